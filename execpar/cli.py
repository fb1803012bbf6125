"""execpar command line: `run` (one process of a torchrun job) and `launch` (starts torchrun)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from dataclasses import fields

from simpar.cli.checks import check_numbers
from simpar.devices import check_device
from simpar.errors import OneLineParser, SpecError, require, run_command
from simpar.files import check_writable

SCALABLE = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len",
            "global_batch")


_Parser = OneLineParser


def _run_flags(p):
    p.add_argument("plan", help="plan file written by `simpar plan`")
    p.add_argument("--steps", type=int, default=10, help="training steps (default 10)")
    p.add_argument("--warmup", type=int, default=2,
                   help="first steps left out of the timings (default 2)")
    p.add_argument("--out", help="write the measurement (JSON) here (rank 0)")
    p.add_argument("--device", choices=["cpu", "cuda"],
                   help="default: cuda when available, else cpu (gloo)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the initial weights and synthetic data")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    p.add_argument("--clip", type=float, default=0.0, help="max gradient norm (0 = off)")
    p.add_argument("--data", help="file of uint16 token ids (default: synthetic tokens)")
    p.add_argument("--dtype", choices=["fp32", "bf16", "fp16"],
                   help="compute precision (default: the plan's 16-bit type on GPUs, fp32 on "
                   "CPUs); fp16 trains under a dynamic loss scale")
    p.add_argument("--timeout-s", type=float, default=300.0,
                   help="collective timeout: a dead peer ends the job")
    p.add_argument(
        "--profile", action="store_true",
        help="profile the last step with torch.profiler for the communication/compute split")
    p.add_argument("--checkpoint-dir",
                   help="folder for checkpoints; a run resumes from the newest one in it")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="steps between checkpoints (0 = none)")
    p.add_argument("--fail-at-step", type=int, default=-1,
                   help="fault injection: kill --fail-rank before this step")
    p.add_argument("--fail-rank", type=int, default=0, help="the rank --fail-at-step kills")
    for name in SCALABLE:
        p.add_argument(
            f"--{name.replace('_', '-')}", type=int, dest=name,
            help=f"scaled-down run: override the plan's {name} (recorded in the measurement)")


def _config(args):
    from execpar.config import RunConfig

    # ranges (positive, >= 0, finite) were checked with simpar's table
    # (simpar/cli/checks.py) before this
    if args.warmup >= args.steps:
        raise SpecError("--warmup", args.warmup,
                        f"must be from 0 to {args.steps - 1}: the measurement needs a timed step")
    # where the measurement and checkpoints go is checked before any step runs, not
    # after the whole run
    if args.out is not None:  # an empty --out would write nothing, silently
        require(args.out != "", "--out", args.out, "give a file name for the measurement")
        check_writable(args.out, "--out")
    if args.checkpoint_dir and not os.path.isdir(args.checkpoint_dir):
        check_writable(args.checkpoint_dir, "--checkpoint-dir")  # its parent must take a new folder
    overrides = tuple((k, getattr(args, k)) for k in SCALABLE if getattr(args, k) is not None)
    if args.fail_rank and args.fail_at_step < 0:
        raise SpecError("--fail-rank", args.fail_rank,
                        "picks the rank --fail-at-step kills; give --fail-at-step too")
    if args.checkpoint_every and not args.checkpoint_dir:
        raise SpecError("--checkpoint-every", args.checkpoint_every,
                        "give a positive number with --checkpoint-dir")
    return RunConfig(plan=args.plan, steps=args.steps, warmup=args.warmup, out=args.out,
                     device=args.device, seed=args.seed, lr=args.lr, clip=args.clip, data=args.data,
                     dtype=args.dtype, timeout_s=args.timeout_s, overrides=overrides,
                     checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
                     fail_at_step=args.fail_at_step, fail_rank=args.fail_rank, profile=args.profile)


def cmd_run(args) -> int:
    from execpar.train import run

    # a rank forked by execpar.agent inherits torchrun's signal handlers, which raise in the rank
    # when torchrun stops it (a peer refused or crashed) mid-teardown: it dies as a fresh
    # interpreter does
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result = run(_config(args))
    except SpecError:
        raise
    except Exception:
        # the rank's traceback through torch's excepthook, "[rankN]: " on each line, which the
        # launcher reads for the crash's cause (RANK_EXCEPTION): a fresh interpreter prints it so
        # at its exit, while a rank that execpar.agent forked ends in torch's multiprocessing
        # wrapper, which would not
        sys.excepthook(*sys.exc_info())
        return 1
    if result is not None:
        print(
            f"step {result['step_time_s']:.4f} s (median), {result['tokens_per_s']:,.0f} tokens/s, "
            f"final loss {result['losses'][-1]:.4f}" + (f"; wrote {args.out}" if args.out else ""))
    return 0


def _forward(args) -> list[str]:
    out = [
        args.plan, "--steps",
        str(args.steps), "--warmup",
        str(args.warmup), "--seed",
        str(args.seed), "--lr",
        str(args.lr), "--clip",
        str(args.clip), "--timeout-s",
        str(args.timeout_s)
    ]
    out += [
        "--checkpoint-every",
        str(args.checkpoint_every), "--fail-at-step",
        str(args.fail_at_step), "--fail-rank",
        str(args.fail_rank)
    ] + (["--profile"] if args.profile else [])
    for flag in ("out", "device", "data", "checkpoint_dir", "dtype"):
        if getattr(args, flag):
            value = getattr(args, flag)
            out += [
                f"--{flag.replace('_', '-')}",
                value if flag in ("device", "dtype") else os.path.abspath(value)
            ]
    for k in SCALABLE:
        if getattr(args, k) is not None:
            out += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    return out


def _device_memory_gib(device: str | None) -> float | None:
    """Memory of the CUDA device a local rank would run on; None on CPU, where the
    plan's GPU is a label."""
    if device == "cpu":  # asked for: no need to load torch in the launcher to find out
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(0).total_memory / 2**30


