"""Many data-parallel replicas: stragglers, backup workers and asynchronous SGD.

The closed form and the event engine price one replica. Replicas differ from step to step (noisy
neighbours, thermal throttling, slow hosts): each takes T(1 + X) of the step, X exponential with
mean `delay` (the shifted-exponential straggler model of Lee et al. 2017 and Dutta et al. 2018), so

- synchronous SGD waits for the slowest of N replicas: E[max] = T (1 + delay H_N), H the
harmonic number;
- backup workers (Chen et al. 2016) do not wait for the slowest b = round(share N): the
(N-b)-th fastest
  arrives at T (1 + delay (H_N - H_b)), and the step uses (N-b)/N of the batch, the rest
  is discarded;
- asynchronous SGD (Dean et al. 2012, Downpour) has no barrier: each replica runs at its
own mean pace
  T (1 + delay), pushing gradients and pulling weights while it computes the next step, so its
  period is the largest of its compute, its push/pull and the servers' share of the optimizer
  work; a gradient is applied to weights N-1 updates newer than those it was computed on (the
  other replicas each push once in between at equal pace): that mean staleness is reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# An asynchronous parameter server applies the optimizer in host memory: a two-socket
# server sustains about 400 GB/s of DRAM bandwidth (the DGX host figure behind
# ClusterSpec.host_memory_gbps x 8 GPUs).
PS_SERVER_MEMORY_GBPS = 400.0
EULER_GAMMA = 0.5772156649015329


# Above this many terms the harmonic number is taken from its asymptotic series (error
# below 1e-16 relative): summing 10^7 replicas' terms took seconds per candidate.
HARMONIC_TERMS = 1000


def harmonic(n: int) -> float:
    """1 + 1/2 + ... + 1/n."""
    if n <= HARMONIC_TERMS:
        return sum(1.0 / i for i in range(1, n + 1))
    return math.log(n) + EULER_GAMMA + 1 / (2 * n) - 1 / (12 * n**2) + 1 / (120 * n**4)


@dataclass(frozen=True)
class Replicas:
    count: int
    delay_frac: float  # mean extra share of the step one replica takes
    ignored: int  # replicas a synchronous step does not wait for (backup workers)
    async_sgd: bool
    sync_s: float  # one replica's whole gradient push and weight pull per step (asynchronous SGD)
    # the servers' optimizer work for one step of every replica (asynchronous SGD)
    server_update_s: float

    @property
    def gradients_used(self) -> float:
        return (self.count - self.ignored) / self.count

    @property
    def staleness_steps(self) -> float:
        return float(self.count - 1) if self.async_sgd else 0.0

    def apply(self, breakdown: dict) -> dict:
        """One replica's phases -> the job's phases per step, with `straggler_wait` added."""
        out = dict(breakdown)
        if self.async_sgd:
            compute = sum(out.values()) - out["dp_comm"] - out["optimizer"]
            out["dp_comm"] = max(0.0, self.sync_s - compute)
            out["optimizer"] = max(0.0, self.server_update_s - compute - out["dp_comm"])
            out["straggler_wait"] = self.delay_frac * sum(out.values())
            return out
        if self.delay_frac == 0.0:
            out["straggler_wait"] = 0.0
            return out
        wait = harmonic(self.count) - harmonic(self.ignored)
        out["straggler_wait"] = self.delay_frac * wait * sum(out.values())
        return out

    def to_dict(self) -> dict:
        return {
            "replicas": self.count, "ignored": self.ignored, "gradients_used": self.gradients_used,
            "async_sgd": self.async_sgd, "staleness_steps": self.staleness_steps,
            "straggler_delay_frac": self.delay_frac
        }


def replicas_for(s, cluster, sync_s: float, local_params: float, optimizer_bytes: int) -> Replicas:
    server = 0.0
    if s.async_sgd:
        server = (
            s.gpus * local_params * optimizer_bytes / (s.ps_servers * PS_SERVER_MEMORY_GBPS * 1e9)
        )
    ignored = min(s.dp - 1, int(s.backup_frac * s.dp + 0.5))  # the nearest whole number of replicas
    return Replicas(s.dp, cluster.straggler_delay_frac, ignored, s.async_sgd, sync_s, server)
