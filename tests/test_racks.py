"""Rack-scale NVLink domains (GB200 / GB300 NVL72) and the Blackwell Ultra and MI355X
catalog entries."""

import json

import pytest

from simpar.cli.parser import main
from simpar.cost.compute import attention_softmax_factor
from simpar.network.algorithms import nvls
from simpar.network.model import AlphaBetaNetwork, FlowNetwork, ranks_per_domain
from simpar.specs import Strategy
from simpar.specs.cluster import dgx_like, load_cluster
from simpar.specs.gpu import GPUS


@pytest.mark.parametrize("name, bf16, fp8, fp4, hbm", [("gb200", 2500, 5000, 10000, 186),
                                                       ("gb300", 2500, 5000, 15000, 279),
                                                       ("b300", 2250, 4500, 14000, 270),
                                                       ("mi355x", 2516.6, 5033.2, 10066.3, 288)])
def test_the_catalog_has_the_2025_parts_with_dense_peaks(name, bf16, fp8, fp4, hbm):
    g = GPUS[name]
    assert (g.bf16_tflops, g.fp8_tflops, g.fp4_tflops, g.hbm_gib) == (bf16, fp8, fp4, hbm)
    assert g.peak_tflops("fp8") == 2 * g.peak_tflops("bf16")  # every one doubles its rate at fp8


@pytest.mark.parametrize("name, watts, sms", [("gb200", 1200, 148), ("gb300", 1400, 160),
                                              ("b300", 1100, 160)])
def test_unmeasured_blackwell_parts_sustain_b200s_rates_at_their_power_budgets_clock(name, watts,
                                                                                     sms):
    """B200 sustains 0.57 x 4,500 fp8 and 0.67 x 2,250 bf16 TFLOP/s at 1000 W on 148 SMs. A part
    with W watts on S SMs gives each SM (W - 100) / S watts of dynamic power (100 W static floor),
    so each runs at a clock ((W - 100) / S / (900 / 148))^(1/3) of B200's, and the part at S / 148
    times that: GB300 x1.1907, B300 x1.0909. GB200, B200's die on 1200 W, would be x1.0692 (not
    the x1.111 of its datasheet peaks), but ran as fast as B200 on one recipe (1.01-1.03x), and
    GB300 1.15-1.17x GB200 on identical MLPerf ones: it keeps B200's rates. Blackwell Ultra
    (GB300, B300) computes exponentials twice as fast: its attention at head dim 128, half
    softmax on B200, runs a forward 2 / 1.5 times faster again, a backward 1.4 / 1.2."""
    g = GPUS[name]
    law = sms / 148 * ((watts - 100) / sms / (900 / 148)) ** (1 / 3)
    rate = 1.0 if name == "gb200" else law
    assert g.fp8_gemm_efficiency * g.fp8_tflops == pytest.approx(0.57 * 4500 * rate)
    assert g.gemm_efficiency * g.bf16_tflops == pytest.approx(0.67 * 2250 * rate)
    assert g.attention_efficiency * g.bf16_tflops == pytest.approx(0.50 * 2250 * rate)
    ultra = name != "gb200"
    assert attention_softmax_factor(g, (128, 128), False) == pytest.approx(1.5 / 2 if ultra else 1)
    assert attention_softmax_factor(g, (128, 128), True) == pytest.approx(1.2 / 1.4 if ultra else 1)
    assert law == pytest.approx({"gb200": 1.0692, "gb300": 1.1907, "b300": 1.0909}[name],
                                abs=1e-4)


@pytest.mark.parametrize("name", ["b200", "gb200", "gb300", "b300", "mi355x"])
def test_an_fp4_gemm_sustains_at_most_twice_an_fp8_one(name):
    """B200 and GB200 rate fp4 at twice fp8 (9,000 / 4,500; 10,000 / 5,000), as does MI355X; GB300
    and B300 rate it at three times (15,000 / 5,000; 14,000 / 4,500), which the power cap does not
    sustain: their fp4 GEMMs run at twice their fp8 rate too, less the block scales
    (BLOCK_SCALED_GEMM_FRACTION)."""
    g = GPUS[name]
    fp8 = g.gemm_fraction("fp8") * g.fp8_tflops
    # twice fp8's rate, block-scaled: Transformer Engine's B300 NVFP4 GEMMs ran 3.55x bf16 where
    # per-tensor fp8 ran 1.94x (1.83x fp8)
    assert g.gemm_fraction("nvfp4") * g.fp4_tflops == pytest.approx(1.8 * fp8, rel=1e-4)


