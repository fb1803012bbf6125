"""Event-engine speed: one step of Llama 3.1 405B on 16,384 H100s (tp 8, pp 16, dp 128, 16
micro-batches), and `compare` with event-engine re-ranking on 1,024 GPUs.
Usage: python benchmarks/sim_speed.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simpar.network.model import flow_model  # noqa: E402
from simpar.search.rank import search  # noqa: E402
from simpar.sim.engine import SimOptions, simulate  # noqa: E402
from simpar.specs import MODELS, JobSpec, Strategy, load_cluster  # noqa: E402


def main() -> int:
    cluster = load_cluster("dgx-h100", None)
    model, job = MODELS["llama3.1-405b"], JobSpec(8192, 2048)
    s = Strategy(dp=128, tp=8, pp=16, sp=True, zero=1)
    for schedule in ("1f1b", "zb-h1"):
        flow_model.cache_clear()
        start = time.perf_counter()
        r = simulate(model, cluster, job, s, SimOptions(schedule=schedule))
        total = time.perf_counter() - start
        print(
            f"405B on 16,384 H100 ({schedule}): {total:.2f} s in all (fabric, collectives, "
            f"engine); engine {r.wall_s:.2f} s for {r.events:,} events ({r.events / r.wall_s:,.0f} "
            f"events/s); step {r.p50_s:.2f} s")
    flow_model.cache_clear()
    start = time.perf_counter()
    res = search(MODELS["llama3-70b"], cluster, JobSpec(8192, 1024), 1024, rerank=5)
    print("compare llama3-70b on 1,024 H100 with the top 5 re-ranked by the event engine: "
          f"{time.perf_counter() - start:.2f} s ({res.enumerated:,} strategies)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
