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
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict, set_model_state_dict, set_state_dict

_STEP = re.compile(r"^step-(\d+)$")


def latest(folder: str | None) -> tuple[int, Path] | None:
    if not folder or not Path(folder).is_dir():
        return None
    found = [(int(m.group(1)), p) for p in Path(folder).iterdir() if (m := _STEP.match(p.name)) and p.is_dir()]
    return max(found) if found else None


def _is_zero1(optimizer) -> bool:
    # imported here: torch.distributed.optim scripts its functional optimizers (slow, deprecation warnings)
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return isinstance(optimizer, ZeroRedundancyOptimizer)


def _zero1_file(optimizer) -> str:
    """ZeRO-1's optimizer state, consolidated on its data-parallel group's first rank (one file per group:
    pipeline stages have their own groups)."""
    return f"zero1-optim-rank{dist.get_global_rank(optimizer.process_group, 0)}.pt"


def save(folder: str, step: int, model, optimizer, losses: list) -> None:
    tmp, final = Path(folder) / f"step-{step}.tmp", Path(folder) / f"step-{step}"
    if dist.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    if _is_zero1(optimizer):
        # torch's own ZeRO-1 state: every rank sends its shard to the group's first rank, which writes the
        # whole optimizer; the model (replicated under DDP) goes through DCP as for the other stages
        optimizer.consolidate_state_dict(to=0)
        dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=str(tmp))
        if optimizer.rank == 0:
            torch.save(optimizer.state_dict(), tmp / _zero1_file(optimizer))
    else:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    torch.save({"losses": losses, "rng": torch.get_rng_state()}, tmp / f"extra-rank{dist.get_rank()}.pt")
    dist.barrier()
    if dist.get_rank() == 0:
        os.replace(tmp, final)
    dist.barrier()


def load(path: Path, model, optimizer) -> list:
    """Restore model, optimizer and RNG state in place; return the loss curve up to the checkpoint."""
    if _is_zero1(optimizer):
        state = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=str(path))
        set_model_state_dict(model, state["model"])
        # each rank keeps the shard of the whole optimizer state that its partition owns
        optimizer.load_state_dict(torch.load(path / _zero1_file(optimizer), weights_only=False))
    else:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(path))
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    extra = torch.load(path / f"extra-rank{dist.get_rank()}.pt", weights_only=False)
    torch.set_rng_state(extra["rng"])
    return list(extra["losses"])


def parameter_checksum(model, mesh, experts=()) -> float:
    """Sum of squares of every parameter of the whole model, whatever the sharding (to compare runs);
    `experts`: weights split over the ep ranks (execpar.parallelize.apply_ep), counted once per ep rank."""
    split = {id(p) for p in experts}
    dense, routed = torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)
    for p in model.parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        sq = t.detach().double().pow(2).sum().cpu()
        if id(p) in split:
            routed += sq
        else:
            dense += sq
    # each pipeline stage holds different parameters; data and tensor parallel ranks hold the same ones
    tp0 = mesh["tp"].get_local_rank() == 0
    total = dense * (tp0 and mesh["dp"].get_local_rank() == 0)
    if split:
        total += routed * (tp0 and mesh["edp"].get_local_rank() == 0)
    device = next(model.parameters()).device
    t = total.to(device if device.type == "cuda" else "cpu")
    dist.all_reduce(t)
    return float(t)
