"""Per-rank memory: weights, gradients, optimizer states, activations, in-flight
micro-batches, buffers.

Mixed precision with Adam (Rajbhandari et al. 2020, ZeRO): 2 bytes of 16-bit weights, 2 of gradients
and 12 of fp32 master weights, momentum and variance per parameter, so DDP holds 16 Psi, ZeRO-1 4
Psi + 12 Psi/N, ZeRO-2 2 Psi + 14 Psi/N and ZeRO-3 16 Psi/N. Activations follow Korthikanti et al.
2022 (arXiv:2205.05198), generalised to grouped-query attention and gated MLPs: per layer and token,
tensors that tensor parallelism does not split (norm and GEMM inputs, dropout masks) and those it
does (Q, K, V, the attention output, the MLP inner activations, and without flash attention the a*s
softmax scores of every head), reducing to s*b*h*(34 + 5as/h) for a GPT layer."""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import lru_cache
from typing import NamedTuple

from simpar.specs.precision import get_precision
from simpar.specs.schedule import SCHEDULES
from simpar.specs.stack import LOSS_CHUNK_TOKENS, Stack
from simpar.specs.strategy import CORE_ATTENTION, WHOLE_MLP, split_layers
from simpar.workload.layer import (
    act_bytes,
    cp_kv_chunk_elements,
    layer_linears,
    op_kept,
    op_router_kept,
    split_input_gemms,
    weight_tensors,
)
from simpar.workload.params import chunk_params, linear_weights, multiplied_params, stage_params

GIB = 1024 ** 3
# CUDA context, cuBLAS workspaces and NCCL channel buffers that live outside the PyTorch allocator
# (about 0.5 GiB context + 0.3-0.5 GiB NCCL on A100/H100 as reported by nvidia-smi at start-up).
RUNTIME_RESERVED_GIB = 1.0
# The loss at its peak, bytes per logit. "fp32" (cross_entropy(logits.float())): forward
# holds the 16-bit logits, their fp32 copy and log_softmax's fp32 output (2 + 4 + 4);
# backward holds that output, the fp32 gradient nll_loss writes into it and
# log_softmax_backward's fp32 result (4 + 4 + 4), after the 16-bit logits are gone: 12 at
# the peak. "fused" keeps the 16-bit logits and writes a 16-bit gradient. "chunked" holds
# the 16-bit logits and their gradient, plus one chunk's fp32 temporaries (_buffer_bytes).
LOSS_PEAK_BYTES = {"fp32": 12, "chunked": 4, "fused": 4}
# ... and where Megatron's code runs it (Stack.loss_code "megatron", fused or not): forward holds
# the 16-bit logits and the fp32 copy it turns into the softmax (2 + 4); backward turns that into
# the gradient and casts it to the 16-bit logits' dtype (4 + 2), in the block the freed 16-bit
# logits left
MEGATRON_LOSS_PEAK_BYTES = 6
# Transformer Engine's parallel cross entropy writes the gradient into the 16-bit logits
# (Stack.loss_code "megatron-te", fused)
TE_FUSED_LOSS_PEAK_BYTES = 2
# torch's loss_parallel (DTensor logits sharded over tp, torchtitan's default under tp) takes the
# fp32 loss in its own ops (torch/distributed/tensor/parallel/loss.py): its backward,
# (grad_input + torch.exp(x)) * grad_output, holds the saved log-probabilities, the scattered
# grad_input, exp(x) and their sum at once: 4 + 4 + 4 + 4 bytes per logit (forward peaks lower, at
# 2 + 4 + 4 + 4: the 16-bit logits, their fp32 copy, the shifted logits and their exp).
DTENSOR_LOSS_PARALLEL_PEAK_BYTES = 16
# Bytes per logit the caching allocator keeps reserved beside that peak, under the loss kinds that
# upcast the whole logits ("fp32"): the 16-bit logits, freed after the loss's forward (torchtitan's
# train step `del pred`s them), leave a block that the backward's fp32 tensors, each twice its
# size, cannot use: forward frees the 16-bit logits and their fp32 copy (2 + 4), the first fp32
# gradient fills 4 of those 6 and the next one maps new memory, with or without expandable
# segments. Meta's Llama 3.1 8B runs show it (reports/stack_accuracy.txt, peak memory): four
# context-parallel runs of 32K tokens a rank reserved 84.0-84.5 GiB, 8.7-9.2 above their count
# without it, and this block of 2 x 32,768 x 128,256 bytes is 7.8 GiB of that. So do torchtitan's
# runs on the lent H200 (reports/torchtitan-h200): its four eager runs reserved 2.2-7.0 GiB above
# their peak active bytes, the block 2.0-3.9 GiB of it, leaving a median 2.3% of slack; their
# compiled twins, whose compiled loss never materializes fp32 logits, 0.1-1.3 GiB.
FREED_LOGITS_BYTES = 2
# The caching allocator reserves more than it has allocated at the peak: freed blocks of
# other sizes stay cached and split blocks cannot be merged. GMLake (Guo et al.,
# ASPLOS'24, arXiv:2401.08156) measures 15% of reserved memory on average (up to 33%)
# across LLM training with ZeRO-3, recompute and LoRA, where many tensor sizes interleave;
# a plain step repeats one set of layer shapes, so we take 10%. With expandable segments
# (PyTorch's allocator option, set by torchtitan's and NeMo's launchers) freed pages are
# remapped for any size; what stays is the partly used tail of blocks, taken as 3%. This
# is the search's and `plan`'s safety margin: a strategy fits when its reserved peak does.
ALLOCATOR_FRAGMENTATION = 0.10
EXPANDABLE_FRAGMENTATION = 0.03
# Offloaded activations (--offload-activations) pass through a double buffer on the GPU: one
# layer's being copied while the next one's fills (Transformer Engine's cpu offload,
# AsyncDoubleBufferGroupOffloadHandler; torch's save_on_cpu copies as each tensor is saved)
OFFLOAD_BUFFER_LAYERS = 2


