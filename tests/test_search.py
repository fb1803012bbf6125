"""The search: pruning by the compute-only bound keeps the top of the ranking exactly as
pricing every candidate does."""

import pytest

from simpar.cost.step import (
    _free_layer_and_head,
    _layer_and_head_on,
    compute_bound,
    compute_bound_key,
    predict,
)
from simpar.network.model import FREE_NETWORK
from simpar.search.rank import search
from simpar.search.space import SearchSpace, enumerate_strategies
from simpar.specs import MODELS, JobSpec, Strategy, load_cluster
from simpar.specs.schedule import SCHEDULES
from simpar.specs.strategy import split_layers, stage_kind_counts, stage_kinds, validate
from simpar.workload.layer import head_work, layer_work

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
        else:  # the fill and drain of the pipeline count, at no more than the priced bubble
            assert compute < bound <= compute + p.breakdown["pipeline_bubble"] * (1 + 1e-12)


@pytest.mark.parametrize("model, gpus", [("llama3-70b", 32), ("mixtral-8x7b", 16)])
def test_no_candidate_is_priced_faster_than_its_bound(model, gpus):
    """Every schedule, ZeRO stage and recompute choice the search enumerates: a bound above the
    prediction would prune a candidate that belongs in the top."""
    m = MODELS[model]
    every = SearchSpace(schedules=tuple(SCHEDULES))
    cands = list(enumerate_strategies(m, JOB, gpus, CLUSTER.gpus_per_node, every,
                                      gpu=CLUSTER.gpu))
    assert {s.schedule for s in cands} >= {"1f1b", "interleaved", "zb-h1", "zbv"}
    for s in cands:
        assert compute_bound(m, CLUSTER, JOB, s) <= predict(m, CLUSTER, JOB, s).step_time_s * (
            1 + 1e-12), s.label


def test_the_search_runs_the_schedules_the_stack_runs():
    """Megatron core pipelines with 1F1B, interleaved or not; DeepSpeed's PipelineEngine with its
    1F1B TrainSchedule; torchtitan takes any of torch's classes; Composer and plain FSDP do not
    pipeline. A candidate of another schedule would be a plan its stack cannot run, unless the
    user asks for those schedules."""
    m = MODELS["llama3-70b"]

    def schedules(stack: str, space=None) -> set[str]:
        space = space or SearchSpace(overrides=(("stack", stack),))
        return {s.schedule for s in enumerate_strategies(m, JOB, 32, CLUSTER.gpus_per_node,
                                                         space, gpu=CLUSTER.gpu)}

    assert schedules("megatron") == schedules("nemo") == {"1f1b", "interleaved"}
    assert schedules("deepspeed") == {"1f1b"}
    assert schedules("torchtitan") == set(SCHEDULES)
    # Composer's and plain FSDP trainers do not pipeline: only pp 1 (1f1b stands for none)
    for stack in ("mosaic", "fsdp"):
        assert schedules(stack) == {"1f1b"}
        assert {s.pp for s in enumerate_strategies(m, JOB, 32, CLUSTER.gpus_per_node,
                                                   SearchSpace(overrides=(("stack", stack),)),
                                                   gpu=CLUSTER.gpu)} == {1}
    asked = SearchSpace(schedules=("DualPipeV", "1f1b"), overrides=(("stack", "megatron"),))
    assert schedules("megatron", asked) == {"dualpipev", "1f1b"}
    assert SearchSpace(schedules=("All",)).schedules == tuple(SCHEDULES)


def test_cached_compute_costs_equal_fresh_ones():
    m = MODELS["mixtral-8x7b"]
    cands = list(enumerate_strategies(m, JOB, 16, CLUSTER.gpus_per_node, gpu=CLUSTER.gpu))[::7]
    warm = [compute_bound(m, CLUSTER, JOB, s) for s in cands]
    for cache in (_free_layer_and_head, layer_work, head_work, split_layers, stage_kinds,
                  stage_kind_counts):
        cache.cache_clear()
    assert [compute_bound(m, CLUSTER, JOB, s) for s in cands] == warm
    s = cands[0]
    args = (m, CLUSTER.gpu, JOB.seq_len, JOB.dtype, s.micro_batch, s.tp, s.cp, s.ep, s.sp,
            s.flash, s.elementwise, s.recompute, s.recompute_layers > 0, s.overlap_tp_comm,
            s.profile, s.loss_kind, s.shards_parameters, s.selective_modules(m))
    assert _free_layer_and_head(*args) == _layer_and_head_on(FREE_NETWORK, *args)


