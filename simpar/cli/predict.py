"""Commands that predict: simulate one strategy, write a plan, compare strategies or GPU counts."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from simpar.cli.capacity import capacity, capacity_text, reliability_inputs
from simpar.cli.flags import (
    compiled,
    default_grad_reduce,
    load_specs,
    module_names,
    net_args,
    sim_options,
    stack_profile,
    strategy_from,
    whatif_fields,
)
from simpar.errors import SpecError, require
from simpar.files import make_folder, strict_json
from simpar.report.accuracy import AccuracyBand, band_for


@dataclass(frozen=True)
class Simulated:
    """What `simpar simulate` predicts: the step (closed form, or the event engine's
    when it ran), the event engine's own result, the same strategy without its what-ifs,
    and failures, time and cost."""
    model: Any  # the specs it was priced for (ModelSpec, ClusterSpec, JobSpec)
    cluster: Any
    job: Any
    prediction: Any  # simpar.cost.step.Prediction
    simulation: Any  # simpar.sim.engine.SimulationResult, or None with engine "analytic"
    without_whatifs: Any  # a Prediction, or None when the strategy has no what-if
    capacity: dict
    layer: Any = None  # simpar.report.kernels.LayerTime with --explain
    zero_passes: tuple = ()  # simpar.report.dpsync.ZeroPass rows with --explain (sharded runs)
    # how far the stack's predictions fell from published runs of such models, where known
    accuracy: AccuracyBand | None = None

    def to_dict(self) -> dict:
        """The `--json` document."""
        from simpar.report.text import price_notes

        doc = self.prediction.to_dict()
        # what was priced, as the catalogs name it (a user's spelling or file resolved)
        doc["priced"] = {"model": self.model.name, "cluster": self.cluster.name,
                         "gpu": self.cluster.gpu.name, "seq_len": self.job.seq_len,
                         "global_batch": self.job.global_batch, "dtype": self.job.dtype}
        doc["accuracy"] = self.accuracy.to_dict() if self.accuracy else None
        # what the price assumes, the lines the text prints under the strategy
        doc["notes"] = price_notes(self.prediction, self.model, self.cluster, self.job)
        if self.simulation:
            doc["simulation"] = self.simulation.to_dict()
        if self.without_whatifs:
            base = self.without_whatifs
            doc["without_whatifs"] = {
                k: getattr(base, k) for k in ("step_time_s", "tokens_per_s", "exposed_comm_s")
            }
            doc["without_whatifs"]["memory_gib"] = base.memory.total_gib
        doc["capacity"] = self.capacity
        if self.layer:
            doc["layer"] = self.layer.to_dict()
        if self.zero_passes:
            doc["zero_passes"] = [z.to_dict() for z in self.zero_passes]
        return doc


def _check_drawings(args) -> None:
    """--trace and --timeline draw the event engine's step, each to its own file."""
    for flag, path in (("--trace", args.trace), ("--timeline", args.timeline)):
        if path is not None:
            require(path != "", flag, path, "give a file name")
            require(args.engine == "event", flag, path,
                    "draws the event engine's step: drop --engine analytic")
    require(not args.trace or args.trace != args.timeline, "--timeline", args.timeline,
            "is the --trace file too: give each its own file")


