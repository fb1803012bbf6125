"""Summaries and drawings of a built fabric: node and link counts, bisection bandwidth, diameter."""

from __future__ import annotations

from collections import Counter

import networkx as nx

from simpar.files import atomic_write


def summary(fab) -> dict:
    g = fab.graph
    kinds = Counter(n[0] for n in g.nodes)
    links = g.number_of_edges() // 2
    und = g.to_undirected(as_view=True)
    return {
        "cluster": fab.cluster.name, "kind": fab.kind, "gpus": fab.gpus,
        "nodes_by_kind": dict(kinds), "links": links, "diameter_hops": _diameter(fab, und),
        "bisection_bw_gbps": bisection_gbps(fab)
    }


def _diameter(fab, und) -> int:
    """Longest shortest path between GPUs, in links (from the GPUs farthest apart in rank order)."""
    src = ("gpu", 0) if ("gpu", 0) in und else next(iter(und.nodes))
    far = nx.single_source_shortest_path_length(und, src)
    other = max(far, key=far.get)
    return max(nx.single_source_shortest_path_length(und, other).values())


def bisection_gbps(fab) -> float:
    """Nominal bandwidth (GB/s, one direction) across the cut between the first and
    second half of the ranks: the max flow from one half to the other."""
    if fab.gpus < 2:
        return 0.0
    g = nx.DiGraph()
    for u, v, d in fab.graph.edges(data=True):
        g.add_edge(u, v, capacity=d["bw_gbps"])
    half = fab.gpus // 2
    for r in range(fab.gpus):
        side = "S" if r < half else "T"
        gpu = ("gpu", r)
        if side == "S":
            g.add_edge("S", gpu, capacity=float("inf"))
        else:
            g.add_edge(gpu, "T", capacity=float("inf"))
    return float(nx.maximum_flow_value(g, "S", "T"))


def _grid_layout(g) -> dict:
    """Positions without force-directed layout (too slow for thousands of nodes): torus chips
    at their coordinates (3-D tori as side-by-side z slices), dragonfly routers on a circle by
    group, the host in the middle, and every GPU beside the switch or chip it hangs from."""
    import math

    pos = {}
    chips = [n for n in g.nodes if n[0] == "chip"]
    width = 1 + max((n[1][0] for n in chips), default=0)
    for n in chips:
        x, y, *z = n[1]
        pos[n] = (x + (z[0] if z else 0) * (width + 1), y)
    routers = sorted(n for n in g.nodes if n[0] == "router")
    for i, n in enumerate(routers):
        angle = 2 * math.pi * i / len(routers)
        pos[n] = (10 * math.cos(angle), 10 * math.sin(angle))
    for n in g.nodes:
        if n not in pos and n[0] != "gpu":
            pos[n] = (0.0, 0.0)
    for n in g.nodes:
        if n[0] == "gpu":
            x, y = next((pos[m] for m in g.neighbors(n) if m in pos), (0.0, 0.0))
            angle = 2.4 * n[1]  # spread a switch's GPUs around it
            pos[n] = (x + 0.3 * math.cos(angle), y + 0.3 * math.sin(angle) - 0.3)
    return pos


def draw(fab, path: str) -> None:
    """Write a PNG of the fabric (layered by switch tier for fat-trees, spring layout otherwise)."""
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure registry

    und = fab.graph.to_undirected(as_view=True)
    tiers = {
        "gpu": 0, "chip": 1, "hub": 1, "nic": 2, "leaf": 3, "spine": 4, "core": 5, "router": 2,
        "host": 1
    }
    if fab.kind == "fat-tree":
        for n in und.nodes:
            und.nodes[n]["layer"] = tiers.get(n[0], 0)
        pos = nx.multipartite_layout(und, subset_key="layer", align="horizontal")
    else:
        pos = _grid_layout(und)
    colours = [f"C{tiers.get(n[0], 0)}" for n in und.nodes]
    fig = Figure(figsize=(12, 7))
    ax = fig.subplots()
    nx.draw_networkx(und, pos, ax=ax, node_size=20 if und.number_of_nodes() > 200 else 60,
                     with_labels=False, node_color=colours, width=0.3)
    ax.set_title(f"{fab.cluster.name}: {fab.gpus} GPUs, {fab.kind}")
    ax.set_axis_off()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight"),
                 "--png")
