"""Stack: the software that runs a training step, as the cost and memory models need to know it.

The same strategy on the same GPUs runs different kernels under Megatron-LM, NeMo, torchtitan,
plain PyTorch FSDP, DeepSpeed, MosaicML Composer or execpar: which elementwise ops are fused, which
attention kernel is called, whether the loss upcasts the whole logits tensor to fp32, in which
precision gradients are kept and reduced, how ZeRO-3/FSDP gathers parameters, whether pipeline
sends overlap compute. Each profile below states what its stack does, with where that comes from; a
profile also carries the stack's defaults for what a user leaves unsaid (applied by the command
line, where a flag the user gives always wins). Nothing here is fitted to a measured run."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from simpar.errors import one_of, require
from simpar.specs.names import canonical, normal_form
from simpar.specs.precision import get_precision
from simpar.specs.schedule import SCHEDULES

ATTENTION = ("best", "fa2", "triton", "unfused")
# how Transformer Engine scales per-tensor fp8 (Stack.fp8_current_scaling)
FP8_SCALING = ("delayed", "current")
LOSSES = ("fp32", "chunked", "fused")
# The code behind a stack's loss, which sets what it holds (memory/model.py, _loss_peak_bytes):
# "torch": torch's cross_entropy (on logits.float() for "fp32": log_softmax's output, nll_loss's
#   gradient and log_softmax's gradient are allocated one after another; a compiled or fused
#   kernel keeps the 16-bit logits and writes a 16-bit gradient);
# "megatron": Megatron's vocab_parallel_cross_entropy (tensor_parallel/cross_entropy.py, and
#   mpu/cross_entropy.py in Megatron-LM and Megatron-DeepSpeed before it) turns its fp32 copy of
#   the logits into the softmax it saves and that into the gradient, in place (sub_, exp(out=),
#   div_, mul_), then casts it to the logits' dtype; its fusion (fusions/fused_cross_entropy.py,
#   cross_entropy_fusion_impl "native", Megatron-LM's default) jit-fuses the same steps;
# "megatron-te": the same, but the fused loss is Transformer Engine's parallel cross entropy
#   (cross_entropy_fusion_impl "te", which Megatron-Bridge's performance scripts set,
#   scripts/performance/utils/overrides.py, from Aug 2025): its Triton kernel computes the loss
#   and writes the gradient into the logits themselves (pytorch/triton/cross_entropy.py).
LOSS_CODES = ("torch", "megatron", "megatron-te")
# The chunked loss takes the fp32 cross entropy over this many tokens at a time, each
# chunk under activation checkpointing: only one chunk's fp32 temporaries exist at once
# (execpar/model.py uses the same number).
LOSS_CHUNK_TOKENS = 1024
KERNELS = ("fused", "eager")
# how the stack's linear layers cast their GEMM operands to per-tensor fp8: "fused", Transformer
# Engine's cast kernels, one per GEMM input, fused with the stack's other memory-bound work
# (Precision.cast_bytes); "torchao", torchao's Float8Linear (tensorwise recipe, as torchtitan's
# float8 converter and execpar apply it), whose GEMMs each cast both their operands themselves
# (workload/fp8_casts.py)
FP8_CASTS = ("fused", "torchao")
ZERO3_UNITS = ("block", "bucket", "param")
# what torch.distributed.pipelining keeps of each micro-batch's stage output until the step ends,
# to merge and return them (PipelineStage.output_chunks): "all" stages' before torch's May 2025
# change (pytorch/pytorch#153383 kept them on the last stage only), "last" after it, unless the
# caller passes step(return_outputs=False) (pytorch/pytorch#159251), as execpar does; "none" as
# well for stacks that run their own pipeline (Megatron frees each output once it is sent,
# deallocate_pipeline_outputs)
PIPELINE_OUTPUTS = ("none", "last", "all")
# what --recompute selective checkpoints: "core", the attention core (Megatron's
# checkpoint_core_attention: QK^T, softmax and AV where they are unfused), or "attention", the
# whole attention module, its Q/K/V and output projections and rotary with the core
# (execpar/parallelize.py, apply_recompute: checkpoint_wrapper around block.attention)
SELECTIVE = ("core", "attention")
# how each micro-batch's weight gradients join those of the step's earlier micro-batches:
# "fused": the weight-gradient GEMM adds into the kept fp32 gradient itself (Megatron core's
#   gradient_accumulation_fusion: on unless --no-gradient-accumulation-fusion in Megatron-LM,
#   set by NeMo's performance scripts, scripts/performance/utils/overrides.py; the GEMM is
#   fused_weight_gradient_mlp_cuda's or Transformer Engine's fuse_wgrad_accumulation), no pass
#   of its own;
# "autograd": torch's AccumulateGrad adds the new gradient into .grad in place (read both, write
#   one) for every micro-batch after the first; FSDP2 does the same to its reduce-scattered shard,
#   or to the unsharded gradient it keeps across micro-batches under pipeline parallelism
#   (_fsdp_param.py, accumulate_unsharded_grad_if_needed, in the reduce dtype);
# "hp_copy": DeepSpeed's BF16_Optimizer (bf16 with ZeRO 0/1; the pipeline engine calls its
#   update_hp_grads after every micro-batch's backward) casts each bf16 gradient to fp32 and adds
#   it into the fp32 gradient it keeps: 2 + 4 bytes for the cast, 3 x 4 for the add, on every
#   micro-batch; DeepSpeed's fp16 optimizers accumulate through autograd
GRAD_ACCUMULATION = ("fused", "autograd", "hp_copy")
# when an MoE layer's forward copies its experts' token counts to the host and waits for them
# (Stack.moe_host_sync): "always", Megatron core's dropless dispatchers (token_dispatcher.py at
# 0d8e0714: the alltoall dispatcher synchronizes "before_ep_alltoall" for its splits, or
# "before_finish" without expert parallelism for the grouped GEMM's m_splits; the flex
# dispatcher's HybridEP and DeepEP copy the received counts to the host, fused_a2a.py
# use_host_meta; Megatron's docs/discussions/deepseek-v3-gb200-optimization names this sync as
# what keeps the experts out of CUDA graphs); "with_ep", where only the all-to-all's splits are
# host lists (torch's all_to_all_single: torchtitan's token_dispatcher.py and execpar's model.py
# call .tolist() on them) and the grouped GEMM reads its offsets on the device; "never":
# DeepSpeed's MoE pads each expert to a capacity (static shapes); the fsdp and mosaic stacks'
# MoE code was not read for it
MOE_HOST_SYNCS = ("never", "with_ep", "always")
# How an MoE layer's dispatch and combine move tokens (Stack.moe_dispatch): "alltoall", one copy
# per selected expert (Megatron core's alltoall dispatcher permutes each token top-k times before
# NCCL's all-to-all; torch's all_to_all_single in torchtitan and execpar; DeepSpeed); "flex",
# Megatron core's flex dispatcher on DeepEP or HybridEP: one copy per destination rank inside the
# NVLink domain and one per destination node across it, forwarded over NVLink there (DeepEP's
# is_token_in_rank; NVIDIA's DeepSeek-V3 GB200 guide: it "fuses the global permute into the
# communication kernel, eliminating the need to explicitly copy the tokens top-k times", and
# HybridEP "ensured that there is no redundant communication during data distribution")
MOE_DISPATCHES = ("alltoall", "flex")
# when an MoE layer's alltoall dispatch sorts the rows a rank receives by local expert, and back
# after the experts, where a rank holds more than one (Stack.expert_sort; workload/layer.py,
# EXPERT_SORT_BYTES): "always", with or without expert parallelism (Megatron core's alltoall
# dispatcher, token_dispatcher.py: sort_chunks_by_idxs); "with_ep", after an expert-parallel
# all-to-all, whose rows arrive rank-major (torchtitan's token_dispatcher.py, _permute and
# _unpermute; execpar's model.py, _routed); "never". The flex dispatch hands the experts sorted
# rows.
EXPERT_SORTS = ("never", "with_ep", "always")


def experts_folded(folds: bool, tp: int, ep: int) -> bool:
    """Whether routed experts run whole on each rank of a tensor-parallel group, their ep ranks
    cut from tp x dp x cp: where the stack `folds` them (Stack.folds_experts), with tp to fold
    and experts split over ep (experts not split over ep, as a dense model's one MLP, stay split
    over tp)."""
    return folds and tp > 1 and ep > 1
# the memory passes FSDP adds around its collectives (cost/step.py, fsdp_copy_seconds): "fsdp2":
#   FSDP2 copies each gathered parameter out of the all-gather buffer and each gradient into the
#   reduce-scatter's (torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py), averaging in the
#   collective itself (ReduceOp.AVG for NCCL, _get_gradient_divide_factors); "flat": FSDP1
#   gathers straight into its flat parameter, whose per-parameter views autograd concatenates back
#   into one flat gradient (split_with_sizes' backward), which its post-backward hook casts to the
#   reduce dtype and pre-divides in place (torch/distributed/fsdp/_runtime_utils.py,
#   _post_backward_hook and _reduce_grad: _div_if_needed by _gradient_predivide_factor, > 1 for any
#   world of 2 or more); "none": flat buffers the collectives read and write in place (Megatron,
#   DeepSpeed)
FSDP_COPIES = ("fsdp2", "flat", "none")
# DeepSpeed's stage3_prefetch_bucket_size default (deepspeed/runtime/zero/config.py):
# elements gathered at once.
DEEPSPEED_PREFETCH_BUCKET = 5e7
# DeepSpeed's stage3_max_reuse_distance default (the same file): a module's gathered weights stay
# gathered after it runs when the modules traced before its next use hold fewer elements than this.
DEEPSPEED_MAX_REUSE_DISTANCE = 1e9
# DeepSpeed's stage3_param_persistence_threshold default (zero/constants.py, v0.3.13 on): ZeRO-3
# keeps a parameter of fewer elements whole on every rank between its uses (norms, biases).
DEEPSPEED_PERSISTENCE_THRESHOLD = 1e5

# Ring attention merges each ring step's partial output into the running one by their
# log-sum-exps, bytes moved per output element and step (backward, as every memory-bound pass,
# twice that: its gradient accumulators). Transformer Engine's AttnFuncWithCPAndKVP2P runs one
# jit-fused kernel in the query dtype (flash_attn_fwd_out_correction: read the step's output and
# the running one, write the running one: 2 + 2 + 2); torch's context_parallel _SDPAMerger runs
# eager fp32 ops (_SDPAMerger.step and _merge_one: cast the step's output up 2 + 4, out -
# block_out 4 + 4 + 4, the sigmoid-weighted product 4 + 4, the subtraction 4 + 4 + 4).
TE_CP_MERGE_BYTES, TORCH_CP_MERGE_BYTES = 6, 38

# CPU time to issue one GPU kernel from eager PyTorch: Python module call, ATen dispatch, autocast,
# the autograd bookkeeping, and the backward's engine. The bare dispatcher alone runs ~3.6 us/op
# (H. He, "Making Deep Learning Go Brrrr From First Principles", 2022); a whole training step of
# execpar's Llama at 256 tokens per micro-batch, where the GPU waits for the CPU, issued the
# 10,305 kernels before its optimizer's in 0.161 s on the H200 machine lent here
# (benchmarks/host_bound.py, run b of reports/host-bound-h200). The GPU only waits for the CPU
# when its kernels are shorter than this, i.e. for small models and micro-batches.
EAGER_LAUNCH_US = 15.6
# One bare op from a Python or C++ loop, no module, autocast or autograd around it: the dispatcher
# (~3.6 us, He 2022) and a CUDA launch (~2-3 us, CUDA C programming guide), e.g. the per-rank
# views and copies of a list collective (Stack.per_rank_list_ops)
BARE_OP_US = 8.0
# ... and one that launches nothing (a view: narrow, view): the dispatcher alone (He 2022)
VIEW_OP_US = 3.6
# What a kernel recomputed under torch.utils.checkpoint costs the host on top of its launch: the
# non-reentrant checkpoint's Python hooks on every saved tensor, packed in the first forward,
# unpacked and checked (determinism_check) around the recompute. Full recompute added 4,416
# kernels and 0.285 s to the same step (run a): 64.5 us each, 49 beyond the launch. Megatron's
# and DeepSpeed's reentrant checkpoints run the forward again inside one autograd Function.
CHECKPOINT_HOOK_US = 49.0
# Inductor's generated wrapper calls its kernels from one Python function, with no
# module or autograd bookkeeping per op: about the CUDA launch itself.
COMPILED_LAUNCH_US = 3.0
# Kernels of a Megatron core MoE layer's router and alltoall token dispatcher (moe_router_fusion and
# moe_permute_fusion on, as Megatron-Bridge's recipes set them), read in Megatron core at 0d8e0714
# (the 25.11 container's): the router's forward 9 (the gating GEMM's neighbours: the score
# function's noise clone, fused top-k, fused aux-loss scores and loss, the routing map's sum, the
# tracker), its backward 11 (the aux loss's auto-scaler and fused backwards, the logits' gradient
# add); the dispatcher's forward 16 (preprocess sums and a copy, TE's fused permute and its row map,
# the chunk sort and unsort, the unpermute), its backward 4 (the unpermute's, the two chunk sorts'
# and the permute's).
MEGATRON_MOE_ROUTING_LAUNCHES = (25, 15)
# Host time beyond the kernels counted, read off NVIDIA's profile of a DeepSeek-V3 MoE layer's
# forward on a GB200 (Megatron-LM docs/discussions/deepseek-v3-gb200-optimization, the Nsys
# timeline after HybridEP, images/image7.png; Megatron core and Transformer Engine of late 2025,
# the 25.11 container's; 8 local experts, the attention and router in CUDA graphs): after the
# dispatch the GPU idles while the host issues the experts. Each of the two GroupedLinears
# spends 0.45-0.55 ms from its range's start to its first GEMM and ~0.65 ms in all for 8 experts,
# where its 8 casts, 2 swizzles and 8 GEMMs count 0.28 ms at EAGER_LAUNCH_US: 46 us more per
# expert GEMM, its Python loops over the experts' quantizers, weight workspaces and saved tensors
# (module/grouped_linear.py, _GroupedLinear.forward at v2.9). Around them, from the dispatch's
# end to the combine's start, Megatron core's MoE code runs another 0.9 ms with a handful of
# kernels (the permute's copy, the activation, the unpermute): 0.8 ms beyond their launches.
TE_EXPERT_GEMM_HOST_US = 46.0
MEGATRON_MOE_FORWARD_HOST_US = 800.0


@dataclass(frozen=True, kw_only=True)
class Stack:
    name: str
    about: str
    # elementwise ops without --compile: "fused" (norms, rotary, SwiGLU in few kernels) or "eager"
    kernels: str
    compilable: bool  # --compile applies (torch.compile of each block fuses its elementwise ops)
    # "best": the GPU's fastest fused kernel (cuDNN / FA3 on Hopper); "fa2": FlashAttention-2
    # class (torch SDPA's flash backend); "triton": the 2023 Triton FlashAttention;
    # "unfused": QK^T, softmax, AV as separate kernels
    attention: str
    # "fp32": logits upcast to fp32 for a softmax cross entropy; "chunked": the same per chunk of
    # LOSS_CHUNK_TOKENS tokens, recomputed in backward; "fused": one kernel, no fp32 copy
    loss: str
    # bytes per parameter of the weights a rank keeps: 2 (16-bit, fp32 master in the
    # optimizer) or 4 (fp32, cast to 16 bits for compute: FSDP's mixed precision, autocast)
    weight_bytes: int
    grad_bytes: int  # bytes per parameter of the gradient a rank keeps
    grad_reduce_bytes: int  # bytes per gradient element on the wire of the data-parallel reduction
    # torch.autocast: 16-bit weight copies made each step, gradients cast back to fp32
    autocast: bool
    # bytes moved per parameter by one Adam step (fused: 28; torch's foreach: more passes)
    optimizer_bytes: int
    # what ZeRO-3 gathers at once: "block" (FSDP wraps each transformer block), "bucket"
    # (DeepSpeed's 5e7-element prefetch bucket) or "param" (one weight matrix, DeepSpeed before
    # v0.6)
    zero3_unit: str
    # ZeRO-3 gathers prefetch behind compute (DeepSpeed before v0.6 synchronised each)
    zero3_overlap: bool
    # ZeRO-3 frees gathered weights after forward and gathers them again
    reshard_after_forward: bool
    # ... also with pipeline parallelism (torchtitan keeps them gathered there)
    reshard_under_pp: bool
    # ZeRO-3 gathers from hooks on every module's forward, so full recompute's forward gathers a
    # block's weights once more (DeepSpeed: stage3.py registers them on each submodule, and
    # checkpointing re-runs those forwards); FSDP's hooks sit on the block that the checkpoint
    # wraps, whose backward gathers once for the recompute and the backward together
    recompute_regathers: bool = False
    # the copies a stack's FSDP makes around its ZeRO-2/3 collectives (FSDP_COPIES)
    fsdp_copies: str
    p2p_overlap: bool  # pipeline sends and receives overlap compute (interleaved schedule)
    # each pipeline receive holds the stage like a send: DeepSpeed's pipeline engine receives with
    # a blocking broadcast on a two-rank group (dist.recv from torch 1.8; runtime/pipe/p2p.py
    # refuses async_op), in its own step of the TrainSchedule; torch posts receives ahead, and
    # Megatron posts each in one batch_isend_irecv with the send it pairs with
    # (send_forward_recv_backward: both cross the link at once, even where its 2021-22 code then
    # waits for the pair, p2p_communication.py at 6985e58938 and e36cdd7936)
    blocking_recvs: bool = False
    # without sequence parallelism each tensor-parallel rank sends only its 1/tp slice of a
    # pipeline activation and the receiver all-gathers the whole over tp: Megatron-LM's
    # scatter/gather optimization (Narayanan et al. 2021, Sec. 4.1;
    # --scatter-gather-tensors-in-pipeline, on by default in p2p_communication.py at 6985e58938);
    # DeepSpeed's pipeline engine, from its first release, as PartitionedTensor over the slice
    # (tensor-parallel) group, its gradients too (runtime/pipe/engine.py: is_pipe_partitioned and
    # is_grad_partitioned whenever is_model_parallel, 65c2f974d, 2020-09)
    pipeline_scatter_gather: bool = False
    # the data-parallel gradient reduction runs bucket by bucket during the last backward (its
    # DDP's hooks; --no-overlap-grad-reduce turns it off); False: the trainer reduces after the
    # backward (Megatron-LM of 2021: train_step calls model.allreduce_gradients() once
    # forward_backward_func returns, training.py at 6985e58938; DeepSpeed's pipeline engine in
    # its TrainSchedule's last step, ReduceGrads after the flush, and its ZeRO 0/1 engine at the
    # accumulation boundary once the last backward is done)
    grad_reduce_overlap: bool = True
    # context parallel gathers all K/V up front (torch's default rotate method), hidden only
    # behind the local chunk's attention; otherwise a ring overlapped step by step
    cp_kv_allgather: bool
    # bytes per output element a ring step's merge moves (TE_CP_MERGE_BYTES, TORCH_CP_MERGE_BYTES)
    cp_merge_bytes: float
    default_zero: int  # what the stack shards when the user names no ZeRO stage
    max_zero_with_pp: int = 3  # the highest ZeRO stage the stack runs beside pipeline parallelism
    sp_with_tp: bool  # sequence parallelism whenever tp > 1, unless the user says otherwise
    tp_overlap: bool  # tensor-parallel communication overlapped with GEMMs by default (userbuffers)
    # precisions whose recipes run without that overlap (Stack.overlaps_tp)
    tp_overlap_off_for: tuple[str, ...] = ()
    # the overlap needs CUDA multicast (GPUSpec.has_multicast): Transformer Engine's
    # initialize_ub raises "does not support comm+GEMM overlap with CUDA Multicast" on an older
    # GPU unless the job sets UB_SKIPMC=1 (module/base.py), so the stack's recipes leave it off
    # there by default (an A100's Megatron run waits for its tensor-parallel collectives)
    tp_overlap_needs_multicast: bool = False
    # in backward, a linear layer's input-gradient collective runs beside its
    # weight-gradient GEMM: Megatron's LinearWithGradAccumulationAndAsyncCommunication
    # launches it before computing the weight gradient. torch's DTensor TP cannot:
    # autograd's MmBackward computes both gradients in one node, and the collective is the
    # next node (the redistribute's backward), which the norm's backward then waits for
    tp_wgrad_overlap: bool
    # the model code computes q, k and v in one GEMM, and a gated MLP's gate and up in one
    # (Megatron's linear_qkv and linear_fc1, MPT's Wqkv); torch stacks' Llama keeps wq, wk, wv,
    # w1 and w3 separate, so backward reduces a sum of their input gradients, which torch's
    # micro-pipelined (async) TP cannot pipeline: it fuses a reduce-scatter only with the one
    # matmul producing its input (torch/_inductor/fx_passes/micro_pipeline_tp.py,
    # _find_producer_matmul)
    fused_input_linears: bool
    # the model code expands K and V to the query heads before SDPA (torchtitan's Llama and
    # Hugging Face style code: repeat_kv): attention saves, and context parallelism rotates,
    # n_heads of K/V, not kv_heads (Megatron's TE attention and execpar's enable_gqa do not)
    repeats_kv_heads: bool = False
    # ... only under context parallelism: execpar expands them before torch's CUDA ring attention
    # takes the attention over (execpar/model.py, Attention.forward), SDPA's grouped path otherwise
    repeats_kv_under_cp: bool = False
    # under sequence parallelism a column-parallel linear saves its local input and gathers
    # it again in backward for the weight gradient, beside the input-gradient GEMM
    # (Megatron's LinearWithGradAccumulationAndAsyncCommunication.backward; TE's bulk "dgrad"
    # overlap does the same); torch's SequenceParallel saves the gathered input instead
    sp_regathers: bool
    # gradients live in a buffer kept across steps (Megatron, DeepSpeed); otherwise
    # optimizer.zero_grad(set_to_none=True) frees them and backward allocates them again
    persistent_grads: bool
    # bytes per (sharded) parameter the optimizer step allocates on top
    optimizer_temp_bytes: int = 0
    # the fp32 gradients (grad_bytes 4) are bf16's: Megatron-LM sets
    # accumulate_allreduce_grads_in_fp32 under --bf16 only (megatron/training/arguments.py, as in
    # 2022's megatron/arguments.py), so under --fp16 its main_grad buffers take the parameters'
    # fp16 and are reduced in it (docs/user-guide/features/dist_optimizer.md: "fp16 parameters,
    # fp16 gradients"); default_grad_reduce says so where the user's recipe does not
    fp32_grads_bf16_only: bool = False
    # the launcher sets PYTORCH_ALLOC_CONF=expandable_segments:True: the caching allocator grows one
    # segment per stream page by page, so freed memory is reused whatever the next size (less slack)
    expandable_segments: bool = False
    # tensor parallelism through torch's DTensor (parallelize_module): its dispatch costs host CPU
    # time per op unless torch.compile traces it away, and its [batch, seq, hidden] layout copies
    # sequence-parallel collectives into place (workload/layer.py, layer_work's dtensor_sp)
    tp_dtensor: bool = False
    # eager norms upcast to fp32 op by op (Llama's RMSNorm in torchtitan of 2024, Hugging Face);
    # False: one kernel (llm-foundry's low_precision_layernorm runs F.layer_norm in bf16; torch's
    # nn.RMSNorm, which torch >= 2.8 sends to its fused CUDA kernel, aten::_fused_rms_norm, where
    # the input's dtype is the weight's)
    norm_fp32: bool = True
    # its norms are torch's nn.RMSNorm: one fused kernel on CUDA (norm_fp32 False), on a CPU
    # device a composite of eager fp32 ops (rms_norm's CPU path decomposes), which planning on a
    # CPU prices (--norm fp32, cli/flags.py stack_defaults)
    torch_rms_norm: bool = False
    # activation checkpointing through torch.utils.checkpoint (non-reentrant): its hooks cost the
    # host CHECKPOINT_HOOK_US per recomputed kernel where the block is not compiled
    checkpoint_hooks: bool = False
    # without FSDP (one data-parallel rank, or DDP) the 16-bit compute comes from torch.autocast
    # around forward and loss: torchtitan's maybe_enable_amp (FSDP's mixed precision otherwise)
    autocast_without_fsdp: bool = False
    # under autocast the MoE layers keep their experts' 16-bit copies for the whole step, beside
    # every gradient at the end of backward (execpar/model.py: MoE._weight casts once a step,
    # StepAutocast drops them); the other stacks' experts are cast per call (torchtitan's
    # GroupedExperts: .bfloat16()) and backward frees each copy as it consumes it. On an H200,
    # execpar's two Mixtral layers of one micro-batch peaked there, 5.1 GiB (their experts'
    # copies) above the optimizer step (reports/gpu-validation-h200-moe).
    step_expert_casts: bool = False
    # eager kernels the model code spends building the rotary table in every attention forward
    # (execpar/model.py's rotary: arange, scale, fill, pow, reciprocal, positions, cast, outer,
    # cos, sin for q and again for k; torchtitan computes its freqs_cis once per model forward)
    rotary_table_kernels: int = 0
    # --compile compiles the loss as well (torchtitan: compile.components has "loss")
    compile_loss: bool = True
    # under tp the loss runs on each rank's vocabulary shard (Megatron's
    # vocab_parallel_cross_entropy, torchtitan's loss_parallel); otherwise the logits
    # are all-gathered and every rank takes the whole loss
    loss_parallel: bool = True
    # the code that runs the loss, for its memory (LOSS_CODES, memory/model.py _loss_peak_bytes)
    loss_code: str = "torch"
    # ZeRO-3 collectives take a list of one tensor per rank: DeepSpeed before v0.6 builds the
    # list with a Python loop of views (partition_parameters.py, _allgather_param and
    # _reduce_scatter_gradient) after a torch.cuda.synchronize(), and torch's list all_gather
    # and reduce_scatter copy each rank's piece through a flat buffer, one copy_ per rank
    # (ProcessGroupNCCL): about one eager op's host time per rank, per collective, with the
    # GPU waiting; and the GPU passes over the bytes around each (gradsync.LIST_COPY_PASSES)
    per_rank_list_ops: bool = False
    # ZeRO-3 reduces gradients with a full all-reduce of each bucket, every rank then keeping its
    # own shard: DeepSpeed v0.3.13 to v0.4.2 by default (contiguous_gradients off until v0.4.3:
    # stage3.py reduce_ipg_grads -> buffered_reduce_fallback -> allreduce_bucket flattens the
    # bucket, divides it in place, all-reduces it and copies it back), twice a reduce-scatter's
    # traffic and no per-rank lists (gradsync.zero_reduce_op, LIST_COPY_PASSES["allreduce"])
    zero3_grad_allreduce: bool = False
    # ZeRO-3 partitions its persistent parameters (under DEEPSPEED_PERSISTENCE_THRESHOLD elements)
    # after every backward and gathers them again at the end of each optimizer step, copying
    # every rank's piece of each into place from Python: DeepSpeed before v0.5.5 (stage3.py,
    # _partition_all_parameters after backward, step's re-gather; partition_parameters.py
    # _allgather_params: narrow, view, narrow and copy_ per parameter and rank; v0.5.5, PR #1188,
    # gathers them coalesced, without the loop)
    zero3_persistent_regather: bool = False
    # how the local experts' GEMMs of one weight run: None, as one grouped kernel, the tiles of
    # all experts filling the SMs together (torch._grouped_mm in torchtitan's GroupedExperts and
    # execpar's MoE; MegaBlocks' grouped GEMM under llm-foundry); n, one cuBLAS GEMM per expert,
    # n at a time: Transformer Engine's GroupedLinear (Megatron's moe_grouped_gemm) issues them
    # over its 4 compute streams (common/gemm/cublaslt_gemm.cu, multi_stream_cublas_gemm;
    # util/multi_stream.cpp, num_compute_streams = 4; its CUTLASS grouped GEMM only under
    # NVTE_USE_CUTLASS_GROUPED_GEMM), a Python loop over experts 1 (DeepSpeed's Experts, Hugging
    # Face's Mixtral). On an H200, 128 experts of Qwen3-30B-A3B at 512 rows each ran their up
    # projection grouped in 0.40 ms, priced 0.35 grouped and 2.33 one by one
    # (reports/grouped-gemm-h200).
    expert_gemm_streams: int | None = None
    # its linear layers are Transformer Engine modules, which cast a quantized GEMM's operands in
    # kernels of their own (TE v2.9, quantizer.cpp and gemm.cpp; counted in Megatron core's layer
    # at 0d8e0714, the 25.11 container's): a linear's forward casts its input (after the norm, fused
    # with it only under NVTE_NORM_FWD_USE_CUDNN), and for block-scaled formats swizzles both
    # operands' scales into cuBLAS's layout; its backward casts the output gradient and swizzles
    # for the input- and the weight-gradient GEMM. A GroupedLinear casts each expert's rows apart
    # (split_quantize: one launch per tensor outside delayed scaling) and swizzles all experts'
    # scales in one multi-tensor kernel (cost/layer.py, te_cast_launches)
    te_quantize_launches: bool = False
    # (forward, backward) kernels an MoE layer's router and token dispatcher launch beside the
    # GEMMs, where counted in the stack's code; None: workload/layer.py's EAGER/FUSED_MOE_KERNELS
    moe_routing_launches: tuple[int, int] | None = None
    # host time per expert GEMM its grouped linears issue (forward and backward), and per MoE
    # layer forward, beyond the kernels counted: Transformer Engine's and Megatron core's Python
    # (TE_EXPERT_GEMM_HOST_US, MEGATRON_MOE_FORWARD_HOST_US); none under CUDA graphs
    expert_gemm_host_us: float = 0.0
    moe_forward_host_us: float = 0.0
    # its fused RoPE takes no YaRN concentration factor: Megatron core's apply_rotary_pos_emb
    # runs the unfused torch ops where mscale != 1 (rope_utils.py: "mscale=... is not supported by
    # TE's fused RoPE. Using unfused implementation."; d0b3b775, the 26.06 container's)
    rope_fusion_plain_only: bool = False
    # how its model code rotates q and k (ROTARIES): "half", rotate_half's ops in the compute
    # dtype (Hugging Face's Llama; Megatron's unfused RoPE), which compile fuses; "complex", as
    # complex numbers, which inductor leaves to eager aten kernels when the block is compiled
    # (simpar.workload.layer.COMPLEX_ROPE: torchtitan's Llama, apply_rotary_emb, from its first
    # release on); "real_fp32", each pair of channels rotated in fp32 op by op, heavier than
    # either eager (REAL_FP32_ROPE: execpar/model.py, rotary)
    rotary: str = "half"
    # --overlap-ep-comm runs: Megatron core's combined 1F1B schedule
    # (overlap_moe_expert_parallel_comm, pipeline_parallel/combined_1f1b.py) runs each forward
    # beside another micro-batch's backward, layer by layer, so that each one's expert-parallel
    # all-to-alls hide behind the other's compute; the step's first forward and last backward
    # run alone
    ep_overlap: bool = False
    # op-level recompute keeps what the expert-parallel dispatch and combine all-to-alls delivered
    # (torchtitan's save list has _c10d_functional.all_to_all_single); execpar's policy keeps
    # matmuls and attention only, so its recompute runs both all-to-alls again
    op_saves_all_to_all: bool = False
    selective: str = "core"  # what selective recompute checkpoints (SELECTIVE)
    # selective recompute takes the modules to checkpoint by name (Megatron core's
    # --recompute-modules, TransformerConfig.recompute_modules: Strategy.recompute_modules)
    recompute_modules: bool = False
    pipeline_outputs_kept: str = "none"  # PIPELINE_OUTPUTS
    # the stack pipelines through torch.distributed.pipelining's PipelineStage, which allocates a
    # receive buffer for every micro-batch of the step, once, and keeps them (stage.py,
    # _setup_forward_recv_info: one per input of every stage but the first;
    # _setup_backward_recv_info: one per output gradient of every stage but the last); Megatron
    # and DeepSpeed receive each micro-batch into a tensor freed with its backward
    pipeline_recv_buffers: bool = False
    grad_accumulation: str = "autograd"  # GRAD_ACCUMULATION
    # the stack's recipe decays weights in AdamW (torchtitan's build_optimizers and fms-fsdp's
    # main_training_llama.py pass weight_decay=0.1; execpar passes 0, as do the MPT yamls), which
    # costs the foreach path a pass of its own
    weight_decay: bool = True
    fp8_casts: str = "fused"  # FP8_CASTS
    # torchao's fp8 linears under ZeRO-3 (FSDP2) cast each weight shard to fp8 before FSDP gathers
    # it (torchao's enable_fsdp_float8_all_gather, one amax all-reduce for all weights after the
    # optimizer with precompute_float8_dynamic_scale_for_fsdp): a gather moves one byte per
    # linear weight element, and the gathered weight is already cast. torchtitan's float8 docs
    # launch with both flags (docs/float8.md) and its 405B recipe sets them (llama3_405b.toml);
    # torchao's own default, which execpar keeps unless a plan says --fp8-all-gather, gathers 16
    # bits.
    fp8_weight_gathers: bool = False
    # per-tensor fp8 with current scaling: each cast first reads its whole input for the amax
    # (Transformer Engine's Float8CurrentScalingQuantizer::quantize_impl: nvte_compute_amax,
    # then the scale, then nvte_quantize), where delayed scaling takes the scale from the amax
    # history and finds the new amax inside the cast. MXFP8 finds its block scales in the cast;
    # NVFP4's per-tensor scale has the pass whatever this says (amax_pass).
    fp8_current_scaling: bool = False
    # precisions the stack runs compiled when the user leaves --compile unsaid: torchtitan's
    # float8 docs call --training.compile "required for competitive performance" (it fuses the
    # scaling and casting kernels, docs/float8.md), and its published fp8 rows compile
    compiled_precisions: tuple[str, ...] = ()
    compile: bool = False
    # the trainer can capture its step in CUDA graphs: Megatron core's cuda_graph_impl
    # ("transformer_engine" per layer, "full_iteration" the whole forward and backward, which
    # Megatron-Bridge's 26.06 MoE recipes run on GB300 and GB200: v0.5.0, set_full_iter_cg_configs)
    graphable: bool = False
    # the step replays CUDA graphs (--cuda-graphs): the host launches a graph, not its kernels,
    # so no pass waits for the host (Stack.launch_us)
    cuda_graphs: bool = False
    # the MoE dispatch waits for the experts' token counts on the host (MOE_HOST_SYNCS): the host
    # cannot run ahead through the experts (cost/layer.py, after_moe_host_sync). A replayed CUDA
    # graph has none: Megatron captures a dropless MoE whole only with static buffers
    # (moe_expert_rank_capacity_factor), which need no counts on the host
    moe_host_sync: str = "never"
    # how its dispatch and combine move tokens (MOE_DISPATCHES; network/collectives.py,
    # dispatch_copies)
    moe_dispatch: str = "alltoall"
    # when its alltoall dispatch sorts each rank's rows by local expert and back (EXPERT_SORTS)
    expert_sort: str = "never"
    # its experts clamp a clamped GLU's input and add fc2's bias per routed row in eager ops:
    # Megatron core's TEGroupedMLP outside Transformer Engine's op fuser (workload/layer.py,
    # EXPERT_CLAMP_BYTES). A step replayed from CUDA graphs runs the op fuser's grouped MLP, which
    # fuses both: the unfused layer copies its token counts to the host (.tolist()), which a graph
    # cannot capture, and Megatron-Bridge's full-iteration recipes set
    # use_transformer_engine_op_fuser beside their graphs (perf_recipes/*/common.py, 067f987d)
    eager_expert_epilogue: bool = False
    # its routed experts run whole on each rank under tensor parallelism, their ep ranks cut from
    # tp x dp x cp: Megatron core's MoE parallel folding with expert_tensor_parallel_size 1, as
    # Megatron-Bridge's MoE recipes set it; otherwise each expert splits over tp as the dense MLP
    # does (Megatron core's default, expert_tensor_parallel_size = tensor_model_parallel_size)
    folds_experts: bool = False
    # the pipeline schedules the stack's trainer runs, which `compare` and `scale` search: torch's
    # classes for the torch stacks (torchtitan's pipeline_parallel_schedule takes any of
    # torch.distributed.pipelining's); Megatron core's forward_backward_pipelining_without_ and
    # _with_interleaving (pipeline_parallel/schedules.py); DeepSpeed's PipelineEngine its
    # TrainSchedule, 1F1B's order (runtime/pipe/schedule.py); none where the trainer does not
    # pipeline (Composer's and fms-fsdp's FSDP, Hugging Face's Trainer)
    schedules: tuple[str, ...] = tuple(SCHEDULES)

    def __post_init__(self):
        one_of("stack.kernels", self.kernels, KERNELS)
        one_of("stack.attention", self.attention, ATTENTION)
        one_of("stack.loss", self.loss, LOSSES)
        one_of("stack.loss_code", self.loss_code, LOSS_CODES)
        one_of("stack.zero3_unit", self.zero3_unit, ZERO3_UNITS)
        one_of("stack.selective", self.selective, SELECTIVE)
        one_of("stack.pipeline_outputs_kept", self.pipeline_outputs_kept, PIPELINE_OUTPUTS)
        one_of("stack.grad_accumulation", self.grad_accumulation, GRAD_ACCUMULATION)
        one_of("stack.fsdp_copies", self.fsdp_copies, FSDP_COPIES)
        one_of("stack.fp8_casts", self.fp8_casts, FP8_CASTS)
        one_of("stack.moe_host_sync", self.moe_host_sync, MOE_HOST_SYNCS)
        one_of("stack.expert_sort", self.expert_sort, EXPERT_SORTS)
        one_of("stack.moe_dispatch", self.moe_dispatch, MOE_DISPATCHES)
        one_of("stack.rotary", self.rotary, ROTARIES)
        for name in self.schedules:
            one_of("stack.schedules", name, SCHEDULES)
        require(not self.compile or self.compilable, "compile", True,
                f"{self.name} has no torch.compile path; drop --compile or use --stack torchtitan")
        require(not self.cuda_graphs or self.graphable, "cuda_graphs", True,
                f"{self.name} does not capture CUDA graphs (Megatron core does): use --stack "
                "megatron or nemo, or drop --cuda-graphs")

    def attention_input_bytes(self, dtype: str) -> int:
        """Bytes per element of what selective recompute keeps of a checkpointed attention module:
        its input, in the residual stream's precision (fp32 under autocast, whose residual adds
        promote to the fp32 weights' type); 0 where selective recompute is the core's."""
        if self.selective == "core":
            return 0
        return 4 if self.autocast or get_precision(dtype).wide else get_precision(dtype).word_bytes

    @property
    def elementwise(self) -> str:
        """The elementwise kernels that run: a compiled block fuses its elementwise ops."""
        return "fused" if self.compile else self.kernels

    @property
    def loss_kind(self) -> str:
        """The loss that runs: a compiled one is fused, where the stack compiles it."""
        return "fused" if self.compile and self.compile_loss else self.loss

    @property
    def dtensor_dispatch(self) -> bool:
        """Each op of a tensor-parallel block pays DTensor's eager dispatch (compiled
        blocks do not)."""
        return self.tp_dtensor and not self.compile

    def kv_repeated(self, cp: int) -> bool:
        """Attention saves, and context parallelism rotates, K and V expanded to the query heads."""
        return self.repeats_kv_heads or (cp > 1 and self.repeats_kv_under_cp)

    @property
    def cp_waits_at_issue(self) -> bool:
        """Context-parallel transfers wait where they are issued: a compiled block traces torch's
        ring attention, whose functional collectives wait at once under tracing
        (_functional_collectives._maybe_wrap_tensor returns wait_tensor(...)), and Inductor keeps
        that order (reorder_for_compute_comm_overlap and
        aten_distributed_optimizations.enable_overlap_scheduling are off by default in torch
        2.13; torchtitan sets neither outside its experiments)."""
        return self.compile and self.cp_kv_allgather

    @property
    def launch_us(self) -> float:
        """Host time to issue one kernel: none in a replayed CUDA graph (one launch a step)."""
        if self.cuda_graphs:
            return 0.0
        return COMPILED_LAUNCH_US if self.compile else EAGER_LAUNCH_US

    def syncs_moe_host(self, expert_parallel: bool) -> bool:
        """An MoE layer's forward, its experts split over ranks or not, waits for its token
        counts on the host (moe_host_sync), unless the step replays CUDA graphs."""
        if self.cuda_graphs:
            return False
        return self.moe_host_sync == "always" or (self.moe_host_sync == "with_ep"
                                                  and expert_parallel)

    @property
    def recompute_launch_us(self) -> float:
        """Host time per kernel of a recomputed forward: a compiled block's recompute is in its
        graph; an eager one pays torch.utils.checkpoint's hooks where the stack uses them."""
        hooks = self.checkpoint_hooks and not self.compile
        return self.launch_us + (CHECKPOINT_HOOK_US if hooks else 0.0)

    @property
    def table_kernels(self) -> int:
        """Kernels a layer's forward spends on the rotary table (none where compiled)."""
        return 0 if self.compile else self.rotary_table_kernels

    def overlaps_tp(self, dtype: str, gpu) -> bool:
        """The stack overlaps tensor-parallel collectives with GEMMs by default in `dtype` on
        `gpu` (tp_overlap_off_for, tp_overlap_needs_multicast)."""
        return (self.tp_overlap and dtype not in self.tp_overlap_off_for
                and (gpu.has_multicast or not self.tp_overlap_needs_multicast))

    def autocasts(self, dtype: str) -> bool:
        """torch.autocast casts only to a 16-bit compute type; fp32 training runs the
        weights as they are."""
        return self.autocast and not get_precision(dtype).wide

    def fp32_stream(self, dtype: str, shards_parameters: bool) -> bool:
        """The residual stream runs in fp32 while the GEMMs run in 16 bits: autocast over fp32
        weights (no FSDP to cast them). The embedding's output is fp32 (its lookup is not
        autocast), each residual add promotes a 16-bit branch to it, the norms read and keep fp32,
        and autocast casts a norm's fp32 output once per linear that takes it (q, k and v; the
        MLP's gate and up), caching casts of leaf tensors (the weights) only. FSDP's mixed
        precision casts the weights themselves, so everything downstream is 16-bit."""
        return self.autocasts(dtype) and not shards_parameters

    @property
    def optimizer_state_bytes(self) -> int:
        """Adam's momentum and variance (8), plus an fp32 master copy when the weights
        are 16-bit."""
        return 8 if self.weight_bytes == 4 else 12

    @property
    def label(self) -> str:
        return f"{self.name}+compile" if self.compile else self.name

    def gathers_fp8_weights(self, dtype: str, shards_parameters: bool) -> bool:
        """ZeRO-3 gathers of the linear weights move fp8, cast before the gather
        (fp8_weight_gathers) where torchao's fp8 linears run `dtype`'s GEMMs."""
        return self.fp8_weight_gathers and shards_parameters and self.torchao_fp8(dtype)

    def torchao_fp8(self, dtype: str) -> bool:
        """torchao's per-tensor fp8 linears run `dtype`'s GEMMs (Stack.fp8_casts): they cast their
        operands, weights included, themselves, and eager ones keep 16-bit inputs for
        backward. Under tensor parallelism its float8 styles cast a column-parallel linear's
        sequence-parallel input before gathering it, so the forward all-gather moves fp8
        (torchtitan's and execpar's PrepareFloat8ModuleInput with Float8ColwiseParallel)."""
        p = get_precision(dtype)
        return self.fp8_casts == "torchao" and p.quantized and not p.block

    def quantized_gathers(self, dtype: str) -> str:
        """Which sequence-parallel all-gathers move `dtype`'s quantized GEMM inputs
        (workload/layer.py, QUANTIZED_GATHERS): torchao's forward ones (torchao_fp8), or
        Transformer Engine's every one (its fused casts, fp8_casts "fused")."""
        if self.torchao_fp8(dtype):
            return "forward"
        quantized = get_precision(dtype).quantized and self.fp8_casts == "fused"
        return "all" if quantized else "none"

    @property
    def fp8_scaling_label(self) -> str:
        """How the stack scales per-tensor fp8 (--fp8-scaling), in words."""
        if self.fp8_casts == "torchao":
            return "torchao, as it casts"
        return "current" if self.fp8_current_scaling else "delayed"

    def amax_pass(self, dtype: str) -> bool:
        """Whether each quantized cast first reads its whole input for the tensor's amax: per-tensor
        fp8 under current scaling (fp8_current_scaling), and NVFP4 always, for its per-tensor
        scale (Transformer Engine's NVFP4Quantizer::quantize_impl runs nvte_compute_amax, or
        nvte_hadamard_transform_amax for the column-wise copy, before the cast)."""
        p = get_precision(dtype)
        return p.tensor_scale or (p.quantized and not p.block and self.fp8_current_scaling)

    def compiles_by_default(self, dtype: str) -> bool:
        """--compile left unsaid: whether the stack's recipe for `dtype` compiles."""
        return self.compilable and dtype in self.compiled_precisions

    def compiled(self, on: bool) -> Stack:
        return replace(self, compile=on) if on != self.compile else self

    def sorts_experts(self, ep: int) -> bool:
        """Its dispatch sorts each rank's rows by local expert and back at `ep` (EXPERT_SORTS)."""
        return self.moe_dispatch == "alltoall" and (
            self.expert_sort == "always" or (self.expert_sort == "with_ep" and ep > 1))

    @property
    def runs_eager_expert_epilogue(self) -> bool:
        """eager_expert_epilogue where the step is not replayed from CUDA graphs."""
        return self.eager_expert_epilogue and not self.cuda_graphs

    def graphed(self, on: bool) -> Stack:
        """The stack replaying its step from CUDA graphs (where its trainer captures them)."""
        return replace(self, cuda_graphs=on) if on != self.cuda_graphs else self

    def without_fsdp(self) -> Stack:
        """The stack where it applies no FSDP: under autocast where it then turns it on."""
        return replace(self, autocast=True) if self.autocast_without_fsdp else self

    def with_grad_reduce(self, dtype: str) -> Stack:
        """The stack reducing gradients in `dtype` (GRAD_REDUCE): Megatron's
        --grad-reduce-in-bf16, FSDP's reduce_dtype. A stack with 16-bit weights keeps its
        persistent gradient buffer in that dtype too (Megatron's main_grad buffer takes the
        reduce dtype), so its size and what the optimizer reads follow; a stack with fp32
        weights keeps fp32 gradients and only reduces in `dtype`."""
        one_of("grad_reduce", dtype, GRAD_REDUCE)
        nbytes = GRAD_REDUCE_BYTES[dtype]
        if self.weight_bytes == 4 or not self.persistent_grads:
            return replace(self, grad_reduce_bytes=nbytes)
        adam = FUSED_ADAM_FP32_GRAD_BYTES if nbytes == 4 else FUSED_ADAM_BYTES
        return replace(self, grad_reduce_bytes=nbytes, grad_bytes=nbytes, optimizer_bytes=adam)

    def step_grad_cast_bytes(self, weight_bytes: int, grad_bytes: int) -> int:
        """Bytes per (sharded) master parameter the optimizer step allocates for the fp32 gradient
        Adam reads beside its fp32 master weight, for weights and gradients of these widths.
        Megatron's optimizers cast each 16-bit main_grad (its shard under the distributed
        optimizer) with .float(): a new tensor where the gradient is 16-bit, the same one where it
        is fp32 (megatron/core/optimizer/distrib_optimizer.py and optimizer.py,
        _copy_model_grads_to_main_grads; its distributed-optimizer table: "fp16 parameters, fp16
        gradients: 4 + 16/d" beside bf16's fp32 gradients "6 + 12/d"). The stacks with 16-bit
        weights are Megatron's and DeepSpeed's; DeepSpeed's optimizers (grad_accumulation
        "hp_copy") keep or cast theirs otherwise."""
        cast = weight_bytes == 2 and grad_bytes == 2 and self.grad_accumulation != "hp_copy"
        return 4 if cast else 0

    def default_grad_reduce(self, dtype: str) -> str:
        """The gradient precision (GRAD_REDUCE) the stack runs `dtype` with where it differs from
        its profile's ("": the profile's): fp16 for an fp16 run of a stack whose fp32 gradients
        are bf16's only (fp32_grads_bf16_only)."""
        return "fp16" if self.fp32_grads_bf16_only and dtype == "fp16" else ""

    def with_norm(self, kind: str) -> Stack:
        """The stack running its norms as `kind` (NORMS): "fp32", eager ops upcast to fp32
        whose fp32 copies autograd keeps, or "fused", one 16-bit kernel."""
        one_of("norm", kind, NORMS)
        return replace(self, norm_fp32=kind == "fp32")

    def with_attention(self, kernel: str) -> Stack:
        """The stack calling `kernel` (ATTENTION) for attention: e.g. torchtitan 0.2 puts cuDNN's
        first in its SDPA priority list (the GPU's best kernel), where its 2024 releases ran
        FlashAttention-2."""
        one_of("attention", kernel, ATTENTION)
        return replace(self, attention=kernel)

    def with_fp8_scaling(self, scaling: str) -> Stack:
        """The stack scaling per-tensor fp8 as `scaling` (FP8_SCALING): "delayed" as Megatron
        core's fp8_recipe "delayed" (its default), "current" as its "tensorwise"
        (Float8CurrentScaling) and Megatron-Bridge's fp8_cs recipes."""
        one_of("fp8_scaling", scaling, FP8_SCALING)
        return replace(self, fp8_current_scaling=scaling == "current")

    def with_folded_experts(self, on: bool) -> Stack:
        """The stack running its routed experts whole on each rank under tp (`on`: Megatron's
        --expert-tensor-parallel-size 1) or split over tp as the dense MLP."""
        return replace(self, folds_experts=on)

    def with_moe_dispatch(self, dispatch: str) -> Stack:
        """The stack moving its MoE tokens as `dispatch` (MOE_DISPATCHES): Megatron core's
        --moe-token-dispatcher-type alltoall, or flex on DeepEP or HybridEP."""
        one_of("moe_dispatch", dispatch, MOE_DISPATCHES)
        return replace(self, moe_dispatch=dispatch)

    def with_fp8_all_gather(self, on: bool) -> Stack:
        """The stack gathering its torchao fp8 linears' weights in fp8 under ZeRO-3 (`on`:
        torchao's enable_fsdp_float8_all_gather) or in 16 bits."""
        return replace(self, fp8_weight_gathers=on)

    def with_pipeline_outputs(self, kept: str) -> Stack:
        """The stack's pipeline schedule keeping `kept` (PIPELINE_OUTPUTS) of its stage outputs to
        the step's end: e.g. torchtitan's trainer passes return_outputs=False since 2026 (none)."""
        one_of("pipeline_outputs", kept, PIPELINE_OUTPUTS)
        return replace(self, pipeline_outputs_kept=kept)

    def with_adam(self, impl: str) -> Stack:
        """The stack running torch.optim.AdamW as `impl` (ADAM_IMPLS) on its fp32 parameters: the
        step's bytes per parameter and what it allocates on top. A stack with 16-bit weights runs
        its own fused optimizer over an fp32 master copy (Megatron, DeepSpeed), not torch's."""
        require(self.weight_bytes == 4, "optimizer", impl,
                f"{self.name} runs its own fused Adam on an fp32 master copy; --optimizer is for "
                "stacks with fp32 parameters (torchtitan, fsdp, mosaic, execpar)")
        if impl == "foreach":
            decay = FOREACH_WEIGHT_DECAY_BYTES if self.weight_decay else 0
            return replace(self, optimizer_bytes=FOREACH_ADAMW_BYTES + decay,
                           optimizer_temp_bytes=FOREACH_ADAMW_TEMP_BYTES)
        fused = FUSED_ADAM_FP32_GRAD_BYTES if self.grad_bytes == 4 else FUSED_ADAM_BYTES
        return replace(self, optimizer_bytes=fused, optimizer_temp_bytes=0)


