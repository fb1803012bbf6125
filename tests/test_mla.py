"""Latent attention, shared experts and dense first layers (DeepSeek-V3), and fp8
activation storage."""

import pytest

from simpar.cost.compute import gemm_time
from simpar.cost.layer import layer_cost
from simpar.memory.model import activation_bytes_per_token
from simpar.network.model import network_for
from simpar.specs import MODELS, JobSpec, Strategy, dgx_like
from simpar.specs.stack import get_stack
from simpar.workload import flops
from simpar.workload.layer import Gemm, layer_work
from simpar.workload.params import stage_params

V3 = MODELS["deepseek-v3"]


def test_latent_attention_gemms_and_attention_flops():
    work = layer_work(V3, 4096, 1, 1, 1, 1, False, True, "bf16")
    names = [g.name for g in work.gemms]
    assert names[:5] == ["wq_a", "wq_b", "wkv_a", "wkv_b", "proj"]
    assert work.gemms[3] == Gemm("wkv_b", 4096, 128 * (128 + 128), 512)
    # scores over 128 + 64 dims per head, values over 128: 2 s (q_dim + out_dim) per
    # token, half causal
    assert work.flash_attention_flops == pytest.approx(0.5 * 2 * 4096 * 4096 *
                                                       (128 * 192 + 128 * 128))
    assert flops.attention_flops_per_token(V3, 4096) == 61 * 2 * 4096 * (128 * 192 + 128 * 128)


def test_shared_experts_are_replicated_and_dense_first_layers_sit_on_stage_zero():
    s = Strategy(dp=128, pp=16, ep=64)
    dense0, expert0 = stage_params(V3, s, 0, 4)
    dense1, expert1 = stage_params(V3, s, 1, 4)
    # stage 0's first three layers are dense: their FFN replaces 3 layers of routed experts
    assert expert0 == pytest.approx(expert1 / 4)
    assert dense0 > dense1
    assert V3.shared_params_per_layer == 3 * 7168 * 2048 and V3.experts % 64 == 0


def test_selective_recompute_of_the_latent_up_projections():
    cluster = dgx_like("h800")
    work = layer_work(V3, 4096, 1, 1, 1, 1, False, True, "bf16")
    net = network_for(cluster, Strategy(dp=8))
    ups = frozenset({"mla_up_proj"})
    _, plain = layer_cost(work, net, cluster.gpu, "bf16", "none", False, get_stack("megatron"))
    _, sel = layer_cost(work, net, cluster.gpu, "bf16", "selective", False, get_stack("megatron"),
                        ups)
    up_gemms = [g for g in work.gemms if g.name in ("wq_b", "wkv_b")]
    assert sel.recompute_s == pytest.approx(sum(gemm_time(g, cluster.gpu, "bf16")
                                                for g in up_gemms))
    assert plain.recompute_s == 0
    kept_none = activation_bytes_per_token(V3, 4096, 1, False, "none", True, "bf16")
    kept_ups = activation_bytes_per_token(V3, 4096, 1, False, "selective", True, "bf16",
                                          modules=ups)
    assert kept_none - kept_ups == 2 * (V3.q_dim + V3.kv_dim + V3.v_dim)
    # selective's default on a latent attention adds the norms: its input norm's and the MoE
    # layer's pre-MLP norm's 16-bit outputs, 2 x 7168 bytes each
    default = Strategy(dp=8, recompute="selective").selective_modules(V3)
    assert default == {"mla_up_proj", "layernorm"}
    kept_sel = activation_bytes_per_token(V3, 4096, 1, False, "selective", True, "bf16",
                                          modules=default)
    assert kept_ups - kept_sel == 2 * 2 * V3.hidden
    extra = flops.recompute_flops_per_token(V3, 4096, "selective", modules=ups)
    assert extra == 61 * 2 * (1536 * 128 * 192 + 512 * 128 * 256)


def test_fp8_keeps_gemm_inputs_in_one_byte():
    m = MODELS["llama3-8b"]
    bf16 = activation_bytes_per_token(m, 4096, 1, False, "none", True, "bf16")
    fp8 = activation_bytes_per_token(m, 4096, 1, False, "none", True, "fp8")
    # QKV and MLP inputs, the attention output and the MLP down-projection input: one
    # byte instead of two
    assert bf16 - fp8 == 2 * m.hidden + m.q_dim + m.ffn_hidden


def test_deepseek_v3_published_setup_fits_and_predicts_its_throughput():
    job = JobSpec(4096, 15360, "fp8")
    s = Strategy(dp=128, pp=16, ep=64, zero=1, schedule="dualpipev", recompute="selective")
    from simpar.cost.step import predict
    p = predict(V3, dgx_like("h800"), job, s)
    assert p.fits_memory  # the configuration DeepSeek ran is not rejected
    assert 1000 < p.tokens_per_s / 2048 < 2500  # published 1,543 (benchmarks/heldout_accuracy.py)
