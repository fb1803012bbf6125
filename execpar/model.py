"""A decoder-only transformer built from a simpar ModelSpec: RMSNorm, rotary embeddings,
grouped-query attention, gated (SwiGLU) or GELU MLP or routed mixture-of-experts, tied or
untied embeddings. Written once, usable at tiny sizes on a CPU. Layers live in a
ModuleDict keyed by their index, so a pipeline stage keeps its own and drops the rest, and
the embedding, final norm and output layer may be None on stages that do not hold them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from simpar.specs.stack import LOSS_CHUNK_TOKENS

if TYPE_CHECKING:
    from simpar.specs.model import ModelSpec


def rotary(x: torch.Tensor, positions: torch.Tensor | None = None,
           theta: float = 10000.0) -> torch.Tensor:
    """Rotate pairs of channels of x (batch, seq, heads, head_dim) by position-dependent angles;
    `positions`: each token's place in the whole sequence (None: 0, 1, ...)."""
    seq, dim = x.shape[1], x.shape[-1]
    freqs = 1.0 / theta ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim)
    if positions is None:
        positions = torch.arange(seq, device=x.device)
    angles = torch.outer(positions.to(torch.float32), freqs)
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.type_as(x)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.head_dim = spec.head_dim
        self.wq = nn.Linear(spec.hidden, spec.heads * spec.head_dim, bias=False)
        self.wk = nn.Linear(spec.hidden, spec.kv_heads * spec.head_dim, bias=False)
        self.wv = nn.Linear(spec.hidden, spec.kv_heads * spec.head_dim, bias=False)
        self.wo = nn.Linear(spec.heads * spec.head_dim, spec.hidden, bias=False)
        # each head of q and k normed before the rotary (ModelSpec.qk_norm: Qwen3's q_norm and
        # k_norm)
        self.q_norm = nn.RMSNorm(spec.head_dim, eps=1e-5) if spec.qk_norm else None
        self.k_norm = nn.RMSNorm(spec.head_dim, eps=1e-5) if spec.qk_norm else None
        self.core = CausalAttention()
        # under context parallelism the places of this rank's tokens in the whole sequence
        # (execpar.parallelize.apply_cp); None: the rank holds the whole sequence
        self.positions: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds heads/tp of them
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotary(q, self.positions), rotary(k, self.positions)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        if self.core.ring and k.shape[2] != q.shape[2]:
            groups = q.shape[2] // k.shape[2]
            k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
        out = self.core(*(t.transpose(1, 2) for t in (q, k, v)))
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class CausalAttention(nn.Module):
    """softmax(q k^T) v under the causal mask, q, k, v as (batch, heads, seq, head_dim): its own
    module, so that context parallelism can take it over (execpar.parallelize.apply_cp): torch's
    ring attention on CUDA, or, where torch has no context-parallel kernel (CPU), the keys and
    values of the whole sequence gathered and masked by position (`gathered`)."""

    def __init__(self) -> None:
        super().__init__()
        # (process group name, this rank's query positions, the gathered keys' positions)
        self.gathered: tuple[str, torch.Tensor, torch.Tensor] | None = None
        # torch's ring attention takes this module over (CUDA): its handlers call the fused
        # kernels with as many K/V heads as query heads, so Attention expands grouped K/V before
        # the call (as torchtitan's repeat_kv does)
        self.ring = False

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        gqa = q.shape[1] != k.shape[1]
        if self.gathered is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        from torch.distributed.tensor.experimental._context_parallel import flex_cp_allgather

        group, q_pos, k_pos = self.gathered
        # torch's own all-gather of context-parallel K/V: a reduce-scatter of their gradients
        k, v = flex_cp_allgather(k, v, 2, group)
        mask = q_pos[:, None] >= k_pos[None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


class FeedForward(nn.Module):
    def __init__(self, spec: ModelSpec, width: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(spec.hidden, width, bias=False)
        self.w2 = nn.Linear(width, spec.hidden, bias=False)
        # None: GELU MLP
        self.w3 = nn.Linear(spec.hidden, width, bias=False) if spec.gated_mlp else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))


