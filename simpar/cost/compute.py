"""Compute roofline: the time of GEMMs, fused attention and memory-bound kernels on one GPU."""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from simpar.specs.precision import get_precision, unquantized
from simpar.workload.layer import Gemm

# Output tile of a tensor-core GEMM kernel (CUTLASS / cuBLAS 16-bit kernels use 128x128 and
# 128x256): the tiles are spread over the SMs in waves, and a partial last wave leaves SMs idle.
GEMM_TILE = (128, 128)
# Each output tile also pays a fixed cost outside its main loop over K: the software
# pipeline's prologue fills its shared-memory stages (CUTLASS mainloops run 3-5 stages of
# 32-64 wide K slices) before the first MMA, and the epilogue converts and stores the
# accumulator. The epilogue overlaps other work (a second CTA on the SM on Ampere; the next
# tile's mainloop in Hopper's persistent, warp-specialised kernels), leaving about the
# pipeline fill, 128 elements of K: a tile runs at K / (K + 128) of its steady rate, 94% at K
# = 2048 and 98% at K = 8192. The GPU's gemm_efficiency (MAMF, measured at the best, large-K
# shape) already holds the steady rate. The fill takes the same time at any precision while an
# fp8 main loop runs twice as fast, so in K elements the overhead scales with the peak rate.
GEMM_K_OVERHEAD = 128
# A FlashAttention kernel loops each query tile over key blocks of 128; per query tile it also
# loads Q, rescales and stores O and the log-sum-exp, and with causal masking computes its
# diagonal block half wasted: about 192 keys' worth of work on top of the keys it attends to.
# Short sequences and small context-parallel chunks therefore run below the kernel's long-sequence
# rate (FlashAttention-2 paper, Fig. 4-5: causal fwd+bwd at 512 tokens about half the 8K rate).
ATTENTION_OVERHEAD_KEYS = 192
# FlashAttention-2 is written for Ampere's mma.sync tensor-core instructions; on Hopper, where only
# wgmma reaches the dense peak, it runs at about 35% of it (FlashAttention-3 paper, Shah et al.
# 2024, arXiv:2407.08608, abstract and Fig. 1). torch's SDPA flash backend is FlashAttention-2.
FA2_HOPPER_EFFICIENCY = 0.35
# A fused attention backward runs five GEMMs against the forward's two (it recomputes the scores):
# 2.5x the forward FLOPs. FlashAttention-2's backward also runs below its forward's utilisation, 63%
# of A100 peak against 73% (Dao 2023, arXiv:2307.08691, section 4.1); a GPU's attention_efficiency
# is a forward-and-backward figure already, FA2_HOPPER_EFFICIENCY a forward one.
FLASH_BACKWARD_FACTOR = 2.5
FA2_BACKWARD_UTILISATION = 63 / 73
# The Triton FlashAttention of 2023 (flash_attn_triton.py, the kernel MPT's ALiBi needed before
# FlashAttention-2 supported it) is Ampere mma code too, and slower than FlashAttention-2 on
# the same GPU: FA2 runs forward+backward "1.3-2.5x faster than FlashAttention in Triton" (Dao
# 2023, arXiv:2307.08691, section 4.1); the geometric middle of that range.
TRITON_FA_SLOWDOWN = 1.8
# Hopper's tensor cores accumulate fp8 products in a narrow fixed-point register (about 14
# bits kept, DeepSeek-V3 report, arXiv:2412.19437, section 3.3.2), so fp8 training recipes
# keep "fast accumulation" for the forward GEMM only and run the input- and weight-gradient
# GEMMs with a split accumulator that promotes partial sums to fp32 in the CUDA cores
# (Transformer Engine module/base.py: _2X_ACC_FPROP = False, _2X_ACC_DGRAD = _2X_ACC_WGRAD
# = True; torchao float8's config: use_fast_accum in forward only). Fast accumulation is
# 1.1-1.2x faster on H100 at LLM shapes (pytorch/ao issue 2377); we take 1.15.
FP8_SPLIT_ACCUMULATOR_SLOWDOWN = 1.15


