"""A fused attention kernel's softmax: one exponential per score on the special-function units,
between the tile's two matmuls, so its share of the time grows as the head dim shrinks; and its
dropout's random number per score."""

from dataclasses import replace

import pytest

from simpar.cost.compute import attention_dropout_factor, attention_softmax_factor
from simpar.cost.layer import layer_kernels, stack_layer_work
from simpar.specs import MODELS
from simpar.specs.gpu import GPUS, _blackwell
from simpar.specs.stack import get_stack


def test_head_dim_64_is_slower_per_flop_where_exponentials_are_scarce():
    """Hopper: 256 FLOPs per exponential. A forward score at head dim 128 has 512 matmul FLOPs,
    at 64 256: (1 + 256/256) / (1 + 256/512) = 4/3. Backward, 1,280 and 640 FLOPs per score
    and one exponential: (1 + 0.4) / (1 + 0.2) = 7/6. (Measured with cuDNN on an H200: 1.32 and
    1.28.) Blackwell, 512 per exponential: 3/2 forward. Latent attention's 192-wide queries and
    keys against 128-wide values (640 FLOPs) run a little faster per FLOP than 128's; a GPU
    whose exponential rate is unknown (MI300X) is left as it is."""
    h100, b200 = GPUS["h100-sxm"], GPUS["b200"]
    assert attention_softmax_factor(h100, (128, 128), False) == 1.0
    assert attention_softmax_factor(h100, (128, 128), True) == 1.0
    assert attention_softmax_factor(h100, (64, 64), False) == pytest.approx(4 / 3)
    assert attention_softmax_factor(h100, (64, 64), True) == pytest.approx(7 / 6)
    assert attention_softmax_factor(b200, (64, 64), False) == pytest.approx(3 / 2)
    assert attention_softmax_factor(h100, (192, 128), False) == pytest.approx(1.4 / 1.5)
    assert attention_softmax_factor(GPUS["mi300x"], (64, 64), False) == 1.0


def test_blackwell_ultra_runs_attention_faster_by_its_doubled_exponential_rate():
    """At head dim 128 B200's attention forward spends 1 + 512/512 parts on matmul and softmax,
    Blackwell Ultra's 1 + 256/512: 0.75 of the time of the same part without the doubled
    special-function units. Backward, 1,280 matmul FLOPs a score: (1 + 256/1280) / (1 + 512/1280)
    = 6/7. Both keep B200's measured efficiency; GEMMs are unchanged."""
    args = ("x", 80.0, 1250.0, 2500.0, 5000.0, 279.0, 8.0, 160)
    plain = _blackwell(*args, tdp_w=1400, fp4_tflops=15000.0)
    ultra = _blackwell(*args, tdp_w=1400, fp4_tflops=15000.0, ultra=True)
    assert ultra.attention_efficiency == plain.attention_efficiency
    assert ultra.gemm_efficiency == plain.gemm_efficiency
    assert attention_softmax_factor(plain, (128, 128), False) == 1.0
    assert attention_softmax_factor(ultra, (128, 128), False) == pytest.approx(3 / 4)
    assert attention_softmax_factor(ultra, (128, 128), True) == pytest.approx(6 / 7)
    # head dim 64 on Ultra: (1 + 256/256) / (1 + 512/512), as fast per FLOP as B200 at 128
    assert attention_softmax_factor(ultra, (64, 64), False) == pytest.approx(1.0)
    assert GPUS["gb300"].exp_ratio == 256 and GPUS["gb200"].exp_ratio == 512
    assert GPUS["gb300"].attention_exp_ratio == 512


def test_dropout_slows_a_fused_attention_by_its_random_numbers_per_score():
    """Dropout draws a random number per score: 0.35 exponentials' worth of SM time forward and
    1.5 backward (FlashAttention-4's dropout on a GB200: 75-85% and 60-70% of its rate without).
    H100 at head dim 128, 256 FLOPs per exponential: forward 1 + 0.35 x 256 / (512 + 256) =
    1.1167, backward 1 + 1.5 x 256 / (1,280 + 256) = 1.25. B200 at head dim 128 and 64 sits at
    the measured ranges' ends: 85% and 70%, 81% and 60%. Blackwell Ultra's doubled exponential
    rate leaves the random numbers' cost as B200's. A layer's fused attention takes the factor
    where the model drops out; an unfused softmax prices its dropout as memory traffic."""
    h100, b200, gb300 = GPUS["h100-sxm"], GPUS["b200"], GPUS["gb300"]
    assert attention_dropout_factor(h100, (128, 128), False) == pytest.approx(1 + 89.6 / 768)
    assert attention_dropout_factor(h100, (128, 128), True) == pytest.approx(1.25)
    assert 1 / attention_dropout_factor(b200, (128, 128), False) == pytest.approx(0.85, abs=0.005)
    assert 1 / attention_dropout_factor(b200, (128, 128), True) == pytest.approx(0.70, abs=0.005)
    assert 1 / attention_dropout_factor(b200, (64, 64), False) == pytest.approx(0.81, abs=0.005)
    assert 1 / attention_dropout_factor(b200, (64, 64), True) == pytest.approx(0.60, abs=0.005)
    # B200's 0.35 x 512 extra over Ultra's 256 + 512 per forward score
    assert attention_dropout_factor(gb300, (128, 128), False) == pytest.approx(1 + 179.2 / 768)
    assert attention_dropout_factor(GPUS["mi300x"], (128, 128), True) == 1.0

    gpt = MODELS["gpt3-5b"]
    assert gpt.dropout and gpt.head_dim == 128
    plain = replace(gpt, dropout=False)
    megatron = get_stack("megatron")
    for model, factor in ((gpt, (1 + 89.6 / 768, 1.25)), (plain, (1.0, 1.0))):
        work = stack_layer_work(model, 2048, 1, 1, 1, 1, False, True, "bf16", "fused", megatron)
        fused = next(k for k in layer_kernels(work, h100, "bf16", megatron)
                     if k.name == "attention")
        base = stack_layer_work(plain, 2048, 1, 1, 1, 1, False, True, "bf16", "fused", megatron)
        bare = next(k for k in layer_kernels(base, h100, "bf16", megatron)
                    if k.name == "attention")
        assert (fused.forward_s / bare.forward_s, fused.backward_s / bare.backward_s) == (
            pytest.approx(factor[0]), pytest.approx(factor[1]))
        assert ("dropout" in fused.detail) == model.dropout  # --explain says so
    unfused = stack_layer_work(gpt, 2048, 1, 1, 1, 1, False, False, "bf16", "fused", megatron)
    assert unfused.attention_gemms and not unfused.attention_dropout
