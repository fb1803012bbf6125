"""simpar as a library: the functions take the command line's flags and give what the
commands print."""

import contextlib
import io
import json

import pytest

import simpar
from simpar.cli import main
from simpar.errors import SpecError

JOB = dict(model="llama3-8b", gpu="h100-sxm", seq_len=4096, global_batch=32)


def _cli_json(*argv) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*argv, "--json"]) == 0
    return json.loads(out.getvalue())


def test_simulate_is_the_command_line_json():
    got = simpar.simulate(**JOB, gpus=16, tp=2, pp=2, sp=True, schedule="interleaved", vpp=2,
                          engine="analytic")
    want = _cli_json("simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--seq-len", "4096",
                     "--global-batch", "32", "--gpus", "16", "--tp", "2", "--pp", "2", "--sp",
                     "--schedule", "interleaved", "--vpp", "2", "--engine", "analytic")
    assert json.loads(json.dumps(got.to_dict())) == want
    assert got.simulation is None and got.prediction.strategy.vpp == 2


def test_switches_go_on_and_off_as_their_flags():
    sp = simpar.simulate(**JOB, gpus=8, tp=2, sp=True, engine="analytic").prediction
    no_sp = simpar.simulate(**JOB, gpus=8, tp=2, sp=False, engine="analytic").prediction
    assert sp.strategy.sp and not no_sp.strategy.sp
    assert sp.memory.activations_gib < no_sp.memory.activations_gib
    flash = simpar.simulate(**JOB, gpus=8, engine="analytic", no_flash_attention=None).prediction
    unfused = simpar.simulate(**JOB, gpus=8, engine="analytic", no_flash_attention=True).prediction
    assert unfused.memory.activations_gib > flash.memory.activations_gib


def test_compare_ranks_as_the_command_line():
    got = simpar.compare(**JOB, gpus=64, top=3, tp=[1, 2])
    want = _cli_json("compare", "--model", "llama3-8b", "--gpu", "h100-sxm", "--seq-len", "4096",
                     "--global-batch", "32", "--gpus", "64", "--top", "3", "--tp", "1,2")
    timing = ("seconds", "priced_per_s", "rerank_seconds")  # how long the search took
    assert {k: v for k, v in json.loads(json.dumps(got.to_dict())).items() if k not in timing} == \
        {k: v for k, v in want.items() if k not in timing}
    assert got.result.ranked[0].step_time_s <= got.result.ranked[1].step_time_s
    assert {p.strategy.tp for p in got.result.ranked} <= {1, 2}


def test_plan_writes_the_file_execpar_reads(tmp_path):
    from simpar.specs.plan import load_plan

    out = simpar.plan(**JOB, gpus=8, tp=2, zero=1, out=str(tmp_path / "plan.json"))
    assert out.path == str(tmp_path / "plan.json")
    assert load_plan(out.path).strategy == out.plan.strategy
    assert out.plan.strategy.tp == 2 and out.plan.strategy.dp == 4


@pytest.mark.parametrize("options, needle", [
    (dict(JOB, gpus=8, tpp=2), "tpp=2: did you mean 'tp'?"),
    (dict(JOB, gpus=8, tp="x"), "argument --tp: invalid int value: 'x'"),
    (dict(model="llama3-8b", gpus=8), "required: --seq-len, --global-batch"),
    (dict(JOB, gpus=8, seq_len=-1), "--seq-len"),
    (dict(JOB, gpus=8, tp=3), "--tp"),
])
def test_bad_options_raise_one_spec_error(options, needle):
    with pytest.raises(SpecError) as err:
        simpar.simulate(**options)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_compare_takes_one_gpu_count():
    with pytest.raises(SpecError, match="give one GPU count"):
        simpar.compare(**JOB, gpus=[8, 16])


def test_the_command_line_names_flags_where_the_library_names_fields(capsys):
    """specs/ raise errors naming a field; the command line says the flag that sets it."""
    with pytest.raises(SpecError, match=r"^schedule='zvb': did you mean 'zbv'\?"):
        simpar.simulate(**JOB, gpus=8, pp=2, schedule="zvb")
    argv = [
        "simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--seq-len", "4096",
        "--global-batch", "32", "--gpus", "8", "--pp", "2"
    ]
    assert main([*argv, "--schedule", "zvb"]) == 2
    assert capsys.readouterr().err.startswith(
        "simpar: error: --schedule='zvb': did you mean 'zbv'?")
    assert main([*argv[:-2], "--sp"]) == 2  # Strategy.sp without tensor parallelism
    assert capsys.readouterr().err.startswith(
        "simpar: error: --sp=True: sequence parallel needs --tp > 1")
