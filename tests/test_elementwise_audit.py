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

