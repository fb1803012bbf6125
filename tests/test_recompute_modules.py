"""Megatron core's --recompute-modules: selective recompute named module by module (layernorm,
moe_act, core_attn, mla_up_proj), its memory and its time, by hand from the shapes."""

import json

import pytest

from simpar.cli import main
from simpar.cost.compute import gemm_time, memory_bound_time
from simpar.cost.layer import layer_cost
from simpar.memory.model import activation_bytes_per_token
from simpar.network.model import network_for
from simpar.specs import MODELS, Strategy, dgx_like
from simpar.specs.stack import get_stack
from simpar.workload.layer import layer_work

Q30 = MODELS["qwen3-30b-a3b"]  # 48 layers, hidden 2048, 128 experts top-8 of width 768, no clamp
OSS = MODELS["gpt-oss-120b"]  # a clamped GLU, which Megatron's unfused experts clamp in eager ops


def _kept(model, modules, dtype="bf16"):
    return activation_bytes_per_token(model, 4096, 1, False, "selective", True, dtype,
                                      modules=frozenset(modules))


def test_layernorm_and_moe_act_free_what_megatron_discards():
    none = activation_bytes_per_token(Q30, 4096, 1, False, "none", True, "bf16")
    # the pre-MLP norm's 16-bit output, which the router keeps (Transformer Engine fuses the
    # input norm into the QKV linear, which keeps its own copy: not a module to recompute)
    assert none - _kept(Q30, {"layernorm"}) == 2 * 2048
    # fc2's 16-bit input, the activation's output, for each of a token's 8 experts
    assert none - _kept(Q30, {"moe_act"}) == 2 * 768 * 8
    # a flash attention core keeps nothing its recompute would free
    assert _kept(Q30, {"core_attn"}) == none


def test_a_clamped_glus_eager_copies_go_with_its_activation():
    # gpt-oss under nemo's unfused experts: beside fc2's input, the clamped halves (2 x 16-bit)
    from simpar.memory.model import SavedCode

    code = SavedCode(clamps_experts_eagerly=True)
    none = activation_bytes_per_token(OSS, 4096, 1, False, "none", True, "bf16", code=code)
    act = activation_bytes_per_token(OSS, 4096, 1, False, "selective", True, "bf16", code=code,
                                     modules=frozenset({"moe_act"}))
    assert none - act == (2 + 2 * 2) * 2880 * 4


def test_the_modules_run_again_at_their_memory_bound_time():
    cluster = dgx_like("h100-sxm")
    work = layer_work(Q30, 4096, 1, 1, 1, 1, False, True, "bf16")
    # the activation reads fc1's two halves and writes one: 3 x 2 bytes a routed element
    assert work.mlp_act_bytes == 4096 * 8 * 768 * 3 * 2
    # the pre-MLP norm reads its input and writes its output
    assert work.norm_module_bytes == 4096 * 2 * 2 * 2048
    net = network_for(cluster, Strategy(dp=8))
    stack = get_stack("megatron")

    def again(modules):
        return layer_cost(work, net, cluster.gpu, "bf16", "selective", False, stack,
                          frozenset(modules))[1].recompute_s

    assert again(()) == 0.0
    act, norm = again({"moe_act"}), again({"layernorm"})
    # memory-bound kernels over the bytes above, one each
    assert act == pytest.approx(memory_bound_time(work.mlp_act_bytes, cluster.gpu, 1))
    assert norm == pytest.approx(memory_bound_time(work.norm_module_bytes, cluster.gpu, 1))
    assert again({"moe_act", "layernorm"}) == pytest.approx(act + norm)
    assert again({"core_attn"}) > 0


# Megatron-Bridge's gpt-oss B200 job; simulate adds its recipe's layout, compare searches it
GPT_OSS_JOB = ["--model", "gpt-oss-120b", "--gpu", "b200", "--gpus", "64", "--seq-len", "4096",
               "--global-batch", "1280", "--stack", "nemo", "--dtype", "bf16"]
GPT_OSS_B200 = [*GPT_OSS_JOB, "--ep", "8", "--micro-batch", "4"]


