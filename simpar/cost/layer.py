"""Time of one transformer layer (and the output layer) per micro-batch: forward,
backward, recompute.

Backward costs twice the forward GEMM FLOPs (input and weight gradients) and twice the
memory-bound traffic; a fused attention backward costs 2.5x its forward (five GEMMs against
two, as it recomputes the scores; compute.attention_backward_factor). Tensor-parallel
collectives sit on the critical path, each hidden at most behind the GEMMs of its own
linear (tp_comm_exposed): in backward an input-gradient collective runs beside its
weight-gradient GEMM where the stack launches it first (Megatron-LM; not torch's DTensor
TP), and `overlap_tp_comm` pipelines every collective with its GEMM, in forward too."""

from __future__ import annotations

from dataclasses import dataclass, replace

from simpar.cost.compute import (
    attention_backward_factor,
    attention_dropout_factor,
    attention_from_table,
    attention_softmax_factor,
    backward_gemm_factor,
    flash_attention_time,
    gemm_time,
    memory_bound_time,
)
from simpar.network.collectives import dispatch_copies, hybridep_seconds
from simpar.specs.precision import get_precision, unquantized
from simpar.specs.strategy import CORE_ATTENTION, WHOLE_MLP
from simpar.workload.layer import (
    COMPLEX_ROPE,
    EXPERT_GEMMS,
    EXPERT_PADDING_KERNELS,
    MEGATRON_UNFUSED_ROPE,
    MLP_GEMMS,
    REAL_FP32_ROPE,
    LayerCode,
    RopeOps,
    head_work,
    layer_work,
)


def overlapped(comm_s: float, window_s: float, slowdown: float) -> float:
    """Seconds a collective adds when it runs beside `window_s` of compute: the part
    that does not fit in the window, plus the slowdown it inflicts on the compute it
    hides behind (gpu.overlap_slowdown)."""
    return max(0.0, comm_s - window_s) + slowdown * min(comm_s, window_s)


@dataclass(frozen=True)
class PassCost:
    """Seconds of one pass over a layer (or the output layer), split into phases on the
    critical path."""
    compute_s: float = 0.0
    recompute_s: float = 0.0
    tp_comm_s: float = 0.0
    cp_comm_s: float = 0.0
    ep_comm_s: float = 0.0
    # the weight-gradient GEMMs inside compute_s (zero-bubble schedules split them off)
    wgrad_s: float = 0.0
    # of compute_s and recompute_s, the time the GPU waits for the host to issue kernels
    host_wait_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.compute_s + self.recompute_s + self.tp_comm_s + self.cp_comm_s + self.ep_comm_s

    # written out rather than over dataclasses.fields(): a search adds and scales these
    # half a million times
    def scaled(self, k: float) -> PassCost:
        return PassCost(self.compute_s * k, self.recompute_s * k, self.tp_comm_s * k,
                        self.cp_comm_s * k, self.ep_comm_s * k, self.wgrad_s * k,
                        self.host_wait_s * k)

    def __add__(self, o: PassCost) -> PassCost:
        return PassCost(self.compute_s + o.compute_s, self.recompute_s + o.recompute_s,
                        self.tp_comm_s + o.tp_comm_s, self.cp_comm_s + o.cp_comm_s,
                        self.ep_comm_s + o.ep_comm_s, self.wgrad_s + o.wgrad_s,
                        self.host_wait_s + o.host_wait_s)


def overlap_pair(f: PassCost, b: PassCost, slowdown: float) -> PassCost:
    """A forward and another micro-batch's backward run together (DualPipe): each one's collectives
    hide behind the other's compute, exposed only beyond it (plus the overlap slowdown)."""
    def exposed(x: PassCost, window: float) -> float:
        comm = x.tp_comm_s + x.cp_comm_s + x.ep_comm_s
        return overlapped(comm, window, slowdown) / comm if comm > 0 else 0.0

    kf, kb = exposed(f, b.compute_s + b.recompute_s), exposed(b, f.compute_s + f.recompute_s)
    return PassCost(f.compute_s + b.compute_s, f.recompute_s + b.recompute_s,
                    kf * f.tp_comm_s + kb * b.tp_comm_s, kf * f.cp_comm_s + kb * b.cp_comm_s,
                    kf * f.ep_comm_s + kb * b.ep_comm_s, b.wgrad_s, f.host_wait_s + b.host_wait_s)


def _comm_times(work, net, comms=None, stack=None) -> tuple[float, float]:
    tp = ep = 0.0
    for c in work.comms if comms is None else comms:
        moved = _moved_bytes(c, net, stack)
        t = c.count * (_hybridep_seconds(c, moved, net, stack)
                       or net.collective(c.op, moved, c.group))
        if c.group == "tp":
            tp += t
        else:
            ep += t
    return tp, ep


def _flex_span(c, net, stack):
    """The group an MoE dispatch or combine `c` spans where the stack's flex dispatcher runs it
    (Stack.moe_dispatch); None for any other collective."""
    return net.spans.get(c.group) if c.top_k and stack and stack.moe_dispatch == "flex" else None


