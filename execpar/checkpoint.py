"""Checkpoints with torch.distributed.checkpoint, written atomically, and exact resume.

A checkpoint of step k lives in DIR/step-k: the model and optimizer state (sharded as the run
shards them), the loss curve so far and every rank's RNG state. It is written to DIR/step-k.tmp
and renamed by rank 0 once every rank has finished, so a crash mid-write never leaves a checkpoint
that looks whole; an interrupted write removes its step-k.tmp. A run holds the folder's lock, and
resumes from the newest checkpoint that reads whole, naming any damaged newer one. The step is the
data position: batches are a function of the step, so resuming replays nothing. Each checkpoint
records the run it belongs to (RUN_FILE: the model's shape and how the run splits it), and a run
of another plan refuses to resume from it, rather than failing on a missing key or, where the
keys happen to match, silently training another model."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import zipfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.tensor import DTensor, Shard

from execpar.folder_lock import LOCK_HELD_ENV, lock
from simpar.errors import SpecError

_STEP = re.compile(r"^step-(\d+)$")
# The run a checkpoint belongs to, written beside its state by rank 0
RUN_FILE = "run.json"
# The strategy fields that decide which parameters and optimizer state each rank holds
_SPLIT_FIELDS = ("pp", "dp", "tp", "cp", "ep", "dp_shard", "zero", "schedule", "vpp")


def run_identity(model_spec, strategy, world: int) -> dict:
    """What a checkpoint's state depends on: the model's shape (not its name) and how the run
    splits it over its ranks."""
    shape = {k: v for k, v in model_spec.to_dict().items() if k != "name"}
    return {"model": shape, "split": {k: getattr(strategy, k) for k in _SPLIT_FIELDS},
            "world": world}


def mismatch(saved: dict, here: dict) -> str | None:
    """The first difference between two run identities, as 'field X there, Y here'."""
    for part in ("world", "split", "model"):
        a, b = saved.get(part), here[part]
        if not isinstance(b, dict):
            if a != b:
                return f"{part} {a} there, {b} here"
            continue
        a = a if isinstance(a, dict) else {}
        for k in b:
            if a.get(k) != b[k]:
                return f"{part}.{k} {a.get(k)} there, {b[k]} here"
    return None


def checkpoints(folder: str | None) -> list[tuple[int, Path]]:
    """The step folders in `folder`, newest first."""
    if not folder or not Path(folder).is_dir():
        return []
    return sorted(((int(m.group(1)), p)
                   for p in Path(folder).iterdir() if (m := _STEP.match(p.name)) and p.is_dir()),
                  reverse=True)


def damage(path: Path, world: int) -> str | None:
    """What makes a checkpoint folder unreadable (a file missing, empty or cut short), or
    None if it is whole: DCP's metadata must read, every byte range it names must exist,
    and every rank's extra state and ZeRO-1 optimizer file must be a whole archive."""
    meta = path / ".metadata"
    if not meta.is_file() or meta.stat().st_size == 0:
        return ".metadata is missing or empty"
    try:
        storage = dcp.FileSystemReader(str(path)).read_metadata().storage_data
    except Exception as exc:  # a damaged pickle raises whatever its bytes decode to
        return f".metadata does not read ({type(exc).__name__})"
    for info in storage.values():
        f = path / info.relative_path
        if not f.is_file() or f.stat().st_size < info.offset + info.length:
            return f"{info.relative_path} is cut short"
    for f in [path / f"extra-rank{r}.pt"
              for r in range(world)] + sorted(path.glob("zero1-optim-rank*.pt")):
        # torch.save writes a zip archive: one cut short has no central directory (read
        # without loading)
        try:
            zipfile.ZipFile(f).close()
        except (OSError, zipfile.BadZipFile) as exc:
            return f"{f.name} is missing or cut short ({type(exc).__name__})"
    return None


def newest_intact(folder: str | None, world: int, say=None) -> tuple[int, Path] | None:
    """The newest checkpoint that reads whole; `say` is told of each damaged newer one."""
    for k, path in checkpoints(folder):
        why = damage(path, world)
        if why is None:
            return k, path
        if say:
            say(f"execpar: checkpoint {path} is damaged ({why}); trying an older one")
    return None


