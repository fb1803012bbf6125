"""Routes between two GPUs of a fabric, as {link id: share of the flow}.

Fat-tree: up to the lowest common tier and down, spread evenly over the equal-cost uplinks
(ECMP with NCCL's many queue pairs spreading traffic, so the long-run split is even); the
parallel up-links of a leaf, and the spine-core links of a pod, are used as one bundle each
(see topology._fat_tree_bundles). Torus: dimension-order routing, the shorter way round
each ring. Dragonfly: minimal routing through the one global link between two groups, or
Valiant routing through an intermediate group (spread evenly over all of them)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np


def route_with_latency(fab, src: int, dst: int, valiant: bool = False) -> tuple[dict, float]:
    """(link shares, seconds of latency along one shortest path) in one pass."""
    if src == dst:
        return {}, 0.0
    if fab.kind == "fat-tree":
        path = _fat_tree(fab, src, dst, False, one=True)[0][0]
        latency = sum(fab.latency[fab.link_index[(u, v)]]
                      for u, v in zip(path, path[1:], strict=False))
        return {fab.link_index[k]: 1.0 for k in _bundled(path)}, latency
    return route(fab, src, dst, valiant), path_latency(fab, src, dst)


def route(fab, src: int, dst: int, valiant: bool = False) -> dict:
    """Link shares of a flow from rank `src` to rank `dst` (empty when src == dst)."""
    if src == dst:
        return {}
    if fab.kind == "fat-tree":
        return {
            fab.link_index[k]: 1.0
            for k in _bundled(_fat_tree(fab, src, dst, False, one=True)[0][0])
        }
    hops = _ROUTERS[fab.kind](fab, src, dst, valiant)
    shares: defaultdict[int, float] = defaultdict(float)  # link id -> share
    for path, w in hops:
        for u, v in zip(path, path[1:], strict=False):
            shares[fab.link_index[(u, v)]] += w
    return dict(shares)


def path_latency(fab, src: int, dst: int) -> float:
    """Seconds of propagation and switching along one (shortest) route."""
    if src == dst:
        return 0.0
    path = _fat_tree(fab, src, dst, False, one=True)[0][0] if fab.kind == "fat-tree" else \
        _ROUTERS[fab.kind](fab, src, dst, False)[0][0]
    return sum(fab.latency[fab.link_index[(u, v)]] for u, v in zip(path, path[1:], strict=False))


def _fat_tree(fab, src, dst, valiant, one: bool = False):
    """Every equal-cost path with its share, or (one=True) just the first of them."""
    m, per = fab.meta, fab.cluster.gpus_per_node
    (ns, ls), (nd, ld) = divmod(src, per), divmod(dst, per)
    gs, gd = ("gpu", src), ("gpu", dst)
    if ns == nd:
        return [([gs, ("hub", ns), gd], 1.0)]
    nics = m["nics"]
    ks, kd = ls * nics // per, ld * nics // per
    up = [gs, ("nic", ns, ks)] if nics == per else [gs, ("hub", ns), ("nic", ns, ks)]
    down = [("nic", nd, kd), gd] if nics == per else [("nic", nd, kd), ("hub", nd), gd]
    a, b = m["leaf_of"][(ns, ks)], m["leaf_of"][(nd, kd)]
    if a == b:
        return [(up + [("leaf", a)] + down, 1.0)]
    pa, pb, spines = a // m["pod_leaves"], b // m["pod_leaves"], m["spines_per_pod"]
    if one:
        spines = 1
    if pa == pb:
        return [(up + [("leaf", a), ("spine", pa, s), ("leaf", b)] + down, 1.0 / spines)
                for s in range(spines)]
    cores = 1 if one else m["core_up"]
    w = 1.0 / (spines * cores)
    return [(up + [("leaf", a), ("spine", pa, s), ("core", s, k), ("spine", pb, s),
                   ("leaf", b)] + down, w) for s in range(spines) for k in range(cores)]


def _bundled(path):
    """Link keys of a fat-tree path with the ECMP-spread tiers as bundles."""
    keys = []
    for u, v in zip(path, path[1:], strict=False):
        if u[0] == "leaf" and v[0] == "spine":
            keys.append(("up", u[1]))
        elif u[0] == "spine" and v[0] == "core":
            keys.append(("pod-up", u[1]))
        elif u[0] == "core" and v[0] == "spine":
            keys.append(("pod-down", v[1]))
        elif u[0] == "spine" and v[0] == "leaf":
            keys.append(("down", v[1]))
        else:
            keys.append((u, v))
    return keys


def _torus(fab, src, dst, valiant):
    dims, coords = fab.meta["dims"], fab.meta["coords"]
    cur, target = list(coords[src]), coords[dst]
    path = [("gpu", src), ("chip", tuple(cur))]
    for axis, d in enumerate(dims):
        forward = (target[axis] - cur[axis]) % d
        step = 1 if forward <= d - forward else -1
        while cur[axis] != target[axis]:
            cur[axis] = (cur[axis] + step) % d
            path.append(("chip", tuple(cur)))
    path.append(("gpu", dst))
    return [(path, 1.0)]


def _dragonfly(fab, src, dst, valiant):
    m = fab.meta
    per_group = m["routers_per_group"] * m["gpus_per_router"]
    (gs_, rs), (gd_, rd) = divmod(src, per_group), divmod(dst, per_group)
    rs, rd = rs // m["gpus_per_router"], rd // m["gpus_per_router"]
    if gs_ == gd_:
        mid = [("router", gs_, rs)] + ([("router", gd_, rd)] if rs != rd else [])
        return [([("gpu", src)] + mid + [("gpu", dst)], 1.0)]
    if not valiant or m["groups"] < 3:
        return [([("gpu", src)] + _inter_group(m, gs_, rs, gd_, rd) + [("gpu", dst)], 1.0)]
    others = [g for g in range(m["groups"]) if g not in (gs_, gd_)]
    paths = []
    for via in others:
        gw_in, _ = m["gateway"][(via, gs_)]
        first = _inter_group(m, gs_, rs, via, gw_in)
        second = _inter_group(m, via, gw_in, gd_, rd)
        paths.append(([("gpu", src)] + first + second[1:] + [("gpu", dst)], 1.0 / len(others)))
    return paths


def _inter_group(m, gx, rx, gy, ry):
    """Routers from router rx of group gx to router ry of group gy over their global link."""
    ox, oy = m["gateway"][(gx, gy)]
    hops = [("router", gx, rx)]
    if ox != rx:
        hops.append(("router", gx, ox))
    hops.append(("router", gy, oy))
    if oy != ry:
        hops.append(("router", gy, ry))
    return hops


def _local(fab, src, dst, valiant):
    return [([("gpu", src), ("host",), ("gpu", dst)], 1.0)]


_ROUTERS = {"fat-tree": _fat_tree, "torus": _torus, "dragonfly": _dragonfly, "local": _local}


@dataclass(frozen=True)
class FatTreeLinks:
    """Per-GPU link ids of a fat-tree, for routing many pairs at once (fat_tree_routes):
    -1 where a GPU's node has no such link (a GPU with its own NIC does not go through
    the node's switch to reach it)."""
    node: np.ndarray
    leaf: np.ndarray
    pod: np.ndarray
    to_hub: np.ndarray  # gpu -> its node's switch
    from_hub: np.ndarray
    out: np.ndarray  # [gpus, 2]: gpu -> its NIC, directly or through the switch
    into: np.ndarray  # [gpus, 2]: its NIC -> gpu
    to_leaf: np.ndarray  # its NIC -> its leaf
    from_leaf: np.ndarray
    up: np.ndarray  # leaf -> the bundle of its spine up-links (and down)
    down: np.ndarray
    pod_up: np.ndarray  # pod -> the bundle of its spine-core links (and down)
    pod_down: np.ndarray
    latency: np.ndarray  # link id -> seconds