def _host_memory_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def planned_memory(plan, model, job, *, scaled: bool):
    """One rank's predicted peak: the plan's, or, for a run scaled by overrides (another model
    or job), simpar's memory model repriced for what will run."""
    from simpar.memory.model import MemoryBreakdown, memory_breakdown

    if scaled:
        return memory_breakdown(model, job, plan.strategy)
    mem = plan.prediction.get("memory")
    if not mem:
        return None
    names = {f.name for f in fields(MemoryBreakdown)}
    return MemoryBreakdown(**{k: v for k, v in mem.items() if k in names})


def check_memory(mem, device_gib: float | None, ranks_here: int) -> None:
    """Refuse a run whose predicted peak exceeds what this node has: each rank's reserved
    memory and runtime against the GPU found here, or, with no GPU, the allocated peaks of
    the node's ranks together against its RAM (a lower bound: CPU runs compute in fp32)."""
    from simpar.memory.model import biggest_part, does_not_fit

    if mem is None:
        return
    if device_gib is not None:
        if mem.total_gib > device_gib:
            raise SpecError("plan memory", f"{mem.total_gib:.1f} GiB per GPU",
                            does_not_fit(mem, device_gib, "this node's GPU"))
        return
    need, host = ranks_here * mem.peak_allocated_gib, _host_memory_gib()
    if need > host:
        name, gib, remedy = biggest_part(mem)
        raise SpecError(
            "plan memory", f"{need:.1f} GiB for {ranks_here} rank(s)",
            f"over this host's {host:.1f} GiB of RAM ({mem.peak_allocated_gib:.1f} GiB each, "
            f"the biggest part {name}, {gib:.1f} GiB): {remedy}; --force goes ahead anyway")


