"""FLOP accounting, written once.

Model FLOPs per token (Narayanan et al. 2021, eq. 3; PaLM appendix B): a forward pass costs 2
FLOPs per multiply-accumulate of every weight matrix that the token touches (MoE: only its
experts), plus attention scores and the weighted sum of values, 2 * seq_len * (q_dim + out_dim)
per layer (4 * seq_len * q_dim for standard attention), counted over the full sequence (the
convention of Megatron-LM and PaLM: causal masking is not subtracted). Training costs 3x the
forward pass (backward = 2x). Hardware FLOPs add the forward recomputation that activation
recompute executes (the convention of Narayanan et al. Table 1, which counts one extra forward
pass). MFU = model FLOPs / (time x dense peak of the precision used); HFU uses hardware FLOPs.
"""

from __future__ import annotations

from simpar.specs.strategy import CORE_ATTENTION, WHOLE_MLP


def matmul_params_per_token(model) -> int:
    """Weights a token multiplies through in one forward pass (embedding lookup is not a matmul)."""
    layer = (model.attn_params_per_layer + model.router_params_per_layer +
             model.experts_per_token * model.mlp_params_per_expert + model.shared_params_per_layer)
    return model.layers * layer + model.vocab * model.hidden  # + output (logit) layer


def attention_flops_per_token(model, seq_len: int) -> float:
    """Forward attention-core FLOPs per token over all layers: QK^T and AV, over the full sequence
    (a windowed layer's: over its window)."""
    keys = sum(share * span for share, span in model.attention_spans(seq_len))
    return model.layers * 2.0 * keys * (model.q_dim + model.out_dim)


def forward_flops_per_token(model, seq_len: int) -> float:
    return 2.0 * matmul_params_per_token(model) + attention_flops_per_token(model, seq_len)


def model_flops_per_token(model, seq_len: int) -> float:
    return 3.0 * forward_flops_per_token(model, seq_len)


def recompute_flops_per_token(model, seq_len: int, recompute: str, selective: str = "core",
                              modules: frozenset[str] = CORE_ATTENTION) -> float:
    """Extra forward FLOPs per token executed by activation recompute (logit layer never
    recomputed); `selective`: what selective recompute checkpoints (Stack.selective), and where
    that is Megatron's core, the `modules` it names (Strategy.selective_modules: the norms and
    the experts' activation run no matmul; a whole MLP or MoE layer its router's, experts' and
    shared experts' GEMMs, the shared experts theirs)."""
    if recompute == "full":
        return forward_flops_per_token(model, seq_len) - 2.0 * model.vocab * model.hidden
    if recompute == "selective" and selective == "attention":  # with its projections
        return (attention_flops_per_token(model, seq_len)
                + model.layers * 2.0 * model.attn_params_per_layer)
    if recompute == "selective":
        ups = [(n_in, n_out) for name, n_in, n_out, _ in model.attention_linears()
               if name in ("wq_b", "wkv_b")] if "mla_up_proj" in modules else []
        core = attention_flops_per_token(model, seq_len) if "core_attn" in modules else 0.0
        mlp = (model.router_params_per_layer + model.experts_per_token
               * model.mlp_params_per_expert + model.shared_params_per_layer
               if modules & WHOLE_MLP else
               model.shared_params_per_layer if "shared_experts" in modules else 0)
        return core + model.layers * 2.0 * (sum(n_in * n_out for n_in, n_out in ups) + mlp)
    # every second matmul of each layer (wk, wo, w3 of a Llama layer), per token
    if recompute == "op":
        from simpar.workload.layer import op_recomputed

        tokens = model.experts  # so that balanced routing gives each expert whole tokens
        return model.layers * sum(g.flops for g in op_recomputed(model, tokens, 1, 1)) / tokens
    return 0.0


def hardware_flops_per_token(model, seq_len: int, recompute: str, share: float = 1.0,
                             selective: str = "core",
                             modules: frozenset[str] = CORE_ATTENTION) -> float:
    """FLOPs executed per token, with `recompute` on a `share` of the layers."""
    recomputed = share * recompute_flops_per_token(model, seq_len, recompute, selective, modules)
    return model_flops_per_token(model, seq_len) + recomputed
