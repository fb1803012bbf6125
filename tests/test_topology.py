"""Fabric graphs, routing and the flow model: the 'Done when' checks of the topology issue."""

import json
from dataclasses import replace

import numpy as np
import pytest

from simpar.cli import main
from simpar.cost.step import predict
from simpar.errors import SpecError
from simpar.network.algorithms import ALGORITHMS
from simpar.network.flowcost import STEP_OVERHEAD_S, FlowModel
from simpar.network.flows import max_min_rates, phase_time
from simpar.network.model import NetworkOptions, flow_model
from simpar.network.placement import rank_groups
from simpar.network.routing import path_latency, route
from simpar.network.topology import build
from simpar.specs import MODELS, JobSpec, Strategy, builtin_clusters, load_cluster
from simpar.specs.topology import topology_from_dict

H100 = load_cluster("dgx-h100", None)


def _cluster(**topology):
    base = {
        "kind": "fat-tree", "leaf_radix": 64, "spine_radix": 64, "rail_optimized": True, "tiers": 3
    }
    base.update(topology)
    return replace(H100, name="test", topology=topology_from_dict(base, "test"))


@pytest.mark.parametrize("nodes", [2, 4, 16, 64])
@pytest.mark.parametrize("size", [1e6, 1e8, 4e9])
def test_ring_allreduce_on_non_blocking_fat_tree_matches_closed_form(nodes, size):
    # one GPU per node (a data-parallel group under tp=8): every ring hop crosses the fabric on NICs
    gpus = nodes * 8
    model = flow_model(H100, gpus)
    group = tuple(range(0, gpus, 8))
    t, _ = model.cost("allreduce", size, (group,), "ring")
    b = H100.nic_bw_gbps * 1e9 * H100.inter_node_efficiency
    # each step's piece passes the ring's hops in turn: the mean hop, some through the spines
    hop = sum(path_latency(model.fab, a, group[(i + 1) % nodes])
              for i, a in enumerate(group)) / nodes
    expected = 2 * (nodes - 1) / nodes * size / b + 2 * (nodes - 1) * (hop + STEP_OVERHEAD_S)
    assert t == pytest.approx(expected, rel=0.01)


def test_spine_oversubscription_halves_cross_pod_bandwidth():
    # pods of 32 leaves x 4 nodes = 1,024 GPUs in both; the second fabric's spines have half as many
    # links up to the core as down to the leaves
    flat = _cluster(rail_optimized=False)
    over = _cluster(rail_optimized=False, spine_radix=48, spine_oversubscription=2.0)
    gpus = 2048
    fab_flat, fab_over = build(flat, gpus), build(over, gpus)
    assert (
        fab_flat.meta["pod_leaves"] == fab_over.meta["pod_leaves"] == 32
        and fab_over.meta["pods"] == 2
    )
    pod = 1024
    # every GPU all-reduces with its twin in the other pod
    groups = tuple((r, r + pod) for r in range(pod))
    t_flat, _ = FlowModel(fab_flat).cost("allreduce", 1e9, groups, "ring")
    t_over, _ = FlowModel(fab_over).cost("allreduce", 1e9, groups, "ring")
    inside = tuple((r, r + 8) for r in range(0, 64))  # neighbours inside one pod are unaffected
    t_in_flat, _ = FlowModel(fab_flat).cost("allreduce", 1e9, inside, "ring")
    t_in_over, _ = FlowModel(fab_over).cost("allreduce", 1e9, inside, "ring")
    assert t_over / t_flat == pytest.approx(2.0, rel=0.02)
    assert t_in_over == pytest.approx(t_in_flat, rel=0.01)


