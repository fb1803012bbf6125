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


@dataclass(frozen=True)
class AccuracyBand:
    """Errors of tokens/s per GPU (predicted / measured - 1) on one stack's published runs of
    one architecture ("dense" or "MoE")."""
    stack: str
    architecture: str
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
        return (f"accuracy on {self.runs} measured {self.architecture} runs of the {self.stack} "
                f"stack: tokens/s off by {self.median_abs_error:.1%} (median),\n"
                f"  {spread}, median signed {self.median_signed_error:+.1%} (+: predicted faster)")


def bands_from(errors: list[tuple[str, str, float]]) -> list[AccuracyBand]:
    """One band per (stack, architecture) with MIN_RUNS runs or more, from (stack,
    architecture, error) triples."""
    groups: dict[tuple[str, str], list[float]] = {}
    for stack, architecture, error in errors:
        groups.setdefault((stack, architecture), []).append(error)
    return [
        AccuracyBand(stack, architecture, len(e), statistics.median(abs(x) for x in e),
                     _nearest_rank(sorted(abs(x) for x in e), 0.9), statistics.median(e))
        for (stack, architecture), e in sorted(groups.items()) if len(e) >= MIN_RUNS
    ]


def _nearest_rank(ordered: list[float], q: float) -> float:
    """The q-quantile of an ordered list: its smallest value with a share q at or below it."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@cache
def _bands() -> dict[tuple[str, str], AccuracyBand]:
    if not BANDS_FILE.is_file():
        return {}
    rows = json.loads(BANDS_FILE.read_text())["bands"]
    return {(b["stack"], b["architecture"]): AccuracyBand(**b) for b in rows}


def band_for(stack: str, moe: bool) -> AccuracyBand | None:
    """The band of `stack` on models like this one, or None where too few runs were checked."""
    return _bands().get((stack, "MoE" if moe else "dense"))
