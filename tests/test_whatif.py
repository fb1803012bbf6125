"""What-if flags: each moves the prediction by what its formula says (closed form, overlap off)."""

import json
import math
from dataclasses import replace

import pytest

from simpar.cli import main
from simpar.cost.gradsync import INDEX_BYTES, bucketed, powersgd_fraction, ps_rate
from simpar.cost.replicas import PS_SERVER_MEMORY_GBPS, harmonic
from simpar.cost.step import predict
from simpar.network.model import NetworkOptions, network_for
from simpar.specs import MODELS, JobSpec, Strategy, load_cluster
from simpar.specs.stack import FUSED_ADAM_FP32_GRAD_BYTES
from simpar.workload.params import stage_params

C = load_cluster("dgx-h100", None)
M = MODELS["llama3-8b"]
JOB = JobSpec(4096, 64)
AB = NetworkOptions(model="alpha-beta")  # closed forms: the what-ifs compare like with like
JOB32 = JobSpec(4096, 64, "fp32")
# 64 GPUs, dp 8 x tp 8: gradient sync across nodes, nothing overlapped, so dp_comm is
# the whole sync NeMo's recipes keep and reduce bf16 gradients: 2 bytes per element on
# the wire, as these formulas assume
BASE = Strategy(dp=8, tp=8, sp=True, overlap_grad_reduce=False, stack="nemo")


def _predict(s, job=JOB, cluster=C):
    return predict(M, cluster, job, s, network=AB)


def _params(s):
    return sum(stage_params(M, s, 0, M.layers))


def _net(s):
    return network_for(C, s, AB)


def _collective(s, op, bytes_per_element):
    """All of a rank's gradients in Megatron-LM's buckets of max(40M, 1M x dp)
    parameters, one after another."""
    # without expert parallelism, one group for all weights
    p = sum(stage_params(M, s, 0, M.layers))
    return bucketed(_net(s), op, p * bytes_per_element, "dpcp",
                    math.ceil(p / max(40e6, 1e6 * s.dp)))


def test_parameter_servers_push_and_pull_at_the_slower_of_gpu_and_server_share():
    s = replace(BASE, grad_sync="ps", ps_servers=4)
    nbytes = _params(s) * 2  # bf16 gradients pushed, bf16 weights pulled (pipelined, full duplex)
    # 4 servers shared by 64 GPUs
    rate = min(C.inter_bw_bytes_per_s, 4 * C.inter_bw_bytes_per_s / 64)
    assert ps_rate(s, C) == pytest.approx(rate)
    p = _predict(s)
    assert p.breakdown["dp_comm"] == pytest.approx(nbytes / rate +
                                                   2 * C.inter_node_latency_us * 1e-6)
    # enough servers: the GPU's own NIC binds, and more servers stop helping
    many, more = _predict(replace(s, ps_servers=64)), _predict(replace(s, ps_servers=128))
    assert many.breakdown["dp_comm"] < p.breakdown["dp_comm"] / 10
    assert more.breakdown["dp_comm"] == pytest.approx(many.breakdown["dp_comm"])
    # faster server NICs act like more servers
    fast = _predict(replace(s, ps_server_gbps=2 * C.nic_bw_gbps))
    assert fast.breakdown["dp_comm"] == pytest.approx(nbytes / (2 * rate) +
                                                      2 * C.inter_node_latency_us * 1e-6)


def test_async_sgd_drops_the_barrier_and_reports_staleness():
    ps = replace(BASE, grad_sync="ps", ps_servers=2)
    sync, asyn = _predict(ps), _predict(replace(ps, async_sgd=True))
    compute = sync.step_time_s - sync.breakdown["dp_comm"] - sync.breakdown["optimizer"]
    push = sync.breakdown["dp_comm"]
    server = 64 * _params(ps) * FUSED_ADAM_FP32_GRAD_BYTES / (2 * PS_SERVER_MEMORY_GBPS * 1e9)
    assert asyn.step_time_s == pytest.approx(max(compute, push, server))
    assert asyn.replicas.staleness_steps == 8 - 1 and sync.replicas.staleness_steps == 0
    slow = _predict(replace(ps, async_sgd=True), cluster=replace(C, straggler_delay_frac=0.1))
    # each replica at its own mean pace
    assert slow.step_time_s == pytest.approx(1.1 * asyn.step_time_s)


