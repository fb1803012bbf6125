"""`simpar calibrate`'s collective timings: what a step pays for each collective."""

import pytest

torch = pytest.importorskip("torch")

from execpar import calibrate  # noqa: E402

COMPUTE_S, WARM_S, COLD_S = 4e-3, 1e-3, 3e-3


def test_collectives_are_timed_after_compute_as_a_step_issues_them(monkeypatch):
    """A collective that costs WARM_S back to back but COLD_S after compute (the ranks' compute
    ends at different times, gloo's transport thread has gone to sleep) is priced at COLD_S:
    the loop of compute and collective, less the compute alone. A back-to-back loop would
    have found WARM_S."""
    clock = {"s": 0.0, "computed": True}

    def matmul(a, b):
        clock.update(s=clock["s"] + COMPUTE_S, computed=True)

    def collective(*args, **kwargs):
        clock.update(s=clock["s"] + (COLD_S if clock["computed"] else WARM_S), computed=False)

    def timed(fn, device, reps):  # a loop's steady state: its second pass
        fn()
        clock["s"] = 0.0
        fn()
        return clock["s"]

    monkeypatch.setattr(torch.Tensor, "__matmul__", matmul)
    monkeypatch.setattr(calibrate, "_time", timed)
    monkeypatch.setattr(calibrate.dist, "get_world_size", lambda: 2)
    for op in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"):
        monkeypatch.setattr(calibrate.dist, op, collective)
    res = calibrate.collectives(torch.device("cpu"), reps=1)
    assert set(res) == {"allreduce", "allgather", "reducescatter"}
    for points in res.values():
        assert [s for s, _ in points] == calibrate.SIZES
        assert [t for _, t in points] == pytest.approx([COLD_S] * len(calibrate.SIZES))


def test_dtensor_dispatch_is_timed_at_the_workloads_widths_on_a_cpu_and_tiny_on_a_gpu():
    """On a CPU the block's own kernels run on the core that dispatches, so the probe block has
    the model's widths at the step's tokens (one dense layer, a small vocabulary); a GPU runs the
    kernels apart, where a tiny block leaves only the host cost."""
    from simpar.specs.model_catalog import MODELS

    model = MODELS["llama3-8b"]
    spec, tokens = calibrate.dtensor_probe_block(model, "cpu", 256)
    assert (spec.hidden, spec.heads, spec.kv_heads, spec.ffn_hidden, spec.gated_mlp) == (
        4096, 32, 8, 14336, True)
    assert (spec.layers, spec.vocab, tokens) == (1, 64, 256)
    for m, device in ((model, "cuda"), (None, "cpu")):
        spec, tokens = calibrate.dtensor_probe_block(m, device, 256)
        assert (spec.hidden, spec.ffn_hidden, tokens) == (64, 128, 16)


def test_a_calibrated_gpu_reproduces_its_own_attention_probe():
    """A GPU's probe (causal, 4096 tokens, forward and backward) runs below a kernel's
    long-sequence rate; the profile holds the long rate, so pricing the probe's forward and
    backward again gives the time measured."""
    from simpar.cost.compute import flash_attention_time
    from simpar.specs.gpu import GPUSpec

    b, h, s, d = calibrate.ATTENTION_PROBE["cuda"]
    fwd_and_bwd = 3.5 * 0.5 * 4 * b * h * s * s * d
    measured_s = 2e-3
    rate = calibrate.long_attention_flops(fwd_and_bwd / measured_s, "cuda")
    gpu = GPUSpec("probe", 1000.0, 1000.0, 1000.0, 0.0, 80.0, 3.0, 132, gemm_efficiency=1.0,
                  attention_efficiency=rate / 1000e12, kernel_overhead_us=0.0, arch="hopper")
    assert flash_attention_time(fwd_and_bwd, gpu, "bf16", "best", s / 2, 1) == pytest.approx(
        measured_s)
    assert calibrate.long_attention_flops(1.0, "cuda") == pytest.approx(1 + 192 / 2048)
    assert calibrate.long_attention_flops(1.0, "cpu") == 1.0


