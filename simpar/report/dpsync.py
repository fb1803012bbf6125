"""Where one rank's ZeRO collectives spend a step (`simpar simulate --explain`): the transfer on
the network and, of it, the latency of the message steps; the host building one tensor per rank
where the stack's collectives take lists (DeepSpeed before v0.6, torch's list collectives); the
GPU's copies around each collective; hybrid sharding's all-reduce over the replicas. The totals
come before any overlap with compute: how much of them the step exposes is its `dp_comm` phase.
A user asking why ZeRO-3 stops scaling at a thousand ranks reads it off these rows."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from simpar.cost.gradsync import (
    SyncParts,
    persistent_regather_parts,
    sharded_sync_parts,
    zero_reduce_op,
)
from simpar.cost.pricing import Pricing
from simpar.cost.step import zero_cadence
from simpar.network.model import DEFAULT_NETWORK, network_for
from simpar.report.text import table
from simpar.specs.strategy import split_layers
from simpar.workload.params import stage_params


@dataclass(frozen=True)
class ZeroPass:
    """One kind of ZeRO pass of the first pipeline stage's rank, and how often a step runs it."""
    name: str
    per_step: float  # passes per step (ZeRO-3 gathers again for backward and recompute)
    parts: SyncParts

    def to_dict(self) -> dict:
        return {"name": self.name, "per_step": self.per_step, **asdict(self.parts),
                "step_s": self.per_step * self.parts.total_s}


def zero_passes(model, cluster, job, strategy, network=DEFAULT_NETWORK) -> tuple[ZeroPass, ...]:
    """The parameter all-gathers and gradient reductions (reduce-scatters, or all-reduces where
    the stack's ZeRO-3 runs them) of a sharded strategy (ZeRO 1-3 over more than one
    data-parallel rank), as the step prices them; () otherwise."""
    s = strategy
    if s.optimizer_zero(job.dtype) == 0 or s.dp * s.cp == 1:
        return ()
    p = Pricing(model, cluster, job, s, network_for(cluster, s, network))
    blocks = split_layers(model.layers, s.pp)[0]
    dense, expert = stage_params(model, s, 0, blocks)
    m = s.micro_batches(job.global_batch)
    rs_step, ag_step, rs_mb, ag_mb = zero_cadence(s, model)
    parts = {op: sharded_sync_parts(p, op, dense, expert, blocks, with_latency=True)
             for op in ("allgather", "reducescatter")}
    reduce = {"allreduce": "all-reduce", "reducescatter": "reduce-scatter"}[zero_reduce_op(s, job)]
    passes = (ZeroPass("parameter all-gather", ag_step + m * ag_mb, parts["allgather"]),
              ZeroPass(f"gradient {reduce}", rs_step + m * rs_mb, parts["reducescatter"]))
    persistent = persistent_regather_parts(p)
    # priced in the optimizer phase: the step's end waits for it
    return passes + ((ZeroPass("persistent re-gather", 1.0, persistent),) if persistent else ())


def zero_passes_text(passes: tuple[ZeroPass, ...]) -> str:
    """The per-step table: each part summed over the step's passes, in seconds."""
    rows = []
    for z in passes:
        c, n = z.parts, z.per_step
        seconds = (c.wire_s, c.latency_s, c.host_s, c.copies_s, c.replica_s, c.total_s)
        rows.append([z.name, f"{n:.3g}", f"{c.collectives:,}",
                     f"{c.bytes_per_collective / 2**20:,.1f}", *(f"{n * t:.3f}" for t in seconds)])
    return ("ZeRO collectives of one rank per step, before overlap with compute (seconds)\n"
            + table(["pass", "passes", "collectives/pass", "MiB each", "wire", "of it latency",
                     "host lists", "GPU copies", "replicas", "total"], rows))
