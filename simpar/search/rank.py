"""Price every candidate strategy, drop those that do not fit in memory, rank the rest."""

from __future__ import annotations

import time
from dataclasses import dataclass

from simpar.cost.step import Prediction, predict
from simpar.memory.model import memory_breakdown
from simpar.network.model import DEFAULT_NETWORK, NetworkOptions
from simpar.search.space import SearchSpace, enumerate_strategies


@dataclass(frozen=True)
class SearchResult:
    ranked: tuple[Prediction, ...]  # fitting strategies, fastest first
    enumerated: int
    out_of_memory: int
    seconds: float
    best_out_of_memory: Prediction | None  # the fastest one that did not fit, to explain empty results

    @property
    def priced_per_s(self) -> float:
        return self.enumerated / self.seconds if self.seconds > 0 else float("inf")

    def to_dict(self, top: int) -> dict:
        return {"enumerated": self.enumerated, "out_of_memory": self.out_of_memory, "feasible": len(self.ranked),
                "seconds": self.seconds, "priced_per_s": self.priced_per_s,
                "top": [p.to_dict() for p in self.ranked[:top]]}


def search(model, cluster, job, gpus: int, space: SearchSpace | None = None, progress=None,
           mem_limit_gib: float | None = None, rerank: int = 0, network: NetworkOptions = DEFAULT_NETWORK) -> SearchResult:
    """Rank every strategy whose memory per GPU is within `mem_limit_gib` (default: the GPU's HBM);
    the analytic top `rerank` (and the best of each other schedule) are then simulated with the event
    engine and re-ordered by it."""
    limit = cluster.gpu.hbm_gib if mem_limit_gib is None else mem_limit_gib
    start = time.perf_counter()
    fits, oom, n = [], 0, 0
    best_oom = None
    for s in enumerate_strategies(model, job, gpus, cluster.gpus_per_node, space or SearchSpace()):
        n += 1
        mem = memory_breakdown(model, job, s)
        if mem.total_gib > limit:
            oom += 1
            if best_oom is None or mem.total_gib < best_oom.memory.total_gib:
                best_oom = predict(model, cluster, job, s, check=False, memory=mem, network=network)
            continue
        fits.append(predict(model, cluster, job, s, check=False, memory=mem, network=network))
        if progress and n % 5000 == 0:
            progress(n)
    fits.sort(key=lambda p: p.step_time_s)
    if rerank:
        from simpar.cost.step import with_simulation
        from simpar.sim.engine import simulate

        picked = _rerank_candidates(fits, rerank)
        top = [with_simulation(fits[i], simulate(model, cluster, job, fits[i].strategy, network=network)) for i in picked]
        rest = [p for i, p in enumerate(fits) if i not in set(picked)]
        fits = sorted(top, key=lambda p: p.step_time_s) + rest
    return SearchResult(tuple(fits), n, oom, time.perf_counter() - start, best_oom)


def _rerank_candidates(fits: list, k: int) -> list[int]:
    """Indices of the analytic top k, plus the analytic best of each pipeline schedule not among them: the
    closed form errs differently per schedule, so the engine judges one of each."""
    picked = list(range(min(k, len(fits))))
    seen = {fits[i].strategy.schedule for i in picked}
    for i, p in enumerate(fits):
        if p.strategy.schedule not in seen:
            seen.add(p.strategy.schedule)
            picked.append(i)
    return picked
