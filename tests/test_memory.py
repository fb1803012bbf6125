from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simpar.memory.model import (
    MEGATRON_LOSS_PEAK_BYTES,
    _stage_peak,
    _StagePeak,
    activation_bytes_per_token,
    memory_breakdown,
    model_states,
    saved_code,
    state_bytes_per_param,
)
from simpar.specs import MODELS, JobSpec, ModelSpec, Strategy
from simpar.specs.schedule import get_schedule
from simpar.specs.stack import get_stack
from simpar.specs.strategy import split_layers

PSI = 7.0e9


@pytest.mark.parametrize("n", [1, 8, 64, 1024])
def test_zero_closed_forms(n):
    # the ZeRO paper's accounting: 16-bit weights and gradients, 12 bytes of Adam
    ds = get_stack("deepspeed")
    assert sum(model_states(PSI, n, Strategy(zero=0), "bf16", ds)) == pytest.approx(16 * PSI)
    assert sum(model_states(PSI, n, Strategy(zero=1), "bf16",
                            ds)) == pytest.approx(4 * PSI + 12 * PSI / n)
    assert sum(model_states(PSI, n, Strategy(zero=2), "bf16",
                            ds)) == pytest.approx(2 * PSI + 14 * PSI / n)
    assert sum(model_states(PSI, n, Strategy(zero=3), "bf16", ds)) == pytest.approx(16 * PSI / n)


@pytest.mark.parametrize("n", [1, 8, 64])
def test_stack_state_bytes_follow_their_docs(n):
    # Megatron-LM's docs: bf16 with fp32 gradients is 18 bytes per parameter, the
    # distributed optimizer 6 + 12/d
    meg = get_stack("megatron")
    assert sum(model_states(PSI, n, Strategy(zero=0), "bf16", meg)) == pytest.approx(18 * PSI)
    assert sum(model_states(PSI, n, Strategy(zero=1), "bf16",
                            meg)) == pytest.approx(6 * PSI + 12 * PSI / n)
    # FSDP2 (torchtitan) keeps fp32 sharded weights and gradients and fp32 Adam moments:
    # 16 / n, no master copy
    fsdp2 = model_states(PSI, n, Strategy(zero=3), "bf16", get_stack("torchtitan"))
    assert fsdp2 == pytest.approx((4 * PSI / n, 4 * PSI / n, 8 * PSI / n))


GPT = ModelSpec("gpt", 24, 2048, 16, 16, 8192, 50000, gated_mlp=False, dropout=True)


@pytest.mark.parametrize("s", [1024, 2048, 4096])
def test_korthikanti_activation_formulas(s):
    h, a = GPT.hidden, GPT.heads
    def per_token(t, sp, rc):
        return activation_bytes_per_token(GPT, s, t, sp, rc, False, "bf16")
    assert per_token(1, False, "none") == pytest.approx(h * (34 + 5 * a * s / h))
    assert per_token(8, False, "none") == pytest.approx(h * (10 + 24 / 8 + 5 * a * s / (h * 8)))
    assert per_token(8, True, "none") == pytest.approx(h * (34 / 8 + 5 * a * s / (h * 8)))
    assert per_token(8, True, "selective") == pytest.approx(h * 34 / 8)
    assert per_token(1, False, "full") == pytest.approx(2 * h)
    assert per_token(8, True, "full") == pytest.approx(2 * h / 8)


def test_flash_attention_drops_the_score_term():
    assert activation_bytes_per_token(GPT, 4096, 1, False, "none", True, "bf16") < 35 * GPT.hidden


@pytest.mark.parametrize("pp, m", [(4, 16), (8, 8), (8, 4)])
def test_inflight_micro_batches(pp, m):
    assert get_schedule("1f1b").inflight_micro_batches(0, pp, 1, m) == min(pp, m)
    assert get_schedule("1f1b").inflight_micro_batches(pp - 1, pp, 1, m) == 1
    assert get_schedule("gpipe").inflight_micro_batches(0, pp, 1, m) == m


