"""Accuracy per software stack: published runs of torchtitan, MosaicML, NeMo, Megatron-LM, PyTorch
FSDP and DeepSpeed, predicted as a user would, with `simpar simulate --json --stack STACK` and
the published strategy. Data: benchmarks/data/stacks.yaml (published, measured runs with their
sources; nothing in simpar was fitted to them), the three execpar runs on one H100
(benchmarks/data/h100_execpar/) and torchtitan 0.2.2's eight runs on one H200
(reports/torchtitan-h200). Knobs a source leaves unstated (null) are left to the stack's
defaults, as a user would. Mapping of the data's recompute names: "op" is torchtitan's op-level
SAC (our op) except under Megatron/NeMo, where it is Megatron's selective (attention core)
recompute; "selective" (every n-th block checkpointed) has no exact counterpart and is priced as
full recompute of every block (an upper bound). Prints every point, then the median absolute and
signed error of tokens/s per GPU per stack, per model size and per source (a paper, benchmark
suite or repository file with three or more runs), so that a bias shows as a bias.
With --stack-defaults it leaves out what a source's code ran otherwise than its stack's
defaults (its loss, AdamW, norms, attention kernel, gradient reduce precision), as a user who
gives only --stack would; --plain-names also names each row's stack without a version (megatron
for megatron-2022: the era of the stack's published runs on the row's GPU), as one who knows
only which project ran it.
Usage: python benchmarks/stack_accuracy.py [--engine analytic] [--stack NAME] [--stack-defaults]
[--plain-names] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simpar.cli.parser import main as simpar_main  # noqa: E402
from simpar.devices import catalog_gpu  # noqa: E402
from simpar.files import write_json  # noqa: E402
from simpar.report.accuracy import bands_from, run_feature  # noqa: E402
from simpar.specs import MODELS  # noqa: E402
from simpar.specs.stack import STACKS, family_of  # noqa: E402

DATA = Path(__file__).parent / "data"
TORCHTITAN_RUNS = Path(__file__).resolve().parents[1] / "reports" / "torchtitan-h200"
# torchtitan's activation_checkpoint settings as simpar's --recompute (selective op-level: op)
TORCHTITAN_AC = {"none": "none", "selective-op": "op", "full": "full"}
SIZES = ((3e9, "<3B"), (10e9, "3-10B"), (40e9, "10-40B"), (100e9, "40-100B"), (float("inf"),
                                                                               ">100B"))


# the model fields a row may give beside a dense transformer's: a head width other than hidden /
# heads, a mixture of experts, a GPT's dropout, biases and tied embeddings, and norms on the heads
# of q and k
EXTRA_MODEL_KEYS = ("head_dim", "experts", "experts_per_token", "shared_experts",
                    "shared_ffn_hidden", "dense_layers", "dense_ffn_hidden", "dropout", "bias",
                    "tied_embeddings", "qk_norm")


def _model_file(pt, tmp: Path) -> str:
    m = pt["model"]
    if m.get("builtin"):  # a model simpar ships (`simpar models`), as its row names it
        return str(m["builtin"])
    spec = {
        k: m[k]
        for k in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", *EXTRA_MODEL_KEYS)
        if m.get(k)
    }
    # not stated by the source (MT-NLG): GPT-2's BPE vocabulary, padded as Megatron does
    if not m.get("vocab"):
        spec["vocab"] = 51200
    spec.update(name=pt["id"], gated_mlp=bool(m.get("gated_mlp", True)))
    # a table of max_seq_len learned positions (MPT's NumParams grows with it)
    if m.get("learned_positions"):
        spec["position_embeddings"] = pt["job"]["seq_len"]
    path = tmp / f"{pt['id']}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def _recompute(stack: str, value) -> str | None:
    if value == "op":
        return "selective" if stack.startswith(("megatron", "nemo")) else "op"
    return "full" if value == "selective" else value


# What a source's code ran where it differs from its stack's defaults (each with a *_source line in
# stacks.yaml); --stack-defaults leaves them out, as a user who gives only --stack would
CODE_KEYS = ("loss", "optimizer", "norm", "attention", "grad_reduce", "fsdp_mixed_precision",
             "tp_overlap", "fp8_scaling", "moe_dispatch")


def flags(pt, model_path: str, engine: str, stack_defaults: bool = False, *,
          plain_names: bool = False) -> list[str]:
    s, job = pt["strategy"], pt["job"]
    # without a version (megatron for megatron-2022), a name prices the era of the stack's
    # published runs on the row's GPU (simpar.specs.stack.ARCH_ERAS)
    stack = family_of(pt["stack"]) if plain_names else pt["stack"]
    if stack_defaults:
        s = {k: v for k, v in s.items() if k not in CODE_KEYS}
    # a rack-scale system is priced on its cluster file (NVLink domain, scale-out fabric)
    machine = ["--cluster", pt["cluster"]] if pt.get("cluster") else ["--gpu", pt["gpu"]]
    out = [
        "simulate", "--model", model_path, *machine, "--gpus",
        str(pt["gpus"]), "--seq-len",
        str(job["seq_len"]), "--global-batch",
        str(job["global_batch"]), "--stack", stack, "--json", "--engine", engine
    ]
    if pt.get("power_limit_w"):  # the source ran its GPUs below their rated board power
        out += ["--power-limit-w", str(pt["power_limit_w"])]
    if job.get("dtype"):
        out += ["--dtype", job["dtype"]]
    for key in ("dp", "tp", "pp", "cp", "ep", "zero", "micro_batch"):
        if s.get(key) is not None:
            out += [f"--{key.replace('_', '-')}", str(s[key])]
    if s.get("vpp") and s["vpp"] > 1:
        out += ["--schedule", "interleaved", "--vpp", str(s["vpp"])]
    if s.get("sp") is not None and (s.get("tp") or 1) > 1:
        out.append("--sp" if s["sp"] else "--no-sp")
    rc = _recompute(pt["stack"], s.get("recompute"))
    if rc:
        out += ["--recompute", rc]
    if s.get("recompute_modules"):  # Megatron core's --recompute-modules (recompute_modules_source)
        out += ["--recompute-modules", ",".join(s["recompute_modules"])]
    if s.get("recompute_every"):  # torchtitan's layer-level checkpointing of every k-th block
        chunk = pt["model"]["layers"] // ((s.get("pp") or 1) * (s.get("vpp") or 1))
        out += ["--recompute-layers", str(chunk // s["recompute_every"])]
    if s.get("ep_overlap"):  # Megatron's combined 1F1B hides the EP all-to-alls (moe_a2a_overlap)
        out.append("--overlap-ep-comm")
    if s.get("cuda_graphs"):  # the recipe replays full-iteration CUDA graphs (cuda_graphs_source)
        out.append("--cuda-graphs")
    if s.get("async_tp"):  # torchtitan's async TP overlaps the TP collectives with the GEMMs
        out.append("--overlap-tp-comm")
    if s.get("tp_overlap") is False:  # a Megatron older than its stack's TP overlap (2023)
        out.append("--no-overlap-tp-comm")
    if s.get("compile") and STACKS[pt["stack"]].compilable:
        out.append("--compile")
    if s.get("loss"):  # the source's code ran another loss than its stack's today
        out += ["--loss", s["loss"]]
    if s.get("optimizer"):  # ... or another AdamW implementation (optimizer_source)
        out += ["--optimizer", s["optimizer"]]
    if s.get("norm"):  # ... or ran its norms otherwise (norm_source)
        out += ["--norm", s["norm"]]
    if s.get("attention"):  # ... or another attention kernel (attention_source)
        out += ["--attention", s["attention"]]
    if s.get("fp8_scaling"):  # ... or scaled its fp8 otherwise (fp8_scaling_source)
        out += ["--fp8-scaling", s["fp8_scaling"]]
    if s.get("moe_dispatch"):  # ... or dispatched its MoE tokens otherwise (moe_dispatch_source)
        out += ["--moe-dispatch", s["moe_dispatch"]]
    if s.get("grad_reduce"):  # ... or reduced gradients in another precision than its stack's
        out += ["--grad-reduce", s["grad_reduce"]]
    if s.get("fsdp_mixed_precision") == "DEFAULT":
        # Composer's FSDP mixed precision, which llm-foundry's table states per run: DEFAULT
        # reduces in fp32, PURE (the mosaic stack's) in bf16 (composer get_mixed_precision)
        out += ["--grad-reduce", "fp32"]
    if s.get("fsdp_sharding") == "HSDP":
        # FSDP's hybrid sharding: shard inside an 8-GPU node, replicate across nodes
        out += ["--dp-shard", "8"]
    if s.get("offload_activations"):  # layers whose activations the recipe keeps on the host
        out += ["--offload-activations", str(s["offload_activations"])]
    return out


def execpar_points() -> list[dict]:
    """The execpar runs on one H100 (benchmarks/data/h100_execpar/runs.yaml) in the same
    shape as the published points: measured tokens/s from the step time."""
    runs = yaml.safe_load((DATA / "h100_execpar" / "runs.yaml").read_text())["runs"]
    out = []
    for r in runs:
        model = yaml.safe_load((DATA / "h100_execpar" / f"{r['model']}.yaml").read_text())
        out.append({
            "id": f"execpar_h100_{r['id']}",
            "stack": "execpar",
            "source": {"url": "execpar H100 runs"},
            "gpu": "h100-sxm",
            "gpus": 1,
            "model": model,
            "job": {"seq_len": r["seq_len"], "global_batch": r["global_batch"], "dtype": "bf16"},
            # execpar's loss was cross_entropy(logits.float()) over the whole
            # micro-batch then, and torch.optim.AdamW's defaults (foreach on CUDA) (runs.yaml)
            "strategy": {
                "micro_batch": r["micro_batch"], "recompute": r["recompute"], "loss": "fp32",
                "optimizer": "foreach"
            },
            "measured": {
                "tokens_per_s_per_gpu": r["global_batch"] * r["seq_len"] / r["measured_step_s"],
                "memory_gib": r["measured_peak_allocated_gib"], "memory_kind": "allocated"
            }
        })
    return out


def torchtitan_points() -> list[dict]:
    """torchtitan 0.2.2 measured on one H200 (reports/torchtitan-h200, written by
    benchmarks/torchtitan_single_gpu.py) in the shape of the published points: tokens/s of its
    step less the data loading it reports (its dataset's host time, which simpar does not price),
    its peak reserved memory."""
    out = []
    for path in sorted(TORCHTITAN_RUNS.glob("tt-*.json")):
        run = json.loads(path.read_text())
        if not run.get("ok"):
            continue
        cfg, summ = run["config"], run["summary"]
        model = yaml.safe_load((DATA / "h100_execpar" / f"{cfg['flavor']}.yaml").read_text())
        busy_s = summ["median_step_s"] * (1 - summ["median_data_loading_pct"] / 100)
        out.append({
            "id": f"torchtitan_h200_{cfg['id']}",
            "stack": "torchtitan-0.2",
            "source": {"url": "torchtitan H200 runs"},
            "gpu": catalog_gpu(run["device_name"]),
            "gpus": 1,
            "model": model,
            "job": {"seq_len": cfg["seq_len"], "global_batch": cfg["batch"], "dtype": "bf16"},
            "strategy": {"micro_batch": cfg["batch"], "recompute": TORCHTITAN_AC[cfg["ac"]],
                         "compile": cfg.get("compile", False)},
            "measured": {"tokens_per_s_per_gpu": cfg["batch"] * cfg["seq_len"] / busy_s,
                         "memory_gib": summ["peak_memory_gib"], "memory_kind": "reserved"}
        })
    return out


def predict_point(pt, tmp: Path, engine: str, stack_defaults: bool = False, *,
                  plain_names: bool = False) -> dict:
    args = flags(pt, _model_file(pt, tmp), engine, stack_defaults, plain_names=plain_names)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = simpar_main(args)
        except SystemExit as exc:
            rc = exc.code
    row = {
        "id": pt["id"], "stack": pt["stack"], "source": pt["source"]["url"], "gpu": pt["gpu"],
        "gpus": pt["gpus"], "measured": pt["measured"]["tokens_per_s_per_gpu"],
        "command": "simpar " + " ".join(args)
    }
    if rc != 0:
        said = err.getvalue().strip()
        row["refused"] = said.splitlines()[-1] if said else f"exit {rc}"
        return row
    doc = json.loads(out.getvalue())
    row["stack"] = doc["strategy"]["stack"]  # the profile priced (a plain name's: its GPU's era)
    row["predicted"] = doc["tokens_per_s"] / pt["gpus"]
    row["error"] = row["predicted"] / row["measured"] - 1
    row["fits_memory"] = doc["fits_memory"]
    # torchtitan logs the reserved peak, execpar the allocated one
    if pt["measured"].get("memory_gib"):
        kind = pt["measured"].get("memory_kind", "reserved")
        row["memory_gib"] = {"measured": pt["measured"]["memory_gib"], "kind": kind,
                             "predicted": doc["memory"][f"peak_{kind}_gib"]}
        row["memory_gib"][
            "error"] = row["memory_gib"]["predicted"] / row["memory_gib"]["measured"] - 1
    return row


def _size(pt) -> str:
    m = pt["model"]
    if m.get("builtin") and not m.get("params"):  # simpar's own count of its built-in model
        m = {"params": MODELS[m["builtin"]].total_params}
    params = m.get(
        "params") or 12 * m["layers"] * m["hidden"]**2 + (m.get("vocab") or 0) * m["hidden"]
    return next(label for bound, label in SIZES if params < bound)


def summary(rows: list[dict], key, min_points: int = 1) -> list[tuple]:
    groups: dict = {}
    for r in rows:
        if "error" in r:
            groups.setdefault(key(r), []).append(r["error"])
    return [(g, len(e), statistics.median(abs(x) for x in e), statistics.median(e))
            for g, e in sorted(groups.items()) if len(e) >= min_points]


def _source(row) -> str:
    """A source's short name: the end of its address (a file, a paper), with the
    repository for files."""
    parts = row["source"].rstrip("/").split("/")
    return "/".join(parts[3:5] + parts[-1:]) if "github.com" in row["source"] else parts[-1]


def _architecture(pt) -> str:
    """dense or MoE (mixture of experts), as the row's model or simpar's built-in one says."""
    m = pt["model"]
    experts = m.get("experts") or (MODELS[m["builtin"]].experts if m.get("builtin") else 1)
    return "MoE" if experts > 1 else "dense"


# upper bounds of the job sizes the benchmark groups runs by: a bias that grows with scale (more
# ranks to wait for, longer collectives) shows as a trend down this table
GPU_BOUNDS = (1, 8, 64, 256, 1024)


def _job_size(row) -> str:
    """The row's GPU count as a range of GPU_BOUNDS, right-aligned so that ranges sort by size."""
    lo = 1
    for hi in GPU_BOUNDS:
        if row["gpus"] <= hi:
            return f"{lo:>4}" + (f"-{hi}" if hi > lo else "")
        lo = hi + 1
    return f"{lo:>4}+"


# (title, key, least points): a source is one paper, benchmark suite or repository file with 3+ runs
GROUPS = (("stack", lambda r: r["stack"], 1), ("model size", lambda r: r["size"], 1),
          ("architecture", lambda r: r["architecture"], 1), ("GPUs", _job_size, 1),
          ("source (3+ runs)", _source, 3))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="event", choices=["event", "analytic"],
                    help="as simulate's --engine")
    ap.add_argument("--stack", help="only the points of this stack")
    ap.add_argument("--stack-defaults", action="store_true",
                    help="price each run with its stack's defaults, leaving out what the source's "
                    "code ran otherwise (loss, AdamW, norm, attention kernel, gradient reduce "
                    "precision, TP overlap): the accuracy a user gets who gives only --stack")
    ap.add_argument("--plain-names", action="store_true",
                    help="name each run's stack without a version (megatron for megatron-2022), "
                    "which prices the era of the stack's published runs on the run's GPU: the "
                    "accuracy of a harness that knows only which project ran it")
    ap.add_argument("--bands", metavar="PATH",
                    help="also write each stack's error band on dense and MoE runs (JSON) here: "
                    "simpar/report/accuracy_bands.json is what simulate quotes")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    points = [
        p for p in yaml.safe_load((DATA / "stacks.yaml").read_text())["points"] + execpar_points()
        + torchtitan_points()
        if (not args.stack or p["stack"] == args.stack) and
        p["measured"].get("tokens_per_s_per_gpu")
    ]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, pt in enumerate(points):
            print(f"  ... {i + 1}/{len(points)} {pt['id']:60}", file=sys.stderr, end="\r")
            row = predict_point(pt, Path(tmp), args.engine, args.stack_defaults,
                                plain_names=args.plain_names)
            row["size"], row["architecture"] = _size(pt), _architecture(pt)
            row["cp"] = pt["strategy"].get("cp") or 1
            rows.append(row)
    print(file=sys.stderr)
    priced = [r for r in rows if "error" in r]
    if args.bands:
        _write_bands(args.bands, priced, args.stack_defaults)
    overall = statistics.median(abs(r["error"]) for r in priced) if priced else float("nan")
    if args.json:
        print(
            json.dumps(
                {
                    "rows": rows, "median_abs_error": overall, **{
                        f"per_{title.split()[0].lower()}": summary(rows, key, n)
                        for title, key, n in GROUPS
                    }
                }, indent=1))
        return 0
    print(f"{'point':52} {'gpus':>5} {'measured':>9} {'predicted':>9} {'error':>7}")
    for r in rows:
        if "error" in r:
            fits = "" if r["fits_memory"] else "  (does not fit)"
            tail = f"{r['predicted']:9,.0f} {r['error']:+7.1%}{fits}"
        else:
            tail = f"{'-':>9} refused: {r['refused']}"
        print(f"{r['id'][:52]:52} {r['gpus']:5d} {r['measured']:9,.0f} {tail}")
    for title, key, least in GROUPS:
        width = max(12, *(len(g) for g, *_ in summary(rows, key, least)))
        print(f"\n{title:{width}} {'points':>6} {'median |error|':>15} {'median signed':>14}")
        for g, n, mae, signed in summary(rows, key, least):
            print(f"{g:{width}} {n:6d} {mae:15.1%} {signed:+14.1%}")
    print(
        f"\nmedian |error| of tokens/s per GPU over {len(priced)} points "
        f"({len(rows) - len(priced)} refused): {overall:.1%}")
    _print_memory(rows)
    return 0