def _hybridep_seconds(c, moved: float, net, stack) -> float:
    """A flex dispatch or combine inside one Blackwell NVLink domain runs HybridEP, at its
    measured rate (network/collectives.py, HYBRIDEP_GBPS); 0 for any other collective."""
    span = _flex_span(c, net, stack)
    if span is None or span.size <= 1 or span.crosses_nodes or net.cluster.gpu.arch != "blackwell":
        return 0.0
    return hybridep_seconds(moved, span.size)


def _moved_bytes(c, net, stack) -> float:
    """What collective `c` moves per rank: an MoE dispatch under a flex dispatcher
    (Stack.moe_dispatch) a copy of each token per rank or domain its experts sit on
    (network/collectives.py, dispatch_copies), not one per expert."""
    span = _flex_span(c, net, stack)
    if span is None:
        return c.size_bytes
    return c.size_bytes / c.top_k * dispatch_copies(span, c.experts, c.top_k, c.expert_groups,
                                                    c.groups_per_token)


# torch.autocast (fp32 weights, 16-bit compute), bytes per weight element and
# micro-batch in backward: the 16-bit weight gradient is cast to fp32 (2 + 4). Adding it
# into .grad after the first micro-batch is the stack's gradient accumulation
# (cost/step.py, grad_accumulation_seconds). The forward cast of each weight to 16 bits
# (4 + 2) happens once per step (autocast's cache) and is priced with the optimizer step.
AUTOCAST_GRAD_BYTES = 6


def tp_comm_exposed(work, net, gemm_s: dict[str, float], pipelined: bool, stack,
                    slowdown: float) -> tuple[float, float]:
    """Seconds the layer's tensor-parallel collectives add to its forward and backward.
    Each can hide only behind the GEMMs of its own linear (Comm.forward_gemms,
    backward_gemms). `pipelined` (Megatron's
    --tp-comm-overlap, torch's async TP): the collective and its GEMM are split into tp
    chunks and pipelined; the chunk of the GEMM on the rank's own shard runs before any
    transfer (or after the last), leaving (tp-1)/tp of the GEMM as the window; in backward
    the input- and weight-gradient GEMMs (twice the forward's). Otherwise forward waits for
    each, and backward runs an input-gradient collective beside its linear's weight-gradient
    GEMM where the stack launches it first (tp_wgrad_overlap). A stack that gathers a
    sequence-parallel input again in backward (sp_regathers) runs that gather beside the
    input-gradient GEMM. torch's async TP does not pipeline the input-gradient reduction of
    separate linears (Stack.fused_input_linears). `gemm_s`: each of the layer's GEMMs' forward
    seconds, by name."""
    slow, chunk = slowdown, (work.tp - 1) / work.tp
    fwd = bwd = 0.0
    for c in work.comms:
        if c.group != "tp":
            continue
        t = c.count * net.collective(c.op, c.backward_bytes, c.group)
        t_f = c.count * net.collective(c.op, c.forward_bytes, c.group)
        g_f = sum(gemm_s.get(name, 0.0) for name in c.forward_gemms)
        g_b = sum(gemm_s.get(name, 0.0) for name in c.backward_gemms)
        fwd += overlapped(t_f, chunk * g_f, slow) if pipelined else t_f
        # a reduction of several separate linears' summed input gradients is not pipelined
        summed = c.after_dgrad and c.input_linears > 1 and not stack.fused_input_linears
        if pipelined and not summed:
            bwd += overlapped(t, chunk * 2.0 * g_b, slow)
        else:
            bwd += overlapped(t, g_b, slow) if stack.tp_wgrad_overlap and c.after_dgrad else t
        if stack.sp_regathers and c.op == "allgather":  # the forward's gather again
            bwd += overlapped(t_f, g_b, slow)
    return fwd, bwd


def amax_reductions(work, net, dtype: str, stack) -> tuple[float, float]:
    """(forward, backward) seconds of the per-tensor amax all-reduces over tensor parallelism
    (Stack.amax_pass: fp8 current scaling, NVFP4). A sequence-parallel input is cast before its
    gather, so every tp rank must use one scale:
    Transformer Engine all-reduces each column-parallel linear's input amax over the tp group
    (set_quantizer_amax_reduction_group, module/linear.py), and in backward each row-parallel
    linear's output-gradient amax; the cast waits for it (quantizer.cpp: allreduce(...)->wait()
    before the scale is computed). One latency-bound all-reduce of one fp32 each."""
    if not stack.amax_pass(dtype):
        return 0.0, 0.0
    one = net.collective("allreduce", 4, "tp")
    ops = [c.op for c in work.comms if c.group == "tp"]
    return one * ops.count("allgather"), one * ops.count("reducescatter")


def launch_bound(device_s: float, kernels: float, stack, gpu, dtensor_ops: float = 0.0) -> float:
    """A pass's time when its host CPU must issue `kernels` kernels (stack.launch_us
    each; eager PyTorch ~16 us) and DTensor dispatches `dtensor_ops` of them
    (gpu.dtensor_op_us each). A GPU runs ahead of the CPU and waits only when the CPU
    falls behind; a CPU device runs the kernels itself, so DTensor's dispatch adds to
    them (a plain op's dispatch is inside the measured kernel times already)."""
    dispatch_s = dtensor_ops * gpu.dtensor_op_us * 1e-6
    if gpu.arch == "cpu":
        return device_s + dispatch_s
    return max(device_s, kernels * stack.launch_us * 1e-6 + dispatch_s)


