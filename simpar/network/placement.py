"""Where the ranks of a process group sit: how many share a node, and how many nodes the group spans.

Ranks are laid out with tp innermost, then cp, then dp (expert-parallel groups are contiguous runs
inside dp), then pp outermost, as Megatron-LM and torchtitan build their device meshes."""

from __future__ import annotations

from dataclasses import dataclass

ORDER = ("tp", "cp", "dp", "pp")


@dataclass(frozen=True)
class GroupSpan:
    size: int  # ranks in the group
    per_node: int  # group ranks on each node it touches
    nodes: int  # nodes the group spans

    @property
    def crosses_nodes(self) -> bool:
        return self.nodes > 1


def span(size: int, stride: int, gpus_per_node: int) -> GroupSpan:
    """A group of `size` ranks spaced `stride` apart in rank order."""
    if size <= 1:
        return GroupSpan(1, 1, 1)
    per_node = max(1, min(size, gpus_per_node // stride)) if stride < gpus_per_node else 1
    return GroupSpan(size, per_node, -(-size // per_node))


def group_spans(strategy, gpus_per_node: int) -> dict[str, GroupSpan]:
    s = strategy
    strides = {"tp": 1, "cp": s.tp, "dp": s.tp * s.cp, "pp": s.tp * s.cp * s.dp}
    spans = {name: span(getattr(s, name), strides[name], gpus_per_node) for name in ORDER}
    spans["ep"] = span(s.ep, s.tp * s.cp, gpus_per_node)
    # Gradients of dense weights are reduced over data and context parallel ranks together.
    spans["dpcp"] = span(s.dp * s.cp, s.tp, gpus_per_node)
    # Expert weights are replicated over the dp*cp/ep ranks that hold the same experts.
    spans["edp"] = span(s.dp * s.cp // s.ep, s.tp * s.ep, gpus_per_node)
    return spans
