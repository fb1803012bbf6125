"""Ending a process group without aborting a finished process."""

from __future__ import annotations

import gc

import torch.distributed as dist


def close_process_group() -> None:
    """Free what holds the job's groups (a device mesh's subgroups, FSDP and DTensor state,
    reachable only through reference cycles of their hooks) while the interpreter is whole,
    so each gloo group joins its worker thread now: left to interpreter exit, a group's
    thread could still be joinable when its destructor ran, and std::terminate aborts a
    process whose work is done ("terminate called without an active exception")."""
    gc.collect()
    dist.destroy_process_group()
