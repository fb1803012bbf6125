"""benchmarks/elementwise_audit.py, the op-by-op count of an execpar block's memory-bound bytes,
counts what the ops move."""

import pytest


def test_the_elementwise_audit_counts_execpars_ops_by_hand_computed_bytes():
    """benchmarks/elementwise_audit.py on a tiny block, per token: the adds are the two residual
    ones (an fp32 stream plus a bf16 output into fp32: 4 + 2 + 4 bytes per element each) and
    rotary's (fp32 halves of q and k: 4 + 4 + 4 per pair); SwiGLU's silu reads and writes bf16."""
    pytest.importorskip("torch")
    import importlib.util
    from pathlib import Path

    from simpar.specs.model import ModelSpec

    path = Path(__file__).parents[1] / "benchmarks" / "elementwise_audit.py"
    spec_ = importlib.util.spec_from_file_location("elementwise_audit", path)
    audit = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(audit)
    model = ModelSpec(name="e", layers=2, hidden=128, heads=4, kv_heads=2, ffn_hidden=384,
                      vocab=32)
    tokens = 100
    fwd, bwd = audit.traced(model, tokens)
    rotary_pairs = (4 * 32 + 2 * 32) / 2  # q's 4 heads and k's 2, 32 wide
    assert fwd.bytes["add"] / tokens == 2 * (4 + 2 + 4) * 128 + rotary_pairs * (4 + 4 + 4)
    assert fwd.bytes["silu"] / tokens == (2 + 2) * 384
    assert bwd.kernels["silu_backward"] == 1



def _audit():
    pytest.importorskip("torch")
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "benchmarks" / "elementwise_audit.py"
    spec_ = importlib.util.spec_from_file_location("elementwise_audit", path)
    audit = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(audit)
    return audit


SMALL = dict(name="s", layers=2, hidden=256, heads=4, kv_heads=2, ffn_hidden=768, vocab=32)


def test_an_fp32_stream_moves_what_the_model_prices_over_a_16bit_one():
    """execpar's block under autocast over fp32 weights against the same over bf16 weights, op by
    op: the difference per hidden element of a token is FP32_STREAM_BYTES with five linears fed
    by the norms (q, k, v, gate, up): 46 forward, 80 backward."""
    import torch

    from simpar.specs.model import ModelSpec
    from simpar.workload.layer import fp32_stream_bytes

    audit = _audit()
    model, tokens = ModelSpec(**SMALL), 100
    fp32 = [sum(c.bytes.values()) for c in audit.traced(model, tokens)]
    bf16 = [sum(c.bytes.values()) for c in audit.traced(model, tokens, torch.bfloat16)]
    per_element = tuple((a - b) / tokens / model.hidden for a, b in zip(fp32, bf16, strict=True))
    assert per_element == fp32_stream_bytes(2, 5) == (46, 80)


def test_execpars_rotary_moves_what_real_fp32_rope_prices():
    """execpar/model.py's rotary alone on a 16-bit q, op by op: REAL_FP32_ROPE_BYTES per rotated
    element, forward and backward, and its kernels a call (the cos and sin table apart)."""
    import torch

    from execpar.model import rotary
    from simpar.workload.layer import REAL_FP32_ROPE_BYTES, REAL_FP32_ROPE_KERNELS

    audit = _audit()
    tokens, heads, dim = 100, 32, 64  # many heads: the per-position cos and sin reads are few
    q = torch.randn(1, tokens, heads, dim, dtype=torch.bfloat16, requires_grad=True)
    fwd, bwd = audit.ByteCount(tokens), audit.ByteCount(tokens)
    with fwd:
        out = rotary(q)
    with bwd:
        out.backward(torch.randn_like(out))
    table = ("cos", "sin")  # the angles' cos and sin: per position and frequency, not element
    elements = tokens * heads * dim
    moved = [sum(v for k, v in c.bytes.items() if k not in table) / elements for c in (fwd, bwd)]
    assert moved == pytest.approx(REAL_FP32_ROPE_BYTES, abs=0.5)
    # less the table's two more: the positions' cast to fp32 and their outer product
    assert sum(v for k, v in fwd.kernels.items() if k not in table) - 2 == REAL_FP32_ROPE_KERNELS


def test_the_priced_memory_bound_bytes_are_the_traced_ones():
    """The whole block, priced against traced over fp32 and bf16 weights: within 10% each pass
    (the priced eager layout copies of q, k, v and the output, which execpar's cuDNN attention
    makes one of, are the most of the gap)."""
    import torch

    from simpar.specs.model import ModelSpec

    audit = _audit()
    model, tokens = ModelSpec(**SMALL), 100
    for weights, fp32 in ((torch.float32, True), (torch.bfloat16, False)):
        traced = [sum(c.bytes.values()) / tokens for c in audit.traced(model, tokens, weights)]
        fwd, bwd, _ = audit.priced(model, tokens, fp32)
        assert fwd == pytest.approx(traced[0], rel=0.10) and bwd == pytest.approx(traced[1],
                                                                                   rel=0.10)
