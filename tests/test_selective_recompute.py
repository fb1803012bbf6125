"""--recompute selective as each stack runs it: Megatron checkpoints the attention core (the fused
kernel included), execpar the whole attention module (apply_recompute's checkpoint_wrapper around
block.attention): its projections, rotary and core run again, and it keeps only its input."""

import pytest

from simpar.cost.compute import flash_attention_time, gemm_time, memory_bound_time
from simpar.cost.layer import layer_cost, stack_layer_work
from simpar.memory.model import SavedCode, activation_bytes_per_token
from simpar.network.model import FreeNetwork
from simpar.specs import MODELS, JobSpec, Strategy, load_cluster
from simpar.specs.model import ModelSpec
from simpar.specs.stack import get_stack
from simpar.workload import flops
from simpar.workload.layer import MLP_GEMMS

M = MODELS["llama3-8b"]
H100 = load_cluster("dgx-h100", None)


def _recompute_s(stack_name: str, recompute: str, tokens: int = 8192) -> tuple[float, object]:
    stack = get_stack(stack_name)
    work = stack_layer_work(M, tokens, 1, 1, 1, 1, False, True, "bf16", stack.kernels, stack)
    _, bwd = layer_cost(work, FreeNetwork(), H100.gpu, "bf16", recompute, False, stack)
    return bwd.recompute_s, work


def test_execpar_recomputes_the_attention_module_and_megatron_its_core():
    full, work = _recompute_s("execpar", "full")
    selective, _ = _recompute_s("execpar", "selective")
    # full recompute runs the layer's forward again; selective all of it but the MLP: its two
    # GEMMs and the memory-bound kernels outside attention (norms, residuals, SwiGLU)
    mlp = sum(gemm_time(g, H100.gpu, "bf16") for g in work.gemms if g.name in MLP_GEMMS)
    outside = memory_bound_time(
        work.elementwise_bytes - work.attention_elementwise_bytes, H100.gpu,
        work.elementwise_kernels - work.attention_elementwise_kernels)
    assert 0 < selective < full
    assert full - selective == pytest.approx(mlp + outside, rel=1e-9)
    # Megatron: only the fused attention kernel's forward
    core, work = _recompute_s("megatron", "selective")
    assert core == pytest.approx(flash_attention_time(
        work.flash_attention_flops, H100.gpu, "bf16", "best", work.attention_keys, 1), rel=1e-9)


def test_execpars_selective_recompute_counts_the_attention_projections_as_hardware_flops():
    small = ModelSpec(name="s", layers=2, hidden=512, heads=8, kv_heads=4, ffn_hidden=1536,
                      vocab=64)
    # q and o 512 x 512, k and v 512 x 256: 786,432 weights, 2 FLOPs each, 2 layers; the core:
    # 2 x 256 keys x (512 + 512) per layer
    by_hand = 2 * 2 * 786_432 + 2 * 2 * 256 * 1024
    assert flops.recompute_flops_per_token(small, 256, "selective", "attention") == by_hand
    assert flops.recompute_flops_per_token(small, 256, "selective") == 2 * 2 * 256 * 1024


def test_a_checkpointed_attention_module_keeps_its_input_and_frees_the_rest():
    """execpar's residual stream is fp32 under autocast: the module keeps 4 bytes per hidden
    element of its input, and drops its GEMM input copy, Q, K, V, its output and the softmax
    statistics; the MLP and the norms keep theirs."""
    job = JobSpec(4096, 8, "bf16")

    def act(recompute):
        s = Strategy(recompute=recompute, stack="execpar")
        return activation_bytes_per_token(
            M, job.seq_len, 1, False, recompute, True, "bf16", "eager",
            SavedCode(attention_input_bytes=s.profile.attention_input_bytes("bf16")))

    h, q, kv = M.hidden, M.q_dim, M.kv_dim + M.v_dim
    dropped = 2 * h + 2 * (q + kv) + 2 * M.out_dim + 4 * M.rotary_dim + 4 * M.heads
    assert act("none") - act("selective") == pytest.approx(dropped - 4 * h)
    assert get_stack("megatron").attention_input_bytes("bf16") == 0


def test_the_saving_matches_what_execpars_block_saves_for_backward():
    """Autograd's saved tensors of execpar's own block under bf16 autocast, counted on the CPU:
    what checkpointing the attention module saves per token is what the model says, within 15%
    (the model counts the attention's GEMM input once where execpar's separate wq, wk and wv each
    save their own cast, and rotary's fp32 copies where execpar's saves only its cos and sin)."""
    torch = pytest.importorskip("torch")
    from execpar.model import Transformer
    from execpar.parallelize import apply_recompute

    spec = ModelSpec(name="p", layers=2, hidden=512, heads=8, kv_heads=4, ffn_hidden=1536,
                     vocab=64)
    tokens = 384  # no width of the model

    def saved_per_token(mode: str) -> float:
        model = Transformer(spec)
        apply_recompute(model, mode)
        storages: dict[int, int] = {}

        def pack(t):
            if tokens in t.shape:  # activations, not the weights' bf16 copies
                storages.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
            return t

        x = torch.randn(1, tokens, spec.hidden, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                model.layers["1"](x)
        return sum(storages.values()) / tokens

    measured = saved_per_token("none") - saved_per_token("selective")
    stack = get_stack("execpar")
    predicted = (activation_bytes_per_token(spec, tokens, 1, False, "none", True, "bf16", "eager")
                 - activation_bytes_per_token(
                     spec, tokens, 1, False, "selective", True, "bf16", "eager",
                     SavedCode(attention_input_bytes=stack.attention_input_bytes("bf16"))))
    assert measured > 0 and predicted == pytest.approx(measured, rel=0.15)
