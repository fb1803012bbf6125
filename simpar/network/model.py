"""The network as the cost model sees it: the time of a strategy's collectives and transfers.

Two models answer the same questions: `AlphaBetaNetwork` (closed forms on the two-level
node/NIC network, fast, for comparison) and `FlowNetwork` (algorithms as flows on the
cluster's fabric graph, with contention between concurrent groups). `network_for` picks
the flow model when the cluster has a topology."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from simpar.network import collectives as ab
from simpar.network.flowcost import FlowModel
from simpar.network.placement import ORDER, group_signature, group_spans, mesh_key, rank_groups
from simpar.network.topology import build

MODELS = ("flow", "alpha-beta")


@dataclass(frozen=True, kw_only=True)
class NetworkOptions:
    """How a prediction prices communication; the same options reach the closed form,
    the search and the event engine."""
    # "flow": algorithms as flows on the fabric graph; "alpha-beta": closed forms
    model: str = "flow"
    order: tuple[str, ...] = ORDER  # mesh dimensions from innermost (fastest-varying rank) out
    algo: str | None = None  # force one collective algorithm (None: the fastest that applies)
    valiant: bool = False  # route dragonfly traffic through a random intermediate group


DEFAULT_NETWORK = NetworkOptions()


def measured_speed(time_of, size_bytes: float, efficiency: float) -> float:
    """A collective's time with its bandwidth term (the time above a one-byte message's, which is
    all latency) slowed to the measured `efficiency` of its kind (cluster.collective_efficiency)."""
    t = time_of(size_bytes)
    if efficiency >= 1.0 or size_bytes <= 1:
        return t
    return t + (1.0 / efficiency - 1.0) * max(0.0, t - time_of(1.0))


class AlphaBetaNetwork:
    def __init__(self, cluster, strategy, order=ORDER):
        self.cluster = cluster
        self.spans = group_spans(strategy, cluster.gpus_per_node, order)

    def collective(self, op: str, size_bytes: float, group: str) -> float:
        return measured_speed(lambda k: ab.collective_time(op, k, self.spans[group], self.cluster),
                              size_bytes, self.cluster.efficiency_of(op))

    def ring_shift(self, size_bytes: float, group: str) -> float:
        """Every rank sends `size_bytes` to its neighbour in the group (pipeline stages,
        ring attention)."""
        return ab.p2p_time(size_bytes, self.spans[group].crosses_nodes, self.cluster)


class FreeNetwork:
    """Communication at no cost: what the compute alone takes (the search's lower bound
    on a step)."""

    spans: dict = {}  # no group spans anything: nothing is priced

    def collective(self, op: str, size_bytes: float, group: str) -> float:
        return 0.0

    def ring_shift(self, size_bytes: float, group: str) -> float:
        return 0.0


FREE_NETWORK = FreeNetwork()

@lru_cache(maxsize=16)
def flow_model(cluster, gpus: int, valiant: bool = False) -> FlowModel:
    """One fabric and one cache of solved patterns per cluster and size, shared by every
    strategy."""
    return FlowModel(build(cluster, gpus), valiant)


def ranks_per_domain(domain: int, strategy) -> int:
    """Ranks a job puts on each NVLink domain: all of it, or, for a job that does not
    fill whole domains anyway and whose block of tp x cp x ep consecutive ranks (the
    groups that talk most) does not divide the domain (groups of 64 on a 72-GPU rack),
    as many whole blocks as fit, so that no such group straddles two domains; the rest
    stays idle, as NVL72 jobs allocated 16 of a rack's 18 trays leave it."""
    block = strategy.tp * strategy.cp * strategy.ep
    if block > domain or domain % block == 0 or strategy.gpus % domain == 0:
        return domain
    return domain - domain % block


class FlowNetwork:

    def __init__(self, cluster, strategy, order=ORDER, algo: str | None = None,
                 valiant: bool = False):
        domain = cluster.gpus_per_node
        self.per_domain = ranks_per_domain(domain, strategy)
        domains = -(-strategy.gpus // self.per_domain)
        self.model = flow_model(
            cluster, strategy.gpus if self.per_domain == domain else domains * domain, valiant
        )
        self.cluster = cluster
        self.key = mesh_key(strategy, order)
        self.algo = algo
        # each kind of group's size and ranks per NVLink domain (the domains as packed)
        self.spans = group_spans(strategy, self.per_domain, order)

    def gpu_groups(self, group: str) -> tuple:
        """The concurrent groups of a kind as GPUs of the fabric (rank r on GPU r unless
        domains are packed)."""
        groups = rank_groups(self.key)[group]
        per, domain = self.per_domain, self.cluster.gpus_per_node
        if per == domain:
            return groups
        return tuple(tuple(r // per * domain + r % per for r in g) for g in groups)

    def collective(self, op: str, size_bytes: float, group: str) -> float:
        algo = self.algo if op != "alltoall" else None
        groups, key = self.gpu_groups(group), (group_signature(self.key, group), self.per_domain)
        return measured_speed(lambda k: self.model.cost(op, k, groups, algo, key=key)[0],
                              size_bytes, self.cluster.efficiency_of(op))

    def ring_shift(self, size_bytes: float, group: str) -> float:
        if size_bytes <= 0:
            return 0.0
        lin = self.model.linear_cost(
            "p2p", "direct", None, key=(group_signature(self.key,
                                                        group), group == "cp", self.per_domain),
            groups_fn=lambda: self._pairs(group))
        return size_bytes * lin[0] + lin[1] if lin else 0.0

    def _pairs(self, group: str) -> tuple:
        cyclic = group == "cp"  # ring attention passes KV round a ring; pipeline stages form a line
        return tuple((g[i], g[(i + 1) % len(g)]) for g in self.gpu_groups(group) if len(g) > 1
                     for i in range(len(g) - (0 if cyclic else 1)))


def network_for(cluster, strategy, options: NetworkOptions = DEFAULT_NETWORK):
    if options.model == "flow" and cluster.topology is not None:
        return FlowNetwork(cluster, strategy, options.order, options.algo, options.valiant)
    return AlphaBetaNetwork(cluster, strategy, options.order)
