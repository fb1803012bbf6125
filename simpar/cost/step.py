"""Analytic step time of one strategy: compute roofline, collectives, pipeline bubble,
overlap, optimizer."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from simpar.cost.compute import hbm_rate, memory_bound_time
from simpar.cost.gradsync import (
    ddp_sync,
    grad_bytes,
    persistent_regather_seconds,
    sharded_sync,
    tied_embedding_sync,
)
from simpar.cost.layer import (
    PassCost,
    at_step_power,
    head_behind_host,
    head_cost,
    layer_passes,
    layers_backward,
    overlap_pair,
    overlapped,
    stack_layer_work,
)
from simpar.cost.pipeline import pipeline_span
from simpar.cost.pricing import Pricing
from simpar.cost.replicas import Replicas, replicas_for
from simpar.memory.model import (
    MemoryBreakdown,
    memory_breakdown,
    saved_activation_bytes,
    state_bytes_per_param,
    stream_element_bytes,
)
from simpar.network.model import DEFAULT_NETWORK, FREE_NETWORK, NetworkOptions, network_for
from simpar.specs.gpu import GPUSpec
from simpar.specs.precision import get_precision
from simpar.specs.stack import DEEPSPEED_MAX_REUSE_DISTANCE
from simpar.specs.strategy import Strategy, split_layers, stage_kind_counts, stage_kinds, validate
from simpar.workload import flops
from simpar.workload.layer import act_bytes, head_work, weight_tensors
from simpar.workload.params import multiplied_params, root_params, stage_params

# Adam step in fp32 training, bytes per local parameter: read the gradient, read+write the weight,
# momentum and variance, and read gradients once more for the global-norm clip. Mixed precision: the
# stack's optimizer_bytes (simpar/specs/stack.py).
OPTIMIZER_BYTES_FP32 = 4 + 8 + 8 + 8 + 4
# torch.autocast casts each fp32 weight to 16 bits once per step (read 4, write 2 bytes).
AUTOCAST_CAST_BYTES = 6

# The parts a step's time is split into, in the order they are shown; the communication
# parts are the time communication did not hide behind compute. straggler_wait: what the
# replicas what-ifs add.
PHASES = ("forward_compute", "backward_compute", "recompute", "tp_comm", "cp_comm", "ep_comm",
          "pp_p2p", "pipeline_bubble", "dp_comm", "optimizer", "straggler_wait")
COMM_PHASES = ("tp_comm", "cp_comm", "ep_comm", "pp_p2p", "dp_comm")


@dataclass(frozen=True)
class Prediction:
    step_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    hfu: float
    bubble_fraction: float  # bubble / pipeline span: (P-1)/(M+P-1) for equal stages
    exposed_comm_s: float
    memory_verdict: str  # MemoryBreakdown.verdict: fits, tight or does not fit
    memory: MemoryBreakdown
    breakdown: dict  # seconds per phase on the critical path; sums to step_time_s
    micro_batches: int
    layers_per_stage: tuple
    strategy: Strategy = field(repr=False)
    time_to_train_days: float | None = None  # when the job gives tokens to train
    # stragglers, backup workers, async SGD
    replicas: Replicas | None = field(default=None, repr=False)

    @property
    def fits_memory(self) -> bool:
        return self.memory_verdict == "fits"

    def to_dict(self) -> dict:
        return {
            "step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu, "mfu": self.mfu,
            "hfu": self.hfu, "bubble_fraction": self.bubble_fraction,
            "exposed_comm_s": self.exposed_comm_s, "fits_memory": self.fits_memory,
            "memory_verdict": self.memory_verdict, "memory": self.memory.to_dict(),
            "breakdown": dict(self.breakdown),
            "micro_batches": self.micro_batches, "layers_per_stage": list(self.layers_per_stage),
            "time_to_train_days": self.time_to_train_days, "strategy": self.strategy.to_dict(),
            "replicas": self.replicas.to_dict() if self.replicas else None
        }


def _stage_costs(p: Pricing) -> list[tuple[PassCost, PassCost, float]]:
    """(forward, backward, sends) per micro-batch of each pipeline stage; stages of one kind
    (specs/strategy.stage_kinds) share one tuple."""
    priced = _kind_costs(p)
    return [priced[i] for i, _ in stage_kinds(p.model.layers, p.strategy.pp)]


def _kind_costs(p: Pricing) -> dict[int, tuple[PassCost, PassCost, float]]:
    """(forward, backward, sends) per micro-batch of each stage kind, by its first stage."""
    model, s, gpu = p.model, p.strategy, p.gpu
    fwd, bwd, plain, head_f, head_b = _layer_and_head(p)
    p2p = pipeline_send_seconds(p)
    priced: dict[int, tuple[PassCost, PassCost, float]] = {}
    for i, n, _ in stage_kind_counts(model.layers, s.pp):
        copies = gradient_copy_seconds(p, *stage_params(model, s, i, n))
        # the rank's layers as chunks_per_rank model chunks, each offloading its own
        off_f, off_b = (s.chunks_per_rank * t for t in activation_offload_seconds(
            p, fwd, bwd, n // s.chunks_per_rank))
        f = fwd.scaled(n) + PassCost(compute_s=off_f)
        b = (layers_backward(bwd, plain, n, s.recomputed(n, s.chunks_per_rank))
             + PassCost(compute_s=copies + off_b))
        if i == s.pp - 1:
            f, b = f + head_f, head_behind_host(b + head_b, head_f.compute_s + head_b.compute_s)
        # sends per micro-batch: activations onward from every virtual stage but the
        # model's last, gradients back from every one but the first; blocking,
        # unless the stack overlaps them; as many receives, blocking where the stack's are
        sends = (2 * s.vpp - (i == 0) - (i == s.pp - 1) if s.pp > 1 else 0) * p2p
        sends *= 2 if s.profile.blocking_recvs else 1
        if overlaps_p2p(s):
            sends = overlapped(sends, f.compute_s + b.compute_s, gpu.overlap_slowdown)
        priced[i] = (f, b, sends)
    return priced


def _layer_and_head(p: Pricing) -> tuple[PassCost, PassCost, PassCost, PassCost, PassCost]:
    """(forward, backward, backward without recompute) of one transformer layer and (forward,
    backward) of the output head, per micro-batch."""
    s, job = p.strategy, p.job
    args = (p.model, p.gpu, job.seq_len, job.dtype, s.micro_batch, s.tp, s.cp, s.ep, s.sp,
            s.flash, s.elementwise, s.recompute, s.recompute_layers > 0, s.overlap_tp_comm,
            s.profile, s.loss_kind, s.shards_parameters, s.selective_modules(p.model))
    if p.net is FREE_NETWORK:  # compute alone: the same for every candidate of one layer shape
        return _free_layer_and_head(*args)
    return _layer_and_head_on(p.net, *args)


def _layer_and_head_on(net, model, gpu, seq_len: int, dtype: str, micro_batch: int, tp: int,
                       cp: int, ep: int, sp: bool, flash, kernels: str, recompute: str,
                       partial: bool, overlap_tp: bool, prof, loss_kind: str, zero3: bool,
                       modules: frozenset[str]):
    work = stack_layer_work(model, seq_len, micro_batch, tp, cp, ep, sp, flash, dtype, kernels,
                            prof, zero3=zero3)
    head = head_work(model, seq_len, micro_batch, tp, cp, sp, dtype, loss_kind, prof.loss_parallel)
    gpu = at_step_power(work, head, model.layers, gpu, dtype, prof, recompute)
    passes = layer_passes(work, net, gpu, dtype, recompute, overlap_tp, prof, partial, modules)
    return (*passes, *head_cost(head, net, gpu, dtype))


@lru_cache(maxsize=4096)
def _free_layer_and_head(*args) -> tuple[PassCost, PassCost, PassCost, PassCost, PassCost]:
    return _layer_and_head_on(FREE_NETWORK, *args)


def pipeline_send_seconds(p: Pricing) -> float:
    """One micro-batch's activation (or its gradient) sent to the next pipeline stage, in the
    residual stream's precision: each tensor-parallel rank sends its shard under sequence
    parallelism, the whole activation otherwise."""
    s, job = p.strategy, p.job
    if s.pp == 1:
        return 0.0
    tokens = s.micro_batch * job.seq_len // s.cp
    msg = tokens * p.model.hidden * stream_element_bytes(s, job.dtype)
    if s.sp or s.tp == 1:
        return p.net.ring_shift(msg / s.tp, "pp")
    if s.profile.pipeline_scatter_gather:
        return p.net.ring_shift(msg / s.tp, "pp") + p.net.collective("allgather", msg, "tp")
    return p.net.ring_shift(msg, "pp")


def compute_bound(model, cluster, job, strategy) -> float:
    """Seconds a step takes at least: the pipeline's span (every micro-batch through the
    busiest stage, plus the fill and drain) with communication free. A prediction adds only
    non-negative terms to the stages' times (collectives, sends) and to the span
    (data-parallel sync, optimizer); the span grows with the stage times, and its fill-drain
    share only grows as communication lowers the weight-gradient share W / (F + B), so the
    bound takes each schedule's share at the lowest of the stages' compute-only W shares
    (and, for DualPipeV, at a backward share of 0). The GPU's waits for the host are left out:
    collectives hide the host's issue as they hide compute, so with communication free they
    would count what a prediction hides. The search skips a candidate whose bound is already
    slower than the ones it keeps (what-ifs that rescale the step excepted)."""
    s = strategy
    m = s.micro_batches(job.global_batch)
    kinds = _kind_costs(Pricing(model, cluster, job, s, FREE_NETWORK))
    per_micro_batch = {i: _per_micro_batch(f, b, s, cluster, m) for i, (f, b, _) in kinds.items()}
    times = {i: c.total_s - c.host_wait_s for i, c in per_micro_batch.items()}
    t_max = max(times.values())
    if s.pp == 1:
        return m * t_max
    total = sum(times[i] * count for i, _, count in stage_kind_counts(model.layers, s.pp))
    share = min(s.pipeline.fill_drain_share(s.vpp, b.wgrad_s / max(f.total_s + b.total_s, 1e-30),
                                            0.0) for f, b, _ in kinds.values())
    return m * t_max + (total - t_max) * share


def compute_bound_key(s) -> tuple:
    """Strategies with equal keys have equal compute bounds: every field of the strategy but its
    ZeRO stage, which enters the communication-free span only through the gradient copies
    (gradient_copy_seconds: FSDP2's copy kernels, and an accumulation that adds a shard or the
    whole gradient). A search's candidates differ often in their ZeRO stage alone."""
    fields = dict(vars(s))
    prof = s.profile
    if prof.fsdp_copies == "none" and prof.grad_accumulation == "fused":
        fields["zero"] = None
    return tuple(fields.values())