def test_rail_optimized_beats_non_rail_for_concurrent_dp_allreduces():
    # 3:1 oversubscribed leaves: with rails, a data-parallel ring (tp=8) stays on its rail's leaves;
    # without, all eight rails of a node leave the same leaf through four up-links.
    rail = _cluster(leaf_radix=16, leaf_oversubscription=3.0, rail_optimized=True)
    flat = _cluster(leaf_radix=16, leaf_oversubscription=3.0, rail_optimized=False)
    s = Strategy(dp=16, tp=8)
    groups = rank_groups((8, 1, 16, 1, 1, ("tp", "cp", "dp", "pp"), 16, False))["dp"]
    assert len(groups) == 8 and all(len(g) == 16 for g in groups)
    t_rail, _ = flow_model(rail, s.gpus).cost("allreduce", 1e9, groups, "ring")
    t_flat, _ = flow_model(flat, s.gpus).cost("allreduce", 1e9, groups, "ring")
    assert t_flat > 1.5 * t_rail


def test_four_nics_per_node_give_a_nodes_eight_gpus_a_quarter_of_a_dgx_a100s_network():
    """Jean Zay (BLOOM's machine): 4 x 100 Gb/s Omni-Path per node, shared through the node's
    switch, where a DGX A100 gives each GPU its own 200 Gb/s NIC. Every GPU of two nodes sending to
    its twin in the other node at once gets 50 GB/s / 8 against 25 GB/s: four times as long."""
    jz, dgx = load_cluster("jean-zay-a100", None), load_cluster("dgx-a100", None)
    assert (jz.gpus_per_node, dict(jz.topology.params)["nics_per_node"]) == (8, 4)
    pairs = tuple((r, r + 8) for r in range(8))
    t_jz, _ = flow_model(jz, 16).cost("allreduce", 1e9, pairs, "ring")
    t_dgx, _ = flow_model(dgx, 16).cost("allreduce", 1e9, pairs, "ring")
    assert t_jz / t_dgx == pytest.approx(4.0, rel=0.02)


def test_torus_ring_per_dimension_matches_hand_calculation():
    c = load_cluster("torus-3d", None)
    cluster = replace(
        c, topology=topology_from_dict(
            {"kind": "torus", "dims": [4, 4, 4], "link_bw_gbps": 50, "link_latency_us": 1.0}, "t"))
    model = flow_model(cluster, 64)
    size = 1e9
    t, _ = model.cost("allreduce", size, (tuple(range(64)),), "torus-ring")
    b = 50e9 * cluster.inter_node_efficiency
    # reduce-scatter along x, y, z on rings of 4 (each with 1/4 of the data left), then
    # all-gather back
    bandwidth = 2 * sum(3 / 4 * size / 4 ** i / b for i in range(3))
    latency = 2 * 3 * 3 * (1e-6 + STEP_OVERHEAD_S)
    assert t == pytest.approx(bandwidth + latency, rel=1e-6)


def test_dragonfly_alltoall_is_bottlenecked_on_the_global_link():
    base = load_cluster("dragonfly", None)
    topo = {
        "kind": "dragonfly", "routers_per_group": 4, "gpus_per_router": 2,
        "global_links_per_router": 1, "local_bw_gbps": 1000, "global_bw_gbps": 25,
        "link_latency_us": 0.0
    }
    cluster = replace(base, nic_bw_gbps=1000, topology=topology_from_dict(topo, "d"))
    model = flow_model(cluster, 16)  # two groups of 8 GPUs joined by one global link
    size = 1.6e9
    t, algo = model.cost("alltoall", size, (tuple(range(16)),))
    g = 25e9 * cluster.inter_node_efficiency
    # 8 x 8 flows of size/16 cross the one link each way: 4 x size bytes
    assert algo == "direct"
    assert t == pytest.approx(4 * size / g + STEP_OVERHEAD_S, rel=1e-6)


def test_valiant_spreads_inter_group_traffic():
    c = load_cluster("dragonfly", None)
    minimal = flow_model(c, 256)  # four groups of 64 GPUs
    valiant = FlowModel(minimal.fab, valiant=True)
    pairs = tuple((r, r + 64) for r in range(64))  # all of group 0 sends to group 1 at once
    t_min, _ = minimal.cost("p2p", 1e9, pairs)
    t_val, _ = valiant.cost("p2p", 1e9, pairs)
    # minimal routing queues 64 flows on the one 0-1 global link; Valiant spreads them over the two
    # intermediate groups, whose links each carry half of the traffic
    assert t_min / t_val == pytest.approx(2.0, rel=0.05)



