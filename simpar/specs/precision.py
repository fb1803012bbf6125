"""Training precisions: one object per `--dtype`, holding the tensor-core rate its GEMMs
run at and the bytes everything else moves.

Quantized precisions (fp8, mxfp8, nvfp4) run the transformer blocks' GEMMs on narrow inputs
and keep activations, attention, the output layer and the loss in bf16 (Transformer
Engine's recipes; torchao's float8 likewise). Each GEMM input is cast before its GEMM: read
in 16 bits, written in the narrow format with its scales. Per-tensor fp8 writes one copy
(Hopper's fp8 GEMM takes a transposed copy made from it, Blackwell's any layout). Block
scaling runs along the contraction dimension, so an operand the backward uses transposed
needs its own column-wise quantized copy: mxfp8 and nvfp4 write two (Transformer Engine's
MXFP8BlockScaling and NVFP4BlockScaling recipes; NVFP4 also passes the weight-gradient
inputs through a 16-point random Hadamard transform, fused into that quantization, and scales
each tensor once more by its amax, found in a pass of its own)."""

from __future__ import annotations

from dataclasses import dataclass

from simpar.errors import one_of
from simpar.specs.names import canonical


@dataclass(frozen=True)
class Precision:
    name: str
    # the GPU's dense rate its GEMMs run at: fp32, tf32, bf16, fp8 or fp4 (GPUSpec.<rate>_tflops)
    rate: str
    summary: str
    wide: bool = False  # fp32/tf32 training: 4-byte activations, weights and gradients
    # gradients come scaled by a dynamic loss scale (fp16's narrow exponent): the optimizer step
    # first unscales them and checks for inf/nan (LOSS_SCALE_PASSES in simpar/cost/step.py)
    loss_scaled: bool = False
    element_bytes: float = 0.0  # quantized GEMM inputs: bytes per element; 0: not quantized
    block: int = 0  # elements per scale (0: one scale per tensor)
    scale_bytes: float = 0.0  # bytes of one block scale (E8M0 for MX formats, E4M3 for NVFP4)
    copies: int = 1  # quantized copies written per GEMM input (two with block scaling, see above)
    # a second-level fp32 scale per tensor over the block scales (NVFP4), found from the tensor's
    # amax before the cast: one more read of every GEMM input (Stack.amax_pass)
    tensor_scale: bool = False
    # GPU generations with tensor cores for its block scales; (): any with the rate
    archs: tuple[str, ...] = ()

    @property
    def quantized(self) -> bool:
        return self.element_bytes > 0

    @property
    def word_bytes(self) -> int:
        """Bytes per activation element and per 16-bit weight (fp32 in fp32/tf32 training)."""
        return 4 if self.wide else 2

    @property
    def gemm_input_bytes(self) -> float:
        """Bytes per element a GEMM reads, scales included."""
        if not self.quantized:
            return self.word_bytes
        return self.element_bytes + (self.scale_bytes / self.block if self.block else 0.0)

    @property
    def cast_bytes(self) -> float:
        """Bytes moved per GEMM input element by its casts: one 16-bit read, the
        quantized copies written."""
        return 2 + self.copies * self.gemm_input_bytes if self.quantized else 0.0


PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in (
        Precision("bf16", "bf16", "16-bit brain float everywhere"),
        Precision("fp16", "bf16", "16-bit float (with loss scaling), at the bf16 rate",
                  loss_scaled=True),
        Precision("fp8", "fp8",
                  "GEMMs in fp8 with per-tensor (delayed or current) scaling, the rest in bf16",
                  element_bytes=1.0),
        Precision("mxfp8", "fp8",
                  "GEMMs in MXFP8 (fp8 with a power-of-two scale per 32 elements), the rest in "
                  "bf16; Blackwell and MI355X",
                  element_bytes=1.0, block=32, scale_bytes=1.0, copies=2,
                  archs=("blackwell", "cdna4")),
        Precision("nvfp4", "fp4",
                  "GEMMs in NVFP4 (fp4 with an fp8 scale per 16 elements), the rest in bf16; "
                  "Blackwell",
                  element_bytes=0.5, block=16, scale_bytes=1.0, copies=2, archs=("blackwell",),
                  tensor_scale=True),
        Precision("fp32", "fp32", "fp32 everywhere, no tensor cores", wide=True),
        Precision("tf32", "tf32", "fp32 storage, GEMMs on tf32 tensor cores", wide=True),
    )
}


def unquantized(name: str) -> str:
    """The precision a `name` recipe runs its attention and output layer in: bf16 where its GEMMs
    are quantized (see above), itself otherwise."""
    return "bf16" if get_precision(name).quantized else name


# Megatron-Bridge's performance tables name per-tensor fp8 by its scaling: FP8-CS (current
# scaling) and FP8-DS (delayed), as do NeMo 2's recipe names (bf16_with_fp8_current_scaling_mixed);
# the CLI takes the scaling from the name (--fp8-scaling wins), in names.normal_form.
FP8_SCALING_NAMES = {
    "fp8-cs": "current", "fp8-current-scaling": "current",
    "bf16-with-fp8-current-scaling-mixed": "current",
    "fp8-ds": "delayed", "fp8-delayed": "delayed", "fp8-delayed-scaling": "delayed",
    "bf16-with-fp8-delayed-scaling-mixed": "delayed",
}
# The same precisions as other tools write them, in names.normal_form: torch's dtypes,
# Megatron-Bridge's tables (FP8-MX), Lightning's precision flags (bf16-mixed, 16-mixed),
# llm-foundry's (amp_bf16, amp_fp8), NeMo 2's recipes (bf16_with_fp8_mixed, bf16_with_mxfp8_mixed)
# and fp8's element format (e4m3).
PRECISION_ALIASES = {
    "bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
    "float8": "fp8", "fp8-mx": "mxfp8",
    **dict.fromkeys(("amp-bf16", "bf16-mixed", "bf16-true"), "bf16"),
    **dict.fromkeys(("amp-fp16", "16-mixed", "fp16-mixed", "16-true"), "fp16"),
    **dict.fromkeys(("amp-fp8", "fp8-mixed", "bf16-with-fp8-mixed", "fp8-e4m3", "e4m3"), "fp8"),
    **dict.fromkeys(FP8_SCALING_NAMES, "fp8"),
    "bf16-with-mxfp8-mixed": "mxfp8", "bf16-with-nvfp4-mixed": "nvfp4",
}


def precision_name(name: str) -> str:
    """The precision a user's name for it means (names.canonical, with PRECISION_ALIASES), or
    the name as typed for one_of to refuse."""
    return canonical(name, PRECISIONS, PRECISION_ALIASES)


def fp8_scaling_named(name: str) -> str:
    """The per-tensor fp8 scaling a precision's name says (FP8_SCALING_NAMES: `FP8-CS` current,
    `FP8-DS` delayed), or "" where it says none."""
    return FP8_SCALING_NAMES.get(canonical(name, FP8_SCALING_NAMES), "")


def get_precision(name: str) -> Precision:
    try:
        return PRECISIONS[name]
    except KeyError:
        one_of("dtype", name, PRECISIONS)  # raises, naming the choices
        raise