def overlaps_p2p(s) -> bool:
    """Megatron-LM overlaps pipeline sends with compute in its interleaved schedule only
    (--overlap-p2p-communication)."""
    return s.profile.p2p_overlap and s.pipeline.virtual_stages


def _per_micro_batch(f: PassCost, b: PassCost, s, cluster, m: int) -> PassCost:
    """A stage's forward and backward of one micro-batch, averaged over the step.
    DualPipeV (and Megatron's combined 1F1B, --overlap-ep-comm) runs a forward beside another
    micro-batch's backward in its main phase, so their collectives hide behind each other's
    compute."""
    paired = s.paired_share(m)
    if paired == 0.0:
        return f + b
    both = overlap_pair(f, b, cluster.gpu.overlap_slowdown)
    return both.scaled(paired) + (f + b).scaled(1.0 - paired)


def _dp_sync(p: Pricing, dense: float, expert: float,
             blocks: int) -> tuple[float, float, float, float]:
    """(per-step gradient sync, per-step parameter gather, per-micro-batch reduction,
    per-micro-batch gathers) seconds of one stage of `blocks` transformer blocks."""
    s = p.strategy
    if s.optimizer_zero(p.job.dtype) == 0:
        return ddp_sync(p, dense, expert), 0.0, 0.0, 0.0
    rs = sharded_sync(p, "reducescatter", dense, expert, blocks)
    ag = sharded_sync(p, "allgather", dense, expert, blocks)
    rs_step, ag_step, rs_mb, ag_mb = zero_cadence(s, p.model)
    return rs_step * rs, ag_step * ag, rs_mb * rs, ag_mb * ag


