"""The work of one transformer layer, on one rank, for one micro-batch, under a strategy.

Forward work only; the cost layer derives backward and recompute from it. Sizes are per rank: GEMM
widths divided by tp, tokens divided by cp, experts divided by ep."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from simpar.specs.precision import get_precision
from simpar.specs.stack import TE_CP_MERGE_BYTES, experts_folded
from simpar.workload.fp8_casts import CastWork, torchao_casts


@dataclass(frozen=True)
class Gemm:
    name: str
    m: int  # rows of the activation (tokens)
    n: int  # output features
    k: int  # reduction dimension
    count: int = 1  # independent GEMMs of this shape (batched heads, local experts)
    # of the count, how many run at once, their tiles filling the SMs together: all of them in one
    # batched or grouped kernel (torch.bmm over batch x heads, torch._grouped_mm over experts),
    # a few as separate kernels on parallel streams, or one after another (1)
    together: int = 1

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count

    @property
    def input_elements(self) -> int:
        """Elements of the activation input, rows x contraction, of all `count` GEMMs."""
        return self.m * self.k * self.count

    @property
    def kernels(self) -> int:
        """Kernels the host launches for it: one batched or grouped kernel for all of the count,
        else one each (Transformer Engine's GroupedLinear calls cuBLAS once per expert, a Python
        loop once per expert too)."""
        return 1 if self.together >= self.count else self.count


@dataclass(frozen=True)
class Comm:
    op: str  # allreduce | allgather | reducescatter | alltoall | p2p
    group: str  # tp | cp | ep
    # message size per rank, nccl-tests convention (the full tensor for allreduce)
    size_bytes: float
    count: int = 1
    # A tensor-parallel collective belongs to one linear layer's GEMMs in each pass, and
    # only those can hide it: in forward the GEMM that consumes its gathered input or
    # produces its scattered output (what TP comm overlap pipelines it with); in
    # backward that of the linear whose backward issues it.
    forward_gemms: tuple[str, ...] = ()
    backward_gemms: tuple[str, ...] = ()
    # ... issued in backward after that linear's input-gradient GEMM (a column-parallel
    # linear reducing its input gradient), so its weight-gradient GEMM can run beside
    # it; otherwise it gathers the gradient the input-gradient GEMM needs first (a
    # row-parallel linear under sequence parallelism)
    after_dgrad: bool = False
    # the linears reading its gathered input where a stack's model code keeps them separate
    # (q, k and v; a gated MLP's gate and up): backward sums their input gradients before
    # reducing them (Stack.fused_input_linears)
    input_linears: int = 1
    # what the forward moves where less than size_bytes: a gather of a quantized GEMM input
    # (LayerCode.quantized_gathers); 0: size_bytes
    forward_size_bytes: float = 0.0
    # ... and what the backward moves: a sequence-parallel reduce-scatter's backward gathers the
    # output gradient, quantized where the stack casts it before gathering; 0: size_bytes
    backward_size_bytes: float = 0.0
    # an MoE dispatch's routing, whose size_bytes counts a copy of each token per selected expert
    # (Stack.moe_dispatch prices what a flex dispatcher sends instead); 0: not one
    experts: int = 0
    top_k: int = 0
    # ... chosen from groups_per_token of expert_groups groups (ModelSpec's); 0: any
    expert_groups: int = 0
    groups_per_token: int = 0

    @property
    def forward_bytes(self) -> float:
        return self.forward_size_bytes or self.size_bytes

    @property
    def backward_bytes(self) -> float:
        return self.backward_size_bytes or self.size_bytes


@dataclass(frozen=True)
class LayerWork:
    gemms: tuple[Gemm, ...]  # weight GEMMs (and, without flash attention, the attention GEMMs)
    attention_gemms: tuple[Gemm, ...]  # unfused attention: QK^T and AV as batched GEMMs
    flash_attention_flops: float  # executed FLOPs of a fused attention kernel (causal half skipped)
    elementwise_bytes: float  # memory-bound kernels: norms, residuals, activation, rotary, dropout
    elementwise_kernels: int  # how many such kernels run per layer (launch overhead)
    softmax_bytes: float  # unfused attention softmax (+ dropout): recomputed by selective recompute
    comms: tuple[Comm, ...]  # forward collectives on the critical path (tp, ep)
    # context parallel: KV chunk passed round the ring cp-1 times per forward
    cp_kv_chunk_bytes: float
    cp_steps: int
    # op-level selective recompute (torchtitan): every second GEMM's output is dropped
    # and recomputed
    op_recompute_gemms: tuple[Gemm, ...] = ()
    # selective recompute of latent attention (DeepSeek-V3): the query/key/value
    # up-projections run again
    latent_up_gemms: tuple[Gemm, ...] = ()
    # keys a query tile of the fused attention kernel attends to, on average
    attention_keys: float = 0.0
    # (query-key, value) head dims of the fused attention kernel (its softmax's share of the time)
    attention_head_dims: tuple[int, int] = (128, 128)
    # the fused attention kernel drops out attention probabilities (ModelSpec.dropout)
    attention_dropout: bool = False
    # of flash_attention_flops, those of the sliding-window layers (per layer, weighted by their
    # share), and the keys a query attends to in them, on average (ModelSpec.attention_window)
    windowed_attention: tuple[float, float] = (0.0, 0.0)
    # (sequences x heads, tokens, head dim) of the fused attention where it is one causal kernel
    # over whole sequences at one head dim (no context parallelism, window or latent attention),
    # as a measured table holds it (GPUSpec.attention_table); zeros otherwise
    attention_shape: tuple[int, int, int] = (0, 0, 0)
    # the output layer's loss: memory-bound bytes in forward and in backward
    loss_bytes: tuple[float, float] = (0.0, 0.0)
    tp: int = 1  # tensor-parallel ranks the layer is split over
    # collectives of the forward pass only (the output layer's logits gather)
    forward_comms: tuple[Comm, ...] = ()
    # fp32 gradient bytes of the weights sequence parallelism keeps replicated (the two
    # norms): torch's SequenceParallel all-reduces them over tp in every backward (a
    # DTensor Partial made Replicate)
    replicated_grad_bytes: float = 0.0
    # bytes read and written in forward and in backward by the copies that re-lay out DTensor's
    # sequence-parallel collectives (layer_work's dtensor_sp), and how many copies per pass
    relayout_bytes: tuple[float, float] = (0.0, 0.0)
    relayout_copies: int = 0
    # of elementwise_bytes and _kernels, those of the attention module (rotary, head layout
    # copies): what a recompute of the whole module runs again with its GEMMs and core
    # (Stack.selective)
    attention_elementwise_bytes: float = 0.0
    attention_elementwise_kernels: int = 0
    # of elementwise_kernels, an MoE layer's routing (EAGER/FUSED_MOE_KERNELS)
    routing_kernels: int = 0
    # the routed experts' rows copied into per-expert runs padded for the quantized GEMMs and
    # back (layer_work's pads_experts)
    pads_experts: bool = False
    # bytes and kernels per pass of the copies that only move the routed experts' rows: the
    # padding (pads_experts) and the dispatcher's sorts by local expert (sorts_experts). A copy's
    # backward is the inverse copy, so both passes move these bytes; in neither elementwise_bytes
    # nor _kernels
    expert_copy_bytes: float = 0.0
    expert_copy_kernels: int = 0
    # what the routed experts' eager epilogue moves in forward and in backward (layer_work's
    # eager_expert_epilogue: EXPERT_CLAMP_BYTES, EXPERT_BIAS_BYTES), and its kernels in each; in
    # neither elementwise_bytes nor _kernels
    expert_epilogue_bytes: tuple[float, float] = (0.0, 0.0)
    expert_epilogue_kernels: tuple[int, int] = (0, 0)
    # what Megatron's selective recompute runs again of the memory-bound work
    # (RECOMPUTE_MODULES), forward bytes and kernels, already counted once in the others: the
    # norms that are modules of their own ("layernorm"), and the MLP's activation, the routed
    # experts' in an MoE layer ("moe_act", "mlp", "moe") (layer_work's _recomputable)
    norm_module_bytes: float = 0.0
    norm_module_kernels: int = 0
    mlp_act_bytes: float = 0.0
    mlp_act_kernels: int = 0
    # what a rotary run op by op (LayerCode.rope_ops) moves in forward and in backward beyond the
    # fused kernel's, and its kernels more; in neither elementwise_bytes nor _kernels
    rope_bytes: tuple[float, float] = (0.0, 0.0)
    rope_kernels: int = 0
    # what an fp32 residual stream (LayerCode.fp32_stream) moves in forward and in backward beyond
    # the 16-bit one's, and the casts it launches in each pass; in neither elementwise_bytes nor
    # _kernels
    stream_bytes: tuple[float, float] = (0.0, 0.0)
    stream_kernels: int = 0
    # autocast casts each weight to 16 bits forward and its gradient back to fp32 backward
    # (LayerCode.fp32_stream; FSDP's mixed precision casts the weights itself)
    autocast_casts: bool = False
    # GEMMs more that code keeping q, k, v (and a gated MLP's gate and up) as separate linears
    # launches (Stack.fused_input_linears), of them the attention module's
    split_input_gemms: tuple[int, int] = (0, 0)
    # the fp8 casts torchao's linears run around their GEMMs (Stack.fp8_casts)
    casts: CastWork = CastWork()
    attention_casts: CastWork = CastWork()  # of them, the attention module's projections'
    # of elementwise_bytes, the fused casts of the GEMM inputs (the kernel table shows the share),
    # and the elements they cast
    fused_cast_bytes: float = 0.0
    fused_cast_elements: float = 0.0

    @property
    def weight_elements(self) -> float:
        """Elements of the weights this layer's GEMMs multiply by (one rank's share)."""
        return sum(g.n * g.k * g.count for g in self.gemms)


def act_bytes(dtype: str) -> int:
    """Bytes per activation element: 16-bit but in fp32/tf32 training (quantized only
    inside GEMMs)."""
    return get_precision(dtype).word_bytes


# Eager PyTorch (torchtitan's Llama without torch.compile, Hugging Face models): each
# elementwise op is its own kernel and norms and rotary upcast to fp32. Bytes read +
# written per element, from the op sequences: RMSNorm = cast up (2+4), square (4+4), mean
# (4), scale (4+4), cast down (4+2), weight (2+2) = 36; rotary = cast up (2+4), complex
# multiply (4+4), cast down (4+2) = 20; SwiGLU = silu (2+2) then multiply (4+2) = 10 per
# inner element; attention layout copies of Q, K, V and the output = 4. Fused stacks
# (Megatron-LM, Transformer Engine, torch.compile) read and write each tensor once.
EAGER_NORM_BYTES, EAGER_ROTARY_BYTES, EAGER_SWIGLU_BYTES, EAGER_LAYOUT_BYTES = 36, 20, 10, 4
# In fp32 training the casts up and down vanish (-12 bytes each) and the norm's weight
# is read in fp32 (+4): RMSNorm 28, rotary 8 bytes per element.
EAGER_FP32_NORM_BYTES, EAGER_FP32_ROTARY_BYTES = 28, 8
# The loss's cast of 16-bit logits to fp32 (2 + 4 bytes) and its backward (4 + 2) are
# no-ops on fp32 logits.
LOSS_CAST_BYTES = 6
# A mixture-of-experts layer sends each token's hidden vector to each of its k experts and back:
# forward bytes per routed element (token x choice x hidden element). Eager PyTorch (execpar's
# MoE, torchtitan's eager dispatcher): gather the rows by expert (4 + 4: autocast leaves the
# residual stream, and so the norm's output, in fp32), cast them to 16 bits (4 + 2), gather the
# experts' outputs back into token order (2 + 2), weight them by the router's probabilities into
# fp32 (2 + 4) and sum over the k (4) = 28. Fused (Megatron-Bridge's MoE recipes set
# moe_permute_fusion: Transformer Engine's permute and unpermute-with-probs kernels; a compiled
# block): the permute reads and writes each row once (2 + 2), the unpermute reads it (2) = 6.
# Kernels per layer forward beside the GEMMs (execpar's: top-k, softmax and its casts, two
# sorts, the histogram, the index arithmetic and gathers, the weight casts, the combine; TE's:
# the fused router, permute and unpermute).
EAGER_MOE_ROUTING_BYTES, FUSED_MOE_ROUTING_BYTES = 28, 6
# Quantized grouped GEMMs take each expert's rows in runs of a multiple of 16 (32 for MXFP8):
# Megatron core's TEGroupedMLP copies its input into padded runs with Transformer Engine's
# Fp8Padding and its output back with Fp8Unpadding (fused_multi_row_padding and _unpadding: each
# reads and writes every row once) unless the dispatcher already padded them (core r0.18:
# skip_routed_expert_padding, HybridEP or router padding; r0.15, the 25.11 container's, always
# pads): bytes per 16-bit routed element forward, the input's copy (2 + 2) and the output's (2 + 2),
# in kernels 2 + 1 forward and 1 + 2 backward (experts.py)
EXPERT_PADDING_BYTES, EXPERT_PADDING_KERNELS = 8, 3
# An alltoall dispatch sorts the rows a rank receives by local expert before the experts and back
# into source-rank order after them (Stack.expert_sort: Megatron core's "Permutation 2" and
# "Unpermutation 2", token_dispatcher.py's sort_chunks_by_idxs, Transformer Engine's
# moe_sort_chunks_by_index under moe_permute_fusion; torchtitan's _permute and _unpermute): each
# reads and writes every routed row once, 2 + 2 + 2 + 2 bytes per 16-bit routed element forward;
# rows that reach it in fp32 (autocast leaves the norm's output so: execpar) 4 + 4 on the way in.
# Megatron's flex dispatcher hands the experts their rows in expert order (HybridEP in its dispatch
# kernel, DeepEP in the permute that FUSED_MOE_ROUTING_BYTES counts).
EXPERT_SORT_BYTES, FP32_SORT_BYTES = 8, 4
EXPERT_SORT_KERNELS = 2  # the sort and the unsort, each a pass
# Megatron core's TEGroupedMLP outside Transformer Engine's op fuser (experts.py at d0b3b775, the
# 26.06 container's) finishes a gpt-oss-like expert in eager ops around its fused activation, in
# bytes per 16-bit element (forward, backward):
# - a clamped GLU (ModelSpec.glu_clamp): fused_bias_geglu.py's weighted_bias_quick_geglu_impl
#   clamps each half of fc1's output and concatenates them before its fused kernel: 2 x (2 + 2)
#   + (4 + 4) = 16 per routed row x inner element forward; backward each clamp's masked gradient
#   (2 x (2 + 2 + 2)) and the two joined into fc1's output gradient (4 + 4) = 20;
# - fc2's bias (ModelSpec.bias), weighted by each row's router probability (_apply_bias, expert
#   by expert): the bias times its rows' fp32 probabilities written (4), added to the output
#   (2 + 4 + 4), the experts' rows joined (4 + 4) and cast back (4 + 2) = 28 per routed row x
#   hidden element forward; backward the casts (2 + 4, 4 + 2) and the bias's and the
#   probabilities' gradients, each a product written and summed (4 + 4 + 4, twice) = 36.
# Its saved copy of the clamped input is memory/model.py's. Kernels (forward, backward): the
# clamps and the join (3, 3); the bias's multiply and add per local expert, the join and the
# cast (2 x experts + 2), and backward per expert the cast and the two products and sums
# (5 x experts + 1).
EXPERT_CLAMP_BYTES, EXPERT_BIAS_BYTES = (16, 20), (28, 36)
EAGER_MOE_KERNELS, FUSED_MOE_KERNELS = 24, 6
# elementwise kernels per layer forward, eager with its two norms op by op (EAGER_NORM_KERNELS)
FUSED_KERNELS, EAGER_KERNELS = 8, 36
# layer_work's GEMMs of the MLP (and the MoE router); the others are the attention's projections
MLP_GEMMS = ("router", "mlp_up", "mlp_down", "shared_up", "shared_down")
# of them, an MoE layer's routed experts
EXPERT_GEMMS = ("mlp_up", "mlp_down")
# of those, the attention module's: rotary on q and k (one kernel each fused; eager,
# EAGER_ROTARY_KERNELS a call: the eager count's 16 less its four layout copies, halved; the
# complex multiply's code is 7 ops a call, 3 of them kernels), and the eager code's four layout
# copies
EAGER_ROTARY_KERNELS = 6
FUSED_ATTENTION_KERNELS, EAGER_ATTENTION_KERNELS = 2, 2 * EAGER_ROTARY_KERNELS + 4
# kernels of one RMSNorm (the layer's two, or one over a head's q or k: ModelSpec.qk_norm): one
# fused (Transformer Engine's RMSNorm, a compiled block, torch's nn.RMSNorm on CUDA: Stack.
# norm_fp32 False), eight eager (transformers' Qwen3RMSNorm and torch's composite
# rms_norm alike: cast up, square, mean, add eps, rsqrt, scale, cast down, weight)
FUSED_NORM_KERNELS, EAGER_NORM_KERNELS = 1, 8
# Megatron core's unfused RoPE (rope_utils.py, _apply_rotary_pos_emb_bshd), which a YaRN
# concentration factor forces (ModelSpec.rope_mscale, Stack.rope_fusion_plain_only), per rotated
# 16-bit element. Forward: t * cos (2 + 2), rotate_half's negation of one half (2 per element) and
# its concatenation (2 + 2), * sin (2 + 2), the sum (4 + 2) and the concatenation with the
# unrotated part (2 + 2): 24 bytes. Backward (autograd of those ops): grad * cos and grad * sin
# (4 + 4), the negation (2), the halves reassembled (4), the two branches summed (6) and the
# slice's gradient written into zeros (6): 26. The fused kernel moves 4 and 8. Per call, 6 kernels
# on the tensor and 6 on the frequencies (cos and sin, each scaled and cast).
UNFUSED_ROPE_BYTES, UNFUSED_ROPE_KERNELS = (24, 26), 12
# torchtitan's Llama rotates q and k as complex numbers (apply_rotary_emb: view_as_complex of
# x.float(), a complex multiply, view_as_real, type_as), and inductor generates no code for
# complex operators: compiled, the multiply (and in backward the multiply by the conjugate) stays
# an aten kernel between two compiled casts (torch/_inductor/lowering.py,
# _warn_complex_not_supported: "Torchinductor does not support code generation for complex
# operators. Performance may be worse than eager."; torchtitan issue #15 reports it for that
# rotary). Per rotated 16-bit element, forward and backward alike: the cast up (2 + 4), the
# complex multiply (4 + 4) and the cast down (4 + 2), EAGER_ROTARY_BYTES; in fp32 the multiply
# alone, EAGER_FP32_ROTARY_BYTES; 3 kernels per call.
COMPLEX_ROPE_KERNELS = 3
# execpar's rotary (execpar/model.py, rotary) rotates each pair of channels in fp32, op by op:
# per rotated 16-bit element, forward: two casts up of the whole tensor, one per half it slices
# (2 + 4 each), four multiplies of a half by cos or sin (4 + 4 a half element each), their
# difference and sum (4 + 4 + 4 a half element each), the stack of the two halves (4 + 4) and the
# cast down (4 + 2): 54 bytes in 10 kernels. Backward (autograd of those ops): the cast back up (2
# + 4), the difference's negation (4 + 4 a half element), the four multiplies (4 + 4 a half
# element each), each half's two gradients summed (4 + 4 + 4 a half element each), each half's
# gradient written into zeros the tensor's size (slice_backward: 4 + 4 a half element), the two
# casts down (4 + 2 each) and their sum (2 + 2 + 2): 68. In fp32 the casts are no-ops and that sum
# moves 12: 36 and 56. Counted op by op on a CPU (tests/test_elementwise_audit.py).
REAL_FP32_ROPE_BYTES, REAL_FP32_ROPE_FP32_BYTES, REAL_FP32_ROPE_KERNELS = (54, 68), (36, 56), 10
# An fp32 residual stream (Stack.fp32_stream: autocast over fp32 weights) beside a 16-bit one,
# bytes per hidden element of a token, ab the 16-bit width. Forward: each of the two norms (one
# fused kernel) reads and writes fp32 (2 x (4 - ab) more), each linear a norm feeds casts its
# output (4 + ab; q, k and v and a gated MLP's gate and up: five), and each residual add reads the
# fp32 stream and writes it (4 + ab + 4, where 16-bit it moves 3 ab). Backward: each norm's input-
# and weight-gradient kernels make five fp32 passes (5 x (4 - ab) more), each cast's gradient is
# cast back up (ab + 4), the gradients of a norm's output, one per linear, are summed in fp32 (3 x
# (4 - ab) more a sum, one sum fewer than linears per norm), and so are the stream's two at each
# add. For Llama's block 46 and 80 in all (fp32_stream_bytes); counted op by op on a CPU,
# execpar's block over fp32 weights under autocast against the same over bf16 weights
# (tests/test_elementwise_audit.py).


@dataclass(frozen=True)
class RopeOps:
    """A rotary embedding a fused or compiled stack still runs op by op: bytes per rotated
    element (forward, backward) in 16-bit and in fp32 training, and kernels per call, on q and on
    k, each pass."""
    bytes_16bit: tuple[float, float]
    bytes_fp32: tuple[float, float]
    kernels: int


MEGATRON_UNFUSED_ROPE = RopeOps(UNFUSED_ROPE_BYTES,
                                (2 * UNFUSED_ROPE_BYTES[0], 2 * UNFUSED_ROPE_BYTES[1]),
                                UNFUSED_ROPE_KERNELS)
COMPLEX_ROPE = RopeOps((EAGER_ROTARY_BYTES, EAGER_ROTARY_BYTES),
                       (EAGER_FP32_ROTARY_BYTES, EAGER_FP32_ROTARY_BYTES), COMPLEX_ROPE_KERNELS)
REAL_FP32_ROPE = RopeOps(REAL_FP32_ROPE_BYTES, REAL_FP32_ROPE_FP32_BYTES, REAL_FP32_ROPE_KERNELS)
# Cross entropy over the logits, bytes per logit (forward, backward). "fp32" is
# F.cross_entropy on logits.float(): the cast (2 + 4), softmax's max, sum and output passes (3
# x 4 + 4); backward writes the dense fp32 gradient of the log-probabilities (4),
# log_softmax_backward reads it twice and the output once and writes (16), the cast back (4 +
# 2). "fused" (Megatron's --cross-entropy-loss-fusion, flash_attn's xentropy, a compiled loss)
# reads the 16-bit logits and writes the 16-bit gradient in forward (2 + 2), and backward
# reads it once more where the kernel does not fold it in (2). "chunked" runs the fp32 one
# chunk by chunk under checkpointing: its backward first recomputes the chunk's forward.
LOSS_BYTES = {"fp32": (22.0, 26.0), "chunked": (22.0, 22.0 + 26.0), "fused": (4.0, 2.0)}


def cp_kv_chunk_elements(model, tokens: int, tp: int, repeats_kv_heads: bool) -> int:
    """Elements of the K and V chunk of one rank's `tokens` that a context-parallel ring step
    moves: expanded to the query heads where the model code repeats them, each tp rank its
    heads' share."""
    kv_width = model.q_dim + model.out_dim if repeats_kv_heads else model.kv_dim + model.v_dim
    return tokens * kv_width // tp


