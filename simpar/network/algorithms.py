"""Collective algorithms as phases of point-to-point flows.

A phase is a set of flows that run at once, each moving `share` x the message size, plus the number of
sequential message steps it takes (its latency multiplier). Phases run one after another. Sizes follow
nccl-tests: the full buffer for all-reduce, broadcast and all-to-all, the gathered tensor for
all-gather and reduce-scatter."""

from __future__ import annotations

import math
from dataclasses import dataclass

OPS = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "p2p")
ALGOS = ("ring", "tree", "hierarchical", "halving-doubling", "torus-ring", "direct")


@dataclass(frozen=True)
class Phase:
    flows: tuple  # (src rank, dst rank, share of the message)
    steps: int


def _ring_flows(ranks, share):
    n = len(ranks)
    return tuple((ranks[i], ranks[(i + 1) % n], share) for i in range(n))


def ring(op, ranks, node_of=None, dims=None):
    n = len(ranks)
    if op == "allreduce":
        return [Phase(_ring_flows(ranks, 2 * (n - 1) / n), 2 * (n - 1))]
    if op in ("allgather", "reducescatter"):
        return [Phase(_ring_flows(ranks, (n - 1) / n), n - 1)]
    if op == "broadcast":  # pipelined along the ring (not closed)
        return [Phase(tuple((ranks[i], ranks[i + 1], 1.0) for i in range(n - 1)), n - 1)]
    return None


def tree(op, ranks, node_of=None, dims=None):
    """NCCL's double binary tree: two trees, each carrying half the data, reduce up and broadcast
    down pipelined; a rank that is a leaf in one tree is inside the other."""
    if op not in ("allreduce", "broadcast") or len(ranks) < 3:
        return None
    n = len(ranks)
    flows = []
    for order in (ranks, ranks[::-1]):
        for i in range(1, n):
            child, parent = order[i], order[(i - 1) // 2]
            if op == "allreduce":
                flows.append((child, parent, 0.5))
            flows.append((parent, child, 0.5))
    depth = math.ceil(math.log2(n + 1))
    return [Phase(tuple(flows), (2 if op == "allreduce" else 1) * depth)]


def hierarchical(op, ranks, node_of=None, dims=None):
    """Reduce-scatter inside each node, all-reduce of 1/k of the data across nodes between ranks of
    the same local index, all-gather inside the node; NCCL pipelines the three, so they share one phase."""
    if node_of is None or op not in ("allreduce", "allgather", "reducescatter"):
        return None
    by_node = {}
    for r in ranks:
        by_node.setdefault(node_of(r), []).append(r)
    locals_ = list(by_node.values())
    k, m = len(locals_[0]), len(locals_)
    if m < 2 or k < 2 or any(len(x) != k for x in locals_):
        return None
    ar = op == "allreduce"
    flows = []
    for members in locals_:
        flows += _ring_flows(members, (2 if ar else 1) * (k - 1) / k)
    for j in range(k):
        flows += _ring_flows([members[j] for members in locals_], (2 if ar else 1) * (m - 1) / m / k)
    mult = 2 if ar else 1
    return [Phase(tuple(flows), mult * (k - 1) + mult * (m - 1))]


def halving_doubling(op, ranks, node_of=None, dims=None):
    """Recursive halving (reduce-scatter) then doubling (all-gather); needs a power-of-two group."""
    n = len(ranks)
    if n < 2 or n & (n - 1) or op not in ("allreduce", "allgather", "reducescatter"):
        return None
    halving = [Phase(tuple((ranks[i], ranks[i ^ (n >> (j + 1))], 1 / 2 ** (j + 1)) for i in range(n)), 1)
               for j in range(int(math.log2(n)))]
    doubling = halving[::-1]
    return {"allreduce": halving + doubling, "reducescatter": halving, "allgather": doubling}[op]


def torus_ring(op, ranks, node_of=None, dims=None):
    """All-reduce as a ring along each torus axis in turn (reduce-scatter over axes, then all-gather
    back), each ring on neighbour links; `dims` maps rank -> torus coordinate."""
    if dims is None or op not in ("allreduce", "allgather", "reducescatter"):
        return None
    coords = {r: dims(r) for r in ranks}
    axes = [a for a in range(len(next(iter(coords.values())))) if len({c[a] for c in coords.values()}) > 1]
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


ALGORITHMS = {"ring": ring, "tree": tree, "hierarchical": hierarchical, "halving-doubling": halving_doubling,
              "torus-ring": torus_ring, "direct": direct}