class MoE(nn.Module):
    """Routed experts, each token to its experts_per_token best by the router (their
    weights a softmax over the chosen experts' logits, as Mixtral), plus the shared
    experts every token passes. Under expert parallelism (`ep_group`, set by
    execpar.parallelize.apply_ep) a rank holds a contiguous block of the experts, and
    tokens travel to their expert's rank and back by torch's differentiable all-to-all.
    The experts run as torch's grouped GEMM (torch._grouped_mm, as torchtitan's
    GroupedExperts): one kernel per weight for all experts, their row groups given by
    offsets on the device, so the host neither waits for the routing nor issues a kernel
    per expert."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        h, f, e = spec.hidden, spec.ffn_hidden, spec.experts
        self.top_k, self.experts = spec.experts_per_token, e
        # group-limited routing (ModelSpec.expert_groups): experts only from the token's best
        # groups_per_token groups, a group scored by its best expert (DeepSeek-V2's
        # group_limited_greedy)
        self.groups, self.groups_per_token = spec.expert_groups, spec.groups_per_token
        self.router = nn.Linear(h, e, bias=False)
        self.w1 = nn.Parameter(torch.empty(e, h, f))
        self.w2 = nn.Parameter(torch.empty(e, f, h))
        # None: GELU experts
        self.w3 = nn.Parameter(torch.empty(e, h, f)) if spec.gated_mlp else None
        width = spec.shared_experts * spec.shared_ffn_hidden
        self.shared = FeedForward(spec, width) if width else None
        self.ep_group = None
        # the weights' 16-bit copies under autocast: (the weight's version, the copy), made once a
        # step as autocast makes those of nn.Linear weights, and dropped with them (StepAutocast)
        self.casts: dict[str, tuple[int, torch.Tensor]] = {}

    def _limited(self, logits: torch.Tensor) -> torch.Tensor:
        """The router's logits with the experts of all but each token's best groups masked."""
        if not self.groups or self.groups_per_token >= self.groups:
            return logits
        by_group = logits.view(logits.shape[0], self.groups, -1)
        best = by_group.amax(-1).topk(self.groups_per_token, dim=-1).indices
        keep = torch.zeros_like(by_group[..., 0], dtype=torch.bool).scatter_(1, best, True)
        return by_group.masked_fill(~keep[..., None], float("-inf")).view_as(logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        tokens = x.reshape(-1, h)
        top, chosen = self._limited(self.router(tokens)).topk(self.top_k, dim=-1)
        weights = top.float().softmax(-1).type_as(x)
        order = chosen.flatten().argsort(stable=True)  # (token, choice) pairs grouped by expert
        counts = torch.bincount(chosen.flatten(), minlength=self.experts)
        out = self._routed(tokens[order // self.top_k], counts)[order.argsort()]
        y = (out.view(-1, self.top_k, h) * weights.unsqueeze(-1)).sum(1)
        if self.shared is not None:
            y = y + self.shared(tokens)
        return y.view(b, s, h)

    def _routed(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Each expert's FFN on its rows (grouped by expert), sent to the expert's rank
        and back under EP."""
        if self.ep_group is None:
            return self._local(rows, counts)
        import torch.distributed as dist
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        ep, local = dist.get_world_size(self.ep_group), self.w1.shape[0]
        # [source rank, my local expert]: rows each source sends each
        got_counts = torch.empty_like(counts)
        dist.all_to_all_single(got_counts, counts, group=self.ep_group)
        got_counts = got_counts.view(ep, local)
        # the all-to-all's split sizes are the host's: it waits for the routing here
        send, recv = counts.view(ep, local).sum(1).tolist(), got_counts.sum(1).tolist()
        got = all_to_all_single_autograd(rows, recv, send, self.ep_group)
        expert_of = (
            torch.arange(local, device=rows.device)
            .repeat(ep)
            .repeat_interleave(got_counts.flatten())
        )
        by_expert = expert_of.argsort(stable=True)
        done = self._local(got[by_expert], got_counts.sum(0))[by_expert.argsort()]
        return all_to_all_single_autograd(done, send, recv, self.ep_group)

    def _local(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The local experts' FFN on `rows`, grouped by expert (`counts` rows each). Autocast
        does not cover the grouped GEMM, so it casts here what autocast would: the rows and
        weights to the autocast type (FSDP2's mixed precision has cast the weights already)."""
        device = rows.device.type
        dtype = (torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device)
                 else rows.dtype)
        offsets = torch.cumsum(counts, 0, dtype=torch.int32)
        rows = rows.to(dtype)

        def grouped(x: torch.Tensor, name: str) -> torch.Tensor:
            w = self._weight(name, dtype)
            if dtype == torch.bfloat16:
                return torch._grouped_mm(x, w, offs=offsets)
            return _eager_grouped_mm(x, w, offsets)

        up = grouped(rows, "w1")
        inner = F.silu(up) * grouped(rows, "w3") if self.w3 is not None else F.gelu(up)
        return grouped(inner, "w2")

    def _weight(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        """Weight `name` in `dtype`: cast once a step where autograd records it, so that the
        step's micro-batches and recomputes share the copy (as autocast's cache shares those
        of nn.Linear weights); a weight changed in place since (its version) is cast again."""
        w = getattr(self, name)
        if w.dtype == dtype or not torch.is_grad_enabled() or torch.compiler.is_compiling():
            return w.to(dtype)
        hit = self.casts.get(name)
        if hit is None or hit[0] != w._version or hit[1].dtype != dtype:
            hit = self.casts[name] = (w._version, w.to(dtype))
        return hit[1]


@torch.compiler.disable
def _eager_grouped_mm(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """torch._grouped_mm outside torch.compile: what compile traces (its meta kernel) takes bf16
    only, where the eager op falls back to a loop for other dtypes (fp32 on a CPU, fp16)."""
    return torch._grouped_mm(x, w, offs=offsets)


class StepAutocast:
    """torch.autocast around a training step, reusable step after step; on leaving it, the MoE
    layers of `model` drop their weights' 16-bit copies, as autocast drops its cache."""

    def __init__(self, device_type: str, dtype: torch.dtype, model: nn.Module) -> None:
        self.device_type, self.dtype = device_type, dtype
        self.moes = [m for m in model.modules() if isinstance(m, MoE)]
        self.inner: torch.autocast | None = None

    def __enter__(self) -> None:
        self.inner = torch.autocast(self.device_type, dtype=self.dtype)
        self.inner.__enter__()

    def __exit__(self, *exc) -> None:
        assert self.inner is not None
        self.inner.__exit__(*exc)
        for module in self.moes:
            module.casts.clear()


class Block(nn.Module):
    def __init__(self, spec: ModelSpec, index: int) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(spec.hidden, eps=1e-5)
        self.attention = Attention(spec)
        self.ffn_norm = nn.RMSNorm(spec.hidden, eps=1e-5)
        self.feed_forward: MoE | FeedForward
        if spec.is_moe and index >= spec.dense_layers:
            self.feed_forward = MoE(spec)
        else:
            self.feed_forward = FeedForward(
                spec, spec.dense_ffn_hidden if spec.is_moe else spec.ffn_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        # None on pipeline stages that do not hold them (execpar.pipeline.keep_chunk)
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(spec.vocab, spec.hidden)
        self.layers = nn.ModuleDict({str(i): Block(spec, i) for i in range(spec.layers)})
        self.norm: nn.RMSNorm | None = nn.RMSNorm(spec.hidden, eps=1e-5)
        self.output: nn.Linear | None = nn.Linear(spec.hidden, spec.vocab, bias=False)
        if spec.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.init_weights()

    def init_weights(self, std: float = 0.02) -> None:
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy in fp32, LOSS_CHUNK_TOKENS tokens at a time: each chunk runs
    under activation checkpointing, so the fp32 logits, log-probabilities and their
    gradient exist for one chunk at a time (for the whole micro-batch they are 12 bytes
    per logit: 15.7 GiB at 32K tokens of a 128K vocabulary)."""
    flat, target = logits.flatten(0, 1), labels.flatten(0, 1)
    total = sum(
        checkpoint(_cross_entropy_sum, x, t, use_reentrant=False)
        for x, t in zip(flat.split(LOSS_CHUNK_TOKENS), target.split(LOSS_CHUNK_TOKENS), strict=True)
    )
    return total / target.numel()


def _cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels, reduction="sum")
