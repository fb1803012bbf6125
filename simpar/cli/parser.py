"""The argument parser of every command, and the entry point."""

from __future__ import annotations

import argparse

from simpar.cli.checks import check_numbers
from simpar.cli.flags import (
    add_job_flags,
    add_sim_flags,
    add_strategy_flags,
    add_whatif_flags,
    count,
    int_list,
    path,
)
from simpar.cli.predict import cmd_compare, cmd_plan, cmd_simulate
from simpar.cli.tools import (
    cmd_calibrate,
    cmd_collective,
    cmd_gpus,
    cmd_models,
    cmd_scale,
    cmd_stacks,
    cmd_topo_show,
    cmd_validate,
)
from simpar.errors import OneLineParser, run_command
from simpar.network.algorithms import ALGOS, OPS


def build_parser(parser_class: type[OneLineParser] = OneLineParser) -> argparse.ArgumentParser:
    """Every command's flags; `parser_class` says what a bad flag does (the CLI: one
    line and exit 2)."""
    p = parser_class(
        prog="simpar",
        description="Plan and simulate distributed training of transformers: predict step time, "
        "memory and where the time goes for a parallel strategy, and rank strategies.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=parser_class)
    _add_simulate(sub)
    _add_plan(sub)
    _add_compare(sub)
    _add_topo(sub, parser_class)
    _add_collective(sub)
    _add_validate(sub)
    _add_scale(sub)
    _add_calibrate(sub)
    _add_listings(sub)
    return p


def _add_simulate(sub) -> None:
    """simpar simulate: one strategy's step time, breakdown and memory."""
    s = sub.add_parser(
        "simulate", help="predict one strategy: step time, breakdown, memory",
        description="Predict one parallel strategy's step time (with a per-phase breakdown) and "
                    "per-GPU memory.")
    add_job_flags(s)
    add_strategy_flags(s)
    add_whatif_flags(s)
    add_sim_flags(s)
    s.add_argument("--explain", action="store_true",
                   help="also show one layer's time kernel by kernel: each GEMM's shape, time and "
                   "rate, the attention core, the memory-bound kernels, host launch wait, "
                   "recompute and exposed collectives (JSON: \"layer\"); on a ZeRO strategy, its "
                   "collectives per step: wire time and its latency, per-rank host lists, GPU "
                   "copies (JSON: \"zero_passes\")")
    s.set_defaults(func=cmd_simulate)


def _add_plan(sub) -> None:
    """simpar plan: write a strategy as a plan file for execpar."""
    pl = sub.add_parser(
        "plan", help="write the chosen strategy as a plan file for execpar",
        description="Write a self-contained, versioned plan (model, cluster, job, strategy and "
        "the prediction) for `execpar launch`/`execpar run`; priced as execpar runs it unless "
        "--stack. A plan execpar would refuse is refused, unless it prices another --stack: "
        "then it is written, saying why, to check against that trainer's log (`simpar validate "
        "PLAN LOG`).")
    pl.set_defaults(stack="execpar")
    add_job_flags(pl)
    add_strategy_flags(pl)
    add_whatif_flags(pl)
    pl.add_argument("--out", required=True, type=path,
                    help="plan file to write (JSON), or a folder with --emit")
    pl.add_argument("--emit",
                    help="also write launch files into the --out folder: torchrun,slurm,k8s")
    pl.add_argument(
        "--force", action="store_true", help="write the plan even when its predicted peak memory "
        "(reserved, with the allocator's fragmentation margin) does not fit the GPU")
    pl.set_defaults(func=cmd_plan)


def _add_compare(sub) -> None:
    """simpar compare: enumerate, price and rank the strategies that fit."""
    c = sub.add_parser(
        "compare", help="enumerate, price and rank every strategy that fits in memory",
        description="Enumerate every valid strategy for --gpus GPUs, drop those that do not fit "
        "in memory, and rank the rest by predicted throughput.")
    add_job_flags(c)
    for a in c._actions:
        if a.dest == "gpus":
            a.type = int_list
            a.help = "GPU count, or several (e.g. 1024,2048,4096) to compare counts by --objective"
    c.add_argument("--objective", choices=["throughput", "time", "cost",
                                           "goodput"], default="throughput",
                   help="how several GPU counts are ranked (with --tokens for time and cost)")
    c.add_argument("--pareto",
                   help="write a Pareto plot of cost (or GPU-hours) against time-to-train (PNG)")
    c.add_argument(
        "--top", type=int, default=10,
        help="rows to print (default 10); the search prices candidates fastest-bound first and "
        "skips those that even with free communication are slower than these")
    _add_search_space_flags(c)
    c.add_argument(
        "--rerank", type=int, default=5, help="re-rank the analytic top K (and each other "
        "schedule's best) with the event engine, then up to K more while the analytic ranking "
        "puts the next candidate under the K-th re-ranked one (default 5; 0 keeps the analytic "
        "ranking)")
    add_whatif_flags(c)
    c.add_argument(
        "--mem-limit-gib", type=float,
        help="memory per GPU a strategy may use (default: all of the GPU's HBM); lower it to keep "
        "headroom for allocator fragmentation")
    c.set_defaults(func=cmd_compare)


def _add_search_space_flags(c) -> None:
    """What compare searches: the degrees, ZeRO stages, shard groups, recompute modes and
    overlaps its candidates may take."""
    c.add_argument("--tp", type=int_list, help="only these tensor-parallel degrees, e.g. 4,8")
    c.add_argument("--pp", type=int_list, help="only these pipeline degrees")
    c.add_argument("--cp", type=int_list, help="only these context-parallel degrees")
    c.add_argument("--zero", type=int_list, help="only these ZeRO stages, e.g. 1,3")
    c.add_argument(
        "--dp-shard", type=int_list, metavar="N,...",
        help="only these hybrid shard groups (HSDP), in dp ranks, 0 for all of dp, e.g. 0,8 "
        "(each that divides a candidate's dp, with ZeRO 1-3); default: all of dp and, for "
        "ZeRO-3, the dp ranks of one node")
    c.add_argument(
        "--recompute", type=lambda v: tuple(v.split(",")), default=("none", "selective", "full"),
        help="recompute modes to search, from none, selective, op, full (default "
             "none,selective,full; selective is what the --stack checkpoints: see simpar stacks)")
    c.add_argument(
        "--recompute-modules", default="", metavar="M[,M...]",
        help="what the selective candidates checkpoint, by Megatron core's --recompute-modules "
        "names (megatron and nemo stacks; see simulate --help), e.g. layernorm,moe_act; "
        "default: the stack's selective, which with flash attention saves nothing and is skipped")
    c.add_argument(
        "--schedules", type=lambda v: tuple(v.split(",")), metavar="NAME,...|all",
        help="pipeline schedules to search (gpipe, 1f1b, interleaved, zb-h1, zbv, dualpipev, "
        "or all); default: those the --stack runs (see simpar stacks), so that no plan names "
        "one its trainer does not have; others are what-ifs")
    c.add_argument(
        "--partial-recompute", action="store_true",
        help="where full recompute fits, recompute only as many layers of each chunk as memory "
        "needs (--recompute-layers): faster, but it fills memory up to the limit, so leave "
        "headroom with --mem-limit-gib")
    c.add_argument("--kernels", choices=["fused", "eager"],
                   help="elementwise kernels: fused or eager PyTorch (default: the --stack's)")
    c.add_argument(
        "--overlap-ep-comm", action="store_true",
        help="price each candidate Megatron core's combined 1F1B can run (--ep > 1, no full "
        "recompute, pp 1 or interleaved) with its expert-parallel all-to-alls hidden behind "
        "another micro-batch's compute (megatron and nemo stacks; see simulate --help)")


def _add_topo(sub, parser_class: type[OneLineParser]) -> None:
    """simpar topo show: a cluster's fabric graph."""
    t = sub.add_parser("topo", help="inspect cluster fabrics",
                       description="Inspect a cluster's fabric graph.")
    tsub = t.add_subparsers(dest="topo_command", required=True, parser_class=parser_class)
    ts = tsub.add_parser(
        "show", help="nodes, switches, links, bisection bandwidth, diameter; optional PNG",
        description="Build CLUSTER's fabric for --gpus GPUs and print its size, bisection "
        "bandwidth and diameter, and write a drawing (PNG).")
    ts.add_argument("cluster", help="cluster name (see topologies/) or YAML file")
    ts.add_argument("--gpus", type=int, required=True, help="GPUs to build the fabric for")
    ts.add_argument("--png", type=path,
                    help="where to write the drawing of the fabric (default topo-CLUSTER-N.png)")
    ts.add_argument("--no-png", action="store_true", help="print only; write no drawing")
    ts.add_argument("--json", action="store_true", help="print JSON")
    ts.set_defaults(func=cmd_topo_show)


def _add_collective(sub) -> None:
    """simpar collective: one collective's time, nccl-tests style."""
    co = sub.add_parser(
        "collective", help="time one collective on a cluster (nccl-tests style)",
        description="Time one collective over --gpus GPUs (ranks 0..N-1) of a cluster and print "
        "time, algorithm bandwidth and bus bandwidth (nccl-tests convention).")
    co.add_argument("--cluster", help="cluster name (see topologies/) or YAML file")
    co.add_argument("--gpu", help="GPU catalog name (see `simpar gpus`); alone it means DGX-like "
                    "nodes of that GPU, as for simulate")
    co.add_argument("--gpus", type=int, required=True, help="GPUs in the collective")
    co.add_argument("--op", default="allreduce", choices=list(OPS),
                    help="collective (default allreduce)")
    co.add_argument("--size-bytes", type=count, required=True,
                    help="message size in bytes (e.g. 1G = 1e9)")
    co.add_argument("--algo", choices=list(ALGOS), help="force an algorithm (default: the fastest)")
    co.add_argument("--network", default="flow", choices=["flow", "alpha-beta"],
                    help="network model")
    co.add_argument("--routing", default="minimal", choices=["minimal", "valiant"],
                    help="dragonfly routing")
    co.add_argument("--json", action="store_true", help="print JSON")
    co.set_defaults(func=cmd_collective)


def _add_validate(sub) -> None:
    """simpar validate: a plan's prediction beside a measurement or a trainer's log."""
    v = sub.add_parser(
        "validate", help="a plan's prediction beside an execpar measurement or a training log",
        description="Put the plan's prediction and an execpar measurement side by side: step "
        "time, tokens/s, TFLOP/s, memory and the communication/compute split, with relative "
        "errors. MEASURED may also be a torchtitan or Megatron(-Bridge) training log of the "
        "plan's strategy (plan it with that --stack): the median step after the first 3, and the "
        "peak memory the trainer printed.")
    v.add_argument("plan", nargs="?", help="plan file (simpar plan)")
    v.add_argument("measured", nargs="?",
                   help="measurement file (execpar launch --out), or a torchtitan or Megatron log")
    v.add_argument(
        "--sweep", action="store_true",
        help="calibrate, then plan, run and validate a set of strategies of a small model on this "
        "machine, and write a report to --out")
    v.add_argument("--out", type=path, help="folder for the sweep")
    v.add_argument("--nproc-per-node", type=int, default=2,
                   help="processes for the sweep (default 2)")
    v.add_argument("--size", choices=["tiny", "small", "1b"], default="small",
                   help="the sweep's model size (1b: a 1B-class Llama at 2K tokens, for a GPU)")
    v.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu",
        help="where the sweep runs: cpu (gloo, fp32) or cuda (NCCL, bf16; compares peak memory too)"
    )
    v.add_argument("--steps", type=int, default=6, help="steps per run in the sweep")
    v.add_argument("--png", type=path, help="write a bar chart of predicted vs measured")
    v.add_argument("--json", action="store_true", help="print JSON")
    v.set_defaults(func=cmd_validate)


