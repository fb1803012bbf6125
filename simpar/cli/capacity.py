"""Failures, checkpoints, time and cost printed beside a prediction."""

from __future__ import annotations


def capacity(args, model, cluster, job, p) -> dict:
    from simpar.capacity.reliability import reliability, time_and_cost

    inputs = reliability_inputs(args)
    rel = reliability(model.total_params, p.strategy, inputs, cluster.gpus_per_node, job.dtype)
    out = {"reliability": rel.to_dict()}
    if args.tokens:
        out["run"] = time_and_cost(args.tokens, p.tokens_per_s, p.strategy.gpus, rel.goodput,
                                   args.price_per_gpu_hour, cluster.gpu.tdp_w)
    return out


def reliability_inputs(args):
    from simpar.capacity.reliability import GPU_MTBF_HOURS, NODE_MTBF_HOURS, ReliabilityInputs

    # 0 is a value the user gave (and ReliabilityInputs refuses), not "unset"
    def given(value, default):
        return default if value is None else value

    return ReliabilityInputs(gpu_mtbf_hours=given(args.gpu_mtbf_hours, GPU_MTBF_HOURS),
                             node_mtbf_hours=given(args.node_mtbf_hours,
                                                   NODE_MTBF_HOURS), storage_gbps=args.storage_gbps,
                             node_storage_gbps=args.node_storage_gbps, restart_min=args.restart_min,
                             preemptions_per_day=args.preemptions_per_day)


def capacity_text(cap: dict) -> str:
    r = cap["reliability"]
    lines = [
        f"failures: job MTBF {r['job_mtbf_hours']:.1f} h, checkpoint {r['checkpoint_gib']:,.0f} "
        f"GiB written in {r['checkpoint_write_s']:.0f} s, every "
        f"{r['checkpoint_interval_s'] / 60:.0f} min (Young/Daly); goodput {r['goodput']:.1%}"
    ]
    if "run" in cap:
        t = cap["run"]
        cost = f", cost {t['cost']:,.0f}" if t["cost"] is not None else ""
        energy = f", GPU energy {t['gpu_energy_mwh']:,.0f} MWh" if t.get("gpu_energy_mwh") else ""
        lines.append(
            f"token budget: {t['ideal_days']:.1f} days without failures, "
            f"{t['wall_clock_days']:.1f} days with them, {t['gpu_hours']:,.0f} "
            f"GPU-hours{cost}{energy}")
    return "\n".join(lines)
