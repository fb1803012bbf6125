"""The casts torchao's Float8Linear (tensorwise recipe) runs around a layer's fp8 GEMMs, as
torchtitan's float8 converter and execpar apply it (Stack.fp8_casts "torchao"). Transformer
Engine's fused casts are priced with the layer's other memory-bound kernels instead
(workload/layer.py, Precision.cast_bytes).

Each of a linear's three GEMMs casts both its operands itself (torchao/float8/float8_linear.py,
matmul_with_hp_or_float8_args): forward the input and the weight; backward the output gradient
twice (for the input gradient and for the weight gradient), and the weight and the input once
more. Code that keeps q, k and v (and a gated MLP's gate and up) as separate linears casts
their shared input once per linear. One cast is an amax (abs, then max), the scale from it
(to fp64, clamp, divide, to fp32) and the scaled copy (to fp32, multiply, clamp, to fp8:
float8_utils.py and float8_training_tensor.py).
"""

from __future__ import annotations

from dataclasses import dataclass

# Eager: the op chain reads and writes 4 + 2 + 6 + 8 + 8 + 5 = 33 bytes per element of a bf16
# tensor (and of an fp32 weight, whose cast to fp32 is a no-op but whose abs and max read 4);
# its unvectorized multiply by the 0-dim scale and fp8 copy run slower than that: on an H200 the
# cast of a 16384 x 4096 bf16 tensor took 10.0 times a copy of it, 40 bytes at the copy's rate
# (benchmarks/fp8_cast.py, reports/fp8-execpar-h200/fp8_cast.json). Ten kernels per cast.
EAGER_CAST_BYTES, EAGER_CAST_KERNELS = 40.0, 10
# Compiled: Inductor fuses the amax into the kernel producing the tensor where it can, so a cast
# reads the tensor for its amax and again for the scaled copy, and writes one byte: 5 bytes, two
# kernels (an amax reduction, a pointwise cast)
COMPILED_CAST_BYTES, COMPILED_CAST_KERNELS = 5.0, 2
# Eager only: torch._scaled_mm takes its first operand row-major and its second column-major,
# so torchao's preprocess_addmm (float8_ops.py) copies the weight (for the input gradient) and
# the output gradient and the input (for the weight gradient) transposed, one byte each way;
# these strided one-byte copies are slow: TRANSPOSE_BYTES at the copy's rate per element,
# measured on an H200 (benchmarks/fp8_cast.py). A compiled graph writes its casts in the layout
# the GEMM takes.
TRANSPOSE_BYTES = 14.0


@dataclass(frozen=True)
class CastWork:
    """A layer's fp8 casts for one micro-batch on one rank: bytes at the memory-bound rate and
    kernels, in forward and in backward."""
    forward_bytes: float = 0.0
    backward_bytes: float = 0.0
    forward_kernels: int = 0
    backward_kernels: int = 0


def torchao_casts(gemms, input_copies: dict[str, int], compiled: bool) -> CastWork:
    """CastWork of the weight GEMMs `gemms` (layer_work's, the router's left out: torchtitan's
    float8 filter and execpar's skip it), each GEMM group's input cast `input_copies[name]`
    times (1 unless its linears are kept separate)."""
    cast_bytes = COMPILED_CAST_BYTES if compiled else EAGER_CAST_BYTES
    per_cast = COMPILED_CAST_KERNELS if compiled else EAGER_CAST_KERNELS
    fwd = bwd = transposed = 0.0
    linears = 0
    for g in gemms:
        if g.name == "router":
            continue
        copies = input_copies.get(g.name, 1)
        inputs, weights, grads = (g.m * g.k * g.count * copies, g.n * g.k * g.count,
                                  g.m * g.n * g.count)
        fwd += inputs + weights
        bwd += 2 * grads + weights + inputs
        transposed += inputs + weights + grads
        linears += g.count * copies
    copies_b = 0.0 if compiled else TRANSPOSE_BYTES * transposed
    return CastWork(cast_bytes * fwd, cast_bytes * bwd + copies_b, 2 * per_cast * linears,
                    4 * per_cast * linears + (0 if compiled else 3 * linears))
