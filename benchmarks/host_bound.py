"""How fast the host CPU issues execpar's kernels: plans so short (256 tokens per micro-batch) that
the GPU waits for the CPU, run on one GPU with the last step profiled. Each run's median step
time, less the optimizer's kernels that end it, over the other kernels its profiled step ran is
the host's time per kernel (where the GPU waited: device time well short of the step); a
full-recompute run
against the same plan without recompute gives what a recomputed kernel costs the host
(torch.utils.checkpoint's hooks included). simpar's launch constants (simpar/specs/stack.py,
EAGER_LAUNCH_US and CHECKPOINT_HOOK_US) come from here.

    # on the GPU (about 25 s a run)
    python benchmarks/host_bound.py measure --out DIR
    # anywhere
    python benchmarks/host_bound.py report DIR     # writes DIR/report.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

MODELS = Path(__file__).parent / "data" / "h100_execpar"
SEQ_LEN = 256
# (id, model file, micro-batches of one sequence, recompute)
RUNS = (("a", "m1b.yaml", 4, "full"), ("b", "m1b.yaml", 4, "none"),
        ("c", "m3b.yaml", 2, "selective"), ("d", "m8b4l.yaml", 4, "none"))
# profiler records that launch no kernel: CUDA runtime calls, CUPTI's buffer marks, the
# optimizer's annotation, and copies (simpar.report.validate.NOT_KERNELS names the two that old
# measurements counted as kernel time)
NOT_LAUNCHES = ("cuda", "Activity", "Command", "Optimizer", "Memcpy")


def measure(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for run_id, model, m, recompute in RUNS:
        plan = out / f"plan-{run_id}.json"
        subprocess.run([sys.executable, "-m", "simpar.cli", "plan", "--model", str(MODELS / model),
                        "--gpus", "1", "--seq-len", str(SEQ_LEN), "--global-batch", str(m),
                        "--micro-batch", "1", "--recompute", recompute, "--dtype", "bf16",
                        "--gpu", args.gpu, "--out", str(plan)], check=True)
        subprocess.run([sys.executable, "-m", "execpar.cli", "launch", str(plan),
                        "--nproc-per-node", "1", "--device", "cuda", "--steps", "10",
                        "--warmup", "3", "--profile", "--out", str(out / f"host-{run_id}.json")],
                       check=True)
    return 0


def summary(path: Path) -> dict:
    """One run: its step, the device time and the kernels of its profiled step."""
    d = json.loads(path.read_text())
    k = d["breakdown"]["kernels"]
    kernels = sum(t["calls"] for t in k["top"] if not t["name"].startswith(NOT_LAUNCHES))
    # the step ends with the optimizer's few long kernels, which the host waits for
    optimizer = [t for t in k["top"] if "multi_tensor_apply_kernel" in t["name"]]
    return {"id": path.stem[len("host-"):], "model": d["model"]["name"],
            "micro_batches": d["global_batch"], "recompute": d["strategy"]["recompute"],
            "step_s": d["step_time_s"], "p10_s": d["step_time_p10_s"],
            "device_s": k["gemm_s"] + k["attention_s"] + k["memory_bound_s"],
            "kernels": kernels, "optimizer_kernels": sum(t["calls"] for t in optimizer),
            "optimizer_s": sum(t["s"] for t in optimizer),
            "device": d["environment"].get("device_name", "?"),
            "torch": d["environment"].get("torch", "?")}


def report(args) -> int:
    folder = Path(args.folder)
    rows = {r["id"]: r for r in map(summary, sorted(folder.glob("host-*.json")))}
    first = next(iter(rows.values()))
    lines = [f"execpar's host time per kernel on one {first['device']}, torch {first['torch']}: "
             f"plans of {SEQ_LEN} tokens per micro-batch, the GPU waiting for the CPU", "",
             "| run | model | micro-batches | recompute | step s (median) | p10 s | device s | "
             "optimizer s | kernels | us per kernel | less the optimizer |",
             "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows.values():
        rest = (r["step_s"] - r["optimizer_s"]) / (r["kernels"] - r["optimizer_kernels"])
        lines.append(f"| {r['id']} | {r['model']} | {r['micro_batches']} | {r['recompute']} | "
                     f"{r['step_s']:.4f} | {r['p10_s']:.4f} | {r['device_s']:.4f} | "
                     f"{r['optimizer_s']:.4f} | {r['kernels']} | "
                     f"{1e6 * r['step_s'] / r['kernels']:.1f} | {1e6 * rest:.1f} |")
    if "a" in rows and "b" in rows:
        a, b = rows["a"], rows["b"]
        extra = a["kernels"] - b["kernels"]
        lines += ["", f"- full recompute (a) over none (b): {extra} more kernels, "
                  f"{a['step_s'] - b['step_s']:.4f} s more: "
                  f"{1e6 * (a['step_s'] - b['step_s']) / extra:.1f} us per recomputed kernel"]
    text = "\n".join(lines) + "\n"
    tmp = folder / "report.md.tmp"
    tmp.write_text(text)
    os.replace(tmp, folder / "report.md")
    print(text)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="phase", required=True)
    me = sub.add_parser("measure", help="run the four host-bound plans (on the GPU)")
    me.add_argument("--out", required=True, help="folder for the plans and measurements")
    me.add_argument("--gpu", default="h200", help="the catalog GPU the plans name")
    me.set_defaults(func=measure)
    rep = sub.add_parser("report", help="tabulate a measured folder")
    rep.add_argument("folder", help="the folder `measure` wrote")
    rep.set_defaults(func=report)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
