"""The event engine: agreement with the closed form, schedules' bubbles, overlap,
stragglers, traces."""

import itertools
import json

import numpy as np
import pytest

from simpar.cli import main
from simpar.cost.layer import PassCost
from simpar.cost.pricing import Pricing
from simpar.cost.step import predict
from simpar.network.model import DEFAULT_NETWORK, network_for
from simpar.sim import schedules
from simpar.sim.costs import ChunkCost
from simpar.sim.engine import SimOptions, _Step, simulate
from simpar.specs import MODELS, JobSpec, Strategy, load_cluster
from simpar.specs.schedule import get_schedule

A100 = load_cluster("dgx-a100", None)
GPT = MODELS["megatron2021-18.4b"]


@pytest.mark.parametrize("strategy", [
    Strategy(dp=32, tp=8, overlap_grad_reduce=False),
    Strategy(dp=16, tp=8, pp=2, overlap_grad_reduce=False),
    Strategy(dp=8, tp=8, pp=4, overlap_grad_reduce=False, schedule="gpipe", micro_batch=2),
    Strategy(dp=8, tp=8, pp=4, overlap_grad_reduce=False, zero=1),
    Strategy(dp=4, tp=8, pp=8, overlap_grad_reduce=False, recompute="full"),
    Strategy(dp=64, tp=4, overlap_grad_reduce=False, zero=1, sp=True),
])
def test_engine_agrees_with_analytic_without_overlap_or_contention(strategy):
    job = JobSpec(2048, 512)
    sim = simulate(GPT, A100, job, strategy, SimOptions(contention=False))
    ana = predict(GPT, A100, job, strategy)
    assert sim.p50_s == pytest.approx(ana.step_time_s, rel=0.02)


def _play(name, pp, m, v=1, f=1.0, b=2.0, w=None):
    """Play a schedule with uniform chunk costs and no communication."""
    sched = schedules.build(get_schedule(name), pp, m, v)
    chunks = sched.chunks
    k = sched.chunks_per_stage  # a rank's work is split over its chunks
    back = PassCost(compute_s=(b + (w or 0.0)) / k, wgrad_s=(w or 0.0) / k)
    fwd = PassCost(compute_s=f / k)
    costs = [ChunkCost(fwd, back, 0.0, 0.0) for _ in range(chunks)]
    s = Strategy(dp=1, pp=pp)
    step = _Step(Pricing(None, A100, JobSpec(2048, m), s, None), SimOptions(), sched, costs, 0.0,
                 np.random.default_rng(0))
    return step.run(), sched


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("pp, m", [(2, 8), (4, 16), (8, 32), (8, 8)])
def test_measured_bubble_matches_formula(name, pp, m):
    r, _ = _play(name, pp, m)
    assert r.bubble_fraction == pytest.approx((pp - 1) / (m + pp - 1), rel=0.01)


@pytest.mark.parametrize("pp, v, m", [(4, 2, 16), (4, 4, 16), (8, 2, 32)])
def test_interleaving_shrinks_the_bubble_by_v(pp, v, m):
    r, _ = _play("interleaved", pp, m, v)
    # in units of one micro-batch's full forward+backward on a rank (3 s here)
    bubble = (pp - 1) / v
    assert r.bubble_fraction == pytest.approx(bubble / (m + bubble), rel=0.01)


def test_zb_h1_bubble_is_about_a_third_of_1f1b_with_the_same_memory():
    pp, m = 4, 16
    plain, s1 = _play("1f1b", pp, m, f=1.0, b=2.0)
    zb, s2 = _play("zb-h1", pp, m, f=1.0, b=1.0, w=1.0)  # F = B = W = 1
    ratio = (zb.bubble_fraction * zb.step_time_s) / (plain.bubble_fraction * plain.step_time_s)
    assert ratio == pytest.approx(1 / 3, abs=0.06)
    # the memory it costs: 1F1B holds pp - s micro-batches; ZB-H1 also holds up to pp
    # deferred W inputs
    assert schedules.peak_live(s1) == [pp - i for i in range(pp)]
    assert all(a < z <= a + pp
               for a, z in zip(schedules.peak_live(s1), schedules.peak_live(s2), strict=True))


def test_zbv_runs_every_op_once_and_beats_1f1b():
    pp, m = 4, 8
    zbv, sched = _play("zbv", pp, m, f=1.0, b=1.0, w=1.0)
    for order in sched.orders:
        assert len(order) == len(set(order)) == 2 * 3 * m
    plain, _ = _play("1f1b", pp, m, f=1.0, b=2.0)
    assert zbv.step_time_s < plain.step_time_s


