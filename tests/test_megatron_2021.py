"""The Megatron-LM of the SC21 paper (--stack megatron-2021): each pipeline exchange sends a
tensor-parallel rank's slice and all-gathers it over tp, holding both stages; fp16 gradients
accumulate through autograd; no overlap of the input-gradient all-reduce. Hand-computed
expectations; the paper's Table 1 is the benchmark (benchmarks/published_accuracy.py)."""

import json

import pytest

from simpar.cost.compute import hbm_rate
from simpar.cost.pricing import Pricing
from simpar.cost.step import grad_accumulation_seconds, pipeline_send_seconds, predict
from simpar.network.model import DEFAULT_NETWORK, FreeNetwork, network_for
from simpar.specs import MODELS, JobSpec, Strategy, dgx_like
from simpar.specs import stack as stacks
from simpar.workload.params import stage_params

M = MODELS["megatron2021-529.6b"]
A100 = dgx_like("a100-80gb")
JOB = JobSpec(2048, 280, "fp16")  # one pipeline of the paper's 530B layout: 280 micro-batches


def _pricing(s: Strategy) -> Pricing:
    return Pricing(M, A100, JOB, s, network_for(A100, s, DEFAULT_NETWORK))


def test_a_2021_pipeline_exchange_sends_a_tp_slice_and_gathers_it_over_nvlink():
    """One micro-batch's activation, 2048 tokens x 20480 x 2 bytes = 84 MB: the 2021 code
    sends 1/8 of it from each of the eight tensor-parallel ranks across the network and
    all-gathers the 84 MB over NVLink; today's Megatron core without sequence parallelism
    sends all of it from every rank."""
    old = Strategy(dp=1, tp=8, pp=35, sp=False, stack="megatron-2021")
    new = Strategy(dp=1, tp=8, pp=35, sp=False, stack="megatron")
    msg = 2048 * 20480 * 2
    p = _pricing(old)
    assert pipeline_send_seconds(p) == pytest.approx(
        p.net.ring_shift(msg / 8, "pp") + p.net.collective("allgather", msg, "tp"))
    assert pipeline_send_seconds(_pricing(new)) == pytest.approx(
        _pricing(new).net.ring_shift(msg, "pp"))
    # eight HDR NICs carry the slices: the 2021 exchange is the cheaper one
    assert pipeline_send_seconds(p) < 0.5 * pipeline_send_seconds(_pricing(new))
    # with sequence parallelism every stack sends the slice and gathers nothing
    sp = Strategy(dp=1, tp=8, pp=35, sp=True, stack="megatron-2021")
    assert pipeline_send_seconds(_pricing(sp)) == pytest.approx(
        _pricing(sp).net.ring_shift(msg / 8, "pp"))


def test_2021_fp16_gradients_accumulate_through_autograd():
    """Four micro-batches: the three after the first each read the fp16 .grad and the new
    gradient and write the sum, 6 bytes per parameter; Megatron core's fused weight-gradient
    GEMM accumulates in place (no pass)."""
    job = JobSpec(2048, 4, "fp16")
    s = Strategy(dp=1, tp=8, pp=35, micro_batch=1, sp=False, stack="megatron-2021")
    dense, expert = stage_params(M, s, 1, M.layers // s.pp)
    t = grad_accumulation_seconds(Pricing(M, A100, job, s, FreeNetwork()), dense, expert)
    assert t == pytest.approx(3 / 4 * (2 + 2 + 2) * (dense + expert) / hbm_rate(A100.gpu))
    fused = Strategy(dp=1, tp=8, pp=35, micro_batch=1, sp=False, stack="megatron")
    assert grad_accumulation_seconds(Pricing(M, A100, job, fused, FreeNetwork()),
                                     dense, expert) == 0.0


def test_the_2021_profile_shards_nothing_and_overlaps_nothing_by_default():
    prof = stacks.get_stack("megatron-2021")
    assert (prof.default_zero, prof.sp_with_tp, prof.tp_overlap, prof.tp_wgrad_overlap,
            prof.p2p_overlap) == (0, False, False, False, False)
    # each receive rides in one batch_isend_irecv with the send it pairs with
    # (send_forward_recv_backward at 6985e58938): waited for, but no transfer of its own
    assert not prof.blocking_recvs and prof.pipeline_scatter_gather
    assert not prof.te_quantize_launches and not prof.graphable


def test_the_papers_530b_layout_runs_slower_on_the_2021_code_than_on_todays():
    """The interleaved 530B row of Table 1 (tp 8, pp 35, three virtual stages, 280
    micro-batches): blocking exchanges, unhidden input-gradient all-reduces and autograd's
    accumulation cost more than the slices' cheaper sends save."""
    kw = dict(dp=1, tp=8, pp=35, sp=False, recompute="full", micro_batch=1,
              schedule="interleaved", vpp=3, overlap_grad_reduce=False)
    old = predict(M, A100, JOB, Strategy(stack="megatron-2021", **kw)).step_time_s
    new = predict(M, A100, JOB, Strategy(stack="megatron", **kw)).step_time_s
    assert old > 1.03 * new


def _reduce_overlaps(capsys, command: str, stack: str, *extra: str) -> list[bool]:
    from simpar.cli import main
    args = [command, "--model", "llama3-8b", "--gpu", "a100-80gb", "--gpus", "16", "--seq-len",
            "2048", "--global-batch", "64", "--dtype", "fp16", "--stack", stack, "--json", *extra]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["top"] if command == "compare" else [out]
    return [r["strategy"]["overlap_grad_reduce"] for r in rows]


def test_the_2021_trainer_reduces_gradients_after_the_backward(capsys):
    """Megatron-LM of 2021 all-reduces once forward_backward_func returns (training.py at
    6985e58938): simulate and compare price it so under --stack megatron-2021 without being told;
    today's Megatron (megatron@2023 on this A100) overlaps unless --no-overlap-grad-reduce."""
    assert _reduce_overlaps(capsys, "simulate", "megatron-2021", "--tp", "4") == [False]
    assert _reduce_overlaps(capsys, "simulate", "megatron@2023", "--tp", "4") == [True]
    assert _reduce_overlaps(capsys, "simulate", "megatron@2023", "--tp", "4",
                            "--no-overlap-grad-reduce") == [False]
    assert set(_reduce_overlaps(capsys, "compare", "megatron-2021", "--top", "3")) == {False}


def test_a_strategy_reduces_as_its_stacks_trainer_does_unless_told():
    """Strategy.overlap_grad_reduce left unsaid takes the stack's (Stack.grad_reduce_overlap), as
    the API's callers, the CLI and the search all make strategies; a caller's value wins."""
    assert Strategy(stack="megatron-2021").overlap_grad_reduce is False
    assert Strategy(stack="megatron").overlap_grad_reduce is True
    assert Strategy(stack="megatron-2021", overlap_grad_reduce=True).overlap_grad_reduce is True
