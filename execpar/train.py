"""Run a plan: build the model, parallelize it as the plan says, train, measure, write
measured.json.

Started by torchrun (RANK, WORLD_SIZE, LOCAL_RANK in the environment); one process per device."""

from __future__ import annotations

import faulthandler
import math
import os
import platform
import resource
import signal
import statistics
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.autograd import DeviceType
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from execpar import checkpoint
from execpar.config import RunConfig
from execpar.data import Batches
from execpar.groups import close_process_group
from execpar.mesh import (
    Meshes,
    MeshShape,
    build_mesh,
    check_on_device,
    check_supported,
    scaled,
)
from execpar.model import StepAutocast, Transformer, loss_fn
from execpar.parallelize import (
    apply_activation_offload,
    apply_compile,
    apply_cp,
    apply_dp,
    apply_ep,
    apply_float8,
    apply_recompute,
    apply_tp,
    check_bf16_reduce,
    clip_gradients,
    context_shards,
    make_optimizer,
    precompute_float8_scales,
    sync_expert_grads,
    uses_fsdp,
)
from execpar.pipeline import build_schedule, split_for_rank, without_outputs
from simpar.errors import SpecError, require
from simpar.files import write_json
from simpar.progress import Progress
from simpar.report.profiled import COMM_KEYS, seconds_by_kind
from simpar.specs.plan import load_plan
from simpar.specs.precision import get_precision
from simpar.workload import flops


def run(cfg: RunConfig) -> dict | None:
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    # `kill -USR1 <pid>` prints where every thread of a stuck rank is, without stopping it
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    plan = load_plan(cfg.plan)
    model_spec, job = scaled(plan, cfg.overrides)
    s = plan.strategy
    check_supported(s, model_spec, job)
    shape = MeshShape(s.pp, s.dp, s.tp, s.ep, s.cp, s.dp_shard)
    shape.check(world)
    if job.global_batch % (s.dp * s.micro_batch):
        raise SpecError("--global-batch", job.global_batch,
                        f"must be divisible by dp*micro_batch = {s.dp * s.micro_batch}")
    batches = Batches(model_spec.vocab, job.seq_len, job.global_batch, cfg.seed, cfg.data)
    device_type = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    device = torch.device("cpu")
    if device_type == "cuda":
        device = torch.device(device_type, torch.cuda.current_device())
    check_on_device(s, job, gpu=device.type == "cuda")
    _check_fp8(job.dtype, device)
    check_bf16_reduce(s, nccl=device.type == "cuda")
    backend = "nccl" if device_type == "cuda" else "gloo"
    _init_process_group(backend, rank, world, timedelta(seconds=cfg.timeout_s))
    try:
        result = _train(cfg, plan, model_spec, job, s, shape, batches, device, backend, rank, world)
        # no rank tears its groups down while another still has a collective in flight
        dist.barrier()
        return result
    finally:
        close_process_group()


def _check_fp8(dtype: str, device) -> None:
    """fp8 GEMMs need fp8 tensor cores on a GPU (CPUs run torch._scaled_mm in software)."""
    if dtype != "fp8" or device.type != "cuda":
        return
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        raise SpecError(
            "dtype", dtype, f"{torch.cuda.get_device_name(device)} (sm_{major}{minor}) has no fp8 "
            "tensor cores (sm_89 and later: L40S, H100, H200, B200); plan with --dtype bf16")


def _init_process_group(backend: str, rank: int, world: int, timeout: timedelta) -> None:
    """Join the job's store under a prefix of this attempt: after torchrun restarts a
    failed job, the store still holds the old attempt's process-group addresses, which
    the new groups must not read."""
    if "MASTER_ADDR" not in os.environ:
        dist.init_process_group(backend, timeout=timeout)
        return
    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "False") == "True"
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                         is_master=rank == 0 and not agent_hosts, timeout=timeout)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(backend, store=dist.PrefixStore(f"execpar/attempt-{attempt}", base),
                            rank=rank, world_size=world, timeout=timeout)


def _bucket_mb(s, job) -> float:
    """DDP's bucket size: the one simpar priced the plan with."""
    from simpar.memory.model import state_bytes_per_param

    gb = state_bytes_per_param(job.dtype, s.profile)[1]
    return s.bucket_params(gb) * gb / 2**20