def _scanned_greedy(pp, m, v, chunk_stage, max_live, max_deferred):
    """The zero-bubble list scheduler written plainly: every time step, each rank scans every op
    left for the most urgent one whose inputs finished (slow, the reference for the real one)."""
    last, finish, orders = pp * v - 1, {}, [[] for _ in range(pp)]
    live, deferred = [0] * pp, [0] * pp
    todo = {(k, i, c) for i in range(m) for c in range(last + 1) for k in "FBW"}
    t = 0
    while todo:
        for s in range(pp):
            urgent = "BFW" if max_deferred is None or deferred[s] < max_deferred[s] else "BWF"
            def done(*op, now=t):
                return finish.get(op, now + 1) <= now
            ready = [(urgent.index(k), i, -c if k == "F" else c, k, c) for k, i, c in todo
                     if chunk_stage[c] == s and (
                         k == "F" and (c == 0 or done("F", i, c - 1)) and live[s] < max_live[s]
                         or k == "B" and done("F", i, c) and done(*(("F", i, c) if c == last
                                                                   else ("B", i, c + 1)))
                         or k == "W" and done("B", i, c))]
            if ready:
                _, i, _, k, c = min(ready)
                todo.discard((k, i, c))
                orders[s].append((k, i, c))
                finish[(k, i, c)] = t + 1
                live[s] += {"F": 1, "B": -1, "W": 0}[k]
                deferred[s] += {"F": 0, "B": 1, "W": -1}[k]
        t += 1
    return orders


@pytest.mark.parametrize("pp, m", [(1, 3), (2, 2), (3, 7), (4, 8), (5, 12), (8, 17)])
def test_zero_bubble_orders_match_a_plain_scan_of_every_op(pp, m):
    v_stage = tuple(c if c < pp else 2 * pp - 1 - c for c in range(2 * pp))
    for sched, ref in ((schedules.build(get_schedule("zb-h1"), pp, m),
                        _scanned_greedy(pp, m, 1, tuple(range(pp)), [pp - s for s in range(pp)],
                                        [pp] * pp)),
                       (schedules.build(get_schedule("zbv"), pp, m),
                        _scanned_greedy(pp, m, 2, v_stage, [2 * pp] * pp, None))):
        assert [[(op.kind, op.mb, op.chunk) for op in order] for order in sched.orders] == ref


@pytest.mark.parametrize("pp, m", [(2, 4), (4, 8), (4, 16), (8, 32)])
def test_dualpipev_runs_every_op_once_with_pp_plus_one_chunks_alive(pp, m):
    sched = schedules.build(get_schedule("dualpipev"), pp, m)
    for r, order in enumerate(sched.orders):
        ops = [
            p for op in order
            for p in ((("F", op.mb, op.chunk), ("B", op.b_mb, op.b_chunk),
                       ("W", op.b_mb, op.b_chunk)) if op.kind == "FB" else ((op.kind, op.mb,
                                                                             op.chunk), ))
        ]
        mine = {r, 2 * pp - 1 - r}
        assert sorted(ops) == sorted((k, i, c) for k in "FBW" for i in range(m) for c in mine)
    # DeepSeek's table: PP + 1 stage activations on a rank (here 2pp half-size chunks,
    # one more on the last)
    assert schedules.peak_live(sched) == [2 * pp] * (pp - 1) + [2 * pp + 1]


@pytest.mark.parametrize("pp, m", [(4, 8), (4, 16), (8, 32)])
def test_dualpipev_bubble_matches_the_closed_form_at_equal_costs(pp, m):
    from simpar.cost.pipeline import pipeline_span
    r, _ = _play("dualpipev", pp, m, f=1.0, b=1.0, w=1.0)
    bubble = r.step_time_s - 3.0 * m
    # per chunk F&B = 1.5 (no communication to hide), B = W = 0.5: (pp - 1)(F&B + B - 2W)
    assert bubble == pytest.approx((pp - 1) * (1.5 + 0.5 - 1.0))
    _, closed = pipeline_span([3.0] * pp, m, get_schedule("dualpipev"), 1, wgrad_share=1 / 3,
                              backward_share=2 / 3)
    assert closed == pytest.approx(bubble)


def test_dualpipev_hides_tensor_parallel_comm_behind_the_other_micro_batch():
    job = JobSpec(2048, 512)
    runs = {
        name: simulate(GPT, A100, job,
                       Strategy(dp=8, tp=8, pp=4, schedule=name, overlap_grad_reduce=False),
                       SimOptions(contention=False))
        for name in ("zbv", "dualpipev")
    }
    assert (
        runs["dualpipev"].first.breakdown["tp_comm"] < 0.5 * runs["zbv"].first.breakdown["tp_comm"]
    )
    s = Strategy(dp=8, tp=8, pp=4, schedule="dualpipev", overlap_grad_reduce=False)
    # the closed form pairs the main phase only, as the reference order does: within 3%
    # of the engine
    assert predict(GPT, A100, job, s).step_time_s == pytest.approx(runs["dualpipev"].p50_s,
                                                                   rel=0.03)


