"""Issue 12's check on a GPU: six single-GPU execpar runs (1B-8B-class models, 2K-8K tokens,
recompute none/selective/full, micro-batch 1-8), each planned with the execpar stack, run, and put
beside its prediction by `simpar validate`.

Two phases, so that the device time goes to measuring alone:

    # on the GPU: the six runs (each profiled), then `simpar calibrate` with each model's GEMMs
    python benchmarks/gpu_validation.py measure --out DIR
    # anywhere (no torch needed): plan each run on the catalog GPU the device names, on the
    # calibrated profile, and on that profile without its GEMM table; validate; report
    python benchmarks/gpu_validation.py report DIR

`report` writes DIR/report.md (naming the device and torch) and DIR/report.json.
`measure --device cpu --small --dtype fp32` checks the plumbing on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import yaml

from simpar import devices
from simpar.report.validate import measured_kernels

MODELS = Path(__file__).parent / "data" / "h100_execpar"


class Run(NamedTuple):
    id: str
    model: str  # a file in MODELS
    seq_len: int
    micro_batch: int
    micro_batches: int
    recompute: str
    dtype: str | None = None  # None: measure's --dtype
    compile: bool = False  # torch.compile of each block (execpar's --compile)


CONFIGS = (
    Run("1b-s2k-mb8", "m1b.yaml", 2048, 8, 1, "none"),
    Run("1b-s4k-mb4-sel", "m1b.yaml", 4096, 4, 1, "selective"),
    Run("3b-s2k-mb2x2-full", "m3b.yaml", 2048, 2, 2, "full"),
    Run("3b-s8k-mb1-full", "m3b.yaml", 8192, 1, 1, "full"),
    Run("8b4l-s4k-mb2x2", "m8b4l.yaml", 4096, 2, 2, "none"),
    Run("8b4l-s8k-mb1x2-sel", "m8b4l.yaml", 8192, 1, 2, "selective"),
)
# Shapes none of the six has, chosen before they ran and never used to set a constant: the model
# is checked on them as it stands (reports/gpu-validation-*-heldout)
HELDOUT = (
    Run("1b-s8k-mb2", "m1b.yaml", 8192, 2, 1, "none"),
    Run("1b-s2k-mb1x8-full", "m1b.yaml", 2048, 1, 8, "full"),
    Run("1b-s4k-mb2x2-fp16", "m1b.yaml", 4096, 2, 2, "none", "fp16"),
    Run("3b-s2k-mb2", "m3b.yaml", 2048, 2, 1, "none"),
    Run("3b-s2k-mb1x4-sel", "m3b.yaml", 2048, 1, 4, "selective"),
    Run("8b4l-s2k-mb8-full", "m8b4l.yaml", 2048, 8, 1, "full"),
    Run("8b4l-s8k-mb1x4", "m8b4l.yaml", 8192, 1, 4, "none"),
)
# fp8 as execpar runs it (torchao's tensorwise float8 linears), eager and compiled, each beside
# its bf16 twin on the same GPU; chosen before they ran
FP8 = (
    Run("8b4l-s4k-mb2x2-fp8", "m8b4l.yaml", 4096, 2, 2, "none", "fp8"),
    Run("8b4l-s4k-mb2x2-fp8-compile", "m8b4l.yaml", 4096, 2, 2, "none", "fp8", True),
    Run("8b4l-s4k-mb2x2", "m8b4l.yaml", 4096, 2, 2, "none", "bf16"),
    Run("8b4l-s4k-mb2x2-compile", "m8b4l.yaml", 4096, 2, 2, "none", "bf16", True),
    Run("1b-s2k-mb8-fp8", "m1b.yaml", 2048, 8, 1, "none", "fp8"),
    Run("1b-s2k-mb8-fp8-compile", "m1b.yaml", 2048, 8, 1, "none", "fp8", True),
    Run("1b-s2k-mb8-compile", "m1b.yaml", 2048, 8, 1, "none", "bf16", True),
    Run("3b-s8k-mb1-full-fp8", "m3b.yaml", 8192, 1, 1, "full", "fp8"),
)
# fp8 shapes the fp8 set lacks, chosen after torchao's casts were priced from the fp8 set and
# before these ran: the check of that pricing
FP8_HELDOUT = (
    Run("3b-s4k-mb2-fp8", "m3b.yaml", 4096, 2, 1, "none", "fp8"),
    Run("3b-s4k-mb2-fp8-compile", "m3b.yaml", 4096, 2, 1, "none", "fp8", True),
    Run("8b4l-s2k-mb4x2-sel-fp8", "m8b4l.yaml", 2048, 4, 2, "selective", "fp8"),
    Run("1b-s8k-mb1x2-sel-fp8-compile", "m1b.yaml", 8192, 1, 2, "selective", "fp8", True),
    Run("8b4l-s8k-mb1-full-fp8-compile", "m8b4l.yaml", 8192, 1, 1, "full", "fp8", True),
)
# Mixture-of-experts layers as execpar runs them (torch's grouped GEMM, no host sync without
# EP): a slice of Qwen3-30B-A3B (128 small experts, top-8) and of Mixtral 8x7B (8 large, top-2);
# chosen before they ran
MOE = (
    Run("q30a3b4l-s4k-mb2", "mq30a3b4l.yaml", 4096, 2, 1, "none"),
    Run("q30a3b4l-s2k-mb2x2-full", "mq30a3b4l.yaml", 2048, 2, 2, "full"),
    Run("q30a3b4l-s8k-mb1-sel", "mq30a3b4l.yaml", 8192, 1, 1, "selective"),
    Run("mix2l-s4k-mb2", "mmix2l.yaml", 4096, 2, 1, "none"),
    Run("mix2l-s8k-mb1x2-sel", "mmix2l.yaml", 8192, 1, 2, "selective"),
)
# MoE shapes the moe set lacks, chosen after its runs had been priced and before these ran
MOE_HELDOUT = (
    Run("q30a3b4l-s4k-mb1x2-sel", "mq30a3b4l.yaml", 4096, 1, 2, "selective"),
    Run("q30a3b4l-s2k-mb4", "mq30a3b4l.yaml", 2048, 4, 1, "none"),
    Run("mix2l-s2k-mb4-full", "mmix2l.yaml", 2048, 4, 1, "full"),
)
SETS = {"six": CONFIGS, "heldout": HELDOUT, "fp8": FP8, "fp8-heldout": FP8_HELDOUT, "moe": MOE,
        "moe-heldout": MOE_HELDOUT}
# --small: a 2-layer 256-wide model at a sixteenth of the tokens, to check the plumbing on a CPU
SMALL = "name: small\nlayers: 2\nhidden: 256\nheads: 4\nkv_heads: 2\nffn_hidden: 512\nvocab: 1024\n"


def catalog_gpu(device_name: str) -> str:
    """The catalog GPU for a device name; h100-sxm for a CPU (whose dry run prices nothing)."""
    return devices.catalog_gpu(device_name) or "h100-sxm"


def run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def simpar(*args: str) -> list[str]:
    return [sys.executable, "-m", "simpar.cli", *args]


def job_args(cfg: Run, folder: Path, small: bool, dtype: str) -> list[str]:
    model_file = str(folder / "small.yaml") if small else str(MODELS / cfg.model)
    seq = cfg.seq_len // 16 if small else cfg.seq_len
    return ["--model", model_file, "--gpus", "1", "--seq-len", str(seq),
            "--global-batch", str(cfg.micro_batch * cfg.micro_batches), "--micro-batch",
            str(cfg.micro_batch), "--recompute", cfg.recompute, "--dtype", cfg.dtype or dtype,
            *(["--compile"] if cfg.compile else [])]


def measure(args) -> int:
    """The runs first (they are the check), then one calibration per model, each timing every
    GEMM shape of that model's largest micro-batch (a shape it lacks takes its nearest's rate)."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {"small": args.small, "dtype": args.dtype, "device": args.device, "set": args.set}
    (out / "settings.json").write_text(json.dumps(settings))
    if args.small:
        (out / "small.yaml").write_text(SMALL)
    gpu = "h100-sxm"
    if args.device == "cuda":
        import torch

        gpu = catalog_gpu(torch.cuda.get_device_name())
    for cfg in SETS[args.set] if args.runs else ():
        plan = out / f"plan-{cfg.id}.json"
        try:  # one run failing (e.g. out of memory) does not cost the others their device time
            run(simpar("plan", *job_args(cfg, out, args.small, args.dtype), "--gpu", gpu,
                       "--out", str(plan)))
            run([sys.executable, "-m", "execpar.cli", "launch", str(plan), "--nproc-per-node",
                 "1", "--device", args.device, "--steps", str(args.steps), "--warmup", "3",
                 "--profile", "--out", str(out / f"measured-{cfg.id}.json")])
        except subprocess.CalledProcessError as err:
            print(f"{cfg.id}: failed ({err})", flush=True)
    for model in args.calibrate:
        # calibrate times GEMMs of micro-batches of 1 and --micro-batch sequences: the model's
        # smallest and largest tokens per micro-batch (powers of two, so the ratio is whole)
        tokens = [c.seq_len * c.micro_batch for c in CONFIGS if c.model == model]
        seq = min(tokens) // 16 if args.small else min(tokens)
        model_file = str(out / "small.yaml") if args.small else str(MODELS / model)
        run(simpar("calibrate", "--nproc-per-node", "1", "--device", args.device, "--model",
                   model_file, "--seq-len", str(seq), "--micro-batch",
                   str(max(tokens) // min(tokens)), "--out", str(out / f"profile-{model}")))
    return 0


def validate(plan: Path, measured: Path) -> dict:
    out = subprocess.run(simpar("validate", str(plan), str(measured), "--json"), check=True,
                         capture_output=True, text=True).stdout
    return {f["figure"]: f for f in json.loads(out)["figures"]}


def without_table(profile: Path, scratch: Path) -> Path:
    """The calibrated profile less its measured tables (GEMMs and attention): the single measured
    rates and the shape model."""
    data = yaml.safe_load(profile.read_text())
    for key in ("gemm_table", "gemm_table_dtype", "attention_table", "attention_table_dtype"):
        data["gpu"].pop(key, None)
    path = scratch / (profile.stem + "-notable.yaml")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def one(cfg: Run, folder: Path, settings: dict, clusters: dict[str, list[str]],
        scratch: Path) -> dict:
    measured = folder / f"measured-{cfg.id}.json"
    row: dict = {"id": cfg.id, "seq_len": cfg.seq_len, "micro_batch": cfg.micro_batch,
                 "micro_batches": cfg.micro_batches, "recompute": cfg.recompute,
                 "dtype": cfg.dtype or settings["dtype"],
                 "kernels": measured_kernels(json.loads(measured.read_text())["breakdown"])}
    for label, where in clusters.items():
        plan = scratch / f"predicted-{cfg.id}-{label}.json"
        run(simpar("plan", *job_args(cfg, folder, settings["small"], settings["dtype"]), *where,
                   "--out", str(plan)))
        figures = validate(plan, measured)
        step = figures["step time (s)"]
        row["measured_step_s"] = step["measured"]
        row[f"{label}_step_s"], row[f"{label}_error"] = step["predicted"], step["error"]
        mem = figures.get("peak allocated per GPU (GiB)")
        if mem:
            row["measured_memory_gib"] = mem["measured"]
            row[f"{label}_memory_gib"], row[f"{label}_memory_error"] = (mem["predicted"],
                                                                       mem["error"])
    return row


def report(args) -> int:
    folder = Path(args.folder)
    settings = json.loads((folder / "settings.json").read_text())
    configs = SETS[settings.get("set", "six")]
    env = json.loads((folder / f"measured-{configs[0].id}.json").read_text()).get(
        "environment", {})
    gpu = catalog_gpu(env.get("device_name", ""))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:  # the predictions are made again each time
        scratch = Path(tmp)
        for cfg in configs:
            profile = folder / f"profile-{cfg.model}"
            clusters = {gpu: ["--gpu", gpu]}
            if profile.exists():
                clusters["calibrated"] = ["--cluster", str(profile)]
                clusters["calibrated-no-table"] = ["--cluster",
                                                   str(without_table(profile, scratch))]
            rows.append(one(cfg, folder, settings, clusters, scratch))
    text = render(rows, env)
    for name, body in (("report.md", text),
                       ("report.json", json.dumps({"environment": env, "runs": rows}, indent=1))):
        tmp = folder / (name + ".tmp")
        tmp.write_text(body)
        os.replace(tmp, folder / name)
    print(text)
    return 0


def render(rows: list[dict], env: dict) -> str:
    labels = [k[:-len("_step_s")] for k in rows[0]
              if k.endswith("_step_s") and k != "measured_step_s"]
    lines = [f"execpar on one {env.get('device_name', env.get('device', '?'))}, torch "
             f"{env.get('torch', '?')}. Step time predicted with the execpar stack on the "
             "catalog GPU, on the profile `simpar calibrate --model` measured there, and on that "
             "profile less its GEMM table (one measured GEMM rate and the shape model)", "",
             "| run | measured s | " + " | ".join(f"{lab} s | error" for lab in labels) + " |",
             "| --- | ---: | " + " | ".join("---: | ---:" for _ in labels) + " |"]
    for r in rows:
        cells = " | ".join(f"{r[lab + '_step_s']:.4f} | {100 * r[lab + '_error']:+.1f}%"
                           for lab in labels)
        lines.append(f"| {r['id']} | {r['measured_step_s']:.4f} | {cells} |")
    lines.append("")
    for lab in labels:
        errs = [abs(r[lab + "_error"]) for r in rows if lab + "_error" in r]
        lines.append(f"- {lab}: median |error| {100 * statistics.median(errs):.1f}%, largest "
                     f"{100 * max(errs):.1f}% over {len(errs)} runs")
    lines += ["", "Peak memory (torch.cuda.max_memory_allocated), GiB", "",
              "| run | measured | " + " | ".join(f"{lab} | error" for lab in labels) + " |",
              "| --- | ---: | " + " | ".join("---: | ---:" for _ in labels) + " |"]
    for r in (r for r in rows if "measured_memory_gib" in r):
        cells = " | ".join(f"{r[lab + '_memory_gib']:.2f} | {100 * r[lab + '_memory_error']:+.1f}%"
                           for lab in labels)
        lines.append(f"| {r['id']} | {r['measured_memory_gib']:.2f} | {cells} |")
    lines += ["", "The last (profiled) step's device time by kind of kernel, s (torch.profiler)",
              "",
              "| run | GEMM | attention | memory-bound | collectives |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for r in (r for r in rows if r["kernels"]):
        k = r["kernels"]
        lines.append(f"| {r['id']} | {k['gemm_s']:.4f} | {k['attention_s']:.4f} | "
                     f"{k['memory_bound_s']:.4f} | {k['communication_s']:.4f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="phase", required=True)
    me = sub.add_parser("measure", help="run the six plans and calibrate (on the GPU)")
    me.add_argument("--out", required=True, help="folder for the plans, measurements, profiles")
    me.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    me.add_argument("--dtype", default="bf16", help="where a run names none")
    me.add_argument("--set", default="six", choices=sorted(SETS),
                    help="six: issue 12's runs (default); heldout: shapes the six lack; fp8: "
                    "torchao float8, eager and compiled, beside bf16 twins; fp8-heldout: "
                    "fp8 shapes the fp8 set lacks; moe: mixture-of-experts slices; moe-heldout: "
                    "MoE shapes the moe set lacks")
    me.add_argument("--steps", type=int, default=20, help="steps per run (3 of them warm-up)")
    me.add_argument("--small", action="store_true", help="tiny models: a dry run on a CPU")
    models = sorted({c.model for c in CONFIGS})
    me.add_argument("--calibrate", nargs="*", default=models, choices=models,
                    help="the models to calibrate for, after the runs (default: all)")
    me.add_argument("--no-runs", dest="runs", action="store_false",
                    help="calibrate only (the runs' measurements are in --out already)")
    me.set_defaults(func=measure)
    rep = sub.add_parser("report", help="predict, validate and tabulate a measured folder")
    rep.add_argument("folder", help="the folder `measure` wrote")
    rep.set_defaults(func=report)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
