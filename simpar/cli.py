"""simpar command line: thin wrappers that parse flags, call one library function and print."""

from __future__ import annotations

import argparse
import json
import sys

from simpar.errors import SpecError, require

_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag on one line and exits 2."""

    def error(self, message):
        sys.stderr.write(f"simpar: error: {message} (see `{self.prog} --help`)\n")
        sys.exit(2)


def _count(text: str) -> float:
    """'15T', '2.5e12', '300B' -> a number of tokens."""
    t = text.strip().lower()
    try:
        return float(t[:-1]) * _SUFFIX[t[-1]] if t and t[-1] in _SUFFIX else float(t)
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


def _add_strategy_flags(p):
    g = p.add_argument_group("strategy (dp*tp*pp*cp must equal --gpus)")
    g.add_argument("--dp", type=int, help="data-parallel degree (default: --gpus / (tp*pp*cp))")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    g.add_argument("--pp", type=int, default=1, help="pipeline-parallel stages (default 1)")
    g.add_argument("--cp", type=int, default=1, help="context-parallel degree: sequence split for attention")
    g.add_argument("--ep", type=int, default=1, help="expert-parallel degree (MoE), carved out of dp*cp")
    g.add_argument("--zero", type=int, default=0, help="ZeRO stage: 0 DDP, 1 optimizer, 2 +gradients, 3 +weights (FSDP)")
    g.add_argument("--sp", action="store_true", help="sequence parallel inside the tensor-parallel group")
    g.add_argument("--micro-batch", type=int, default=1, help="sequences per micro-batch (default 1)")
    g.add_argument("--schedule", default="1f1b", help="pipeline schedule: gpipe, 1f1b, interleaved (default 1f1b)")
    g.add_argument("--vpp", type=int, default=1, help="virtual stages per pipeline rank (interleaved)")
    g.add_argument("--recompute", default="none", help="activation recompute: none, selective, full")
    g.add_argument("--no-flash-attention", action="store_true", help="unfused attention (stores the s^2 scores)")
    g.add_argument("--no-overlap-grad-reduce", action="store_true", help="gradient sync after backward, not during")
    g.add_argument("--overlap-tp-comm", action="store_true", help="hide tensor-parallel collectives behind GEMMs")


def _load(args):
    from simpar.specs import JobSpec, load_cluster, load_model

    model = load_model(args.model)
    cluster = load_cluster(args.cluster, args.gpu)
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
                    micro_batch=args.micro_batch, schedule=args.schedule, vpp=args.vpp, recompute=args.recompute,
                    flash_attention=not args.no_flash_attention, overlap_grad_reduce=not args.no_overlap_grad_reduce,
                    overlap_tp_comm=args.overlap_tp_comm)


def cmd_simulate(args) -> int:
    from simpar.cost.step import predict
    from simpar.report.text import prediction_text
    from simpar.specs import validate

    model, cluster, job = _load(args)
    strategy = _strategy(args)
    validate(strategy, model, job, args.gpus)
    p = predict(model, cluster, job, strategy, check=False)
    print(json.dumps(p.to_dict(), indent=1) if args.json else prediction_text(p, model, cluster, job))
    return 0


def cmd_compare(args) -> int:
    from simpar.report.text import ranking_text
    from simpar.search.rank import search
    from simpar.search.space import SearchSpace

    model, cluster, job = _load(args)
    require(args.top > 0, "--top", args.top, "must be a positive integer")
    space = SearchSpace(tp=args.tp, pp=args.pp, cp=args.cp, zero=args.zero or (0, 1, 2, 3))
    progress = None if args.json else (lambda n: print(f"  ... {n} strategies priced", file=sys.stderr))
    require(args.mem_limit_gib is None or args.mem_limit_gib > 0, "--mem-limit-gib", args.mem_limit_gib,
            "must be a positive number of GiB")
    result = search(model, cluster, job, args.gpus, space, progress=progress, mem_limit_gib=args.mem_limit_gib)
    if args.json:
        print(json.dumps(result.to_dict(args.top), indent=1))
        return 0
    print(f"{model.name} on {args.gpus} x {cluster.gpu.name} ({cluster.name}), seq {job.seq_len}, "
          f"global batch {job.global_batch}, {job.dtype}: fastest strategies that fit in memory\n")
    print(ranking_text(result, args.top))
    if not result.ranked:
        hint = result.best_out_of_memory
        extra = f" (the smallest needs {hint.memory.total_gib:.1f} GiB)" if hint else ""
        limit = args.mem_limit_gib or cluster.gpu.hbm_gib
        print(f"\nNo strategy fits in {limit:.1f} GiB{extra}: add GPUs, shorten --seq-len or use a larger GPU.")
        return 1
    return 0


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
    s.set_defaults(func=cmd_simulate)
    c = sub.add_parser("compare", help="enumerate, price and rank every strategy that fits in memory",
                       description="Enumerate every valid strategy for --gpus GPUs, drop those that do not fit in "
                       "memory, and rank the rest by predicted throughput.")
    _add_job_flags(c)
    c.add_argument("--top", type=int, default=10, help="rows to print (default 10)")
    c.add_argument("--tp", type=_int_list, help="only these tensor-parallel degrees, e.g. 4,8")
    c.add_argument("--pp", type=_int_list, help="only these pipeline degrees")
    c.add_argument("--cp", type=_int_list, help="only these context-parallel degrees")
    c.add_argument("--zero", type=_int_list, help="only these ZeRO stages, e.g. 1,3")
    c.add_argument("--mem-limit-gib", type=float, help="memory per GPU a strategy may use (default: all of the "
                   "GPU's HBM); lower it to keep headroom for allocator fragmentation")
    c.set_defaults(func=cmd_compare)
    for name, fn, text in (("models", cmd_models, "list built-in models"), ("gpus", cmd_gpus, "list built-in GPUs")):
        q = sub.add_parser(name, help=text, description=text)
        q.add_argument("--json", action="store_true", help="print JSON")
        q.set_defaults(func=fn)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SpecError as exc:
        sys.stderr.write(f"simpar: error: {exc}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