# Which sequence-parallel all-gathers of a quantized recipe move the quantized GEMM input (its
# bytes, scales included) rather than 16 bits: "forward", the column-parallel inputs (torchao's
# float8 styles cast before gathering: Stack.torchao_fp8); "all", those, the row-parallel output
# gradients backward gathers, and the inputs it gathers again for the weight gradient
# (Transformer Engine: layernorm_linear.py and linear.py hand their quantizer to
# gather_along_first_dim, or to the userbuffers all-gather, in forward and for the wgrad
# re-gather; base.py's grad_output_preprocess quantizes the output gradient before gathering it);
# the reduce-scatters stay 16-bit
QUANTIZED_GATHERS = ("none", "forward", "all")


@dataclass(frozen=True)
class LayerCode:
    """How a stack's code runs a layer, beyond its shapes and the strategy (cost/layer.py's
    layer_code reads it off a Stack); the defaults are fused kernels with nothing extra."""
    norm_fp32: bool = True  # eager norms compute in fp32 (their casts up and down)
    repeats_kv_heads: bool = False  # K and V expanded to the query heads before attention
    dtensor_sp: bool = False  # DTensor's sequence-parallel relayout copies (_relaid)
    cp_merge_bytes: float = TE_CP_MERGE_BYTES  # a ring step's merge, per output element
    torchao_fp8: bool = False  # torchao's linears cast their own operands (torchao_casts)
    # the sequence-parallel gathers that move quantized GEMM inputs (QUANTIZED_GATHERS)
    quantized_gathers: str = "none"
    cast_weight_bytes: int = 2  # bytes a weight element has before its fp8 cast
    amax_pass: bool = False  # fp8 casts read their input once more for its amax
    weights_arrive_fp8: bool = False  # ZeRO-3 gathers the weights already in fp8
    expert_streams: int | None = 1  # local experts' GEMMs at once (None: all, grouped)
    rope_ops: RopeOps | None = None  # fused kernels but the rotary (RopeOps)
    fold_experts: bool = False  # routed experts whole on each rank under tp
    pads_experts: bool = False  # quantized experts copy rows into padded runs and back
    sorts_experts: bool = False  # the dispatcher sorts rows by local expert and back
    # the residual stream is fp32 (Stack.fp32_stream): so are the norms, their outputs' casts
    # (FP32_STREAM_BYTES) and the rows that reach an MoE's dispatch
    fp32_stream: bool = False
    eager_expert_epilogue: bool = False  # clamped GLU input and fc2's bias in eager ops

    @property
    def qk_norms_fp32(self) -> bool:
        """The norms on q's and k's heads upcast op by op: where the layer's norms do, and over
        an fp32 stream, whose 16-bit q and k meet the norms' fp32 weights, a mismatch for which
        torch's nn.RMSNorm falls back to its composite (layer_norm.cpp, rms_norm_symint)."""
        return self.norm_fp32 or self.fp32_stream


