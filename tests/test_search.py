"""The search: pruning by the compute-only bound keeps the top of the ranking exactly as
pricing every candidate does."""

import pytest

from simpar.cost.step import compute_bound, predict
from simpar.search.rank import search
from simpar.specs import MODELS, JobSpec, Strategy, load_cluster

CLUSTER = load_cluster("dgx-h100", None)
JOB = JobSpec(4096, 256)


@pytest.mark.parametrize("model, gpus", [("llama3-70b", 32), ("mixtral-8x7b", 16)])
def test_pruned_search_keeps_the_exact_top(model, gpus):
    m = MODELS[model]
    every = search(m, CLUSTER, JOB, gpus)
    kept = search(m, CLUSTER, JOB, gpus, keep=10)
    assert kept.pruned > 0 and len(kept.ranked) + kept.pruned == len(every.ranked)
    assert [p.strategy for p in kept.ranked[:10]] == [p.strategy for p in every.ranked[:10]]
    assert [p.step_time_s for p in kept.ranked[:10]] == [p.step_time_s for p in every.ranked[:10]]
    assert kept.to_dict(10)["feasible"] == every.to_dict(10)["feasible"]


def test_the_bound_is_the_compute_and_never_exceeds_the_prediction():
    m = MODELS["llama3-70b"]
    for s in (Strategy(dp=8, tp=8, pp=1, zero=1, sp=True, micro_batch=1),
              Strategy(dp=2, tp=8, pp=4, sp=True, micro_batch=1, schedule="interleaved", vpp=4,
                       zero=1),
              Strategy(dp=4, tp=4, pp=4, sp=True, micro_batch=2, schedule="zb-h1",
                       recompute="full")):
        p = predict(m, CLUSTER, JOB, s)
        compute = sum(p.breakdown[k] for k in ("forward_compute", "backward_compute", "recompute"))
        bound = compute_bound(m, CLUSTER, JOB, s)
        assert compute <= bound <= p.step_time_s  # the pacing stage's compute, or a busier stage's
        if s.pp == 1:
            assert bound == pytest.approx(compute)