def zero_cadence(s, model) -> tuple[float, float, float, float]:
    """Passes over a stage's parameters of a sharded strategy: (gradient reductions per step,
    weight gathers per step, reductions per micro-batch, gathers per micro-batch). ZeRO-1/2 (or
    gradients accumulated unsharded) reduce and gather once a step; ZeRO-2 reduce-scatters each
    micro-batch; ZeRO-3 also gathers each micro-batch, for forward and again for backward when
    the stack reshards."""
    if not s.shards_gradients or s.accumulates_unsharded:
        return 1.0, 1.0, 0.0, 0.0
    if not s.shards_parameters:
        return 0.0, 1.0, 1.0, 0.0
    return 0.0, 0.0, 1.0, zero3_gathers(s, model)


def zero3_gathers(s, model) -> float:
    """All-gathers of a block's weights per micro-batch under ZeRO-3, in passes over them."""
    return zero3_passes(s, model, "F") + zero3_passes(s, model, "B")


def zero3_passes(s, model, kind: str) -> float:
    """ZeRO-3 all-gathers of a block's weights, in passes over them, for its forward ("F") or its
    backward ("B", recompute included): one for forward; one for backward where the stack
    reshards after forward; and where full recompute gathers again (Stack.recompute_regathers),
    one for the recomputed forward, after which backward gathers only what was freed."""
    if kind == "F":
        return 1.0
    if not s.profile.reshard_after_forward or s.accumulates_unsharded:
        return 0.0
    if s.recompute == "full" and s.profile.recompute_regathers:
        return 1.0 + s.recompute_share(model.layers) * freed_before_backward(s, model)
    return 1.0