def test_straggler_wait_and_backup_workers_follow_order_statistics():
    delay = replace(C, straggler_delay_frac=0.05)
    base = _predict(BASE)
    slow = _predict(BASE, cluster=delay)
    assert slow.breakdown["straggler_wait"] == pytest.approx(0.05 * harmonic(8) * base.step_time_s)
    backup = _predict(replace(BASE, backup_frac=0.25), cluster=delay)  # ignore the slowest 2 of 8
    assert backup.replicas.ignored == 2
    assert backup.step_time_s == pytest.approx(base.step_time_s * (1 + 0.05 *
                                                                   (harmonic(8) - harmonic(2))))
    assert backup.tokens_per_s == pytest.approx(JOB.tokens_per_step * 6 / 8 / backup.step_time_s)
    assert backup.step_time_s < slow.step_time_s
    # without stragglers, backup workers only throw work away
    assert _predict(replace(BASE, backup_frac=0.25)).tokens_per_s == pytest.approx(
        0.75 * base.tokens_per_s)


def test_fp16_cast_halves_fp32_gradient_bytes_and_is_free_in_bf16():
    s32 = _predict(BASE, JOB32)
    f16 = _predict(replace(BASE, compress="fp16"), JOB32)
    p = _params(BASE)
    cast = (
        2 * p * (4 + 2) / (C.gpu.hbm_tbps * 1e12 * C.gpu.hbm_efficiency)
        + 2 * C.gpu.kernel_overhead_us * 1e-6
    )
    assert s32.breakdown["dp_comm"] == pytest.approx(_collective(BASE, "allreduce", 4))
    assert f16.breakdown["dp_comm"] == pytest.approx(_collective(BASE, "allreduce", 2) + cast)
    assert _predict(replace(BASE, compress="bf16")).step_time_s == pytest.approx(
        _predict(BASE).step_time_s)


def test_powersgd_sends_r_times_n_plus_m_per_matrix():
    h, f, q, kv, v = M.hidden, M.ffn_hidden // 8, M.q_dim // 8, M.kv_dim // 8, M.vocab // 8
    # one matrix per weight, as PyTorch holds them
    mats = [(h, q), (h, kv), (h, kv), (q, h), (h, f), (h, f), (f, h)]
    full = M.layers * sum(n * m for n, m in mats) + 2 * v * h
    sent = M.layers * sum(4 * (n + m) for n, m in mats) + 2 * 4 * (v + h)
    assert powersgd_fraction(M, 8, 1, 4) == pytest.approx(sent / full)
    s = replace(BASE, compress="powersgd", compress_rank=4)
    p, frac = _params(s), sent / full
    gpu = C.gpu
    codec = max(6 * p * 4 / (gpu.peak_tflops("bf16") * 1e12 * gpu.gemm_efficiency),
                5 * p * 2 / (gpu.hbm_tbps * 1e12 * gpu.hbm_efficiency))
    expected = 2 * _collective(s, "allreduce", 2 * frac / 2) + codec
    assert _predict(s).breakdown["dp_comm"] == pytest.approx(expected)
    assert _predict(s).breakdown["dp_comm"] < _predict(BASE).breakdown["dp_comm"]
    # error feedback keeps a gradient-sized buffer (at two micro-batches' activations both peak in
    # backward; with one, BASE peaks in the optimizer step, casting its bf16 gradients to fp32)
    two = replace(BASE, micro_batch=2)
    assert _predict(replace(s, micro_batch=2)).memory.buffers_gib == pytest.approx(
        _predict(two).memory.buffers_gib + p * 2 / 2**30)


def test_topk_all_gathers_values_and_indices():
    s = replace(BASE, compress="topk", topk_ratio=0.01)
    p = _params(s)
    # every rank's values and indices
    comm = _collective(s, "allgather", 0.01 * (2 + INDEX_BYTES) * 8)
    received = 8 * 0.01 * p * (2 * 2 + INDEX_BYTES)  # read and scatter-added
    codec = (6 * p * 2 + received) / (C.gpu.hbm_tbps * 1e12 *
                                      C.gpu.hbm_efficiency) + 3 * C.gpu.kernel_overhead_us * 1e-6
    assert _predict(s).breakdown["dp_comm"] == pytest.approx(comm + codec)
    # too dense a top-k gathers more than the all-reduce moves: (N-1) k (g+4) > 2 (N-1)/N g
    assert _predict(replace(
        s, topk_ratio=0.5)).breakdown["dp_comm"] > _predict(BASE).breakdown["dp_comm"]