def simulated(args) -> Simulated:
    """Predict (and with --trace/--timeline, draw) the strategy the flags name."""
    from dataclasses import replace

    from simpar.specs import validate

    _check_drawings(args)
    model, cluster, job = load_specs(args)
    strategy = strategy_from(args, cluster.gpu)
    validate(strategy, model, job, args.gpus)
    opts = sim_options(args)
    for rank, _ in opts.stragglers + opts.stage_gpus:
        require(rank < strategy.pp, "--straggler/--stage-gpu", rank,
                f"names a pipeline rank, and --pp {strategy.pp} has ranks 0..{strategy.pp - 1}: "
                "name one of those or raise --pp")
    p, sim = _predict_one(args, model, cluster, job, strategy, opts)
    if sim and (args.trace or args.timeline):
        from simpar.sim.trace import write_timeline, write_trace

        title = f"{model.name} {strategy.gpus} GPUs {strategy.mesh_label} ({sim.schedule})"
        if args.trace:
            write_trace(sim.trace_events(), title, args.trace)
        if args.timeline:
            write_timeline(sim.trace_events(), title, args.timeline)
    base = None  # the same strategy without the what-ifs, to show their effect
    if strategy.has_whatifs:
        base, _ = _predict_one(args, model, cluster, job, strategy.without_whatifs(),
                               replace(opts, trace=False))
    layer = None
    zero: tuple = ()
    if args.explain:
        from simpar.report.dpsync import zero_passes
        from simpar.report.kernels import layer_time

        layer = layer_time(model, cluster, job, strategy, net_args(args))
        zero = zero_passes(model, cluster, job, strategy, net_args(args))
    return Simulated(model, cluster, job, p, sim, base, capacity(args, model, cluster, job, p),
                     layer, zero, band_for(strategy.profile.name, model.is_moe, strategy.cp))


def eager_fp8_note(strategy, dtype: str) -> None:
    """On stderr: an fp8 plan whose torchao casts run eager (measured slower than bf16)."""
    prof = strategy.profile
    if prof.torchao_fp8(dtype) and not prof.compile:
        print(f"note: {prof.name} runs fp8 through torchao, whose casts run eager without "
              "--compile (ten kernels each, per GEMM operand): on an H200 such steps took 1.46x "
              "a bf16 step's, compiled 0.88x (reports/gpu-validation-h200-fp8); add --compile",
              file=sys.stderr)


def cmd_simulate(args) -> int:
    from simpar.report.text import prediction_text, simulation_text, whatif_text

    out = simulated(args)
    eager_fp8_note(out.prediction.strategy, out.job.dtype)
    if args.json:
        print(strict_json(out.to_dict()))
        return 0
    print(prediction_text(out.prediction, out.model, out.cluster, out.job, out.accuracy))
    if out.layer:
        from simpar.report.kernels import layer_time_text

        print("\n" + layer_time_text(out.layer, out.cluster.gpu, out.job.dtype))
    if out.zero_passes:
        from simpar.report.dpsync import zero_passes_text

        print("\n" + zero_passes_text(out.zero_passes))
    if out.without_whatifs:
        print("\n" + whatif_text(out.prediction, out.without_whatifs))
    if out.simulation:
        print("\n" + simulation_text(out.simulation, args.trace, args.timeline))
    print("\n" + capacity_text(out.capacity))
    return 0


def _predict_one(args, model, cluster, job, strategy, opts):
    """(prediction, simulation or None): the closed form, replaced by the event engine's step unless
    --engine analytic."""
    from simpar.cost.step import predict, with_simulation

    net = net_args(args)
    p = predict(model, cluster, job, strategy, check=False, network=net)
    if args.engine != "event":
        return p, None
    from simpar.sim.engine import simulate

    sim = simulate(model, cluster, job, strategy, opts, net)
    return with_simulation(p, sim), sim


@dataclass(frozen=True)
class Planned:
    """What `simpar plan` wrote: the plan, its path, the launch files beside it and the
    prediction."""
    plan: Any  # simpar.specs.plan.Plan
    path: str
    launch_files: list[str]
    accuracy: AccuracyBand | None = None  # the stack's band, also in the plan's prediction
    # why execpar would refuse the plan, which then records another stack's prediction only
    not_runnable: str | None = None

    def to_dict(self) -> dict:
        """The `--json` document."""
        return {
            "plan": self.path, "launch_files": self.launch_files,
            "prediction": self.plan.prediction, "not_runnable": self.not_runnable
        }


