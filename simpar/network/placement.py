"""Where the ranks of each process group sit.

Ranks are laid out over the (tp, cp, dp, pp) mesh with tp innermost and pp outermost by default, as
Megatron-LM and torchtitan build their device meshes; `order` changes that (innermost first). Rank r
runs on GPU r. Expert-parallel groups are contiguous runs inside the data-parallel dimension."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from simpar.errors import require

ORDER = ("tp", "cp", "dp", "pp")


@dataclass(frozen=True)
class GroupSpan:
    size: int  # ranks in the group
    per_node: int  # group ranks on each node it touches
    nodes: int  # nodes the group spans

    @property
    def crosses_nodes(self) -> bool:
        return self.nodes > 1


def check_order(order) -> tuple:
    order = tuple(order)
    require(sorted(order) == sorted(ORDER), "--placement", ",".join(order),
            f"give the four mesh dimensions {','.join(ORDER)} in some order, innermost first")
    return order


def strides(strategy, order=ORDER) -> dict[str, int]:
    out, acc = {}, 1
    for dim in order:
        out[dim] = acc
        acc *= getattr(strategy, dim)
    return out


def span(size: int, stride: int, gpus_per_node: int) -> GroupSpan:
    """A group of `size` ranks spaced `stride` apart in rank order."""
    if size <= 1:
        return GroupSpan(1, 1, 1)
    per_node = max(1, min(size, gpus_per_node // stride)) if stride < gpus_per_node else 1
    return GroupSpan(size, per_node, -(-size // per_node))


def group_spans(strategy, gpus_per_node: int, order=ORDER) -> dict[str, GroupSpan]:
    s, st = strategy, strides(strategy, order)
    spans = {dim: span(getattr(s, dim), st[dim], gpus_per_node) for dim in ORDER}
    # Gradients of dense weights are reduced over data and context parallel ranks together;
    # experts are split in runs of ep ranks of that group and replicated across the runs. (Treated
    # as one strided block: exact when dp and cp are adjacent in the order, as by default.)
    inner = min(st["dp"], st["cp"])
    spans["dpcp"] = span(s.dp * s.cp, inner, gpus_per_node)
    # folded experts (Strategy.folds_experts) are split in runs of ep ranks of tp x dp x cp
    experts = min(inner, st["tp"]) if s.folds_experts else inner
    spans["ep"] = span(s.ep, experts, gpus_per_node)
    spans["edp"] = span(s.edp, experts * s.ep, gpus_per_node)
    # hybrid sharding: runs of shard_ranks ranks of that group shard, the runs replicate
    spans["shard"] = span(s.shard_ranks, inner, gpus_per_node)
    spans["replicate"] = span(s.shard_replicas, inner * s.shard_ranks, gpus_per_node)
    return spans


def mesh_key(strategy, order=ORDER) -> tuple:
    """What the groups depend on: the degrees, the placement order, the shard groups' size and
    whether experts are cut from tp x dp x cp (folded) or dp x cp."""
    return (strategy.tp, strategy.cp, strategy.dp, strategy.pp, strategy.ep, tuple(order),
            strategy.shard_ranks, strategy.folds_experts)


_VARYING = {"tp": ("tp",), "cp": ("cp",), "dp": ("dp",), "pp": ("pp",), "dpcp": ("dp", "cp"),
            "ep": ("dp", "cp"), "edp": ("dp", "cp"), "shard": ("dp", "cp"),
            "replicate": ("dp", "cp")}
# kinds whose groups are runs (or strides) of ranks inside the dp*cp groups, by run length
_RUNS = {"ep": 4, "edp": 4, "shard": 6, "replicate": 6}  # index of the run length in the key


@lru_cache(maxsize=4096)
def group_signature(key: tuple, group: str) -> tuple:
    """A compact name for the set of concurrent groups of a kind: the (size, stride) of the
    dimensions that vary inside a group, the world size and, for groups cut from the dp*cp ones,
    their run length (ep, or the shard groups' size). Different meshes with equal
    signatures have exactly the same groups, so their collective costs can be shared."""
    tp, cp, dp, pp, _, order, _, folded = key
    sizes = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    st, acc = {}, 1
    for d in order:
        st[d], acc = acc, acc * sizes[d]
    varying = ("tp", "dp", "cp") if folded and group in ("ep", "edp") else _VARYING[group]
    dims = tuple(sorted((sizes[d], st[d]) for d in varying if sizes[d] > 1))
    run = key[_RUNS[group]] if group in _RUNS else 1
    return (group if group in _RUNS else "g", dims, acc, run)


@lru_cache(maxsize=512)
def rank_groups(key: tuple) -> MeshGroups:
    """Every process group of each kind for `mesh_key(...)`, as tuples of ranks, each
    kind built when first asked for (a search asks a few kinds of each of thousands of
    meshes); all groups of a kind run concurrently."""
    return MeshGroups(key)


class MeshGroups(dict):
    """kind (tp, cp, dp, pp, dpcp, ep, edp, shard, replicate) -> its groups, built on first
    use."""

    def __init__(self, key: tuple):
        super().__init__()
        self.key = key

    def __missing__(self, kind: str) -> tuple:
        value = self[kind] = self._build(kind)
        return value

    def _build(self, kind: str) -> tuple:
        if kind in ORDER:
            return _groups(self.key, (kind,))
        if kind == "dpcp":
            return _groups(self.key, ("dp", "cp"))
        if kind == "tpdpcp":  # what folded experts are cut from
            return _groups(self.key, ("tp", "dp", "cp"))
        folded = self.key[-1] and kind in ("ep", "edp")
        dpcp, run = self["tpdpcp" if folded else "dpcp"], self.key[_RUNS[kind]]
        # contiguous runs of `run` ranks of each dp*cp group (the experts' split over ep
        # ranks, a hybrid-sharded group); the same slot in every run (the experts' replicas,
        # the shard groups' replicas)
        if kind in ("ep", "shard"):
            return tuple(g[i:i + run] for g in dpcp for i in range(0, len(g), run))
        return tuple(tuple(g[i] for i in range(j, len(g), run)) for g in dpcp for j in range(run))


def _groups(key: tuple, varying: tuple[str, ...]) -> tuple:
    """The groups of ranks that differ only in the `varying` mesh dimensions."""
    tp, cp, dp, pp, _, order, _, _ = key
    sizes = {"tp": tp, "cp": cp, "dp": dp, "pp": pp}
    # axis i of the mesh array is order[-1 - i]: outermost first, so rank = flat index
    mesh = np.arange(tp * cp * dp * pp).reshape([sizes[d] for d in reversed(order)])
    axis = {d: len(order) - 1 - i for i, d in enumerate(order)}
    moved = np.moveaxis(mesh, [axis[d] for d in varying], range(-len(varying), 0))
    flat = np.sort(moved.reshape(-1, math.prod(sizes[d] for d in varying)), axis=1)
    return tuple(map(tuple, flat.tolist()))
