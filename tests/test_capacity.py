"""Time, money, failures and launch files."""

import json
import math
import subprocess

import pytest
import yaml

from simpar.capacity.reliability import (
    ReliabilityInputs,
    reliability,
    time_and_cost,
    waste_fraction,
    young_daly_interval,
)
from simpar.cli import main
from simpar.specs import Strategy

# 1,024 GPUs in 128 nodes, every rank writes its optimizer shard
ZERO1 = Strategy(dp=128, tp=8, zero=1)


def test_young_daly_interval_and_waste_by_hand():
    write, mtbf = 60.0, 10 * 3600.0
    tau = young_daly_interval(write, mtbf)
    assert tau == pytest.approx(math.sqrt(2 * 60 * 36000) - 60)  # 2018.4 s
    waste = waste_fraction(tau, write, 600.0, mtbf)
    assert waste == pytest.approx(60 / tau + (tau / 2 + 600) / 36000)


def test_reliability_of_a_job():
    r = reliability(70e9, ZERO1, ReliabilityInputs(gpu_mtbf_hours=51200.0, node_mtbf_hours=math.inf,
                                                   storage_gbps=100.0, restart_min=10.0))
    assert r.job_mtbf_hours == pytest.approx(50.0)
    # 16-bit weights + fp32 master and moments
    assert r.checkpoint_gib == pytest.approx(70e9 * 14 / 2**30)
    write = 70e9 * 14 / 100e9  # 128 nodes x 25 GB/s exceed the file system's 100 GB/s
    assert r.checkpoint_write_s == pytest.approx(write)
    assert r.restart_s == pytest.approx(600 + write)
    tau = math.sqrt(2 * write * 50 * 3600) - write
    assert r.checkpoint_interval_s == pytest.approx(tau)
    assert r.goodput == pytest.approx(1 - write / tau - (tau / 2 + 600 + write) / (50 * 3600))
    more = reliability(
        70e9, ZERO1,
        ReliabilityInputs(gpu_mtbf_hours=51200.0, node_mtbf_hours=math.inf,
                          preemptions_per_day=12.0))
    assert more.job_mtbf_hours == pytest.approx(1 / (1 / 50 + 0.5)) and more.goodput < r.goodput
    # node failures add per node: 1024 GPUs in 128 nodes of 8, one node failure per 6,400 node-hours
    nodes = reliability(70e9, ZERO1,
                        ReliabilityInputs(gpu_mtbf_hours=51200.0, node_mtbf_hours=6400.0), 8)
    assert nodes.job_mtbf_hours == pytest.approx(1 / (1024 / 51200 + 128 / 6400))


def test_checkpoint_size_and_write_time_follow_the_strategy():
    inputs = ReliabilityInputs(storage_gbps=200.0, node_storage_gbps=25.0)
    # without ZeRO one replica (tp8 x pp2 = 16 GPUs, 2 nodes) writes: 2 x 25 GB/s
    ddp = reliability(70e9, Strategy(dp=64, tp=8, pp=2), inputs, 8)
    assert ddp.checkpoint_write_s == pytest.approx(70e9 * 14 / 50e9)
    # 128 nodes: the file system binds
    sharded = reliability(70e9, Strategy(dp=64, tp=8, pp=2, zero=1), inputs, 8)
    assert sharded.checkpoint_write_s == pytest.approx(70e9 * 14 / 200e9)
    # weights + two moments
    fp32 = reliability(70e9, Strategy(dp=64, tp=8, pp=2, zero=1), inputs, 8, "fp32")
    assert fp32.checkpoint_gib == pytest.approx(70e9 * 12 / 2**30)
    # DeepSpeed's BF16_Optimizer shards the optimizer at ZeRO 0 too (BLOOM's pipelines): every
    # rank writes its shard, as under ZeRO 1; in fp16 one replica writes
    bloom = Strategy(dp=64, tp=8, pp=2, zero=0, stack="deepspeed")
    bf16 = reliability(70e9, bloom, inputs, 8)
    assert bf16.checkpoint_write_s == pytest.approx(bf16.checkpoint_gib * 2**30 / 200e9)
    fp16 = reliability(70e9, bloom, inputs, 8, "fp16")
    assert fp16.checkpoint_write_s == pytest.approx(fp16.checkpoint_gib * 2**30 / 50e9)


