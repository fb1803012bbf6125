"""The error bands simulate quotes: computed as stated, written by the accuracy benchmark's run,
and shown for the stack and architecture priced."""

import json
import re
from pathlib import Path

import pytest

from simpar.cli import main
from simpar.report.accuracy import (
    BANDS_FILE,
    CONTEXT_PARALLEL,
    MIN_RUNS,
    band_for,
    bands_from,
    run_feature,
)

REPORT = Path(__file__).resolve().parents[1] / "reports" / "stack_accuracy_stack_defaults.txt"


def test_a_band_is_the_median_and_nine_in_ten_of_its_runs_errors():
    errors = [("a", "dense", "", e) for e in (0.10, -0.02, 0.04, -0.30, 0.01, 0.06, 0.03, -0.05,
                                             0.02, 0.08)]
    errors += [("a", "MoE", "", 0.5), ("a", "MoE", "", 0.4)]  # too few runs for a band
    (band,) = bands_from(errors)
    assert (band.stack, band.architecture, band.feature, band.runs) == ("a", "dense", "", 10)
    # |errors| sorted: .01 .02 .02 .03 .04 .05 .06 .08 .10 .30; median (.04 + .05) / 2
    assert band.median_abs_error == pytest.approx(0.045)
    assert band.p90_abs_error == pytest.approx(0.10)  # the 9th of 10
    # signed, sorted: -.30 -.05 -.02 .01 .02 .03 .04 .06 .08 .10: (.02 + .03) / 2
    assert band.median_signed_error == pytest.approx(0.025)
    assert MIN_RUNS == 3


def test_a_feature_with_enough_runs_has_its_own_band_and_leaves_the_others_theirs():
    dense = [("a", "dense", "", e) for e in (0.01, 0.02, -0.03)]
    ring = [("a", "dense", CONTEXT_PARALLEL, e) for e in (0.30, 0.40, 0.35)]
    (plain, cp) = bands_from(dense + ring)
    assert (plain.feature, plain.runs, plain.median_signed_error) == ("", 3, pytest.approx(0.01))
    assert (cp.feature, cp.runs, cp.median_abs_error) == (CONTEXT_PARALLEL, 3, pytest.approx(0.35))
    assert "3 measured dense context-parallel runs of the a stack" in cp.text()
    # two context-parallel runs are too few for a band: they join the stack's others
    (joined,) = bands_from(dense + ring[:2])
    assert (joined.feature, joined.runs, joined.median_signed_error) == (
        "", 5, pytest.approx(0.02))
    assert run_feature(1) == "" and run_feature(2) == CONTEXT_PARALLEL


def test_the_committed_bands_are_the_ones_the_stack_defaults_run_printed():
    written = json.loads(BANDS_FILE.read_text())
    assert written["written_by"] == "benchmarks/stack_accuracy.py --stack-defaults"
    table = REPORT.read_text().split("\nstack ", 1)[1].split("\n\n", 1)[0]
    printed = {m[1]: (int(m[2]), float(m[3]) / 100, float(m[4]) / 100)
               for m in re.finditer(r"^(\S+)\s+(\d+)\s+([\d.]+)%\s+([+-][\d.]+)%$", table, re.M)}
    by_stack: dict = {}
    for b in written["bands"]:
        by_stack.setdefault(b["stack"], []).append(b)
    assert set(by_stack) <= set(printed) and len(by_stack) >= 6
    for stack, bands in by_stack.items():
        runs, median_abs, median_signed = printed[stack]
        assert sum(b["runs"] for b in bands) <= runs
        if len(bands) == 1 and bands[0]["runs"] == runs:  # one architecture: the stack's row
            assert bands[0]["median_abs_error"] == pytest.approx(median_abs, abs=6e-4)
            assert bands[0]["median_signed_error"] == pytest.approx(median_signed, abs=6e-4)


def test_simulate_quotes_the_band_of_its_stack_and_architecture(capsys):
    dense = ["simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len",
             "4096", "--global-batch", "16", "--stack", "torchtitan", "--zero", "3"]
    assert main([*dense, "--json"]) == 0
    band = json.loads(capsys.readouterr().out)["accuracy"]
    assert band == band_for("torchtitan", moe=False).to_dict() and band["runs"] >= 30
    assert main(dense) == 0
    assert f"accuracy on {band['runs']} measured dense runs of the torchtitan stack" in \
        capsys.readouterr().out
    # no published MoE run of torchtitan was checked: no band, said as null
    moe = ["simulate", "--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "64",
           "--seq-len", "4096", "--global-batch", "256", "--ep", "8", "--stack", "torchtitan",
           "--zero", "3", "--json"]
    assert main(moe) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] is None
    nemo_moe, nemo_dense = band_for("nemo", moe=True), band_for("nemo", moe=False)
    assert nemo_moe.median_abs_error > nemo_dense.median_abs_error


def test_a_context_parallel_run_quotes_the_band_of_the_stacks_context_parallel_runs(capsys):
    # torchtitan's ring attention runs slower than priced as the ring grows: its context-parallel
    # runs' band is their own, and the stack's other runs keep theirs
    args = ["simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len",
            "32768", "--global-batch", "8", "--stack", "torchtitan", "--zero", "3",
            "--recompute", "full", "--json"]
    assert main([*args, "--cp", "2"]) == 0
    ring = json.loads(capsys.readouterr().out)["accuracy"]
    assert ring == band_for("torchtitan", moe=False, cp=2).to_dict()
    assert ring["feature"] == CONTEXT_PARALLEL and ring["runs"] >= MIN_RUNS
    assert main([*args, "--cp", "1"]) == 0
    plain = json.loads(capsys.readouterr().out)["accuracy"]
    assert plain["feature"] == "" and ring["median_abs_error"] > plain["median_abs_error"]
    # a stack with too few context-parallel runs checked quotes its general band
    assert band_for("fsdp", moe=False, cp=4) == band_for("fsdp", moe=False)


def test_a_plan_records_and_prints_the_band_of_the_stack_execpar_runs(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert main(["plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len",
                 "2048", "--global-batch", "8", "--zero", "3", "--out", str(plan)]) == 0
    band = band_for("execpar", moe=False)
    assert json.loads(plan.read_text())["prediction"]["accuracy"] == band.to_dict()
    # fewer than ten runs: the largest error, not a 90th percentile of them
    assert band.runs < 10 and f"within {band.p90_abs_error:.0%} on each" in capsys.readouterr().out
