"""Sliding-window attention (Mistral, Gemma, GPT-OSS): windowed layers attend to a fixed span."""

import json
from dataclasses import replace

import pytest

from simpar.cost.compute import attention_softmax_factor, flash_attention_time
from simpar.cost.layer import layer_kernels
from simpar.errors import SpecError
from simpar.specs import MODELS, ModelSpec
from simpar.specs.gpu import GPUS
from simpar.specs.loaders import load_model
from simpar.specs.stack import get_stack
from simpar.workload import flops
from simpar.workload.layer import layer_work

OSS = MODELS["gpt-oss-120b"]


def test_gpt_oss_has_its_model_cards_size_and_alternating_windows():
    """116.8B parameters; 5.13B active without the embedding (OpenAI's count); 18 of 36 layers on
    a 128-token window."""
    assert OSS.total_params == pytest.approx(116.83e9, rel=1e-3)
    assert OSS.active_params - OSS.embedding_params == pytest.approx(5.13e9, rel=1e-2)
    assert (OSS.attention_window, OSS.windowed_layers) == (128, 18)
    assert OSS.attention_spans(4096) == ((0.5, 4096), (0.5, 128))


def test_a_window_without_a_layer_count_covers_every_layer_and_bad_counts_are_refused():
    model = ModelSpec("m", 8, 1024, 8, 8, 4096, 32000, attention_window=256)
    assert model.windowed_layers == 8 and model.attention_spans(4096) == ((1.0, 256),)
    with pytest.raises(SpecError, match="model.windowed_layers"):
        ModelSpec("m", 8, 1024, 8, 8, 4096, 32000, attention_window=256, windowed_layers=9)
    with pytest.raises(SpecError, match="attention_window"):
        ModelSpec("m", 8, 1024, 8, 8, 4096, 32000, windowed_layers=4)


def test_model_flops_count_a_windowed_layers_attention_over_its_window():
    """Per token, forward: 2 x keys x (q_dim + out_dim) per layer, q_dim = out_dim = 64 x 64:
    18 layers over 4,096 keys and 18 over 128."""
    expected = 2 * (18 * 4096 + 18 * 128) * (4096 + 4096)
    assert flops.attention_flops_per_token(OSS, 4096) == pytest.approx(expected)


def test_a_windowed_layers_kernel_runs_its_windows_flops_at_the_short_span_rate():
    """One all-windowed layer at 4,096 tokens, window 128: a query attends to 128 - 128^2 /
    8,192 = 126 keys on average, 2 x 4,096 x 126 x 8,192 FLOPs, priced at that span's rate (and
    head dim 64's); a window as long as the sequence is plain causal attention."""
    model = replace(OSS, windowed_layers=OSS.layers)
    work = layer_work(model, 4096, 1, 1, 1, 1, False, True, "bf16")
    flops_w, keys = work.windowed_attention
    assert keys == pytest.approx(126.0)
    assert flops_w == work.flash_attention_flops == pytest.approx(2 * 4096 * 126 * 8192)
    gpu, stack = GPUS["h100-sxm"], get_stack("megatron")
    attention = next(k for k in layer_kernels(work, gpu, "bf16", stack) if k.name == "attention")
    # head dim 64: the softmax's share of the time is larger than at 128 (4/3 on Hopper)
    assert attention.forward_s == pytest.approx(
        flash_attention_time(flops_w, gpu, "bf16", "best", 126.0)
        * attention_softmax_factor(gpu, (64, 64), False))
    long = layer_work(replace(model, attention_window=4096), 4096, 1, 1, 1, 1, False, True,
                      "bf16")
    plain = layer_work(replace(model, attention_window=0, windowed_layers=0), 4096, 1, 1, 1, 1,
                       False, True, "bf16")
    assert long.flash_attention_flops == plain.flash_attention_flops
    assert long.windowed_attention == (0.0, 0.0)
    # the window saves most of the work: 126 keys a query against 2,048
    assert flops_w < 0.07 * plain.flash_attention_flops


@pytest.mark.parametrize("extra, window, windowed", [
    # openai/gpt-oss-120b: layer_types alternates sliding and full attention
    ({"sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 18}, 128,
     18),
    ({"sliding_window": 4096}, 4096, 36),  # Mistral: every layer
    ({"sliding_window": 32768, "use_sliding_window": False}, 0, 0),  # Qwen2: named, unused
    ({"sliding_window": None}, 0, 0),
    # Gemma's configs name no layer_types: Gemma 2 every other layer, Gemma 3 five in six
    ({"sliding_window": 4096, "model_type": "gemma2"}, 4096, 18),
    ({"sliding_window": 1024, "model_type": "gemma3_text"}, 1024, 30),
])
def test_a_hugging_face_config_brings_its_window(tmp_path, extra, window, windowed):
    cfg = {"num_hidden_layers": 36, "hidden_size": 2880, "num_attention_heads": 64,
           "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880,
           "vocab_size": 201088, **extra}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = load_model(str(tmp_path / "config.json"))
    assert (model.attention_window, model.windowed_layers) == (window, windowed)