def gemm_time(g: Gemm, gpu, dtype: str) -> float:
    """max(FLOPs at the achievable rate after wave quantization and the per-tile K
    overhead, bytes at achievable HBM bandwidth), or the GPU's measured time where its
    profile has a table in `dtype` (at the clock priced, where the table says its own)."""
    if gpu.gemm_table and dtype == gpu.gemm_table_dtype:
        measured = g.count * measured_gemm_seconds(gpu.gemm_table, g.m, g.n, g.k)
        if not gpu.gemm_table_efficiency:
            return measured
        return measured * gpu.gemm_table_efficiency / gpu.gemm_fraction(dtype)
    # GEMMs that run together (one batched or grouped kernel, or kernels on parallel streams)
    # spread their tiles over the SMs at once
    per_kernel = min(g.together, g.count)
    tiles = math.ceil(g.m / GEMM_TILE[0]) * math.ceil(g.n / GEMM_TILE[1]) * per_kernel
    waves = math.ceil(tiles / gpu.sm_count)
    wave_eff = tiles / (waves * gpu.sm_count)
    peak = gpu.peak_tflops(dtype)
    # the fill is GEMM_K_OVERHEAD elements of K at the 16-bit tensor-core rate
    k_overhead = GEMM_K_OVERHEAD * peak / (gpu.bf16_tflops or peak)
    rate = peak * 1e12 * gpu.gemm_fraction(dtype) * wave_eff * g.k / (g.k + k_overhead)
    flops = 2.0 * g.m * g.n * g.k * per_kernel
    ib = get_precision(dtype).gemm_input_bytes
    # inputs at the GEMM precision, 16-bit output
    moved = (ib * (g.m * g.k + g.k * g.n) + 2 * g.m * g.n) * per_kernel
    per_launch = max(flops / rate, moved / hbm_rate(gpu)) + gpu.kernel_overhead_us * 1e-6
    return g.count / per_kernel * per_launch


def backward_gemm_factor(gpu, dtype: str) -> float:
    """Backward GEMM time over forward: an input- and a weight-gradient GEMM of the forward's
    FLOPs, each slower in fp8 on Hopper where they run with a split accumulator."""
    # Hopper has per-tensor fp8 only
    split = get_precision(dtype).quantized and gpu.arch == "hopper"
    return 2.0 * (FP8_SPLIT_ACCUMULATOR_SLOWDOWN if split else 1.0)


@lru_cache(maxsize=64)
def _table_index(table: tuple, keys: int) -> tuple[dict, np.ndarray]:
    """A measured table's exact shapes (its first `keys` columns) -> their times (the rest), and
    the rows' log-shapes for nearest lookups."""
    exact = {tuple(int(v) for v in row[:keys]): row[keys:] for row in table}
    return exact, np.log([row[:keys] for row in table])


def _measured(table: tuple, shape: tuple[int, ...], work) -> tuple[float, ...]:
    """The times of `shape` in a measured table: its own row's where it holds one, otherwise the
    row nearest in the logs of each dimension (efficiency moves with each one's scale), scaled
    by `work`(shape) over the row's."""
    exact, shapes = _table_index(table, len(shape))
    if shape in exact:
        return exact[shape]
    row = table[int(np.argmin(((shapes - np.log(shape)) ** 2).sum(axis=1)))]
    scale = work(*shape) / work(*row[:len(shape)])
    return tuple(t * scale for t in row[len(shape):])


def measured_gemm_seconds(table: tuple, m: int, n: int, k: int) -> float:
    """A measured GEMM's time (gemm_table rows: m, n, k, seconds), the nearest shape's at its
    FLOP rate where the table does not hold it."""
    return _measured(table, (m, n, k), lambda m, n, k: m * n * k)[0]


