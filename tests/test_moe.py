"""Mixture-of-experts layers as each stack runs them: the experts' GEMMs grouped, on parallel
streams or one by one, the routing's memory-bound gathers, and the experts' 16-bit copies
execpar keeps for the step; then the H200 measurements that checked them
(reports/grouped-gemm-h200, reports/gpu-validation-h200-moe)."""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from simpar.cost.compute import gemm_time
from simpar.memory.model import memory_breakdown
from simpar.specs import JobSpec, Strategy, dgx_like
from simpar.specs.loaders import load_model
from simpar.specs.stack import get_stack
from simpar.workload.layer import Gemm, layer_work

ROOT = Path(__file__).parents[1]
Q30 = load_model(str(ROOT / "benchmarks" / "data" / "h100_execpar" / "mq30a3b4l.yaml"))
H200 = dgx_like("h200").gpu
GIB = 2**30


def test_a_grouped_kernel_fills_the_sms_with_every_experts_tiles():
    """128 experts' up projections, 512 rows x 768 x 2048 each, on an H200 (132 SMs, 128 x 128
    tiles): 4 x 6 = 24 tiles an expert. One by one, each GEMM is one wave of 24 tiles on 132 SMs
    (18% busy); on Transformer Engine's four streams 96 tiles share a wave (73%); grouped, all
    3,072 tiles run in 24 waves (3,168 slots, 97%)."""
    one = Gemm("up", 512, 768, 2048, 128)
    flops = 2 * 512 * 768 * 2048 * 128
    steady = H200.peak_tflops("bf16") * 1e12 * H200.gemm_fraction("bf16") * 2048 / (2048 + 128)
    launch = H200.kernel_overhead_us * 1e-6
    assert gemm_time(one, H200, "bf16") == pytest.approx(
        flops / (steady * 24 / 132) + 128 * launch, rel=1e-9)
    assert gemm_time(replace(one, together=4), H200, "bf16") == pytest.approx(
        flops / (steady * 96 / 132) + 32 * launch, rel=1e-9)
    assert gemm_time(replace(one, together=128), H200, "bf16") == pytest.approx(
        flops / (steady * 3072 / 3168) + launch, rel=1e-9)


@pytest.mark.parametrize("stack, together", [("execpar", 128), ("torchtitan", 128),
                                             ("megatron", 4), ("nemo", 4), ("deepspeed", 1),
                                             ("fsdp", 1)])
def test_each_stack_runs_its_expert_gemms_as_its_code_does(stack, together):
    """torch._grouped_mm (execpar, torchtitan), TE's GroupedLinear over its four compute
    streams (Megatron, NeMo), a Python loop over experts (DeepSpeed, Hugging Face)."""
    from simpar.cost.layer import stack_layer_work

    work = stack_layer_work(Q30, 4096, 2, 1, 1, 1, False, True, "bf16", "fused",
                            get_stack(stack))
    experts = [g for g in work.gemms if g.name in ("mlp_up", "mlp_down")]
    assert [(g.count, g.together) for g in experts] == [(128, together)] * 2


def test_routing_moves_each_tokens_vector_to_its_experts_and_back():
    """Per routed element (token x choice x hidden), forward: eager 28 bytes (gather 4 + 4 from
    the fp32 residual stream, cast 4 + 2, gather back 2 + 2, weight 2 + 4, sum 4), fused 6 (TE's
    permute 2 + 2, unpermute 2); a layer of 8,192 tokens, top-8 of hidden 2048 routes 134M."""
    dense = replace(Q30, experts=1, experts_per_token=1, ffn_hidden=Q30.ffn_hidden * 8)
    for kernels, per_element in (("eager", 28), ("fused", 6)):
        moe = layer_work(Q30, 4096, 2, 1, 1, 1, False, True, "bf16", kernels)
        base = layer_work(dense, 4096, 2, 1, 1, 1, False, True, "bf16", kernels)
        assert moe.elementwise_bytes - base.elementwise_bytes == 8192 * 8 * 2048 * per_element


def test_execpar_keeps_its_experts_copies_to_the_end_of_backward():
    """One micro-batch of four Qwen3-30B-A3B layers without recompute: at the end of backward
    execpar holds every fp32 gradient beside the experts' 16-bit copies (4 layers x 128 x 3 x
    2048 x 768 weights, 2 bytes each): at micro-batches 1 and 2 its peak; at 3 the activations of
    backward (each token's eight routed copies among them) rise above it. torchtitan casts its
    experts per call, so its peak is never there."""
    params = Q30.total_params
    copies = 4 * 128 * 3 * 2048 * 768 * 2
    one = memory_breakdown(Q30, JobSpec(4096, 1), Strategy(micro_batch=1, stack="execpar"))
    assert one.peak_phase == "backward end"
    assert one.buffers_gib * GIB == pytest.approx(copies, rel=1e-9)
    assert one.peak_allocated_gib * GIB == pytest.approx(16 * params + copies, rel=1e-9)
    two = memory_breakdown(Q30, JobSpec(4096, 2), Strategy(micro_batch=2, stack="execpar"))
    assert two.peak_phase == "backward end"
    three = memory_breakdown(Q30, JobSpec(4096, 3), Strategy(micro_batch=3, stack="execpar"))
    assert three.peak_phase == "backward"
    assert three.peak_allocated_gib > one.peak_allocated_gib
    other = memory_breakdown(Q30, JobSpec(4096, 2),
                             Strategy(micro_batch=2, stack="torchtitan", zero=0))
    assert other.peak_phase != "backward end"


