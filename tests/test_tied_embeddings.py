"""A tied word embedding split over pipeline stages: the last stage keeps its own copy for the
output layer, and each step the first and the last stage all-reduce the two copies' gradients
before the optimizer (Megatron-LM, Megatron core, DeepSpeed's pipeline engine)."""

from dataclasses import replace

import pytest

from simpar.cost.step import predict
from simpar.sim.engine import SimOptions, simulate
from simpar.specs import JobSpec, ModelSpec, Strategy, dgx_like

GPT = ModelSpec(name="gpt-tied", layers=8, hidden=4096, heads=32, kv_heads=32, ffn_hidden=16384,
                vocab=51200, gated_mlp=False, tied_embeddings=True)
H100 = dgx_like("h100-sxm")
JOB = JobSpec(2048, 8)
# one stage a node: the two stages' copies meet over the NIC
S = Strategy(tp=8, pp=2, micro_batch=1, stack="megatron")


def _tied(events) -> list[tuple]:
    return [e for e in events if e[0] == "tied embedding all-reduce"]


def test_first_and_last_stage_sum_their_embedding_copies_over_the_nic():
    # 51,200 x 4,096 / 8 fp32 gradients (Megatron's main_grad) = 105 MB, once each way at the
    # NIC's 400 Gb/s
    seconds = 51200 * 4096 / 8 * 4 / H100.inter_bw_bytes_per_s
    events = _tied(simulate(GPT, H100, JOB, S, SimOptions(trace=True)).trace_events())
    assert sorted(e[2] for e in events) == [0, 1]  # stage 0 and the last stage, nobody else
    assert [e[4] for e in events] == [pytest.approx(seconds, rel=0.05)] * 2
    # without data parallelism it is the analytic step's only gradient traffic
    assert predict(GPT, H100, JOB, S).breakdown["dp_comm"] == pytest.approx(seconds, rel=0.05)


@pytest.mark.parametrize("model, s", [
    (replace(GPT, tied_embeddings=False), S),
    (GPT, replace(S, pp=1)),
    # a V schedule runs the first and the last chunk on rank 0: one table, nothing to sum
    (GPT, replace(S, schedule="zbv", stack="torchtitan", zero=1)),
], ids=["untied", "one stage", "V schedule"])
def test_no_tied_copies_no_sum(model, s):
    assert not _tied(simulate(model, H100, JOB, s, SimOptions(trace=True)).trace_events())
    assert predict(model, H100, JOB, s).breakdown["dp_comm"] == 0.0
