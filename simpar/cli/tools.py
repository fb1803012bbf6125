"""Commands around the predictions: fabrics, collectives, validation, scaling,
calibration, catalogs."""

from __future__ import annotations

import sys

from simpar.cli.flags import load_specs, net_args
from simpar.devices import check_device, oversubscribed
from simpar.errors import require
from simpar.files import check_folder, make_folder, strict_json


def cmd_topo_show(args) -> int:
    from simpar.network.topology import MAX_FABRIC_GPUS, build
    from simpar.report.text import table
    from simpar.report.topo import draw, summary
    from simpar.specs import load_cluster

    require(not (args.png and args.no_png), "--png", args.png,
            "asks for a drawing that --no-png turns off: give one of them")
    cluster = load_cluster(args.cluster, None)
    require(
        isinstance(args.gpus, int) and 0 < args.gpus <= MAX_FABRIC_GPUS, "--gpus", args.gpus,
        f"topo show builds and draws each link of the fabric: give 1 to {MAX_FABRIC_GPUS:,} GPUs")
    fab = build(cluster, args.gpus)
    info = summary(fab)
    png = None if args.no_png else args.png or f"topo-{cluster.name}-{args.gpus}.png"
    if png:
        draw(fab, png)
        info["png"] = png
    if args.json:
        print(strict_json(info))
        return 0
    rows = [[k, v] for k, v in info["nodes_by_kind"].items()]
    print(f"{cluster.name}: {fab.kind} for {args.gpus} GPUs ({cluster.gpus_per_node} per node, "
          f"{cluster.gpu.name})\n")
    print(table(["nodes", "count"], rows))
    print(f"\nlinks (full duplex): {info['links']}\ndiameter: {info['diameter_hops']} "
          f"hops\nbisection bandwidth: {info['bisection_bw_gbps']:,.0f} GB/s per direction "
          "(nominal)")
    if png:
        print(f"drawing: {png}")
    return 0


# the largest all-to-all `simpar collective` prices flow by flow on the fabric graph (n^2 flows)
MAX_FLOW_ALLTOALL_GPUS = 2048


def cmd_collective(args) -> int:
    from simpar.network import collectives as ab
    from simpar.network.model import flow_model
    from simpar.network.placement import span
    from simpar.specs import load_cluster

    cluster = load_cluster(args.cluster, args.gpu)
    require(args.gpus >= 2, "--gpus", args.gpus, "a collective needs at least 2 GPUs")
    n, size = args.gpus, args.size_bytes
    if args.network == "flow" and cluster.topology is not None:
        # an all-to-all is a flow between every pair of ranks: 4M at 2,048 GPUs (15 s, 3 GB)
        require(args.op != "alltoall" or n <= MAX_FLOW_ALLTOALL_GPUS, "--gpus", n,
                f"an all-to-all over more than {MAX_FLOW_ALLTOALL_GPUS:,} GPUs is too many flows "
                "for the fabric graph; use --network alpha-beta (its closed form) or fewer GPUs")
        group = ((0, 1),) if args.op == "p2p" else (tuple(range(n)),)
        t, algo = flow_model(cluster, n,
                             args.routing == "valiant").cost(args.op, size, group, args.algo)
    else:
        # the closed forms price one schedule per collective: no algorithm to choose
        model = ("the closed-form model (--network alpha-beta)" if args.network == "alpha-beta"
                 else f"the closed-form model of {cluster.name} (it has no fabric graph)")
        require(args.algo is None, "--algo", args.algo,
                f"{model} prices one schedule per collective; drop --algo, or use "
                "--network flow on a cluster with a topology")
        t = ab.collective_time(args.op, size, span(n, 1, cluster.gpus_per_node), cluster)
        algo = "alpha-beta"
    factor = ab.bus_factor(args.op, n)
    out = {
        "op": args.op, "gpus": n, "size_bytes": size, "algorithm": algo, "time_s": t,
        "algbw_gbps": size / t / 1e9 if t else 0.0,
        "busbw_gbps": size / t * factor / 1e9 if t else 0.0
    }
    if args.json:
        print(strict_json(out))
    else:
        print(f"{args.op} of {size:,.0f} bytes over {n} GPUs of {cluster.name} ({algo}): "
              f"{t * 1e3:.3f} ms, algbw {out['algbw_gbps']:.1f} GB/s, busbw "
              f"{out['busbw_gbps']:.1f} GB/s")
    return 0