# Fused Adam (apex / torch fused=True / Megatron's distributed optimizer) in mixed
# precision, bytes per parameter: read the gradient, read and write fp32 master,
# momentum and variance, write the 16-bit copy, read gradients once more for the
# global-norm clip (2 + 8 + 8 + 8 + 2 + 2). With fp32 gradients 4 more.
FUSED_ADAM_BYTES = 28
FUSED_ADAM_FP32_GRAD_BYTES = 32
# torch.optim.AdamW's default foreach path on fp32 parameters: lerp of m (12), mul and
# addcmul of v (8 + 12), sqrt into a new list (8), bias-correction div and eps add (8 +
# 8), addcdiv into the weight (16) = 72 bytes per parameter (torch/optim/adam.py,
# _multi_tensor_adam) ...
FOREACH_ADAMW_BYTES = 72
# ... and a nonzero weight decay one more pass, a mul_ of the weights (4 + 4) before the
# moments (the fused kernel decays in its one pass)
FOREACH_WEIGHT_DECAY_BYTES = 8
# ... and the sqrt list it allocates holds one fp32 value per parameter until the step ends.
FOREACH_ADAMW_TEMP_BYTES = 4
# Composer's DecoupledAdamW (llm-foundry's decoupled_adamw) steps each parameter in a Python
# loop of unfused ops (composer/optim/decoupled_weight_decay.py, DecoupledAdamW.adamw): mul_
# and add_ of m (8 + 12), mul_ and addcmul_ of v (8 + 12), sqrt, the bias-correction division
# and the eps add_ (8 + 8 + 8), addcdiv_ into the weight (16) = 80 bytes per fp32 parameter
# (the MPT yamls set weight_decay 0, which skips its decay pass).
COMPOSER_ADAMW_BYTES = 80
# torch.optim.AdamW's implementations: "fused" (fused=True, one kernel per parameter group;
# torchtitan's default since Feb 2025, execpar's) or "foreach" (torch's default without
# fused=True: multi-tensor kernels, one pass per arithmetic step; torchtitan before Feb 2025,
# Hugging Face, fms-fsdp)
ADAM_IMPLS = ("fused", "foreach")
# how the model code runs its norms, where the user's code differs from the stack's (--norm):
# "fp32": eager ops upcast to fp32 one by one (torchtitan's RMSNorm of 2024, Hugging Face's);
# "fused": one kernel (Transformer Engine, torchtitan's fused_rmsnorm of 2024, llm-foundry's
# low-precision LayerNorm, torch's nn.RMSNorm on CUDA: torchtitan 0.2, execpar), reading and
# writing the residual stream's precision
NORMS = ("fp32", "fused")
# how the model code rotates q and k (Stack.rotary)
ROTARIES = ("half", "complex", "real_fp32")
# the precision gradients are reduced in, where the user's recipe sets it (--grad-reduce)
GRAD_REDUCE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
GRAD_REDUCE = tuple(GRAD_REDUCE_BYTES)

