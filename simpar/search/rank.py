"""Price every candidate strategy, drop those that do not fit in memory, rank the rest."""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, replace

from simpar.cost.step import Prediction, compute_bound, compute_bound_key, predict
from simpar.memory.model import memory_breakdown
from simpar.network.model import DEFAULT_NETWORK, NetworkOptions
from simpar.progress import Progress
from simpar.search.space import SearchSpace, enumerate_strategies


@dataclass(frozen=True)
class SearchResult:
    ranked: tuple[Prediction, ...]  # fitting strategies that were priced, fastest first
    enumerated: int
    out_of_memory: int
    seconds: float
    # the fastest one that did not fit, to explain empty results
    best_out_of_memory: Prediction | None
    # fitting strategies never priced: with free communication, slower than the ones kept
    pruned: int = 0
    # the event engine's re-ranking, apart from `seconds` (the search itself): each one a
    # whole simulated step, slow beside a closed-form price at thousands of GPUs
    reranked: int = 0
    rerank_seconds: float = 0.0
    # of out_of_memory, those whose allocated peak fits and only the allocator's expected slack
    # does not (MemoryBreakdown.verdict "tight")
    tight: int = 0

    @property
    def priced_per_s(self) -> float:
        return self.enumerated / self.seconds if self.seconds > 0 else float("inf")

    def to_dict(self, top: int) -> dict:
        return {
            "enumerated": self.enumerated, "out_of_memory": self.out_of_memory,
            "tight": self.tight, "feasible": len(self.ranked) + self.pruned,
            "priced": len(self.ranked),
            "pruned": self.pruned, "seconds": self.seconds, "priced_per_s": self.priced_per_s,
            "reranked": self.reranked, "rerank_seconds": self.rerank_seconds,
            "top": [p.to_dict() for p in self.ranked[:top]]
        }


def search(model, cluster, job, gpus: int, space: SearchSpace | None = None, progress: bool = False,
           mem_limit_gib: float | None = None, rerank: int = 0,
           network: NetworkOptions = DEFAULT_NETWORK, keep: int | None = None) -> SearchResult:
    """Rank every strategy whose memory per GPU is within `mem_limit_gib` (default: the GPU's HBM);
    the analytic top `rerank` (and the best of each other schedule) are then simulated
    with the event engine and re-ordered by it. `keep`: only the fastest `keep` need
    exact places; candidates are priced in order of their compute-only bound and skipped
    once that bound is slower than the keep-th (and than their schedule's best), which
    leaves the top `keep` exactly as pricing all would. None prices all. `progress`: a line on
    stderr while pricing or re-ranking runs longer than a second."""
    limit = cluster.gpu.hbm_gib if mem_limit_gib is None else mem_limit_gib
    start = time.perf_counter()
    fitting, oom, tight, n = [], 0, 0, 0
    smallest_oom = None  # (strategy, memory) of the candidate that misses the limit by the least
    space = space or SearchSpace()
    for s in enumerate_strategies(model, job, gpus, cluster.gpus_per_node, space,
                                  gpu=cluster.gpu):
        n += 1
        mem = memory_breakdown(model, job, s)
        if mem.total_gib > limit:
            oom += 1
            tight += mem.verdict(limit) == "tight"
            if smallest_oom is None or mem.total_gib < smallest_oom[1].total_gib:
                smallest_oom = (s, mem)
            continue
        fitting.append(_fewest_recomputed(model, job, s, mem, limit) if space.partial_recompute
                       else (s, mem))

    def price(s, mem):
        return predict(model, cluster, job, s, check=False, memory=mem, network=network)

    best_oom = price(*smallest_oom) if smallest_oom else None

    if keep is None:
        fits = [price(s, mem) for s, mem in _reporting(fitting, "pricing strategies", progress)]
        pruned = 0
    else:
        fits, pruned = _price_best(model, cluster, job, fitting, max(keep, rerank, 1), rerank > 0,
                                   price, progress)
    fits.sort(key=lambda p: p.step_time_s)
    searched_s = time.perf_counter() - start
    picked = 0
    if rerank:
        fits, picked = _rerank(model, cluster, job, fits, rerank, network, progress)
    rerank_s = time.perf_counter() - start - searched_s if picked else 0.0
    return SearchResult(tuple(fits), n, oom, searched_s, best_oom, pruned, picked, rerank_s,
                        tight)


