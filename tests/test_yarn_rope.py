"""YaRN's concentration factor on the rotary (GPT-OSS): Megatron core's fused RoPE takes none, so
its layers rotate q and k with unfused torch ops (rope_utils.py), which simpar prices."""

import math

import pytest

from simpar.cost.layer import layer_kernels, stack_layer_work
from simpar.errors import SpecError
from simpar.specs import MODELS, ModelSpec, dgx_like
from simpar.specs.loaders import model_from_hf_config
from simpar.specs.model import yarn_mscale
from simpar.specs.stack import get_stack

GPT_OSS = MODELS["gpt-oss-120b"]


def test_yarn_concentration_factor_as_megatron_computes_it():
    # GPT-OSS: factor 32, no mscale in its config: 0.1 ln 32 + 1
    assert yarn_mscale(32.0) == pytest.approx(1.0 + 0.1 * math.log(32.0))
    assert GPT_OSS.rope_mscale == pytest.approx(1.3466, abs=1e-4)
    # DeepSeek-V3: mscale and mscale_all_dim both 1, so the ratio is 1 and the fused RoPE runs
    assert yarn_mscale(40.0, 1.0, 1.0) == 1.0
    assert yarn_mscale(1.0) == 1.0


def test_hugging_face_rope_scaling_sets_it():
    base = {"num_attention_heads": 64, "num_key_value_heads": 8, "num_hidden_layers": 2,
            "hidden_size": 2880, "intermediate_size": 2880, "vocab_size": 1000, "head_dim": 64}
    yarn = {**base, "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0}}
    assert model_from_hf_config(yarn, "c.json").rope_mscale == pytest.approx(yarn_mscale(32.0))
    deepseek = {**base, "rope_scaling": {"type": "yarn", "factor": 40, "mscale": 1.0,
                                         "mscale_all_dim": 1.0}}
    assert model_from_hf_config(deepseek, "c.json").rope_mscale == 1.0
    linear = {**base, "rope_scaling": {"type": "linear", "factor": 4.0}}
    assert model_from_hf_config(linear, "c.json").rope_mscale == 1.0
    assert model_from_hf_config(base, "c.json").rope_mscale == 1.0
    with pytest.raises(SpecError, match="rope_mscale"):
        ModelSpec("m", 2, 64, 4, 4, 128, 100, rope_mscale=-1.0)


def _rope_row(model, stack_name: str):
    stack = get_stack(stack_name)
    work = stack_layer_work(model, 4096, 4, 1, 1, 64, False, True, "mxfp8", stack.kernels, stack)
    rows = {k.name: k for k in layer_kernels(work, dgx_like("b200").gpu, "mxfp8", stack)}
    return work, rows.get("rope (op by op)")


def test_megatrons_layers_rotate_a_yarn_model_unfused():
    """16,384 tokens of q (64 x 64) and k (8 x 64): 4,608 rotated elements each, 20 bytes more
    than the fused kernel's in forward (24 - 4) and 18 in backward (26 - 8), in 22 kernels more."""
    for name in ("nemo", "megatron"):
        work, row = _rope_row(GPT_OSS, name)
        assert work.rope_bytes == (16384 * 4608 * 20, 16384 * 4608 * 18)
        assert work.rope_kernels == 22 and row is not None and row.backward_s > 0
    # torchtitan's eager rotary is priced op by op already; plain RoPE keeps Megatron fused
    work, row = _rope_row(GPT_OSS, "torchtitan")
    assert work.rope_kernels == 0 and row is None
    from dataclasses import replace
    work, row = _rope_row(replace(GPT_OSS, rope_mscale=1.0), "nemo")
    assert work.rope_bytes == (0.0, 0.0) and row is None
