"""torchtitan's own trainer, measured on one GPU (benchmarks/torchtitan_single_gpu.py), beside
simpar's prediction of the same run with the torchtitan stack.

Each run is predicted as a user would: `simpar simulate --stack torchtitan-0.2` (torchtitan
0.2 as released, what ran here) with the run's model, sequence, batch and activation
checkpointing (torchtitan's selective op-level checkpointing is `--recompute op`) and
`--compile` where it compiled. The step
time compared is torchtitan's own (it logs every step, so each step also waits for its next
batch's tokenizing on the host, which simpar does not price) and that step less the data loading
torchtitan reports.
Memory: torchtitan's peak active bytes against the predicted peak allocated, its peak reserved
against the predicted peak reserved.

    python benchmarks/torchtitan_report.py reports/torchtitan-h200   # writes report.md, .json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # its sibling stack_accuracy, also where imported

from stack_accuracy import TORCHTITAN_AC  # noqa: E402

from simpar.api import simulate  # noqa: E402
from simpar.devices import catalog_gpu  # noqa: E402
from simpar.files import write_text  # noqa: E402

MODELS = ROOT / "benchmarks" / "data" / "h100_execpar"  # the models the runs registered


def predicted(run: dict) -> dict:
    """simpar's step time and memory for a measured run's configuration."""
    cfg = run["config"]
    gpu = catalog_gpu(run["device_name"])
    if gpu is None:
        raise SystemExit(f"{run['id']}: no catalog GPU for device {run['device_name']!r}")
    sim = simulate(model=str(MODELS / f"{cfg['flavor']}.yaml"), gpu=gpu, gpus=1,
                   seq_len=cfg["seq_len"], micro_batch=cfg["batch"], global_batch=cfg["batch"],
                   recompute=TORCHTITAN_AC[cfg["ac"]], stack="torchtitan-0.2",
                   compile=cfg.get("compile", False))
    doc = sim.to_dict()  # what --json prints
    mem = doc["memory"]
    return {"gpu": gpu, "step_s": doc["step_time_s"], "allocated_gib": mem["peak_allocated_gib"],
            "reserved_gib": mem["peak_reserved_gib"]}


def row(run: dict) -> dict:
    s = run["summary"]
    step = s["median_step_s"]
    busy = step * (1 - s["median_data_loading_pct"] / 100)
    p = predicted(run)
    return {"id": run["id"], "step_s": step, "without_data_s": busy, "predicted_s": p["step_s"],
            "error": p["step_s"] / step - 1, "error_without_data": p["step_s"] / busy - 1,
            "active_gib": s["peak_active_gib"], "allocated_gib": p["allocated_gib"],
            "memory_error": p["allocated_gib"] / s["peak_active_gib"] - 1,
            "reserved_gib": s["peak_memory_gib"], "predicted_reserved_gib": p["reserved_gib"],
            "reserved_error": p["reserved_gib"] / s["peak_memory_gib"] - 1, "gpu": p["gpu"]}


def render(rows: list[dict], env: dict) -> str:
    lines = [f"torchtitan {env['torchtitan']} on one {env['device']}, torch {env['torch']}, "
             "against `simpar simulate --stack torchtitan-0.2` on "
             f"the catalog {rows[0]['gpu']}", "",
             "| run | step s | less data s | predicted s | error | error less data | active GiB "
             "| predicted GiB | error | reserved GiB | predicted GiB |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(
            f"| {r['id']} | {r['step_s']:.4f} | {r['without_data_s']:.4f} | "
            f"{r['predicted_s']:.4f} | {r['error']:+.1%} | {r['error_without_data']:+.1%} | "
            f"{r['active_gib']:.2f} | {r['allocated_gib']:.2f} | {r['memory_error']:+.1%} | "
            f"{r['reserved_gib']:.2f} | {r['predicted_reserved_gib']:.2f} |")
    lines.append("")
    for key, what in (("error", "step"), ("error_without_data", "step less data loading"),
                      ("memory_error", "peak memory"), ("reserved_error", "peak reserved")):
        errs = [r[key] for r in rows]
        lines.append(f"- {what}: median |error| {statistics.median(map(abs, errs)):.1%}, "
                     f"median signed {statistics.median(errs):+.1%}, largest "
                     f"{max(errs, key=abs):+.1%} over {len(errs)} runs")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="the --out folder of torchtitan_single_gpu.py")
    args = ap.parse_args(argv)
    runs = [json.loads(p.read_text()) for p in sorted(args.folder.glob("tt-*.json"))]
    runs = [r for r in runs if r.get("ok")]
    if not runs:
        raise SystemExit(f"{args.folder}: no successful torchtitan run (tt-*.json)")
    env = {"torchtitan": runs[0]["torchtitan_version"], "torch": runs[0]["torch_version"],
           "device": runs[0]["device_name"]}
    rows = [row(r) for r in runs]
    text = render(rows, env)
    write_text(str(args.folder / "report.md"), text)
    write_text(str(args.folder / "report.json"), json.dumps({"environment": env, "rows": rows},
                                                          indent=1) + "\n")
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