def measured_attention_seconds(table: tuple, batch_heads: int, tokens: int,
                               head_dim: int) -> tuple[float, float]:
    """(forward, backward) seconds of a causal attention kernel over `batch_heads` sequences x
    heads of `tokens` at `head_dim` (attention_table rows), the nearest shape's at its rates of
    causal matmul work (bh x s^2 x d) where the table does not hold it."""
    forward, backward = _measured(table, (batch_heads, tokens, head_dim),
                                  lambda bh, s, d: bh * s * s * d)
    return forward, backward


def attention_from_table(gpu, dtype: str, shape: tuple[int, int, int],
                         kernel: str) -> tuple[float, float] | None:
    """(forward, backward) seconds of a layer's causal attention of `shape` (sequences x heads,
    tokens, head dim; zeros: not one full causal kernel) from the GPU's measured table, where it
    has one in the attention's precision (16-bit in fp8 recipes) and the stack runs the `kernel`
    the table timed (SDPA's own choice, "best"; not FlashAttention-2 or Triton's), at the clock
    priced; None otherwise."""
    if not (gpu.attention_table and unquantized(dtype) == gpu.attention_table_dtype
            and all(shape) and kernel == "best"):
        return None
    forward, backward = measured_attention_seconds(gpu.attention_table, *shape)
    return forward / gpu.clock_fraction, backward / gpu.clock_fraction


def hbm_rate(gpu) -> float:
    return gpu.hbm_tbps * 1e12 * gpu.hbm_efficiency


def memory_bound_time(nbytes: float, gpu, kernels: int) -> float:
    return nbytes / hbm_rate(gpu) + kernels * gpu.kernel_overhead_us * 1e-6


def _fa2_below_best(gpu, kernel: str) -> bool:
    """FlashAttention-2 (or its slower Triton sibling) on Hopper and later, which it
    cannot drive at the wgmma rate."""
    return kernel in ("fa2", "triton") and gpu.arch in ("hopper", "blackwell")


def attention_efficiency(gpu, kernel: str) -> float:
    """Achievable fraction of peak of a fused attention kernel: the GPU's best ("best"),
    FlashAttention-2's forward rate where it falls below it (at the GPU's clock: a power
    limit slows it as it slows the best kernel), and the Triton kernel's below that."""
    fa2 = FA2_HOPPER_EFFICIENCY * gpu.clock_fraction
    best = (
        min(gpu.attention_efficiency, fa2)
        if _fa2_below_best(gpu, kernel)
        else gpu.attention_efficiency
    )
    return best / TRITON_FA_SLOWDOWN if kernel == "triton" else best


def attention_backward_factor(gpu, kernel: str) -> float:
    """Backward time of a fused attention kernel over its forward time."""
    return FLASH_BACKWARD_FACTOR / (FA2_BACKWARD_UTILISATION
                                    if _fa2_below_best(gpu, kernel) else 1.0)


def attention_overhead(keys_per_query: float) -> float:
    """Time of a fused attention kernel whose query tiles attend to `keys_per_query` keys on
    average (0: long), over its long-sequence time (ATTENTION_OVERHEAD_KEYS)."""
    return 1.0 + ATTENTION_OVERHEAD_KEYS / keys_per_query if keys_per_query > 0 else 1.0


# Dropout inside a fused attention kernel draws a Philox random number for each score, in forward
# and again in backward, which also masks dP: integer work on the SM's own pipes between the
# tensor-core matmuls, as the exponential is, and as much per score at any head dim. FlashAttention-
# 4's dropout, measured on a GB200 beside cuDNN 9.24's (Dao-AILab/flash-attention PR #2597, p =
# 0.125, head dims 64 and 128, ~32K tokens), runs forward at 75-85% and backward at 60-70% of the
# same kernel's rate without it, whatever the sequence length. In exponentials' worth of time per
# score (B200: 512 FLOPs each), 0.35 forward and 1.5 backward span those ranges: head dim 128 at
# their tops (85%: (512 + 512) x (1/0.85 - 1) = 181 FLOPs; 70%: (1,280 + 512) x (1/0.7 - 1) =
# 768), head dim 64 at their bottoms (81% and 60%). The instructions per score are the same on
# every generation, so they weigh against the tensor cores as the exponential does: at head dim
# 128 an H100 runs forward 1.12x and backward 1.25x slower, an A100 1.07x and 1.14x. (An unfused
# softmax's dropout is memory traffic: workload/layer.py's softmax bytes.)
DROPOUT_EXPS = (0.35, 1.5)