def _waited(pass_s: float, device_s: float, gpu) -> float:
    """Of a pass's time, what a GPU spends waiting for the host (a CPU device never waits: the
    dispatch is its own work)."""
    return 0.0 if gpu.arch == "cpu" else pass_s - device_s


def head_behind_host(b: PassCost, head_s: float) -> PassCost:
    """A chunk's backward `b` after the output head, whose kernels (output layer and loss,
    `head_s` of device time in all) are long: the host issues them and runs on to the
    backward's kernels while the GPU works through them, so the head fills what would otherwise
    be the backward's waits for the host."""
    hidden = min(head_s, b.host_wait_s)
    return b + PassCost(compute_s=-hidden, host_wait_s=-hidden)


def after_moe_host_sync(fwd_s: float, device_s: float, by_name: dict, work, stack, dtype: str,
                        gpu) -> float:
    """A layer's forward `fwd_s` (`device_s` of it on the GPU) where its MoE dispatch copies the
    experts' token counts to the host and waits for them (Stack.syncs_moe_host): the host loses
    its lead there, so the experts' kernels (their GEMMs and Transformer Engine's casts, as
    te_cast_launches counts them) run no faster than the host issues them, and the GPU idles for
    the launch after the wait. The copy is one launch more. The rest of the pass runs as
    before; the window between two layers' waits is priced as the slower of its device time and
    the host's issue of the experts followed by the device time after them."""
    expert_parallel = any(c.group == "ep" for c in work.comms)
    if not work.routing_kernels or gpu.arch == "cpu" or not stack.syncs_moe_host(expert_parallel):
        return fwd_s
    experts = tuple(g for g in work.gemms if g.name in EXPERT_GEMMS)
    launches = 1 + sum(g.kernels for g in experts) + te_cast_launches(
        replace(work, gemms=experts), stack, dtype)[0] + moe_host_launches(work, stack)[0]
    expert_device = sum(by_name[name].forward_s for name in EXPERT_GEMMS)
    launch_s = stack.launch_us * 1e-6
    return max(fwd_s, launches * launch_s + device_s - expert_device) + launch_s


def moe_host_launches(work, stack) -> tuple[float, float]:
    """(forward, backward) host time of an MoE layer's code beyond the kernels it launches, in
    launches of stack.launch_us: per expert GEMM its grouped linears issue (one per local expert
    and linear forward, two backward: Stack.expert_gemm_host_us), and once per forward
    (Stack.moe_forward_host_us). None where the step replays CUDA graphs (no launch_us)."""
    if not work.routing_kernels or not stack.launch_us:
        return 0.0, 0.0
    gemms = sum(g.kernels for g in work.gemms if g.name in EXPERT_GEMMS)
    per_gemm = stack.expert_gemm_host_us / stack.launch_us
    return gemms * per_gemm + stack.moe_forward_host_us / stack.launch_us, 2 * gemms * per_gemm


def _launches(work, stack, dtype: str) -> tuple[float, float, int]:
    """Kernels of a layer's (forward but its rotary table, backward, attention module's forward):
    each weight GEMM (three for q, k, v where the code keeps them apart; each local expert's where
    the stack does not group them, Gemm.kernels), under autocast each
    weight's 16-bit cast, the attention core (a kernel per context-parallel ring step) and the
    elementwise kernels, and torchao's or Transformer Engine's fp8 casts; backward twice each but
    the casts (one cast of the gradient back, torchao's and TE's their own counts) and an MoE's
    routing where the stack's code was counted (Stack.moe_routing_launches)."""
    split, split_attention = work.split_input_gemms if not stack.fused_input_linears else (0, 0)
    weights = sum(g.kernels for g in work.gemms) + split
    attention_weights = sum(1 for g in work.gemms if g.name in ("qkv", "proj")) + split_attention
    casts = int(work.autocast_casts)
    core = len(work.attention_gemms) + work.cp_steps + 1
    forward = (weights + core + work.elementwise_kernels + work.rope_kernels + work.stream_kernels
               - work.routing_kernels)
    epilogue_f, epilogue_b = work.expert_epilogue_kernels
    fp8 = work.casts
    te_f, te_b, te_attention = te_cast_launches(work, stack, dtype)
    routing_f, routing_b = work.routing_kernels, 2 * work.routing_kernels
    if stack.moe_routing_launches and work.routing_kernels:
        routing_f, routing_b = stack.moe_routing_launches
    host_f, host_b = moe_host_launches(work, stack)
    return (forward + epilogue_f + routing_f + casts * weights + fp8.forward_kernels + te_f
            + host_f,
            2 * forward + epilogue_b + routing_b + casts * weights + fp8.backward_kernels + te_b
            + host_b,
            attention_weights * (1 + casts) + core + work.attention_elementwise_kernels
            + work.attention_casts.forward_kernels + te_attention)


