"""What a profiled kernel's name says it is: one definition for execpar, which sorts a profiled
step's device time by it (execpar/train.py), and for `simpar validate`, which reads those
measurements back (report/validate.py)."""

from __future__ import annotations

COMM_KEYS = ("c10d", "nccl", "gloo", "allreduce", "all_reduce", "allgather", "all_gather",
             "reduce_scatter", "reducescatter", "broadcast", "send", "recv", "wait")
# checked in this order: fused attention kernels are CUTLASS templates too, so attention comes
# before the GEMM names
KINDS = (("communication", COMM_KEYS),
         ("attention", ("flash", "fmha", "scaled_dot_product", "attention")),
         ("gemm", ("gemm", "xmma", "nvjet", "cutlass", "cublas", "aten::mm", "aten::addmm",
                   "aten::bmm", "aten::baddbmm", "_scaled_mm")))
# torch.compile's pointwise, reduction and persistent-reduction kernels: memory-bound, though
# their names list the ops they fused, "_scaled_mm" among them where a cast feeds an fp8 GEMM
INDUCTOR_KERNELS = ("triton_poi_", "triton_red_", "triton_per_")


def kernel_kind(name: str) -> str:
    """"gemm", "attention", "communication" or "memory_bound" for a GPU kernel's (or an aten
    op's) name."""
    low = name.lower()
    if low.startswith(INDUCTOR_KERNELS):
        return "memory_bound"
    return next((k for k, keys in KINDS if any(w in low for w in keys)), "memory_bound")


def seconds_by_kind(rows) -> dict[str, float]:
    """{kind_s: seconds} of (name, seconds) rows."""
    kinds = dict.fromkeys(("gemm", "attention", "communication", "memory_bound"), 0.0)
    for name, seconds in rows:
        kinds[kernel_kind(name)] += seconds
    return {f"{k}_s": v for k, v in kinds.items()}
