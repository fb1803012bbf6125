"""The README's `simulate --explain` example is what the command prints today."""

from pathlib import Path

from simpar.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"
ARGS = ["simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "8192",
        "--global-batch", "32", "--stack", "torchtitan", "--zero", "3", "--recompute", "op",
        "--explain"]


def _table(capsys, extra: list[str]) -> list[str]:
    assert main(ARGS + extra) == 0
    out = capsys.readouterr().out
    lines = out[out.index("one layer, one micro-batch"):].splitlines()
    return lines[:next(i for i, line in enumerate(lines) if line.startswith("layer ")) + 1]


def test_the_explain_examples_in_the_readme_are_current(capsys):
    readme = README.read_text().splitlines()
    eager = _table(capsys, [])
    assert all(line in readme for line in eager)
    # the clock line under the table (GPUSpec.at_tensor_core_share)
    assert main(ARGS) == 0
    clock = next(line for line in capsys.readouterr().out.splitlines() if "power cap" in line)
    assert clock in readme
    compiled = _table(capsys, ["--compile"])
    for name in ("elementwise", "rope (op by op)", "recompute", "layer "):
        assert next(line for line in compiled if line.startswith(name)) in readme
