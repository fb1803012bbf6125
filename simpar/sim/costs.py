"""Durations the event engine plays: per chunk (virtual stage) forward, backward and weight-gradient
costs, pipeline transfers and data-parallel collectives, from the same cost layer as the
analytic model."""

from __future__ import annotations

from dataclasses import dataclass

from simpar.cost.gradsync import ddp_sync, sharded_sync
from simpar.cost.layer import (
    PassCost,
    at_step_power,
    head_behind_host,
    head_cost,
    layer_passes,
    layers_backward,
    strategy_head_work,
    strategy_layer_work,
)
from simpar.cost.pricing import Pricing
from simpar.cost.step import activation_offload_seconds, gradient_copy_seconds
from simpar.specs.gpu import GPUS
from simpar.specs.strategy import split_layers
from simpar.workload.params import chunk_params, root_params


@dataclass(frozen=True)
class ChunkCost:
    forward: PassCost
    backward: PassCost  # input and weight gradients (and recompute)
    dense_params: float  # on one rank
    expert_params: float
    layers: int = 1  # transformer blocks in the chunk (ZeRO-3 gathers block by block)
    root_params: float = 0.0  # of dense_params, those outside the blocks (params.root_params)


def chunk_costs(p: Pricing, chunks: int, stage_of, stage_gpu: dict) -> list[ChunkCost]:
    """Costs of each of `chunks` virtual stages in data-flow order; `stage_gpu` overrides the GPU of
    some pipeline ranks (heterogeneous jobs)."""
    model, job, s, net = p.model, p.job, p.strategy, p.net
    prof = s.profile
    work = strategy_layer_work(model, job, s)
    head = strategy_head_work(model, job, s)
    per_gpu = {}
    out = []
    for c, layers in enumerate(split_layers(model.layers, chunks)):
        base = GPUS[stage_gpu[stage_of(c)]] if stage_of(c) in stage_gpu else p.gpu
        if base.name not in per_gpu:
            gpu = at_step_power(work, head, model.layers, base, job.dtype, prof, s.recompute)
            per_gpu[base.name] = (*layer_passes(work, net, gpu, job.dtype, s.recompute,
                                                s.overlap_tp_comm, prof, s.recompute_layers > 0,
                                                s.selective_modules(model)),
                                  *head_cost(head, net, gpu, job.dtype))
        fwd, bwd, plain, hf, hb = per_gpu[base.name]
        params = chunk_params(model, s, layers, c == 0, c == chunks - 1)
        off_f, off_b = activation_offload_seconds(p, fwd, bwd, layers)
        f = fwd.scaled(layers) + PassCost(compute_s=off_f)
        b = (layers_backward(bwd, plain, layers, s.recomputed(layers))
             + PassCost(compute_s=gradient_copy_seconds(p, *params) + off_b))
        if c == chunks - 1:
            f, b = f + hf, head_behind_host(b + hb, hf.compute_s + hb.compute_s)
        root = root_params(model, s, c == 0, c == chunks - 1)
        out.append(ChunkCost(f, b, *params, layers, root))
    return out


def sync_seconds(p: Pricing, op: str, dense: float, expert: float, blocks: int = 1) -> float:
    """One collective over a chunk's parameters (or a share of them) of `blocks` transformer blocks:
    gradients for reductions, 16-bit weights for gathers; DDP's all-reduce follows the what-ifs."""
    return (
        ddp_sync(p, dense, expert)
        if op == "allreduce"
        else sharded_sync(p, op, dense, expert, blocks)
    )
