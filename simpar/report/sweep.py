"""End-to-end validation on the machine at hand: calibrate, plan each strategy with the calibrated
profile, run it with execpar, set prediction beside measurement, and rank both ways.

Everything runs as subprocesses (torchrun for the measurements), so simpar itself never imports torch."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from simpar.errors import SpecError
from simpar.files import write_json, write_text
from simpar.report.text import table
from simpar.report.validate import compare

# (name, simpar plan flags) for 2 processes; a hybrid of pipeline and recompute stands for the mixes.
STRATEGIES_2 = [("dp", []), ("zero3", ["--zero", "3"]), ("tp_sp", ["--tp", "2", "--sp"]), ("pp_1f1b", ["--pp", "2"]),
                ("pp_gpipe", ["--pp", "2", "--schedule", "gpipe"]),
                ("pp_recompute", ["--pp", "2", "--recompute", "full"])]
SIZES = {  # model YAML text, seq_len, global batch
    "tiny": ("name: sweep-tiny\nlayers: 2\nhidden: 128\nheads: 4\nkv_heads: 2\nffn_hidden: 384\nvocab: 1024\n", 64, 4),
    "small": ("name: sweep-small\nlayers: 4\nhidden: 512\nheads: 8\nkv_heads: 4\nffn_hidden: 1536\nvocab: 4096\n", 256, 8),
}


def _run(cmd: list[str], log) -> None:
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    log.write(" ".join(cmd) + "\n" + proc.stdout[-4000:] + proc.stderr[-4000:] + "\n")
    if proc.returncode != 0:
        raise SpecError("validate --sweep", " ".join(cmd[2:5]), f"a step failed; see {log.name}")


def spearman(a: list[float], b: list[float]) -> float:
    def ranks(v):
        order = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        for i, j in enumerate(order):
            r[j] = float(i)
        return r
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb, strict=True)) / (n * (n * n - 1)) if n > 1 else 1.0


def run_sweep(out_dir: str, nproc: int, size: str, steps: int, progress=print) -> dict:
    if nproc != 2:
        raise SpecError("--nproc-per-node", nproc, "the sweep's strategy set is for 2 processes; use 2")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model_text, seq, batch = SIZES[size]
    (out / "model.yaml").write_text(model_text)
    py = sys.executable
    with open(out / "sweep.log", "w") as log:
        profile = out / "profile.yaml"
        progress(f"calibrating with {nproc} processes ...")
        _run([py, "-m", "simpar.cli", "calibrate", "--nproc-per-node", str(nproc), "--out", str(profile)], log)
        rows = []
        for name, flags in STRATEGIES_2:
            plan, measured = out / f"plan-{name}.json", out / f"measured-{name}.json"
            _run([py, "-m", "simpar.cli", "plan", "--model", str(out / "model.yaml"), "--cluster", str(profile),
                  "--gpus", str(nproc), "--seq-len", str(seq), "--global-batch", str(batch), "--dtype", "fp32",
                  *flags, "--out", str(plan)], log)
            _run([py, "-m", "execpar.cli", "launch", str(plan), "--nproc-per-node", str(nproc), "--steps", str(steps),
                  "--out", str(measured)], log)
            step = compare(str(plan), str(measured))["figures"][0]
            rows.append({"strategy": name, "predicted_s": step["predicted"], "measured_s": step["measured"],
                         "error": step["error"]})
            progress(f"  {name}: predicted {step['predicted']:.3f} s, measured {step['measured']:.3f} s "
                     f"({step['error']:+.1%})")
    pred, meas = [r["predicted_s"] for r in rows], [r["measured_s"] for r in rows]
    env = json.loads((out / f"measured-{STRATEGIES_2[0][0]}.json").read_text()).get("environment", {})
    report = {"size": size, "nproc": nproc, "steps": steps, "rows": rows, "environment": env,
              "median_abs_error": statistics.median(abs(r["error"]) for r in rows),
              "predicted_fastest": min(rows, key=lambda r: r["predicted_s"])["strategy"],
              "measured_fastest": min(rows, key=lambda r: r["measured_s"])["strategy"],
              "rank_correlation": spearman(pred, meas)}
    write_json(str(out / "report.json"), report)
    write_text(str(out / "report.md"), sweep_text(report) + "\n")
    return report


def sweep_text(r: dict) -> str:
    rows = [[x["strategy"], f"{x['predicted_s']:.4f}", f"{x['measured_s']:.4f}", f"{x['error']:+.1%}"] for x in r["rows"]]
    return "\n".join([
        f"End-to-end validation ({r['size']} model, {r['nproc']} processes, {r['steps']} steps, calibrated profile)",
        "measured on {host}: {device} with {backend}, torch {torch}".format(**{k: r["environment"].get(k, "?")
                                                                       for k in ("host", "device", "backend", "torch")}),
        "", table(["strategy", "predicted step s", "measured step s", "error"], rows), "",
        f"median |error|: {r['median_abs_error']:.1%}; predicted fastest: {r['predicted_fastest']}, "
        f"measured fastest: {r['measured_fastest']}; Spearman rank correlation {r['rank_correlation']:.2f}"])
