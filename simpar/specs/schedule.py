"""Pipeline schedules: one object per schedule, holding everything the layers ask of it.

Which chunks (virtual stages) a rank runs, whether the backward is split into input- and
weight-gradient ops, how many micro-batches' activations are alive at a stage's peak,
how much of the 1F1B fill and drain is left, what the schedule needs of the batch, and
the torch.distributed.pipelining class execpar runs. The event engine's per-rank op
orders are built in simpar/sim/schedules.py, keyed by these names."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from simpar.errors import one_of
from simpar.specs.names import canonical, normal_form

# A deferred weight-gradient op keeps the inputs of its layer's linear layers and their
# output gradients: about half of what a layer stores for backward (QKV and MLP inputs,
# the attention output and the MLP activation out of Korthikanti's 34h per token).
DEFERRED_W_SHARE = 0.5


@dataclass(frozen=True)
class PipelineSchedule:
    name: str
    torch_class: str  # the torch.distributed.pipelining schedule execpar runs
    summary: str  # one line for --help
    # input- and weight-gradient ops run apart (zero-bubble schedules)
    splits_backward: bool = False
    v_shape: bool = False  # two half-size chunks per rank in a V: r and 2pp - 1 - r
    virtual_stages: bool = False  # --vpp chunks per rank, round robin: r, r + pp, ...
    # DualPipeV's reference order needs at least 2 pp micro-batches
    min_micro_batches_per_pp: int = 0
    # ... and torch's class at least this many per pipeline rank (Schedule1F1B: one per stage;
    # Megatron's 1F1B runs fewer)
    torch_min_micro_batches_per_pp: int = 0
    # micro-batches of a full stage whose activations are alive at the peak on `stage`, given pp > 1
    inflight: Callable[[int, int, int, int],
                       float] = lambda stage, pp, vpp, m: float(min(pp - stage, m))
    # the share of 1F1B's fill and drain left: (vpp, wgrad_share W/(F+B), backward_share B/(F+B))
    fill_drain_share: Callable[[int, float, float], float] = lambda vpp, w, b: 1.0
    # the share of a step's forwards that run beside another micro-batch's backward:
    # (micro_batches, pp)
    paired_share: Callable[[int, int], float] = lambda m, pp: 0.0

    @property
    def needs_pipeline(self) -> bool:
        """More than one chunk per rank, or a split backward: meaningless without
        pipeline parallelism."""
        return self.splits_backward or self.v_shape or self.virtual_stages

    @property
    def single_stage(self) -> bool:
        """torch runs it with one PipelineStage per rank (PipelineScheduleSingle)."""
        return not self.needs_pipeline

    def chunks_per_rank(self, vpp: int) -> int:
        return 2 if self.v_shape else vpp if self.virtual_stages else 1

    def rank_chunks(self, rank: int, pp: int, vpp: int) -> list[int]:
        """The chunks (virtual stages, in data-flow order) that pipeline rank `rank` runs."""
        if self.v_shape:
            return [rank, 2 * pp - 1 - rank]
        return [rank + k * pp for k in range(self.chunks_per_rank(vpp))]

    def inflight_micro_batches(self, stage: int, pp: int, vpp: int, micro_batches: int) -> float:
        return 1.0 if pp == 1 else self.inflight(stage, pp, vpp, micro_batches)

    def live_gradient_share(self, pp: int, vpp: int, micro_batches: int) -> float:
        """Of the gradients a rank accumulates per chunk, each from its chunk's first backward
        to its last (FSDP kept unsharded under torch.distributed.pipelining: stage.py,
        backward_maybe_with_nosync, syncs and frees a stage's only at its last backward), the
        share alive beside the activations' peak. The interleaved schedule runs backwards chunk
        by chunk in rounds of pp micro-batches (the last chunk's first): with a single round
        (micro_batches <= pp, torchtitan's default count) a chunk's last backward comes before
        the next chunk's first, so one chunk's gradients live at a time; with more rounds every
        chunk's overlap."""
        if self.virtual_stages and micro_batches <= pp:
            return 1.0 / self.chunks_per_rank(vpp)
        return 1.0


def _interleaved_inflight(stage: int, pp: int, vpp: int, m: int) -> float:
    """Megatron's interleaved warm-up: 2 (pp - stage - 1) + (vpp - 1) pp + 1 chunk
    forwards, each 1/vpp."""
    return min(m * vpp, 2 * (pp - stage - 1) + (vpp - 1) * pp + 1) / vpp


GPIPE = PipelineSchedule("gpipe", "ScheduleGPipe", "all forwards, then all backwards",
                         inflight=lambda stage, pp, vpp, m: float(m))
ONE_F_ONE_B = PipelineSchedule("1f1b", "Schedule1F1B",
                               "one forward, one backward (PipeDream-Flush)",
                               torch_min_micro_batches_per_pp=1)
INTERLEAVED = PipelineSchedule("interleaved", "ScheduleInterleaved1F1B",
                               "1F1B over --vpp chunks per rank", virtual_stages=True,
                               inflight=_interleaved_inflight,
                               fill_drain_share=lambda vpp, w, b: 1.0 / vpp)
# 1F1B plus up to pp deferred weight-gradient ops (the event engine's ZB-H1)
ZB_H1 = PipelineSchedule(
    "zb-h1", "ScheduleInterleavedZeroBubble",
    "1F1B with deferred weight gradients (Qi et al. 2024)", splits_backward=True,
    inflight=lambda stage, pp, vpp, m: min(pp - stage, m) + DEFERRED_W_SHARE * min(pp, m),
    fill_drain_share=lambda vpp, w, b: max(0.0, 1.0 - 2.0 * w))
# every rank holds up to 2pp half-size chunks: pp micro-batches, as 1F1B's first
ZBV = PipelineSchedule("zbv", "ScheduleZBVZeroBubble",
                       "zero bubble over two chunks per rank in a V", splits_backward=True,
                       v_shape=True, inflight=lambda stage, pp, vpp, m: float(min(pp, m)),
                       fill_drain_share=lambda vpp, w, b: max(0.0, 1.0 - 2.0 * w) / 2.0)
# 2pp half-size chunks, one more on the last rank (DeepSeek: PP + 1 stages)
DUALPIPEV = PipelineSchedule(
    "dualpipev", "ScheduleDualPipeV", "DeepSeek's DualPipe in a V: forwards beside backwards",
    splits_backward=True, v_shape=True, min_micro_batches_per_pp=2,
    inflight=lambda stage, pp, vpp, m: min(pp, m) + (0.5 if stage == pp - 1 else 0.0),
    fill_drain_share=lambda vpp, w, b: max(0.0, 1.0 + b - 3.0 * w) / 2.0,
    # of the 2m chunk forwards of its first rank, 2m - 3pp + 1 are paired (the reference
    # order's phases 4 and 5); the warm-up and the drain run alone
    paired_share=lambda m, pp: min(1.0, max(0.0, (2 * m - 3 * pp + 1) / (2 * m))))

def interleaved_warmup(rank: int, pp: int, vpp: int, passes: int) -> int:
    """Forwards rank `rank` runs before its first backward in Megatron-LM's interleaved 1F1B
    (schedules.py, get_pp_rank_microbatches): (pp - rank - 1) * 2 + (vpp - 1) * pp, at most the
    `passes` (micro-batches x vpp) of its step."""
    return min((pp - rank - 1) * 2 + (vpp - 1) * pp, passes)


# the schedules Megatron core's combined 1F1B (--overlap-ep-comm) has a form of
# (pipeline_parallel/combined_1f1b.py: ..._for_no_pipelining, ..._for_interleaved_pipelining)
COMBINED_1F1B = (ONE_F_ONE_B, INTERLEAVED)

SCHEDULES: dict[str, PipelineSchedule] = {
    s.name: s for s in (GPIPE, ONE_F_ONE_B, INTERLEAVED, ZB_H1, ZBV, DUALPIPEV)
}


# torch.distributed.pipelining's names for the schedules, as execpar runs each (its class, and
# torchtitan's --parallelism.pipeline_parallel_schedule, which drops the Schedule prefix), in
# names.normal_form; its ScheduleLoopedBFS has no counterpart here. Also the papers' names:
# PipeDream-Flush (Narayanan et al. 2021) is 1F1B, GPipe's fill-drain; interleaved 1F1B either way
# round.
SCHEDULE_ALIASES = {
    **{normal_form(alias): s.name for s in SCHEDULES.values()
       for alias in (s.torch_class, s.torch_class.removeprefix("Schedule"))},
    "interleaved-1f1b": "interleaved", "1f1b-interleaved": "interleaved",
    "pipedream-flush": "1f1b", "fill-drain": "gpipe",
}


def schedule_name(name: str) -> str:
    """The schedule a user's name for it means (names.canonical, with SCHEDULE_ALIASES), or the
    name as typed for one_of to refuse."""
    return canonical(name, SCHEDULES, SCHEDULE_ALIASES)


def get_schedule(name: str) -> PipelineSchedule:
    """The schedule of that name (as schedule_name reads it), or a one-line error listing the
    names."""
    name = schedule_name(name)
    one_of("schedule", name, SCHEDULES)
    return SCHEDULES[name]