def test_each_routed_copy_of_a_token_is_kept_and_cast():
    """A routed expert's GEMM takes the token copy dispatched to it: its input, one of
    experts_per_token copies, is what the GEMM keeps for backward and what a quantized recipe
    casts. By hand, a Qwen3-30B-A3B layer (h 2048, q 4096, k and v 512 each, 8 of 128 experts of
    width 768) in bf16 without recompute keeps per token: the two norms' inputs 2 x 2 x 2048, the
    QKV input 2 x 2048, the router's input 2 x 2048, the routed copies 8 x 2 x 2048, Q, K, V and
    the attention output 2 x (4096 + 1024) + 2 x 4096 with 32 fp32 log-sum-exps, and the experts'
    up outputs and down inputs (2 x 2 + 2) x 8 x 768 = 104,576 bytes; with the experts folded at
    tp 2 each rank takes half the tokens' copies. In MXFP8 (1 + 1/32 bytes an element, two copies
    read from 16 bits: 4.0625 bytes) a micro-batch of 4,096 tokens casts 2048 + 4096 + 8 x 2048 +
    8 x 768 elements a token (the router's GEMM stays 16-bit): 3.2x what one copy a token
    would cast."""
    from simpar.memory.model import SavedCode, activation_bytes_per_token

    kept = activation_bytes_per_token(Q30, 4096, 1, False, "none", True, "bf16")
    assert kept == 8192 + 4096 + 4096 + 32768 + (10240 + 8192 + 128) + 36864
    folded = activation_bytes_per_token(Q30, 4096, 2, True, "none", True, "bf16",
                                        code=SavedCode(folds_experts=True))
    whole = activation_bytes_per_token(Q30, 4096, 2, True, "none", True, "bf16")
    assert whole - folded == 32768 / 2
    work = layer_work(Q30, 4096, 1, 1, 1, 8, False, True, "mxfp8")
    per_token = 2048 + 4096 + 8 * 2048 + 8 * 768
    assert work.fused_cast_bytes == pytest.approx(4096 * 4.0625 * per_token, rel=1e-9)


def test_grouped_pricing_matches_the_grouped_kernel_measured_on_an_h200():
    """torch._grouped_mm on an H200 (reports/grouped-gemm-h200), six published models' expert
    FFNs: priced grouped, each forward GEMM within 20% of its measured time; priced one by one
    (as before), the 128 small experts of Qwen3-30B-A3B came out 2.9-5.8x slow."""
    data = json.loads((ROOT / "reports" / "grouped-gemm-h200" / "grouped_gemm.json").read_text())
    for r in data["shapes"]:
        e, per = r["experts"], r["rows"] // r["experts"]
        for name, n, k in (("up", r["ffn"], r["hidden"]), ("down", r["hidden"], r["ffn"])):
            grouped = gemm_time(Gemm(name, per, n, k, e, e), H200, "bf16")
            assert abs(grouped / r[f"{name}_s"] - 1) < 0.20, (r["id"], name)
        assert r["output_rel_error"] < 1e-2 and r["grad_rel_error"] < 1e-2
    small = data["shapes"][0]
    assert small["experts"] == 128
    alone = gemm_time(Gemm("up", 512, 768, 2048, 128), H200, "bf16")
    assert alone / small["up_s"] > 2.5


def test_explain_says_how_the_experts_gemms_run():
    """--explain's shape column: the experts' count and how many of them run at once."""
    from simpar.cost.layer import layer_kernels, stack_layer_work

    shapes = {}
    for stack in ("execpar", "megatron", "deepspeed"):
        prof = get_stack(stack)
        work = stack_layer_work(Q30, 4096, 2, 1, 1, 1, False, True, "bf16", "fused", prof)
        shapes[stack] = {k.name: k.detail for k in layer_kernels(work, H200, "bf16", prof)}
    assert shapes["execpar"]["mlp_down"] == "512x2048x768 x128 grouped"
    assert shapes["megatron"]["mlp_down"] == "512x2048x768 x128 4 at once"
    assert shapes["deepspeed"]["mlp_down"] == "512x2048x768 x128 one by one"
    assert shapes["execpar"]["qkv"] == "8192x5120x2048"


def test_each_unpaired_expert_gemm_is_a_launch_of_its_own():
    """Transformer Engine's GroupedLinear calls cuBLAS once per expert (4 at a time), so the host
    launches 16 kernels for 16 local experts' up projection; a grouped kernel is one launch."""
    one_by_one = Gemm("mlp_up", 2048, 1536, 2048, 16, 4)
    assert one_by_one.kernels == 16
    assert replace(one_by_one, together=16).kernels == 1
    assert Gemm("qkv", 2048, 5120, 2048).kernels == 1


