"""How far each stack's predictions fell from published runs: the band `simulate` quotes beside
its numbers, so that a user knows how much to bet on them.

`benchmarks/stack_accuracy.py --stack-defaults --bands simpar/report/accuracy_bands.json` writes
the bands (reports/make_stack_accuracy.sh runs it): each published run of benchmarks/data/
stacks.yaml and each execpar H100 run, priced as a user who gives only `--stack` and the run's
strategy would price it. Nothing here changes a prediction."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

BANDS_FILE = Path(__file__).with_name("accuracy_bands.json")
# a band needs as many runs as a source does in the accuracy benchmark's per-source table
MIN_RUNS = 3


# Runs whose errors are their own, apart from the stack's other runs of the architecture, where
# MIN_RUNS of them were checked: context parallelism, whose ring attention torchtitan's measured
# runs show slower than priced as the ring grows (the benchmark's 8B and 405B rows).
CONTEXT_PARALLEL = "context-parallel"


def run_feature(cp: int) -> str:
    """The feature a run's band is kept apart by ("" for none)."""
    return CONTEXT_PARALLEL if cp > 1 else ""


@dataclass(frozen=True)
class AccuracyBand:
    """Errors of tokens/s per GPU (predicted / measured - 1) on one stack's published runs of
    one architecture ("dense" or "MoE"), of those with `feature` (run_feature) where it has a
    band of its own, else of the others."""
    stack: str
    architecture: str
    feature: str
    runs: int
    median_abs_error: float
    p90_abs_error: float  # nine runs in ten were closer than this
    median_signed_error: float  # positive: predicted faster than measured

    def to_dict(self) -> dict:
        return asdict(self)

    def text(self) -> str:
        # with fewer than ten runs the nearest-rank 90th percentile is the largest error
        spread = (f"within {self.p90_abs_error:.0%} in 9 of 10" if self.runs >= 10 else
                  f"within {self.p90_abs_error:.0%} on each")
        kind = f"{self.architecture} {self.feature}".strip()
        return (f"accuracy on {self.runs} measured {kind} runs of the {self.stack} "
                f"stack: tokens/s off by {self.median_abs_error:.1%} (median),\n"
                f"  {spread}, median signed {self.median_signed_error:+.1%} (+: predicted faster)")


def bands_from(errors: list[tuple[str, str, str, float]]) -> list[AccuracyBand]:
    """Bands from (stack, architecture, feature, error) quadruples: one per (stack, architecture,
    feature) with MIN_RUNS runs or more, and one of the remaining runs of each (stack,
    architecture) (those without a feature, and those whose feature has too few runs)."""
    groups: dict[tuple[str, str, str], list[float]] = {}
    for stack, architecture, feature, error in errors:
        groups.setdefault((stack, architecture, feature), []).append(error)
    for key in [k for k in groups if k[2] and len(groups[k]) < MIN_RUNS]:
        groups.setdefault((*key[:2], ""), []).extend(groups.pop(key))
    return [
        AccuracyBand(stack, architecture, feature, len(e), statistics.median(abs(x) for x in e),
                     _nearest_rank(sorted(abs(x) for x in e), 0.9), statistics.median(e))
        for (stack, architecture, feature), e in sorted(groups.items()) if len(e) >= MIN_RUNS
    ]


def _nearest_rank(ordered: list[float], q: float) -> float:
    """The q-quantile of an ordered list: its smallest value with a share q at or below it."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@cache
def _bands() -> dict[tuple[str, str, str], AccuracyBand]:
    if not BANDS_FILE.is_file():
        return {}
    rows = json.loads(BANDS_FILE.read_text())["bands"]
    return {(b["stack"], b["architecture"], b["feature"]): AccuracyBand(**b) for b in rows}


def band_for(stack: str, moe: bool, cp: int = 1) -> AccuracyBand | None:
    """The band of `stack` on runs like this one (its architecture, and context parallelism
    where that has a band of its own), or None where too few runs were checked."""
    architecture = "MoE" if moe else "dense"
    bands = _bands()
    return bands.get((stack, architecture, run_feature(cp))) or bands.get((stack, architecture, ""))
