"""Rotaries a fused or compiled stack still runs op by op, which simpar prices (RopeOps): YaRN's
concentration factor (GPT-OSS), which Megatron core's fused RoPE does not take, so its layers rotate
q and k with unfused torch ops (rope_utils.py); and torchtitan's complex-valued rotary, which
inductor leaves to aten kernels in a compiled block, where execpar's real-valued one compiles."""

import math
from dataclasses import replace

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


def _layer(model, stack, *, seq_len: int = 4096, micro_batch: int = 4, tp: int = 1, ep: int = 64,
           sp: bool = False, dtype: str = "mxfp8", gpu: str = "b200"):
    """One layer's work as `stack` runs it and its kernel rows by name."""
    work = stack_layer_work(model, seq_len, micro_batch, tp, 1, ep, sp, True, dtype,
                            stack.elementwise, stack)
    return work, {k.name: k for k in layer_kernels(work, dgx_like(gpu).gpu, dtype, stack)}


def _rope_row(model, stack_name: str):
    work, rows = _layer(model, get_stack(stack_name))
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
    work, row = _rope_row(replace(GPT_OSS, rope_mscale=1.0), "nemo")
    assert work.rope_bytes == (0.0, 0.0) and row is None


LLAMA_8B = MODELS["llama3-8b"]
COMPILED_TORCHTITAN = get_stack("torchtitan").compiled(True)


def _llama_rope(stack, dtype: str = "bf16"):
    work, rows = _layer(LLAMA_8B, stack, seq_len=8192, micro_batch=1, ep=1, dtype=dtype,
                        gpu="h100-sxm")
    return work, rows.get("rope (op by op)")


def test_a_compiled_torchtitan_block_rotates_op_by_op():
    """8,192 tokens x (q 4,096 + k 1,024) rotated elements: the cast up (2 + 4), the complex
    multiply (4 + 4) and the cast down (4 + 2) are 20 bytes each way, 16 more than the fused
    kernel's 4 in forward and 12 more than its 8 in backward; 3 kernels each on q and on k for
    the fused kernel's 1: 4 more."""
    work, row = _llama_rope(COMPILED_TORCHTITAN)
    assert work.rope_bytes == (8192 * 5120 * 16, 8192 * 5120 * 12)
    assert work.rope_kernels == 4 and row is not None and row.forward_s > row.backward_s > 0
    # in fp32 the casts vanish and the multiply moves what the fused kernel would: kernels only
    work, _ = _llama_rope(COMPILED_TORCHTITAN, "fp32")
    assert work.rope_bytes == (0.0, 0.0) and work.rope_kernels == 4
    # eager, the rotary is among the eager kernels already; execpar's is real-valued
    assert _llama_rope(get_stack("torchtitan"))[0].rope_kernels == 0
    assert _llama_rope(get_stack("execpar").compiled(True))[0].rope_kernels == 0
    # a model with learned positions rotates nothing
    gpt3, _ = _layer(MODELS["gpt3-175b"], COMPILED_TORCHTITAN, seq_len=2048, micro_batch=1, tp=8,
                     ep=1, sp=True, dtype="bf16", gpu="h100-sxm")
    assert gpt3.rope_kernels == 0 and gpt3.rope_bytes == (0.0, 0.0)


def test_the_complex_rotary_costs_a_compiled_torchtitan_layer_time():
    def layer_s(stack) -> float:
        _, rows = _layer(LLAMA_8B, stack, seq_len=8192, micro_batch=1, ep=1, dtype="bf16",
                         gpu="h100-sxm")
        return sum(k.forward_s + k.backward_s for k in rows.values())

    real_rotary = replace(COMPILED_TORCHTITAN, rotary="half")
    assert layer_s(real_rotary) < layer_s(COMPILED_TORCHTITAN) < layer_s(get_stack("torchtitan"))
