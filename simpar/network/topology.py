"""Cluster fabrics as graphs: build a networkx DiGraph of GPUs, switches and links for N GPUs.

The `topology:` block of a cluster file (topologies/*.yaml) has a `kind` and the
parameters of that kind; the node itself (GPUs per node, NVLink and NIC bandwidth) comes
from the cluster's own fields. Every link is full-duplex and appears as two directed
edges, each with `bw_gbps` (GB/s per direction, nominal) and `latency_us`; link capacity
in the flow model is nominal x the cluster's link efficiency.
Kinds:
  fat-tree  NVSwitch nodes (or PCIe nodes) on a 2- or 3-tier fat-tree, rail-optimized or not,
            with an oversubscription ratio at the leaf and at the spine tier;
  torus     chips on a 2D or 3D torus with wrap-around links (TPU-pod-like);
  dragonfly groups of routers, all-to-all inside a group, global links between groups;
  local     processes on one host that talk through shared memory / loopback (cpu-local).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import networkx as nx

from simpar.errors import require

if TYPE_CHECKING:
    from simpar.specs.cluster import ClusterSpec


@dataclass
class Fabric:
    """A built fabric: the graph plus the indices that routing and the flow solver use."""
    cluster: ClusterSpec
    gpus: int
    edges: list  # (u, v, attributes) of every directed link
    link_index: dict = field(default_factory=dict)  # (u, v) -> link id
    capacity: list = field(default_factory=list)  # link id -> achievable bytes/s
    latency: list = field(default_factory=list)  # link id -> seconds
    meta: dict = field(default_factory=dict)  # kind-specific layout used by routing

    @property
    def graph(self) -> nx.DiGraph:
        """The fabric as a networkx graph (built on first use: the flow model needs only
        the links)."""
        if self._graph is None:
            self._graph = nx.DiGraph()
            self._graph.add_edges_from(self.edges)
        return self._graph

    _graph: nx.DiGraph | None = None

    def add_link(self, key, capacity_bytes_per_s: float, latency_s: float) -> None:
        self.link_index[key] = len(self.capacity)
        self.capacity.append(capacity_bytes_per_s)
        self.latency.append(latency_s)

    @property
    def kind(self) -> str:
        return self.meta["kind"]

    def node_of(self, rank: int) -> int:
        """The host (server) a GPU sits in: groups of gpus_per_node consecutive ranks."""
        return rank // self.cluster.gpus_per_node


# The flow model builds every GPU, NIC, switch and link of the fabric as graph nodes and
# edges (about 10 per GPU on a three-tier fat-tree) and routes flows over them: beyond
# this many GPUs, memory and time grow past what a planning tool should ask for, where
# the closed form answers in seconds.
MAX_FABRIC_GPUS = 65_536


def build(cluster, gpus: int) -> Fabric:
    """The fabric of `cluster` sized for `gpus` GPUs (ranks 0..gpus-1)."""
    require(isinstance(gpus, int) and gpus > 0, "--gpus", gpus, "must be a positive integer")
    require(
        gpus <= MAX_FABRIC_GPUS, "--gpus", gpus,
        f"the flow model builds each link of the fabric, up to {MAX_FABRIC_GPUS:,} GPUs; price "
        "larger jobs with --network alpha-beta (the closed form)")
    spec = cluster.topology
    require(spec is not None, "--cluster", cluster.name,
            "has no topology block; give a cluster from topologies/")
    edges: list = []  # collected first: one add_edges_from is far faster than many add_edge calls
    meta = {"kind": spec.kind}
    {"fat-tree": _fat_tree, "torus": _torus, "dragonfly": _dragonfly, "local": _local}[spec.kind](
        cluster, dict(spec.params), gpus, edges, meta)
    fab = Fabric(cluster, gpus, edges, meta=meta)
    for u, v, d in edges:
        eff = cluster.intra_node_efficiency if d["intra"] else cluster.inter_node_efficiency
        fab.add_link((u, v), d["bw_gbps"] * 1e9 * eff, d["latency_us"] * 1e-6)
    if spec.kind == "fat-tree":
        _fat_tree_bundles(fab)
    return fab


def _fat_tree_bundles(fab) -> None:
    """ECMP spreads every flow evenly over the parallel up-links of a switch, so those links
    always carry equal loads and fill together: for the flow solver each such set is one bundle
    whose capacity is their sum (exact for even spreading, and far fewer links per flow)."""
    m = fab.meta
    if m["leaves"] < 2:
        return
    for leaf in range(m["leaves"]):
        ups = [(("leaf", leaf), ("spine", leaf // m["pod_leaves"], s))
               for s in range(m["spines_per_pod"])]
        if ups:
            cap = sum(fab.capacity[fab.link_index[e]] for e in ups)
            lat = fab.latency[fab.link_index[ups[0]]]
            fab.add_link(("up", leaf), cap, lat)
            fab.add_link(("down", leaf), cap, lat)
    for pod in range(m["pods"] if m["pods"] > 1 else 0):
        pod_ups = [(("spine", pod, s), ("core", s, k)) for s in range(m["spines_per_pod"])
                   for k in range(m["core_up"])]
        if pod_ups:
            cap = sum(fab.capacity[fab.link_index[e]] for e in pod_ups)
            lat = fab.latency[fab.link_index[pod_ups[0]]]
            fab.add_link(("pod-up", pod), cap, lat)
            fab.add_link(("pod-down", pod), cap, lat)


def _add(edges: list, u, v, bw_gbps: float, latency_us: float, intra: bool = False) -> None:
    """A full-duplex link: two directed edges."""
    attrs = {"bw_gbps": float(bw_gbps), "latency_us": float(latency_us), "intra": intra}
    edges.append((u, v, attrs))
    edges.append((v, u, attrs))


def _gpu(i):
    return ("gpu", i)


def _fat_tree(c, p, gpus, g, meta):
    per_node = c.gpus_per_node
    nics = p["nics_per_node"] or per_node
    require(per_node % nics == 0, "topology.nics_per_node", nics,
            f"must divide gpus_per_node ({per_node})")
    nodes = math.ceil(gpus / per_node)
    lat_sw, nic_bw = p["switch_latency_us"], c.nic_bw_gbps * per_node / nics
    for r in range(gpus):
        n, local = divmod(r, per_node)
        # NVSwitch (or the PCIe switch of a PCIe server) joins the GPUs of a node; half the NVLink
        # latency on each side of the switch
        _add(g, _gpu(r), ("hub", n), c.intra_node_bw_gbps, c.intra_node_latency_us / 2, intra=True)
        if nics == per_node:
            # GPU-direct RDMA to its own NIC (the NIC port rate)
            _add(g, _gpu(r), ("nic", n, local), nic_bw, 0.0)
    if nics != per_node:
        for n in range(nodes):
            for k in range(nics):
                _add(g, ("hub", n), ("nic", n, k), nic_bw, 0.0)
    # NIC -> leaf: rail-optimized puts NIC k of every node on the rail-k leaves;
    # otherwise a node's NICs share a leaf. A leaf of radix R with oversubscription o
    # has R*o/(1+o) ports down and R/(1+o) up.
    o1 = p["leaf_oversubscription"]
    down = max(1, int(p["leaf_radix"] * o1 / (1 + o1)))
    up = max(1, int(p["leaf_radix"]) - down)
    order = [(n, k) for k in range(nics) for n in range(nodes)] if p["rail_optimized"] \
        else [(n, k) for n in range(nodes) for k in range(nics)]
    leaf_of = {}
    for i, (n, k) in enumerate(order):
        leaf_of[(n, k)] = i // down
        _add(g, ("nic", n, k), ("leaf", i // down), nic_bw, c.inter_node_latency_us / 2)
    leaves = math.ceil(len(order) / down)
    meta.update(nics=nics, leaf_of=leaf_of, leaves=leaves, spines_per_pod=up, pods=1,
                pod_leaves=leaves, core_up=0)
    if leaves == 1:
        return
    o2, tiers = p["spine_oversubscription"], p["tiers"]
    pod_leaves = int(p["spine_radix"]) if tiers == 2 else max(1,
                                                              int(p["spine_radix"] * o2 / (1 + o2)))
    pods = math.ceil(leaves / pod_leaves)
    require(
        pods == 1 or tiers == 3, "topology.spine_radix", p["spine_radix"],
        f"a 2-tier fat-tree of {leaves} leaves needs spine_radix >= {leaves}; raise it or use "
        "tiers: 3")
    for leaf in range(leaves):  # every leaf has one link to each spine of its pod
        for s in range(up):
            _add(g, ("leaf", leaf), ("spine", leaf // pod_leaves, s), nic_bw, lat_sw)
    core_up = max(1, int(round(pod_leaves / o2)))
    if pods > 1:  # spine s of every pod reaches the core switches of plane s
        for pod in range(pods):
            for s in range(up):
                for k in range(core_up):
                    _add(g, ("spine", pod, s), ("core", s, k), nic_bw, lat_sw)
    meta.update(pods=pods, pod_leaves=pod_leaves, core_up=core_up)


def _torus(c, p, gpus, g, meta):
    dims = p["dims"]
    size = math.prod(dims)
    require(gpus <= size, "--gpus", gpus,
            f"the torus {list(dims)} holds {size} chips; enlarge dims")
    coords = []
    for r in range(size):
        cc, rest = [], r
        for d in dims:
            cc.append(rest % d)
            rest //= d
        coords.append(tuple(cc))
    for cc in coords:
        for axis, d in enumerate(dims):
            if d == 1 or (d == 2 and cc[axis] == 1):  # a ring of two chips has one link, not two
                continue
            n = list(cc)
            n[axis] = (cc[axis] + 1) % d
            _add(g, ("chip", cc), ("chip", tuple(n)), p["link_bw_gbps"], p["link_latency_us"])
    for r in range(gpus):
        # the chip's own port (not a bottleneck)
        _add(g, _gpu(r), ("chip", coords[r]), 1e6, 0.0, intra=True)
    meta.update(dims=dims, coords=coords)


def _dragonfly(c, p, gpus, g, meta):
    a, per_router, h = p["routers_per_group"], p["gpus_per_router"], p["global_links_per_router"]
    per_group = a * per_router
    groups = math.ceil(gpus / per_group)
    require(groups <= a * h + 1, "topology.global_links_per_router", h,
            f"{groups} groups need routers_per_group x global_links_per_router >= {groups - 1}")
    for r in range(gpus):
        grp, rest = divmod(r, per_group)
        _add(g, _gpu(r), ("router", grp, rest // per_router), c.nic_bw_gbps, p["link_latency_us"])
    for grp in range(groups):
        for i in range(a):
            for j in range(i + 1, a):
                _add(
                    g,
                    ("router", grp, i),
                    ("router", grp, j),
                    p["local_bw_gbps"],
                    p["link_latency_us"],
                )
    # one global link per pair of groups, spread over the routers of each group
    gateway = {}
    for x in range(groups):
        for y in range(x + 1, groups):
            rx, ry = (y - 1) % a, x % a
            _add(g, ("router", x, rx), ("router", y, ry), p["global_bw_gbps"], p["link_latency_us"])
            gateway[(x, y)], gateway[(y, x)] = (rx, ry), (ry, rx)
    meta.update(routers_per_group=a, gpus_per_router=per_router, groups=groups, gateway=gateway)


def _local(c, p, gpus, g, meta):
    # processes on one host: every rank reaches the others through host memory (gloo over loopback)
    for r in range(gpus):
        _add(g, _gpu(r), ("host",), c.intra_node_bw_gbps, c.intra_node_latency_us / 2, intra=True)