def zero3_edge_share(s, params: float, root: float, blocks: int, with_root: bool) -> float:
    """Of a ZeRO-3 pass over a chunk's `params` (of them `root` outside its `blocks` transformer
    blocks, params.root_params), the share its first block waits for (a gather) or that follows
    its last (a reduce-scatter), the rest streaming beside its blocks: one block's, and, where
    `with_root` under FSDP (Stack.zero3_unit "block"), all of the root unit, the embedding or
    the output layer, which forward gathers first and backward reduces last."""
    block_params = max(params - root, 0.0)
    r = root if with_root and fsdp_root_unit(s) else 0.0
    return (r + block_params / max(blocks, 1)) / max(r + block_params, 1e-30)


def fsdp_root_unit(s) -> bool:
    """The stack runs FSDP (Stack.zero3_unit "block": a unit per block), which shards what lies
    outside the blocks as one root unit, gathered before the first block's forward, kept gathered
    from forward to backward (fully_shard sets reshard_after_forward False for the root; FSDP1
    does not free the root after forward) and reduced after the last block's backward."""
    return s.profile.zero3_unit == "block"


def freed_before_backward(s, model) -> float:
    """Share of a block's weight elements DeepSpeed frees between a module's recomputed forward
    and its backward: it keeps a module's weights gathered when the modules it will run before
    that backward (those after it in the block, once recomputed and once in backward) hold fewer
    elements than DEEPSPEED_MAX_REUSE_DISTANCE (stage3.py, _keep_for_later). Elements are
    counted per tensor-parallel rank, as each rank holds them."""
    sizes = [w / s.tp for w in weight_tensors(model, s.profile.fused_input_linears)]
    freed = sum(w for i, w in enumerate(sizes)
                if 2 * sum(sizes[i + 1:]) >= DEEPSPEED_MAX_REUSE_DISTANCE)
    return freed / sum(sizes)


def fsdp_copy_seconds(p: Pricing, dense: float, expert: float) -> float:
    """The memory passes FSDP makes around its ZeRO-2/3 collectives (Stack.fsdp_copies), per
    micro-batch, booked with the backward pass. FSDP2: each all-gather's copy-out reads the
    gathered buffer and writes every parameter (2 x the compute dtype's bytes per gather), the
    reduce-scatter's copy-in reads the gradients and writes them in the reduce dtype. FSDP1: the
    flat gradient's concatenation from its views (read and write in the compute dtype), the cast
    to the reduce dtype where it differs, and the in-place pre-division (read and write in the
    reduce dtype). A stage kept gathered copies once per step."""
    s, job = p.strategy, p.job
    mode = s.profile.fsdp_copies
    if mode == "none" or not s.shards_gradients:
        return 0.0
    param, reduce = act_bytes(job.dtype), grad_bytes(s, job)
    if mode == "fsdp2":
        gathers = zero3_gathers(s, p.model) if s.shards_parameters else 1
        per_param = 2 * param * gathers + param + reduce
    else:
        per_param = 2 * param + (param + reduce if reduce != param else 0) + 2 * reduce
    per_step = s.micro_batches(job.global_batch) if s.accumulates_unsharded else 1
    return memory_bound_time(per_param * (dense + expert), p.gpu, 0) / per_step