# Keyword arguments of Stack that several profiles share (field name -> value, of the field's type).
_FSDP: dict[str,
            Any] = {"zero3_unit": "block", "zero3_overlap": True, "reshard_after_forward": True}
_MEGATRON: dict[str, Any] = {
    **_FSDP, "kernels": "fused", "compilable": False, "attention": "best", "weight_bytes": 2,
    "autocast": False, "optimizer_bytes": FUSED_ADAM_FP32_GRAD_BYTES, "reshard_under_pp": True,
    "fsdp_copies": "none", "p2p_overlap": True, "cp_kv_allgather": False,
    "cp_merge_bytes": TE_CP_MERGE_BYTES, "default_zero": 1,
    "sp_with_tp": True, "tp_overlap": True, "tp_wgrad_overlap": True, "sp_regathers": True,
    "fused_input_linears": True,
    "persistent_grads": True, "grad_accumulation": "fused", "expert_gemm_streams": 4,
    "schedules": ("1f1b", "interleaved"), "loss_code": "megatron"
}
# what Megatron core's Transformer Engine layers and MoE dispatchers launch (the DeepSpeed stacks
# share _MEGATRON's kernels, not these)
_TRANSFORMER_ENGINE: dict[str, Any] = {
    "te_quantize_launches": True, "moe_routing_launches": MEGATRON_MOE_ROUTING_LAUNCHES,
    "expert_gemm_host_us": TE_EXPERT_GEMM_HOST_US,
    "moe_forward_host_us": MEGATRON_MOE_FORWARD_HOST_US,
    "moe_host_sync": "always", "expert_sort": "always", "eager_expert_epilogue": True,
    "tp_overlap_needs_multicast": True,
    "graphable": True, "rope_fusion_plain_only": True, "recompute_modules": True
}
_TORCH: dict[str, Any] = {
    **_FSDP, "kernels": "eager", "attention": "fa2", "loss": "fp32", "weight_bytes": 4,
    "grad_bytes": 4, "tp_dtensor": True, "p2p_overlap": False, "cp_kv_allgather": True,
    "cp_merge_bytes": TORCH_CP_MERGE_BYTES,
    "tp_overlap": False, "tp_wgrad_overlap": False, "sp_regathers": False,
    "persistent_grads": False, "fused_input_linears": False, "repeats_kv_heads": True,
    "checkpoint_hooks": True
}