def te_transpose_bytes(work, gpu, stack, dtype: str) -> float:
    """Bytes Transformer Engine's per-tensor fp8 casts write beside their row-wise copy where the
    GPU's fp8 GEMMs take only the TN layout (Hopper): a transposed copy for the backward's GEMMs,
    one byte an element (TE's quantizer.cpp, with_transpose = columnwise_usage &&
    !is_non_tn_fp8_gemm_supported, true from sm100 on; the cast-transpose kernel writes both).
    Block-scaled formats quantize column-wise copies on every GPU (Precision.copies)."""
    p = get_precision(dtype)
    if not (stack.te_quantize_launches and p.quantized and not p.block and gpu.arch == "hopper"):
        return 0.0
    return work.fused_cast_elements * p.element_bytes


def te_cast_launches(work, stack, dtype: str) -> tuple[int, int, int]:
    """(forward, backward, attention module's forward) kernels Transformer Engine launches to cast
    a layer's quantized GEMM operands (Stack.te_quantize_launches): per linear, its input's cast
    (one per expert's rows in a GroupedLinear, but one multi-tensor kernel for all under delayed
    scaling: cast.cpp, multi_tensor_quantize_impl) and in backward its output gradient's, each
    after an amax pass and a scale kernel under current scaling (Float8CurrentScalingQuantizer::
    quantize_impl: nvte_compute_amax, nvte_compute_scale_from_amax, nvte_quantize_v2) or an amax
    pass for NVFP4's tensor scale; for block-scaled formats two scale swizzles per GEMM (one
    multi-tensor kernel each for a grouped one). The router's GEMM stays 16-bit; an MoE layer's
    experts run between TE's Fp8Padding and Fp8Unpadding where the dispatcher did not pad their
    rows (LayerWork.pads_experts, EXPERT_PADDING_KERNELS each pass)."""
    p = get_precision(dtype)
    if not (stack.te_quantize_launches and p.quantized):
        return 0, 0, 0
    amax = stack.amax_pass(dtype)
    per_cast = 1 + (0 if not amax else 1 if p.block else 2)
    delayed = not (p.block or amax)
    swizzles = 2 if p.block else 0
    casts = [(1 if delayed else g.count) * per_cast for g in work.gemms if g.name != "router"]
    padding = EXPERT_PADDING_KERNELS * work.pads_experts
    forward = sum(casts) + swizzles * len(casts) + padding
    backward = sum(casts) + 2 * swizzles * len(casts) + padding
    attention = sum(per_cast + swizzles for g in work.gemms if g.name in ("qkv", "proj"))
    return forward, backward, attention


def stack_layer_work(model, seq_len: int, micro_batch: int, tp: int, cp: int, ep: int, sp: bool,
                     flash: bool, dtype: str, kernels: str, stack, *, zero3: bool = False):
    """layer_work as `stack` runs the layer (layer_code)."""
    return layer_work(model, seq_len, micro_batch, tp, cp, ep, sp, flash, dtype, kernels,
                      layer_code(stack, model, dtype, cp=cp, ep=ep, zero3=zero3))


def layer_code(stack, model, dtype: str, *, cp: int, ep: int, zero3: bool) -> LayerCode:
    """How `stack` runs a layer: its norms' precision, K/V expanded or not, DTensor's
    sequence-parallel relayout copies and fp8 gathers where the stack has them, and under ZeRO-3
    (`zero3`) weights gathered in fp8 where it gathers them so."""
    return LayerCode(norm_fp32=stack.norm_fp32, repeats_kv_heads=stack.kv_repeated(cp),
                     dtensor_sp=stack.tp_dtensor, cp_merge_bytes=stack.cp_merge_bytes,
                     torchao_fp8=stack.torchao_fp8(dtype),
                     quantized_gathers=stack.quantized_gathers(dtype),
                     cast_weight_bytes=4 if stack.fp32_stream(dtype, zero3) else 2,
                     amax_pass=stack.amax_pass(dtype),
                     weights_arrive_fp8=stack.gathers_fp8_weights(dtype, zero3),
                     expert_streams=stack.expert_gemm_streams, fold_experts=stack.folds_experts,
                     rope_ops=_rope_ops(stack, model),
                     pads_experts=stack.te_quantize_launches and stack.moe_dispatch == "alltoall",
                     sorts_experts=stack.sorts_experts(ep),
                     fp32_stream=stack.fp32_stream(dtype, zero3),
                     eager_expert_epilogue=stack.runs_eager_expert_epilogue)


def _rope_ops(stack, model) -> RopeOps | None:
    """The rotary `stack` runs op by op though it fuses or compiles the rest, if any: Megatron's
    unfused RoPE where a YaRN concentration factor rules out the fused one, a complex rotary."""
    if stack.rope_fusion_plain_only and model.rope_mscale != 1:
        return MEGATRON_UNFUSED_ROPE
    if stack.rotary == "complex":
        return COMPLEX_ROPE
    return REAL_FP32_ROPE if stack.rotary == "real_fp32" and stack.elementwise == "eager" else None


@dataclass(frozen=True)
class Kernel:
    """One kernel (or a group of like kernels) of a layer, for one micro-batch on one rank."""
    name: str
    kind: str  # "gemm", "attention" or "memory" (memory-bound)
    detail: str  # its shape, or what it moves
    forward_s: float
    backward_s: float
    forward_flops: float = 0.0  # GEMMs and attention
    forward_bytes: float = 0.0  # memory-bound kernels


