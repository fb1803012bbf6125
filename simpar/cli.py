"""simpar command line: thin wrappers that parse flags, call one library function and print."""

from __future__ import annotations

import argparse
import json
import sys

from simpar.errors import OneLineParser, SpecError, require, run_command
from simpar.network.algorithms import ALGOS, OPS

_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30,
           "ti": 2.0**40}


_Parser = OneLineParser


def _count(text: str) -> float:
    """'15T', '2.5e12', '300B', '128Mi' -> a number (of tokens or bytes); Ki/Mi/Gi are powers of 2."""
    t = text.strip().lower()
    try:
        for suffix in sorted(_SUFFIX, key=len, reverse=True):
            if t.endswith(suffix):
                return float(t[:-len(suffix)]) * _SUFFIX[suffix]
        return float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: give a number such as 15T or 3e11") from None


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid list {text!r}: give integers separated by commas, e.g. 4,8") from None
    return values


def _add_job_flags(p):
    g = p.add_argument_group("model, hardware and job")
    g.add_argument("--model", required=True, help="catalog name (see `simpar models`), a YAML/JSON file of "
                   "ModelSpec fields, or a Hugging Face config.json")
    g.add_argument("--cluster", help="cluster name (dgx-a100, dgx-h100, dgx-b200) or YAML file of ClusterSpec fields")
    g.add_argument("--gpu", help="GPU catalog name (see `simpar gpus`); alone it means DGX-like nodes of that GPU")
    g.add_argument("--gpus", type=int, required=True, help="number of GPUs in the job")
    g.add_argument("--seq-len", type=int, required=True, help="tokens per sequence")
    g.add_argument("--global-batch", type=int, required=True, help="sequences per optimizer step")
    g.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp8", "fp32", "tf32"],
                   help="GEMM precision (fp8: GEMMs in fp8, the rest in bf16); default bf16")
    g.add_argument("--tokens", type=_count, default=0.0, help="tokens to train (e.g. 15T), for time-to-train")
    g.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    c = p.add_argument_group("capacity: time, money and failures (printed beside the prediction)")
    c.add_argument("--price-per-gpu-hour", type=float, default=0.0, help="price of one GPU-hour, for the cost")
    c.add_argument("--gpu-mtbf-hours", type=float, default=None,
                   help="GPU-hours between GPU failures (default ~86,400: the GPU share of the Llama 3 paper's "
                   "419 interruptions)")
    c.add_argument("--node-mtbf-hours", type=float, default=None,
                   help="node-hours between host, network and software failures (default ~15,300: the rest of them)")
    c.add_argument("--storage-gbps", type=float, default=200.0, help="checkpoint write/read bandwidth, GB/s (default 200)")
    c.add_argument("--restart-min", type=float, default=10.0, help="minutes to restart a job after a failure")
    c.add_argument("--preemptions-per-day", type=float, default=0.0, help="spot preemptions of the job per day")
    n = p.add_argument_group("network model")
    n.add_argument("--network", default="flow", choices=["flow", "alpha-beta"],
                   help="flow: collectives as flows on the cluster's fabric graph, with contention (default); "
                   "alpha-beta: closed forms on the node/NIC bandwidths")
    n.add_argument("--collective-algo", choices=list(ALGOS),
                   help="force one collective algorithm (default: the fastest for each size and group)")
    n.add_argument("--placement", default="tp,cp,dp,pp",
                   help="mesh dimensions from innermost (closest ranks) to outermost; default tp,cp,dp,pp")
    n.add_argument("--routing", default="minimal", choices=["minimal", "valiant"],
                   help="dragonfly routing: minimal (default) or Valiant through a random intermediate group")


