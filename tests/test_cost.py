from dataclasses import astuple, fields

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simpar.cost.layer import PassCost
from simpar.cost.pipeline import pipeline_span
from simpar.cost.step import PHASES, optimizer_bytes, predict
from simpar.specs import MODELS, JobSpec, Strategy, load_cluster
from simpar.specs.schedule import get_schedule
from simpar.workload import flops

H100, A100 = load_cluster("dgx-h100", None), load_cluster("dgx-a100", None)


@pytest.mark.parametrize("p, m", [(2, 8), (4, 16), (8, 32), (16, 16)])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_bubble_fraction_equal_stages(p, m, schedule):
    span, bubble = pipeline_span([1.0] * p, m, get_schedule(schedule), 1)
    assert bubble / span == pytest.approx((p - 1) / (m + p - 1))
    assert bubble / (m * 1.0) == pytest.approx((p - 1) / m)  # (P-1)/M of the ideal time


@pytest.mark.parametrize("v", [2, 4])
def test_interleaving_divides_the_bubble_by_v(v):
    _, plain = pipeline_span([1.0] * 8, 32, get_schedule("1f1b"), 1)
    _, inter = pipeline_span([1.0] * 8, 32, get_schedule("interleaved"), v)
    assert inter == pytest.approx(plain / v)


def test_slowest_stage_sets_the_pace():
    span, _ = pipeline_span([1.0, 2.0, 1.0], 10, get_schedule("1f1b"), 1)
    assert span == pytest.approx(10 * 2.0 + 2.0)


@given(st.integers(2, 64), st.integers(1, 256), st.integers(1, 256))
def test_more_micro_batches_never_raise_the_bubble_fraction(p, m1, m2):
    lo, hi = sorted((m1, m2))
    def frac(m):
        span, bubble = pipeline_span([1.0] * p, m, get_schedule("1f1b"), 1)
        return bubble / span
    assert frac(hi) <= frac(lo) + 1e-12


def test_simulated_bubble_matches_formula_end_to_end():
    model, job = MODELS["llama3-70b"], JobSpec(4096, 256)
    p = predict(model, H100, job, Strategy(dp=8, tp=8, pp=4, sp=True))
    m = p.micro_batches
    # the last stage also holds the output layer and sets the pace, so the other stages' fill and
    # drain is a little shorter than (P-1) x the slowest stage
    formula = (4 - 1) / (m + 4 - 1)
    assert 0.8 * formula < p.bubble_fraction <= formula


@pytest.mark.parametrize("strategy", [
    Strategy(dp=64),
    Strategy(dp=8, tp=8, sp=True),
    Strategy(dp=4, tp=8, pp=2, sp=True, zero=1),
    Strategy(dp=16, tp=4, zero=3, recompute="full"),
    Strategy(dp=2, tp=8, pp=4, schedule="interleaved", vpp=5, sp=True),
    Strategy(dp=8, tp=4, cp=2, sp=True),
])
def test_compute_phases_bounded_by_the_flops_and_json_keys(strategy):
    """Independent of how the breakdown is built: H100 runs the large bf16 GEMMs of a 70B step at
    55-80% of its dense peak (NVIDIA's and MLPerf's ~650-750 of 989 TFLOP/s), and a backward does
    twice the FLOPs of its forward (full recompute adds one forward: a quarter of the compute)."""
    job = JobSpec(8192, 64)
    p = predict(MODELS["llama3-70b"], H100, job, strategy)
    per_gpu = (
        flops.model_flops_per_token(MODELS["llama3-70b"], job.seq_len)
        * job.tokens_per_step
        / strategy.gpus
    )
    per_gpu *= 4 / 3 if strategy.recompute == "full" else 1  # the forward again
    peak = H100.gpu.peak_tflops("bf16") * 1e12
    compute = sum(p.breakdown[k] for k in ("forward_compute", "backward_compute", "recompute"))
    assert 1 / 0.8 < compute / (per_gpu / peak) < 1 / 0.55
    forward_share = 0.25 if strategy.recompute == "full" else 1 / 3
    assert p.breakdown["forward_compute"] / compute == pytest.approx(forward_share, abs=0.05)
    assert compute < p.step_time_s
    assert set(p.breakdown) == set(PHASES)
    d = p.to_dict()
    for key in ("step_time_s", "tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu",
                "mfu", "hfu", "bubble_fraction", "exposed_comm_s", "fits_memory", "memory",
                "breakdown", "strategy"):
        assert key in d
    assert "total_gib" in d["memory"] and 0 < p.mfu <= p.hfu < 1


def test_flop_accounting_matches_narayanan_formula():
    # 96 B s l h^2 (1 + s/6h + V/16lh): model FLOPs plus one recompute forward of the layers.
    m, s = MODELS["megatron2021-145.6b"], 2048
    n, h, v = m.layers, m.hidden, m.vocab
    per_token = 96 * n * h * h * (1 + s / (6 * h) + v / (16 * n * h))
    assert flops.hardware_flops_per_token(m, s, "full") == pytest.approx(per_token, rel=0.005)
    model_per_token = 72 * n * h * h * (1 + s / (6 * h) + v / (12 * n * h))
    assert flops.model_flops_per_token(m, s) == pytest.approx(model_per_token, rel=0.005)


