"""execpar refuses hostile plans and flags in one line, exit 2, and a rank that refuses its input
mid-run reaches the user as that one line and exit 2, not torchrun's ChildFailedError traceback
with exit 1 (found by probing execpar launch with 315 plan edits and its flags)."""

import contextlib
import io
import json

import pytest

pytest.importorskip("torch")

from execpar import cli as execpar_cli  # noqa: E402
from simpar.cli import main as simpar_main  # noqa: E402

TINY = "name: tiny\nlayers: 2\nhidden: 64\nheads: 4\nkv_heads: 4\nffn_hidden: 128\nvocab: 256\n"
RUN = ["--nproc-per-node", "2", "--device", "cpu", "--steps", "2", "--warmup", "0"]


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    folder = tmp_path_factory.mktemp("plan")
    (folder / "tiny.yaml").write_text(TINY)
    out = folder / "plan.json"
    with contextlib.redirect_stdout(io.StringIO()):
        assert simpar_main(["plan", "--model", str(folder / "tiny.yaml"), "--gpus", "2",
                            "--seq-len", "64", "--global-batch", "4", "--gpu", "h100-sxm",
                            "--zero", "3", "--out", str(out)]) == 0
    return out


def _refused(capfd, argv, says: str) -> None:
    assert execpar_cli.main(argv) == 2
    err = capfd.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and says in err, err


@pytest.mark.parametrize("edit,says", [
    (lambda d: d.update(prediction=[]), "plan.prediction=[]"),  # AttributeError .get
    (lambda d: d["strategy"].update(compile="no"), "compile='no'"),  # it compiled
])
def test_a_hostile_plan_edit(tmp_path, capfd, plan, edit, says):
    data = json.loads(plan.read_text())
    edit(data)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    _refused(capfd, ["launch", str(bad), *RUN], says)


@pytest.mark.parametrize("flags,says", [
    (["--seed", "9223372036854775807"], "a 32-bit seed"),  # OverflowError in the ranks
    (["--timeout-s", "1e-7"], "must be at least 1"),  # rounded to a 0 ms store timeout
    (["--hidden", "60"], "even head dim"),  # a shape error inside rotary
    (["--seq-len", "1000000000000"], "must be at most 100,000,000"),  # a 32 TB allocation
])
def test_a_flag_the_ranks_could_not_run(capfd, plan, flags, says):
    _refused(capfd, ["launch", str(plan), *RUN, *flags], says)


def test_a_rank_that_refuses_mid_run_is_one_line_and_exit_2(capfd, plan):
    """A learning rate that overflows the loss is found at step 1, inside the ranks."""
    _refused(capfd, ["launch", str(plan), *RUN, "--lr", "1e30"],
             "execpar[rank")


def test_an_empty_out_is_refused(capfd, plan):
    _refused(capfd, ["launch", str(plan), *RUN, "--out", ""], "give a file name")  # wrote nothing


def test_resuming_past_the_last_step_is_refused(tmp_path, capfd, plan):
    """A checkpoint after step 2 and --steps 1 wrote a measurement with a null step time."""
    ck = str(tmp_path / "ck")
    assert execpar_cli.main(["launch", str(plan), *RUN, "--checkpoint-dir", ck,
                             "--checkpoint-every", "1"]) == 0
    capfd.readouterr()
    run = ["--nproc-per-node", "2", "--device", "cpu", "--steps", "1", "--warmup", "0"]
    _refused(capfd, ["launch", str(plan), *run, "--checkpoint-dir", ck, "--out",
                     str(tmp_path / "m.json")], "resumes after step 2")
    assert not (tmp_path / "m.json").exists()


def test_a_refused_run_leaves_no_folder_behind(tmp_path, capfd, plan):
    """A rank that refused its input left the folder the launcher made, holding only its .lock;
    the folder goes again, and one the user made stays."""
    ck = tmp_path / "ck"
    _refused(capfd, ["launch", str(plan), *RUN, "--lr", "1e30", "--checkpoint-dir", str(ck)],
             "execpar[rank")
    assert not ck.exists()
    ck.mkdir()
    _refused(capfd, ["launch", str(plan), *RUN, "--lr", "1e30", "--checkpoint-dir", str(ck)],
             "execpar[rank")
    assert ck.is_dir()


def test_fp8_sp_on_gloo_is_refused_before_the_ranks_start(tmp_path, capfd, monkeypatch):
    """fp8 sequence parallelism on gloo was refused inside every rank, after torchrun had
    started."""
    monkeypatch.setattr(execpar_cli, "_torchrun",
                        lambda *a, **k: pytest.fail("torchrun must not start"))
    (tmp_path / "tiny.yaml").write_text(TINY)
    out = tmp_path / "p.json"
    with contextlib.redirect_stdout(io.StringIO()):
        assert simpar_main(["plan", "--model", str(tmp_path / "tiny.yaml"), "--tp", "2", "--sp",
                            "--dtype", "fp8", "--gpus", "2", "--seq-len", "64", "--global-batch",
                            "4", "--gpu", "h100-sxm", "--out", str(out)]) == 0
    capfd.readouterr()  # the plan's notes
    _refused(capfd, ["launch", str(out), *RUN], "gloo cannot all-gather fp8")


def test_a_checkpoint_of_another_run_is_named_by_its_first_difference(tmp_path):
    """What run.json says against this run (no processes: the check itself)."""
    from dataclasses import replace

    from execpar.checkpoint import RUN_FILE, _other_run, run_identity
    from simpar.specs import ModelSpec, Strategy

    model = ModelSpec.from_dict({"name": "a", "layers": 2, "hidden": 64, "heads": 4,
                                 "ffn_hidden": 128, "vocab": 256})
    here = run_identity(model, Strategy(dp=2), 2)
    step = tmp_path / "step-4"
    step.mkdir()
    assert _other_run(step, here) is None  # written before run.json existed
    (step / RUN_FILE).write_text(json.dumps(here))
    assert _other_run(step, here) is None
    # another name is the same run; another split or world is not
    assert _other_run(step, run_identity(replace(model, name="b"), Strategy(dp=2), 2)) is None
    # tp2 onto dp2 (a raw "Missing key" before): the first field that differs
    assert "(split.dp 2 there, 1 here)" in _other_run(step, run_identity(model, Strategy(tp=2), 2))
    assert "(world 2 there, 4 here)" in _other_run(step, run_identity(model, Strategy(dp=4), 4))
    (step / RUN_FILE).write_text("{not json")
    assert "does not read; remove step-4" in _other_run(step, here)