def cmd_validate(args) -> int:
    from simpar.report.validate import compare, sweep_text, validation_chart, validation_text

    if args.sweep:
        from simpar.cli.sweep import run_sweep

        require(args.out is not None, "--out", None,
                "give a folder for the sweep's plans, measurements and report")
        check_device(args.device)
        check_folder(args.out, "--out")
        if warning := oversubscribed(args.nproc_per_node, args.device):
            print(f"simpar: {warning}", file=sys.stderr)
        report = run_sweep(
            args.out, args.nproc_per_node, args.size, args.steps, args.device,
            progress=(lambda *_: None) if args.json else (lambda m: print(m, file=sys.stderr)))
        print(strict_json(report) if args.json else sweep_text(report))
        return 0
    require(args.plan and args.measured, "validate", None,
            "give PLAN and MEASURED, or --sweep --out DIR")
    report = compare(args.plan, args.measured)
    if args.png:
        validation_chart(report, args.png)
        report["png"] = args.png
    print(strict_json(report) if args.json else validation_text(report))
    return 0


def cmd_scale(args) -> int:
    from simpar.cli.flags import stack_profile
    from simpar.report.text import stack_line, table

    model, cluster, job = load_specs(args)
    check_folder(args.out, "--out")
    counts = list(args.gpu_list)
    progress = (
        None
        if args.json
        else (lambda n, r: print(f"  {n} GPUs: {r.enumerated} strategies", file=sys.stderr))
    )
    from simpar.cli.predict import stack_overrides
    from simpar.search.space import SearchSpace

    space = SearchSpace(overrides=stack_overrides(args))
    res = {"stack": args.stack, **_scale(args, model, cluster, job, counts, progress, space)}
    if args.json:
        print(strict_json(res))
        return 0
    rows = [[r["gpus"], r["global_batch"], r["strategy"], f"{r['tokens_per_s']:,.0f}",
             f"{r['efficiency']:.1%}" if r.get("efficiency") else "-"] for r in res["rows"]]
    print(stack_line(stack_profile(args)))  # the software priced (and its era's note)
    print(table(["GPUs", "global batch", "best strategy", "tokens/s", "efficiency"], rows))
    print(f"\nwrote {res['csv']} and {res['png']}")
    return 0


def _scale(args, model, cluster, job, counts, progress, space) -> dict:
    """The rows of every count, written as scaling-KIND.csv and .png into --out."""
    from pathlib import Path

    from simpar.capacity.scaling import scaling_rows
    from simpar.report.scaling import write_csv, write_plot

    rows = scaling_rows(model, cluster, job, counts, args.weak, progress, space, net_args(args))
    require(
        any(r["tokens_per_s"] > 0 for r in rows), "--gpu-list", ",".join(map(str, counts)),
        "no strategy fits in memory at any of these GPU counts: give more GPUs, a shorter "
        "--seq-len or a smaller --global-batch (`simpar compare` at one count says what is "
        "biggest)")
    make_folder(args.out, "--out")
    kind = "weak" if args.weak else "strong"
    csv_path, png_path = (
        str(Path(args.out) / f"scaling-{kind}.csv"),
        str(Path(args.out) / f"scaling-{kind}.png"),
    )
    write_csv(rows, csv_path)
    title = (
        f"{model.name} on {cluster.name} ({cluster.gpu.name}), seq {job.seq_len}, {kind} scaling "
        f"({'global batch grows with GPUs' if args.weak else f'global batch {job.global_batch}'})")
    write_plot(rows, png_path, title, args.weak)
    return {"rows": rows, "csv": csv_path, "png": png_path}

