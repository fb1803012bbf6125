"""Eager (unfused) elementwise kernels and torchtitan's op-level recompute."""

from dataclasses import replace

import pytest

from simpar.cli import main
from simpar.cost.compute import gemm_time, memory_bound_time
from simpar.cost.layer import layer_cost
from simpar.cost.step import predict
from simpar.memory.model import activation_bytes_per_token
from simpar.network.model import network_for
from simpar.specs import MODELS, JobSpec, Strategy, load_cluster
from simpar.specs.stack import get_stack
from simpar.workload import flops
from simpar.workload.layer import Gemm, layer_work

M = MODELS["llama3-8b"]
C = load_cluster("dgx-a100", None)


def test_eager_elementwise_bytes_follow_the_op_sequences():
    h, q, kv, f = M.hidden, M.q_dim, M.kv_dim, M.ffn_hidden
    fused = layer_work(M, 4096, 1, 1, 1, 1, False, True, "bf16", "fused")
    eager = layer_work(M, 4096, 1, 1, 1, 1, False, True, "bf16", "eager")
    assert fused.elementwise_bytes == 4096 * (2 * 4 * h + 2 * 6 * h + 6 * f + 4 * (q + kv))
    # norms 36 B, residual adds 6 B per element; SwiGLU 10 B per inner element; rotary
    # 20 B; layout copies 4 B
    assert eager.elementwise_bytes == 4096 * (2 * 36 * h + 2 * 6 * h + 10 * f + 20 * (q + kv) + 4 *
                                              (2 * q + 2 * kv))
    assert eager.gemms == fused.gemms and eager.elementwise_kernels > fused.elementwise_kernels


def test_eager_kernels_slow_the_step_but_not_the_flops():
    job, s = JobSpec(8192, 64), Strategy(dp=64, zero=3)
    fused, eager = predict(M, C, job, s), predict(M, C, job, replace(s, kernels="eager"))
    assert eager.step_time_s > fused.step_time_s
    assert eager.hardware_tflops_per_gpu * eager.step_time_s == pytest.approx(
        fused.hardware_tflops_per_gpu * fused.step_time_s)
    assert eager.memory.activations_gib > fused.memory.activations_gib  # autograd keeps fp32 copies


def test_op_recompute_reruns_every_second_gemm_and_the_elementwise_ops():
    work = layer_work(M, 8192, 1, 1, 1, 1, False, True, "bf16", "fused")
    net = network_for(C, Strategy(dp=8))
    _, plain = layer_cost(work, net, C.gpu, "bf16", "none", False, get_stack("megatron"))
    _, op = layer_cost(work, net, C.gpu, "bf16", "op", False, get_stack("megatron"))
    tokens = 8192
    again = [Gemm("wk", tokens, M.kv_dim, M.hidden), Gemm("proj", tokens, M.hidden, M.q_dim),
             Gemm("w3", tokens, M.ffn_hidden, M.hidden)]
    expected = sum(gemm_time(g, C.gpu, "bf16") for g in again)
    expected += memory_bound_time(work.elementwise_bytes, C.gpu, work.elementwise_kernels)
    assert op.recompute_s == pytest.approx(expected)
    assert op.compute_s == plain.compute_s
    # it keeps the layer input and the outputs of wq, wv, attention, w1 and w2 (+ the
    # fp32 log-sum-exp)
    h, q, kv, f = M.hidden, M.q_dim, M.kv_dim, M.ffn_hidden
    kept = activation_bytes_per_token(M, 8192, 1, False, "op", True, "bf16")
    assert kept == 2 * (2 * h + 2 * q + kv + f) + 4 * M.heads
    assert activation_bytes_per_token(M, 8192, 1, False, "full", True, "bf16") < kept < \
        activation_bytes_per_token(M, 8192, 1, False, "none", True, "bf16")
    assert flops.hardware_flops_per_token(M, 8192, "op") > flops.model_flops_per_token(M, 8192)


def test_cli_takes_kernels_and_recompute_modes(capsys):
    args = ["--model", "llama3-8b", "--cluster", "dgx-a100", "--gpus", "64", "--seq-len", "8192",
            "--global-batch", "64", "--network", "alpha-beta"]
    assert main([
        "simulate", *args, "--zero", "3", "--recompute", "op", "--kernels", "eager", "--engine",
        "analytic"
    ]) == 0
    assert "recompute op" in capsys.readouterr().out
    assert main([
        "compare", *args, "--recompute", "none,op", "--kernels", "eager", "--rerank", "0", "--top",
        "3"
    ]) == 0
    assert main(["compare", *args, "--recompute", "some"]) == 2
    assert "--recompute" in capsys.readouterr().err


def test_a_batched_attention_gemm_fills_the_sms_with_the_tiles_of_every_head():
    """Unfused attention's QK^T is one baddbmm over micro-batch x heads: cuBLAS spreads the tiles
    of all of them over the SMs in one launch. Scores of 8 heads, 2048 x 2048 x 128 each, on an
    A100 (108 SMs, 128 x 128 tiles): 256 tiles a head, 2048 together, 19 waves of 108 (2052 slots)
    against 3 waves (324 slots) per head launched alone; K = 128 runs at 128 / (128 + 128)."""
    gpu = C.gpu
    alone = Gemm("scores", 2048, 2048, 128, 8)
    batched = replace(alone, together=8)
    steady = 312e12 * gpu.gemm_efficiency * 0.5
    launch = gpu.kernel_overhead_us * 1e-6
    flops = 2 * 2048 * 2048 * 128 * 8
    assert gemm_time(batched, gpu, "bf16") == pytest.approx(
        flops / (steady * 2048 / 2052) + launch, rel=1e-9)
    assert gemm_time(alone, gpu, "bf16") == pytest.approx(
        flops / (steady * 256 / 324) + 8 * launch, rel=1e-9)
    # the layer's unfused attention GEMMs are batched
    work = layer_work(M, 4096, 1, 1, 1, 1, False, False, "bf16")
    assert [g.together == g.count for g in work.attention_gemms] == [True, True]


def test_an_a100_runs_its_tensor_cores_at_the_clock_it_holds_at_400_watts():
    """A100: MAMF 267.9 of 312 TFLOP/s at the 1,410 MHz boost, run at the 1,305 MHz NVIDIA rates
    its HPL Rpeak at. An 8192^3 bf16 GEMM: 64 x 64 = 4096 tiles in 38 waves of 108 SMs (4104
    slots), K = 8192 at 8192 / (8192 + 128)."""
    gpu = C.gpu
    rate = 312e12 * 0.859 * 1305 / 1410 * 4096 / 4104 * 8192 / 8320
    expected = 2 * 8192**3 / rate + gpu.kernel_overhead_us * 1e-6
    big = Gemm("big", 8192, 8192, 8192)
    assert gemm_time(big, gpu, "bf16") == pytest.approx(expected, rel=1e-9)