def _ep_run(capsys, *extra):
    """Qwen3-30B-A3B's shapes, four layers, on 8 H100s with experts over all 8 (--json)."""
    from simpar.cli.parser import main
    model = str(ROOT / "benchmarks" / "data" / "h100_execpar" / "mq30a3b4l.yaml")
    args = ["simulate", "--model", model, "--gpu", "h100-sxm", "--gpus", "8", "--ep", "8",
            "--seq-len", "4096", "--global-batch", "32", "--micro-batch", "1", "--stack", "nemo",
            "--json", *extra]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("engine", ["analytic", "event"])
def test_megatrons_combined_1f1b_hides_the_all_to_alls_of_all_but_the_first_and_last_pass(
        capsys, engine):
    """--overlap-ep-comm: of 4 micro-batches a rank, the first forward and the last backward run
    alone; the other forwards each run beside the previous micro-batch's backward, where the
    all-to-alls (here shorter than the compute beside them) cost only the overlap slowdown the
    compute suffers (0.2 of their time on an H100): the exposed all-to-all time falls to
    1/4 + 3/4 x 0.2 = 0.4 of what it was."""
    off = _ep_run(capsys, "--engine", engine)["breakdown"]
    on = _ep_run(capsys, "--engine", engine, "--overlap-ep-comm")["breakdown"]
    assert off["ep_comm"] > 0
    slowdown = dgx_like("h100-sxm").gpu.overlap_slowdown
    assert slowdown == 0.2
    assert on["ep_comm"] == pytest.approx(off["ep_comm"] * (1 / 4 + 3 / 4 * slowdown), rel=1e-6)
    assert on["forward_compute"] == pytest.approx(off["forward_compute"], rel=1e-9)


def test_the_combined_1f1b_pairs_what_megatron_pairs():
    """Without pipelining: F0, then F1 beside B0, F2 beside B1, F3 beside B2, then B3 alone; under
    the interleaved schedule each forward after a backward, and the analytic share counts the
    same pairs as the event engine's orders."""
    from simpar.sim import schedules
    from simpar.specs.schedule import get_schedule
    order = schedules.build(get_schedule("1f1b"), 1, 4, paired=True).orders[0]
    assert [(op.kind, op.mb, op.b_mb) for op in order] == [
        ("F", 0, -1), ("FB", 1, 0), ("FB", 2, 1), ("FB", 3, 2), ("B", 3, -1)]
    assert Strategy(dp=8, ep=8, stack="nemo", overlap_ep_comm=True).paired_share(4) == 0.75
    s = Strategy(dp=8, pp=2, vpp=2, ep=8, schedule="interleaved", stack="nemo",
                 overlap_ep_comm=True)
    sched = schedules.build(get_schedule("interleaved"), 2, 4, 2, paired=True)
    pairs = sum(op.kind == "FB" for order in sched.orders for op in order)
    assert s.paired_share(4) == pytest.approx(pairs / (2 * 4 * 2)) == 0.5


def test_a_what_if_schedule_without_a_combined_form_says_it_plays_the_all_to_alls_unpaired(
        capsys):
    """--sim-schedule plays another schedule in the event engine; Megatron's combined 1F1B has
    no zero-bubble form, so a zero-bubble what-if runs the all-to-alls unpaired and says so,
    where DualPipeV pairs its own passes."""
    args = ["--pp", "2", "--dp", "4", "--ep", "4", "--schedule", "interleaved", "--vpp", "2",
            "--overlap-ep-comm"]
    said = {sch: _ep_run(capsys, *args, "--sim-schedule", sch)["simulation"]["schedule"]
            for sch in ("interleaved", "zb-h1", "gpipe", "dualpipev")}
    assert said["interleaved"] == "interleaved" and said["dualpipev"] == "dualpipev"
    assert said["zb-h1"].startswith("zb-h1 (all-to-alls unpaired")
    assert said["gpipe"].startswith("gpipe (all-to-alls unpaired")


@pytest.mark.parametrize("fields, says", [
    ({"stack": "torchtitan"}, "combined 1F1B"),
    ({"ep": 1}, "--ep > 1"),
    ({"recompute": "full"}, "full recompute"),
    ({"pp": 2, "dp": 4}, "--schedule interleaved"),
    # an unknown schedule is named as such, before the overlap asks what it is
    ({"pp": 2, "dp": 4, "schedule": "zigzag"}, "schedule='zigzag'"),
])
def test_overlap_ep_comm_is_refused_where_megatron_refuses_it(fields, says):
    from simpar.errors import SpecError
    base = {"dp": 8, "ep": 8, "stack": "nemo", "overlap_ep_comm": True}
    with pytest.raises(SpecError, match=says):
        Strategy(**{**base, **fields})


