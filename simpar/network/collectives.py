"""Alpha-beta cost of collectives on the two-level network (NVLink inside a node, NICs
between nodes).

Conventions follow nccl-tests: `size_bytes` is the full buffer for all-reduce, and the
per-rank output for all-gather / input for reduce-scatter is size_bytes (the gathered
tensor). A ring all-reduce moves 2(N-1)/N x size per rank. Across nodes we take the
faster of a flat ring and a hierarchical algorithm (reduce-scatter inside the node,
all-reduce of 1/k of the data across nodes on every GPU's own NIC, all-gather inside the
node); NCCL pipelines those phases on different links, so the slower phase sets the time.
Every rank of a group is assumed to have its own NIC (rail-optimized DGX-style nodes)."""

from __future__ import annotations

import math

import numpy as np

from simpar.network.placement import GroupSpan

# A ring that crosses nodes passes every one of its steps through each node's network proxy,
# which posts a send, a receive and an acknowledgement per step under NCCL's Simple protocol:
# NCCL's tuning model floors every step of such a ring at three network post overheads
# ("inter-node rings still have to launch nsteps * net overhead", src/graph/tuning.cc:
# intraLat = max(intraLat, 3 * getNetOverhead) for Simple), however fast the NVLink hop is.
NCCL_SIMPLE_NET_POSTS = 3


def ring_step_floor_s(cluster, crosses: bool) -> float:
    """The least time one step of a ring takes: NCCL_SIMPLE_NET_POSTS network posts where the ring
    crosses nodes, nothing inside one."""
    return NCCL_SIMPLE_NET_POSTS * cluster.net_post_us * 1e-6 if crosses else 0.0


def _latency(steps: float, cluster, crosses: bool) -> float:
    alpha = cluster.inter_node_latency_us if crosses else cluster.intra_node_latency_us
    return steps * alpha * 1e-6


def _allreduce_parts(size_bytes: float, g: GroupSpan, cluster) -> tuple[float, float]:
    """(bandwidth seconds, latency seconds) of the faster all-reduce algorithm for this group."""
    n = g.size
    b_in, b_out = cluster.intra_bw_bytes_per_s, cluster.inter_bw_bytes_per_s
    if not g.crosses_nodes:
        return 2 * (n - 1) / n * size_bytes / b_in, _latency(2 * (n - 1), cluster, False)
    k, m = g.per_node, g.nodes
    # flat ring: k channels leave each node over k NICs
    ring = (2 * (n - 1) / n * size_bytes / min(b_in, k * b_out),
            _latency(2 * (n - 1), cluster, True))
    intra = 2 * (k - 1) / k * size_bytes / b_in
    inter = 2 * (m - 1) / m * (size_bytes / k) / b_out
    tree_steps = 2 * min(m - 1, math.ceil(math.log2(m)))  # NCCL switches to trees at scale
    hier = (max(intra,
                inter), _latency(2 * (k - 1), cluster, False) + _latency(tree_steps, cluster, True))
    return min(ring, hier, key=sum)


def allreduce_time(size_bytes: float, g: GroupSpan, cluster) -> float:
    if g.size <= 1 or size_bytes <= 0:
        return 0.0
    return sum(_allreduce_parts(size_bytes, g, cluster))


def allgather_time(size_bytes: float, g: GroupSpan, cluster) -> float:
    """All-gather (or reduce-scatter) of a `size_bytes` tensor: half the traffic of an
    all-reduce."""
    if g.size <= 1 or size_bytes <= 0:
        return 0.0
    bw, _ = _allreduce_parts(size_bytes, g, cluster)
    return 0.5 * bw + _ring_latency(g, cluster)


def _ring_latency(g: GroupSpan, cluster) -> float:
    """n - 1 ring steps, nodes - 1 of them across the network and the rest on NVLink (NCCL's
    tuning model: nInterSteps = nNodes - 1), those no faster than ring_step_floor_s: NCCL runs
    all-gather and reduce-scatter as rings."""
    across = g.nodes - 1 if g.crosses_nodes else 0
    inside = max(_latency(1, cluster, False), ring_step_floor_s(cluster, g.crosses_nodes))
    return (g.size - 1 - across) * inside + _latency(across, cluster, True)


reducescatter_time = allgather_time


def broadcast_time(size_bytes: float, g: GroupSpan, cluster) -> float:
    """Broadcast, as NCCL runs it: a pipelined chain along the ring, each link carrying the whole
    message once: the all-gather's bandwidth term without its (n-1)/n, and its ring steps."""
    if g.size <= 1 or size_bytes <= 0:
        return 0.0
    bw, _ = _allreduce_parts(size_bytes, g, cluster)
    return 0.5 * bw * g.size / (g.size - 1) + _ring_latency(g, cluster)


def alltoall_time(size_bytes: float, g: GroupSpan, cluster) -> float:
    """Each rank sends (N-1)/N of `size_bytes`, part over NVLink and part over its NIC,
    concurrently."""
    n = g.size
    if n <= 1 or size_bytes <= 0:
        return 0.0
    intra = (g.per_node - 1) / n * size_bytes / cluster.intra_bw_bytes_per_s
    inter = (n - g.per_node) / n * size_bytes / cluster.inter_bw_bytes_per_s
    return max(intra, inter) + _latency(n - 1, cluster, g.crosses_nodes)