def resume_point(folder: str, identity: dict) -> tuple[int, Path] | None:
    """The newest intact checkpoint, judged by rank 0 and agreed by every rank; each damaged newer
    one is named on stderr. Leftover step-k.tmp folders of a killed run are removed first. A
    checkpoint of another run (`identity` differs) is refused on every rank."""
    found: tuple[int, Path] | None = None
    why = None
    if dist.get_rank() == 0:
        for tmp in Path(folder).glob("step-*.tmp"):
            shutil.rmtree(tmp, ignore_errors=True)
        # judged on the newest checkpoint, whole or not: another run's would read as damaged
        # here (its ranks' files are not this run's), and its steps be written over
        newest = checkpoints(folder)
        why = _other_run(newest[0][1], identity) if newest else None
        if why is None:
            found = newest_intact(folder, dist.get_world_size(),
                                  lambda line: print(line, file=sys.stderr, flush=True))
    agreed: list[Any] = [found, why]
    dist.broadcast_object_list(agreed, src=0)
    if agreed[1]:
        raise SpecError("--checkpoint-dir", folder, agreed[1])
    return agreed[0]


def _other_run(path: Path, identity: dict) -> str | None:
    """Why the checkpoint at `path` belongs to another run, or None (also for checkpoints
    written before RUN_FILE was)."""
    f = path / RUN_FILE
    if not f.is_file():
        return None
    try:
        saved = json.loads(f.read_text())
    except (OSError, ValueError):
        return f"{f} does not read; remove {path.name} or give a fresh folder"
    diff = mismatch(saved if isinstance(saved, dict) else {}, identity)
    if diff is None:
        return None
    return (f"holds {path.name} of another run ({diff}); resume with the plan and overrides that "
            "wrote it, or give a fresh folder")


def lock_in_job(folder: str | None, device):
    """Rank 0 locks the folder for a job started without `execpar launch` (torchrun by hand, several
    nodes); every rank learns whether it could."""
    if not folder or os.environ.get(LOCK_HELD_ENV) == os.path.abspath(folder):
        return None
    held, error = None, None
    if dist.get_rank() == 0:
        try:
            held = lock(folder)
        except SpecError as exc:
            error = exc
    ok = torch.tensor([0 if error else 1], device=device)
    dist.broadcast(ok, src=0)
    if error:
        raise error
    if not ok.item():
        raise SpecError("--checkpoint-dir", folder,
                        "is in use by another run; give each run its own folder")
    return held


def _is_zero1(optimizer) -> bool:
    # imported here: torch.distributed.optim scripts its functional optimizers (slow,
    # deprecation warnings)
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return isinstance(optimizer, ZeroRedundancyOptimizer)


def _zero1_file(optimizer) -> str:
    """ZeRO-1's optimizer state, consolidated on its data-parallel group's first rank
    (one file per group: pipeline stages have their own groups)."""
    return f"zero1-optim-rank{dist.get_global_rank(optimizer.process_group, 0)}.pt"


def _map_experts(state: dict, experts, fn) -> dict:
    """A model or optimizer state dict with `fn` applied to each expert weight, or to each of
    its optimizer moments; the rest as it was."""
    out = dict(state)
    moments = dict(out.get("state", {}))  # optimizer state by parameter name
    for name in experts:
        if name in out:  # model state
            out[name] = fn(out[name])
        if name in moments:
            moments[name] = {k: fn(v) for k, v in moments[name].items()}
    if moments:
        out["state"] = moments
    return out


def _as_ep_shards(state: dict, experts, ep_mesh) -> dict:
    """The state with each expert weight (and its optimizer moments) as a DTensor sharded over
    the ep ranks: every ep rank holds its own block of the experts under one name
    (execpar.parallelize.apply_ep), which DCP would otherwise take for one replicated tensor and
    write once. The local tensors are shared, not copied; scalars (Adam's step) stay as they
    are."""
    def shard(v):
        if not isinstance(v, torch.Tensor) or not v.dim():
            return v
        return DTensor.from_local(v, ep_mesh, [Shard(0)], run_check=False)

    return _map_experts(state, experts, shard)


def _as_local(state: dict, experts) -> dict:
    """_as_ep_shards undone: each rank's own block again."""
    return _map_experts(state, experts,
                        lambda v: v.to_local() if isinstance(v, DTensor) else v)


