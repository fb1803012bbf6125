"""Hostile numbers for every numeric flag of every simpar and execpar command, generated
from the parser itself (a flag added later is fuzzed too): each must be refused before
any work starts, with exit 2, one line naming the flag, no traceback and nothing
written. Extreme but legitimate values must answer, and quickly."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import tempfile

import pytest

from execpar.cli import build_parser as execpar_parser
from execpar.cli import main as execpar_main
from simpar.cli import flags
from simpar.cli.checks import AT_MOST, NON_NEGATIVE, POSITIVE
from simpar.cli.parser import build_parser, main
from simpar.errors import SpecError

PROGRAMS = {"simpar": (build_parser, main), "execpar": (execpar_parser, execpar_main)}
PLAN = os.path.join(tempfile.mkdtemp(), "plan.json")  # a valid plan for execpar's base calls
with contextlib.redirect_stdout(io.StringIO()):
    main([
        "plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--seq-len", "2048", "--global-batch",
        "16", "--gpus", "2", "--zero", "3", "--recompute", "full", "--out", PLAN
    ])

JOB = ["--model", "llama3-8b", "--gpu", "h100-sxm", "--seq-len", "2048", "--global-batch", "16"]
BASE = {  # a valid call of each command (files land in the test's own folder)
    ("simpar", "simulate"): ["simulate", *JOB, "--gpus", "8"],
    ("simpar", "plan"): ["plan", *JOB, "--gpus", "8", "--out", "plan.json"],
    ("simpar", "compare"): ["compare", *JOB, "--gpus", "8", "--rerank", "0"],
    ("simpar", "scale"): ["scale", *JOB, "--gpu-list", "8,16", "--out", "scaling"],
    ("simpar", "collective"): "collective --cluster dgx-h100 --gpus 16 --size-bytes 1G".split(),
    ("simpar", "topo", "show"): ["topo", "show", "dgx-h100", "--gpus", "16", "--no-png"],
    ("simpar", "validate"): ["validate", "--sweep", "--out", "sweep"],
    ("simpar", "calibrate"): "calibrate --nproc-per-node 1 --device cpu --out profile.yaml".split(),
    ("execpar", "run"): ["run", PLAN, "--device", "cpu", "--out", "m.json"],
    ("execpar", "launch"): ["launch", PLAN, "--nproc-per-node", "2", "--device", "cpu",
                               "--out", "m.json"],
}
# numeric flags whose values are parsed by their own converters (RANK:FACTOR pairs, names)
# (fail_at_step: -1 means none)
OWN_SYNTAX = {"straggler", "stage_gpu", "recompute", "schedules", "fail_at_step"}


def _commands(parser, path=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, path + (name,))
    if path:
        yield path, parser


def _numeric_flags():
    for prog, (build, _) in PROGRAMS.items():
        yield from _flags_of(_commands(build(), (prog,)))


def _flags_of(commands):
    for path, parser in commands:
        for a in parser._actions:
            # a typed flag is a number, but a path (flags.path refuses an empty name only)
            typed = a.type not in (None, flags.path) and not a.choices
            if a.option_strings and typed and a.dest not in OWN_SYNTAX:
                yield path, a


def _hostile(a) -> list[str]:
    values = ["nan", "inf", "-inf", "abc", "", "-1"]
    if a.dest in POSITIVE:
        values.append("0")
    if a.dest in AT_MOST:
        values.append(str(int(AT_MOST[a.dest][0]) + 1))
    return values


CASES = [(path, a.option_strings[0], v) for path, a in _numeric_flags() if path in BASE
         for v in _hostile(a)]


class _Hang(Exception):
    pass


def _run(argv, seconds: int = 20) -> tuple:
    """(exit code, stderr) of simpar in this process, as the console script runs it; a
    hang raises."""
    def alarm(*_):
        raise _Hang(" ".join(argv))

    program, argv = PROGRAMS[argv[0]][1], argv[1:]
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    err = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = program(argv)
    except SystemExit as exc:
        code = exc.code
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return code, err.getvalue()


def _with(path, flag, value) -> list[str]:
    """The program's name, then the command's base call with `flag` set to `value`."""
    argv = [path[0], *BASE[path]]
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    return argv


def test_every_numeric_flag_has_a_range():
    """A numeric flag without a range in simpar/cli/checks.py would let -1 or 0 through
    to the models."""
    unranged = sorted({a.dest
                       for _, a in _numeric_flags()} - set(POSITIVE) - set(NON_NEGATIVE) - {"zero"})
    assert not unranged, f"give these flags a range in simpar/cli/checks.py: {unranged}"
    assert {p
            for p, _ in _numeric_flags()
            } <= set(BASE), "a new command: add a valid call of it to BASE"


def test_the_fuzz_reaches_every_command():
    assert {path for path, _, _ in CASES} == set(BASE)


@pytest.mark.parametrize("path, flag, value", CASES,
                         ids=[f"{' '.join(p)} {f}={v!r}" for p, f, v in CASES])
def test_a_hostile_number_is_one_line_exit_2_and_writes_nothing(tmp_path, monkeypatch, path, flag,
                                                                value):
    monkeypatch.chdir(tmp_path)
    code, err = _run(_with(path, flag, value))
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err and flag in err, err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("path, flag, value", [
    # ~20,000 gradient buckets: the event engine hung
    (("simpar", "simulate"), "--bucket-mb", "1.5"),
    # without jitter every step is the same: one is played
    (("simpar", "simulate"), "--steps", "100000"),
    # its divisors were found by trying each number below it
    (("simpar", "compare"), "--global-batch", "99999999999"),
    # the most GPUs taken: answered (here, that batch 16 cannot use them)
    (("simpar", "compare"), "--gpus", "16777216"),
])
def test_extreme_but_legitimate_values_answer(tmp_path, monkeypatch, path, flag, value):
    monkeypatch.chdir(tmp_path)
    code, err = _run(_with(path, flag, value))
    assert code == 0 or (code == 2 and err.count("\n") == 1 and "Traceback" not in err), err


def test_scale_says_when_nothing_fits_at_any_count_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = _run(_with(("simpar", "scale"), "--seq-len", "50000000"))
    last = err.splitlines()[-1]  # after the per-count progress lines
    assert code == 2 and last.startswith("simpar: error: --gpu-list") and "no strategy fits" in last
    assert "Traceback" not in err
    assert not (tmp_path / "scaling").exists()


def test_more_cpu_processes_than_cores_is_warned_about_or_refused():
    """calibrate with 64 processes on 2 cores measured the sharing without a word, for minutes."""
    from simpar.devices import oversubscribed

    assert "--nproc-per-node 4 on 2 CPU cores" in oversubscribed(4, "cpu", cores=2)
    with pytest.raises(SpecError, match="64 processes on 2 CPU cores .* give at most 2"):
        oversubscribed(64, "cpu", cores=2)
    assert oversubscribed(2, "cpu", cores=2) is None
    assert oversubscribed(64, "cuda", cores=2) is None  # one device per process


def test_a_binary_folder_or_fifo_path_gets_one_line(tmp_path, capsys):
    """A binary file as --model ended in a UnicodeDecodeError traceback; a FIFO nobody reads as
    --trace waited forever."""
    import os

    binary = tmp_path / "model.yaml"
    binary.write_bytes(bytes(range(256)) * 4)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    job = ["--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "2048", "--global-batch", "16"]
    for args, says in (
            (["simulate", "--model", str(binary), *job], "is not a text file"),
            (["simulate", "--model", str(tmp_path), *job], "is a folder"),
            (["validate", str(binary), str(binary)], "is not a text file"),
            (["simulate", "--model", "llama3-8b", *job, "--engine", "event", "--trace", str(fifo)],
             "is a FIFO that nobody reads")):
        code = main(args)
        err = capsys.readouterr().err
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err


def test_output_folders_are_checked_before_the_work(tmp_path, capsys):
    """scale --out under /proc, or naming a file, ended in a traceback after the search."""
    a_file = tmp_path / "a.txt"
    a_file.write_text("x")
    cases = [(["scale", *JOB, "--gpu-list", "8", "--out", str(a_file)], "is a file; give a folder")]
    if os.path.isdir("/proc/self"):  # a folder that takes no new entries, whatever its mode says
        cases.append((["validate", "--sweep", "--out", "/proc/nope"], "cannot be written"))
        cases.append((["scale", *JOB, "--gpu-list", "8", "--out", "/proc/nope"],
                      "cannot be written"))
    for args, says in cases:
        code = main(args)
        err = capsys.readouterr().err
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
    assert sorted(os.listdir(tmp_path)) == ["a.txt"]


def test_a_fail_rank_without_a_failure_step_is_refused(capsys):
    """--fail-rank alone injected nothing, silently."""
    code = execpar_main(["launch", PLAN, "--nproc-per-node", "2", "--device", "cpu",
                         "--fail-rank", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "--fail-rank=1" in err and "--fail-at-step" in err, err


def test_launch_checks_a_scaled_down_model_and_the_checkpoint_folder_first(tmp_path, capsys):
    """--hidden 63 with 4 heads failed inside each rank (a line per rank, then torchrun's
    traceback); a file as --checkpoint-dir ended in FileExistsError."""
    a_file = tmp_path / "a.txt"
    a_file.write_text("x")
    base = ["launch", PLAN, "--nproc-per-node", "2", "--device", "cpu"]
    for extra, says in ((["--hidden", "4095"], "must divide hidden (4095)"),
                        # (--force: the full-size plan would not fit this host's RAM)
                        (["--checkpoint-dir", str(a_file), "--checkpoint-every", "1", "--force"],
                         "is a file; give a folder")):
        code = execpar_main(base + extra)
        err = capsys.readouterr().err
        assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err