@dataclass(frozen=True)
class MemoryBreakdown:
    """One rank's memory at its peak, on the pipeline stage that needs the most. The allocated
    parts are those alive at that moment: in backward, at the loss (weights, optimizer states,
    gradients where they persist, every in-flight activation, buffers), or in the optimizer
    step (no activations, the optimizer's temporaries instead), whichever is larger."""
    weights_gib: float
    gradients_gib: float
    optimizer_gib: float
    activations_gib: float  # all in-flight micro-batches
    # the loss's logits and temporaries, communication buffers, autocast copies,
    # optimizer temporaries
    buffers_gib: float
    inflight_micro_batches: int
    stage: int  # the pipeline stage that needs the most memory
    # "backward" (at the loss), "backward end" (every gradient beside the experts' copies) or
    # "optimizer" (the step's update)
    peak_phase: str = "backward"
    runtime_gib: float = RUNTIME_RESERVED_GIB  # CUDA context, cuBLAS and NCCL outside the allocator
    fragmentation: float = ALLOCATOR_FRAGMENTATION  # reserved beyond allocated, as a fraction of it
    # reserved, not allocated, at the peak: the sharded gradients the reduce-scatter stream
    # allocated in the last step, freed by zero_grad and cached in that stream's pool, which the
    # default stream's allocations cannot reuse (_stage_peak)
    cached_gradients_gib: float = 0.0
    # reserved, not allocated, at the loss: the freed 16-bit logits (FREED_LOGITS_BYTES)
    cached_logits_gib: float = 0.0

    @property
    def buffers_label(self) -> str:
        if self.peak_phase == "backward":
            return "logits, loss and buffers"
        if self.peak_phase == "backward end":
            return "experts' 16-bit copies"
        return "optimizer temporaries"

    @property
    def peak_allocated_gib(self) -> float:
        """What torch.cuda.max_memory_allocated reports."""
        return (self.weights_gib + self.gradients_gib + self.optimizer_gib + self.activations_gib
                + self.buffers_gib)

    @property
    def fragmentation_gib(self) -> float:
        return self.fragmentation * self.peak_allocated_gib

    @property
    def peak_reserved_gib(self) -> float:
        """What torch.cuda.max_memory_reserved reports: the allocated peak, the allocator's
        cached slack, the gradients cached in the reduce-scatter stream's pool and the freed
        16-bit logits cached at the loss."""
        return (self.peak_allocated_gib + self.fragmentation_gib + self.cached_gradients_gib
                + self.cached_logits_gib)

    @property
    def total_gib(self) -> float:
        """What the device must hold: the reserved peak and the runtime outside the allocator."""
        return self.peak_reserved_gib + self.runtime_gib

    def slack_that_fits(self, limit_gib: float) -> float:
        """The allocator's fragmentation, as a fraction of the allocated peak, at which the
        device would still hold the peak: below zero the allocated peak alone does not fit."""
        return (limit_gib - (self.total_gib - self.fragmentation_gib)) / self.peak_allocated_gib

    def tight_text(self, limit_gib: float) -> str:
        """What a "tight" verdict means for the run, in words."""
        return (f"runs if the allocator's slack stays under {self.slack_that_fits(limit_gib):.0%} "
                f"({self.fragmentation:.0%} expected)")

    def verdict(self, limit_gib: float) -> str:
        """"fits"; "tight": the allocated peak fits, the allocator's expected slack does not (the
        run may go through, or fail on fragmentation); or "does not fit"."""
        if self.total_gib <= limit_gib:
            return "fits"
        return "tight" if self.slack_that_fits(limit_gib) >= 0 else "does not fit"

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d.update(peak_allocated_gib=self.peak_allocated_gib,
                 fragmentation_gib=self.fragmentation_gib, peak_reserved_gib=self.peak_reserved_gib,
                 total_gib=self.total_gib)
        return d


def state_bytes_per_param(dtype: str, stack) -> tuple[int, int, int]:
    """(weight, gradient, optimizer) bytes per parameter for Adam as `stack` keeps them:
    16-bit weights with an fp32 master copy in the optimizer (Megatron, DeepSpeed) or
    fp32 weights cast for compute (FSDP mixed precision, autocast); fp32 or 16-bit
    gradients. fp8 recipes keep 16-bit weights."""
    if get_precision(dtype).wide:
        return 4, 4, 8
    return stack.weight_bytes, stack.grad_bytes, stack.optimizer_state_bytes


def model_states(psi: float, n: int, s, dtype: str, stack) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes for psi parameters sharded over n ranks as
    strategy `s`'s ZeRO stage shards them."""
    return _sharded(psi, n, s, state_bytes_per_param(dtype, stack), dtype)


def _sharded(psi: float, n: int, s, per_param: tuple[int, int, int],
             dtype: str) -> tuple[float, float, float]:
    w, g, o = per_param
    return (psi * w / (n if s.shards_parameters else 1), psi * g / (n if s.shards_gradients else 1),
            psi * o / (n if s.optimizer_zero(dtype) >= 1 else 1))


