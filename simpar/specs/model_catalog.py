"""Built-in models. Each entry cites where its shape comes from."""

from __future__ import annotations

from simpar.specs.model import ModelSpec, yarn_mscale

# GPT-OSS's rope_scaling: YaRN, factor 32, no mscale (its config.json)
GPT_OSS_ROPE_MSCALE = yarn_mscale(32.0)


def _llama(name, layers, hidden, heads, kv_heads, ffn, vocab, **kw):
    return ModelSpec(name, layers, hidden, heads, kv_heads, ffn, vocab, gated_mlp=True, **kw)


def _gpt(name, layers, hidden, heads, vocab, tied, positions):
    # GPT / Megatron-LM style: GELU MLP of 4h, multi-head attention, biases, learned
    # positions, dropout.
    return ModelSpec(name, layers, hidden, heads, heads, 4 * hidden, vocab, gated_mlp=False,
                     tied_embeddings=tied, dropout=True, bias=True, position_embeddings=positions)


_ENTRIES = [
    # Brown et al. 2020 (arXiv:2005.14165) Table 2.1; vocab 50257 (GPT-2 BPE), tied embeddings.
    _gpt("gpt3-175b", 96, 12288, 96, 50257, tied=True, positions=2048),
    # Touvron et al. 2023 (arXiv:2307.09288) and the Hugging Face config.json of
    # meta-llama/Llama-2-*.
    _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000),
    _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000),
    _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000),
    # Llama 3 herd paper (arXiv:2407.21783) Table 3 and meta-llama/Meta-Llama-3*-*/config.json.
    _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256),
    _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256),
    _llama("llama3.1-405b", 126, 16384, 128, 8, 53248, 128256),
    # Jiang et al. 2024 (arXiv:2401.04088) and mistralai/Mixtral-8x7B-v0.1/config.json.
    _llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, experts=8, experts_per_token=2),
    # DeepSeek-V3 (arXiv:2412.19437) and deepseek-ai/DeepSeek-V3/config.json: latent
    # attention, 256 routed experts + 1 shared, top-8, the first 3 layers dense.
    # 671B/37B (the multi-token-prediction module is left out).
    _llama("deepseek-v3", 61, 7168, 128, 128, 2048, 129280, experts=256, experts_per_token=8,
           shared_experts=1, head_dim=128, kv_lora_rank=512, q_lora_rank=1536, rope_head_dim=64,
           v_head_dim=128, dense_layers=3, dense_ffn_hidden=18432),
    # OpenAI gpt-oss model card (arXiv:2508.10925) and openai/gpt-oss-{120b,20b}/config.json:
    # 64 query and 8 key-value heads of 64, SwiGLU experts of 2,880 (128 or 32, top-4), every
    # other layer attending to a 128-token window, o200k vocabulary of 201,088. 116.8B/5.1B and
    # 20.9B/3.6B; the attention sinks (a logit per head) are left out.
    _llama("gpt-oss-120b", 36, 2880, 64, 8, 2880, 201088, experts=128, experts_per_token=4,
           head_dim=64, bias=True, attention_window=128, windowed_layers=18,
           rope_mscale=GPT_OSS_ROPE_MSCALE),
    _llama("gpt-oss-20b", 24, 2880, 64, 8, 2880, 201088, experts=32, experts_per_token=4,
           head_dim=64, bias=True, attention_window=128, windowed_layers=12,
           rope_mscale=GPT_OSS_ROPE_MSCALE),
]

# Narayanan et al. 2021 (arXiv:2104.04473) Table 1 weak-scaling family: vocab 51200,
# sequence 2048, GPT-style with tied embeddings (Megatron's default; the paper's
# parameter formula counts V*h once).
for _size, _l, _h, _a in [("1.7b", 24, 2304, 24), ("3.6b", 30, 3072, 32), ("7.5b", 36, 4096, 32),
                          ("18.4b", 40, 6144, 48), ("39.1b", 48, 8192, 64),
                          ("76.1b", 60, 10240, 80), ("145.6b", 80, 12288, 96),
                          ("310.1b", 96, 16384, 128), ("529.6b", 105, 20480, 128),
                          ("1t", 128, 25600, 160)]:
    _ENTRIES.append(_gpt(f"megatron2021-{_size}", _l, _h, _a, 51200, tied=True, positions=2048))

# NVIDIA/Megatron-LM README (2024) H100 weak-scaling family: vocab 131072, sequence 4096,
# GPT-style (ffn 4h and MHA: the README does not print them, Megatron's defaults), untied output
# layer and no learned position embeddings (the README's parameter counts only match that way; 32B
# is the exception: 12 l h^2 + 2 V h gives 31.5B, so its unprinted ffn or heads likely differ).
for _size, _l, _h, _a in [("1.7b", 24, 2048, 16), ("7.1b", 30, 4096, 32), ("16b", 32, 6144, 48),
                          ("32b", 48, 7168, 56), ("70b", 84, 8192, 64), ("119b", 92, 10240, 80),
                          ("177b", 96, 12288, 96), ("314b", 96, 16384, 128),
                          ("462b", 112, 18432, 144)]:
    _ENTRIES.append(_gpt(f"megatron2024-{_size}", _l, _h, _a, 131072, tied=False, positions=0))

MODELS: dict[str, ModelSpec] = {m.name: m for m in _ENTRIES}

# The Hugging Face repositories whose config.json each entry follows (see above), by the ids users
# copy from the Hub, in names.normal_form: instruction-tuned releases share the base architecture.
MODEL_ALIASES = {
    f"{repo}{suffix}".lower(): name
    for name, repos in (
        ("llama2-7b", ("meta-llama/llama-2-7b",)), ("llama2-13b", ("meta-llama/llama-2-13b",)),
        ("llama2-70b", ("meta-llama/llama-2-70b",)),
        ("llama3-8b", ("meta-llama/meta-llama-3-8b", "meta-llama/llama-3.1-8b")),
        ("llama3-70b", ("meta-llama/meta-llama-3-70b", "meta-llama/llama-3.1-70b",
                        "meta-llama/llama-3.3-70b")),
        ("llama3.1-405b", ("meta-llama/llama-3.1-405b",)),
        ("mixtral-8x7b", ("mistralai/mixtral-8x7b-v0.1",)),
        ("deepseek-v3", ("deepseek-ai/deepseek-v3", "deepseek-ai/deepseek-v3-base")),
        ("gpt-oss-120b", ("openai/gpt-oss-120b",)), ("gpt-oss-20b", ("openai/gpt-oss-20b",)))
    for repo in repos for suffix in ("", "-hf", "-instruct", "-chat-hf")
}