# torchtitan, as behind its 2024 benchmarks (docs/performance.md, Dec 2024's
# llama3_h100_202412): eager Llama (fp32 RMSNorm and rotary, separate kernels)
# unless --compile, which compiles each TransformerBlock; SDPA with FLASH first in its
# priority list (FlashAttention-2); cross_entropy(pred.float())
# eager (compiled only from 2024-10-22, e10cb9494, to 2024-12-18, e8977b0, and again
# from 2025-04-02, bbb1b616e: --loss fused); FSDP2 per block, resharding after
# forward except under PP, bf16 params, reduce_dtype fp32; torch.optim.AdamW with
# fused=False, so foreach with weight decay 0.1 (fused by default from 2025-02-24,
# #881: --optimizer fused); sequence-parallel norms under TP; context parallel through
# torch's all-gather rotater; rotary as complex numbers, eager even in a compiled block
# (complex_rotary); run_train.sh launches with expandable segments. Its
# pipeline schedules, torch's of that time, keep every stage's micro-batch outputs
# through the step (PIPELINE_OUTPUTS).
TORCHTITAN_2024 = Stack(
    name="torchtitan",
    about="torchtitan of its 2024 benchmarks (FSDP2, DTensor TP, torch.compile optional)",
    compilable=True, expandable_segments=True, grad_reduce_bytes=4, autocast=False,
    autocast_without_fsdp=True,
    optimizer_bytes=FOREACH_ADAMW_BYTES + FOREACH_WEIGHT_DECAY_BYTES,
    optimizer_temp_bytes=FOREACH_ADAMW_TEMP_BYTES, compile_loss=False,
    reshard_under_pp=False, fsdp_copies="fsdp2", default_zero=3, sp_with_tp=True,
    fp8_casts="torchao", fp8_weight_gathers=True, compiled_precisions=("fp8",),
    pipeline_outputs_kept="all", pipeline_recv_buffers=True, op_saves_all_to_all=True,
    moe_host_sync="with_ep", expert_sort="with_ep", rotary="complex", **_TORCH)

