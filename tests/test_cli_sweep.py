"""A seeded random sweep over `simpar simulate`'s flags: every combination either prices (exit 0,
one JSON document) or is refused in one line (exit 2), never a traceback. The draws cover models
dense and MoE, GPUs and rack clusters, every precision and stack, and the mesh, ZeRO, recompute,
schedule and engine flags, valid together or not."""

import contextlib
import io
import json
import random

import pytest

from simpar.cli import main
from simpar.specs.stack import STACKS

MODELS = ["llama3-8b", "llama3-70b", "llama3.1-405b", "mixtral-8x7b", "deepseek-v3",
          "gpt-oss-20b", "gpt3-175b", "megatron2021-18.4b"]
MOE = {"mixtral-8x7b", "deepseek-v3", "gpt-oss-20b"}
GPUS = ["a100-80gb", "h100-sxm", "h200", "b200", "gb200", "mi300x", "v100-32gb"]
CLUSTERS = ["gb200-nvl72", "dgx-h100", "dgx-a100"]
DTYPES = ["bf16", "fp16", "fp8", "mxfp8", "nvfp4", "fp32"]
SCHEDULES = ["1f1b", "gpipe", "interleaved", "zb-h1", "zbv", "dualpipev"]


def _draw(rng: random.Random) -> list[str]:
    model = rng.choice(MODELS)
    pp = rng.choice([1, 1, 2, 4, 8])
    args = ["simulate", "--model", model, "--gpus", str(rng.choice([8, 16, 64, 256, 1024])),
            "--seq-len", str(rng.choice([2048, 4096, 8192, 32768])),
            "--global-batch", str(rng.choice([64, 128, 256, 1024])),
            "--tp", str(rng.choice([1, 1, 2, 4, 8])), "--pp", str(pp),
            "--cp", str(rng.choice([1, 1, 1, 2, 4])), "--dtype", rng.choice(DTYPES),
            "--stack", rng.choice(list(STACKS)), "--json"]
    args += (["--cluster", rng.choice(CLUSTERS)] if rng.random() < 0.3
             else ["--gpu", rng.choice(GPUS)])
    if model in MOE:
        args += ["--ep", str(rng.choice([1, 2, 4, 8]))]
    if rng.random() < 0.5:
        args += ["--zero", str(rng.choice([0, 1, 2, 3]))]
    if rng.random() < 0.5:
        args += ["--recompute", rng.choice(["none", "selective", "full", "op"])]
    if rng.random() < 0.3:
        args += ["--micro-batch", str(rng.choice([1, 2, 4]))]
    if pp > 1 and rng.random() < 0.5:
        schedule = rng.choice(SCHEDULES)
        args += ["--schedule", schedule] + (["--vpp", "2"] if schedule == "interleaved" else [])
    if rng.random() < 0.3:
        args += ["--engine", "analytic"]
    if rng.random() < 0.2:
        args += ["--compile"]
    if rng.random() < 0.2:
        args += ["--cuda-graphs"]
    return args


@pytest.mark.parametrize("seed", range(4))
def test_random_flag_combinations_price_or_are_refused_in_one_line(seed):
    rng = random.Random(seed)
    priced = 0
    for _ in range(25):
        args = _draw(rng)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(args)
            except SystemExit as exc:  # argparse's own refusals
                rc = exc.code
        said = err.getvalue()
        assert rc in (0, 2), " ".join(args)
        if rc == 0:
            assert json.loads(out.getvalue())["step_time_s"] > 0, " ".join(args)
            priced += 1
        else:
            assert said.startswith("simpar") and said.count("\n") == 1, (" ".join(args), said)
    assert priced > 0  # the draws reach valid strategies, not only refusals
