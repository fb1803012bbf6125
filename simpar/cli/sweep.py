"""End-to-end validation on the machine at hand: calibrate, plan each strategy with the calibrated
profile, run it with execpar, set prediction beside measurement, and rank both ways.

Everything runs as subprocesses (torchrun for the measurements), so simpar itself never
imports torch."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from simpar.errors import SpecError
from simpar.files import make_folder, write_json, write_text
from simpar.report.validate import compare, sweep_text
from simpar.specs.schedule import GPIPE

# (name, simpar plan flags) for 2 processes; a hybrid of pipeline and recompute stands
# for the mixes.
STRATEGIES_2 = [("dp", []), ("zero3", ["--zero", "3"]), ("tp_sp", ["--tp", "2", "--sp"]),
                ("pp_1f1b", ["--pp", "2"]), ("pp_gpipe", ["--pp", "2", "--schedule", GPIPE.name]),
                ("pp_recompute", ["--pp", "2", "--recompute", "full"])]
# One process (one GPU): the micro-batch and recompute settings a single-device plan
# chooses between.
STRATEGIES_1 = [("mb1", ["--micro-batch", "1"]), ("mb2", ["--micro-batch", "2"]),
                ("mb4", ["--micro-batch", "4"]),
                ("mb2_selective", ["--micro-batch", "2", "--recompute", "selective"]),
                ("mb4_full", ["--micro-batch", "4", "--recompute", "full"]),
                ("mb8_full", ["--micro-batch", "8", "--recompute", "full"])]
STRATEGIES = {1: STRATEGIES_1, 2: STRATEGIES_2}
SIZES = {  # model YAML text, seq_len, global batch
    "tiny": ("name: sweep-tiny\nlayers: 2\nhidden: 128\nheads: 4\nkv_heads: 2\n"
             "ffn_hidden: 384\nvocab: 1024\n", 64, 4),
    "small": ("name: sweep-small\nlayers: 4\nhidden: 512\nheads: 8\nkv_heads: 4\n"
              "ffn_hidden: 1536\nvocab: 4096\n", 256, 8),
    # a 1B-class Llama for a GPU (the H100 calibration runs' m1b)
    "1b": ("name: sweep-1b\nlayers: 16\nhidden: 2048\nheads: 32\nkv_heads: 8\n"
           "ffn_hidden: 8192\nvocab: 128256\n", 2048, 8),
}


# what torchrun reports when a rank died of a signal: gloo can abort a process whose work is done
# at teardown ("terminate called without an active exception", SIGABRT) or fault inside a
# collective (SIGSEGV), rarely and never twice in a row in this project's CI (tests/test_execpar.py)
RANK_CRASHES = ("exitcode: -6", "exitcode: -11")


def _run(cmd: list[str], log, retries: int = 0) -> None:
    """Run one step of the sweep, logging its output; a launch whose rank crashed (RANK_CRASHES)
    runs again up to `retries` times, the log saying so."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    log.write(" ".join(cmd) + "\n" + proc.stdout[-4000:] + proc.stderr[-4000:] + "\n")
    if proc.returncode != 0 and retries and any(c in proc.stderr for c in RANK_CRASHES):
        log.write("a rank crashed; running the step again\n")
        return _run(cmd, log, retries - 1)
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
    return (
        1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb, strict=True)) / (n * (n * n - 1))
        if n > 1
        else 1.0
    )


def run_sweep(out_dir: str, nproc: int, size: str, steps: int, device: str = "cpu",
              progress=print) -> dict:
    """Calibrate on `device` (cpu: gloo, fp32; cuda: NCCL, bf16), then plan, run and
    compare each strategy of the set for `nproc` processes."""
    if nproc not in STRATEGIES:
        raise SpecError(
            "--nproc-per-node", nproc, "the sweep has strategy sets for 1 process (micro-batch "
            "and recompute, e.g. one GPU) and 2 (parallelisms); use 1 or 2")
    out = Path(out_dir)
    make_folder(str(out), "--out")
    model_text, seq, batch = SIZES[size]
    (out / "model.yaml").write_text(model_text)
    py = sys.executable
    with open(out / "sweep.log", "w") as log:
        profile = out / "profile.yaml"
        progress(f"calibrating with {nproc} processes ...")
        _run([
            py, "-m", "simpar.cli", "calibrate", "--nproc-per-node",
            str(nproc), "--device", device, "--model",
            str(out / "model.yaml"), "--seq-len",
            str(seq), "--micro-batch",
            str(batch // nproc), "--out",
            str(profile)
        ], log)
        rows = []
        for name, flags in _for_batch(STRATEGIES[nproc], batch):
            plan, measured = out / f"plan-{name}.json", out / f"measured-{name}.json"
            _run(
                [
                    py,
                    "-m",
                    "simpar.cli",
                    "plan",
                    "--model",
                    str(out / "model.yaml"),
                    "--cluster",
                    str(profile),
                    "--gpus",
                    str(nproc),
                    "--seq-len",
                    str(seq),
                    "--global-batch",
                    str(batch),
                    # --force: a strategy predicted not to fit is measured too (the
                    # sweep checks that prediction)
                    "--dtype",
                    "bf16" if device == "cuda" else "fp32",
                    *flags,
                    "--out",
                    str(plan),
                    "--force",
                ],
                log,
            )
            _run([
                py, "-m", "execpar.cli", "launch",
                str(plan), "--nproc-per-node",
                str(nproc), "--steps",
                str(steps), "--device", device, "--out",
                str(measured)
            ], log, retries=1)
            rows.append(_row(name, compare(str(plan), str(measured))["figures"]))
            progress(f"  {name}: predicted {rows[-1]['predicted_s']:.3f} s, measured "
                     f"{rows[-1]['measured_s']:.3f} s ({rows[-1]['error']:+.1%})")
    pred, meas = [r["predicted_s"] for r in rows], [r["measured_s"] for r in rows]
    env = json.loads(
        (out / f"measured-{rows[0]['strategy']}.json").read_text()).get("environment", {})
    report = {"size": size, "nproc": nproc, "steps": steps, "rows": rows, "environment": env,
              "median_abs_error": statistics.median(abs(r["error"]) for r in rows),
              "predicted_fastest": min(rows, key=lambda r: r["predicted_s"])["strategy"],
              "measured_fastest": min(rows, key=lambda r: r["measured_s"])["strategy"],
              "rank_correlation": spearman(pred, meas)}
    write_json(str(out / "report.json"), report)
    write_text(str(out / "report.md"), sweep_text(report) + "\n")
    return report


def _for_batch(strategies: list, batch: int) -> list:
    """The strategies whose micro-batch divides the size's global batch (mb8 needs a batch of 8)."""
    def micro(flags):
        return int(flags[flags.index("--micro-batch") + 1]) if "--micro-batch" in flags else 1
    return [(name, flags) for name, flags in strategies if batch % micro(flags) == 0]


def _row(name: str, figures: list[dict]) -> dict:
    """Step time, and on CUDA the peak allocated memory, predicted and measured."""
    by = {f["figure"]: f for f in figures}
    step = by["step time (s)"]
    row = {
        "strategy": name, "predicted_s": step["predicted"], "measured_s": step["measured"],
        "error": step["error"]
    }
    mem = by.get("peak allocated per GPU (GiB)")
    if mem:
        row.update(predicted_gib=mem["predicted"], measured_gib=mem["measured"],
                   memory_error=mem["error"])
    return row
