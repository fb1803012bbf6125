"""Memory as the caching allocator sees it: the peak at the loss or in the optimizer
step, the loss's fp32 temporaries, autocast's weight copies, fragmentation, and refusing
plans that do not fit."""

import json
from dataclasses import replace

import pytest

from execpar import cli as execpar_cli
from simpar.cli import main
from simpar.errors import SpecError
from simpar.memory.model import (
    ALLOCATOR_FRAGMENTATION,
    EXPANDABLE_FRAGMENTATION,
    GIB,
    RUNTIME_RESERVED_GIB,
    memory_breakdown,
)
from simpar.specs import JobSpec, ModelSpec, Strategy
from simpar.specs.plan import load_plan

# A small Llama-like model: every figure below is worked out by hand from its shapes.
M = ModelSpec(name="tiny", layers=4, hidden=1024, heads=8, kv_heads=8, ffn_hidden=4096, vocab=32000)
# eager, autocast bf16, fp32 weights, fused AdamW
ONE = Strategy(dp=1, stack="execpar", micro_batch=4)


def _params() -> int:
    per_layer = 4 * 1024 * 1024 + 3 * 1024 * 4096 + 2 * 1024  # q, k, v, o; w1, w2, w3; two norms
    return 4 * per_layer + 2 * 32000 * 1024 + 1024  # untied embedding and output layer, final norm


def test_peak_at_the_loss_holds_activations_autocast_copies_and_fp32_loss_temporaries():
    job = JobSpec(2048, 4)
    mem = memory_breakdown(M, job, ONE)
    psi, tokens = _params(), 4 * 2048
    assert M.total_params == psi
    assert mem.peak_phase == "backward"
    # fp32 weights, Adam m and v
    assert mem.weights_gib * GIB == 4 * psi and mem.optimizer_gib * GIB == 8 * psi
    # one micro-batch, set_to_none: no gradient exists yet at the loss
    assert mem.gradients_gib == 0
    # 16-bit logits and gradient; one 1,024-token chunk's fp32 loss
    loss = (4 * tokens + 12 * 1024) * 32000
    comm = 2 * tokens * 1024 * 2  # the current layer's 16-bit activation, twice
    # the bf16 copy of every weight a GEMM multiplies by, saved for its backward; the input
    # embedding is looked up, in fp32 (execpar's runs on an H100 and two H200s peaked within
    # 1.1% of the prediction without it, 3.1% high with it)
    casts = 2 * (psi - 32000 * 1024)
    assert mem.buffers_gib * GIB == pytest.approx(loss + comm + casts)
    tied = replace(M, tied_embeddings=True)  # the output layer multiplies by the embedding
    assert memory_breakdown(tied, job, ONE).buffers_gib * GIB == pytest.approx(
        loss + comm + 2 * tied.total_params)
    # ... but not the first of two pipeline stages' copy of it, which is only looked up
    from simpar.workload.params import chunk_params, multiplied_params

    two = replace(ONE, pp=2)
    dense, expert = chunk_params(tied, two, 2, True, False)
    assert multiplied_params(tied, two, True, dense, expert) == dense + expert - 32000 * 1024
    # execpar launches with expandable segments; a stack that does not (Megatron-LM)
    # keeps more slack
    assert mem.peak_reserved_gib == pytest.approx(mem.peak_allocated_gib *
                                                  (1 + EXPANDABLE_FRAGMENTATION))
    assert mem.total_gib == pytest.approx(mem.peak_reserved_gib + RUNTIME_RESERVED_GIB)
    megatron = memory_breakdown(M, job, replace(ONE, stack="megatron"))
    assert megatron.peak_reserved_gib == pytest.approx(megatron.peak_allocated_gib *
                                                       (1 + ALLOCATOR_FRAGMENTATION))


