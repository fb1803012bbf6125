"""execpar's mixture-of-experts layer on one process: torch's grouped GEMM computes what a loop
of one GEMM per expert does, and under StepAutocast each expert weight is cast to 16 bits once a
step, shared by the step's micro-batches and dropped when the step ends."""

import pytest

torch = pytest.importorskip("torch")

from execpar.model import MoE, StepAutocast  # noqa: E402
from simpar.specs.model import ModelSpec  # noqa: E402

SPEC = ModelSpec(name="tiny-moe", layers=1, hidden=32, heads=4, kv_heads=4, ffn_hidden=48,
                 vocab=64, experts=6, experts_per_token=2)


def _layer(seed: int = 0) -> MoE:
    torch.manual_seed(seed)
    layer = MoE(SPEC)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.1)
    return layer


def test_the_grouped_gemm_computes_what_a_loop_over_experts_does():
    """Row counts 0, 1, 5, ... (an expert without rows, and none a multiple of 8) on the CPU in
    fp32: outputs and the gradients of rows and weights as a per-expert loop gives them."""
    layer = _layer()
    counts = torch.tensor([0, 1, 5, 3, 7, 4])
    rows = torch.randn(int(counts.sum()), SPEC.hidden, requires_grad=True)
    grad = torch.randn(int(counts.sum()), SPEC.hidden)
    got = layer._local(rows, counts)
    got_grads = torch.autograd.grad(got, (rows, layer.w1, layer.w2, layer.w3), grad)
    outs = []
    for e, chunk in enumerate(rows.split(counts.tolist())):
        inner = torch.nn.functional.silu(chunk @ layer.w1[e]) * (chunk @ layer.w3[e])
        outs.append(inner @ layer.w2[e])
    want = torch.cat(outs)
    want_grads = torch.autograd.grad(want, (rows, layer.w1, layer.w2, layer.w3), grad)
    assert torch.allclose(got, want, atol=1e-6)
    for a, b in zip(got_grads, want_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_a_step_casts_each_expert_weight_once_and_drops_the_copies_at_its_end():
    """Two micro-batches under StepAutocast (bf16 on the CPU): the second reuses the first's
    16-bit copies (the same tensors), none survive the step, the gradients are those of casting
    per micro-batch, and a weight changed in place is cast again."""
    x = torch.randn(2, 8, SPEC.hidden)
    layer = _layer()
    step = StepAutocast("cpu", torch.bfloat16, layer)
    with step:
        layer(x).float().sum().backward()
        first = {name: copy for name, (_, copy) in layer.casts.items()}
        assert sorted(first) == ["w1", "w2", "w3"]
        assert all(c.dtype == torch.bfloat16 for c in first.values())
        layer(x).float().sum().backward()
        assert all(layer.casts[name][1] is first[name] for name in first)
    assert layer.casts == {}
    cached = [p.grad.clone() for p in layer.parameters()]
    again = _layer()
    with StepAutocast("cpu", torch.bfloat16, again):
        for _ in range(2):
            again(x).float().sum().backward()
            again.casts.clear()  # a copy per micro-batch
    assert all(torch.equal(a, p.grad) for a, p in zip(cached, again.parameters(), strict=True))
    with step:
        layer(x).float().sum().backward()
        before = layer.casts["w1"][1]
        with torch.no_grad():
            layer.w1.mul_(2.0)
        layer(x).float().sum().backward()
        assert layer.casts["w1"][1] is not before


def test_a_compiled_moe_layer_runs_in_fp32():
    """torch.compile traces the grouped GEMM through its meta kernel, which takes bf16 only: an
    fp32 layer (execpar's CPU runs) calls the eager op outside the graph and gives eager's
    output (a plan with --compile had crashed with 'Expected inputs of BF16 type')."""
    layer = _layer()
    x = torch.randn(2, 8, SPEC.hidden)
    compiled = torch.compile(layer)
    got = compiled(x)
    got.sum().backward()
    assert torch.allclose(got, layer(x), atol=1e-5)
    assert layer.w1.grad is not None and layer.w1.grad.abs().sum() > 0


def test_group_limited_routing_picks_experts_from_the_best_groups_only():
    """16 experts in 4 groups of 4, top-4 from the 2 groups whose best logit is highest
    (ModelSpec.expert_groups, groups_per_token): every token's experts lie in 2 groups, those
    holding its two highest logits; without groups the router takes the top 4 anywhere."""
    from dataclasses import replace

    spec = replace(SPEC, experts=16, experts_per_token=4, expert_groups=4, groups_per_token=2)
    torch.manual_seed(0)
    layer = MoE(spec)
    logits = torch.randn(256, 16)
    _, chosen = layer._limited(logits).topk(4, dim=-1)
    groups = chosen // 4
    best = logits.view(256, 4, 4).amax(-1).topk(2, dim=-1).indices
    for g, b in zip(groups, best, strict=True):
        assert set(g.tolist()) <= set(b.tolist())
    free = MoE(replace(spec, expert_groups=0, groups_per_token=0))
    assert torch.equal(free._limited(logits), logits)
    # some token's free top 4 spans 3 or more groups: the limit changes the routing
    assert any(len(set((c // 4).tolist())) > 2 for c in logits.topk(4, dim=-1).indices)
