"""The device mesh of a plan: (pp, dp, cp, tp) with tp innermost, as simpar places ranks, the
data-parallel dimension split as (edp, ep) when experts are split over ep of its ranks;
self-checking."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace
from typing import Any

from simpar.errors import SpecError
from simpar.specs.runnable import check_runnable


@dataclass(frozen=True)
class MeshShape:
    pp: int
    dp: int
    tp: int
    # expert parallel: consecutive data-parallel ranks that split the experts among them
    ep: int = 1
    cp: int = 1  # context parallel: ranks that split each sequence
    # hybrid sharding: FSDP over groups of dp_shard data-parallel ranks (times cp), replicated
    # over the dp / dp_shard groups; 0: FSDP over all of them
    dp_shard: int = 0

    @property
    def world(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    def check(self, world_size: int) -> None:
        if self.world != world_size:
            raise SpecError(
                "world size", world_size,
                f"the plan needs pp*dp*cp*tp = {self.pp}*{self.dp}*{self.cp}*{self.tp} = "
                f"{self.world} processes; launch with --nproc-per-node {self.world} or change "
                "the plan's --dp")


def check_on_device(strategy, job, *, gpu: bool) -> None:
    """Refuse what the plan needs of a GPU when it runs on CPUs (`gpu` False): the launcher asks
    before torchrun starts, and each rank again (a job started with torchrun by hand)."""
    s = strategy
    # torchao casts to fp8 before sequence parallelism's all-gather, which NCCL moves and gloo
    # cannot
    if job.dtype == "fp8" and not gpu and s.tp > 1 and s.sp:
        raise SpecError("strategy.sp", True, "gloo cannot all-gather fp8 tensors: on CPU plan "
                        "fp8 tensor parallelism with --no-sp (NCCL on GPUs gathers them)")


def check_supported(strategy, model, job) -> None:
    """Refuse, before any collective starts, what execpar cannot run (simpar's check_runnable,
    as `simpar plan` made it) and what this machine lacks for it."""
    check_runnable(strategy, model, job)
    if job.dtype == "fp8" and importlib.util.find_spec("torchao") is None:
        raise SpecError("dtype", job.dtype, "execpar runs fp8 through torchao, which is not "
                        "installed: pip install 'simpar[exec]' (or torchao)")


@dataclass(frozen=True)
class Meshes:
    """A rank's device meshes: `root` with a named dimension per degree (pp, dp or edp and ep,
    cp, tp; mesh["tp"] reads it), and the groups that span several of them, flattened once and
    kept (torch deprecates slicing a flattened dimension from the root again)."""
    root: Any
    data: Any  # the data-parallel ranks: edp x ep under expert parallelism
    # the ranks that hold the same weights and average their gradients: the data-parallel ones
    # and the context-parallel ones, which see other tokens of the same sequences
    replicas: Any
    # what FSDP shards over: `replicas`, or under hybrid sharding the 2D (replicate, shard) mesh
    # of those ranks, which fully_shard runs as HSDP
    sharding: Any = None

    def __getitem__(self, name: str):
        return self.root[name]


def build_mesh(shape: MeshShape, device_type: str) -> Meshes:
    from torch.distributed.device_mesh import init_device_mesh

    if shape.ep > 1:
        root = init_device_mesh(device_type, (shape.pp, shape.dp // shape.ep, shape.ep, shape.tp),
                                mesh_dim_names=("pp", "edp", "ep", "tp"))
        data = root["edp", "ep"]._flatten("dp")
        return Meshes(root, data, data, data)
    if shape.dp_shard and shape.dp_shard < shape.dp:
        return _hybrid_mesh(shape, device_type)
    root = init_device_mesh(device_type, (shape.pp, shape.dp, shape.cp, shape.tp),
                            mesh_dim_names=("pp", "dp", "cp", "tp"))
    cp = root["dp", "cp"]._flatten("dp_cp") if shape.cp > 1 else root["dp"]
    return Meshes(root, root["dp"], cp, cp)


def _hybrid_mesh(shape: MeshShape, device_type: str) -> Meshes:
    """The data-parallel dimension as (dp_replicate, dp_shard), outer to inner, as simpar places
    hybrid shard groups (contiguous runs of dp ranks); FSDP's 2D mesh is (dp_replicate,
    dp_shard x cp). torch deprecates slicing a flattened dimension from its root, so with cp the
    2D mesh comes from a second root laid over the same ranks."""
    from torch.distributed.device_mesh import init_device_mesh

    rep, shard = shape.dp // shape.dp_shard, shape.dp_shard
    root = init_device_mesh(device_type, (shape.pp, rep, shard, shape.cp, shape.tp),
                            mesh_dim_names=("pp", "dp_replicate", "dp_shard", "cp", "tp"))
    data = root["dp_replicate", "dp_shard"]._flatten("dp")
    replicas = root["dp_replicate", "dp_shard", "cp"]._flatten("dp_cp")
    if shape.cp == 1:
        return Meshes(root, data, replicas, root["dp_replicate", "dp_shard"])
    flat = init_device_mesh(device_type, (shape.pp, rep, shard * shape.cp, shape.tp),
                            mesh_dim_names=("pp", "dp_replicate", "dp_shard_cp", "tp"))
    return Meshes(root, data, replicas, flat["dp_replicate", "dp_shard_cp"])


def scaled(plan, overrides: tuple) -> tuple:
    """(model, job) of the plan with a scaled-down run's overrides ((field, value) pairs) applied,
    each checked as the plan's own were."""
    model, job = plan.model, plan.job
    m_fields = {k: v for k, v in overrides
                if k in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab")}
    j_fields = {k: v for k, v in overrides if k in ("seq_len", "global_batch")}
    if m_fields:
        reshaped = "hidden" in m_fields or "heads" in m_fields  # head_dim follows hidden / heads
        model = replace(model, **m_fields, **({"head_dim": 0} if reshaped else {}))
    if j_fields:
        job = replace(job, **j_fields)
    return model, job