# torchtitan 0.2 as released (v0.2.2, 2026-02-20, what `pip install torchtitan` gives), where it
# departs from the 2024 code above, each read at that tag: SDPA with cuDNN's attention first in
# its priority list (models/attention.py, ScaledDotProductAttentionWrapper; since #1000,
# 2025-03-20), context parallelism too (#1211); grouped K/V handed to SDPA whole (enable_gqa,
# #2259, 2026-01-27), expanded only where torch's ring attention takes over (as execpar finds
# its handlers need); torch.optim.AdamW fused (optimizer.implementation = "fused", #881); the
# loss compiled beside the blocks under --compile (compile.components = ["model", "loss"],
# components/loss.py); torch's nn.RMSNorm (#985), one fused kernel each way on CUDA where
# torch >= 2.8 and input and weight share a dtype, eager ops on a CPU; train.py steps its
# pipeline schedule with return_outputs=False, keeping no stage outputs.
TORCHTITAN_0_2 = replace(
    TORCHTITAN_2024.with_adam("fused"), name="torchtitan-0.2",
    about="torchtitan 0.2 (v0.2.2: cuDNN attention, fused AdamW and loss, grouped K/V)",
    attention="best", compile_loss=True, norm_fp32=False, torch_rms_norm=True,
    repeats_kv_heads=False, repeats_kv_under_cp=True, pipeline_outputs_kept="none")


