"""Micro-benchmarks of the machine at hand, written as a simpar cluster profile (YAML).

Run by `simpar calibrate` under torchrun, one process per device, all ranks measuring at once (so
the figures include the contention of a real job): the best GEMM rate over workload-like shapes
(the peak the cost model scales from; with --soak, a GPU's `gemm_efficiency` is what it
sustains under continuous GEMM load, below that burst rate), streaming bandwidth, the fixed
cost of a tiny kernel, fused attention's rate, how much a collective beside GEMMs slows them, and
collective times against message size as a step issues them (after compute), fitted to the
alpha-beta ring model. With --model, also the time of every GEMM shape the model's step runs
(forward, input and weight gradients, at tp 1 and at the process count) and of its attention
(forward and backward), tables that predictions use in place of the single rates."""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import replace
from functools import partial

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml

from execpar.groups import close_process_group
from simpar.files import write_text

GEMMS = [(512, 512, 512), (1024, 1024, 1024), (2048, 512, 512), (1024, 2048, 512),
         (2048, 2048, 1024)]
# a GPU's best rate needs GEMMs of a few thousand in each dimension (its first GPU calibration,
# H200 in reports/gpu-validation-h200, peaked at 305 TFLOP/s over the CPU's shapes above)
GPU_GEMMS = [(4096, 4096, 4096), (8192, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 4096)]
SIZES = [2**k for k in range(10, 25, 2)]  # 1 KiB .. 16 MiB
# causal SDPA of (sequences, heads, tokens, head dim): the CPU's probe is small enough to time
# quickly; a GPU's that small is launch-bound (the H200's ran at 7% of its GEMM rate), so a GPU
# times one of long sequences at a modern head dim, forward and backward, as a step runs it
ATTENTION_PROBE = {"cpu": (2, 8, 512, 64), "cuda": (2, 16, 4096, 128)}
# the GPU kernels a tiny-kernel probe queues behind GEMMs that keep the GPU busy
TINY_KERNELS = 1000
# A GPU runs its GEMMs faster in a short burst than under a training step's continuous load,
# which holds it at its power cap within a second (an H100 at 700 W: 792 TFLOP/s in bursts, 675
# sustained, reports/gpu-gemm-soak). With --soak a GPU's calibration also soaks the best shape
# this long and keeps the rate of the second half, so that the profile carries both rates and a
# step's tensor-core share sets where between them it runs (GPUSpec.at_tensor_core_share). It is
# off by default: eager steps (execpar's) ran their GEMMs at the burst rate on an H100 and an H200,
# and the share the cost model judges for them is too high to let it (the H200's soaked profiles
# priced execpar's six runs 12.7% slow at the median, unsoaked 4.6%: reports/gpu-validation-h200).
SOAK_S = 6.0
# below this fraction of the burst rate the soak counts as a power cap (run-to-run noise is ~1%)
SUSTAINED_BELOW = 0.98
# simpar's GPU architecture for a CUDA compute capability's major number
ARCH = {7: "volta", 8: "ampere", 9: "hopper", 10: "blackwell"}


def _time(fn, device, reps: int) -> float:
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