def test_the_event_engine_and_the_closed_form_route_alike():
    """--routing valiant reaches the event engine too (it was dropped on the way to it)."""
    from simpar.sim.engine import simulate

    c = load_cluster("dragonfly", None)
    job = JobSpec(4096, 256)
    s = Strategy(dp=256, micro_batch=1, zero=3)  # FSDP over all four groups of the dragonfly
    model = MODELS["llama3-8b"]
    minimal, spread = NetworkOptions(), NetworkOptions(valiant=True)
    closed = [predict(model, c, job, s, network=n).breakdown["dp_comm"] for n in (minimal, spread)]
    engine = [
        simulate(model, c, job, s, network=n).first.breakdown["dp_comm"] for n in (minimal, spread)
    ]
    assert closed[0] != closed[1]
    assert (engine[0] > engine[1]) == (closed[0] > closed[1]) and engine[0] != engine[1]

def test_every_builtin_cluster_builds():
    for name in builtin_clusters():
        c = load_cluster(name, None)
        fab = build(c, 64)
        assert fab.graph.number_of_nodes() > 64 and min(fab.capacity) > 0


@pytest.mark.parametrize("topo, field", [
    ({"kind": "fat-tree", "leaf_radix": -4}, "leaf_radix"),
    ({"kind": "fat-tree", "colour": "red"}, "colour"),
    ({"kind": "mesh"}, "kind"),
    ({"kind": "torus", "dims": [4], "link_bw_gbps": 50}, "dims"),
    ({"kind": "torus", "dims": [4, 4]}, "link_bw_gbps"),
    ({
        "kind": "dragonfly", "routers_per_group": 2, "gpus_per_router": 1,
        "global_links_per_router": 1, "local_bw_gbps": 1, "global_bw_gbps": -1
    }, "global_bw_gbps"),
])
def test_bad_topology_values(topo, field):
    with pytest.raises(SpecError, match=field):
        topology_from_dict(topo, "topology")


def test_radix_too_small_for_the_gpus():
    c = _cluster(leaf_radix=8, spine_radix=4, tiers=2)
    with pytest.raises(SpecError, match="spine_radix"):
        build(c, 1024)
    small = replace(load_cluster("torus-2d", None))
    with pytest.raises(SpecError, match="torus"):
        build(small, 10_000)


