import json
from dataclasses import replace

import pytest
import yaml

from simpar.errors import SpecError
from simpar.specs import (
    GPUS,
    MODELS,
    JobSpec,
    ModelSpec,
    Strategy,
    load_cluster,
    load_model,
    split_layers,
    validate,
)

# Published parameter counts. Exact figures where the source prints them; the Megatron
# families print rounded values, so the tolerance is 1% or half of the last printed
# digit, whichever is larger.
PUBLISHED = {
    "gpt3-175b": (175.0e9, 0.5e9),
    "llama2-7b": (6.74e9, 0.005e9),
    "llama2-13b": (13.02e9, 0.005e9),
    "llama2-70b": (68.98e9, 0.005e9),
    "llama3-8b": (8.03e9, 0.005e9),
    "llama3-70b": (70.55e9, 0.005e9),
    "llama3.1-405b": (405.85e9, 0.005e9),
    "mixtral-8x7b": (46.70e9, 0.005e9),
    # the model cards on the Hugging Face Hub (Llama 3.2, Mixtral 8x22B, Mistral 7B v0.3, Qwen2.5,
    # Qwen3), DeepSeek-V2's paper (236B), Nemotron-4's (15B: 3.2B embedding + 12.5B other; 340B)
    "llama3.2-1b": (1.24e9, 0.005e9),
    "llama3.2-3b": (3.21e9, 0.005e9),
    "mistral-7b": (7.25e9, 0.005e9),
    "mixtral-8x22b": (141e9, 0.5e9),
    "qwen2.5-7b": (7.61e9, 0.005e9),
    "qwen2.5-14b": (14.7e9, 0.05e9),
    "qwen2.5-72b": (72.7e9, 0.05e9),
    "qwen3-8b": (8.2e9, 0.05e9),
    "qwen3-14b": (14.8e9, 0.05e9),
    "qwen3-32b": (32.8e9, 0.05e9),
    "qwen3-30b-a3b": (30.5e9, 0.05e9),
    "qwen3-235b-a22b": (235e9, 0.5e9),
    "deepseek-v2": (236e9, 0.5e9),
    "nemotron4-15b": (15.7e9, 0.05e9),
    "nemotron4-340b": (340e9, 0.5e9),
    "megatron2021-1.7b": (1.7e9, 0.05e9),
    "megatron2021-3.6b": (3.6e9, 0.05e9),
    "megatron2021-7.5b": (7.5e9, 0.05e9),
    "megatron2021-18.4b": (18.4e9, 0.05e9),
    "megatron2021-39.1b": (39.1e9, 0.05e9),
    "megatron2021-76.1b": (76.1e9, 0.05e9),
    "megatron2021-145.6b": (145.6e9, 0.05e9),
    "megatron2021-310.1b": (310.1e9, 0.05e9),
    "megatron2021-529.6b": (529.6e9, 0.05e9),
    "megatron2021-1t": (1008.0e9, 0.05e9),
    "megatron2024-1.7b": (1.7e9, 0.05e9),
    "megatron2024-7.1b": (7.1e9, 0.05e9),
    "megatron2024-16b": (16e9, 0.5e9),
    # megatron2024-32b is left out: its printed 32B does not follow from the printed
    # shape with a 4h MLP.
    "megatron2024-70b": (70e9, 0.5e9),
    "megatron2024-119b": (119e9, 0.5e9),
    "megatron2024-177b": (177e9, 0.5e9),
    "megatron2024-314b": (314e9, 0.5e9),
    "megatron2024-462b": (462e9, 0.5e9),
    # BLOOM's model card (176,247,271,232), OPT's paper (175B)
    "bloom-176b": (176.247e9, 0.005e9),
    "opt-175b": (175e9, 0.5e9),
    # llm-foundry's benchmark table (scripts/train/benchmarking/README.md), 2,048 learned
    # positions included there
    "mpt-760m": (760_470_528, 0.0), "mpt-1b": (1_315_950_592, 0.0),
    "mpt-3b": (2_651_837_440, 0.0), "mpt-7b": (6_658_859_008, 0.0),
    "mpt-13b": (12_853_954_560, 0.0), "mpt-30b": (29_975_214_080, 0.0),
    "mpt-70b": (64_862_437_376, 0.0),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_catalog_parameter_counts(name):
    published, rounding = PUBLISHED[name]
    assert abs(MODELS[name].total_params - published) <= max(0.01 * published, rounding)


def test_mixtral_active_parameters():
    assert MODELS["mixtral-8x7b"].active_params == pytest.approx(12.9e9, rel=0.01)


@pytest.mark.parametrize("name, active", [("mixtral-8x22b", 39e9), ("qwen3-30b-a3b", 3.3e9),
                                          ("qwen3-235b-a22b", 22e9), ("deepseek-v2", 21e9)])
def test_moe_catalog_active_parameters(name, active):
    # the model cards' and DeepSeek-V2's activated parameters, printed to two digits
    assert MODELS[name].active_params == pytest.approx(active, rel=0.05)


def test_every_required_gpu_is_catalogued_with_sane_rates():
    for name in ("v100-32gb", "a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200",
                 "mi300x"):
        g = GPUS[name]
        assert g.bf16_tflops > g.tf32_tflops >= g.fp32_tflops > 0
        assert 0 < g.gemm_efficiency <= 1 and g.hbm_gib > 0


def test_hf_config_maps_to_modelspec(tmp_path):
    cfg = {
        "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
        "hidden_act": "silu", "num_local_experts": 8, "num_experts_per_tok": 2,
        "tie_word_embeddings": False, "model_type": "mixtral"
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    m = load_model(str(path))
    assert m.total_params == MODELS["mixtral-8x7b"].total_params
    assert m.gated_mlp and m.experts == 8 and m.experts_per_token == 2


@pytest.mark.parametrize(
    "cfg, total_b, active_b",
    [
        # Qwen1.5-MoE-A2.7B: 60 routed experts + one shared expert 4x as wide; published
        # 14.3B / 2.7B
        ({
            "num_hidden_layers": 24, "hidden_size": 2048, "num_attention_heads": 16,
            "num_key_value_heads": 16, "intermediate_size": 5632, "moe_intermediate_size": 1408,
            "shared_expert_intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4,
            "vocab_size": 151936, "hidden_act": "silu"
        }, 14.3, 2.7),
        # DeepSeekMoE 16B: 64 routed + 2 shared experts, top-6; published 16.4B / 2.8B
        ({
            "num_hidden_layers": 28, "hidden_size": 2048, "num_attention_heads": 16,
            "num_key_value_heads": 16, "intermediate_size": 10944, "moe_intermediate_size": 1408,
            "n_routed_experts": 64, "n_shared_experts": 2, "num_experts_per_tok": 6,
            "first_k_dense_replace": 1, "vocab_size": 102400, "hidden_act": "silu"
        }, 16.4, 2.8),
    ])
def test_hf_moe_configs_with_shared_experts(tmp_path, cfg, total_b, active_b):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = load_model(str(tmp_path / "config.json"))
    assert m.total_params / 1e9 == pytest.approx(total_b, rel=0.03)
    assert m.active_params / 1e9 == pytest.approx(active_b, rel=0.03)


def test_deepseek_v3_config_latent_attention_and_dense_first_layers(tmp_path):
    cfg = {
        "num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 128,
        "num_key_value_heads": 128, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
        "first_k_dense_replace": 3, "q_lora_rank": 1536, "kv_lora_rank": 512,
        "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
        "hidden_act": "silu", "tie_word_embeddings": False, "n_group": 8, "topk_group": 4
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = load_model(str(tmp_path / "config.json"))
    assert m == replace(MODELS["deepseek-v3"], name=m.name)
    # published: 671B in all, 37B active per token
    assert m.total_params / 1e9 == pytest.approx(671, rel=0.005)
    assert m.active_params / 1e9 == pytest.approx(37, rel=0.02)
    # per layer: q down/up (7168x1536, 1536x128x192), kv down/up (7168x576,
    # 512x128x256), out (16384x7168)
    assert m.attn_params_per_layer == (7168 * 1536 + 1536 * 128 * 192 + 7168 * 576
                                       + 512 * 128 * 256 + 16384 * 7168)
    with pytest.raises(SpecError, match="kv_heads"):
        replace(m, kv_heads=1)


def test_gelu_hf_config_is_not_gated(tmp_path):
    cfg = {
        "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "intermediate_size": 256, "vocab_size": 100, "hidden_act": "gelu"
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert not load_model(str(tmp_path / "config.json")).gated_mlp


@pytest.mark.parametrize("model_type, act, gated", [
    ("gemma2", "gelu_pytorch_tanh", True),  # GeGLU: gate_proj beside up_proj
    ("nemotron", "relu2", False),  # squared ReLU between two matrices
    ("gpt_neox", "gelu", False), ("llama", "silu", True)])
def test_a_hf_configs_model_type_says_whether_its_mlp_is_gated(tmp_path, model_type, act, gated):
    cfg = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
           "intermediate_size": 256, "vocab_size": 100, "hidden_act": act,
           "model_type": model_type}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert load_model(str(tmp_path / "config.json")).gated_mlp is gated


@pytest.mark.parametrize("experts, step, total_b", [(16, 1, 109), (128, 2, 400)])
def test_llama4s_language_model_from_its_multimodal_config(tmp_path, experts, step, total_b):
    # meta-llama/Llama-4-Scout-17B-16E and -Maverick-17B-128E: the text model sits under
    # text_config; published 109B and 400B in all (with a vision encoder of under 1B), 17B
    # active: top-1 of the routed experts and one shared expert, Maverick's MoE layers every
    # other one between dense layers of 16,384
    text = {"model_type": "llama4_text", "num_hidden_layers": 48, "hidden_size": 5120,
            "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
            "intermediate_size": 8192, "intermediate_size_mlp": 16384, "vocab_size": 202048,
            "num_local_experts": experts, "num_experts_per_tok": 1,
            "interleave_moe_layer_step": step}
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama4",
                                                      "text_config": text}))
    m = load_model(str(tmp_path / "config.json"))
    assert m.total_params / 1e9 == pytest.approx(total_b, rel=0.02)
    assert m.active_params / 1e9 == pytest.approx(17, rel=0.03)