STACKS: dict[str, Stack] = {
    s.name: s
    for s in [
        # Megatron-LM core with Transformer Engine. Kernels: TE's fused norm+linear, RoPE and
        # bias-SwiGLU fusions (arguments.py: apply_rope_fusion, bias_swiglu_fusion on by
        # default); TE DotProductAttention prefers cuDNN fused attention on Hopper
        # (attention/dot_product_attention/utils.py). Loss: vocab_parallel_cross_entropy
        # upcasts the logits to fp32 (tensor_parallel/cross_entropy.py). bf16 training keeps
        # and reduces gradients in fp32 (arguments.py sets accumulate_allreduce_grads_in_fp32;
        # docs: distributed optimizer 6 + 12/d bytes per parameter), fp16 training in fp16
        # (fp32_grads_bf16_only). The interleaved schedule
        # overlaps its p2p (overlap_p2p_comm, on by default with virtual stages). Its
        # published recipes run the distributed optimizer (ZeRO-1), sequence parallelism with
        # tp and --tp-comm-overlap: those are the defaults here.
        Stack(name="megatron", about="Megatron-LM + Transformer Engine", loss="fp32", grad_bytes=4,
              grad_reduce_bytes=4, fp32_grads_bf16_only=True, ep_overlap=True, **_MEGATRON,
              **_TRANSFORMER_ENGINE),
        # Megatron-LM as its SC21 paper ran it (Narayanan et al. 2021, arXiv:2104.04473; the
        # authors' scripts at 6985e58938, 2021-08-18): no Transformer Engine, fused softmax but
        # no fused attention; fp16 gradients accumulate in .grad through autograd and are
        # all-reduced in fp16 after the backward (model/distributed.py: no contiguous fp32
        # buffer unless --accumulate-allreduce-grads-in-fp32, which bf16 sets); each pipeline
        # exchange sends 1/tp of the activation and all-gathers it over tp
        # (--scatter-gather-tensors-in-pipeline, on by default), then synchronizes the device
        # (p2p_communication.py: torch.cuda.synchronize()), so the interleaved schedule hides no
        # transfer; the tensor-parallel input-gradient all-reduce waits for the linear's whole
        # backward (the async all-reduce beside the weight-gradient GEMM came in September
        # 2021); no distributed optimizer and no sequence parallelism (both 2022).
        Stack(name="megatron-2021", about="Megatron-LM of 2021 (SC21 paper): fp16, no TE", **{
            **_MEGATRON, "attention": "unfused", "loss": "fp32", "grad_bytes": 2,
            "grad_reduce_bytes": 2, "optimizer_bytes": FUSED_ADAM_BYTES,
            "grad_accumulation": "autograd", "p2p_overlap": False, "blocking_recvs": False,
            "pipeline_scatter_gather": True, "grad_reduce_overlap": False, "default_zero": 0,
            "sp_with_tp": False, "tp_overlap": False, "tp_wgrad_overlap": False
        }),
        # Megatron-LM as its 2022 release ran the sequence-parallel and selective-recompute
        # paper (Korthikanti et al. 2022, arXiv:2205.05198; read at e36cdd7936, 2022-07-26):
        # still no Transformer Engine and no fused attention (no flash-attention flag yet);
        # the fp32 loss, and bf16's fp32 gradients, of today's; weight gradients fused into a
        # contiguous main_grad buffer (--no-gradient-accumulation-fusion turns it off), the
        # input-gradient all-reduce (or, under --sequence-parallel, reduce-scatter) beside the
        # weight-gradient GEMM (mpu/layers.py, async_grad_allreduce); the pipeline exchange and
        # gradient all-reduce as in 2021 (p2p_communication.py skips its scatter/gather under
        # sequence parallelism); sequence parallelism and the distributed optimizer opt-in.
        Stack(name="megatron-2022", about="Megatron-LM of 2022 (sequence parallel, no TE)", **{
            **_MEGATRON, "attention": "unfused", "loss": "fp32", "grad_bytes": 4,
            "grad_reduce_bytes": 4, "fp32_grads_bf16_only": True, "p2p_overlap": False,
            "pipeline_scatter_gather": True, "grad_reduce_overlap": False,
            "default_zero": 0, "sp_with_tp": False, "tp_overlap": False
        }),
        # NeMo 2 runs Megatron core; its GPT/Llama configs fuse the cross entropy
        # (cross_entropy_loss_fusion), and its performance scripts reduce gradients in bf16
        # (scripts/performance/helpers.py, set_precision_configs:
        # grad_reduce_in_fp32=False). Its performance scripts also launch with expandable
        # segments (scripts/performance/executors.py, PERF_ENV_VARS; B200 excepted in 2025).
        # Its Llama performance recipes turn the TP overlap off for NVFP4 on every GPU
        # (scripts/performance/configs/llama/llama3_llm_pretrain.py and llama31_llm_pretrain.py,
        # 2025-11 to 2026-07: tp_comm_overlap = False if precision == "nvfp4").
        # Its fp8 is current scaling: Megatron-Bridge's performance recipes run "fp8_cs"
        # (scripts/performance/utils/precision.py, bf16_with_fp8_current_scaling_mixed), where
        # Megatron core's fp8_recipe defaults to "delayed" (transformer_config.py). Its MoE
        # recipes dispatch with the flex dispatcher (moe_token_dispatcher_type "flex" on HybridEP
        # or DeepEP: every GB200, GB300 and B300 one and DeepSeek-V3's on every GPU in v0.5.0's
        # scripts/performance/configs; Qwen3's B200 and H100 235B presets keep "alltoall"), and
        # run routed experts whole under tp (expert_tensor_parallel_size 1 in every MoE preset's
        # workload base config, v0.2.0 to v0.5.0).
        Stack(name="nemo", about="NVIDIA NeMo (Megatron core + Transformer Engine)", loss="fused",
              grad_bytes=2, grad_reduce_bytes=2, expandable_segments=True, moe_dispatch="flex",
              folds_experts=True,
              tp_overlap_off_for=("nvfp4",), fp8_current_scaling=True, ep_overlap=True,
              **{**_MEGATRON, "loss_code": "megatron-te"}, **_TRANSFORMER_ENGINE),
        TORCHTITAN_2024,
        TORCHTITAN_0_2,
        # Plain PyTorch FSDP with eager model code (Hugging Face Trainer / accelerate,
        # IBM's fms-fsdp): SDPA, fp32 logits in the loss, FULL_SHARD per decoder layer,
        # bf16 reduce (accelerate's bf16 mixed precision). FSDP1 (FullyShardedDataParallel:
        # flat parameters and gradients) and torch.optim.AdamW with its default
        # foreach path (fms-fsdp main_training_llama.py). Without FSDP (DDP, one GPU) Hugging
        # Face's Trainer runs bf16 as accelerate's native AMP: prepare_model wraps the model's
        # forward in torch.autocast over its fp32 weights (autocast_without_fsdp).
        Stack(name="fsdp", about="PyTorch FSDP with eager model code (Hugging Face style)",
              compilable=True, grad_reduce_bytes=2, autocast=False, autocast_without_fsdp=True,
              optimizer_bytes=FOREACH_ADAMW_BYTES + FOREACH_WEIGHT_DECAY_BYTES,
              optimizer_temp_bytes=FOREACH_ADAMW_TEMP_BYTES,
              reshard_under_pp=True, fsdp_copies="flat", default_zero=3, sp_with_tp=False,
              expert_gemm_streams=1, schedules=(), **_TORCH),
        # MosaicML Composer / llm-foundry: FSDP1 FULL_SHARD per block (flat parameters and
        # gradients), the MPT yamls' mixed_precision PURE (bf16 reduce), flash_attn's Triton
        # cross entropy (never an fp32 logits tensor), otherwise eager kernels, LayerNorm in
        # 16 bits (the benchmark script sets low_precision_layernorm), Composer's unfused
        # DecoupledAdamW. Attention: MPT's ALiBi ran on the Triton FlashAttention, which its
        # published throughput tables used (scripts/train/benchmarking/submit_benchmarks.py:
        # --attn_impl defaults to triton).
        Stack(name="mosaic", about="MosaicML Composer / llm-foundry FSDP (MPT, Triton attention)",
              compilable=False, grad_reduce_bytes=2, autocast=False,
              optimizer_bytes=COMPOSER_ADAMW_BYTES, reshard_under_pp=True, fsdp_copies="flat",
              default_zero=3, sp_with_tp=False, **
              {**_TORCH, "loss": "fused", "attention": "triton", "fused_input_linears": True,
               # torch 1.13-2.0's checkpoint_wrapper, which it wraps blocks with, defaulted to
               # CheckpointImpl.REENTRANT
               "checkpoint_hooks": False},
              norm_fp32=False, weight_decay=False, schedules=()),
        # DeepSpeed's PipelineEngine runs ZeRO stage 0 or 1 only (runtime/pipe/engine.py asserts
        # zero_optimization_stage() < 2), so 3D-parallel Megatron-DeepSpeed jobs (BLOOM, MT-NLG)
        # run ZeRO-1. DeepSpeed ZeRO as released before v0.6 (2021, the published ZeRO-3 runs),
        # with Megatron-DeepSpeed model code: Megatron's fused softmax and bias-GeLU but no
        # flash attention; ZeRO-3 all-gathers each fp16 parameter on its own with a
        # torch.cuda.synchronize() (partition_parameters.py, _allgather_param), so gathers do
        # not hide behind compute. Its ZeRO-3 defaults are those of the first releases (v0.3.13
        # to v0.4.2, spring 2021, the published ZeRO-3 runs): gradients all-reduced bucket by
        # bucket in fp16 (reduce-scattered per parameter from v0.4.3), and the persistent small
        # parameters gathered again after each step with a per-rank Python loop.
        # Megatron-DeepSpeed's ColumnParallelLinear (megatron/mpu/layers.py, to mid-2023)
        # all-reduces its input gradient in copy_to_tensor_model_parallel_region's backward, after
        # the linear's whole backward: no overlap with its weight-gradient GEMM, which Megatron-LM
        # added in September 2021 and Megatron-DeepSpeed took in July 2023 (core/tensor_parallel).
        Stack(
            name="deepspeed",
            about=("DeepSpeed ZeRO before v0.6 (2021; ZeRO-3 as v0.3.13-v0.4.2), "
                   "Megatron-DeepSpeed model code"), **{
                **_MEGATRON, "attention": "unfused", "loss": "fp32", "grad_bytes": 2,
                "grad_reduce_bytes": 2, "optimizer_bytes": FUSED_ADAM_BYTES, "zero3_unit": "param",
                "zero3_overlap": False, "recompute_regathers": True, "p2p_overlap": False,
                "default_zero": 3, "max_zero_with_pp": 1, "sp_with_tp": False, "tp_overlap": False,
                "tp_wgrad_overlap": False, "per_rank_list_ops": True, "zero3_grad_allreduce": True,
                "zero3_persistent_regather": True, "grad_accumulation": "hp_copy",
                "blocking_recvs": True, "pipeline_scatter_gather": True,
                "grad_reduce_overlap": False, "expert_gemm_streams": 1, "schedules": ("1f1b",)
            }),
        # DeepSpeed v0.6 and later: ZeRO-3 gathers one coalesced fetch group of up to
        # stage3_prefetch_bucket_size elements ahead on its own stream, and
        # reduce-scatters coalesced buckets, both in the model's dtype. Its Megatron-DeepSpeed
        # model code, as above, waits for each tensor-parallel input-gradient all-reduce; its
        # attention is FlashAttention-2, as that code's runs pass --use-flash-attn-v2 (from 2023).
        Stack(
            name="deepspeed-0.6",
            about="DeepSpeed ZeRO v0.6 and later (batched ZeRO-3 collectives)", **{
                **_MEGATRON, "attention": "fa2", "loss": "fp32", "grad_bytes": 2,
                "grad_reduce_bytes": 2, "optimizer_bytes": FUSED_ADAM_BYTES, "zero3_unit": "bucket",
                "recompute_regathers": True, "p2p_overlap": False, "default_zero": 3,
                "max_zero_with_pp": 1, "sp_with_tp": False, "tp_overlap": False,
                "tp_wgrad_overlap": False, "grad_accumulation": "hp_copy", "blocking_recvs": True,
                "pipeline_scatter_gather": True, "grad_reduce_overlap": False,
                "expert_gemm_streams": 1, "schedules": ("1f1b",)
            }),
        # execpar (this project): eager model (execpar/model.py): torch's nn.RMSNorm, one fused
        # kernel each way on CUDA (profiled on an H200 under torch 2.11+cu130:
        # vectorized_layer_norm_kernel<float, float, true> forward, layer_norm_grad_input_kernel_
        # vectorized and GammaBetaBackwardCUDAKernelTemplate backward, once a norm:
        # reports/gpu-validation-h200*/measured-*.json), its rotary in fp32 op by op;
        # SDPA, which torch >= 2.10 sends to cuDNN's attention on Hopper and Blackwell where the
        # runtime cuDNN is newer than 9.15 (sdp_utils.cpp, check_prefer_cudnn_attention), as
        # torch's CUDA 13 wheels ship it: the GPU's best kernel, not FlashAttention-2 (profiled
        # on an H100 and an H200 under torch 2.11+cu130: cudnn_generated_fort_native_sdpa_sm90_
        # flash_{fprop,bprop}_wgmma, reports/gpu-validation-h100), loss_fn = the chunked
        # cross_entropy(logits.float()), fp32 weights under autocast (FSDP2 casts them, fp32
        # reduce), fused torch.optim.AdamW (fp32 gradients),
        # DDP / ZeRO-1 / FSDP2 as execpar/parallelize.py's apply_dp decides; `execpar launch`
        # turns on expandable segments unless the user's environment sets the allocator.
        # --compile: torch.compile of each block, after activation checkpointing and
        # before data parallelism (torchtitan's order); the chunked loss stays eager.
        # Under tp the output layer all-gathers the logits (ColwiseParallel to
        # Replicate, execpar/parallelize.py apply_tp): no loss parallelism. Selective recompute
        # checkpoints each block's whole attention module.
        Stack(name="execpar", about="execpar (this project's torch.distributed runner)",
              compilable=True, compile_loss=False, expandable_segments=True, grad_reduce_bytes=4,
              autocast=True, optimizer_bytes=FUSED_ADAM_FP32_GRAD_BYTES, reshard_under_pp=True,
              fsdp_copies="fsdp2", default_zero=0, sp_with_tp=False, loss_parallel=False,
              norm_fp32=False, torch_rms_norm=True, rotary="real_fp32", **
              {**_TORCH, "attention": "best", "loss": "chunked", "repeats_kv_heads": False,
                 "repeats_kv_under_cp": True, "selective": "attention", "weight_decay": False,
                 "rotary_table_kernels": 20, "fp8_casts": "torchao",
                 "step_expert_casts": True, "pipeline_recv_buffers": True,
                 "moe_host_sync": "with_ep", "expert_sort": "with_ep"}),
    ]
}

