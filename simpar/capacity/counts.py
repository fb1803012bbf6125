"""Compare GPU counts for a token budget: the best strategy at each count, its days, cost
and goodput, ranked by an objective, and the Pareto front of cost against time-to-train."""

from __future__ import annotations

from simpar.capacity.reliability import ReliabilityInputs, reliability, time_and_cost
from simpar.files import atomic_write
from simpar.network.model import DEFAULT_NETWORK, NetworkOptions
from simpar.search.rank import search
from simpar.search.space import SearchSpace

OBJECTIVES = ("throughput", "time", "cost", "goodput")


def compare_counts(model, cluster, job, counts, inputs: ReliabilityInputs, price: float,
                   objective: str, *, space: SearchSpace | None = None, rerank: int = 0,
                   mem_limit_gib: float | None = None,
                   network: NetworkOptions = DEFAULT_NETWORK) -> list[dict]:
    rows = []
    for n in counts:
        res = search(model, cluster, job, n, space, mem_limit_gib=mem_limit_gib, rerank=rerank,
                     network=network, keep=1)
        if not res.ranked:
            rows.append({"gpus": n, "strategy": "no strategy fits"})
            continue
        p = res.ranked[0]
        rel = reliability(model.total_params, p.strategy, inputs, cluster.gpus_per_node, job.dtype)
        row = {"gpus": n, "strategy": p.strategy.label,
               "tokens_per_s": p.tokens_per_s, "mfu": p.mfu, "goodput": rel.goodput}
        if job.tokens:
            row.update(
                time_and_cost(job.tokens, p.tokens_per_s, n, rel.goodput, price, cluster.gpu.tdp_w))
        rows.append(row)
    key = {
        "throughput": lambda r: -r.get("tokens_per_s", 0),
        "goodput": lambda r: -r.get("goodput", 0),
        "time": lambda r: r.get("wall_clock_days", float("inf")), "cost": lambda r: r.get("cost")
        if r.get("cost") is not None else r.get("gpu_hours", float("inf"))
    }[objective]
    ranked = sorted(rows, key=key)
    front, best = [], float("inf")
    for r in sorted((r for r in rows if "wall_clock_days" in r),
                    key=lambda r: r["wall_clock_days"]):
        money = r["cost"] if r["cost"] is not None else r["gpu_hours"]
        r["pareto"] = money < best
        if r["pareto"]:
            best = money
            front.append(r)
    return ranked


def pareto_plot(rows: list[dict], path: str, title: str) -> None:
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure registry

    pts = [r for r in rows if "wall_clock_days" in r]
    priced = bool(pts) and pts[0]["cost"] is not None
    money = [(r["cost"] if priced else r["gpu_hours"]) / 1e6 for r in pts]
    fig = Figure(figsize=(8, 5))
    ax = fig.subplots()
    ax.scatter([r["wall_clock_days"] for r in pts], money, label="best strategy per GPU count")
    front = [(r["wall_clock_days"], m)
             for r, m in sorted(zip(pts, money, strict=True), key=lambda x: x[0]["wall_clock_days"])
             if r.get("pareto")]
    ax.plot([d for d, _ in front], [m for _, m in front], "r--", label="Pareto front")
    for r, m in zip(pts, money, strict=True):
        text = (f"{r['gpus']} GPUs: {r['wall_clock_days']:.0f} days, {m:.2f}M, "
                f"goodput {r['goodput']:.1%}")
        ax.annotate(text, (r["wall_clock_days"], m), textcoords="offset points", xytext=(6, 4),
                    fontsize=8)
    ax.set_xlabel("time to train, with failures and restarts (days)")
    ax.set_ylabel(
        "cost (millions, at the given price per GPU-hour)" if priced else "GPU-hours (millions)")
    ax.margins(x=0.35, y=0.15)
    ax.set_title(title)
    ax.legend()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight"),
                 "--pareto")
