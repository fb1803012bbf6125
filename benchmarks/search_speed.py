"""How fast `simpar compare` enumerates and prices strategies (run on demand, not in the tests).

Usage: python benchmarks/search_speed.py [--repeat N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simpar.search.rank import search  # noqa: E402
from simpar.specs import MODELS, JobSpec, dgx_like  # noqa: E402

CASES = [  # (model, gpu, gpus, seq_len, global_batch)
    ("llama3-70b", "h100-sxm", 1024, 8192, 1024),
    ("llama3.1-405b", "h100-sxm", 16384, 8192, 2048),
    ("mixtral-8x7b", "h100-sxm", 256, 4096, 1024),
    ("gpt3-175b", "a100-80gb", 1024, 2048, 1536),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per case; the fastest is reported")
    args = ap.parse_args(argv)
    print(f"{'case':42} {'enumerated':>10} {'fit':>6} {'best s':>8} {'seconds':>8} {'priced/s':>9}")
    for name, gpu, gpus, seq, batch in CASES:
        best = None
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            r = search(MODELS[name], dgx_like(gpu), JobSpec(seq, batch), gpus)
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        top = f"{r.ranked[0].step_time_s:.2f}" if r.ranked else "-"
        print(f"{name + ' / ' + str(gpus) + ' x ' + gpu:42} {r.enumerated:10d} {len(r.ranked):6d} {top:>8} "
              f"{best:8.2f} {r.enumerated / best:9,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
