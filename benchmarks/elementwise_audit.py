"""The memory-bound work of one execpar transformer block, counted op by op, against what simpar
prices for it (stack execpar, bf16).

Runs the block's forward and backward once on the CPU under bf16 autocast, as execpar runs it on a
GPU, and adds up the bytes every aten op reads and writes, leaving out the GEMMs, the attention
kernel, views and the tensors without a token dimension (autocast's casts of the weights and of
their gradients, priced per weight element elsewhere); pick --tokens unlike any of the model's
widths. CUDA autocast casts the same ops as the CPU's for these blocks; the norms differ: on CUDA
torch's nn.RMSNorm is one fused kernel each way (aten::_fused_rms_norm, torch >= 2.8), on the CPU
a composite of eager ops, so the count runs each norm as CUDA's kernel moves it (FusedRMSNorm).
Prints bytes per token, forward and backward, traced and priced, by op; --weights bf16 counts the
block over 16-bit weights (FSDP's mixed precision: no fp32 stream).

    python benchmarks/elementwise_audit.py --model benchmarks/data/h100_execpar/m3b.yaml
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import replace
from functools import partial

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from execpar.model import Transformer
from simpar.cost.layer import stack_layer_work
from simpar.specs.loaders import load_model
from simpar.specs.stack import get_stack

# ops that move no bytes of their own (views, allocation, scalars) or that simpar prices
# elsewhere (GEMMs, attention)
SKIP = {
    "view", "_unsafe_view", "t", "transpose", "expand", "as_strided", "slice", "select", "alias",
    "detach", "unsqueeze", "squeeze", "permute", "reshape", "_reshape_alias", "split", "unbind",
    "lift_fresh", "empty_like", "empty", "empty_strided", "new_empty_strided", "zeros", "ones",
    "arange", "split_with_sizes", "new_empty", "full", "scalar_tensor", "_local_scalar_dense",
    "is_same_size", "randn_like", "zeros_like", "ones_like", "new_zeros",
    "mm", "addmm", "bmm", "linear", "matmul", "baddbmm",
}


class ByteCount(TorchDispatchMode):
    """Bytes read and written per aten op, by op name."""

    def __init__(self, tokens: int) -> None:
        super().__init__()
        self.tokens = tokens
        self.bytes: Counter[str] = Counter()
        self.kernels: Counter[str] = Counter()
        self.paused = False  # inside FusedRMSNorm, which counts itself

    def add(self, name: str, nbytes: int, kernels: int) -> None:
        self.bytes[name] += nbytes
        self.kernels[name] += kernels

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if self.paused or name in SKIP or "scaled_dot_product" in name:
            return out
        ins = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        outs = [a for a in tree_flatten(out)[0] if isinstance(a, torch.Tensor)]
        # per-token traffic only: the casts of the weights (forward, once per step) and of their
        # gradients (backward) are priced apart, per weight element
        moved = [t for t in ins + outs if self.tokens in t.shape]
        if moved:
            self.bytes[name] += sum(t.numel() * t.element_size() for t in moved)
            self.kernels[name] += 1
        return out


class FusedRMSNorm(torch.autograd.Function):
    """nn.RMSNorm as CUDA runs it: one kernel forward (reads its input, writes its output), and
    backward an input-gradient kernel (reads the gradient and the input, writes the input's
    gradient) and a weight-gradient one (reads both again): counted as such into the current
    ByteCounts, the ops computing it on the CPU not."""

    counts: tuple[ByteCount, ByteCount] | None = None  # (forward, backward) being counted

    @staticmethod
    def forward(ctx, x, weight, eps):
        fwd, bwd = FusedRMSNorm.counts
        fwd.paused = True
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)
        y = (x * rstd * weight).to(x.dtype)
        fwd.paused = False
        ctx.save_for_backward(x, rstd, weight)
        fwd.add("fused_rms_norm", 2 * x.numel() * x.element_size(), 1)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, rstd, weight = ctx.saved_tensors
        fwd, bwd = FusedRMSNorm.counts
        bwd.paused = True
        normed = x * rstd
        grad_weight = (grad * normed).sum(tuple(range(grad.dim() - 1)))
        scaled = grad * weight
        grad_x = rstd * (scaled - normed * (scaled * normed).mean(-1, keepdim=True))
        bwd.paused = False
        bwd.add("fused_rms_norm_backward", 5 * x.numel() * x.element_size(), 2)
        return grad_x.to(x.dtype), grad_weight.to(weight.dtype), None


def _fused_norm(module: torch.nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
    return FusedRMSNorm.apply(x, module.weight, module.eps or torch.finfo(x.dtype).eps)


def traced(model, tokens: int, weights: torch.dtype = torch.float32
           ) -> tuple[ByteCount, ByteCount]:
    """(forward, backward) byte counts of execpar's first block on `tokens` tokens, under bf16
    autocast over fp32 weights (whose residual stream is fp32: the embedding's output and the
    adds promote to it) or over `weights` 16-bit ones (FSDP's: all of it 16-bit)."""
    torch.manual_seed(0)
    block = Transformer(replace(model, layers=1)).layers["0"].to(weights)
    for norm in (block.attention_norm, block.ffn_norm):
        norm.forward = partial(_fused_norm, norm)
    x = torch.randn(1, tokens, model.hidden, dtype=weights, requires_grad=True)
    fwd, bwd = ByteCount(tokens), ByteCount(tokens)
    FusedRMSNorm.counts = (fwd, bwd)
    with torch.autocast("cpu", dtype=torch.bfloat16), fwd:
        y = block(x)
    with bwd:
        y.backward(torch.randn_like(y))
    return fwd, bwd


def priced(model, tokens: int, fp32_stream: bool = True) -> tuple[float, float, int]:
    """(forward, backward) bytes per token and forward kernels simpar prices for the block's
    memory-bound work (stack execpar): its elementwise kernels (backward twice forward), the fp32
    stream's and the rotary's op-by-op rows."""
    stack = get_stack("execpar")
    work = stack_layer_work(model, tokens, 1, 1, 1, 1, False, True, "bf16", stack.elementwise,
                            stack, zero3=not fp32_stream)
    fwd = work.elementwise_bytes + work.stream_bytes[0] + work.rope_bytes[0]
    bwd = 2 * work.elementwise_bytes + work.stream_bytes[1] + work.rope_bytes[1]
    kernels = work.elementwise_kernels + work.stream_kernels + work.rope_kernels
    return fwd / tokens, bwd / tokens, kernels


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="benchmarks/data/h100_execpar/m1b.yaml", help="model file")
    ap.add_argument("--tokens", type=int, default=1000,
                    help="tokens of the micro-batch (unlike any width of the model)")
    ap.add_argument("--weights", choices=("fp32", "bf16"), default="fp32",
                    help="the block's weights: fp32 under autocast (one GPU, DDP) or bf16 (FSDP)")
    args = ap.parse_args(argv)
    model = load_model(args.model)
    fp32 = args.weights == "fp32"
    fwd, bwd = traced(model, args.tokens, torch.float32 if fp32 else torch.bfloat16)
    price_f, price_b, kernels = priced(model, args.tokens, fp32)
    print(f"{model.name}: hidden {model.hidden}, {args.tokens} tokens, {args.weights} weights; "
          "bytes per token of one block's memory-bound kernels")
    print(f"{'':10s} {'traced':>10s} {'priced':>10s} {'ratio':>6s} {'kernels':>8s}")
    for label, count, price, k in (("forward", fwd, price_f, kernels),
                                   ("backward", bwd, price_b, None)):
        t = sum(count.bytes.values()) / args.tokens
        print(f"{label:10s} {t:10,.0f} {price:10,.0f} {t / price:6.2f} "
              f"{sum(count.kernels.values()):4d}/{k if k else '-'}")
    for label, count in (("forward", fwd), ("backward", bwd)):
        top = ", ".join(f"{k} {v / args.tokens:,.0f}" for k, v in count.bytes.most_common(6))
        print(f"  {label} by op (B/token): {top}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
