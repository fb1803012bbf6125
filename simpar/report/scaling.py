"""Scaling sweeps: the best strategy at each GPU count, scaling efficiency, a plot and a CSV."""

from __future__ import annotations

import csv
import os
from dataclasses import replace
from pathlib import Path

from simpar.errors import require
from simpar.files import atomic_write
from simpar.network.model import DEFAULT_NETWORK, NetworkOptions
from simpar.search.rank import search


def sweep(model, cluster, job, gpu_counts: list[int], weak: bool, progress=None, space=None,
          network: NetworkOptions = DEFAULT_NETWORK) -> list[dict]:
    """Weak scaling keeps the global batch per GPU of the smallest count; strong keeps the global batch;
    `space` (a SearchSpace) limits the candidates and carries the stack."""
    base = min(gpu_counts)
    rows = []
    for n in sorted(gpu_counts):
        j = replace(job, global_batch=job.global_batch * n // base) if weak else job
        result = search(model, cluster, j, n, space, network=network, keep=1)
        if progress:
            progress(n, result)
        if not result.ranked:
            rows.append({"gpus": n, "global_batch": j.global_batch, "strategy": "no strategy fits", "tokens_per_s": 0.0,
                         "tokens_per_s_per_gpu": 0.0, "step_time_s": None, "mfu": None, "efficiency": None})
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


def write_csv(rows: list[dict], path: str) -> None:
    keys = ["gpus", "global_batch", "strategy", "step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu",
            "efficiency"]

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


def run_scale(model, cluster, job, gpu_counts, weak: bool, out_dir: str, progress=None, space=None,
              network: NetworkOptions = DEFAULT_NETWORK) -> dict:
    rows = sweep(model, cluster, job, gpu_counts, weak, progress, space, network)
    require(any(r["tokens_per_s"] > 0 for r in rows), "--gpu-list", ",".join(map(str, gpu_counts)),
            "no strategy fits in memory at any of these GPU counts: give more GPUs, a shorter --seq-len or a "
            "smaller --global-batch (`simpar compare` at one count says what is biggest)")
    os.makedirs(out_dir, exist_ok=True)
    kind = "weak" if weak else "strong"
    csv_path, png_path = str(Path(out_dir) / f"scaling-{kind}.csv"), str(Path(out_dir) / f"scaling-{kind}.png")
    write_csv(rows, csv_path)
    title = (f"{model.name} on {cluster.name} ({cluster.gpu.name}), seq {job.seq_len}, {kind} scaling "
             f"({'global batch grows with GPUs' if weak else f'global batch {job.global_batch}'})")
    write_plot(rows, png_path, title, weak)
    return {"rows": rows, "csv": csv_path, "png": png_path}