def cmd_calibrate(args) -> int:
    import os
    import subprocess

    check_device(args.device)  # torch first: calibrate runs execpar
    if warning := oversubscribed(args.nproc_per_node, args.device):
        print(f"simpar: {warning}", file=sys.stderr)
    from simpar.files import check_writable

    check_writable(args.out, "out")  # before minutes of measuring, not after them
    out = os.path.abspath(args.out)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={args.nproc_per_node}", "-m", "execpar.calibrate", "--out", out,
        "--reps",
        str(args.reps)
    ] + (["--device", args.device] if args.device else []) + (["--soak"] if args.soak else [])
    if args.model:
        from simpar.specs.loaders import load_model

        load_model(args.model)  # a bad model name fails here, in one line, before torchrun starts
        cmd += [
            "--model",
            os.path.abspath(args.model) if os.path.exists(args.model) else args.model, "--seq-len",
            str(args.seq_len), "--micro-batch",
            str(args.micro_batch)
        ]
    from execpar.cli import allocator_env

    # measured under the allocators `execpar launch` runs with (a GEMM's output, page-faulted
    # in anew on a CPU without them, would cost the calibration what the runs do not pay)
    env = allocator_env(dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1")),
                        args.device)
    code = subprocess.call(cmd, env=env)
    if code == 0 and not args.json:
        print(f"wrote {args.out}: use it as --cluster {args.out}")
    elif code == 0:
        print(strict_json({"profile": args.out}))
    return code


def cmd_models(args) -> int:
    from simpar.report.text import table
    from simpar.specs import MODELS

    if args.json:
        print(
            strict_json({
                n: {
                    **m.to_dict(), "total_params": m.total_params, "active_params": m.active_params
                }
                for n, m in MODELS.items()
            }))
        return 0
    rows = [[
        m.name, f"{m.total_params / 1e9:.1f}B", f"{m.active_params / 1e9:.1f}B", m.layers, m.hidden,
        f"{m.heads}/{m.kv_heads}", _attention_kind(m), m.ffn_hidden, m.vocab,
        "gated" if m.gated_mlp else "plain", f"{m.experts}x top{m.experts_per_token}"
        if m.is_moe else "-"
    ] for m in MODELS.values()]
    print(
        table([
            "model", "params", "active", "layers", "hidden", "heads/kv", "attention", "ffn",
            "vocab", "mlp", "experts"
        ], rows))
    print("mlp: gated = three matrices (SwiGLU, GeGLU), plain = two (GELU, squared ReLU)")
    return 0


def _attention_kind(m) -> str:
    """What `simpar models` says of a model's attention: latent (MLA), grouped-query or
    multi-head, with norms on q and k and sliding windows where it has them."""
    kind = "mla" if m.is_mla else "gqa" if m.kv_heads < m.heads else "mha"
    if m.qk_norm:
        kind += ", qk-norm"
    if m.attention_window:
        kind += f", window {m.attention_window}"
    return kind


def cmd_gpus(args) -> int:
    from simpar.report.text import table
    from simpar.specs import GPUS

    if args.json:
        print(strict_json({n: g.to_dict() for n, g in GPUS.items()}))
        return 0
    # arch: the generation a stack's plain name takes its era from (`simpar stacks`)
    rows = [[
        g.name, g.arch or "-", g.fp32_tflops, g.tf32_tflops, g.bf16_tflops, g.fp8_tflops or "-",
        g.fp4_tflops or "-", f"{g.hbm_gib:.0f}", g.hbm_tbps, f"{g.gemm_efficiency:.0%}",
        f"{g.burst_gemm_efficiency:.0%}" if g.burst_gemm_efficiency else "-"
    ] for g in GPUS.values()]
    print(
        table([
            "gpu", "arch", "fp32 TF", "tf32 TF", "bf16 TF", "fp8 TF", "fp4 TF", "HBM GiB",
            "HBM TB/s", "GEMM eff.", "burst"
        ], rows))
    return 0


