"""Pipeline schedules as per-stage orders of operations.

An op is (kind, micro-batch, chunk): F forward, B backward (input and weight gradients together),
or, for zero-bubble schedules, B the input gradient and W the weight gradient. DualPipeV also
runs "FB": the forward of one micro-batch (mb, chunk) beside the whole backward of another (b_mb,
b_chunk), so each one's communication hides behind the other's compute. A chunk is a virtual
stage: `chunk_stage(chunk)` maps it to the pipeline rank that runs it. The event engine plays the
orders; nothing here knows durations except the greedy generator, which orders ops by unit-time
list scheduling the way the zero-bubble paper's heuristic scheduler does."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace

from simpar.specs.schedule import (
    DUALPIPEV,
    GPIPE,
    INTERLEAVED,
    ONE_F_ONE_B,
    ZB_H1,
    ZBV,
    PipelineSchedule,
    interleaved_warmup,
)


@dataclass(frozen=True)
class Op:
    kind: str  # "F", "B", "W" or "FB"
    mb: int
    chunk: int  # virtual stage index, 0 .. pp*vpp - 1 in data-flow order
    b_mb: int = -1  # "FB": the micro-batch and chunk of the backward (input and weight gradients)
    b_chunk: int = -1


@dataclass(frozen=True)
class Schedule:
    name: str
    pp: int
    chunks_per_stage: int
    orders: tuple  # orders[stage] = tuple of Op
    split_backward: bool  # B and W are separate ops
    chunk_stage: tuple  # chunk -> pipeline rank

    @property
    def chunks(self) -> int:
        return self.pp * self.chunks_per_stage


def build(schedule: PipelineSchedule, pp: int, micro_batches: int, vpp: int = 1, *,
          paired: bool = False) -> Schedule:
    """Every rank's op order; `vpp` counts only for a schedule with virtual stages. `paired`:
    Megatron core's combined 1F1B (--overlap-ep-comm), which runs each forward that follows a
    backward beside it: all but the first forward and the last backward without pipelining."""
    sched = _BUILDERS[schedule.name](pp, micro_batches, vpp if schedule.virtual_stages else 1)
    if not paired:
        return sched
    return replace(sched, orders=tuple(_combined(order) for order in sched.orders))


def _combined(order) -> tuple:
    """A 1F1B order with each backward and the forward after it merged into one "FB" op."""
    out: list[Op] = []
    for op in order:
        if op.kind == "F" and out and out[-1].kind == "B":
            b = out.pop()
            op = Op("FB", op.mb, op.chunk, b.mb, b.chunk)
        out.append(op)
    return tuple(out)


def _simple(name, order_fn):
    def build_simple(pp, m, _vpp):
        return Schedule(name, pp, 1, tuple(tuple(order_fn(s, pp, m)) for s in range(pp)), False,
                        tuple(range(pp)))
    return build_simple


def _gpipe(s, pp, m):
    return [Op("F", i, s) for i in range(m)] + [Op("B", i, s) for i in range(m)]


def _one_f_one_b(s, pp, m):
    warm = min(pp - s - 1, m)
    ops = [Op("F", i, s) for i in range(warm)]
    f, b = warm, 0
    while b < m:
        if f < m:
            ops.append(Op("F", f, s))
            f += 1
        ops.append(Op("B", b, s))
        b += 1
    return ops


def _interleaved(pp, m, v):
    """Megatron-LM's interleaved 1F1B: micro-batches in groups of pp cycle through the v chunks of a
    rank; (pp - s - 1) * 2 + (v - 1) * pp warm-up forwards, then one forward one backward."""
    total = m * v

    def chunk_of(k, forward):
        c = (k // pp) % v
        return c if forward else v - 1 - c

    def mb_of(k):
        return (k // (pp * v)) * pp + k % pp

    orders = []
    for s in range(pp):
        warm = interleaved_warmup(s, pp, v, total)
        ops = [Op("F", mb_of(k), chunk_of(k, True) * pp + s) for k in range(warm)]
        f, b = warm, 0
        while b < total:
            if f < total:
                ops.append(Op("F", mb_of(f), chunk_of(f, True) * pp + s))
                f += 1
            ops.append(Op("B", mb_of(b), chunk_of(b, False) * pp + s))
            b += 1
        orders.append(tuple(ops))
    return Schedule(INTERLEAVED.name, pp, v, tuple(orders), False,
                    tuple(c % pp for c in range(pp * v)))


def _zb_h1(pp, m, _vpp):
    """ZB-H1 (Qi et al. 2024, arXiv:2401.10241): the backward split into input and weight gradients;
    rank s starts at most pp - s micro-batches ahead as 1F1B does and defers up to pp
    weight-gradient ops into the slots where 1F1B idles (greedy list scheduling, B
    before F before W). The deferred W ops keep their layers' inputs and output
    gradients alive: that is the memory this schedule costs."""
    return _greedy(ZB_H1.name, pp, m, 1, tuple(range(pp)), max_live=[pp - s for s in range(pp)],
                   max_deferred=[pp] * pp)


def _zbv(pp, m, _vpp):
    """ZBV (Qi et al., "Pipeline parallelism with controllable memory", 2024): two chunks
    per rank in a V (chunk c < pp on rank c, chunk c >= pp on rank 2pp-1-c), split
    backward, each rank keeping at most 2pp chunk activations alive; orders come from
    greedy unit-time list scheduling (B first, then F, then W to fill idle slots)."""
    chunk_stage = tuple(c if c < pp else 2 * pp - 1 - c for c in range(2 * pp))
    return _greedy(ZBV.name, pp, m, 2, chunk_stage, max_live=[2 * pp] * pp)


def _dualpipev(pp, m, _vpp):
    """DualPipeV (DeepSeek-V3, arXiv:2412.19437; the "cut-in-half" DualPipe): two chunks per rank in
    a V, as ZBV; after the warm-up each rank alternates overlapped pairs, the forward of one chunk
    beside the whole backward of the other, and the tail splits backwards into input and deferred
    weight gradients. The eight phases follow DeepSeek's reference order (needs m >= 2 pp)."""
    chunk_stage = tuple(c if c < pp else 2 * pp - 1 - c for c in range(2 * pp))
    return Schedule(DUALPIPEV.name, pp, 2,
                    tuple(tuple(_dualpipev_rank(r, pp, m)) for r in range(pp)), True, chunk_stage)


