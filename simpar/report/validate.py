"""Measured vs predicted: a plan's prediction beside an execpar measurement, figure by figure."""

from __future__ import annotations

import json

from simpar.cost.step import COMM_PHASES
from simpar.errors import SpecError, is_number, require
from simpar.files import read_text
from simpar.report.profiled import INDUCTOR_KERNELS, seconds_by_kind
from simpar.report.text import table
from simpar.report.trainer_logs import check_log_batch, is_trainer_log, measurement_from_log
from simpar.specs.plan import load_plan

# Figures both sides have, as (label, prediction path, measurement path).
FIGURES = (("step time (s)", ("step_time_s", ), ("step_time_s", )), ("tokens/s", ("tokens_per_s", ),
                                                                     ("tokens_per_s", )),
           ("model TFLOP/s per GPU", ("model_tflops_per_gpu", ), ("model_tflops_per_gpu", )),
           ("peak allocated per GPU (GiB)", ("memory", "peak_allocated_gib"),
            ("memory", "peak_allocated_gib")),
           ("peak reserved per GPU (GiB)", ("memory", "peak_reserved_gib"),
            ("memory", "peak_reserved_gib")), ("memory per GPU (GiB)", ("memory", "total_gib"),
                                               ("memory", "total_gib")))
# On CUDA the measurement has the allocator's peaks; its total is the allocated peak,
# not the device's need.
ALLOCATOR_MEASURED = ("memory", "peak_allocated_gib")


# below this share of the step in kernels, a GPU step is limited by its host, not its kernels
# (the six execpar runs on an H100 and two H200s kept their GPUs 93-100% busy)
HOST_BOUND_SHARE = 0.85


def _get(doc: dict, path: tuple):
    for key in path:
        if not isinstance(doc, dict) or key not in doc:
            return None
        doc = doc[key]
    return doc


def load_measurement(path: str, plan=None) -> dict:
    """An execpar measurement (JSON), or, given the `plan` it ran, a torchtitan or Megatron
    training log (simpar.report.trainer_logs)."""
    text = read_text(path, "measured",
                     "no such file; write one with `execpar launch PLAN --out measured.json`, or "
                     "give a torchtitan or Megatron training log")
    if plan is not None and not text.lstrip().startswith("{") and is_trainer_log(text):
        measured = measurement_from_log(text, path, gpus=plan.strategy.gpus,
                                        tokens_per_step=plan.job.tokens_per_step)
        check_log_batch(measured, plan.job.global_batch, path)
        return measured
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError("measured", path, f"is not valid JSON ({exc.msg})") from None
    except (ValueError, RecursionError) as exc:  # a 5,000-digit number, nesting 10^5 deep
        raise SpecError("measured", path,
                        f"is not an execpar measurement ({exc}"[:150] + ")") from None
    if not isinstance(doc, dict) or doc.get("schema") != "execpar-measurement":
        raise SpecError("measured.schema", doc.get("schema") if isinstance(doc, dict) else None,
                        "is not an execpar measurement (nor a torchtitan or Megatron log)")
    _check_measurement(doc)
    return doc


def _check_shapes(doc: dict, source: str, mappings: tuple, numbers: tuple) -> None:
    """One line naming the field where a measurement or a plan's prediction holds something else
    than a mapping at each of `mappings`, or a finite number at each of `numbers` (paths); absent
    fields are allowed."""
    for key in mappings:
        value = _get(doc, key)
        require(value is None or isinstance(value, dict), f"{source}.{'.'.join(key)}", value,
                "must be a mapping; re-create the file")
    for key in numbers:
        value = _get(doc, key)
        require(value is None or is_number(value), f"{source}.{'.'.join(key)}", value,
                "must be a number; re-create the file")


def _check_measurement(doc: dict) -> None:
    _check_shapes(doc, "measured", (("memory",), ("breakdown",), ("strategy",),
                                    ("breakdown", "kernels")),
                  tuple(m for _, _, m in FIGURES) + (("breakdown", "comm_s"),
                                                     ("breakdown", "compute_s")))
    batch = doc.get("global_batch")
    require(batch is None or (isinstance(batch, int) and not isinstance(batch, bool)),
            "measured.global_batch", batch, "must be a whole number of sequences; re-measure")
    step = doc.get("step_time_s")
    require(step is None or step > 0, "measured.step_time_s", step,
            "must be a positive number of seconds; re-measure")
    kernels = _get(doc, ("breakdown", "kernels"))
    if kernels:
        top = kernels.get("top")
        require(isinstance(top, list) and all(
            isinstance(t, dict) and isinstance(t.get("name"), str) and is_number(t.get("s"))
            for t in top), "measured.breakdown.kernels.top", top,
            "must list the profiled kernels as {name, s}; re-measure with `execpar launch "
            "--profile`")
        _check_shapes(kernels, "measured.breakdown.kernels", (),
                      tuple((k,) for k in ("gemm_s", "attention_s", "memory_bound_s",
                                           "communication_s")))
        require(is_number(kernels.get("memory_bound_s")),
                "measured.breakdown.kernels.memory_bound_s", kernels.get("memory_bound_s"),
                "must be a number of seconds; re-measure with `execpar launch --profile`")