def _groups_hit(groups: int, experts: int, top_k: int) -> float:
    """Expected number of `groups` equal groups of `experts` that hold at least one of a token's
    `top_k` distinct experts, drawn uniformly (balanced routing)."""
    per_group = experts / groups
    miss = 1.0
    for i in range(top_k):  # no pick lands in a given group
        miss *= max(0.0, (experts - per_group - i) / (experts - i))
    return groups * (1.0 - miss)


def dispatch_copies(g: GroupSpan, experts: int, top_k: int, expert_groups: int = 0,
                    groups_per_token: int = 0) -> float:
    """Copies of a token an MoE flex dispatch (DeepEP, HybridEP) sends, counted as the token
    copies a uniform all-to-all over `g` would carry to load its bottleneck the same: inside one
    NVLink domain one copy per other rank holding one of the token's experts, of which an
    all-to-all of n ranks sends (n-1)/n off the rank, so as many copies as ranks hit; across
    domains one per other domain hit, over the NIC, of which an all-to-all sends (d-1)/d across,
    so as many as domains hit (the receiving domain forwards over NVLink). The alltoall
    dispatcher sends top_k, one per expert. Under group-limited routing (`expert_groups`,
    `groups_per_token`: ModelSpec's) the experts come from the chosen groups only."""
    if g.size <= 1:
        return 0.0
    units = g.nodes if g.crosses_nodes else g.size
    hit = _groups_hit(units, experts, top_k)
    if expert_groups and groups_per_token < expert_groups:
        hit = _limited_hit(units, experts, top_k, expert_groups, groups_per_token) or hit
    return min(float(top_k), hit)


# HybridEP, Megatron core's flex dispatcher on Blackwell's NVLink5 domains, measured on GB200
# (DeepEP Hybrid-EP_Implementation.md at 29b4d6f, "GB200 Platform": 4096 tokens, hidden 7168,
# top-8, uniform routing, 32 SMs as Megatron-Bridge's recipes give it): algorithm bandwidth per
# GPU of the whole torch call (its routing-map all-gather, preprocessing, host sync and copies
# included), BF16 dispatch and combine averaged, GB/s by ranks. NVLink5 carries 900 GB/s a
# direction; the kernels alone reach 605-764.
HYBRIDEP_GBPS = ((8, 557.3), (16, 522.5), (24, 495.5), (32, 474.4), (36, 463.5))
_HYBRIDEP_RANKS, _HYBRIDEP_RATES = zip(*HYBRIDEP_GBPS, strict=True)


def hybridep_seconds(moved_bytes: float, ranks: int) -> float:
    """A HybridEP dispatch or combine moving `moved_bytes` per rank among `ranks` ranks of one
    NVLink domain, at HYBRIDEP_GBPS's rate for that many (interpolated; the nearest end beyond
    the table, whose 36 ranks also stand for larger groups)."""
    return moved_bytes / (float(np.interp(ranks, _HYBRIDEP_RANKS, _HYBRIDEP_RATES)) * 1e9)


def _limited_hit(units: int, experts: int, top_k: int, groups: int, chosen: int) -> float | None:
    """Expected `units` (ranks or NVLink domains, each holding an equal run of the experts, in
    order) a token's `top_k` experts land on when its router first picks `chosen` of the
    `groups` equal runs of experts and then the experts among them (DeepSeek-V3's node-limited
    routing: 4 of 8 groups, so at most 4 nodes of 8 at expert parallelism 64); None where units
    and groups do not nest. A unit holding whole groups is hit when one of its groups is chosen
    (each chosen group taken to get one of the experts); groups spanning several units spread
    the experts over the chosen groups' units."""
    if groups % units == 0:
        per_unit = groups // units
        return units * (1.0 - math.comb(groups - per_unit, chosen) / math.comb(groups, chosen))
    if units % groups == 0:
        return _groups_hit(chosen * (units // groups), chosen * experts // groups, top_k)
    return None


def p2p_time(size_bytes: float, crosses_nodes: bool, cluster) -> float:
    if size_bytes <= 0:
        return 0.0
    bw = cluster.inter_bw_bytes_per_s if crosses_nodes else cluster.intra_bw_bytes_per_s
    return size_bytes / bw + _latency(1, cluster, crosses_nodes)


def first_pair_p2p_time(size_bytes: float, g: GroupSpan, cluster) -> float:
    """A point-to-point transfer between the group's first two ranks (nccl-tests' sendrecv
    pair): inside a node where a node holds two of them."""
    return p2p_time(size_bytes, g.per_node < 2, cluster)


COLLECTIVES = {"allreduce": allreduce_time, "allgather": allgather_time,
               "reducescatter": reducescatter_time, "alltoall": alltoall_time,
               "broadcast": broadcast_time, "p2p": first_pair_p2p_time}


def collective_time(op: str, size_bytes: float, g: GroupSpan, cluster) -> float:
    return COLLECTIVES[op](size_bytes, g, cluster)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests: bus bandwidth = algbw x 2(n-1)/n for all-reduce, x (n-1)/n for
    gathers and scatters, x 1 for broadcast and point-to-point."""
    if op in ("broadcast", "p2p"):
        return 1.0
    return (2 if op == "allreduce" else 1) * (n - 1) / n


def bus_bandwidth_gbps(op: str, size_bytes: float, g: GroupSpan, cluster) -> float:
    t = collective_time(op, size_bytes, g, cluster)
    return size_bytes / t * bus_factor(op, g.size) / 1e9 if t > 0 else 0.0