@lru_cache(maxsize=4096)
def layer_work(model, seq_len: int, micro_batch: int, tp: int, cp: int, ep: int, sp: bool,
               flash: bool, dtype: str, kernels: str = "fused",
               code: LayerCode = LayerCode()) -> LayerWork:
    """One layer's work for one micro-batch on one rank, as `code` runs it."""
    tokens = micro_batch * seq_len // cp  # tokens this rank computes
    ab = act_bytes(dtype)
    fold = experts_folded(code.fold_experts, tp, ep) and model.is_moe
    gemms = _layer_gemms(model, tokens, tp, ep, code.expert_streams, fold)
    core = _attention_core(model, seq_len, micro_batch, tokens, tp, cp, flash, ab)
    eager = kernels == "eager"
    # torchao's linears cast their own operands (the casts below); the stack's casts are fused
    cast_elements = 0.0 if code.torchao_fp8 else _fused_cast_elements(gemms, dtype)
    fused_casts = cast_elements * _cast_bytes_per_element(dtype, code.amax_pass)
    elementwise = _elementwise_bytes(model, tokens, tp, cp, sp, dtype, kernels, code) + fused_casts
    experts = _expert_copies(model, gemms, ep, dtype, code)
    comms = _layer_comms(model, tokens, tp, ep, sp, dtype, code, fold)
    routing = 0 if not model.is_moe else EAGER_MOE_KERNELS if eager else FUSED_MOE_KERNELS
    per_norm = EAGER_NORM_KERNELS if eager and code.qk_norms_fp32 else FUSED_NORM_KERNELS
    # eager code whose norms are one kernel each launches 2 x 7 fewer
    fused_norms = 2 * (EAGER_NORM_KERNELS - FUSED_NORM_KERNELS) if eager and not code.norm_fp32 \
        else 0
    qk_norm_kernels = 2 * per_norm if model.qk_norm else 0  # on q and on k
    rope_bytes, rope_kernels = _op_by_op_rope(model, tokens, tp, ab, eager, code)
    split, split_attention = split_input_gemms(model)
    stream_bytes, stream_casts, stream_attention = _fp32_stream(model, tokens, tp, sp, ab, eager,
                                                                code, (split, split_attention))
    attention_bytes = rope_bytes[0] + stream_attention + tokens * _attention_elementwise_per_token(
        model, tp, ab, eager, code.qk_norms_fp32)
    relaid = _relaid(comms, micro_batch) if code.dtensor_sp and sp else []

    def cast_work(of) -> CastWork:
        return torchao_casts(of, {"qkv": 1 + split_attention, "mlp_up": 1 + split -
                                  split_attention}, not eager, code.cast_weight_bytes,
                             tp, sp, cast_weights=not code.weights_arrive_fp8)
    return LayerWork(tuple(gemms), core.gemms, core.flash_flops, elementwise,
                     (EAGER_KERNELS - fused_norms if eager else FUSED_KERNELS) + routing
                     + qk_norm_kernels,
                     core.softmax_bytes, tuple(comms),
                     cp_kv_chunk_elements(model, tokens, tp, code.repeats_kv_heads) * ab
                     if cp > 1 else 0.0, cp - 1,
                     op_recomputed(model, tokens, tp, ep, code.expert_streams, fold),
                     tuple(g for g in gemms if g.name in ("wq_b", "wkv_b")), core.keys_per_query,
                     windowed_attention=core.windowed, tp=tp,
                     attention_shape=_table_shape(model, seq_len, micro_batch, tp, cp, flash),
                     attention_head_dims=(model.head_dim + model.rope_head_dim, model.v_head_dim),
                     attention_dropout=model.dropout and not core.gemms,
                     replicated_grad_bytes=2 * model.hidden * 4 if sp and tp > 1 else 0.0,
                     relayout_bytes=(sum(2 * c.forward_bytes * c.count for c in relaid),
                                     sum(2 * c.size_bytes * c.count for c in relaid)),
                     relayout_copies=sum(c.count for c in relaid),
                     attention_elementwise_bytes=attention_bytes,
                     attention_elementwise_kernels=(EAGER_ATTENTION_KERNELS if eager
                                                    else FUSED_ATTENTION_KERNELS)
                     + qk_norm_kernels + rope_kernels + (1 + split_attention) * bool(stream_casts),
                     routing_kernels=routing, rope_bytes=rope_bytes, rope_kernels=rope_kernels,
                     stream_bytes=stream_bytes, stream_kernels=stream_casts,
                     autocast_casts=code.fp32_stream,
                     split_input_gemms=(split, split_attention),
                     casts=cast_work(gemms) if code.torchao_fp8 else CastWork(),
                     attention_casts=(cast_work([g for g in gemms if g.name not in MLP_GEMMS])
                                      if code.torchao_fp8 else CastWork()),
                     fused_cast_bytes=fused_casts, fused_cast_elements=cast_elements,
                     **experts, **_recomputable(model, gemms, tokens, tp, sp, ab,
                                                code.eager_expert_epilogue))


