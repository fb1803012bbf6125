"""Parameters held by one rank of a pipeline stage or chunk, split into dense and expert weights."""

from __future__ import annotations


def stage_params(model, strategy, stage: int, layers: int) -> tuple[float, float]:
    """(dense, expert) parameters on one rank of pipeline `stage`, which holds `layers`
    transformer layers."""
    return chunk_params(model, strategy, layers, stage == 0, stage == strategy.pp - 1)


def chunk_params(model, strategy, layers: int, first: bool, last: bool) -> tuple[float, float]:
    """(dense, expert) parameters on one rank of a chunk of `layers` layers.

    The first chunk also holds the input embedding (and an MoE model's dense first
    layers), the last the output layer and final norm (with tied embeddings and more
    than one stage, the last stage keeps its own copy of the embedding, as Megatron-LM
    does). Dense weights are split over tp; expert weights over ep and, unless folded, tp."""
    s = strategy
    dense = layers * model.dense_params_per_layer / s.tp + root_params(model, s, first, last)
    expert = layers * model.expert_params_per_layer / (s.expert_tp * s.ep)
    if first:
        k = min(model.dense_layers, layers)
        # their FFN is replicated over the data-parallel ranks in place of experts and a router
        if k:
            ffn = (3 if model.gated_mlp else 2) * model.hidden * model.dense_ffn_hidden
            dense += k * (ffn - model.router_params_per_layer) / s.tp
            expert -= k * model.expert_params_per_layer / (s.expert_tp * s.ep)
    return dense, expert


def root_params(model, strategy, first: bool, last: bool) -> float:
    """Of a chunk's parameters on one rank (chunk_params), those outside its transformer blocks:
    the input embedding on the first, the output layer and final norm on the last. FSDP shards
    them as its root unit (torchtitan's fully_shard(model) after each block's; FSDP1's root
    FlatParameter), gathered before the chunk's first block and reduced after its last."""
    s, out = strategy, 0.0
    if first:
        out += model.embedding_params / s.tp
    if last:
        out += (model.output_params or (model.embedding_params if s.pp > 1 else 0)) / s.tp
        out += model.hidden
    return out


def linear_weights(model, strategy, layers: int) -> float:
    """Of one rank's parameters of `layers` transformer layers, the weights of the linears
    torchao's float8 converts (attention and MLP projections, shared experts): not the norms,
    the router or routed experts (grouped, not nn.Linear)."""
    mlp = 0 if model.is_moe else model.expert_params_per_layer  # a dense model's one MLP
    per_layer = model.attn_params_per_layer + model.shared_params_per_layer + mlp
    return layers * per_layer / strategy.tp


def multiplied_params(model, strategy, first: bool, dense: float, expert: float,
                      self_cast_layers: int = 0) -> float:
    """Of a rank's `dense` + `expert` parameters, those a GEMM multiplies by (what autocast casts
    to 16 bits): all but the input embedding on the first chunk (`first`), which is looked up,
    unless the output layer multiplies by it too (tied, on one pipeline stage), and but the
    weights of `self_cast_layers` layers whose linears cast their own (torchao's fp8
    Float8Linear casts its weight to fp8 itself, outside autocast)."""
    tied_here = model.tied_embeddings and strategy.pp == 1
    looked_up = model.embedding_params / strategy.tp if first and not tied_here else 0
    own = self_cast_layers * (model.dense_params_per_layer / strategy.tp
                              + model.expert_params_per_layer / (strategy.ep * strategy.expert_tp))
    return dense + expert - looked_up - own
