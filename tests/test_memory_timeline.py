"""The memory model against execpar's own step as torch's memory profiler sees it: one training
step of execpar's Transformer under bf16 autocast (fp32 weights, foreach AdamW, the fp32 loss), on
the CPU, whose allocations torch.profiler records by tensor; the peak of its memory timeline is
what simpar predicts as the peak allocated (the stack execpar, --loss fp32 --optimizer foreach)."""

import json

import pytest

from simpar.memory.model import memory_breakdown
from simpar.specs import JobSpec, Strategy
from simpar.specs.model import ModelSpec

torch = pytest.importorskip("torch")

SPEC = ModelSpec(name="t", layers=4, hidden=256, heads=4, kv_heads=2, ffn_hidden=768, vocab=16000)
SEQ, MB = 512, 2


def _measured_peak_bytes(recompute: str, tmp_path, spec: ModelSpec = SPEC) -> int:
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    from execpar.model import Transformer
    from execpar.parallelize import apply_recompute

    torch.manual_seed(0)
    model = Transformer(spec)
    apply_recompute(model, recompute)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

    def step(seq_len: int):
        x, y = (torch.randint(0, spec.vocab, (MB, seq_len)) for _ in range(2))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(0, 1))
        del logits
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    # the optimizer's states exist from the first step on, whatever its tokens: a step of 8
    # leaves the same tensors behind at a 64th of the cost (bf16 matmuls on an AVX2 CPU run at a
    # fiftieth of fp32's rate, and the output layer's alone took 12 s a step)
    step(8)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        step(SEQ)
    path = tmp_path / f"timeline-{recompute}.json"
    prof.export_memory_timeline(str(path), device="cpu")
    _, sizes = json.loads(path.read_text())
    return max(sum(row) for row in sizes)


# torch 2.13 marks export_memory_timeline deprecated (for CUDA's memory snapshots) but has no CPU
# replacement
@pytest.mark.filterwarnings("ignore:.*export_memory_timeline.*:FutureWarning")
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_the_predicted_peak_is_execpars_measured_one(recompute, tmp_path):
    s = Strategy(micro_batch=MB, recompute=recompute, stack="execpar", loss="fp32",
                 optimizer="foreach")
    predicted = memory_breakdown(SPEC, JobSpec(SEQ, MB, "bf16"), s).peak_allocated_gib * 2**30
    measured = _measured_peak_bytes(recompute, tmp_path)
    assert predicted == pytest.approx(measured, rel=0.05)


MOE = ModelSpec(name="m", layers=4, hidden=256, heads=4, kv_heads=2, ffn_hidden=256, vocab=16000,
                experts=8, experts_per_token=4)


@pytest.mark.filterwarnings("ignore:.*export_memory_timeline.*:FutureWarning")
def test_op_level_recompute_recomputes_the_routed_experts(tmp_path):
    """execpar's op-level policy (torchtitan's) counts and saves aten.mm, not the experts'
    torch._grouped_mm: what it keeps beyond full recompute is the attention's odd matmuls, the
    router's logits and the attention output, none of the experts' outputs. Measured on the CPU
    here: 5.1 MiB; keeping every odd-numbered weight's output, experts included, priced 21."""
    peaks = {}
    for recompute in ("op", "full"):
        s = Strategy(micro_batch=MB, recompute=recompute, stack="execpar", loss="fp32",
                     optimizer="foreach")
        predicted = memory_breakdown(MOE, JobSpec(SEQ, MB, "bf16"), s).peak_allocated_gib * 2**30
        peaks[recompute] = (predicted, _measured_peak_bytes(recompute, tmp_path, MOE))
    (op_p, op_m), (full_p, full_m) = peaks["op"], peaks["full"]
    assert op_p - full_p == pytest.approx(op_m - full_m, rel=0.25)
