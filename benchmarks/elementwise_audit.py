"""The memory-bound work of one execpar transformer block, counted op by op, against what simpar
prices for it (stack execpar, bf16).

Runs the block's forward and backward once on the CPU under bf16 autocast, as execpar runs it on a
GPU, and adds up the bytes every aten op reads and writes, leaving out the GEMMs, the attention
kernel, views and the tensors without a token dimension (autocast's casts of the weights and of
their gradients, priced per weight element elsewhere); pick --tokens unlike any of the model's
widths. CUDA
autocast casts the same ops as the CPU's for these blocks, so the count is the GPU's too; only the
time per byte differs. Prints bytes per token, forward and backward, traced and priced, by op.

    python benchmarks/elementwise_audit.py --model benchmarks/data/h100_execpar/m3b.yaml
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import replace

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

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in SKIP or "scaled_dot_product" in name:
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


def traced(model, tokens: int) -> tuple[ByteCount, ByteCount]:
    """(forward, backward) byte counts of execpar's first block on `tokens` tokens."""
    torch.manual_seed(0)
    block = Transformer(replace(model, layers=1)).layers["0"]
    # the residual stream under autocast is fp32 (the embedding's output and the adds promote)
    x = torch.randn(1, tokens, model.hidden, requires_grad=True)
    fwd, bwd = ByteCount(tokens), ByteCount(tokens)
    with torch.autocast("cpu", dtype=torch.bfloat16), fwd:
        y = block(x)
    with bwd:
        y.backward(torch.randn_like(y))
    return fwd, bwd


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="benchmarks/data/h100_execpar/m1b.yaml", help="model file")
    ap.add_argument("--tokens", type=int, default=1000,
                    help="tokens of the micro-batch (unlike any width of the model)")
    args = ap.parse_args(argv)
    model = load_model(args.model)
    stack = get_stack("execpar")
    work = stack_layer_work(model, args.tokens, 1, 1, 1, 1, False, True, "bf16", stack.elementwise,
                            stack)
    fwd, bwd = traced(model, args.tokens)
    priced = work.elementwise_bytes / args.tokens
    print(f"{model.name}: hidden {model.hidden}, {args.tokens} tokens; bytes per token of one "
          "block's memory-bound kernels")
    print(f"{'':10s} {'traced':>10s} {'priced':>10s} {'ratio':>6s} {'kernels':>8s}")
    for label, count, price, kernels in (("forward", fwd, priced, work.elementwise_kernels),
                                         ("backward", bwd, 2 * priced, None)):
        t = sum(count.bytes.values()) / args.tokens
        print(f"{label:10s} {t:10,.0f} {price:10,.0f} {t / price:6.2f} "
              f"{sum(count.kernels.values()):4d}/{kernels if kernels else '-'}")
    for label, count in (("forward", fwd), ("backward", bwd)):
        top = ", ".join(f"{k} {v / args.tokens:,.0f}" for k, v in count.bytes.most_common(6))
        print(f"  {label} by op (B/token): {top}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