def _elementwise_bytes(model, tokens: int, tp: int, cp: int, sp: bool, dtype: str, kernels: str,
                       code: LayerCode) -> float:
    """Bytes a layer's memory-bound kernels move in forward, but the fused fp8 casts: the
    per-hidden kernels split by tp only with sequence parallel, and under context parallelism
    each ring step's partial output merged into the running one by its log-sum-exp."""
    per_hidden, per_shard = _elementwise_per_token(model, tp, dtype, kernels, code.norm_fp32,
                                                   code.qk_norms_fp32)
    rep = 1.0 / tp if sp else 1.0
    merge = (cp - 1) * model.out_dim / tp * code.cp_merge_bytes if cp > 1 else 0.0
    return tokens * (per_hidden * rep + per_shard + merge)


def _expert_copies(model, gemms, ep: int, dtype: str, code: LayerCode) -> dict:
    """LayerWork's fields for an MoE layer's copies of its routed rows: into padded runs for
    quantized experts, sorted by local expert where a rank holds several, and the eager
    epilogue of a clamped GLU and fc2's bias."""
    ab = act_bytes(dtype)
    pads = code.pads_experts and model.is_moe and get_precision(dtype).quantized
    sorts = code.sorts_experts and model.is_moe and model.experts > ep
    # the rows the routed experts take in (and as many they give out), 16-bit
    routed = sum(g.input_elements for g in gemms if g.name == "mlp_up") * ab / 2
    sort_bytes = EXPERT_SORT_BYTES + FP32_SORT_BYTES * code.fp32_stream
    epilogue_bytes, epilogue_kernels = _expert_epilogue(model, gemms, ab,
                                                        code.eager_expert_epilogue)
    return {"pads_experts": pads,
            "expert_copy_bytes": routed * (EXPERT_PADDING_BYTES * pads + sort_bytes * sorts),
            "expert_copy_kernels": EXPERT_PADDING_KERNELS * pads + EXPERT_SORT_KERNELS * sorts,
            "expert_epilogue_bytes": epilogue_bytes,
            "expert_epilogue_kernels": epilogue_kernels}