def _add_scale(sub) -> None:
    """simpar scale: the best strategy over GPU counts."""
    sc = sub.add_parser(
        "scale", help="best strategy and scaling efficiency over GPU counts (PNG + CSV)",
        description="For each GPU count, rank every strategy and keep the best; plot throughput "
        "and scaling efficiency (weak: global batch grows with the GPUs; strong: fixed global "
        "batch).")
    add_job_flags(sc)
    sc.set_defaults(gpus=1)
    for a in sc._actions:
        if a.dest == "gpus":
            a.required, a.help = False, argparse.SUPPRESS
    sc.add_argument("--gpu-list", "--counts", dest="gpu_list", type=int_list, required=True,
                    help="GPU counts, e.g. 64,128,256,512,1024")
    mode = sc.add_mutually_exclusive_group()
    mode.add_argument("--weak", action="store_true",
                      help="weak scaling: --global-batch is for the smallest count")
    mode.add_argument("--strong", action="store_true",
                      help="strong scaling (default): the same global batch")
    sc.add_argument("--out", required=True, type=path,
                    help="folder for scaling-<kind>.csv and .png")
    sc.set_defaults(func=cmd_scale)


def _add_calibrate(sub) -> None:
    """simpar calibrate: measure this machine into a cluster profile."""
    ca = sub.add_parser(
        "calibrate",
        help="measure this machine (GEMMs, bandwidth, collectives) into a cluster profile",
        description="Run micro-benchmarks through execpar on the machine at hand and write a "
        "cluster profile (YAML) usable anywhere a --cluster is.")
    ca.add_argument("--nproc-per-node", type=int, required=True,
                    help="processes (devices) to measure with")
    ca.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")
    ca.add_argument("--reps", type=int, default=5, help="repetitions per measurement (default 5)")
    ca.add_argument("--out", required=True, type=path, help="profile file to write (YAML)")
    ca.add_argument(
        "--model", help="also time every GEMM shape and the causal attention of this model's "
        "step (catalog name or file): predictions with the profile use the measured times")
    ca.add_argument("--seq-len", type=int, default=2048,
                    help="sequence length of --model's GEMMs and attention (default 2048)")
    ca.add_argument("--micro-batch", type=int, default=1,
                    help="largest micro-batch to time --model's GEMMs and attention at")
    ca.add_argument(
        "--soak", action="store_true",
        help="a GPU's GEMMs also run back to back for seconds, to the rate its power cap holds: "
        "the profile then prices GEMM-heavy steps (fused stacks, 85%% or more in GEMMs) at that "
        "sustained rate, rising towards the burst rate as a step gets memory-bound. Leave it off "
        "for eager steps such as execpar's, whose GEMMs ran at the burst rate on an H100 and an "
        "H200 (reports/gpu-validation-*)")
    ca.add_argument("--json", action="store_true", help="print JSON")
    ca.set_defaults(func=cmd_calibrate)


def _add_listings(sub) -> None:
    """simpar models, gpus, stacks: the built-in catalogs."""
    for name, fn, text in (("models", cmd_models, "list built-in models"),
                           ("gpus", cmd_gpus, "list built-in GPUs"),
                           ("stacks", cmd_stacks, "list the software stack profiles --stack "
                            "chooses among (kernels, attention, loss, ZeRO-3, defaults)")):
        q = sub.add_parser(name, help=text, description=text)
        q.add_argument("--json", action="store_true", help="print JSON")
        q.set_defaults(func=fn)


def main(argv=None) -> int:
    return run_command(build_parser(), argv, "simpar", check=check_numbers)