def gradient_copy_seconds(p: Pricing, dense: float, expert: float) -> float:
    """Memory-bound seconds the data-parallel setup adds to each micro-batch's backward over a
    rank's `dense` + `expert` parameters: FSDP2's copies around its collectives and the
    gradient accumulation. Both engines book it."""
    return fsdp_copy_seconds(p, dense, expert) + grad_accumulation_seconds(p, dense, expert)


def grad_accumulation_seconds(p: Pricing, dense: float, expert: float) -> float:
    """Seconds per micro-batch (averaged over the step's) to add each micro-batch's weight
    gradients into those accumulated over the step, as the stack does it
    (Stack.grad_accumulation), booked with the backward pass. Where ZeRO-2/3 reduce-scatters
    every micro-batch, only a rank's shard accumulates; where the stage keeps its gradients
    unsharded (ZeRO 0/1, FSDP2 under pipeline parallelism), the whole of them."""
    s, job = p.strategy, p.job
    mode, m = s.profile.grad_accumulation, s.micro_batches(job.global_batch)
    if mode == "fused":
        return 0.0
    params = dense + expert
    if s.shards_gradients and not s.accumulates_unsharded:
        params = s.shard_of(dense, expert)
    if s.keeps_fp32_gradients(job.dtype):
        per_param = 2.0 + 4 + 3 * 4  # cast to fp32, add into the fp32 copy: every micro-batch
    else:
        kept = grad_bytes(s, job) if s.accumulates_unsharded else state_bytes_per_param(
            job.dtype, s.profile)[1]
        # FSDP2 under pipeline parallelism gets 16-bit gradients from backward and keeps their
        # sum in the reduce dtype: the first is cast, the others added
        new = act_bytes(job.dtype) if s.accumulates_unsharded else kept
        first = new + kept if new != kept else 0
        per_param = (first + (m - 1) * (new + 2 * kept)) / m
    return per_param * params / hbm_rate(p.gpu)


def activation_offload_seconds(p: Pricing, fwd: PassCost, bwd: PassCost,
                               layers: int) -> tuple[float, float]:
    """(forward, backward) seconds per micro-batch the host link adds to `layers` layers of a
    model chunk for those whose saved activations wait in host memory (--offload-activations):
    each goes down in forward and comes back in backward on a side stream, beside that layer's
    compute (`fwd`, `bwd`: one layer's costs)."""
    off = min(p.strategy.offload_activations, layers)
    if not off:
        return 0.0, 0.0
    down = saved_activation_bytes(p.model, p.job, p.strategy) / (p.cluster.host_link_gbps * 1e9)
    slow = p.gpu.overlap_slowdown
    return (off * overlapped(down, fwd.compute_s, slow),
            off * overlapped(down, bwd.compute_s + bwd.recompute_s, slow))


# fp16's loss scaling: before the step, every gradient is read and written once more to unscale it
# and flag inf/nan (torch._amp_foreach_non_finite_check_and_unscale_, which Megatron's
# MixedPrecisionOptimizer._unscale_main_grads_and_check_for_nan and torch's GradScaler.unscale_
# both call); bf16 training has no grad scaler
LOSS_SCALE_PASSES = 2


def optimizer_bytes(job, s) -> int:
    """The stack's Adam implementation; fp32 training moves at least the fp32 fused step's bytes,
    and fp16 training unscales its gradients first."""
    precision = get_precision(job.dtype)
    per_param = s.profile.optimizer_bytes
    if precision.wide:
        per_param = max(OPTIMIZER_BYTES_FP32, per_param)
    if precision.loss_scaled:
        per_param += LOSS_SCALE_PASSES * state_bytes_per_param(job.dtype, s.profile)[1]
    return per_param


def optimizer_time(p: Pricing, dense: float, expert: float, first: bool,
                   gpu: GPUSpec | None = None) -> float:
    """The Adam step on a rank's (shard of) `dense` + `expert` parameters, autocast's weight
    casts (the first stage's embedding is looked up, not cast) and what the stack's step does
    after the update (persistent_regather_seconds), on the cluster's GPU or `gpu` (a pipeline
    stage on other GPUs)."""
    return _adam_time(p, dense, expert, first, gpu) + persistent_regather_seconds(p)


