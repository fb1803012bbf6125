"""Does a GPU hold its GEMM rate through a training step's sustained load, and does the share of
the step spent in GEMMs change it? The catalog prices Hopper GEMMs at 0.70 of peak, a rate
sustained under load at 700 W, yet execpar's profiled H100 step ran its GEMMs at 0.80
(reports/gpu-validation-h100). This runs one GEMM shape back to back for some seconds ("gemm"),
then the same GEMMs each followed by a memory-bound pass of about the GEMM's time ("mixed", a
half-memory-bound step like execpar's eager one; "eager": the same pass as the many small
kernels of eager fp32 RMSNorms), timing the GEMMs alone with CUDA events, and reads the SM clock
and board power once a second (NVML). Writes OUT/gemm_soak.json and prints a table.

    python benchmarks/gemm_soak.py --out DIR [--seconds 10] [--modes gemm mixed eager]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

# Llama-3-8B's MLP up-projection at 16K tokens, and the square shape of GEMM benchmarks
SHAPES = ((16384, 28672, 4096), (8192, 8192, 8192))


def nvml():
    """A function that reads (SM clock MHz, board power W), or None without NVML."""
    try:
        import pynvml
    except ImportError:
        return None
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    return lambda: (pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                    pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)


def soak(shape, mode: str, seconds: float, read) -> dict:
    """Seconds of back-to-back GEMMs, each followed by a memory-bound pass of about its length in
    "mixed" (one streaming kernel) and "eager" (many small kernels, a step's eager RMSNorms): the
    GEMMs' own TFLOP/s in each second, their share of it, and the clock and power at its end."""
    import torch

    m, n, k = shape
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    flops = 2.0 * m * n * k
    # about the GEMM's time of streaming at 3-4 TB/s: read and write x (bytes = 4 x elements)
    x = torch.randn(int(flops / 800e12 * 3.5e12 / 4), device="cuda", dtype=torch.bfloat16)
    # eager: an fp32 RMSNorm's ops on one layer's activations (16K tokens x 2048, 64 MiB in bf16),
    # op by op: cast up, square, mean, rsqrt, scale, cast down (about 30 bytes per element)
    y = torch.randn(16384, 2048, device="cuda", dtype=torch.bfloat16)
    norms = max(1, int(flops / 800e12 * 3.5e12 / (30 * y.numel())))

    def eager_pass() -> None:
        for _ in range(norms):
            t = y.float()
            (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5)).to(torch.bfloat16)
    # GEMMs per window of about a second, so that the host queues a window ahead of the GPU
    # (it blocks once the launch queue is full) and only the window's end drains it
    torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    per_window = max(1, int(5 / (time.perf_counter() - t0)))
    windows = []
    for _ in range(int(seconds)):
        events = []
        t0 = time.perf_counter()
        for _ in range(per_window):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.matmul(a, b, out=c)
            end.record()
            events.append((start, end))
            if mode == "mixed":
                x.mul_(1.0001)
            elif mode == "eager":
                eager_pass()
        torch.cuda.synchronize()
        window_s = time.perf_counter() - t0
        gemm_s = sum(s.elapsed_time(e) for s, e in events) * 1e-3
        clock, power = read() if read else (0, 0.0)
        # the share of the window in GEMMs: what GPUSpec.at_tensor_core_share takes
        windows.append({"tflops": flops * len(events) / gemm_s / 1e12, "gemms": len(events),
                        "gemm_share": gemm_s / window_s, "sm_mhz": clock, "power_w": power})
    return {"shape": list(shape), "mode": mode, "mixed": mode == "mixed", "windows": windows}


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=10.0, help="per shape and mode")
    ap.add_argument("--modes", nargs="+", choices=["gemm", "mixed", "eager"],
                    default=["gemm", "mixed"])
    args = ap.parse_args(argv)
    read = nvml()
    runs = [soak(shape, mode, args.seconds, read) for shape in SHAPES for mode in args.modes]
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "runs": runs}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / "gemm_soak.json.tmp"
    tmp.write_text(json.dumps(result, indent=1))
    os.replace(tmp, out / "gemm_soak.json")
    print(f"{result['device']}, torch {result['torch']}")
    print(f"{'shape':>20s} {'mode':>6s} {'first s':>8s} {'last s':>8s} {'share':>6s} {'MHz':>6s} "
          f"{'W':>6s}")
    for r in runs:
        w = r["windows"]
        print(f"{'x'.join(map(str, r['shape'])):>20s} {r['mode']:>6s} "
              f"{w[0]['tflops']:8.1f} {w[-1]['tflops']:8.1f} {w[-1]['gemm_share']:6.2f} "
              f"{w[-1]['sm_mhz']:6d} "
              f"{w[-1]['power_w']:6.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
