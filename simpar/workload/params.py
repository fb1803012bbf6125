"""Parameters held by one rank of a pipeline stage, split into dense and expert weights."""

from __future__ import annotations


def stage_params(model, strategy, stage: int, layers: int) -> tuple[float, float]:
    """(dense, expert) parameters on one rank of `stage`, which holds `layers` transformer layers.

    The first stage also holds the input embedding, the last the output layer and final norm (with tied
    embeddings and more than one stage, the last stage keeps its own copy of the embedding, as Megatron-LM
    does). Dense weights are split over tp; expert weights over tp and ep."""
    s = strategy
    dense = layers * model.dense_params_per_layer / s.tp
    if stage == 0:
        dense += model.embedding_params / s.tp
    if stage == s.pp - 1:
        output = model.output_params or (model.embedding_params if s.pp > 1 else 0)
        dense += output / s.tp + model.hidden
    expert = layers * model.expert_params_per_layer / (s.tp * s.ep)
    return dense, expert