def save(folder: str, step: int, model, optimizer, losses: list, scaler=None, *,
         identity: dict, experts=(), ep_mesh=None) -> None:
    """Write step `step`'s checkpoint; `scaler`: fp16's loss scale, kept with the losses;
    `identity`: the run it belongs to (run_identity); `experts`: the names of the weights split
    over the ep ranks of `ep_mesh`."""
    tmp, final = Path(folder) / f"step-{step}.tmp", Path(folder) / f"step-{step}"
    try:
        _write(tmp, final, model, optimizer, losses, scaler, identity, (experts, ep_mesh))
    # Ctrl-C or a failing rank mid-write: no half-written step-k.tmp stays behind
    except BaseException:
        if dist.get_rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write(tmp: Path, final: Path, model, optimizer, losses: list, scaler,
           identity: dict, ep: tuple) -> None:
    if dist.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    if _is_zero1(optimizer):
        # torch's own ZeRO-1 state: every rank sends its shard to the group's first
        # rank, which writes the whole optimizer; the model (replicated under DDP) goes
        # through DCP as for the other stages
        optimizer.consolidate_state_dict(to=0)
        dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=str(tmp))
        if optimizer.rank == 0:
            torch.save(optimizer.state_dict(), tmp / _zero1_file(optimizer))
    else:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        dcp.save({"model": _as_ep_shards(model_sd, *ep), "optim": _as_ep_shards(optim_sd, *ep)},
                 checkpoint_id=str(tmp))
    torch.save({"losses": losses, "rng": torch.get_rng_state(),
                "scaler": scaler.state_dict() if scaler is not None else None},
               tmp / f"extra-rank{dist.get_rank()}.pt")
    if dist.get_rank() == 0:
        (tmp / RUN_FILE).write_text(json.dumps(identity, indent=1) + "\n")
    dist.barrier()
    if dist.get_rank() == 0:
        # a damaged checkpoint of this step, set aside first
        old = final.with_name(final.name + ".old.tmp")
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    dist.barrier()


def load(path: Path, model, optimizer, scaler=None, *, experts=(), ep_mesh=None) -> list:
    """Restore model, optimizer, RNG state and fp16's loss scale in place; return the loss
    curve up to the checkpoint (`experts`, `ep_mesh`: as for save)."""
    if _is_zero1(optimizer):
        state: dict[str, Any] = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=str(path))
        set_model_state_dict(model, state["model"])
        # each rank keeps the shard of the whole optimizer state that its partition owns
        optimizer.load_state_dict(torch.load(path / _zero1_file(optimizer), weights_only=False))
    else:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": _as_ep_shards(model_sd, experts, ep_mesh),
                 "optim": _as_ep_shards(optim_sd, experts, ep_mesh)}
        dcp.load(state, checkpoint_id=str(path))
        set_state_dict(model, optimizer, model_state_dict=_as_local(state["model"], experts),
                       optim_state_dict=_as_local(state["optim"], experts))
    extra = torch.load(path / f"extra-rank{dist.get_rank()}.pt", weights_only=False)
    torch.set_rng_state(extra["rng"])
    if scaler is not None and extra.get("scaler"):
        scaler.load_state_dict(extra["scaler"])
    return list(extra["losses"])


def parameter_checksum(model, mesh, experts=()) -> float:
    """Sum of squares of every parameter of the whole model, whatever the sharding (to
    compare runs); `experts`: weights split over the ep ranks
    (execpar.parallelize.apply_ep), counted once per ep rank."""
    split = {id(p) for p in experts}
    dense, routed = torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)
    for p in model.parameters():
        t = p.full_tensor() if hasattr(p, "full_tensor") else p
        sq = t.detach().double().pow(2).sum().cpu()
        if id(p) in split:
            routed += sq
        else:
            dense += sq
    # each pipeline stage holds different parameters; data and tensor parallel ranks
    # hold the same ones
    tp0 = mesh["tp"].get_local_rank() == 0
    total = dense * (tp0 and mesh.replicas.get_local_rank() == 0)
    if split:
        total += routed * (tp0 and mesh["edp"].get_local_rank() == 0)
    device = next(model.parameters()).device
    t = total.to(device if device.type == "cuda" else "cpu")
    dist.all_reduce(t)
    return float(t)