def test_compare_runs_the_combined_1f1b_on_the_candidates_that_can_run_it(capsys):
    from simpar.cli.parser import main
    args = ["compare", "--model", "mixtral-8x7b", "--gpu", "h100-sxm", "--gpus", "64",
            "--seq-len", "4096", "--global-batch", "256", "--stack", "nemo", "--top", "5", "--json"]
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)["top"]
    assert main(args + ["--overlap-ep-comm"]) == 0
    paired = json.loads(capsys.readouterr().out)["top"]
    assert not any(r["strategy"]["overlap_ep_comm"] for r in plain)
    assert paired[0]["tokens_per_s"] > plain[0]["tokens_per_s"]
    for r in paired:
        s = r["strategy"]
        runs = s["ep"] > 1 and s["recompute"] != "full" and (
            s["pp"] == 1 or s["schedule"] == "interleaved")
        assert s["overlap_ep_comm"] == runs
    assert main(args[:-5] + ["--stack", "torchtitan", "--overlap-ep-comm"]) == 2
    assert "no combined 1F1B" in capsys.readouterr().err


def test_simulate_says_whether_the_all_to_alls_hide_where_the_stack_can_hide_them(capsys):
    from simpar.cli.parser import main
    model = str(ROOT / "benchmarks" / "data" / "h100_execpar" / "mq30a3b4l.yaml")
    args = ["simulate", "--model", model, "--gpu", "h100-sxm", "--gpus", "8", "--ep", "8",
            "--seq-len", "4096", "--global-batch", "32", "--engine", "analytic"]
    def experts_line() -> str:
        return next(line for line in capsys.readouterr().out.splitlines()
                    if line.startswith("experts:"))
    assert main(args + ["--stack", "nemo"]) == 0
    assert "once per expert), exposed" in experts_line()
    assert main(args + ["--stack", "nemo", "--overlap-ep-comm"]) == 0
    assert "expert) beside another micro-batch's compute" in experts_line()
    assert main(args + ["--stack", "torchtitan"]) == 0
    line = experts_line()
    assert "send a token once per expert" in line and "exposed" not in line


def test_op_level_recompute_keeps_no_routed_expert_output():
    """torchtitan's op SAC counts aten.mm only: of a MoE layer wq, wk, wv, wo and the router it
    keeps wq, wv and the router (1st, 3rd, 5th); every grouped expert GEMM runs again. Per token
    (bf16, tp 1): input 2*256, wq 2*256, wv 2*128, router 2*8, attention output 2*256 and 4 bytes
    of log-sum-exp per head; torchtitan under ep also keeps both all-to-alls' 4 copies of 256."""
    from simpar.memory.model import SavedCode, activation_bytes_per_token
    from simpar.specs.model import ModelSpec
    from simpar.workload.layer import op_kept, op_recomputed

    m = ModelSpec(name="m", layers=2, hidden=256, heads=4, kv_heads=2, ffn_hidden=128, vocab=100,
                  experts=8, experts_per_token=4)
    assert op_kept(m) == (True, False, True, False, False, False, False)
    assert [g.name for g in op_recomputed(m, 64, 1, 1)] == ["wk", "wo", "w1", "w3", "w2"]
    plain = 512 + 512 + 256 + 16 + 512 + 16
    assert activation_bytes_per_token(m, 64, 1, False, "op", True, "bf16") == plain
    assert activation_bytes_per_token(m, 64, 1, False, "op", True, "bf16",
                                      code=SavedCode(keeps_dispatched=True)) == \
        plain + 2 * 2 * 4 * 256


def test_op_level_recompute_sends_the_all_to_alls_again_where_the_policy_drops_them(capsys):
    """execpar's op policy keeps matmuls and attention only, so its recompute runs each layer's
    dispatch and combine again: the forward's all-to-alls once more beside the forward's and the
    backward's, 3 passes of them for 2; torchtitan keeps their outputs and sends nothing more."""
    def ep_comm(stack, recompute):
        return _ep_run(capsys, "--stack", stack, "--recompute", recompute)["breakdown"]["ep_comm"]

    assert ep_comm("execpar", "op") == pytest.approx(1.5 * ep_comm("execpar", "none"), rel=1e-6)
    assert ep_comm("torchtitan", "op") == pytest.approx(ep_comm("torchtitan", "none"), rel=1e-9)


def test_a_flex_dispatch_sends_a_token_once_per_rank_or_domain_its_experts_sit_on():
    """DeepEP and HybridEP (Megatron core's flex dispatcher) send a token once per rank holding
    one of its experts inside the NVLink domain, once per domain across domains; the alltoall
    dispatcher once per expert. Balanced top-8 routing over 128 experts: on 8 ranks of 16
    experts, a rank misses all 8 picks with probability (112/128)(111/127)...(105/121) = 0.3326,
    so 8 x 0.6674 = 5.34 ranks are hit; on 16 ranks over two 8-GPU nodes, a node of 64 experts
    is missed with probability (64/128)...(57/121) = 0.0031, so 1.994 domains. With one expert
    per rank and top-8 of 8, every rank is hit: as many copies as the alltoall dispatcher's."""
    from simpar.network.collectives import dispatch_copies
    from simpar.network.placement import GroupSpan
    assert dispatch_copies(GroupSpan(8, 8, 1), 128, 8) == pytest.approx(5.339, abs=1e-3)
    assert dispatch_copies(GroupSpan(16, 8, 2), 128, 8) == pytest.approx(1.994, abs=1e-3)
    assert dispatch_copies(GroupSpan(8, 8, 1), 8, 8) == pytest.approx(8.0)
    assert dispatch_copies(GroupSpan(1, 1, 1), 128, 8) == 0.0


