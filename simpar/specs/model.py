"""ModelSpec: a decoder-only transformer (dense or mixture-of-experts), and its parameter counts."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import cached_property

from simpar.errors import SpecError, positive_int, reject_unknown, require

MAX_LAYERS = 100_000
# widths (hidden, FFN, vocabulary, heads) beyond this are typos: the largest published models
# stay under a million
MAX_WIDTH = 10_000_000


def yarn_mscale(factor: float, mscale: float | None = None,
                mscale_all_dim: float | None = None) -> float:
    """YaRN's concentration factor on the rotary cos and sin, as Megatron core computes it
    (yarn_rotary_pos_embedding.py, _yarn_get_concentration_factor): 0.1 mscale ln(factor) + 1,
    over the same with mscale_all_dim where a config gives both; 1 for a factor of 1 or less."""
    def get(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
    if mscale is None or mscale_all_dim is None:
        return get(factor)
    return get(factor, mscale) / get(factor, mscale_all_dim)


def default_ffn_hidden(hidden: int, gated: bool) -> int:
    """The MLP width Megatron-LM gives a model whose config names none (training/arguments.py,
    validate_args): 4 x hidden, or for a gated MLP two thirds of that (its two input matrices
    keep the parameter count of the 4h one), rounded down to a multiple of 64."""
    return int(4 * hidden * 2 / 3 / 64) * 64 if gated else 4 * hidden


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
    # multi-head latent attention (DeepSeek-V2/V3): queries and keys/values pass through
    # low-rank latents; head_dim is then the per-head query/key width without rotary
    # dims the compressed key-value width; 0 means standard (grouped-query) attention
    kv_lora_rank: int = 0
    q_lora_rank: int = 0  # the query latent width; 0 means queries are projected directly
    rope_head_dim: int = 0  # decoupled rotary dims per head, added to head_dim for queries and keys
    v_head_dim: int = 0  # value width per head; 0 means head_dim
    # shared experts every token passes through beside its routed ones (DeepSeek,
    # Qwen-MoE): replicated like dense weights, computed on every token, no all-to-all
    shared_experts: int = 0
    shared_ffn_hidden: int = 0  # their FFN width each; 0 means ffn_hidden
    # mixture-of-experts models whose first layers are dense (DeepSeek's first_k_dense_replace)
    dense_layers: int = 0
    dense_ffn_hidden: int = 0  # their FFN width; 0 means experts_per_token x ffn_hidden
    # sliding-window attention (Mistral, Gemma, GPT-OSS): a query of a windowed layer attends to
    # the attention_window tokens up to itself; 0: every layer attends to the whole prefix
    attention_window: int = 0
    # how many of the layers are windowed (GPT-OSS: every other one); 0 with a window: all
    windowed_layers: int = 0
    # YaRN's concentration factor on the rotary cos and sin (0.1 ln(factor) + 1 where the config
    # names no mscale, the ratio of its mscale and mscale_all_dim otherwise: Megatron core's
    # _yarn_get_concentration_factor; GPT-OSS's factor 32 gives 1.35, DeepSeek-V3's 1); 1: none
    rope_mscale: float = 1.0
    # an RMSNorm on each head of q and of k before the rotary (Qwen3, Gemma 3, OLMo 2, OLMoE;
    # Megatron core's qk_layernorm, transformers' q_norm and k_norm): a memory-bound kernel each
    # and its input kept for backward
    qk_norm: bool = False
    # group-limited routing (DeepSeek's n_group and topk_group; Megatron core's
    # moe_router_num_groups and moe_router_group_topk): the experts, in expert_groups equal runs,
    # and each token's experts chosen inside the groups_per_token runs its router picks first;
    # 0: any experts
    expert_groups: int = 0
    groups_per_token: int = 0
    # a clamp on each half of the gated MLP's input before the activation (GPT-OSS's swiglu_limit
    # of 7: the gate at most 7, the linear half within +-7; Megatron core's
    # activation_func_clamp_value); 0: none
    glu_clamp: float = 0.0

    def __post_init__(self):
        require(
            isinstance(self.name, str) and self.name != "", "model.name", self.name,
            "give the model a name")
        for f in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "experts",
                  "experts_per_token"):
            positive_int(f"model.{f}", getattr(self, f))
        for f in ("hidden", "heads", "ffn_hidden", "vocab", "experts"):
            require(getattr(self, f) <= MAX_WIDTH, f"model.{f}", getattr(self, f),
                    f"is beyond {MAX_WIDTH:,}; check the model file")
        for f in ("gated_mlp", "tied_embeddings", "dropout", "bias", "qk_norm"):
            require(isinstance(getattr(self, f), bool), f"model.{f}", getattr(self, f),
                    "give true or false")
        # pipelines place layers one by one: a typo of 10^11 layers would fill memory
        # instead of answering
        require(
            self.layers <= MAX_LAYERS, "model.layers", self.layers,
            f"is beyond {MAX_LAYERS:,} (the largest published models have a few hundred); check "
            "the model file")
        require(self.heads % self.kv_heads == 0, "model.kv_heads", self.kv_heads,
                f"must divide heads ({self.heads}) for grouped-query attention")
        require(self.experts_per_token <= self.experts, "model.experts_per_token",
                self.experts_per_token, f"must be at most experts ({self.experts})")
        if self.head_dim == 0:
            require(self.hidden % self.heads == 0, "model.heads", self.heads,
                    f"must divide hidden ({self.hidden}), or set head_dim")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        positive_int("model.head_dim", self.head_dim)
        require(self.head_dim <= MAX_WIDTH, "model.head_dim", self.head_dim,
                f"is beyond {MAX_WIDTH:,}; check the model file")
        for f in ("position_embeddings", "kv_lora_rank", "q_lora_rank", "rope_head_dim",
                  "v_head_dim", "dense_layers", "dense_ffn_hidden", "shared_experts",
                  "shared_ffn_hidden", "attention_window", "windowed_layers", "expert_groups",
                  "groups_per_token"):
            value = getattr(self, f)
            require(isinstance(value, int) and not isinstance(value, bool) and
                    0 <= value <= MAX_WIDTH, f"model.{f}", value,
                    f"must be a whole number from 0 to {MAX_WIDTH:,}")
        clamp = self.glu_clamp
        require(isinstance(clamp, (int, float)) and not isinstance(clamp, bool)
                and 0 <= clamp <= MAX_WIDTH, "model.glu_clamp", clamp,
                "give the clamp on the gated MLP's input, a number from 0 (none)")
        require(clamp == 0 or self.gated_mlp, "model.glu_clamp", clamp,
                "clamps the halves of a gated MLP: set gated_mlp true, or 0")
        mscale = self.rope_mscale
        require(isinstance(mscale, (int, float)) and not isinstance(mscale, bool)
                and 0 < mscale <= 100, "model.rope_mscale", mscale,
                "give YaRN's concentration factor, a number above 0 (1: plain rotary)")
        require(self.kv_lora_rank > 0 or (self.q_lora_rank == 0 and self.rope_head_dim == 0),
                "model.kv_lora_rank", self.kv_lora_rank,
                "q_lora_rank and rope_head_dim belong to latent attention: set kv_lora_rank too")
        require(self.kv_lora_rank == 0 or self.kv_heads == self.heads, "model.kv_heads",
                self.kv_heads,
                "latent attention has one key and value per head: set kv_heads = heads")
        self._check_expert_groups()
        require(self.dense_layers < self.layers, "model.dense_layers", self.dense_layers,
                f"must be below layers ({self.layers})")
        require(self.windowed_layers <= self.layers, "model.windowed_layers",
                self.windowed_layers, f"must be at most layers ({self.layers})")
        require(self.attention_window > 0 or self.windowed_layers == 0, "model.windowed_layers",
                self.windowed_layers, "windowed layers need attention_window (tokens): set it")
        if self.attention_window and self.windowed_layers == 0:
            object.__setattr__(self, "windowed_layers", self.layers)
        if self.v_head_dim == 0:
            object.__setattr__(self, "v_head_dim", self.head_dim)
        if self.shared_experts and self.shared_ffn_hidden == 0:
            object.__setattr__(self, "shared_ffn_hidden", self.ffn_hidden)
        if self.dense_layers and self.dense_ffn_hidden == 0:
            object.__setattr__(self, "dense_ffn_hidden", self.ffn_width_per_token)

    def _check_expert_groups(self) -> None:
        g, chosen = self.expert_groups, self.groups_per_token
        if not g:
            require(chosen == 0, "model.groups_per_token", chosen,
                    "group-limited routing needs expert_groups too: set it, or 0")
            return
        require(self.experts % g == 0, "model.expert_groups", g,
                f"must divide experts ({self.experts}) into equal groups")
        require(1 <= chosen <= g, "model.groups_per_token", chosen,
                f"give 1 to {g} (expert_groups): the groups a token's experts come from")
        require(chosen * self.experts // g >= self.experts_per_token, "model.groups_per_token",
                chosen, f"its groups must hold the token's {self.experts_per_token} experts")

    # --- derived sizes -------------------------------------------------------------------------
    @cached_property
    def is_moe(self) -> bool:
        return self.experts > 1

    @cached_property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @cached_property
    def q_dim(self) -> int:
        """Query width: heads x (head_dim + rotary dims)."""
        return self.heads * (self.head_dim + self.rope_head_dim)

    @cached_property
    def kv_dim(self) -> int:
        """Key width (values use v_dim): kv_heads x (head_dim + rotary dims)."""
        return self.kv_heads * (self.head_dim + self.rope_head_dim)

    @cached_property
    def v_dim(self) -> int:
        return self.kv_heads * self.v_head_dim

    @cached_property
    def out_dim(self) -> int:
        """Attention output width, the output projection's input."""
        return self.heads * self.v_head_dim

    @cached_property
    def rotary_dim(self) -> int:
        """Query and key elements rotary embedding touches per token (none with learned
        positions)."""
        if self.position_embeddings:
            return 0
        if self.is_mla:
            return (self.heads + 1) * self.rope_head_dim  # per-head query dims, one shared key part
        return self.q_dim + self.kv_dim

    def attention_spans(self, seq_len: int) -> tuple[tuple[float, int], ...]:
        """(share of the layers, keys a query may attend to) of the full-attention layers and the
        windowed ones, those present: seq_len, or the window where shorter."""
        windowed = self.windowed_layers / self.layers
        spans = ((1.0 - windowed, seq_len), (windowed, min(self.attention_window, seq_len)))
        return tuple((share, keys) for share, keys in spans if share > 0)

    def attention_linears(self) -> tuple:
        """(name, inputs, outputs, tensor-parallel split) of the attention projections in
        execution order: "out" splits the outputs over tp (column parallel), "in" the inputs (row
        parallel), "none" keeps the weight whole on every rank (the latent down-projections)."""
        h = self.hidden
        if not self.is_mla:
            return (("wq", h, self.q_dim, "out"), ("wk", h, self.kv_dim, "out"),
                    ("wv", h, self.v_dim, "out"), ("wo", self.out_dim, h, "in"))
        q = (("wq_a", h, self.q_lora_rank, "none"), ("wq_b", self.q_lora_rank, self.q_dim, "out")) \
            if self.q_lora_rank else (("wq", h, self.q_dim, "out"),)
        kv = (("wkv_a", h, self.kv_lora_rank + self.rope_head_dim, "none"),
              ("wkv_b", self.kv_lora_rank, self.heads * (self.head_dim + self.v_head_dim), "out"))
        return q + kv + (("wo", self.out_dim, h, "in"),)

    @cached_property
    def attn_params_per_layer(self) -> int:
        """Query, key, value (or latent) and output projections."""
        return sum((n_in + self.bias) * n_out for _, n_in, n_out, _ in self.attention_linears())

    def mlp_params(self, ffn: int) -> int:
        up = (2 if self.gated_mlp else 1) * ffn
        return (self.hidden + self.bias) * up + (ffn + self.bias) * self.hidden

    @cached_property
    def mlp_params_per_expert(self) -> int:
        return self.mlp_params(self.ffn_hidden)

    @cached_property
    def shared_params_per_layer(self) -> int:
        return (
            self.shared_experts * self.mlp_params(self.shared_ffn_hidden)
            if self.shared_experts
            else 0
        )

    @cached_property
    def ffn_width_per_token(self) -> int:
        """MLP inner width a token passes through in one layer: its routed experts and
        the shared ones."""
        routed = self.ffn_hidden * self.experts_per_token
        return routed + self.shared_experts * self.shared_ffn_hidden

    @cached_property
    def router_params_per_layer(self) -> int:
        return self.hidden * self.experts if self.is_moe else 0

    @cached_property
    def norm_params_per_layer(self) -> int:
        return 2 * self.hidden * (1 + self.bias)

    @cached_property
    def dense_params_per_layer(self) -> int:
        """Parameters of a layer that every data-parallel rank replicates (all but the
        routed experts)."""
        return (self.attn_params_per_layer + self.router_params_per_layer +
                self.norm_params_per_layer + self.shared_params_per_layer)

    @cached_property
    def expert_params_per_layer(self) -> int:
        return self.experts * self.mlp_params_per_expert

    @cached_property
    def embedding_params(self) -> int:
        return (self.vocab + self.position_embeddings) * self.hidden

    @cached_property
    def output_params(self) -> int:
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    @cached_property
    def dense_layer_correction(self) -> int:
        """Parameters the first dense layers of an MoE model have beyond (negative:
        short of) an MoE layer's attention and norms: their one FFN instead of the
        experts and router. The cost model prices every layer as an MoE layer (DeepSeek
        sizes the dense FFN to an MoE layer's active width)."""
        if not self.dense_layers:
            return 0
        ffn = self.mlp_params(self.dense_ffn_hidden)
        moe = (self.expert_params_per_layer + self.router_params_per_layer
               + self.shared_params_per_layer)
        return self.dense_layers * (ffn - moe)

    @cached_property
    def total_params(self) -> int:
        per_layer = self.dense_params_per_layer + self.expert_params_per_layer
        return (self.layers * per_layer + self.dense_layer_correction + self.embedding_params +
                self.output_params + self.hidden * (1 + self.bias))

    @cached_property
    def active_params(self) -> int:
        """Parameters that touch each token (MoE: only experts_per_token experts)."""
        experts = self.experts_per_token * self.mlp_params_per_expert
        per_layer = self.dense_params_per_layer + experts
        return (
            self.layers * per_layer
            + self.embedding_params
            + self.output_params
            + self.hidden * (1 + self.bias)
        )

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict, source: str = "model") -> ModelSpec:
        """A model from its file's mapping (at `source`, a file name or "model"): ModelSpec's
        keys, or Megatron's and llm-foundry's for the same (MODEL_KEY_SYNONYMS); a key left null
        or out takes its default (kv_heads: heads, ffn_hidden: the MLP's usual width, name: the
        file's stem)."""
        known = {f.name for f in fields(cls)}
        data = _schema_keys(data, source, known)
        if "name" not in data and source != "model":
            data["name"] = source.rsplit(".", 1)[0]
        missing = [k for k in ("name", "layers", "hidden", "heads", "vocab") if k not in data]
        if missing:
            raise SpecError(f"{source}.{missing[0]}", None,
                            f"is required: give the model's {missing[0]} (see `simpar models` "
                            "for complete examples)")
        data.setdefault("kv_heads", data["heads"])
        hidden = data["hidden"]
        if data.get("ffn_hidden") is None:  # a hidden that is no integer: its own check says why
            data["ffn_hidden"] = (default_ffn_hidden(hidden, data.get("gated_mlp", True))
                                  if type(hidden) is int else None)
        return cls(**data)


