"""ModelSpec: a decoder-only transformer (dense or mixture-of-experts), and its parameter counts."""

from __future__ import annotations

from dataclasses import dataclass, fields

from simpar.errors import SpecError, positive_int, require


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int  # per expert for MoE models
    vocab: int
    gated_mlp: bool = True  # SwiGLU-style (three matrices) vs GELU MLP (two)
    tied_embeddings: bool = False
    experts: int = 1  # 1 means a dense MLP
    experts_per_token: int = 1
    dropout: bool = False  # dropout masks are stored for backward (GPT-style training)
    head_dim: int = 0  # 0 means hidden // heads
    bias: bool = False  # GPT-style biases in linear layers and LayerNorm
    position_embeddings: int = 0  # learned absolute positions (GPT); 0 = rotary (no parameters)

    def __post_init__(self):
        require(isinstance(self.name, str) and self.name != "", "model.name", self.name, "give the model a name")
        for f in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "experts", "experts_per_token"):
            positive_int(f"model.{f}", getattr(self, f))
        require(self.heads % self.kv_heads == 0, "model.kv_heads", self.kv_heads,
                f"must divide heads ({self.heads}) for grouped-query attention")
        require(self.experts_per_token <= self.experts, "model.experts_per_token", self.experts_per_token,
                f"must be at most experts ({self.experts})")
        if self.head_dim == 0:
            require(self.hidden % self.heads == 0, "model.heads", self.heads,
                    f"must divide hidden ({self.hidden}), or set head_dim")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        positive_int("model.head_dim", self.head_dim)
        require(self.position_embeddings >= 0, "model.position_embeddings", self.position_embeddings, "must be >= 0")

    # --- derived sizes -------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.experts > 1

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def attn_params_per_layer(self) -> int:
        """Q, K, V and output projections."""
        qkv = self.q_dim + 2 * self.kv_dim
        return (self.hidden + self.bias) * qkv + (self.q_dim + self.bias) * self.hidden

    @property
    def mlp_params_per_expert(self) -> int:
        up = (2 if self.gated_mlp else 1) * self.ffn_hidden
        return (self.hidden + self.bias) * up + (self.ffn_hidden + self.bias) * self.hidden

    @property
    def router_params_per_layer(self) -> int:
        return self.hidden * self.experts if self.is_moe else 0

    @property
    def norm_params_per_layer(self) -> int:
        return 2 * self.hidden * (1 + self.bias)

    @property
    def dense_params_per_layer(self) -> int:
        """Parameters of a layer that every data-parallel rank replicates (all but the experts)."""
        return self.attn_params_per_layer + self.router_params_per_layer + self.norm_params_per_layer

    @property
    def expert_params_per_layer(self) -> int:
        return self.experts * self.mlp_params_per_expert

    @property
    def embedding_params(self) -> int:
        return (self.vocab + self.position_embeddings) * self.hidden

    @property
    def output_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @property
    def total_params(self) -> int:
        per_layer = self.dense_params_per_layer + self.expert_params_per_layer
        return self.layers * per_layer + self.embedding_params + self.output_params + self.hidden * (1 + self.bias)

    @property
    def active_params(self) -> int:
        """Parameters that touch each token (MoE: only experts_per_token experts)."""
        per_layer = self.dense_params_per_layer + self.experts_per_token * self.mlp_params_per_expert
        return self.layers * per_layer + self.embedding_params + self.output_params + self.hidden * (1 + self.bias)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict, source: str = "model") -> ModelSpec:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise SpecError(f"{source}.{unknown[0]}", data[unknown[0]], f"unknown key; known keys: {', '.join(sorted(known))}")
        missing = [k for k in ("name", "layers", "hidden", "heads", "ffn_hidden", "vocab") if k not in data]
        if missing:
            raise SpecError(f"{source}.{missing[0]}", None, "is required")
        data = dict(data)
        data.setdefault("kv_heads", data["heads"])
        return cls(**data)
