"""Collective algorithms as phases of point-to-point flows.

A phase is a set of flows that run at once, each moving `share` x the message size, plus
the number of sequential message steps it takes (its latency multiplier). Phases run one
after another. Sizes follow nccl-tests: the full buffer for all-reduce, broadcast and
all-to-all, the gathered tensor for all-gather and reduce-scatter."""

from __future__ import annotations

import math
from dataclasses import dataclass

OPS = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "p2p")
ALGOS = ("ring", "tree", "hierarchical", "halving-doubling", "torus-ring", "nvls", "direct")


@dataclass(frozen=True)
class Phase:
    flows: tuple  # (src rank, dst rank, share of the message)
    steps: int
    fixed_s: float = 0.0  # algorithm latency beyond `steps` message hops (see NCCL's tuning model)
    # a ring: each piece of the message passes the phase's hops one after another, so a step
    # costs the mean hop's latency (NVLink hops inside a node, a NIC hop to leave it), as in
    # NCCL's tuning model (intra-node steps at NVLink latency, nNodes - 1 at network latency);
    # otherwise every step waits for the longest route (tree levels, halving-doubling)
    ring: bool = False


# NCCL's own cost model (src/graph/tuning.cc) charges a tree step across the network far
# more than a ring step (hwLat NET, Simple protocol: tree 50 us, ring 9.6 us per hop),
# and NVLS a 25 us base latency; the flow model takes those from it. Its tree bandwidth
# correction is TREE_CORRECTION below.
NCCL_TREE_NET_HOP_S = 50e-6
NCCL_NVLS_BASE_S = 25e-6
# treeCorrectionFactor, Simple protocol, all-reduce, by log2(bytes / 64) from 64 B to
# 256 MiB; 1.0 above.
TREE_CORRECTION = (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7,
                   .8, .9, .9)


def tree_correction(size_bytes: float) -> float:
    i = int(math.log2(max(size_bytes, 64) / 64))
    return TREE_CORRECTION[i] if i < len(TREE_CORRECTION) else 1.0


def _ring_flows(ranks, share):
    n = len(ranks)
    return tuple((ranks[i], ranks[(i + 1) % n], share) for i in range(n))


def _channels(ranks, node_of) -> list[list]:
    """NCCL runs one ring per channel; with k group ranks in each node it rotates the
    order inside the nodes so that each channel leaves a node through a different GPU
    and so through a different NIC."""
    nodes = _by_node(ranks, node_of) if node_of is not None else None
    if nodes is None or len(nodes) < 2 or len(nodes[0]) < 2:
        return [list(ranks)]
    k = len(nodes[0])
    return [[r for members in nodes for r in members[j:] + members[:j]] for j in range(k)]


def ring(op, ranks, node_of=None, dims=None):
    n = len(ranks)
    if op in ("allreduce", "allgather", "reducescatter"):
        share = (2 if op == "allreduce" else 1) * (n - 1) / n
        channels = _channels(ranks, node_of)
        flows = tuple(f for ch in channels for f in _ring_flows(ch, share / len(channels)))
        return [Phase(flows, (2 if op == "allreduce" else 1) * (n - 1), ring=True)]
    if op == "broadcast":
        # pipelined along each channel's ring, opened at the root: each channel carries its
        # share of the message down a chain, leaving each node through its own NIC
        channels = [ch[ch.index(ranks[0]):] + ch[:ch.index(ranks[0])]
                    for ch in _channels(ranks, node_of)]
        return [Phase(tuple((ch[i], ch[i + 1], 1.0 / len(channels))
                            for ch in channels for i in range(n - 1)), n - 1)]
    return None


def _by_node(ranks, node_of):
    """Group ranks by node; None unless every node holds the same number of them."""
    by_node = {}
    for r in ranks:
        by_node.setdefault(node_of(r), []).append(r)
    sizes = {len(v) for v in by_node.values()}
    return list(by_node.values()) if len(sizes) == 1 else None


def tree(op, ranks, node_of=None, dims=None):
    """NCCL's tree all-reduce across nodes: per channel (one per GPU of a node, each on its
    own NIC) a chain through the node's GPUs and two complementary binary trees over the
    nodes, each carrying half the channel's data, reduce up and broadcast down pipelined."""
    if op not in ("allreduce", "broadcast") or node_of is None:
        return None
    nodes = _by_node(ranks, node_of)
    if nodes is None or len(nodes) < 2:
        return None
    k, m = len(nodes[0]), len(nodes)
    ar = op == "allreduce"
    flows = []
    for j in range(k):
        for members in nodes:  # the chain inside the node, entered at the channel's GPU
            chain = members[j:] + members[:j]
            for a, b in zip(chain, chain[1:], strict=False):
                flows.append((a, b, 1 / k))
                if ar:
                    flows.append((b, a, 1 / k))
        for tree_ in _double_btree(m):
            for child, parent in tree_:
                flows.append((nodes[parent][j], nodes[child][j], 0.5 / k))
                if ar:
                    flows.append((nodes[child][j], nodes[parent][j], 0.5 / k))
    levels = math.ceil(math.log2(m + 1))
    return [
        Phase(tuple(flows), (2 if ar else 1) * (levels + k - 1),
              (2 if ar else 1) * levels * NCCL_TREE_NET_HOP_S)
    ]


def _btree_parent(i: int, n: int) -> int:
    """Parent of position i in NCCL's binary tree over n positions (root 0; ncclGetBtree)."""
    bit = i & -i
    up = (i ^ bit) | (bit << 1)
    return up if up < n else i ^ bit


