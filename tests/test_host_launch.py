"""The host CPU issuing eager kernels (benchmarks/host_bound.py measured it on an H200): how many
kernels a layer launches as each stack's code runs it, what a recomputed kernel costs under
torch.utils.checkpoint, and that a device-bound backward hides its recompute's host time."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from simpar.cost.layer import PassCost, head_behind_host, layer_cost, stack_layer_work
from simpar.network.model import network_for
from simpar.specs import ModelSpec, Strategy, dgx_like
from simpar.specs.stack import (
    CHECKPOINT_HOOK_US,
    COMPILED_LAUNCH_US,
    EAGER_LAUNCH_US,
    get_stack,
)

H200 = dgx_like("h200")
M1B = Path(__file__).parents[1] / "benchmarks" / "data" / "h100_execpar" / "m1b.yaml"
# 128 tokens of a 256-wide layer: every kernel is shorter than its launch
TINY = ModelSpec(name="tiny", layers=2, hidden=256, heads=4, kv_heads=2, ffn_hidden=768,
                 vocab=1000)
M3B = ModelSpec(name="m3b", layers=28, hidden=3072, heads=24, kv_heads=8, ffn_hidden=8192,
                vocab=128256)


def passes(model, seq: int, mb: int, stack_name: str, recompute: str):
    s = Strategy(micro_batch=mb, recompute=recompute, stack=stack_name)
    stack = s.profile
    work = stack_layer_work(model, seq, mb, 1, 1, 1, False, True, "bf16", stack.elementwise,
                            stack, zero3=s.shards_parameters)
    net = network_for(H200, s)
    return layer_cost(work, net, H200.gpu, "bf16", recompute, False, stack)


def test_execpar_launches_its_split_linears_their_casts_and_the_rotary_table():
    """execpar's block forward: wq, wk, wv, wo, w1, w3, w2 (7 GEMMs), autocast's cast of each
    weight (7), the attention kernel (1), 35 elementwise kernels (the eager layer's 36 less 7 for
    each of its two norms, which torch's nn.RMSNorm runs as one kernel; 5 casts of the norms'
    fp32 output, one per linear; 8 more for its rotary in fp32, 10 a call where the complex
    multiply's eager pricing counts 6) and 20 building the rotary table (for q and for k): 70,
    as many as full recompute added per layer on the GPU (4,416 over 64 layer passes, 69:
    reports/host-bound-h200). Backward: two of each but the casts (one each) and the table
    (none): 93."""
    fwd, bwd = passes(TINY, 128, 1, "execpar", "none")
    assert fwd.compute_s == pytest.approx(70 * EAGER_LAUNCH_US * 1e-6)
    assert bwd.compute_s == pytest.approx(93 * EAGER_LAUNCH_US * 1e-6)
    # torchtitan on one GPU: autocast over fp32 weights too (the 7 weights' casts and the norms'
    # 5), its norms op by op (36) and its rotary table built once per model
    fwd, bwd = passes(TINY, 128, 1, "torchtitan", "none")
    assert fwd.compute_s == pytest.approx((7 + 7 + 1 + 36 + 5) * EAGER_LAUNCH_US * 1e-6)
    assert bwd.compute_s == pytest.approx((2 * (7 + 1 + 36 + 5) + 7) * EAGER_LAUNCH_US * 1e-6)
    # under FSDP (two ranks) no autocast: FSDP casts the weights, the stream is 16-bit
    s = Strategy(dp=2, zero=3, micro_batch=1, stack="torchtitan")
    work = stack_layer_work(TINY, 128, 1, 1, 1, 1, False, True, "bf16", s.profile.elementwise,
                            s.profile, zero3=s.shards_parameters)
    fwd, bwd = layer_cost(work, network_for(H200, s), H200.gpu, "bf16", "none",
                          False, s.profile)
    assert fwd.compute_s == pytest.approx((7 + 1 + 36) * EAGER_LAUNCH_US * 1e-6)
    assert bwd.compute_s == pytest.approx(2 * (7 + 1 + 36) * EAGER_LAUNCH_US * 1e-6)


def test_a_kernel_recomputed_under_torch_checkpoint_costs_the_host_its_hooks_too():
    """torch.utils.checkpoint (execpar, torchtitan) pays CHECKPOINT_HOOK_US per recomputed
    kernel beside its launch; Megatron's reentrant checkpoint does not, and a compiled block's
    recompute is in its graph."""
    assert get_stack("execpar").recompute_launch_us == EAGER_LAUNCH_US + CHECKPOINT_HOOK_US
    assert get_stack("torchtitan").recompute_launch_us == EAGER_LAUNCH_US + CHECKPOINT_HOOK_US
    assert get_stack("megatron").recompute_launch_us == EAGER_LAUNCH_US
    assert get_stack("mosaic").recompute_launch_us == EAGER_LAUNCH_US
    assert get_stack("torchtitan", compile=True).recompute_launch_us == COMPILED_LAUNCH_US
    _, plain = passes(TINY, 128, 1, "execpar", "none")
    _, full = passes(TINY, 128, 1, "execpar", "full")
    # the whole forward again, 70 kernels at 15.6 + 49 us
    assert full.recompute_s == pytest.approx(70 * (EAGER_LAUNCH_US + CHECKPOINT_HOOK_US) * 1e-6)
    assert full.compute_s == plain.compute_s
    # selective: the attention module's 4 weights and their casts, the core, 27 elementwise
    # kernels (16, 8 more for the fp32 rotary, q's, k's and v's casts) and the table: 56, where
    # an H200's profile of 3b-s2k-mb1x4-sel counted about 55 a layer and micro-batch more than
    # 3b-s2k-mb2 (reports/gpu-validation-h200-heldout)
    _, sel = passes(TINY, 128, 1, "execpar", "selective")
    assert sel.recompute_s == pytest.approx(
        (8 + 1 + 27 + 20) * (EAGER_LAUNCH_US + CHECKPOINT_HOOK_US) * 1e-6)


def test_a_device_bound_backward_hides_its_recomputes_host_time():
    """A 3B layer of two 2K-token sequences: the recompute alone is host-bound (70 kernels at
    64.6 us, 4.5 ms, over a 3 ms forward), but the host issues it while the GPU still runs the
    previous layer's backward, so the pair costs their device time (the run measured 0.571 s
    on an H200, 0.530 s of it kernels; pass by pass it was priced 0.70 s)."""
    fwd, full = passes(M3B, 2048, 2, "execpar", "full")
    host = 70 * (EAGER_LAUNCH_US + CHECKPOINT_HOOK_US) * 1e-6
    assert fwd.compute_s < host
    assert full.recompute_s == pytest.approx(fwd.compute_s)


def test_the_head_fills_the_waits_of_a_host_bound_backward_and_no_more():
    """The output layer and loss are long kernels: the host issues them and runs on into the
    backward, so their device time takes the place of the backward's waits for the host; a
    device-bound backward (no waits) hides nothing."""
    b = PassCost(compute_s=0.010, recompute_s=0.002, host_wait_s=0.004)
    shorter = head_behind_host(b, 0.003)
    assert (shorter.compute_s, shorter.host_wait_s) == pytest.approx((0.007, 0.001))
    assert head_behind_host(b, 0.006).compute_s == pytest.approx(0.006)
    assert head_behind_host(b, 0.006).recompute_s == 0.002
    assert head_behind_host(PassCost(compute_s=0.010), 0.006).compute_s == 0.010
    # a layer's passes say how long their GPU waited: a tiny layer all of its time beyond its
    # kernels, a 3B layer of 4K tokens none
    fwd, bwd = passes(TINY, 128, 1, "execpar", "full")
    assert 0 < fwd.host_wait_s < fwd.compute_s and bwd.host_wait_s > 0
    fwd, bwd = passes(M3B, 2048, 2, "execpar", "full")
    assert fwd.host_wait_s == 0 and bwd.host_wait_s == 0


def test_explain_shows_a_host_bound_recompute_as_host_wait_and_its_kernels_as_recompute():
    """--explain's table: of a host-bound backward with full recompute, the recompute row is the
    forward's kernels run again, the rest of the pair's time the host's launch wait."""
    from simpar.report.kernels import layer_time
    from simpar.specs import JobSpec

    lt = layer_time(TINY, H200, JobSpec(128, 1, "bf16"),
                    Strategy(micro_batch=1, recompute="full", stack="execpar"))
    assert lt.recompute_s == pytest.approx(sum(k.forward_s for k in lt.kernels))
    assert lt.backward_s == pytest.approx(
        (93 * EAGER_LAUNCH_US + 70 * (EAGER_LAUNCH_US + CHECKPOINT_HOOK_US)) * 1e-6)