DEFAULT_STACK = "megatron"

# What users call these stacks (their projects', packages' and docs' names), taken wherever a stack
# is named: Megatron core is Megatron-LM's library; Megatron-Bridge is NeMo 2's Megatron trainer;
# IBM's fms-fsdp and Hugging Face's Trainer / accelerate run plain PyTorch FSDP on eager model code;
# llm-foundry runs on MosaicML's Composer; Megatron-DeepSpeed is the model code DeepSpeed's
# published 3D runs (BLOOM, MT-NLG) used, and EleutherAI's GPT-NeoX trains Megatron-derived model
# code through DeepSpeed's engine too; NeMo Megatron is NeMo's former name for its LLM training.
STACK_ALIASES = {
    "megatron-lm": "megatron", "megatron-core": "megatron", "mcore": "megatron",
    "megatron-bridge": "nemo", "nemo2": "nemo", "nemo-megatron": "nemo",
    "pytorch-fsdp": "fsdp", "fms-fsdp": "fsdp", "huggingface": "fsdp", "hf": "fsdp",
    "accelerate": "fsdp",
    "composer": "mosaic", "llm-foundry": "mosaic", "mosaicml": "mosaic",
    "megatron-deepspeed": "deepspeed", "deepspeed-megatron": "deepspeed", "gpt-neox": "deepspeed",
    "nvidia-nemo": "nemo", "nemo-framework": "nemo", "nvidia-megatron-lm": "megatron",
}


