import pytest
from hypothesis import given
from hypothesis import strategies as st

from simpar.network.collectives import allgather_time, allreduce_time, bus_bandwidth_gbps
from simpar.network.placement import group_spans, span
from simpar.specs import Strategy, load_cluster

H100 = load_cluster("dgx-h100", None)


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("size", [1e6, 1e8, 1e9])
def test_ring_allreduce_inside_a_node_moves_2_n_minus_1_over_n(n, size):
    expected = (
        2 * (n - 1) / n * size / H100.intra_bw_bytes_per_s
        + 2 * (n - 1) * H100.intra_node_latency_us * 1e-6
    )
    assert allreduce_time(size, span(n, 1, 8), H100) == pytest.approx(expected)


def test_one_rank_costs_nothing():
    assert allreduce_time(1e9, span(1, 1, 8), H100) == 0.0


def test_allgather_is_half_an_allreduce_in_bandwidth():
    g = span(8, 1, 8)
    big = 1e10
    assert allgather_time(big, g, H100) == pytest.approx(allreduce_time(big, g, H100) / 2, rel=1e-3)


def test_cross_node_bus_bandwidth_is_bounded_by_the_nics():
    g = span(16, 1, 8)  # 2 nodes x 8 GPUs
    busbw = bus_bandwidth_gbps("allreduce", 8 * 2**30, g, H100)
    # hierarchical: each GPU's NIC carries 1/8 of the data across; busbw above the NIC
    # rate, below NVLink
    assert H100.nic_bw_gbps < busbw < H100.intra_node_bw_gbps


@given(st.integers(2, 4096), st.floats(1.0, 1e11), st.floats(1.0, 1e11))
def test_larger_message_never_costs_less(n, a, b):
    g = span(n, 1, 8)
    small, large = sorted((a, b))
    assert allreduce_time(large, g, H100) >= allreduce_time(small, g, H100)
    assert allgather_time(large, g, H100) >= allgather_time(small, g, H100)


def test_tp_innermost_placement():
    spans = group_spans(Strategy(dp=16, tp=8, pp=8), 8)
    assert not spans["tp"].crosses_nodes
    assert spans["dp"].per_node == 1 and spans["dp"].nodes == 16
    spans = group_spans(Strategy(dp=64, tp=2, pp=1), 8)
    assert spans["dp"].per_node == 4 and spans["dp"].nodes == 16
