"""A torchtitan or Megatron training log read as a measurement `simpar validate` compares with a
plan: the steady step's time and tokens/s, and the peak memory the trainer printed.

torchtitan (torchtitan/components/metrics.py) logs, every log_freq steps, a line like
`step: 10  loss: 9.1  memory: 74.38GiB(53.20%)  tps: 50,370  tflops: 414.05  mfu: 41.86%`
(colored unless --metrics.disable_color_printing; `wps` in its earlier releases): `tps` is the
rank's tokens over the interval's time and its tp x pp x cp group (non_data_parallel_size), so
the job's tokens/s is tps x GPUs; `memory` is the interval's peak reserved bytes. Megatron-LM
and Megatron-Bridge (megatron/training/training.py, training_log) log ` iteration 10/100 | ... |
elapsed time per iteration (ms): 1234.5 | ... | global batch size: 128 |`, and report_memory
prints each stage's `memory (MB) | allocated: ... | max allocated: A | reserved: ... | max
reserved: R` (MB of 2^20 bytes); Megatron-Bridge's (megatron/bridge/training/utils/
train_utils.py) `memory (GB) | ... | mem-max-allocated-gigabytes: A | ... |
mem-max-reserved-gigabytes: R | mem-alloc-retires: n` (GB of 10^9 bytes; n cudaMalloc failures
the allocator flushed its cache and retried after). The first WARMUP_STEPS steps compile, grow
the allocator and tune kernels, so the median of the later ones is the steady step."""

from __future__ import annotations

import re
import statistics

from simpar.errors import SpecError, require
from simpar.specs.gpu import GIB_PER_GB

# steps a trainer's first log lines cover that are not yet steady (torch.compile, the caching
# allocator's growth, NCCL's and cuBLAS's first calls): torchtitan's step 2 on the lent H200 ran
# at 55% of its step 3 (reports/torchtitan-h200, tt-1b-s2k-mb8.log)
WARMUP_STEPS = 3
GIB_PER_MIB = 1 / 1024

_TORCHTITAN = re.compile(r"step:\s*(\d+)\s.*?memory:\s*([\d.]+)GiB.*?[tw]ps:\s*([\d,]+)",
                         re.IGNORECASE)
_MEGATRON = re.compile(r"iteration\s+(\d+)/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*"
                       r"([\d.]+).*?global batch size:\s*(\d+)")
_MEGATRON_MEMORY = re.compile(r"memory \(MB\).*?max allocated:\s*([\d.]+).*?max reserved:\s*"
                              r"([\d.]+)")
_BRIDGE_MEMORY = re.compile(r"memory \(GB\).*?mem-max-allocated-gigabytes:\s*([\d.]+).*?"
                            r"mem-max-reserved-gigabytes:\s*([\d.]+)(?:.*?mem-alloc-retires:\s*"
                            r"(\d+))?")


def is_trainer_log(text: str) -> bool:
    """The text is a torchtitan or Megatron log (a line of either's step format)."""
    return bool(_TORCHTITAN.search(text) or _MEGATRON.search(text))


def measurement_from_log(text: str, path: str, *, gpus: int, tokens_per_step: int) -> dict:
    """The log at `path` as a measurement of a job on `gpus` GPUs processing `tokens_per_step`
    tokens a step (the plan's): a dict with validate's figures, the trainer, and the steps it
    took the median over."""
    if _TORCHTITAN.search(text):
        return _torchtitan(text, path, gpus, tokens_per_step)
    return _megatron(text, path, tokens_per_step)


def _steady(records: list[tuple], path: str) -> list[tuple]:
    """The records (step first) past the warm-up steps; one line naming the fix if none are."""
    steady = [r for r in records if r[0] > WARMUP_STEPS]
    require(bool(steady), "measured", path,
            f"logs no step after the first {WARMUP_STEPS} (warm-up: compile, allocator growth): "
            "run more steps, or log more often")
    return steady


def _torchtitan(text: str, path: str, gpus: int, tokens_per_step: int) -> dict:
    records = [(int(s), float(mem), float(tps.replace(",", "")))
               for s, mem, tps in _TORCHTITAN.findall(text)]
    steady = _steady(records, path)
    tokens_per_s = statistics.median(tps for _, _, tps in steady) * gpus
    return {
        "source": "torchtitan log", "steady_steps": [s for s, _, _ in steady],
        "tokens_per_s": tokens_per_s, "step_time_s": tokens_per_step / tokens_per_s,
        "memory": {"peak_reserved_gib": max(mem for _, mem, _ in steady)},
    }


def _megatron(text: str, path: str, tokens_per_step: int) -> dict:
    records = [(int(i), float(ms) / 1000, int(batch))
               for i, ms, batch in _MEGATRON.findall(text)]
    steady = _steady(records, path)
    step_s = statistics.median(s for _, s, _ in steady)
    memory = [(float(a) * GIB_PER_MIB, float(r) * GIB_PER_MIB)
              for a, r in _MEGATRON_MEMORY.findall(text)]
    bridge = _BRIDGE_MEMORY.findall(text)
    memory += [(float(a) * GIB_PER_GB, float(r) * GIB_PER_GB) for a, r, _ in bridge]
    out = {
        "source": "Megatron log", "steady_steps": [i for i, _, _ in steady],
        "global_batch": steady[-1][2], "step_time_s": step_s,
        "tokens_per_s": tokens_per_step / step_s,
    }
    if memory:  # each stage's first data-parallel rank prints its own: the largest is the peak
        out["memory"] = {"peak_allocated_gib": max(a for a, _ in memory),
                         "peak_reserved_gib": max(r for _, r in memory)}
    if any(n for _, _, n in bridge):
        out["alloc_retries"] = max(int(n or 0) for _, _, n in bridge)
    return out


def check_log_batch(measured: dict, global_batch: int, path: str) -> None:
    """A Megatron log names its global batch: it must be the plan's for one to check the other."""
    batch = measured.get("global_batch")
    if batch is not None and batch != global_batch:
        raise SpecError("measured", path, f"ran global batch {batch} (plan: {global_batch}); "
                        "validate a log against the plan of the run it logs")