def test_a_gpu_profile_records_what_the_device_says_of_itself(monkeypatch, tmp_path):
    """A GPU's profile takes its multiprocessor count (wave quantization) and architecture from
    the device, and loads as a cluster: its first H200 profile had sm_count 1."""
    from types import SimpleNamespace

    from simpar.specs.cluster import load_cluster

    props = SimpleNamespace(total_memory=80 * 2**30, multi_processor_count=132, major=9)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: props)
    measured = {"gemm_flops": 789e12, "stream_bytes_per_s": 2.7e12, "attention_flops": 500e12,
                "kernel_overhead_s": 2.2e-6, "overlap_slowdown": 1.0, "dtensor_op_s": 47e-6,
                "link_bytes_per_s": 2.7e12, "link_alpha_s": 2.2e-6}
    path = tmp_path / "profile.yaml"
    calibrate.write_profile(str(path), measured, 1, "cuda", {}, {}, "bf16")
    gpu = load_cluster(str(path), None).gpu
    assert (gpu.sm_count, gpu.arch, gpu.kernel_overhead_us) == (132, "hopper", pytest.approx(2.2))
    assert gpu.bf16_tflops == pytest.approx(789) and gpu.gemm_efficiency == 1.0


def test_a_soaked_gpu_profile_carries_its_burst_and_sustained_rates(monkeypatch, tmp_path):
    """A GPU that sustains 675 of its 789 TFLOP/s burst under continuous GEMMs (the H100 soak)
    gets gemm_efficiency 675/789 with burst 1, its attention scaled alike, and its burst-timed
    table priced at the clock a step allows: at the sustained rate in an all-GEMM step, faster
    in a half memory-bound one."""
    from types import SimpleNamespace

    from simpar.cost.compute import gemm_time
    from simpar.specs.cluster import load_cluster
    from simpar.workload.layer import Gemm

    props = SimpleNamespace(total_memory=80 * 2**30, multi_processor_count=132, major=9)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: props)
    measured = {"gemm_flops": 789e12, "gemm_sustained_flops": 675e12, "stream_bytes_per_s": 2.7e12,
                "attention_flops": 500e12, "kernel_overhead_s": 2.2e-6, "overlap_slowdown": 1.0,
                "dtensor_op_s": 47e-6, "link_bytes_per_s": 2.7e12, "link_alpha_s": 2.2e-6}
    table = [[4096, 4096, 4096, 1e-3]]
    path = tmp_path / "profile.yaml"
    calibrate.write_profile(str(path), measured, 1, "cuda", {}, {"gemm_table": table},
                            "bf16")
    gpu = load_cluster(str(path), None).gpu
    assert gpu.gemm_efficiency == pytest.approx(675 / 789) and gpu.burst_gemm_efficiency == 1.0
    assert gpu.attention_efficiency == pytest.approx(
        calibrate.long_attention_flops(500e12, "cuda") / 789e12 * 675 / 789)
    up = Gemm("up", 4096, 4096, 4096)
    assert gemm_time(up, gpu, "bf16") == pytest.approx(1e-3 * 789 / 675)
    half = gpu.at_tensor_core_share(0.5)
    assert 1e-3 < gemm_time(up, half, "bf16") < 1e-3 * 789 / 675
    # no soak (a CPU) or none below the burst rate: one rate, the table as timed
    calibrate.write_profile(str(path), {**measured, "gemm_sustained_flops": 785e12}, 1, "cuda",
                            {}, {"gemm_table": table}, "bf16")
    gpu = load_cluster(str(path), None).gpu
    assert (gpu.gemm_efficiency, gpu.burst_gemm_efficiency, gpu.gemm_table_efficiency) == (1, 0, 0)
    assert gemm_time(up, gpu, "bf16") == pytest.approx(1e-3)


def test_a_link_whose_bandwidth_the_noise_hid_leaves_no_zero_efficiency():
    """A busy host's all-reduce line came out falling (fit_ring: 1e15 B/s), and the gathers'
    ratio to it rounded to 0, a profile that `simpar plan` refused; such a kind is left out."""
    sizes = [2**k for k in range(10, 25, 2)]
    falling = [(s, 0.02 - 1e-9 * s) for s in sizes]
    rising = [(s, 1e-3 + 2e-9 * s) for s in sizes]
    bw, _ = calibrate.fit_ring(falling, 2)
    assert calibrate.collective_efficiency({"allgather": rising}, 2, bw) == {}
    # a resolved all-reduce still gives the gather its measured ratio: gloo's gather at half
    resolved, _ = calibrate.fit_ring([(s, 1e-3 + 2e-9 * s) for s in sizes], 2)
    assert calibrate.collective_efficiency({"allgather": rising}, 2, resolved) == {
        "allgather": pytest.approx(0.5, abs=1e-3)}
