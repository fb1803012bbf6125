"""How fast a GPU runs a mixture-of-experts layer's expert FFN as torch's grouped GEMM
(torch._grouped_mm: execpar's and torchtitan's experts) against a loop of one GEMM per expert,
at the expert shapes of published MoE models, and whether the two agree where the routing gives
the experts row counts that are not multiples of 8 or 16 (no padding).

For each shape: the three grouped GEMMs of a SwiGLU expert FFN (gate and up: rows x hidden by
hidden x ffn; down: rows x ffn by ffn x hidden), each timed alone in the forward, then the whole
FFN forward and forward+backward, grouped and looped. Writes OUT/grouped_gemm.json and prints a
table; `simpar`'s price of the same GEMMs is put beside it by `report`:

    python benchmarks/grouped_gemm.py measure --out DIR     # on the GPU
    python benchmarks/grouped_gemm.py report DIR/grouped_gemm.json [--gpu h200]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import NamedTuple


class Shape(NamedTuple):
    id: str
    hidden: int
    ffn: int
    experts: int  # on the GPU (the model's experts / ep)
    rows: int  # routed rows on the GPU: tokens x top-k x ep


# Published MoE models' expert FFNs at a GPU's share of a recipe's micro-batch (the NeMo and
# Megatron-Bridge performance tables' layouts) and at execpar's single-GPU runs
SHAPES = (
    Shape("qwen3-30b-a3b-ep1-8k", 2048, 768, 128, 8192 * 8),
    Shape("qwen3-30b-a3b-ep8-16k", 2048, 768, 16, 16384 * 8),
    Shape("qwen3-235b-a22b-ep8-4k", 4096, 1536, 16, 4096 * 8),
    Shape("mixtral-8x7b-ep1-8k", 4096, 14336, 8, 8192 * 2),
    Shape("deepseek-v3-ep8-4k", 7168, 2048, 32, 4096 * 8),
    Shape("gpt-oss-120b-ep8-8k", 2880, 2880, 16, 8192 * 4),
)


def counts_for(shape: Shape, seed: int):
    """Row counts per expert as a router gives them: balanced on average, uneven and
    mostly not multiples of 8 (a multinomial draw)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    draw = torch.multinomial(torch.ones(shape.experts), shape.rows, replacement=True,
                             generator=g)
    return torch.bincount(draw, minlength=shape.experts)


def one(shape: Shape, repeats: int) -> dict:
    import torch
    import torch.nn.functional as F
    from fp8_cast import timed  # CUDA events around each call, the median (a script beside this)

    dev, bf = "cuda", torch.bfloat16
    counts = counts_for(shape, seed=len(shape.id)).to(dev)
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    split = counts.tolist()
    e, h, f = shape.experts, shape.hidden, shape.ffn
    x = (torch.randn(shape.rows, h, device=dev) / 4).to(bf).requires_grad_()
    w1, w3 = ((torch.randn(e, h, f, device=dev) / h ** 0.5).to(bf).requires_grad_()
              for _ in range(2))
    w2 = (torch.randn(e, f, h, device=dev) / f ** 0.5).to(bf).requires_grad_()
    grad = torch.randn(shape.rows, h, device=dev, dtype=bf)

    def grouped():
        up = torch._grouped_mm(x, w1, offs=offs)
        return torch._grouped_mm(F.silu(up) * torch._grouped_mm(x, w3, offs=offs), w2, offs=offs)

    def looped():
        outs = []
        for i, chunk in enumerate(x.split(split)):
            outs.append((F.silu(chunk @ w1[i]) * (chunk @ w3[i])) @ w2[i])
        return torch.cat(outs)

    def backward(fn):
        return lambda: torch.autograd.grad(fn(), (x, w1, w2, w3), grad)

    got, want = grouped(), looped()
    grads = [torch.autograd.grad(fn(), (x, w1, w2, w3), grad) for fn in (grouped, looped)]

    def rel(a, b):
        return float((a.float() - b.float()).norm() / b.float().norm())

    mid = torch.randn(shape.rows, f, device=dev, dtype=bf)
    with torch.no_grad():
        gemms = {
            "up": timed(lambda: torch._grouped_mm(x, w1, offs=offs), repeats),
            "down": timed(lambda: torch._grouped_mm(mid, w2, offs=offs), repeats),
        }
        forward = {"grouped": timed(grouped, repeats), "looped": timed(looped, repeats)}
    both = {"grouped": timed(backward(grouped), repeats),
            "looped": timed(backward(looped), repeats)}
    return {**shape._asdict(), "counts_not_multiple_of_8": sum(c % 8 != 0 for c in split),
            "max_rows": max(split), "output_rel_error": rel(got, want),
            "grad_rel_error": max(rel(a, b) for a, b in zip(*grads, strict=True)),
            "up_s": gemms["up"], "down_s": gemms["down"],
            "forward_s": forward, "forward_backward_s": both}