def test_interleaved_first_stage_memory_factor():
    # Korthikanti et al.: the first stage holds (1 + (P-1)/(P v)) x the 1F1B activations.
    pp, v, m = 8, 4, 64
    assert get_schedule("interleaved").inflight_micro_batches(0, pp, v, m) == pytest.approx(
        pp * (1 + (pp - 1) / (pp * v)))


@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4]), st.sampled_from(["none", "full"]),
       st.sampled_from([8, 16, 32]))
def test_more_zero_sharding_never_raises_memory(tp, pp, recompute, dp):
    job = JobSpec(4096, 256)
    model = MODELS["llama3-8b"]
    totals = [
        memory_breakdown(model, job,
                         Strategy(dp=dp, tp=tp, pp=pp, zero=z, sp=tp > 1,
                                  recompute=recompute)).total_gib for z in range(4)
    ]
    assert totals == sorted(totals, reverse=True)


def test_recompute_and_sequence_parallel_reduce_memory():
    job, model = JobSpec(8192, 64), MODELS["llama3-70b"]
    base = memory_breakdown(model, job, Strategy(dp=8, tp=8, pp=1)).activations_gib
    sp = memory_breakdown(model, job, Strategy(dp=8, tp=8, pp=1, sp=True)).activations_gib
    full = memory_breakdown(model, job, Strategy(dp=8, tp=8, pp=1, sp=True,
                                                 recompute="full")).activations_gib
    assert base > sp > full


@pytest.mark.parametrize("schedule, vpp", [("1f1b", 1), ("interleaved", 2), ("gpipe", 1),
                                           ("zb-h1", 1), ("dualpipev", 1)])
def test_peak_stage_found_without_pricing_every_alike_stage(schedule, vpp):
    """memory_breakdown prices one of the stages alike but for their in-flight
    micro-batches; every stage priced on its own gives the same peak on the same stage
    (uneven layer counts, 6 stages)."""
    model, job = MODELS["llama3-8b"], JobSpec(4096, 48)
    s = Strategy(dp=1, pp=6, micro_batch=1, schedule=schedule, vpp=vpp)
    m = s.micro_batches(job.global_batch)
    per_token = activation_bytes_per_token(model, job.seq_len, 1, False, "none", True, job.dtype,
                                           s.elementwise, saved_code(s, job.dtype))
    every = [
        _stage_peak(model, job, s, m, i, n,
                    get_schedule(schedule).inflight_micro_batches(i, 6, vpp, m), (per_token, 0.0),
                    state_bytes_per_param(job.dtype, s.profile))
        for i, n in enumerate(split_layers(model.layers, 6))
    ]
    first_max = max(every, key=_StagePeak.allocated)
    mem = memory_breakdown(model, job, s)
    assert (mem.stage, mem.peak_allocated_gib) == (first_max.stage,
                                                   pytest.approx(first_max.allocated() / 2**30))


def test_deepspeed_before_0_6_holds_weight_sized_zero3_buffers():
    """DeepSpeed before v0.6 gathers and reduces weight by weight: two gathered weights (in use,
    prefetched) and one unsharded gradient of the largest tensor, Llama 3 8B's gate and up in one
    (2 x 4096 x 14336 elements), where a block-wise gather holds whole layers (218.1M elements:
    q, k, v, o, gate, up, down and two norms), 6 bytes an element either way."""
    job, model = JobSpec(4096, 64), MODELS["llama3-8b"]
    s = Strategy(dp=64, zero=3, micro_batch=1, recompute="full")
    old = memory_breakdown(model, job, replace(s, stack="deepspeed")).buffers_gib
    new = memory_breakdown(model, job, replace(s, stack="deepspeed-0.6")).buffers_gib
    layer = 4096 * (4096 + 2 * 1024 + 4096 + 3 * 14336) + 2 * 4096
    largest = 2 * 4096 * 14336
    assert new - old == pytest.approx(6 * (layer - largest) / 2**30, rel=1e-6)