def _layer_comms(model, tokens: int, tp: int, ep: int, sp: bool, dtype: str, code: LayerCode,
                 fold: bool) -> list[Comm]:
    """A layer's tensor-parallel collectives and its expert-parallel dispatch and combine."""
    ab = act_bytes(dtype)
    act = tokens * model.hidden * ab
    quantized = tokens * model.hidden * get_precision(dtype).gemm_input_bytes
    gathered = quantized if code.quantized_gathers != "none" else 0.0
    gradients = quantized if code.quantized_gathers == "all" else 0.0
    comms = _tp_comms(model, act, sp, gathered, fold, gradients) if tp > 1 else []
    if ep > 1:  # dispatch and combine: rows that reach the dispatch in fp32 go so, the
        # experts' 16-bit output comes back (per collective, their mean)
        rows = act * (1 + (4 / ab if code.fp32_stream else 1)) / 2
        k_top = model.experts_per_token
        comms.append(Comm("alltoall", "ep", rows * k_top / tp, 2,
                          experts=model.experts, top_k=k_top,
                          expert_groups=model.expert_groups,
                          groups_per_token=model.groups_per_token))
    return comms


def _op_by_op_rope(model, tokens: int, tp: int, ab: int, eager: bool,
                   code: LayerCode) -> tuple[tuple[float, float], int]:
    """((forward, backward) bytes, kernels) of a rotary run op by op (code.rope_ops) beyond what
    the layer's elementwise kernels already price for it, on q and k each: the fused kernel's 2
    and 4 elements' bytes a rotated element in one kernel a call, or in eager code the complex
    multiply's (EAGER_ROTARY_BYTES, twice that backward) in EAGER_ROTARY_KERNELS."""
    ops = code.rope_ops
    if ops is None or not model.rotary_dim:  # learned positions rotate nothing
        return (0.0, 0.0), 0
    rotated = tokens * model.rotary_dim / tp
    eager_bytes = EAGER_FP32_ROTARY_BYTES if ab == 4 else EAGER_ROTARY_BYTES
    priced = (eager_bytes, 2 * eager_bytes) if eager else (2 * ab, 4 * ab)
    fwd, bwd = (max(0.0, b - p) for b, p in
                zip(ops.bytes_fp32 if ab == 4 else ops.bytes_16bit, priced, strict=True))
    kernels = max(0, ops.kernels - (EAGER_ROTARY_KERNELS if eager else 1))
    return (rotated * fwd, rotated * bwd), 2 * kernels


def _fp32_stream(model, tokens: int, tp: int, sp: bool, ab: int, eager: bool, code: LayerCode,
                 split_gemms: tuple[int, int]) -> tuple[tuple[float, float], int, float]:
    """((forward, backward) bytes, casts a pass, the attention module's forward bytes) an fp32
    residual stream (code.fp32_stream) moves beyond a 16-bit one in eager code
    (FP32_STREAM_BYTES), with `split_gemms` (split_input_gemms) input linears more than one
    each; a compiled block casts inside its norms' kernels."""
    if not (code.fp32_stream and eager):
        return (0.0, 0.0), 0, 0.0
    split, split_attention = split_gemms
    linears = 2 + split  # the attention's and the MLP's (or router's) input linears
    fwd, bwd = fp32_stream_bytes(ab, linears)
    elements = tokens * model.hidden * (1.0 / tp if sp else 1.0)
    attention = elements * (1 + split_attention) * (4 + ab)  # its input linears' casts
    return (elements * fwd, elements * bwd), linears, attention


