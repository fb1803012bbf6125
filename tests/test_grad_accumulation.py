"""Gradient accumulation over micro-batches as each stack does it (Stack.grad_accumulation): the
memory-bound pass that adds each micro-batch's weight gradients into the step's, by hand-computed
bytes, in both engines."""

from dataclasses import replace

import pytest

from simpar.cost.compute import hbm_rate
from simpar.cost.pricing import Pricing
from simpar.cost.step import grad_accumulation_seconds, predict
from simpar.network.model import FreeNetwork
from simpar.sim.engine import simulate
from simpar.specs import MODELS, JobSpec, Strategy, dgx_like
from simpar.specs import stack as stacks
from simpar.workload.params import stage_params

M = MODELS["llama3-8b"]
A100 = dgx_like("a100-80gb")


def _seconds(s: Strategy, job: JobSpec, stage: int = 0) -> tuple[float, float]:
    """(seconds per micro-batch, the stage's parameters on one rank)."""
    layers = M.layers // s.pp
    dense, expert = stage_params(M, s, stage, layers)
    return (grad_accumulation_seconds(Pricing(M, A100, job, s, FreeNetwork()), dense, expert),
            dense + expert)


def test_each_stack_adds_its_micro_batches_gradients_by_hand_counted_bytes():
    job = JobSpec(4096, 32)  # four micro-batches of 8 on one rank of each group below
    rate = hbm_rate(A100.gpu)
    # Megatron: the weight-gradient GEMM accumulates into main_grad itself
    assert _seconds(Strategy(dp=1, micro_batch=8, stack="megatron"), job)[0] == 0.0
    # execpar (DDP, no_sync): autograd adds each fp32 gradient after the first in place
    t, p = _seconds(Strategy(dp=1, micro_batch=8, stack="execpar"), job)
    assert t == pytest.approx(3 / 4 * (4 + 4 + 4) * p / rate)
    # DeepSpeed's BF16_Optimizer casts every micro-batch's gradient to fp32 and adds it in
    ds = Strategy(dp=1, pp=2, zero=1, micro_batch=8, stack="deepspeed")
    t, p = _seconds(ds, job)
    assert t == pytest.approx((2 + 4 + 3 * 4) * p / rate)
    # ... in fp16 its gradients accumulate through autograd, 16-bit
    t, p = _seconds(ds, replace(job, dtype="fp16"))
    assert t == pytest.approx(3 / 4 * (2 + 2 + 2) * p / rate)
    # torchtitan's FSDP2 under pp keeps the unsharded sum in fp32: the first bf16 gradient is cast
    # (2 + 4 bytes), the other three added (2 + 4 + 4)
    tt = Strategy(dp=2, pp=2, zero=3, micro_batch=4, stack="torchtitan")
    t, p = _seconds(tt, job)
    assert t == pytest.approx((6 + 3 * 10) / 4 * p / rate)
    # ... without pp it reduce-scatters every micro-batch and adds only its fp32 shard
    t, p = _seconds(replace(tt, pp=1, dp=4, micro_batch=2), job)
    assert t == pytest.approx(3 / 4 * 12 * p / 4 / rate)


@pytest.mark.parametrize("engine", ["analytic", "event"])
def test_both_engines_book_the_pass_once_per_micro_batch(monkeypatch, engine):
    """The same job under execpar and under an execpar that fused its accumulation differ by
    the pass times the micro-batches."""
    job = JobSpec(2048, 16)
    s = Strategy(dp=1, micro_batch=2, stack="execpar")  # eight micro-batches
    fused = replace(stacks.STACKS["execpar"], grad_accumulation="fused")

    def step() -> float:
        if engine == "analytic":
            return predict(M, A100, job, s).step_time_s
        return simulate(M, A100, job, s).first.step_time_s

    real = step()
    monkeypatch.setitem(stacks.STACKS, "execpar", fused)
    stacks.get_stack.cache_clear()
    try:
        without = step()
    finally:
        monkeypatch.undo()
        stacks.get_stack.cache_clear()
    per_micro_batch, _ = _seconds(s, job)
    assert per_micro_batch > 0
    assert real - without == pytest.approx(8 * per_micro_batch, rel=1e-6)