def test_the_launch_constants_are_the_host_bound_runs_measurements(benchmark):
    """EAGER_LAUNCH_US is run b's step less its optimizer over its other kernels, and
    CHECKPOINT_HOOK_US what full recompute (run a) added per recomputed kernel beyond that
    (reports/host-bound-h200, benchmarks/host_bound.py)."""
    module = benchmark("host_bound")
    folder = Path(__file__).parents[1] / "reports" / "host-bound-h200"
    a, b = (module.summary(folder / f"host-{run}.json") for run in "ab")
    launch = (b["step_s"] - b["optimizer_s"]) / (b["kernels"] - b["optimizer_kernels"])
    recomputed = (a["step_s"] - b["step_s"]) / (a["kernels"] - b["kernels"])
    assert EAGER_LAUNCH_US == pytest.approx(1e6 * launch, abs=0.05)
    assert CHECKPOINT_HOOK_US == pytest.approx(1e6 * recomputed - EAGER_LAUNCH_US, abs=0.5)
    # the GPU waited for the host in both: their kernels ran in well under the step
    assert a["device_s"] < 0.3 * a["step_s"] and b["device_s"] < 0.6 * b["step_s"]


def test_validate_says_when_the_measured_gpu_waited_for_its_host(tmp_path, capsys):
    """The held-out 1B run of eight one-sequence micro-batches with full recompute: its profiled
    kernels ran 0.49 of its 0.94 s step, so validate says the GPU waited for its host; a run
    whose kernels fill its step (the 8K-token one) gets the share alone."""
    from simpar.cli.parser import main

    folder = Path(__file__).parents[1] / "reports" / "gpu-validation-h200-heldout"
    plan = tmp_path / "plan.json"
    for run, waited in (("1b-s2k-mb1x8-full", True), ("1b-s8k-mb2", False)):
        measured = json.loads((folder / f"measured-{run}.json").read_text())
        assert main(["plan", "--model", str(M1B), "--gpus", "1", "--seq-len",
                     str(measured["seq_len"]), "--global-batch", str(measured["global_batch"]),
                     "--micro-batch", str(measured["strategy"]["micro_batch"]), "--recompute",
                     measured["strategy"]["recompute"], "--gpu", "h200", "--out", str(plan)]) == 0
        capsys.readouterr()
        assert main(["validate", str(plan), str(folder / f"measured-{run}.json")]) == 0
        out = capsys.readouterr().out
        assert "measured GPU kernels:" in out
        assert ("waited for its host" in out) is waited, out
    assert main(["validate", str(plan), str(folder / "measured-1b-s8k-mb2.json"), "--json"]) == 0
    busy = json.loads(capsys.readouterr().out)["gpu_busy"]
    assert 0.9 < busy["share"] <= 1.0


