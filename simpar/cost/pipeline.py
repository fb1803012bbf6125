"""Pipeline step time from per-stage micro-batch times.

GPipe and 1F1B: a permutation flow shop of M identical micro-batches, so the step spans (M - 1)
x the slowest stage + the sum of all stages; with equal stages that is (M + P - 1) t, and the
bubble (P - 1) t is (P - 1)/M of the ideal M t. Interleaved 1F1B with v virtual stages cuts the
fill and drain to 1/v: M t_max + (sum - t_max)/v (Narayanan et al. 2021, section 2.2)."""

from __future__ import annotations

from simpar.specs.schedule import PipelineSchedule


def pipeline_span(stage_times: list[float], micro_batches: int, schedule: PipelineSchedule,
                  vpp: int, wgrad_share: float = 0.0,
                  backward_share: float = 2.0 / 3.0) -> tuple[float, float]:
    """(span seconds, bubble seconds) of the forward+backward phase of one step. `wgrad_share` is
    W / (F + B) and `backward_share` B / (F + B) of the pace-setting stage, with B the
    whole backward: zero-bubble schedules move W into the fill and drain, leaving (F + B
    - 2W)/(F + B) of the 1F1B bubble (ZB-H1, Qi et al. 2024), and ZBV's two half-size
    chunks per rank halve that again; DualPipeV's reference order leaves (F + 2B - 3W) /
    (2 (F + B)) (all as the event engine measures them)."""
    t_max, total = max(stage_times), sum(stage_times)
    ideal = micro_batches * t_max
    fill_drain = (total - t_max) * schedule.fill_drain_share(vpp, wgrad_share, backward_share)
    return ideal + fill_drain, fill_drain