def test_execpar_adds_each_micro_batchs_fp32_gradient_into_the_kept_one_in_place():
    """What the "autograd" mode assumes of execpar, on the CPU: its accumulation loop leaves the
    second micro-batch's fp32 gradient in the same storage as the first's."""
    torch = pytest.importorskip("torch")
    from execpar.model import Transformer
    from execpar.train import _accumulate
    from simpar.specs.model import ModelSpec

    spec = ModelSpec(name="g", layers=1, hidden=64, heads=4, kv_heads=4, ffn_hidden=128,
                     vocab=96)
    model = Transformer(spec)
    seen: dict[str, list] = {}
    for name, param in model.named_parameters():
        param.register_post_accumulate_grad_hook(
            lambda p, name=name: seen.setdefault(name, []).append((p.grad.data_ptr(),
                                                                   p.grad.dtype)))
    x = torch.randint(0, spec.vocab, (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _accumulate(model, x, torch.roll(x, -1, 1), micro_batches=2)
    assert seen and all(len(v) == 2 for v in seen.values())
    assert all(v[0] == v[1] and v[0][1] == torch.float32 for v in seen.values())



def test_the_searchs_compute_bound_tells_zero_stages_apart_where_accumulation_differs():
    """The search shares one compute bound among candidates alike but for their ZeRO stage. That
    holds for Megatron (accumulation fused into the GEMM), not where ZeRO-2/3 accumulate only a
    shard: there the bounds differ, and a shared one would prune the cheaper stage wrongly."""
    from simpar.cost.step import compute_bound, compute_bound_key

    job = JobSpec(4096, 64)  # eight micro-batches of 1 on each of 8 ranks
    meg = Strategy(dp=8, micro_batch=1, stack="megatron")
    assert compute_bound_key(replace(meg, zero=1)) == compute_bound_key(replace(meg, zero=2))
    mosaic = Strategy(dp=8, micro_batch=1, stack="mosaic", zero=1)
    sharded = replace(mosaic, zero=3)
    assert compute_bound_key(mosaic) != compute_bound_key(sharded)
    assert compute_bound(M, A100, job, sharded) < compute_bound(M, A100, job, mosaic)


def test_deepspeeds_bf16_optimizer_all_reduces_its_fp32_gradients_after_the_backward():
    """BF16_Optimizer reduces the fp32 copies it accumulates, whole (the pipeline engine's
    _bf16_reduce_grads: an all-reduce, bucket by bucket, each rank then stepping its shard), and
    DeepSpeed reduces after the last backward (ReduceGrads after the flush), not beside it. Its
    fp16 optimizers reduce-scatter 16-bit gradients; Megatron's distributed optimizer
    reduce-scatters beside the backward."""
    from simpar.cost.gradsync import grad_bytes, sharded_sync, zero_reduce_op
    from simpar.network.model import DEFAULT_NETWORK, network_for

    bf16, fp16 = JobSpec(4096, 32, "bf16"), JobSpec(4096, 32, "fp16")
    ds = Strategy(dp=4, pp=2, zero=1, micro_batch=8, stack="deepspeed")
    assert (zero_reduce_op(ds, bf16), grad_bytes(ds, bf16)) == ("allreduce", 4)
    assert (zero_reduce_op(ds, fp16), grad_bytes(ds, fp16)) == ("reducescatter", 2)
    mega = Strategy(dp=4, pp=2, zero=1, micro_batch=8, stack="megatron")
    assert zero_reduce_op(mega, bf16) == "reducescatter"
    assert not ds.overlap_grad_reduce and mega.overlap_grad_reduce
    # the whole fp32 all-reduce against a 16-bit reduce-scatter of the same gradients
    cluster = A100
    dense, expert = stage_params(M, ds, 0, M.layers // 2)

    def reduce_s(job):
        p = Pricing(M, cluster, job, ds, network_for(cluster, ds, DEFAULT_NETWORK))
        return sharded_sync(p, "reducescatter", dense, expert, M.layers // 2)
    assert reduce_s(bf16) > 3 * reduce_s(fp16)


def test_deepspeeds_bf16_optimizer_keeps_a_whole_fp32_copy_of_the_gradients_in_memory():
    """BF16_Optimizer allocates fp32_groups_gradients_flat, zeros_like each whole bf16 flat group,
    beside the bf16 gradients: 4 more bytes per parameter of the stage, unsharded under ZeRO-1.
    Its fp16 optimizers and Megatron (fused fp32 main_grad, counted in its gradient bytes) keep
    no such copy."""
    from simpar.memory.model import memory_breakdown

    bf16, fp16 = JobSpec(4096, 32, "bf16"), JobSpec(4096, 32, "fp16")
    ds = Strategy(dp=4, pp=2, zero=1, micro_batch=8, stack="deepspeed")
    # the last stage's (its final norm's few weights make it the larger)
    dense, expert = stage_params(M, ds, 1, M.layers // 2)
    gib = 2**30
    assert ds.keeps_fp32_gradients("bf16") and not ds.keeps_fp32_gradients("fp16")
    assert memory_breakdown(M, fp16, ds).gradients_gib == pytest.approx(2 * (dense + expert) / gib)
    assert memory_breakdown(M, bf16, ds).gradients_gib == pytest.approx(6 * (dense + expert) / gib)
    mega = replace(ds, stack="megatron")
    assert not mega.keeps_fp32_gradients("bf16")
    assert memory_breakdown(M, bf16, mega).gradients_gib == pytest.approx(
        4 * (dense + expert) / gib)


def test_deepspeeds_bf16_optimizer_shards_the_optimizer_states_at_zero_0_too():
    """DeepSpeed takes a bf16 job at ZeRO 0 to its BF16_Optimizer, which partitions the fp32
    weights and Adam moments over the data-parallel ranks (BLOOM ran so: "bf16 must use z0! it
    implements its own zero stage 1 equivalent"); its fp16 optimizer at ZeRO 0 keeps them whole
    on every rank. Priced at ZeRO 1, BLOOM's own setting had been refused as out of memory."""
    from simpar.memory.model import memory_breakdown

    bf16, fp16 = JobSpec(4096, 32, "bf16"), JobSpec(4096, 32, "fp16")
    z0 = Strategy(dp=4, pp=2, zero=0, micro_batch=8, stack="deepspeed")
    z1 = replace(z0, zero=1)
    dense, expert = stage_params(M, z0, 1, M.layers // 2)
    gib = 2**30
    assert (z0.optimizer_zero("bf16"), z0.optimizer_zero("fp16")) == (1, 0)
    # 12 bytes of fp32 master weights and moments per parameter, a quarter on each of 4 ranks
    assert memory_breakdown(M, bf16, z0).optimizer_gib == pytest.approx(
        12 * (dense + expert) / 4 / gib)
    assert memory_breakdown(M, fp16, z0).optimizer_gib == pytest.approx(12 * (dense + expert) / gib)
    assert memory_breakdown(M, bf16, z0) == memory_breakdown(M, bf16, z1)
    # and the step is priced as ZeRO 1's: the shard's update, the updated weights gathered
    assert predict(M, A100, bf16, z0).step_time_s == pytest.approx(
        predict(M, A100, bf16, z1).step_time_s)
    assert simulate(M, A100, bf16, z0).first.step_time_s == pytest.approx(
        simulate(M, A100, bf16, z1).first.step_time_s)


def test_simulate_says_when_zero_0_shards_the_optimizer_states(capsys):
    """The header names the stage asked for and what DeepSpeed's BF16_Optimizer does with it."""
    from simpar.cli.parser import main

    base = ["simulate", "--model", "llama3-8b", "--gpu", "a100-80gb", "--gpus", "8", "--seq-len",
            "4096", "--global-batch", "32", "--stack", "deepspeed", "--pp", "2", "--zero", "0"]
    assert main([*base, "--dtype", "bf16"]) == 0
    header = capsys.readouterr().out.splitlines()[1]
    assert "zero 0 (its BF16_Optimizer shards the optimizer states as ZeRO 1 does)" in header
    assert main([*base, "--dtype", "fp16"]) == 0
    assert "zero 0, " in capsys.readouterr().out.splitlines()[1]