def test_recompute_costs_time_and_saves_memory():
    model, job = MODELS["llama3-8b"], JobSpec(8192, 64)
    none = predict(model, H100, job, Strategy(dp=8, tp=8, sp=True))
    full = predict(model, H100, job, Strategy(dp=8, tp=8, sp=True, recompute="full"))
    assert full.step_time_s > none.step_time_s and full.memory.total_gib < none.memory.total_gib
    assert full.hfu > full.mfu and none.hfu == pytest.approx(none.mfu)


def test_overlap_hides_gradient_reduction_up_to_backward():
    model, job = MODELS["llama3-8b"], JobSpec(4096, 256)
    on = predict(model, A100, job, Strategy(dp=256))
    off = predict(model, A100, job, Strategy(dp=256, overlap_grad_reduce=False))
    assert on.breakdown["dp_comm"] < off.breakdown["dp_comm"]


def test_faster_network_is_never_slower():
    from dataclasses import replace
    model, job, s = MODELS["llama3-70b"], JobSpec(4096, 512), Strategy(dp=16, tp=8, pp=4, sp=True)
    slow = predict(model, H100, job, s)
    fast = predict(model, replace(H100, nic_bw_gbps=4 * H100.nic_bw_gbps), job, s)
    assert fast.step_time_s <= slow.step_time_s


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4]), st.sampled_from([0, 1, 2, 3]),
       st.sampled_from(["none", "full"]), st.sampled_from([1, 2, 4]))
def test_predictions_are_finite_and_positive(tp, pp, zero, recompute, mb):
    s = Strategy(dp=64 // (tp * pp), tp=tp, pp=pp, zero=zero, recompute=recompute, sp=tp > 1,
                 micro_batch=mb)
    p = predict(MODELS["llama3-8b"], H100, JobSpec(4096, 512), s)
    assert 0 < p.step_time_s < 1e4 and 0 < p.mfu < 1


def test_time_to_train_follows_throughput():
    job = JobSpec(8192, 64, tokens=1e12)
    p = predict(MODELS["llama3-8b"], H100, job, Strategy(dp=8, tp=8, sp=True))
    assert p.time_to_train_days == pytest.approx(1e12 / p.tokens_per_s / 86400)
    assert predict(MODELS["llama3-8b"], H100, JobSpec(8192, 64),
                   Strategy(dp=8, tp=8, sp=True)).time_to_train_days is None


def test_zero_bubble_schedules_shrink_the_bubble_as_the_event_engine_measures():
    _, plain = pipeline_span([3.0] * 4, 16, get_schedule("1f1b"), 1)
    # F = B_input = W = 1
    _, zb = pipeline_span([3.0] * 4, 16, get_schedule("zb-h1"), 1, wgrad_share=1 / 3)
    _, zbv = pipeline_span([3.0] * 4, 16, get_schedule("zbv"), 1, wgrad_share=1 / 3)
    assert zb == pytest.approx(plain / 3) and zbv == pytest.approx(plain / 6)


def test_zero_bubble_strategies_predict_faster_steps_and_cost_memory():
    model, job = MODELS["llama3-70b"], JobSpec(4096, 256)
    base = predict(model, H100, job, Strategy(dp=8, tp=8, pp=4, sp=True))
    zb = predict(model, H100, job, Strategy(dp=8, tp=8, pp=4, sp=True, schedule="zb-h1"))
    zbv = predict(model, H100, job, Strategy(dp=8, tp=8, pp=4, sp=True, schedule="zbv"))
    assert zbv.step_time_s < zb.step_time_s < base.step_time_s
    assert zb.memory.activations_gib > base.memory.activations_gib


def test_pass_cost_arithmetic_covers_every_phase():
    """PassCost adds and scales its fields written out by name (a search does so half a
    million times): a field added to the class must be added there too."""
    one = PassCost(*(float(i + 1) for i in range(len(fields(PassCost)))))
    assert [f.name for f in fields(PassCost)
            ] == ["compute_s", "recompute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "wgrad_s",
                  "host_wait_s"]
    assert astuple(one + one) == astuple(one.scaled(2.0)) == tuple(2.0 * (i + 1) for i in range(7))


def test_fp16_unscales_every_gradient_before_the_step():
    """fp16 training's optimizer step first reads and writes each gradient to unscale it and flag
    inf/nan (torch._amp_foreach_non_finite_check_and_unscale_): Megatron's fp32 main gradients add
    8 bytes a parameter to its fused Adam's 32, DeepSpeed's 16-bit gradients 4 to its 28; bf16
    has no loss scale."""
    for stack, bf16, fp16 in (("megatron", 32, 40), ("deepspeed", 28, 32)):
        s = Strategy(dp=8, stack=stack)
        assert optimizer_bytes(JobSpec(2048, 64, "bf16"), s) == bf16
        assert optimizer_bytes(JobSpec(2048, 64, "fp16"), s) == fp16
