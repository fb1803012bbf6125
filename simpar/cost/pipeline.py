"""Pipeline step time from per-stage micro-batch times.

GPipe and 1F1B: a permutation flow shop of M identical micro-batches, so the step spans
(M - 1) x the slowest stage + the sum of all stages; with equal stages that is (M + P - 1) t, and the
bubble (P - 1) t is (P - 1)/M of the ideal M t. Interleaved 1F1B with v virtual stages cuts the fill
and drain to 1/v: M t_max + (sum - t_max)/v (Narayanan et al. 2021, section 2.2)."""

from __future__ import annotations


def pipeline_span(stage_times: list[float], micro_batches: int, schedule: str, vpp: int) -> tuple[float, float]:
    """(span seconds, bubble seconds) of the forward+backward phase of one step."""
    t_max, total = max(stage_times), sum(stage_times)
    ideal = micro_batches * t_max
    fill_drain = total - t_max
    if schedule == "interleaved":
        fill_drain /= vpp
    return ideal + fill_drain, fill_drain