def planned(args) -> Planned:
    """Price the strategy the flags name and write it as a plan (refused when it does
    not fit, unless --force)."""
    import os

    from simpar.cost.step import predict
    from simpar.specs import validate
    from simpar.specs.plan import Plan

    model, cluster, job = load_specs(args)
    strategy = strategy_from(args, cluster.gpu)
    validate(strategy, model, job, args.gpus)
    not_runnable = runnable_or_why(strategy, model, job, emit=args.emit is not None)
    p = predict(model, cluster, job, strategy, check=False, network=net_args(args))
    if not p.fits_memory and not args.force:  # a plan that would run out of memory is not written
        from simpar.memory.model import does_not_fit

        raise SpecError("predicted peak memory", f"{p.memory.total_gib:.1f} GiB per GPU",
                        does_not_fit(p.memory, cluster.gpu.hbm_gib, cluster.gpu.name,
                                     p.strategy.zero))
    band = band_for(strategy.profile.name, model.is_moe, strategy.cp)
    prediction = {**p.to_dict(), "capacity": capacity(args, model, cluster, job, p),
                  "accuracy": band.to_dict() if band else None}
    plan = Plan(model, cluster, job, strategy.pinned(), prediction)
    plan_path, written = args.out, []
    if args.emit is not None:
        from simpar.report.launch import EMITTERS, emit

        kinds = [k.strip() for k in args.emit.split(",")]
        for k in kinds:
            require(k in EMITTERS, "--emit", k, f"choose from {', '.join(EMITTERS)}")
        make_folder(args.out, "--out")
        plan_path = os.path.join(args.out, "plan.json")
    plan.write(plan_path)
    if args.emit is not None:
        written = emit(plan, "plan.json", kinds, args.out)
    return Planned(plan, plan_path, written, band, not_runnable)


def runnable_or_why(strategy, model, job, *, emit: bool) -> str | None:
    """A plan is what execpar runs: refuse one it would refuse (check_runnable), unless the plan
    prices another stack, whose run it records for `simpar validate` against that trainer's log
    (then: why execpar would refuse it; execpar checks again before it starts). Launch files
    (--emit) are for execpar, so they need a runnable plan."""
    from simpar.specs.runnable import check_runnable

    try:
        check_runnable(strategy, model, job)
    except SpecError as exc:
        if strategy.stack == "execpar" or emit:
            raise
        return str(exc)
    return None


def cmd_plan(args) -> int:
    out = planned(args)
    eager_fp8_note(out.plan.strategy, out.plan.job.dtype)
    if args.json:
        print(strict_json(out.to_dict()))
        return 0
    s, prediction = out.plan.strategy, out.plan.prediction
    shard = f"/{s.dp_shard}" if s.dp_shard else ""
    print(f"wrote {out.path}: {out.plan.model.name}, {s.gpus} GPUs, dp{s.dp}{shard} tp{s.tp} "
          f"pp{s.pp} cp{s.cp} zero {s.zero}; predicted step {prediction['step_time_s']:.3f} s")
    if out.not_runnable:
        print(f"simpar: execpar would not run this plan ({out.not_runnable}); it records the "
              f"{s.stack} prediction, to validate against that trainer's log "
              "(`simpar validate PLAN LOG`)", file=sys.stderr)
    if out.accuracy:
        print(out.accuracy.text())
    for w in out.launch_files:
        print(f"wrote {w}")
    print(capacity_text(prediction["capacity"]))
    return 0


@dataclass(frozen=True)
class Compared:
    """What `simpar compare` ranks for one GPU count: the search (ranked strategies and
    its counts) and failures, time and cost of the fastest."""
    model: Any
    cluster: Any
    job: Any
    result: Any  # simpar.search.rank.SearchResult
    capacity: dict | None  # None when nothing fits
    top: int

    def to_dict(self) -> dict:
        """The `--json` document."""
        return {**self.result.to_dict(self.top), "capacity": self.capacity}