@dataclass(frozen=True)
class Trainer:
    """What a rank trains with, built once: the mesh, its chunks of the model parallelized
    in the plan's order, the optimizer, the pipeline schedule, and the precision context."""
    mesh: Meshes
    model: torch.nn.Module  # the rank's chunk, or a ModuleList of its chunks
    optimizer: torch.optim.Optimizer
    schedule: Any  # a torch.distributed.pipelining schedule, or None without pipeline parallelism
    autocast: Any
    experts: dict  # expert-parallel weights by name (apply_ep)
    first: bool  # holds the first chunk (takes the tokens)
    last: bool  # holds the last chunk (computes the loss)
    compute: torch.dtype
    micro_batches: int
    # fp16's dynamic loss scale (_loss_scaler), None in bf16 and fp32
    scaler: Any = None
    # fp8 weights FSDP gathers in fp8: their scales are found after each optimizer step
    fp8_gathers: bool = False


def _build(cfg, spec, job, s, shape, device) -> Trainer:
    mesh = build_mesh(shape, device.type)
    # the same initial weights on every rank, as in the single-process run
    torch.manual_seed(cfg.seed)
    with torch.device(device):
        model = Transformer(spec)
    pp_rank = mesh["pp"].get_local_rank()
    chunk_ids, modules = split_for_rank(model, s.pipeline, pp_rank, s.pp,
                                        s.vpp) if s.pp > 1 else ([0], [model])
    chunks = s.pp * s.chunks_per_rank
    compute = _compute_dtype(cfg.dtype, job.dtype, device)
    mixed = compute if compute != torch.float32 else None
    fsdp = uses_fsdp(s, mixed=mixed is not None)
    fp8_gathers = fsdp and s.profile.gathers_fp8_weights(job.dtype, s.shards_parameters)
    experts: dict = {}
    # fp8 linears, tensor, context, expert parallel, recompute, compile, data parallel, by chunk
    for i, module in enumerate(modules):
        if job.dtype == "fp8":
            apply_float8(module, fsdp_all_gather=fp8_gathers)
        if s.tp > 1:
            apply_tp(module, mesh["tp"], s.sp)
        if s.cp > 1:
            apply_cp(module, mesh["cp"], job.seq_len)
        if s.ep > 1:
            experts.update(apply_ep(module, mesh["ep"]))
        apply_recompute(module, s.recompute, s.recompute_layers)
        if s.compile:
            apply_compile(module)
        apply_activation_offload(module, s.offload_activations, device)
        modules[i] = apply_dp(module, mesh.replicas, s, bucket_mb=_bucket_mb(s, job),
                              mixed=mixed, ignore=tuple(experts), shard_mesh=mesh.sharding)
    whole: torch.nn.Module = modules[0] if len(modules) == 1 else torch.nn.ModuleList(modules)
    # FSDP casts parameters itself; everything else runs under autocast
    autocast = StepAutocast(device.type, compute, whole) if mixed and not fsdp else _null()
    m = s.micro_batches(job.global_batch)
    scaler = _loss_scaler(compute, device)
    schedule = None
    if s.pp > 1:
        schedule = build_schedule(modules, chunk_ids, chunks, mesh["pp"].get_group(), device,
                                  s.pipeline, m, _scaled(loss_fn, scaler))
    optimizer = make_optimizer(whole, s, mesh.replicas, cfg.lr, fsdp=fsdp)
    return Trainer(mesh, whole, optimizer, schedule, autocast, experts, 0 in chunk_ids,
                   chunks - 1 in chunk_ids, compute, m, scaler, fp8_gathers)


def _loss_scaler(compute: torch.dtype, device):
    """fp16 training's dynamic loss scale: small gradients underflow fp16's narrow exponent
    unless the loss is scaled up first. torch's ShardedGradScaler all-reduces its inf/nan flag
    over every rank (the default group), so all ranks skip the same steps whatever shard of the
    gradients each holds (FSDP, TP, pipeline stages, experts)."""
    if compute != torch.float16:
        return None
    scaler = ShardedGradScaler(device=device.type)
    # the scale exists on every rank from the start, also on pipeline stages that never see the
    # loss yet receive gradients scaled by it
    scaler.scale(torch.ones((), device=device))
    return scaler


def _scaled(fn, scaler):
    """The loss function a pipeline schedule calls and runs backward from: scaled under fp16."""
    if scaler is None:
        return fn
    return lambda output, target: scaler.scale(fn(output, target))


