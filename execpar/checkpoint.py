"""Checkpoints with torch.distributed.checkpoint, written atomically, and exact resume.

A checkpoint of step k lives in DIR/step-k: the model and optimizer state (sharded as the run shards
them), the loss curve so far and every rank's RNG state. It is written to DIR/step-k.tmp and renamed by
rank 0 once every rank has finished, so a crash mid-write never leaves a checkpoint that looks whole.
The step is the data position: batches are a function of the step, so resuming replays nothing."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from simpar.errors import SpecError

_STEP = re.compile(r"^step-(\d+)$")


def latest(folder: str | None) -> tuple[int, Path] | None:
    if not folder or not Path(folder).is_dir():
        return None
    found = [(int(m.group(1)), p) for p in Path(folder).iterdir() if (m := _STEP.match(p.name)) and p.is_dir()]
    return max(found) if found else None


def save(folder: str, step: int, model, optimizer, losses: list) -> None:
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if isinstance(optimizer, ZeroRedundancyOptimizer):
        raise SpecError("--checkpoint-every", step, "checkpoints of ZeRO-1 (ZeroRedundancyOptimizer) are not supported; "
                        "plan --zero 2 or 3")
    tmp, final = Path(folder) / f"step-{step}.tmp", Path(folder) / f"step-{step}"
    if dist.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    torch.save({"losses": losses, "rng": torch.get_rng_state()}, tmp / f"extra-rank{dist.get_rank()}.pt")
    dist.barrier()
    if dist.get_rank() == 0:
        os.replace(tmp, final)
    dist.barrier()


def load(path: Path, model, optimizer) -> list:
    """Restore model, optimizer and RNG state in place; return the loss curve up to the checkpoint."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    extra = torch.load(path / f"extra-rank{dist.get_rank()}.pt", weights_only=False)
    torch.set_rng_state(extra["rng"])
    return list(extra["losses"])


def parameter_checksum(model, mesh) -> float:
    """Sum of squares of every parameter of the whole model, whatever the sharding (to compare runs)."""
    total = torch.zeros((), dtype=torch.float64)
    for p in model.parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        total += t.detach().double().pow(2).sum().cpu()
    # each pipeline stage holds different parameters; data and tensor parallel ranks hold the same ones
    owner = mesh["dp"].get_local_rank() == 0 and mesh["tp"].get_local_rank() == 0
    t = (total * owner).to(next(model.parameters()).device if next(model.parameters()).device.type == "cuda" else "cpu")
    dist.all_reduce(t)
    return float(t)