# What must agree between a plan and a measurement for one to check the other (a scaled-down run may
# shrink the model and the sequence, never the strategy or the batch).
SAME_STRATEGY = ("dp", "tp", "pp", "cp", "ep", "zero", "sp", "micro_batch", "schedule", "vpp",
                 "recompute", "recompute_layers")


def _check_same_run(plan, measured: dict, measured_path: str) -> None:
    ran = {**(measured.get("strategy") or {}), "global_batch": measured.get("global_batch")}
    planned = {**plan.strategy.to_dict(), "global_batch": plan.job.global_batch}
    differ = [
        k for k in SAME_STRATEGY + ("global_batch", )
        if ran.get(k) is not None and ran[k] != planned[k]
    ]
    if differ:
        ran_as = ", ".join(f"{k} {ran[k]} (plan: {planned[k]})" for k in differ)
        raise SpecError(
            "measured", measured_path, f"ran another strategy than the plan: {ran_as}; validate a "
            "measurement against the plan it ran (`execpar launch PLAN --out ...`)")


def compare(plan_path: str, measured_path: str) -> dict:
    plan = load_plan(plan_path)
    measured = load_measurement(measured_path, plan)
    _check_same_run(plan, measured, measured_path)
    predicted = plan.prediction
    _check_shapes(predicted, "plan.prediction", (("breakdown",), ("memory",)),
                  tuple(p for _, p, _ in FIGURES))
    for phase, seconds in (predicted.get("breakdown") or {}).items():
        require(is_number(seconds), f"plan.prediction.breakdown.{phase}", seconds,
                "must be a number; re-create the plan with `simpar plan`")
    rows = []
    for label, pp, mp in FIGURES:
        p, m = _get(predicted, pp), _get(measured, mp)
        if p is None or m is None or (mp == ("memory", "total_gib") and
                                      _get(measured, ALLOCATOR_MEASURED) is not None):
            continue
        rows.append(
            {"figure": label, "predicted": p, "measured": m, "error": p / m - 1 if m else None})
    require(bool(rows), "measured", measured_path,
            "shares no figure with the plan's prediction (step time, tokens/s, TFLOP/s, "
            "memory): nothing to compare; give the measurement `execpar launch PLAN --out` wrote")
    pb, mb = predicted.get("breakdown") or {}, measured.get("breakdown") or {}
    phases = {}
    if mb:
        p_comm = sum(v for k, v in pb.items() if k in COMM_PHASES)
        phases = {
            "communication_s": {"predicted": p_comm, "measured": mb.get("comm_s")},
            "compute_s": {"predicted": sum(pb.values()) - p_comm, "measured": mb.get("compute_s")}
        }
    scaled = measured.get("scaled_down")
    prof = plan.strategy.profile
    return {
        "plan": plan_path, "measured": measured_path,
        "measured_by": measured.get("source", "execpar"),
        "steady_steps": measured.get("steady_steps"),
        "alloc_retries": measured.get("alloc_retries"),
        "stack": prof.label,
        "stack_about": prof.about, "figures": rows, "phases": phases,
        "gpu_busy": _gpu_busy(measured), "scaled_down": scaled,
        "environment": measured.get("environment"),
        "note": "the run was scaled down from the plan: compare with a plan of the run's own size"
        if scaled else None
    }


# records that execpar before ab2849f counted as memory-bound kernels: CUPTI's full-queue mark
# and the optimizer's user annotation (the first H200 measurements have them)
NOT_KERNELS = ("Command Buffer Full", "Optimizer.step#")


def measured_kernels(breakdown: dict) -> dict | None:
    """The profiled step's kernel split less the records in it that are no kernels, where the
    kernel list gives their time (measurements before ab2849f counted them; those lists hold the
    12 longest only, so the optimizer's annotation, 0.01-0.03 s, can fall just outside)."""
    kernels = breakdown.get("kernels")
    if not kernels:
        return None
    names = [t["name"] for t in kernels["top"]]
    if any(n.startswith(INDUCTOR_KERNELS) and names.count(n) > 1 for n in names):
        # execpar before b170035 listed each compiled kernel twice (the host-side
        # record of its launch was charged its device time) and took those feeding an fp8 GEMM
        # for GEMMs; their lists are whole: sort them again, each kernel once
        once = {t["name"]: t["s"] for t in kernels["top"]
                if not t["name"].startswith(NOT_KERNELS)}
        return {**kernels, **seconds_by_kind(once.items())}
    extra = sum(t["s"] for t in kernels["top"] if t["name"].startswith(NOT_KERNELS))
    return {**kernels, "memory_bound_s": kernels["memory_bound_s"] - extra}


