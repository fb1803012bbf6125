"""The device mesh of a plan: (pp, dp, cp, tp) with tp innermost, as simpar places ranks, the
data-parallel dimension split as (edp, ep) when experts are split over ep of its ranks;
self-checking."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, replace
from typing import Any

from simpar.errors import SpecError
from simpar.specs.precision import get_precision


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
    """Refuse, before any collective starts, what execpar cannot run, with the reason."""
    s = strategy
    _check_precision(model, job.dtype)
    if model.head_dim % 2:  # rotary embedding rotates pairs of a head's dims
        raise SpecError("model.head_dim", model.head_dim,
                        "execpar's rotary embedding needs an even head dim; change hidden or heads")
    if s.norm == "fused":
        raise SpecError("strategy.norm", s.norm, "execpar's norms are torch.nn.RMSNorm on fp32 "
                        "weights (execpar/model.py), which its stack prices as fp32 ops; plan "
                        "without --norm fused")
    if s.cp > 1 and job.seq_len % (2 * s.cp):
        raise SpecError(
            "seq_len", job.seq_len,
            f"context parallelism balances 2*cp = {2 * s.cp} chunks of each sequence over the cp "
            f"ranks; give a multiple of {2 * s.cp}")
    if s.cp > 1 and s.ep > 1:
        raise SpecError("strategy.cp", s.cp,
                        "execpar splits sequences or experts, not both; plan with --cp 1 or --ep 1")
    if s.dp_shard and not s.shards_gradients:
        raise SpecError("strategy.dp_shard", s.dp_shard,
                        "execpar shards over groups of dp ranks through FSDP2 (HSDP): plan with "
                        "--zero 2 or 3, or without --dp-shard")
    if model.is_mla:
        raise SpecError("model.kv_lora_rank", model.kv_lora_rank,
                        "latent attention is not supported by execpar yet")
    if model.is_moe and s.tp > 1:
        raise SpecError(
            "strategy.tp", s.tp,
            "execpar runs mixture-of-experts layers without tensor parallelism; plan with --tp 1 "
            "(and --ep to split the experts)")
    if s.ep > 1 and model.experts % s.ep:
        raise SpecError("strategy.ep", s.ep, f"must divide the model's {model.experts} experts")
    if s.ep > 1 and (s.shards_optimizer or s.pp > 1):
        raise SpecError(
            "strategy.ep", s.ep,
            "execpar runs expert parallelism beside DDP only; plan with --zero 0 and --pp 1, or "
            "--ep 1")
    simulate_only = (("offload_optimizer", s.offload_optimizer),
                     ("ps_servers", s.grad_sync == "ps" and s.ps_servers),
                     ("async_sgd", s.async_sgd), ("backup_frac", s.backup_frac),
                     ("compress", s.compress == "topk" and "topk"))
    for name, value in simulate_only:
        if value:
            raise SpecError(
                f"strategy.{name}", value,
                "is a what-if simpar predicts but execpar does not run; plan without it")
    if s.compress != "none" and (s.shards_gradients or s.tp > 1):
        raise SpecError(
            "strategy.compress", s.compress, "execpar compresses through a DDP communication "
            "hook: plan with --zero 0 or 1 and --tp 1")
    if s.pp > 1 and model.tied_embeddings:
        raise SpecError(
            "model.tied_embeddings", True,
            "tied embeddings cannot span pipeline stages in execpar; plan an untied model or --pp 1"
        )


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


def _check_precision(model, dtype: str) -> None:
    """fp8 runs through torchao's per-tensor float8 linears; block-scaled formats are what-ifs."""
    precision = get_precision(dtype)
    if precision.quantized and dtype != "fp8":
        raise SpecError("dtype", dtype, "execpar runs fp8 with per-tensor scaling (torchao); "
                        "block-scaled formats are a what-if simpar prices: plan with --dtype fp8 "
                        "or bf16")
    widths = {"hidden": model.hidden, "heads*head_dim": model.heads * model.head_dim,
              "kv_heads*head_dim": model.kv_heads * model.head_dim,
              "ffn_hidden": model.ffn_hidden}
    odd = [f"{k} {v}" for k, v in widths.items() if v % 16]
    if dtype == "fp8" and odd:
        raise SpecError("dtype", dtype, f"fp8 GEMMs (torch._scaled_mm) need widths that are "
                        f"multiples of 16; this model has {', '.join(odd)}: plan with bf16")
    if dtype == "fp8" and importlib.util.find_spec("torchao") is None:
        raise SpecError("dtype", dtype, "execpar runs fp8 through torchao, which is not installed: "
                        "pip install 'simpar[exec]' (or torchao)")


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
