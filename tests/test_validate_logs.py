"""`simpar validate PLAN LOG`: a torchtitan or Megatron training log read as the measurement of the
plan's run (simpar/report/trainer_logs.py)."""

import json
from pathlib import Path

import pytest

from simpar.cli import main

DATA = Path(__file__).parent / "data"
MODELS = Path(__file__).parents[1] / "benchmarks" / "data" / "h100_execpar"
# torchtitan 0.2.2 on the lent H200, local batch 8 of 2,048 tokens (reports/torchtitan-h200)
TORCHTITAN_LOG = DATA / "torchtitan_h200_m1b_s2k_mb8.log"


def _plan(tmp_path, *args) -> str:
    out = str(tmp_path / "plan.json")
    assert main(["plan", "--model", str(MODELS / "m1b.yaml"), "--gpu", "h200", "--seq-len", "2048",
                 "--out", out, *args]) == 0
    return out


def _validate(capsys, plan: str, log) -> dict:
    capsys.readouterr()
    assert main(["validate", plan, str(log), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _refused(capsys, plan: str, log) -> str:
    capsys.readouterr()
    try:
        rc = main(["validate", plan, str(log)])
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    return err[0]


def _figures(report: dict) -> dict:
    return {r["figure"]: r["measured"] for r in report["figures"]}


def test_a_torchtitan_log_is_the_median_steady_step_of_its_tps_and_its_peak_reserved(
        tmp_path, capsys):
    plan = _plan(tmp_path, "--gpus", "1", "--global-batch", "8", "--micro-batch", "8",
                 "--stack", "torchtitan")
    report = _validate(capsys, plan, TORCHTITAN_LOG)
    assert report["measured_by"] == "torchtitan log"
    assert report["steady_steps"] == list(range(4, 16))
    got = _figures(report)
    # steps 4-15 log tps 48,925 to 51,197: their median is (50,210 + 50,530) / 2 per GPU
    assert got["tokens/s"] == pytest.approx(50_370)
    assert got["step time (s)"] == pytest.approx(8 * 2048 / 50_370)
    assert got["peak reserved per GPU (GiB)"] == 74.38
    assert report["stack"] == "torchtitan"
    # its 2024 releases logged words per second, in color by default
    colored = tmp_path / "titan-2024.log"
    colored.write_text("".join(
        f"\x1b[31mstep: {s:2}  \x1b[32mloss: 9.0000  \x1b[33mmemory: 70.00GiB(73.20%)  "
        f"\x1b[34mwps: {w:,}  \x1b[35mmfu: 40.00%\x1b[39m\n"
        for s, w in ((1, 9_000), (2, 30_000), (3, 48_000), (4, 50_000), (5, 52_000))))
    assert _figures(_validate(capsys, plan, colored))["tokens/s"] == 51_000


MEGATRON_LINE = (" [2026-12-02 10:00:00.000000] iteration {:8d}/{:8d} | consumed samples: {:12d} | "
                 "elapsed time per iteration (ms): {:.1f} | throughput per GPU (TFLOP/s/GPU): "
                 "401.2 | learning rate: 3.000000E-04 | global batch size: {:5d} | lm loss: "
                 "9.5E+00 | loss scale: 1.0 | grad norm: 1.000 | number of skipped iterations:"
                 "   0 | number of nan iterations:   0 |")


def _megatron_log(path: Path, ms: list[float], batch: int, memory_mib=()) -> Path:
    """A log in Megatron's training_log and report_memory formats (megatron/training)."""
    lines = [MEGATRON_LINE.format(i, 100, i * batch, t, batch) for i, t in enumerate(ms, 1)]
    lines += [f"[Rank {r}] (after 1 iterations) memory (MB) | allocated: 1.00 | max allocated: "
              f"{a:.2f} | reserved: 2.00 | max reserved: {v:.2f}" for r, (a, v) in
              enumerate(memory_mib)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_megatron_log_is_the_median_iteration_past_warm_up_and_the_largest_stage_peak(
        tmp_path, capsys):
    plan = _plan(tmp_path, "--gpus", "2", "--global-batch", "16", "--micro-batch", "8")
    # iterations 1-3 are warm-up; 4-8 ran 400, 410, 390, 405, 1000 ms: median 405 ms
    log = _megatron_log(tmp_path / "megatron.log", [9000, 2000, 600, 400, 410, 390, 405, 1000], 16,
                        memory_mib=[(40_960, 45_056), (51_200, 53_248)])
    report = _validate(capsys, plan, log)
    got = _figures(report)
    assert report["measured_by"] == "Megatron log" and report["steady_steps"] == [4, 5, 6, 7, 8]
    assert got["step time (s)"] == pytest.approx(0.405)
    assert got["tokens/s"] == pytest.approx(16 * 2048 / 0.405)
    assert got["peak allocated per GPU (GiB)"] == pytest.approx(50.0)
    assert got["peak reserved per GPU (GiB)"] == pytest.approx(52.0)


def test_a_log_of_another_batch_or_only_warm_up_steps_is_refused_in_one_line(tmp_path, capsys):
    plan = _plan(tmp_path, "--gpus", "2", "--global-batch", "16", "--micro-batch", "8")
    other = _megatron_log(tmp_path / "other.log", [900, 800, 700, 400, 410], 32)
    assert "global batch 32 (plan: 16)" in _refused(capsys, plan, other)
    short = _megatron_log(tmp_path / "short.log", [900, 800, 700], 16)
    assert "no step after the first 3" in _refused(capsys, plan, short)
    neither = tmp_path / "notes.txt"
    neither.write_text("loss went down\n")
    assert "not valid JSON" in _refused(capsys, plan, neither)


def test_the_readmes_validate_example_is_what_the_commands_print(tmp_path, capsys):
    plan = _plan(tmp_path, "--gpus", "1", "--global-batch", "8", "--micro-batch", "8",
                 "--stack", "torchtitan", "--attention", "best", "--optimizer", "fused",
                 "--norm", "fused")
    capsys.readouterr()
    assert main(["validate", plan, str(TORCHTITAN_LOG)]) == 0
    table = capsys.readouterr().out.split("\n\n")[1].splitlines()
    readme = (Path(__file__).parents[1] / "README.md").read_text().splitlines()
    assert len(table) == 5 and all(line in readme for line in table)


def test_a_megatron_bridge_log_reports_memory_in_gb_and_its_allocator_retries(tmp_path, capsys):
    plan = _plan(tmp_path, "--gpus", "2", "--global-batch", "16", "--micro-batch", "8")
    log = _megatron_log(tmp_path / "bridge.log", [900, 800, 700, 400, 410], 16)
    with log.open("a") as f:  # Megatron-Bridge's report_memory: GB of 10^9 bytes
        f.write("[Rank 0] (after 2 iterations) memory (GB) | mem-allocated-gigabytes: 30.0 | "
                "mem-max-allocated-gigabytes: 53.687 | mem-max-reserved-gigabytes: 64.425 | "
                "mem-alloc-retires: 7 | mem-allocated-count: 900\n")
    report = _validate(capsys, plan, log)
    got = _figures(report)
    assert got["peak allocated per GPU (GiB)"] == pytest.approx(53.687e9 / 2**30)
    assert got["peak reserved per GPU (GiB)"] == pytest.approx(64.425e9 / 2**30)
    assert report["alloc_retries"] == 7
    assert main(["validate", plan, str(log)]) == 0
    assert "retried 7 cudaMalloc calls" in capsys.readouterr().out