def fp32_stream_bytes(ab: int, linears: int) -> tuple[float, float]:
    """FP32_STREAM_BYTES per hidden element of a token: (forward, backward) with `linears`
    linears fed by the two norms."""
    wide = 4 - ab
    forward = 2 * 2 * wide + linears * (4 + ab) + 2 * 2 * wide
    backward = 2 * 5 * wide + linears * (4 + ab) + (linears - 2) * 3 * wide + 2 * 3 * wide
    return forward, backward


def _expert_epilogue(model, gemms, ab: int,
                     eager: bool) -> tuple[tuple[float, float], tuple[int, int]]:
    """(forward, backward) bytes and kernels of an MoE layer's eager expert epilogue
    (EXPERT_CLAMP_BYTES, EXPERT_BIAS_BYTES) where `eager`."""
    clamped = eager and model.is_moe and model.glu_clamp > 0
    biased = eager and model.is_moe and model.bias
    down = [g for g in gemms if g.name == "mlp_down"]
    if not (clamped or biased) or not down:
        return (0.0, 0.0), (0, 0)
    inner = sum(g.input_elements for g in down) * ab / 2  # routed rows x inner width
    out = sum(g.m * g.n * g.count for g in down) * ab / 2  # routed rows x hidden
    fwd, bwd = (clamp * inner * clamped + bias * out * biased
                for clamp, bias in zip(EXPERT_CLAMP_BYTES, EXPERT_BIAS_BYTES, strict=True))
    local = down[0].count
    return (fwd, bwd), (3 * clamped + (2 * local + 2) * biased,
                        3 * clamped + (5 * local + 1) * biased)


def _recomputable(model, gemms, tokens: int, tp: int, sp: bool, ab: int,
                  eager_epilogue: bool) -> dict:
    """LayerWork's fields for the memory-bound modules Megatron's selective recompute runs again:
    the norms that are modules of their own (a latent attention's input norm, an MoE layer's
    pre-MLP norm), each reading its 16-bit input and writing its output, split by tp only under
    sequence parallelism; and the MLP's activation (the routed experts' in an MoE layer),
    reading fc1's output (both halves of a GLU) and writing fc2's input, with a clamped GLU's
    eager clamps and join before it (EXPERT_CLAMP_BYTES) where the stack runs them
    (`eager_epilogue`)."""
    norms = int(model.is_mla) + int(model.is_moe)
    rep = 1.0 / tp if sp else 1.0
    inner = sum(g.input_elements for g in gemms if g.name == "mlp_down")
    clamped = eager_epilogue and model.is_moe and model.glu_clamp > 0
    reads = 2 if model.gated_mlp else 1
    return {"norm_module_bytes": norms * tokens * 2 * ab * model.hidden * rep,
            "norm_module_kernels": norms,
            "mlp_act_bytes": inner * ab * (reads + 1) + clamped * EXPERT_CLAMP_BYTES[0] * inner
            * ab / 2,
            "mlp_act_kernels": (1 + 3 * clamped) * bool(inner)}


def _experts_together(local: int, streams: int | None) -> int:
    """Of `local` experts' GEMMs of one weight, how many run at once (Stack.expert_gemm_streams):
    all in a grouped kernel (None), else `streams`."""
    return local if streams is None else streams


