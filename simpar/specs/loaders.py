"""Read specs from names, our own YAML/JSON files, and Hugging Face config.json files."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from simpar.errors import SpecError


def read_mapping(path: str | Path, what: str) -> dict:
    """Parse a YAML or JSON file that must hold a mapping; errors name the file."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(what, str(path), "no such file; give a catalog name or an existing file path")
    try:
        text = p.read_text()
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0]
        raise SpecError(what, str(path), f"is not valid {'JSON' if p.suffix == '.json' else 'YAML'} ({first})") from None
    if not isinstance(data, dict):
        raise SpecError(what, str(path), "must hold a mapping of keys to values")
    return data


def looks_like_path(name: str) -> bool:
    return "/" in name or name.endswith((".yaml", ".yml", ".json"))


def _hf_int(cfg: dict, key: str, path: str, default=None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise SpecError(f"{Path(path).name}:{key}", None, "is required in a Hugging Face config.json")
    if not isinstance(value, int) or isinstance(value, bool):
        raise SpecError(f"{Path(path).name}:{key}", value, "must be an integer")
    return value


def _hf_experts(cfg: dict, path: str) -> tuple[int, int]:
    """(experts, experts per token), shared experts counted as experts every token uses: DeepSeek's
    n_shared_experts are routed-expert sized; Qwen2-MoE's one shared expert has its own width, counted in
    routed-expert units. DeepSeek's first_k_dense_replace dense layers are priced as MoE layers (their
    FFN is sized to match an MoE layer's active work; the count overstates parameters by a few percent)."""
    routed = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 1
    per_token = int(cfg.get("num_experts_per_tok") or 1)
    if routed <= 1:
        return 1, 1
    shared = int(cfg.get("n_shared_experts") or 0)
    width = cfg.get("shared_expert_intermediate_size")
    if width:
        shared = max(1, round(int(width) / _hf_int(cfg, "moe_intermediate_size", path)))
    return int(routed) + shared, per_token + shared


def model_from_hf_config(cfg: dict, path: str):
    """Map a Hugging Face config.json (Llama, Mistral, Mixtral, Qwen, Qwen-MoE, DeepSeek-MoE, GPT-NeoX-like
    keys) to a ModelSpec."""
    from simpar.specs.model import ModelSpec

    if cfg.get("kv_lora_rank"):
        raise SpecError(f"{Path(path).name}:kv_lora_rank", cfg["kv_lora_rank"],
                        "multi-head latent attention is not modelled yet; describe the model in simpar's YAML "
                        "schema with a standard-attention equivalent (heads, kv_heads, head_dim)")
    heads = _hf_int(cfg, "num_attention_heads", path)
    act = str(cfg.get("hidden_act", cfg.get("hidden_activation", "silu")))
    experts, per_token = _hf_experts(cfg, path)
    dropout = any(float(cfg.get(k) or 0) > 0 for k in ("attention_dropout", "hidden_dropout", "resid_pdrop"))
    return ModelSpec(
        name=str(cfg.get("_name_or_path") or cfg.get("model_type") or Path(path).parent.name or "hf-model"),
        layers=_hf_int(cfg, "num_hidden_layers", path),
        hidden=_hf_int(cfg, "hidden_size", path),
        heads=heads,
        kv_heads=_hf_int(cfg, "num_key_value_heads", path, heads),
        ffn_hidden=_hf_int(cfg, "moe_intermediate_size", path) if experts > 1 and "moe_intermediate_size" in cfg
        else _hf_int(cfg, "intermediate_size", path),
        vocab=_hf_int(cfg, "vocab_size", path),
        gated_mlp=act in ("silu", "swish", "swiglu"),  # SiLU in HF decoder configs means SwiGLU
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        experts=experts,
        experts_per_token=per_token,
        dropout=dropout,
        head_dim=int(cfg.get("head_dim") or 0),
    )


def load_model(name_or_path: str):
    """A catalog name, our own YAML/JSON schema (keys of ModelSpec), or a Hugging Face config.json."""
    from simpar.specs.model import ModelSpec
    from simpar.specs.model_catalog import MODELS

    if name_or_path in MODELS:
        return MODELS[name_or_path]
    if not looks_like_path(name_or_path):
        names = ", ".join(list(MODELS)[:8])
        raise SpecError("--model", name_or_path,
                        f"unknown model; run `simpar models` for names ({names}, ...) or give a YAML/JSON file")
    data = read_mapping(name_or_path, "--model")
    if "num_hidden_layers" in data or "hidden_size" in data:
        return model_from_hf_config(data, name_or_path)
    return ModelSpec.from_dict(data, source=Path(name_or_path).name)
