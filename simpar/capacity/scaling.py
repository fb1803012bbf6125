"""Scaling: the best strategy at each GPU count and its scaling efficiency, weak or strong."""

from __future__ import annotations

from dataclasses import replace

from simpar.network.model import DEFAULT_NETWORK, NetworkOptions
from simpar.search.rank import search


def scaling_rows(model, cluster, job, gpu_counts: list[int], weak: bool, progress=None, space=None,
          network: NetworkOptions = DEFAULT_NETWORK) -> list[dict]:
    """Weak scaling keeps the global batch per GPU of the smallest count; strong keeps the
    global batch; `space` (a SearchSpace) limits the candidates and carries the stack."""
    base = min(gpu_counts)
    rows = []
    for n in sorted(gpu_counts):
        j = replace(job, global_batch=job.global_batch * n // base) if weak else job
        result = search(model, cluster, j, n, space, network=network, keep=1)
        if progress:
            progress(n, result)
        if not result.ranked:
            rows.append({
                "gpus": n, "global_batch": j.global_batch, "strategy": "no strategy fits",
                "tokens_per_s": 0.0, "tokens_per_s_per_gpu": 0.0, "step_time_s": None, "mfu": None,
                "efficiency": None
            })
            continue
        p = result.ranked[0]
        rows.append({"gpus": n, "global_batch": j.global_batch,
                     "strategy": p.strategy.label,
                     "tokens_per_s": p.tokens_per_s, "tokens_per_s_per_gpu": p.tokens_per_s / n,
                     "step_time_s": p.step_time_s, "mfu": p.mfu})
    first = next((r for r in rows if r["tokens_per_s"] > 0), None)
    for r in rows:
        if first and r["tokens_per_s"] > 0:
            # weak: per-GPU throughput against the smallest count; strong: speed-up against ideal
            ideal = first["tokens_per_s_per_gpu"] * r["gpus"]
            r["efficiency"] = r["tokens_per_s"] / ideal
    return rows