def _dualpipev_rank(r, pp, m):
    c0, c1 = r, 2 * pp - 1 - r  # the rank's chunk on the way down and on the way up the V
    nxt = {"F": [0, 0], "B": [0, 0]}  # next micro-batch per kind and chunk (0: c0, 1: c1)
    ops, deferred = [], []

    def f(c):
        i = nxt["F"][c == c1]
        nxt["F"][c == c1] += 1
        return Op("F", i, c)

    def b(c, split):  # the input gradient; its weight gradient now (whole backward) or deferred
        i = nxt["B"][c == c1]
        nxt["B"][c == c1] += 1
        if split:
            deferred.append(Op("W", i, c))
            return [Op("B", i, c)]
        return [Op("B", i, c), Op("W", i, c)]

    def fb(fc, bc):
        fwd, bwd = f(fc), b(bc, False)[0]
        return Op("FB", fwd.mb, fc, bwd.mb, bc)

    def w():
        return [deferred.pop(0)] if deferred else []

    ops += [f(c0) for _ in range((pp - r - 1) * 2)]
    for _ in range(r + 1):
        ops += [f(c0), f(c1)]
    for _ in range(pp - r - 1):
        ops += b(c1, True) + w() + [f(c1)]
    for i in range(m - 2 * pp + r + 1):
        ops += [f(c0)] + b(c1, False) if (i == 0 and r == pp - 1) else [fb(c0, c1)]
        ops.append(fb(c1, c0))
    for _ in range(pp - r - 1):
        ops += b(c1, False) + [fb(c1, c0)]
    split = False
    for i in range(r + 1):
        split = split or (i == (r + 1) // 2 and r % 2 == 1)
        ops += b(c1, split)
        split = split or (i == (r + 1) // 2 and r % 2 == 0)
        ops += b(c0, split)
    for _ in range(pp - r - 1):
        ops += w() + b(c0, split)
    for _ in range(r + 1):
        ops += w()
    return ops


def _greedy(name: str, pp: int, m: int, v: int, chunk_stage: tuple, max_live: list[int],
            max_deferred: list[int] | None = None) -> Schedule:
    """Unit-time list scheduling: each free rank runs its most urgent ready op (B, then F, then W;
    among one kind the lowest micro-batch, then the latest chunk for F and the earliest for B and
    W); F waits while `max_live[s]` micro-batch chunks are alive (freed by B); a rank holding
    `max_deferred[s]` pending weight-gradient ops runs one before its next forward. Ops become
    ready when their inputs finish, so each time step touches only the ranks' ready heaps (a scan
    of every op per step took minutes for 16 stages and hundreds of micro-batches)."""
    last = pp * v - 1
    # ready[s][kind]: heap of (micro-batch, chunk key) whose inputs have finished
    ready: list[dict[str, list]] = [{k: [] for k in "BFW"} for _ in range(pp)]

    def release(k, i, c):
        heapq.heappush(ready[chunk_stage[c]][k], (i, -c if k == "F" else c))

    for i in range(m):
        release("F", i, 0)
    orders: list[list[Op]] = [[] for _ in range(pp)]
    live, deferred = [0] * pp, [0] * pp
    left = 3 * m * (last + 1)
    while left:
        finished = []  # ops run in this time step: their outputs are ready at the next one
        for s in range(pp):
            urgent = "BFW" if max_deferred is None or deferred[s] < max_deferred[s] else "BWF"
            k = next((k for k in urgent if ready[s][k] and (k != "F" or live[s] < max_live[s])),
                     None)
            if k is None:
                continue
            i, key = heapq.heappop(ready[s][k])
            c = -key if k == "F" else key
            orders[s].append(Op(k, i, c))
            finished.append((k, i, c))
            # B frees most activations; W needs only inputs
            live[s] += 1 if k == "F" else (-1 if k == "B" else 0)
            deferred[s] += 1 if k == "B" else (-1 if k == "W" else 0)
        if not finished:
            raise RuntimeError(f"{name}: no op can run with pp={pp}, m={m}")
        left -= len(finished)
        for k, i, c in finished:  # a forward feeds the next chunk; a backward the one before
            if k == "F":
                release("F" if c < last else "B", i, c + 1 if c < last else c)
            elif k == "B":
                release("W", i, c)
                if c > 0:
                    release("B", i, c - 1)
    return Schedule(name, pp, v, tuple(tuple(o) for o in orders), True, chunk_stage)


def peak_live(schedule: Schedule) -> list[int]:
    """Peak number of micro-batch chunks a rank holds activations for: from F until the
    backward that frees them (B), plus pending weight-gradient ops, which keep the layer
    inputs and output gradients (counted as one more each)."""
    peaks = []
    for order in schedule.orders:
        live = peak = 0
        for op in order:
            if op.kind == "FB":  # a forward starts, another micro-batch's backward ends
                continue
            if op.kind == "F" or (op.kind == "B" and schedule.split_backward):
                live += 1 if op.kind == "F" else 0
            elif op.kind in "BW":
                live -= 1
            peak = max(peak, live)
        peaks.append(peak)
    return peaks


_BUILDERS = {
    GPIPE.name: _simple(GPIPE.name,
                        _gpipe), ONE_F_ONE_B.name: _simple(ONE_F_ONE_B.name, _one_f_one_b),
    INTERLEAVED.name: _interleaved, ZB_H1.name: _zb_h1, ZBV.name: _zbv, DUALPIPEV.name: _dualpipev
}
