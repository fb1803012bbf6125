"""A CPU as the device (what `simpar calibrate` measures on gloo) and how predictions use it: each
collective kind's measured speed, DTensor's dispatch cost, FSDP2's copies at the
parameters' precision."""

from dataclasses import replace

import pytest

from simpar.cost.layer import head_cost, layer_cost
from simpar.cost.pricing import Pricing
from simpar.cost.step import fsdp_copy_seconds
from simpar.errors import SpecError
from simpar.memory.model import memory_breakdown
from simpar.network.model import AlphaBetaNetwork, FlowNetwork
from simpar.specs import JobSpec, ModelSpec, Strategy
from simpar.specs.cluster import ClusterSpec
from simpar.specs.stack import get_stack
from simpar.workload.layer import head_work, layer_work

LINK_GBPS, LATENCY_US = 1.0, 1000.0


def host_cluster(**extra) -> ClusterSpec:
    """Two processes on one host, as `simpar calibrate --device cpu` writes it."""
    gpu = {
        "name": "cpu-test", "fp32_tflops": 0.05, "tf32_tflops": 0.05, "bf16_tflops": 0.05,
        "fp8_tflops": 0.0, "hbm_gib": 8.0, "hbm_tbps": 0.01, "sm_count": 1, "gemm_efficiency": 1.0,
        "attention_efficiency": 0.5, "hbm_efficiency": 1.0, "kernel_overhead_us": 10.0,
        "overlap_slowdown": 1.0, "dtensor_op_us": 50.0, "arch": "cpu"
    }
    return ClusterSpec.from_dict({
        "name": "host", "gpu": gpu, "gpus_per_node": 2, "intra_node_bw_gbps": LINK_GBPS,
        "intra_node_latency_us": LATENCY_US, "nic_bw_gbps": LINK_GBPS,
        "inter_node_latency_us": LATENCY_US, "intra_node_efficiency": 1.0,
        "inter_node_efficiency": 1.0, "topology": {"kind": "local"}, **extra
    })


MODEL = ModelSpec(name="small", layers=4, hidden=512, heads=8, kv_heads=4, ffn_hidden=1536,
                  vocab=4096)


@pytest.mark.parametrize("network", [AlphaBetaNetwork, FlowNetwork])
def test_a_measured_collective_efficiency_slows_only_the_bandwidth_term(network):
    plain, slow = host_cluster(), host_cluster(collective_efficiency={"allgather": 0.25})
    s = Strategy(dp=2)
    fast_net, slow_net = network(plain, s), network(slow, s)
    size = 64e6
    t, t1 = fast_net.collective("allgather", size,
                                "dp"), fast_net.collective("allgather", 1.0, "dp")
    # the latency (a one-byte message) stays; the bandwidth part takes 1 / 0.25 = 4 times as long
    assert slow_net.collective("allgather", size, "dp") == pytest.approx(t1 + 4 * (t - t1))
    assert slow_net.collective("allgather", 1.0, "dp") == pytest.approx(t1)
    # a kind not measured apart runs at the ring model
    assert slow_net.collective("allreduce", size,
                               "dp") == fast_net.collective("allreduce", size, "dp")
    # two ranks: (n-1)/n of 64 MB over 1 GB/s is 32 ms of bandwidth term
    assert t - t1 == pytest.approx(0.032, rel=0.01)


@pytest.mark.parametrize("bad", [{"allgather": 0.0}, {"allgather": 1.5}, {"gather": 0.5}, [0.5]])
def test_a_bad_collective_efficiency_is_refused(bad):
    with pytest.raises(SpecError, match="collective_efficiency"):
        host_cluster(collective_efficiency=bad)


def test_dtensor_dispatch_adds_to_a_cpu_devices_tensor_parallel_layer():
    cluster = host_cluster()
    s = Strategy(tp=2, sp=True)
    net = AlphaBetaNetwork(cluster, s)
    work = layer_work(MODEL, 256, 1, 2, 1, 1, True, True, "fp32", "eager")
    torch_tp = get_stack("execpar")
    no_dtensor = replace(torch_tp, tp_dtensor=False)
    f, b = layer_cost(work, net, cluster.gpu, "fp32", "none", False, torch_tp)
    f0, b0 = layer_cost(work, net, cluster.gpu, "fp32", "none", False, no_dtensor)
    # every op of the block but the attention kernel
    ops = len(work.gemms) + work.elementwise_kernels
    assert ops == 4 + 36  # qkv, proj, mlp_up, mlp_down and eager PyTorch's 36 elementwise kernels
    assert f.compute_s - f0.compute_s == pytest.approx(ops * 50e-6)
    # backward dispatches twice as many
    assert b.compute_s - b0.compute_s == pytest.approx(2 * ops * 50e-6)
    # one rank (no DTensor) pays nothing
    solo = layer_work(MODEL, 256, 1, 1, 1, 1, False, True, "fp32", "eager")
    assert layer_cost(solo, net, cluster.gpu, "fp32", "none", False, torch_tp)[0] == \
        layer_cost(solo, net, cluster.gpu, "fp32", "none", False, no_dtensor)[0]