def cmd_stacks(args) -> int:
    """The software stack profiles --stack chooses among: what each runs, and its defaults
    for what a user leaves unsaid (simpar/specs/stack.py says where each value comes from)."""
    from dataclasses import asdict

    from simpar.report.text import table
    from simpar.specs.stack import (
        ARCH_ERAS,
        STACK_ALIASES,
        STACKS,
        arch_era_names,
        era_names,
        era_versions,
    )

    aliases = {n: [a for a, to in STACK_ALIASES.items() if to == n] for n in STACKS}
    if args.json:
        # the GPU architectures on which the plain name of a stack with eras picks this profile
        on = {n: [a for eras in ARCH_ERAS.values() for a, p in eras.items() if p == n]
              for n in STACKS}
        print(strict_json({n: {**asdict(s), "aliases": aliases[n], "from_versions": era_versions(n),
                               "plain_name_on_archs": on[n]}
                           for n, s in STACKS.items()}))
        return 0
    rows = [[
        s.name, s.kernels + ("/compile" if s.compilable else "")
        + ("/cuda-graphs" if s.graphable else ""), s.attention,
        s.loss + ("" if s.loss_code == "torch" else f" ({s.loss_code})")
        + (", compiled: fused" if s.compilable and s.compile_loss and s.loss != "fused" else ""),
        "fp32" if s.norm_fp32 and s.elementwise == "eager" else
        "fused (CPU: fp32)" if s.torch_rms_norm else "fused",
        f"{s.weight_bytes}/{s.grad_bytes}/{s.grad_reduce_bytes}"
        + (" (fp16: 2/2/2)" if s.fp32_grads_bf16_only else ""),
        f"{s.zero3_unit}, {'prefetched' if s.zero3_overlap else 'waited for'}"
        + (", fp8 weights" if s.fp8_weight_gathers else "")
        + {"fsdp2": ", fsdp2 copies", "flat": ", flat grads", "none": ""}[s.fsdp_copies],
        s.default_zero, "yes" if s.sp_with_tp else "no", _tp_overlap(s), s.fp8_scaling_label,
        s.selective + (" (or --recompute-modules)" if s.recompute_modules else ""),
        "torch hooks" if s.checkpoint_hooks else "reentrant", s.grad_accumulation,
        ("blocking" if s.blocking_recvs else "posted ahead")
        + (", 1/tp + gather" if s.pipeline_scatter_gather else ""), _schedules(s), s.about
    ] for s in STACKS.values()]
    print(table(["stack", "kernels", "attention", "loss", "norm", "weight/grad/reduce B",
                 "ZeRO-3 gathers", "default zero", "sp with tp", "tp overlap", "fp8 scaling",
                 "selective",
                 "checkpoint", "grad accum.",
                 "pp receives", "pp schedules", "runs"], rows))
    named = "; ".join(f"{n}: {', '.join(a)}" for n, a in aliases.items() if a)
    print(f"\n--stack also takes (any case): {named}")
    print(f"and NAME@VERSION (or NAME-VERSION), a release or a year: {era_names()}")
    print(f"without a version, the code of a stack's published runs on the GPU's generation: "
          f"{arch_era_names()}")
    return 0


def _schedules(s) -> str:
    """The pipeline schedules the stack runs (what compare searches for it)."""
    from simpar.specs.schedule import SCHEDULES

    if not s.schedules:
        return "none"
    return "all" if set(s.schedules) == set(SCHEDULES) else ", ".join(s.schedules)


def _tp_overlap(s) -> str:
    """Whether the stack hides its TP collectives behind GEMMs by default, and where not."""
    if not s.tp_overlap:
        return "no"
    off = list(s.tp_overlap_off_for) + (["pre-Hopper"] if s.tp_overlap_needs_multicast else [])
    return "yes" + (f", not {', '.join(off)}" if off else "")