def compared(args, progress: bool = False) -> Compared:
    """Rank every strategy for the one GPU count of --gpus; `progress`: a line on stderr while the
    search runs longer than a second."""
    from simpar.search.rank import search

    require(len(args.gpus) == 1 and not args.pareto, "--gpus", ",".join(map(str, args.gpus)),
            "give one GPU count here (`simpar compare --gpus A,B,...` compares several)")
    args.gpus = args.gpus[0]
    model, cluster, job = load_specs(args)
    _check_mem_limit(args, cluster)
    space = _search_space(args)
    result = search(model, cluster, job, args.gpus, space, progress=progress,
                    mem_limit_gib=args.mem_limit_gib, rerank=args.rerank, network=net_args(args),
                    keep=args.top)
    fixed = space.restrictions()
    require(
        result.enumerated > 0, "--gpus", args.gpus,
        f"no strategy with {fixed} places on these GPUs: each degree must divide --gpus, tp also "
        f"the model's {model.heads} heads and {model.kv_heads} KV heads; change them or leave them "
        "out"
        if fixed else
        f"no split of {args.gpus:,} GPUs runs a global batch of {job.global_batch:,} sequences "
        "(every data-parallel rank needs whole ones, and tp, pp and cp are bounded by the model); "
        "give fewer GPUs or a larger --global-batch")
    # failures, and with --tokens the time and cost of the run, for the fastest strategy
    best = capacity(args, model, cluster, job, result.ranked[0]) if result.ranked else None
    return Compared(model, cluster, job, result, best, args.top)


def cmd_compare(args) -> int:
    from simpar.report.text import ranking_text, stack_line, whatif_label

    if len(args.gpus) > 1 or args.pareto:
        counts, args.gpus = args.gpus, args.gpus[0]
        model, cluster, job = load_specs(args)
        _check_mem_limit(args, cluster)
        return _compare_counts(args, model, cluster, job, counts, _search_space(args))
    out = compared(args, progress=not args.json)
    _require_a_fit(args, out)
    if args.json:
        print(strict_json(out.to_dict()))
        return 0
    model, cluster, job, result, best = out.model, out.cluster, out.job, out.result, out.capacity
    print(f"{model.name} on {args.gpus} x {cluster.gpu.name} ({cluster.name}), seq {job.seq_len}, "
          f"global batch {job.global_batch}, {job.dtype}: fastest strategies that fit in memory")
    if result.ranked:  # the software priced, and which profile prices another era's
        print(stack_line(result.ranked[0].strategy.profile))
    print()
    if result.ranked and result.ranked[0].strategy.has_whatifs:
        print(f"what-if on every candidate (as for #1): {whatif_label(result.ranked[0])}\n")
    print(ranking_text(result, args.top))
    if best:
        print("\n#1 " + capacity_text(best))
    return 0


def _require_a_fit(args, out: Compared) -> None:
    """One line, as for any request that cannot be met, when no strategy fits in memory."""
    if out.result.ranked:
        return
    hint = out.result.best_out_of_memory
    extra = f" (the smallest needs {hint.memory.total_gib:.1f} GiB)" if hint else ""
    limit = args.mem_limit_gib or out.cluster.gpu.hbm_gib
    raise SpecError("--gpus", args.gpus, f"no strategy fits in {limit:.1f} GiB per GPU{extra}: "
                    "add GPUs, shorten --seq-len or use a larger GPU")


def _check_mem_limit(args, cluster) -> None:
    """--mem-limit-gib narrows the search below the GPU's memory; above it, plans would not fit."""
    limit, hbm = args.mem_limit_gib, cluster.gpu.hbm_gib
    require(
        limit is None or limit <= hbm, "--mem-limit-gib", limit,
        f"is above {cluster.gpu.name}'s {hbm:.1f} GiB: give at most {hbm:.1f}, or leave it out to "
        "use all of it")


