"""fp8 as torchao runs it (torchtitan, execpar): the casts each linear's GEMMs make around them,
eager and compiled, priced from torchao's code and benchmarks/fp8_cast.py's micro-benchmark."""

import json

import pytest

from simpar.cli.parser import main
from simpar.workload.fp8_casts import (
    COMPILED_CAST_KERNELS,
    EAGER_CAST_BYTES,
    EAGER_CAST_KERNELS,
    EAGER_FP32_WEIGHT_CAST_BYTES,
    TRANSPOSE_BYTES,
    torchao_casts,
)
from simpar.workload.layer import Gemm

M8B4L = "benchmarks/data/h100_execpar/m8b4l.yaml"


def test_each_gemm_casts_both_its_operands_itself():
    """One linear of 8 tokens, 2 in, 4 out: X = 16, W = 8, dY = 32 elements. Forward casts X
    and W; backward dY twice, W and X again, and (eager) copies W, dY and X transposed for
    _scaled_mm. An fp32 weight (autocast) costs its own eager rate; compiled, 2 bytes read
    twice and 1 written per 16-bit element, 4 + 4 + 1 per fp32 one. The router is left out."""
    gemms = (Gemm("proj", 8, 4, 2), Gemm("router", 8, 16, 2))
    eager = torchao_casts(gemms, {}, compiled=False, weight_bytes=4)
    assert eager.forward_bytes == pytest.approx(16 * EAGER_CAST_BYTES +
                                                8 * EAGER_FP32_WEIGHT_CAST_BYTES)
    assert eager.backward_bytes == pytest.approx(
        (64 + 16) * EAGER_CAST_BYTES + 8 * EAGER_FP32_WEIGHT_CAST_BYTES
        + (16 + 8 + 32) * TRANSPOSE_BYTES)
    assert (eager.forward_kernels, eager.backward_kernels) == (2 * EAGER_CAST_KERNELS,
                                                               4 * EAGER_CAST_KERNELS + 3)
    compiled = torchao_casts(gemms, {}, compiled=True, weight_bytes=2)
    assert (compiled.forward_bytes, compiled.backward_bytes) == (5 * 16 + 5 * 8, 5 * 80 + 5 * 8)
    assert compiled.forward_kernels == 2 * COMPILED_CAST_KERNELS
    fp32 = torchao_casts(gemms, {}, compiled=True, weight_bytes=4)
    assert fp32.forward_bytes - compiled.forward_bytes == 8 * 4


def test_separate_linears_cast_their_shared_input_each():
    """q, k and v as three linears cast the same input three times (input_copies 3), forward
    and again in backward; the weights and output gradients are the same elements as one
    fused linear's."""
    one = torchao_casts((Gemm("qkv", 8, 6, 2),), {}, compiled=True, weight_bytes=2)
    three = torchao_casts((Gemm("qkv", 8, 6, 2),), {"qkv": 3}, compiled=True, weight_bytes=2)
    assert three.forward_bytes - one.forward_bytes == 5 * 2 * 16
    assert three.backward_bytes - one.backward_bytes == 5 * 2 * 16


def test_tensor_parallel_linears_find_their_input_and_gradient_cast_once():
    """torchao's float8 TP styles cast a sharded linear's input once before any gather (q, k and
    v share it: torchtitan's PrepareFloat8ModuleInput) and its output gradient once in backward.
    qkv (8 tokens, 2 in, 6 out, three linears) and proj (6 in, 2 out), compiled: without TP the
    input is cast 3 x 16 elements forward and again backward, the gradients 2 x 48 and 2 x 16;
    at tp 4 with sequence parallelism qkv's input is cast on its shard (16 / 4) and proj's
    gradient too (16 / 4), each once; without it each of q, k and v casts the whole input it is
    handed, and proj its whole gradient."""
    gemms = (Gemm("qkv", 8, 6, 2), Gemm("proj", 8, 2, 6))
    plain = torchao_casts(gemms, {"qkv": 3}, compiled=True, weight_bytes=2)
    sharded = torchao_casts(gemms, {"qkv": 3}, compiled=True, weight_bytes=2, tp=4, sp=True)
    assert plain.forward_bytes - sharded.forward_bytes == 5 * (3 * 16 - 16 / 4)
    assert plain.backward_bytes - sharded.backward_bytes == (
        5 * (3 * 16 + 2 * 48 - 48) + 5 * (48 + 2 * 16 - 16 / 4))
    whole = torchao_casts(gemms, {"qkv": 3}, compiled=True, weight_bytes=2, tp=4)
    assert whole.forward_bytes - sharded.forward_bytes == 5 * (3 * 16 - 16 / 4)
    assert whole.backward_bytes - sharded.backward_bytes == 5 * (16 - 16 / 4)


