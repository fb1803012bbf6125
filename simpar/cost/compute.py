"""Compute roofline: the time of GEMMs, fused attention and memory-bound kernels on one GPU."""

from __future__ import annotations

import math

from simpar.workload.layer import Gemm, gemm_input_bytes

# Output tile of a tensor-core GEMM kernel (CUTLASS / cuBLAS 16-bit kernels use 128x128 and 128x256):
# the tiles are spread over the SMs in waves, and a partial last wave leaves SMs idle.
GEMM_TILE = (128, 128)


def gemm_time(g: Gemm, gpu, dtype: str) -> float:
    """max(FLOPs at the achievable rate after wave quantization, bytes at achievable HBM bandwidth)."""
    tiles = math.ceil(g.m / GEMM_TILE[0]) * math.ceil(g.n / GEMM_TILE[1])
    waves = math.ceil(tiles / gpu.sm_count)
    wave_eff = tiles / (waves * gpu.sm_count)
    rate = gpu.peak_tflops(dtype) * 1e12 * gpu.gemm_efficiency * wave_eff
    flops = 2.0 * g.m * g.n * g.k
    ib = gemm_input_bytes(dtype)
    moved = ib * (g.m * g.k + g.k * g.n) + 2 * g.m * g.n  # inputs at the GEMM precision, 16-bit output
    per_gemm = max(flops / rate, moved / hbm_rate(gpu)) + gpu.kernel_overhead_us * 1e-6
    return g.count * per_gemm


def hbm_rate(gpu) -> float:
    return gpu.hbm_tbps * 1e12 * gpu.hbm_efficiency


def memory_bound_time(nbytes: float, gpu, kernels: int) -> float:
    return nbytes / hbm_rate(gpu) + kernels * gpu.kernel_overhead_us * 1e-6


def flash_attention_time(flops: float, gpu, dtype: str) -> float:
    """Fused attention runs in 16-bit even in fp8 recipes (Transformer Engine default)."""
    if flops <= 0:
        return 0.0
    peak = gpu.peak_tflops("bf16" if dtype == "fp8" else dtype) * 1e12
    return flops / (peak * gpu.attention_efficiency) + gpu.kernel_overhead_us * 1e-6
