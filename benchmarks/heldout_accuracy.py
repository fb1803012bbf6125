"""Held-out accuracy: published runs from other stacks than the calibration set's Megatron-LM.

Data: benchmarks/data/heldout.yaml (torchtitan's FSDP2 runs, eager or compiled;
DeepSeek-V3 on 2,048 H800s). Nothing in simpar was fitted to these points: they check
that eager kernels (`--kernels eager`), op-level recompute, latent attention, shared
experts, FP8 and DualPipeV carry over from the calibration.
Usage: python benchmarks/heldout_accuracy.py [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simpar.cost.step import predict  # noqa: E402
from simpar.specs import MODELS, JobSpec, Strategy  # noqa: E402
from simpar.specs.cluster import load_cluster  # noqa: E402

DATA = Path(__file__).parent / "data" / "heldout.yaml"


def rows():
    out = []
    for pt in yaml.safe_load(DATA.read_text())["points"]:
        # a cluster file where the source's hardware is known beyond its GPU, else a DGX-like node
        cluster = load_cluster(pt.get("cluster"), pt["gpu"])
        if pt.get("gpu_overrides"):
            cluster = replace(cluster, gpu=replace(cluster.gpu, **pt["gpu_overrides"]))
        if pt.get("power_limit_w"):
            cluster = replace(cluster, gpu=cluster.gpu.power_limited(pt["power_limit_w"]))
        job = JobSpec(**pt["job"])
        p = predict(MODELS[pt["model"]], cluster, job, Strategy(**pt["strategy"]))
        measured, predicted = pt["tokens_per_s_per_gpu"], p.tokens_per_s / pt["gpus"]
        out.append({
            "id": pt["id"], "measured_tokens_per_s_per_gpu": measured,
            "predicted_tokens_per_s_per_gpu": predicted, "error": predicted / measured - 1,
            "memory_gib": p.memory.total_gib, "fits_memory": p.fits_memory,
            "measured_memory_reserved_gib": pt.get("memory_reserved_gib"),
            "note": pt.get("note", "")
        })
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rs = rows()
    median = statistics.median(abs(r["error"]) for r in rs)
    if args.json:
        print(json.dumps({"rows": rs, "median_abs_error": median}, indent=1))
        return 0
    print(f"{'point':50s} {'measured':>9s} {'predicted':>9s} {'error':>7s} {'mem GiB':>8s} "
          f"{'reserved':>8s}")
    for r in rs:
        print(f"{r['id']:50s} {r['measured_tokens_per_s_per_gpu']:9,.0f} "
              f"{r['predicted_tokens_per_s_per_gpu']:9,.0f} {r['error']:+7.1%} "
              f"{r['memory_gib']:8.1f} {r['measured_memory_reserved_gib'] or '-':>8}  {r['note']}")
    print(f"\nmedian |error| of tokens/s per GPU over {len(rs)} held-out points: {median:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