def measure(args) -> int:
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for shape in SHAPES:
        try:
            rows.append(one(shape, args.repeats))
        except Exception as err:  # one shape failing costs the others nothing
            rows.append({**shape._asdict(), "error": f"{type(err).__name__}: {err}"[:300]})
        print(json.dumps(rows[-1]), flush=True)
        torch.cuda.empty_cache()
    body = {"device_name": torch.cuda.get_device_name(), "torch": torch.__version__,
            "shapes": rows}
    tmp = out / "grouped_gemm.json.tmp"
    tmp.write_text(json.dumps(body, indent=1))
    os.replace(tmp, out / "grouped_gemm.json")
    return 0


def report(args) -> int:
    """Measured against simpar's price of the same GEMMs (count = the experts: one GEMM each,
    balanced rows) on the catalog GPU."""
    from simpar import devices
    from simpar.cost.compute import gemm_time
    from simpar.specs.cluster import resolve_gpu
    from simpar.workload.layer import Gemm

    data = json.loads(Path(args.json).read_text())
    gpu = resolve_gpu(args.gpu or devices.catalog_gpu(data["device_name"]) or "h200")
    print(f"{data['device_name']}, torch {data['torch']}, priced on {gpu.name}\n")
    print("| shape | rows/expert | up | priced grouped | one by one | down | priced grouped "
          "| one by one | FFN fwd grouped | looped | fwd+bwd grouped | looped | output err "
          "| grad err |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
          "| ---: | ---: |")
    for r in data["shapes"]:
        if "error" in r:
            print(f"| {r['id']} | {r['error']} |")
            continue
        e, per = r["experts"], r["rows"] // r["experts"]
        cells = [r["id"], str(per)]
        for name, n, k in (("up", r["ffn"], r["hidden"]), ("down", r["hidden"], r["ffn"])):
            priced = [gemm_time(Gemm(name, per, n, k, e, together), gpu, "bf16")
                      for together in (e, 1)]
            cells += [_ms(r[f"{name}_s"]), *(f"{_ms(t)} ({t / r[f'{name}_s'] - 1:+.0%})"
                                               for t in priced)]
        fw, fb = r["forward_s"], r["forward_backward_s"]
        cells += [_ms(fw["grouped"]), _ms(fw["looped"]), _ms(fb["grouped"]), _ms(fb["looped"]),
                  f"{r['output_rel_error']:.1e}", f"{r['grad_rel_error']:.1e}"]
        print("| " + " | ".join(cells) + " |")
    return 0


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="phase", required=True)
    me = sub.add_parser("measure", help="time the shapes (on a CUDA GPU)")
    me.add_argument("--out", required=True)
    me.add_argument("--repeats", type=int, default=10)
    me.set_defaults(func=measure)
    rep = sub.add_parser("report", help="the measurement beside simpar's price")
    rep.add_argument("json")
    rep.add_argument("--gpu", help="catalog GPU to price on (default: the one measured)")
    rep.set_defaults(func=report)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