def test_torchtitans_eager_runs_reserved_their_freed_logits_beside_the_allocators_slack():
    """torchtitan's runs on the lent H200 (reports/torchtitan-h200): the eager ones take the loss
    on fp32 logits, whose freed 16-bit logits (2 bytes a logit, 128,256 of them a token) stay
    reserved; less that block, they reserved a median under the expandable segments' 3% above
    their peak active bytes, as their compiled twins (a compiled loss) did with no block at all."""
    import re
    from pathlib import Path
    from statistics import median

    from simpar.memory.model import FREED_LOGITS_BYTES

    rows = json.loads((Path(__file__).parents[1] / "reports" / "torchtitan-h200" /
                       "report.json").read_text())["rows"]

    def slack(row, freed: bool) -> float:
        seq_k, micro = map(int, re.search(r"-s(\d+)k-mb(\d+)", row["id"]).groups())
        block = FREED_LOGITS_BYTES * seq_k * 1024 * micro * 128256 / GIB if freed else 0.0
        return (row["reserved_gib"] - block) / row["active_gib"] - 1

    eager = [slack(r, True) for r in rows if "compile" not in r["id"]]
    compiled = [slack(r, False) for r in rows if "compile" in r["id"]]
    assert len(eager) == len(compiled) == 4
    assert min(eager) > 0 and median(eager) < EXPANDABLE_FRAGMENTATION
    assert max(compiled) < EXPANDABLE_FRAGMENTATION
    # without the block the eager runs would sit far above it
    assert median(slack(r, False) for r in rows if "compile" not in r["id"]) > 0.08
    # the model: eager and compiled blocks keep the same slack; only the eager loss caches logits
    # (torchtitan 0.2 compiles the loss with the blocks: --loss fused)
    s = Strategy(dp=1, zero=3, stack="torchtitan", micro_batch=4)
    job = JobSpec(2048, 4)
    for compiled_block in (False, True):
        mem = memory_breakdown(M, job, replace(s, compile=compiled_block,
                                               loss="fused" if compiled_block else ""))
        assert mem.fragmentation_gib == pytest.approx(
            EXPANDABLE_FRAGMENTATION * mem.peak_allocated_gib)
        assert mem.cached_logits_gib * GIB == pytest.approx(
            0 if compiled_block else FREED_LOGITS_BYTES * 4 * 2048 * 32000)


def test_accumulated_gradients_are_alive_at_the_second_micro_batch():
    one, two = memory_breakdown(M, JobSpec(2048, 4),
                                ONE), memory_breakdown(M, JobSpec(2048, 8), ONE)
    assert (
        two.gradients_gib * GIB == 4 * _params() and two.peak_allocated_gib > one.peak_allocated_gib
    )
    # Megatron keeps its gradient buffer across steps: counted even with one micro-batch
    megatron = memory_breakdown(M, JobSpec(2048, 4), replace(ONE, stack="megatron"))
    assert megatron.gradients_gib * GIB == 4 * _params()


def test_foreach_adamw_peaks_in_the_step_with_one_fp32_temporary_per_parameter():
    # full recompute and a short sequence: the optimizer step is the peak, 4 + 4 + 8 + 4 = 20
    # bytes per parameter (plain FSDP's torch.optim.AdamW as fms-fsdp calls it, here unsharded)
    mem = memory_breakdown(M, JobSpec(128, 2),
                           replace(ONE, micro_batch=1, recompute="full", stack="fsdp"))
    assert mem.peak_phase == "optimizer" and mem.activations_gib == 0
    assert mem.peak_allocated_gib * GIB == pytest.approx(20 * _params())
    fused = memory_breakdown(M, JobSpec(128, 2), replace(ONE, micro_batch=1, recompute="full"))
    # fused AdamW allocates no temporary: its step (16 bytes per parameter) is no longer the peak
    assert fused.peak_phase == "backward" and fused.peak_allocated_gib * GIB < 20 * _params()


def test_fsdp_holds_its_root_unit_gathered_and_caches_gradients_in_the_reduce_scatter_stream():
    """FSDP2 on 8 ranks (torchtitan, one micro-batch): at the loss the root unit (embedding,
    output layer, final norm) is gathered in bf16 beside the two prefetched layers; last step's
    sharded fp32 gradients, the reduce-scatter stream's outputs, are freed by zero_grad but stay
    reserved in that stream's pool. Accumulating over micro-batches they are allocated instead."""
    s = Strategy(dp=8, zero=3, stack="torchtitan", micro_batch=1)
    job = JobSpec(2048, 8)
    mem = memory_breakdown(M, job, s)
    psi = _params()
    layer = 4 * 1024 * 1024 + 3 * 1024 * 4096 + 2 * 1024
    root = 2 * 32000 * 1024 + 1024
    tokens = 2048
    logits = 12 * tokens * 32000  # fp32 loss
    comm = 2 * tokens * 1024 * 2 + (2 * 2 + 2) * layer  # activation; two gathered layers, grads
    assert mem.buffers_gib * GIB == pytest.approx(logits + comm + 2 * root)
    assert mem.gradients_gib == 0 and mem.cached_gradients_gib * GIB == pytest.approx(4 * psi / 8)
    # the freed 16-bit logits (2 bytes each) stay reserved beside the loss's fp32 tensors
    assert mem.cached_logits_gib * GIB == pytest.approx(2 * tokens * 32000)
    assert mem.peak_reserved_gib == pytest.approx(
        mem.peak_allocated_gib * (1 + EXPANDABLE_FRAGMENTATION) + mem.cached_gradients_gib
        + mem.cached_logits_gib)
    # two micro-batches: the first one's gradients are allocated (held), none cached beside them
    two = memory_breakdown(M, JobSpec(2048, 16), s)
    assert two.gradients_gib * GIB == pytest.approx(4 * psi / 8) and two.cached_gradients_gib == 0
    # Megatron's persistent gradient buffer is allocated all along
    assert memory_breakdown(M, job, replace(s, stack="megatron")).cached_gradients_gib == 0