def _step(t: Trainer, cfg, s, x, y, device) -> float:
    """One optimizer step on this rank's batch; the step's mean loss over every rank."""
    with t.autocast:
        if t.schedule is not None:
            mb_losses: list = []
            args = (x,) if t.first else ()
            t.schedule.step(*args, target=y if t.last else None,
                            losses=mb_losses if t.last else None, **without_outputs(t.schedule))
            local = torch.zeros((), device=device)
            if t.last:
                local = torch.stack(mb_losses).mean().detach()
                if t.scaler is not None:  # the schedule kept the scaled losses
                    local = local / t.scaler.get_scale()
        else:
            local = _accumulate(t.model, x, y, t.micro_batches, t.scaler)
    if t.experts:
        sync_expert_grads(t.experts, t.mesh["edp"], s.dp)
    if t.scaler is not None:
        t.scaler.unscale_(t.optimizer)  # clipping and the step see the true gradients
    if cfg.clip > 0:
        clip_gradients(t.model, cfg.clip, t.mesh["pp"], t.experts.values(),
                       t.mesh["ep"] if t.experts else None)
    if t.scaler is None:
        t.optimizer.step()
    else:
        _scaled_step(t.scaler, t.optimizer)
    if t.fp8_gathers:
        precompute_float8_scales(t.model)
    t.optimizer.zero_grad(set_to_none=True)
    return _global_loss(local, t.last, device)


def _train(cfg, plan, spec, job, s, shape, batches, device, backend, rank, world):
    t = _build(cfg, spec, job, s, shape, device)
    # the lock is held until the run ends (a name keeps it alive)
    held = checkpoint.lock_in_job(cfg.checkpoint_dir, device)  # noqa: F841
    start, losses = 0, []
    identity = checkpoint.run_identity(spec, s, world)
    resume = checkpoint.resume_point(cfg.checkpoint_dir, identity) if cfg.checkpoint_dir else None
    if resume is not None:
        start, path = resume
        # the measurement needs a timed step after the resumed one (it wrote a null step time)
        require(start < cfg.steps, "--steps", cfg.steps,
                f"the checkpoint in --checkpoint-dir resumes after step {start}: give more than "
                f"{start} (steps count from the run's start)")
        losses = checkpoint.load(path, t.model, t.optimizer, t.scaler, **_ep_split(t))
    times, split = _loop(cfg, t, s, batches, device, rank, world, start, losses,
                         identity=identity)
    checksum = checkpoint.parameter_checksum(t.model, t.mesh, t.experts.values())
    peaks = _peak_memory(device)
    if rank != 0:
        return None
    result = measurement(
        cfg, plan, spec, job, s, times, losses, peaks, backend, device, world, t.compute
    )
    result.update(parameter_checksum=checksum, resumed_from_step=start, breakdown=split,
                  loss_scale=t.scaler.get_scale() if t.scaler is not None else None)
    if cfg.out:
        write_json(cfg.out, result, "--out")
    return result


def _loop(cfg, t: Trainer, s, batches, device, rank, world, start: int,
          losses: list, *, identity: dict) -> tuple[list, dict | None]:
    """Steps `start` to the last: each timed between barriers; `losses` grows by each step's loss.
    The seconds of each step, and with --profile the last step's communication/compute split;
    checkpoints record `identity`, the run they belong to."""
    times, split = [], None
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    # on stderr, for runs over a second
    progress = Progress("execpar steps", cfg.steps) if rank == 0 else None
    for step in range(start, cfg.steps):
        if step == cfg.fail_at_step and rank == cfg.fail_rank and not restarted:
            # a killed rank: no cleanup, as a crash would leave it
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = (v.to(device) for v in batches.local(step, t.mesh.data.get_local_rank(), s.dp))
        if s.cp > 1:
            x, y = context_shards(t.mesh["cp"], x, y)
        profiling = cfg.profile and step == cfg.steps - 1 and cfg.steps > 1
        profiler = _profiler(device) if profiling else _null()
        dist.barrier()
        t0 = time.perf_counter()
        with profiler:
            loss = _step(t, cfg, s, x, y, device)
        dist.barrier()
        times.append(time.perf_counter() - t0)
        if profiling:
            split = _comm_split(profiler, times[-1])
            del profiler  # release the profiler's threads before the process group goes away
        _check_finite(loss, step, cfg.checkpoint_dir, world)
        losses.append(loss)
        if progress:
            progress.update(step + 1)
        if cfg.checkpoint_every and (step + 1) % cfg.checkpoint_every == 0 and cfg.checkpoint_dir:
            checkpoint.save(cfg.checkpoint_dir, step + 1, t.model, t.optimizer, losses,
                            t.scaler, identity=identity, **_ep_split(t))
    if progress:
        progress.close()
    return times, split


