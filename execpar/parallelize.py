"""parallelize(model, mesh, flags), in torchtitan's order: tensor, context and expert parallel,
then activation checkpointing, compile and activation offload, then data parallel.

Each step takes the mesh and plain flags, not the whole plan. Everything is torch's own:
DTensor `parallelize_module`, context-parallel attention, `checkpoint_wrapper`, DDP,
`ZeroRedundancyOptimizer` and FSDP2 `fully_shard`."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, cast

import torch
import torch.distributed as dist
from torch import nn

from simpar.errors import SpecError

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle

    from execpar.model import Attention, Transformer


def apply_tp(model: Transformer, tp_mesh, sequence_parallel: bool) -> None:
    """Megatron-style: column-parallel QKV and MLP-in, row-parallel output projections;
    with sequence parallelism norms run on sequence shards and activations are
    all-gathered before the column GEMMs. fp8 linears (apply_float8) are sharded by torchao's
    float8 styles, which gather a sequence-parallel input after casting it to fp8 (torchtitan's
    way)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    sp = sequence_parallel
    seq = Shard(1) if sp else Replicate()
    top: dict[str, ParallelStyle] = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if model.norm is not None and sp:
        top["norm"] = SequenceParallel()
    if model.output is not None:
        top["output"] = ColwiseParallel(input_layouts=seq, output_layouts=Replicate())
    if top:
        parallelize_module(model, tp_mesh, top)
    for block in model.layers.values():
        colwise, rowwise, prepare = _tp_styles(block.get_submodule("attention.wq"))
        plan = {
            "attention.wq": colwise(), "attention.wk": colwise(), "attention.wv": colwise(),
            "attention.wo": rowwise(output_layouts=seq)
        }
        ffn_colwise, ffn_rowwise, ffn_prepare = _tp_styles(block.get_submodule("feed_forward.w1"))
        plan.update({"feed_forward.w1": ffn_colwise(),
                     "feed_forward.w2": ffn_rowwise(output_layouts=seq)})
        if block.get_submodule("feed_forward").w3 is not None:
            plan["feed_forward.w3"] = ffn_colwise()
        if block.get_submodule("attention").q_norm is not None:
            # a rank's q and k hold its heads (dim 2): the norms' weights stay whole, and their
            # gradients, partial over the heads, are summed over tp (a Replicate DTensor's)
            plan.update({f"attention.{n}": SequenceParallel(sequence_dim=2, use_local_output=True)
                         for n in ("q_norm", "k_norm")})
        if sp:
            plan.update({
                "attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
                "attention": prepare(input_layouts=(Shard(1), ),
                                     desired_input_layouts=(Replicate(), )),
                "feed_forward": ffn_prepare(input_layouts=(Shard(1), ),
                                            desired_input_layouts=(Replicate(), ))
            })
        parallelize_module(block, tp_mesh, plan)


def _tp_styles(linear: nn.Module) -> tuple:
    """(colwise, rowwise, prepare-input) styles for a group of linears like `linear`: torchao's
    float8 ones where apply_float8 converted it (all of a block's attention and MLP linears, as
    check_supported holds their widths to multiples of 16)."""
    if type(linear).__name__ == "Float8Linear":
        from torchao.float8.float8_tensor_parallel import (
            Float8ColwiseParallel,
            Float8RowwiseParallel,
            PrepareFloat8ModuleInput,
        )

        return Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
    )

    return ColwiseParallel, RowwiseParallel, PrepareModuleInput