def model_gemm_shapes(model, seq_len: int, micro_batch: int,
                      tps: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """The (m, n, k) of every GEMM a step of `model` runs at these tensor-parallel sizes
    and micro-batches of up to `micro_batch` sequences: each layer GEMM and the logits
    forward, and their input-gradient (m, k, n) and weight-gradient (k, n, m) GEMMs."""
    from simpar.workload.layer import head_work, layer_work

    shapes = set()
    mbs = sorted({1, micro_batch})
    for tp in tps:
        for mb in mbs:
            work = layer_work(model, seq_len, mb, tp, 1, 1, tp > 1, True, "bf16")
            for g in work.gemms + head_work(model, seq_len, mb, tp, 1, tp > 1, "bf16").gemms:
                shapes |= {(g.m, g.n, g.k), (g.m, g.k, g.n), (g.k, g.n, g.m)}
    return sorted(shapes)


# Rounds over the whole GEMM table: each shape's time is its median round, so a burst of load
# from outside the job (a shared or virtual machine) slows one round of every shape instead
# of skewing a few shapes. The rounds share twice the --reps calls per shape between them.
GEMM_ROUNDS = 5


def gemm_table(shapes, device, dtype, reps: int) -> list[list[float]]:
    """[m, n, k, seconds] of each shape, timed as the step runs it (one matmul after another)."""
    pairs = [(torch.randn(m, k, device=device,
                          dtype=dtype), torch.randn(k, n, device=device, dtype=dtype))
             for m, n, k in shapes]
    per_round = max(1, 2 * reps // GEMM_ROUNDS)
    rounds = [[_time(lambda a=a, b=b: a @ b, device, per_round) for a, b in pairs]
              for _ in range(GEMM_ROUNDS)]
    return [[m, n, k, float(np.median([r[i] for r in rounds]))]
            for i, (m, n, k) in enumerate(shapes)]


def model_attention_shapes(model, seq_len: int, micro_batch: int,
                           tps: tuple[int, ...]) -> list[tuple[int, int, int, int, int]]:
    """(sequences, heads, K/V heads, tokens, head dim) of the causal attention a step of `model`
    runs at these tensor-parallel sizes and micro-batches of up to `micro_batch` sequences, where
    it is one such kernel over whole sequences (simpar's LayerWork.attention_shape), once for
    each row of the table (sequences x heads: micro-batch 2 at tp 2 is micro-batch 1 at tp 1);
    none at a tp that does not divide the K/V heads (no strategy runs there)."""
    from simpar.workload.layer import layer_work

    shapes: dict[tuple[int, int, int], tuple[int, int, int, int, int]] = {}
    for tp in tps:
        for mb in sorted({1, micro_batch}):
            key = layer_work(model, seq_len, mb, tp, 1, 1, tp > 1, True, "bf16").attention_shape
            bh, tokens, head_dim = key
            if bh and model.kv_heads % tp == 0:
                shapes.setdefault(key, (mb, bh // mb, model.kv_heads // tp, tokens, head_dim))
    return sorted(shapes.values())


def attention_table(shapes, device, dtype, reps: int) -> list[list[float]]:
    """[sequences x heads, tokens, head dim, forward s, backward s] of each shape: causal SDPA as
    execpar's attention calls it (head-major views of token-major q, k and v, grouped K/V through
    enable_gqa), its forward as training runs it (saving for backward) and its backward apart,
    over the forward's graph kept for the purpose."""
    rows = []
    for b, heads, kv_heads, tokens, head_dim in shapes:
        leaves = [torch.randn(b, tokens, n, head_dim, device=device, dtype=dtype,
                              requires_grad=True) for n in (heads, kv_heads, kv_heads)]
        q, k, v = (t.transpose(1, 2) for t in leaves)

        def forward(q=q, k=k, v=v, gqa=kv_heads != heads):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

        out = forward()
        grad = torch.randn_like(out)

        def backward(out=out, grad=grad, leaves=leaves):
            for t in leaves:
                t.grad = None
            out.backward(grad, retain_graph=True)

        rows.append([b * heads, tokens, head_dim, _time(forward, device, reps),
                     _time(backward, device, reps)])
    return rows


def mean_over_ranks(table: list[list[float]], timed: int, device) -> list[list[float]]:
    """The ranks' mean of each row's last `timed` columns (times): a step runs hundreds of
    kernels, so a rank's jitter averages out over them; the slowest rank's time of every shape
    would add up to a step no rank runs."""
    times = torch.tensor([row[-timed:] for row in table], dtype=torch.float64, device=device)
    dist.all_reduce(times, op=dist.ReduceOp.SUM)
    n = dist.get_world_size()
    return [row[:-timed] + [float(t) / n for t in ts]
            for row, ts in zip(table, times.tolist(), strict=True)]


def measure(device, dtype, reps: int, stream_elements: int = 2**23, soak: bool = False) -> dict:
    """Best GEMM rate, streaming bandwidth over tensors of `stream_elements` (a model's
    activation size when calibrating for one: on a CPU a small model's activations stay
    in cache), per-op cost, SDPA; with `soak`, a GPU's sustained GEMM rate."""
    out = {}
    best = 0.0
    for m, n, k in GPU_GEMMS if device.type == "cuda" else GEMMS:
        a, b = torch.randn(m, k, device=device,
                           dtype=dtype), torch.randn(k, n, device=device, dtype=dtype)
        best = max(best, 2 * m * n * k / _time(lambda a=a, b=b: a @ b, device, reps))
    out["gemm_flops"] = best
    x = torch.randn(stream_elements, device=device, dtype=dtype)
    y = torch.randn(stream_elements, device=device, dtype=dtype)
    add_s = _time(lambda: torch.add(x, y), device, reps)
    out["stream_bytes_per_s"] = 3 * x.numel() * x.element_size() / add_s
    out["kernel_overhead_s"] = (device_kernel_seconds(device) if device.type == "cuda"
                                else host_op_seconds(device, dtype, reps))
    out["attention_flops"] = attention_rate(device, dtype, reps)
    if soak and device.type == "cuda":
        out["gemm_sustained_flops"] = sustained_gemm_flops(device, dtype)
    return out


def sustained_gemm_flops(device, dtype, seconds: float = SOAK_S) -> float:
    """The rate of back-to-back 8192^3 GEMMs over the second half of `seconds` of them, timed in
    windows of about a quarter second (the host queues a window ahead of the GPU)."""
    n = 8192
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    per_window = max(1, int(0.25 / _time(lambda: a @ b, device, 5)))
    rates = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        for _ in range(per_window):
            a @ b
        torch.cuda.synchronize()
        rates.append(2.0 * n**3 * per_window / (time.perf_counter() - t0))
    return float(np.median(rates[len(rates) // 2:]))


def host_op_seconds(device, dtype, reps: int) -> float:
    """The fixed cost of one op on a device that runs its ops as the host issues them (a CPU):
    dispatch, autograd bookkeeping and the op, from a tiny forward+backward of 10 ops (3
    forward: matmul, relu, sum; ~7 backward)."""
    w = torch.ones(4, 4, device=device, dtype=dtype, requires_grad=True)
    v = torch.ones(4, 4, device=device, dtype=dtype)
    return _time(lambda: (v @ w).relu().sum().backward(), device, reps * 20) / 10


def device_kernel_seconds(device) -> float:
    """The fixed cost of one kernel on a GPU's timeline (simpar's kernel_overhead_us): the
    time per tiny kernel that the GPU takes once the host has queued them ahead of it, as in a
    step whose GPU is the bottleneck. GEMMs first keep the GPU busy while the host queues
    TINY_KERNELS one-element adds; CUDA events time the adds alone. (The host's own cost per
    op, which bounds a step only when the GPU outruns it, is the stack's launch_us.)"""
    a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
    x = torch.zeros(1, device=device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    for _ in range(25):  # ~35 ms of GEMMs on a Hopper GPU: more than the host takes to queue
        a @ a
    start.record()
    for _ in range(TINY_KERNELS):
        x.add_(1.0)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e-3 / TINY_KERNELS


def attention_rate(device, dtype, reps: int) -> float:
    """Causal SDPA's FLOP rate (the causal half skipped): forward alone on a CPU, forward and
    backward (2.5 times the forward's FLOPs) on a GPU, whose attention_efficiency is a
    forward-and-backward figure."""
    b, h, s, d = ATTENTION_PROBE[device.type]
    fwd_flops = 0.5 * 4 * b * h * s * s * d
    if device.type != "cuda":
        q = torch.randn(b, h, s, d, device=device, dtype=dtype)
        return fwd_flops / _time(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True),
                                 device, reps)
    q, k, v = (torch.randn(b, h, s, d, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))
    grad = torch.randn(b, h, s, d, device=device, dtype=dtype)

    def step():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)

    return 3.5 * fwd_flops / _time(step, device, reps)


def long_attention_flops(probe_flops: float, device_type: str) -> float:
    """The long-sequence attention rate the cost model's attention_efficiency holds, from the
    probe's rate at its ATTENTION_PROBE causal tokens: the probe's query tiles attend to half
    of them on average, where a GPU kernel runs below its long-sequence rate
    (simpar.cost.compute.attention_overhead); so a GPU's profile reproduces its own probe. A CPU's
    is kept as measured: its SDPA shows no such penalty (43 GFLOP/s at 256 tokens against 45 at
    512 on this project's VM), but the cost model's penalty there stands in for CPU costs it does
    not price yet (README, "Measured against predicted on this machine")."""
    from simpar.cost.compute import attention_overhead

    if device_type == "cpu":
        return probe_flops
    return probe_flops * attention_overhead(ATTENTION_PROBE[device_type][2] / 2)


def overlap_slowdown(device, dtype, reps: int, allreduce_bytes_per_s: float) -> float:
    """Compute seconds lost per second of a collective running beside it: with GEMM time
    g, all-reduce time c and both at once b, b = max(g, c) + s min(g, c) (the cost
    model's `overlapped`). The all-reduce is sized to last about as long as the GEMMs: a
    short one drowns in the GEMMs' own jitter."""
    a = torch.randn(1024, 1024, device=device, dtype=dtype)

    def gemms():
        for _ in range(4):
            a @ a

    # every rank sizes the same all-reduce
    g = _slowest({"gemm_s": _time(gemms, device, reps)}, device)["gemm_s"]
    numel = int(min(2**26, max(2**16, g * allreduce_bytes_per_s / 4)))
    x = torch.zeros(numel, device=device, dtype=torch.float32)

    def both():
        work = dist.all_reduce(x, async_op=True)
        gemms()
        work.wait()

    c = _time(lambda: dist.all_reduce(x), device, reps)
    b = _time(both, device, reps)
    return min(1.0, max(0.0, (b - max(g, c)) / max(min(g, c), 1e-12)))


# The compute a step runs between two of its collectives, as one GEMM: a collective timed in a
# back-to-back loop finds its peers ready and their threads awake, while in a step it starts
# after compute that ends at a slightly different time on each rank (and, with gloo, a
# transport thread that has to wake up). Timed after this GEMM, minus the GEMM alone, it costs
# what a step pays for it: on a 2-core VM twice the back-to-back time at 512 KiB.
STEP_GEMM = (512, 1536, 512)
# each collective is timed over this many times --reps calls: a difference of two loops
COLLECTIVE_REPS = 4


def collectives(device, reps: int, dtype=torch.float32) -> dict:
    """Seconds against bytes of each collective kind in the form torch's parallelisms call it:
    all-reduce (DDP), all_gather_into_tensor and reduce_scatter_tensor (FSDP2, DTensor), each
    as a step issues it, after a block of compute (STEP_GEMM); bytes are the full tensor (the
    gathered output, the scattered input), as simpar prices them."""
    n = dist.get_world_size()
    m, k, w = STEP_GEMM
    a, b = torch.randn(m, k, device=device, dtype=dtype), torch.randn(k, w, device=device,
                                                                       dtype=dtype)
    calls = COLLECTIVE_REPS * reps
    res: dict[str, list[tuple[int,
                              float]]] = {"allreduce": [], "allgather": [], "reducescatter": []}
    for size in SIZES:
        full = torch.zeros(size // 4 // n * n, device=device, dtype=torch.float32)
        shard = torch.zeros(full.numel() // n, device=device, dtype=torch.float32)
        ops = {"allreduce": partial(dist.all_reduce, full),
               "allgather": partial(dist.all_gather_into_tensor, full, shard),
               "reducescatter": partial(dist.reduce_scatter_tensor, shard, full)}
        for op, call in ops.items():
            # the GEMM alone is timed again beside each collective: a busy machine's speed
            # drifts between loops, and the difference of two adjacent ones cancels it
            compute = _time(lambda: a @ b, device, calls)
            after = _time(lambda call=call: (a @ b, call()), device, calls)
            res[op].append((size, max(after - compute, 0.0)))
    return res


def dtensor_probe_block(model, device_type: str, tokens: int):
    """(block shape, tokens) dtensor_op_seconds times: tiny on a GPU, `model`'s widths (one dense
    layer, a token vocabulary of 64) at `tokens` tokens on a CPU where a model execpar runs is
    given (not latent attention, which execpar refuses)."""
    from simpar.specs.model import ModelSpec

    if model is not None and device_type == "cpu" and not model.is_mla:
        return replace(model, name="probe", layers=1, vocab=64, experts=1, dense_layers=0), tokens
    return ModelSpec(name="probe", layers=1, hidden=64, heads=4, kv_heads=2, ffn_hidden=128,
                     vocab=64), 16


def dtensor_op_seconds(device, reps: int, model=None, tokens: int = 16) -> float:
    """CPU time DTensor's dispatch adds per op of a tensor-parallel block, as the cost model
    counts a block's ops (its GEMMs and eager elementwise kernels): execpar's own block,
    parallelised by apply_tp with sequence parallelism on a one-rank tp mesh (every DTensor
    dispatch, sharding propagation and redistribution runs, no data moves), forward and backward,
    against the same block on plain tensors. On a GPU the block is tiny, so that only the host
    cost is left. On a CPU the same core runs the kernels, whose data evicts the interpreter's
    caches: DTensor's Python costs twice as much per op beside a real block's GEMMs (25 against
    11 us per dispatch for a 512-wide block of 256 tokens), and DTensor runs more kernels than
    plain tensors do for the same block, whose cost grows with the tokens. So there the block has
    `model`'s widths and `tokens` tokens where they are given: the figure holds at those widths."""
    import copy

    from torch.distributed.device_mesh import init_device_mesh

    from execpar.model import Transformer
    from execpar.parallelize import apply_tp
    from simpar.workload.layer import layer_work

    spec, seq = dtensor_probe_block(model, device.type, tokens)
    plain = Transformer(spec).to(device)
    sharded = copy.deepcopy(plain)
    apply_tp(
        sharded,
        init_device_mesh(device.type, (dist.get_world_size(), 1),
                         mesh_dim_names=("dp", "tp"))["tp"], sequence_parallel=True)
    x = torch.randn(1, seq, spec.hidden, device=device, requires_grad=True)

    def step(block):
        return lambda: block(x).sum().backward()

    # alternated, the least of three of each: a big block's time varies by more than DTensor adds
    times = [(_time(step(sharded.layers["0"]), device, reps),
              _time(step(plain.layers["0"]), device, reps)) for _ in range(3)]
    added = min(t[0] for t in times) - min(t[1] for t in times)
    work = layer_work(spec, seq, 1, 1, 1, 1, False, True, "fp32", "eager")
    # forward, backward (2x)
    return max(0.0, added) / (3 * (len(work.gemms) + work.elementwise_kernels))


def fit_ring(points, n: int) -> tuple[float, float]:
    """(bytes/s, seconds per step) of t = 2(n-1) alpha + 2(n-1)/n K / B fitted by least squares."""
    sizes = np.array([p[0] for p in points], dtype=float)
    times = np.array([p[1] for p in points])
    slope, intercept = np.polyfit(sizes, times, 1)
    bw = 2 * (n - 1) / n / max(slope, 1e-15)
    return float(bw), float(max(intercept, 0.0)) / (2 * (n - 1))


def collective_efficiency(coll: dict, n: int, bw: float) -> dict:
    """Each gather and scatter kind's bandwidth against the all-reduce's (bw): the slope of its own
    least-squares line of time on bytes, read as (n-1)/n of the bytes at its bandwidth.
    NCCL runs them at the all-reduce's bus bandwidth; gloo's run well below it, the more
    so for large messages. On a busy host a line can come out flat or falling: the all-reduce's
    then gives no bandwidth to compare with (fit_ring's 1e15 B/s) and its ratio rounds to 0, which
    the cluster spec refuses (seen once in CI); such a kind is left out, priced at the
    all-reduce's speed as where none was measured."""
    out = {}
    for op in ("allgather", "reducescatter"):
        points = coll.get(op, [])
        if len(points) >= 2:
            slope = np.polyfit([p[0] for p in points], [p[1] for p in points], 1)[0]
            ratio = round(float(min(1.0, (n - 1) / n / max(slope, 1e-15) / bw)), 4)
            if ratio > 0:
                out[op] = ratio
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", choices=["cpu", "cuda"])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--model",
                    help="also time every GEMM and the attention of this model (catalog name or "
                    "file) at --seq-len")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, default=1,
                    help="largest micro-batch to time the GEMMs and attention at")
    ap.add_argument("--soak", action="store_true",
                    help="a GPU's sustained GEMM rate too (SOAK_S of back-to-back GEMMs)")
    args = ap.parse_args(argv)
    device_type = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    device = torch.device("cpu")
    if device_type == "cuda":
        device = torch.device(device_type, torch.cuda.current_device())
    dtype = torch.bfloat16 if device_type == "cuda" else torch.float32
    model = None
    if args.model:
        from simpar.specs.loaders import load_model

        model = load_model(args.model)
    # streaming kernels touch activations of micro-batch x sequence x hidden elements
    elements = args.micro_batch * args.seq_len * model.hidden if model else 2**23
    n = dist.get_world_size()
    local = measure(device, dtype, args.reps, max(elements, 2**16), args.soak)
    local["dtensor_op_s"] = dtensor_op_seconds(device, args.reps * 4, model, args.seq_len)
    coll = collectives(device, args.reps, dtype) if n > 1 else {}
    # one process has no link to measure (and a one-rank all-reduce is a no-op): its "links" are
    # never used by a one-device plan, so they get the device's own copy rate and launch cost
    if n > 1:
        local["link_bytes_per_s"], local["link_alpha_s"] = fit_ring(coll["allreduce"], n)
    else:
        local["link_bytes_per_s"] = local["stream_bytes_per_s"]
        local["link_alpha_s"] = local["kernel_overhead_s"]
    local = _slowest(local, device)
    local["overlap_slowdown"] = _slowest({"overlap_slowdown": overlap_slowdown(
        device, dtype, args.reps, local["link_bytes_per_s"])}, device)["overlap_slowdown"]
    tables: dict[str, list] = {}
    if model:
        tps = tuple(sorted({1, n}))
        gemms = model_gemm_shapes(model, args.seq_len, args.micro_batch, tps)
        tables["gemm_table"] = mean_over_ranks(gemm_table(gemms, device, dtype, args.reps), 1,
                                               device)
        attention = model_attention_shapes(model, args.seq_len, args.micro_batch, tps)
        if attention:
            tables["attention_table"] = mean_over_ranks(
                attention_table(attention, device, dtype, args.reps), 2, device)
    if dist.get_rank() == 0:
        write_profile(args.out, local, n, device_type, coll, tables,
                      "bf16" if device_type == "cuda" else "fp32")
    dist.barrier()  # no rank tears its groups down while another still has a collective in flight
    close_process_group()
    return 0


# measurements where the largest value is the slowest rank's (times); for the others
# (rates) the smallest is
SECONDS = ("kernel_overhead_s", "dtensor_op_s", "link_alpha_s", "overlap_slowdown", "gemm_s")


def _slowest(local: dict, device) -> dict:
    """The slowest rank's value of each measurement: it sets the pace of a synchronous
    job. Reduced on the process group's device (NCCL reduces only CUDA tensors)."""
    keys = sorted(local)
    vals = torch.tensor([local[k] if k in SECONDS else -local[k] for k in keys],
                        dtype=torch.float64, device=device)
    dist.all_reduce(vals, op=dist.ReduceOp.MAX)
    return {
        k: float(v) if k in SECONDS else -float(v) for k, v in zip(keys, vals.tolist(), strict=True)
    }


def write_profile(path: str, m: dict, n: int, device_type: str, coll: dict, tables: dict,
                  table_dtype: str) -> None:
    bw, alpha = m["link_bytes_per_s"], m["link_alpha_s"]
    host = platform.node() or "host"
    tflops = m["gemm_flops"] / 1e12
    # what the device says of itself: a GPU's multiprocessors set the cost model's wave
    # quantization, its compute capability the architecture (Hopper's fp8 and FA2 rules)
    shape: dict = {"sm_count": 1, "arch": "cpu"}
    if device_type == "cpu":
        mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 / n
    else:
        props = torch.cuda.get_device_properties(0)
        mem_gib = props.total_memory / 2**30
        shape = {"sm_count": props.multi_processor_count,
                 **({"arch": ARCH[props.major]} if props.major in ARCH else {})}
    profile = {
        "name": f"calibrated-{host}",
        "gpu": {
            "name": f"{device_type}-{host}", "fp32_tflops": tflops, "tf32_tflops": tflops,
            "bf16_tflops": tflops, "fp8_tflops": 0.0, "hbm_gib": round(mem_gib, 2),
            "hbm_tbps": m["stream_bytes_per_s"] / 1e12, "sm_count": shape["sm_count"],
            "gemm_efficiency": 1.0,
            "attention_efficiency": min(1.0, long_attention_flops(m["attention_flops"],
                                                                   device_type) / m["gemm_flops"]),
            "hbm_efficiency": 1.0, "kernel_overhead_us": m["kernel_overhead_s"] * 1e6,
            "overlap_slowdown": m["overlap_slowdown"], "dtensor_op_us": m["dtensor_op_s"] * 1e6,
            **({"arch": shape["arch"]} if "arch" in shape else {})
        },
        "gpus_per_node": n,
        "intra_node_bw_gbps": bw / 1e9,
        "intra_node_latency_us": alpha * 1e6,
        "nic_bw_gbps": bw / 1e9,
        "inter_node_latency_us": alpha * 1e6,
        "intra_node_efficiency": 1.0,
        "inter_node_efficiency": 1.0,
        "topology": {"kind": "local"},
    }
    efficiency = collective_efficiency(coll, n, bw)
    if efficiency:
        profile["collective_efficiency"] = efficiency
    gpu = profile["gpu"]
    sustained = m.get("gemm_sustained_flops", 0.0) / m["gemm_flops"]
    capped = 0 < sustained < SUSTAINED_BELOW  # the rates above are burst rates: record both
    if capped:
        gpu.update(gemm_efficiency=sustained, burst_gemm_efficiency=1.0,
                   attention_efficiency=gpu["attention_efficiency"] * sustained)
    # measured GEMMs and attention override the single rates above for the shapes they hold
    for name, table in tables.items():
        gpu.update({name: table, f"{name}_dtype": table_dtype})
    if "gemm_table" in tables and capped:
        gpu["gemm_table_efficiency"] = 1.0
    notes = [
        f"# simpar calibrate on {host} ({device_type}, {n} processes, torch {torch.__version__}):",
        "# best GEMM rate over workload-like shapes, streaming bandwidth of an add, a 1-element "
        "op's time",
        "# (a GPU's: a tiny kernel's on its timeline, the host queued ahead), causal SDPA's rate "
        "(a GPU's:",
        "# forward and backward at 4K tokens), the compute lost to an all-reduce running beside "
        "GEMMs (overlap_slowdown),",
        "# DTensor's dispatch cost per op, all-reduce time vs size (1 KiB..16 MiB) fitted to the "
        "ring model",
        "# and the gather and scatter kinds' speed against it (collective_efficiency); with "
        "--model, the time",
        "# of every GEMM of that model's step (gemm_table: m, n, k, seconds) and of its causal "
        "attention",
        "# (attention_table: sequences x heads, tokens, head dim, forward and backward seconds), "
        "which predictions use directly;",
        "# with --soak, a GPU's sustained rate too: 8192^3 GEMMs back to back for seconds, at its "
        "power cap (gemm_efficiency, burst 1)."
    ]
    notes += [
        f"# {op} (bytes, seconds): " + ", ".join(f"{s}:{t:.2e}" for s, t in points)
        for op, points in coll.items()
    ]
    if not coll:
        notes.append("# collectives: none (one process: no link to measure)")
    write_text(path, "\n".join(notes) + "\n" + yaml.safe_dump(profile, sort_keys=False))


if __name__ == "__main__":
    sys.exit(main())