def test_deepspeed_frees_the_gathered_output_weight_before_recomputing_a_layer():
    """DeepSpeed's ZeRO-3 module hooks gather the output layer's weight for its forward and
    backward only, so it is alive at the loss but gone at the peak inside the first layer that
    backward recomputes (FSDP's root unit keeps it, with the embedding, to the end of backward).
    MT-NLG's shape at micro-batch 4: the recomputed layer (15 GiB) outweighs the loss, and the
    buffers hold two gathered MLP weights and one unsharded gradient of one; with a vocabulary
    large enough that the loss is the peak, the output weight (vocab x hidden, 2 bytes an element)
    and the final norm are there beside the logits."""
    model = ModelSpec("gpt-530b", 105, 20480, 128, 128, 81920, 51200, gated_mlp=False,
                      dropout=True, bias=True, position_embeddings=2048)
    job = JobSpec(2048, 2560, "fp16")
    s = Strategy(dp=640, zero=3, micro_batch=4, recompute="full", stack="deepspeed")
    tokens, h = 4 * 2048, 20480
    base = 2 * tokens * h * 2 + 3 * 2 * h * 81920  # DeepSpeed before v0.6: weight by weight
    assert memory_breakdown(model, job, s).buffers_gib == pytest.approx(base / 2**30, rel=1e-6)
    vocab = 1_000_000
    # Megatron-DeepSpeed's vocab_parallel_cross_entropy works in place on its fp32 copy
    at_loss = tokens * vocab * MEGATRON_LOSS_PEAK_BYTES + 2 * (vocab * h + h)
    big = memory_breakdown(replace(model, vocab=vocab), job, s)
    assert big.buffers_gib == pytest.approx((base + at_loss) / 2**30, rel=1e-6)


def test_torch_pipelines_keep_the_steps_stage_outputs_where_the_stack_does():
    """torchtitan's 2024 pipelines (torch.distributed.pipelining before pytorch#153383) keep each
    micro-batch's stage output to the step's end: the last stage all eight micro-batches' bf16
    logits (its vocabulary share under loss parallelism), the others what they forwarded by
    their first backward (their sequence share under sp); execpar asks torch to keep none, and
    Megatron runs its own pipeline."""
    from simpar.memory.model import kept_pipeline_outputs

    m8, job = MODELS["llama3-8b"], JobSpec(4096, 8, dtype="bf16")
    tt = Strategy(pp=2, zero=3, micro_batch=1, stack="torchtitan")
    assert kept_pipeline_outputs(m8, job, tt, 4096, 1, 8, 1) == 8 * 4096 * 128256 * 2
    assert kept_pipeline_outputs(m8, job, tt, 4096, 0, 8, 2) == 2 * 4096 * 4096 * 2
    # without FSDP, autocast over fp32 weights: the stage outputs are the fp32 residual stream
    assert kept_pipeline_outputs(m8, job, replace(tt, zero=0), 4096, 0, 8, 2) == \
        2 * 4096 * 4096 * 4
    tp = replace(tt, tp=2, sp=True)
    assert kept_pipeline_outputs(m8, job, tp, 4096, 1, 8, 1) == 8 * 4096 * 64128 * 2
    assert kept_pipeline_outputs(m8, job, tp, 4096, 0, 8, 2) == 2 * 4096 * 2048 * 2
    for other in (replace(tt, stack="execpar"), replace(tt, stack="megatron"), replace(tt, pp=1)):
        assert kept_pipeline_outputs(m8, job, other, 4096, other.pp - 1, 8, 1) == 0



