"""Held-out accuracy on a PyTorch-native stack: torchtitan's published FSDP2 runs (eager or compiled).

Data: benchmarks/data/torchtitan.yaml. Nothing in simpar was fitted to these points; they check that the
eager-kernel model (`--kernels eager`) and torchtitan's op-level recompute (`--recompute op`) carry over
from the Megatron-LM calibration. The Grand Teton H100 is the catalog H100 with 96 GB of HBM2e at
2.4 TB/s; its 500 W power limit is not modelled (the catalog's sustained GEMM rate is at 700 W).
Usage: python benchmarks/pytorch_native_accuracy.py [--json]
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
from simpar.specs import GPUS, MODELS, JobSpec, Strategy, load_cluster  # noqa: E402

DATA = Path(__file__).parent / "data" / "torchtitan.yaml"


def _cluster(gpu: str):
    if gpu == "h100-96gb-hbm2e":
        base = load_cluster("dgx-h100", None)
        return replace(base, gpu=replace(GPUS["h100-sxm"], name=gpu, hbm_gib=95.6, hbm_tbps=2.4))
    return load_cluster("dgx-a100" if gpu.startswith("a100") else "dgx-h100", None)


def rows():
    out = []
    for pt in yaml.safe_load(DATA.read_text())["points"]:
        model, cluster = MODELS[pt["model"]], _cluster(pt["gpu"])
        job = JobSpec(pt["seq_len"], pt["local_batch"] * pt["gpus"], "bf16")
        s = Strategy(dp=pt["gpus"], zero=pt["zero"], micro_batch=pt["local_batch"], recompute=pt["recompute"],
                     kernels=pt["kernels"])
        p = predict(model, cluster, job, s)
        measured = pt["tokens_per_s_per_gpu"]
        predicted = p.tokens_per_s / pt["gpus"]
        out.append({"id": pt["id"], "measured_tokens_per_s_per_gpu": measured,
                    "predicted_tokens_per_s_per_gpu": predicted, "error": predicted / measured - 1,
                    "memory_gib": p.memory.total_gib, "measured_memory_reserved_gib": pt.get("memory_reserved_gib"),
                    "fits_memory": p.memory.total_gib <= cluster.gpu.hbm_gib,
                    "note": pt.get("note", "")})
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
    print(f"{'point':50s} {'measured':>9s} {'predicted':>9s} {'error':>7s} {'mem GiB':>8s} {'reserved':>8s}")
    for r in rs:
        print(f"{r['id']:50s} {r['measured_tokens_per_s_per_gpu']:9,.0f} {r['predicted_tokens_per_s_per_gpu']:9,.0f} "
              f"{r['error']:+7.1%} {r['memory_gib']:8.1f} {r['measured_memory_reserved_gib'] or '-':>8}  {r['note']}")
    print(f"\nmedian |error| of tokens/s per GPU over {len(rs)} held-out torchtitan points: {median:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