def _held_out_run_and_its_plan(tmp_path):
    """The held-out H200 run of the 1B model at 8K tokens, and a plan of its strategy."""
    from simpar.cli.parser import main

    folder = Path(__file__).parents[1] / "reports" / "gpu-validation-h200-heldout"
    measured = json.loads((folder / "measured-1b-s8k-mb2.json").read_text())
    plan = tmp_path / "plan.json"
    assert main(["plan", "--model", str(M1B), "--gpus", "1", "--seq-len",
                 str(measured["seq_len"]), "--global-batch", str(measured["global_batch"]),
                 "--micro-batch", str(measured["strategy"]["micro_batch"]), "--gpu", "h200",
                 "--out", str(plan)]) == 0
    return measured, plan


def test_validate_reads_a_kind_of_kernel_the_profile_found_none_of_as_none(tmp_path, capsys):
    """A measurement whose kernel split gives null for a kind (no kernel of it) summed None and
    raised TypeError; a null memory-bound time, which every profile has, is refused in one line."""
    from simpar.cli.parser import main

    measured, plan = _held_out_run_and_its_plan(tmp_path)
    kernels = measured["breakdown"]["kernels"]
    whole = {k: kernels[k] or 0.0 for k in ("gemm_s", "attention_s", "memory_bound_s",
                                            "communication_s")}
    kernels["communication_s"] = None
    path = tmp_path / "measured.json"
    path.write_text(json.dumps(measured))
    capsys.readouterr()
    assert main(["validate", str(plan), str(path), "--json"]) == 0
    busy = json.loads(capsys.readouterr().out)["gpu_busy"]
    assert busy["kernels_s"] == pytest.approx(sum(whole.values()) - whole["communication_s"])
    kernels["memory_bound_s"] = None
    path.write_text(json.dumps(measured))
    assert main(["validate", str(plan), str(path)]) == 2
    assert "measured.breakdown.kernels.memory_bound_s" in capsys.readouterr().err