def test_a_compiled_block_pays_no_dtensor_dispatch():
    assert get_stack("torchtitan").dtensor_dispatch and not get_stack("torchtitan",
                                                                      compile=True).dtensor_dispatch
    assert not get_stack("megatron").dtensor_dispatch  # Megatron's own tensor-parallel layers


def test_fsdp_copies_move_the_parameters_precision():
    cluster = host_cluster()
    s = Strategy(dp=2, zero=3, stack="torchtitan")
    params = 1e6
    def copies(strategy, dtype="bf16"):
        return fsdp_copy_seconds(Pricing(None, cluster, JobSpec(256, 8, dtype), strategy, None),
                                 params, 0.0)
    bf16, fp32 = copies(s), copies(s, "fp32")
    # two gathers' copy-out (read + write each) plus the reduce's copy-in into the fp32 reduce
    # dtype: bf16: 2 x 2 x 2 + 2 + 4 = 14 bytes per parameter; fp32: 2 x 2 x 4 + 4 + 4 = 24
    assert bf16 == pytest.approx(14 * params / 0.01e12)
    assert fp32 == pytest.approx(24 * params / 0.01e12)
    # ZeRO-1 runs no FSDP, and Megatron's buffers are reduced in place
    assert copies(replace(s, zero=1)) == 0.0
    assert copies(replace(s, stack="megatron")) == 0.0
    # FSDP1 (mosaic: bf16 reduce) concatenates the flat gradient (2 + 2) and pre-divides it in
    # place (2 + 2): 8 bytes; reducing in fp32 it also casts it (2 + 4) and divides in fp32
    # (4 + 4): 18
    mosaic = replace(s, stack="mosaic")
    assert copies(mosaic) == pytest.approx(8 * params / 0.01e12)
    assert copies(replace(mosaic, grad_reduce="fp32")) == pytest.approx(18 * params / 0.01e12)


def test_torch_sequence_parallel_all_reduces_the_norm_gradients_in_every_backward():
    cluster = host_cluster()
    net = AlphaBetaNetwork(cluster, Strategy(tp=2, sp=True))
    work = layer_work(MODEL, 256, 1, 2, 1, 1, True, True, "fp32", "eager")
    torch_tp = get_stack("execpar")
    # Megatron sums them once per step, not per micro-batch
    own_layers = replace(torch_tp, tp_dtensor=False)
    f, b = layer_cost(work, net, cluster.gpu, "fp32", "none", False, torch_tp)
    f0, b0 = layer_cost(work, net, cluster.gpu, "fp32", "none", False, own_layers)
    # two RMSNorm weights of 512 fp32 values: one 4 KiB all-reduce, two 1 ms ring steps on two ranks
    assert b.tp_comm_s - b0.tp_comm_s == pytest.approx(2e-3 + 4096 / (LINK_GBPS * 1e9), rel=0.01)
    assert f.tp_comm_s == f0.tp_comm_s
    # without sequence parallelism the norms see every token on every rank: no partial gradients
    no_sp = layer_work(MODEL, 256, 1, 2, 1, 1, False, True, "fp32", "eager")
    assert no_sp.replicated_grad_bytes == 0


def test_without_loss_parallelism_the_logits_are_gathered_and_every_rank_takes_the_whole_loss():
    cluster = host_cluster()
    net = AlphaBetaNetwork(cluster, Strategy(tp=2))
    sharded = head_work(MODEL, 256, 1, 2, 1, False, "fp32", "chunked", True)
    gathered = head_work(MODEL, 256, 1, 2, 1, False, "fp32", "chunked", False)
    # the whole vocabulary, not half
    assert gathered.loss_bytes == tuple(2 * x for x in sharded.loss_bytes)
    fs, bs = head_cost(sharded, net, cluster.gpu, "fp32")
    fg, bg = head_cost(gathered, net, cluster.gpu, "fp32")
    # forward gathers 256 tokens x 4096 logits x 4 bytes = 4 MiB: half of it crosses the
    # link, 1 ms latency
    assert fg.tp_comm_s - fs.tp_comm_s == pytest.approx(1e-3 + 2**21 / (LINK_GBPS * 1e9), rel=0.01)
    assert bg.tp_comm_s == bs.tp_comm_s  # the gradient of a gather is a local slice
    # apply_tp's output layer returns Replicate logits
    assert not get_stack("execpar").loss_parallel
    assert get_stack("torchtitan").loss_parallel and get_stack("megatron").loss_parallel


def test_the_logits_memory_follows_the_loss_parallelism():
    job = JobSpec(seq_len=256, global_batch=8, dtype="fp32")
    execpar = memory_breakdown(MODEL, job, Strategy(tp=2, stack="execpar"))
    titan = memory_breakdown(MODEL, job, Strategy(tp=2, stack="torchtitan"))
    solo = memory_breakdown(MODEL, job, Strategy(stack="execpar"))
    # execpar's ranks each hold the whole vocabulary's logits and loss temporaries, as one rank does
    assert execpar.buffers_gib > titan.buffers_gib
    assert execpar.buffers_gib == pytest.approx(solo.buffers_gib, rel=0.05)
