"""--recompute-layers: only N layers of each model chunk recompute (Megatron's block method,
torchtitan's layer-level selective checkpointing); the others keep their activations."""

import pytest

from simpar.cli import main
from simpar.cost.step import predict
from simpar.memory.model import memory_breakdown
from simpar.specs import MODELS, JobSpec, Strategy, load_cluster
from simpar.workload import flops

M = MODELS["llama3-8b"]  # 32 layers
H100 = load_cluster("dgx-h100", None)
JOB = JobSpec(8192, 8)


def _predict(**kw):
    return predict(M, H100, JOB, Strategy(dp=8, zero=3, stack="torchtitan", **kw), check=False)


def test_recomputing_k_of_n_layers_costs_k_nths_of_the_recompute():
    full, none = _predict(recompute="full"), _predict()
    half = _predict(recompute="full", recompute_layers=16)
    assert half.breakdown["recompute"] == pytest.approx(full.breakdown["recompute"] / 2, rel=1e-9)
    assert half.breakdown["forward_compute"] == pytest.approx(full.breakdown["forward_compute"])
    assert none.step_time_s < half.step_time_s < full.step_time_s
    # all 32 layers of the one chunk: the same as full recompute
    assert _predict(recompute="full", recompute_layers=32).step_time_s == full.step_time_s
    # hardware FLOPs count half the recomputed forward
    extra = flops.recompute_flops_per_token(M, 8192, "full") / 2
    assert half.hfu / half.mfu == pytest.approx(
        1 + extra / flops.model_flops_per_token(M, 8192), rel=1e-6)


def test_layers_that_do_not_recompute_keep_their_activations():
    """Each layer that does not recompute keeps what recompute would regenerate: the saved
    activations grow by one such share per layer, linearly in the layers recomputed."""
    def act(k):
        s = Strategy(dp=8, zero=3, stack="torchtitan", recompute="full", recompute_layers=k)
        return memory_breakdown(M, JOB, s).activations_gib

    full = memory_breakdown(M, JOB, Strategy(dp=8, zero=3, stack="torchtitan",
                                             recompute="full")).activations_gib
    assert act(32) == pytest.approx(full)
    assert act(8) - act(16) == pytest.approx(act(16) - act(24), rel=1e-9)
    assert act(8) > act(16) > act(24) > full
    # with two chunks per rank (interleaved, vpp 2), N layers of each chunk: 2N per rank
    s = Strategy(dp=4, pp=2, vpp=2, schedule="interleaved", recompute="full", recompute_layers=4)
    assert s.recomputed(16, s.chunks_per_rank) == 8
    assert s.recompute_share(32) == pytest.approx(0.5)


def test_deepspeed_gathers_again_only_for_the_layers_it_recomputes():
    from simpar.cost.step import zero3_passes

    gpt = MODELS["gpt3-175b"]  # 96 layers; 8/12 of a block freed before its backward
    s = Strategy(dp=64, zero=3, stack="deepspeed", recompute="full", recompute_layers=48)
    assert zero3_passes(s, gpt, "B") == pytest.approx(1 + 0.5 * 8 / 12)


def test_the_command_line_takes_and_checks_recompute_layers(capsys):
    base = ["simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len",
            "8192", "--global-batch", "8", "--json"]
    assert main(base + ["--recompute", "full", "--recompute-layers", "8"]) == 0
    import json

    doc = json.loads(capsys.readouterr().out)
    assert doc["strategy"]["recompute_layers"] == 8
    for bad in (["--recompute-layers", "8"], ["--recompute", "full", "--recompute-layers", "-1"],
                ["--recompute", "full", "--recompute-layers", "33"]):
        assert main(base + bad) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "recompute" in err[0]
    # the text report says how many
    assert main(base[:-1] + ["--recompute", "full", "--recompute-layers", "8"]) == 0
    assert "recompute full (8 layers/chunk)" in capsys.readouterr().out


def test_a_plan_carries_recompute_layers(tmp_path):
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len",
                 "8192", "--global-batch", "8", "--zero", "3", "--recompute", "full",
                 "--recompute-layers", "4", "--out", str(out)]) == 0
    from simpar.specs.plan import load_plan

    assert load_plan(str(out)).strategy.recompute_layers == 4


def test_compare_can_recompute_only_the_layers_memory_needs(capsys):
    """Llama 3 8B at 16K tokens on 8 H100s under FSDP fits only with recompute; with
    --partial-recompute the best candidate recomputes fewer layers, fits, and is faster."""
    import json

    base = ["compare", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len",
            "16384", "--global-batch", "16", "--stack", "torchtitan", "--tp", "1", "--pp", "1",
            "--cp", "1", "--rerank", "0", "--json"]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out)["top"]
    assert all(r["strategy"]["recompute_layers"] == 0 for r in plain)
    assert main(base + ["--partial-recompute"]) == 0
    best = json.loads(capsys.readouterr().out)["top"][0]
    k = best["strategy"]["recompute_layers"]
    assert 0 < k < 32 and best["memory"]["total_gib"] <= 79.6
    assert best["step_time_s"] < min(r["step_time_s"] for r in plain)
    # one layer fewer would not fit
    s = Strategy(**{**best["strategy"], "recompute_layers": k - 1})
    assert memory_breakdown(M, JobSpec(16384, 16), s).total_gib > 79.6