def fat_tree_links(fab) -> FatTreeLinks:
    m, per, idx = fab.meta, fab.cluster.gpus_per_node, fab.link_index
    ranks = np.arange(fab.gpus)
    node, nic = ranks // per, ranks % per * m["nics"] // per
    gpu = [("gpu", int(r)) for r in ranks]
    hub = [("hub", int(n)) for n in node]
    card = [("nic", int(n), int(k)) for n, k in zip(node, nic, strict=True)]
    leaf = np.array([m["leaf_of"][c[1:]] for c in card], dtype=np.int64)
    switch = [("leaf", int(a)) for a in leaf]

    def links(us, vs) -> np.ndarray:
        return np.array([idx[(u, v)] for u, v in zip(us, vs, strict=True)], dtype=np.int64)

    # where the fabric has them (topology._fat_tree_bundles)
    def bundles(kind: str, count: int) -> np.ndarray:
        return np.array([idx[(kind, i)] for i in range(count)] if (kind, 0) in idx else [],
                        dtype=np.int64)

    if m["nics"] == per:  # GPU-direct to its own NIC
        none = np.full(fab.gpus, -1, dtype=np.int64)
        out, into = np.stack([links(gpu, card), none], axis=1), np.stack([links(card, gpu), none],
                                                                         axis=1)
    else:  # through the node's switch
        out = np.stack([links(gpu, hub), links(hub, card)], axis=1)
        into = np.stack([links(card, hub), links(hub, gpu)], axis=1)
    return FatTreeLinks(node, leaf, leaf // m["pod_leaves"], links(gpu, hub), links(hub, gpu), out,
                        into, links(card, switch), links(switch, card), bundles("up", m["leaves"]),
                        bundles("down", m["leaves"]), bundles("pod-up", m["pods"]),
                        bundles("pod-down", m["pods"]), np.asarray(fab.latency, dtype=np.float64))


def fat_tree_routes(t: FatTreeLinks, src: np.ndarray,
                    dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([pairs, 10] link ids padded with -1, latency seconds) of each pair's route, as
    route_with_latency gives it one pair at a time: the first equal-cost path, spine
    tiers bundled, links in path order."""
    n = len(src)
    links = np.full((n, 10), -1, dtype=np.int64)
    same_node = t.node[src] == t.node[dst]
    links[:, 0:2] = t.out[src]
    links[:, 2] = t.to_leaf[src]
    a, b = t.leaf[src], t.leaf[dst]
    across = a != b
    if across.any():
        links[across, 3] = t.up[a[across]]
        same_pod = across & (t.pod[src] == t.pod[dst])
        links[same_pod, 4] = t.down[b[same_pod]]
        pods = across & ~same_pod
        links[pods, 4] = t.pod_up[t.pod[src][pods]]
        links[pods, 5] = t.pod_down[t.pod[dst][pods]]
        links[pods, 6] = t.down[b[pods]]
    links[:, 7] = t.from_leaf[dst]
    links[:, 8:10] = t.into[dst]
    links[same_node] = -1
    links[same_node, 0] = t.to_hub[src[same_node]]
    links[same_node, 1] = t.from_hub[dst[same_node]]
    hops = np.where(links >= 0, t.latency[np.maximum(links, 0)], 0.0)
    latency = np.zeros(n)
    for column in hops.T:  # in path order, as a sum along the path adds them
        latency += column
    return links, latency
