"""A ring that crosses nodes is paced by the network proxy's posts (NCCL's tuning model: every step
of such a ring costs at least three network post overheads under the Simple protocol; a post is
2 us on AMD x86 hosts and 1 us on Intel). Worked by hand on both network models."""

from dataclasses import replace

import pytest

from simpar.network.collectives import allgather_time, ring_step_floor_s
from simpar.network.flowcost import STEP_OVERHEAD_S
from simpar.network.model import flow_model
from simpar.network.placement import GroupSpan
from simpar.specs.cluster import load_cluster


def test_amd_hosts_post_at_twice_intel_hosts():
    assert load_cluster(None, "a100-80gb").net_post_us == 2.0  # DGX A100: two EPYC 7742
    assert load_cluster("dgx-a100", None).net_post_us == 2.0
    assert load_cluster(None, "h100-sxm").net_post_us == 1.0  # DGX H100: Xeon
    assert load_cluster(None, "gb200").net_post_us == 1.0  # Grace (Arm)


def test_the_floor_applies_only_where_a_ring_leaves_the_node():
    a100 = load_cluster(None, "a100-80gb")
    assert ring_step_floor_s(a100, crosses=True) == pytest.approx(6e-6)
    assert ring_step_floor_s(a100, crosses=False) == 0.0
    model = flow_model(a100, 16)
    inside = model.cost("allgather", 1.0, (tuple(range(8)),), "ring")[0]
    across = model.cost("allgather", 1.0, (tuple(range(16)),), "ring")[0]
    # inside: 7 NVLink steps at their own 2 us hop latency (half a link each way) and NCCL's step
    # overhead; across: 15 steps each paced at 3 x 2 us
    assert inside == pytest.approx(7 * (2e-6 + STEP_OVERHEAD_S), rel=1e-3)
    assert across == pytest.approx(15 * 6e-6, rel=1e-3)


def test_intel_hosts_pace_at_three_microseconds_and_faster_hops_do_not_matter():
    h100 = load_cluster(None, "h100-sxm")
    fast = replace(h100, net_post_us=0.0)
    span = GroupSpan(size=64, per_node=8, nodes=8)
    # alpha-beta: 56 steps inside the nodes at max(2 us, 3 us), 7 across at 5 us
    assert allgather_time(1.0, span, h100) == pytest.approx(56 * 3e-6 + 7 * 5e-6, rel=1e-3)
    assert allgather_time(1.0, span, fast) == pytest.approx(56 * 2e-6 + 7 * 5e-6, rel=1e-3)

