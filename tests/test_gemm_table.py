"""A calibrated profile's measured GEMM times in place of the roofline."""

import pytest

from simpar.cost.compute import gemm_time
from simpar.errors import SpecError
from simpar.specs import GPUS
from simpar.specs.gpu import GPUSpec
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
