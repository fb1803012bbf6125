"""All-reduce bus bandwidth: simpar's flow model against the published curves in the
calibration set.

Points: 8x H200 in one node (NVLS), 4 x 8 B200, 2 x 8 H100 on Google Cloud A3 Mega (see
benchmarks/data/published.yaml). Prints measured and predicted busbw per message size and the error;
the target is within 15% from 128 MiB up. Also times pricing one all-reduce over 4,096 GPUs.
Usage: python benchmarks/collective_accuracy.py [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simpar.network.collectives import bus_factor  # noqa: E402
from simpar.network.model import flow_model  # noqa: E402
from simpar.specs import load_cluster  # noqa: E402

DATA = Path(__file__).parent / "data" / "published.yaml"
CLUSTER_OF = {
    "allreduce_8xH200_single_node_torch": "hgx-h200", "allreduce_4x8xB200_torch": "dgx-b200",
    "allreduce_2x8xH100_gcp_a3mega_nccltests": "gcp-a3-mega"
}
UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def _bytes(label: str) -> int:
    for unit, scale in UNITS.items():
        if label.endswith(unit):
            return int(float(label[:-len(unit)]) * scale)
    raise ValueError(label)


def rows():
    out = []
    for pt in yaml.safe_load(DATA.read_text())["points"]:
        if pt["id"] not in CLUSTER_OF:
            continue
        n = pt["parallel"]["total_gpus"]
        model = flow_model(load_cluster(CLUSTER_OF[pt["id"]], None), n)
        for label, m in pt["measured"]["busbw_GBps_by_message_size"].items():
            size = _bytes(label)
            t, algo = model.cost("allreduce", size, (tuple(range(n)),))
            busbw = size / t * bus_factor("allreduce", n) / 1e9
            out.append({
                "id": pt["id"], "cluster": CLUSTER_OF[pt["id"]], "gpus": n, "size": label,
                "size_bytes": size, "measured_busbw_gbps": m["value"],
                "predicted_busbw_gbps": busbw, "algorithm": algo, "error": busbw / m["value"] - 1
            })
    return out


def pricing_seconds(gpus: int = 4096) -> float:
    start = time.perf_counter()
    flow_model(load_cluster("dgx-h100", None), gpus).cost("allreduce", 1e9, (tuple(range(gpus)),))
    return time.perf_counter() - start


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON document")
    args = ap.parse_args(argv)
    table, secs = rows(), pricing_seconds()
    big = [r for r in table if r["size_bytes"] >= 128 * 2**20]
    worst = max(abs(r["error"]) for r in big)
    if args.json:
        print(
            json.dumps(
                {"rows": table, "worst_error_from_128MiB": worst, "price_4096_allreduce_s": secs}))
        return 0
    print(f"{'curve':42} {'size':>6} {'measured':>9} {'predicted':>9} {'error':>7}  algorithm")
    for r in table:
        print(f"{r['id']:42} {r['size']:>6} {r['measured_busbw_gbps']:9.1f} "
              f"{r['predicted_busbw_gbps']:9.1f} {r['error']:+7.1%}  {r['algorithm']}")
    print(f"\nworst |error| from 128 MiB up: {worst:.1%} over {len(big)} points")
    print("pricing one all-reduce over 4,096 GPUs of dgx-h100 (build the fabric, solve every "
          f"algorithm): {secs:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