def _gemm_shape(g) -> str:
    """m x n x k, and for several GEMMs of the shape their count and how many run at once."""
    shape = f"{g.m}x{g.n}x{g.k}"
    if g.count == 1:
        return shape
    at_once = " grouped" if g.together >= g.count else (
        f" {g.together} at once" if g.together > 1 else " one by one")
    return f"{shape} x{g.count}{at_once}"


# the kernel table's rows of elementwise ops (what op-level recompute runs again beside its GEMMs):
# the layer's own, an fp32 stream's and a rotary's run op by op
ELEMENTWISE, FP32_STREAM, OP_BY_OP_ROPE = "elementwise", "fp32 stream", "rope (op by op)"
ELEMENTWISE_ROWS = (ELEMENTWISE, FP32_STREAM, OP_BY_OP_ROPE)


def _memory_kernel(name: str, detail: str, nbytes: tuple[float, float],
                   kernels: tuple[int, int], gpu) -> Kernel:
    """A row of memory-bound kernels that move `nbytes` (forward, backward) in `kernels`."""
    return Kernel(name, "memory", detail, memory_bound_time(nbytes[0], gpu, kernels[0]),
                  memory_bound_time(nbytes[1], gpu, kernels[1]), forward_bytes=nbytes[0])


def _dropped(work) -> str:
    """What --explain's attention row adds where the kernel drops out."""
    return ", dropout" if work.attention_dropout else ""


def _dropout(work, gpu, backward: bool) -> float:
    """The fused attention's slowdown from its dropout, where the layer has it."""
    return (attention_dropout_factor(gpu, work.attention_head_dims, backward)
            if work.attention_dropout else 1.0)


def layer_kernels(work, gpu, dtype: str, stack) -> tuple[Kernel, ...]:
    """The layer's device work for one micro-batch as `stack` runs it: each weight GEMM (its
    backward runs the input- and weight-gradient GEMMs), the attention core, the memory-bound
    kernels (twice the traffic in backward, but the copies of the routed experts' rows: as much),
    DTensor's relayout copies and autocast's casts of the weight gradients. Host launch time and
    collectives are layer_cost's."""
    back = backward_gemm_factor(gpu, dtype)
    out = [Kernel(g.name, "gemm", _gemm_shape(g), t, back * t, forward_flops=g.flops)
           for g in work.gemms for t in (gemm_time(g, gpu, dtype),)]
    if work.attention_gemms:
        attn_f = sum(gemm_time(g, gpu, dtype) for g in work.attention_gemms)
        attn_f += memory_bound_time(work.softmax_bytes, gpu, 2)
        out.append(Kernel("attention", "attention", "unfused: QK^T, softmax, AV", attn_f,
                          2.0 * attn_f,
                          forward_flops=sum(g.flops for g in work.attention_gemms)))
    elif measured := attention_from_table(gpu, dtype, work.attention_shape, stack.attention):
        bh, tokens, head_dim = work.attention_shape
        forward, backward = measured
        detail = f"measured: {bh} x {tokens} x {head_dim}{_dropped(work)}"
        out.append(Kernel("attention", "attention", detail,
                          forward * _dropout(work, gpu, False),
                          backward * _dropout(work, gpu, True),
                          forward_flops=work.flash_attention_flops))
    else:
        windowed, window_keys = work.windowed_attention
        attn_f = (flash_attention_time(work.flash_attention_flops - windowed, gpu, dtype,
                                       stack.attention, work.attention_keys, work.cp_steps + 1)
                  + flash_attention_time(windowed, gpu, dtype, stack.attention, window_keys))
        # at head dims other than 128 the softmax's share of the time differs
        heads = work.attention_head_dims
        detail = f"fused ({stack.attention}{_dropped(work)})"
        out.append(Kernel("attention", "attention", detail,
                          attn_f * attention_softmax_factor(gpu, heads, False)
                          * _dropout(work, gpu, False),
                          attention_backward_factor(gpu, stack.attention) * attn_f
                          * attention_softmax_factor(gpu, heads, True) * _dropout(work, gpu, True),
                          forward_flops=work.flash_attention_flops))
    transposes = te_transpose_bytes(work, gpu, stack, dtype)
    elem_bytes = work.elementwise_bytes + transposes
    elem_f = memory_bound_time(elem_bytes, gpu, work.elementwise_kernels)
    detail = f"{work.elementwise_kernels} kernels"
    if work.fused_cast_bytes:
        detail += f", {(work.fused_cast_bytes + transposes) / elem_bytes:.0%} casts"
    out.append(Kernel(ELEMENTWISE, "memory", detail, elem_f, 2.0 * elem_f,
                      forward_bytes=elem_bytes))
    if work.expert_copy_kernels:  # each copy's backward is the inverse copy
        copy_s = memory_bound_time(work.expert_copy_bytes, gpu, work.expert_copy_kernels)
        out.append(Kernel("expert row copies", "memory", f"{work.expert_copy_kernels} kernels",
                          copy_s, copy_s, forward_bytes=work.expert_copy_bytes))
    if any(work.expert_epilogue_kernels):
        n_f, n_b = work.expert_epilogue_kernels
        out.append(_memory_kernel("expert epilogue (eager)", f"{n_f} + {n_b} kernels",
                                  work.expert_epilogue_bytes, (n_f, n_b), gpu))
    if work.stream_kernels:
        out.append(_memory_kernel(FP32_STREAM, f"autocast, {work.stream_kernels} casts",
                                  work.stream_bytes, (work.stream_kernels,) * 2, gpu))
    if work.rope_kernels:
        out.append(_memory_kernel(OP_BY_OP_ROPE, f"{work.rope_kernels} kernels more",
                                  work.rope_bytes, (work.rope_kernels,) * 2, gpu))
    if work.relayout_copies:
        out.append(_memory_kernel("dtensor relayout", f"{work.relayout_copies} copies",
                                  work.relayout_bytes, (work.relayout_copies,) * 2, gpu))
    casts = work.casts
    if casts.forward_kernels:
        out.append(_memory_kernel("fp8 casts", "torchao",
                                  (casts.forward_bytes, casts.backward_bytes),
                                  (casts.forward_kernels, casts.backward_kernels), gpu))
    if work.autocast_casts:
        nbytes = AUTOCAST_GRAD_BYTES * work.weight_elements
        out.append(Kernel("gradient casts", "memory", "autocast", 0.0,
                          memory_bound_time(nbytes, gpu, 0)))
    return tuple(out)