def test_each_losss_code_holds_its_own_bytes_a_logit_and_only_torchs_caches_the_logits():
    """A vocabulary so large that the loss is the peak, one rank, one micro-batch of 8,192
    tokens. torch's cross_entropy(logits.float()) holds log_softmax's output, nll_loss's gradient
    and log_softmax's gradient at once (12 bytes a logit), and its freed 16-bit logits (2) stay
    reserved; Megatron's vocab_parallel_cross_entropy turns its fp32 copy into the softmax and
    that into the gradient, which it casts into the 16-bit logits' freed block (4 + 2)."""
    big = replace(M, vocab=1_000_000)
    job, logits = JobSpec(8192, 1), 8192 * 1_000_000
    s = Strategy(dp=1, micro_batch=1, recompute="full")
    # without FSDP the fsdp stack (Hugging Face's Trainer) autocasts fp32 weights: at the loss
    # autocast's cache holds a 16-bit copy of every weight a GEMM multiplies by (all but the
    # embedding, which is looked up)
    casts = {"fsdp": 2 * (_params() + (1_000_000 - 32000) * 1024 * 2 - 1_000_000 * 1024)}
    torch_loss = memory_breakdown(big, job, replace(s, stack="fsdp"))
    megatron = memory_breakdown(big, job, replace(s, stack="megatron"))
    assert torch_loss.cached_logits_gib * GIB == pytest.approx(2 * logits)
    assert megatron.cached_logits_gib == 0
    # the loss alone differs: what each counts as buffers beside it is under 1% of a logit's byte
    # Megatron's fusion ("native") runs the same steps jit-fused; NeMo's performance recipes take
    # Transformer Engine's, which writes the gradient into the 16-bit logits
    fused = replace(s, loss="fused")
    for stack, loss, per_logit in (("fsdp", "", 12), ("megatron", "", 6), ("megatron", "fused", 6),
                                   ("nemo", "fused", 2), ("fsdp", "fused", 4)):
        mem = memory_breakdown(big, job, replace(fused, stack=stack, loss=loss))
        rest = mem.buffers_gib * GIB - per_logit * logits - casts.get(stack, 0)
        assert 0 < rest < 0.01 * logits, stack


def test_chunked_loss_holds_16_bit_logits_and_one_chunks_fp32_temporaries():
    # execpar's loss: 16-bit logits and their gradient (4 bytes per logit) for the
    # micro-batch's 8,192 tokens, plus 12 fp32 bytes per logit for one chunk of 1,024
    # tokens, against 12 for all of them
    job = JobSpec(2048, 4)
    chunked = memory_breakdown(M, job, ONE)
    # fsdp: fp32 loss, otherwise the same buffers (autocast's weight copies too: without FSDP
    # Hugging Face's Trainer autocasts fp32 weights as execpar does)
    whole = memory_breakdown(M, job, replace(ONE, stack="fsdp"))
    assert (whole.buffers_gib - chunked.buffers_gib) * GIB == pytest.approx(
        (12 - 4) * 8192 * 32000 - 12 * 1024 * 32000)


def test_fused_loss_needs_a_third_of_the_fp32_one():
    job = JobSpec(2048, 4)
    fp32 = memory_breakdown(M, job, replace(ONE, stack="torchtitan"))
    fused = memory_breakdown(M, job, replace(ONE, stack="torchtitan", compile=True, loss="fused"))
    assert (fp32.buffers_gib - fused.buffers_gib) * GIB == pytest.approx(
        (12 - 4) * 4 * 2048 * 32000)


