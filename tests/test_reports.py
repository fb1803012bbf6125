"""simpar validate and simpar scale."""

import csv
import json

import pytest

from simpar.cli import main


def test_scale_writes_a_csv_and_a_plot(tmp_path, capsys):
    out = tmp_path / "scale"
    assert main([
        "scale", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpu-list", "8,16,32", "--seq-len",
        "4096", "--global-batch", "64", "--strong", "--network", "alpha-beta", "--out",
        str(out)
    ]) == 0
    rows = list(csv.DictReader(open(out / "scaling-strong.csv")))
    assert [int(r["gpus"]) for r in rows] == [8, 16, 32]
    assert all(r["strategy"] for r in rows) and float(rows[0]["efficiency"]) == pytest.approx(1.0)
    effs = [float(r["efficiency"]) for r in rows]
    assert all(0 < e <= 1.05 for e in effs)
    tps = [float(r["tokens_per_s"]) for r in rows]
    assert tps == sorted(tps)  # more GPUs, more throughput at a fixed batch
    assert (out / "scaling-strong.png").stat().st_size > 10_000
    assert "wrote" in capsys.readouterr().out


def test_weak_scaling_grows_the_batch(tmp_path, capsys):
    assert main([
        "scale", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpu-list", "8,32", "--seq-len",
        "4096", "--global-batch", "16", "--weak", "--network", "alpha-beta", "--out",
        str(tmp_path), "--json"
    ]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["global_batch"] for r in doc["rows"]] == [16, 64]


def test_validate_sets_prediction_beside_measurement(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert main([
        "plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096",
        "--global-batch", "16", "--tp", "8", "--sp", "--out",
        str(plan)
    ]) == 0
    capsys.readouterr()
    predicted = json.loads(plan.read_text())["prediction"]
    measured = {"schema": "execpar-measurement", "step_time_s": predicted["step_time_s"] * 1.25,
                "tokens_per_s": predicted["tokens_per_s"] / 1.25, "memory": {"total_gib": 40.0},
                "breakdown": {"comm_s": 0.1, "compute_s": 1.0}}
    m = tmp_path / "measured.json"
    m.write_text(json.dumps(measured))
    png = tmp_path / "v.png"
    assert main(["validate", str(plan), str(m), "--png", str(png), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    step = next(r for r in doc["figures"] if r["figure"].startswith("step time"))
    assert step["error"] == pytest.approx(1 / 1.25 - 1)
    assert png.stat().st_size > 5_000 and "communication_s" in doc["phases"]
    m.write_text("{}")
    assert main(["validate", str(plan), str(m)]) == 2
    capsys.readouterr()
    # a measurement of another strategy (data parallel, where the plan is tp 8) is not
    # compared with it
    strategy = {**json.loads(plan.read_text())["strategy"], "dp": 8, "tp": 1, "sp": False}
    m.write_text(json.dumps({**measured, "strategy": strategy, "global_batch": 16}))
    assert main(["validate", str(plan), str(m)]) == 2
    err = capsys.readouterr().err
    assert (
        "ran another strategy than the plan: dp 8 (plan: 1), tp 1 (plan: 8)" in err
        and err.count("\n") == 1
    )


def _profile(tmp_path, tflops: float, bw: float) -> str:
    import yaml
    p = tmp_path / f"profile-{tflops}-{bw}.yaml"
    p.write_text(
        yaml.safe_dump({
            "name": "handmade", "gpu": {
                "name": "cpu-x", "fp32_tflops": tflops, "tf32_tflops": tflops,
                "bf16_tflops": tflops, "fp8_tflops": 0.0, "hbm_gib": 16.0, "hbm_tbps": 0.01,
                "sm_count": 1, "gemm_efficiency": 1.0, "attention_efficiency": 0.5,
                "hbm_efficiency": 1.0, "kernel_overhead_us": 5.0
            }, "gpus_per_node": 2, "intra_node_bw_gbps": bw, "intra_node_latency_us": 50.0,
            "nic_bw_gbps": bw, "inter_node_latency_us": 50.0, "intra_node_efficiency": 1.0,
            "inter_node_efficiency": 1.0, "topology": {"kind": "local"}
        }))
    return str(p)


def test_a_calibrated_profile_loads_and_moves_predictions_as_its_figures_say(tmp_path, capsys):
    def predict(profile, *flags):
        args = [
            "simulate", "--model", "llama3-8b", "--cluster", profile, "--gpus", "2", "--seq-len",
            "512", "--global-batch", "4", "--dtype", "fp32", "--engine", "analytic", "--json",
            *flags
        ]
        assert main(args) == 0
        return json.loads(capsys.readouterr().out)["breakdown"]

    base = predict(_profile(tmp_path, 0.1, 1.0))
    slow_gemm = predict(_profile(tmp_path, 0.05, 1.0))
    # halving the GEMM rate roughly doubles the forward compute (GEMMs dominate it at this size)
    assert 1.7 < slow_gemm["forward_compute"] / base["forward_compute"] <= 2.0
    tp = predict(_profile(tmp_path, 0.1, 1.0), "--tp", "2")
    tp_fast_net = predict(_profile(tmp_path, 0.1, 10.0), "--tp", "2")
    assert tp_fast_net["tp_comm"] < tp["tp_comm"] / 5
