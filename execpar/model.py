"""A decoder-only transformer built from a simpar ModelSpec: RMSNorm, rotary embeddings, grouped-query
attention, gated (SwiGLU) or GELU MLP, tied or untied embeddings. Written once, usable at tiny sizes on a
CPU. Layers live in a ModuleDict keyed by their index, so a pipeline stage keeps its own and drops the
rest, and the embedding, final norm and output layer may be None on stages that do not hold them."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from simpar.specs.stack import LOSS_CHUNK_TOKENS


def rotary(x: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotate pairs of channels of x (batch, seq, heads, head_dim) by position-dependent angles."""
    seq, dim = x.shape[1], x.shape[-1]
    freqs = 1.0 / theta ** (torch.arange(0, dim, 2, device=x.device, dtype=torch.float32) / dim)
    angles = torch.outer(torch.arange(seq, device=x.device, dtype=torch.float32), freqs)
    cos, sin = angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]
    x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
    out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    return out.type_as(x)


class Attention(nn.Module):
    def __init__(self, spec):
        super().__init__()
        self.head_dim = spec.head_dim
        self.wq = nn.Linear(spec.hidden, spec.heads * spec.head_dim, bias=False)
        self.wk = nn.Linear(spec.hidden, spec.kv_heads * spec.head_dim, bias=False)
        self.wv = nn.Linear(spec.hidden, spec.kv_heads * spec.head_dim, bias=False)
        self.wo = nn.Linear(spec.heads * spec.head_dim, spec.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds heads/tp of them
        q = rotary(self.wq(x).view(b, s, -1, self.head_dim))
        k = rotary(self.wk(x).view(b, s, -1, self.head_dim))
        v = self.wv(x).view(b, s, -1, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, spec):
        super().__init__()
        self.gated = spec.gated_mlp
        self.w1 = nn.Linear(spec.hidden, spec.ffn_hidden, bias=False)
        self.w2 = nn.Linear(spec.ffn_hidden, spec.hidden, bias=False)
        self.w3 = nn.Linear(spec.hidden, spec.ffn_hidden, bias=False) if spec.gated_mlp else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))


class Block(nn.Module):
    def __init__(self, spec):
        super().__init__()
        self.attention_norm = nn.RMSNorm(spec.hidden, eps=1e-5)
        self.attention = Attention(spec)
        self.ffn_norm = nn.RMSNorm(spec.hidden, eps=1e-5)
        self.feed_forward = FeedForward(spec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, spec):
        super().__init__()
        if spec.is_moe:
            raise ValueError("mixture-of-experts models are not supported by execpar yet")
        self.spec = spec
        self.tok_embeddings = nn.Embedding(spec.vocab, spec.hidden)
        self.layers = nn.ModuleDict({str(i): Block(spec) for i in range(spec.layers)})
        self.norm = nn.RMSNorm(spec.hidden, eps=1e-5)
        self.output = nn.Linear(spec.hidden, spec.vocab, bias=False)
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
    """Mean cross entropy in fp32, LOSS_CHUNK_TOKENS tokens at a time: each chunk runs under activation
    checkpointing, so the fp32 logits, log-probabilities and their gradient exist for one chunk at a time
    (for the whole micro-batch they are 12 bytes per logit: 15.7 GiB at 32K tokens of a 128K vocabulary)."""
    flat, target = logits.flatten(0, 1), labels.flatten(0, 1)
    total = sum(checkpoint(_cross_entropy_sum, x, t, use_reentrant=False)
                for x, t in zip(flat.split(LOSS_CHUNK_TOKENS), target.split(LOSS_CHUNK_TOKENS), strict=True))
    return total / target.numel()


def _cross_entropy_sum(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels, reduction="sum")
