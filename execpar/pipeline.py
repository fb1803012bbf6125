"""Pipeline stages from any model built by execpar.model, and torch.distributed.pipelining schedules."""

from __future__ import annotations

from torch import nn

from simpar.errors import SpecError
from simpar.specs.strategy import split_layers

SCHEDULE_CLASSES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}


def keep_stage(model: nn.Module, stage: int, stages: int) -> nn.Module:
    """Drop what pipeline rank `stage` does not run: other stages' layers, and the embedding (all but the
    first) and the final norm and output layer (all but the last). Layers are split as simpar splits them."""
    if model.spec.tied_embeddings:
        raise SpecError("model.tied_embeddings", True,
                        "tied embeddings cannot span pipeline stages in execpar; plan an untied model or --pp 1")
    counts = split_layers(len(model.layers), stages)
    first = sum(counts[:stage])
    keep = {str(i) for i in range(first, first + counts[stage])}
    for key in [k for k in model.layers if k not in keep]:
        del model.layers[key]
    if stage > 0:
        model.tok_embeddings = None
    if stage < stages - 1:
        model.norm = None
        model.output = None
    return model


def build_schedule(module: nn.Module, stage: int, stages: int, pp_group, device, schedule: str, micro_batches: int,
                   loss_fn):
    import torch.distributed.pipelining as pipelining

    pipe_stage = pipelining.PipelineStage(module, stage, stages, device, group=pp_group)
    cls = getattr(pipelining, SCHEDULE_CLASSES[schedule])
    return cls(pipe_stage, n_microbatches=micro_batches, loss_fn=loss_fn)
