"""Norms on the heads of q and k (ModelSpec.qk_norm: Qwen3, Gemma 3, OLMo 2): what they move,
launch and keep, by hand, and where simpar learns a model has them."""

import json
from dataclasses import replace

import pytest

from simpar.memory.model import activation_bytes_per_token
from simpar.specs.loaders import load_model
from simpar.workload.layer import layer_work

QWEN3_8B = load_model("qwen3-8b")  # q 32 x 128 = 4096, k 8 x 128 = 1024 per token
PLAIN = replace(QWEN3_8B, qk_norm=False)
NORMED = 4096 + 1024


@pytest.mark.parametrize("kernels, per_element, launches", [("fused", 4, 2), ("eager", 36, 16)])
def test_the_norms_move_and_launch_per_head_element(kernels, per_element, launches):
    """A fused RMSNorm reads and writes each 16-bit element once (2 + 2 bytes) in one kernel for
    q and one for k; eager, each upcasts to fp32 op by op (36 bytes an element, eight kernels:
    cast up, square, mean, add eps, rsqrt, scale, cast down, weight). 4,096 tokens at tp 1, and
    at tp 2 each rank norms half the heads."""
    for tp in (1, 2):
        normed = layer_work(QWEN3_8B, 4096, 1, tp, 1, 1, False, True, "bf16", kernels)
        plain = layer_work(PLAIN, 4096, 1, tp, 1, 1, False, True, "bf16", kernels)
        extra = 4096 * per_element * NORMED / tp
        assert normed.elementwise_bytes - plain.elementwise_bytes == pytest.approx(extra)
        assert (normed.attention_elementwise_bytes - plain.attention_elementwise_bytes
                == pytest.approx(extra))
        assert normed.elementwise_kernels - plain.elementwise_kernels == launches
        assert normed.attention_elementwise_kernels - plain.attention_elementwise_kernels \
            == launches


def test_the_norms_keep_their_inputs_for_backward():
    """Each norm keeps its 16-bit input (2 bytes an element of q and k); eager fp32 norms also
    keep the fp32 copies autograd saves (4 + 4 - 2 more), as the block's norms do; under full
    recompute only the layer's input is kept."""
    def kept(model, kernels="fused", recompute="none"):
        return activation_bytes_per_token(model, 4096, 1, False, recompute, True, "bf16", kernels)

    assert kept(QWEN3_8B) - kept(PLAIN) == 2 * NORMED
    assert kept(QWEN3_8B, "eager") - kept(PLAIN, "eager") == (2 + 6) * NORMED
    assert kept(QWEN3_8B, recompute="full") == kept(PLAIN, recompute="full")


def test_qwen3_gemma3_and_llama4_configs_say_they_norm_q_and_k(tmp_path):
    """By model type (transformers' q_norm and k_norm: Qwen3 and Qwen3-MoE, Gemma 3, OLMo 2) or by
    the config's own flag (Llama 4's use_qk_norm); Llama 3's has neither."""
    base = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256,
            "hidden_act": "silu"}
    for extra, normed in (({"model_type": "qwen3"}, True), ({"model_type": "qwen3_moe"}, True),
                          ({"model_type": "gemma3_text"}, True), ({"model_type": "olmo2"}, True),
                          ({"model_type": "llama4_text", "use_qk_norm": True}, True),
                          ({"model_type": "llama"}, False)):
        path = tmp_path / f"{extra['model_type']}.json"
        path.write_text(json.dumps({**base, **extra}))
        assert load_model(str(path)).qk_norm is normed, extra
    assert all(load_model(name).qk_norm for name in ("qwen3-8b", "qwen3-30b-a3b",
                                                     "qwen3-235b-a22b"))
    assert not load_model("llama3-8b").qk_norm