def test_torch_pipelines_keep_a_receive_buffer_for_every_micro_batch():
    """torch's PipelineStage allocates, once, a buffer for each micro-batch's stage input (every
    stage but the first) and output gradient (every stage but the last). Llama 3 8B at 4096
    tokens a micro-batch, 8 micro-batches, bf16: a boundary tensor is 4096 x 4096 x 2 bytes.
    1F1B on 2 ranks: rank 0 keeps 8 gradient buffers; rank 1 keeps 8 input buffers, of which
    the 1 in flight is counted with its activations, so 7. Interleaved, 2 chunks a rank: rank 0
    runs chunks 0 and 2 (8 gradients; 8 - 2 inputs and 8 gradients), rank 1 chunks 1 and 3 (8 - 1
    inputs and 8 gradients; 8 - 1 inputs). Sequence parallelism halves each buffer at tp 2;
    Megatron receives into tensors it frees. Without FSDP (autocast over fp32 weights) the
    boundary tensors are the fp32 residual stream, twice as large."""
    from simpar.memory.model import pipeline_recv_buffers

    m8, job = MODELS["llama3-8b"], JobSpec(4096, 8, dtype="bf16")
    one = 4096 * 4096 * 2
    tt = Strategy(pp=2, zero=3, micro_batch=1, stack="torchtitan")
    assert pipeline_recv_buffers(m8, job, tt, 4096, 0, 8, 2) == 8 * one
    assert pipeline_recv_buffers(m8, job, tt, 4096, 1, 8, 1) == 7 * one
    inter = replace(tt, schedule="interleaved", vpp=2)
    assert pipeline_recv_buffers(m8, job, inter, 4096, 0, 8, 2) == (8 + 6 + 8) * one
    assert pipeline_recv_buffers(m8, job, inter, 4096, 1, 8, 1) == (7 + 8 + 7) * one
    sp = replace(tt, tp=2, sp=True)
    assert pipeline_recv_buffers(m8, job, sp, 4096, 0, 8, 2) == 8 * one / 2
    assert pipeline_recv_buffers(m8, job, replace(tt, stack="execpar"), 4096, 0, 8, 2) == 8 * one
    execpar_ddp = replace(tt, zero=0, stack="execpar")
    assert pipeline_recv_buffers(m8, job, execpar_ddp, 4096, 0, 8, 2) == 8 * 2 * one
    for other in (replace(tt, stack="megatron"), replace(tt, pp=1)):
        assert pipeline_recv_buffers(m8, job, other, 4096, 0, 8, 2) == 0


def _torchtitan_pipeline_peaks(monkeypatch, **stack_fields):
    """The memory breakdown of Llama 3 8B on 4 torchtitan pipeline ranks (16 micro-batches of
    4096 tokens, full recompute) as the stack is, and with `stack_fields` changed."""
    from simpar.specs import stack as stacks

    m8, job = MODELS["llama3-8b"], JobSpec(4096, 16, dtype="bf16")
    s = Strategy(pp=4, zero=3, micro_batch=1, stack="torchtitan", recompute="full")
    kept = memory_breakdown(m8, job, s)
    monkeypatch.setitem(stacks.STACKS, "torchtitan",
                        replace(stacks.STACKS["torchtitan"], **stack_fields))
    get_stack.cache_clear()
    try:
        return kept, memory_breakdown(m8, job, s)
    finally:
        monkeypatch.undo()
        get_stack.cache_clear()


def test_the_receive_buffers_add_to_a_torch_pipelines_peak(monkeypatch):
    """The same buffers raise the peak of the stage that has it, and nothing else: Llama 3 8B
    on 4 ranks, 16 micro-batches of 4096 tokens, full recompute; the peak is the last stage's
    (its logits), which keeps 16 - 1 input buffers of 32 MiB beside the one in flight."""
    kept, without = _torchtitan_pipeline_peaks(monkeypatch, pipeline_recv_buffers=False)
    assert kept.stage == without.stage == 3
    assert kept.peak_allocated_gib - without.peak_allocated_gib == pytest.approx(
        15 * 4096 * 4096 * 2 / 2**30)