def test_a_flex_dispatch_inside_a_blackwell_nvlink_domain_runs_at_hybridep_s_measured_rate():
    """HybridEP on GB200 (DeepEP's Hybrid-EP_Implementation.md, 32 SMs, the whole torch call):
    BF16 dispatch 484.22 and combine 464.54 GB/s at 32 ranks, 545.71 and 568.94 at 8. A flex
    dispatch of 400 MB a rank among 32 ranks of a GB200 rack takes 400e6 / 474.38e9 s; 24 ranks
    fall between the table's rows, 64 take its last (36 ranks); across racks, on Hopper and under
    the alltoall dispatcher the network model prices it as before."""
    from simpar.cost.layer import _comm_times
    from simpar.network.collectives import dispatch_copies, hybridep_seconds
    from simpar.network.model import network_for
    from simpar.specs import load_cluster
    from simpar.workload.layer import Comm

    assert hybridep_seconds(400e6, 32) == pytest.approx(400e6 / ((484.22 + 464.54) / 2 * 1e9),
                                                         rel=1e-4)
    assert hybridep_seconds(400e6, 8) == pytest.approx(400e6 / ((545.71 + 568.94) / 2 * 1e9),
                                                        rel=1e-4)
    assert hybridep_seconds(1, 8) < hybridep_seconds(1, 24) < hybridep_seconds(1, 32)
    assert hybridep_seconds(1, 64) == hybridep_seconds(1, 36)
    nemo = get_stack("nemo")
    c = Comm("alltoall", "ep", 8 * 4096 * 7168 * 2, 1, experts=256, top_k=8)

    def ep_seconds(cluster, gpu, ep, stack=nemo):
        net = network_for(load_cluster(cluster, gpu), Strategy(dp=ep, ep=ep))
        work = layer_work(Q30, 4096, 1, 1, 1, ep, False, True, "bf16")
        return _comm_times(replace(work, comms=(c,)), net, (c,), stack)[1], net

    rack, net = ep_seconds("gb200-nvl72", None, 32)
    moved = c.size_bytes / 8 * dispatch_copies(net.spans["ep"], 256, 8)
    assert rack == pytest.approx(hybridep_seconds(moved, 32))
    hopper, net = ep_seconds("dgx-h100", None, 8)
    moved = c.size_bytes / 8 * dispatch_copies(net.spans["ep"], 256, 8)
    assert hopper == pytest.approx(net.collective("alltoall", moved, "ep"))
    plain, net = ep_seconds("gb200-nvl72", None, 32, nemo.with_moe_dispatch("alltoall"))
    assert plain == pytest.approx(net.collective("alltoall", c.size_bytes, "ep"))


def test_group_limited_routing_sends_a_token_to_fewer_nodes():
    """DeepSeek-V3 picks a token's 8 experts from 4 of its 8 expert groups. At ep 64 over eight
    8-GPU nodes a group is a node's experts: 4 nodes are hit, where 8 free picks of 256 hit 5.29.
    At ep 32 over four nodes a node holds two groups and is missed when neither is chosen,
    C(6,4) / C(8,4) = 15/70: 4 x 55/70 = 3.14 nodes (3.61 free). Inside one NVLink domain of 64
    ranks the picks fall on the 4 x 8 ranks of the chosen groups: 32 x (1 - (124/128)...(117/121))
    = 7.36 ranks (7.68 free). Groups that do not nest with the nodes are priced as free picks."""
    from simpar.network.collectives import dispatch_copies
    from simpar.network.placement import GroupSpan
    v3 = (256, 8, 8, 4)
    assert dispatch_copies(GroupSpan(64, 8, 8), *v3) == pytest.approx(4.0)
    assert dispatch_copies(GroupSpan(64, 8, 8), 256, 8) == pytest.approx(5.29, abs=0.01)
    assert dispatch_copies(GroupSpan(32, 8, 4), *v3) == pytest.approx(4 * 55 / 70)
    assert dispatch_copies(GroupSpan(32, 8, 4), 256, 8) == pytest.approx(3.61, abs=0.01)
    miss = math.prod((124 - i) / (128 - i) for i in range(8))
    assert dispatch_copies(GroupSpan(64, 64, 1), *v3) == pytest.approx(32 * (1 - miss))
    assert dispatch_copies(GroupSpan(48, 8, 6), *v3) == dispatch_copies(GroupSpan(48, 8, 6),
                                                                        256, 8)


