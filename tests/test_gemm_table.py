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
