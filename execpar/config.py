"""The options of one execpar run, as `execpar run` and `execpar launch` take them.

Kept apart from execpar.train, which loads torch: the launcher builds and checks a RunConfig
before any process starts, and on a CPU it never needs torch itself."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RunConfig:
    plan: str
    steps: int = 10
    warmup: int = 2  # steps left out of the timing statistics
    out: str | None = None
    device: str | None = None  # cpu | cuda (default: cuda when available)
    seed: int = 0
    lr: float = 1e-3
    clip: float = 0.0  # max norm of the whole model's gradient; 0 = off
    data: str | None = None
    # compute precision: default the plan's 16-bit type on GPUs, fp32 on CPUs
    dtype: str | None = None
    profile: bool = False  # profile the last step for the communication/compute split
    timeout_s: float = 300.0
    overrides: tuple = ()  # (field, value) of a scaled-down run: layers, hidden, heads, ...
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0  # steps between checkpoints (0 = none)
    # fault injection: this rank is killed (SIGKILL) before running this step (first attempt only)
    fail_at_step: int = -1
    fail_rank: int = 0