def _simulate(capsys, *extra):
    assert main(["simulate", *GPT_OSS_B200, *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_megatron_bridges_gpt_oss_b200_recipe_fits_with_its_recompute_modules(capsys):
    # Megatron-Bridge's GPT_OSS_120B_PRETRAIN_CONFIG_B200_BF16 (v0.4.0): recompute_modules
    # [layernorm, moe_act], which ran on 179 GiB B200s; selective's attention core alone does not
    # fit there
    core = _simulate(capsys, "--recompute", "selective")
    named = _simulate(capsys, "--recompute", "selective", "--recompute-modules",
                      "layernorm,moe_act")
    assert not core["fits_memory"] and named["fits_memory"]
    assert named["strategy"]["recompute_modules"] == ["layernorm", "moe_act"]
    plain = _simulate(capsys)
    assert named["step_time_s"] > plain["step_time_s"]


@pytest.mark.parametrize("extra, says", [
    (["--recompute-modules", "layernorm"], "add --recompute selective"),
    (["--recompute", "selective", "--recompute-modules", "layernrm"], "did you mean 'layernorm'"),
    (["--recompute", "selective", "--recompute-modules", "moe_act,moe_act"], "name each once"),
    (["--recompute", "selective", "--recompute-modules", "moe_act", "--stack", "torchtitan"],
     "use --stack megatron or nemo"),
])
def test_bad_recompute_modules_are_refused_in_one_line(capsys, extra, says):
    assert main(["simulate", *GPT_OSS_B200, *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "--recompute-modules" in err and "\n" not in err


def test_compare_searches_the_named_modules_where_the_core_alone_would_be_skipped(capsys):
    base = ["compare", *GPT_OSS_JOB, "--tp", "1", "--pp", "1", "--recompute", "none,selective",
            "--top", "3", "--json"]
    assert main(base) == 0
    plain = json.loads(capsys.readouterr().out)["top"]
    # with flash attention, recomputing the core frees nothing: no selective candidate
    assert all(t["strategy"]["recompute"] == "none" for t in plain)
    assert main([*base, "--recompute-modules", "layernorm,moe_act"]) == 0
    named = json.loads(capsys.readouterr().out)["top"]
    best = named[0]["strategy"]
    assert best["recompute"] == "selective"
    assert best["recompute_modules"] == ["layernorm", "moe_act"]
    assert named[0]["tokens_per_s"] > plain[0]["tokens_per_s"]
    # refused before the search, as simulate refuses them, not skipped candidate by candidate
    for bad in (["moe_act", "--stack", "torchtitan"], ["moe_act,moe_act"],
                ["moe_act", "--recompute", "none,full"]):
        assert main([*base, "--recompute-modules", *bad]) == 2
        assert "--recompute-modules" in capsys.readouterr().err


L8 = MODELS["llama3-8b"]  # dense: hidden 4096, a gated MLP of width 14336


def test_a_checkpointed_mlp_keeps_only_its_input():
    none = activation_bytes_per_token(L8, 4096, 1, False, "none", True, "bf16")
    # fc1's copy of its normed input (2 x 4096), fc1's two outputs and fc2's input (3 x 2 x 14336)
    assert none - _kept(L8, {"mlp"}) == 2 * 4096 + 3 * 2 * 14336
    q30 = activation_bytes_per_token(Q30, 4096, 1, False, "none", True, "bf16")
    # an MoE layer keeps its (normed) input for the router: the experts' copies of each token
    # (8 x 2 x 2048) and their fc1 outputs and fc2 inputs (8 x 3 x 2 x 768) go
    assert q30 - _kept(Q30, {"moe"}) == 8 * 2 * 2048 + 8 * 3 * 2 * 768
    # with its norm discarded too, the router's input goes
    assert _kept(Q30, {"moe"}) - _kept(Q30, {"moe", "layernorm"}) == 2 * 2048


def test_a_checkpointed_mlp_runs_its_gemms_and_activation_again():
    cluster = dgx_like("h100-sxm")
    work = layer_work(L8, 4096, 1, 1, 1, 1, False, True, "bf16")
    net = network_for(cluster, Strategy(dp=8))
    mlp = layer_cost(work, net, cluster.gpu, "bf16", "selective", False, get_stack("megatron"),
                     frozenset({"mlp"}))[1]
    gemms = sum(gemm_time(g, cluster.gpu, "bf16") for g in work.gemms
                if g.name in ("mlp_up", "mlp_down"))
    act = memory_bound_time(work.mlp_act_bytes, cluster.gpu, 1)
    assert work.mlp_act_bytes == 4096 * 14336 * 3 * 2
    assert mlp.recompute_s == pytest.approx(gemms + act)
    assert mlp.tp_comm_s == 0 and mlp.ep_comm_s == 0  # one rank: nothing to gather again


def test_only_the_modules_a_model_has_are_priced():
    s = Strategy(recompute="selective", recompute_modules=("core_attn", "mlp", "moe_act"),
                 stack="nemo")
    assert s.selective_modules(L8) == {"core_attn", "mlp"}
    assert s.selective_modules(Q30) == {"core_attn", "moe_act"}
    assert Strategy(recompute="full").selective_modules(Q30) == frozenset()


def test_a_checkpointed_moe_layer_dispatches_and_combines_again():
    cluster = dgx_like("h100-sxm")
    work = layer_work(Q30, 4096, 1, 1, 1, 8, False, True, "bf16")
    net = network_for(cluster, Strategy(dp=8, ep=8))
    stack = get_stack("megatron")

    def passes(modules):
        return layer_cost(work, net, cluster.gpu, "bf16", "selective", False, stack,
                          frozenset(modules))

    fwd, act = passes({"moe_act"})
    _, moe = passes({"moe"})
    assert fwd.ep_comm_s > 0
    assert moe.ep_comm_s == pytest.approx(act.ep_comm_s + fwd.ep_comm_s)
    assert moe.recompute_s > act.recompute_s  # the router's and experts' GEMMs besides


def test_hfu_counts_the_gemms_a_checkpointed_mlp_runs_again():
    from simpar.workload import flops

    def again(model, modules):
        return flops.recompute_flops_per_token(model, 4096, "selective",
                                               modules=frozenset(modules))

    # Llama 3 8B: 32 layers of three 4096 x 14336 matrices, 2 FLOPs a weight
    assert again(L8, {"mlp"}) == 32 * 2 * 3 * 4096 * 14336
    # Qwen3-30B-A3B: 48 layers of the router (2048 x 128) and 8 experts' three 2048 x 768
    assert again(Q30, {"moe"}) == 48 * 2 * (2048 * 128 + 8 * 3 * 2048 * 768)
    assert again(Q30, {"moe_act", "layernorm"}) == 0  # memory-bound work only