# The profile each release of a stack with several eras runs, by the first version it covers:
# release numbers (DeepSpeed's, torchtitan's, Megatron core's 0.x) or years. Megatron-LM took
# sequence parallelism in 2022 (e36cdd7936's flags) and Transformer Engine in 2023; every Megatron
# core release runs TE. DeepSpeed batched its ZeRO-3 collectives in v0.6.0 (March 2022), but a year
# also names the model code of its runs, and Megatron-DeepSpeed's attention stayed unfused until
# FlashAttention-2 (July 2023; its --use-flash-attn-v2): 2022's runs (BLOOM's) are the 2021
# profile's. torchtitan 0.2 is the first release of its 2025 code (cuDNN attention, fused AdamW).
YEAR = 2000  # versions from here on are years
STACK_ERAS: dict[str, tuple[tuple[tuple[int, ...], str], ...]] = {
    "megatron": (((0,), "megatron"), ((YEAR,), "megatron-2021"), ((2022,), "megatron-2022"),
                 ((2023,), "megatron")),
    "deepspeed": (((0,), "deepspeed"), ((0, 6), "deepspeed-0.6"), ((YEAR,), "deepspeed"),
                  ((2023,), "deepspeed-0.6")),
    "torchtitan": (((0,), "torchtitan"), ((0, 2), "torchtitan-0.2"), ((YEAR,), "torchtitan"),
                   ((2025,), "torchtitan-0.2")),
}


# The profile a stack's plain name (no version) prices on a GPU architecture: the code that most of
# the stack's published runs on that architecture ran; others run its profile of that name.
# Megatron-LM's runs on V100s and A100s predate Transformer Engine and flash attention in it (2023),
# which every Hopper or later run has: most are its SC21 paper's and README's (Narayanan et al.
# 2021, 2021's code), a few its 2022 paper's (Korthikanti et al., megatron-2022 by version);
# DeepSpeed's on Hopper and later GPUs (from 2023) postdate v0.6 (March 2022) and FlashAttention-2
# in Megatron-DeepSpeed; torchtitan's on Blackwell GPUs (from 2025) run its 0.2 code. A version the
# user names wins, as does an alias of one era (ERA_ALIASES).
ARCH_ERAS: dict[str, dict[str, str]] = {
    "megatron": {"volta": "megatron-2021", "ampere": "megatron-2021"},
    "deepspeed": dict.fromkeys(("hopper", "blackwell", "cdna3", "cdna4"), "deepspeed-0.6"),
    "torchtitan": dict.fromkeys(("blackwell", "cdna4"), "torchtitan-0.2"),
}
# names of one era: Megatron core is Megatron-LM's library since Transformer Engine came into it
ERA_ALIASES = ("megatron-core", "mcore")


def names_no_era(name: str) -> bool:
    """Whether `name` is a stack with eras named without a version (`megatron`, `Megatron-LM`,
    `megatron-deepspeed`), whose GPU then picks the era (stack_on)."""
    era_alias = canonical(name, ERA_ALIASES) in ERA_ALIASES
    return canonical(name, STACKS, STACK_ALIASES) in ARCH_ERAS and not era_alias


def arch_era_names() -> str:
    """ARCH_ERAS in words, for --stack's help and `simpar stacks`."""
    return "; ".join(
        f"{family} on {', '.join(archs)} GPUs: {profile}"
        for family, eras in ARCH_ERAS.items()
        for profile in dict.fromkeys(eras.values())
        for archs in [[a for a, p in eras.items() if p == profile]])


def stack_on(name: str, arch: str) -> str:
    """The profile the plain stack name `name` prices on a GPU of architecture `arch`
    (ARCH_ERAS), or `name` where the architecture has no era of its own."""
    return ARCH_ERAS.get(name, {}).get(arch, name)


def stack_name(name: str) -> str:
    """The profile a user's name for a stack means (names.canonical, with STACK_ALIASES), also
    as NAME@VERSION or NAME-VERSION for a stack with eras (STACK_ERAS: `megatron@2022`,
    `deepspeed@0.5.8`, `torchtitan-0.1`); a name that is none of them comes back as typed, for
    one_of to refuse."""
    known = canonical(name, STACKS, STACK_ALIASES)
    if not isinstance(name, str) or known in STACKS:
        return known
    family, sep, version = _family_and_version(name)
    release = _version(version)
    if not sep or family not in STACK_ERAS or release is None:
        return name
    in_range = [(first, profile) for first, profile in STACK_ERAS[family]
                if (first[0] >= YEAR) == (release[0] >= YEAR) and first <= release]
    return max(in_range)[1] if in_range else name


def version_refusal(name: str) -> str:
    """Why `name`, a known stack with a version stack_name could not place, names no profile
    (`nemo@25.02`: one profile; `megatron@next`: no release or year); "" for any other name."""
    family, sep, version = _family_and_version(name)
    if not sep or family not in STACKS:
        return ""
    if family not in STACK_ERAS:
        return (f"{family} has one profile whatever its release: give --stack {family}, and "
                "--attention, --fp8-scaling, --loss or --optimizer where that release ran "
                "otherwise")
    latest = ".".join(map(str, STACK_ERAS[family][-1][0]))
    return (f"{version!r} is no release or year of {family}; give one, e.g. {family}@{latest} "
            "(`simpar stacks` lists the ranges)")


def era_names() -> str:
    """STACK_ERAS in words, for --stack's help and `simpar stacks`: per stack, the profile of each
    range of releases and of years."""
    out = []
    for family, eras in STACK_ERAS.items():
        kinds = []
        for years in (False, True):
            rows = [(first, profile) for first, profile in eras if (first[0] >= YEAR) == years]
            kinds.append(("years: " if years else "releases: ") + ", ".join(
                profile if i == 0 else f"{'.'.join(map(str, first))}+ {profile}"
                for i, (first, profile) in enumerate(rows)))
        out.append(f"{family} ({'; '.join(kinds)})")
    return "; ".join(out)


def era_versions(profile: str) -> list[str]:
    """The NAME@VERSION spellings that pick `profile`, each the first of its range ("megatron@2023",
    and from there on), for `simpar stacks --json`."""
    return [f"{family}@{'.'.join(map(str, first))}" for family, eras in STACK_ERAS.items()
            for first, name in eras if name == profile]


def _family_and_version(name: str) -> tuple[str, str, str]:
    """NAME@VERSION or NAME-VERSION as (the stack NAME means, the separator, VERSION); the
    separator is "" where the name has none."""
    key = normal_form(name)
    family, sep, version = key.partition("@") if "@" in key else key.rpartition("-")
    return canonical(family, STACKS, STACK_ALIASES), sep, version


def family_of(profile: str) -> str:
    """The stack whose eras include `profile` (megatron for megatron-2021), or `profile`."""
    return next((family for family, eras in STACK_ERAS.items()
                 if any(name == profile for _, name in eras)), profile)


def _version(text: str) -> tuple[int, ...] | None:
    """`2022`, `0.5.8`, `v0.2` or a Megatron core release tag (`core_r0.8.0`, in normal form
    `core-r0.8.0`) as a tuple of numbers; None where it is none of those."""
    parts = text.removeprefix("core-r").removeprefix("v").split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else None


@lru_cache(maxsize=64)
def get_stack(name: str, compile: bool = False, adam: str = "", grad_reduce: str = "",
              norm: str = "", attention: str = "", fsdp: bool = True, *,
              fp8_scaling: str = "", fp8_all_gather: bool | None = None,
              pipeline_outputs: str = "", cuda_graphs: bool = False,
              moe_dispatch: str = "", fold_experts: bool | None = None) -> Stack:
    """The profile of stack `name`, compiled or not, running torch's AdamW as `adam`, reducing
    gradients in `grad_reduce`, running its norms as `norm`, its attention with `attention`,
    scaling per-tensor fp8 as `fp8_scaling` ("": as the stack does), gathering fp8 linears'
    weights in fp8 or not (`fp8_all_gather`; None: as the stack does) and keeping
    `pipeline_outputs` of its pipeline stages' outputs ("": as the stack does), replaying CUDA
    graphs or launching each kernel (`cuda_graphs`), dispatching MoE tokens as `moe_dispatch`
    ("": as the stack does), running routed experts whole under tp or not (`fold_experts`; None:
    as the stack does), with FSDP or without it."""
    name = stack_name(name)
    one_of("stack", name, tuple(STACKS))
    stack = STACKS[name].compiled(compile).graphed(cuda_graphs)
    if not fsdp:
        stack = stack.without_fsdp()
    if adam:
        one_of("optimizer", adam, ADAM_IMPLS)
        stack = stack.with_adam(adam)
    if grad_reduce:
        stack = stack.with_grad_reduce(grad_reduce)
    if norm:
        stack = stack.with_norm(norm)
    if attention:
        stack = stack.with_attention(attention)
    if fp8_scaling:
        stack = stack.with_fp8_scaling(fp8_scaling)
    if fp8_all_gather is not None:
        stack = stack.with_fp8_all_gather(fp8_all_gather)
    if pipeline_outputs:
        stack = stack.with_pipeline_outputs(pipeline_outputs)
    if moe_dispatch:
        stack = stack.with_moe_dispatch(moe_dispatch)
    if fold_experts is not None:
        stack = stack.with_folded_experts(fold_experts)
    return stack