def test_default_failure_rates_add_up_to_the_llama3_interruptions():
    from simpar.capacity.reliability import ReliabilityInputs as R
    per_hour = 16384 / R().gpu_mtbf_hours + 2048 / R().node_mtbf_hours
    assert per_hour * 54 * 24 == pytest.approx(419)


def test_time_and_cost_arithmetic():
    t = time_and_cost(tokens=8.64e12, tokens_per_s=1e6, gpus=1000, goodput=0.8,
                      price_per_gpu_hour=2.0, gpu_power_w=700.0)
    assert t["ideal_days"] == pytest.approx(100.0)
    assert t["wall_clock_days"] == pytest.approx(125.0)
    assert t["gpu_hours"] == pytest.approx(125 * 24 * 1000)
    assert t["cost"] == pytest.approx(125 * 24 * 1000 * 2.0)
    # 2,100 MWh at 700 W each
    assert t["gpu_energy_mwh"] == pytest.approx(125 * 24 * 1000 * 700 / 1e6)


def test_launch_files(tmp_path, capsys):
    out = tmp_path / "launch"
    assert main([
        "plan", "--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "64", "--seq-len", "4096",
        "--global-batch", "64", "--tp", "8", "--pp", "2", "--sp", "--zero", "1",
        "--recompute", "selective", "--emit",
        "torchrun,slurm,k8s", "--out",
        str(out), "--json"
    ]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["launch_files"]) == 3 and (out / "plan.json").is_file()
    for script in ("job.slurm", "torchrun.sh"):
        assert subprocess.run(["bash", "-n", str(out / script)]).returncode == 0
    slurm = (out / "job.slurm").read_text()
    assert "#SBATCH --nodes=8" in slurm and "srun" in slurm and "--rdzv-endpoint" in slurm
    assert (out / "torchrun.sh").read_text().count("--node-rank=") == 8
    job = yaml.safe_load((out / "pytorchjob.yaml").read_text())
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 7
    container = specs["Worker"]["template"]["spec"]["containers"][0]
    assert (
        container["resources"]["limits"]["nvidia.com/gpu"] == 8
        and "execpar.cli" in container["command"]
    )
    assert specs["Worker"]["restartPolicy"] == "OnFailure"
    assert any(v["name"] == "checkpoints" for v in specs["Worker"]["template"]["spec"]["volumes"])
    assert main([
        "plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096",
        "--global-batch", "8", "--emit", "mpi", "--out",
        str(tmp_path / "x")
    ]) == 2


def test_simulate_prints_capacity_beside_the_plan(capsys):
    assert main([
        "simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "64", "--seq-len",
        "4096", "--global-batch", "64", "--tp", "8", "--sp", "--engine", "analytic", "--tokens",
        "1T", "--price-per-gpu-hour", "2", "--json"
    ]) == 0
    cap = json.loads(capsys.readouterr().out)["capacity"]
    assert (
        0.9 < cap["reliability"]["goodput"] < 1
        and cap["run"]["wall_clock_days"] > cap["run"]["ideal_days"]
    )
    assert cap["run"]["cost"] == pytest.approx(cap["run"]["gpu_hours"] * 2)


def test_compare_gpu_counts_by_objective_with_a_pareto_plot(tmp_path, capsys):
    png = tmp_path / "pareto.png"
    assert main([
        "compare", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16,32,64", "--seq-len",
        "4096", "--global-batch", "64", "--tokens", "100B", "--price-per-gpu-hour", "2",
        "--objective", "time", "--network", "alpha-beta", "--rerank", "0", "--pareto",
        str(png), "--json"
    ]) == 0
    doc = json.loads(capsys.readouterr().out)
    days = [r["wall_clock_days"] for r in doc["rows"]]
    assert days == sorted(days) and [r["gpus"] for r in doc["rows"]] == [64, 32, 16]
    assert doc["rows"][0]["pareto"] and png.stat().st_size > 5000
    assert main([
        "compare", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16,32", "--seq-len",
        "4096", "--global-batch", "64", "--objective", "cost", "--network", "alpha-beta",
        "--rerank", "0", "--pareto",
        str(png)
    ]) == 2  # a Pareto plot needs --tokens