def cmd_launch(args) -> int:
    """Start torchrun for this node, or print the torchrun line each node of a
    multi-node job runs."""
    from execpar.mesh import check_on_device, check_supported, scaled
    from simpar.specs.plan import load_plan
    from simpar.specs.strategy import validate

    cfg = _config(args)
    check_device(args.device)
    plan = load_plan(args.plan)
    # refuse before any process starts, with the scaled-down model and job where given
    model, job = scaled(plan, cfg.overrides)
    check_supported(plan.strategy, model, job)
    validate(plan.strategy, model, job, plan.strategy.gpus)
    # the device matters to fp8 plans only (finding out loads torch: 2 s)
    check_on_device(plan.strategy, job, gpu=job.dtype == "fp8" and not _on_cpu(args.device))
    if not args.force:
        check_memory(planned_memory(plan, model, job, scaled=bool(cfg.overrides)),
                     _device_memory_gib(args.device), args.nproc_per_node)
    if "bf16" in (plan.strategy.grad_reduce, plan.strategy.compress):
        import torch

        from execpar.parallelize import check_bf16_reduce

        check_bf16_reduce(plan.strategy, nccl=args.device != "cpu" and torch.cuda.is_available())
    if args.data:  # the plan's vocabulary, or the scaled-down run's
        from execpar.data import Batches

        vocab = args.vocab or plan.model.vocab
        Batches(vocab, args.seq_len or plan.job.seq_len, args.global_batch or plan.job.global_batch,
                0, args.data).check_ids()
    world = args.nproc_per_node * args.nnodes
    if world != plan.strategy.gpus:
        raise SpecError(
            "--nproc-per-node x --nnodes", world,
            f"the plan needs {plan.strategy.gpus} processes (dp*tp*pp*cp); change one of them")
    if args.fail_rank >= world:
        raise SpecError("--fail-rank", args.fail_rank,
                        f"is not a rank of this {world}-process job; give 0 to {world - 1}")
    rank = ["run", *_forward(args)]  # what each rank runs of this command line
    run_args = ["-m", "execpar.cli", *rank]
    if args.nnodes > 1:
        for node in range(args.nnodes):
            cmd = [
                sys.executable, "-m", "torch.distributed.run", f"--nnodes={args.nnodes}",
                f"--nproc-per-node={args.nproc_per_node}", f"--node-rank={node}",
                f"--rdzv-endpoint={args.rdzv_endpoint}", "--rdzv-backend=c10d", "--rdzv-id=execpar"
            ] + run_args
            print(f"node {node}: " + shlex.join(cmd))
        return 0
    # on a CPU, torchrun forks each rank from execpar.agent, which has imported what a rank needs
    # (see there), instead of starting it as a new interpreter
    agent, ranks = ("torch.distributed.run", run_args) if not _on_cpu(args.device) else (
        "execpar.agent", ["--start-method", "fork", "--run-path", os.path.abspath(__file__), *rank])
    cmd = [
        sys.executable, "-m", agent, "--standalone", f"--nproc-per-node={args.nproc_per_node}",
        f"--max-restarts={args.max_restarts}"
    ] + ranks
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    if not args.checkpoint_dir:
        return _torchrun(cmd, allocator_env(env, args.device))
    # held here for the whole job, so a second run refuses before it starts
    from execpar.folder_lock import LOCK_FILE, LOCK_HELD_ENV, lock

    made = not os.path.exists(args.checkpoint_dir)
    held = lock(args.checkpoint_dir)
    env[LOCK_HELD_ENV] = os.path.abspath(args.checkpoint_dir)
    try:
        return _torchrun(cmd, allocator_env(env, args.device))
    finally:
        # a folder made for a run that wrote nothing into it (refused, killed before its first
        # checkpoint) goes again, while still locked: only its lock would be left
        if made and os.listdir(args.checkpoint_dir) == [LOCK_FILE]:
            os.remove(os.path.join(args.checkpoint_dir, LOCK_FILE))
            os.rmdir(args.checkpoint_dir)
        held.close()


# Where a rank notes that it refused its input (exit 2, one line already on stderr)
REFUSED_ENV = "EXECPAR_REFUSED_FILE"
# A rank's one-line refusal (run_command's prefix in a rank)
RANK_ERROR = re.compile(r"^execpar\[rank \d+\]: error: (.*)")
# torchrun's own log lines (glog style: E1127 01:08:01.656000 PID .../elastic/...py:1002] ...),
# and torch.multiprocessing's about the ranks it forked (execpar.agent)
ELASTIC_LOG = re.compile(r"^[EWI]\d{4} [\d:.]+ \d+ \S*torch/(distributed|multiprocessing)/")
# A crashed rank's exception, as torchrun prefixes its lines
RANK_EXCEPTION = re.compile(r"^\[rank(\d+)\]: ((?:\w+\.)*\w*(?:Error|Exception)\b.*)")
# ... and what the other ranks raise when it is gone (gloo's "Connection closed by peer", NCCL's
# aborted communicators): not the cause
LOST_PEER = re.compile(r"closed by peer|reset by peer|NCCL communicator was aborted|"
                       r"ProcessGroup\w* is aborted|Connection refused")


