"""The work of one transformer layer, on one rank, for one micro-batch, under a strategy.

Forward work only; the cost layer derives backward and recompute from it. Sizes are per rank: GEMM
widths divided by tp, tokens divided by cp, experts divided by ep."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Gemm:
    name: str
    m: int  # rows of the activation (tokens)
    n: int  # output features
    k: int  # reduction dimension
    count: int = 1  # independent GEMMs of this shape (batched heads, local experts)

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count


@dataclass(frozen=True)
class Comm:
    op: str  # allreduce | allgather | reducescatter | alltoall | p2p
    group: str  # tp | cp | ep
    size_bytes: float  # message size per rank, nccl-tests convention (the full tensor for allreduce)
    count: int = 1


@dataclass(frozen=True)
class LayerWork:
    gemms: tuple[Gemm, ...]  # weight GEMMs (and, without flash attention, the attention GEMMs)
    attention_gemms: tuple[Gemm, ...]  # unfused attention: QK^T and AV as batched GEMMs
    flash_attention_flops: float  # executed FLOPs of a fused attention kernel (causal half skipped)
    elementwise_bytes: float  # memory-bound kernels: norms, residuals, activation, rotary, dropout
    softmax_bytes: float  # unfused attention softmax (+ dropout): recomputed by selective recompute
    comms: tuple[Comm, ...]  # forward collectives on the critical path (tp, ep)
    cp_kv_chunk_bytes: float  # context parallel: KV chunk passed round the ring cp-1 times per forward
    cp_steps: int


def act_bytes(dtype: str) -> int:
    """Bytes per activation element: 16-bit for bf16/fp16/fp8 training (fp8 only inside GEMMs)."""
    return 4 if dtype in ("fp32", "tf32") else 2


def gemm_input_bytes(dtype: str) -> int:
    return {"fp32": 4, "tf32": 4, "fp8": 1}.get(dtype, 2)


@lru_cache(maxsize=4096)
def layer_work(model, seq_len: int, micro_batch: int, tp: int, cp: int, ep: int, sp: bool,
               flash: bool, dtype: str) -> LayerWork:
    h, q, kv, f = model.hidden, model.q_dim, model.kv_dim, model.ffn_hidden
    a, k_top, e = model.heads, model.experts_per_token, model.experts
    tokens = micro_batch * seq_len // cp  # tokens this rank computes
    ab = act_bytes(dtype)
    up = (2 if model.gated_mlp else 1) * f

    gemms = [Gemm("qkv", tokens, (q + 2 * kv) // tp, h), Gemm("proj", tokens, h, q // tp)]
    if model.is_moe:
        # Balanced routing: each of the e/ep local experts receives tokens*k*ep/e tokens.
        per_expert = max(1, tokens * k_top * ep // e)
        gemms += [Gemm("router", tokens, e, h),
                  Gemm("mlp_up", per_expert, up // tp, h, e // ep), Gemm("mlp_down", per_expert, h, f // tp, e // ep)]
    else:
        gemms += [Gemm("mlp_up", tokens, up // tp, h), Gemm("mlp_down", tokens, h, f // tp)]

    # Attention core: queries of this rank against all keys of the sequence.
    heads_local = a // tp
    attention_gemms: tuple[Gemm, ...] = ()
    flash_flops = 0.0
    softmax_bytes = 0.0
    if flash:
        flash_flops = 0.5 * 4.0 * tokens * seq_len * q / tp  # causal: the kernel skips masked blocks
    else:
        s_q = seq_len // cp
        attention_gemms = (Gemm("scores", s_q, seq_len, model.head_dim, micro_batch * heads_local),
                           Gemm("context", s_q, model.head_dim, seq_len, micro_batch * heads_local))
        # fused scale-mask-softmax reads and writes the scores; dropout reads, writes and stores a mask
        softmax_bytes = tokens * heads_local * seq_len * (2 * ab + (2 * ab + 1 if model.dropout else 0))

    # Memory-bound kernels per token; the per-hidden ones are split by tp only with sequence parallel.
    rep = 1.0 / tp if sp else 1.0
    per_hidden = 2 * 2 * ab * h  # two norms: read + write
    per_hidden += 2 * (3 * ab * h + (h if model.dropout else 0))  # two residual(+dropout) adds
    per_shard = (3 if model.gated_mlp else 2) * ab * f * (k_top if model.is_moe else 1) / tp  # activation fn
    if model.position_embeddings == 0:
        per_shard += 2 * ab * (q + kv) / tp  # rotary on q and k: read + write
    if dtype == "fp8":
        per_shard += 3 * (2 * h + q / tp + f / tp)  # casts of GEMM inputs to fp8: read 2 B, write 1 B
    elementwise = tokens * (per_hidden * rep + per_shard)

    act = tokens * h * ab
    comms = []
    if tp > 1:
        comms += ([Comm("allgather", "tp", act, 2), Comm("reducescatter", "tp", act, 2)] if sp
                  else [Comm("allreduce", "tp", act, 2)])
    if ep > 1:
        comms.append(Comm("alltoall", "ep", act * k_top / tp, 2))  # dispatch and combine
    cp_kv = (tokens * 2 * kv // tp) * ab if cp > 1 else 0.0
    return LayerWork(tuple(gemms), attention_gemms, flash_flops, elementwise, softmax_bytes, tuple(comms), cp_kv, cp - 1)


@lru_cache(maxsize=1024)
def head_work(model, seq_len: int, micro_batch: int, tp: int, cp: int, sp: bool, dtype: str) -> LayerWork:
    """The output layer and loss on the last stage (the embedding lookup is negligible)."""
    tokens = micro_batch * seq_len // cp
    ab = act_bytes(dtype)
    logits = Gemm("logits", tokens, model.vocab // tp + (model.vocab % tp > 0), model.hidden)
    # Vocab-parallel cross entropy in fp32 (Megatron-LM, torchtitan): cast the 16-bit logits to fp32 and
    # make max, exp-sum and normalise passes (~22 B per logit); backward rewrites the fp32 softmax as the
    # gradient and casts it back (~18 B); the cost layer charges this forward traffic twice for both.
    ce_bytes = tokens * (model.vocab / tp) * 20
    norm = tokens * model.hidden * 2 * ab / (tp if sp else 1)
    comms = (Comm("allgather", "tp", tokens * model.hidden * ab, 1),) if (tp > 1 and sp) else ()
    return LayerWork((logits,), (), 0.0, ce_bytes + norm, 0.0, comms, 0.0, 0)