@dataclass(frozen=True)
class SavedCode:
    """What a stack's code keeps for backward beyond the layer's shapes and the strategy
    (saved_code reads it off a strategy and its Stack); the defaults: fused 16-bit kernels that
    keep the quantized GEMM inputs and nothing extra."""
    norm_fp32: bool = True  # eager norms upcast to fp32 op by op; autograd keeps the fp32 copies
    repeats_kv_heads: bool = False  # attention keeps K and V expanded to the query heads
    # under sequence parallelism the column-parallel GEMMs keep their all-gathered input, not a
    # sequence shard to gather again (torch's SequenceParallel; Stack.sp_regathers False)
    saves_gathered: bool = False
    # > 0: selective recompute checkpoints the whole attention module (Stack.selective
    # "attention"), which keeps only its input, in elements of that many bytes
    attention_input_bytes: int = 0
    # a quantized precision's GEMMs keep their quantized inputs for backward (Transformer Engine;
    # a compiled graph of torchao's), not the 16-bit ones (torchao eager)
    saves_quantized: bool = True
    keeps_dispatched: bool = False  # op-level recompute keeps the all-to-alls' outputs
    # each rank's routed experts take its sequence-parallel slice of the tokens
    # (Strategy.folds_experts), not all of the tensor-parallel group's
    folds_experts: bool = False
    # a clamped GLU's experts keep their clamped input beside fc1's output (Stack.
    # eager_expert_epilogue: the clamps keep their input, the fused activation the joined copy)
    clamps_experts_eagerly: bool = False
    # the residual stream is fp32 (Stack.fp32_stream): the norms keep fp32 inputs, checkpointing
    # keeps an fp32 layer input, and each linear a norm feeds keeps its own 16-bit cast of the
    # norm's fp32 output (autocast casts per call)
    fp32_stream: bool = False


def saved_code(s, dtype: str) -> SavedCode:
    """What strategy `s`'s layer keeps for backward as its stack runs it in `dtype`."""
    prof = s.profile
    return SavedCode(norm_fp32=prof.norm_fp32, repeats_kv_heads=prof.kv_repeated(s.cp),
                     saves_gathered=not prof.sp_regathers,
                     attention_input_bytes=prof.attention_input_bytes(dtype),
                     saves_quantized=not (prof.torchao_fp8(dtype) and not prof.compile),
                     keeps_dispatched=s.ep > 1 and prof.op_saves_all_to_all,
                     folds_experts=s.folds_experts,
                     clamps_experts_eagerly=prof.runs_eager_expert_epilogue,
                     fp32_stream=s.fp32_stream(dtype))


@lru_cache(maxsize=4096)  # a search asks it of every candidate, with few distinct arguments
def activation_bytes_per_token(model, seq_len: int, tp: int, sp: bool, recompute: str, flash: bool,
                               dtype: str, kernels: str = "fused",
                               code: SavedCode = SavedCode(),
                               modules: frozenset[str] = CORE_ATTENTION) -> float:
    """Bytes one layer keeps for backward per token of a micro-batch (per tensor-parallel rank),
    as `code` runs it; `modules`: what selective recompute checkpoints
    (Strategy.selective_modules)."""
    ab = act_bytes(dtype)
    stream = 4 if code.fp32_stream else ab  # the residual stream's bytes an element
    rep = 1.0 / tp if sp else 1.0
    if recompute == "full":
        return stream * model.hidden * rep  # only the layer input
    if recompute == "op":
        return _op_kept_bytes(model, tp, rep, ab, stream, code.keeps_dispatched)
    h, ffn = model.hidden, model.ffn_width_per_token
    mask = 1 if model.dropout else 0
    # quantized recipes keep the quantized (column-wise) copy of each GEMM input for the backward
    gin = get_precision(dtype).gemm_input_bytes if code.saves_quantized else ab
    # norm inputs and two dropout masks, sequence-split under sp; the QKV and MLP inputs too,
    # unless kept gathered
    # eager code over an fp32 stream: the norms keep fp32 inputs, and q, k, v (a dense gated MLP's
    # gate and up) a 16-bit cast each of their norm's output (a compiled block's partitioner
    # chooses what its graph keeps, and its casts fuse into the norms' kernels)
    eager_stream = code.fp32_stream and kernels == "eager"
    norm_input = stream if eager_stream else ab
    unsplit = norm_input * 2 * h + 2 * mask * h
    qkv_input = gin * h
    router_input, routed, mlp_input = _mlp_inputs(model, tp, ab, gin, code.folds_experts)
    if eager_stream:
        split, split_attention = split_input_gemms(model)
        qkv_input += gin * h * split_attention
        mlp_input += gin * h * (split - split_attention)
    # Q, K, V, the attention output (a GEMM input), the MLP's up-projection outputs and
    # down-projection input
    kv = model.q_dim + model.out_dim if code.repeats_kv_heads else model.kv_dim + model.v_dim
    # the attention module's own (its input's GEMM copy above, Q, K, V, its output, rotary's fp32
    # copies and the softmax statistics below): a checkpointed module keeps its input instead
    attention = ab * (model.q_dim + kv) + gin * model.out_dim
    qk_normed = model.q_dim + model.kv_dim if model.qk_norm else 0
    attention += ab * qk_normed  # the q and k heads' norms keep their inputs
    # the MLP's up-projection outputs and down-projection input; eager code's gated activation
    # keeps the activation's output too (the multiply's operand, beside the activation's input)
    gated = 2 + (kernels == "eager") if model.gated_mlp else 1
    ffn_kept = (ab * gated + gin) * ffn
    if code.clamps_experts_eagerly and model.is_moe and model.glu_clamp:
        ffn_kept += 2 * ab * ffn
    sel = modules if recompute == "selective" else frozenset()
    if sel & WHOLE_MLP:  # the MLP, or the MoE layer, keeps only its input
        routed = mlp_input = ffn_kept = 0.0
    if "moe_act" in sel and not sel & {"moe"}:
        # the activation's output, fc2's input, and the eager clamps' copies run again
        ffn_kept -= (gin + 2 * ab * (code.clamps_experts_eagerly and model.glu_clamp > 0)) * (
            model.ffn_hidden * model.experts_per_token)
    if "shared_experts" in sel and not sel & {"moe"}:  # they keep only their (router's) input
        mlp_input = 0.0
        ffn_kept -= (ab * gated + gin) * model.shared_experts * model.shared_ffn_hidden
    if "layernorm" in sel:  # the outputs of the norms that are modules of their own
        if model.is_mla:
            qkv_input = 0.0
        if model.is_moe:
            router_input = mlp_input = 0.0
    # the latents (and their normed copies) are whole on every tensor-parallel rank
    if model.is_mla:
        unsplit += 2 * ab * (model.q_lora_rank + model.kv_lora_rank + model.rope_head_dim)
        if "mla_up_proj" in sel:  # the up-projected Q, K, V run again
            attention -= ab * (model.q_dim + kv)
    # eager norms upcast op by op: autograd keeps their fp32 input and output (the rotary keeps
    # only its cos and sin, or complex frequencies: one table for every layer); over an fp32
    # stream the norms on q's and k's heads do (LayerCode.qk_norms_fp32)
    if kernels == "eager" and code.norm_fp32:
        unsplit += 2 * (4 + 4 - norm_input) * h
    if kernels == "eager" and (code.norm_fp32 or code.fp32_stream):
        attention += (4 + 4 - ab) * qk_normed
    attention += _attention_statistics(model, seq_len, "core_attn" in sel, flash, ab, mask)
    gathered = 1.0 if code.saves_gathered else rep
    mlp = mlp_input * gathered + router_input * rep + routed
    if recompute == "selective" and code.attention_input_bytes:
        return unsplit * rep + mlp + ffn_kept / tp + code.attention_input_bytes * h * rep
    return unsplit * rep + qkv_input * gathered + mlp + (ffn_kept + attention) / tp