def _rerank(model, cluster, job, fits: list, k: int, network, progress: bool) -> tuple[list, int]:
    """(`fits`, sorted by the closed form, with the event engine's price on those it played,
    these first in its order; how many it played): the closed form's top `k` and the best of each
    other schedule (_rerank_candidates), then, as long as the next candidate's closed-form time
    is under the k-th played one's, that candidate too (k more at most): the closed form errs
    differently per layout, so one it ranked lower may still beat those the engine slowed. A
    candidate too long for the engine to play keeps its closed-form price."""
    from simpar.cost.step import with_simulation
    from simpar.sim.engine import MAX_PASSES, passes, simulate

    def played(i: int):
        return with_simulation(fits[i], simulate(model, cluster, job, fits[i].strategy,
                                                 network=network))

    playable = [i for i, p in enumerate(fits) if passes(p.strategy, job) <= MAX_PASSES]
    can_play = set(playable)
    first = [i for i in _rerank_candidates(fits, k) if i in can_play]
    top = [played(i) for i in _reporting(first, "re-ranking with the event engine", progress)]
    done = set(first)
    later = [i for i in playable if i not in done]
    for i in later[:k]:
        bar = sorted(p.step_time_s for p in top)[min(k, len(top)) - 1] if top else 0.0
        if fits[i].step_time_s >= bar:
            break
        top.append(played(i))
        done.add(i)
    rest = [p for i, p in enumerate(fits) if i not in done]
    return sorted(top, key=lambda p: p.step_time_s) + rest, len(done)


def _fewest_recomputed(model, job, s, mem, limit: float) -> tuple:
    """A candidate that fits with full recompute, recomputing only as many layers of each chunk
    as it needs to fit (Strategy.recompute_layers): faster, since the other layers skip their
    recompute. Memory grows linearly with the layers that keep their activations, so two
    breakdowns give the count, a third checks it (the peak may move to another phase)."""
    if s.recompute != "full" or s.recompute_layers:
        return s, mem
    chunk = s.chunk_layers(model.layers)
    if chunk < 2:
        return s, mem
    one = memory_breakdown(model, job, replace(s, recompute_layers=1))
    per_layer = (one.total_gib - mem.total_gib) / (chunk - 1)
    if per_layer <= 0:
        return s, mem
    k = max(1, chunk - int((limit - mem.total_gib) / per_layer))
    while k < chunk:
        partial = replace(s, recompute_layers=k)
        fewer = memory_breakdown(model, job, partial)
        if fewer.total_gib <= limit:
            return partial, fewer
        k += 1
    return s, mem


def _reporting(items: list, label: str, progress: bool):
    bar = Progress(label, len(items)) if progress else None
    for i, item in enumerate(items):
        if bar:
            bar.update(i)
        yield item
    if bar:
        bar.close()


def _price_best(
    model, cluster, job, fitting: list, k: int, per_schedule: bool, price, progress: bool
) -> tuple[list, int]:
    """Price candidates by ascending compute bound until none left can enter the top k (nor, with
    `per_schedule`, beat its schedule's best, which the re-ranking also simulates)."""
    bounds: dict[tuple, float] = {}  # candidates alike but for their ZeRO stage share one
    bounded = []
    for i, (s, _) in enumerate(fitting):
        key = compute_bound_key(s)
        if key not in bounds:
            bounds[key] = compute_bound(model, cluster, job, s)
        bounded.append((bounds[key], i))
    bounded.sort()
    priced: list = []
    times: list[float] = []  # step times priced so far, ascending
    best: dict[str, float] = {}  # schedule -> fastest step time priced
    for bound, i in _reporting(bounded, "pricing strategies", progress):
        s, mem = fitting[i]
        kth = times[k - 1] if len(times) >= k else float("inf")
        if bound >= kth and (not per_schedule or bound >= best.get(s.schedule, float("inf"))) \
                and not s.has_whatifs:
            continue
        p = price(s, mem)
        priced.append(p)
        bisect.insort(times, p.step_time_s)
        best[s.schedule] = min(best.get(s.schedule, float("inf")), p.step_time_s)
    return priced, len(fitting) - len(priced)


def _rerank_candidates(fits: list, k: int) -> list[int]:
    """Indices of the analytic top k, plus the analytic best of each pipeline schedule not among
    them: the closed form errs differently per schedule, so the engine judges one of each."""
    picked = list(range(min(k, len(fits))))
    seen = {fits[i].strategy.schedule for i in picked}
    for i, p in enumerate(fits):
        if p.strategy.schedule not in seen:
            seen.add(p.strategy.schedule)
            picked.append(i)
    return picked