def test_overlapped_gradient_reduction_hides_up_to_the_backward():
    job, model = JobSpec(2048, 64), MODELS["megatron2021-1.7b"]
    base = Strategy(dp=64, micro_batch=1)
    overlapped = simulate(model, A100, job, base).first
    serial = simulate(model, A100, job, Strategy(dp=64, overlap_grad_reduce=False)).first
    assert overlapped.step_time_s < serial.step_time_s
    # never hidden beyond the last backward: the exposed part is at least sync - last backward
    from simpar.network.model import network_for
    from simpar.sim.costs import chunk_costs, sync_seconds
    net = network_for(A100, base)
    c = chunk_costs(Pricing(model, A100, job, base, net), 1, lambda _: 0, {})[0]
    sync = sync_seconds(
        Pricing(model, A100, job, base, net), "allreduce", c.dense_params, c.expert_params
    )
    assert overlapped.breakdown["dp_comm"] >= sync - c.backward.total_s - 1e-9
    assert serial.breakdown["dp_comm"] == pytest.approx(sync, rel=0.01)


@pytest.mark.parametrize("strategy", [Strategy(dp=8, tp=8, pp=4), Strategy(dp=32, tp=8)])
def test_a_straggler_slows_the_whole_step(strategy):
    job = JobSpec(2048, 512)
    base = simulate(GPT, A100, job, strategy).p50_s
    slow = simulate(GPT, A100, job, strategy, SimOptions(stragglers=((0, 1.5),))).p50_s
    assert slow > 1.3 * base


def test_jitter_gives_a_spread_and_p99_above_p50():
    r = simulate(GPT, A100, JobSpec(2048, 512), Strategy(dp=8, tp=8, pp=4),
                 SimOptions(steps=8, jitter=0.05, seed=1))
    assert len(r.step_times_s) == 8 and r.p99_s > r.p50_s


def test_heterogeneous_stages_follow_the_slow_gpu():
    s, job = Strategy(dp=8, tp=8, pp=4), JobSpec(2048, 512)
    fast = simulate(GPT, load_cluster("dgx-h100", None), job, s).p50_s
    mixed = simulate(GPT, load_cluster("dgx-h100", None), job, s,
                     SimOptions(stage_gpus=((3, "a100-80gb"), ))).p50_s
    assert mixed > 1.5 * fast


def test_trace_is_valid_chrome_json(tmp_path, capsys):
    trace, png = tmp_path / "t.json", tmp_path / "t.png"
    args = [
        "simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "64", "--seq-len",
        "4096", "--global-batch", "64", "--tp", "4", "--pp", "4", "--sp", "--zero", "1", "--trace",
        str(trace), "--timeline",
        str(png), "--json"
    ]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    events = json.loads(trace.read_text())["traceEvents"]
    # the step ends with the last op any rank runs
    spans = [e for e in events if e.get("ph") == "X"]
    assert doc["simulation"]["engine"] == "event"
    assert max(e["ts"] + e["dur"]
               for e in spans) / 1e6 == pytest.approx(doc["step_time_s"], rel=1e-9)
    assert len(events) > 50
    for e in events:
        assert {"name", "ph", "ts", "pid", "tid"} <= set(e)
    assert {e["ph"] for e in events} == {"M", "X"} and png.stat().st_size > 1000


def test_analytic_engine_flag_and_bad_sim_flags(capsys):
    base = [
        "simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "64", "--seq-len",
        "4096", "--global-batch", "64", "--tp", "4", "--pp", "4", "--sp"
    ]
    assert main(base + ["--engine", "analytic", "--json"]) == 0
    assert "simulation" not in json.loads(capsys.readouterr().out)
    assert main(base + ["--straggler", "9:1.5"]) == 2
    assert "--pp 4 has ranks 0..3" in capsys.readouterr().err
    assert main(base + ["--straggler", "1:0.5"]) == 2
    assert main(base + ["--stage-gpu", "1:tpu"]) == 2


