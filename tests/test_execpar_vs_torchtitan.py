"""The side-by-side benchmark reads torchtitan's console metric lines as torchtitan prints them
(torchtitan/components/metrics.py: colour codes, thousands separators, N/A without a known peak)."""

import pytest


def _line(step: int, mem: float, tps: int, mfu: str) -> str:
    red, green, blue, magenta, reset = "\x1b[31m", "\x1b[32m", "\x1b[34m", "\x1b[35m", "\x1b[39m"
    return (f"[rank0]:[titan] 2026-11-25 12:00:00,000 - root - INFO - {red}step: {step:2}  "
            f"{green}loss:  7.61234  grad_norm:  1.2345  memory: {mem:5.2f}GiB(30.91%)  "
            f"{blue}tps: {tps:,}  tflops: 394.50  {magenta}mfu: {mfu}{reset}")


def test_torchtitan_metric_lines_are_read_past_the_warmup(benchmark):
    log = "\n".join([
        "[titan] Starting job: Llama 3 1B training",
        _line(1, 70.1, 1_200, "10.00%"),  # warm-up: compile and allocator growth
        _line(10, 71.5, 13_100, "41.00%"),
        "[titan] some other line with step: in it but no metrics",
        _line(20, 71.0, 13_300, "41.60%"),
        _line(30, 71.2, 13_200, "41.30%"),
    ])
    m = benchmark("execpar_vs_torchtitan").torchtitan_metrics(log, warmup=1)
    assert m["tokens_per_s_per_device"] == 13_200
    assert m["mfu_pct"] == pytest.approx(41.30)
    assert m["peak_gib"] == pytest.approx(71.5)


def test_a_log_without_enough_metric_lines_is_one_clear_error(benchmark):
    parse = benchmark("execpar_vs_torchtitan").torchtitan_metrics
    with pytest.raises(SystemExit, match="1 metric lines, need more than --warmup 1"):
        parse(_line(1, 70.1, 1_200, "N/A"), warmup=1)
