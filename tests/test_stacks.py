"""Stack profiles: each one's effect on time and memory, in the right direction and by
hand-computed amounts."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from simpar.cli.parser import main
from simpar.cost import gradsync
from simpar.cost.compute import (
    GEMM_K_OVERHEAD,
    flash_attention_time,
    gemm_time,
    hbm_rate,
    memory_bound_time,
)
from simpar.cost.layer import head_cost, layer_code, stack_layer_work
from simpar.cost.step import predict
from simpar.errors import SpecError
from simpar.memory.model import GIB, SavedCode, activation_bytes_per_token, memory_breakdown
from simpar.network.model import network_for
from simpar.specs import MODELS, JobSpec, ModelSpec, Strategy, dgx_like, load_cluster
from simpar.specs.schedule import INTERLEAVED, ONE_F_ONE_B
from simpar.specs.stack import STACKS, get_stack
from simpar.workload.layer import Gemm, LayerCode, head_work, layer_work

M = MODELS["llama3-8b"]
H100 = dgx_like("h100-sxm")
JOB = JobSpec(8192, 16)


def _json(capsys, *args) -> dict:
    assert main(list(args) + ["--json", "--engine", "analytic"]) == 0
    return json.loads(capsys.readouterr().out)


def test_stack_defaults_fill_what_the_user_left_unsaid_and_flags_win(capsys):
    base = [
        "simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16", "--tp", "2",
        "--seq-len", "4096", "--global-batch", "16"
    ]
    meg = _json(capsys, *base, "--stack", "megatron")["strategy"]
    assert (meg["zero"], meg["sp"], meg["overlap_tp_comm"], meg["kernels"]) == (1, True, True,
                                                                                "fused")
    tt = _json(capsys, *base, "--stack", "torchtitan")["strategy"]
    assert (tt["zero"], tt["sp"], tt["overlap_tp_comm"], tt["kernels"]) == (3, True, False, "eager")
    ds = _json(capsys, *base, "--stack", "deepspeed@0.5")["strategy"]
    # Megatron-DeepSpeed of 2021: unfused attention
    assert (ds["zero"], ds["sp"], ds["flash_attention"]) == (3, False, False)
    mine = _json(
        capsys, *base, "--stack", "megatron", "--zero", "0", "--no-sp", "--kernels", "eager"
    )["strategy"]
    assert (mine["zero"], mine["sp"], mine["overlap_tp_comm"], mine["kernels"]) == (0, False, False,
                                                                                    "eager")


def test_the_kernel_table_shows_the_quantized_casts_share_of_the_memory_bound_bytes(capsys):
    """--explain's elementwise row says how much of its traffic is the GEMM inputs' casts: more
    under NeMo's current scaling (each cast reads its input twice) than under Megatron's delayed
    scaling, and none in bf16. By hand, Llama 3 70B at tp 4: the cast inputs are 2 x 8192 +
    8192 / 4 + 28672 / 4 = 25,600 elements a token, 3 bytes each delayed, 5 current, and on the
    H100 (fp8 GEMMs in the TN layout only) one more for the transposed copy TE writes beside."""
    from simpar.cost.layer import layer_kernels

    m = MODELS["llama3-70b"]

    def row(dtype, stack):
        work = stack_layer_work(m, 8192, 1, 4, 1, 1, True, True, dtype, "fused", STACKS[stack])
        kernel = next(k for k in layer_kernels(work, H100.gpu, dtype, STACKS[stack])
                      if k.name == "elementwise")
        return work, kernel

    tokens = 8192
    for stack, per_element in (("megatron", 3), ("nemo", 5)):
        work, kernel = row("fp8", stack)
        assert work.fused_cast_bytes == pytest.approx(tokens * 25_600 * per_element)
        transposes = tokens * 25_600 * 1
        assert kernel.forward_bytes == pytest.approx(work.elementwise_bytes + transposes)
        share = (work.fused_cast_bytes + transposes) / kernel.forward_bytes
        assert kernel.detail == f"8 kernels, {share:.0%} casts"
    work, kernel = row("bf16", "nemo")
    assert work.fused_cast_bytes == 0 and kernel.detail == "8 kernels"
    base = ["simulate", "--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "64", "--tp", "4",
            "--pp", "2", "--seq-len", "8192", "--global-batch", "128", "--dtype", "fp8",
            "--explain"]
    shares = []
    for stack in ("megatron", "nemo"):
        assert main([*base, "--stack", stack]) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("elementwise"))
        shares.append(int(line.split("kernels, ")[1].split("%")[0]))
    assert shares[0] < shares[1]


def test_current_scaling_agrees_on_each_gathered_inputs_scale_over_tp():
    """Under sequence parallelism a current-scaling (or NVFP4) cast happens before the gather, so
    the tp ranks all-reduce its amax first: TE does it for the two column-parallel inputs in
    forward and the two row-parallel output gradients in backward, one fp32 each, waited for.
    Delayed scaling, mxfp8 and tp without sequence parallelism have none."""
    from simpar.cost.layer import amax_reductions

    m, nemo = MODELS["llama3-8b"], STACKS["nemo"]
    net = network_for(H100, Strategy(dp=4, tp=2, sp=True))
    one = net.collective("allreduce", 4, "tp")
    assert one > 0

    def reductions(dtype, sp=True, stack=nemo):
        work = stack_layer_work(m, 4096, 1, 2, 1, 1, sp, True, dtype, "fused", stack)
        return amax_reductions(work, net, dtype, stack)

    assert reductions("fp8") == pytest.approx((2 * one, 2 * one))
    assert reductions("fp8", stack=STACKS["megatron"]) == (0.0, 0.0)
    # NVFP4's per-tensor scale is agreed the same way, on any stack
    assert reductions("nvfp4", stack=STACKS["megatron"]) == pytest.approx((2 * one, 2 * one))
    assert reductions("mxfp8") == (0.0, 0.0)
    assert reductions("fp8", sp=False) == (0.0, 0.0)


def test_fp8_scaling_is_the_stacks_unless_the_user_says_and_only_for_per_tensor_fp8(
        capsys, tmp_path):
    """nemo scales fp8 as Megatron-Bridge's fp8_cs recipes (current), megatron as Megatron-LM's
    --fp8-recipe default (delayed); --fp8-scaling wins and is recorded. It means nothing for
    block-scaled formats or torchao's float8: one line, exit 2."""
    base = ["simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8",
            "--seq-len", "4096", "--global-batch", "16", "--dtype", "fp8"]
    nemo = _json(capsys, *base, "--stack", "nemo")
    meg = _json(capsys, *base, "--stack", "megatron")
    delayed = _json(capsys, *base, "--stack", "nemo", "--fp8-scaling", "delayed")
    current = _json(capsys, *base, "--stack", "megatron", "--fp8-scaling", "current")
    assert (delayed["strategy"]["fp8_scaling"], current["strategy"]["fp8_scaling"]) == (
        "delayed", "current")
    assert delayed["step_time_s"] < nemo["step_time_s"]
    assert current["step_time_s"] > meg["step_time_s"]
    for bad in (["--stack", "nemo", "--dtype", "mxfp8", "--gpu", "b200"],
                ["--stack", "torchtitan"]):
        assert main([*base, *bad, "--fp8-scaling", "current"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("simpar: error: --fp8-scaling='current'") and "\n" not in err
    # the searches refuse it before pricing, and write nothing
    out = tmp_path / "scaling"
    for cmd in (["compare", "--gpus", "8"], ["scale", "--gpu-list", "8,16", "--out", str(out)]):
        args = [cmd[0], "--model", "llama3-8b", "--gpu", "b200", "--seq-len", "4096",
                "--global-batch", "16", "--dtype", "mxfp8", "--stack", "nemo",
                "--fp8-scaling", "delayed", *cmd[1:]]
        assert main(args) == 2
        assert "drop --fp8-scaling" in capsys.readouterr().err
    assert not out.exists()
    # the search itself refuses it, for callers of the library too
    from simpar.errors import SpecError
    from simpar.search.space import SearchSpace, enumerate_strategies

    space = SearchSpace(overrides=(("stack", "nemo"), ("fp8_scaling", "delayed")))
    job = JobSpec(seq_len=4096, global_batch=16, dtype="mxfp8")
    with pytest.raises(SpecError, match="drop --fp8-scaling"):
        next(enumerate_strategies(MODELS["llama3-8b"], job, 8, 8, space,
                                  gpu=dgx_like("b200").gpu))


def test_fp8_all_gather_is_the_stacks_unless_the_user_says_and_only_for_torchaos_fp8(
        capsys, tmp_path):
    """torchtitan gathers its fp8 weights in fp8 under ZeRO-3, execpar in 16 bits (torchao's
    default); --fp8-all-gather / --no-fp8-all-gather win both ways and are recorded in the plan.
    A Transformer Engine stack or a 16-bit run is refused in one line, exit 2, searches too."""
    base = ["simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len",
            "8192", "--global-batch", "16", "--micro-batch", "2", "--zero", "3", "--dtype", "fp8"]
    titan = _json(capsys, *base, "--stack", "torchtitan")
    titan_off = _json(capsys, *base, "--stack", "torchtitan", "--no-fp8-all-gather")
    execpar = _json(capsys, *base, "--stack", "execpar", "--recompute", "full")
    execpar_on = _json(capsys, *base, "--stack", "execpar", "--recompute", "full",
                       "--fp8-all-gather")
    assert titan["strategy"]["fp8_all_gather"] is None
    assert titan_off["strategy"]["fp8_all_gather"] is False
    assert titan["step_time_s"] < titan_off["step_time_s"]
    assert execpar_on["step_time_s"] < execpar["step_time_s"]
    plan = tmp_path / "plan.json"
    assert main(["plan", *base[1:], "--recompute", "full", "--fp8-all-gather",
                 "--out", str(plan)]) == 0
    capsys.readouterr()
    assert json.loads(plan.read_text())["strategy"]["fp8_all_gather"] is True
    for bad, says in ((["--stack", "megatron"], "gathers its weights in 16 bits"),
                      (["--stack", "torchtitan", "--dtype", "bf16"], "not bf16")):
        assert main([*base, *bad, "--fp8-all-gather"]) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and "drop --fp8-all-gather" in err and "\n" not in err
    # the searches refuse it before pricing, and keep --no-fp8-all-gather (a False) as given
    assert main(["compare", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8",
                 "--seq-len", "8192", "--global-batch", "16", "--stack", "torchtitan",
                 "--no-fp8-all-gather"]) == 2
    assert "drop --fp8-all-gather" in capsys.readouterr().err
    from simpar.cli.parser import build_parser
    from simpar.cli.predict import stack_overrides

    args = build_parser().parse_args(["compare", "--model", "llama3-8b", "--gpu", "h100-sxm",
                                      "--gpus", "8", "--seq-len", "8192", "--global-batch",
                                      "16", "--dtype", "fp8", "--no-fp8-all-gather"])
    assert ("fp8_all_gather", False) in stack_overrides(args)


def test_nemo_runs_nvfp4_without_tp_overlap_as_its_recipes_do(capsys):
    """Megatron-Bridge's Llama recipes turn the TP comm overlap off for NVFP4: the nemo stack does
    too, unless the user asks for it; its fp8 recipes keep it; exposed, the collectives cost
    time."""
    base = [
        "simulate", "--model", "llama3-70b", "--cluster", "gb200-nvl72", "--gpus", "64", "--tp",
        "2", "--pp", "4", "--vpp", "5", "--schedule", "interleaved", "--seq-len", "8192",
        "--global-batch", "256", "--stack", "nemo"
    ]
    fp4 = _json(capsys, *base, "--dtype", "nvfp4")
    fp8 = _json(capsys, *base, "--dtype", "mxfp8")
    forced = _json(capsys, *base, "--dtype", "nvfp4", "--overlap-tp-comm")
    assert (fp4["strategy"]["overlap_tp_comm"], fp8["strategy"]["overlap_tp_comm"],
            forced["strategy"]["overlap_tp_comm"]) == (False, True, True)
    assert fp4["breakdown"]["tp_comm"] > forced["breakdown"]["tp_comm"]
    assert fp4["step_time_s"] > forced["step_time_s"]
    assert main(["stacks"]) == 0
    nemo = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("nemo"))
    assert "yes, not nvfp4" in nemo


def test_megatron_waits_for_its_tp_collectives_on_gpus_without_cuda_multicast(capsys):
    """Transformer Engine's userbuffers overlap needs CUDA multicast (initialize_ub raises on
    an A100 unless UB_SKIPMC=1): the megatron and nemo stacks default to waiting for the
    sequence-parallel collectives there, and the waits cost time; on an H100 they overlap; a user
    who asks for the overlap gets it; torchtitan's default does not change."""
    base = ["simulate", "--model", "gpt3-20b", "--gpus", "8", "--tp", "8", "--seq-len", "2048",
            "--global-batch", "4", "--micro-batch", "4"]
    a100 = _json(capsys, *base, "--gpu", "a100-80gb", "--stack", "megatron")
    h100 = _json(capsys, *base, "--gpu", "h100-sxm", "--stack", "megatron")
    asked = _json(capsys, *base, "--gpu", "a100-80gb", "--stack", "megatron", "--overlap-tp-comm")
    assert (a100["strategy"]["overlap_tp_comm"], h100["strategy"]["overlap_tp_comm"],
            asked["strategy"]["overlap_tp_comm"]) == (False, True, True)
    assert a100["breakdown"]["tp_comm"] > asked["breakdown"]["tp_comm"]
    assert a100["step_time_s"] > asked["step_time_s"]
    assert not get_stack("nemo").overlaps_tp("bf16", dgx_like("a100-80gb").gpu)
    assert get_stack("nemo").overlaps_tp("bf16", dgx_like("b200").gpu)
    assert not get_stack("torchtitan").tp_overlap_needs_multicast
    assert main(["stacks"]) == 0
    megatron = next(line for line in capsys.readouterr().out.splitlines()
                    if line.startswith("megatron "))
    assert "yes, not pre-Hopper" in megatron


def test_bad_stack_and_compile_without_a_compiler_get_one_line(capsys):
    base = [
        "simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096",
        "--global-batch", "8"
    ]
    with pytest.raises(SystemExit) as exc:
        main(base + ["--stack", "jax"])
    assert exc.value.code == 2
    assert main(base + ["--stack", "megatron", "--compile"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--compile" in err[-1] and "torchtitan" in err[-1]


def test_a_stack_is_taken_by_its_projects_names_in_any_case_and_recorded_by_its_profiles(capsys):
    base = [
        "simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "4096",
        "--global-batch", "8"
    ]
    for alias, name in (("Composer", "mosaic"), ("llm_foundry", "mosaic"),
                        ("Megatron-LM", "megatron"), ("megatron-bridge", "nemo"),
                        ("FMS-FSDP", "fsdp"), ("TorchTitan", "torchtitan")):
        priced = _json(capsys, *base, "--stack", alias)
        assert priced["strategy"]["stack"] == name
        assert priced == _json(capsys, *base, "--stack", name)
    # a plan file's or caller's strategy takes them too, and keeps the profile's name
    assert Strategy(dp=8, stack="Composer").stack == "mosaic"
    with pytest.raises(SpecError, match="stack='colossal-ai'"):
        Strategy(dp=8, stack="colossal-ai")


def test_a_stack_with_eras_is_taken_by_release_or_year_and_priced_as_that_eras_code(capsys):
    """NAME@VERSION (or NAME-VERSION) picks the profile of the code that release or year ran:
    DeepSpeed batched its ZeRO-3 collectives in 0.6 (its runs' model code took flash attention in
    2023), Megatron-LM took sequence parallelism in 2022 and Transformer Engine in 2023,
    torchtitan's 2025 code is its 0.2; a version that is none (or a stack with one profile) is
    refused as an unknown stack."""
    from simpar.specs.stack import stack_name

    for said, profile in (("deepspeed@0.5.8", "deepspeed"), ("DeepSpeed-0.6", "deepspeed-0.6"),
                          ("deepspeed@0.14.2", "deepspeed-0.6"), ("deepspeed@2022", "deepspeed"),
                          ("deepspeed@2024", "deepspeed-0.6"),
                          ("megatron@2021", "megatron-2021"), ("Megatron-LM@2022", "megatron-2022"),
                          ("megatron-lm-2024", "megatron"), ("mcore@0.12", "megatron"),
                          ("torchtitan@0.1", "torchtitan"), ("torchtitan@v0.2.2", "torchtitan-0.2"),
                          ("torchtitan@2025", "torchtitan-0.2")):
        assert stack_name(said) == profile, said
    for bad in ("nemo@25.02", "megatron@next", "fsdp-2"):
        assert stack_name(bad) == bad
    base = ["simulate", "--model", "megatron2021-1.7b", "--gpu", "a100-80gb", "--gpus", "8",
            "--seq-len", "2048", "--global-batch", "16", "--dtype", "fp16", "--tp", "8", "--sp"]
    era, today = (_json(capsys, *base, "--stack", s) for s in ("megatron@2022", "megatron@2023"))
    assert era["strategy"]["stack"] == "megatron-2022" and today["strategy"]["stack"] == "megatron"
    # 2022's code: no fused attention, so the same run takes longer
    assert era["step_time_s"] > 1.05 * today["step_time_s"]
    # refused in one line that says why: one profile, or no release or year
    for said, why in (("nemo@25.02", "nemo has one profile whatever its release"),
                      ("megatron@next", "'next' is no release or year of megatron; give one, "
                       "e.g. megatron@2023")):
        with pytest.raises(SystemExit) as exc:
            main(base + ["--stack", said])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and f"'{said}'" in err and why in err
        assert err.count("\n") == 1
    # `simpar stacks --json` gives scripts the first version of each profile's ranges
    assert main(["stacks", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["megatron-2022"]["from_versions"] == ["megatron@2022"]
    assert listed["deepspeed-0.6"]["from_versions"] == ["deepspeed@0.6", "deepspeed@2023"]
    assert listed["nemo"]["from_versions"] == []


def test_eager_is_slower_than_compiled_which_is_slower_than_fused_kernels():
    def step(**kw):  # each strategy takes its stack's kernels
        return predict(M, H100, JOB, Strategy(dp=8, zero=3, micro_batch=2, recompute="op",
                                              **kw)).step_time_s
    eager, compiled = step(stack="torchtitan"), step(stack="torchtitan", compile=True)
    assert step(stack="megatron") < compiled < eager
    # torchtitan's 2024 releases compiled the blocks, not the loss: compiling it too is faster
    assert step(stack="torchtitan", compile=True, loss="fused") < compiled


def test_fp32_logits_cost_time_and_memory():
    # 2 x 8192 tokens x 128,256 logits: the fp32 loss moves 22 + 26 bytes per logit, the
    # fused one 4 + 2
    logits = 2 * 8192 * 128256
    net = network_for(H100, Strategy(dp=8))
    fp32 = head_cost(head_work(M, 8192, 2, 1, 1, False, "bf16", "fp32"), net, H100.gpu, "bf16")
    fused = head_cost(head_work(M, 8192, 2, 1, 1, False, "bf16", "fused"), net, H100.gpu, "bf16")
    extra = sum(p.total_s for p in fp32) - sum(p.total_s for p in fused)
    kernels = 3 * (8 - 3) * 4e-6  # five more kernels in forward, twice that in backward, 4 us each
    # 88 GB more at 2.85 TB/s: 31 ms
    assert extra == pytest.approx(logits * 42 / (3.35e12 * 0.85) + kernels)
    # memory at the loss's backward: 12 fp32 bytes per logit (log-softmax output, its gradient,
    # the input gradient) against the fused loss's 16-bit logits and gradient (4): 15.7 GiB more
    s = Strategy(dp=8, zero=3, micro_batch=2, stack="torchtitan")
    fp32_mem = memory_breakdown(M, JOB, s)
    compiled = memory_breakdown(M, JOB, replace(s, compile=True, loss="fused"))
    assert fp32_mem.buffers_gib - compiled.buffers_gib == pytest.approx(logits * 8 / 2**30)


def test_chunked_loss_pays_the_fp32_losss_forward_again_in_backward():
    # 2 x 8192 tokens x 128,256 logits: the recomputed fp32 forward moves 22 more bytes per logit
    logits = 2 * 8192 * 128256
    net = network_for(H100, Strategy(dp=8))
    fp32 = head_cost(head_work(M, 8192, 2, 1, 1, False, "bf16", "fp32"), net, H100.gpu, "bf16")
    chunked = head_cost(
        head_work(M, 8192, 2, 1, 1, False, "bf16", "chunked"), net, H100.gpu, "bf16"
    )
    assert chunked[0].total_s == pytest.approx(fp32[0].total_s)
    assert chunked[1].total_s - fp32[1].total_s == pytest.approx(logits * 22 / (3.35e12 * 0.85))
    assert get_stack("execpar").loss_kind == "chunked"
    # execpar --compile compiles the blocks, not its chunked loss (nor did torchtitan's 2024
    # releases compile theirs: e8977b0 turned it off until bbb1b616e, April 2025)
    assert (get_stack("execpar", True).elementwise, get_stack("execpar", True).loss_kind) == (
        "fused",
        "chunked",
    )
    assert get_stack("torchtitan", True).loss_kind == "fp32"


def test_flashattention2_runs_at_35_percent_of_hopper_peak_and_at_its_own_rate_on_ampere():
    flops = 1e15
    a100 = load_cluster("dgx-a100", None).gpu
    assert flash_attention_time(flops, H100.gpu, "bf16", "fa2") == pytest.approx(
        flops / (989e12 * 0.35) + H100.gpu.kernel_overhead_us * 1e-6)
    assert flash_attention_time(flops, a100, "bf16",
                                "fa2") == flash_attention_time(flops, a100, "bf16", "best")


def test_mosaics_triton_attention_runs_below_flashattention2_on_both_generations():
    # the 2023 Triton kernel: FlashAttention-2's rate over 1.8 (A100: 60% at its sustained 1,305
    # of 1,410 MHz, / 1.8 = 31% of 312 TFLOP/s; H100: 35% / 1.8 = 19% of 989); its backward keeps
    # FA2's ratio to the forward
    flops = 1e15
    a100 = load_cluster("dgx-a100", None).gpu
    assert flash_attention_time(flops, a100, "bf16", "triton") == pytest.approx(
        flops / (312e12 * 0.60 * 1305 / 1410 / 1.8) + a100.kernel_overhead_us * 1e-6)
    assert flash_attention_time(flops, H100.gpu, "bf16", "triton") == pytest.approx(
        flops / (989e12 * 0.35 / 1.8) + H100.gpu.kernel_overhead_us * 1e-6)
    assert get_stack("mosaic").attention == "triton"


def test_16_bit_layernorm_moves_a_ninth_of_the_eager_fp32_rmsnorm_bytes():
    # MPT-7B-like, non-gated, learned positions (no rotary), eager: per token the two
    # norms move 2 x 4 bytes per hidden element in 16 bits against 2 x 36 upcast to fp32
    # op by op; the rest is the same
    mpt = replace(M, gated_mlp=False, kv_heads=32, ffn_hidden=16384, position_embeddings=2048)
    fp32, lp = (layer_work(mpt, 2048, 1, 1, 1, 1, False, True, "bf16", "eager",
                           LayerCode(norm_fp32=f)) for f in (True, False))
    assert fp32.elementwise_bytes - lp.elementwise_bytes == pytest.approx(2048 * 2 * (36 - 4) *
                                                                          4096)
    assert not get_stack("mosaic").norm_fp32 and get_stack("torchtitan").norm_fp32
    # and autograd keeps no fp32 norm copies: 2 norms x (4 + 4 - 2) bytes per hidden
    # element less, and with learned positions no fp32 rotary q and k at all
    kept = {
        n: activation_bytes_per_token(mpt, 2048, 1, False, "none", True, "bf16", "eager",
                                      SavedCode(norm_fp32=n))
        for n in (True, False)
    }
    assert kept[True] - kept[False] == 2 * 6 * 4096
    assert mpt.rotary_dim == 0


def test_short_keys_and_small_k_run_below_the_long_rate():
    # a query tile attending to 1,024 keys pays 192 keys more: 1 + 192/1024 = 1.1875
    # times the long-sequence time
    long = flash_attention_time(1e15, H100.gpu, "bf16", "best") - 1e-6 * H100.gpu.kernel_overhead_us
    short = flash_attention_time(1e15, H100.gpu, "bf16", "best",
                                 keys_per_query=1024) - 1e-6 * H100.gpu.kernel_overhead_us
    assert short / long == pytest.approx(1.1875)
    # same FLOPs, K = 2048 against K = 16384 (M, N large and wave-aligned): (2048 /
    # 2176) / (16384 / 16512)
    assert GEMM_K_OVERHEAD == 128
    wide = gemm_time(Gemm("a", 132 * 128, 1024, 16384), H100.gpu, "bf16")
    narrow = gemm_time(Gemm("b", 132 * 128, 8192, 2048), H100.gpu, "bf16")
    assert (narrow - 4e-6) / (wide - 4e-6) == pytest.approx((16384 / 16512) / (2048 / 2176))


def test_megatron_reduces_gradients_in_fp32_and_deepspeed_in_fp16():
    s = Strategy(dp=64, zero=1, micro_batch=1)
    big = load_cluster("dgx-h100", None)
    job = JobSpec(4096, 64)
    meg = predict(M, big, job, replace(s, stack="megatron", overlap_grad_reduce=False))
    ds = predict(M, big, job, replace(s, stack="deepspeed-0.6", overlap_grad_reduce=False))
    # the reduce-scatter carries 4 bytes per gradient against 2; the all-gather of
    # 16-bit weights is the same
    assert meg.breakdown["dp_comm"] > 1.3 * ds.breakdown["dp_comm"]


def test_megatrons_fp16_step_holds_its_docs_bytes_per_parameter():
    """Megatron's optimizers cast each 16-bit main_grad to fp32 for the step (.float(), beside
    the fp32 master weight). Its distributed-optimizer table gives fp16 parameters with fp16
    gradients 20 bytes per parameter without sharding and 4 + 16/d with it: 2 + 2 + (4 master +
    8 Adam + 4 fp32 gradient) / d. A 13B model at tp 8 and full recompute peaks in that step:
    20 bytes per rank's parameter at dp 1, 8 at dp 4. bf16's fp32 gradients need no cast."""
    from simpar.workload.params import stage_params

    M13 = MODELS["llama2-13b"]

    def per_param(dtype: str, dp: int) -> tuple[str, float]:
        s = Strategy(dp=dp, tp=8, zero=1, micro_batch=1, stack="megatron", recompute="full",
                     grad_reduce="fp16" if dtype == "fp16" else "")
        m = memory_breakdown(M13, JobSpec(2048, 8 * dp, dtype), s)
        return m.peak_phase, m.peak_allocated_gib * GIB / sum(stage_params(M13, s, 0, 40))

    assert per_param("fp16", 1) == ("optimizer", pytest.approx(20.0))
    assert per_param("fp16", 4) == ("optimizer", pytest.approx(4 + 16 / 4))
    phase, bf16 = per_param("bf16", 1)
    assert phase == "backward" and bf16 > 18.0  # 2 + 4 + 12, and the activations beside them


def test_a_recipe_reducing_gradients_in_bf16_halves_megatrons_gradient_buffer(capsys):
    """Megatron's --grad-reduce-in-bf16 (its Llama 3 examples set it): the main_grad buffer
    and the reduction go to 2 bytes per gradient, and fused Adam reads 28 bytes per parameter
    instead of 32. A stack with fp32 weights keeps fp32 gradients and only reduces in bf16."""
    job = JobSpec(8192, 128)
    s = Strategy(dp=4, cp=2, zero=1, micro_batch=1, stack="megatron")
    fp32, bf16 = (memory_breakdown(M, job, replace(s, grad_reduce=g)) for g in ("", "bf16"))
    from simpar.workload.params import stage_params

    params = sum(stage_params(M, s, 0, M.layers))
    assert fp32.gradients_gib - bf16.gradients_gib == pytest.approx(2 * params / 2**30)
    mb = get_stack("megatron", grad_reduce="bf16")
    assert (mb.grad_bytes, mb.grad_reduce_bytes, mb.optimizer_bytes) == (2, 2, 28)
    assert get_stack("nemo", grad_reduce="fp32").grad_bytes == 4  # and back
    tt = get_stack("torchtitan", grad_reduce="bf16")
    assert (tt.grad_bytes, tt.grad_reduce_bytes) == (4, 2)
    # the data-parallel reduce-scatter carries half the bytes
    big = load_cluster("dgx-h100", None)
    meg = Strategy(dp=64, zero=1, micro_batch=1, stack="megatron", overlap_grad_reduce=False)
    t = [predict(M, big, JobSpec(4096, 64), replace(meg, grad_reduce=g)).breakdown["dp_comm"]
         for g in ("", "bf16")]
    assert t[0] > 1.3 * t[1]
    # fp32 training reduces in fp32 unless the user says otherwise (execpar then runs bf16)
    fp32_job = JobSpec(32, 8, "fp32")
    assert [gradsync.grad_bytes(Strategy(dp=2, stack="execpar", grad_reduce=g), fp32_job)
            for g in ("", "bf16")] == [4, 2]
    # the flag reaches the search's candidates too, as --optimizer does
    assert main(["compare", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8",
                 "--seq-len", "8192", "--global-batch", "16", "--stack", "torchtitan",
                 "--grad-reduce", "bf16", "--optimizer", "foreach", "--top", "1", "--json"]) == 0
    best = json.loads(capsys.readouterr().out)["top"][0]["strategy"]
    assert (best["grad_reduce"], best["optimizer"]) == ("bf16", "foreach")
    # with gradient compression the hook sets what is sent: one line
    assert main(["simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8",
                 "--seq-len", "8192", "--global-batch", "16", "--zero", "0",
                 "--grad-reduce", "bf16", "--compress", "fp16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--grad-reduce" in err[0]


def test_megatron_keeps_an_fp16_runs_gradients_in_fp16(capsys):
    """Megatron-LM accumulates and reduces gradients in fp32 under --bf16 only; an fp16 run's
    main_grad buffer is fp16 (its distributed-optimizer docs: "fp16 parameters, fp16
    gradients"). So today's Megatron-LM (on this A100: megatron@2023) under --dtype fp16 keeps 2
    bytes a gradient, as many as its fp16
    weights, where bf16 keeps 4, twice them; --grad-reduce fp32 (the recipe's
    --accumulate-allreduce-grads-in-fp32) gives them back, and compare prices it the same way."""
    base = ["simulate", "--model", "llama2-7b", "--gpu", "a100-80gb", "--gpus", "8",
            "--seq-len", "2048", "--global-batch", "64", "--stack", "megatron@2023"]

    def memory(*extra):
        d = _json(capsys, *base, *extra)
        return d["strategy"]["grad_reduce"], d["memory"]

    g, fp16 = memory("--dtype", "fp16")
    assert g == "fp16" and fp16["gradients_gib"] == pytest.approx(fp16["weights_gib"])
    g, bf16 = memory("--dtype", "bf16")
    assert g == "" and bf16["gradients_gib"] == pytest.approx(2 * bf16["weights_gib"])
    g, asked = memory("--dtype", "fp16", "--grad-reduce", "fp32")
    assert g == "fp32" and asked["gradients_gib"] == pytest.approx(bf16["gradients_gib"])
    # the profile alone is bf16's: other stacks and dtypes are left as they are
    assert STACKS["megatron"].default_grad_reduce("fp16") == "fp16"
    assert STACKS["megatron"].default_grad_reduce("bf16") == ""
    assert STACKS["nemo"].default_grad_reduce("fp16") == ""
    assert main(["compare", *base[1:], "--dtype", "fp16", "--top", "1", "--json"]) == 0
    top = json.loads(capsys.readouterr().out)["top"][0]
    assert top["strategy"]["grad_reduce"] == "fp16"
    # and simulate says what it priced, and how to price the other
    for dtype, said in (("fp16", True), ("bf16", False)):
        assert main([*base, "--dtype", dtype, "--engine", "analytic"]) == 0
        assert ("gradients: fp16" in capsys.readouterr().out) is said

def test_deepspeed_before_0_6_gathers_each_weight_and_waits_for_it():
    s = Strategy(dp=64, zero=3, micro_batch=1)
    big = load_cluster("dgx-h100", None)
    job = JobSpec(4096, 64)
    old = predict(M, big, job, replace(s, stack="deepspeed", flash_attention=True))
    new = predict(M, big, job, replace(s, stack="deepspeed-0.6"))
    # nothing hidden, 7 collectives per block
    assert old.breakdown["dp_comm"] > 3 * new.breakdown["dp_comm"]


def test_torchtitan_keeps_a_pipeline_stage_gathered_and_reduces_once_per_step():
    # FSDP2 under torch.distributed.pipelining: no reshard, gradient sync off until the stage's last
    # backward. Memory: the stage's whole bf16 weights and fp32 accumulated gradients beside the
    # sharded states; time: one gather and one reduce-scatter per step, however many micro-batches.
    from simpar.cost.step import zero3_gathers

    flat = Strategy(dp=8, zero=3, stack="torchtitan")
    piped = Strategy(dp=4, pp=2, zero=3, stack="torchtitan")
    assert piped.accumulates_unsharded and not flat.accumulates_unsharded
    assert not replace(piped, stack="fsdp").accumulates_unsharded  # FSDP1 stacks reshard under PP
    assert (zero3_gathers(flat, M), zero3_gathers(piped, M)) == (2, 1)
    job = JobSpec(8192, 16)  # 2 micro-batches per data-parallel rank
    mem = memory_breakdown(M, job, piped)
    stage = M.total_params / 2  # llama3-8b: its two stages hold the same parameters within 1%
    assert mem.gradients_gib * GIB == pytest.approx(4 * stage, rel=0.02)  # fp32, unsharded
    # bf16 whole + fp32 shard
    assert mem.weights_gib * GIB == pytest.approx(2 * stage + 4 * stage / 4, rel=0.02)
    dp = {}
    for m in (2, 8):
        p = predict(M, H100, JobSpec(8192, 4 * m), replace(piped, micro_batch=1), check=False)
        dp[m] = p.breakdown.get("dp_comm", 0.0) + p.breakdown.get("optimizer", 0.0)
    assert dp[8] == pytest.approx(dp[2], rel=0.05)  # per step, not per micro-batch
    reshard = predict(M, H100, JobSpec(8192, 32), replace(piped, stack="fsdp"), check=False)
    assert reshard.breakdown["dp_comm"] > 2 * dp[8]


def test_interleaved_chunks_hold_their_unsharded_gradients_one_at_a_time_in_a_single_round():
    """torch.distributed.pipelining syncs (and frees) a stage's unsharded FSDP gradients only at
    its last backward; interleaved 1F1B runs each chunk's backwards in rounds of pp micro-batches,
    so with pp micro-batches (one round, torchtitan's default) a rank's two chunks never hold
    their fp32 gradients at once: half the stage's at the peak, against all of it under 1F1B or
    with two rounds (torchtitan's 405B runs: interleaved peaked 9.8 GiB below 1F1B)."""
    piped = Strategy(dp=2, pp=4, zero=3, micro_batch=1, stack="torchtitan")
    inter = replace(piped, schedule="interleaved", vpp=2)

    def grads(s, m):  # at the peak stage, m micro-batches per data-parallel rank
        return memory_breakdown(M, JobSpec(8192, 2 * m), s).gradients_gib * GIB

    whole = grads(piped, 4)  # stage 0: its 8 layers and the embedding, in fp32
    per_layer = (M.total_params - M.embedding_params - M.output_params) / M.layers
    assert whole == pytest.approx(4 * (8 * per_layer + M.embedding_params), rel=0.01)
    assert grads(inter, 4) == pytest.approx(whole / 2, rel=0.1)
    assert grads(inter, 8) == pytest.approx(whole, rel=0.1)
    assert INTERLEAVED.live_gradient_share(4, 2, 4) == 0.5
    assert INTERLEAVED.live_gradient_share(4, 2, 8) == ONE_F_ONE_B.live_gradient_share(4, 1, 4) == 1


def test_a_tp_collective_hides_only_behind_its_own_linear_and_dtensor_waits_for_its_backward_ones():
    from simpar.cost.layer import layer_cost, overlapped

    s = Strategy(dp=1, tp=8, sp=True)
    net = network_for(H100, s)
    work = layer_work(M, 8192, 2, 8, 1, 1, True, True, "bf16")
    g = {x.name: gemm_time(x, H100.gpu, "bf16") for x in work.gemms}
    ag, rs = (net.collective(op, 2 * 8192 * M.hidden * 2, "tp")
              for op in ("allgather", "reducescatter"))
    slow = H100.gpu.overlap_slowdown
    megatron = get_stack("megatron")
    _, hidden = layer_cost(work, net, H100.gpu, "bf16", "none", False, megatron)
    _, waited = layer_cost(work, net, H100.gpu, "bf16", "none", False,
                           replace(megatron, tp_wgrad_overlap=False))
    # backward: the column-parallel linears reduce-scatter their input gradients beside
    # their own weight-gradient GEMMs, the row-parallel ones first gather the output
    # gradient their input-gradient GEMM needs; Megatron also gathers each
    # column-parallel input again, beside its input-gradient GEMM
    regathers = overlapped(ag, g["qkv"], slow) + overlapped(ag, g["mlp_up"], slow)
    assert hidden.tp_comm_s == pytest.approx(2 * regathers + 2 * rs)
    assert waited.tp_comm_s == pytest.approx(2 * ag + 2 * rs +
                                             regathers) and waited.tp_comm_s > hidden.tp_comm_s
    # torch's DTensor TP and Megatron-DeepSpeed's ColumnParallelLinear wait for it
    assert not any(get_stack(name).tp_wgrad_overlap
                   for name in ("torchtitan", "execpar", "deepspeed", "deepspeed-0.6"))
    # async TP pipelines each collective with its own GEMM in 8 chunks; the chunk on the
    # local shard has no transfer
    fwd, piped = layer_cost(work, net, H100.gpu, "bf16", "none", True, get_stack("torchtitan"))
    pairs = [(ag, g["qkv"]), (rs, g["proj"]), (ag, g["mlp_up"]), (rs, g["mlp_down"])]
    assert fwd.tp_comm_s == pytest.approx(sum(overlapped(c, 7 / 8 * w, slow) for c, w in pairs))
    # SP norms' weight gradients, waited for
    norms = net.collective("allreduce", work.replicated_grad_bytes, "tp")
    # in backward torch pipelines the gathers of the row-parallel linears' output gradients,
    # but not the reductions of the summed input gradients of wq, wk, wv and of w1, w3
    assert piped.tp_comm_s == pytest.approx(
        sum(overlapped(c, 7 / 8 * 2 * w, slow) for c, w in pairs[1::2]) + 2 * ag + norms)
    # Megatron computes q, k, v in one GEMM and gate and up in another: all four pipelined
    _, meg_piped = layer_cost(work, net, H100.gpu, "bf16", "none", True, megatron)
    assert meg_piped.tp_comm_s == pytest.approx(
        sum(overlapped(c, 7 / 8 * 2 * w, slow) for c, w in pairs) + regathers)
    # the attention's all-gather outlasts its thin GEMM at tp 8, and the MLP's long
    # GEMMs cannot hide it
    assert ag > 7 / 8 * g["qkv"] and fwd.tp_comm_s > overlapped(2 * ag + 2 * rs, sum(g.values()),
                                                                slow)



def test_megatron_overlaps_interleaved_pipeline_sends():
    s = Strategy(dp=2, tp=8, pp=4, sp=True, schedule="interleaved", vpp=2, zero=1)
    big = load_cluster("dgx-h100", None)
    job = JobSpec(4096, 64)
    meg = predict(MODELS["llama3-70b"], big, job, s)
    # same sends, blocking
    blocking = predict(MODELS["llama3-70b"], big, job, replace(s, stack="deepspeed-0.6"))
    assert meg.breakdown["pp_p2p"] < 0.5 * blocking.breakdown["pp_p2p"]


def test_plan_records_the_stack_and_validate_names_it(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    args = [
        "plan",
        "--model",
        "llama3-8b",
        "--gpu",
        "h100-sxm",
        "--gpus",
        "1",
        "--seq-len",
        "2048",
        "--global-batch",
        "2",
        # 8B with fp32 Adam on one GPU: a plan to compare, not to run
        "--out",
        str(plan),
        "--force"
    ]
    assert main(args) == 0
    doc = json.loads(plan.read_text())
    assert doc["strategy"]["stack"] == "execpar" and doc["strategy"]["kernels"] == "eager"
    from simpar.specs.plan import load_plan

    assert load_plan(str(plan)).strategy.profile is STACKS["execpar"]
    measured = tmp_path / "m.json"
    measured.write_text(
        json.dumps({"schema": "execpar-measurement", "step_time_s": 1.0, "tokens_per_s": 4096.0}))
    assert main(["validate", str(plan), str(measured)]) == 0
    assert "priced for the execpar stack" in capsys.readouterr().out


def test_autocast_costs_execpar_time():
    s = Strategy(micro_batch=1)
    job = JobSpec(2048, 1)
    ex = predict(M, H100, job, replace(s, stack="execpar"))
    # torchtitan under FSDP, whose mixed precision casts (without FSDP it autocasts too)
    tt = predict(M, H100, job, replace(s, stack="torchtitan", optimizer="fused", zero=3))
    from simpar.workload.params import stage_params

    params = sum(stage_params(M, s, 0, M.layers))
    # both run fused AdamW on fp32 gradients (32 bytes); execpar's autocast also casts
    # each weight it multiplies by (4 + 2): not the input embedding, which is looked up
    assert ex.breakdown["optimizer"] - tt.breakdown["optimizer"] == pytest.approx(
        (params - M.vocab * M.hidden) * 6 / hbm_rate(H100.gpu), rel=0.01)
    assert get_stack("execpar").autocast and not get_stack("torchtitan").autocast
    assert get_stack("torchtitan", fsdp=False).autocast


def test_deepspeed_pipelines_run_zero_1_at_most(capsys):
    base = [
        "simulate", "--model", "llama3-8b", "--gpu", "a100-80gb", "--gpus", "16", "--pp", "2",
        "--seq-len", "2048", "--global-batch", "16", "--stack", "deepspeed"
    ]
    # the stack's ZeRO-3 default gives way under pipelining
    assert _json(capsys, *base)["strategy"]["zero"] == 1
    assert main(base + ["--zero", "3"]) == 2
    assert "ZeRO stage 1 at most" in capsys.readouterr().err


def test_checkpoints_hold_the_states_the_stack_keeps():
    from simpar.capacity.reliability import reliability

    psi = 8e9
    meg = reliability(psi, Strategy(dp=8, zero=1, stack="megatron"))
    tt = reliability(psi, Strategy(dp=8, zero=3, stack="torchtitan"))
    assert meg.checkpoint_gib == pytest.approx(psi * 14 / 2**30)  # bf16 weights + fp32 master, m, v
    # fp32 weights + m, v, no separate master
    assert tt.checkpoint_gib == pytest.approx(psi * 12 / 2**30)


def test_torchtitan_repeats_kv_heads_before_attention_and_execpar_does_not():
    """torchtitan's Llama expands K and V to the query heads (repeat_kv) before SDPA: ring
    attention rotates, and autograd saves, n_heads of K/V; execpar calls SDPA with enable_gqa."""
    m = MODELS["llama3-8b"]
    assert STACKS["torchtitan"].repeats_kv_heads and not STACKS["execpar"].repeats_kv_heads
    assert not STACKS["megatron"].repeats_kv_heads
    n_rep = m.heads // m.kv_heads
    chunk = {r: layer_work(m, 8192, 1, 1, 4, 1, False, True, "bf16", "eager",
                           LayerCode(repeats_kv_heads=r)).cp_kv_chunk_bytes for r in (False, True)}
    assert chunk[True] == pytest.approx(n_rep * chunk[False])

    def kept(recompute, r):
        return activation_bytes_per_token(m, 8192, 1, False, recompute, True, "bf16", "eager",
                                          SavedCode(repeats_kv_heads=r))
    # two bf16 copies of (n_heads - kv_heads) x head_dim more per token, unless the layer is redone
    assert kept("none", True) - kept("none", False) == pytest.approx(2 * 2 * (m.q_dim - m.kv_dim))
    assert kept("full", True) == kept("full", False)


@pytest.mark.parametrize("slow, bytes_per_param", [
    # torch.optim.AdamW without fused=True, and torchtitan's weight_decay 0.1: one pass more
    ({"optimizer": "foreach"}, 72 + 8),
    ({}, 72 + 8),  # torchtitan's 2024 default
    ({"stack": "mosaic"}, 80),  # Composer's DecoupledAdamW: a Python loop of unfused ops
    ({"optimizer": "foreach", "stack": "execpar"}, 72),  # execpar does not decay
])
def test_unfused_adamw_moves_more_bytes_than_fused(slow, bytes_per_param):
    """torch's foreach AdamW (torchtitan before Feb 2025) and llm-foundry's decoupled_adamw
    against fused AdamW's 32 bytes per fp32 parameter (torchtitan's from Feb 2025; execpar's
    against its own)."""
    execpar = slow.get("stack") == "execpar"
    # the FSDP stacks under FSDP (torchtitan autocasts without it, which the step pays for too)
    s = Strategy(micro_batch=1, stack="execpar" if execpar else "torchtitan",
                 zero=0 if execpar else 3)
    job = JobSpec(2048, 1)
    fused, unfused = (predict(M, H100, job, replace(s, **kw))
                      for kw in ({"optimizer": "fused"}, {"optimizer": "", **slow}))
    from simpar.workload.params import stage_params

    params = sum(stage_params(M, s, 0, M.layers))
    assert unfused.breakdown["optimizer"] - fused.breakdown["optimizer"] == pytest.approx(
        params * (bytes_per_param - 32) / hbm_rate(H100.gpu), rel=0.01)


def test_foreach_adamw_holds_a_temporary_and_megatron_refuses_it(capsys):
    """torch's foreach AdamW keeps its sqrt list (4 bytes per parameter) on top in the step."""
    s = Strategy(micro_batch=1, stack="torchtitan")
    job = JobSpec(2048, 1)
    from simpar.workload.params import stage_params

    params = sum(stage_params(M, s, 0, M.layers))
    assert get_stack("torchtitan").optimizer_temp_bytes == 4  # its 2024 default
    assert get_stack("torchtitan", adam="fused").optimizer_temp_bytes == 0
    # one GPU, full recompute: the step's peak is weights, gradients, states and the temporary
    peaks = [memory_breakdown(M, job, replace(s, optimizer=o, recompute="full"))
             for o in ("fused", "foreach")]
    assert [m.peak_phase for m in peaks] == ["optimizer", "optimizer"]
    assert peaks[1].peak_allocated_gib - peaks[0].peak_allocated_gib == pytest.approx(
        params * 4 / 2**30)
    # Megatron steps its own fused Adam over an fp32 master copy: the flag is refused
    assert main(["simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8",
                 "--seq-len", "8192", "--global-batch", "16", "--stack", "megatron",
                 "--optimizer", "foreach"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--optimizer" in err[0] and "fp32 master" in err[0]


def test_dtensor_sequence_parallel_copies_each_collective_into_place():
    """torch's [batch, seq, hidden] layout shards dim 1 while the collectives work on dim 0: each
    reduce-scatter's input is copied into place, and each all-gather's output unless the
    micro-batch is one sequence (funcol's view then); Megatron's sequence-first layout copies
    none."""
    m = MODELS["llama3-8b"]
    act = 2 * 8192 * m.hidden * 2  # two sequences of 8,192 tokens, bf16

    def relayout(mb, dtensor):
        w = layer_work(m, 8192, mb, 8, 1, 1, True, True, "bf16", code=LayerCode(dtensor_sp=dtensor))
        return w.relayout_bytes, w.relayout_copies

    # forward and backward: 2 all-gathers and 2 reduce-scatters, or the reduce-scatters alone
    assert relayout(2, True) == ((4 * 2 * act, 4 * 2 * act), 4)
    assert relayout(1, True) == ((2 * 2 * act / 2, 2 * 2 * act / 2), 2)
    assert relayout(2, False) == ((0.0, 0.0), 0)
    # priced as memory-bound copies on the compute stream, once per pass
    from simpar.cost.layer import layer_cost
    from simpar.network.model import FREE_NETWORK

    gpu, tt = H100.gpu, STACKS["torchtitan"]
    works = [layer_work(m, 8192, 2, 8, 1, 1, True, True, "bf16", "eager", LayerCode(dtensor_sp=d))
             for d in (True, False)]
    (f1, b1), (f0, b0) = (layer_cost(w, FREE_NETWORK, gpu, "bf16", "none", False, tt)
                          for w in works)
    copies = memory_bound_time(4 * 2 * act, gpu, 4)
    assert f1.compute_s - f0.compute_s == pytest.approx(copies)
    assert b1.compute_s - b0.compute_s == pytest.approx(copies)
    assert STACKS["torchtitan"].tp_dtensor and not STACKS["megatron"].tp_dtensor


def test_torchtitan_gathers_fp8_inputs_for_its_float8_tensor_parallel_linears():
    """PrepareFloat8ModuleInput casts a column-parallel input to fp8 before the all-gather: the
    forward gathers (and their layout copies) move 1 byte per element, the backward stays 16-bit."""
    m = MODELS["llama3-8b"]
    tt = STACKS["torchtitan"]

    def work(dtype, stack=tt):
        return layer_work(m, 8192, 2, 8, 1, 1, True, True, dtype,
                          code=layer_code(stack, m, dtype, cp=1, ep=1, zero3=False))

    fp8, bf16 = work("fp8"), work("bf16")
    gathers = [c for c in fp8.comms if c.op == "allgather"]
    assert len(gathers) == 2
    assert all(c.forward_bytes == c.size_bytes / 2 for c in gathers)
    assert all(c.backward_bytes == c.size_bytes for c in fp8.comms)
    assert all(c.forward_bytes == c.size_bytes for c in bf16.comms)
    act = 2 * 8192 * m.hidden * 2
    assert fp8.relayout_bytes == (2 * 2 * act + 2 * 2 * act / 2, 4 * 2 * act)
    assert STACKS["torchtitan"].torchao_fp8("fp8") and STACKS["execpar"].torchao_fp8("fp8")
    assert not STACKS["megatron"].torchao_fp8("fp8") and not STACKS["torchtitan"].torchao_fp8(
        "bf16")


def test_transformer_engine_gathers_its_quantized_inputs_and_output_gradients():
    """Transformer Engine hands its quantizer to every sequence-parallel all-gather: forward
    gathers the column-parallel inputs quantized, backward the row-parallel output gradients and
    the inputs again for the weight gradient; the reduce-scatters stay 16-bit. Llama 3 8B at tp 4,
    2 x 4096 tokens: 16.8 MB gathered in 16 bits, 8.4 MB in fp8, 8.4 x 33/32 in MXFP8 (a 1-byte
    scale per 32) and 8.4 x 9/16 in NVFP4 (half a byte, a 1-byte scale per 16)."""
    m = MODELS["llama3-8b"]
    nemo = STACKS["nemo"]
    act = 2 * 4096 * m.hidden * 2
    for dtype, ratio in (("bf16", 1.0), ("fp8", 0.5), ("mxfp8", 33 / 64), ("nvfp4", 9 / 32)):
        work = stack_layer_work(m, 4096, 2, 4, 1, 1, True, True, dtype, "fused", nemo)
        gathers = [c for c in work.comms if c.op == "allgather"]
        scatters = [c for c in work.comms if c.op == "reducescatter"]
        assert [c.forward_bytes for c in gathers] == pytest.approx([ratio * act] * 2)
        assert [c.backward_bytes for c in scatters] == pytest.approx([ratio * act] * 2)
        assert all(c.forward_bytes == act for c in scatters)
        assert all(c.backward_bytes == act for c in gathers)
    assert nemo.quantized_gathers("fp8") == "all" and nemo.quantized_gathers("bf16") == "none"
    assert STACKS["torchtitan"].quantized_gathers("fp8") == "forward"
    # priced: the exposed tensor-parallel time of an fp8 layer without TP overlap falls
    from simpar.cost.layer import tp_comm_exposed

    s = Strategy(dp=1, tp=4, sp=True)
    net = network_for(H100, s)
    quantized = stack_layer_work(m, 4096, 2, 4, 1, 1, True, True, "fp8", "fused", nemo)
    plain = replace(quantized, comms=tuple(replace(c, forward_size_bytes=0.0,
                                                   backward_size_bytes=0.0)
                                           for c in quantized.comms))
    (qf, qb), (pf, pb) = (tp_comm_exposed(w, net, {}, False, nemo, 0.0) for w in (quantized, plain))
    ag, ag8 = (net.collective("allgather", b, "tp") for b in (act, act / 2))
    assert pf - qf == pytest.approx(2 * (ag - ag8))
    assert pb - qb == pytest.approx(4 * (ag - ag8))  # two output-gradient gathers, two re-gathers


def test_current_scaling_reads_each_per_tensor_fp8_input_once_more_for_its_amax():
    """NeMo's fp8 is current scaling (Megatron-Bridge's fp8_cs recipes): Transformer Engine
    reads each cast's input once for the amax before casting it. Llama 3 8B at tp 2, 2 x 4096
    tokens: the inputs of q/k/v and the MLP (4096 each), of the attention output (4096 / 2) and
    of the down projection (14336 / 2), 2 bytes each, once more per token; 16-bit layers are
    unchanged, mxfp8 finds its block scales in the cast, and Megatron-LM's default (delayed
    scaling) has no such pass."""
    m = MODELS["llama3-8b"]

    def elementwise(dtype, amax):
        return layer_work(m, 4096, 2, 2, 1, 1, True, True, dtype,
                          code=LayerCode(amax_pass=amax)).elementwise_bytes

    per_token = 2 * (4096 + 4096 + 4096 / 2 + 14336 / 2)
    assert elementwise("fp8", True) - elementwise("fp8", False) == pytest.approx(
        2 * 4096 * per_token)
    assert elementwise("bf16", True) == elementwise("bf16", False)
    assert STACKS["nemo"].fp8_current_scaling and not STACKS["megatron"].fp8_current_scaling
    # NVFP4 finds a per-tensor scale before every cast, whatever the fp8 recipe: both stacks
    assert all(STACKS[n].amax_pass("nvfp4") for n in ("nemo", "megatron"))
    assert STACKS["nemo"].amax_pass("fp8") and not STACKS["megatron"].amax_pass("fp8")
    assert not STACKS["nemo"].amax_pass("mxfp8") and not STACKS["nemo"].amax_pass("bf16")
    # priced as memory-bound traffic on the compute stream: forward reads it once, backward twice
    from simpar.cost.layer import layer_cost
    from simpar.network.model import FREE_NETWORK

    gpu, nemo = H100.gpu, STACKS["nemo"]
    delayed = replace(nemo, fp8_current_scaling=False)
    (f1, b1), (f0, b0) = (
        layer_cost(stack_layer_work(m, 4096, 2, 2, 1, 1, True, True, "fp8", "fused", st),
                   FREE_NETWORK, gpu, "fp8", "none", False, st) for st in (nemo, delayed))
    extra = 2 * 4096 * per_token
    assert f1.compute_s - f0.compute_s == pytest.approx(memory_bound_time(extra, gpu, 0))
    assert b1.compute_s - b0.compute_s == pytest.approx(memory_bound_time(2 * extra, gpu, 0))


def test_execpar_saves_kv_expanded_to_the_query_heads_only_under_context_parallelism():
    """execpar expands grouped K/V before torch's CUDA ring attention (cp > 1) and runs SDPA's
    grouped path otherwise; torchtitan always expands (repeat_kv), Megatron never. Llama 3 8B,
    bf16, no recompute: 4,096 query and 1,024 K/V channels, so a token saves (4,096 + 4,096 -
    1,024 - 1,024) x 2 bytes more per layer when expanded."""
    from simpar.memory.model import saved_activation_bytes
    from simpar.specs.stack import get_stack

    assert [get_stack(n).kv_repeated(cp) for n in ("execpar", "torchtitan", "megatron")
            for cp in (1, 2)] == [False, True, True, True, False, False]
    llama, job = MODELS["llama3-8b"], JobSpec(8192, 8)
    per_token = [saved_activation_bytes(llama, job, Strategy(cp=cp, stack="execpar",
                                                             micro_batch=1)) / (8192 // cp)
                 for cp in (1, 2)]
    assert per_token[1] - per_token[0] == pytest.approx((4096 + 4096 - 1024 - 1024) * 2)


def _deepspeed_with(monkeypatch, *, run, **fields):
    """run() with the deepspeed profile's `fields` changed, then the profile restored."""
    from simpar.specs import stack as stacks

    with monkeypatch.context() as m:
        m.setitem(stacks.STACKS, "deepspeed", replace(stacks.STACKS["deepspeed"], **fields))
        get_stack.cache_clear()
        try:
            return run()
        finally:
            get_stack.cache_clear()


def test_deepspeed_before_0_6_pays_an_eager_op_per_rank_for_each_list_collective(monkeypatch):
    """Each ZeRO-3 collective of DeepSpeed before v0.6 builds one view per rank in Python and
    torch copies each through its flat buffer: 64 ranks x 8 us per collective. Megatron's
    model code holds q, k, v in one tensor and gate and up in one: 4 gathered weights a layer,
    gathered for forward and again for backward, each waited for."""
    s = Strategy(dp=64, zero=3, micro_batch=1, stack="deepspeed", flash_attention=True)
    job = JobSpec(4096, 64)
    big = load_cluster("dgx-h100", None)
    with_ops = predict(M, big, job, s).breakdown["dp_comm"]
    monkeypatch.setattr(gradsync, "list_ops_seconds", lambda s, op, n: 0.0)
    without = predict(M, big, job, s).breakdown["dp_comm"]
    gathers = M.layers * 4 * 2 * 64 * 8e-6
    # its gradients are all-reduced from flat buckets: no list to build
    assert with_ops - without == pytest.approx(gathers, rel=1e-3)


def test_deepspeed_before_0_6_passes_over_each_collectives_bytes_on_the_gpu(monkeypatch):
    """Around each ZeRO-3 collective DeepSpeed before v0.6 zero-fills the weight it gathers and
    torch's list all_gather copies it out (1 + 2 passes); DeepSpeed of spring 2021 flattens each
    gradient bucket, divides it in place and copies the all-reduced result back (2 + 2 + 2), and
    from v0.4.3 divides each gradient in place and torch's list reduce_scatter copies it into a
    flat buffer (2 + 2): 16-bit elements of Llama 3 8B's whole stage, at the GPU's memory rate,
    once per pass. The batched stacks copy nothing of the kind."""
    from simpar.cost.pricing import Pricing
    from simpar.network.model import DEFAULT_NETWORK
    from simpar.workload.params import stage_params

    big = load_cluster("dgx-h100", None)
    s = Strategy(dp=64, zero=3, micro_batch=1, stack="deepspeed")
    job = JobSpec(4096, 64)
    dense, expert = stage_params(M, s, 0, M.layers)
    nbytes = (dense + expert) * 2

    def sync(strategy, op) -> float:
        pricing = Pricing(M, big, job, strategy, network_for(big, strategy, DEFAULT_NETWORK))
        return gradsync.sharded_sync(pricing, op, dense, expert, M.layers)

    def all_three() -> list[float]:
        v043 = _deepspeed_with(monkeypatch, zero3_grad_allreduce=False, run=lambda: sync(
            s, "reducescatter"))
        return [sync(s, "allgather"), sync(s, "reducescatter"), v043]

    rate = hbm_rate(big.gpu)
    with_copies = all_three()
    for op in ("allgather", "reducescatter", "allreduce"):
        monkeypatch.setitem(gradsync.LIST_COPY_PASSES, op, 0)
    without = all_three()
    assert [a - b for a, b in zip(with_copies, without, strict=True)] == pytest.approx(
        [3 * nbytes / rate, 6 * nbytes / rate, 4 * nbytes / rate])
    monkeypatch.undo()
    batched = replace(s, stack="deepspeed-0.6")
    pricing = Pricing(M, big, job, batched, network_for(big, batched, DEFAULT_NETWORK))
    assert gradsync.list_copies_seconds(pricing, "allgather", nbytes) == 0.0


def test_deepspeed_2021_gathers_its_persistent_parameters_again_rank_by_rank_after_each_step(
        monkeypatch):
    """DeepSpeed's first ZeRO-3 releases partition even the parameters under 1e5 elements after
    backward and gather them again at the end of the step, copying each rank's piece into place
    from Python: narrow, view, narrow and copy_ (3 x 3.6 + 8 = 18.8 us) per parameter and rank.
    GPT-3 175B: per block two LayerNorms' weights and biases (4 x 12288) and the biases of qkv
    (36864), proj (12288), fc1 (49152) and fc2 (12288), all under 1e5: 8 a block, 96 blocks, and
    the final LayerNorm's 2: 770 tensors, each split over all 1536 ranks (pieces of 8 to 32)."""
    from simpar.cost.gradsync import persistent_regather_parts, persistent_tensors
    from simpar.cost.pricing import Pricing
    from simpar.network.model import DEFAULT_NETWORK

    gpt = MODELS["gpt3-175b"]
    s = Strategy(dp=1536, zero=3, micro_batch=1, recompute="full", stack="deepspeed")
    assert len(persistent_tensors(gpt, 1, 1, 1, True)) == 770
    job, a100 = JobSpec(2048, 1536, "fp16"), load_cluster("dgx-a100", None)
    parts = persistent_regather_parts(Pricing(gpt, a100, job, s,
                                              network_for(a100, s, DEFAULT_NETWORK)))
    # the loop, and the list of 1536 views the one all-gather of them all takes (8 us a rank)
    assert parts.host_s == pytest.approx(770 * 1536 * 18.8e-6 + 1536 * 8e-6)
    assert parts.bytes_per_collective == 96 * (6 * 12288 + 36864 + 49152) * 2 + 2 * 12288 * 2
    with_loop = predict(gpt, a100, job, s).breakdown["optimizer"]
    without = _deepspeed_with(monkeypatch, zero3_persistent_regather=False, run=lambda: predict(
        gpt, a100, job, s).breakdown["optimizer"])
    assert with_loop - without == pytest.approx(parts.total_s)
    # at 4h over 1e5 (h = 25600) fc1's bias is gathered with its weight instead: 7 a block
    wide = replace(gpt, hidden=25600, heads=100, kv_heads=100, ffn_hidden=4 * 25600)
    assert len(persistent_tensors(wide, 1, 1, 1, True)) == 7 * 96 + 2
    # a tensor of fewer elements than ranks has one element on each of the first n ranks
    few = replace(s, dp=65536)
    assert _regather(gpt, few) == pytest.approx(
        96 * (6 * 12288 + 36864 + 49152) * 18.8e-6 + 2 * 12288 * 18.8e-6 + 65536 * 8e-6)
    # the batched releases (v0.6 on) gather them coalesced
    assert _regather(gpt, replace(s, stack="deepspeed-0.6")) == 0.0


def _regather(model, s) -> float:
    from simpar.cost.gradsync import persistent_regather_seconds
    from simpar.cost.pricing import Pricing
    from simpar.network.model import FREE_NETWORK

    return persistent_regather_seconds(Pricing(model, H100, JobSpec(2048, s.dp), s,
                                               FREE_NETWORK))


def test_deepspeed_2021_all_reduces_its_gradient_buckets():
    """Before v0.4.3 (contiguous_gradients off) DeepSpeed's ZeRO-3 all-reduces each flat gradient
    bucket and keeps its shard: the ring moves twice a reduce-scatter's bytes. Bandwidth share
    of GPT-3's fp16 gradients over 384 A100s, the same buckets (one per weight matrix)."""
    from simpar.cost.gradsync import bucketed, zero_reduce_op
    from simpar.cost.pricing import Pricing
    from simpar.network.model import DEFAULT_NETWORK

    gpt, a100 = MODELS["gpt3-175b"], load_cluster("dgx-a100", None)
    s = Strategy(dp=384, zero=3, micro_batch=4, recompute="full", stack="deepspeed")
    job = JobSpec(2048, 1536, "fp16")
    assert zero_reduce_op(s, job) == "allreduce"
    assert zero_reduce_op(replace(s, stack="deepspeed-0.6"), job) == "reducescatter"
    assert zero_reduce_op(replace(s, zero=1), job) == "reducescatter"
    p = Pricing(gpt, a100, job, s, network_for(a100, s, DEFAULT_NETWORK))
    nbytes = 12 * 12288**2 * 96 * 2

    def bandwidth(op: str) -> float:
        return bucketed(p.net, op, nbytes, "dpcp", 384) - 384 * p.net.collective(op, 1.0, "dpcp")

    assert bandwidth("allreduce") == pytest.approx(2 * bandwidth("reducescatter"), rel=0.05)


def test_deepspeed_gathers_again_for_full_recompute_and_keeps_only_what_it_reuses_soon():
    """DeepSpeed's ZeRO-3 hooks each module's forward, so full recompute gathers a block again.
    After a module's recomputed forward it stays gathered for its backward when the modules run
    in between (those after it: recomputed once, then their backward) hold under 1e9 elements.
    GPT-3 175B, h = 12288, h^2 = 1.51e8: qkv 3h^2, proj h^2, fc1 4h^2, fc2 4h^2. fc2 (nothing
    after it) is kept; fc1 (2 x 4h^2 = 1.2e9 after it) and the two before it are freed: 8/12 of
    the block is gathered a third time. At tp 2 every count halves, fc1 (0.6e9) is kept too."""
    from simpar.cost.step import zero3_gathers, zero3_passes

    gpt = MODELS["gpt3-175b"]
    ds = Strategy(dp=64, zero=3, stack="deepspeed", recompute="full")
    assert zero3_passes(ds, gpt, "F") == 1
    assert zero3_passes(ds, gpt, "B") == pytest.approx(1 + 8 / 12)
    assert zero3_passes(replace(ds, tp=2, dp=32), gpt, "B") == pytest.approx(1 + 4 / 12)
    assert zero3_gathers(replace(ds, recompute="none"), gpt) == 2
    # a small model's whole block is under the distance: the recompute's gather serves backward
    assert zero3_passes(ds, M, "B") == 1
    # FSDP gathers for the checkpointed block once, in its backward
    assert zero3_gathers(replace(ds, stack="fsdp"), gpt) == 2
    # the third gather is priced, and by both engines alike (the event engine also exposes the
    # last reduce-scatter, so their increments are compared)
    from simpar.cost.pricing import Pricing
    from simpar.network.model import DEFAULT_NETWORK
    from simpar.sim.engine import simulate
    from simpar.workload.params import stage_params

    job, big = JobSpec(2048, 64), load_cluster("dgx-a100", None)
    analytic, event = {}, {}
    for rc in ("none", "full"):
        s = replace(ds, micro_batch=1, recompute=rc)
        analytic[rc] = predict(gpt, big, job, s, check=False).breakdown["dp_comm"]
        event[rc] = simulate(gpt, big, job, s).first.breakdown["dp_comm"]
    s = replace(ds, micro_batch=1)
    pricing = Pricing(gpt, big, job, s, network_for(big, s, DEFAULT_NETWORK))
    gather = gradsync.sharded_sync(pricing, "allgather", *stage_params(gpt, s, 0, 96), 96)
    assert analytic["full"] - analytic["none"] == pytest.approx(gather * 8 / 12, rel=0.05)
    assert event["full"] - event["none"] == pytest.approx(gather * 8 / 12, rel=0.05)


def test_a_fused_norm_keeps_no_fp32_copies_and_moves_fewer_bytes(capsys):
    """--norm fused (one 16-bit kernel: torchtitan's fused_rmsnorm of 2024, Transformer Engine)
    against torchtitan's eager RMSNorm, which upcasts to fp32 op by op and whose fp32 input and
    normalised output autograd keeps: 4 + 4 bytes per element beside the 2-byte output the next
    GEMM keeps anyway, for each of a layer's two norms. Llama 3 8B, 8192 tokens, no recompute."""
    job = JobSpec(8192, 8)
    eager = Strategy(dp=8, zero=3, stack="torchtitan")
    fused = replace(eager, norm="fused")
    saved = {s.norm: memory_breakdown(M, job, s).activations_gib for s in (eager, fused)}
    from simpar.memory.model import GIB

    per_layer_token = 2 * (4 + 4 - 2) * M.hidden
    assert (saved[""] - saved["fused"]) * GIB == pytest.approx(
        per_layer_token * 8192 * M.layers, rel=1e-6)
    assert predict(M, H100, job, fused).step_time_s < predict(M, H100, job, eager).step_time_s
    assert main(["simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8",
                 "--seq-len", "8192", "--global-batch", "8", "--stack", "torchtitan", "--norm",
                 "fused", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["strategy"]["norm"] == "fused"


def test_execpars_norm_is_torchs_fused_kernel_on_a_gpu_and_eager_ops_on_a_cpu(capsys, tmp_path):
    """execpar's norms are torch's nn.RMSNorm: on CUDA one fused kernel (the stack's norm), on a
    CPU device a composite of eager fp32 ops, which a plan priced for a CPU device says (--norm
    fp32)."""
    import yaml

    from simpar.specs.stack import get_stack

    assert not get_stack("execpar").norm_fp32 and get_stack("execpar").torch_rms_norm
    cpu = yaml.safe_load((Path(__file__).parents[1] / "reports" / "cpu-validation" /
                          "profile.yaml").read_text())
    profile = tmp_path / "cpu.yaml"
    profile.write_text(yaml.safe_dump(cpu))
    norms = {}
    for where in (["--gpu", "h100-sxm"], ["--cluster", str(profile)]):
        assert main(["simulate", "--model", "llama3-8b", "--gpus", "1", "--seq-len", "2048",
                     "--global-batch", "1", "--stack", "execpar", "--json", *where]) == 0
        norms[where[0]] = json.loads(capsys.readouterr().out)["strategy"]["norm"]
    assert norms == {"--gpu": "", "--cluster": "fp32"}


def test_attention_names_the_kernel_the_software_calls(capsys):
    """--attention best (torchtitan 0.2 puts cuDNN's first in its SDPA list) against the
    stack's FlashAttention-2: faster on an H100, where FA2 reaches about 35% of peak, and the
    same on an A100, where FA2 is the best kernel; the choice goes into the strategy."""
    job = JobSpec(8192, 8)
    fa2 = Strategy(dp=8, zero=3, stack="torchtitan")
    best = replace(fa2, attention="best")
    assert fa2.profile.attention == "fa2" and best.profile.attention == "best"
    assert predict(M, H100, job, best).step_time_s < predict(M, H100, job, fa2).step_time_s
    a100 = dgx_like("a100-80gb")
    assert predict(M, a100, job, best).step_time_s == predict(M, a100, job, fa2).step_time_s
    assert main(["simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8",
                 "--seq-len", "8192", "--global-batch", "8", "--stack", "torchtitan",
                 "--attention", "best", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["strategy"]["attention"] == "best"
    from simpar.errors import SpecError

    with pytest.raises(SpecError, match="attention"):
        Strategy(stack="torchtitan", attention="flash3")


def test_torchs_ring_attention_merges_in_eager_fp32_and_transformer_engine_in_one_kernel():
    """Each ring step after the first merges its partial output into the running one: TE runs one
    fused kernel in bf16 (6 bytes per output element), torch's _SDPAMerger five eager fp32 ops (38
    bytes). Llama 3 8B at 8,192 tokens over cp 4: 3 merges of 2,048 x 4,096 outputs per layer."""
    from simpar.cost.layer import strategy_layer_work
    assert (STACKS["megatron"].cp_merge_bytes, STACKS["torchtitan"].cp_merge_bytes) == (6, 38)
    assert STACKS["execpar"].cp_merge_bytes == 38  # it calls torch's context_parallel too
    work = {(name, cp): strategy_layer_work(M, JOB, Strategy(dp=1, cp=cp, stack=name))
            for name in ("megatron", "torchtitan") for cp in (1, 4)}
    # the same stack with and without cp: the merges are the difference in the forward's bytes
    # beyond the per-token kernels (which cp splits 4 ways)
    merges = 3 * 2048 * 4096
    for name, per_elem in (("megatron", 6), ("torchtitan", 38)):
        one, four = work[name, 1], work[name, 4]
        assert four.elementwise_bytes - one.elementwise_bytes / 4 == pytest.approx(
            merges * per_elem)


def test_a_strategy_replaced_onto_another_stack_takes_that_stacks_kernels():
    """Strategy resolves the kernels and attention it leaves unsaid from its stack when asked, so
    dataclasses.replace onto another stack prices that stack's (it used to keep the first's)."""
    s = Strategy(dp=8, zero=3, micro_batch=2)
    tt = replace(s, stack="torchtitan")
    assert (s.elementwise, tt.elementwise, replace(tt, compile=True).elementwise) == (
        "fused", "eager", "fused")
    assert replace(s, stack="deepspeed").flash is False and s.flash is True
    assert replace(s, kernels="eager").elementwise == "eager"
    assert tt.to_dict()["kernels"] == "eager" and tt.pinned().kernels == "eager"
    assert predict(M, H100, JOB, tt).step_time_s == predict(
        M, H100, JOB, Strategy(dp=8, zero=3, micro_batch=2, stack="torchtitan")).step_time_s


def test_torchtitan_on_one_rank_runs_no_fsdp_but_autocast(capsys):
    """torchtitan applies FSDP only with a second data-parallel rank (parallel_dims.fsdp_enabled)
    and otherwise autocasts forward and loss (maybe_enable_amp): on one GPU the default is ZeRO
    0, and at the loss autocast's cache holds a 16-bit copy of every multiplied weight, unless a
    compiled block casts in its graph and recomputes the casts under full recompute."""
    from simpar.memory.model import GIB

    def default_zero(gpus: int) -> int:
        assert main(["simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", str(gpus),
                     "--seq-len", "2048", "--global-batch", "8", "--stack", "torchtitan",
                     "--json"]) == 0
        return json.loads(capsys.readouterr().out)["strategy"]["zero"]

    assert (default_zero(1), default_zero(8)) == (0, 3)
    tiny = ModelSpec(name="tiny", layers=4, hidden=1024, heads=8, kv_heads=8, ffn_hidden=4096,
                     vocab=32000)
    s = Strategy(stack="torchtitan", micro_batch=4, recompute="full")
    job = JobSpec(2048, 4)
    eager = memory_breakdown(tiny, job, s)
    compiled = memory_breakdown(tiny, job, replace(s, compile=True))
    assert s.profile.autocast and not replace(s, zero=3).profile.autocast
    # every weight but the looked-up embedding, 2 bytes each
    assert (eager.buffers_gib - compiled.buffers_gib) * GIB == pytest.approx(
        2 * (tiny.total_params - 32000 * 1024))


def test_torchtitan_gathers_its_fp8_linears_weights_in_fp8_under_zero3():
    """torchtitan's float8 recipe casts each linear's weight shard to fp8 before FSDP gathers
    it: a gather moves one byte per linear weight element (two for the embedding, output layer
    and norms), and the layer no longer casts the gathered weight itself."""
    from simpar.report.dpsync import zero_passes
    from simpar.workload.fp8_casts import torchao_casts

    job = JobSpec(8192, 16, "fp8")

    def gathered_bytes(stack: str, zero: int, dtype: str = "fp8") -> float:
        s = Strategy(dp=8, zero=zero, micro_batch=2, stack=stack, compile=True)
        (ag, _) = zero_passes(M, H100, replace(job, dtype=dtype), s)
        return ag.parts.bytes_per_collective * ag.parts.collectives

    # Llama 3 8B on one rank (tp 1): 32 blocks of q, k, v, o and the gated MLP's three
    linears = 32 * (4096 * (4096 + 2 * 1024 + 4096) + 3 * 4096 * 14336)
    bf16_gather = gathered_bytes("execpar", 3)  # torchao's default: 16-bit gathers
    assert gathered_bytes("torchtitan", 3) == pytest.approx(bf16_gather - linears)
    assert gathered_bytes("torchtitan", 3, "bf16") == pytest.approx(bf16_gather)
    # only FSDP's gathers of ZeRO-3: ZeRO-1's gather of the updated weights stays 16-bit
    assert gathered_bytes("torchtitan", 1) == pytest.approx(gathered_bytes("execpar", 1))
    # the forward and backward casts of the weights go (compiled: 2 x 2 + 1 bytes each)
    gemms = layer_work(M, 8192, 2, 1, 1, 1, False, True, "fp8").gemms
    cast = torchao_casts(gemms, {}, True, 2)
    arrived = torchao_casts(gemms, {}, True, 2, cast_weights=False)
    weights = sum(g.n * g.k * g.count for g in gemms if g.name != "router")
    assert cast.forward_bytes - arrived.forward_bytes == pytest.approx(5 * weights)
    assert cast.backward_bytes - arrived.backward_bytes == pytest.approx(5 * weights)
    # and the layer torchtitan prices under ZeRO-3 is the one whose weights arrive cast
    from simpar.cost.layer import stack_layer_work

    def casts(zero3: bool):
        return stack_layer_work(M, 8192, 2, 1, 1, 1, False, True, "fp8", "fused",
                                STACKS["torchtitan"], zero3=zero3).casts
    assert casts(False).forward_bytes - casts(True).forward_bytes == pytest.approx(5 * weights)
    # and the two gathered blocks FSDP holds (the one in use, the one prefetched) take a byte a
    # linear weight element less
    from simpar.memory.model import _buffer_bytes

    s = Strategy(dp=8, zero=3, micro_batch=2, stack="torchtitan", compile=True)
    block = M.dense_params_per_layer + M.expert_params_per_layer

    def buffers(dtype: str) -> float:
        return _buffer_bytes(M, replace(job, dtype=dtype), s, 16384, block, True, True, 4)[0]
    assert buffers("bf16") - buffers("fp8") == pytest.approx(2 * linears / 32)


class _Net:
    """A network whose every transfer takes a second per GB, whatever its kind."""

    @staticmethod
    def collective(op, nbytes, group):
        return nbytes / 1e9

    @staticmethod
    def ring_shift(nbytes, group):
        return nbytes / 1e9


def test_torchs_ring_gathers_kv_twice_and_passes_fp32_dkv_on_each_step():
    """torch's ring attention at cp 4 (3 ring steps, 1 GB of K/V per chunk, 1 s per GB): forward
    all-gathers 4 GB behind the local chunk's attention (a quarter of it); backward gathers them
    again and passes the fp32 dK/dV accumulators (2 GB) on after each of its 4 steps, the last
    waited for at once. With 10 s of attention each way and a 20% overlap slowdown: forward
    4 - 2.5 + 0.2 x 2.5 = 2 s; backward 4 - 2.5 + 0.5 (the gather) + 0.2 x 6 (three 2 GB passes
    behind three 2.5 s steps) + 2 = 5.2 s. Compiled, each transfer waits where it is issued:
    4 s and 4 + 4 x 2 = 12 s. Transformer Engine's p2p ring hides its 3 GB behind forward and
    6 GB behind backward: 0.6 s and 1.2 s."""
    from types import SimpleNamespace

    from simpar.cost.layer import _cp_exposed

    work = SimpleNamespace(cp_steps=3, cp_kv_chunk_bytes=1e9)
    tt = get_stack("torchtitan")
    assert not tt.cp_waits_at_issue and get_stack("torchtitan", compile=True).cp_waits_at_issue
    assert get_stack("execpar", compile=True).cp_waits_at_issue
    assert not get_stack("megatron").cp_waits_at_issue

    def exposed(stack):
        return _cp_exposed(work, _Net, stack, 10.0, 10.0, 0.2)

    assert exposed(tt) == pytest.approx((2.0, 5.2))
    assert exposed(get_stack("torchtitan", compile=True)) == pytest.approx((4.0, 12.0))
    assert exposed(get_stack("megatron")) == pytest.approx((0.6, 1.2))


def test_te_writes_transposed_fp8_copies_on_hopper_only():
    """Transformer Engine's per-tensor fp8 casts write a transposed copy beside the row-wise one
    where the fp8 GEMMs take only the TN layout (H100: one byte more per cast element), not on
    Blackwell, whose fp8 GEMMs take any layout; torchao's casts (torchtitan) are priced on their
    own (fp8_casts.py)."""
    from simpar.cost.layer import stack_layer_work, te_transpose_bytes
    from simpar.specs import dgx_like

    m = MODELS["llama3-8b"]
    work = stack_layer_work(m, 8192, 1, 1, 1, 1, False, True, "fp8", "fused", STACKS["megatron"])
    assert work.fused_cast_elements == 8192 * (2 * 4096 + 4096 + 14336)
    h100, b200 = dgx_like("h100-sxm").gpu, dgx_like("b200").gpu
    assert te_transpose_bytes(work, h100, STACKS["megatron"], "fp8") == work.fused_cast_elements
    assert te_transpose_bytes(work, b200, STACKS["megatron"], "fp8") == 0
    assert te_transpose_bytes(work, h100, STACKS["torchtitan"], "fp8") == 0


def test_a_stacks_plain_name_prices_the_code_of_its_published_runs_on_that_gpu(capsys, tmp_path):
    """Named without a version, a stack with eras prices the code its published runs on the GPU's
    generation ran: Megatron-LM on V100s and A100s without Transformer Engine (most of them 2021's),
    DeepSpeed on Hopper after v0.6, torchtitan on Blackwell its 0.2. The header says so; a version
    (or Megatron core's name) picks another, and plans record the profile priced."""
    def priced(gpu, stack=None):
        out = _json(capsys, "simulate", "--model", "llama3-8b", "--gpu", gpu, "--gpus", "8",
                    "--seq-len", "2048", "--global-batch", "16", "--dtype", "fp16",
                    *(["--stack", stack] if stack else []))
        return out["strategy"]["stack"], out["notes"]

    for gpu, stack, profile in (
            ("a100-80gb", "megatron", "megatron-2021"), ("a100-80gb", None, "megatron-2021"),
            ("v100-32gb", "Megatron-LM", "megatron-2021"), ("h100-sxm", "megatron", "megatron"),
            ("a100-80gb", "megatron@2023", "megatron"), ("a100-80gb", "mcore", "megatron"),
            ("a100-80gb", "megatron@2022", "megatron-2022"),
            ("a100-80gb", "deepspeed", "deepspeed"),
            ("h100-sxm", "megatron-deepspeed", "deepspeed-0.6"), ("h100-sxm", "gpt-neox",
                                                                  "deepspeed-0.6"),
            ("h100-sxm", "deepspeed@0.5", "deepspeed"), ("h100-sxm", "torchtitan", "torchtitan"),
            ("b200", "torchtitan", "torchtitan-0.2"), ("b200", "torchtitan@0.1", "torchtitan")):
        assert priced(gpu, stack)[0] == profile, (gpu, stack)
    era, notes = priced("a100-80gb", "megatron")
    assert any("Megatron-LM of 2021" in n and "--stack megatron@2023" in n for n in notes)
    assert not any("Megatron-LM of" in n for n in priced("a100-80gb", "mcore")[1])
    # the unfused attention of 2021's code makes the same A100 step slower than today's
    step = {s: _json(capsys, "simulate", "--model", "llama3-8b", "--gpu", "a100-80gb", "--gpus",
                     "8", "--seq-len", "4096", "--global-batch", "16", "--stack", s)["step_time_s"]
            for s in ("megatron", "mcore")}
    assert step["megatron"] > 1.05 * step["mcore"]
    plan = tmp_path / "plan.json"
    assert main(["plan", "--model", "llama3.2-1b", "--gpu", "a100-80gb", "--gpus", "8", "--seq-len",
                 "2048", "--global-batch", "16", "--stack", "megatron", "--out", str(plan)]) == 0
    capsys.readouterr()
    assert json.loads(plan.read_text())["strategy"]["stack"] == "megatron-2021"
    # compare says which software it ranked, and where a plain name took an era, which it took
    ranked = ["compare", "--model", "llama3.2-1b", "--gpus", "8", "--seq-len", "2048",
              "--global-batch", "16", "--top", "1"]
    assert main([*ranked, "--gpu", "a100-80gb"]) == 0
    assert "stack: Megatron-LM of 2021" in capsys.readouterr().out
    assert main([*ranked, "--gpu", "h100-sxm", "--stack", "nemo"]) == 0
    assert "\nstack: nemo\n" in capsys.readouterr().out
    # ... and so does scale, in its JSON too
    assert main(["scale", "--model", "llama3.2-1b", "--gpu", "a100-80gb", "--gpu-list", "8",
                 "--seq-len", "2048", "--global-batch", "16", "--out", str(tmp_path / "scale"),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stack"] == "megatron-2021"
    # the line follows the flags: DeepSpeed of 2021 told to run FlashAttention-2 is not the old
    # code the note describes
    scaled = ["scale", "--model", "llama3.2-1b", "--gpu", "a100-80gb", "--gpu-list", "8",
              "--seq-len", "2048", "--global-batch", "16", "--stack", "deepspeed"]
    assert main([*scaled, "--out", str(tmp_path / "ds")]) == 0
    assert "DeepSpeed as released before v0.6" in capsys.readouterr().out
    assert main([*scaled, "--attention", "fa2", "--out", str(tmp_path / "ds-fa2")]) == 0
    assert capsys.readouterr().out.startswith("stack: deepspeed\n")


def test_torchtitan_of_2024_points_at_todays_release(capsys):
    """`--stack torchtitan` prices its 2024 code, and says which profile prices today's; not
    where the user already named today's attention kernel, nor under torchtitan-0.2."""
    from simpar.cli.parser import main

    base = ["simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len",
            "4096", "--global-batch", "16"]
    hint = "--stack torchtitan-0.2 prices today's release"
    assert main([*base, "--stack", "torchtitan"]) == 0
    assert hint in capsys.readouterr().out
    for told in (["--stack", "torchtitan", "--attention", "best"], ["--stack", "torchtitan-0.2"]):
        assert main([*base, *told]) == 0
        assert hint not in capsys.readouterr().out


def test_deepspeed_of_2021_points_at_todays_releases(capsys):
    """`--stack deepspeed` prices DeepSpeed before v0.6 (its published 2021-22 runs), and says
    which profile prices today's releases; not where the user named an attention kernel, nor
    under deepspeed@0.6."""
    from simpar.cli.parser import main

    base = ["simulate", "--model", "llama3-8b", "--gpu", "a100-80gb", "--gpus", "8", "--seq-len",
            "4096", "--global-batch", "16"]
    hint = "--stack deepspeed@0.6 prices today's releases"
    assert main([*base, "--stack", "deepspeed"]) == 0
    assert hint in capsys.readouterr().out
    # scripts read the same line in the JSON document's notes
    assert any(hint in note for note in _json(capsys, *base, "--stack", "deepspeed")["notes"])
    for told in (["--stack", "deepspeed", "--attention", "fa2"], ["--stack", "deepspeed@0.14"]):
        assert main([*base, *told]) == 0
        assert hint not in capsys.readouterr().out


def test_torchtitan_0_2_is_the_2024_stack_with_todays_code():
    """--stack torchtitan-0.2 prices torchtitan v0.2.2 as released: what the 2024 profile prices
    only when told --attention best --norm fused --optimizer fused (and, compiled, --loss fused),
    and grouped K/V handed to SDPA whole, so that autograd keeps kv_heads of them, not n_heads:
    2 x 2 bytes x (q_dim - kv_dim) less a token and layer (Llama 3 8B: 3,072 x 4 = 12 KiB)."""
    job = JobSpec(4096, 2)
    for compiled in (False, True):
        new = Strategy(micro_batch=2, zero=3, stack="torchtitan-0.2", compile=compiled)
        told = replace(new, stack="torchtitan", attention="best", norm="fused",
                       optimizer="fused", loss="fused" if compiled else "fp32")
        a, b = predict(M, H100, job, new), predict(M, H100, job, told)
        assert a.step_time_s == pytest.approx(b.step_time_s, rel=1e-9)
        # the step's peak: every layer's kept activations of the micro-batch less the expansion
        saved = M.layers * 2 * 4096 * 2 * 2 * (M.q_dim - M.kv_dim) / GIB
        assert b.memory.peak_allocated_gib - a.memory.peak_allocated_gib == pytest.approx(
            saved, rel=0.02)
    # and it runs faster than the 2024 code: cuDNN's attention, fused AdamW, one fused norm kernel
    eager = Strategy(micro_batch=2, zero=3, stack="torchtitan")
    assert (predict(M, H100, job, replace(eager, stack="torchtitan-0.2")).step_time_s
            < predict(M, H100, job, eager).step_time_s)
    # its pipeline schedule keeps no stage outputs (train.py: step(return_outputs=False))
    assert STACKS["torchtitan-0.2"].pipeline_outputs_kept == "none"
    assert STACKS["torchtitan"].pipeline_outputs_kept == "all"