def test_gpus_json_lists_them(capsys):
    assert main(["gpus", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {"gb200", "gb300", "b300", "mi355x"} <= set(listed)


@pytest.mark.parametrize("name, gpu, nic_gbps", [("gb200-nvl72", "gb200", 50),
                                                 ("gb300-nvl72", "gb300", 100)])
def test_an_nvl72_rack_is_one_nvlink_domain_of_72(name, gpu, nic_gbps):
    c = load_cluster(name, None)
    assert (c.gpu.name, c.gpus_per_node, c.intra_node_bw_gbps, c.nic_bw_gbps) == (gpu, 72, 900,
                                                                                  nic_gbps)
    alone = dgx_like(gpu)  # --gpu gb200 alone means the same rack
    assert (alone.name, alone.gpus_per_node) == (name, 72)
    assert dgx_like("b300").gpus_per_node == 8  # HGX B300 is an 8-GPU node


def test_tensor_parallel_of_72_stays_in_the_rack():
    rack, nodes = load_cluster("gb200-nvl72", None), dgx_like("b200")
    s = Strategy(dp=2, tp=72)
    assert not AlphaBetaNetwork(rack, s).spans["tp"].crosses_nodes
    assert AlphaBetaNetwork(nodes, s).spans["tp"].crosses_nodes
    size = 1e9
    # inside the rack: a ring of 72 at 80% of 900 GB/s, 71 steps of 2 us; across nine
    # 8-GPU nodes the gather also crosses the NICs
    in_rack = AlphaBetaNetwork(rack, s).collective("allgather", size, "tp")
    assert in_rack == pytest.approx(71 / 72 * size / (0.8 * 900e9) + 71 * 2e-6, rel=0.01)
    assert in_rack < 0.6 * AlphaBetaNetwork(nodes, s).collective("allgather", size, "tp")
    # NVLink SHARP reduces in the rack's switch trays
    assert nvls("allreduce", list(range(72)), lambda r: r // 72, gpu="gb200") is not None
    assert nvls("allreduce", list(range(144)), lambda r: r // 72, gpu="gb200") is None


@pytest.mark.parametrize("tp, cp, ep, per", [(1, 1, 64, 64), (8, 1, 1, 72), (16, 1, 1, 64),
                                             (4, 2, 8, 64), (1, 1, 128, 72), (1, 1, 1, 72)])
def test_ranks_per_rack_keep_whole_groups(tp, cp, ep, per):
    s = Strategy(dp=128 // cp if ep > 1 else 2, tp=tp, cp=cp, ep=ep)
    assert ranks_per_domain(72, s) == per
    assert ranks_per_domain(8, Strategy(dp=16, tp=8)) == 8
    # 24 GPUs fill three nodes: nothing to leave idle
    assert ranks_per_domain(8, Strategy(dp=24, ep=3)) == 8


def test_expert_groups_of_64_do_not_straddle_racks():
    """256 GPUs on 72-GPU racks: rank 64-127 used to share racks 0 and 1; packed 64 a rack,
    each expert group's all-to-all stays on NVLink and costs what one rack's does."""
    rack = load_cluster("gb300-nvl72", None)
    four, one = Strategy(dp=64, pp=4, ep=64), Strategy(dp=64, ep=64)
    net = FlowNetwork(rack, four)
    assert all(len({r // 72 for r in g}) == 1 for g in net.gpu_groups("ep"))
    size = 4e8
    assert net.collective("alltoall", size, "ep") == pytest.approx(
        FlowNetwork(rack, one).collective("alltoall", size, "ep"), rel=1e-6)
    # the pipeline's stages sit in different racks: their sends cross the scale-out fabric
    assert all(len({r // 72 for r in g}) == 4 for g in net.gpu_groups("pp"))


def test_simulate_and_topo_show_on_racks(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = [
        "simulate", "--cluster", "gb200-nvl72", "--gpus", "256", "--model", "llama3.1-405b",
        "--seq-len", "8192", "--global-batch", "256", "--dtype", "fp8", "--tp", "8", "--pp", "8",
        "--json"
    ]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["fits_memory"]
    assert main([
        "simulate", "--cluster", "gb300-nvl72", "--gpus", "256", "--model", "deepseek-v3",
        "--seq-len", "4096", "--global-batch", "1024", "--dtype", "fp8", "--pp", "4", "--ep", "64",
        "--recompute", "full", "--json"
    ]) == 0
    assert json.loads(capsys.readouterr().out)["breakdown"]["ep_comm"] > 0
    assert main(["topo", "show", "gb200-nvl72", "--gpus", "144", "--json", "--no-png"]) == 0
    info = json.loads(capsys.readouterr().out)
    # two racks' switch trays
    assert info["nodes_by_kind"]["gpu"] == 144 and info["nodes_by_kind"]["hub"] == 2


def test_offloaded_activations_free_gpu_memory_and_cost_the_host_link_beyond_compute():
    """--offload-activations N: N layers of each chunk keep their saved activations in host memory
    (two in flight stay on the GPU), each going down in forward and up in backward beside the
    layer's compute. Grace's NVLink-C2C (225 GB/s per GPU) hides what PCIe (25 GB/s) cannot."""
    from dataclasses import replace

    from simpar.cost.step import predict
    from simpar.memory.model import memory_breakdown, saved_activation_bytes
    from simpar.specs import MODELS, JobSpec

    model, job = MODELS["llama3-70b"], JobSpec(8192, 128)
    s = Strategy(dp=64, zero=3, micro_batch=2, stack="nemo")
    off = replace(s, offload_activations=40)
    layer = saved_activation_bytes(model, job, s)
    saved = memory_breakdown(model, job, s).activations_gib - memory_breakdown(
        model, job, off).activations_gib
    assert saved * 2**30 == pytest.approx((40 - 2) * layer)
    rack, pcie = load_cluster("gb200-nvl72", None), dgx_like("b200")
    assert (rack.host_link_gbps, pcie.host_link_gbps) == (225, 25)
    # 40 layers down and up, per micro-batch, at 25 GB/s: far beyond a layer's compute on PCIe
    extra = {c.name: predict(model, c, job, off, check=False).step_time_s
             - predict(model, c, job, s, check=False).step_time_s for c in (rack, pcie)}
    m = job.global_batch // (s.dp * s.micro_batch)
    assert extra[pcie.name] > 0.5 * m * 40 * 2 * layer / 25e9
    assert 0 <= extra[rack.name] < 0.2 * extra[pcie.name]
