"""The numeric flags every simpar and execpar command shares, checked once before any
command starts work.

argparse already refuses a value that is not a number, and OneLineParser one that is not finite;
this table holds the range of each flag, so that `simulate`, `compare`, `plan`, `scale` and the
tools refuse the same bad value with the same line (a flag a command does not have is skipped)."""

from __future__ import annotations

from simpar.errors import SpecError, require
from simpar.specs.job import MAX_SEQ_LEN

# More GPUs than any cluster holds (the largest of 2026 have a few hundred thousand): past
# this, sizes are a typo, and the rank lists of a collective alone would not fit in memory.
MAX_GPUS = 2**24
# Steps the event engine plays with --jitter (without it every step is the same and one is played):
# p50 and p99 settle within a few hundred.
MAX_SIM_STEPS = 1_000

POSITIVE = (
    "gpus",
    "gpu_list",
    "seq_len",
    "global_batch",
    "micro_batch",
    "grad_accum",
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "vpp",
    "steps",
    "reps",
    "nproc_per_node",
    "powersgd_rank",
    "ps_servers",
    "top",
    "size_bytes",
    "storage_gbps",
    "node_storage_gbps",
    "gpu_mtbf_hours",
    "node_mtbf_hours",
    "power_limit_w",
    "mem_limit_gib",
    "topk_ratio",
    # execpar: the learning rate, collective timeout, nodes, and a scaled-down run's model sizes
    "lr",
    "timeout_s",
    "nnodes",
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "ffn_hidden",
    "vocab",
)
NON_NEGATIVE = (
    "tokens",
    "price_per_gpu_hour",
    "restart_min",
    "preemptions_per_day",
    "ps_server_gbps",
    "bucket_mb",
    "offload_activations",
    "recompute_layers",
    "dp_shard",
    "straggler_delay",
    "seed",
    "rerank",
    "backup_workers",
    "jitter",
    "zero",
    # execpar (clip 0: off)
    "clip",
    "warmup",
    "fail_rank",
    "checkpoint_every",
    "max_restarts",
)
AT_MOST = {"gpus": (MAX_GPUS, "GPUs"), "gpu_list": (MAX_GPUS, "GPUs"),
           "backup_workers": (99.999, "a percentage of the replicas, below 100"),
           "topk_ratio": (1.0, "a share of the gradient elements"),
           "jitter": (1.0, "a lognormal sigma (at 1, one op in 40 already runs 7x slower)"),
           "zero": (3, "a ZeRO stage: 0 DDP, 1 optimizer, 2 +gradients, 3 +weights"),
           # beyond these a value is a typo, and the answer would be inf or 10^30 seconds
           "bucket_mb": (1e6, "MiB, a terabyte"),
           "straggler_delay": (10_000, "percent: replicas 100x slower have failed, not lagged"),
           "restart_min": (1e6, "minutes, two years"),
           "preemptions_per_day": (1440, "once a minute"),
           "price_per_gpu_hour": (1e4, "dollars"),
           "seed": (2**32 - 1, "a 32-bit seed"),
           "timeout_s": (1e6, "seconds, 11 days"),
           "gpu_mtbf_hours": (1e9, "hours, a hundred thousand years"),
           "node_mtbf_hours": (1e9, "hours, a hundred thousand years"),
           # p50 and p99 settle within a few hundred; a billion filled 15 GB with step times
           "steps": (1_000_000, "steps"),
           "seq_len": (MAX_SEQ_LEN, "tokens")}
# The least positive value that means something (0 stays allowed where NON_NEGATIVE has it)
AT_LEAST = {"bucket_mb": (1.0, "MiB; 0 takes Megatron-LM's bucket rule"),
            "storage_gbps": (1e-3, "GB/s, a megabyte a second"),
            "node_storage_gbps": (1e-3, "GB/s, a megabyte a second"),
            "gpu_mtbf_hours": (0.01, "hours, a minute"),
            "node_mtbf_hours": (0.01, "hours, a minute"),
            "ps_server_gbps": (1e-3, "GB/s, a megabyte a second; 0 takes the cluster's NIC"),
            "size_bytes": (1, "byte"),
            "timeout_s": (1.0, "second")}


def _values(args, dest: str) -> tuple:
    """(number, as the user gave it) for each number of the flag: a list flag (4,8) is
    shown whole."""
    value = getattr(args, dest, None)
    if value is None or isinstance(value, bool):
        return ()
    if isinstance(value, (tuple, list)):
        return tuple((v, ",".join(map(str, value))) for v in value)
    return ((value, value),)


def check_numbers(args) -> None:
    """Raise SpecError naming the flag, the value and its range for the first numeric
    flag out of range."""
    def flag(dest: str) -> str:
        return "--" + dest.replace("_", "-")

    for dest in POSITIVE:
        for v, shown in _values(args, dest):
            require(v > 0, flag(dest), shown, "must be positive")
    for dest in NON_NEGATIVE:
        for v, shown in _values(args, dest):
            require(v >= 0, flag(dest), shown, "must be >= 0")
    for dest, (most, what) in AT_MOST.items():
        for v, shown in _values(args, dest):
            require(v <= most, flag(dest), shown, f"must be at most {most:,} ({what})")
    for dest, (least, what) in AT_LEAST.items():
        for v, shown in _values(args, dest):
            require(v == 0 or v >= least, flag(dest), shown,
                    f"must be at least {least:g} ({what})")
    if getattr(args, "jitter", 0) and getattr(args, "steps", 1) > MAX_SIM_STEPS:
        raise SpecError(
            "--steps", args.steps,
            f"with --jitter, at most {MAX_SIM_STEPS:,} steps (p50 and p99 settle within a few "
            "hundred; without --jitter every step is the same and any count is instant)")