# matmul FLOPs per score of an attention forward at head dim 128 (QK^T and PV, 2 x (128 + 128)):
# the head dim attention_efficiency holds at
REFERENCE_SCORE_FLOPS = 512.0


def attention_softmax_factor(gpu, head_dims: tuple[int, int], backward: bool) -> float:
    """A fused attention kernel's time per matmul FLOP at (query-key, value) `head_dims` over its
    time at 128 on the part attention_efficiency was measured on (gpu.attention_exp_ratio: this
    one's but for Blackwell Ultra, which takes B200's): each score costs its matmul FLOPs and one
    exponential, worth gpu.exp_ratio FLOPs of tensor-core time (one after the other: a tile's
    softmax sits between its two matmuls, which wait for it). A forward's score has
    2 x (dqk + dv) FLOPs, a backward's 2 x (3 dqk + 2 dv) (QK^T again, dP, dV, dQ, dK) and its
    one exponential (P again). So on Hopper head dim 64 runs a forward 1.33x and a backward
    1.17x slower per FLOP. execpar's cuDNN attention on an H200 ran 1.32x and 1.28x (medians,
    measured over predicted, of the 8 runs of the 1B model against the 14 of the 3B and 8B in
    reports/gpu-validation-h200*): the backward's other per-score work (dS = P (dP - D), in
    fp32) is not counted."""
    ratio, measured = gpu.exp_ratio, gpu.attention_exp_ratio
    if not ratio:
        return 1.0
    dqk, dv = head_dims
    if backward:  # at head dim 128: 2 x (384 + 256) = 2.5 x the forward's 512
        per_score, reference = 2.0 * (3 * dqk + 2 * dv), 2.5 * REFERENCE_SCORE_FLOPS
    else:
        per_score, reference = 2.0 * (dqk + dv), REFERENCE_SCORE_FLOPS
    return (1.0 + ratio / per_score) / (1.0 + measured / reference)


def attention_dropout_factor(gpu, head_dims: tuple[int, int], backward: bool) -> float:
    """A fused attention kernel's time with dropout over its time without (DROPOUT_EXPS), at
    (query-key, value) `head_dims`; 1 where the GPU's exponential rate is unknown. The random
    numbers run on the SM's integer pipes, which Blackwell Ultra did not widen as it did the
    exponential's (gpu.attention_exp_ratio: B200's there)."""
    ratio, measured = gpu.exp_ratio, gpu.attention_exp_ratio
    if not ratio:
        return 1.0
    dqk, dv = head_dims
    per_score = 2.0 * (3 * dqk + 2 * dv) if backward else 2.0 * (dqk + dv)
    return 1.0 + DROPOUT_EXPS[backward] * measured / (per_score + ratio)


def flash_attention_time(flops: float, gpu, dtype: str, kernel: str = "best",
                         keys_per_query: float = 0.0, calls: int = 1) -> float:
    """Fused attention (16-bit even in fp8 recipes, the Transformer Engine default):
    `flops` executed in `calls` kernels whose query tiles each attend to
    `keys_per_query` keys on average (0: long)."""
    if flops <= 0:
        return 0.0
    peak = gpu.peak_tflops(unquantized(dtype)) * 1e12
    short = attention_overhead(keys_per_query)
    return (
        flops * short / (peak * attention_efficiency(gpu, kernel))
        + calls * gpu.kernel_overhead_us * 1e-6
    )