@pytest.mark.parametrize("model, gpus, seq, batch, space", [
    ("llama3-70b", 96, 4096, 192, SearchSpace()),
    ("mixtral-8x7b", 48, 8192, 96, SearchSpace()),
    ("deepseek-v3", 64, 4096, 128, SearchSpace(schedules=("dualpipev", "interleaved"))),
    ("gpt3-175b", 96, 3072, 72, SearchSpace(tp=(16,), cp=(3,), micro_batch=(1, 3))),
    ("llama3-8b", 12, 6144, 36, SearchSpace(cp=(2, 4), accumulation=3)),
    ("llama3-8b", 8, 4096, 16, SearchSpace(overrides=(("stack", "torchtitan"),))),
])
def test_enumerated_strategies_pass_validation(model, gpus, seq, batch, space):
    """The enumeration does not ask `validate` again (a search makes thousands of candidates):
    its loops must already make only strategies that validation accepts."""
    m, job = MODELS[model], JobSpec(seq, batch)
    cands = list(enumerate_strategies(m, job, gpus, CLUSTER.gpus_per_node, space,
                                      gpu=CLUSTER.gpu))
    assert cands
    for s in cands:
        validate(s, m, job, gpus)


@pytest.mark.parametrize("stack", ["megatron", "torchtitan"])
def test_candidates_sharing_a_bound_key_have_the_same_bound(stack):
    """The search prices one compute bound per key; torchtitan's FSDP2 copies make the ZeRO stage
    part of it (a planted key without the ZeRO stage fails here)."""
    m = MODELS["llama3-70b"]
    space = SearchSpace(overrides=(("stack", stack),))
    cands = list(enumerate_strategies(m, JOB, 32, CLUSTER.gpus_per_node, space,
                                      gpu=CLUSTER.gpu))
    by_key: dict = {}
    for s in cands:
        by_key.setdefault(compute_bound_key(s), set()).add(compute_bound(m, CLUSTER, JOB, s))
    assert all(len(bounds) == 1 for bounds in by_key.values())
    if stack == "megatron":  # no FSDP2 copies: the ZeRO stages share their bound
        assert len(by_key) < len(cands) / 2


def test_a_long_search_says_how_far_it_is_on_stderr_only(monkeypatch, capsys):
    from simpar import progress

    m = MODELS["llama3-8b"]
    monkeypatch.setattr(progress, "SILENT_FOR_S", 0.0)  # as if each step took over a second
    monkeypatch.setattr(progress, "EVERY_S", 0.0)
    search(m, CLUSTER, JOB, 16, keep=3, rerank=2, progress=True)
    out, err = capsys.readouterr()
    assert out == "" and "pricing strategies" in err and "re-ranking with the event engine" in err
    search(m, CLUSTER, JOB, 16, keep=3, rerank=2)
    err = capsys.readouterr().err
    assert "pricing strategies" not in err and "re-ranking" not in err


def test_the_engine_plays_on_while_the_closed_form_ranks_the_next_candidate_under_its_top(
        monkeypatch):
    """Five candidates the closed form prices 1.0-1.4 s; the engine finds the first two slower
    (1.5, 1.6) and the next two faster (1.25, 1.35). With --rerank 2 the engine plays the top two,
    then the third (1.2 < 1.6, the 2nd played), then the fourth (1.3 < 1.5), then stops: k more at
    most. The fifth keeps its closed-form 1.4 after the played ones."""
    from types import SimpleNamespace

    import simpar.cost.step as step
    import simpar.sim.engine as engine
    from simpar.search import rank

    closed = [1.0, 1.1, 1.2, 1.3, 1.4]
    event = [1.5, 1.6, 1.25, 1.35, 2.0]
    fits = [SimpleNamespace(step_time_s=t, strategy=SimpleNamespace(schedule="1f1b", i=i))
            for i, t in enumerate(closed)]
    monkeypatch.setattr(engine, "passes", lambda s, job: 1)
    monkeypatch.setattr(engine, "simulate", lambda m, c, j, s, network=None: s.i)
    monkeypatch.setattr(step, "with_simulation",
                        lambda p, i: SimpleNamespace(step_time_s=event[i], strategy=p.strategy))
    ranked, played = rank._rerank(None, None, None, fits, 2, None, False)
    assert played == 4
    assert [p.step_time_s for p in ranked] == [1.25, 1.35, 1.5, 1.6, 1.4]


def test_selective_recompute_is_searched_where_it_frees_memory():
    """Selective recompute of the attention core frees nothing behind a fused kernel, so the
    search skips it there; an unfused core (Megatron-LM of 2022, the technique's own paper), a
    whole attention module (execpar's selective) or named modules free memory and are searched."""
    m = MODELS["llama3-70b"]

    def modes(stack: str, **space) -> set[str]:
        asked = SearchSpace(overrides=(("stack", stack),), **space)
        return {s.recompute for s in enumerate_strategies(m, JOB, 32, CLUSTER.gpus_per_node,
                                                          asked, gpu=CLUSTER.gpu)}

    assert modes("megatron") == {"none", "full"}
    assert modes("megatron-2022") == modes("execpar") == {"none", "selective", "full"}
    assert "selective" in modes("megatron", recompute_modules=("mlp",))