def _ep_split(t: Trainer) -> dict:
    """The expert weights' names and the mesh they are split over, for checkpoints."""
    return {"experts": tuple(t.experts), "ep_mesh": t.mesh["ep"] if t.experts else None}


def _check_finite(loss: float, step: int, checkpoint_dir: str | None, world: int) -> None:
    if not math.isfinite(loss):
        last_good = checkpoint.newest_intact(checkpoint_dir, world)
        where = f"last good checkpoint {last_good[1]}" if last_good else "no checkpoint written"
        raise SpecError("loss", loss,
                        f"is not finite at step {step} ({where}); lower --lr or check the data")


def _profiler(device):
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    return profile(activities=acts)


def _comm_split(prof, step_s: float) -> dict:
    """Seconds of the profiled step in collectives (and waits on them) vs the rest, on
    rank 0's timeline; and the device time by kind of kernel (_kernel_kinds)."""
    events = prof.key_averages()
    comm_us = sum(e.self_device_time_total if e.self_device_time_total else e.self_cpu_time_total
                  for e in events if any(k in e.key.lower() for k in COMM_KEYS))
    comm = min(step_s, comm_us * 1e-6)
    return {"comm_s": comm, "compute_s": step_s - comm, "source": "torch.profiler, last step",
            "kernels": _kernel_kinds(events)}


# device-side records that are no kernel: CUPTI's mark of the host waiting on a full launch
# queue (on an H200, 0.47 s of "device time" inside a 0.44 s step); user annotations such as
# "Optimizer.step#AdamW.step" are told by their is_user_annotation flag
_NOT_KERNELS = ("Command Buffer Full",)


def _kernel_kinds(events) -> dict:
    """Seconds of the profiled step by kind of work: GEMM, attention, collectives and the rest
    (memory-bound: elementwise, reductions, copies), from the GPU's kernels where it has them
    (self device time), else from the CPU's aten ops (self CPU time); and every kernel, longest
    first (what a memory-bound byte count on the GPU needs: the CPU decomposes ops, such as
    RMSNorm, that CUDA runs as one kernel)."""
    gpu = [e for e in events if e.self_device_time_total > 0 and "aten::" not in e.key
           and not getattr(e, "is_user_annotation", False) and e.key not in _NOT_KERNELS
           and e.device_type != DeviceType.CPU]
    rows = [(e.key, e.count, (e.self_device_time_total if gpu else e.self_cpu_time_total) * 1e-6)
            for e in (gpu or [e for e in events if e.key.startswith("aten::")])]
    kinds = seconds_by_kind((name, seconds) for name, _, seconds in rows)
    top = sorted(rows, key=lambda r: -r[2])
    return {**kinds, "source": "gpu kernels" if gpu else "cpu aten ops",
            "top": [{"name": n[:240], "calls": c, "s": s} for n, c, s in top]}


def _compute_dtype(override: str | None, plan_dtype: str, device) -> torch.dtype:
    names = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if override:
        return names[override]
    if device.type == "cuda" and not get_precision(plan_dtype).wide:
        # fp8 plans: bf16 around the fp8 GEMMs of apply_float8's linears
        return torch.float16 if plan_dtype == "fp16" else torch.bfloat16
    return torch.float32


def _scaled_step(scaler, optimizer) -> None:
    """fp16: step unless unscale_ flagged an inf/nan gradient on some rank (it all-reduced the
    flag, so every rank skips alike), then grow or shrink the scale. GradScaler.step would hand
    ShardedGradScaler's one-element flag to fused AdamW, whose 0-dim step counters torch refuses
    to broadcast it into."""
    if not any(float(f.item()) for f in scaler._found_inf_per_device(optimizer).values()):
        optimizer.step()
    scaler.update()