def test_gradient_accumulation_sets_micro_batch_and_ddp_syncs_once(capsys):
    args = [
        "simulate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "64", "--tp", "8",
        "--sp", "--seq-len", "4096", "--global-batch", "64", "--engine", "analytic", "--network",
        "alpha-beta", "--no-overlap-grad-reduce", "--json"
    ]
    docs = {}
    for zero in (0, 2):
        for k in (2, 8):
            assert main(args + ["--zero", str(zero), "--grad-accum", str(k)]) == 0
            docs[zero, k] = json.loads(capsys.readouterr().out)
    assert docs[0, 2]["strategy"]["micro_batch"] == 4 and docs[0, 8]["strategy"]["micro_batch"] == 1
    assert docs[0, 8]["micro_batches"] == 8
    # DDP: one all-reduce per step whatever K; ZeRO-2: a reduce-scatter per micro-batch,
    # so K times more
    assert docs[0, 8]["breakdown"]["dp_comm"] == pytest.approx(docs[0, 2]["breakdown"]["dp_comm"])
    z2, z8 = docs[2, 2]["breakdown"]["dp_comm"], docs[2, 8]["breakdown"]["dp_comm"]
    assert z8 > 2.5 * z2
    assert docs[0, 8]["memory"]["activations_gib"] == pytest.approx(
        docs[0, 2]["memory"]["activations_gib"] / 4)
    assert main(args + ["--grad-accum", "3"]) == 2  # 64 sequences do not split into dp 8 x 3
    assert main(args + ["--grad-accum", "2", "--micro-batch", "2"]) == 2
    assert "--grad-accum" in capsys.readouterr().err


def test_optimizer_offload_frees_gpu_memory_and_costs_pcie_time():
    s = Strategy(dp=8, tp=8, sp=True)
    base, off = predict(M, C, JOB, s), predict(M, C, JOB, replace(s, offload_optimizer=True))
    assert off.memory.optimizer_gib == 0 and off.memory.peak_allocated_gib == pytest.approx(
        base.memory.peak_allocated_gib - base.memory.optimizer_gib)
    params = _params(s)
    # Megatron keeps fp32 gradients: 4 bytes down, 2 bytes of bf16 weights up
    expected = params * 6 / (C.host_link_gbps * 1e9) + params * FUSED_ADAM_FP32_GRAD_BYTES / (
        C.host_memory_gbps * 1e9)
    assert off.breakdown["optimizer"] == pytest.approx(expected)
    assert off.step_time_s > base.step_time_s


def test_event_engine_applies_the_same_replica_model():
    from simpar.cost.step import with_simulation
    from simpar.sim.engine import simulate

    delay = replace(C, straggler_delay_frac=0.05)
    s = Strategy(dp=8, tp=8, sp=True)
    sim = simulate(M, delay, JOB, s, network=AB)
    p = with_simulation(predict(M, delay, JOB, s, network=AB), sim)
    assert p.step_time_s == pytest.approx(sim.p50_s * (1 + 0.05 * harmonic(8)))
    ps = replace(s, grad_sync="ps", ps_servers=1)  # one server for 64 GPUs: the push is exposed
    assert simulate(M, C, JOB, ps, network=AB).p50_s > simulate(M, C, JOB, s, network=AB).p50_s


def test_cli_what_ifs_print_their_effect_and_reject_bad_values(capsys):
    base = [
        "simulate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "64", "--tp", "8",
        "--sp", "--seq-len", "4096", "--global-batch", "64", "--engine", "analytic"
    ]
    assert main(base + ["--ps-servers", "8", "--async-sgd", "--straggler-delay", "5"]) == 0
    out = capsys.readouterr().out
    assert "8 parameter servers" in out and "staleness 7 steps" in out and "straggler_wait" in out
    assert "with the what-ifs vs without" in out
    for bad, field in ((["--ps-servers", "0"], "--ps-servers"), (["--async-sgd"], "--async-sgd"),
                       (["--backup-workers", "100"], "--backup-workers"), (["--topk-ratio",
                                                                            "0"], "--topk-ratio"),
                       (["--compress", "powersgd", "--zero",
                         "3"], "--zero"), (["--straggler-delay", "-1"], "--straggler-delay")):
        assert main(base + bad) == 2
        err = capsys.readouterr().err
        assert field in err and len(err.strip().splitlines()) == 1


