"""A plain hand-written torch DDP loop (run under torchrun), the reference for execpar's
overhead."""

import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from execpar.model import Transformer, loss_fn  # noqa: E402
from simpar.specs.plan import load_plan  # noqa: E402
from simpar.workload import flops  # noqa: E402


def main(plan_path: str, steps: int, out: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    plan = load_plan(plan_path)
    torch.manual_seed(0)
    model = DDP(Transformer(plan.model))
    # as execpar steps
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, fused=True)
    per = plan.job.global_batch // world
    times = []
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        seqs = torch.randint(0, plan.model.vocab, (plan.job.global_batch, plan.job.seq_len + 1),
                             generator=g)
        x, y = seqs[rank * per:(rank + 1) * per, :-1], seqs[rank * per:(rank + 1) * per, 1:]
        dist.barrier()
        t0 = time.perf_counter()
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.barrier()
        times.append(time.perf_counter() - t0)
    if rank == 0:
        step = statistics.median(times[2:])
        tokens = plan.job.global_batch * plan.job.seq_len
        model_flops = flops.model_flops_per_token(plan.model, plan.job.seq_len) * tokens
        peak = plan.cluster.gpu.peak_tflops(plan.job.dtype) * 1e12
        with open(out, "w") as f:
            json.dump({"step_s": step, "tokens_per_s_per_device": tokens / step / world,
                       "mfu_pct": 100 * model_flops / (step * world * peak),
                       # the process's resident set, as execpar measures memory on CPU
                       "peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])
