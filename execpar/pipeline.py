"""Pipeline stages from any model built by execpar.model, and
torch.distributed.pipelining schedules.

A rank runs one chunk (GPipe, 1F1B), several in a loop (interleaved 1F1B and its zero-bubble
variant: chunks r, r + pp, ...), or two in a V (ZBV, DualPipeV: chunks r and 2pp - 1 - r)."""

from __future__ import annotations

import copy
import inspect
from typing import TYPE_CHECKING, Any

from simpar.specs.schedule import PipelineSchedule
from simpar.specs.strategy import split_layers

if TYPE_CHECKING:
    from execpar.model import Transformer


def keep_chunk(model: Transformer, chunk: int, chunks: int) -> Transformer:
    """Drop what chunk `chunk` of `chunks` does not run: other chunks' layers, and the
    embedding (all but the first) and the final norm and output layer (all but the
    last). Layers split as simpar splits them."""
    counts = split_layers(len(model.layers), chunks)
    first = sum(counts[:chunk])
    keep = {str(i) for i in range(first, first + counts[chunk])}
    for key in [k for k in model.layers if k not in keep]:
        del model.layers[key]
    if chunk > 0:
        model.tok_embeddings = None
    if chunk < chunks - 1:
        model.norm = None
        model.output = None
    return model


def split_for_rank(model: Transformer, schedule: PipelineSchedule, rank: int, pp: int,
                   vpp: int) -> tuple[list[int], list[Transformer]]:
    """The chunks pipeline rank `rank` runs, and the model cut to each of them."""
    mine = schedule.rank_chunks(rank, pp, vpp)
    chunks = pp * schedule.chunks_per_rank(vpp)
    if len(mine) == 1:
        return mine, [keep_chunk(model, mine[0], chunks)]
    return mine, [keep_chunk(copy.deepcopy(model), c, chunks) for c in mine]


def build_schedule(modules: list, chunk_ids: list, chunks: int, pp_group, device,
                   schedule: PipelineSchedule, micro_batches: int, loss_fn):
    import torch.distributed.pipelining as pipelining

    stages = [
        pipelining.PipelineStage(m, c, chunks, device, group=pp_group)
        for m, c in zip(modules, chunk_ids, strict=True)
    ]
    cls = getattr(pipelining, schedule.torch_class)
    if schedule.single_stage:
        return cls(stages[0], n_microbatches=micro_batches, loss_fn=loss_fn)
    return cls(stages, n_microbatches=micro_batches, loss_fn=loss_fn)


def without_outputs(schedule) -> dict[str, Any]:
    """The keyword that stops `schedule.step` keeping every micro-batch's output on the last stage:
    torch's schedules keep them, the logits, until the next step to merge and return them
    (PipelineStage.output_chunks), which execpar never asks for: for Llama 3 8B at 8K tokens a
    micro-batch, 2 GB of bf16 logits for each micro-batch of the step. The flag came with
    pytorch/pytorch issue 159251 (2025; torch 2.13 here has it); earlier releases keep the outputs
    whatever the caller says."""
    return {"return_outputs": False} if "return_outputs" in inspect.signature(
        schedule.step).parameters else {}
