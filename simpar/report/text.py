"""Plain-text rendering of predictions and rankings (JSON comes from the objects' to_dict)."""

from __future__ import annotations

from simpar.memory.model import biggest_part


def table(headers: list[str], rows: list[list], align: str | None = None) -> str:
    """A fixed-width table; `align` has one 'l' or 'r' per column (default: first left,
    rest right)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    align = align or "l" + "r" * (len(headers) - 1)
    lines = []
    for j, r in enumerate(cells):
        lines.append("  ".join(
            c.ljust(w) if a == "l" else c.rjust(w)
            for c, w, a in zip(r, widths, align, strict=True)))
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _a2a_note(s) -> str:
    """How the expert-parallel all-to-alls send tokens, and where a stack's recipes may hide them,
    whether this price does."""
    if s.ep == 1:
        return ""
    sent = ("; all-to-alls send a token once per rank holding its experts, per node across nodes "
            "(flex dispatch, at HybridEP's measured rate inside a Blackwell NVLink domain; "
            "--moe-dispatch alltoall: once per expert)"
            if s.profile.moe_dispatch == "flex" else "; all-to-alls send a token once per expert")
    if not s.profile.ep_overlap:
        return sent
    if s.overlap_ep_comm:
        return sent + " beside another micro-batch's compute (--overlap-ep-comm)"
    return sent + (", exposed (Megatron-Bridge's GB200/GB300 MXFP8 recipes hide them: "
                   "--overlap-ep-comm)")


def _header(p, model, cluster, job) -> str:
    """What was priced: the model, the machine, the job and the strategy as the stack runs it, and
    under them price_notes."""
    s = p.strategy
    zero = f"{s.zero}" if s.optimizer_zero(job.dtype) == s.zero else (
        f"{s.zero} (its BF16_Optimizer shards the optimizer states as ZeRO 1 does)")
    head = (
        f"{model.name} on {s.gpus} x {cluster.gpu.name} ({cluster.name}), seq {job.seq_len}, "
        f"global batch {job.global_batch}, {job.dtype}{_scaling(s, job)}\nstrategy: "
        f"{s.mesh_label}, zero {zero}, "
        f"micro-batch {s.micro_batch} x {p.micro_batches}, schedule {s.schedule_label}, recompute "
        f"{s.recompute_label}, layers/stage {_layers(p.layers_per_stage)}\n")
    return head + "".join(f"{note}\n" for note in price_notes(p, model, cluster, job))


def _scaling(s, job) -> str:
    """How per-tensor fp8 is scaled where the job runs it, for the header ("" otherwise)."""
    if job.dtype != "fp8":
        return ""
    label = s.profile.fp8_scaling_label
    return f" ({label} scaling)" if s.profile.fp8_casts != "torchao" else f" (scaled by {label})"


def era_note(profile) -> str:
    """What an earlier era's profile prices, and which one prices today's release ("" for a
    profile of today's, or one the user's flags already moved to today's attention kernel)."""
    if profile.name in ("megatron-2021", "megatron-2022"):
        return (f"stack: Megatron-LM of {profile.name[-4:]}, as its published runs on V100s and "
                "A100s ran (no Transformer Engine, no fused attention); --stack megatron@2023 (or "
                "mcore) prices today's")
    if profile.name == "deepspeed" and profile.attention == "unfused":
        return ("stack: DeepSpeed as released before v0.6 (2021: each ZeRO-3 weight gathered on "
                "its own and waited for, no fused attention); --stack deepspeed@0.6 prices "
                "today's releases")
    if profile.name == "torchtitan" and profile.attention == "fa2":
        return ("stack: torchtitan of its 2024 benchmarks (FlashAttention-2, foreach AdamW, eager "
                "fp32 loss); --stack torchtitan-0.2 prices today's release")
    return ""


def stack_line(profile) -> str:
    """The stack a ranking priced, for `compare` and `scale` under their titles: its era's note
    where it has one, else its name."""
    return era_note(profile) or f"stack: {profile.name}"


def price_notes(p, model, cluster, job) -> list[str]:
    """What the price assumes where that needs saying (a what-if schedule, an era's stack, fp16
    gradients, experts), one line each; `simulate` prints them under the strategy and lists them
    as its JSON's "notes"."""
    s = p.strategy
    notes = []
    if s.pp > 1 and s.schedule not in s.profile.schedules:
        runs = (f"pipelines with {', '.join(s.profile.schedules)} only" if s.profile.schedules
                else "does not pipeline")
        notes.append(f"schedule: a what-if, {s.profile.name} {runs}")
    if era := era_note(s.profile):
        notes.append(era)
    if p.memory.verdict(cluster.gpu.hbm_gib) == "does not fit":
        name, gib, remedy = biggest_part(p.memory, s.zero)
        notes.append(f"memory: does not fit, {p.memory.total_gib:,.1f} GiB of "
                     f"{cluster.gpu.hbm_gib:.1f}; the biggest part is {name} ({gib:,.1f} GiB): "
                     f"{remedy}; `simpar compare` (same model, GPUs and batch) ranks the "
                     "layouts that fit")
    if s.grad_reduce == "fp16" and s.profile.fp32_grads_bf16_only:  # fp16's, or the user's
        notes.append("gradients: fp16, kept and reduced as Megatron-LM does under --fp16 "
                     "(--grad-reduce fp32 where the recipe passes "
                     "--accumulate-allreduce-grads-in-fp32)")
    if model.is_moe:
        # what the MoE price assumes, and what a stack that does otherwise measured
        folded = (", each whole on its rank, ep cut from tp x dp x cp (--no-fold-experts: split "
                  "over tp)" if s.folds_experts else "")
        groups = (f" from {model.groups_per_token} of {model.expert_groups} groups"
                  if model.expert_groups else "")
        notes.append(f"experts: {model.experts} x top {model.experts_per_token}{groups}{folded}, "
                     f"priced balanced, {_moe_launches(s)}; Megatron-Bridge 25.11's MoE recipes "
                     f"ran up to 1.9x slower than priced (Qwen3-30B-A3B on 16 H100s)"
                     f"{_a2a_note(s)}")
    return notes


def prediction_text(p, model, cluster, job, accuracy=None) -> str:
    """The prediction's header, metrics, phases and memory; `accuracy` (an
    simpar.report.accuracy.AccuracyBand) says under the metrics how far the stack's predictions
    fell from published runs."""
    head = _header(p, model, cluster, job)
    summary = table(["metric", "value"], [
        ["step time", f"{p.step_time_s:.3f} s"],
        ["throughput", f"{p.tokens_per_s:,.0f} tokens/s"],
        ["model TFLOP/s per GPU", f"{p.model_tflops_per_gpu:.1f}"],
        ["MFU / HFU", f"{p.mfu:.1%} / {p.hfu:.1%}"],
        ["pipeline bubble", f"{p.bubble_fraction:.1%}"],
        ["exposed communication", f"{p.exposed_comm_s:.3f} s"],
        ["memory per GPU", f"{p.memory.total_gib:.1f} GiB of {cluster.gpu.hbm_gib:.1f}"
                           + _fit_note(p.memory, cluster.gpu.hbm_gib)],
    ] + ([[f"time to train {job.tokens:.3g} tokens", f"{p.time_to_train_days:.1f} days"]]
         if p.time_to_train_days else []))
    phases = table(["phase (critical path)", "seconds", "share"],
                   [[k, f"{v:.4f}", f"{v / p.step_time_s:.1%}"]
                    for k, v in p.breakdown.items() if v > 0])
    mem = p.memory
    at = {"backward": "at the loss in backward", "backward end": "at the end of backward"}.get(
        mem.peak_phase, "in the optimizer step")
    memory = table(
        [f"memory (stage {mem.stage}, peak {at})", "GiB"],
        [["weights", f"{mem.weights_gib:.2f}"], ["gradients", f"{mem.gradients_gib:.2f}"],
         ["optimizer states", f"{mem.optimizer_gib:.2f}"],
         [
             f"activations (~{mem.inflight_micro_batches} micro-batches in flight)",
             f"{mem.activations_gib:.2f}"
         ], [mem.buffers_label, f"{mem.buffers_gib:.2f}"],
         ["peak allocated", f"{mem.peak_allocated_gib:.2f}"],
         [f"allocator fragmentation ({mem.fragmentation:.1%} of allocated)",
          f"{mem.fragmentation_gib:.2f}"],
         *([["gradients cached by the reduce-scatter stream", f"{mem.cached_gradients_gib:.2f}"]]
           if mem.cached_gradients_gib else []),
         *([["16-bit logits freed at the loss, cached", f"{mem.cached_logits_gib:.2f}"]]
           if mem.cached_logits_gib else []),
         ["peak reserved", f"{mem.peak_reserved_gib:.2f}"],
         ["CUDA context and NCCL", f"{mem.runtime_gib:.2f}"], ["total", f"{mem.total_gib:.2f}"]])
    if accuracy is not None:
        summary += "\n" + accuracy.text()
    return "\n\n".join([head + "\n" + summary, phases, memory])


def _fit_note(mem, limit_gib: float) -> str:
    """Nothing where the peak fits; where only the allocator's expected slack does not, the slack
    it would run under."""
    verdict = mem.verdict(limit_gib)
    if verdict == "tight":
        return f"  TIGHT: {mem.tight_text(limit_gib)}"
    return "" if verdict == "fits" else "  DOES NOT FIT"


def whatif_label(p) -> str:
    """The prediction's what-ifs in words ("none" without any)."""
    s, r = p.strategy, p.replicas
    parts = []
    if s.offload_optimizer:
        parts.append("optimizer offloaded to the host")
    if s.grad_sync == "ps":
        server = f"{s.ps_server_gbps:g} GB/s" if s.ps_server_gbps else "the cluster's NIC"
        parts.append(f"gradients through {s.ps_servers} parameter servers ({server} each)")
    if s.async_sgd:
        parts.append(f"asynchronous SGD, mean staleness {r.staleness_steps:.0f} steps")
    if s.compress == "powersgd":
        parts.append(f"PowerSGD rank {s.compress_rank}")
    elif s.compress == "topk":
        parts.append(f"top-k {s.topk_ratio:g} of the elements")
    elif s.compress != "none":
        parts.append(f"gradients cast to {s.compress}")
    if s.backup_frac and not r.ignored:
        parts.append(f"backup workers: {s.backup_frac:.1%} of {r.count} replicas rounds to none")
    if r.ignored:
        parts.append(
            f"backup workers: each step waits for {r.count - r.ignored} of {r.count} replicas "
            f"({r.gradients_used:.1%} of the batch used)")
    return "; ".join(parts or ["none"])


def whatif_text(p, base) -> str:
    """What the what-ifs do: their settings, then step, communication, memory and
    throughput beside the same strategy without them."""

    def delta(new, old, unit="s"):
        return f"{new:.3f} vs {old:.3f} ({new - old:+.3f} {unit})"

    rows = [[
        "step time, s",
        delta(p.step_time_s, base.step_time_s) + f", {p.step_time_s / base.step_time_s - 1:+.1%}"
    ], ["exposed data-parallel comm, s",
        delta(p.breakdown["dp_comm"], base.breakdown["dp_comm"])],
            ["optimizer, s",
             delta(p.breakdown["optimizer"], base.breakdown["optimizer"])],
            ["memory per GPU, GiB",
             delta(p.memory.total_gib, base.memory.total_gib, "GiB")],
            [
                "throughput, tokens/s", f"{p.tokens_per_s:,.0f} vs {base.tokens_per_s:,.0f} "
                f"({p.tokens_per_s / base.tokens_per_s - 1:+.1%})"
            ]]
    return f"what-if: {whatif_label(p)}\n" + table(["with the what-ifs vs without", "value"], rows)


def _layers(counts) -> str:
    return str(counts[0]) if len(set(counts)) == 1 else "/".join(map(str, counts))


def ranking_text(result, top: int) -> str:
    rows = []
    for i, p in enumerate(result.ranked[:top], 1):
        s = p.strategy
        rows.append([
            i, s.mesh_label, s.zero, f"{s.micro_batch}x{p.micro_batches}", s.schedule_label,
            s.recompute_label, f"{p.step_time_s:.3f}", f"{p.tokens_per_s:,.0f}", f"{p.mfu:.1%}",
            f"{p.memory.total_gib:.1f}", f"{p.bubble_fraction:.1%}", f"{p.exposed_comm_s:.3f}"
        ])
    head = table([
        "#", "mesh", "zero", "mb x M", "schedule", "recompute", "step s", "tokens/s", "MFU",
        "mem GiB", "bubble", "exp.comm s"
    ], rows, "lllrlllrrrrrr"[:12])
    foot = (
        f"\n{result.enumerated} strategies searched in {result.seconds:.2f} s "
        f"({result.priced_per_s:,.0f}/s): {result.out_of_memory} do not fit in memory"
        + (f" ({result.tight} of them only by the allocator's expected slack)"
           if result.tight else "") + ", "
        f"{len(result.ranked) + result.pruned} fit; {len(result.ranked)} priced, {result.pruned} "
        f"pruned (even with free communication they are slower than the top {top}).")
    if result.reranked:
        foot += (f"\nThe event engine re-ranked {result.reranked} (the closed form's top, each "
                 "other schedule's best, and the next ones while the closed form put them under "
                 f"those) in {result.rerank_seconds:.2f} s; --rerank 0 skips it.")
    return head + foot


def _moe_launches(s) -> str:
    """How an MoE strategy's kernels reach the GPU, as priced."""
    prof = s.profile
    if prof.cuda_graphs:
        return "replayed from CUDA graphs"
    wait = (", the experts' after the host waits for their token counts"
            if prof.syncs_moe_host(s.ep > 1) else "")
    return f"every kernel launched by the host{wait}" + (
        " (--cuda-graphs: replayed)" if prof.graphable else "")


def simulation_text(sim, trace: str | None, timeline: str | None) -> str:
    r = sim.first
    lines = [
        f"event engine: {sim.schedule}, {len(sim.step_times_s)} step(s), p50 {sim.p50_s:.3f} s, "
        f"p99 {sim.p99_s:.3f} s, {sim.events:,} events ({sim.events / sim.wall_s:,.0f}/s)"
    ]
    rows = [[i, f"{b:.3f}", f"{r.step_time_s - b:.3f}", f"{b / r.step_time_s:.1%}"]
            for i, b in enumerate(r.stage_busy_s)]
    lines.append(table(["pipeline rank", "busy s", "idle s", "busy"], rows))
    for label, path in (("trace", trace), ("timeline", timeline)):
        if path:
            lines.append(f"{label}: {path}")
    return "\n".join(lines)