def test_topo_show_and_png(tmp_path, capsys):
    png = tmp_path / "fabric.png"
    assert main(["topo", "show", "dgx-h100", "--gpus", "64", "--png", str(png), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["nodes_by_kind"]["gpu"] == 64 and info["bisection_bw_gbps"] == pytest.approx(
        32 * 50)
    assert info["diameter_hops"] >= 4 and png.stat().st_size > 1000


@pytest.mark.parametrize("cluster", ["torus-3d", "dragonfly", "cpu-local"])
def test_topo_show_draws_every_fabric_by_default(tmp_path, monkeypatch, capsys, cluster):
    monkeypatch.chdir(tmp_path)  # the default drawing goes to the current folder
    assert main(["topo", "show", cluster, "--gpus", "1024" if cluster != "cpu-local" else "4"]) == 0
    drawn = list(tmp_path.glob("topo-*.png"))
    assert (
        len(drawn) == 1
        and drawn[0].stat().st_size > 1000
        and str(drawn[0].name) in capsys.readouterr().out
    )
    assert (
        main(["topo", "show", cluster, "--gpus", "4", "--no-png"]) == 0
        and len(list(tmp_path.glob("*.png"))) == 1
    )


def test_collective_command_reports_nccl_tests_figures(capsys):
    assert main(["collective", "--cluster", "dgx-h100", "--gpus", "8", "--op", "allreduce",
                 "--size-bytes", "1Gi", "--algo", "ring", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["busbw_gbps"] == pytest.approx(d["algbw_gbps"] * 2 * 7 / 8)
    # a ring inside an NVSwitch node runs near the achievable NVLink rate
    assert 0.9 * 360 < d["busbw_gbps"] <= 360


def test_collective_command_takes_a_gpu_as_simulate_does(capsys):
    # --gpu alone means DGX-like nodes of it; before, "--gpu" was read as an abbreviation of
    # --gpus and refused with "invalid int value: 'a100-80gb'"
    args = ["collective", "--gpus", "16", "--op", "allgather", "--size-bytes", "1G", "--json"]
    assert main([*args, "--gpu", "a100-80gb"]) == 0
    by_gpu = json.loads(capsys.readouterr().out)
    assert main([*args, "--cluster", "dgx-a100"]) == 0
    by_cluster = json.loads(capsys.readouterr().out)
    # two nodes of eight: a ring crosses both nodes' eight 25 GB/s HDR NICs
    assert 150 < by_gpu["algbw_gbps"] <= 200 and 150 < by_cluster["algbw_gbps"] <= 200
    assert main(["collective", "--gpus", "16", "--size-bytes", "1G"]) == 2
    assert "give --gpu" in capsys.readouterr().err


def test_closed_form_collectives_price_point_to_point_and_refuse_an_algorithm(capsys):
    # a p2p under --network alpha-beta raised KeyError: 'p2p'; --algo was silently ignored
    args = ["collective", "--cluster", "dgx-h100", "--gpus", "16", "--size-bytes", "1G",
            "--network", "alpha-beta", "--json"]
    assert main([*args, "--op", "p2p"]) == 0
    p2p = json.loads(capsys.readouterr().out)
    # ranks 0 and 1 share a node: one NVLink transfer, far faster than a 50 GB/s NIC
    assert p2p["algorithm"] == "alpha-beta" and p2p["algbw_gbps"] > 100
    assert p2p["busbw_gbps"] == pytest.approx(p2p["algbw_gbps"])
    assert main([*args, "--op", "allreduce", "--algo", "ring"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--algo='ring'" in err and "--network flow" in err
    # a broadcast (KeyError: 'broadcast' before) is a chain along the ring: each link carries
    # the whole message once, near the rate the fabric graph's best broadcast finds
    assert main([*args, "--op", "broadcast"]) == 0
    closed = json.loads(capsys.readouterr().out)
    assert main([*args[:-3], "--op", "broadcast", "--json"]) == 0
    flow = json.loads(capsys.readouterr().out)
    assert closed["algbw_gbps"] == pytest.approx(flow["algbw_gbps"], rel=0.1)
    # the fabric graph's ring broadcast runs a chain per channel, as NCCL does, so two nodes
    # cross on all eight 50 GB/s NICs (one chain crossed on one: 45 GB/s)
    assert main([*args[:-3], "--op", "broadcast", "--algo", "ring", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["algbw_gbps"] > 300


def test_an_all_to_all_too_large_for_the_fabric_graph_is_refused_before_it_starts(capsys):
    # n^2 flows: 4,096 GPUs took 66 s and 13 GB, 32,768 ran out of memory
    args = ["collective", "--cluster", "dgx-h100", "--op", "alltoall", "--size-bytes", "1G"]
    assert main([*args, "--gpus", "4096"]) == 2
    assert "--network alpha-beta" in capsys.readouterr().err
    assert main([*args, "--gpus", "4096", "--network", "alpha-beta"]) == 0


def test_concurrent_groups_contend_for_links():
    model = flow_model(H100, 16)
    alone, _ = model.cost("allreduce", 1e9, ((0, 8),), "ring")
    together, _ = model.cost("allreduce", 1e9, ((0, 8), (1, 9)), "ring")
    assert together == pytest.approx(alone)  # separate NICs: no contention
    pcie = load_cluster("pcie-node", None)
    m2 = flow_model(pcie, 16)
    one, _ = m2.cost("allreduce", 1e9, ((0, 8),), "ring")
    eight, _ = m2.cost("allreduce", 1e9, tuple((i, i + 8) for i in range(8)), "ring")
    assert eight == pytest.approx(8 * one, rel=0.05)  # eight rings share one NIC per node


def test_flow_and_alpha_beta_agree_on_a_dgx_job():
    s = Strategy(dp=8, tp=8, pp=2, sp=True, zero=1)
    job = JobSpec(4096, 256)
    flow = predict(MODELS["llama3-70b"], H100, job, s, network=NetworkOptions(model="flow"))
    ab = predict(MODELS["llama3-70b"], H100, job, s, network=NetworkOptions(model="alpha-beta"))
    assert flow.step_time_s == pytest.approx(ab.step_time_s, rel=0.05)


def test_placement_and_routing_flags(capsys):
    base = [
        "simulate", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "64", "--seq-len",
        "4096", "--global-batch", "64", "--tp", "8", "--sp", "--json"
    ]
    assert main(base) == 0
    inner = json.loads(capsys.readouterr().out)["step_time_s"]
    assert main(base + ["--placement", "dp,cp,tp,pp"]) == 0  # tp across nodes: slower
    outer = json.loads(capsys.readouterr().out)["step_time_s"]
    assert outer > 1.2 * inner
    assert main(base + ["--placement", "tp,dp"]) == 2
    assert "--placement" in capsys.readouterr().err
    assert main(["collective", "--cluster", "dragonfly", "--gpus", "256", "--routing", "valiant",
                 "--size-bytes", "1e8"]) == 0


@pytest.mark.parametrize("args, says", [
    (["topo", "show", "dgx-h100", "--gpus", "1000000"], "give 1 to 65,536 GPUs"),
    ([
        "simulate", "--model", "llama3-70b", "--gpu", "h100-sxm", "--gpus", "1048576", "--seq-len",
        "8192", "--global-batch", "1048576", "--tp", "8", "--pp", "8"
    ], "--network alpha-beta"),
])
def test_a_million_gpus_answer_in_a_line_not_gigabytes(args, says, capsys):
    """The flow model built every link of a 10^6-GPU fabric and grew to gigabytes
    without answering."""
    assert main(args) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1
    # the closed form prices the same job at once
    if args[0] == "simulate":
        assert main(args + ["--network", "alpha-beta", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["step_time_s"] > 0



# 8 groups, one GPU in each of 4 nodes
ACROSS = tuple((32 + i, 40 + i, 48 + i, 56 + i) for i in range(8))
WITHIN_AND_ACROSS = tuple(tuple(range(n * 8, n * 8 + 8)) for n in range(4)) + ACROSS
PAIRS_IN_TWO_NODES = tuple(
    (32 + 2 * i, 33 + 2 * i, 40 + 2 * i, 41 + 2 * i) for i in range(4)) + ((48, 50, 56, 58), )


@pytest.mark.parametrize("algo, groups", [("ring", WITHIN_AND_ACROSS), ("ring", ACROSS),
                                          ("tree", ACROSS), ("hierarchical", PAIRS_IN_TWO_NODES)])
def test_shifted_group_phases_solve_as_every_group_built_on_its_own(algo, groups):
    """The flow model builds one group shape's phases and shifts them to every group of
    that shape; built group by group (the algorithm run on each group, each route found
    anew) the same flows give the same time, on groups of mixed shapes."""
    fab = build(H100, 64)
    model = FlowModel(fab)
    per_byte = 0.0
    phases = [ALGORITHMS[algo]("allreduce", list(g), fab.node_of) for g in groups]
    for i in range(len(phases[0])):
        flows = [f for p in phases for f in p[i].flows]
        routes = [route(fab, a, b) for a, b, _ in flows]
        f_idx = np.array([j for j, r in enumerate(routes) for _ in r], dtype=np.int64)
        links = np.array([k for r in routes for k in r], dtype=np.int64)
        shares = np.array([w for r in routes for w in r.values()])
        rates = max_min_rates(f_idx, links, shares, len(flows), model.capacity)
        per_byte += phase_time(np.array([f[2] for f in flows]), rates)
    assert model.linear_cost("allreduce", algo, groups)[0] == pytest.approx(per_byte, rel=1e-12)


@pytest.mark.parametrize("cluster, gpus", [("dgx-h100", 16384), ("dgx-a100", 1024),
                                           ("pcie-node", 64), ("dgx-h100", 8)])
def test_fat_tree_routes_at_once_are_the_routes_one_at_a_time(cluster, gpus):
    """Three tiers across pods, one pod, a node whose GPUs share one NIC through the
    switch, one node."""
    from simpar.network.routing import fat_tree_links, fat_tree_routes, route_with_latency

    fab = build(load_cluster(cluster, None), gpus)
    rng = np.random.default_rng(1)
    src, dst = rng.integers(0, gpus, 500), rng.integers(0, gpus, 500)
    src, dst = src[src != dst], dst[src != dst]
    table, latency = fat_tree_routes(fat_tree_links(fab), src, dst)
    for row, lat, a, b in zip(table, latency, src, dst, strict=True):
        shares, want = route_with_latency(fab, int(a), int(b))
        assert [x for x in row if x >= 0] == list(shares) and lat == want


def test_flow_model_routes_each_pair_once_and_finds_it_again():
    model = FlowModel(build(load_cluster("dgx-h100", None), 64))
    # -1: the node's switch
    ends = np.array([[0, 9], [9, 0], [0, 9], [-1, 3], [17, 40]], dtype=np.int64)
    first = model._route_ids(ends)
    assert first[0] == first[2] and len(set(first.tolist())) == 4 and len(model._lengths) == 4
    again = model._route_ids(ends[::-1].copy())
    assert again.tolist() == first[::-1].tolist() and len(model._lengths) == 4
    assert model._lengths[first[3]] == 1  # the node's switch to GPU 3: one NVLink


def test_mesh_groups_worked_by_hand_and_built_on_first_use():
    # 8 ranks, tp innermost, ep 2 of dp 4
    groups = rank_groups((2, 1, 4, 1, 2, ("tp", "cp", "dp", "pp"), 4, False))
    assert groups["tp"] == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert "dp" not in groups  # not built until asked for
    assert groups["dp"] == groups["dpcp"] == ((0, 2, 4, 6), (1, 3, 5, 7))
    # contiguous runs of each data-parallel group
    assert groups["ep"] == ((0, 2), (4, 6), (1, 3), (5, 7))
    assert groups["edp"] == ((0, 4), (2, 6), (1, 5), (3, 7))  # the same expert slot in every run


def test_nccl_gathers_and_scatters_in_rings_across_nodes(capsys):
    """NCCL runs all-gather and reduce-scatter as rings (its tree and the in-node
    reduce-scatter / cross-node all-reduce of `hierarchical` are all-reduce only), so
    a gather over 16 nodes of 8 pays 127 message steps of latency, not 15 + 7. A ring that
    crosses nodes posts every step to the network: on a DGX A100, whose hosts are AMD, three
    posts of 2 us pace each step at 6 us, above its hops' own latency (per channel 112 NVLink
    hops of 2 us and 16 NIC hops of 5 us and the switches, each with NCCL's step overhead).
    Forced, the hierarchical algorithm still answers."""
    model = flow_model(load_cluster("dgx-a100", None), 128)
    group = (tuple(range(128)),)
    for op in ("allgather", "reducescatter"):
        seconds, algo = model.cost(op, 1.0, group)
        assert algo == "ring"
        hops = 127 * (2e-6 + STEP_OVERHEAD_S) + 16 * (5e-6 + 6 * 0.6e-6)
        assert seconds == pytest.approx(127 * 3 * 2e-6, rel=1e-3) and seconds > hops
        assert model.cost(op, 1.0, group, "hierarchical")[0] < seconds / 2
    assert main(["collective", "--cluster", "dgx-a100", "--gpus", "128", "--op", "allgather",
                 "--size-bytes", "1G", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["algorithm"] == "ring"