def _gpu_busy(measured: dict) -> dict | None:
    """The profiled step's kernel time against the median step (`execpar launch --profile` on a
    GPU): what is left over, the GPU spent waiting for its host (eager launches, syncs). The
    profiled step itself runs slower on the host, not on the GPU, so the median step is the
    yardstick."""
    kernels = measured_kernels(measured.get("breakdown") or {})
    step = measured.get("step_time_s")
    if not kernels or kernels.get("source") != "gpu kernels" or not step:
        return None
    # a kind the profile found no kernel of may be absent or null
    busy = sum(kernels.get(k) or 0.0 for k in ("gemm_s", "attention_s", "memory_bound_s",
                                              "communication_s"))
    return {"kernels_s": busy, "step_s": step, "share": busy / step}


def validation_text(report: dict) -> str:
    rows = [[r["figure"], f"{r['predicted']:.4g}", f"{r['measured']:.4g}",
             f"{r['error']:+.1%}" if r["error"] is not None else "-"] for r in report["figures"]]
    steps = report.get("steady_steps")
    by = report.get("measured_by", "execpar")
    out = [f"prediction priced for the {report['stack']} stack ({report['stack_about']}); "
           f"measured by {by}" + (f", median of steps {steps[0]}-{steps[-1]}" if steps else ""),
           table(["figure", "predicted", "measured", "error"], rows)]
    if report["phases"]:
        out.append(
            table(["phase (s)", "predicted", "measured"],
                  [[k, f"{v['predicted']:.4g}",
                    f"{v['measured']:.4g}" if v["measured"] is not None else "-"]
                   for k, v in report["phases"].items()]))
    busy = report.get("gpu_busy")
    if busy:
        out.append(f"measured GPU kernels: {busy['kernels_s']:.4g} s of the {busy['step_s']:.4g} s "
                   f"step ({busy['share']:.0%})" + (
                       "; the GPU waited for its host the rest (eager launches, syncs)"
                       if busy["share"] < HOST_BOUND_SHARE else ""))
    if report.get("alloc_retries"):
        out.append(f"the allocator flushed its cache and retried {report['alloc_retries']} "
                   "cudaMalloc calls: the run worked at its memory ceiling, which slows its steps")
    if report["note"]:
        out.append(f"note: {report['note']} ({report['scaled_down']})")
    return "\n\n".join(out)


def validation_chart(report: dict, path: str) -> None:
    from matplotlib.figure import Figure  # no pyplot: no global backend or figure registry

    from simpar.files import atomic_write

    rows = report["figures"]
    fig = Figure(figsize=(3.2 * len(rows), 3.4))
    axes = fig.subplots(1, len(rows))
    for ax, r in zip(axes if len(rows) > 1 else [axes], rows, strict=True):
        ax.bar(["predicted", "measured"], [r["predicted"], r["measured"]],
               color=["tab:blue", "tab:orange"])
        err = f" ({r['error']:+.0%})" if r["error"] is not None else ""
        ax.set_title(r["figure"] + err, fontsize=9)
    fig.suptitle(f"simpar prediction vs {report.get('measured_by', 'execpar')} measurement")
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110), "--png")


def sweep_text(r: dict) -> str:
    memory = all("measured_gib" in x for x in r["rows"])
    head = ["strategy", "predicted step s", "measured step s", "error"] + (
        ["predicted GiB", "measured GiB", "memory error"] if memory else [])
    rows = [
        [x["strategy"], f"{x['predicted_s']:.4f}", f"{x['measured_s']:.4f}", f"{x['error']:+.1%}"] +
        ([f"{x['predicted_gib']:.2f}", f"{x['measured_gib']:.2f}", f"{x['memory_error']:+.1%}"]
         if memory else []) for x in r["rows"]
    ]
    return "\n".join([
        f"End-to-end validation ({r['size']} model, {r['nproc']} processes, {r['steps']} steps, "
        "calibrated profile)",
        "measured on {host}: {device} with {backend}, torch {torch}".format(
            **{k: r["environment"].get(k, "?") for k in ("host", "device", "backend", "torch")}),
        "",
        table(head, rows), "",
        f"median |error|: {r['median_abs_error']:.1%}; predicted fastest: "
        f"{r['predicted_fastest']}, measured fastest: {r['measured_fastest']}; Spearman rank "
        f"correlation {r['rank_correlation']:.2f}"
    ])