def test_deepseek_configs_limit_the_groups_and_it_shortens_cross_node_dispatch(tmp_path, capsys):
    """n_group and topk_group of a DeepSeek config.json; DeepSeek-V3 at ep 32 over four H100
    nodes (flex dispatch) spends less on its all-to-alls than with free routing."""
    from simpar.cli.parser import main
    cfg = {"model_type": "deepseek_v3", "num_hidden_layers": 4, "hidden_size": 256,
           "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 512,
           "moe_intermediate_size": 64, "vocab_size": 1024, "n_routed_experts": 64,
           "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "hidden_act": "silu"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = load_model(str(path))
    assert (m.expert_groups, m.groups_per_token) == (8, 4)
    free = tmp_path / "free.yaml"
    free.write_text(yaml.safe_dump({**load_model("deepseek-v3").to_dict(), "expert_groups": 0,
                                    "groups_per_token": 0}))
    ep = {}
    for model in ("deepseek-v3", str(free)):
        assert main(["simulate", "--model", model, "--gpu", "h100-sxm", "--gpus", "256", "--ep",
                     "32", "--pp", "8", "--seq-len", "4096", "--global-batch", "256", "--dtype",
                     "fp8", "--stack", "nemo", "--engine", "analytic", "--json"]) == 0
        ep[model] = json.loads(capsys.readouterr().out)["breakdown"]["ep_comm"]
    assert ep["deepseek-v3"] < 0.95 * ep[str(free)]


def test_nemo_dispatches_flex_and_the_flag_says_otherwise(capsys):
    """Across two H100 nodes (ep 16) the flex dispatch sends each token about twice where the
    alltoall dispatcher sends it eight times, half of them over InfiniBand: the same layer's
    all-to-alls take about a quarter as long. --moe-dispatch picks either under any stack."""
    from simpar.cli.parser import main
    args = ["simulate", "--model", "qwen3-30b-a3b", "--gpu", "h100-sxm", "--gpus", "16", "--ep",
            "16", "--seq-len", "4096", "--global-batch", "64", "--engine", "analytic", "--json",
            "--dtype", "fp8"]
    priced = {}
    for extra in ([], ["--moe-dispatch", "alltoall"], ["--stack", "megatron"],
                  ["--stack", "megatron", "--moe-dispatch", "flex"]):
        assert main(args + ["--stack", "nemo"] + extra) == 0
        priced[tuple(extra)] = json.loads(capsys.readouterr().out)["breakdown"]["ep_comm"]
    flex, alltoall = priced[()], priced[("--moe-dispatch", "alltoall")]
    assert 0.2 < flex / alltoall < 0.3
    assert priced[("--stack", "megatron")] == pytest.approx(alltoall, rel=0.05)
    assert priced[("--stack", "megatron", "--moe-dispatch", "flex")] == pytest.approx(flex,
                                                                                       rel=0.05)


def test_folded_experts_are_cut_from_tp_dp_cp_and_run_whole():
    """Megatron-Bridge's MoE recipes run experts whole on each rank (expert TP 1) with ep cut
    from tp x dp x cp (MoE parallel folding): Qwen3-235B-A22B on 256 H100s at tp 2, pp 8, ep 32
    has dp 16, which ep 32 does not divide. Each rank holds 128 / 32 = 4 whole experts, as many
    parameters as 8 half experts at ep 16 split over tp; its expert GEMMs take its own 2,048 of
    the tensor-parallel group's 4,096 tokens (sequence parallel), 2,048 x 8 x 32 / 128 = 4,096
    rows each, at the full 2 x 1,536 width; no tensor-parallel collective sits around them."""
    from simpar.cost.layer import strategy_layer_work
    from simpar.errors import SpecError
    from simpar.specs.strategy import validate
    from simpar.workload.params import chunk_params
    model = load_model("qwen3-235b-a22b")
    job = JobSpec(4096, 8192, "fp8")
    folded = Strategy(dp=16, tp=2, pp=8, ep=32, sp=True, stack="nemo")
    validate(folded, model, job, 256)
    assert folded.folds_experts and folded.expert_ranks == 32 and folded.edp == 1
    with pytest.raises(SpecError, match="must divide dp\\*cp"):
        validate(replace(folded, stack="megatron"), model, job, 256)
    split = Strategy(dp=16, tp=2, pp=8, ep=16, sp=True, stack="nemo", fold_experts=False)
    assert chunk_params(model, folded, 12, False, False)[1] == pytest.approx(
        chunk_params(model, split, 12, False, False)[1])
    work = strategy_layer_work(model, job, folded)
    up = next(g for g in work.gemms if g.name == "mlp_up")
    assert (up.m, up.n, up.k, up.count) == (4096, 2 * 1536, 4096, 4)
    assert [c.op for c in work.comms if c.group == "tp"] == ["allgather", "reducescatter"]
    unfolded = strategy_layer_work(model, job, split)
    up = next(g for g in unfolded.gemms if g.name == "mlp_up")
    assert (up.m, up.n, up.count) == (4096 * 8 * 16 // 128, 1536, 8)
    assert len([c for c in unfolded.comms if c.group == "tp"]) == 4


def test_folded_expert_groups_worked_by_hand():
    """8 ranks, tp 2 innermost, dp 4, folded ep 4: runs of 4 of all 8 ranks, the expert slot
    replicated across the two runs."""
    from simpar.network.placement import rank_groups
    groups = rank_groups((2, 1, 4, 1, 4, ("tp", "cp", "dp", "pp"), 4, True))
    assert groups["ep"] == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert groups["edp"] == ((0, 4), (1, 5), (2, 6), (3, 7))


def test_simulate_takes_a_folded_layout_and_the_flag_unfolds_it(capsys):
    from simpar.cli.parser import main
    args = ["simulate", "--model", "qwen3-235b-a22b", "--gpu", "h100-sxm", "--gpus", "256",
            "--tp", "2", "--pp", "8", "--ep", "32", "--seq-len", "4096", "--global-batch",
            "8192", "--dtype", "fp8", "--stack", "nemo", "--engine", "analytic"]
    assert main(args) == 0
    assert "each whole on its rank, ep cut from tp x dp x cp" in capsys.readouterr().out
    try:
        code = main(args + ["--no-fold-experts"])
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--ep=32" in err[0]


def test_quantized_experts_pad_their_rows_unless_the_dispatch_did():
    """Megatron core's TEGroupedMLP copies the rows it receives into runs padded for the quantized
    grouped GEMM (TE's Fp8Padding) and its output back (Fp8Unpadding): each reads and writes a
    16-bit routed element once, 2 x (2 + 2) = 8 bytes a routed element, and 3 kernels forward and
    3 backward. HybridEP pads inside its dispatch (core r0.18's skip_routed_expert_padding), so
    nemo's flex dispatch copies nothing; bf16 GEMMs need no padding. Qwen3-30B-A3B at ep 8, 4,096
    tokens: 4,096 x 8 x 2,048 routed elements a rank."""
    from simpar.cost.layer import stack_layer_work, te_cast_launches
    from simpar.specs.loaders import load_model

    m = load_model("qwen3-30b-a3b")
    nemo = get_stack("nemo")

    def work(stack, dtype="mxfp8"):
        return stack_layer_work(m, 4096, 1, 1, 1, 8, False, True, dtype, "fused", stack)

    padded, flex = work(nemo.with_moe_dispatch("alltoall")), work(nemo)
    assert padded.pads_experts and not flex.pads_experts
    sorted_bf16 = work(nemo.with_moe_dispatch("alltoall"), "bf16")
    assert padded.expert_copy_bytes - sorted_bf16.expert_copy_bytes == 8 * 4096 * 8 * 2048
    assert padded.elementwise_bytes == flex.elementwise_bytes
    launches = [te_cast_launches(w, nemo, "mxfp8") for w in (padded, flex)]
    assert (launches[0][0] - launches[1][0], launches[0][1] - launches[1][1]) == (3, 3)
    assert not work(get_stack("megatron"), "bf16").pads_experts


def test_an_alltoall_dispatch_sorts_rows_by_local_expert_and_back():
    """Megatron core's alltoall dispatcher sorts the rows a rank receives by local expert
    (sort_chunks_by_idxs, 'Permutation 2') and back before the combine, with or without expert
    parallelism: 2 x (2 + 2) = 8 bytes a 16-bit routed element in forward and as many in backward
    (the inverse sorts), two kernels each pass. torchtitan's and execpar's dispatch sort only the
    rows an expert-parallel all-to-all delivers, execpar's arriving in fp32 under autocast (4 + 4
    in, 2 + 2 out: 12). Qwen3-30B-A3B at ep 8, 4,096 tokens, bf16: 4,096 x 8 x 2,048 routed
    elements a rank, 16 experts on each. The flex dispatch hands the experts sorted rows; a rank
    holding one expert (ep = experts) has nothing to sort."""
    from simpar.cost.layer import layer_kernels, stack_layer_work
    from simpar.specs.loaders import load_model

    m = load_model("qwen3-30b-a3b")
    nemo = get_stack("nemo")

    def copied(stack, ep=8):
        return stack_layer_work(m, 4096, 1, 1, 1, ep, False, True, "bf16", stack.kernels,
                                stack).expert_copy_bytes

    alltoall = nemo.with_moe_dispatch("alltoall")
    routed = 4096 * 8 * 2048
    assert copied(alltoall) == 8 * routed
    assert copied(alltoall, ep=1) == 8 * 4096 * 8 * 2048  # all 128 experts on the rank
    assert copied(nemo) == 0
    assert copied(alltoall, ep=128) == 0
    assert (copied(get_stack("torchtitan")), copied(get_stack("torchtitan"), ep=1)) == (
        8 * routed, 0)
    assert copied(get_stack("execpar")) == 12 * routed
    # ... and execpar's all-to-all sends those fp32 rows, and takes the experts' bf16 output back
    def sent(name):
        work = stack_layer_work(m, 4096, 1, 1, 1, 8, False, True, "bf16", "fused", get_stack(name))
        return next(c.size_bytes for c in work.comms if c.group == "ep")
    assert (sent("execpar"), sent("torchtitan")) == ((4 + 2) / 2 * routed, 2 * routed)
    assert copied(get_stack("fsdp")) == 0  # its MoE code was not read
    work = stack_layer_work(m, 4096, 1, 1, 1, 8, False, True, "bf16", "fused", alltoall)
    assert work.expert_copy_kernels == 2
    copies = {k.name: k for k in layer_kernels(work, H200, "bf16", alltoall)}
    kernel = copies["expert row copies"]
    hbm = H200.hbm_tbps * 1e12 * H200.hbm_efficiency
    assert kernel.backward_s == kernel.forward_s > 8 * routed / hbm


def test_simulate_says_a_models_experts_come_from_a_few_groups(capsys):
    """The experts line names group-limited routing where the model has it, as the price
    assumes it."""
    from simpar.cli.parser import main
    args = ["simulate", "--gpu", "h100-sxm", "--gpus", "64", "--ep", "32", "--pp", "2",
            "--seq-len", "4096", "--global-batch", "64", "--dtype", "fp8", "--engine", "analytic"]
    assert main(args + ["--model", "deepseek-v3"]) == 0
    assert "experts: 256 x top 8 from 4 of 8 groups, priced balanced" in capsys.readouterr().out
    assert main(args + ["--model", "qwen3-30b-a3b", "--pp", "1"]) == 0
    assert "experts: 128 x top 8, priced balanced" in capsys.readouterr().out


def test_gpt_oss_experts_clamp_and_add_their_bias_eagerly_outside_the_op_fuser():
    """Megatron core's TEGroupedMLP, outside Transformer Engine's op fuser, clamps both halves of
    gpt-oss's GLU input and joins them before its fused activation (16 bytes a routed row x inner
    element forward, 20 backward) and adds fc2's bias times each row's router weight in fp32,
    expert by expert (28 and 36 a routed row x hidden element). gpt-oss-120b at ep 8, 4,096
    tokens: 16,384 routed rows a rank, inner and hidden both 2,880; kernels: 3 each pass for the
    clamps; for the bias 2 per local expert (16) + 2 forward, 5 per expert + 1 backward. A step
    replayed from CUDA graphs runs the fused grouped MLP: none of it; nor does a model without a
    clamp or biases, nor torchtitan."""
    from simpar.cost.layer import layer_kernels, stack_layer_work
    from simpar.specs.model_catalog import MODELS

    oss = MODELS["gpt-oss-120b"]
    nemo = get_stack("nemo")

    def work(stack, model=oss):
        return stack_layer_work(model, 4096, 1, 1, 1, 8, False, True, "bf16", "fused", stack)

    eager = work(nemo)
    rows = 16384 * 2880
    assert eager.expert_epilogue_bytes == (44 * rows, 56 * rows)
    assert eager.expert_epilogue_kernels == (3 + 2 * 16 + 2, 3 + 5 * 16 + 1)
    assert work(nemo.graphed(True)).expert_epilogue_bytes == (0.0, 0.0)
    assert work(get_stack("torchtitan")).expert_epilogue_kernels == (0, 0)
    assert work(nemo, Q30).expert_epilogue_kernels == (0, 0)
    unclamped = work(nemo, replace(oss, glu_clamp=0.0))
    assert unclamped.expert_epilogue_bytes == (28 * rows, 36 * rows)
    kernels = {k.name: k for k in layer_kernels(eager, H200, "bf16", nemo)}
    epilogue = kernels["expert epilogue (eager)"]
    assert epilogue.backward_s > epilogue.forward_s


def test_gpt_oss_experts_keep_their_clamped_input_beside_fc1s_output():
    """The clamps keep fc1's output and the fused activation the joined clamped copy: one more
    16-bit copy of fc1's output, 2 x 2 x (4 x 2,880) bytes a token a layer, unless the op fuser
    runs."""
    from simpar.memory.model import SavedCode, activation_bytes_per_token
    from simpar.specs.model_catalog import MODELS

    oss = MODELS["gpt-oss-120b"]

    def kept(clamps):
        return activation_bytes_per_token(oss, 4096, 1, False, "none", True, "bf16",
                                          code=SavedCode(clamps_experts_eagerly=clamps))
    assert kept(True) - kept(False) == 2 * 2 * 4 * 2880


def test_glu_clamp_comes_from_a_config_and_is_checked(tmp_path):
    from simpar.errors import SpecError
    from simpar.specs.model_catalog import MODELS

    cfg = {"model_type": "gpt_oss", "num_hidden_layers": 24, "hidden_size": 2880,
           "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
           "intermediate_size": 2880, "vocab_size": 201088, "num_local_experts": 32,
           "num_experts_per_tok": 4, "swiglu_limit": 7.0}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    model = load_model(str(tmp_path / "config.json"))
    assert (model.glu_clamp, model.bias) == (7.0, True)
    assert MODELS["gpt-oss-20b"].glu_clamp == 7.0
    with pytest.raises(SpecError, match="glu_clamp"):
        replace(model, glu_clamp=-1.0)
    with pytest.raises(SpecError, match="gated_mlp"):
        replace(model, gated_mlp=False)