def _mlp_inputs(model, tp: int, ab: int, gin: float,
                folds_experts: bool) -> tuple[float, float, float]:
    """(router, routed experts, dense or shared MLP) input bytes a layer keeps per token: a dense
    layer its MLP's GEMM input; an MoE layer the norm's 16-bit output for the router, each routed
    expert its own copy of the token (the grouped GEMM's input: experts_per_token copies,
    quantized where the GEMMs are), on every rank of the tensor-parallel group unless the
    experts are folded, and the shared experts their quantized input (in 16 bits, the
    router's own)."""
    h = model.hidden
    if not model.is_moe:
        return 0.0, 0.0, gin * h
    routed = gin * model.experts_per_token * h * (1.0 / tp if folds_experts else 1.0)
    return ab * h, routed, gin * h if model.shared_experts and gin != ab else 0.0


def _attention_statistics(model, seq_len: int, core_again: bool, flash: bool, ab: int,
                          mask: int) -> float:
    """What attention keeps per token beside Q, K, V and its output: a fused kernel its fp32
    log-sum-exp per head; an unfused one, unless selective recompute regenerates them, its
    softmax output, dropout mask and dropped-out probabilities."""
    if flash:
        return 4 * model.heads
    if core_again:
        return 0.0
    return model.heads * seq_len * (ab + (mask + ab) * mask)


def _op_kept_bytes(model, tp: int, rep: float, ab: int, stream: int,
                   keeps_dispatched: bool) -> float:
    """Op-level recompute keeps the layer input, the outputs of the matmuls op_kept names (wq, wv,
    w1 and w2 of a Llama layer; column-parallel ones split over tp, row-parallel ones as the
    hidden input, latent down-projections whole; no routed expert's), the router's logits where
    it is odd-numbered, the attention output with its fp32 log-sum-exp, and, where
    `keeps_dispatched`, what the expert-parallel dispatch and combine all-to-alls delivered
    (Stack.op_saves_all_to_all): each token's experts_per_token copies, twice."""
    kept = stream * model.hidden * rep  # the layer input, `stream` bytes an element
    for lin, keep in zip(layer_linears(model), op_kept(model), strict=True):
        if keep:
            kept += ab * lin.n_out * {"out": 1.0 / tp, "in": rep, "none": 1.0}[lin.split]
    if op_router_kept(model):
        kept += ab * model.experts
    if keeps_dispatched:
        kept += 2 * ab * model.experts_per_token * model.hidden / tp
    return kept + (ab * model.out_dim + 4 * model.heads) / tp


def _strategy_bytes_per_token(model, job, s, recompute: str = "") -> float:
    """activation_bytes_per_token as strategy `s` and its stack run the layer (with `recompute`
    instead of the strategy's, where given)."""
    return activation_bytes_per_token(model, job.seq_len, s.tp, s.sp, recompute or s.recompute,
                                      s.flash, job.dtype, s.elementwise, saved_code(s, job.dtype),
                                      s.selective_modules(model))


