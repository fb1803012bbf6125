"""A calibrated profile's measured GEMM and attention times in place of the roofline."""

from dataclasses import replace

import pytest

from simpar.cost.compute import gemm_time
from simpar.cost.layer import layer_kernels, stack_layer_work
from simpar.errors import SpecError
from simpar.specs import GPUS, MODELS
from simpar.specs.gpu import GPUSpec
from simpar.specs.stack import get_stack
from simpar.workload.layer import Gemm


def test_a_measured_gemm_table_overrides_the_roofline():
    row = (4096, 4096, 4096, 1e-3)  # 137 TFLOP/s measured
    gpu = GPUSpec.from_dict(
        {
            **{k: v for k, v in GPUS["h100-sxm"].to_dict().items() if k != "gemm_table"},
            "gemm_table": [list(row)],
            "gemm_table_dtype": "bf16",
        }
    )
    assert gemm_time(Gemm("up", 4096, 4096, 4096, count=3), gpu, "bf16") == pytest.approx(3e-3)
    # an unmeasured shape runs at the rate of the nearest measured one: twice the FLOPs,
    # twice the time
    assert gemm_time(Gemm("up", 8192, 4096, 4096), gpu, "bf16") == pytest.approx(2e-3)
    # another precision keeps the roofline
    assert gemm_time(Gemm("up", 4096, 4096, 4096), gpu, "fp8") == gemm_time(
        Gemm("up", 4096, 4096, 4096), GPUS["h100-sxm"], "fp8")
    with pytest.raises(SpecError, match="gemm_table"):
        GPUSpec.from_dict(
            {**GPUS["h100-sxm"].to_dict(), "gemm_table": [[1, 2, 3]], "gemm_table_dtype": "bf16"})
    with pytest.raises(SpecError, match="gemm_table_dtype"):
        GPUSpec.from_dict({**GPUS["h100-sxm"].to_dict(), "gemm_table": [list(row)]})


def test_a_table_timed_at_another_clock_scales_with_the_clock_priced():
    """A table timed at 0.8 of peak, priced on a GPU that holds 0.7 of it: 8/7 the time; under a
    power limit (a lower clock) slower still; with no clock of its own, as timed."""
    row = (4096, 4096, 4096, 1e-3)
    base = {k: v for k, v in GPUS["h100-sxm"].to_dict().items() if k != "burst_gemm_efficiency"}
    gpu = GPUSpec.from_dict({**base, "gemm_efficiency": 0.7, "gemm_table": [list(row)],
                             "gemm_table_dtype": "bf16", "gemm_table_efficiency": 0.8})
    up = Gemm("up", 4096, 4096, 4096)
    assert gemm_time(up, gpu, "bf16") == pytest.approx(1e-3 * 0.8 / 0.7)
    assert gemm_time(up, gpu.power_limited(500), "bf16") > gemm_time(up, gpu, "bf16")
    with pytest.raises(SpecError, match="gemm_table_efficiency"):
        GPUSpec.from_dict({**gpu.to_dict(), "gemm_table_efficiency": 1.5})


EXECPAR = get_stack("execpar")


def _attention(model, gpu, dtype="bf16", seq_len=4096, cp=1, stack=EXECPAR):
    """(forward, backward) seconds of the attention kernel of one layer of `model` at micro-batch
    2 and tp 2, as `stack` runs it."""
    work = stack_layer_work(model, seq_len, 2, 2, cp, 1, True, True, dtype, "eager", stack)
    kernel = next(k for k in layer_kernels(work, gpu, dtype, stack) if k.name == "attention")
    return kernel.forward_s, kernel.backward_s


def test_a_measured_attention_table_overrides_the_attention_rate():
    """Llama 3 8B at 4K tokens, micro-batch 2, tp 2 runs one causal kernel over 2 x 16 sequences
    x heads at head dim 128. Timed at 3 ms forward and 8 ms backward, the layer's attention takes
    those, in an fp8 recipe too (its attention runs in 16 bits); at twice the tokens, four times
    the work at the same rates; at half the clock, twice the time. Ring attention, sliding
    windows and a stack's own FlashAttention-2 run other kernels than the table's SDPA: they keep
    the roofline."""
    llama = MODELS["llama3-8b"]
    catalog = GPUS["h100-sxm"]
    gpu = GPUSpec.from_dict({**catalog.to_dict(), "attention_table": [[32, 4096, 128, 3e-3, 8e-3]],
                             "attention_table_dtype": "bf16"})
    assert _attention(llama, gpu) == (3e-3, 8e-3)
    assert _attention(llama, gpu, "fp8") == (3e-3, 8e-3)
    assert _attention(llama, gpu, seq_len=8192) == pytest.approx((12e-3, 32e-3))
    assert _attention(llama, replace(gpu, clock_fraction=0.5)) == pytest.approx((6e-3, 16e-3))
    assert _attention(llama, gpu, "fp32") == _attention(llama, catalog, "fp32")
    assert _attention(llama, gpu, cp=2) == _attention(llama, catalog, cp=2)
    torchtitan = get_stack("torchtitan")  # FlashAttention-2, as its 2024 releases ran
    assert _attention(llama, gpu, stack=torchtitan) == _attention(llama, catalog, stack=torchtitan)
    windowed = replace(llama, attention_window=1024, windowed_layers=16)
    assert _attention(windowed, gpu) == _attention(windowed, catalog)
    with pytest.raises(SpecError, match="attention_table"):
        GPUSpec.from_dict({**catalog.to_dict(), "attention_table": [[32, 4096, 128, 3e-3]],
                           "attention_table_dtype": "bf16"})
    with pytest.raises(SpecError, match="attention_table_dtype"):
        GPUSpec.from_dict({**catalog.to_dict(), "attention_table": [[32, 4096, 128, 3e-3, 8e-3]]})