def _double_btree(n: int) -> tuple:
    """NCCL's two complementary trees as (child, parent) pairs: the second is the first shifted
    by one position (even n) or mirrored (odd n), so a leaf of one tree is inside the other."""
    first = [(i, _btree_parent(i, n)) for i in range(1, n)]
    move = (lambda i: (i + 1) % n) if n % 2 == 0 else (lambda i: n - 1 - i)
    return first, [(move(c), move(p)) for c, p in first]


def hierarchical(op, ranks, node_of=None, dims=None):
    """Reduce-scatter inside each node, all-reduce of 1/k of the data across nodes between ranks
    of the same local index, all-gather inside the node: three phases, one after another."""
    if node_of is None or op not in ("allreduce", "allgather", "reducescatter"):
        return None
    nodes = _by_node(ranks, node_of)
    if nodes is None or len(nodes) < 2 or len(nodes[0]) < 2:
        return None
    k, m = len(nodes[0]), len(nodes)
    intra = Phase(tuple(f for members in nodes for f in _ring_flows(members, (k - 1) / k)), k - 1)
    mult = 2 if op == "allreduce" else 1
    inter = Phase(
        tuple(f for j in range(k) for f in _ring_flows([x[j] for x in nodes],
                                                       mult * (m - 1) / m / k)), mult * (m - 1))
    return {
        "allreduce": [intra, inter, intra], "reducescatter": [intra, inter],
        "allgather": [inter, intra]
    }[op]


# NVLink SHARP (NVLS): NVSwitch reduces and multicasts in the switch. Each GPU sends its
# buffer up once and receives the result once, (n+1)/n of the message each way (the 1/n
# it reduces for the others). The switch sustains less than NVLink line rate for it:
# NVIDIA quotes ~480 GB/s all-reduce bus bandwidth on 8 H100/H200 with NVLS (NCCL
# 2.17+), 2(n-1)/(n+1) x 450 GB/s x 0.686, against ~360 GB/s without.
NVLS_EFFICIENCY = 0.686
# ... and the NVLink Switch trays of GB200/GB300 NVL72 racks (NVLink SHARP across all 72 GPUs)
NVLS_GPUS = ("h100-sxm", "h200", "b200", "b300", "gb200", "gb300")
SWITCH = -1  # flow end point standing for the node's NVSwitch


def nvls(op, ranks, node_of=None, dims=None, gpu=None, link_efficiency=0.8):
    if op != "allreduce" or node_of is None or gpu not in NVLS_GPUS:
        return None
    if len({node_of(r) for r in ranks}) != 1:
        return None
    n = len(ranks)
    share = (n + 1) / n * link_efficiency / NVLS_EFFICIENCY  # slower than plain NVLink traffic
    return [
        Phase(
            tuple((r, SWITCH, share) for r in ranks) + tuple((SWITCH, r, share) for r in ranks),
            2,
            NCCL_NVLS_BASE_S,
        )
    ]


def halving_doubling(op, ranks, node_of=None, dims=None):
    """Recursive halving (reduce-scatter) then doubling (all-gather); needs a power-of-two group."""
    n = len(ranks)
    if n < 2 or n & (n - 1) or op not in ("allreduce", "allgather", "reducescatter"):
        return None
    halving = [
        Phase(tuple((ranks[i], ranks[i ^ (n >> (j + 1))], 1 / 2**(j + 1)) for i in range(n)), 1)
        for j in range(int(math.log2(n)))
    ]
    doubling = halving[::-1]
    return {"allreduce": halving + doubling, "reducescatter": halving, "allgather": doubling}[op]


def torus_ring(op, ranks, node_of=None, dims=None):
    """All-reduce as a ring along each torus axis in turn (reduce-scatter over axes, then all-gather
    back), each ring on neighbour links; `dims` maps rank -> torus coordinate."""
    if dims is None or op not in ("allreduce", "allgather", "reducescatter"):
        return None
    coords = {r: dims(r) for r in ranks}
    axes = [
        a for a in range(len(next(iter(coords.values())))) if len({c[a]
                                                                   for c in coords.values()}) > 1
    ]
    if not axes:
        return None
    phases, frac = [], 1.0
    for a in axes:
        lines = {}
        for r, c in coords.items():
            lines.setdefault(c[:a] + c[a + 1:], []).append(r)
        rings = [sorted(members, key=lambda r: coords[r][a]) for members in lines.values()]
        n = len(rings[0])
        if any(len(x) != n for x in rings) or n * len(rings) != len(ranks):
            return None
        flows = tuple(f for ring_ in rings for f in _ring_flows(ring_, frac * (n - 1) / n))
        phases.append(Phase(flows, n - 1))
        frac /= n
    if op == "reducescatter":
        return phases
    if op == "allgather":
        return phases[::-1]
    return phases + phases[::-1]


def direct(op, ranks, node_of=None, dims=None):
    n = len(ranks)
    if op == "alltoall":
        return [Phase(tuple((a, b, 1 / n) for a in ranks for b in ranks if a != b), 1)]
    if op == "p2p" and n == 2:
        return [Phase(((ranks[0], ranks[1], 1.0),), 1)]
    return None


ALGORITHMS = {
    "ring": ring, "tree": tree, "hierarchical": hierarchical, "halving-doubling": halving_doubling,
    "torus-ring": torus_ring, "nvls": nvls, "direct": direct
}
