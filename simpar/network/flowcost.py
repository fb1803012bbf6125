"""Collective time on a fabric graph: algorithm phases -> flows -> max-min fair rates -> seconds.

Concurrent groups (for example the data-parallel all-reduces of every tensor-parallel rank) are solved
together, so they contend for shared links; the slowest group sets the time. Rates do not depend on the
message size, so a (phase pattern, groups) pair is solved once and cached as seconds per byte plus a
latency term: time(K) = K x per_byte + latency."""

from __future__ import annotations

import numpy as np

from simpar.errors import SpecError
from simpar.network.algorithms import ALGORITHMS, OPS, SWITCH, nvls, tree_correction
from simpar.network.flows import phase_time, route_rates
from simpar.network.routing import route_with_latency

# Per message step, on top of link latency: NCCL kernel and proxy overhead per step (the ~2 us floor
# of nccl-tests small-message steps inside a node).
STEP_OVERHEAD_S = 1.0e-6
# Recursive halving-doubling (an MPI algorithm; NCCL does not use it) is only tried automatically on
# small groups, where its log2(n) latency can win; --collective-algo forces it at any size.
AUTO_HD_MAX_RANKS = 64


class FlowModel:
    def __init__(self, fabric, valiant: bool = False):
        self.fab = fabric
        self.valiant = valiant
        self.capacity = np.asarray(fabric.capacity, dtype=np.float64)
        self._routes: dict = {}
        self._cache: dict = {}
        self._rates: dict = {}  # flow end points -> (max-min rates, longest route latency)

    def _route(self, a: int, b: int) -> tuple:
        """(link ids, shares, latency seconds) of the route from rank a to rank b, cached; SWITCH as an
        end point means the rank's own NVSwitch."""
        r = self._routes.get((a, b))
        if r is None and SWITCH in (a, b):
            rank = b if a == SWITCH else a
            gpu, hub = ("gpu", rank), ("hub", self.fab.node_of(rank))
            link = self.fab.link_index[(gpu, hub) if b == SWITCH else (hub, gpu)]
            r = (np.array([link]), np.array([1.0]), self.fab.latency[link])
            self._routes[(a, b)] = r
        if r is None:
            shares, latency = route_with_latency(self.fab, a, b, self.valiant)
            r = (np.fromiter(shares.keys(), np.int64, len(shares)), np.fromiter(shares.values(), np.float64, len(shares)),
                 latency)
            self._routes[(a, b)] = r
        return r

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

    def _solve(self, flows: list) -> tuple:
        """(rates, longest route latency) of a set of flows; flows with the same end points share a solve
        (a ring's reduce-scatter, all-gather and all-reduce move different amounts over the same routes)."""
        ends = np.array([(a, b) for a, b, _ in flows], dtype=np.int64)
        key = ends.tobytes()
        found = self._rates.get(key)
        if found is None:
            routes = [self._route(a, b) for a, b, _ in flows]
            found = (route_rates(routes, self.capacity), max(r[2] for r in routes))
            self._rates[key] = found
        return found

    def _dims(self):
        if self.fab.kind != "torus":
            return None
        coords = self.fab.meta["coords"]
        return lambda r: coords[r]

    def _phases(self, op: str, algo: str, group: tuple):
        if algo == "nvls":
            if self.fab.kind != "fat-tree" or self.fab.cluster.intra_node_bw_gbps < 100:  # NVSwitch nodes only
                return None
            return nvls(op, list(group), self.fab.node_of, gpu=self.fab.cluster.gpu.name,
                        link_efficiency=self.fab.cluster.intra_node_efficiency)
        return ALGORITHMS[algo](op, list(group), self.fab.node_of, self._dims())

    def linear_cost(self, op: str, algo: str, groups, key=None, groups_fn=None) -> tuple[float, float] | None:
        """(seconds per message byte, latency seconds) of `algo` for concurrent `groups`, or None if the
        algorithm does not apply to these groups. `key`, when given, names the groups compactly for
        the cache (hashing thousands of ranks on every lookup is slow)."""
        key = (op, algo, key if key is not None else groups)
        if key in self._cache:
            return self._cache[key]
        if groups_fn is not None:  # build the groups only on a cache miss
            groups = groups_fn()
        groups = self._independent(groups)
        per_group = [self._phases(op, algo, g) for g in groups if len(g) > 1]
        if not per_group or any(p is None for p in per_group):
            self._cache[key] = None
            return None
        per_byte = latency = 0.0
        for i in range(len(per_group[0])):  # phase i of every group runs at the same time
            flows = [f for phases in per_group for f in phases[i].flows]
            rates, hop = self._solve(flows)
            per_byte += phase_time(np.array([f[2] for f in flows]), rates)
            steps = max(phases[i].steps for phases in per_group)
            latency += steps * (hop + STEP_OVERHEAD_S) + max(p[i].fixed_s for p in per_group)
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
            names = [algo] if algo else [a for a in ALGORITHMS if (a != "direct" or op in ("alltoall", "p2p"))
                                         and (a != "halving-doubling" or largest <= AUTO_HD_MAX_RANKS)]
            found = [(*lin, name) for name in names if (lin := self.linear_cost(op, name, groups, key)) is not None]
            if not found and algo:
                raise SpecError("--collective-algo", algo, f"does not apply to {op} on these groups; "
                                "try ring (or leave it out to choose automatically)")
            self._cache[ck] = found
        return found

    def cost(self, op: str, size_bytes: float, groups: tuple, algo: str | None = None, key=None) -> tuple[float, str]:
        """(seconds, algorithm) of the fastest applicable algorithm, or of `algo` when forced."""
        if size_bytes <= 0:
            return 0.0, "none"
        found = self.candidates(op, groups, algo, key)
        return min(((size_bytes * a / (tree_correction(size_bytes) if name == "tree" else 1.0) + b, name)
                    for a, b, name in found), default=(0.0, "none"))
