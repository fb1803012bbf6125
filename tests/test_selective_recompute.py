"""--recompute selective as each stack runs it: Megatron checkpoints the attention core (the fused
kernel included), execpar the whole attention module (apply_recompute's checkpoint_wrapper around
block.attention): its projections, rotary and core run again, and it keeps only its input."""

from dataclasses import replace

import pytest

from simpar.cost.compute import flash_attention_time, gemm_time, memory_bound_time
from simpar.cost.layer import layer_cost, layer_kernels, stack_layer_work
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
    # GEMMs and the memory-bound kernels outside attention (norms, residuals, SwiGLU, the fp32
    # stream's MLP casts)
    mlp = sum(gemm_time(g, H100.gpu, "bf16") for g in work.gemms if g.name in MLP_GEMMS)
    memory = sum(k.forward_s for k in layer_kernels(work, H100.gpu, "bf16", get_stack("execpar"))
                 if k.kind == "memory")
    outside = memory - memory_bound_time(work.attention_elementwise_bytes, H100.gpu,
                                         work.attention_elementwise_kernels)
    assert 0 < selective < full and outside > 0
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
    element of its input, and drops the 16-bit copies its q, k and v projections each cast of
    it, Q, K, V, its output and the softmax statistics (its rotary keeps only its cos and sin
    tables); the MLP and the norms keep theirs. Over 16-bit weights (FSDP's), one copy feeds
    all three projections."""
    job = JobSpec(4096, 8, "bf16")

    def act(recompute, fp32_stream=True):
        s = Strategy(recompute=recompute, stack="execpar")
        return activation_bytes_per_token(
            M, job.seq_len, 1, False, recompute, True, "bf16", "eager",
            SavedCode(norm_fp32=False, fp32_stream=fp32_stream,
                      attention_input_bytes=s.profile.attention_input_bytes("bf16")))

    h, q, kv = M.hidden, M.q_dim, M.kv_dim + M.v_dim
    attention = 2 * (q + kv) + 2 * M.out_dim + 4 * M.heads
    assert act("none") - act("selective") == pytest.approx(3 * 2 * h + attention - 4 * h)
    assert act("none", False) - act("selective", False) == pytest.approx(2 * h + attention - 4 * h)
    assert get_stack("megatron").attention_input_bytes("bf16") == 0


def test_the_saving_matches_what_execpars_block_saves_for_backward():
    """Autograd's saved tensors of execpar's own block under bf16 autocast, counted on the CPU:
    what checkpointing the attention module saves per token is what the model says, to the
    byte (q's, k's and v's own casts of the norm's fp32 output among it); the rotary's cos and
    sin tables (half a head per position, shared by the batch) are left out."""
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
            # activations, not the weights' bf16 copies nor the rotary's [1, seq, 1, half a
            # head] cos and sin tables
            if tokens in t.shape and not (t.dim() == 4 and t.shape[2] == 1):
                storages.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
            return t

        x = torch.randn(1, tokens, spec.hidden, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                model.layers["1"](x)
        return sum(storages.values()) / tokens

    measured = saved_per_token("none") - saved_per_token("selective")
    stack = get_stack("execpar")
    code = SavedCode(norm_fp32=False, fp32_stream=True)
    predicted = (activation_bytes_per_token(spec, tokens, 1, False, "none", True, "bf16", "eager",
                                            code)
                 - activation_bytes_per_token(
                     spec, tokens, 1, False, "selective", True, "bf16", "eager",
                     replace(code, attention_input_bytes=stack.attention_input_bytes("bf16"))))
    assert measured > 0 and predicted == pytest.approx(measured, rel=1e-9)