def _accumulate(model, x, y, micro_batches: int, scaler=None) -> torch.Tensor:
    """Gradient accumulation over micro-batches; DDP syncs gradients only on the last one.
    Under fp16 backward runs from the scaled loss; the returned loss is the true one."""
    total = torch.zeros((), device=x.device)
    for i, (xi, yi) in enumerate(zip(x.chunk(micro_batches), y.chunk(micro_batches), strict=True)):
        sync = i == micro_batches - 1
        ctx = model.no_sync() if hasattr(model, "no_sync") and not sync else _null()
        with ctx:
            loss = loss_fn(model(xi), yi) / micro_batches
            (loss if scaler is None else scaler.scale(loss)).backward()
        total += loss.detach()
    return total


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def _global_loss(local: torch.Tensor, holds_loss: bool, device) -> float:
    """Mean loss over the ranks that compute it (the last pipeline stage), which is the
    global mean."""
    if hasattr(local, "full_tensor"):
        local = local.full_tensor()
    t = torch.stack([local.float() * holds_loss, torch.tensor(float(holds_loss), device=device)])
    dist.all_reduce(t)
    return float(t[0] / t[1])


def _peak_memory(device) -> dict[str, list[float]]:
    """Every rank's peak memory in GiB: allocated and reserved by the CUDA caching allocator, or the
    process's resident set on CPU."""
    if device.type == "cuda":
        local: list[float] = [
            torch.cuda.max_memory_allocated(device),
            torch.cuda.max_memory_reserved(device)
        ]
    else:
        # KiB; RSS has no reserve
        local = [resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0] * 2
    mine = torch.tensor(local, dtype=torch.float64, device=device) / 2**30
    gathered = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    return {
        "allocated": [float(t[0]) for t in gathered], "reserved": [float(t[1]) for t in gathered]
    }


def measurement(
    cfg, plan, spec, job, s, times, losses, peaks, backend, device, world, compute_dtype
) -> dict:
    # warm-up steps (and a profiled last step) are left out of the statistics
    kept = times[:-1] if cfg.profile and len(times) > cfg.warmup + 1 else times
    timed = kept[cfg.warmup:] or times or [float("nan")]
    step = statistics.median(timed)
    tokens = job.global_batch * job.seq_len
    model_flops = flops.model_flops_per_token(spec, job.seq_len) * tokens
    peak_flops = plan.cluster.gpu.peak_tflops(job.dtype) * 1e12
    scaled = dict(cfg.overrides)
    return {
        "schema": "execpar-measurement",
        "version": 1,
        "plan": os.path.abspath(cfg.plan),
        "step_time_s": step,
        "step_time_p10_s": _pct(timed, 10),
        "step_time_p90_s": _pct(timed, 90),
        "step_times_s": times,
        "warmup_steps": min(cfg.warmup,
                            len(times) - 1),
        "tokens_per_s": tokens / step,
        "model_tflops_per_gpu": model_flops / step / world / 1e12,
        "mfu": model_flops / (step * world * peak_flops),
        "mfu_peak_source": f"plan: {plan.cluster.gpu.name} {job.dtype}",
        "memory": _memory_doc(peaks, device.type == "cuda"),
        "losses": losses,
        "steps": len(losses),
        "scaled_down": scaled or None,
        "model": spec.to_dict(),
        "strategy": s.to_dict(),
        "seq_len": job.seq_len,
        "global_batch": job.global_batch,
        "compute_dtype": str(compute_dtype).replace("torch.", ""),
        "environment": {
            "torch": torch.__version__, "backend": backend, "device": device.type,
            # the GPU's name (reports name the card they were measured on), or the CPU's
            "device_name": (torch.cuda.get_device_name(device) if device.type == "cuda"
                            else platform.processor() or platform.machine()),
            "world_size": world, "python": platform.python_version(), "host": platform.node(),
            # the allocators' settings the run had (execpar launch sets them: cli.HOST_HEAP_KEPT)
            "allocator": {k: v for k, v in os.environ.items()
                          if k.startswith("MALLOC_") or (k.startswith("PYTORCH_") and "ALLOC" in k)}
        },
    }


def _memory_doc(peaks: dict, cuda: bool) -> dict:
    """On CUDA the allocator's peaks, comparable with the prediction's; on CPU the resident set."""
    doc = {"peak_per_rank_gib": peaks["allocated"], "total_gib": max(peaks["allocated"]),
           "kind": "cuda max allocated" if cuda else "process RSS"}
    if cuda:
        doc.update(peak_allocated_gib=max(peaks["allocated"]),
                   peak_reserved_gib=max(peaks["reserved"]),
                   peak_reserved_per_rank_gib=peaks["reserved"])
    return doc


def _pct(values, q) -> float:
    vals = sorted(values)
    return vals[min(len(vals) - 1, max(0, round(q / 100 * (len(vals) - 1))))]