def test_loss_flag_prices_the_loss_the_code_runs_over_the_stacks(capsys):
    # torchtitan's 2024 releases compiled the blocks, not the loss (but from 2024-10-22 to
    # 2024-12-18); from Apr 2025 it compiles both: --loss fused prices the compiled loss, 4 bytes
    # per logit at the peak against the eager fp32 loss's 12, and fewer passes in time
    job = JobSpec(2048, 4)
    compiled = replace(ONE, stack="torchtitan", compile=True, loss="fused")
    eager_loss = memory_breakdown(M, job, replace(compiled, loss="fp32"))
    assert (
        eager_loss.buffers_gib - memory_breakdown(M, job, compiled).buffers_gib
    ) * GIB == pytest.approx((12 - 4) * 4 * 2048 * 32000)
    assert replace(compiled, loss="fp32", stack="fsdp").loss_kind == "fp32"
    # the stack's, unresolved
    assert replace(ONE, stack="fsdp").loss_kind == "fp32" and ONE.loss_kind == "chunked"
    args = [
        "simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "8192",
        "--global-batch", "16", "--dp", "8", "--stack", "torchtitan", "--compile", "--engine",
        "analytic", "--json"
    ]
    docs = []
    for extra in (["--loss", "fused"], []):
        assert main(args + extra) == 0
        docs.append(json.loads(capsys.readouterr().out))
    assert docs[1]["step_time_s"] > docs[0]["step_time_s"]
    assert docs[1]["memory"]["peak_allocated_gib"] - docs[0]["memory"][
        "peak_allocated_gib"] == pytest.approx(8 * 8192 * 128256 / GIB,
                                               rel=1e-6)  # one micro-batch of 8,192 tokens
    with pytest.raises(SystemExit) as exit_:
        main(args + ["--loss", "fp33"])
    assert exit_.value.code == 2 and "did you mean 'fp32'" in capsys.readouterr().err


PLAN = ["plan", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "1", "--seq-len", "8192",
        "--global-batch", "4", "--micro-batch", "4"]