def saved_activation_bytes(model, job, s) -> float:
    """Bytes one layer keeps for backward per micro-batch, on each rank."""
    return _strategy_bytes_per_token(model, job, s) * (s.micro_batch * job.seq_len // s.cp)


def memory_breakdown(model, job, strategy) -> MemoryBreakdown:
    """The peak of the pipeline stage that needs the most (the first, on a tie)."""
    s = strategy
    m = s.micro_batches(job.global_batch)
    per_token = _strategy_bytes_per_token(model, job, s)
    # what backward regenerates of a recomputed layer, alive through that layer's backward
    regenerated = (_strategy_bytes_per_token(model, job, s, "none") - per_token
                   if s.recompute != "none" else 0.0)
    # a search asks this of every candidate: compare the stages' allocated bytes, and build the
    # breakdown of the largest only (fragmentation and runtime are the same on every stage)
    per_param = state_bytes_per_param(job.dtype, s.profile)
    peaks = (_stage_peak(model, job, s, m, stage, layers, n, (per_token, regenerated), per_param)
             for stage, layers, n in _stages_to_price(model.layers, s.pp, s.vpp, m, s.schedule))
    peak = max(peaks, key=_StagePeak.allocated)  # max keeps the first of equal ones
    frag = fragmentation(s.profile)
    return MemoryBreakdown(peak.weights / GIB, peak.gradients / GIB, peak.optimizer / GIB,
                           peak.activations / GIB, peak.buffers / GIB,
                           int(round(peak.inflight)), peak.stage, peak.phase, fragmentation=frag,
                           cached_gradients_gib=peak.cached_gradients / GIB,
                           cached_logits_gib=peak.cached_logits / GIB)


def fragmentation(prof: Stack) -> float:
    """Reserved beyond allocated at the peak, as a fraction of allocated: the allocator's general
    slack, with or without expandable segments."""
    return EXPANDABLE_FRAGMENTATION if prof.expandable_segments else ALLOCATOR_FRAGMENTATION


@lru_cache(maxsize=1024)
def _stages_to_price(layers: int, pp: int, vpp: int, m: int, schedule: str) -> tuple:
    """(stage, layers, in-flight micro-batches) of the stages whose peak can be the largest, in
    stage order. Stages alike in their layer count and in holding the embedding or the output
    layer differ only in their in-flight micro-batches, so only the one of them with the most is
    priced (a search asks this of every candidate, and many share these numbers)."""
    pipe = SCHEDULES[schedule]
    alike: dict[tuple, tuple[int, float]] = {}
    for stage, n_layers in enumerate(split_layers(layers, pp)):
        key = (n_layers, stage == 0, stage == pp - 1)
        n = pipe.inflight_micro_batches(stage, pp, vpp, m)
        if key not in alike or n > alike[key][1]:
            alike[key] = (stage, n)
    by_stage = sorted(alike.items(), key=lambda kv: kv[1][0])
    return tuple((stage, key[0], n) for key, (stage, n) in by_stage)


class _StagePeak(NamedTuple):
    """One stage's allocated peak, in bytes, and when it happens."""
    weights: float
    gradients: float
    optimizer: float
    activations: float
    buffers: float
    inflight: float
    stage: int
    phase: str  # "backward" (at the loss), "backward end" or "optimizer"
    cached_gradients: float = 0.0  # reserved in the reduce-scatter stream's pool, not allocated
    cached_logits: float = 0.0  # the freed 16-bit logits, reserved at the loss, not allocated

    def allocated(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.buffers


def _stage_peak(model, job, s, m: int, stage: int, layers: int, n_inflight: float,
                per_token: tuple[float, float], per_param: tuple[int, int, int]) -> _StagePeak:
    """One stage's peak: in backward (at the loss, or in the backward of the first layer it
    recomputes), at its end (where experts' copies outlive the activations), or in the optimizer
    step, whichever is larger; `per_token`: a layer's activation
    bytes per token (activation_bytes_per_token), kept and regenerated by its recompute;
    `per_param`: (weight, gradient, optimizer) bytes per parameter (state_bytes_per_param)."""
    prof = s.profile
    tokens = s.micro_batch * job.seq_len // s.cp
    dense, expert = stage_params(model, s, stage, layers)
    weights, grads, states = _stage_states(s, dense, expert, per_param, job.dtype)
    if s.keeps_fp32_gradients(job.dtype):  # DeepSpeed's BF16_Optimizer: a whole fp32 copy
        grads += 4 * (dense + expert)
    act, buffers, logits_cached = _stage_activations(model, job, s, m, stage, layers,
                                                     n_inflight, tokens, per_token, per_param[1])
    # error feedback keeps what compression dropped: a gradient copy
    if s.compress in ("powersgd", "topk"):
        buffers += (dense + expert) * per_param[1]
    copies = _autocast_copies(model, job, s, stage, layers, dense, expert)
    buffers += copies
    held, cached = _gradients_at_loss(s, m, grads, dense + expert)
    weight_bytes, grad_bytes, state_bytes = per_param
    step_bytes = prof.optimizer_temp_bytes + prof.step_grad_cast_bytes(weight_bytes, grad_bytes)
    temps = step_bytes * states / state_bytes
    # the same fragmentation and runtime apply to both: the larger allocated peak wins
    # reserved at the loss counts the cached gradients; in the step they are allocated again
    # experts' copies kept for the step outlive the activations: at the end of backward every
    # gradient is there beside them
    end = expert_copies = 0.0
    if copies and prof.step_expert_casts and model.is_moe:
        expert_copies = 2 * expert
        end = grads + expert_copies
    if held + cached + act + buffers >= max(grads + temps, end):
        peak = _StagePeak(weights, held, states, act, buffers, n_inflight, stage, "backward",
                          cached, logits_cached)
    elif end > grads + temps:
        peak = _StagePeak(weights, grads, states, 0.0, expert_copies, 0, stage, "backward end")
    else:
        peak = _StagePeak(weights, grads, states, 0.0, temps, 0, stage, "optimizer")
    # allocated once and kept through the step: beside whichever peak it is
    recv = pipeline_recv_buffers(model, job, s, tokens, stage, m, n_inflight)
    return peak._replace(buffers=peak.buffers + recv)


def _stage_states(s, dense: float, expert: float, per_param: tuple[int, int, int],
                  dtype: str) -> tuple[float, float, float]:
    """A rank's weights, gradients and optimizer states of a stage's `dense` and `expert`
    parameters, each sharded over its own ZeRO group (experts' is ep times smaller)."""
    weights, grads, states = _sharded(dense, s.shard_ranks, s, per_param, dtype)
    w2, g2, o2 = _sharded(expert, s.expert_shard_ranks, s, per_param, dtype)
    weights, grads, states = weights + w2, grads + g2, states + o2
    if s.offload_optimizer:  # fp32 master weights and Adam moments live in host memory
        states = 0.0
    # the stage stays gathered in 16 bits through the step (Strategy.accumulates_unsharded)
    if s.accumulates_unsharded:
        weights += 2 * (dense + expert)
    return weights, grads, states


def _stage_activations(model, job, s, m: int, stage: int, layers: int, n_inflight: float,
                       tokens: int, per_token: tuple[float, float],
                       grad_bytes: int) -> tuple[float, float, float]:
    """Activation bytes of a stage's micro-batches in flight at its backward's peak, the
    buffers beside them (the loss's temporaries or, where larger, the first recomputed layer's
    regenerated activations with context parallelism's ring buffers, and the pipeline outputs
    the stack keeps) and the freed logits cached beside a peak at the loss."""
    kept, regenerated = per_token
    layer_params = (model.dense_params_per_layer / s.tp
                    + model.expert_params_per_layer / (s.ep * s.expert_tp))
    # offloaded layers' activations wait in host memory but those being copied
    off = min(s.offload_activations * s.chunks_per_rank, layers)
    # layers that do not recompute (Strategy.recompute_layers) keep what recompute regenerates
    plain = layers - s.recomputed(layers, s.chunks_per_rank)
    per_layer = kept + regenerated * plain / max(layers, 1)
    act = per_layer * tokens * ((layers - off) * n_inflight + min(off, OFFLOAD_BUFFER_LAYERS))
    buffers, loss, logits_cached = _buffer_bytes(model, job, s, tokens, layer_params,
                                                 stage == 0, stage == s.pp - 1, grad_bytes)
    # the loss's temporaries are freed before backward recomputes its first layer, whose
    # regenerated activations live through its backward beside context parallelism's ring buffers
    ring = cp_ring_backward_bytes(model, job, s, tokens)
    if regenerated * tokens + ring > loss:
        act += regenerated * tokens
        buffers += ring
        logits_cached = 0.0
    else:
        buffers += loss
    buffers += kept_pipeline_outputs(model, job, s, tokens, stage, m, n_inflight)
    return act, buffers, logits_cached


def _autocast_copies(model, job, s, stage: int, layers: int, dense: float,
                     expert: float) -> float:
    """Bytes of the 16-bit weight copies autocast keeps through backward (none where FSDP casts,
    or a compiled block casts inside its graph)."""
    prof = s.profile
    # a compiled block casts inside its graph, without autocast's cache, and recomputes the casts
    # with the block under full recompute (torchtitan on an H200: a compiled 3B run with full
    # checkpointing peaked at the count without copies, its eager twin 5 GiB above)
    graph_casts = prof.compile and s.recompute == "full"
    if not s.fp32_stream(job.dtype) or graph_casts:
        return 0.0
    # each weight's autocast 16-bit copy (FSDP casts itself): autograd saves it for the
    # backward, and autocast's cast cache holds it until the autocast region ends, after the
    # loss: execpar's region is the whole step (execpar/train.py, _step), torchtitan's the
    # forward and the loss (maybe_enable_amp), so full recompute frees none of them (on an
    # H100 and an H200, a 3B run with two micro-batches under full recompute peaked 5.3 GiB
    # above a count without them). The input embedding is looked up, not multiplied:
    # autocast leaves it in fp32, uncopied (unless the output layer multiplies by it, tied)
    own = layers if prof.torchao_fp8(job.dtype) else 0
    return 2 * multiplied_params(model, s, stage == 0, dense, expert, own)


def _gradients_at_loss(s, m: int, grads: float, params: float) -> tuple[float, float]:
    """(held, cached): gradient bytes allocated and cached at the loss of a stage of `params`
    parameters, whose sharded gradients are `grads` bytes."""
    prof = s.profile
    # gradients alive at the loss: a persistent buffer, or the micro-batches already accumulated
    held = grads if (prof.persistent_grads or m > 1) else 0.0
    # sharded gradients are the reduce-scatter's outputs, allocated on its side stream (FSDP1/2,
    # torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py, foreach_reduce): freed by
    # zero_grad(set_to_none) before the next forward, they stay cached in that stream's pool
    cached = grads - held if s.shards_gradients and not prof.persistent_grads else 0.0
    # a stage kept gathered accumulates its gradients whole (and reduce-scatters them into
    # sharded ones once, after the step's last backward)
    if s.accumulates_unsharded:
        live = s.pipeline.live_gradient_share(s.pp, s.vpp, m)
        held = params * prof.grad_reduce_bytes * live if m > 1 else 0.0
        cached = grads
    return held, cached


def kept_pipeline_outputs(model, job, s, tokens: int, stage: int, m: int,
                          n_inflight: float) -> float:
    """Bytes of the stage outputs torch.distributed.pipelining holds until the step ends
    (Stack.pipeline_outputs_kept): on the last stage every micro-batch's logits (the rank's share
    of the vocabulary under loss parallelism), all m by the last loss; on the others, where kept,
    the outputs of the micro-batches forwarded by the stage's peak at its first backward, one
    per model chunk (the rank's share of the sequence under sequence parallelism)."""
    kept = s.profile.pipeline_outputs_kept
    if s.pp == 1 or kept == "none":
        return 0.0
    ab = act_bytes(job.dtype)
    if stage == s.pp - 1:
        return m * tokens * model.vocab / (s.tp if s.profile.loss_parallel else 1) * ab
    if kept == "last":
        return 0.0
    return n_inflight * s.chunks_per_rank * stage_boundary_bytes(model, job, s, tokens)


def stream_element_bytes(s, dtype: str) -> int:
    """Bytes an element of the residual stream takes as strategy `s`'s stack runs it: 4 over an
    fp32 stream (Stack.fp32_stream), the activations' otherwise."""
    return 4 if s.fp32_stream(dtype) else act_bytes(dtype)


def stage_boundary_bytes(model, job, s, tokens: int) -> float:
    """Bytes of one micro-batch's tensor between pipeline stages (an activation or its gradient,
    in the residual stream's precision): the rank's share of the sequence under sequence
    parallelism."""
    return tokens * model.hidden / (s.tp if s.sp else 1) * stream_element_bytes(s, job.dtype)


def cp_ring_backward_bytes(model, job, s, tokens: int) -> float:
    """Bytes torch's ring attention holds through one layer's attention backward under context
    parallelism (Stack.cp_kv_allgather; torch 2.13
    tensor/experimental/_context_parallel/_attention.py, _templated_ring_attention_backward): the
    K and V of every cp rank all-gathered (the rotater's output, and its concatenated input), the
    fp32 accumulators of dQ, dK and dV (convert_to_f32), the concatenated fp32 dK/dV it passes on
    and the one it receives, and a step's own 16-bit gradients. K and V are the ring's chunk
    (cp_kv_chunk_elements: the query heads where the model code expands them, Stack.kv_repeated)."""
    if s.cp == 1 or not s.profile.cp_kv_allgather:
        return 0.0
    q = tokens * model.q_dim // s.tp
    kv = cp_kv_chunk_elements(model, tokens, s.tp, s.profile.kv_repeated(s.cp))
    ab = act_bytes(job.dtype)
    return ab * ((s.cp + 1) * kv + q + kv) + 4 * (q + kv) + 2 * 4 * kv


def pipeline_recv_buffers(model, job, s, tokens: int, stage: int, m: int,
                          n_inflight: float) -> float:
    """Bytes of the receive buffers torch.distributed.pipelining keeps on pipeline rank `stage`
    (Stack.pipeline_recv_buffers): for each model chunk the rank runs, one stage input per
    micro-batch of the step where the chunk is not the model's first, and one output gradient
    per micro-batch where it is not the last; a stage input is the rank's share of the sequence
    under sequence parallelism. The inputs of the `n_inflight` micro-batches in flight are held
    in their buffers already (a chunk computes on the buffer it received into), counted with the
    activations."""
    if s.pp == 1 or not s.profile.pipeline_recv_buffers:
        return 0.0
    last = s.pp * s.chunks_per_rank - 1
    held = 0.0
    for chunk in s.pipeline.rank_chunks(stage, s.pp, s.vpp):
        held += (m - min(m, n_inflight)) if chunk > 0 else 0.0
        held += m if chunk < last else 0.0
    return held * stage_boundary_bytes(model, job, s, tokens)


def _buffer_bytes(model, job, s, tokens: int, layer_params: float, first_stage: bool,
                  last_stage: bool, grad: int) -> tuple[float, float, float]:
    """(communication buffers beside the activations in backward, what is alive at the loss
    only: on the last stage the logits with the loss's temporaries, LOSS_PEAK_BYTES, and
    DeepSpeed's gathered output weight, and what the allocator keeps reserved beside them,
    FREED_LOGITS_BYTES); `grad`: bytes per gradient element."""
    ab = act_bytes(job.dtype)
    # all-gathered / communicated activation of the current layer
    buf, at_loss = 2 * tokens * model.hidden * ab, 0.0
    if s.shards_parameters and not s.accumulates_unsharded:
        # two gathered units (the one in use and the one prefetched) + the unit's unsharded
        # gradients: a layer each, or for DeepSpeed before v0.6, which gathers and reduces
        # weight by weight (Stack.zero3_unit "param"), its largest weight tensor
        unit, gathered = layer_params, 2.0  # bytes per gathered weight element
        if s.profile.zero3_unit == "param":
            unit = max(weight_tensors(model, s.profile.fused_input_linears)) / s.tp
        elif s.profile.gathers_fp8_weights(job.dtype, True):  # the linears arrive in fp8
            fp8 = get_precision(job.dtype).gemm_input_bytes
            gathered -= min(1.0, linear_weights(model, s, 1) / unit) * (2 - fp8)
        buf += 2 * unit * gathered + unit * 2
        # the output layer in use at the loss, gathered. FSDP's root unit holds the embedding with
        # it until the embedding's gradient at the end of backward; DeepSpeed's module hooks free
        # the output weight after its own backward, so it is alive at the loss, not beside the
        # first layer that backward recomputes
        fsdp = s.profile.zero3_unit == "block"
        ends, _ = chunk_params(model, s, 0, first_stage and fsdp, last_stage)
        if fsdp:
            buf += ends * ab
        else:
            at_loss += ends * ab
    elif s.dp * s.cp > 1:  # two gradient buckets in flight, of the size the cost model syncs
        buf += 2 * s.bucket_params(grad) * grad
    if not last_stage:
        return buf, at_loss, 0.0
    kind = s.loss_kind
    # a rank's share of the logits
    vocab = model.vocab / (s.tp if s.profile.loss_parallel else 1)
    per_logit, freed = _loss_peak_bytes(s)
    loss = tokens * vocab * per_logit + at_loss
    if kind == "chunked":
        loss += min(tokens, LOSS_CHUNK_TOKENS) * vocab * LOSS_PEAK_BYTES["fp32"]
    return buf, loss, tokens * vocab * freed


def _loss_peak_bytes(s) -> tuple[float, float]:
    """(allocated, and reserved beside it: FREED_LOGITS_BYTES) bytes per logit at the loss's
    peak, as the stack's code (Stack.loss_code) runs the strategy's loss."""
    kind, code = s.loss_kind, s.profile.loss_code
    if kind == "chunked":
        return LOSS_PEAK_BYTES[kind], 0.0
    if code == "megatron-te" and kind == "fused":
        return TE_FUSED_LOSS_PEAK_BYTES, 0.0
    if code != "torch":
        return MEGATRON_LOSS_PEAK_BYTES, 0.0
    if kind == "fused":
        return LOSS_PEAK_BYTES[kind], 0.0
    if s.tp > 1 and s.profile.loss_parallel and s.profile.tp_dtensor:
        return DTENSOR_LOSS_PARALLEL_PEAK_BYTES, FREED_LOGITS_BYTES
    return LOSS_PEAK_BYTES[kind], FREED_LOGITS_BYTES


# What shrinks each part of a rank's memory, for the one-line refusal of a plan that does not fit:
# ZeRO where the stage in use does not shard the part yet (SHARDED_FROM), else a model split.
REMEDIES = {
    "weights": "shard the weights (--zero 3) or split the model (--tp, --pp)",
    "gradients": "shard the gradients (--zero 2 or 3) or split the model (--tp, --pp)",
    "optimizer states": "shard the optimizer states (--zero 1 or more), split the model (--tp, "
    "--pp) or --offload-optimizer",
    "activations": "recompute more (--recompute selective or full), lower --micro-batch, or split "
    "the sequence (--sp with --tp, --cp)",
    "logits, loss and buffers": "lower --micro-batch, split the vocabulary (--tp) or use a stack "
    "with a fused loss",
    "optimizer temporaries": "shard the optimizer states (--zero 1 or more) or use a fused "
    "optimizer",
}
SHARDED_FROM = {"weights": 3, "gradients": 2, "optimizer states": 1, "optimizer temporaries": 1}
SHARDED_REMEDIES = {
    "weights": "split the model (--tp, --pp) or spread it over more GPUs",
    "gradients": "split the model (--tp, --pp) or spread it over more GPUs",
    "optimizer states": "split the model (--tp, --pp), spread it over more GPUs or "
    "--offload-optimizer",
    "optimizer temporaries": "use a fused optimizer or spread it over more GPUs",
}


def biggest_part(mem: MemoryBreakdown, zero: int = 0) -> tuple[str, float, str]:
    """(name, GiB, what to change) of the largest part of the peak, under ZeRO stage `zero`."""
    parts = {
        "weights": mem.weights_gib, "gradients": mem.gradients_gib,
        "optimizer states": mem.optimizer_gib, "activations": mem.activations_gib,
        mem.buffers_label: mem.buffers_gib
    }
    name = max(parts, key=parts.__getitem__)
    sharded = zero >= SHARDED_FROM.get(name, 4)
    return name, parts[name], (SHARDED_REMEDIES if sharded else REMEDIES)[name]


def does_not_fit(mem: MemoryBreakdown, limit_gib: float, device: str, zero: int = 0) -> str:
    """The fix part of a refusal: how far over `limit_gib` the peak is, its biggest part
    and what to do under ZeRO stage `zero`."""
    name, gib, remedy = biggest_part(mem, zero)
    tight = (f"; the allocated peak fits: it {mem.tight_text(limit_gib)}"
             if mem.verdict(limit_gib) == "tight" else "")
    return (
        f"over {device}'s {limit_gib:.1f} GiB (reserved {mem.peak_reserved_gib:.1f}, of which "
        f"allocator fragmentation {mem.fragmentation_gib:.1f}, + runtime {mem.runtime_gib:.1f})"
        f"{tight}; the biggest part is {name} ({gib:.1f} GiB): {remedy}; --force goes ahead "
        "anyway")