def _adam_time(p: Pricing, dense: float, expert: float, first: bool,
               gpu: GPUSpec | None = None) -> float:
    """The update itself: Adam on the GPU (or in host memory, offloaded) and autocast's casts."""
    s, job, gpu = p.strategy, p.job, gpu or p.gpu
    per_param = optimizer_bytes(job, s)
    cast = (
        AUTOCAST_CAST_BYTES * multiplied_params(p.model, s, first, dense, expert) / hbm_rate(gpu)
        if s.fp32_stream(job.dtype)
        else 0.0
    )
    # each rank updates only its shard under ZeRO
    params = s.shard_of(dense, expert) if s.optimizer_zero(job.dtype) >= 1 else dense + expert
    if s.offload_optimizer:
        # gradients down and updated 16-bit weights back over the host link (PCIe, or
        # Grace-Blackwell's NVLink-C2C), the Adam step in host memory
        wb, gb, _ = state_bytes_per_param(job.dtype, s.profile)
        link, dram = p.cluster.host_link_gbps * 1e9, p.cluster.host_memory_gbps * 1e9
        return params * (gb + wb) / link + params * per_param / dram
    return params * per_param / hbm_rate(gpu) + cast


def _data_parallel(p: Pricing, layers, stages, m: int) -> tuple[float, float, float, float]:
    """Of the slowest stage: exposed data-parallel communication, optimizer and whole
    (unhidden) sync seconds, and the most parameters a stage's rank holds.

    A stage's gradients are final after its last backward; stages after the first finish
    earlier (the pipeline drain), so the drain also hides their reduction."""
    model, s, slow = p.model, p.strategy, p.gpu.overlap_slowdown
    dp_exposed = opt = drain = whole = most = 0.0
    tied = tied_embedding_sync(p)  # the first and last stages', after their sync
    # stages of the same parameters and blocks sync alike (most of them)
    syncs: dict[tuple, tuple] = {}
    for i, n in enumerate(layers):
        f, b, _ = stages[i]
        dense, expert = stage_params(model, s, i, n)
        key = (dense, expert, n, i == 0)
        if key not in syncs:
            syncs[key] = (*_dp_sync(p, dense, expert, n), optimizer_time(p, dense, expert, i == 0))
        grad_sync, gather, reduce_mb, gather_mb, opt_s = syncs[key]
        root = root_params(model, s, i == 0, i == len(layers) - 1)
        if s.shards_parameters and fsdp_root_unit(s):  # backward finds the root gathered
            back = zero3_passes(s, model, "B") / max(zero3_gathers(s, model), 1e-30)
            gather_mb *= 1 - back * root / max(dense + expert, 1e-30)
        per_mb = reduce_mb + gather_mb
        whole, most = max(whole, grad_sync + gather + m * per_mb), max(most, dense + expert)
        if s.overlap_grad_reduce:
            exposed = (overlapped(grad_sync, b.total_s + drain, slow)
                       + overlapped(gather, f.total_s, slow))
            # prefetched one block ahead: the first block's gather never hides
            if s.profile.zero3_overlap:
                share = zero3_edge_share(s, dense + expert, root, n, with_root=True)
                first_gather = per_mb * share if s.shards_parameters else 0.0
                exposed += m * overlapped(per_mb, f.total_s + b.total_s, slow) + first_gather
            else:  # each gather waited for before its block computes
                exposed += m * (gather_mb + overlapped(reduce_mb, b.total_s, slow))
        else:
            exposed = grad_sync + gather + m * per_mb
        if i in (0, len(layers) - 1):
            exposed += tied
        dp_exposed = max(dp_exposed, exposed)
        opt = max(opt, opt_s)
        drain += b.total_s
    return dp_exposed, opt, whole, most