def test_compare_reranks_with_the_event_engine(capsys):
    assert main([
        "compare", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "64", "--seq-len", "4096",
        "--global-batch", "64", "--rerank", "3", "--json", "--top", "5"
    ]) == 0
    out = json.loads(capsys.readouterr().out)
    steps = [p["step_time_s"] for p in out["top"][:3]]
    assert steps == sorted(steps)
    # the top 3 and each other schedule's best, timed apart from the search
    assert out["reranked"] >= 3 and out["rerank_seconds"] > 0
    assert main(["compare", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "64",
                 "--seq-len", "4096", "--global-batch", "64", "--rerank", "2"]) == 0
    assert "The event engine re-ranked" in capsys.readouterr().out
    assert main(["compare", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "64",
                 "--seq-len", "4096", "--global-batch", "64", "--rerank", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["reranked"], out["rerank_seconds"]) == (0, 0.0)


def test_a_shared_link_finishes_late_in_a_long_simulation():
    """At t = 3e7 s a float resolves ~4 ns: transfers left a few ulps short were woken
    forever (an absolute 1e-12 s completion test); the work still adds up: one link, 1 +
    2 + 3 s of transfers end at +6 s."""
    import simpy

    from simpar.sim.channel import Channel

    env = simpy.Environment(initial_time=3e7)
    link, ends = Channel(env), []

    def send(seconds, after):
        yield env.timeout(after)
        yield link.transfer(seconds)
        ends.append(env.now)

    for i, s in enumerate((1.0, 2.0, 3.0) * 20):
        env.process(send(s / 20, i * 1.3e-9))
    events = 0
    # a bounded run: a hang fails, not stalls CI
    while env.peek() < float("inf") and events < 100_000:
        env.step()
        events += 1
    assert len(ends) == 60 and max(ends) == pytest.approx(3e7 + 6.0, abs=1e-6) and events < 10_000


def test_virtual_stages_gather_their_weights_in_turn(tmp_path, capsys):
    """ZeRO-1 with overlap: each virtual stage's updated weights are gathered after the one
    before (Megatron dispatches them as its schedule reaches each), so the first forward waits
    for its own chunk's first bucket only; started together, sharing the link, it had waited
    for every chunk's."""
    trace = tmp_path / "t.json"
    assert main(["simulate", "--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "128",
                 "--seq-len", "4096", "--global-batch", "32", "--tp", "8", "--pp", "4",
                 "--schedule", "interleaved", "--vpp", "5", "--zero", "1", "--trace",
                 str(trace), "--json"]) == 0
    capsys.readouterr()
    spans = [e for e in json.loads(trace.read_text())["traceEvents"]
             if e.get("ph") == "X" and e["pid"] == 0]
    gathers = sorted((e for e in spans if e["name"] == "gathered"), key=lambda e: e["ts"])
    assert len(gathers) == 5
    for before, after in itertools.pairwise(gathers):
        assert after["ts"] >= before["ts"] + before["dur"] - 1e-3
    first = min((e for e in spans if e["name"].startswith("F")), key=lambda e: e["ts"])
    assert 0 < first["ts"] <= gathers[0]["dur"] + 1e-3


def _no_overlap_slowdown(cluster):
    from dataclasses import replace
    return replace(cluster, gpu=replace(cluster.gpu, overlap_slowdown=0.0))


def test_fsdp_streams_its_gathers_and_reduce_scatters_block_by_block():
    """FSDP prefetches each block's all-gather behind the block before it and reduce-scatters each
    block's gradients as its backward ends, so with one micro-batch a step waits only for the
    root unit's and the first block's gather before forward and the last block's and the root's
    reduce-scatter after backward. Played as whole chunks, it had waited for the chunk's whole
    gather and whole reduce-scatter (2.3 s of a 70B step on 64 A100s where this leaves 0.5)."""
    from simpar.cost.gradsync import sharded_sync
    from simpar.cost.step import zero3_edge_share

    m = MODELS["llama3-8b"]
    h100 = _no_overlap_slowdown(load_cluster("dgx-h100", None))
    s = Strategy(dp=128, zero=3, stack="torchtitan", micro_batch=1)
    job = JobSpec(8192, 128)  # one micro-batch a rank: nothing to hide behind but its own blocks
    # by hand: the root unit is the embedding, the output layer and the final norm
    root = 2 * m.vocab * m.hidden + m.hidden
    blocks = m.total_params - root
    edge = (root + blocks / m.layers) / m.total_params  # 0.158
    assert zero3_edge_share(s, m.total_params, root, m.layers, with_root=True) == pytest.approx(
        edge, rel=1e-3)
    pricing = Pricing(m, h100, job, s, network_for(h100, s, DEFAULT_NETWORK))
    gather = sharded_sync(pricing, "allgather", m.total_params, 0.0, m.layers)
    reduce = sharded_sync(pricing, "reducescatter", m.total_params, 0.0, m.layers)
    sim = simulate(m, h100, job, s, SimOptions())
    assert sim.first.breakdown["dp_comm"] == pytest.approx(edge * (gather + reduce), rel=0.02)
    # the closed form prices the same overlap
    assert predict(m, h100, job, s).step_time_s == pytest.approx(sim.p50_s, rel=0.01)
    # DeepSpeed before v0.6 waits for each gather: the whole forward gather is exposed
    old = simulate(m, h100, job, Strategy(dp=128, zero=3, stack="deepspeed", micro_batch=1),
                   SimOptions())
    assert old.first.breakdown["dp_comm"] > gather
