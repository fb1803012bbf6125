"""torchtitan's Llama rotates q and k as complex numbers, which inductor leaves to eager aten
kernels: a compiled torchtitan block still runs its rotary op by op; execpar's real-valued rotary
compiles into the block's fused kernels."""

from dataclasses import replace

from simpar.cost.layer import layer_kernels, stack_layer_work
from simpar.specs import MODELS, dgx_like
from simpar.specs.stack import get_stack

LLAMA_8B = MODELS["llama3-8b"]
H100 = dgx_like("h100-sxm")


def _rope(stack, dtype: str = "bf16"):
    work = stack_layer_work(LLAMA_8B, 8192, 1, 1, 1, 1, False, True, dtype, stack.elementwise,
                            stack)
    rows = {k.name: k for k in layer_kernels(work, H100.gpu, dtype, stack)}
    return work, rows.get("rope (op by op)")


def test_a_compiled_torchtitan_block_rotates_op_by_op():
    """8,192 tokens x (q 4,096 + k 1,024) rotated elements: the cast up (2 + 4), the complex
    multiply (4 + 4) and the cast down (4 + 2) are 20 bytes each way, 16 more than the fused
    kernel's 4 in forward and 12 more than its 8 in backward; 3 kernels each on q and on k for
    the fused kernel's 1: 4 more."""
    work, row = _rope(get_stack("torchtitan").compiled(True))
    assert work.rope_bytes == (8192 * 5120 * 16, 8192 * 5120 * 12)
    assert work.rope_kernels == 4 and row is not None and row.forward_s > row.backward_s > 0
    # in fp32 the casts vanish and the multiply moves what the fused kernel would: kernels only
    work, _ = _rope(get_stack("torchtitan").compiled(True), "fp32")
    assert work.rope_bytes == (0.0, 0.0) and work.rope_kernels == 4
    # eager, the rotary is among the eager kernels already; execpar's is real-valued
    assert _rope(get_stack("torchtitan"))[0].rope_kernels == 0
    assert _rope(get_stack("execpar").compiled(True))[0].rope_kernels == 0
    # a model with learned positions rotates nothing
    gpt3 = stack_layer_work(MODELS["gpt3-175b"], 2048, 1, 8, 1, 1, True, True, "bf16", "fused",
                            get_stack("torchtitan").compiled(True))
    assert gpt3.rope_kernels == 0 and gpt3.rope_bytes == (0.0, 0.0)


def test_the_complex_rotary_costs_a_compiled_torchtitan_layer_time():
    def layer_s(stack) -> float:
        work = stack_layer_work(LLAMA_8B, 8192, 1, 1, 1, 1, False, True, "bf16", stack.elementwise,
                                stack)
        return sum(k.forward_s + k.backward_s for k in layer_kernels(work, H100.gpu, "bf16", stack))

    compiled = get_stack("torchtitan").compiled(True)
    real_rotary = replace(compiled, complex_rotary=False)
    assert layer_s(real_rotary) < layer_s(compiled) < layer_s(get_stack("torchtitan"))
