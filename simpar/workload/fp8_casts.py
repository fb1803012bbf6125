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
# tensor; its unvectorized multiply by the 0-dim scale and fp8 copy run slower than that: on two
# H200s the cast of a 16384 x 4096 (and x 14336) bf16 tensor took 10.0-10.8 times a copy of it,
# 41 bytes at the copy's rate (benchmarks/fp8_cast.py; its fp8_cast.json in
# reports/gpu-validation-h200-fp8 and -fp8-heldout). An fp32 weight, read through its transpose
# as a linear layer hands it over, took 14.5-15.7 copies: 60 bytes (its abs, max, multiply and
# clamp move 33 bytes, strided). Ten kernels per cast.
EAGER_CAST_BYTES, EAGER_FP32_WEIGHT_CAST_BYTES, EAGER_CAST_KERNELS = 41.0, 60.0, 10
# Compiled: Inductor fuses the amax into the kernel producing the tensor where it can, so a cast
# reads the tensor for its amax and again for the scaled copy, and writes one byte (5 bytes from
# 16 bits, 9 from an fp32 weight); two kernels (an amax reduction, a pointwise cast)
COMPILED_CAST_BYTES, COMPILED_CAST_KERNELS = 5.0, 2
# Eager only: torch._scaled_mm takes its first operand row-major and its second column-major,
# so torchao's preprocess_addmm (float8_ops.py) copies the weight (for the input gradient) and
# the output gradient and the input (for the weight gradient) transposed, one byte each way;
# these strided one-byte copies took 5.5-6.3 times a bf16 copy of as many elements on the H200s:
# 24 bytes at the copy's rate. A compiled graph writes its casts in the layout the GEMM takes.
TRANSPOSE_BYTES = 24.0


@dataclass(frozen=True)
class CastWork:
    """A layer's fp8 casts for one micro-batch on one rank: bytes at the memory-bound rate and
    kernels, in forward and in backward."""
    forward_bytes: float = 0.0
    backward_bytes: float = 0.0
    forward_kernels: int = 0
    backward_kernels: int = 0


# layer_work's GEMM groups a tensor-parallel plan splits by column (their input gathered under
# sequence parallelism) and by row (their output reduce-scattered)
COLUMN_PARALLEL, ROW_PARALLEL = ("qkv", "mlp_up"), ("proj", "mlp_down")


def torchao_casts(gemms, input_copies: dict[str, int], compiled: bool, weight_bytes: int,
                  tp: int = 1, sp: bool = False, *, cast_weights: bool = True) -> CastWork:
    """CastWork of the weight GEMMs `gemms` (layer_work's, the router's left out: torchtitan's
    float8 filter and execpar's skip it), each GEMM group's input cast `input_copies[name]`
    times (1 unless its linears are kept separate), from weights of `weight_bytes` per element
    (4 under autocast, whose fp32 weights torchao casts itself; 2 from FSDP's 16-bit copies).

    Under tensor parallelism (`tp` > 1) torchao's Float8ColwiseParallel and Float8RowwiseParallel
    (float8_tensor_parallel.py; torchtitan's PrepareFloat8ModuleInput for a module's shared input)
    cast a sharded linear's input once, before any gather, and its output gradient once in
    backward, before the gather of the gradient: the linear finds both cast. Under sequence
    parallelism (`sp`) those casts are of this rank's sequence shard: a column-parallel module's
    input (once for q, k and v together), a row-parallel output gradient."""
    if compiled:
        act_bytes, per_cast = COMPILED_CAST_BYTES, COMPILED_CAST_KERNELS
        w_bytes = 2.0 * weight_bytes + 1.0  # its amax read, its scaled read, one byte written
    else:
        w_bytes = EAGER_FP32_WEIGHT_CAST_BYTES if weight_bytes == 4 else EAGER_CAST_BYTES
        act_bytes, per_cast = EAGER_CAST_BYTES, EAGER_CAST_KERNELS
    shard = tp if sp else 1
    fwd = bwd = transposed = 0.0
    casts_f = casts_b = linears = 0
    for g in gemms:
        if g.name == "router":
            continue
        copies = input_copies.get(g.name, 1)
        inputs, weights, grads = (g.input_elements, g.n * g.k * g.count, g.m * g.n * g.count)
        n = g.count * copies  # linears
        if tp > 1 and g.name in COLUMN_PARALLEL:
            # one cast of the module's shard under sp (PrepareFloat8ModuleInput); without it each
            # linear casts the whole input it is handed
            fwd += act_bytes * (inputs / shard if sp else inputs * copies)
            bwd += act_bytes * grads
            casts_f, casts_b = casts_f + (1 if sp else n), casts_b + n
        elif tp > 1 and g.name in ROW_PARALLEL:
            fwd += act_bytes * inputs
            bwd += act_bytes * grads / shard
            casts_f, casts_b = casts_f + n, casts_b + n
        else:
            fwd += act_bytes * inputs * copies
            bwd += act_bytes * (inputs * copies + 2 * grads)
            casts_f, casts_b = casts_f + n, casts_b + n + 2 * n
        if cast_weights:  # the weight, forward and again for the input gradient
            fwd += w_bytes * weights
            bwd += w_bytes * weights
        transposed += inputs * copies + weights + grads
        linears += n
    if cast_weights:
        casts_f, casts_b = casts_f + linears, casts_b + linears  # the weights'
    if not compiled:
        bwd += TRANSPOSE_BYTES * transposed
    return CastWork(fwd, bwd, per_cast * casts_f,
                    per_cast * casts_b + (0 if compiled else 3 * linears))
