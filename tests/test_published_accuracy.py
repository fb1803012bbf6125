"""The calibration benchmark as a regression test: it runs in well under a second."""

import yaml


def test_median_error_over_published_throughput_points_is_at_most_10_percent(benchmark):
    bench = benchmark("published_accuracy")
    points = yaml.safe_load(bench.DATA.read_text())["points"]
    rows = bench.throughput_rows(points)
    assert len(rows) == 21
    errors = sorted(abs(r["error"]) for r in rows)
    assert errors[len(errors) // 2] <= 0.10
    assert max(errors) < 0.35  # no point wildly off
    # every published configuration really ran: none is rejected as OOM
    assert all(r["fits_memory"] for r in rows)


def test_per_layer_times_within_10_percent(benchmark):
    bench = benchmark("published_accuracy")
    rows = bench.layer_rows(yaml.safe_load(bench.DATA.read_text())["points"])
    assert len(rows) == 5 and all(abs(r["error"]) < 0.10 for r in rows)