def step_s(*flags: str, capsys) -> float:
    assert main(["simulate", "--model", M8B4L, "--gpus", "1", "--gpu", "h200", "--seq-len",
                 "4096", "--global-batch", "4", "--micro-batch", "2", "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)["step_time_s"]


def test_eager_fp8_is_slower_than_bf16_and_compiled_fp8_faster(capsys):
    """What execpar measured on an H200 (reports/gpu-validation-h200-fp8, 4 layers of Llama 3 8B,
    2 x 2 sequences of 4K): eager torchao fp8 1.46x slower than eager bf16 (0.478 against 0.328
    s: its casts cost more than its GEMMs save), compiled fp8 12% faster than compiled bf16
    (0.264 against 0.302 s), and eager fp8 1.81x slower than compiled. Priced as Transformer
    Engine's fused casts, all fp8 was 17-18% faster than bf16."""
    run = ("--stack", "execpar")
    bf16, fp8 = step_s(*run, "--dtype", "bf16", capsys=capsys), step_s(
        *run, "--dtype", "fp8", capsys=capsys)
    bf16_c, fp8_c = step_s(*run, "--dtype", "bf16", "--compile", capsys=capsys), step_s(
        *run, "--dtype", "fp8", "--compile", capsys=capsys)
    assert 1.3 < fp8 / bf16 < 1.6
    assert 0.8 < fp8_c / bf16_c < 0.95
    assert 1.6 < fp8 / fp8_c < 2.0


def test_torchtitan_compiles_its_fp8_runs_unless_told_not_to(capsys):
    """torchtitan's float8 docs call --training.compile required for competitive performance:
    with --compile unsaid its fp8 runs are priced compiled, bf16 ones eager; --no-compile
    prices an eager fp8 run, slower."""
    run = ("--stack", "torchtitan")
    unsaid = step_s(*run, "--dtype", "fp8", capsys=capsys)
    assert unsaid == step_s(*run, "--dtype", "fp8", "--compile", capsys=capsys)
    assert step_s(*run, "--dtype", "fp8", "--no-compile", capsys=capsys) > 1.5 * unsaid
    assert step_s(*run, "--dtype", "bf16", capsys=capsys) == step_s(
        *run, "--dtype", "bf16", "--no-compile", capsys=capsys)


def test_an_eager_fp8_plan_says_compile_would_be_faster(capsys, tmp_path):
    """simulate and plan name the cost on stderr where torchao's casts run eager, and stay quiet
    compiled, in bf16 or where Transformer Engine casts (megatron)."""
    def err(command: str, *flags: str) -> str:
        out = ["--out", str(tmp_path / "plan.json")] if command == "plan" else []
        assert main([command, "--model", M8B4L, "--gpus", "1", "--gpu", "h200", "--seq-len",
                     "4096", "--global-batch", "4", "--micro-batch", "2", *flags, *out]) == 0
        return capsys.readouterr().err

    for command in ("simulate", "plan"):
        assert "add --compile" in err(command, "--stack", "execpar", "--dtype", "fp8")
    assert "note" not in err("simulate", "--stack", "execpar", "--dtype", "fp8", "--compile")
    assert "note" not in err("simulate", "--stack", "execpar", "--dtype", "bf16")
    assert "note" not in err("simulate", "--stack", "megatron", "--dtype", "fp8")