def strategy_layer_work(model, job, s):
    """stack_layer_work of one layer as strategy `s` runs it."""
    return stack_layer_work(model, job.seq_len, s.micro_batch, s.tp, s.cp, s.ep, s.sp,
                            s.flash, job.dtype, s.elementwise, s.profile,
                            zero3=s.shards_parameters)


def strategy_head_work(model, job, s):
    """head_work of the output layer and loss as strategy `s` runs them."""
    return head_work(model, job.seq_len, s.micro_batch, s.tp, s.cp, s.sp, job.dtype, s.loss_kind,
                     s.profile.loss_parallel)


def _cp_exposed(work, net, stack, attn_f: float, attn_b: float,
                slow: float) -> tuple[float, float]:
    """(forward, backward) context-parallel communication left exposed. A ring of point-to-point
    transfers (Transformer Engine) overlaps each step's K/V with the step's attention; backward
    moves K/V and dK/dV. torch's rotaters all-gather every K/V chunk at once, in forward and
    again in backward, behind only the local chunk's attention, and pass the dK/dV accumulators
    on after every backward step in fp32 (_templated_ring_attention_backward: convert_to_f32,
    an all-to-all per step), the last one waited for at once. Where the stack's compiled block
    waits for each transfer as it is issued (Stack.cp_waits_at_issue), nothing hides."""
    if not work.cp_steps:
        return 0.0, 0.0
    ring = work.cp_steps * net.ring_shift(work.cp_kv_chunk_bytes, "cp")
    if not ring:
        return 0.0, 0.0
    if not stack.cp_kv_allgather:
        return overlapped(ring, attn_f, slow), overlapped(2 * ring, attn_b, slow)
    chunks = work.cp_steps + 1
    gathered = net.collective("allgather", chunks * work.cp_kv_chunk_bytes, "cp")
    dkv = net.ring_shift(2 * work.cp_kv_chunk_bytes, "cp")
    if stack.cp_waits_at_issue:
        return gathered, gathered + chunks * dkv
    step_b = attn_b / chunks
    return (overlapped(gathered, attn_f / chunks, slow),
            overlapped(gathered, step_b, slow)
            + overlapped(work.cp_steps * dkv, work.cp_steps * step_b, slow) + dkv)


