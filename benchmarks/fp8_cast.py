"""What fp8 costs besides its GEMMs, as execpar runs it: torchao's tensorwise cast of one bf16
tensor to float8 (amax, scale, saturating cast), eager and compiled, and of an fp32 weight read
transposed, and the transposed copy of an fp8 tensor torchao makes for torch._scaled_mm, each
against a bf16 copy of the same tensor (the memory-bound yardstick); and torch._scaled_mm's
rate against bf16 torch.mm at a model's GEMM shapes. Prints one JSON object (seconds per call,
medians of CUDA-event timings).

    python benchmarks/fp8_cast.py > fp8_cast.json     # on a GPU with fp8 tensor cores
"""

from __future__ import annotations

import json
import statistics

import torch

SHAPES = ((16384, 4096, 4096), (16384, 14336, 4096), (16384, 4096, 14336), (16384, 6144, 4096))


def timed(fn, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def casts(rows: int, cols: int) -> dict:
    from torchao.float8.config import ScalingGranularity
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import LinearMMConfig

    x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)

    def cast():
        return hp_tensor_to_float8_dynamic(x, torch.float8_e4m3fn, LinearMMConfig(),
                                           scaling_granularity=ScalingGranularity.TENSORWISE)

    weight_t = torch.randn(cols, rows, device="cuda").t()  # an fp32 weight as linear reads it
    x8 = x.to(torch.float8_e4m3fn)
    row = {"elements": rows * cols, "copy_s": timed(lambda: x.clone()),
           "cast_eager_s": timed(cast),
           "cast_fp32_weight_eager_s": timed(lambda: hp_tensor_to_float8_dynamic(
               weight_t, torch.float8_e4m3fn, LinearMMConfig(),
               scaling_granularity=ScalingGranularity.TENSORWISE)),
           # the layout copy torchao makes of an fp8 operand _scaled_mm wants the other way
           "fp8_transpose_s": timed(lambda: x8.t().contiguous())}
    try:
        row["cast_compiled_s"] = timed(torch.compile(cast))
    except Exception as err:  # noqa: BLE001 - a measurement to report, not to stop on
        row["compile_error"] = repr(err)[:300]
    return row


def gemms() -> list[dict]:
    rows = []
    for m, n, k in SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        bf16 = timed(lambda a=a, b=b: torch.mm(a, b.t()))
        fp8 = timed(lambda a8=a8, b8=b8, one=one: torch._scaled_mm(
            a8, b8.t(), one, one, out_dtype=torch.bfloat16))
        flops = 2 * m * n * k
        rows.append({"m": m, "n": n, "k": k, "bf16_tflops": flops / bf16 / 1e12,
                     "fp8_tflops": flops / fp8 / 1e12})
    return rows


def main() -> int:
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "casts": [casts(16384, 4096), casts(16384, 14336)], "gemms": gemms()}
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