def test_help_explains_each_what_if_in_one_line(capsys):
    for cmd in ("simulate", "compare"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        text = capsys.readouterr().out
        for flag in ("--grad-accum", "--offload-optimizer", "--ps-servers", "--async-sgd",
                     "--compress", "--powersgd-rank", "--topk-ratio", "--backup-workers",
                     "--straggler-delay"):
            assert flag in text, (cmd, flag)


def test_compare_applies_what_ifs_to_every_candidate(capsys):
    args = [
        "compare", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "64", "--seq-len",
        "4096", "--global-batch", "64", "--rerank", "0", "--network", "alpha-beta", "--json",
        "--top", "50"
    ]
    assert main(args + ["--compress", "powersgd", "--grad-accum", "2"]) == 0
    top = json.loads(capsys.readouterr().out)["top"]
    assert top and all(t["strategy"]["compress"] == "powersgd" and t["strategy"]["zero"] == 0
                       for t in top)
    assert all(t["micro_batches"] == 2 for t in top)
    assert main(args + ["--ps-servers", "4", "--zero", "1,3"]) == 2


def test_power_limit_scales_compute_by_the_cube_root_of_dynamic_power(capsys):
    from simpar.cost.compute import gemm_time, memory_bound_time
    from simpar.specs import GPUS
    from simpar.workload.layer import Gemm

    h100 = GPUS["h100-sxm"]
    capped = h100.power_limited(500)
    clock = ((500 - 70) / (700 - 70)) ** (1 / 3)  # a 70 W static floor of the 700 W board
    assert capped.gemm_efficiency == pytest.approx(675 / 989 * clock)
    g = Gemm("big", 8192, 8192, 8192)  # compute-bound: slower by the clock
    assert gemm_time(g, capped, "bf16") - 4e-6 == pytest.approx(
        (gemm_time(g, h100, "bf16") - 4e-6) / clock)
    # HBM keeps its rate
    assert memory_bound_time(1e9, capped, 1) == memory_bound_time(1e9, h100, 1)
    # FlashAttention-2's rate (35% of peak at full clock) falls with the clock too, not
    # only the best kernel's
    from simpar.cost.compute import flash_attention_time
    fa2_full, fa2_capped = (flash_attention_time(1e15, g, "bf16", "fa2") - 4e-6
                            for g in (h100, capped))
    assert fa2_capped == pytest.approx(fa2_full / clock, rel=1e-6)
    assert fa2_full == pytest.approx(1e15 / (989e12 * 0.35), rel=1e-6)
    base = [
        "simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096",
        "--global-batch", "8", "--engine", "analytic", "--json"
    ]
    assert main(base) == 0
    full = json.loads(capsys.readouterr().out)["step_time_s"]
    assert main(base + ["--power-limit-w", "500"]) == 0
    assert full < json.loads(capsys.readouterr().out)["step_time_s"] < full / clock
    assert main(base + ["--power-limit-w", "800"]) == 2
    assert "--power-limit-w" in capsys.readouterr().err


def test_bucket_size_sets_the_collective_count_in_both_engines():
    from simpar.sim.engine import SimOptions, simulate

    s = replace(BASE, zero=1)
    p = _params(s)
    # 25 buckets of Megatron-LM's 40M parameters
    assert _predict(s).breakdown["dp_comm"] == pytest.approx(
        _collective(s, "reducescatter", 2) + _collective(s, "allgather", 2))
    ddp = replace(s, bucket_mb=25)  # PyTorch DDP's 25 MiB: more collectives, more latency
    n = math.ceil(p * 2 / (25 * 2**20))
    net = _net(ddp)
    expected = bucketed(net, "reducescatter", p * 2, "dpcp", n) + bucketed(
        net, "allgather", p * 2, "dpcp", n)
    assert _predict(ddp).breakdown["dp_comm"] == pytest.approx(expected)
    assert expected > _predict(s).breakdown["dp_comm"]
    sims = [
        simulate(M, C, JOB, x, SimOptions(contention=False), network=AB).first.breakdown["dp_comm"]
        for x in (s, ddp)
    ]
    assert sims[1] > sims[0]  # the engine buckets the same way


def test_harmonic_numbers_past_the_summed_range_follow_the_series():
    """harmonic() summed n terms: 10^7 replicas cost seconds per priced candidate."""
    for n in (1001, 4096, 100_000):
        assert harmonic(n) == pytest.approx(math.fsum(1.0 / i for i in range(1, n + 1)), rel=1e-14)
    assert harmonic(10**12) == pytest.approx(math.log(10**12) + 0.5772156649015329, rel=1e-14)


def test_grace_blackwell_racks_offload_over_nvlink_c2c_into_grace_memory():
    """A GB200 NVL72 superchip's Grace sits on NVLink-C2C (225 GB/s per GPU per direction, not
    PCIe's 25) with 256 GB/s of LPDDR5X per GPU (not a DGX host's 50)."""
    rack, dgx = load_cluster("gb200-nvl72", None), load_cluster("dgx-b200", None)
    assert (rack.host_link_gbps, rack.host_memory_gbps) == (225, 256)
    assert (dgx.host_link_gbps, dgx.host_memory_gbps) == (25.0, 50.0)
    s = Strategy(dp=2, tp=8, sp=True, zero=1, offload_optimizer=True)
    on_rack, on_dgx = predict(M, rack, JOB, s), predict(M, dgx, JOB, s)
    params = _params(s) / 2  # ZeRO-1: each rank updates its half
    assert on_rack.breakdown["optimizer"] == pytest.approx(
        params * 6 / 225e9 + params * FUSED_ADAM_FP32_GRAD_BYTES / 256e9)
    assert on_rack.breakdown["optimizer"] < on_dgx.breakdown["optimizer"] / 5