def _expert_view(tokens: int, tp: int, fold: bool) -> tuple[int, int]:
    """(tokens, tp) a rank's routed experts see: its sequence-parallel slice of the tokens and
    whole experts where they are folded (its ep ranks cut from tp x dp x cp), else every token
    of the tensor-parallel group and experts split over tp."""
    return (tokens // tp, 1) if fold else (tokens, tp)


def _layer_gemms(model, tokens: int, tp: int, ep: int, streams: int | None = 1,
                 fold: bool = False) -> list[Gemm]:
    """The layer's projections and MLP (or experts) on this rank, in the order they run; the
    local experts' GEMMs of a weight `streams` at a time (None: all, one grouped kernel), over
    tp or whole (`fold`, _expert_view)."""
    h, f = model.hidden, model.ffn_hidden
    up = (2 if model.gated_mlp else 1) * f
    if model.is_mla:  # latent projections run one after another
        gemms = [g for g in _projection_gemms(model, tokens, tp) if g.name != "wo"]
    else:
        gemms = [Gemm("qkv", tokens, (model.q_dim + model.kv_dim + model.v_dim) // tp, h)]
    gemms.append(Gemm("proj", tokens, h, model.out_dim // tp))
    if not model.is_moe:
        return gemms + [Gemm("mlp_up", tokens, up // tp, h), Gemm("mlp_down", tokens, h, f // tp)]
    # Balanced routing: each of the e/ep local experts receives tokens*k*ep/e tokens.
    e = model.experts
    routed, etp = _expert_view(tokens, tp, fold)
    per_expert = max(1, routed * model.experts_per_token * ep // e)
    local = e // ep
    together = _experts_together(local, streams)
    gemms += [Gemm("router", tokens, e, h),
              Gemm("mlp_up", per_expert, up // etp, h, local, together),
              Gemm("mlp_down", per_expert, h, f // etp, local, together)]
    # every token, on every rank: one MLP as wide as all shared experts
    if model.shared_experts:
        sf = model.shared_experts * model.shared_ffn_hidden
        gemms += [Gemm("shared_up", tokens, (2 if model.gated_mlp else 1) * sf // tp, h),
                  Gemm("shared_down", tokens, h, sf // tp)]
    return gemms


@dataclass(frozen=True)
class _AttentionCore:
    """Queries of this rank against all keys of the sequence: a flash kernel's FLOPs, or
    unfused attention's two batched GEMMs and the bytes its softmax (and dropout) move."""
    gemms: tuple[Gemm, ...] = ()
    flash_flops: float = 0.0
    softmax_bytes: float = 0.0
    keys_per_query: float = 0.0
    windowed: tuple[float, float] = (0.0, 0.0)  # a sliding window's FLOPs and keys per query


def _attention_core(model, seq_len: int, micro_batch: int, tokens: int, tp: int, cp: int,
                    flash: bool, ab: int) -> _AttentionCore:
    heads_local = model.heads // tp
    if not flash:
        s_q = seq_len // cp
        qk_head = model.head_dim + model.rope_head_dim
        # one baddbmm and one bmm over micro-batch x heads (Megatron's CoreAttention)
        batch = micro_batch * heads_local
        gemms = (Gemm("scores", s_q, seq_len, qk_head, batch, together=batch),
                 Gemm("context", s_q, model.v_head_dim, seq_len, batch, together=batch))
        # fused scale-mask-softmax reads and writes the scores; dropout reads, writes
        # and stores a mask
        softmax = tokens * heads_local * seq_len * (2 * ab + (2 * ab + 1 if model.dropout else 0))
        return _AttentionCore(gemms=gemms, softmax_bytes=softmax)
    # scores over q_dim, the weighted sum over out_dim; causal: the kernel skips masked blocks,
    # so a query attends to half the keys on average; with context parallelism each of the cp
    # ring steps is a separate kernel over one (load-balanced) chunk of them
    width = (model.q_dim + model.out_dim) / tp
    flops, windowed = 0.0, (0.0, 0.0)
    for share, span in model.attention_spans(seq_len):
        if span < seq_len:  # a window: the first queries see fewer keys than it holds
            keys = span - span * span / (2.0 * seq_len)
            windowed = (share * 2.0 * tokens * keys * width, keys)
            flops += windowed[0]
        else:
            flops += share * 0.5 * 2.0 * tokens * seq_len * width
    return _AttentionCore(flash_flops=flops, keys_per_query=seq_len / (2 * cp), windowed=windowed)


def _table_shape(model, seq_len: int, micro_batch: int, tp: int, cp: int,
                 flash: bool) -> tuple[int, int, int]:
    """LayerWork.attention_shape."""
    whole = (flash and cp == 1 and not model.is_mla and not model.rope_head_dim
             and model.v_head_dim == model.head_dim)
    if not whole or any(span < seq_len for _, span in model.attention_spans(seq_len)):
        return (0, 0, 0)
    return (micro_batch * (model.heads // tp), seq_len, model.head_dim)


def split_input_gemms(model) -> tuple[int, int]:
    """(all, attention's): q, k and v as three launches, not one; a dense gated MLP's gate and up
    as two. Latent attention's projections and MoE's experts are counted one by one already."""
    attention = 0 if model.is_mla else 2
    return attention + (1 if model.gated_mlp and not model.is_moe else 0), attention


def _relaid(comms: list[Comm], micro_batch: int) -> list[Comm]:
    """The sequence-parallel collectives DTensor copies into place. It shards the sequence, dim 1
    of torch's [batch, seq, hidden] activations, while the collectives gather and scatter along
    dim 0: each reduce-scatter's input is re-laid out by a copy, and each all-gather's output too
    unless the micro-batch is one sequence (a view then) (torch/distributed/
    _functional_collectives.py: _chunk_or_narrow_cat, _maybe_view_chunk_cat). Megatron's
    [seq, batch, hidden] layout needs neither. Backward mirrors forward, in 16 bits: a gather's
    backward is a reduce-scatter (always copied), a reduce-scatter's a gather."""
    return [c for c in comms if c.group == "tp" and (
        c.op == "reducescatter" or c.op == "allgather" and micro_batch > 1)]


def _tp_comms(model, nbytes: float, sp: bool, gathered_bytes: float = 0.0,
              fold: bool = False, gradient_bytes: float = 0.0) -> list[Comm]:
    """A layer's tensor-parallel collectives, each with the GEMMs it sits beside.
    Sequence parallelism gathers the input of the column-parallel linears (attention in,
    MLP up) and reduce-scatters the output of the row-parallel ones (attention out, MLP
    down); in backward the first reduce-scatter their input gradients and the second
    gather their output gradients. Without it, the row-parallel outputs are all-reduced
    in forward and the column-parallel input gradients in backward. Folded routed experts
    (`fold`) take each rank's own tokens: the MLP's pair stays only for shared experts.
    `gathered_bytes` and `gradient_bytes`: what the forward gathers and the backward's output-
    gradient gathers move where quantized (QUANTIZED_GATHERS); 0: `nbytes`."""
    # the gathered input feeds the latent (or query) and key-value down-projections
    if model.is_mla:
        attn_in = tuple(name for name, n_in, _, _ in model.attention_linears()
                        if n_in == model.hidden)
        n_attn = len(attn_in)
    else:
        attn_in, n_attn = ("qkv",), 3  # q, k and v
    mlp_in: tuple[str, ...] = ("shared_up",) if fold else ("mlp_up", "shared_up")
    mlp_out: tuple[str, ...] = ("shared_down",) if fold else ("mlp_down", "shared_down")
    n_mlp = 2 if model.gated_mlp else 1
    mlp_split = not fold or model.shared_experts > 0
    if not sp:
        return [Comm("allreduce", "tp", nbytes, 1, ("proj",), attn_in, True, n_attn)] + (
            [Comm("allreduce", "tp", nbytes, 1, mlp_out, mlp_in, True, n_mlp)] if mlp_split
            else [])
    return [Comm("allgather", "tp", nbytes, 1, attn_in, attn_in, True, n_attn, gathered_bytes),
            Comm("reducescatter", "tp", nbytes, 1, ("proj",), ("proj",), False,
                 backward_size_bytes=gradient_bytes)] + (
        [Comm("allgather", "tp", nbytes, 1, mlp_in, mlp_in, True, n_mlp, gathered_bytes),
         Comm("reducescatter", "tp", nbytes, 1, mlp_out, mlp_out, False,
              backward_size_bytes=gradient_bytes)] if mlp_split else [])


@dataclass(frozen=True)
class Linear:
    name: str
    n_in: int
    n_out: int
    # over tp: "out" (column parallel), "in" (row parallel) or "none" (whole on every rank)
    split: str
    routed: bool = False  # a routed expert: each token passes through experts_per_token of them


def layer_linears(model) -> tuple[Linear, ...]:
    """One layer's weights in execution order: the attention projections, then w1, w3, w2 (gated) or
    w1, w2 of the routed experts (or the dense MLP) and of the shared experts."""
    out = [Linear(*lin) for lin in model.attention_linears()]
    mlps = [(model.ffn_hidden, model.is_moe)]
    if model.shared_experts:
        mlps.append((model.shared_experts * model.shared_ffn_hidden, False))
    h = model.hidden
    for width, routed in mlps:
        ups = ("w1", "w3") if model.gated_mlp else ("w1",)
        out += [Linear(n, h, width, "out", routed)
                for n in ups] + [Linear("w2", width, h, "in", routed)]
    return tuple(out)


@lru_cache(maxsize=256)  # the memory model asks once per search candidate
def weight_tensors(model, fused_input_linears: bool) -> tuple[int, ...]:
    """Elements of each weight matrix of one layer as the model code holds them: q, k and v in
    one tensor, and a gated MLP's gate and up in one, where the code fuses them
    (Stack.fused_input_linears)."""
    sizes: list[int] = []
    for lin in layer_linears(model):
        if fused_input_linears and lin.name in ("wk", "wv", "w3"):  # into wq and w1
            sizes[-1] += lin.n_in * lin.n_out
        else:
            sizes.append(lin.n_in * lin.n_out)
    return tuple(sizes)


def _projection_gemms(model, tokens: int, tp: int) -> list[Gemm]:
    return [_local_gemm(Linear(*lin), tokens, tp, 1) for lin in model.attention_linears()]


def _local_gemm(lin: Linear, rows: int, tp: int, count: int, together: int = 1) -> Gemm:
    n_out = lin.n_out // tp if lin.split == "out" else lin.n_out
    n_in = lin.n_in // tp if lin.split == "in" else lin.n_in
    return Gemm(lin.name, rows, n_out, n_in, count, together)


def matmul_sequence(model, tokens: int, tp: int, ep: int,
                    streams: int | None = 1, fold: bool = False) -> list[Gemm]:
    """One layer's matmuls on one rank, one per weight, in execution order (layer_linears); routed
    experts run their local share of the tokens, `streams` at a time (None: grouped), over tp or
    whole (`fold`, _expert_view)."""
    routed, etp = _expert_view(tokens, tp, fold)
    rows, count = max(1,
                      routed * model.experts_per_token * ep // model.experts), model.experts // ep
    together = _experts_together(count, streams)
    return [_local_gemm(lin, rows, etp, count, together) if lin.routed
            else _local_gemm(lin, tokens, tp, 1) for lin in layer_linears(model)]


def op_kept(model) -> tuple[bool, ...]:
    """Whether op-level recompute keeps the output of each of layer_linears' matmuls. The policy
    (torchtitan's op SAC, and execpar's _op_level_context after it) counts the plain matmuls in
    execution order, aten.mm, the MoE router's among them (after the attention projections),
    and keeps the odd-numbered ones: wq, wv, w1 and w2 of a Llama layer. Routed experts run as
    torch._grouped_mm, which neither policy counts or saves (torchtitan saves torch's
    partitioner compute-intensive ops, get_default_op_list, and _grouped_mm is not among them;
    torchtitan/distributed/activation_checkpoint.py, and the _op_sac_save_list of its MoE
    models since 2025): backward runs every expert GEMM again."""
    kept, count = [], 0
    n_attention = len(model.attention_linears())
    for i, lin in enumerate(layer_linears(model)):
        count += 1 if i == n_attention and model.is_moe else 0  # the router
        if not lin.routed:
            count += 1
        kept.append(not lin.routed and count % 2 == 1)
    return tuple(kept)


def op_router_kept(model) -> bool:
    """Whether op-level recompute keeps the MoE router's logits (op_kept's count)."""
    return model.is_moe and len(model.attention_linears()) % 2 == 0


def op_recomputed(model, tokens: int, tp: int, ep: int,
                  streams: int | None = 1, fold: bool = False) -> tuple[Gemm, ...]:
    """The matmuls op-level recompute runs again in backward (op_kept): wk, wo and w3 of a
    Llama layer, and all of a MoE layer's routed experts."""
    return tuple(g for g, kept in zip(matmul_sequence(model, tokens, tp, ep, streams, fold),
                                      op_kept(model), strict=True) if not kept)


def _norm_bytes(ab: int, eager: bool, norm_fp32: bool) -> float:
    """Bytes an RMSNorm moves per element: read and written once fused, op by op eager (in fp32
    where `norm_fp32`, EAGER_NORM_BYTES)."""
    if not eager or not norm_fp32:
        return 2 * ab
    return EAGER_FP32_NORM_BYTES if ab == 4 else EAGER_NORM_BYTES


def _attention_elementwise_per_token(model, tp: int, ab: int, eager: bool,
                                     qk_norms_fp32: bool) -> float:
    """Bytes per token of the attention module's memory-bound kernels: rotary on q and k, the
    norms on their heads (ModelSpec.qk_norm; op by op in fp32 where `qk_norms_fp32`), and in
    eager code the copies that lay out its heads."""
    rotary = EAGER_FP32_ROTARY_BYTES if ab == 4 else EAGER_ROTARY_BYTES
    per_token = (rotary if eager else 2 * ab) * model.rotary_dim / tp
    if model.qk_norm:
        per_token += _norm_bytes(ab, eager, qk_norms_fp32) * (model.q_dim + model.kv_dim) / tp
    if eager:
        per_token += (
            EAGER_LAYOUT_BYTES * (model.q_dim + model.kv_dim + model.v_dim + model.out_dim) / tp)
    return per_token


def _elementwise_per_token(model, tp: int, dtype: str, kernels: str, norm_fp32: bool,
                           qk_norms_fp32: bool) -> tuple[float, float]:
    """(bytes on hidden-size tensors, bytes on tp-split tensors) of one layer's memory-bound kernels
    per token: norms, residual adds, an MoE's routing, the MLP activation and rotary (the
    quantized casts apart, _fused_cast_elements). `norm_fp32`: eager norms upcast to fp32 op by op
    (Llama's RMSNorm); otherwise one norm kernel (F.layer_norm, torch's fused RMSNorm); the norms
    on q's and k's heads so where `qk_norms_fp32`."""
    h = model.hidden
    ab = act_bytes(dtype)
    inner = model.ffn_width_per_token / tp
    eager = kernels == "eager"
    per_hidden = 2 * _norm_bytes(ab, eager, norm_fp32) * h  # two norms
    per_hidden += 2 * (3 * ab * h + (h if model.dropout else 0))  # two residual(+dropout) adds
    if model.is_moe:  # each token's hidden vector to its experts and back
        routing = EAGER_MOE_ROUTING_BYTES if eager else FUSED_MOE_ROUTING_BYTES
        per_hidden += model.experts_per_token * routing * h
    if eager and model.gated_mlp:
        per_shard = EAGER_SWIGLU_BYTES * inner
    else:
        per_shard = (3 if model.gated_mlp else 2) * ab * inner  # activation function
    per_shard += _attention_elementwise_per_token(model, tp, ab, eager, qk_norms_fp32)
    return per_hidden, per_shard


def _fused_cast_elements(gemms, dtype: str) -> float:
    """Elements one micro-batch's casts of a layer's GEMM inputs to a quantized precision read:
    each quantized GEMM's input, rows x contraction (the QKV and MLP inputs, the attention output,
    the MLP activation). A routed expert's input is cast where the expert runs, so every one of a
    token's experts_per_token copies is cast (Transformer Engine's GroupedLinear quantizes the
    permuted tokens it receives; Megatron core's HybridEP dispatch sends them in 16 bits,
    fused_a2a.py: "we do not support fp8 dispatch"). The router stays 16-bit."""
    if not get_precision(dtype).quantized:
        return 0.0
    return float(sum(g.input_elements for g in gemms if g.name != "router"))


def _cast_bytes_per_element(dtype: str, amax_pass: bool) -> float:
    """Precision.cast_bytes, and where `amax_pass` one more read for a per-tensor scale first
    (Stack.amax_pass)."""
    precision = get_precision(dtype)
    return precision.cast_bytes + (act_bytes(dtype) if amax_pass and precision.quantized else 0)


@lru_cache(maxsize=1024)
def head_work(model, seq_len: int, micro_batch: int, tp: int, cp: int, sp: bool, dtype: str,
              loss: str = "fp32", loss_parallel: bool = True) -> LayerWork:
    """The output layer and loss on the last stage (the embedding lookup is negligible);
    `loss` is the stack's cross entropy (LOSS_BYTES), vocab-parallel under tp unless not
    `loss_parallel`: then the logits are all-gathered in forward and each rank takes the
    loss over the whole vocabulary."""
    tokens = micro_batch * seq_len // cp
    ab = act_bytes(dtype)
    logits = Gemm("logits", tokens, model.vocab // tp + (model.vocab % tp > 0), model.hidden)
    shards = tp if loss_parallel else 1
    per_logit = tokens * (model.vocab / shards)
    fwd, bwd = LOSS_BYTES[loss]
    # the casts are no-ops on fp32 logits (twice in a chunk's backward)
    if loss != "fused" and ab == 4:
        fwd, bwd = fwd - LOSS_CAST_BYTES, bwd - LOSS_CAST_BYTES * (2 if loss == "chunked" else 1)
    norm = tokens * model.hidden * 2 * ab / (tp if sp else 1)
    comms = (Comm("allgather", "tp", tokens * model.hidden * ab, 1),) if (tp > 1 and sp) else ()
    kernels = 3 if loss == "fused" else 8
    gather = (Comm("allgather", "tp", tokens * model.vocab *
                   ab, 1), ) if tp > 1 and not loss_parallel else ()
    return LayerWork((logits,), (), 0.0, norm, kernels, 0.0, comms, 0.0, 0,
                     loss_bytes=(fwd * per_logit, bwd * per_logit), tp=tp, forward_comms=gather)