def test_own_yaml_schema(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(
        yaml.safe_dump({
            "name": "tiny", "layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 256, "vocab": 100
        }))
    m = load_model(str(path))
    assert m.kv_heads == 4 and m.head_dim == 16


def test_a_model_file_in_megatrons_or_llm_foundrys_words_is_the_same_model(tmp_path):
    """Megatron-LM's argument names (num_query_groups left null: as many as heads), llm-foundry's
    (d_model, n_heads, n_layers) and a published table's (ffn null: the default width) mean our
    keys; a file without a name is named by its stem; a key given under two names is refused."""
    ours = {"name": "g", "layers": 48, "hidden": 7168, "heads": 56, "kv_heads": 56,
            "ffn_hidden": 28672, "vocab": 131072, "gated_mlp": False}
    theirs = [{"num_layers": 48, "hidden_size": 7168, "num_attention_heads": 56,
               "num_query_groups": None, "ffn_hidden_size": 28672, "vocab_size": 131072},
              {"n_layers": 48, "d_model": 7168, "n_heads": 56, "vocab_size": 131072},
              {"layers": 48, "hidden": 7168, "heads": 56, "kv_heads": None, "ffn": None,
               "vocab": 131072}]
    for data in theirs:
        path = tmp_path / "g.yaml"
        path.write_text(yaml.safe_dump({**data, "gated_mlp": False}))
        assert load_model(str(path)) == ModelSpec(**ours)
    path.write_text(yaml.safe_dump({**ours, "ffn": 1024}))
    with pytest.raises(SpecError, match=r"g.yaml.ffn(_hidden)?=\d+: says ffn_hidden again"):
        load_model(str(path))


@pytest.mark.parametrize("gated, ffn", [(False, 4 * 7168), (True, 19072)])
def test_an_unstated_mlp_width_is_megatrons_default(tmp_path, gated, ffn):
    # Megatron-LM's README GPT table gives no MLP width: 4h for a GELU MLP; a gated one gets
    # 4h x 2/3 = 19114.7, down to a multiple of 64 (arguments.py)
    path = tmp_path / "gpt.yaml"
    path.write_text(yaml.safe_dump({"name": "g", "layers": 2, "hidden": 7168, "heads": 56,
                                    "vocab": 131072, "gated_mlp": gated}))
    assert load_model(str(path)).ffn_hidden == ffn


def test_a_missing_required_field_is_named_with_its_fix(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("name: x\nlayers: 2\nheads: 4\nvocab: 100\n")
    with pytest.raises(SpecError, match=r"hidden=None: is required: give the model.s hidden"):
        load_model(str(path))


_MOE16 = ("name: m\nlayers: 2\nhidden: 64\nheads: 4\nffn_hidden: 64\nvocab: 64\n"
          "experts: 16\nexperts_per_token: 4\n")


@pytest.mark.parametrize("text, field", [
    ("name: x\nlayers: 2\nhidden: 64\nheads: 4\nffn_hidden: 256\nvocab: 100\ncolour: red\n",
     "colour"),
    ("name: x\nlayers: -2\nhidden: 64\nheads: 4\nffn_hidden: 256\nvocab: 100\n", "model.layers"),
    ("name: x\nlayers: 2\nhidden: 64\nheads: 5\nffn_hidden: 256\nvocab: 100\n", "model.heads"),
    # no ffn_hidden to default from a hidden that is no integer: hidden's own error
    ("name: x\nlayers: 2\nhidden: abc\nheads: 4\nvocab: 100\n", "model.hidden='abc'"),
    ("name: x\nlayers: 2\nhidden: true\nheads: 4\nvocab: 100\n", "model.hidden=True"),
    ("name: x\nlayers: [2\n", "model="),
    ("- just a list\n", "model="),
    # group-limited routing, 16 experts top-4: groups must divide the experts, and the chosen
    # ones hold at least the 4 experts a token takes
    *((_MOE16 + groups, field) for groups, field in (
        ("expert_groups: 0\ngroups_per_token: 2\n", "groups_per_token"),
        ("expert_groups: 3\ngroups_per_token: 1\n", "expert_groups"),
        ("expert_groups: 8\ngroups_per_token: 9\n", "groups_per_token"),
        ("expert_groups: 8\ngroups_per_token: 1\n", "groups_per_token"))),
])
def test_bad_model_files(tmp_path, text, field):
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as exc:
        load_model(str(path))
    assert field in str(exc.value)


def test_unknown_names():
    with pytest.raises(SpecError, match="simpar models"):
        load_model("gpt-9")
    with pytest.raises(SpecError, match="simpar gpus"):
        load_cluster(None, "tpu-v9")
    with pytest.raises(SpecError, match="cluster="):
        load_cluster("nope", None)


LLAMA = MODELS["llama3-70b"]
JOB = JobSpec(8192, 1024)


@pytest.mark.parametrize("kwargs, gpus, needle", [
    (dict(dp=8, tp=8, pp=8), 1024, "must equal --gpus 1024"),
    (dict(dp=16, tp=3, pp=1), 48, "heads"),
    (dict(dp=1, tp=16, pp=1), 16, "kv_heads"),
    (dict(dp=1, tp=1, pp=83), 83, "layers"),  # 80 layers, the embedding and the loss
    (dict(dp=1, tp=1, pp=40, vpp=3, schedule="interleaved"), 40, "layers"),
    (dict(dp=3, tp=8, pp=1), 24, "divisible by dp\\*micro_batch"),
    (dict(dp=8, tp=8, pp=1, micro_batch=3), 64, "divisible by dp\\*micro_batch"),
    (dict(dp=8, tp=8, pp=1, ep=2), 64, "mixture-of-experts"),
    (dict(dp=4, tp=1, pp=1, cp=3), 12, "--seq-len"),
])
def test_invalid_strategies_name_the_constraint(kwargs, gpus, needle):
    with pytest.raises(SpecError, match=needle):
        validate(Strategy(**kwargs), LLAMA, JOB, gpus)


def test_a_chunk_may_hold_just_the_embedding_or_the_loss_as_megatron_splits_405b():
    """Megatron-Bridge's Llama 3.1 405B recipes run its 126 layers in pp 16 x vpp 8 = 128 chunks,
    counting the embedding and the loss as a layer each; 129 chunks would leave one empty."""
    model, job = MODELS["llama3.1-405b"], JobSpec(8192, 1536)
    validate(Strategy(dp=4, tp=4, pp=16, vpp=8, schedule="interleaved"), model, job, 256)
    with pytest.raises(SpecError, match="plus 2"):
        validate(Strategy(dp=2, tp=4, pp=43, vpp=3, schedule="interleaved"), model, job, 344)


def test_experts_must_divide_by_ep():
    with pytest.raises(SpecError, match="experts"):
        validate(Strategy(dp=6, ep=3), MODELS["mixtral-8x7b"], JobSpec(4096, 12), 6)


@pytest.mark.parametrize("kwargs, needle", [
    (dict(zero=4), "ZeRO stage"),
    (dict(schedule="zigzag"), "schedule="),
    (dict(recompute="some"), "recompute="),
    (dict(sp=True), "--tp > 1"),
    (dict(pp=2, vpp=2), "interleaved"),
    (dict(tp=0), "tp="),
    (dict(pp=2, schedule="interleaved"), "--vpp >= 2"),
])
def test_strategy_field_errors(kwargs, needle):
    with pytest.raises(SpecError, match=needle):
        Strategy(**kwargs)


def test_uneven_layers_split_as_evenly_as_possible():
    counts = split_layers(126, 16)
    assert sum(counts) == 126 and max(counts) - min(counts) == 1
    assert counts[0] == counts[-1] == 7  # end stages also hold the embedding and output layer
    validate(Strategy(dp=128, tp=8, pp=16), MODELS["llama3.1-405b"], JobSpec(8192, 2048), 16384)


def test_cluster_yaml_file(tmp_path):
    path = tmp_path / "mycluster.yaml"
    path.write_text(yaml.safe_dump({"name": "roce-h100", "gpu": "h100-sxm", "gpus_per_node": 8,
                                    "intra_node_bw_gbps": 450, "intra_node_latency_us": 2,
                                    "nic_bw_gbps": 25, "inter_node_latency_us": 8}))
    c = load_cluster(str(path), None)
    assert c.name == "roce-h100" and c.gpu.name == "h100-sxm" and c.nic_bw_gbps == 25
    assert load_cluster(str(path), "h200").gpu.name == "h200"  # --gpu overrides the file's GPU
    path.write_text(
        yaml.safe_dump({
            "name": "x", "gpu": "h100-sxm", "gpus_per_node": 8, "intra_node_bw_gbps": 450,
            "intra_node_latency_us": 2, "nic_bw_gbps": 25, "inter_node_latency_us": 8,
            "switch_radix": 64
        }))
    with pytest.raises(SpecError, match="switch_radix"):
        load_cluster(str(path), None)


def test_a_model_of_ten_to_the_eleven_layers_is_refused_not_laid_out():
    with pytest.raises(SpecError, match="model.layers"):
        ModelSpec(name="typo", layers=10**11, hidden=64, heads=4, kv_heads=4, ffn_hidden=128,
                  vocab=100)


@pytest.mark.parametrize("pp, vpp", [(2, 1), (4, 1), (4, 3)])
def test_every_schedule_hands_each_chunk_to_one_rank(pp, vpp):
    """Worked cases: 1F1B rank r runs chunk r; interleaved runs r, r + pp, ...; a V runs
    r and 2pp - 1 - r."""
    from simpar.specs.schedule import SCHEDULES, get_schedule

    assert get_schedule("1f1b").rank_chunks(1, 4, 1) == [1]
    assert get_schedule("interleaved").rank_chunks(1, 4, 3) == [1, 5, 9]
    assert (
        get_schedule("zbv").rank_chunks(1, 4, 1)
        == get_schedule("dualpipev").rank_chunks(1, 4, 1)
        == [1, 6]
    )
    for pipe in SCHEDULES.values():
        v = vpp if pipe.virtual_stages else 1
        chunks = sorted(c for r in range(pp) for c in pipe.rank_chunks(r, pp, v))
        assert chunks == list(range(pp * pipe.chunks_per_rank(v))), pipe.name


def test_schedule_choices_are_defined_once_and_the_simulator_builds_each():
    from simpar.sim.schedules import _BUILDERS
    from simpar.specs.schedule import SCHEDULES

    assert set(_BUILDERS) == set(SCHEDULES)
    with pytest.raises(SpecError, match="did you mean 'zbv'"):
        Strategy(pp=2, schedule="zvb")
    with pytest.raises(SpecError, match="--vpp"):
        Strategy(pp=2, schedule="interleaved")  # virtual stages without --vpp
    with pytest.raises(SpecError, match="needs --pp > 1"):
        Strategy(schedule="zb-h1")


def test_strategy_labels_worked_cases():
    s = Strategy(dp=64, tp=8, pp=2, sp=True, zero=1, schedule="interleaved", vpp=8)
    assert s.label == "dp64 tp8+sp pp2 z1 interleaved v8"
    assert Strategy(dp=8, cp=2, ep=4).label == "dp8 tp1 pp1 cp2 ep4 z0 -"
    assert Strategy(dp=2, pp=4, schedule="zbv").schedule_label == "zbv"


def test_exponent_numbers_in_a_yaml_file_are_numbers(tmp_path):
    """YAML 1.1 (PyYAML) reads 1e3 and 2.5e-1 as text: `nic_bw_gbps: 1e3` was refused."""
    path = tmp_path / "c.yaml"
    path.write_text("name: c\ngpu: h100-sxm\ngpus_per_node: 8\nintra_node_bw_gbps: 4.5e2\n"
                    "intra_node_latency_us: 2\nnic_bw_gbps: 1e3\ninter_node_latency_us: 5E-1\n")
    c = load_cluster(str(path), None)
    assert (c.nic_bw_gbps, c.intra_node_bw_gbps, c.inter_node_latency_us) == (1000.0, 450.0, 0.5)
    assert c.name == "c"  # text stays text
