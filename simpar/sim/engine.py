"""The event engine: one training step played as simpy processes.

Each pipeline rank has a compute stream that runs its schedule's ops in order, each op waiting for
its inputs (the previous virtual stage's activation, the next one's gradient); pipeline transfers
are blocking sends on the sender's link; data-parallel gradient buckets start as the last backward
of a chunk produces them and share the rank's link with other transfers (processor sharing);
ZeRO-3 gathers are issued one op ahead and, as FSDP's, stream in block by block beside the op, as
its reduce-scatters stream out; the optimizer runs when a rank's gradients are reduced.

Ranks that differ only in their data/tensor/context-parallel coordinate do identical
work, so one representative per pipeline rank is simulated: exact for the step time,
because every synchronous collective waits for the slowest member, and a straggler is
placed on the representative of its stage."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import simpy

from simpar.cost import gradsync
from simpar.cost.layer import PassCost, overlap_pair
from simpar.cost.pricing import Pricing
from simpar.cost.step import (
    PHASES,
    exposed_comm,
    fsdp_root_unit,
    optimizer_time,
    overlaps_p2p,
    pipeline_send_seconds,
    zero3_edge_share,
    zero3_passes,
)
from simpar.errors import require
from simpar.memory.model import state_bytes_per_param
from simpar.network.model import DEFAULT_NETWORK, NetworkOptions, network_for
from simpar.progress import Progress
from simpar.sim import schedules
from simpar.sim.channel import Channel
from simpar.sim.costs import chunk_costs, sync_seconds
from simpar.sim.schedules import Op
from simpar.specs.gpu import GPUS
from simpar.specs.schedule import COMBINED_1F1B, ONE_F_ONE_B, get_schedule
from simpar.specs.strategy import validate
from simpar.workload.layer import act_bytes

# What a rank's ops are booked to; the bubble is what is left of its step, and the
# replicas what-ifs add their straggler wait afterwards (simpar/cost/replicas.py)
RANK_PHASES = tuple(p for p in PHASES if p not in ("pipeline_bubble", "straggler_wait"))
# Most gradient buckets played as separate transfers; beyond, consecutive buckets are
# played in groups (the exposed tail grows from one bucket to one group: at most 1/256
# of the whole reduction).
MAX_BUCKET_EVENTS = 256
# Micro-batch passes through a model chunk (forward and backward) the event engine plays in one
# step: some 25 events each at ~170,000 events a second, so this many take about 40 s. A global
# batch of 10^8 sequences on 8 GPUs asked for 10^7 and ran out of memory; such a job is for the
# closed form.
MAX_PASSES = 250_000


def passes(strategy, job) -> int:
    """The micro-batch passes one step of `strategy` plays: micro-batches x model chunks."""
    return strategy.micro_batches(job.global_batch) * strategy.pp * strategy.chunks_per_rank


@dataclass(frozen=True)
class SimOptions:
    schedule: str | None = None  # default: the strategy's schedule
    steps: int = 1
    stragglers: tuple = ()  # (pipeline rank, slowdown factor)
    jitter: float = 0.0  # sigma of a lognormal factor on every compute op
    seed: int = 0
    stage_gpus: tuple = ()  # (pipeline rank, GPU catalog name) for heterogeneous jobs
    contention: bool = True  # transfers on one link share it
    trace: bool = False


@dataclass
class StepResult:
    step_time_s: float
    stage_busy_s: list
    stage_done_s: list
    bubble_fraction: float
    breakdown: dict
    exposed_comm_s: float
    events: int
    trace: list = field(default_factory=list)


class _Step:
    def __init__(self, pricing: Pricing, opts: SimOptions, sched, costs, p2p_s: float, rng,
                 tied_s: float = 0.0):
        self.env = simpy.Environment()
        self.pricing = pricing
        s, net = pricing.strategy, pricing.net
        self.model, self.s, self.job = pricing.model, s, pricing.job
        self.cluster, self.net = pricing.cluster, net
        self.sched, self.costs = sched, costs
        self.opts, self.rng = opts, rng
        self.slow = dict(opts.stragglers)
        self.stage_gpu = dict(opts.stage_gpus)
        self.events: dict = {}
        self.trace: list = []
        pp = sched.pp
        self.links = [{
            "nic": Channel(self.env, opts.contention), "nvlink": Channel(self.env, opts.contention),
            "ps": Channel(self.env, opts.contention)
        } for _ in range(pp)]
        self.pp_domain = "nic" if s.pp > 1 and net is not None and net_crosses(net,
                                                                               "pp") else "nvlink"
        self.dp_domain = "nic" if s.dp * s.cp > 1 and net_crosses(net, "dpcp") else "nvlink"
        # the servers' shared NICs, not the GPU's, usually bound the push and pull
        if s.grad_sync == "ps":
            self.dp_domain = "ps"
        self.p2p = p2p_s
        self.tied_s = tied_s  # the tied embedding's gradient sum (gradsync.tied_embedding_sync)
        self.parts = [dict.fromkeys(RANK_PHASES, 0.0) for _ in range(pp)]
        self.busy = [0.0] * pp
        self.compute_end = [0.0] * pp
        self.done_at = [0.0] * pp
        # data-parallel transfers to wait for before the optimizer
        self.pending: list[list[simpy.Event]] = [[] for _ in range(pp)]
        # ZeRO-3: each op's gather, done (gather_key -> event), and each rank's latest one
        self.gather_tails: dict[tuple, simpy.Event] = {}
        self.last_gather: list[simpy.Event | None] = [None] * pp
        # seconds of background transfers issued but waiting for the ones before them
        self.queued = [0.0] * pp

    def ev(self, key):
        e = self.events.get(key)
        if e is None:
            e = self.events[key] = self.env.event()
        return e

    def run(self) -> StepResult:
        for st in range(self.sched.pp):
            self.env.process(self._stage(st))
        self.env.run()
        return self._result()

    # --- per-op costs -----------------------------------------------------------------------------
    def _op_cost(self, op) -> PassCost:
        c = self.costs[op.chunk]
        if op.kind == "F":
            return c.forward
        if op.kind == "FB":
            return overlap_pair(
                c.forward, self.costs[op.b_chunk].backward, self.cluster.gpu.overlap_slowdown
            )
        if not self.sched.split_backward:
            return c.backward
        w = c.backward.wgrad_s
        if op.kind == "W":
            return PassCost(compute_s=w, wgrad_s=w)
        b = c.backward
        return PassCost(b.compute_s - w, b.recompute_s, b.tp_comm_s, b.cp_comm_s, b.ep_comm_s)

    def _factor(self, st) -> float:
        f = self.slow.get(st, 1.0)
        if self.opts.jitter > 0:
            f *= float(self.rng.lognormal(0.0, self.opts.jitter))
        return f

    def _sync(self, op: str, dense: float, expert: float, blocks: int = 1) -> float:
        return sync_seconds(self.pricing, op, dense, expert, blocks)

    # --- the stage process ------------------------------------------------------------------------
    @property
    def _sharded(self) -> bool:
        return self.s.dp * self.s.cp > 1  # data-parallel traffic exists

    def _stage(self, st):
        """One pipeline rank: gather weights (ZeRO-1/2), run its ops in schedule order, then reduce
        gradients and step the optimizer."""
        order = self.sched.orders[st]
        grad_kind = "W" if self.sched.split_backward else "B"
        last_grad_op = {}
        for op in order:
            if op.kind in (grad_kind, "FB"):
                last_grad_op[op.b_chunk if op.kind == "FB" else op.chunk] = op
        mine = sorted(last_grad_op)
        yield from self._gather_updated_weights(st, mine)
        for idx, op in enumerate(order):
            yield from self._wait_inputs(st, op)
            prefetches = self.s.shards_parameters and self._sharded and self.s.profile.zero3_overlap
            if prefetches and idx + 1 < len(order):
                for part in _parts(order[idx + 1]):
                    if self._gathers(part):
                        self._zero3_gather(st, part)  # prefetch one op ahead
            grad_chunk = op.b_chunk if op.kind == "FB" else op.chunk
            yield from self._run_op(st, op, op is last_grad_op.get(grad_chunk))
            for part in _parts(op):
                yield from self._send(st, part)
        self.compute_end[st] = self.env.now
        yield from self._finish(st, mine)

    def _gather_updated_weights(self, st, mine):
        """ZeRO-1/2: each chunk's updated weights are all-gathered before its first forward."""
        if self.s.optimizer_zero(self.job.dtype) not in (1, 2) or not self._sharded:
            return
        previous = None
        for c in mine:
            t = self._sync("allgather", self.costs[c].dense_params, self.costs[c].expert_params)
            if self.s.overlap_grad_reduce:
                # the gather streams bucket by bucket just ahead of the first forward's layers,
                # which waits only for what its own duration cannot cover (at least one bucket)
                params = self.costs[c].dense_params + self.costs[c].expert_params
                buckets = gradsync.buckets(self.s, params, act_bytes(self.job.dtype))
                head = max(t / buckets, t - self.costs[c].forward.total_s)
                # a virtual stage's gather follows the one before it: Megatron dispatches it as
                # the schedule reaches that one (schedules.py, forward_step_helper_preprocess),
                # and one process group's collectives run in turn. Started all at once, sharing
                # the link, every chunk's first bucket had waited for all the others' (a 340B
                # model's first forward on 128 B200s, 12 chunks a rank, waited 0.35 s for 0.03)
                previous = self._transfer(st, head, "dp", ("gathered", c), rest=t - head,
                                          after=previous)
            else:
                yield from self._blocking(st, t, "dp", "param all-gather")

    def _wait_inputs(self, st, op):
        """Wait for the neighbours' activations or gradients and for the op's gathered weights;
        time spent waiting on weights alone is exposed data-parallel communication. A stack
        whose receives hold the stage (Stack.blocking_recvs) then spends each transfer from
        another rank once more on this side."""
        s, chunks, stage_of = self.s, self.sched.chunks, self.sched.chunk_stage
        pipes, weights, recvs = [], [], 0
        for part in _parts(op):
            sender = None
            if part.kind == "F" and part.chunk > 0:
                pipes.append(self.ev(("act", part.mb, part.chunk)))
                sender = part.chunk - 1
            elif part.kind == "B":
                last = part.chunk == chunks - 1
                pipes.append(
                    self.ev(("F", part.mb, part.chunk) if last else ("grad", part.mb, part.chunk)))
                sender = None if last else part.chunk + 1
            recvs += sender is not None and stage_of[sender] != st
            if s.shards_parameters and self._sharded and self._gathers(part):
                weights.append(self._zero3_gather(st, part))
            elif (part.kind == "F" and part.mb == 0 and s.optimizer_zero(self.job.dtype) >= 1 and
                  not s.shards_parameters and s.overlap_grad_reduce and self._sharded):
                weights.append(self.ev(("gathered", part.chunk)))
        if pipes or weights:
            t0, pipe_ready = self.env.now, all(p.triggered for p in pipes)
            yield self.env.all_of(pipes + weights)
            if pipe_ready:
                self.parts[st]["dp_comm"] += self.env.now - t0
        if recvs and s.profile.blocking_recvs and self.p2p > 0:
            start = self.env.now
            yield self.env.timeout(recvs * self.p2p)
            self.parts[st]["pp_p2p"] += self.p2p * recvs
            self._record(f"recv {op.kind}{op.mb}", "comm-pp", st, start, self.p2p * recvs)

    def _run_op(self, st, op, last_grad: bool):
        s = self.s
        cost = self._op_cost(op)
        factor = self._factor(st)
        dur = cost.total_s * factor
        chunk, reduce_s = self._reduce_scatter(op, last_grad)
        # of the gradient reduce-scatter the op ends with, what streams beside it as its blocks'
        # backwards finish: all but its last block's and the root unit's (zero3_edge_share)
        streamed = reduce_s * (1 - self._edge_share(chunk, root=True)) if (
            self._streams_zero3) else 0.0
        # gradient and weight traffic running beside this op takes SMs and HBM from it: what is on
        # the link, what waits its turn behind it, and what of the op's own reduction streams
        backlog = self.links[st][self.dp_domain].backlog_s() if self._sharded else 0.0
        # (the queue's running sum may drift a rounding below zero)
        hidden = min(dur, max(0.0, backlog + self.queued[st] + streamed))
        slow = GPUS[self.stage_gpu[
            st]].overlap_slowdown if st in self.stage_gpu else self.cluster.gpu.overlap_slowdown
        self.parts[st]["dp_comm"] += slow * hidden
        dur += slow * hidden
        start = self.env.now
        if s.overlap_grad_reduce and last_grad and not s.shards_gradients and self._sharded:
            self._grad_buckets(st, op.chunk, start, dur,
                               "reducescatter" if s.optimizer_zero(self.job.dtype) >= 1
                               else "allreduce")
        if streamed:  # each block's gradients reduce as soon as its backward is done
            done = self.env.event()
            self.pending[st].append(done)
            self.env.process(self._bucket(st, start + dur / self.costs[chunk].layers, streamed,
                                          done, f"grad reduce-scatter c{chunk}"))
        yield from self._compute(st, op, dur)
        self._account(st, op, cost, factor, dur, start)
        for part in _parts(op):
            self.ev((part.kind, part.mb, part.chunk)).succeed()
        if reduce_s:  # the last block's and the root's share (all of it where nothing streams)
            yield from self._dp(st, reduce_s - streamed, s.overlap_grad_reduce,
                                "grad reduce-scatter")

    @property
    def _streams_zero3(self) -> bool:
        """ZeRO-3 collectives run block by block beside the op's compute (prefetching on their own
        streams), as do FSDP's reduce-scatters under ZeRO-2; DeepSpeed before v0.6 synchronised
        the device around every gather (Stack.zero3_overlap), so nothing of a pass ran beside it,
        and its ZeRO-2 reduces bucket by bucket after the backward."""
        s = self.s
        return bool(s.profile.zero3_overlap and s.overlap_grad_reduce and (
            s.shards_parameters or fsdp_root_unit(s)))

    def _edge_share(self, chunk: int, root: bool) -> float:
        """zero3_edge_share of one of the engine's chunks."""
        c = self.costs[chunk]
        return zero3_edge_share(self.s, c.dense_params + c.expert_params, c.root_params,
                                c.layers, root)

    def _reduce_scatter(self, op, last_grad: bool) -> tuple[int, float]:
        """(chunk, seconds) of the ZeRO-2/3 gradient reduce-scatter the op ends with (0 s:
        none)."""
        s = self.s
        grad_kind = "W" if self.sched.split_backward else "B"
        reduces_now = last_grad or not s.accumulates_unsharded
        for part in _parts(op):
            if s.shards_gradients and part.kind == grad_kind and self._sharded and reduces_now:
                c = self.costs[part.chunk]
                return part.chunk, self._sync("reducescatter", c.dense_params, c.expert_params,
                                              c.layers)
        return op.chunk, 0.0

    def _compute(self, st, op, dur: float):
        """The op's compute; where its ZeRO-3 weights stream in block by block, its last block
        waits for the last of them (the wait is exposed data-parallel communication)."""
        tails = [self.gather_tails[k] for k in map(_gather_key, _parts(op))
                 if k in self.gather_tails and not self.gather_tails[k].triggered]
        if not tails:
            yield self.env.timeout(dur)
            return
        last = dur / max(self.costs[p.chunk].layers for p in _parts(op))
        yield self.env.timeout(dur - last)
        t0 = self.env.now
        yield self.env.all_of(tails)
        self.parts[st]["dp_comm"] += self.env.now - t0
        yield self.env.timeout(last)

    def _finish(self, st, mine):
        """Gradient sync not yet done (all of it without overlap), then the optimizer step."""
        s, env = self.s, self.env
        if not s.overlap_grad_reduce and not s.shards_gradients and self._sharded:
            op = "reducescatter" if s.optimizer_zero(self.job.dtype) >= 1 else "allreduce"
            for c in mine:
                t = self._sync(op, self.costs[c].dense_params, self.costs[c].expert_params)
                yield from self._blocking(st, t, "dp", "gradient sync")
        if self.pending[st]:
            t0 = env.now
            yield env.all_of(self.pending[st])
            self.parts[st]["dp_comm"] += env.now - t0
        yield from self._tied_embedding_sync(st)
        dense = sum(self.costs[c].dense_params for c in mine)
        expert = sum(self.costs[c].expert_params for c in mine)
        name = self.stage_gpu.get(st)
        t_opt = optimizer_time(self.pricing, dense, expert, st == 0,
                               GPUS[name] if name else None)
        start = env.now
        yield env.timeout(t_opt)
        self.parts[st]["optimizer"] += t_opt
        self._record("optimizer", "compute", st, start, t_opt)
        self.done_at[st] = env.now

    def _tied_embedding_sync(self, st):
        """The first and last stage sum their copies of a tied embedding's gradient once both
        have synced their own (gradsync.tied_embedding_sync), on the pipeline's link."""
        last = self.sched.pp - 1
        if not self.tied_s or st not in (0, last):
            return
        self.ev(("tied", st)).succeed()
        # the stage that got here first idles until the other does
        yield self.env.all_of([self.ev(("tied", 0)), self.ev(("tied", last))])
        start = self.env.now
        yield self.links[st][self.pp_domain].transfer(self.tied_s)
        self.parts[st]["dp_comm"] += self.env.now - start
        self._record("tied embedding all-reduce", "comm-pp", st, start, self.env.now - start)

    def _send(self, st, op):
        """Hand the activation (forward) or gradient (backward) to the rank of the
        neighbouring chunk."""
        chunks, stage_of = self.sched.chunks, self.sched.chunk_stage
        if op.kind == "F" and op.chunk < chunks - 1:
            nxt, key = op.chunk + 1, ("act", op.mb, op.chunk + 1)
        elif op.kind == "B" and op.chunk > 0:
            nxt, key = op.chunk - 1, ("grad", op.mb, op.chunk - 1)
        else:
            return
        if stage_of[nxt] == st or self.p2p <= 0:
            self.ev(key).succeed()
            return
        if overlaps_p2p(self.s):  # the stack sends in the background while the next op computes
            self.env.process(self._p2p(st, op, key, blocking=False))
            return
        yield from self._p2p(st, op, key, blocking=True)

    def _p2p(self, st, op, key, blocking: bool):
        start = self.env.now
        yield self.links[st][self.pp_domain].transfer(self.p2p)
        if blocking:
            self.parts[st]["pp_p2p"] += self.env.now - start
        self._record(f"send {op.kind}{op.mb}", "comm-pp", st, start, self.env.now - start)
        self.ev(key).succeed()

    def _grad_buckets(self, st, chunk, start, dur, op_name):
        """DDP-style: the strategy's buckets become ready in turn while the last backward runs."""
        c = self.costs[chunk]
        _, gb, _ = state_bytes_per_param(self.job.dtype, self.s.profile)
        n = gradsync.buckets(self.s, c.dense_params + c.expert_params, gb)
        per = self._sync(op_name, c.dense_params / n, c.expert_params / n)
        # tiny buckets (--bucket-mb 1 on a large model: tens of thousands) are played in
        # MAX_BUCKET_EVENTS groups of consecutive ones, each at its buckets' summed time
        # (latency included) when its last is ready
        groups = min(n, MAX_BUCKET_EVENTS)
        for j in range(groups):
            done = self.env.event()
            self.pending[st].append(done)
            self.env.process(
                self._bucket(st, start + (j + 1) / groups * dur, per * n / groups, done,
                             f"{op_name} c{chunk} b{j}"))

    def _bucket(self, st, ready_at, seconds, done, name):
        yield self.env.timeout(max(0.0, ready_at - self.env.now))
        start = self.env.now
        yield self.links[st][self.dp_domain].transfer(seconds)
        self._record(name, "comm-dp", st, start, self.env.now - start)
        done.succeed()

    def _transfer(self, st, seconds, stream, key, rest: float = 0.0, after=None):
        """A background data-parallel transfer that fires `key` when done; `rest` more
        seconds follow it on the link (and must finish before the optimizer). It starts once
        the event `after` has fired; returns the event that fires when all of it is done."""
        tail = self.env.event()
        self.pending[st].append(tail)
        self.queued[st] += seconds + rest

        def proc():
            if after is not None:
                yield after
            self.queued[st] -= seconds + rest
            start = self.env.now
            yield self.links[st][self.dp_domain].transfer(seconds)
            self.ev(key).succeed()
            if rest > 0:
                yield self.links[st][self.dp_domain].transfer(rest)
            self._record(str(key[0]), f"comm-{stream}", st, start, self.env.now - start)
            tail.succeed()
        self.env.process(proc())
        return tail

    def _blocking(self, st, seconds, stream, name):
        start = self.env.now
        yield self.links[st][self.dp_domain].transfer(seconds)
        self.parts[st]["dp_comm"] += self.env.now - start
        self._record(name, f"comm-{stream}", st, start, self.env.now - start)

    def _dp(self, st, seconds, overlap, name):
        if overlap:
            done = self.env.event()
            self.pending[st].append(done)

            def proc():
                start = self.env.now
                yield self.links[st][self.dp_domain].transfer(seconds)
                self._record(name, "comm-dp", st, start, self.env.now - start)
                done.succeed()
            self.env.process(proc())
        else:
            yield from self._blocking(st, seconds, "dp", name)

    def _gathers(self, part) -> bool:
        """ZeRO-3 gathers a chunk's weights for each forward, and for each backward when it
        reshards (zero3_passes); a stage kept gathered across micro-batches, for its first
        forward only."""
        if self.s.accumulates_unsharded:
            return part.kind == "F" and part.mb == 0
        return part.kind in ("F", "B") and zero3_passes(self.s, self.model, part.kind) > 0

    def _zero3_gather(self, st, op):
        """ZeRO-3: the op's weights are all-gathered, issued when the previous op starts
        (prefetch), after the gathers issued before it (one process group's collectives run in
        turn). The event fires when the op may start: where gathers stream block by block, once
        its first block's weights are in (the rest is in gather_tails), else once all are."""
        key = _gather_key(op)
        if key not in self.events:
            c = self.costs[op.chunk]
            kept = c.root_params if op.kind == "B" and fsdp_root_unit(self.s) else 0.0
            t = self._sync("allgather", c.dense_params - kept, c.expert_params, c.layers)
            t *= zero3_passes(self.s, self.model, op.kind)
            head = t * self._edge_share(op.chunk, root=op.kind == "F") if (
                self._streams_zero3) else t
            self.gather_tails[key] = self._transfer(st, head, "dp", key, rest=t - head,
                                                    after=self.last_gather[st])
            self.last_gather[st] = self.gather_tails[key]
        return self.ev(key)

    # --- bookkeeping ------------------------------------------------------------------------------
    def _account(self, st, op, cost, scale, dur, start):
        """Book the op's phases (stretched by straggler/jitter `scale`; the overlap
        slowdown in `dur` is booked as dp_comm already)."""
        part = self.parts[st]
        fwd = 0.0
        if op.kind == "FB":
            fwd = self.costs[op.chunk].forward.compute_s
        elif op.kind == "F":
            fwd = cost.compute_s
        part["forward_compute"] += fwd * scale
        part["backward_compute"] += (cost.compute_s - fwd) * scale
        part["recompute"] += cost.recompute_s * scale
        part["tp_comm"] += cost.tp_comm_s * scale
        part["cp_comm"] += cost.cp_comm_s * scale
        part["ep_comm"] += cost.ep_comm_s * scale
        self.busy[st] += dur
        name = f"{op.kind}{op.mb}.{op.chunk}"
        if op.kind == "FB":
            name = f"F{op.mb}.{op.chunk}+B{op.b_mb}.{op.b_chunk}"
        self._record(name, "compute", st, start, dur)

    def _record(self, name, stream, st, start, dur):
        if self.opts.trace and dur > 0:
            self.trace.append((name, stream, st, start, dur))

    def _result(self) -> StepResult:
        step = max(self.done_at)
        span = max(self.compute_end) if self.compute_end else step
        pp = self.sched.pp
        # the bubble as the pace-setting (busiest) rank sees it: its idle share of the pipeline span
        pace = max(range(pp), key=self.busy.__getitem__)
        bubble = (  # clamped: a rank busy all along leaves -1e-17 of rounding
            max(0.0, (span - self.busy[pace] - self.parts[pace]["pp_p2p"]) / span)
            if span > 0 and pp > 1
            else 0.0
        )
        crit = max(range(pp), key=self.done_at.__getitem__)
        parts = dict(self.parts[crit])
        parts["pipeline_bubble"] = max(0.0, step - sum(parts.values()))
        return StepResult(step, list(self.busy), list(self.done_at),
                          bubble, {k: parts[k]
                                   for k in PHASES if k in parts}, exposed_comm(parts),
                          next(self.env._eid), self.trace)