def test_validate_refuses_a_measurement_that_shares_no_figure_with_the_plan(tmp_path, capsys):
    """Nothing to compare printed an empty table, and --png crashed drawing no bars."""
    from simpar.cli.parser import main

    measured, plan = _held_out_run_and_its_plan(tmp_path)
    bare = {k: measured[k] for k in ("schema", "version", "strategy", "global_batch")}
    path = tmp_path / "measured.json"
    path.write_text(json.dumps(bare))
    capsys.readouterr()
    png = tmp_path / "chart.png"
    assert main(["validate", str(plan), str(path), "--png", str(png)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "shares no figure" in err and not png.exists()


# Qwen3-30B-A3B's layer: 128 experts, top 8, 768-wide, in 16 local experts per rank at EP 8
QWEN3_30B = ModelSpec(name="qwen3-30b-a3b", layers=48, hidden=2048, heads=32, kv_heads=4,
                      head_dim=128, ffn_hidden=768, experts=128, experts_per_token=8,
                      vocab=151936)


def _moe_launches(stack_name: str, dtype: str, ep: int = 8,
                  dispatch: str = "") -> tuple[int, int]:
    """(forward, backward) kernels one MoE layer of Qwen3-30B-A3B launches under the stack (its
    Python beyond them, moe_host_launches, left out), dispatching as `dispatch` where given."""
    from simpar.cost.layer import _launches, moe_host_launches, stack_layer_work
    stack = get_stack(stack_name)
    stack = stack.with_moe_dispatch(dispatch) if dispatch else stack
    work = stack_layer_work(QWEN3_30B, 4096, 1, 1, 1, ep, False, True, dtype, stack.kernels,
                            stack)
    launches, python = _launches(work, stack, dtype)[:2], moe_host_launches(work, stack)
    return round(launches[0] - python[0]), round(launches[1] - python[1])


def test_megatrons_moe_python_costs_the_host_per_expert_gemm_and_per_forward():
    """Beyond its launches, Megatron core's MoE layer under Transformer Engine costs the host 46 us
    per expert GEMM (16 local experts at EP 8, two GroupedLinears: 32 forward, 64 backward) and
    800 us once per forward, read off NVIDIA's DeepSeek-V3 GB200 profile: forward 32 x 46 + 800 =
    2,272 us, backward 64 x 46 = 2,944 us. A replayed CUDA graph runs none of it; torchtitan's
    grouped GEMM is one kernel with no Python per expert."""
    from simpar.cost.layer import moe_host_launches, stack_layer_work
    for name, expected_us in (("nemo", (2272.0, 2944.0)), ("torchtitan", (0.0, 0.0))):
        stack = get_stack(name)
        work = stack_layer_work(QWEN3_30B, 4096, 1, 1, 1, 8, False, True, "mxfp8",
                                stack.kernels, stack)
        launches = moe_host_launches(work, stack)
        assert tuple(n * EAGER_LAUNCH_US for n in launches) == pytest.approx(expected_us)
    graphed = get_stack("nemo").graphed(True)
    assert moe_host_launches(stack_layer_work(QWEN3_30B, 4096, 1, 1, 1, 8, False, True, "mxfp8",
                                              graphed.kernels, graphed), graphed) == (0.0, 0.0)


def test_megatrons_moe_layer_launches_what_its_code_does():
    """Counted by hand from Megatron core 0d8e0714 and Transformer Engine 2.9 (the 25.11
    container's), MXFP8 at EP 8: qkv, proj and the router (3 GEMMs) and 16 + 16 expert GEMMs, the
    attention kernel, 8 fused elementwise kernels, the router and dispatcher's 25; TE's casts of
    qkv's and proj's inputs with two swizzles each (6), of each expert's rows (16 + 16) with two
    multi-tensor swizzles per GroupedLinear (4), the experts' padding and unpadding (3): 114, the
    code's 118 less the q/k norms' copies. Backward: the GEMMs, core and elementwise twice (88),
    the routing's 15, the gradients' casts (2 + 32) with four swizzles per GEMM (16), the padding's
    3: 156 (the code: 155-161). Core 0d8e0714 pads under every dispatcher; r0.18 (the 26.06
    container's) leaves it to HybridEP, nemo's flex dispatch: 3 + 3 fewer."""
    assert _moe_launches("nemo", "mxfp8", dispatch="alltoall") == (114, 156)
    assert _moe_launches("nemo", "mxfp8") == (111, 153)
    # bf16: no casts, no padding: 35 GEMMs + 1 + 8 + 25; backward 2 x 44 + 15
    assert _moe_launches("nemo", "bf16") == (69, 103)
    # current-scaling fp8 (nemo) runs an amax and a scale kernel before each cast, no swizzles:
    # (1 + 1 + 16 + 16) casts x 3 + 3 padding = 105 beside bf16's 69
    assert _moe_launches("nemo", "fp8", dispatch="alltoall") == (174, 103 + 105)
    # delayed scaling (megatron) casts the 16 experts' rows in one multi-tensor kernel
    assert _moe_launches("megatron", "fp8") == (69 + 4 + 3, 103 + 4 + 3)
    # the stacks not counted keep the elementwise count, twice in backward: torchtitan's eager
    # routing (24 kernels) in bf16, where FSDP casts and nothing else launches
    f, b = _moe_launches("torchtitan", "bf16")
    assert b == 2 * f


def test_a_host_bound_pass_issues_its_kernels_while_the_gpu_waits_on_its_collectives():
    """A small MoE layer on 8 B200s whose all-to-alls are exposed: the host launches the experts
    while the GPU waits for the dispatch, so the pass is the larger of its launches and its device
    time plus the exposed collectives, not their sum."""
    from simpar.cost.layer import _launches, layer_cost, stack_layer_work
    cluster = dgx_like("b200")
    # without the wait for the token counts (after_moe_host_sync's tests price it)
    stack = replace(get_stack("nemo"), moe_host_sync="never")
    s = Strategy(dp=8, ep=8, micro_batch=1, stack="nemo")
    work = stack_layer_work(QWEN3_30B, 4096, 1, 1, 1, 8, False, True, "mxfp8", stack.kernels,
                            stack)
    fwd, bwd = layer_cost(work, network_for(cluster, s), cluster.gpu, "mxfp8", "none", False,
                          stack)
    launches_f, launches_b = (n * EAGER_LAUNCH_US * 1e-6 for n in _launches(work, stack,
                                                                             "mxfp8")[:2])
    assert fwd.ep_comm_s > 0 and fwd.host_wait_s > 0
    assert fwd.compute_s + fwd.ep_comm_s == pytest.approx(launches_f)
    assert bwd.compute_s + bwd.ep_comm_s == pytest.approx(launches_b)


def test_a_step_replayed_from_cuda_graphs_waits_for_no_launch():
    """--cuda-graphs (Megatron core's full-iteration graphs): the same host-bound MoE layer costs
    its device time and exposed collectives, no host wait; stacks whose trainers capture no
    graphs refuse it in one line."""
    from simpar.cost.layer import layer_cost, stack_layer_work
    from simpar.errors import SpecError
    cluster = dgx_like("b200")
    s = Strategy(dp=8, ep=8, micro_batch=1, stack="nemo", cuda_graphs=True)
    stack = s.profile
    assert stack.cuda_graphs and stack.launch_us == 0.0
    work = stack_layer_work(QWEN3_30B, 4096, 1, 1, 1, 8, False, True, "mxfp8", stack.kernels,
                            stack)
    graphed = layer_cost(work, network_for(cluster, s), cluster.gpu, "mxfp8", "none", False, stack)
    eager = layer_cost(work, network_for(cluster, s), cluster.gpu, "mxfp8", "none", False,
                       get_stack("nemo"))
    for g, e in zip(graphed, eager, strict=True):
        assert g.host_wait_s == 0 and e.host_wait_s > 0
        assert g.compute_s == pytest.approx(e.compute_s - e.host_wait_s)
    with pytest.raises(SpecError, match="does not capture CUDA graphs"):
        Strategy(stack="torchtitan", cuda_graphs=True)


@pytest.mark.parametrize("recompute", ["full", "selective", "op"])
def test_a_graphed_step_prices_its_recompute_as_device_time(recompute):
    """A recomputed forward inside a replayed graph launches nothing either (its launches were
    counted in units of a launch, of which a graph has none)."""
    from simpar.cost.layer import layer_cost, stack_layer_work
    cluster = dgx_like("b200")
    s = Strategy(dp=8, ep=8, micro_batch=1, stack="nemo", cuda_graphs=True, recompute=recompute)
    work = stack_layer_work(QWEN3_30B, 4096, 1, 1, 1, 8, False, True, "mxfp8", s.profile.kernels,
                            s.profile)
    fwd, bwd = layer_cost(work, network_for(cluster, s), cluster.gpu, "mxfp8", recompute, False,
                          s.profile)
    assert fwd.host_wait_s == 0 and abs(bwd.host_wait_s) < 1e-12 and bwd.recompute_s >= 0


def _moe_forward(stack, mb: int, ep: int = 8, dtype: str = "mxfp8"):
    """(forward PassCost, its work, the experts' forward device seconds) of one Qwen3-30B-A3B
    layer on 8 B200s at micro-batch `mb`."""
    from simpar.cost.layer import layer_cost, layer_kernels, stack_layer_work
    cluster = dgx_like("b200")
    s = Strategy(dp=8, ep=ep, micro_batch=mb, stack="nemo")
    work = stack_layer_work(QWEN3_30B, 4096, mb, 1, 1, ep, False, True, dtype, stack.kernels,
                            stack)
    fwd, _ = layer_cost(work, network_for(cluster, s), cluster.gpu, dtype, "none", False, stack)
    experts = sum(k.forward_s for k in layer_kernels(work, cluster.gpu, dtype, stack)
                  if k.name in ("mlp_up", "mlp_down"))
    return fwd, work, experts


def test_megatrons_moe_forward_waits_for_its_token_counts_and_then_issues_the_experts():
    """Megatron core's dropless dispatch copies the experts' token counts to the host and waits
    (token_dispatcher.py, fused_a2a.py). At micro-batch 1 the 16 + 16 expert GEMMs, their 32
    MXFP8 casts, 4 swizzles and 3 padding kernels (71 launches, and the copy's: 72 x 15.6 us =
    1.12 ms) and the Python around them (32 x 46 + 800 us = 2.27 ms) outlast the experts' device
    time, so the pass is at least that host time, then the rest of its device time and exposed
    collectives, and one launch more for the wait. (Under the alltoall dispatcher, whose longer
    all-to-alls leave the pass without the wait device-bound.)"""
    nemo = replace(get_stack("nemo"), moe_dispatch="alltoall")
    fwd, work, experts = _moe_forward(nemo, 1)
    free, _, _ = _moe_forward(replace(nemo, moe_host_sync="never"), 1)
    launch = EAGER_LAUNCH_US * 1e-6
    host = 72 * launch + (32 * 46 + 800) * 1e-6
    assert host > experts
    device = free.total_s - free.host_wait_s  # the GPU's kernels and exposed collectives
    assert fwd.total_s == pytest.approx(max(free.total_s, host + device - experts) + launch)
    assert fwd.total_s > free.total_s + launch


def test_a_device_bound_moe_forward_loses_only_the_launch_after_the_wait():
    """At micro-batch 32 the experts' GEMMs outlast their launches and Python (3.39 ms, above):
    the GPU idles only while the host issues the first kernel after the counts arrive."""
    nemo = get_stack("nemo")
    fwd, _, experts = _moe_forward(nemo, 32)
    free, _, _ = _moe_forward(replace(nemo, moe_host_sync="never"), 32)
    assert experts > 72 * EAGER_LAUNCH_US * 1e-6 + (32 * 46 + 800) * 1e-6
    assert fwd.total_s - free.total_s == pytest.approx(EAGER_LAUNCH_US * 1e-6)


def test_which_moe_forwards_wait_for_the_host():
    """Megatron's always (the grouped GEMM's splits are host lists even without expert
    parallelism); torch's all-to-all takes host splits, so torchtitan and execpar wait only
    under expert parallelism; a replayed CUDA graph never waits."""
    assert get_stack("nemo").syncs_moe_host(False) and get_stack("megatron").syncs_moe_host(True)
    assert not get_stack("nemo", cuda_graphs=True).syncs_moe_host(True)
    for name in ("torchtitan", "execpar"):
        assert get_stack(name).syncs_moe_host(True) and not get_stack(name).syncs_moe_host(False)
    for name in ("deepspeed", "mosaic", "fsdp"):
        assert not get_stack(name).syncs_moe_host(True)
    graphed, _, _ = _moe_forward(get_stack("nemo", cuda_graphs=True), 1)
    never, _, _ = _moe_forward(replace(get_stack("nemo", cuda_graphs=True),
                                       moe_host_sync="never"), 1)
    assert graphed.total_s == never.total_s
