"""Read specs from names, our own YAML/JSON files, and Hugging Face config.json files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from simpar.errors import SpecError, is_number, nearest, require
from simpar.files import read_text
from simpar.specs.names import canonical


class _Yaml12Numbers(yaml.SafeLoader):
    """PyYAML follows YAML 1.1, where 1e9 and 1e-9 (no dot, or no exponent sign) are text, so a
    cluster file's `nic_bw_gbps: 1e3` was refused as "not a number"; read them as numbers, as
    YAML 1.2 and JSON do."""

    def construct_mapping(self, node, deep=False):
        """A key given twice is refused: YAML would keep the last one silently, and a file
        that sets `layers` twice most likely means one of them. (A list or mapping as a key is
        left to PyYAML, which refuses it as unhashable.)"""
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)):
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_Yaml12Numbers.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."))


def read_mapping(path: str | Path, what: str) -> dict:
    """Parse a YAML or JSON file that must hold a mapping; errors name the file."""
    p = Path(path)
    text = read_text(p, what, "no such file; give a catalog name or an existing file path")
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.load(text, Loader=_Yaml12Numbers)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0]
        raise SpecError(
            what, str(path),
            f"is not valid {'JSON' if p.suffix == '.json' else 'YAML'} ({first})") from None
    except (ValueError, RecursionError) as exc:  # a 5,000-digit number, nesting 10^5 deep
        raise SpecError(what, str(path), f"is not a spec file ({exc}"[:150] + ")") from None
    if not isinstance(data, dict):
        raise SpecError(what, str(path), "must hold a mapping of keys to values")
    return data


def looks_like_path(name: str) -> bool:
    return "/" in name or name.endswith((".yaml", ".yml", ".json"))


def _hf_int(cfg: dict, key: str, path: str, default=None) -> int:
    value = cfg.get(key, default)
    if value is None:
        raise SpecError(f"{Path(path).name}:{key}", None,
                        "is required in a Hugging Face config.json")
    if not isinstance(value, int) or isinstance(value, bool):
        raise SpecError(f"{Path(path).name}:{key}", value, "must be an integer")
    if value < 0:  # num_local_experts: -8 was read as a dense model
        raise SpecError(f"{Path(path).name}:{key}", value, "must be >= 0")
    return value


def _hf_first_int(cfg: dict, keys: tuple[str, ...], path: str, default: int = 0) -> int:
    """The first of `keys` the config sets (not null, not 0), as _hf_int checks it."""
    key = next((k for k in keys if cfg.get(k)), None)
    return default if key is None else _hf_int(cfg, key, path)


def _hf_number(cfg: dict, key: str, path: str) -> float:
    value = cfg.get(key) or 0
    if not is_number(value):
        raise SpecError(f"{Path(path).name}:{key}", value, "must be a number")
    return float(value)


def _hf_experts(cfg: dict, path: str) -> dict:
    """Routed and shared experts as ModelSpec fields: DeepSeek's n_shared_experts are
    routed-expert sized, Qwen2-MoE's one shared expert has its own width; DeepSeek's
    first_k_dense_replace layers are dense."""
    routed = _hf_first_int(cfg, ("num_local_experts", "num_experts", "n_routed_experts"), path, 1)
    if routed <= 1:
        return {}
    top = _hf_int(cfg, "num_experts_per_tok", path, 1)
    if not 1 <= top <= routed:  # 0 had been read as unset: top-1
        raise SpecError(f"{Path(path).name}:num_experts_per_tok", top,
                        f"must be 1 to {routed} (num_local_experts): each token's experts")
    out = {"experts": routed, "experts_per_token": top}
    if str(cfg.get("model_type", "")).startswith("llama4"):
        # Llama 4: every MoE layer also runs one shared expert of the routed ones' width
        # (transformers' Llama4TextMoe); with interleave_moe_layer_step k, one layer in k is MoE
        # and the others dense, of intermediate_size_mlp (priced as if the dense ones came first)
        step = _hf_int(cfg, "interleave_moe_layer_step", path, 1)
        layers = _hf_int(cfg, "num_hidden_layers", path)
        out["shared_experts"] = 1
        if step > 1:
            out.update(dense_layers=layers - layers // step,
                       dense_ffn_hidden=_hf_int(cfg, "intermediate_size_mlp", path))
    elif cfg.get("shared_expert_intermediate_size"):
        out.update(shared_experts=1,
                   shared_ffn_hidden=_hf_int(cfg, "shared_expert_intermediate_size", path))
    elif cfg.get("n_shared_experts"):
        out["shared_experts"] = _hf_int(cfg, "n_shared_experts", path)
    if (cfg.get("n_group") or 1) > 1 and cfg.get("topk_group"):
        # DeepSeek's group-limited routing: a token's experts from topk_group of n_group groups
        out.update(expert_groups=_hf_int(cfg, "n_group", path),
                   groups_per_token=_hf_int(cfg, "topk_group", path))
    if cfg.get("first_k_dense_replace"):
        out.update(dense_layers=_hf_int(cfg, "first_k_dense_replace", path),
                   dense_ffn_hidden=_hf_int(cfg, "intermediate_size", path))
    return out


# Hugging Face model types whose MLP is two matrices around the activation (GPT-2, GPT-NeoX,
# GPT-J, OPT, BLOOM, Falcon, MPT, Phi-1/2, StarCoder2, Nemotron's squared ReLU); the decoders of
# the last years gate theirs (gate_proj), whatever the activation: Gemma's is a GELU
_UNGATED_MODEL_TYPES = frozenset({"gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "mpt",
                                  "phi", "starcoder2", "nemotron", "gpt_bigcode"})


def _hf_gated(cfg: dict, act: str) -> bool:
    """Whether the config's MLP is gated (SwiGLU, GeGLU): by its model type where it names one,
    else by its activation (SiLU in a decoder's config means SwiGLU)."""
    model_type = cfg.get("model_type")
    if isinstance(model_type, str) and model_type:
        return model_type not in _UNGATED_MODEL_TYPES
    return act in ("silu", "swish", "swiglu")


# Hugging Face model types whose attention norms each head of q and k (transformers' q_norm and
# k_norm modules); Llama 4 says so in its config (use_qk_norm), Persimmon and StableLM
# (qk_layernorm)
_QK_NORM_MODEL_TYPES = frozenset({"qwen3", "qwen3_moe", "qwen3_next", "gemma3", "gemma3_text",
                                  "olmo2", "olmoe"})


def _hf_qk_norm(cfg: dict) -> bool:
    """Whether the config's attention norms q and k per head."""
    return (cfg.get("model_type") in _QK_NORM_MODEL_TYPES or cfg.get("use_qk_norm") is True
            or cfg.get("qk_layernorm") is True)


def model_from_hf_config(cfg: dict, path: str):
    """Map a Hugging Face config.json (Llama 2-4, Mistral, Mixtral, Qwen, Qwen-MoE, Gemma,
    Nemotron, DeepSeek-MoE, GPT-OSS, GPT-NeoX-like keys) to a ModelSpec."""
    from simpar.specs.model import ModelSpec

    heads = _hf_int(cfg, "num_attention_heads", path)
    act = cfg.get("hidden_act", cfg.get("hidden_activation", "silu"))
    if not isinstance(act, str):  # null was read as 'None': a GELU model
        raise SpecError(f"{Path(path).name}:hidden_act", act,
                        "must be the activation's name, e.g. \"silu\" or \"gelu\"")
    moe = _hf_experts(cfg, path)
    mla = _hf_latent_attention(cfg, path)
    dropout = any(_hf_number(cfg, k, path) > 0
                  for k in ("attention_dropout", "hidden_dropout", "resid_pdrop"))
    return ModelSpec(
        name=str(
            cfg.get("_name_or_path") or cfg.get("model_type") or Path(path).parent.name or
            "hf-model"),
        layers=_hf_int(cfg, "num_hidden_layers", path),
        hidden=_hf_int(cfg, "hidden_size", path),
        heads=heads,
        kv_heads=heads if mla else _hf_int(cfg, "num_key_value_heads", path, heads),
        ffn_hidden=_hf_int(cfg, "moe_intermediate_size", path)
        if moe and "moe_intermediate_size" in cfg else _hf_int(cfg, "intermediate_size", path),
        vocab=_hf_int(cfg, "vocab_size", path),
        gated_mlp=_hf_gated(cfg, act),
        tied_embeddings=cfg.get("tie_word_embeddings", False),  # ModelSpec checks it is a bool
        dropout=dropout,
        qk_norm=_hf_qk_norm(cfg),
        # GPT-OSS's attention and experts carry biases, which its config does not name
        bias=cfg.get("model_type") == "gpt_oss",
        glu_clamp=_hf_number(cfg, "swiglu_limit", path) if "swiglu_limit" in cfg else 0.0,
        head_dim=mla.pop("head_dim", _hf_first_int(cfg, ("head_dim",), path)),
        **moe,
        **mla,
        **_hf_window(cfg, path),
        **_hf_rope_scaling(cfg, path),
    )


def _hf_rope_scaling(cfg: dict, path: str) -> dict:
    """YaRN's rope_scaling as the concentration factor it puts on cos and sin (GPT-OSS,
    DeepSeek-V3); other scalings leave the rotary's cost as it is."""
    from simpar.specs.model import yarn_mscale

    scaling = cfg.get("rope_scaling")
    if not isinstance(scaling, dict) or (scaling.get("rope_type") or scaling.get("type")) != "yarn":
        return {}
    numbers = {k: _hf_number(scaling, k, path) for k in ("factor", "mscale", "mscale_all_dim")
               if k in scaling}
    return {"rope_mscale": yarn_mscale(numbers.get("factor", 1.0), numbers.get("mscale"),
                                       numbers.get("mscale_all_dim"))}


def _hf_window(cfg: dict, path: str) -> dict:
    """Sliding-window attention as ModelSpec fields: the window on the layers `layer_types` marks
    "sliding_attention" (GPT-OSS, Gemma), or on every layer (Mistral). Qwen2's configs name a
    window they do not use unless use_sliding_window is set."""
    if not cfg.get("sliding_window") or cfg.get("use_sliding_window") is False:
        return {}
    types = cfg.get("layer_types") or []
    if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
        raise SpecError(f"{Path(path).name}:layer_types", types,
                        "must be a list of layer kinds, e.g. [\"sliding_attention\", ...]")
    windowed = sum(t == "sliding_attention" for t in types)
    if types and not windowed:
        return {}
    if not types and str(cfg.get("model_type", "")).startswith(("gemma2", "gemma3")):
        # Gemma's configs without layer_types: one layer in sliding_window_pattern attends to
        # the whole prefix (Gemma 2 every other one, Gemma 3 one in six: transformers'
        # Gemma2Config and Gemma3TextConfig)
        layers = _hf_int(cfg, "num_hidden_layers", path)
        default = 2 if str(cfg["model_type"]).startswith("gemma2") else 6
        windowed = layers - layers // _hf_int(cfg, "sliding_window_pattern", path, default)
    return {"attention_window": _hf_int(cfg, "sliding_window", path), "windowed_layers": windowed}


def _hf_latent_attention(cfg: dict, path: str) -> dict:
    """DeepSeek-V2/V3 multi-head latent attention keys, as ModelSpec fields (empty for
    other models)."""
    if not cfg.get("kv_lora_rank"):
        return {}
    return {
        "kv_lora_rank": _hf_int(cfg, "kv_lora_rank",
                                path), "q_lora_rank": _hf_first_int(cfg, ("q_lora_rank",), path),
        "head_dim": _hf_int(cfg, "qk_nope_head_dim",
                            path), "rope_head_dim": _hf_int(cfg, "qk_rope_head_dim", path),
        "v_head_dim": _hf_int(cfg, "v_head_dim", path)
    }


# a Hugging Face model id: organisation/repository, no file suffix
HUB_ID = re.compile(r"[\w.-]+/[\w.-]+(?<!\.json)(?<!\.yaml)(?<!\.yml)")


def load_model(name_or_path: str):
    """A catalog name, our own YAML/JSON schema (keys of ModelSpec), or a Hugging Face
    config.json."""
    from simpar.specs.model import ModelSpec
    from simpar.specs.model_catalog import MODEL_ALIASES, MODELS

    # a catalog name however it is spelled, or its Hub id, unless a file has that spelling
    name = canonical(name_or_path, MODELS, MODEL_ALIASES)
    if name in MODELS and (name == name_or_path or not Path(name_or_path).exists()):
        return MODELS[name]
    if not looks_like_path(name_or_path):
        names = ", ".join(list(MODELS)[:8])
        raise SpecError(
            "model", name_or_path,
            f"unknown model; {nearest(name_or_path, MODELS)}run `simpar models` for names "
            f"({names}, ...) or give a YAML/JSON file")
    require(Path(name_or_path).exists() or not HUB_ID.fullmatch(name_or_path), "model",
            name_or_path, "a Hugging Face id the catalog does not hold (`simpar models`): give "
            "the path of its config.json, downloaded from the Hub")
    data = read_mapping(name_or_path, "model")
    text = data.get("text_config")
    if isinstance(text, dict) and "num_hidden_layers" not in data:
        # a multimodal release (Llama 4, Gemma 3, Qwen-VL): its language model, without the
        # vision encoder
        data = {"_name_or_path": data.get("_name_or_path") or data.get("model_type"), **text}
    # a Hugging Face config, not Megatron's names for our keys (ModelSpec.from_dict)
    if "num_hidden_layers" in data or ("hidden_size" in data and "num_layers" not in data):
        return model_from_hf_config(data, name_or_path)
    return ModelSpec.from_dict(data, source=Path(name_or_path).name)