def layer_cost(
    work, net, gpu, dtype: str, recompute: str, overlap_tp: bool, stack,
    modules: frozenset[str] = CORE_ATTENTION
) -> tuple[PassCost, PassCost]:
    """(forward, backward) cost of one layer for one micro-batch under `stack` (its
    attention kernel, autocast and kernel-launch rate); backward includes recompute, selective
    recompute's of `modules` (Strategy.selective_modules)."""
    kernels = layer_kernels(work, gpu, dtype, stack)
    by_name = {k.name: k for k in kernels}
    gemm_s: dict[str, float] = {}
    for k in kernels:
        if k.kind == "gemm":
            gemm_s[k.name] = gemm_s.get(k.name, 0.0) + k.forward_s
    attn_f, attn_b = by_name["attention"].forward_s, by_name["attention"].backward_s
    elem_f = sum(by_name[name].forward_s for name in ELEMENTWISE_ROWS if name in by_name)
    relayout_f = by_name["dtensor relayout"].forward_s if "dtensor relayout" in by_name else 0.0
    kernels_f, kernels_b, kernels_attention = _launches(work, stack, dtype)
    # torch tensor parallelism runs every op of the block but the attention kernel on DTensors
    dtensor_f = (
        len(work.gemms) + work.elementwise_kernels if work.tp > 1 and stack.dtensor_dispatch else 0
    )
    _, ep = _comm_times(work, net, tuple(c for c in work.comms if c.group != "tp"), stack)
    slow = gpu.overlap_slowdown
    cp_f, cp_b = _cp_exposed(work, net, stack, attn_f, attn_b, slow)
    tp_f, tp_b = tp_comm_exposed(work, net, gemm_s, overlap_tp, stack, slow)
    amax_f, amax_b = amax_reductions(work, net, dtype, stack)
    tp_f, tp_b = tp_f + amax_f, tp_b + amax_b
    table = stack.table_kernels  # forward only: the table needs no gradient
    # the host issues a pass's kernels while the GPU computes or waits on the pass's exposed
    # collectives (NCCL's kernels queue on the stream like the others), so launches hide behind both
    comm_f, comm_b = tp_f + cp_f + ep, tp_b + cp_b + ep
    fwd_device = sum(k.forward_s for k in kernels)
    fwd_s = max(fwd_device, launch_bound(fwd_device + comm_f, kernels_f + table, stack, gpu,
                                         dtensor_f) - comm_f)
    synced = after_moe_host_sync(fwd_s, fwd_device, by_name, work, stack, dtype, gpu) - fwd_s
    fwd_s += synced
    fwd = PassCost(compute_s=fwd_s, tp_comm_s=tp_f, cp_comm_s=cp_f, ep_comm_s=ep,
                   host_wait_s=_waited(fwd_s, fwd_device, gpu))
    gemm_b = sum(k.backward_s for k in kernels if k.kind == "gemm")
    bwd_device = sum(k.backward_s for k in kernels)
    bwd_s = max(bwd_device, launch_bound(bwd_device + comm_b, kernels_b, stack, gpu,
                                         2 * dtensor_f) - comm_b)
    bwd_wait = _waited(bwd_s, bwd_device, gpu)

    def recomputed(device_s: float, kernels: float, dtensor_ops: float = 0.0) -> PassCost:
        """What a forward run again before the backward adds to it: the host issues both
        (a recomputed kernel at stack.recompute_launch_us) while the GPU runs both, so the
        pair is bound by the slower in sum, not pass by pass."""
        # in launches of stack.launch_us (none where the step replays CUDA graphs)
        as_launches = kernels * stack.recompute_launch_us / stack.launch_us if stack.launch_us \
            else 0.0
        both = max(bwd_device + device_s, launch_bound(
            bwd_device + device_s + comm_b, kernels_b + as_launches, stack, gpu,
            2 * dtensor_f + dtensor_ops) - comm_b)
        waited = _waited(both, bwd_device + device_s, gpu) - bwd_wait
        return PassCost(recompute_s=both - bwd_s, host_wait_s=waited)
    # latency-bound, waited for at the accumulation
    if stack.tp_dtensor and work.replicated_grad_bytes:
        tp_b += net.collective("allreduce", work.replicated_grad_bytes, "tp")
    bwd = PassCost(compute_s=bwd_s, tp_comm_s=tp_b, cp_comm_s=cp_b, ep_comm_s=ep,
                   wgrad_s=gemm_b / 2, host_wait_s=bwd_wait)
    if recompute == "full":  # the recomputed forward waits for its token counts again
        bwd = bwd + recomputed(fwd_device, kernels_f + table, dtensor_f) + PassCost(
            tp_comm_s=tp_f, cp_comm_s=cp_f, ep_comm_s=ep, recompute_s=synced)
    elif recompute == "selective" and stack.selective == "attention":
        # the whole attention module's forward: its projections, core, rotary and layout copies,
        # and the tensor-parallel collectives around it (half the layer's)
        projections = sum(t for name, t in gemm_s.items() if name not in MLP_GEMMS)
        fp8 = work.attention_casts
        again = projections + attn_f + memory_bound_time(
            work.attention_elementwise_bytes + fp8.forward_bytes, gpu,
            work.attention_elementwise_kernels + fp8.forward_kernels)
        bwd = bwd + recomputed(again, kernels_attention + table) + PassCost(
            tp_comm_s=0.5 * tp_f, cp_comm_s=cp_f)
    elif recompute == "selective":
        whole = bool(modules & WHOLE_MLP)  # the MLP, or the MoE layer, runs whole again
        mlp_f = 0.0
        if whole:
            mlp_f = sum(t for name, t in gemm_s.items() if name in MLP_GEMMS) + sum(
                by_name[name].forward_s for name in MLP_MEMORY_ROWS if name in by_name)
        bwd = bwd + _modules_again(work, gpu, dtype, modules, attn_f, mlp_f) + (
            PassCost(tp_comm_s=0.5 * tp_f, ep_comm_s=ep, recompute_s=synced)
            if whole else PassCost())
    # the dropped GEMMs (all of the routed experts'), every elementwise op and the SP all-gathers
    # run again, and the expert-parallel all-to-alls where the policy does not keep their outputs
    elif recompute == "op":
        again = sum(gemm_time(g, gpu, dtype) for g in work.op_recompute_gemms) + elem_f
        bwd = bwd + PassCost(recompute_s=again + 0.5 * relayout_f, tp_comm_s=0.5 * tp_f,
                             ep_comm_s=0.0 if stack.op_saves_all_to_all else ep)
    return fwd, bwd


