"""How fast `simpar compare` enumerates and prices strategies (run on demand, not in the
tests): pricing every candidate ('all s') against pricing by compute bound until the top
--top is settled ('pruned s', what compare does), and whether both give the same top --top.
'was s' is the whole search before it was reworked (issue 15), '/s' candidates searched per second
(pruned).

Usage: python benchmarks/search_speed.py [--repeat N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simpar.network.model import flow_model  # noqa: E402
from simpar.network.placement import rank_groups  # noqa: E402
from simpar.search.rank import search  # noqa: E402
from simpar.specs import MODELS, JobSpec, dgx_like  # noqa: E402

CASES = [  # (model, gpu, gpus, seq_len, global_batch, seconds before the search was reworked)
    # the last column: `compare` pricing every candidate one by one, as measured on this machine
    # when the work began (issue 15's table; kept to show the old beside the new)
    ("llama3-70b", "h100-sxm", 1024, 8192, 1024, 23.0),
    ("llama3.1-405b", "h100-sxm", 16384, 8192, 2048, 71.0),
    ("mixtral-8x7b", "h100-sxm", 256, 4096, 1024, 22.1),
    ("gpt3-175b", "a100-80gb", 1024, 2048, 1536, 10.5),
]


def _timed(repeat: int, **kw):
    best, r = None, None
    for _ in range(repeat):
        flow_model.cache_clear()  # cold: no fabric or solved pattern left from the run before
        rank_groups.cache_clear()
        t0 = time.perf_counter()
        r = search(**kw)
        dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    return r, best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs per case; the fastest is reported")
    ap.add_argument("--top", type=int, default=20,
                    help="places the pruned search keeps exact (compare's --top)")
    args = ap.parse_args(argv)
    print(f"{'case':34} {'enumerated':>10} {'fit':>6} {'priced':>6} {'best s':>7} {'was s':>6} "
          f"{'all s':>6} {'pruned s':>8} {'was /s':>7} {'now /s':>7} {'top ' + str(args.top):>7}")
    for name, gpu, gpus, seq, batch, was_s in CASES:
        kw = dict(model=MODELS[name], cluster=dgx_like(gpu), job=JobSpec(seq, batch), gpus=gpus)
        every, t_all = _timed(args.repeat, **kw)
        kept, t_kept = _timed(args.repeat, keep=args.top, **kw)
        same = [p.strategy
                for p in kept.ranked[:args.top]] == [p.strategy for p in every.ranked[:args.top]]
        top = f"{every.ranked[0].step_time_s:.2f}" if every.ranked else "-"
        n = every.enumerated
        print(f"{name + ' / ' + str(gpus) + ' x ' + gpu:34} {n:10d} {len(every.ranked):6d} "
              f"{len(kept.ranked):6d} {top:>7} {was_s:6.1f} {t_all:6.2f} {t_kept:8.2f} "
              f"{n / was_s:7,.0f} {n / t_kept:7,.0f} {'same' if same else 'DIFFER':>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