def _write_bands(path: str, priced: list[dict], stack_defaults: bool) -> None:
    bands = bands_from([(r["stack"], r["architecture"], run_feature(r["cp"]), r["error"])
                        for r in priced])
    write_json(path, {
        "written_by": "benchmarks/stack_accuracy.py" + (" --stack-defaults" if stack_defaults
                                                        else ""),
        "runs": len(priced),
        "bands": [{k: round(v, 4) if isinstance(v, float) else v for k, v in b.to_dict().items()}
                  for b in bands]})


def _print_memory(rows: list[dict]) -> None:
    """Peak memory where the source measured it: the allocator's reserved peak (torchtitan logs
    max_reserved) or allocated peak (execpar's max_memory_allocated)."""
    mem = [r for r in rows if "memory_gib" in r]
    if not mem:
        return
    print(f"\n{'peak memory per GPU (GiB)':52} {'kind':>9} {'measured':>9} {'predicted':>9} "
          f"{'error':>7}")
    for r in mem:
        m = r["memory_gib"]
        print(f"{r['id'][:52]:52} {m['kind']:>9} {m['measured']:9.1f} {m['predicted']:9.1f} "
              f"{m['error']:+7.1%}")
    errors = [r["memory_gib"]["error"] for r in mem]
    print(f"median |error| of peak memory over {len(mem)} points: "
          f"{statistics.median(abs(e) for e in errors):.1%}, median signed "
          f"{statistics.median(errors):+.1%}")


if __name__ == "__main__":
    sys.exit(main())