def _stage_pairs(text: str, convert):
    """'3:1.5' or '8-15:a100-80gb' -> ((3, 1.5),) / ((8, 'a100-80gb'), ..., (15, ...))."""
    try:
        ranks, value = text.split(":", 1)
        lo, _, hi = ranks.partition("-")
        return tuple((r, convert(value)) for r in range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid {text!r}: give RANK:VALUE or FIRST-LAST:VALUE, e.g. 3:1.5") from None


def _add_sim_flags(p):
    g = p.add_argument_group("event engine (simulate)")
    g.add_argument("--engine", default="event", choices=["event", "analytic"],
                   help="event: play the step as a discrete-event simulation (default); analytic: closed form")
    g.add_argument("--sim-schedule", choices=["gpipe", "1f1b", "interleaved", "zb-h1", "zbv"],
                   help="simulate this pipeline schedule instead of --schedule (zero-bubble ones: event engine)")
    g.add_argument("--steps", type=int, default=1, help="steps to simulate (p50/p99 over them; default 1)")
    g.add_argument("--straggler", type=lambda t: _stage_pairs(t, float), action="append", default=[],
                   help="slow pipeline rank(s) by a factor, e.g. 3:1.3 or 0-1:1.1 (repeatable)")
    g.add_argument("--jitter", type=float, default=0.0, help="sigma of a lognormal slowdown on every compute op")
    g.add_argument("--seed", type=int, default=0, help="random seed for --jitter")
    g.add_argument("--stage-gpu", type=lambda t: _stage_pairs(t, str), action="append", default=[],
                   help="run pipeline rank(s) on another GPU type, e.g. 8-15:a100-80gb (repeatable)")
    g.add_argument("--bucket-mb", type=float, default=25.0, help="gradient bucket size in MiB (default 25, as DDP)")
    g.add_argument("--no-contention", action="store_true", help="transfers on one link do not slow each other")
    g.add_argument("--trace", help="write a Chrome trace (JSON, opens in Perfetto) of the first step")
    g.add_argument("--timeline", help="write a timeline PNG of the first step")


def _sim_options(args):
    from simpar.sim.engine import SimOptions
    from simpar.specs.cluster import resolve_gpu

    require(args.steps > 0, "--steps", args.steps, "must be a positive integer")
    require(args.jitter >= 0, "--jitter", args.jitter, "must be >= 0")
    require(args.bucket_mb > 0, "--bucket-mb", args.bucket_mb, "must be positive")
    stragglers = tuple(p for group in args.straggler for p in group)
    for rank, factor in stragglers:
        require(factor >= 1.0, "--straggler", f"{rank}:{factor}", "the factor is a slowdown: give a value >= 1")
    gpus = tuple(p for group in args.stage_gpu for p in group)
    for _, name in gpus:
        resolve_gpu(name)
    return SimOptions(schedule=args.sim_schedule, steps=args.steps, bucket_bytes=args.bucket_mb * 2**20,
                      stragglers=stragglers, jitter=args.jitter, seed=args.seed, stage_gpus=gpus,
                      contention=not args.no_contention, trace=bool(args.trace or args.timeline))


def _add_strategy_flags(p):
    g = p.add_argument_group("strategy (dp*tp*pp*cp must equal --gpus)")
    g.add_argument("--dp", type=int, help="data-parallel degree (default: --gpus / (tp*pp*cp))")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    g.add_argument("--pp", type=int, default=1, help="pipeline-parallel stages (default 1)")
    g.add_argument("--cp", type=int, default=1, help="context-parallel degree: sequence split for attention")
    g.add_argument("--ep", type=int, default=1, help="expert-parallel degree (MoE), carved out of dp*cp")
    g.add_argument("--zero", type=int, default=0, help="ZeRO stage: 0 DDP, 1 optimizer, 2 +gradients, 3 +weights (FSDP)")
    g.add_argument("--sp", action="store_true", help="sequence parallel inside the tensor-parallel group")
    g.add_argument("--micro-batch", type=int, help="sequences per micro-batch (default 1, or set by --grad-accum)")
    g.add_argument("--schedule", default="1f1b", help="pipeline schedule: gpipe, 1f1b, interleaved (with --vpp), or "
                   "the zero-bubble zb-h1 and zbv (backward split into input and weight gradients); default 1f1b")
    g.add_argument("--vpp", type=int, default=1, help="virtual stages per pipeline rank (interleaved)")
    g.add_argument("--recompute", default="none", help="activation recompute: none, selective (Megatron: attention "
                   "core), op (torchtitan op-level: every second GEMM and the elementwise ops), full")
    g.add_argument("--no-flash-attention", action="store_true", help="unfused attention (stores the s^2 scores)")
    g.add_argument("--kernels", default="fused", choices=["fused", "eager"],
                   help="elementwise kernels: fused (Megatron-LM, Transformer Engine, torch.compile; default) or eager "
                   "PyTorch (torchtitan without compile, Hugging Face: unfused fp32 norms and rotary)")
    g.add_argument("--no-overlap-grad-reduce", action="store_true", help="gradient sync after backward, not during")
    g.add_argument("--overlap-tp-comm", action="store_true", help="hide tensor-parallel collectives behind GEMMs")


def _add_whatif_flags(p):
    g = p.add_argument_group("what-if (each changes how data-parallel replicas share gradients or wait)")
    g.add_argument("--grad-accum", type=int, help="micro-batches accumulated per replica before each optimizer step: "
                   "micro-batch = global batch / (dp x K); DDP syncs once per step, ZeRO-2/3 per micro-batch")
    g.add_argument("--offload-optimizer", action="store_true",
                   help="optimizer states and the Adam step on the host: frees their GPU memory, costs gradients down "
                   "+ weights up over PCIe (host_link_gbps) and the step at host-memory speed")
    g.add_argument("--ps-servers", type=int, help="aggregate gradients on S parameter servers instead of all-reduce: "
                   "push and pull max(grad, weight bytes) at min(GPU NIC, S x server NIC / GPUs) (BytePS)")
    g.add_argument("--ps-server-gbps", type=float, default=0.0,
                   help="NIC bandwidth of one parameter server, GB/s per direction (default: the cluster's per-GPU NIC)")
    g.add_argument("--async-sgd", action="store_true", help="asynchronous SGD on the parameter servers: no barrier, "
                   "push/pull overlap the next step, servers run the optimizer; reports staleness (replicas - 1 steps)")
    g.add_argument("--compress", choices=["fp16", "bf16", "powersgd", "topk"],
                   help="gradient compression: fp16/bf16 cast (2 bytes/element), PowerSGD (r(n+m) per n x m matrix, "
                   "two all-reduces) or top-k (k x (value + int32 index), all-gathered); codec kernels included")
    g.add_argument("--powersgd-rank", type=int, default=4, help="PowerSGD rank r (default 4)")
    g.add_argument("--topk-ratio", type=float, default=0.01, help="share of gradient elements top-k sends (default 0.01)")
    g.add_argument("--backup-workers", type=float, default=0.0, metavar="PCT", help="ignore the slowest PCT%% of "
                   "replicas each step: wait for the (N-b)-th fastest, T(1+delay(H_N-H_b)), using (N-b)/N of the batch")
    g.add_argument("--straggler-delay", type=float, metavar="PCT", help="replica step times vary: each takes T(1+X), "
                   "X exponential with mean PCT%% of T; a synchronous step waits T(1+delay H_N) (default: the cluster's, 0)")


def _whatif_fields(args) -> dict:
    """Strategy fields from the what-if flags."""
    require(args.backup_workers >= 0, "--backup-workers", args.backup_workers, "give a percentage in [0, 100)")
    out = {"offload_optimizer": args.offload_optimizer, "async_sgd": args.async_sgd, "compress": args.compress or "none",
           "compress_rank": args.powersgd_rank, "topk_ratio": args.topk_ratio, "backup_frac": args.backup_workers / 100}
    if args.ps_servers is not None:
        out.update(grad_sync="ps", ps_servers=args.ps_servers, ps_server_gbps=args.ps_server_gbps)
    return out


def _load(args):
    from simpar.specs import JobSpec, load_cluster, load_model

    model = load_model(args.model)
    cluster = load_cluster(args.cluster, args.gpu)
    delay = getattr(args, "straggler_delay", None)
    if delay is not None:
        from dataclasses import replace

        require(delay >= 0, "--straggler-delay", delay, "give a percentage >= 0")
        cluster = replace(cluster, straggler_delay_frac=delay / 100)
    require(args.gpus is not None and args.gpus > 0, "--gpus", args.gpus, "must be a positive integer")
    job = JobSpec(args.seq_len, args.global_batch, args.dtype, args.tokens)
    return model, cluster, job


def _strategy(args):
    from simpar.specs import Strategy

    inner = args.tp * args.pp * args.cp
    require(inner > 0, "--tp*--pp*--cp", inner, "degrees must be positive integers")
    dp = args.dp if args.dp is not None else args.gpus // inner
    if args.dp is None:
        require(args.gpus % inner == 0, "--gpus", args.gpus,
                f"must be divisible by tp*pp*cp = {args.tp}*{args.pp}*{args.cp} = {inner}; change --tp, --pp or --cp")
    return Strategy(dp=dp, tp=args.tp, pp=args.pp, cp=args.cp, ep=args.ep, zero=args.zero, sp=args.sp,
                    micro_batch=_micro_batch(args, dp), schedule=args.schedule, vpp=args.vpp, recompute=args.recompute,
                    flash_attention=not args.no_flash_attention, kernels=args.kernels,
                    overlap_grad_reduce=not args.no_overlap_grad_reduce,
                    overlap_tp_comm=args.overlap_tp_comm, **_whatif_fields(args))


def _micro_batch(args, dp: int) -> int:
    """--micro-batch, or the one --grad-accum implies: global batch = dp x micro-batch x K."""
    k = args.grad_accum
    if k is None:
        return 1 if args.micro_batch is None else args.micro_batch
    require(k > 0, "--grad-accum", k, "must be a positive integer")
    require(args.global_batch % (dp * k) == 0, "--grad-accum", k,
            f"--global-batch {args.global_batch} must be divisible by dp x K = {dp} x {k}")
    mb = args.global_batch // (dp * k)
    require(args.micro_batch in (None, mb), "--micro-batch", args.micro_batch,
            f"--grad-accum {k} implies micro-batch {mb}; drop one of the two")
    return mb


def _net_args(args) -> dict:
    from simpar.network.placement import check_order

    return {"network": args.network, "order": check_order(args.placement.split(",")), "algo": args.collective_algo,
            "valiant": args.routing == "valiant"}


def cmd_topo_show(args) -> int:
    from simpar.network.topology import build
    from simpar.report.text import table
    from simpar.report.topo import draw, summary
    from simpar.specs import load_cluster

    cluster = load_cluster(args.cluster, None)
    fab = build(cluster, args.gpus)
    info = summary(fab)
    png = None if args.no_png else args.png or f"topo-{cluster.name}-{args.gpus}.png"
    if png:
        draw(fab, png)
        info["png"] = png
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    rows = [[k, v] for k, v in info["nodes_by_kind"].items()]
    print(f"{cluster.name}: {fab.kind} for {args.gpus} GPUs ({cluster.gpus_per_node} per node, {cluster.gpu.name})\n")
    print(table(["nodes", "count"], rows))
    print(f"\nlinks (full duplex): {info['links']}\ndiameter: {info['diameter_hops']} hops\n"
          f"bisection bandwidth: {info['bisection_bw_gbps']:,.0f} GB/s per direction (nominal)")
    if png:
        print(f"drawing: {png}")
    return 0


def cmd_collective(args) -> int:
    from simpar.network import collectives as ab
    from simpar.network.model import flow_model
    from simpar.network.placement import span
    from simpar.specs import load_cluster

    cluster = load_cluster(args.cluster, None)
    require(args.gpus >= 2, "--gpus", args.gpus, "a collective needs at least 2 GPUs")
    require(args.size_bytes > 0, "--size-bytes", args.size_bytes, "must be a positive number of bytes")
    n, size = args.gpus, args.size_bytes
    if args.network == "flow" and cluster.topology is not None:
        group = ((0, 1),) if args.op == "p2p" else (tuple(range(n)),)
        t, algo = flow_model(cluster, n, args.routing == "valiant").cost(args.op, size, group, args.algo)
    else:
        t, algo = ab.collective_time(args.op, size, span(n, 1, cluster.gpus_per_node), cluster), "alpha-beta"
    factor = ab.bus_factor(args.op, n)
    out = {"op": args.op, "gpus": n, "size_bytes": size, "algorithm": algo, "time_s": t,
           "algbw_gbps": size / t / 1e9 if t else 0.0, "busbw_gbps": size / t * factor / 1e9 if t else 0.0}
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(f"{args.op} of {size:,.0f} bytes over {n} GPUs of {cluster.name} ({algo}): {t * 1e3:.3f} ms, "
              f"algbw {out['algbw_gbps']:.1f} GB/s, busbw {out['busbw_gbps']:.1f} GB/s")
    return 0


def cmd_plan(args) -> int:
    import os

    from simpar.cost.step import predict
    from simpar.specs import validate
    from simpar.specs.plan import Plan

    model, cluster, job = _load(args)
    strategy = _strategy(args)
    validate(strategy, model, job, args.gpus)
    p = predict(model, cluster, job, strategy, check=False, **_net_args(args))
    prediction = {**p.to_dict(), "capacity": _capacity(args, model, cluster, p)}
    plan = Plan(model, cluster, job, strategy, prediction)
    plan_path, written = args.out, []
    if args.emit:
        from simpar.report.launch import EMITTERS, emit

        kinds = [k.strip() for k in args.emit.split(",")]
        for k in kinds:
            require(k in EMITTERS, "--emit", k, f"choose from {', '.join(EMITTERS)}")
        os.makedirs(args.out, exist_ok=True)
        plan_path = os.path.join(args.out, "plan.json")
    plan.write(plan_path)
    if args.emit:
        written = emit(plan, "plan.json", kinds, args.out)
    if args.json:
        print(json.dumps({"plan": plan_path, "launch_files": written, "prediction": prediction}, indent=1))
    else:
        print(f"wrote {plan_path}: {model.name}, {strategy.gpus} GPUs, dp{strategy.dp} tp{strategy.tp} pp{strategy.pp} "
              f"cp{strategy.cp} zero {strategy.zero}; predicted step {p.step_time_s:.3f} s")
        for w in written:
            print(f"wrote {w}")
        print(_capacity_text(prediction["capacity"]))
    return 0


def _capacity(args, model, cluster, p) -> dict:
    from simpar.capacity.reliability import reliability, time_and_cost

    inputs = _reliability_inputs(args)
    require(args.price_per_gpu_hour >= 0, "--price-per-gpu-hour", args.price_per_gpu_hour, "must be >= 0")
    rel = reliability(model.total_params, p.strategy.gpus, inputs, cluster.gpus_per_node)
    out = {"reliability": rel.to_dict()}
    if args.tokens:
        out["run"] = time_and_cost(args.tokens, p.tokens_per_s, p.strategy.gpus, rel.goodput, args.price_per_gpu_hour)
    return out


def _reliability_inputs(args):
    from simpar.capacity.reliability import GPU_MTBF_HOURS, NODE_MTBF_HOURS, ReliabilityInputs

    return ReliabilityInputs(gpu_mtbf_hours=args.gpu_mtbf_hours or GPU_MTBF_HOURS,
                             node_mtbf_hours=args.node_mtbf_hours or NODE_MTBF_HOURS, storage_gbps=args.storage_gbps,
                             restart_min=args.restart_min, preemptions_per_day=args.preemptions_per_day)


def _capacity_text(cap: dict) -> str:
    r = cap["reliability"]
    lines = [f"failures: job MTBF {r['job_mtbf_hours']:.1f} h, checkpoint {r['checkpoint_gib']:,.0f} GiB written in "
             f"{r['checkpoint_write_s']:.0f} s, every {r['checkpoint_interval_s'] / 60:.0f} min (Young/Daly); "
             f"goodput {r['goodput']:.1%}"]
    if "run" in cap:
        t = cap["run"]
        cost = f", cost {t['cost']:,.0f}" if t["cost"] is not None else ""
        lines.append(f"token budget: {t['ideal_days']:.1f} days without failures, {t['wall_clock_days']:.1f} days "
                     f"with them, {t['gpu_hours']:,.0f} GPU-hours{cost}")
    return "\n".join(lines)


def cmd_simulate(args) -> int:
    from dataclasses import replace

    from simpar.report.text import prediction_text, simulation_text, whatif_text
    from simpar.specs import validate

    model, cluster, job = _load(args)
    strategy = _strategy(args)
    validate(strategy, model, job, args.gpus)
    opts = _sim_options(args)
    for rank, _ in opts.stragglers + opts.stage_gpus:
        require(rank < strategy.pp, "--straggler/--stage-gpu", rank, f"pipeline ranks are 0..{strategy.pp - 1}")
    p, sim = _predict_one(args, model, cluster, job, strategy, opts)
    if sim and (args.trace or args.timeline):
        from simpar.sim.trace import write_timeline, write_trace

        title = f"{model.name} {strategy.gpus} GPUs dp{strategy.dp} tp{strategy.tp} pp{strategy.pp} ({sim.schedule})"
        if args.trace:
            write_trace(sim.trace_events(), title, args.trace)
        if args.timeline:
            write_timeline(sim.trace_events(), title, args.timeline)
    base = None  # the same strategy without the what-ifs, to show their effect
    if strategy != strategy.without_whatifs():
        base, _ = _predict_one(args, model, cluster, job, strategy.without_whatifs(), replace(opts, trace=False))
    cap = _capacity(args, model, cluster, p)
    if args.json:
        doc = p.to_dict()
        if sim:
            doc["simulation"] = sim.to_dict()
        if base:
            doc["without_whatifs"] = {k: getattr(base, k) for k in ("step_time_s", "tokens_per_s", "exposed_comm_s")}
            doc["without_whatifs"]["memory_gib"] = base.memory.total_gib
        doc["capacity"] = cap
        print(json.dumps(doc, indent=1))
    else:
        print(prediction_text(p, model, cluster, job))
        if base:
            print("\n" + whatif_text(p, base))
        if sim:
            print("\n" + simulation_text(sim, args.trace, args.timeline))
        print("\n" + _capacity_text(cap))
    return 0


def _predict_one(args, model, cluster, job, strategy, opts):
    """(prediction, simulation or None): the closed form, replaced by the event engine's step unless
    --engine analytic."""
    from simpar.cost.step import predict, with_simulation

    net = _net_args(args)
    p = predict(model, cluster, job, strategy, check=False, **net)
    if args.engine != "event":
        return p, None
    from simpar.sim.engine import simulate

    sim = simulate(model, cluster, job, strategy, opts, net["network"], net["order"], net["algo"])
    return with_simulation(p, sim), sim


def cmd_compare(args) -> int:
    from simpar.report.text import ranking_text, whatif_label
    from simpar.search.rank import search

    counts = args.gpus
    args.gpus = counts[0]
    model, cluster, job = _load(args)
    require(args.top > 0, "--top", args.top, "must be a positive integer")
    space = _search_space(args)
    if len(counts) > 1 or args.pareto:
        return _compare_counts(args, model, cluster, job, counts, space)
    progress = None if args.json else (lambda n: print(f"  ... {n} strategies priced", file=sys.stderr))
    require(args.mem_limit_gib is None or args.mem_limit_gib > 0, "--mem-limit-gib", args.mem_limit_gib,
            "must be a positive number of GiB")
    require(args.rerank >= 0, "--rerank", args.rerank, "must be >= 0")
    result = search(model, cluster, job, args.gpus, space, progress=progress, mem_limit_gib=args.mem_limit_gib,
                    rerank=args.rerank, **_net_args(args))
    if args.json:
        print(json.dumps(result.to_dict(args.top), indent=1))
        return 0
    print(f"{model.name} on {args.gpus} x {cluster.gpu.name} ({cluster.name}), seq {job.seq_len}, "
          f"global batch {job.global_batch}, {job.dtype}: fastest strategies that fit in memory\n")
    if result.ranked and result.ranked[0].strategy != result.ranked[0].strategy.without_whatifs():
        print(f"what-if on every candidate (as for #1): {whatif_label(result.ranked[0])}\n")
    print(ranking_text(result, args.top))
    if not result.ranked:
        hint = result.best_out_of_memory
        extra = f" (the smallest needs {hint.memory.total_gib:.1f} GiB)" if hint else ""
        limit = args.mem_limit_gib or cluster.gpu.hbm_gib
        print(f"\nNo strategy fits in {limit:.1f} GiB{extra}: add GPUs, shorten --seq-len or use a larger GPU.")
        return 1
    return 0


def _search_space(args):
    from simpar.search.space import SearchSpace
    from simpar.specs import Strategy

    whatif = _whatif_fields(args)
    Strategy(**whatif)  # one-line errors for bad what-if values before the search
    zero = args.zero or (0, 1, 2, 3)
    if whatif.get("grad_sync") == "ps" or whatif["backup_frac"] > 0 or whatif["compress"] in ("powersgd", "topk"):
        require(0 in zero, "--zero", args.zero, "these what-ifs need whole gradients per replica: include ZeRO stage 0")
        zero = (0,)
    require(args.grad_accum is None or args.grad_accum > 0, "--grad-accum", args.grad_accum, "must be a positive integer")
    from simpar.specs.strategy import RECOMPUTE

    for r in args.recompute:
        require(r in RECOMPUTE, "--recompute", r, f"choose from {', '.join(RECOMPUTE)}")
    return SearchSpace(tp=args.tp, pp=args.pp, cp=args.cp, zero=zero, recompute=args.recompute,
                       accumulation=args.grad_accum, overrides=tuple(whatif.items()) + (("kernels", args.kernels),))


def _compare_counts(args, model, cluster, job, counts, space) -> int:
    from simpar.capacity.counts import compare_counts, pareto_plot
    from simpar.report.text import table

    require(all(n > 0 for n in counts), "--gpus", counts, "give positive GPU counts")
    inputs = _reliability_inputs(args)
    rows = compare_counts(model, cluster, job, counts, inputs, args.price_per_gpu_hour, args.objective, space=space,
                          rerank=args.rerank, mem_limit_gib=args.mem_limit_gib, **_net_args(args))
    if args.pareto:
        require(bool(job.tokens), "--pareto", args.pareto, "needs --tokens (time to train) to place the points")
        tokens = next((f"{job.tokens / u:g}{s}" for u, s in ((1e12, "T"), (1e9, "B")) if job.tokens >= u), f"{job.tokens:g}")
        pareto_plot(rows, args.pareto, f"{model.name} on {cluster.name}: {tokens} tokens, seq {job.seq_len}, "
                    f"global batch {job.global_batch}")
    if args.json:
        print(json.dumps({"objective": args.objective, "rows": rows, "pareto_png": args.pareto}, indent=1))
        return 0
    out = [[r["gpus"], r["strategy"], f"{r.get('tokens_per_s', 0):,.0f}", f"{r.get('goodput', 0):.1%}",
            f"{r['wall_clock_days']:.1f}" if "wall_clock_days" in r else "-",
            f"{r['gpu_hours']:,.0f}" if "gpu_hours" in r else "-",
            f"{r['cost']:,.0f}" if r.get("cost") is not None else "-", "*" if r.get("pareto") else ""] for r in rows]
    print(f"{model.name} on {cluster.name}, ranked by {args.objective}\n")
    print(table(["GPUs", "best strategy", "tokens/s", "goodput", "days", "GPU-hours", "cost", "pareto"], out))
    if args.pareto:
        print(f"\nwrote {args.pareto}")
    return 0


def cmd_validate(args) -> int:
    from simpar.report.validate import compare, validation_chart, validation_text

    if args.sweep:
        from simpar.report.sweep import run_sweep, sweep_text

        require(args.out is not None, "--out", None, "give a folder for the sweep's plans, measurements and report")
        report = run_sweep(args.out, args.nproc_per_node, args.size, args.steps,
                           progress=(lambda *_: None) if args.json else (lambda m: print(m, file=sys.stderr)))
        print(json.dumps(report, indent=1) if args.json else sweep_text(report))
        return 0
    require(args.plan and args.measured, "validate", None, "give PLAN and MEASURED, or --sweep --out DIR")
    report = compare(args.plan, args.measured)
    if args.png:
        validation_chart(report, args.png)
        report["png"] = args.png
    print(json.dumps(report, indent=1) if args.json else validation_text(report))
    return 0


def cmd_scale(args) -> int:
    from simpar.report.scaling import run_scale
    from simpar.report.text import table

    model, cluster, job = _load(args)
    counts = list(args.gpu_list)
    require(all(n > 0 for n in counts), "--gpus", args.gpu_list, "give positive GPU counts, e.g. 8,16,32")
    progress = None if args.json else (lambda n, r: print(f"  {n} GPUs: {r.enumerated} strategies", file=sys.stderr))
    res = run_scale(model, cluster, job, counts, args.weak, args.out, progress, **_net_args(args))
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    rows = [[r["gpus"], r["global_batch"], r["strategy"], f"{r['tokens_per_s']:,.0f}",
             f"{r['efficiency']:.1%}" if r.get("efficiency") else "-"] for r in res["rows"]]
    print(table(["GPUs", "global batch", "best strategy", "tokens/s", "efficiency"], rows))
    print(f"\nwrote {res['csv']} and {res['png']}")
    return 0


def cmd_calibrate(args) -> int:
    import os
    import subprocess

    require(args.nproc_per_node > 0, "--nproc-per-node", args.nproc_per_node, "must be a positive integer")
    try:
        import torch  # noqa: F401
    except ImportError:
        raise SpecError("calibrate", "torch", "needs torch: pip install -e '.[exec]'") from None
    out = os.path.abspath(args.out)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.nproc_per_node}",
           "-m", "execpar.calibrate", "--out", out, "--reps", str(args.reps)] + (["--device", args.device] if args.device else [])
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    code = subprocess.call(cmd, env=env)
    if code == 0 and not args.json:
        print(f"wrote {args.out}: use it as --cluster {args.out}")
    elif code == 0:
        print(json.dumps({"profile": args.out}))
    return code