def _torchrun(cmd: list[str], env: dict) -> int:
    """Run torchrun, passing its stderr through as it comes, except its closing report of a
    failed child (from its first unprefixed traceback on): held back, and dropped where a rank
    refused its input in one line, so the user sees that line and exit code 2, not torchrun's
    ChildFailedError traceback. A rank that crashed still shows all of it."""
    fd, refused = tempfile.mkstemp(prefix="execpar-refused-")
    os.close(fd)
    held: list[str] = []
    try:
        with subprocess.Popen(cmd, env={**env, REFUSED_ENV: refused}, stderr=subprocess.PIPE,
                              text=True, bufsize=1) as proc:
            assert proc.stderr is not None
            failing = False  # torchrun's closing report has begun
            said: set[str] = set()  # every rank refuses the same input in the same words
            crash = None  # the first rank exception that is not a lost peer
            for line in proc.stderr:
                failing = failing or line.rstrip("\n") == "Traceback (most recent call last):"
                raised = RANK_EXCEPTION.match(line)
                if raised and crash is None and not LOST_PEER.search(line):
                    crash = raised
                refusal = RANK_ERROR.match(line)
                if refusal and refusal[1] in said:
                    continue
                if refusal:
                    said.add(refusal[1])
                if failing or ELASTIC_LOG.match(line):
                    held.append(line)
                else:
                    sys.stderr.write(line)
            rc = proc.wait()
        if rc and os.path.getsize(refused):
            return 2
        sys.stderr.writelines(held)
        if rc and crash:  # the cause, last, where a page of torchrun's report would bury it
            sys.stderr.write(f"execpar: error: rank {crash[1]} crashed: "
                             f"{crash[2].strip()} (its traceback above)\n")
        return rc
    finally:
        os.unlink(refused)


def allocator_env(env: dict, device: str | None) -> dict:
    """`env` with the allocators the plan priced, where the user set none of their own: CUDA's
    expandable segments, and on a CPU freed memory kept in the heap (HOST_HEAP_KEPT)."""
    out = dict(env)
    if not ({"PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"} & set(out)):
        out["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"
    if _on_cpu(device):
        for key, value in HOST_HEAP_KEPT.items():
            out.setdefault(key, value)
    return out


# On a CPU, glibc hands large freed blocks back to the kernel (mmap'd chunks, a trimmed heap top),
# so the next tensor of that size is page-faulted in as it is first written: a copy into a fresh
# 32 MiB tensor ran at 5 GB/s on a 2-core VM against 50 GB/s into a reused one. FSDP2 allocates
# its gathered weights and reduce-scatter inputs anew for every unit, and DTensor each
# collective's output. Kept in the heap (no mmap, no trim: glibc's malloc tunables), freed memory
# is reused as a GPU's caching allocator reuses it, which is what the plan prices. A user's own
# settings win.
HOST_HEAP_KEPT = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**40)}


def _on_cpu(device: str | None) -> bool:
    if device is not None:
        return device == "cpu"
    import torch

    return not torch.cuda.is_available()


def build_parser():
    p = _Parser(prog="execpar",
                description="Run a simpar plan with torch.distributed and measure it.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    r = sub.add_parser("run",
                       help="one process of a torchrun job (torchrun -m execpar.cli run PLAN ...)")
    _run_flags(r)
    r.set_defaults(func=cmd_run)
    la = sub.add_parser("launch",
                        help="start torchrun on this node (or print the lines for several nodes)")
    _run_flags(la)
    la.add_argument("--nproc-per-node", type=int, required=True,
                    help="processes (devices) per node")
    la.add_argument("--nnodes", type=int, default=1,
                    help="nodes (more than 1: print each node's torchrun line)")
    la.add_argument("--rdzv-endpoint", default="HEAD_NODE:29500",
                    help="rendezvous host:port for multi-node jobs")
    la.add_argument("--max-restarts", type=int, default=0, help="torchrun restarts after a failure")
    la.add_argument(
        "--force", action="store_true",
        help="start even if the predicted peak memory exceeds the GPU found here (with no GPU:"
        " the node's ranks together exceed its RAM)")
    la.set_defaults(func=cmd_launch)
    return p


def main(argv=None) -> int:
    rank = os.environ.get("RANK")
    rc = run_command(build_parser(), argv,
                     f"execpar[rank {rank}]" if rank is not None else "execpar",
                     check=check_numbers)
    if rc == 2 and os.environ.get(REFUSED_ENV):  # a rank refused: tell the launcher
        with open(os.environ[REFUSED_ENV], "a") as f:
            f.write(f"{rank}\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
