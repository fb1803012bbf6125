"""A power-capped GPU runs its GEMMs faster in a step that is partly memory-bound
(GPUSpec.at_tensor_core_share, measured on an H100 in reports/gpu-gemm-soak)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from simpar.cost.step import predict
from simpar.specs import JobSpec, Strategy, dgx_like
from simpar.specs.gpu import GPUS
from simpar.specs.loaders import load_model

SOAK = Path(__file__).parents[1] / "reports" / "gpu-gemm-soak" / "gemm_soak.json"


def _soak_rates() -> dict[bool, float]:
    """The soak's mean GEMM TFLOP/s of each mode (mixed: a memory-bound pass after each GEMM)."""
    runs = json.loads(SOAK.read_text())["runs"]
    return {mixed: sum(w["tflops"] for r in runs if r["mixed"] == mixed for w in r["windows"])
            / sum(len(r["windows"]) for r in runs if r["mixed"] == mixed)
            for mixed in (False, True)}


def test_the_h100_entry_reproduces_its_soak():
    """Back-to-back GEMMs at the cap run at the sustained rate; with 48% of the time in GEMMs
    (the soak's memory-bound pass was sized to the GEMM's length, timed 5.1 and 5.6 ms) the clock
    the cap allows gives the measured mixed rate."""
    h100 = GPUS["h100-sxm"]
    rates = _soak_rates()
    assert h100.gemm_efficiency * h100.bf16_tflops == pytest.approx(rates[False], rel=0.01)
    mixed = h100.at_tensor_core_share(5.1 / (5.1 + 5.6))
    assert mixed.gemm_efficiency * h100.bf16_tflops == pytest.approx(rates[True], rel=0.02)


def test_the_clock_rises_with_the_memory_bound_share_up_to_the_burst_rate():
    h100 = GPUS["h100-sxm"]
    assert h100.at_tensor_core_share(1.0) == h100
    rates = [h100.at_tensor_core_share(s).gemm_efficiency for s in (0.95, 0.8, 0.6, 0.4, 0.05)]
    assert rates == sorted(rates) and rates[0] > h100.gemm_efficiency
    assert rates[-1] == pytest.approx(h100.burst_gemm_efficiency)
    # by hand at share 0.5: the tensor-core phase may draw (1 - 0.5 x 0.68) / 0.5 = 1.32 of the
    # board power, a clock of ((1.32 - 0.1) / 0.9) ** (1/3) = 1.107
    assert h100.at_tensor_core_share(0.5).gemm_efficiency == pytest.approx(
        h100.gemm_efficiency * 1.107, rel=1e-3)
    # no headroom where none was measured, nor under a user's power limit
    assert GPUS["a100-80gb"].at_tensor_core_share(0.5) == GPUS["a100-80gb"]
    assert h100.power_limited(500).at_tensor_core_share(0.5).gemm_efficiency == pytest.approx(
        h100.power_limited(500).gemm_efficiency)


def _step(stack: str, gpu) -> float:
    model = load_model("llama3-8b")
    cluster = replace(dgx_like("h100-sxm"), gpu=gpu)
    s = Strategy(dp=8, zero=3 if stack == "torchtitan" else 1, micro_batch=1, stack=stack)
    return predict(model, cluster, JobSpec(8192, 32), s).step_time_s


def test_an_eager_step_gains_more_than_a_fused_one():
    """Eager torchtitan spends more of its step in memory-bound kernels than Megatron's fused
    one, so its GEMMs get more of the headroom; neither exceeds the burst rate's gain."""
    h100 = GPUS["h100-sxm"]
    flat = replace(h100, burst_gemm_efficiency=0.0)
    gain = {stack: _step(stack, flat) / _step(stack, h100) - 1
            for stack in ("megatron", "torchtitan")}
    assert 0 < gain["megatron"] < gain["torchtitan"] < h100.burst_gemm_efficiency / \
        h100.gemm_efficiency - 1


def test_the_h200_entry_reproduces_its_own_soak():
    """The H200 soaked on its own: back to back at its sustained rate; with the GEMM share each
    window measured (53%), the mixed rate, a smaller rise than the H100's at a similar share
    (its memory-bound pass draws more of the board power)."""
    soak = json.loads((SOAK.parent / "gemm_soak-h200.json").read_text())["runs"]
    h200, h100 = GPUS["h200"], GPUS["h100-sxm"]
    for mixed in (False, True):
        windows = [w for r in soak if r["mixed"] == mixed for w in r["windows"]]
        rate = sum(w["tflops"] for w in windows) / len(windows)
        share = sum(w["gemm_share"] for w in windows) / len(windows)
        predicted = h200.at_tensor_core_share(share).gemm_efficiency * h200.bf16_tflops
        assert predicted == pytest.approx(rate, rel=0.01), (mixed, share)
    rise = {g.name: g.at_tensor_core_share(0.5).gemm_efficiency / g.gemm_efficiency
            for g in (h200, h100)}
    assert 1 < rise["h200"] < rise["h100-sxm"]
