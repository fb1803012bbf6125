"""Built-in models. Each entry cites where its shape comes from."""

from __future__ import annotations

import re

from simpar.specs.model import ModelSpec, yarn_mscale

# GPT-OSS's rope_scaling: YaRN, factor 32, no mscale (its config.json)
GPT_OSS_ROPE_MSCALE = yarn_mscale(32.0)
# its swiglu_limit (config.json; Megatron-Bridge's gpt_oss_bridge.py: activation_func_clamp_value)
GPT_OSS_GLU_CLAMP = 7.0


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
    # Megatron-Bridge v0.2.0 (7af9601c9) src/megatron/bridge/models/llama/llama_provider.py,
    # Llama32ModelProvider1B and 3B (meta-llama/Llama-3.2-{1B,3B}): input and output
    # embeddings tied.
    _llama("llama3.2-1b", 16, 2048, 32, 8, 8192, 128256, tied_embeddings=True),
    _llama("llama3.2-3b", 28, 3072, 24, 8, 8192, 128256, tied_embeddings=True),
    # The same file's CodeLlamaModelProvider34B (codellama/CodeLlama-34b-hf): Llama 2's 34B shape.
    _llama("codellama-34b", 48, 8192, 64, 8, 22016, 32000),
    # Megatron-Bridge v0.2.0 models/mistral/mistral_provider.py (mistralai/Mistral-7B-v0.3: no
    # sliding window, vocabulary 32,768).
    _llama("mistral-7b", 32, 4096, 32, 8, 14336, 32768),
    # Jiang et al. 2024 (arXiv:2401.04088) and mistralai/Mixtral-8x7B-v0.1/config.json.
    _llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, experts=8, experts_per_token=2),
    # NeMo 2 nemo/collections/llm/gpt/model/mixtral.py, MixtralConfig8x22B (56 layers of 6,144, 48
    # query and 8 key-value heads, 8 experts of 16,384, top-2), with the v0.1 tokenizer's 32,000.
    _llama("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32000, experts=8, experts_per_token=2),
    # Megatron-Bridge v0.2.0 models/qwen/qwen_provider.py: Qwen25ModelProvider7B/14B/72B (biases
    # on q, k and v only, left out) and Qwen3ModelProvider8B/14B/32B, Qwen3MoEModelProvider30B_A3B
    # and 235B_A22B (heads of 128 whatever the width, qk_layernorm=True: an RMSNorm on each head
    # of q and k; 128 experts, top-8).
    _llama("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064),
    _llama("qwen2.5-14b", 48, 5120, 40, 8, 13824, 152064),
    _llama("qwen2.5-72b", 80, 8192, 64, 8, 29568, 152064),
    _llama("qwen3-8b", 36, 4096, 32, 8, 12288, 151936, head_dim=128, qk_norm=True),
    _llama("qwen3-14b", 40, 5120, 40, 8, 17408, 151936, head_dim=128, qk_norm=True),
    _llama("qwen3-32b", 64, 5120, 64, 8, 25600, 151936, head_dim=128, qk_norm=True),
    _llama("qwen3-30b-a3b", 48, 2048, 32, 4, 768, 151936, head_dim=128, experts=128,
           experts_per_token=8, qk_norm=True),
    _llama("qwen3-235b-a22b", 94, 4096, 64, 4, 1536, 151936, head_dim=128, experts=128,
           experts_per_token=8, qk_norm=True),
    # Megatron-Bridge v0.2.0 models/nemotron/nemotron_provider.py: Nemotron3ModelProvider8B/22B
    # and Nemotron4ModelProvider15B/340B, a squared-ReLU MLP of two matrices without biases,
    # untied, vocabulary 256,000 (Parmar et al. 2024, arXiv:2402.16819; NVIDIA 2024,
    # arXiv:2406.11704).
    ModelSpec("nemotron3-8b", 32, 4096, 32, 32, 16384, 256000, gated_mlp=False),
    ModelSpec("nemotron3-22b", 40, 6144, 48, 48, 24576, 256000, gated_mlp=False),
    ModelSpec("nemotron4-15b", 32, 6144, 48, 8, 24576, 256000, gated_mlp=False),
    ModelSpec("nemotron4-340b", 96, 18432, 96, 8, 73728, 256000, gated_mlp=False),
    # DeepSeek-V3 (arXiv:2412.19437) and deepseek-ai/DeepSeek-V3/config.json: latent
    # attention, 256 routed experts + 1 shared, top-8 from 4 of 8 groups (n_group, topk_group),
    # the first 3 layers dense. 671B/37B (the multi-token-prediction module is left out).
    _llama("deepseek-v3", 61, 7168, 128, 128, 2048, 129280, experts=256, experts_per_token=8,
           shared_experts=1, head_dim=128, kv_lora_rank=512, q_lora_rank=1536, rope_head_dim=64,
           v_head_dim=128, dense_layers=3, dense_ffn_hidden=18432, expert_groups=8,
           groups_per_token=4),
    # Megatron-Bridge v0.2.0 models/deepseek/deepseek_provider.py, DeepSeekV2ModelProvider
    # (DeepSeek-V2, arXiv:2405.04434): latent attention as V3's, 160 routed experts of 1,536 and
    # two shared ones, top-6 from 3 of 8 groups (deepseek-ai/DeepSeek-V2/config.json n_group,
    # topk_group), the first layer dense (12,288). 236B/21B.
    _llama("deepseek-v2", 60, 5120, 128, 128, 1536, 102400, experts=160, experts_per_token=6,
           shared_experts=2, head_dim=128, kv_lora_rank=512,
           q_lora_rank=1536, rope_head_dim=64, v_head_dim=128, dense_layers=1,
           dense_ffn_hidden=12288, expert_groups=8, groups_per_token=3),
    # OpenAI gpt-oss model card (arXiv:2508.10925) and openai/gpt-oss-{120b,20b}/config.json:
    # 64 query and 8 key-value heads of 64, SwiGLU experts of 2,880 (128 or 32, top-4), every
    # other layer attending to a 128-token window, o200k vocabulary of 201,088, the experts' GLU
    # input clamped at 7 (swiglu_limit). 116.8B/5.1B and 20.9B/3.6B; the attention sinks (a logit
    # per head) are left out.
    _llama("gpt-oss-120b", 36, 2880, 64, 8, 2880, 201088, experts=128, experts_per_token=4,
           head_dim=64, bias=True, attention_window=128, windowed_layers=18,
           rope_mscale=GPT_OSS_ROPE_MSCALE, glu_clamp=GPT_OSS_GLU_CLAMP),
    _llama("gpt-oss-20b", 24, 2880, 64, 8, 2880, 201088, experts=32, experts_per_token=4,
           head_dim=64, bias=True, attention_window=128, windowed_layers=12,
           rope_mscale=GPT_OSS_ROPE_MSCALE, glu_clamp=GPT_OSS_GLU_CLAMP),
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

# NeMo's GPT-3 family (its performance summaries' GPT3 5B, 20B and 175B; NeMo 1
# conf/training/gpt3/5b.yaml, 20b.yaml): GPT-2's vocabulary, learned positions, tied embeddings.
for _size, _l, _h, _a in [("5b", 24, 4096, 32), ("20b", 44, 6144, 48)]:
    _ENTRIES.append(_gpt(f"gpt3-{_size}", _l, _h, _a, 50257, tied=True, positions=2048))

# The large GPT-style models of 2021-22, as trained (dropout 0.1 on attention probabilities and
# hidden states, biases, tied input and output embeddings):
# - BLOOM-176B: the BigScience tr11 slurm script (NHIDDEN 14336, NLAYERS 70, NHEADS 112,
#   --pad-vocab-size-to 250880, ALiBi positions (priced as rotary: no parameters), Megatron-LM's
#   dropout defaults, which its README says were inherited);
# - OPT-175B: Zhang et al. 2022 (arXiv:2205.01068) Table 1 and metaseq: 96 layers of 12,288, 96
#   heads, a ReLU MLP of 4h, GPT-2's vocabulary padded to 50,272, 2,048 learned positions.
# Megatron-Turing NLG 530B (Smith et al. 2022, arXiv:2201.11990, Section 2: 105 layers of 20,480,
# 128 heads) has megatron2021-529.6b's shape (_SAME_SHAPE).
_ENTRIES += [
    _gpt("bloom-176b", 70, 14336, 112, 250880, tied=True, positions=0),
    _gpt("opt-175b", 96, 12288, 96, 50272, tied=True, positions=2048),
]

# MosaicML's MPT family as llm-foundry trains and benchmarks it (scripts/train/yamls/pretrain/
# mpt-*.yaml: d_model, n_heads, n_layers, vocab 50368, expansion_ratio 4; MPTConfig's defaults
# for the rest: biases, no dropout, tied embeddings, a GELU MLP). Its learned positions, as many
# as the run's max_seq_len, are left out so that any --seq-len runs: at 2,048, 1.3% of the 125M's
# parameters and under 0.6% of the others'.
for _size, _l, _h, _a in [("125m", 12, 768, 12), ("350m", 24, 1024, 16), ("760m", 24, 1536, 12),
                          ("1b", 24, 2048, 16), ("3b", 32, 2560, 20), ("7b", 32, 4096, 32),
                          ("13b", 40, 5120, 40), ("30b", 48, 7168, 56), ("70b", 80, 8192, 64)]:
    _ENTRIES.append(ModelSpec(f"mpt-{_size}", _l, _h, _a, _a, 4 * _h, 50368, gated_mlp=False,
                              tied_embeddings=True, bias=True))

MODELS: dict[str, ModelSpec] = {m.name: m for m in _ENTRIES}

# The Hugging Face repositories whose config.json each entry follows (see above), by the ids users
# copy from the Hub, in names.normal_form: instruction-tuned releases share the base architecture.
_HUB_IDS = (
    ("llama2-7b", ("meta-llama/llama-2-7b",)), ("llama2-13b", ("meta-llama/llama-2-13b",)),
    ("llama2-70b", ("meta-llama/llama-2-70b",)),
    ("llama3-8b", ("meta-llama/meta-llama-3-8b", "meta-llama/meta-llama-3.1-8b",
                   "meta-llama/llama-3.1-8b")),
    ("llama3-70b", ("meta-llama/meta-llama-3-70b", "meta-llama/meta-llama-3.1-70b",
                    "meta-llama/llama-3.1-70b", "meta-llama/llama-3.3-70b")),
    ("llama3.1-405b", ("meta-llama/meta-llama-3.1-405b", "meta-llama/llama-3.1-405b")),
    ("llama3.2-1b", ("meta-llama/llama-3.2-1b",)), ("llama3.2-3b", ("meta-llama/llama-3.2-3b",)),
    ("codellama-34b", ("codellama/codellama-34b",)),
    ("mistral-7b", ("mistralai/mistral-7b-v0.3", "mistralai/mistral-7b-instruct-v0.3")),
    ("mixtral-8x7b", ("mistralai/mixtral-8x7b-v0.1", "mistralai/mixtral-8x7b-instruct-v0.1")),
    ("mixtral-8x22b", ("mistralai/mixtral-8x22b-v0.1", "mistralai/mixtral-8x22b-instruct-v0.1")),
    ("qwen2.5-7b", ("qwen/qwen2.5-7b",)), ("qwen2.5-14b", ("qwen/qwen2.5-14b",)),
    ("qwen2.5-72b", ("qwen/qwen2.5-72b",)), ("qwen3-8b", ("qwen/qwen3-8b",)),
    ("qwen3-14b", ("qwen/qwen3-14b",)), ("qwen3-32b", ("qwen/qwen3-32b",)),
    ("qwen3-30b-a3b", ("qwen/qwen3-30b-a3b",)), ("qwen3-235b-a22b", ("qwen/qwen3-235b-a22b",)),
    ("nemotron4-340b", ("nvidia/nemotron-4-340b-base",)),
    ("deepseek-v2", ("deepseek-ai/deepseek-v2",)),
    ("deepseek-v3", ("deepseek-ai/deepseek-v3", "deepseek-ai/deepseek-v3-base")),
    ("gpt-oss-120b", ("openai/gpt-oss-120b",)), ("gpt-oss-20b", ("openai/gpt-oss-20b",)),
    ("bloom-176b", ("bigscience/bloom",)))
# Other spellings of a release that has the shape of an entry: Llama 3.1's and 3.3's 8B and 70B are
# Llama 3's; MT-NLG 530B is Narayanan et al.'s 529.6B shape; Llama 2 34B is CodeLlama 34B's.
_SAME_SHAPE = {"llama3.1-8b": "llama3-8b", "llama3.1-70b": "llama3-70b",
               # Llama 2's unreleased 34B, which fms-fsdp trains: CodeLlama 34B's shape
               "llama2-34b": "codellama-34b",
               "llama3.3-70b": "llama3-70b", "mt-nlg-530b": "megatron2021-529.6b",
               "megatron-turing-nlg-530b": "megatron2021-529.6b",
               # Megatron-Bridge's tables drop the version's dot: LLAMA31_405B
               "llama31-8b": "llama3-8b", "llama31-70b": "llama3-70b",
               "llama31-405b": "llama3.1-405b"}


def _family_hyphenated(name: str) -> str:
    """`name` with a hyphen between its family and the version after it, as vendors write
    them: llama3.1-405b -> llama-3.1-405b, nemotron4-15b -> nemotron-4-15b."""
    return re.sub(r"^([a-z]+)(\d)", r"\1-\2", name)


# what the Hub appends to a repository's name for its releases of the same shape
_HUB_SUFFIXES = ("", "-hf", "-instruct", "-chat-hf", "-base")
MODEL_ALIASES = {
    f"{spelling}{suffix}": name
    for name, spellings in (
        *((name, (*repos, *(repo.split("/")[1] for repo in repos))) for name, repos in _HUB_IDS),
        *((name, (alias, _family_hyphenated(alias))) for alias, name in _SAME_SHAPE.items()),
        *((name, (_family_hyphenated(name),)) for name in MODELS))
    for spelling in spellings for suffix in _HUB_SUFFIXES if f"{spelling}{suffix}" != name
}