def apply_float8(model: Transformer, *, fsdp_all_gather: bool = False) -> None:
    """fp8 plans: the transformer blocks' linear layers run their GEMMs in fp8 with one scale per
    tensor, computed from the tensor at hand (torchao's float8 training, "tensorwise" recipe, as
    torchtitan's float8 converter; simpar's fp8 prices the same). The output layer stays in 16
    bits, as does a linear with a side not divisible by 16 (torch._scaled_mm's constraint: a
    mixture-of-experts router). Applied before tensor parallelism, which then uses torchao's
    float8 styles. `fsdp_all_gather` (plans whose stack gathers fp8 weights under ZeRO-3,
    Stack.fp8_weight_gathers): each rank casts its weight shards to fp8 before FSDP gathers them,
    with scales from precompute_float8_scales after each optimizer step."""
    with _quiet("torchao", "torch.utils._pytree"):
        # torchao's import warns of each CUDA kernel library a CPU build cannot load, and
        # registers an enum torch now handles itself
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    def eligible(linear: nn.Module, fqn: str) -> bool:
        sides = (getattr(linear, "in_features", 0), getattr(linear, "out_features", 0))
        return fqn.startswith("layers.") and all(n % 16 == 0 for n in sides)

    config = replace(Float8LinearConfig.from_recipe_name("tensorwise"),
                     enable_fsdp_float8_all_gather=fsdp_all_gather)
    convert_to_float8_training(model, module_filter_fn=eligible, config=config)