def _gather_key(op) -> tuple:
    return ("z3", op.kind, op.mb, op.chunk)


def _parts(op) -> tuple:
    """The ops an op stands for: an overlapped pair is a forward, an input gradient and
    a weight gradient."""
    if op.kind != "FB":
        return (op,)
    return (Op("F", op.mb, op.chunk), Op("B", op.b_mb, op.b_chunk), Op("W", op.b_mb, op.b_chunk))


def net_crosses(net, group: str) -> bool:
    spans = getattr(net, "spans", None)
    if spans is not None:
        return spans[group].crosses_nodes
    per_node = net.model.fab.cluster.gpus_per_node
    g = net.gpu_groups(group)[0]
    return len({r // per_node for r in g}) > 1


@dataclass(frozen=True)
class SimulationResult:
    step_times_s: tuple
    p50_s: float
    p99_s: float
    first: StepResult
    schedule: str
    events: int
    wall_s: float

    def trace_events(self) -> list:
        return self.first.trace

    def to_dict(self) -> dict:
        r = self.first
        return {
            "engine": "event", "schedule": self.schedule, "step_times_s": list(self.step_times_s),
            "p50_step_time_s": self.p50_s, "p99_step_time_s": self.p99_s,
            "stage_busy_s": r.stage_busy_s,
            "stage_idle_s": [r.step_time_s - b
                             for b in r.stage_busy_s], "bubble_fraction": r.bubble_fraction,
            "exposed_comm_s": r.exposed_comm_s, "breakdown": r.breakdown, "events": self.events,
            "events_per_s": self.events / self.wall_s if self.wall_s > 0 else 0.0
        }


def simulate(model, cluster, job, strategy, opts: SimOptions = SimOptions(),
             network: NetworkOptions = DEFAULT_NETWORK) -> SimulationResult:
    import time

    s = strategy
    validate(s, model, job, s.gpus)
    pipe = ONE_F_ONE_B
    if s.pp > 1:
        pipe = get_schedule(opts.schedule) if opts.schedule else s.pipeline
    m = s.micro_batches(job.global_batch)
    require(passes(s, job) <= MAX_PASSES, "global_batch", job.global_batch,
            f"gives {m:,} micro-batches a step on each of {passes(s, job) // m} model chunks, "
            f"beyond the {MAX_PASSES:,} passes the event engine plays; give a larger "
            "--micro-batch or --engine analytic")
    # Megatron's combined 1F1B pairs the forwards and backwards of its own two schedules
    paired = s.overlap_ep_comm and pipe in COMBINED_1F1B
    sched = schedules.build(pipe, s.pp, m, s.vpp, paired=paired)
    pricing = Pricing(model, cluster, job, s, network_for(cluster, s, network))
    costs = chunk_costs(pricing, sched.chunks, lambda c: sched.chunk_stage[c],
                        dict(opts.stage_gpus))
    rng = np.random.default_rng(opts.seed)
    start = time.perf_counter()
    p2p = pipeline_send_seconds(pricing)
    tied = gradsync.tied_embedding_sync(pricing)
    # without jitter every step plays the same events: one step stands for all of them
    played = max(1, opts.steps) if opts.jitter > 0 else 1
    progress = Progress("simulating steps", played)
    results = []
    for i in range(played):
        results.append(
            _Step(pricing, replace(opts, trace=opts.trace and i == 0), sched, costs, p2p, rng,
                  tied).run()
        )
        progress.update(i + 1)
    progress.close()
    wall = time.perf_counter() - start
    times = tuple(
        r.step_time_s
        for r in results) if played > 1 else (results[0].step_time_s, ) * max(1, opts.steps)
    name = sched.name
    if s.overlap_ep_comm and not paired and not pipe.paired_share(m, s.pp):
        # a what-if schedule (--sim-schedule) the combined 1F1B has no form of
        name += " (all-to-alls unpaired: Megatron pairs only 1F1B and interleaved passes)"
    return SimulationResult(times, float(np.percentile(times, 50)), float(np.percentile(times, 99)),
                            results[0], name, sum(r.events for r in results), wall)
