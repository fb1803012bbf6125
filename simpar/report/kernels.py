"""Where one transformer layer's time goes, kernel by kernel, as the prediction prices it
(`simpar simulate --explain`): each weight GEMM with its shape and rate, the attention core, the
memory-bound kernels, then what the layer adds beyond its kernels: the host's launch wait where
the GPU outruns it, recompute, and the collectives left exposed."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from simpar.cost.layer import (
    Kernel,
    at_step_power,
    layer_cost,
    layer_kernels,
    strategy_head_work,
    strategy_layer_work,
)
from simpar.network.model import DEFAULT_NETWORK, network_for
from simpar.report.text import table
from simpar.specs.precision import unquantized


@dataclass(frozen=True)
class LayerTime:
    """One layer, one micro-batch, one rank."""
    kernels: tuple[Kernel, ...]
    host_wait_forward_s: float  # the pass's compute beyond its kernels: launch-bound host
    host_wait_backward_s: float
    recompute_s: float
    comm_forward_s: float  # tensor-, context- and expert-parallel collectives left exposed
    comm_backward_s: float
    # tensor-core rates over the GPU's sustained ones: the clock its power cap allows this step
    # (GPUSpec.at_tensor_core_share)
    clock_scale: float = 1.0

    @property
    def forward_s(self) -> float:
        return (sum(k.forward_s for k in self.kernels) + self.host_wait_forward_s
                + self.comm_forward_s)

    @property
    def backward_s(self) -> float:
        return (sum(k.backward_s for k in self.kernels) + self.host_wait_backward_s
                + self.recompute_s + self.comm_backward_s)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(forward_s=self.forward_s, backward_s=self.backward_s)
        return d


def layer_time(model, cluster, job, strategy, network=DEFAULT_NETWORK) -> LayerTime:
    s = strategy
    work = strategy_layer_work(model, job, s)
    head = strategy_head_work(model, job, s)
    gpu = at_step_power(work, head, model.layers, cluster.gpu, job.dtype, s.profile, s.recompute)
    net = network_for(cluster, s, network)
    kernels = layer_kernels(work, gpu, job.dtype, s.profile)
    fwd, bwd = layer_cost(work, net, gpu, job.dtype, s.recompute, s.overlap_tp_comm, s.profile,
                          s.selective_modules(model))
    own_wait = bwd.compute_s - sum(k.backward_s for k in kernels)
    # a recompute is priced with its backward, bound by their summed host or device time: what
    # the pair waits for the host beyond the backward's own wait is a wait, not recompute
    recompute_wait = max(0.0, bwd.host_wait_s - own_wait)
    return LayerTime(
        kernels,
        host_wait_forward_s=fwd.compute_s - sum(k.forward_s for k in kernels),
        host_wait_backward_s=own_wait + recompute_wait,
        recompute_s=bwd.recompute_s - recompute_wait,
        comm_forward_s=fwd.tp_comm_s + fwd.cp_comm_s + fwd.ep_comm_s,
        comm_backward_s=bwd.tp_comm_s + bwd.cp_comm_s + bwd.ep_comm_s,
        clock_scale=gpu.gemm_efficiency / cluster.gpu.gemm_efficiency)


def _rate(k: Kernel) -> str:
    if not k.forward_s:
        return ""
    if k.forward_flops:
        return f"{k.forward_flops / k.forward_s / 1e12:,.0f} TFLOP/s"
    return f"{k.forward_bytes / k.forward_s / 1e9:,.0f} GB/s" if k.forward_bytes else ""


def layer_time_text(lt: LayerTime, gpu, dtype: str) -> str:
    """The table `--explain` prints: forward and backward milliseconds, the forward rate (and
    its fraction of the dense peak its kernel runs at: the GEMMs' precision's, 16-bit for
    attention in quantized recipes) and each row's share of the layer."""
    total = lt.forward_s + lt.backward_s
    peaks = {"gemm": gpu.peak_tflops(dtype),
             "attention": gpu.peak_tflops(unquantized(dtype))}
    rows = []
    for k in lt.kernels:
        peak = (f" ({k.forward_flops / k.forward_s / 1e12 / peaks[k.kind]:.0%})"
                if k.kind in peaks and k.forward_flops and k.forward_s else "")
        rows.append([k.name, k.detail, f"{k.forward_s * 1e3:.3f}", f"{k.backward_s * 1e3:.3f}",
                     _rate(k) + peak, f"{(k.forward_s + k.backward_s) / total:.1%}"])
    extra = [("host launch wait", lt.host_wait_forward_s, lt.host_wait_backward_s),
             ("recompute", 0.0, lt.recompute_s),
             ("exposed collectives", lt.comm_forward_s, lt.comm_backward_s)]
    for name, f, b in extra:
        if f or b:
            rows.append([name, "", f"{f * 1e3:.3f}", f"{b * 1e3:.3f}", "",
                         f"{(f + b) / total:.1%}"])
    rows.append(["layer", "", f"{lt.forward_s * 1e3:.3f}", f"{lt.backward_s * 1e3:.3f}", "",
                 "100.0%"])
    text = ("one layer, one micro-batch, per rank\n"
            + table(["kernel", "shape", "forward ms", "backward ms", "forward rate", "share"],
                    rows))
    if lt.clock_scale > 1:
        text += (f"\nGEMMs and attention at {lt.clock_scale:.3f} x the GPU's sustained rate: the "
                 "clock its power cap allows a step this memory-bound")
    return text
