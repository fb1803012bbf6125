"""Collective time on a fabric graph: algorithm phases -> flows -> max-min fair rates -> seconds.

Concurrent groups (for example the data-parallel all-reduces of every tensor-parallel rank)
are solved together, so they contend for shared links; the slowest group sets the time.
Rates do not depend on the message size, so a (phase pattern, groups) pair is solved once
and cached as seconds per byte plus a latency term: time(K) = K x per_byte + latency."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from simpar.errors import SpecError
from simpar.network.algorithms import ALGORITHMS, OPS, SWITCH, nvls, tree_correction
from simpar.network.collectives import ring_step_floor_s
from simpar.network.flows import max_min_rates, phase_time
from simpar.network.routing import fat_tree_links, fat_tree_routes, route_with_latency

# Per message step, on top of link latency: NCCL kernel and proxy overhead per step (the ~2 us floor
# of nccl-tests small-message steps inside a node).
STEP_OVERHEAD_S = 1.0e-6
# Recursive halving-doubling (an MPI algorithm; NCCL does not use it) is only tried automatically on
# small groups, where its log2(n) latency can win; --collective-algo forces it at any size.
AUTO_HD_MAX_RANKS = 64
# NCCL runs all-gather and reduce-scatter as rings (or NVLS inside an NVSwitch domain): its trees
# serve all-reduce only, and it has no node-by-node algorithm for them (src/enqueue.cc picks among
# the algorithms each collective implements). So a gather over n ranks pays n - 1 message steps;
# `hierarchical` stands in for all-reduce only, whose NCCL tree moves data across nodes alike.
HIERARCHICAL_OPS = ("allreduce",)


class FlowModel:
    def __init__(self, fabric, valiant: bool = False):
        self.fab = fabric
        self.valiant = valiant
        self.capacity = np.asarray(fabric.capacity, dtype=np.float64)
        # every route found so far, stored flat: route i is
        # _links/_shares[_starts[i]:_starts[i] + _lengths[i]]
        self._span = fabric.gpus
        # sorted keys (a + 1) x (gpus + 1) + b + 1 of the flows from a to b routed so
        # far, and their routes
        self._keys = self._key_route = np.zeros(0, dtype=np.int64)
        self._fat_tree = fat_tree_links(fabric) if fabric.meta["kind"] == "fat-tree" else None
        self._starts = self._lengths = self._links = np.zeros(0, dtype=np.int64)
        self._shares = self._latencies = np.zeros(0)
        self._cache: dict = {}
        self._rates: dict = {}  # flow end points -> (max-min rates, longest route latency)
        # the compact key of a set of concurrent groups -> its shapes (_shapes)
        self._shapes_of: dict = {}

    def _route(self, a: int, b: int) -> tuple:
        """(link ids, shares, latency seconds) of the route from rank a to rank b; SWITCH as an end
        point means the rank's own NVSwitch."""
        if SWITCH in (a, b):
            rank = b if a == SWITCH else a
            gpu, hub = ("gpu", rank), ("hub", self.fab.node_of(rank))
            link = self.fab.link_index[(gpu, hub) if b == SWITCH else (hub, gpu)]
            return [link], [1.0], self.fab.latency[link]
        shares, latency = route_with_latency(self.fab, a, b, self.valiant)
        return list(shares.keys()), list(shares.values()), latency

    def _route_ids(self, ends: np.ndarray) -> np.ndarray:
        """The stored route of each flow (row of `ends`), routing the pairs not seen before."""
        keys = (ends[:, 0] + 1) * (self._span + 1) + ends[:, 1] + 1  # SWITCH (-1) -> 0
        pos = np.searchsorted(self._keys, keys)
        known = pos < len(self._keys)
        known[known] = self._keys[pos[known]] == keys[known]
        if not known.all():
            # sorted and deduplicated (np.unique hashes, far slower here)
            new = np.sort(keys[~known])
            self._store(new[np.concatenate(([True], new[1:] != new[:-1]))])
            pos = np.searchsorted(self._keys, keys)
        return self._key_route[pos]

    def _store(self, keys: np.ndarray) -> None:
        """Route the flows of `keys` (none stored yet): on a fat-tree all GPU-to-GPU pairs at
        once, the others (the node's switch as an end point, other fabrics) one at a time."""
        a, b = keys // (self._span + 1) - 1, keys % (self._span + 1) - 1
        tree = self._fat_tree
        batch = (a >= 0) & (b >= 0) & (a != b) & (tree is not None)
        routes = []  # (lengths, links, shares, latencies) of the batch, then of the rest
        if tree is not None and batch.any():
            table, latency = fat_tree_routes(tree, a[batch], b[batch])
            used = table >= 0
            routes.append((used.sum(axis=1), table[used], np.ones(int(used.sum())), latency))
        rest = [self._route(int(x), int(y)) for x, y in zip(a[~batch], b[~batch], strict=True)]
        if rest:
            routes.append(
                (np.array([len(r[0]) for r in rest],
                          dtype=np.int64), np.fromiter((x for r in rest for x in r[0]), np.int64),
                 np.fromiter((x for r in rest for x in r[1]),
                             np.float64), np.array([r[2] for r in rest])))
        lengths = np.concatenate([r[0] for r in routes])
        first = len(self._lengths)
        self._starts = np.concatenate(
            [self._starts, len(self._links) + np.cumsum(lengths) - lengths])
        self._lengths = np.concatenate([self._lengths, lengths])
        self._links = np.concatenate([self._links, *(r[1] for r in routes)])
        self._shares = np.concatenate([self._shares, *(r[2] for r in routes)])
        self._latencies = np.concatenate([self._latencies, *(r[3] for r in routes)])
        route = np.empty(len(keys), dtype=np.int64)  # the batch's routes were stored first
        route[np.concatenate([np.flatnonzero(batch),
                              np.flatnonzero(~batch)])] = first + np.arange(len(keys))
        at = np.searchsorted(self._keys, keys)  # both sorted: insert in place, no re-sort
        self._keys, self._key_route = np.insert(self._keys, at,
                                                keys), np.insert(self._key_route, at, route)

    def _incidence(self, ends: np.ndarray) -> tuple:
        """(flow index, link id, share) of every link of every flow's route, and the longest and
        the mean route's latency, gathered from the stored routes without a Python loop over
        links."""
        ids = self._route_ids(ends)
        start, length = self._starts[ids], self._lengths[ids]
        pos = np.arange(int(length.sum())) + np.repeat(start - (np.cumsum(length) - length), length)
        hops = self._latencies[ids]
        latency = (float(hops.max()), float(hops.mean())) if len(ids) else (0.0, 0.0)
        return np.repeat(np.arange(len(ids)), length), self._links[pos], self._shares[pos], latency

    def _independent(self, groups: tuple) -> tuple:
        """On a fat-tree, groups that stay inside one server touch only that server's links, so the
        groups of the first server stand for all of them (exact, and far fewer flows)."""
        if self.fab.kind != "fat-tree" or len(groups) < 2:
            return groups
        node = self.fab.node_of
        if any(node(g[0]) != node(g[-1]) for g in groups):
            return groups
        first = node(groups[0][0])
        return tuple(g for g in groups if node(g[0]) == first)

    def _solve(self, ends: np.ndarray) -> tuple:
        """(rates, (longest, mean) route latency) of flows between the end points `ends` (one row
        per flow);
        flows with the same end points share a solve (a ring's reduce-scatter,
        all-gather and all-reduce move different amounts over the same routes)."""
        key = ends.tobytes()
        found = self._rates.get(key)
        if found is None:
            f_idx, links, shares, latency = self._incidence(ends)
            found = (max_min_rates(f_idx, links, shares, len(ends), self.capacity), latency)
            self._rates[key] = found
        return found

    def _crosses_nodes(self, phase) -> bool:
        node_of = self.fab.node_of
        return any(node_of(a) != node_of(b) for a, b, _ in phase.flows)

    def _dims(self):
        if self.fab.kind != "torus":
            return None
        coords = self.fab.meta["coords"]
        return lambda r: coords[r]

    def _phases(self, op: str, algo: str, group: tuple):
        if algo == "nvls":
            # NVSwitch nodes only
            if self.fab.kind != "fat-tree" or self.fab.cluster.intra_node_bw_gbps < 100:
                return None
            return nvls(op, list(group), self.fab.node_of, gpu=self.fab.cluster.gpu.name,
                        link_efficiency=self.fab.cluster.intra_node_efficiency)
        return ALGORITHMS[algo](op, list(group), self.fab.node_of, self._dims())

    def _group_phases(self, op: str, algo: str, shapes: list) -> list | None:
        """[(phases of one group, shifts to every group of its shape)] for the `shapes`
        of concurrent groups (_shapes), building each shape's phases once; None if the
        algorithm does not apply to one of them."""
        out = []
        for first, shifts in shapes:
            phases = self._phases(op, algo, first)
            if phases is None:
                return None
            out.append((phases, shifts))
        return out

    def _shapes(self, groups: Sequence) -> list[tuple[tuple, np.ndarray]]:
        """[(first group of a shape, each group's first rank minus that one's)] of the
        concurrent `groups` with two ranks or more. A shape is what an algorithm's
        phases depend on, the ranks and nodes relative to the group's first rank: groups
        of one shape have the same phases moved by the difference of their first ranks
        (not on a torus, whose algorithms follow coordinates)."""
        groups = [g for g in groups if len(g) > 1]
        if not groups or self.fab.kind == "torus" or len({len(g) for g in groups}) > 1:
            return [(g, np.zeros(1, dtype=np.int64)) for g in groups]
        ranks = np.array(groups, dtype=np.int64)
        nodes = ranks // self.fab.cluster.gpus_per_node  # Fabric.node_of, for every rank at once
        shapes: dict = {}
        for i, row in enumerate(np.hstack([ranks - ranks[:, :1], nodes - nodes[:, :1]])):
            shapes.setdefault(row.tobytes(), []).append(i)
        return [(groups[same[0]], ranks[same, 0] - ranks[same[0], 0]) for same in shapes.values()]

    def linear_cost(self, op: str, algo: str, groups, key=None,
                    groups_fn=None) -> tuple[float, float] | None:
        """(seconds per message byte, latency seconds) of `algo` for concurrent `groups`, or
        None if the algorithm does not apply to these groups. `key`, when given, names the
        groups compactly for the cache (hashing thousands of ranks on every lookup is slow)."""
        key = (op, algo, key if key is not None else groups)
        if key in self._cache:
            return self._cache[key]
        # shared by every op and algorithm
        shapes = self._shapes_of.get(key[2]) if key[2] is not groups else None
        if shapes is None:
            if groups_fn is not None:  # build the groups only on a cache miss
                groups = groups_fn()
            shapes = self._shapes(self._independent(groups))
            if key[2] is not groups:
                self._shapes_of[key[2]] = shapes
        per_shape = self._group_phases(op, algo, shapes)
        if not per_shape:
            self._cache[key] = None
            return None
        per_byte = latency = 0.0
        for i in range(len(per_shape[0][0])):  # phase i of every group runs at the same time
            ends, shares = _shifted_flows([(phases[i], shifts) for phases, shifts in per_shape])
            rates, (longest, mean) = self._solve(ends)
            per_byte += phase_time(shares, rates)
            steps = max(phases[i].steps for phases, _ in per_shape)
            rings = all(phases[i].ring for phases, _ in per_shape)
            step = (mean if rings else longest) + STEP_OVERHEAD_S
            if rings:
                crosses = any(self._crosses_nodes(phases[i]) for phases, _ in per_shape)
                step = max(step, ring_step_floor_s(self.fab.cluster, crosses))
            latency += steps * step + max(phases[i].fixed_s for phases, _ in per_shape)
        self._cache[key] = (per_byte, latency)
        return self._cache[key]

    def candidates(self, op: str, groups: tuple, algo: str | None = None, key=None) -> list:
        """[(seconds per byte, latency seconds, algorithm)] of the algorithms that apply, cached."""
        ck = ("candidates", op, algo, key if key is not None else groups)
        found = self._cache.get(ck)
        if found is None:
            if op not in OPS:
                raise SpecError("--op", op, f"choose one of {', '.join(OPS)}")
            largest = max(map(len, groups))
            if largest < 2:
                self._cache[ck] = []
                return []
            names = [algo] if algo else [
                a for a in ALGORITHMS if (a != "direct" or op in ("alltoall", "p2p")) and
                (a != "halving-doubling" or largest <= AUTO_HD_MAX_RANKS) and
                (a != "hierarchical" or op in HIERARCHICAL_OPS)
            ]
            found = [(*lin, name) for name in names
                     if (lin := self.linear_cost(op, name, groups, key)) is not None]
            if not found and algo:
                raise SpecError(
                    "--collective-algo", algo, f"does not apply to {op} on these groups; try ring "
                    "(or leave it out to choose automatically)")
            self._cache[ck] = found
        return found

    def cost(self, op: str, size_bytes: float, groups: tuple, algo: str | None = None,
             key=None) -> tuple[float, str]:
        """(seconds, algorithm) of the fastest applicable algorithm, or of `algo` when forced."""
        if size_bytes <= 0:
            return 0.0, "none"
        found = self.candidates(op, groups, algo, key)
        return min(
            ((size_bytes * a / (tree_correction(size_bytes) if name == "tree" else 1.0) + b, name)
             for a, b, name in found), default=(0.0, "none"))


def _shifted_flows(phase_shifts: list) -> tuple[np.ndarray, np.ndarray]:
    """(end points, shares) of every flow of one phase: each shape's phase moved to each
    of its groups by adding the group's shift to both end points (the node's switch,
    SWITCH, stays where it is)."""
    ends, shares = [], []
    for phase, shifts in phase_shifts:
        base = np.array([(a, b) for a, b, _ in phase.flows], dtype=np.int64).reshape(-1, 2)
        moved = base[None, :, :] + shifts[:, None, None]
        ends.append(np.where(base[None, :, :] == SWITCH, SWITCH, moved).reshape(-1, 2))
        shares.append(np.tile(np.array([f[2] for f in phase.flows], dtype=np.float64), len(shifts)))
    return np.concatenate(ends), np.concatenate(shares)
