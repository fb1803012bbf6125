"""What one prediction is priced with, built once and handed down the cost functions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simpar.specs.cluster import ClusterSpec
from simpar.specs.gpu import GPUSpec
from simpar.specs.job import JobSpec
from simpar.specs.model import ModelSpec
from simpar.specs.stack import Stack
from simpar.specs.strategy import Strategy


@dataclass(frozen=True)
class Pricing:
    """The model, the cluster, the job and the strategy of one prediction, and the
    network its collectives are priced on (simpar/network/model.py: the flow model, the
    closed form, or free for a bound)."""
    model: ModelSpec
    cluster: ClusterSpec
    job: JobSpec
    strategy: Strategy
    net: Any

    @property
    def gpu(self) -> GPUSpec:
        return self.cluster.gpu

    @property
    def stack(self) -> Stack:
        return self.strategy.profile