def _search_space(args):
    from simpar.search.space import SearchSpace
    from simpar.specs import Strategy
    from simpar.specs.stack import get_stack
    from simpar.specs.strategy import ZERO_STAGES, check_ep_overlap_precision

    whatif = whatif_fields(args)
    zero = args.zero or ZERO_STAGES
    # also one-line errors for bad what-if values before the search
    if Strategy(**whatif).needs_whole_gradients:
        require(0 in zero, "--zero", args.zero,
                "these what-ifs need whole gradients per replica: include ZeRO stage 0")
        zero = (0,)
    overlap_ep = getattr(args, "overlap_ep_comm", False)
    require(not overlap_ep or get_stack(args.stack).ep_overlap, "--overlap-ep-comm", True,
            f"{args.stack} has no combined 1F1B schedule (Megatron core's): use --stack megatron "
            "or nemo, or drop it")
    check_ep_overlap_precision(overlap_ep, args.dtype)
    return SearchSpace(tp=args.tp, pp=args.pp, cp=args.cp, zero=zero, recompute=args.recompute,
                       recompute_modules=module_names(getattr(args, "recompute_modules", "")),
                       schedules=getattr(args, "schedules", None), overlap_ep_comm=overlap_ep,
                       dp_shard=getattr(args, "dp_shard", None),
                       partial_recompute=getattr(args, "partial_recompute", False),
                       accumulation=args.grad_accum,
                       overrides=tuple(whatif.items()) + stack_overrides(args))


def stack_overrides(args) -> tuple:
    """The stack every candidate is priced with, and the kernels, loss, optimizer, gradient
    precision, norms, attention kernel, fp8 scaling, fp8 gathers, kept pipeline outputs, MoE
    dispatch and expert folding when the user names them."""
    named = (("stack", args.stack), ("compile", compiled(args)),
             ("cuda_graphs", getattr(args, "cuda_graphs", False)))
    # scale has no --kernels
    given = [(k, getattr(args, k, None))
             for k in ("kernels", "loss", "optimizer", "norm", "attention",
                       "fp8_scaling", "fp8_all_gather", "pipeline_outputs", "moe_dispatch",
                       "fold_experts")] + [("grad_reduce", default_grad_reduce(args))]
    return named + tuple((k, v) for k, v in given if v not in (None, ""))


def _compare_counts(args, model, cluster, job, counts, space) -> int:
    from simpar.capacity.counts import compare_counts, pareto_plot
    from simpar.report.text import stack_line, table

    inputs = reliability_inputs(args)
    rows = compare_counts(model, cluster, job, counts, inputs, args.price_per_gpu_hour,
                          args.objective, space=space, rerank=args.rerank,
                          mem_limit_gib=args.mem_limit_gib, network=net_args(args))
    if args.pareto:
        require(bool(job.tokens), "--pareto", args.pareto,
                "needs --tokens (time to train) to place the points")
        tokens = next((f"{job.tokens / u:g}{s}"
                       for u, s in ((1e12, "T"), (1e9, "B")) if job.tokens >= u), f"{job.tokens:g}")
        pareto_plot(
            rows, args.pareto,
            f"{model.name} on {cluster.name}: {tokens} tokens, seq {job.seq_len}, global batch "
            f"{job.global_batch}")
    if args.json:
        print(strict_json({"objective": args.objective, "rows": rows, "pareto_png": args.pareto}))
        return 0
    out = [[
        r["gpus"], r["strategy"], f"{r.get('tokens_per_s', 0):,.0f}", f"{r.get('goodput', 0):.1%}",
        f"{r['wall_clock_days']:.1f}" if "wall_clock_days" in r else "-",
        f"{r['gpu_hours']:,.0f}" if "gpu_hours" in r else "-",
        f"{r['cost']:,.0f}" if r.get("cost") is not None else "-", "*" if r.get("pareto") else ""
    ] for r in rows]
    print(f"{model.name} on {cluster.name}, ranked by {args.objective}")
    print(stack_line(stack_profile(args)) + "\n")
    print(
        table(
            ["GPUs", "best strategy", "tokens/s", "goodput", "days", "GPU-hours", "cost", "pareto"],
            out,
        )
    )
    if args.pareto:
        print(f"\nwrote {args.pareto}")
    return 0