def test_plan_refuses_a_plan_that_does_not_fit(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(PLAN + ["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(
        err.splitlines()) == 1 and "biggest part is activations" in err and "--recompute" in err
    assert not out.exists()
    assert main(PLAN + ["--out", str(out), "--force"]) == 0 and out.exists()


def test_launch_refuses_a_plan_larger_than_the_gpu_it_finds(tmp_path, monkeypatch, capsys):
    out = tmp_path / "plan.json"
    assert main(PLAN + ["--out", str(out), "--force"]) == 0
    capsys.readouterr()
    need = json.loads(out.read_text())["prediction"]["memory"]["total_gib"]
    monkeypatch.setattr(execpar_cli, "_device_memory_gib", lambda device: 80.0)
    monkeypatch.setattr(execpar_cli, "_torchrun",
                        lambda *a, **k: pytest.fail("torchrun must not start"))
    assert execpar_cli.main(["launch", str(out), "--nproc-per-node", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{need:.1f} GiB" in err and "this node's GPU" in err
    # no GPU here (a CPU run): the ranks' allocated peaks together against the host's RAM
    plan = load_plan(str(out))
    mem = execpar_cli.planned_memory(plan, plan.model, plan.job, scaled=False)
    monkeypatch.setattr(execpar_cli, "_host_memory_gib", lambda: 2 * mem.peak_allocated_gib - 1)
    execpar_cli.check_memory(mem, None, 1)
    with pytest.raises(SpecError, match="for 2 rank"):
        execpar_cli.check_memory(mem, None, 2)
    # --force skips the check
    started = []
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.setattr(execpar_cli, "_torchrun", lambda cmd, env: started.append(env) or 0)
    assert execpar_cli.main(["launch", str(out), "--nproc-per-node", "1", "--force"]) == 0
    # the allocator the plan priced
    assert started[0]["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"


def test_torch_loss_parallel_holds_16_fp32_bytes_per_logit_at_its_peak():
    """torchtitan under tp takes the fp32 loss through torch's loss_parallel, whose backward holds
    the log-probabilities, grad_input, exp(x) and their sum (16 bytes per logit of the rank's
    vocabulary shard) where a fused loss holds the 16-bit logits and their gradient (4)."""
    tt = Strategy(tp=2, sp=True, stack="torchtitan", micro_batch=4, zero=0)
    job = JobSpec(2048, 4)
    fp32 = memory_breakdown(M, job, replace(tt, loss="fp32"))
    fused = memory_breakdown(M, job, replace(tt, loss="fused"))
    assert fp32.peak_phase == fused.peak_phase == "backward"
    logits = 4 * 2048 * 32000 / 2
    assert (fp32.buffers_gib - fused.buffers_gib) * GIB == pytest.approx((16 - 4) * logits)


def test_a_recomputed_layer_is_whole_through_its_backward():
    """Stage 0 of two under 1F1B, full recompute: it holds two micro-batches' layer inputs for its
    2 layers (2,048 bytes a token each) and, while backward runs its first recomputed layer, that
    layer's whole activations; no loss lives on this stage (a small vocabulary keeps the last
    stage's loss below that)."""
    from simpar.memory.model import activation_bytes_per_token

    small = replace(M, vocab=256)
    s = Strategy(pp=2, recompute="full", micro_batch=1, stack="megatron")
    mem = memory_breakdown(small, JobSpec(2048, 8), s)
    whole = activation_bytes_per_token(small, 2048, 1, False, "none", True, "bf16")
    assert mem.stage == 0
    assert mem.activations_gib * GIB == pytest.approx(2048 * 2048 * 2 * 2 + (whole - 2048) * 2048)


def test_torch_sequence_parallelism_keeps_the_gathered_gemm_inputs():
    """torch's SequenceParallel saves each column-parallel GEMM's all-gathered input, Megatron a
    sequence shard it gathers again: the QKV and MLP inputs (2 x 1,024 bf16 values a token) kept
    whole rather than a quarter each at tp 4."""
    from simpar.memory.model import SavedCode, activation_bytes_per_token

    def kept(gathered):
        return activation_bytes_per_token(M, 2048, 4, True, "none", True, "bf16",
                                          code=SavedCode(saves_gathered=gathered))

    assert kept(True) - kept(False) == pytest.approx(2 * 2 * 1024 * (1 - 1 / 4))


def test_a_peak_whose_allocation_fits_but_not_the_allocators_slack_is_tight(capsys, tmp_path):
    """Megatron-LM's Llama 3 8B fp8 example on 8 H100s at Megatron's defaults (fp32 gradients and
    loss): its allocated peak and runtime fit in 79.6 GiB, its expected 10% slack does not. That
    is "tight", with the slack it would run under, not a flat "does not fit"; plan still asks for
    --force and says why."""
    args = ["--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8", "--seq-len", "8192",
            "--global-batch", "128", "--stack", "megatron", "--dtype", "fp8", "--dp", "4",
            "--cp", "2", "--micro-batch", "1"]
    assert main(["simulate", *args, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    mem, hbm = doc["memory"], 79.6
    assert not doc["fits_memory"] and doc["memory_verdict"] == "tight"
    assert mem["total_gib"] > hbm >= mem["total_gib"] - mem["fragmentation_gib"]
    slack = (hbm - (mem["total_gib"] - mem["fragmentation_gib"])) / mem["peak_allocated_gib"]
    assert 0 <= slack < mem["fragmentation"]
    assert main(["simulate", *args]) == 0
    out = capsys.readouterr().out
    assert f"TIGHT: runs if the allocator's slack stays under {slack:.0%}" in out
    assert main(["plan", *args, "--out", str(tmp_path / "p.json")]) == 2
    assert f"slack stays under {slack:.0%}" in capsys.readouterr().err
    # compare counts such near misses among those that do not fit
    assert main(["compare", *args[:-8], "--dtype", "fp8", "--top", "1", "--json"]) == 0
    searched = json.loads(capsys.readouterr().out)
    assert 0 < searched["tight"] < searched["out_of_memory"]
    # far over: does not fit, and simulate says what to shard; well under: fits. (A tight peak
    # gets no such note: it may run.)
    assert not [n for n in doc["notes"] if n.startswith("memory:")]
    said = []
    for model, verdict in (("llama3-70b", "does not fit"), ("llama2-7b", "fits")):
        assert main(["simulate", "--model", model, "--gpu", "h100-sxm", "--gpus", "8",
                     "--seq-len", "2048", "--global-batch", "8", "--zero", "3", "--json"]) == 0
        priced = json.loads(capsys.readouterr().out)
        assert priced["memory_verdict"] == verdict
        notes = [n for n in priced["notes"] if n.startswith("memory: does not fit")]
        assert len(notes) == (verdict == "does not fit")
        said += notes
    # llama3-70b's optimizer states, already sharded by ZeRO-3, are its biggest part: the note
    # asks for a model split, more GPUs or offload, not for the ZeRO stage it runs
    assert "the biggest part is optimizer states" in said[0] and "simpar compare" in said[0]
    assert "--zero" not in said[0] and "--offload-optimizer" in said[0]