def predict(model, cluster, job, strategy, check: bool = True,
            memory: MemoryBreakdown | None = None,
            network: NetworkOptions = DEFAULT_NETWORK) -> Prediction:
    """Predict one step. `check=False` skips validation (the search has validated already); `memory`
    reuses a breakdown computed before; `network` says how communication is priced (NetworkOptions:
    the flow or closed-form model, the mesh placement, a forced algorithm, valiant routing)."""
    s = strategy
    if check:
        validate(s, model, job, s.gpus)
    pricing = Pricing(model, cluster, job, s, network_for(cluster, s, network))
    m = s.micro_batches(job.global_batch)
    layers = split_layers(model.layers, s.pp)
    stages = _stage_costs(pricing)
    per_stage = {
        id(st): _per_micro_batch(st[0], st[1], s, cluster, m).total_s + st[2] for st in stages
    }
    times = [per_stage[id(st)] for st in stages]
    pace = max(range(len(times)), key=times.__getitem__)
    pf, pb, _ = stages[pace]
    both = max(pf.total_s + pb.total_s, 1e-30)
    span, bubble = pipeline_span(times, m, s.pipeline, s.vpp, pb.wgrad_s / both, pb.total_s / both)

    dp_exposed, opt, sync_s, params = _data_parallel(pricing, layers, stages, m)
    replicas = replicas_for(s, cluster, sync_s, params, optimizer_bytes(job, s))

    f, b, p2p = stages[pace]
    per_mb: PassCost = _per_micro_batch(f, b, s, cluster, m)
    breakdown = {
        "forward_compute": m * f.compute_s, "backward_compute": m * b.compute_s,
        "recompute": m * per_mb.recompute_s, "tp_comm": m * per_mb.tp_comm_s,
        "cp_comm": m * per_mb.cp_comm_s, "ep_comm": m * per_mb.ep_comm_s, "pp_p2p": m * p2p,
        "pipeline_bubble": bubble, "dp_comm": dp_exposed, "optimizer": opt
    }
    breakdown = replicas.apply(breakdown)
    step = sum(breakdown.values())

    # backup workers' discarded work does not count
    tokens = job.tokens_per_step * replicas.gradients_used
    gpus = s.gpus
    model_flops = flops.model_flops_per_token(model, job.seq_len) * tokens
    hw_flops = (flops.hardware_flops_per_token(model, job.seq_len, s.recompute,
                                               s.recompute_share(model.layers),
                                               s.profile.selective,
                                               s.selective_modules(model))
                * job.tokens_per_step)
    peak = cluster.gpu.peak_tflops(job.dtype) * 1e12
    mem = memory or memory_breakdown(model, job, s)
    return Prediction(
        step_time_s=step, tokens_per_s=tokens / step,
        model_tflops_per_gpu=model_flops / step / gpus / 1e12,
        hardware_tflops_per_gpu=hw_flops / step / gpus / 1e12,
        mfu=model_flops / (step * gpus * peak), hfu=hw_flops / (step * gpus * peak),
        bubble_fraction=bubble / span, exposed_comm_s=exposed_comm(breakdown),
        memory_verdict=mem.verdict(cluster.gpu.hbm_gib), memory=mem, breakdown=breakdown,
        micro_batches=m, layers_per_stage=layers, strategy=s,
        time_to_train_days=job.tokens / (tokens / step) / 86400 if job.tokens else None,
        replicas=replicas)


def with_simulation(p: Prediction, sim) -> Prediction:
    """The prediction with the event engine's step time (p50), bubble, exposed communication and
    breakdown in place of the closed form's (the engine plays one replica; the replica
    model adds the rest); FLOP rates follow the new step time."""
    from dataclasses import replace

    breakdown = _rescaled(sim.first.breakdown, sim.p50_s)
    if p.replicas is not None:
        breakdown = p.replicas.apply(breakdown)
    step = sum(breakdown.values())
    scale = p.step_time_s / step
    return replace(
        p, step_time_s=step, tokens_per_s=p.tokens_per_s * scale,
        model_tflops_per_gpu=p.model_tflops_per_gpu * scale,
        hardware_tflops_per_gpu=p.hardware_tflops_per_gpu * scale, mfu=p.mfu * scale,
        hfu=p.hfu * scale, bubble_fraction=sim.first.bubble_fraction,
        exposed_comm_s=exposed_comm(breakdown), breakdown=breakdown,
        time_to_train_days=p.time_to_train_days / scale if p.time_to_train_days else None)


def exposed_comm(breakdown: dict) -> float:
    return sum(breakdown[k] for k in COMM_PHASES)


def _rescaled(breakdown: dict, total: float) -> dict:
    """The first simulated step's phases, scaled to sum to the p50 step time."""
    s = sum(breakdown.values())
    return {k: v * total / s for k, v in breakdown.items()} if s > 0 else dict(breakdown)
