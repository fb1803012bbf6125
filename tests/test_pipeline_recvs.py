"""Pipeline receives as each stack posts them (Stack.blocking_recvs): DeepSpeed's pipeline engine
receives with a blocking call, so each transfer holds the receiving stage too; torch posts its
receives ahead, and Megatron beside the send each pairs with. Both engines book one more transfer
per received tensor."""

from dataclasses import replace

import pytest

from simpar.cost.pricing import Pricing
from simpar.cost.step import pipeline_send_seconds, predict
from simpar.network.model import DEFAULT_NETWORK, network_for
from simpar.sim.engine import simulate
from simpar.specs import MODELS, JobSpec, Strategy, dgx_like
from simpar.specs import stack as stacks

M = MODELS["llama3-8b"]
A100 = dgx_like("a100-80gb")
JOB = JobSpec(2048, 8)  # eight micro-batches of one sequence
DS = Strategy(dp=1, pp=2, zero=1, micro_batch=1, stack="deepspeed")


def _step(engine: str, s: Strategy) -> float:
    if engine == "analytic":
        return predict(M, A100, JOB, s).step_time_s
    return simulate(M, A100, JOB, s).first.step_time_s


def _without_blocking_recvs(monkeypatch, engine: str) -> float:
    monkeypatch.setitem(stacks.STACKS, "deepspeed",
                        replace(stacks.STACKS["deepspeed"], blocking_recvs=False))
    stacks.get_stack.cache_clear()
    try:
        return _step(engine, DS)
    finally:
        monkeypatch.undo()
        stacks.get_stack.cache_clear()


def test_only_deepspeed_blocks_on_its_receives():
    assert stacks.STACKS["deepspeed"].blocking_recvs
    assert stacks.STACKS["deepspeed-0.6"].blocking_recvs
    # Megatron-LM's 2021-22 code posts each receive in one batch_isend_irecv with its send
    for name in ("megatron", "megatron-2021", "megatron-2022", "nemo", "torchtitan", "execpar"):
        assert not stacks.STACKS[name].blocking_recvs, name


@pytest.mark.parametrize("engine", ["analytic", "event"])
def test_each_received_tensor_costs_its_transfer_once_more(monkeypatch, engine):
    """Two stages, eight micro-batches: stage 1 receives eight activations and stage 0 eight
    gradients. The closed form adds one transfer to every stage's micro-batch, so the 1F1B span
    (m + pp - 1) t_max grows by nine transfers; the event engine books the eight receives of
    each stage, and the fill and drain let the two stages' receives overlap partly."""
    send = pipeline_send_seconds(Pricing(M, A100, JOB, DS, network_for(A100, DS,
                                                                       DEFAULT_NETWORK)))
    assert send > 0
    extra = _step(engine, DS) - _without_blocking_recvs(monkeypatch, engine)
    if engine == "analytic":
        assert extra == pytest.approx(9 * send, rel=1e-6)
    else:
        assert 8 * send * (1 - 1e-6) <= extra <= 10 * send


def test_deepspeed_sends_its_pipeline_activations_in_tensor_parallel_slices():
    """DeepSpeed's pipeline engine partitions the activation it sends, and its gradient, over the
    tensor-parallel (slice) group and the receiver all-gathers it (engine.py, is_pipe_partitioned
    and is_grad_partitioned): at tp 8 without sequence parallelism a send is an eighth of the
    activation over the stage link (InfiniBand, the next node) plus an all-gather of the whole
    over tp (NVLink), as Megatron-LM 2021's scatter/gather; Megatron core without sequence
    parallelism sends the whole over InfiniBand."""
    s = Strategy(dp=1, tp=8, pp=2, zero=1, micro_batch=1, sp=False, stack="deepspeed")
    p = Pricing(M, A100, JOB, s, network_for(A100, s, DEFAULT_NETWORK))
    whole = 2048 * M.hidden * 2
    assert pipeline_send_seconds(p) == pytest.approx(
        p.net.ring_shift(whole / 8, "pp") + p.net.collective("allgather", whole, "tp"))
    for name in ("deepspeed", "deepspeed-0.6"):
        assert stacks.STACKS[name].pipeline_scatter_gather, name
    plain = replace(s, stack="megatron")
    assert pipeline_send_seconds(Pricing(M, A100, JOB, plain, network_for(
        A100, plain, DEFAULT_NETWORK))) > pipeline_send_seconds(p)