def cmd_models(args) -> int:
    from simpar.report.text import table
    from simpar.specs import MODELS

    if args.json:
        print(json.dumps({n: {**m.to_dict(), "total_params": m.total_params, "active_params": m.active_params}
                          for n, m in MODELS.items()}, indent=1))
        return 0
    rows = [[m.name, f"{m.total_params / 1e9:.1f}B", f"{m.active_params / 1e9:.1f}B", m.layers, m.hidden,
             f"{m.heads}/{m.kv_heads}", m.ffn_hidden, m.vocab, "swiglu" if m.gated_mlp else "gelu",
             f"{m.experts}x top{m.experts_per_token}" if m.is_moe else "-"] for m in MODELS.values()]
    print(table(["model", "params", "active", "layers", "hidden", "heads/kv", "ffn", "vocab", "mlp", "experts"], rows))
    return 0


def cmd_gpus(args) -> int:
    from simpar.report.text import table
    from simpar.specs import GPUS

    if args.json:
        print(json.dumps({n: g.to_dict() for n, g in GPUS.items()}, indent=1))
        return 0
    rows = [[g.name, g.fp32_tflops, g.tf32_tflops, g.bf16_tflops, g.fp8_tflops or "-", f"{g.hbm_gib:.0f}",
             g.hbm_tbps, f"{g.gemm_efficiency:.0%}"] for g in GPUS.values()]
    print(table(["gpu", "fp32 TF", "tf32 TF", "bf16 TF", "fp8 TF", "HBM GiB", "HBM TB/s", "GEMM eff."], rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="simpar", description="Plan and simulate distributed training of transformers: predict "
                "step time, memory and where the time goes for a parallel strategy, and rank strategies.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    s = sub.add_parser("simulate", help="predict one strategy: step time, breakdown, memory",
                       description="Predict one parallel strategy's step time (with a per-phase breakdown) and per-GPU memory.")
    _add_job_flags(s)
    _add_strategy_flags(s)
    _add_whatif_flags(s)
    _add_sim_flags(s)
    s.set_defaults(func=cmd_simulate)
    pl = sub.add_parser("plan", help="write the chosen strategy as a plan file for execpar",
                        description="Write a self-contained, versioned plan (model, cluster, job, strategy and "
                        "the prediction) for `execpar launch`/`execpar run`.")
    _add_job_flags(pl)
    _add_strategy_flags(pl)
    _add_whatif_flags(pl)
    pl.add_argument("--out", required=True, help="plan file to write (JSON), or a folder with --emit")
    pl.add_argument("--emit", help="also write launch files into the --out folder: torchrun,slurm,k8s")
    pl.set_defaults(func=cmd_plan)
    c = sub.add_parser("compare", help="enumerate, price and rank every strategy that fits in memory",
                       description="Enumerate every valid strategy for --gpus GPUs, drop those that do not fit in "
                       "memory, and rank the rest by predicted throughput.")
    _add_job_flags(c)
    for a in c._actions:
        if a.dest == "gpus":
            a.type, a.help = _int_list, "GPU count, or several (e.g. 1024,2048,4096) to compare counts by --objective"
    c.add_argument("--objective", choices=["throughput", "time", "cost", "goodput"], default="throughput",
                   help="how several GPU counts are ranked (with --tokens for time and cost)")
    c.add_argument("--pareto", help="write a Pareto plot of cost (or GPU-hours) against time-to-train (PNG)")
    c.add_argument("--top", type=int, default=10, help="rows to print (default 10)")
    c.add_argument("--tp", type=_int_list, help="only these tensor-parallel degrees, e.g. 4,8")
    c.add_argument("--pp", type=_int_list, help="only these pipeline degrees")
    c.add_argument("--cp", type=_int_list, help="only these context-parallel degrees")
    c.add_argument("--zero", type=_int_list, help="only these ZeRO stages, e.g. 1,3")
    c.add_argument("--recompute", type=lambda v: tuple(v.split(",")), default=("none", "full"),
                   help="recompute modes to search, from none, selective, op, full (default none,full)")
    c.add_argument("--kernels", default="fused", choices=["fused", "eager"],
                   help="elementwise kernels of the training stack: fused (default) or eager PyTorch")
    c.add_argument("--rerank", type=int, default=5, help="re-rank the analytic top K with the event engine "
                   "(default 5; 0 keeps the analytic ranking)")
    _add_whatif_flags(c)
    c.add_argument("--mem-limit-gib", type=float, help="memory per GPU a strategy may use (default: all of the "
                   "GPU's HBM); lower it to keep headroom for allocator fragmentation")
    c.set_defaults(func=cmd_compare)
    t = sub.add_parser("topo", help="inspect cluster fabrics", description="Inspect a cluster's fabric graph.")
    tsub = t.add_subparsers(dest="topo_command", required=True, parser_class=_Parser)
    ts = tsub.add_parser("show", help="nodes, switches, links, bisection bandwidth, diameter; optional PNG",
                         description="Build CLUSTER's fabric for --gpus GPUs and print its size, bisection "
                         "bandwidth and diameter, and write a drawing (PNG).")
    ts.add_argument("cluster", help="cluster name (see topologies/) or YAML file")
    ts.add_argument("--gpus", type=int, required=True, help="GPUs to build the fabric for")
    ts.add_argument("--png", help="where to write the drawing of the fabric (default topo-CLUSTER-N.png)")
    ts.add_argument("--no-png", action="store_true", help="print only; write no drawing")
    ts.add_argument("--json", action="store_true", help="print JSON")
    ts.set_defaults(func=cmd_topo_show)
    co = sub.add_parser("collective", help="time one collective on a cluster (nccl-tests style)",
                        description="Time one collective over --gpus GPUs (ranks 0..N-1) of a cluster and print "
                        "time, algorithm bandwidth and bus bandwidth (nccl-tests convention).")
    co.add_argument("--cluster", required=True, help="cluster name (see topologies/) or YAML file")
    co.add_argument("--gpus", type=int, required=True, help="GPUs in the collective")
    co.add_argument("--op", default="allreduce", choices=list(OPS), help="collective (default allreduce)")
    co.add_argument("--size-bytes", type=_count, required=True, help="message size in bytes (e.g. 1G = 1e9)")
    co.add_argument("--algo", choices=list(ALGOS), help="force an algorithm (default: the fastest)")
    co.add_argument("--network", default="flow", choices=["flow", "alpha-beta"], help="network model")
    co.add_argument("--routing", default="minimal", choices=["minimal", "valiant"], help="dragonfly routing")
    co.add_argument("--json", action="store_true", help="print JSON")
    co.set_defaults(func=cmd_collective)
    v = sub.add_parser("validate", help="a plan's prediction beside an execpar measurement",
                       description="Put the plan's prediction and an execpar measurement side by side: step time, "
                       "tokens/s, TFLOP/s, memory and the communication/compute split, with relative errors.")
    v.add_argument("plan", nargs="?", help="plan file (simpar plan)")
    v.add_argument("measured", nargs="?", help="measurement file (execpar launch --out)")
    v.add_argument("--sweep", action="store_true", help="calibrate, then plan, run and validate a set of strategies "
                   "of a small model on this machine, and write a report to --out")
    v.add_argument("--out", help="folder for the sweep")
    v.add_argument("--nproc-per-node", type=int, default=2, help="processes for the sweep (default 2)")
    v.add_argument("--size", choices=["tiny", "small"], default="small", help="the sweep's model size")
    v.add_argument("--steps", type=int, default=6, help="steps per run in the sweep")
    v.add_argument("--png", help="write a bar chart of predicted vs measured")
    v.add_argument("--json", action="store_true", help="print JSON")
    v.set_defaults(func=cmd_validate)
    sc = sub.add_parser("scale", help="best strategy and scaling efficiency over GPU counts (PNG + CSV)",
                        description="For each GPU count, rank every strategy and keep the best; plot throughput and "
                        "scaling efficiency (weak: global batch grows with the GPUs; strong: fixed global batch).")
    _add_job_flags(sc)
    sc.set_defaults(gpus=1)
    for a in sc._actions:
        if a.dest == "gpus":
            a.required, a.help = False, argparse.SUPPRESS
    sc.add_argument("--gpu-list", "--counts", dest="gpu_list", type=_int_list, required=True,
                    help="GPU counts, e.g. 64,128,256,512,1024")
    mode = sc.add_mutually_exclusive_group()
    mode.add_argument("--weak", action="store_true", help="weak scaling: --global-batch is for the smallest count")
    mode.add_argument("--strong", action="store_true", help="strong scaling (default): the same global batch")
    sc.add_argument("--out", required=True, help="folder for scaling-<kind>.csv and .png")
    sc.set_defaults(func=cmd_scale)
    ca = sub.add_parser("calibrate", help="measure this machine (GEMMs, bandwidth, collectives) into a cluster profile",
                        description="Run micro-benchmarks through execpar on the machine at hand and write a cluster "
                        "profile (YAML) usable anywhere a --cluster is.")
    ca.add_argument("--nproc-per-node", type=int, required=True, help="processes (devices) to measure with")
    ca.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")
    ca.add_argument("--reps", type=int, default=5, help="repetitions per measurement (default 5)")
    ca.add_argument("--out", required=True, help="profile file to write (YAML)")
    ca.add_argument("--json", action="store_true", help="print JSON")
    ca.set_defaults(func=cmd_calibrate)
    for name, fn, text in (("models", cmd_models, "list built-in models"), ("gpus", cmd_gpus, "list built-in GPUs")):
        q = sub.add_parser(name, help=text, description=text)
        q.add_argument("--json", action="store_true", help="print JSON")
        q.set_defaults(func=fn)
    return p


def main(argv=None) -> int:
    return run_command(build_parser(), argv, "simpar")


if __name__ == "__main__":
    sys.exit(main())
