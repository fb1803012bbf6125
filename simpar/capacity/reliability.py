"""Failures, checkpoints and goodput: Young/Daly checkpoint interval and the expected waste.

Defaults: Meta's Llama 3 405B pre-training saw 419 unexpected interruptions in 54 days on 16,384
H100s in 2,048 nodes (Llama 3 paper, arXiv:2407.21783, section 3.3.4), 58.7% of them GPU issues
(faulty GPUs, HBM3, SRAM, GPU system processor, ...); the rest (software, network switches and
cables, host maintenance, NICs, power, CPUs, ...) is charged to nodes: one GPU interruption per
16,384 x 54 x 24 / (0.587 x 419) = 86,400 GPU-hours, one node interruption per 2,048 x 54 x 24 /
(0.413 x 419) = 15,300 node-hours. A checkpoint holds the weights and the optimizer states (16-bit
weights plus fp32 master weights and Adam's two moments: 14 bytes per parameter in mixed precision,
12 in fp32; gradients are not saved). torch.distributed.checkpoint saves each replicated tensor
once: without ZeRO one data-parallel replica writes, with ZeRO every rank writes its optimizer
shard; each writing node streams at most its storage link's rate, so the write bandwidth is min(file
system, writing nodes x node link). Young (1974): the interval between checkpoints that minimises
waste is sqrt(2 delta M) for a write time delta and a job MTBF M; Daly (2006) refines it to sqrt(2
delta M) - delta. The expected waste per unit time is delta/tau (writing) plus (tau/2 + R)/M (work
lost since the last checkpoint, and the restart R including reading the checkpoint back)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from simpar.errors import require
from simpar.memory.model import state_bytes_per_param

LLAMA3_INTERRUPTIONS, LLAMA3_GPU_SHARE = 419, 0.587
GPU_MTBF_HOURS = 16384 * 54 * 24 / (LLAMA3_GPU_SHARE * LLAMA3_INTERRUPTIONS)  # ~86,400 GPU-hours
# ~15,300 node-hours
NODE_MTBF_HOURS = 2048 * 54 * 24 / ((1 - LLAMA3_GPU_SHARE) * LLAMA3_INTERRUPTIONS)
# aggregate write bandwidth of a parallel file system to one job (GB/s)
DEFAULT_STORAGE_GBPS = 200.0
# a node's storage traffic: DGX A100/H100 have two 200 Gb/s storage ports (50 GB/s raw); file-system
# clients sustain about half of that
DEFAULT_NODE_STORAGE_GBPS = 25.0
# scheduler re-queue, process start, NCCL init (minutes), before reading back
DEFAULT_RESTART_MIN = 10.0


@dataclass(frozen=True)
class ReliabilityInputs:
    gpu_mtbf_hours: float = GPU_MTBF_HOURS
    node_mtbf_hours: float = NODE_MTBF_HOURS  # host, network and software failures, per node
    storage_gbps: float = DEFAULT_STORAGE_GBPS
    node_storage_gbps: float = DEFAULT_NODE_STORAGE_GBPS
    restart_min: float = DEFAULT_RESTART_MIN
    preemptions_per_day: float = 0.0  # spot capacity reclaimed, per job and day

    def __post_init__(self):
        require(self.gpu_mtbf_hours > 0, "--gpu-mtbf-hours", self.gpu_mtbf_hours,
                "must be positive")
        require(self.node_mtbf_hours > 0, "--node-mtbf-hours", self.node_mtbf_hours,
                "must be positive (inf: none)")
        require(self.storage_gbps > 0, "--storage-gbps", self.storage_gbps, "must be positive")
        require(self.node_storage_gbps > 0, "--node-storage-gbps", self.node_storage_gbps,
                "must be positive")
        require(self.restart_min >= 0, "--restart-min", self.restart_min, "must be >= 0")
        require(self.preemptions_per_day >= 0, "--preemptions-per-day", self.preemptions_per_day,
                "must be >= 0")


@dataclass(frozen=True)
class Reliability:
    job_mtbf_hours: float
    checkpoint_gib: float
    checkpoint_write_s: float
    checkpoint_interval_s: float  # Young/Daly optimum
    restart_s: float
    goodput: float  # useful fraction of wall-clock time

    def to_dict(self) -> dict:
        return asdict(self)


def young_daly_interval(write_s: float, mtbf_s: float) -> float:
    young = math.sqrt(2 * write_s * mtbf_s)
    return young - write_s if write_s < 2 * mtbf_s else mtbf_s


def waste_fraction(interval_s: float, write_s: float, restart_s: float, mtbf_s: float) -> float:
    return min(1.0, write_s / interval_s + (interval_s / 2 + restart_s) / mtbf_s)


def checkpoint_bytes(params: float, dtype: str, stack) -> float:
    """Weights and optimizer states as `stack` keeps them (Megatron: a 16-bit copy plus fp32 master,
    momentum and variance, 14 bytes; FSDP2: fp32 weights and moments, 12)."""
    weights, _, optimizer = state_bytes_per_param(dtype, stack)
    return params * (weights + optimizer)


def writing_nodes(strategy, gpus_per_node: int, dtype: str) -> int:
    # each rank writes the optimizer shard it steps (Strategy.optimizer_zero), else one replica
    writers = strategy.gpus if strategy.optimizer_zero(dtype) >= 1 else strategy.gpus // strategy.dp
    return math.ceil(writers / gpus_per_node)


def reliability(params: float, strategy, inputs: ReliabilityInputs = ReliabilityInputs(),
                gpus_per_node: int = 8, dtype: str = "bf16") -> Reliability:
    gpus = strategy.gpus
    nodes = math.ceil(gpus / gpus_per_node)
    rate_per_hour = (gpus / inputs.gpu_mtbf_hours + nodes / inputs.node_mtbf_hours
                     + inputs.preemptions_per_day / 24)
    mtbf_s = 3600 / rate_per_hour
    size = checkpoint_bytes(params, dtype, strategy.profile)
    bandwidth = min(inputs.storage_gbps,
                    writing_nodes(strategy, gpus_per_node, dtype) * inputs.node_storage_gbps)
    write = size / (bandwidth * 1e9)
    restart = inputs.restart_min * 60 + write  # reading back takes as long as writing
    tau = young_daly_interval(write, mtbf_s)
    return Reliability(mtbf_s / 3600, size / 2**30, write, tau, restart,
                       1.0 - waste_fraction(tau, write, restart, mtbf_s))


def time_and_cost(tokens: float, tokens_per_s: float, gpus: int, goodput: float,
                  price_per_gpu_hour: float, gpu_power_w: float = 0.0) -> dict:
    """Days of training without and with failures, GPU-hours, money, and the GPUs' energy
    for a token budget; the energy takes every GPU at its board power (or power limit) the
    whole time, which training comes close to, and leaves out hosts, network and cooling."""
    ideal_s = tokens / tokens_per_s
    wall_s = ideal_s / goodput if goodput > 0 else math.inf
    gpu_hours = wall_s / 3600 * gpus
    return {
        "ideal_days": ideal_s / 86400, "wall_clock_days": wall_s / 86400, "gpu_hours": gpu_hours,
        "cost": gpu_hours * price_per_gpu_hour if price_per_gpu_hour else None,
        "gpu_energy_mwh": gpu_hours * gpu_power_w / 1e6 if gpu_power_w else None
    }