def test_torch_ring_attention_holds_every_ranks_kv_and_fp32_gradients_in_backward(monkeypatch):
    """torch's ring attention backward under cp 4, Llama 3 8B at 8192 local tokens, bf16, K and V
    expanded to the 32 query heads as torchtitan's code does: Q is 8192 x 4096 elements (q), K and
    V twice that (kv = 2q). All four ranks' K/V gathered plus its concatenated input, 2 x 6kv;
    a step's 16-bit dQ, dK, dV, 2 x (q + kv); the fp32 accumulators, 4 x (q + kv); the fp32 dK/dV
    passed on and received, 8 kv: 24 kv + 6 q = 54 q bytes. It adds to the peak where a
    recomputed layer's backward is the peak: sixteen sequences a micro-batch, sixteen times
    the bytes, and a 16K vocabulary that keeps the loss's temporaries below them."""
    from simpar.memory.model import cp_ring_backward_bytes
    from simpar.specs import stack as stacks

    m8, job = MODELS["llama3-8b"], JobSpec(4 * 8192, 16, dtype="bf16")
    s = Strategy(cp=4, micro_batch=16, stack="torchtitan", recompute="full")
    q = 8192 * 4096
    assert cp_ring_backward_bytes(m8, job, s, 8192) == 54 * q
    assert cp_ring_backward_bytes(m8, job, replace(s, stack="execpar"), 8192) == 54 * q
    for other in (replace(s, stack="megatron"), replace(s, cp=1)):
        assert cp_ring_backward_bytes(m8, job, other, 8192) == 0
    small_vocab = replace(m8, vocab=16000)
    ring = memory_breakdown(small_vocab, job, s)
    monkeypatch.setitem(stacks.STACKS, "torchtitan",
                        replace(stacks.STACKS["torchtitan"], cp_kv_allgather=False))
    get_stack.cache_clear()
    try:
        without = memory_breakdown(small_vocab, job, s)
    finally:
        monkeypatch.undo()
        get_stack.cache_clear()
    assert ring.peak_phase == without.peak_phase == "backward"
    assert ring.buffers_gib - without.buffers_gib == pytest.approx(16 * 54 * q / 2**30)


def test_a_torchtitan_pipelines_last_stage_peaks_with_all_its_logits(monkeypatch):
    """The last stage's peak, at its last loss, holds the sixteen micro-batches' bf16 logits torch
    kept, 15.7 GiB beside the loss's own fp32 temporaries of one micro-batch."""
    kept, freed = _torchtitan_pipeline_peaks(monkeypatch, pipeline_outputs_kept="none")
    assert (kept.stage, freed.stage) == (3, 3) and kept.peak_phase == freed.peak_phase == "backward"
    assert kept.peak_allocated_gib - freed.peak_allocated_gib == pytest.approx(
        16 * 4096 * 128256 * 2 / 2**30)


def test_pipeline_outputs_says_what_the_users_schedule_keeps(capsys):
    """--pipeline-outputs none prices a current torchtitan, whose trainer passes
    return_outputs=False: its pipelined last stage then holds none of the step's logits; execpar
    refuses a plan that says it keeps some."""
    import json

    from simpar.cli import main
    from simpar.errors import SpecError
    from simpar.specs.runnable import check_runnable

    base = ["simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "2", "--seq-len",
            "4096", "--global-batch", "16", "--stack", "torchtitan", "--pp", "2", "--dp", "1",
            "--zero", "1", "--recompute", "full", "--json"]
    peaks = {}
    for kept in ("all", "none"):
        assert main(base + ["--pipeline-outputs", kept]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["strategy"]["pipeline_outputs"] == kept
        peaks[kept] = doc["memory"]["peak_allocated_gib"]
    # at most the sixteen micro-batches' bf16 logits: without them another stage may peak
    assert 0 < peaks["all"] - peaks["none"] <= 16 * 4096 * 128256 * 2 / 2**30
    with pytest.raises(SystemExit) as refused:  # argparse's one line for a bad choice
        main(base[:-1] + ["--pipeline-outputs", "some"])
    assert refused.value.code == 2
    model = MODELS["llama3-8b"]
    with pytest.raises(SpecError, match="pipeline_outputs"):
        check_runnable(Strategy(pp=2, pipeline_outputs="all"), model, JobSpec(4096, 16))