def precompute_float8_scales(model: torch.nn.Module) -> None:
    """The scales of fp8-gathered weights, from their updated shards: one all-reduce of every
    weight's amax (torchao's precompute_float8_dynamic_scale_for_fsdp, as torchtitan runs it after
    each optimizer step)."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)


@contextmanager
def _quiet(*loggers: str):
    """Only errors from these loggers while the block runs."""
    saved = {name: logging.getLogger(name).level for name in loggers}
    for name in loggers:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


def context_shards(cp_mesh, *tensors: torch.Tensor) -> list[torch.Tensor]:
    """This context-parallel rank's part of each (batch, seq, ...) tensor: torch's head-tail
    load balancing gives rank r the r-th and the (2cp-1-r)-th of 2cp sequence chunks, so that
    under the causal mask every rank attends over as many keys."""
    from torch.distributed.tensor.experimental._attention import (
        _context_parallel_shard,
        _HeadTailLoadBalancer,
    )

    balancer = _HeadTailLoadBalancer(tensors[0].shape[1], cp_mesh.size(), tensors[0].device)
    shards = _context_parallel_shard(cp_mesh, list(tensors), [1] * len(tensors),
                                     load_balancer=balancer)
    return [cast(torch.Tensor, t) for t in shards]


def apply_cp(model: Transformer, cp_mesh, seq_len: int) -> None:
    """Context parallelism: each rank holds context_shards of every sequence; its attention
    blocks rotate positions by where its tokens sit, and attend over the keys and values of
    the whole sequence. On CUDA through torch's context-parallel ring attention (as torchtitan:
    _ContextParallel on the attention module, torch's SDPA handlers); torch has none for CPU
    (no sharding rule for the CPU flash kernel, no FlexAttention backward), so there K and V are
    all-gathered (torch's flex_cp_allgather) and masked by position."""
    import torch.distributed.distributed_c10d as c10d
    from torch.distributed.tensor.experimental._attention import (
        _ContextParallel,
        _enable_context_parallel_dispatcher,
    )
    from torch.distributed.tensor.parallel import parallelize_module

    device = cp_mesh.device_type
    (mine,) = context_shards(cp_mesh, torch.arange(seq_len, device=device)[None])
    positions = mine[0]
    gathered = None  # the CPU path's (group, query positions, gathered keys' positions)
    if device != "cuda":
        everyone = torch.empty(seq_len, dtype=positions.dtype, device=device)
        dist.all_gather_single(everyone, positions.contiguous(), group=cp_mesh.get_group())
        gathered = (c10d._get_process_group_name(cp_mesh.get_group()), positions, everyone)
    ring = _ContextParallel(seq_dim=2, attention_type=_ContextParallel.AttentionType.SDPA)
    for block in model.layers.values():
        attention = cast("Attention", block.get_submodule("attention"))
        attention.positions = positions
        if gathered is None:
            attention.core.ring = True
            parallelize_module(attention.core, cp_mesh, ring)
        else:
            attention.core.gathered = gathered
    if gathered is None:
        _enable_context_parallel_dispatcher()


def apply_recompute(model: Transformer, mode: str, layers: int = 0) -> None:
    """full: recompute every block in backward; selective: only the attention (its s^2
    work); op: torch's selective checkpointing keeps every second matmul output and the
    attention, recomputing the rest. `layers` > 0: only this chunk's first `layers` blocks
    (Megatron's --recompute-method block), as the plan's recompute_layers prices."""
    if mode == "none":
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    blocks = list(model.layers.items())
    for key, block in blocks[:layers] if layers else blocks:
        if mode == "full":
            model.layers[key] = checkpoint_wrapper(block, preserve_rng_state=False)
        elif mode == "op":
            model.layers[key] = checkpoint_wrapper(block, preserve_rng_state=False,
                                                   context_fn=_op_level_context)
        else:
            block.attention = checkpoint_wrapper(block.get_submodule("attention"),
                                                 preserve_rng_state=False)


def apply_activation_offload(model: Transformer, layers: int, device) -> None:
    """The first `layers` blocks of this chunk keep what autograd saves for their backward in host
    memory (torch.autograd.graph.save_on_cpu, pinned on CUDA so the copies run beside compute):
    Megatron's cpu_offloading_num_layers, priced by the plan's offload_activations."""
    for block in list(model.layers.values())[:layers]:
        ctx = torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda")
        block.register_forward_pre_hook(lambda *_, c=ctx: c.__enter__())
        # always_call: a forward that raises leaves the hooks popped all the same
        block.register_forward_hook(lambda *_, c=ctx: c.__exit__(None, None, None),
                                    always_call=True)


def _op_level_context():
    """A fresh policy per checkpointed call: odd-numbered matmuls and attention are saved (as
    torchtitan's op-level policy), so the forward and its recompute count matmuls alike."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    aten = torch.ops.aten
    attention = {
        getattr(aten, n).default
        for n in ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                  "_scaled_dot_product_flash_attention_for_cpu") if hasattr(aten, n)
    }
    seen = {True: 0, False: 0}

    def policy(ctx, op, *args, **kwargs):
        if op == aten.mm.default:
            seen[ctx.is_recompute] += 1
            return (
                CheckpointPolicy.MUST_SAVE
                if seen[ctx.is_recompute] % 2
                else CheckpointPolicy.PREFER_RECOMPUTE
            )
        return CheckpointPolicy.MUST_SAVE if op in attention else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def apply_compile(model: Transformer) -> None:
    """torch.compile each transformer block (as torchtitan does): its elementwise ops
    fuse into few kernels, and identical blocks share one compiled graph."""
    for key, block in list(model.layers.items()):
        # an OptimizedModule (a Module), though torch.compile's signature promises only a callable
        model.layers[key] = cast(nn.Module, torch.compile(block))


def apply_ep(model: Transformer, ep_mesh) -> dict[str, nn.Parameter]:
    """Keep this rank's contiguous block of every MoE layer's experts (each rank built
    all of them from the same seed) and route their tokens through the ep group. Returns
    the expert weights by name: data parallelism must leave them out, as no other rank
    of the ep group holds them (sync_expert_grads)."""
    from execpar.model import MoE

    ep, r = ep_mesh.size(), ep_mesh.get_local_rank()
    experts = {}
    for name, moe in model.named_modules():
        if not isinstance(moe, MoE):
            continue
        local = moe.experts // ep
        for w in ("w1", "w2", "w3"):
            if getattr(moe, w) is not None:
                setattr(moe, w,
                        nn.Parameter(getattr(moe, w).detach()[r * local:(r + 1) * local].clone()))
                experts[f"{name}.{w}"] = getattr(moe, w)
        moe.ep_group = ep_mesh.get_group()
    return experts


def sync_expert_grads(experts: dict[str, nn.Parameter], edp_mesh, dp: int) -> None:
    """The global loss is the mean of the dp ranks' losses: an expert's gradient is the sum of what
    the replicas of its ep rank (the edp group) accumulated, over dp, as DDP averages the rest."""
    for p in experts.values():
        if p.grad is not None:
            if edp_mesh.size() > 1:
                dist.all_reduce(p.grad, group=edp_mesh.get_group())
            p.grad.div_(dp)


def clip_gradients(model: nn.Module, max_norm: float, pp_mesh, experts=(), ep_mesh=None) -> None:
    """Scale the gradients so that the whole model's gradient norm is at most
    `max_norm`, as one process would: each pipeline stage holds its own layers and each
    ep rank its own experts, so their squared norms are summed over those groups
    (torch's clip_grad_norm_ alone sees only this rank's)."""
    split = {id(p) for p in experts}
    param_grads = [(id(p), p.grad) for p in model.parameters() if p.grad is not None]
    device = param_grads[0][1].device if param_grads else torch.device("cpu")

    def squared(grads) -> torch.Tensor:
        # torch's norm takes one kind of tensor at a time: under tensor parallelism without
        # FSDP the norms' gradients are plain beside the DTensor shards, and FSDP beside
        # tensor parallelism holds some on its mesh alone and some on (dp, tp)
        by_mesh: dict = {}
        for g in grads:
            by_mesh.setdefault(getattr(g, "device_mesh", None), []).append(g)
        total = torch.zeros((), dtype=torch.float64, device=device)
        for group in by_mesh.values():
            norm = torch.nn.utils.get_total_norm(group)
            # a DTensor norm of shards: the whole tensors' norm
            norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
            total = total + norm.double() ** 2
        return total

    total = squared([g for key, g in param_grads if key not in split])
    routed = squared([g for key, g in param_grads if key in split])
    if split and ep_mesh.size() > 1:
        dist.all_reduce(routed, group=ep_mesh.get_group())
    total = total + routed
    if pp_mesh.size() > 1:
        dist.all_reduce(total, group=pp_mesh.get_group())
    coef = min(1.0, max_norm / (float(total) ** 0.5 + 1e-6))
    if coef < 1.0:
        for _, g in param_grads:
            g.mul_(coef)


def uses_fsdp(s, *, mixed: bool) -> bool:
    """FSDP2 for ZeRO 2/3, DDP for ZeRO 0/1 (ZeRO-1 shards the optimizer, see
    make_optimizer), over the dp*cp ranks that hold the same weights. DDP cannot wrap DTensor
    parameters, and under a pipeline its reducer asserted where a step ran as many micro-batches
    as stages (torch 2.13: its first bucket rebuild counted every parameter twice), so with
    tensor or pipeline parallelism ZeRO 0/1 use FSDP2 without resharding after forward, which
    moves the same bytes (reduce-scatter + all-gather instead of all-reduce), as torchtitan
    pairs its pipelines with FSDP2. With tensor parallelism and one replica, FSDP2 only casts
    the weights to the 16-bit compute type (`mixed`; torchtitan runs no autocast beside DTensor
    TP): in fp32 nothing wraps the model but a compiled one, sparing FSDP2's hooks and copies on
    one rank (8% of a CPU TP step)."""
    replicated = s.dp * s.cp > 1
    # one replica's compiled tensor-parallel blocks run wrapped too: plain, torch's compiled
    # DTensor backward lost a `_local_tensor` (AttributeError, torch 2.13)
    alone = s.tp > 1 and (mixed or s.compile)
    return (s.shards_gradients or s.tp > 1 or s.pp > 1) and (replicated or alone)


# the 16-bit precisions a plan may reduce gradients in (--grad-reduce), as FSDP2's reduce_dtype
REDUCE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def check_bf16_reduce(s, *, nccl: bool) -> None:
    """DDP reduces in bf16 (--grad-reduce bf16, --compress bf16) through torch's bf16
    communication hook, which needs NCCL; FSDP2 reduces in its reduce_dtype on any backend."""
    if nccl or "bf16" not in (s.grad_reduce, s.compress):
        return
    if s.dp * s.cp > 1 and not uses_fsdp(s, mixed=False):
        fix = ("plan --zero 2 or 3 (FSDP2 reduces in bf16 on gloo too)" if s.grad_reduce else
               "plan --compress fp16")
        raise SpecError(f"strategy.{'grad_reduce' if s.grad_reduce else 'compress'}", "bf16",
                        f"torch's bf16 DDP hook needs NCCL (CUDA): on CPU {fix}")


def apply_dp(model: Transformer, dp_mesh, s, *, bucket_mb: float, mixed: torch.dtype | None,
             ignore: tuple[str, ...] = (), shard_mesh=None):
    """Data parallelism over `dp_mesh` as `uses_fsdp` decides; `mixed`: the 16-bit compute dtype
    (None: fp32). FSDP2 shards over `shard_mesh` where given: a 2D (replicate, shard) mesh of the
    same ranks runs it as HSDP (Strategy.dp_shard)."""
    if uses_fsdp(s, mixed=mixed is not None):
        dp_mesh = shard_mesh if shard_mesh is not None else dp_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        reshard = s.shards_parameters
        # 16-bit compute over fp32 master weights; gradients reduced in fp32 unless the plan
        # says a 16-bit precision (--grad-reduce)
        reduce = REDUCE_DTYPES.get(s.grad_reduce, torch.float32)
        mp = MixedPrecisionPolicy(param_dtype=mixed, reduce_dtype=reduce)
        for block in model.layers.values():
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp)
        fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp)
        return model
    if dp_mesh.size() == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    if ignore:  # expert weights: each rank of an ep group holds different ones (apply_ep)
        DDP._set_params_and_buffers_to_ignore_for_model(model, list(ignore))
    ddp = DDP(model, process_group=dp_mesh.get_group(), bucket_cap_mb=bucket_mb)
    # a plan reducing in 16 bits (--grad-reduce) runs torch's bf16 or fp16 hook: DDP's fp32
    # buckets cast for the all-reduce and back
    compress = s.grad_reduce if s.grad_reduce in REDUCE_DTYPES else s.compress
    if compress != "none":
        _compress_hook(ddp, dp_mesh.get_group(), compress, s.compress_rank)
    return ddp


def _compress_hook(ddp, group, compress: str, rank: int) -> None:
    """Gradient compression as torch's DDP communication hooks: fp16/bf16 casts or PowerSGD
    with error feedback (two plain all-reduce steps first, as PowerSGDState needs)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if compress == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=group, matrix_approximation_rank=rank,
                                            start_powerSGD_iter=2)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    else:
        hooks = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}
        hook = hooks[compress]
        ddp.register_comm_hook(group, hook)


def make_optimizer(model: nn.Module, s, dp_mesh, lr: float, *, fsdp: bool = False):
    """AdamW as the plan prices it: fused (one kernel per parameter group reads and writes each
    state once, as torchtitan does; execpar's default) or foreach (--optimizer foreach)."""
    params = [p for p in model.parameters() if p.requires_grad]
    fused = s.optimizer != "foreach"
    impl = {"fused": fused, "foreach": not fused}
    if s.shards_optimizer and not fsdp and dp_mesh.size() > 1:  # ZeRO-1 beside DDP
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW,
                                       process_group=dp_mesh.get_group(), lr=lr, weight_decay=0.0,
                                       **impl)
    # tensor parallelism without FSDP leaves the norms' weights plain beside DTensor ones: the
    # multi-tensor kernels take one kind at a time, so each kind is its own group
    sharded = [p for p in params if hasattr(p, "device_mesh")]
    plain = [p for p in params if not hasattr(p, "device_mesh")]
    groups = [{"params": g} for g in (sharded, plain) if g]
    return torch.optim.AdamW(groups, lr=lr, weight_decay=0.0, **impl)
