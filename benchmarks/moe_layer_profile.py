"""Where a mixture-of-experts layer's time goes as execpar runs it: one MoE module of a model file
(execpar/model.py), its fp32 weights under execpar's StepAutocast, forward and backward over
--tokens tokens, profiled op by op (torch.profiler: each ATen op's own device time, its calls
and input shapes; each kernel's own row beside them). Writes OUT/moe_layer_profile.json and
prints the rows by device time. (reports/moe-layer-h200 was written before the step's total
counted the kernel rows alone and before each step set its gradients to None: its total counts
every kernel twice, and its add_ rows are gradients accumulated over the profiled steps.)

    python benchmarks/moe_layer_profile.py --model benchmarks/data/h100_execpar/mq30a3b4l.yaml \\
        --tokens 8192 --out DIR          # on a CUDA GPU
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a model file with experts")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=3, help="profiled steps after two warm-ups")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a plumbing check (host times, no GPU)")
    args = ap.parse_args(argv)
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from execpar.model import MoE, StepAutocast
    from simpar.specs.loaders import load_model

    spec = load_model(args.model)
    torch.manual_seed(0)
    dev = args.device
    with torch.device(dev):
        layer = MoE(spec)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.02)
    x = torch.randn(1, args.tokens, spec.hidden, device=dev, requires_grad=True)
    autocast = StepAutocast(dev, torch.bfloat16, layer)
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)

    def step() -> None:
        layer.zero_grad(set_to_none=True)  # as execpar's step: no accumulation into old gradients
        with autocast:
            layer(x).float().sum().backward()

    for _ in range(2):
        step()
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 record_shapes=True) as prof:
        for _ in range(args.steps):
            step()
        sync()
    rows = []
    for e in prof.key_averages(group_by_input_shape=True):
        device_us = (e.self_device_time_total if dev == "cuda" else e.self_cpu_time_total)
        if device_us > 0:
            # an op's row holds the device time of the kernels it launched, and each kernel has
            # its own row too: the step's total counts the kernels (device rows) alone
            kernel = e.device_type != DeviceType.CPU
            rows.append({"op": e.key, "shapes": str(e.input_shapes)[:160], "calls": e.count,
                         "kernel": kernel, "device_ms_per_step": device_us / 1e3 / args.steps})
    rows.sort(key=lambda r: -r["device_ms_per_step"])
    total = sum(r["device_ms_per_step"] for r in rows if r["kernel"] or dev == "cpu")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name() if dev == "cuda" else "CPU"
    body = {"device_name": name, "torch": torch.__version__,
            "model": spec.name, "tokens": args.tokens, "device_ms_per_step": total, "ops": rows}
    tmp = out / "moe_layer_profile.json.tmp"
    tmp.write_text(json.dumps(body, indent=1))
    os.replace(tmp, out / "moe_layer_profile.json")
    print(f"{spec.name}, {args.tokens} tokens: {total:.3f} ms of device time a step")
    for r in rows[:30]:
        print(f"{r['device_ms_per_step']:8.3f} ms {r['calls'] // args.steps:4d}x  {r['op']:28s} "
              f"{r['shapes'][:90]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
