"""execpar side by side with a reference trainer on the same model, batch and strategy: step time,
tokens/s per device, MFU and peak memory in one table.

The reference is torchtitan where its log is given (`--torchtitan-log`, the console output of a
torchtitan run of the same configuration, or `--torchtitan-cmd`, a command that runs it and
prints that output): its per-step metric lines (`step: .. memory: ..GiB(..%)  tps: ..  tflops:
..  mfu: ..%`) are read, the first `--warmup` logged steps left out. torchtitan needs a CUDA GPU,
and its configuration system changes between releases, so the command is the user's. Without
one the reference is a plain hand-written DDP loop of the same model (benchmarks/handwritten_ddp.py,
two processes, gloo on CPU): execpar's own overhead.

Usage:
  python benchmarks/execpar_vs_torchtitan.py [--steps N]            # CPU: vs the hand-written loop
  python benchmarks/execpar_vs_torchtitan.py --plan plan.json --nproc 1 \\
      --torchtitan-cmd "torchrun --nproc-per-node 1 -m torchtitan.train ..."
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "name: bench\nlayers: 4\nhidden: 256\nheads: 8\nkv_heads: 4\nffn_hidden: 768\nvocab: 2048\n"
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_METRICS = re.compile(
    r"step:\s*(\d+).*?memory:\s*([\d.]+)GiB.*?tps:\s*([\d,]+).*?mfu:\s*([\d.]+|N/A)")


def torchtitan_metrics(log: str, warmup: int) -> dict:
    """Median tokens/s per device, MFU (percent of peak) and the largest reserved memory (GiB)
    of the metric lines of torchtitan's console log, the first `warmup` of them left out."""
    rows = [m.groups() for m in map(_METRICS.search, _ANSI.sub("", log).splitlines()) if m]
    if len(rows) <= warmup:
        raise SystemExit(f"--torchtitan-log: {len(rows)} metric lines, need more than "
                         f"--warmup {warmup}; run torchtitan for more steps or log more often")
    kept = rows[warmup:]
    mfus = [float(r[3]) for r in kept if r[3] != "N/A"]
    return {
        "tokens_per_s_per_device": statistics.median(float(r[2].replace(",", "")) for r in kept),
        "mfu_pct": statistics.median(mfus) if mfus else float("nan"),
        "peak_gib": max(float(r[1]) for r in kept),
    }


def _execpar(plan: Path, nproc: int, steps: int, out: Path) -> dict:
    subprocess.run([sys.executable, "-m", "execpar.cli", "launch", str(plan), "--nproc-per-node",
                    str(nproc), "--steps", str(steps), "--out", str(out)], check=True, env=ENV,
                   capture_output=True)
    m = json.loads(out.read_text())
    world = m["environment"]["world_size"]
    mem = m["memory"]
    return {
        "step_s": m["step_time_s"], "tokens_per_s_per_device": m["tokens_per_s"] / world,
        "mfu_pct": 100 * m["mfu"], "peak_gib": mem.get("peak_reserved_gib", mem["total_gib"])
    }


def _handwritten(plan: Path, nproc: int, steps: int, out: Path) -> dict:
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    f"--nproc-per-node={nproc}", str(ROOT / "benchmarks" / "handwritten_ddp.py"),
                    str(plan), str(steps), str(out)], check=True, env=ENV, capture_output=True)
    return json.loads(out.read_text())


def _table(rows: list[tuple[str, dict]]) -> None:
    print(f"{'runner':<22} {'step s':>8} {'tokens/s/device':>16} {'MFU %':>7} {'peak GiB':>9}")
    for name, r in rows:
        step = f"{r['step_s']:.4f}" if "step_s" in r else "-"
        print(f"{name:<22} {step:>8} {r['tokens_per_s_per_device']:>16,.0f} "
              f"{r['mfu_pct']:>7.2f} {r['peak_gib']:>9.2f}")


def _cpu_plan(tmp: Path) -> Path:
    model, plan = tmp / "m.yaml", tmp / "plan.json"
    model.write_text(MODEL)
    subprocess.run([sys.executable, "-m", "simpar.cli", "plan", "--model", str(model), "--gpu",
                    "h100-sxm", "--gpus", "2", "--seq-len", "256", "--global-batch", "8",
                    "--micro-batch", "4", "--dtype", "fp32", "--out", str(plan)], check=True,
                   env=ENV, capture_output=True)
    return plan


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=1,
                    help="torchtitan metric lines to leave out (execpar leaves out its own)")
    ap.add_argument("--plan", help="the plan execpar runs (default: a small CPU model, 2 ranks)")
    ap.add_argument("--nproc", type=int, default=2, help="processes per run")
    ref = ap.add_mutually_exclusive_group()
    ref.add_argument("--torchtitan-log", help="console output of torchtitan on the same config")
    ref.add_argument("--torchtitan-cmd", help="a command that runs torchtitan on the same config")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        plan = Path(args.plan) if args.plan else _cpu_plan(tmp)
        if args.torchtitan_log or args.torchtitan_cmd:
            log = (Path(args.torchtitan_log).read_text() if args.torchtitan_log else
                   subprocess.run(shlex.split(args.torchtitan_cmd), check=True, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  env=ENV).stdout)
            ours = _execpar(plan, args.nproc, args.steps, tmp / "ex.json")
            theirs = torchtitan_metrics(log, args.warmup)
            _table([("execpar", ours), ("torchtitan", theirs)])
            print(f"execpar / torchtitan tokens/s: "
                  f"{ours['tokens_per_s_per_device'] / theirs['tokens_per_s_per_device']:.3f}")
            return 0
        ratios = []
        for _ in range(2):  # alternate to share the machine's state fairly
            ours = _execpar(plan, args.nproc, args.steps, tmp / "ex.json")
            theirs = _handwritten(plan, args.nproc, args.steps, tmp / "hw.json")
            _table([("execpar", ours), ("hand-written DDP", theirs)])
            ratios.append(ours["step_s"] / theirs["step_s"])
            print(f"execpar / hand-written step time: {ratios[-1]:.3f}\n")
        print(f"mean ratio {sum(ratios) / len(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
