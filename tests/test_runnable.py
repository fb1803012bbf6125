"""`simpar plan` refuses, in one line and before writing, the plans execpar would refuse or crash
on (simpar/specs/runnable.py, which execpar checks again before it starts)."""

import pytest

from simpar.cli import main
from simpar.errors import SpecError

TINY = ("name: tiny\nlayers: 4\nhidden: 64\nheads: 4\nkv_heads: 2\nffn_hidden: 128\nvocab: 512\n"
        "gated_mlp: true\n")
MOE = TINY.replace("kv_heads: 2", "kv_heads: 4") + "experts: 4\nexperts_per_token: 2\n"


@pytest.mark.parametrize("model, flags, says", [
    # torch's Schedule1F1B raised ValueError at launch (Megatron's 1F1B runs fewer)
    (TINY, ["--gpus", "2", "--pp", "2", "--global-batch", "1", "--schedule", "1f1b"],
     "Schedule1F1B needs at least one per pipeline stage (2)"),
    # a split backward twice over torch's selective-checkpoint region: RuntimeError in backward
    (TINY, ["--gpus", "2", "--pp", "2", "--global-batch", "2", "--schedule", "zb-h1",
            "--recompute", "op"], "--recompute='op': zb-h1 runs each layer's backward in two"),
    # torch's zero-bubble schedules refuse compiled stages (RuntimeError at launch)
    (TINY, ["--gpus", "2", "--pp", "2", "--global-batch", "2", "--schedule", "zbv", "--compile"],
     "ScheduleZBVZeroBubble refuses compiled stages"),
    (TINY, ["--gpus", "2", "--tp", "2", "--global-batch", "2", "--compile", "--recompute", "full"],
     "cannot compile tensor-parallel blocks under --recompute full"),
    # execpar refused these only at launch, after `simpar plan` had written them
    (MOE, ["--gpus", "2", "--ep", "2", "--global-batch", "2", "--zero", "3"],
     "execpar runs expert parallelism beside DDP only"),
    (MOE, ["--gpus", "2", "--tp", "2", "--global-batch", "2"],
     "execpar runs mixture-of-experts layers without tensor parallelism"),
    # what-ifs simpar prices and execpar does not run: "plan without it", said by execpar only
    (TINY, ["--gpus", "2", "--global-batch", "2", "--ps-servers", "1"],
     "is a what-if simpar predicts but execpar does not run"),
    # execpar's block would train another model than the one priced (gpt-oss, GPT-3)
    (TINY + "attention_window: 16\n", ["--gpus", "1", "--global-batch", "1"],
     "model.attention_window=16: execpar would run another model (its attention spans"),
    (TINY + "position_embeddings: 64\n", ["--gpus", "1", "--global-batch", "1"],
     "model.position_embeddings=64: execpar would run another model"),
    (TINY + "bias: true\n", ["--gpus", "1", "--global-batch", "1"],
     "model.bias=True: execpar would run another model"),
    (TINY + "dropout: true\n", ["--gpus", "1", "--global-batch", "1"],
     "model.dropout=True: execpar would run another model"),
    (MOE + "glu_clamp: 7.0\n", ["--gpus", "1", "--global-batch", "1"],
     "model.glu_clamp=7.0: execpar would run another model"),
], ids=["1f1b-fewer-micro-batches", "zb-h1-op-recompute", "zbv-compile", "compile-tp-recompute",
        "ep-zero3", "moe-tp", "what-if", "window", "learned-positions", "bias", "dropout",
        "glu-clamp"])
def test_a_plan_execpar_cannot_run_is_refused_in_one_line(tmp_path, capsys, model, flags, says):
    path = tmp_path / "m.yaml"
    path.write_text(model)
    out = tmp_path / "plan.json"
    args = ["plan", "--model", str(path), "--cluster", "cpu-local", "--seq-len", "64",
            "--dtype", "fp32", "--out", str(out), *flags]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err, err
    assert not out.exists()


def test_a_plan_of_another_stack_execpar_cannot_run_records_its_prediction_and_says_so(
        tmp_path, capsys):
    """Priced as NeMo runs it (forwards beside other micro-batches' backwards), the plan is for
    `simpar validate` against NeMo's log: written, with why execpar would refuse it, which
    execpar's own check still does; launch files for execpar are refused."""
    from simpar.specs.plan import load_plan
    from simpar.specs.runnable import check_runnable

    path = tmp_path / "m.yaml"
    path.write_text(MOE)
    out = tmp_path / "plan.json"
    args = ["plan", "--model", str(path), "--cluster", "cpu-local", "--seq-len", "64", "--dtype",
            "bf16", "--gpus", "2", "--ep", "2", "--global-batch", "4", "--stack", "nemo",
            "--overlap-ep-comm", "--out", str(out)]
    assert main(args) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "execpar would not run this plan" in err[0]
    assert "not Megatron's combined 1F1B" in err[0]
    plan = load_plan(str(out))
    assert plan.strategy.stack == "nemo"
    with pytest.raises(SpecError, match="not Megatron's combined 1F1B"):
        check_runnable(plan.strategy, plan.model, plan.job)
    folder = tmp_path / "launch"
    assert main(args[:-2] + ["--out", str(folder), "--emit", "torchrun"]) == 2
    assert "not Megatron's combined 1F1B" in capsys.readouterr().err


def test_the_runnable_neighbours_are_planned(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(TINY)
    base = ["plan", "--model", str(path), "--cluster", "cpu-local", "--seq-len", "64", "--dtype",
            "fp32", "--gpus", "2"]
    for flags in (["--pp", "2", "--global-batch", "2", "--schedule", "1f1b"],
                  ["--pp", "2", "--global-batch", "1", "--schedule", "gpipe"],
                  ["--pp", "2", "--global-batch", "2", "--schedule", "zb-h1", "--recompute",
                   "full"],
                  ["--tp", "2", "--global-batch", "2", "--compile", "--recompute", "op"]):
        assert main([*base, *flags, "--out", str(tmp_path / "p.json")]) == 0, flags


def test_a_cuda_graphed_plan_is_for_megatrons_trainer_not_execpar(tmp_path, capsys):
    """execpar launches every kernel from the host: a plan priced with --cuda-graphs is written
    for `simpar validate` against Megatron's log, saying why execpar would not run it."""
    from simpar.specs.plan import load_plan
    from simpar.specs.runnable import check_runnable

    path = tmp_path / "m.yaml"
    path.write_text(TINY)
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", str(path), "--cluster", "cpu-local", "--seq-len", "64",
                 "--dtype", "bf16", "--gpus", "2", "--global-batch", "4", "--stack", "megatron",
                 "--cuda-graphs", "--out", str(out)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "execpar launches every kernel from the host" in err[0]
    plan = load_plan(str(out))
    assert plan.strategy.cuda_graphs and plan.strategy.profile.cuda_graphs
    with pytest.raises(SpecError, match="plan without --cuda-graphs"):
        check_runnable(plan.strategy, plan.model, plan.job)
