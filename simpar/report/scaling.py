"""Scaling sweeps drawn and tabled: the rows of simpar/capacity/scaling.py as a plot and a CSV."""

from __future__ import annotations

import csv

from simpar.files import atomic_write


def write_csv(rows: list[dict], path: str) -> None:
    keys = [
        "gpus", "global_batch", "strategy", "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu",
        "mfu", "efficiency"
    ]

    def write(tmp):
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            for r in rows:
                w.writerow({k: r.get(k) for k in keys})
    atomic_write(path, write)


def write_plot(rows: list[dict], path: str, title: str, weak: bool) -> None:
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure registry

    ok = [r for r in rows if r.get("efficiency")]
    fig = Figure(figsize=(13, 5))
    (ax1, ax2) = fig.subplots(1, 2)
    g = [r["gpus"] for r in ok]
    ax1.plot(g, [r["tokens_per_s"] for r in ok], "o-", label="predicted (best strategy)")
    if ok:
        ax1.plot(g, [ok[0]["tokens_per_s_per_gpu"] * n for n in g], "k--", label="ideal (linear)")
    for r in ok:
        ax1.annotate(r["strategy"], (r["gpus"], r["tokens_per_s"]), fontsize=7, rotation=20,
                     textcoords="offset points", xytext=(4, -10))
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log")
    ax1.set_xlabel("GPUs")
    ax1.set_ylabel("throughput (tokens/s)")
    ax1.legend()
    ax2.plot(g, [100 * r["efficiency"] for r in ok], "o-", label="scaling efficiency")
    ax2.axhline(100, color="k", linestyle="--", label="ideal (100%)")
    ax2.set_xscale("log", base=2)
    ax2.set_ylim(0, 110)
    ax2.set_xlabel("GPUs")
    ax2.set_ylabel(f"{'weak' if weak else 'strong'}-scaling efficiency (%)")
    ax2.legend()
    fig.suptitle(title)
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