# Other trainers' names for ModelSpec's keys, as their configs write them: Megatron-LM's
# arguments and Megatron-Bridge's model providers (num_layers, hidden_size, num_attention_heads,
# num_query_groups, ffn_hidden_size, vocab_size) and llm-foundry's MPT yamls (n_layers, d_model,
# n_heads); ffn as published tables head the column.
MODEL_KEY_SYNONYMS = {
    "num_layers": "layers", "n_layers": "layers",
    "hidden_size": "hidden", "d_model": "hidden",
    "num_attention_heads": "heads", "n_heads": "heads",
    "num_query_groups": "kv_heads", "num_key_value_heads": "kv_heads", "n_kv_heads": "kv_heads",
    "ffn_hidden_size": "ffn_hidden", "ffn": "ffn_hidden",
    "vocab_size": "vocab", "padded_vocab_size": "vocab",
}


def _schema_keys(data: dict, source: str, known: set) -> dict:
    """`data` under ModelSpec's own keys (MODEL_KEY_SYNONYMS), without the keys left null; a key
    the schema does not know, or given twice under two names, is refused."""
    reject_unknown(source, {k: v for k, v in data.items()
                            if MODEL_KEY_SYNONYMS.get(k, k) not in known}, known)
    out: dict = {}
    for key, value in data.items():
        name = MODEL_KEY_SYNONYMS.get(key, key)
        require(name not in out, f"{source}.{key}", value, f"says {name} again: give it once")
        out[name] = value
    return {k: v for k, v in out.items() if v is not None}