# the kernel table's memory-bound rows that are an MoE layer's (what recomputing it runs again
# beside its GEMMs and activation)
MLP_MEMORY_ROWS = ("expert row copies", "expert epilogue (eager)")


def _modules_again(work, gpu, dtype: str, modules: frozenset[str], attn_f: float,
                   mlp_f: float) -> PassCost:
    """What the modules Megatron's selective recompute names run again before the backward
    (RECOMPUTE_MODULES): the attention core (checkpoint_core_attention: a fused kernel, or the
    unfused GEMMs and softmax), a latent attention's up-projections, a dense MLP or an MoE layer
    whole (`mlp_f`: their GEMMs and their memory-bound rows; the activation beside them; their
    collectives are the caller's), the shared experts' GEMMs, and the memory-bound norms and
    experts' activation."""
    again = attn_f if "core_attn" in modules else 0.0
    if "mla_up_proj" in modules:
        again += sum(gemm_time(g, gpu, dtype) for g in work.latent_up_gemms)
    if "layernorm" in modules:
        again += memory_bound_time(work.norm_module_bytes, gpu, work.norm_module_kernels)
    whole = bool(modules & WHOLE_MLP)
    if whole:
        again += mlp_f
    elif "shared_experts" in modules:
        again += sum(gemm_time(g, gpu, dtype) for g in work.gemms
                     if g.name in ("shared_up", "shared_down"))
    if whole or "moe_act" in modules:
        again += memory_bound_time(work.mlp_act_bytes, gpu, work.mlp_act_kernels)
    return PassCost(recompute_s=again)


def layer_passes(work, net, gpu, dtype: str, recompute: str, overlap_tp: bool, stack,
                 partial: bool, modules: frozenset[str] = CORE_ATTENTION
                 ) -> tuple[PassCost, PassCost, PassCost]:
    """(forward, backward with `recompute`, backward without it) of one layer per micro-batch:
    a chunk whose layers recompute only in part (`partial`: Strategy.recompute_layers) runs
    both; otherwise the third is the second."""
    fwd, bwd = layer_cost(work, net, gpu, dtype, recompute, overlap_tp, stack, modules)
    if recompute == "none" or not partial:
        return fwd, bwd, bwd
    return fwd, bwd, layer_cost(work, net, gpu, dtype, "none", overlap_tp, stack)[1]


def layers_backward(bwd: PassCost, plain: PassCost, layers: int, recomputed: int) -> PassCost:
    """The backward of `layers` layers of which `recomputed` recompute (layer_passes)."""
    return bwd.scaled(recomputed) + plain.scaled(layers - recomputed)


def head_kernels(work, gpu, dtype: str) -> tuple[float, float, float, float]:
    """Seconds of the output layer's GEMM, its norm and the loss (forward, backward) per
    micro-batch. fp8 recipes keep the output layer in 16 bits: Megatron-Core's output layer is
    not a Transformer Engine module (fp8_autocast wraps the transformer layers only) and
    torchtitan's float8 converter skips `output` (its default filter_fqns)."""
    gemm_f = sum(
        gemm_time(g, gpu, unquantized(dtype)) for g in work.gemms)
    norm_f = memory_bound_time(work.elementwise_bytes, gpu, work.elementwise_kernels)
    loss_f, loss_b = (memory_bound_time(b, gpu, 0) for b in work.loss_bytes)
    return gemm_f, norm_f, loss_f, loss_b


def at_step_power(work, head, layers: int, gpu, dtype: str, stack, recompute: str):
    """`gpu` at the clock its power cap allows a step of `layers` such layers and this head
    (GPUSpec.at_tensor_core_share): the share of a micro-batch's device time spent in GEMMs and
    attention, full recompute's second forward included, judged at the sustained clock (at the
    clock it allows the share is a little smaller: iterating to that fixed point moved execpar's
    H100 runs by 0.3% for three times the work)."""
    if not gpu.burst_gemm_efficiency:
        return gpu
    again = 1.0 if recompute == "full" else 0.0
    kernels = layer_kernels(work, gpu, dtype, stack)
    tensor_core = layers * sum((1 + again) * k.forward_s + k.backward_s for k in kernels
                               if k.kind in ("gemm", "attention"))
    total = layers * sum((1 + again) * k.forward_s + k.backward_s for k in kernels)
    gemm_f, norm_f, loss_f, loss_b = head_kernels(head, gpu, dtype)
    tensor_core += 3 * gemm_f
    total += 3 * (gemm_f + norm_f) + loss_f + loss_b
    return gpu.at_tensor_core_share(tensor_core / total)


def head_cost(work, net, gpu, dtype: str) -> tuple[PassCost, PassCost]:
    """Output layer and loss on the last pipeline stage (head_kernels)."""
    gemm_f, norm_f, loss_f, loss_b = head_kernels(work, gpu, dtype)
    tp, _ = _comm_times(work, net)
    gather, _ = _comm_times(work, net, work.forward_comms)
    return (PassCost(compute_s=gemm_f + norm_f + loss_f, tp_comm_s=tp + gather),
            PassCost(compute_s=2.0 * gemm_f + 2.0 * norm_f + loss_b, tp_comm_s=tp, wgrad_s=gemm_f))
