"""Hybrid sharding (HSDP, Strategy.dp_shard): the ZeRO stage shards over groups of dp_shard
data-parallel ranks, which replicate each other: memory per rank, where the groups sit, what each
collective moves, the search and the command line."""

import json
from dataclasses import replace

import pytest

from simpar.cli.parser import main
from simpar.cost import gradsync
from simpar.cost.pricing import Pricing
from simpar.cost.step import predict
from simpar.errors import SpecError
from simpar.memory.model import memory_breakdown
from simpar.network.model import DEFAULT_NETWORK, network_for
from simpar.network.placement import mesh_key, rank_groups
from simpar.search.space import enumerate_strategies
from simpar.specs import MODELS, JobSpec, Strategy, dgx_like
from simpar.workload.params import stage_params

M = MODELS["llama3-8b"]
H100 = dgx_like("h100-sxm")
JOB = JobSpec(4096, 64)


def test_model_states_shard_over_the_group_not_all_of_dp():
    """Llama 3 8B under torchtitan's FSDP (4 + 4 + 8 bytes per fp32 parameter) on 64 ranks: in
    groups of 8 a rank holds an eighth of the states, not a 64th."""
    full = Strategy(dp=64, zero=3, stack="torchtitan")
    hybrid = replace(full, dp_shard=8)
    params = sum(stage_params(M, full, 0, M.layers))
    gib = 2**30
    states = {s.dp_shard: memory_breakdown(M, JOB, s) for s in (full, hybrid)}
    for dp_shard, ranks in ((0, 64), (8, 8)):
        b = states[dp_shard]
        assert b.weights_gib * gib == pytest.approx(4 * params / ranks, rel=1e-9)
        assert b.optimizer_gib * gib == pytest.approx(8 * params / ranks, rel=1e-9)


def test_shard_groups_are_runs_of_dp_ranks_and_replicas_the_same_slot_in_each():
    """tp 2 x dp 8 on 16 GPUs, groups of 4 dp ranks: the shard groups hold every other rank of
    one node, the replica groups pair the same slot of the two nodes."""
    s = Strategy(dp=8, tp=2, zero=3, dp_shard=4)
    groups = rank_groups(mesh_key(s))
    assert groups["shard"] == ((0, 2, 4, 6), (8, 10, 12, 14), (1, 3, 5, 7), (9, 11, 13, 15))
    assert sorted(groups["replicate"]) == sorted(tuple((r, r + 8)) for r in range(8))
    net = network_for(dgx_like("h100-sxm"), s, DEFAULT_NETWORK)
    assert all(len({r // 8 for r in g}) == 1 for g in net.gpu_groups("shard"))
    assert all(len({r // 8 for r in g}) == 2 for g in net.gpu_groups("replicate"))


def test_gathers_stay_in_the_node_and_the_reduction_adds_an_all_reduce_of_the_shard():
    """FSDP over 16 ranks of two nodes against groups of 8 (one node each): the all-gather
    crosses no node, and the gradients are reduce-scattered in the node, then each rank's
    eighth all-reduced with its peer in the other node."""
    full = Strategy(dp=16, zero=3, micro_batch=1, stack="torchtitan")
    hybrid = replace(full, dp_shard=8)
    job = JobSpec(4096, 16)
    dense, expert = stage_params(M, full, 0, M.layers)

    def pricing(s):
        return Pricing(M, H100, job, s, network_for(H100, s, DEFAULT_NETWORK))

    def sync(s, op):
        return gradsync.sharded_sync(pricing(s), op, dense, expert, M.layers)

    assert sync(hybrid, "allgather") < sync(full, "allgather")
    p = pricing(hybrid)
    units = M.layers  # FSDP gathers and reduces block by block
    grads = (dense + expert) * 4  # fp32 reduction
    shard_only = gradsync.bucketed(p.net, "reducescatter", grads, "shard", units)
    replicas = gradsync.bucketed(p.net, "allreduce", grads / 8, "replicate", units)
    assert sync(hybrid, "reducescatter") == pytest.approx(shard_only + replicas, rel=1e-9)
    assert predict(M, H100, job, hybrid).step_time_s > 0


def test_a_bad_shard_degree_gets_one_line_naming_the_fix(capsys):
    with pytest.raises(SpecError, match="must divide --dp"):
        Strategy(dp=8, zero=3, dp_shard=3)
    with pytest.raises(SpecError, match="add --zero"):
        Strategy(dp=8, dp_shard=4)
    assert Strategy(dp=8, zero=3, dp_shard=8).dp_shard == 0  # all of dp: plain sharding
    base = ["simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16",
            "--seq-len", "4096", "--global-batch", "16", "--stack", "torchtitan"]
    assert main(base + ["--dp-shard", "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--dp-shard" in err and "must divide --dp (16)" in err
    assert main(base + ["--dp-shard", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["strategy"]["dp_shard"] == 8


def test_the_search_offers_fsdp_within_a_node_beside_fsdp_over_all():
    shards = {s.dp_shard for s in enumerate_strategies(M, JOB, 16, 8,
                                                        gpu=dgx_like("h100-sxm").gpu)
              if s.zero == 3 and s.tp == 1 and s.cp == 1 and s.pp == 1}
    assert shards == {0, 8}


def test_execpar_runs_hybrid_sharding_through_fsdp2_only():
    pytest.importorskip("torch")
    from execpar.mesh import check_supported

    job = JobSpec(4096, 8)
    check_supported(Strategy(dp=4, zero=3, dp_shard=2, stack="execpar"), M, job)
    with pytest.raises(SpecError, match="--zero 2 or 3"):
        check_supported(Strategy(dp=4, zero=1, dp_shard=2, stack="execpar"), M, job)


def test_compare_searches_only_the_shard_groups_asked_for(capsys):
    from simpar.search.space import SearchSpace

    space = SearchSpace(dp_shard=(0, 4))
    found = {(s.dp, s.zero, s.dp_shard) for s in enumerate_strategies(M, JOB, 16, 8, space,
                                                                 gpu=dgx_like("h100-sxm").gpu)
             if s.tp == 1 and s.cp == 1 and s.pp == 1}
    # dp 16: all of it, or groups of 4 under ZeRO 1-3; never a hybrid DDP
    assert {(16, z, d) for z in (1, 2, 3) for d in (0, 4)} | {(16, 0, 0)} == found
    assert main(["compare", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "16",
                 "--seq-len", "4096", "--global-batch", "64", "--dp-shard", "4", "--zero", "3",
                 "--tp", "1", "--pp", "1", "--cp", "1", "--json", "--rerank", "0"]) == 0
    rows = json.loads(capsys.readouterr().out)["top"]
    assert rows and all(r["strategy"]["dp_shard"] == 4 for r in rows)
