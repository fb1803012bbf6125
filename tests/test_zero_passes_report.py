"""`simpar simulate --explain` on a sharded strategy: where one rank's ZeRO collectives spend the
step, part by part (simpar/report/dpsync.py)."""

import json
from dataclasses import replace

import pytest

from simpar.cli import main
from simpar.report.dpsync import zero_passes
from simpar.specs import MODELS, JobSpec, Strategy, load_cluster
from simpar.specs.stack import BARE_OP_US

A100 = load_cluster("dgx-a100", None)
GPT = MODELS["gpt3-175b"]


def _passes(strategy, job):
    return {z.name: z for z in zero_passes(GPT, A100, job, strategy)}


def test_deepspeeds_per_tensor_collectives_pay_one_host_op_per_rank_of_the_group():
    """DeepSpeed of 2021 gathers GPT-3's four weight matrices of each of 96 blocks one by one
    (biases and norms stay whole under the 1e5-element persistence threshold): 384 collectives a
    pass, each building a list of 1536 views and copies, BARE_OP_US apiece. Its gradients are
    all-reduced from flat buckets: no list, but flatten, divide and copy back, 6 passes over
    them."""
    from simpar.cost.compute import hbm_rate

    s = Strategy(dp=1536, zero=3, micro_batch=1, recompute="full", stack="deepspeed")
    rows = _passes(s, JobSpec(2048, 1536, "fp16"))
    gather = rows["parameter all-gather"]
    assert gather.parts.collectives == 384
    assert gather.parts.host_s == pytest.approx(384 * 1536 * BARE_OP_US * 1e-6)
    # GPT-3's block, 12 h^2 weights in fp16, over four collectives
    assert gather.parts.bytes_per_collective == pytest.approx(12 * 12288**2 * 2 / 4, rel=0.01)
    # forward, recompute, and backward for the 8/12 of each block freed in between
    assert gather.per_step == pytest.approx(1 + 1 + 8 / 12)
    assert 0 < gather.parts.latency_s < gather.parts.wire_s
    reduce = rows["gradient all-reduce"]
    assert reduce.per_step == 1 and reduce.parts.collectives == 384 and reduce.parts.host_s == 0
    stage_bytes = 384 * reduce.parts.bytes_per_collective
    assert reduce.parts.copies_s == pytest.approx(6 * stage_bytes / hbm_rate(A100.gpu))
    # the norms and biases gathered again at the step's end, one loop iteration per
    # (parameter, rank): 770 x 1536 of them, with the one gather's list of 1536 views
    again = rows["persistent re-gather"]
    assert again.per_step == 1 and again.parts.collectives == 1
    assert again.parts.host_s == pytest.approx((770 * 1536 * 18.8 + 1536 * 8) * 1e-6)
    assert "persistent re-gather" not in _passes(replace(s, stack="deepspeed-0.6"),
                                                 JobSpec(2048, 1536, "fp16"))


def test_the_latency_share_grows_with_the_ring_and_fsdp_builds_no_lists():
    job = JobSpec(2048, 1536, "fp16")
    small, large = (_passes(Strategy(dp=n, zero=3, micro_batch=1536 // n, stack="deepspeed"),
                            job)["parameter all-gather"].parts for n in (384, 1536))
    # a ring's message steps grow with its ranks; the bytes a rank moves do not
    assert large.latency_s > 3 * small.latency_s
    assert large.wire_s - large.latency_s == pytest.approx(small.wire_s - small.latency_s,
                                                           rel=0.05)
    fsdp = _passes(Strategy(dp=64, zero=3, micro_batch=1, stack="fsdp"), JobSpec(2048, 128))
    gather = fsdp["parameter all-gather"]
    assert gather.parts.host_s == 0 and gather.parts.copies_s == 0
    # one collective per block; two micro-batches, each gathering for forward and backward
    assert gather.parts.collectives == 96 and gather.per_step == 4


def test_unsharded_runs_print_no_zero_table_and_sharded_ones_do(capsys):
    base = ["simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len",
            "4096", "--global-batch", "16", "--engine", "analytic", "--explain"]
    assert main(base + ["--zero", "0"]) == 0
    assert "ZeRO collectives" not in capsys.readouterr().out
    assert main(base + ["--zero", "3", "--stack", "torchtitan"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("ZeRO collectives"):]
    assert "\nparameter all-gather " in table and "\ngradient reduce-scatter " in table
    assert main(base + ["--zero", "3", "--stack", "torchtitan", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in doc["zero_passes"]}
    gather = rows["parameter all-gather"]
    assert gather["step_s"] == pytest.approx(gather["per_step"] * (
        gather["wire_s"] + gather["host_s"] + gather["copies_s"] + gather["replica_s"]))
