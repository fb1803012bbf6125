"""Issue 12's check on a GPU: six single-GPU execpar runs (1B-8B-class models, 2K-8K tokens,
recompute none/selective/full, micro-batch 1-8), each planned with the execpar stack, run, and put
beside its prediction by `simpar validate`: on the catalog GPU and, with --calibrate, on the
profile `simpar calibrate` measures on the machine first. Writes OUT/report.md (naming the device
and torch) and OUT/report.json; one device call (about 6-8 minutes on an H100, estimated: it
has not run on one yet).

    python benchmarks/gpu_validation.py --out reports/gpu-validation-h100 --calibrate
    python benchmarks/gpu_validation.py --device cpu --small --dtype fp32 --out /tmp/dry  # plumbing
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

MODELS = Path(__file__).parent / "data" / "h100_execpar"
# (id, model file, seq_len, micro_batch, micro-batches, recompute)
CONFIGS = (
    ("1b-s2k-mb8", "m1b.yaml", 2048, 8, 1, "none"),
    ("1b-s4k-mb4-sel", "m1b.yaml", 4096, 4, 1, "selective"),
    ("3b-s2k-mb2x2-full", "m3b.yaml", 2048, 2, 2, "full"),
    ("3b-s8k-mb1-full", "m3b.yaml", 8192, 1, 1, "full"),
    ("8b4l-s4k-mb2x2", "m8b4l.yaml", 4096, 2, 2, "none"),
    ("8b4l-s8k-mb1x2-sel", "m8b4l.yaml", 8192, 1, 2, "selective"),
)
# --small: a 2-layer 256-wide model at a tenth of the tokens, to check the plumbing on a CPU
SMALL = "name: small\nlayers: 2\nhidden: 256\nheads: 4\nkv_heads: 2\nffn_hidden: 512\nvocab: 1024\n"


def run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def simpar(*args: str) -> list[str]:
    return [sys.executable, "-m", "simpar.cli", *args]


def validate(plan: Path, measured: Path) -> dict:
    out = subprocess.run(simpar("validate", str(plan), str(measured), "--json"), check=True,
                         capture_output=True, text=True).stdout
    return {f["figure"]: f for f in json.loads(out)["figures"]}


def one(cfg, args, out: Path, clusters: dict[str, list[str]]) -> dict:
    name, model, seq, mb, m, recompute = cfg
    model_file = str(out / "small.yaml") if args.small else str(MODELS / model)
    if args.small:
        seq //= 16
    job = ["--model", model_file, "--gpus", "1", "--seq-len", str(seq), "--global-batch",
           str(mb * m), "--micro-batch", str(mb), "--recompute", recompute, "--dtype", args.dtype]
    row: dict = {"id": name, "seq_len": seq, "micro_batch": mb, "micro_batches": m,
                 "recompute": recompute}
    measured = out / f"measured-{name}.json"
    for label, where in clusters.items():
        plan = out / f"plan-{name}-{label}.json"
        run(simpar("plan", *job, *where, "--out", str(plan)))
        if not measured.exists():
            run([sys.executable, "-m", "execpar.cli", "launch", str(plan), "--nproc-per-node", "1",
                 "--device", args.device, "--steps", str(args.steps), "--warmup", "3",
                 "--profile", "--out", str(measured)])
            # the last step's device time by kind of kernel (GEMM, attention, the rest)
            row["kernels"] = json.loads(measured.read_text())["breakdown"]["kernels"]
        figures = validate(plan, measured)
        step = figures["step time (s)"]
        row["measured_step_s"] = step["measured"]
        row[f"{label}_step_s"], row[f"{label}_error"] = step["predicted"], step["error"]
        mem = figures.get("memory per GPU (GiB)")
        if mem:
            row["measured_memory_gib"] = mem["measured"]
            row[f"{label}_memory_gib"] = mem["predicted"]
    return row


def report(rows: list[dict], labels: list[str], env: dict) -> str:
    head = f"{'run':20s} {'measured s':>10s}" + "".join(
        f" {label + ' s':>14s} {'error':>7s}" for label in labels)
    lines = [f"execpar on one {env.get('device_name', env.get('device', '?'))}, torch "
             f"{env.get('torch', '?')}", "", head]
    for r in rows:
        cells = (f" {r[label + '_step_s']:14.4f} {100 * r[label + '_error']:+6.1f}%"
                 for label in labels)
        lines.append(f"{r['id']:20s} {r['measured_step_s']:10.4f}" + "".join(cells))
    lines.append("")
    for label in labels:
        errs = [abs(r[label + "_error"]) for r in rows]
        lines.append(f"{label}: median |error| {100 * statistics.median(errs):.1f}%, largest "
                     f"{100 * max(errs):.1f}% over {len(errs)} runs")
    lines += ["", "the last (profiled) step's time by kind of kernel, s (torch.profiler; "
              "compare with simpar simulate --explain)",
              f"{'run':20s} {'GEMM':>8s} {'attention':>10s} {'memory-bound':>13s} {'comm':>8s}"]
    for r in rows:
        k = r["kernels"]
        lines.append(f"{r['id']:20s} {k['gemm_s']:8.4f} {k['attention_s']:10.4f} "
                     f"{k['memory_bound_s']:13.4f} {k['communication_s']:8.4f}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for the plans, measurements and report")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--gpu", default="h100-sxm", help="catalog GPU the plans assume")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--steps", type=int, default=20, help="steps per run (3 of them warm-up)")
    ap.add_argument("--calibrate", action="store_true",
                    help="also predict with the profile simpar calibrate measures here first")
    ap.add_argument("--small", action="store_true", help="tiny models: a dry run on a CPU")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.small:
        (out / "small.yaml").write_text(SMALL)
    clusters = {"catalog": ["--gpu", args.gpu]}
    if args.calibrate:
        profile = out / "profile.yaml"
        run(simpar("calibrate", "--nproc-per-node", "1", "--device", args.device, "--out",
                   str(profile)))
        clusters["calibrated"] = ["--cluster", str(profile)]
    rows = [one(cfg, args, out, clusters) for cfg in CONFIGS]
    env = json.loads((out / f"measured-{CONFIGS[0][0]}.json").read_text()).get("environment", {})
    text = report(rows, list(clusters), env)
    tmp = out / "report.md.tmp"
    tmp.write_text(text)
    os.replace(tmp, out / "report.md")
    (out / "report.json").write_text(json.dumps({"environment": env, "runs": rows}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
