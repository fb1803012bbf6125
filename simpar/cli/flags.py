"""Flag groups shared by the commands, and the conversion of parsed flags into specs."""

from __future__ import annotations

import argparse

from simpar.errors import SpecError, require
from simpar.network.algorithms import ALGOS
from simpar.specs.names import normal_form
from simpar.specs.precision import PRECISIONS, fp8_scaling_named, precision_name
from simpar.specs.schedule import INTERLEAVED, ONE_F_ONE_B, SCHEDULES, schedule_name

_SUFFIX = {
    "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "ki": 2.0**10, "mi": 2.0**20, "gi": 2.0**30,
    "ti": 2.0**40
}


def count(text: str) -> float:
    """'15T', '2.5e12', '300B', '128Mi' -> a number (of tokens or bytes); Ki/Mi/Gi are
    powers of 2."""
    t = text.strip().lower()
    try:
        for suffix in sorted(_SUFFIX, key=len, reverse=True):
            if t.endswith(suffix):
                return float(t[:-len(suffix)]) * _SUFFIX[suffix]
        return float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid count {text!r}: give a number such as 15T or 3e11") from None


# ZeRO stages as trainers name them, in names.normal_form: FSDP's sharding strategies
# (FULL_SHARD shards the weights, SHARD_GRAD_OP the gradients, NO_SHARD nothing) and Megatron's
# distributed optimizer (the optimizer states); DeepSpeed's "ZeRO-3" or "stage 3" is the number
ZERO_NAMES = {"fsdp": 3, "full-shard": 3, "shard-grad-op": 2, "no-shard": 0, "ddp": 0,
              "distributed-optimizer": 1}


def zero_stage(text: str) -> int:
    """--zero: 0-3 as a number, DeepSpeed's `ZeRO-3`, or ZERO_NAMES; hybrid sharding asks for
    --dp-shard (its stage range Strategy checks)."""
    key = normal_form(text)
    for prefix in ("zero-", "zero", "stage-", "stage"):
        if key.startswith(prefix) and key[len(prefix):].isdigit():
            key = key[len(prefix):]
            break
    if key.lstrip("-").isdigit():
        return int(key)
    if key in ("hsdp", "hybrid-shard"):
        raise argparse.ArgumentTypeError(
            f"{text!r} shards inside groups: give --zero 3 --dp-shard N (N ranks a group, e.g. 8)")
    if key in ZERO_NAMES:
        return ZERO_NAMES[key]
    raise argparse.ArgumentTypeError(
        f"invalid ZeRO stage {text!r}: give 0, 1, 2 or 3 (or FULL_SHARD, SHARD_GRAD_OP, NO_SHARD)")


def path(text: str) -> str:
    """A file or folder to write or read: an empty name is refused (it read as no path at all)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty: give a file or folder name")
    return text


def int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid list {text!r}: give integers separated by commas, e.g. 4,8") from None
    twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
    if twice is not None:
        raise argparse.ArgumentTypeError(f"invalid list {text!r}: {twice} is there twice")
    return values


def add_job_flags(p):
    g = p.add_argument_group("model, hardware and job")
    g.add_argument(
        "--model", required=True, help="catalog name (see `simpar models`), a YAML/JSON file of "
        "ModelSpec fields, or a Hugging Face config.json")
    g.add_argument(
        "--cluster",
        help="cluster name (dgx-a100, dgx-h100, dgx-b200) or YAML file of ClusterSpec fields")
    g.add_argument(
        "--gpu",
        help="GPU catalog name (see `simpar gpus`); alone it means DGX-like nodes of that GPU")
    g.add_argument("--gpus", type=int, required=True, help="number of GPUs in the job")
    g.add_argument("--seq-len", type=int, required=True, help="tokens per sequence")
    g.add_argument("--global-batch", type=int, required=True, help="sequences per optimizer step")
    g.add_argument(
        "--dtype", default="bf16", action=_Dtype, metavar="{" + ",".join(PRECISIONS) + "}",
        help="training precision: " + "; ".join(f"{p.name}: {p.summary}"
                                                for p in PRECISIONS.values()) + " (default bf16; "
        "also as torch, Lightning, llm-foundry and NeMo write them: bfloat16, bf16-mixed, "
        "amp_fp8, FP8-MX; FP8-CS and FP8-DS are fp8 with current and delayed scaling)")
    g.add_argument("--tokens", type=count, default=0.0,
                   help="tokens to train (e.g. 15T), for time-to-train")
    g.add_argument(
        "--power-limit-w", type=float,
        help="what-if: cap each GPU's board power; GEMM and attention rates scale with the clock "
        "it holds, the cube root of the dynamic power (HBM unchanged)")
    g.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    add_stack_flags(p)
    c = p.add_argument_group("capacity: time, money and failures (printed beside the prediction)")
    c.add_argument("--price-per-gpu-hour", type=float, default=0.0,
                   help="price of one GPU-hour, for the cost")
    c.add_argument(
        "--gpu-mtbf-hours", type=float, default=None,
        help="GPU-hours between GPU failures (default ~86,400: the GPU share of the Llama 3 "
        "paper's 419 interruptions)")
    c.add_argument(
        "--node-mtbf-hours", type=float, default=None,
        help="node-hours between host, network and software failures (default ~15,300: the rest of "
             "them)")
    c.add_argument("--storage-gbps", type=float, default=200.0,
                   help="file system bandwidth to the job for checkpoints, GB/s (default 200)")
    c.add_argument(
        "--node-storage-gbps", type=float, default=25.0,
        help="checkpoint bandwidth one node sustains, GB/s (default 25); without ZeRO one replica "
             "writes")
    c.add_argument("--restart-min", type=float, default=10.0,
                   help="minutes to restart a job after a failure")
    c.add_argument("--preemptions-per-day", type=float, default=0.0,
                   help="spot preemptions of the job per day")
    n = p.add_argument_group("network model")
    n.add_argument(
        "--network", default="flow", choices=["flow", "alpha-beta"],
        help="flow: collectives as flows on the cluster's fabric graph, with contention "
        "(default); alpha-beta: closed forms on the node/NIC bandwidths")
    n.add_argument(
        "--collective-algo", choices=list(ALGOS),
        help="force one collective algorithm (default: the fastest for each size and group)")
    n.add_argument(
        "--placement", default="tp,cp,dp,pp",
        help="mesh dimensions from innermost (closest ranks) to outermost; default tp,cp,dp,pp")
    n.add_argument(
        "--routing", default="minimal", choices=["minimal", "valiant"],
        help="dragonfly routing: minimal (default) or Valiant through a random intermediate group")


def add_stack_flags(p):
    """--stack and --compile, and the flags that say where your code runs otherwise than
    the stack (add_code_flags)."""
    from simpar.specs.stack import (
        ARCH_ERAS,
        DEFAULT_STACK,
        STACK_ALIASES,
        STACKS,
        arch_era_names,
        era_names,
    )

    g = p.add_argument_group(
        "software stack (what it runs, and its defaults for what you leave unsaid)")
    default = p.get_default("stack") or DEFAULT_STACK
    p.set_defaults(stack_era_named=False)
    g.add_argument(
        "--stack", action=_StackName, default=default, metavar="{" + ",".join(STACKS) + "}",
        help="the training software: "
        f"{'; '.join(f'{s.name}: {s.about}' for s in STACKS.values())} (any case; also "
        f"{', '.join(f'{a} for {n}' for a, n in STACK_ALIASES.items())}; and NAME@VERSION, a "
        f"release or a year: {era_names()}). Without a version, {', '.join(ARCH_ERAS)} price "
        f"the code of their published runs on the GPU's generation: {arch_era_names()}. It sets "
        "the kernels, attention kernel, loss, gradient precision and ZeRO-3 behaviour priced, and "
        f"the defaults of --zero, --sp, --overlap-tp-comm and --kernels (default {default})")
    g.add_argument(
        "--compile", action=argparse.BooleanOptionalAction,
        help="torch.compile of each transformer block (stacks that have it: torchtitan, fsdp, "
        "execpar): fused elementwise kernels, fewer launches; fsdp compiles the loss too, "
        "torchtitan's 2024 releases did not (--loss fused compiles it). Unsaid: off, but "
        "torchtitan compiles its fp8 runs (its float8 docs call compile required for "
        "competitive performance); --no-compile prices them eager",
    )
    g.add_argument(
        "--cuda-graphs", action="store_true",
        help="the step replays CUDA graphs (megatron, nemo: Megatron core's cuda_graph_impl "
        "full_iteration, as Megatron-Bridge's 26.06 MoE recipes on GB300 and GB200 run it): no "
        "pass waits for its host to launch kernels. Unsaid: every kernel launched by the host, "
        "which binds small MoE layers at small micro-batches")
    add_code_flags(g)


def add_code_flags(g):
    """The flags for what your code runs otherwise than its --stack: loss, norms, attention,
    fp8 scaling, pipeline outputs, MoE dispatch and expert folding, fp8 gathers, AdamW and
    gradient-reduce precision."""
    from simpar.specs.stack import (
        ADAM_IMPLS,
        ATTENTION,
        FP8_SCALING,
        GRAD_REDUCE,
        LOSS_CHUNK_TOKENS,
        LOSSES,
        MOE_DISPATCHES,
        NORMS,
        PIPELINE_OUTPUTS,
        STACKS,
    )

    g.add_argument(
        "--loss", choices=list(LOSSES),
        help="the cross entropy your code runs, where it differs from the stack's: fp32 "
        "(cross_entropy(logits.float()): fp32 logits, log-probabilities and gradient), chunked "
        f"(the same per {LOSS_CHUNK_TOKENS:,} tokens, recomputed in backward) or fused (one kernel "
        "on 16-bit logits: Megatron's loss fusion, a compiled loss); e.g. torchtitan compiles "
        "its loss from Apr 2025 (--compile --loss fused)")
    g.add_argument(
        "--norm", choices=list(NORMS),
        help="how your model code runs its norms, where it differs from the stack's: fp32 (eager "
        "ops upcast to fp32, whose fp32 copies autograd keeps: torchtitan's RMSNorm of 2024, "
        "Hugging Face's) or fused (one kernel: Transformer Engine, torchtitan's fused_rmsnorm of "
        "2024, llm-foundry's low-precision LayerNorm, torch's nn.RMSNorm on CUDA as torchtitan "
        "0.2 runs it); execpar's is torch's nn.RMSNorm, fused on a GPU and fp32 ops on a CPU")
    g.add_argument(
        "--attention", choices=list(ATTENTION),
        help="the fused attention kernel your software calls, where it differs from the stack's: "
        "best (the GPU's fastest: cuDNN's on Hopper and Blackwell, FlashAttention-2 on Ampere), "
        "fa2 (FlashAttention-2: about 35%% of Hopper's peak), triton (the 2023 Triton "
        "FlashAttention) or unfused (scores in memory); e.g. torchtitan 0.2 puts cuDNN's first "
        "in its SDPA priority list (--attention best), its 2024 releases ran FlashAttention-2")
    g.add_argument(
        "--fp8-scaling", choices=list(FP8_SCALING),
        help="how Transformer Engine scales --dtype fp8 per tensor, where your recipe differs "
        "from the stack's (nemo current, as Megatron-Bridge's fp8_cs recipes; the others "
        "delayed, Megatron-LM's --fp8-recipe default; its tensorwise is current): current "
        "first reads each cast's input for its amax, delayed takes the scale from the amax "
        "history")
    g.add_argument(
        "--pipeline-outputs", choices=list(PIPELINE_OUTPUTS),
        help="what your pipeline schedule keeps of each micro-batch's stage output until the step "
        "ends, where it differs from the stack's: all (torch's schedules before May 2025, as "
        "torchtitan's 2024 releases ran), last (later torch: the last stage's logits, unless "
        "step(return_outputs=False)) or none (Megatron's own pipeline, execpar, torchtitan's "
        "trainer since 2026)")
    g.add_argument(
        "--moe-dispatch", choices=list(MOE_DISPATCHES),
        help="how your MoE layers move tokens to their experts' ranks, where it differs from the "
        "stack's: alltoall (a copy per selected expert: Megatron core's alltoall dispatcher, "
        "torch's all_to_all_single; megatron, torchtitan, execpar) or flex (Megatron core's flex "
        "dispatcher on DeepEP or HybridEP: a copy per rank inside the NVLink domain and per "
        "node across it; nemo, as Megatron-Bridge's MoE recipes)")
    g.add_argument(
        "--fold-experts", action=argparse.BooleanOptionalAction, default=None,
        help="under tensor parallelism, whether each routed expert runs whole on a rank, its --ep "
        "ranks cut from tp x dp x cp (Megatron's --expert-tensor-parallel-size 1, MoE parallel "
        "folding: nemo, as Megatron-Bridge's MoE recipes) or splits over tp as the dense MLP, ep "
        "inside dp x cp (Megatron core's default: megatron)")
    g.add_argument(
        "--fp8-all-gather", action=argparse.BooleanOptionalAction, default=None,
        help="under ZeRO-3, whether the stack's torchao fp8 linears gather their weights in fp8, "
        "each rank casting its shard first (torchao's enable_fsdp_float8_all_gather: one byte "
        "per element, and no cast of the gathered weight), where your run differs from the "
        "stack's: torchtitan on (its float8 docs launch with it), execpar off (torchao's default)")
    g.add_argument(
        "--optimizer", choices=list(ADAM_IMPLS),
        help="torch.optim.AdamW as your code runs it, where it differs from the stack's (stacks "
        "with fp32 parameters): fused (fused=True: one kernel per parameter group) or foreach "
        "(torch's default otherwise: a pass over memory per arithmetic step, and a temporary of 4 "
        "bytes per parameter); e.g. torchtitan before Feb 2025 ran foreach")
    g.add_argument(
        "--grad-reduce", choices=list(GRAD_REDUCE),
        help="the precision your recipe reduces gradients in, where it differs from the stack's ("
        + ", ".join(f"{s.name} {'fp32' if s.grad_reduce_bytes == 4 else 'bf16'}"
                    + (" (fp16 runs: fp16)" if s.fp32_grads_bf16_only else "")
                    for s in STACKS.values())
        + "): Megatron's --grad-reduce-in-bf16, FSDP's reduce_dtype. Stacks with 16-bit weights "
        "keep their gradient buffer in it too (2 bytes per parameter instead of 4); execpar runs "
        "it")


class _Dtype(argparse.Action):
    """--dtype: the precision the name means (precision_name), and the fp8 scaling it says where
    it says one (`FP8-CS`, `FP8-DS`), unless --fp8-scaling has said otherwise."""

    def __call__(self, parser, namespace, values, option_string=None):
        name = precision_name(values)
        if name not in PRECISIONS:  # worded as argparse's own refusal, which gets a did-you-mean
            parser.error(f"argument --dtype: invalid choice: {values!r} (choose from "
                         f"{', '.join(map(repr, PRECISIONS))})")
        namespace.dtype = name
        if (scaling := fp8_scaling_named(values)) and getattr(namespace, "fp8_scaling",
                                                             None) is None:
            namespace.fp8_scaling = scaling


class _StackName(argparse.Action):
    """--stack: the profile the name means (stack_name), and whether the name picks an era
    (`stack_era_named`); a plain name of a stack with eras waits for the GPU (resolve_stack)."""

    def __call__(self, parser, namespace, values, option_string=None):
        from simpar.specs.stack import STACKS, names_no_era, stack_name, version_refusal

        name = stack_name(values)
        if name not in STACKS and (refusal := version_refusal(values)):
            parser.error(f"argument --stack: {values!r}: {refusal}")
        if name not in STACKS:  # worded as argparse's own refusal, which gets a did-you-mean
            parser.error(f"argument --stack: invalid choice: {values!r} (choose from "
                         f"{', '.join(map(repr, STACKS))})")
        namespace.stack = name
        namespace.stack_era_named = not names_no_era(values)


def resolve_stack(args, gpu) -> None:
    """The profile --stack prices on `gpu`: a stack's plain name (or the default) takes the era of
    its published runs on the GPU's generation (stack.ARCH_ERAS); a version the user named wins."""
    from simpar.specs.stack import stack_on

    if not args.stack_era_named:
        args.stack = stack_on(args.stack, gpu.arch)
        args.stack_era_named = True


def compiled(args) -> bool:
    """--compile or --no-compile as given; unsaid, what the stack's recipe for the precision
    does (Stack.compiles_by_default)."""
    from simpar.specs.stack import get_stack

    if args.compile is not None:
        return args.compile
    return get_stack(args.stack).compiles_by_default(args.dtype)


def default_grad_reduce(args) -> str:
    """The gradient precision to price: the user's --grad-reduce, else the one the stack runs
    the job's dtype with where it differs from its profile's (Stack.default_grad_reduce)."""
    from simpar.specs.stack import get_stack

    return args.grad_reduce or get_stack(args.stack).default_grad_reduce(args.dtype)


def stack_profile(args):
    """The --stack profile as the flags run it: compiled or not, with the AdamW, gradient
    precision, norms and attention kernel they name (each as the stack does where unsaid)."""
    from simpar.specs.stack import get_stack

    return get_stack(args.stack, compiled(args), args.optimizer or "", default_grad_reduce(args),
                     args.norm or "", args.attention or "")


def stack_defaults(args, tp: int, whole_gradients: bool, shard_ranks: int, gpu) -> dict:
    """Strategy fields the user left unsaid, from the stack's profile; a flag the user gives wins,
    and what-ifs that need whole gradients per replica (`whole_gradients`) default to ZeRO 0, as
    does a shard group of one rank (`shard_ranks`): torchtitan and execpar apply no FSDP without
    a second data-parallel rank, Megatron's distributed optimizer shards nothing over one."""

    grad_reduce = default_grad_reduce(args)
    prof = stack_profile(args)
    fp8_scaling = getattr(args, "fp8_scaling", None) or ""
    fp8_all_gather = getattr(args, "fp8_all_gather", None)
    sp = args.sp if args.sp is not None else prof.sp_with_tp and tp > 1
    overlap = args.overlap_tp_comm
    if overlap is None:
        overlap = prof.overlaps_tp(args.dtype, gpu) and sp
    # torch's RMSNorm decomposes into eager fp32 ops on a CPU device
    norm = args.norm or ("fp32" if prof.torch_rms_norm and gpu.arch == "cpu" else "")
    unsharded = whole_gradients or shard_ranks == 1
    zero = args.zero if args.zero is not None else 0 if unsharded else prof.default_zero
    if args.zero is None and args.pp > 1:
        zero = min(zero, prof.max_zero_with_pp)
    return {
        "stack": args.stack, "compile": prof.compile, "sp": sp, "overlap_tp_comm": overlap,
        "zero": zero, "kernels": args.kernels or "", "loss": args.loss or "",
        "optimizer": args.optimizer or "", "grad_reduce": grad_reduce,
        "norm": norm, "attention": args.attention or "", "fp8_scaling": fp8_scaling,
        "fp8_all_gather": fp8_all_gather,
        "pipeline_outputs": getattr(args, "pipeline_outputs", None) or "",
        "cuda_graphs": getattr(args, "cuda_graphs", False),
        "moe_dispatch": getattr(args, "moe_dispatch", None) or "",
        "fold_experts": getattr(args, "fold_experts", None)
    }


# A pipeline rank holds at least one layer (ModelSpec's MAX_LAYERS bounds them)
MAX_PIPELINE_RANKS = 100_000
# A rank this many times slower has failed rather than straggled
MAX_SLOWDOWN = 100.0


def stage_pairs(text: str, convert):
    """'3:1.5' or '8-15:a100-80gb' -> ((3, 1.5),) / ((8, 'a100-80gb'), ..., (15, ...))."""
    try:
        ranks, value = text.split(":", 1)
        lo, _, hi = ranks.partition("-")
        first, last, converted = int(lo), int(hi or lo), convert(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid {text!r}: give RANK:VALUE or FIRST-LAST:VALUE, e.g. 3:1.5") from None
    if not 0 <= first <= last < MAX_PIPELINE_RANKS:
        raise argparse.ArgumentTypeError(
            f"invalid {text!r}: give pipeline ranks FIRST-LAST with 0 <= FIRST <= LAST < "
            f"{MAX_PIPELINE_RANKS:,}")
    return tuple((r, converted) for r in range(first, last + 1))


def add_sim_flags(p):
    g = p.add_argument_group("event engine (simulate)")
    g.add_argument(
        "--engine", default="event", choices=["event", "analytic"],
        help="event: play the step as a discrete-event simulation (default); analytic: closed form")
    g.add_argument(
        "--sim-schedule", choices=list(SCHEDULES), type=schedule_name,
        help="simulate this pipeline schedule instead of --schedule (zero-bubble ones: event "
        "engine)")
    g.add_argument("--steps", type=int, default=1,
                   help="steps to simulate (p50/p99 over them; default 1)")
    g.add_argument("--straggler", type=lambda t: stage_pairs(t, float), action="append", default=[],
                   help="slow pipeline rank(s) by a factor, e.g. 3:1.3 or 0-1:1.1 (repeatable)")
    g.add_argument("--jitter", type=float, default=0.0,
                   help="sigma of a lognormal slowdown on every compute op")
    g.add_argument("--seed", type=int, default=0, help="random seed for --jitter")
    g.add_argument(
        "--stage-gpu", type=lambda t: stage_pairs(t, str), action="append", default=[],
        help="run pipeline rank(s) on another GPU type, e.g. 8-15:a100-80gb (repeatable)")
    g.add_argument("--no-contention", action="store_true",
                   help="transfers on one link do not slow each other")
    g.add_argument("--trace", type=path,
                   help="write a Chrome trace (JSON, opens in Perfetto) of the first step")
    g.add_argument("--timeline", type=path, help="write a timeline PNG of the first step")


def sim_options(args):
    from simpar.sim.engine import SimOptions
    from simpar.specs.cluster import gpu_name, resolve_gpu

    stragglers = tuple(p for group in args.straggler for p in group)
    for rank, factor in stragglers:
        require(1.0 <= factor <= MAX_SLOWDOWN, "--straggler", f"{rank}:{factor}",
                f"the factor is a slowdown: give a value from 1 to {MAX_SLOWDOWN:g}")
    gpus = tuple((rank, gpu_name(name)) for group in args.stage_gpu for rank, name in group)
    for flag, pairs in (("--straggler", stragglers), ("--stage-gpu", gpus)):
        seen: set[int] = set()
        for rank, _ in pairs:
            require(rank not in seen, flag, rank, "names this pipeline rank twice: give each once")
            seen.add(rank)
    for rank, name in gpus:
        try:
            resolve_gpu(name)
        except SpecError as exc:
            raise SpecError("--stage-gpu", f"{rank}:{name}", exc.fix) from None
    return SimOptions(schedule=args.sim_schedule, steps=args.steps,
                      stragglers=stragglers, jitter=args.jitter, seed=args.seed, stage_gpus=gpus,
                      contention=not args.no_contention, trace=bool(args.trace or args.timeline))


def add_strategy_flags(p):
    g = p.add_argument_group("strategy (dp*tp*pp*cp must equal --gpus)")
    g.add_argument("--dp", type=int, help="data-parallel degree (default: --gpus / (tp*pp*cp))")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (default 1)")
    g.add_argument("--pp", type=int, default=1, help="pipeline-parallel stages (default 1)")
    g.add_argument("--cp", type=int, default=1,
                   help="context-parallel degree: sequence split for attention")
    g.add_argument("--ep", type=int, default=1,
                   help="expert-parallel degree (MoE), carved out of dp*cp, or of tp*dp*cp "
                   "where the stack runs experts whole under tp (nemo; --fold-experts)")
    from simpar.specs.stack import STACKS

    zeros = "; ".join(f"{s.name} {s.default_zero}" for s in STACKS.values())
    g.add_argument(
        "--zero", type=zero_stage, help="ZeRO stage: 0 DDP, 1 optimizer, 2 +gradients, 3 "
        "+weights (FSDP; also as DeepSpeed and FSDP name them: ZeRO-3, FULL_SHARD, SHARD_GRAD_OP, "
        f"NO_SHARD); default: the stack's ({zeros}), 0 where one rank would hold every shard")
    g.add_argument(
        "--dp-shard", type=int, default=0, metavar="N",
        help="hybrid sharding (HSDP): the ZeRO stage shards over groups of N data-parallel ranks "
        "(times cp), which replicate each other and all-reduce their gradient shards; N must "
        "divide --dp (torchtitan's data_parallel_shard_degree); default 0: over all of --dp")
    g.add_argument(
        "--sp", action=argparse.BooleanOptionalAction,
        help="sequence parallel inside the tensor-parallel group (default: on with --tp > 1 for "
        "megatron, nemo and torchtitan)")
    g.add_argument("--micro-batch", type=int,
                   help="sequences per micro-batch (default 1, or set by --grad-accum)")
    g.add_argument("--schedule", help="pipeline schedule: " + "; ".join(
        f"{s.name}: {s.summary}" for s in SCHEDULES.values()) + f" (default {ONE_F_ONE_B.name}, "
        f"{INTERLEAVED.name} where --vpp > 1 and --pp > 1)")
    g.add_argument("--vpp", type=int, default=1,
                   help="virtual stages per pipeline rank (interleaved; more than one, with "
                   "--pp > 1, implies --schedule interleaved)")
    g.add_argument(
        "--recompute", default="none",
        help="activation recompute: none, selective (what the --stack checkpoints: Megatron's "
        "attention core, execpar's whole attention module; latent attention's up-projections), op "
        "(torchtitan op-level: every second GEMM and the elementwise ops), full")
    g.add_argument(
        "--recompute-layers", type=int, default=0, metavar="N",
        help="only N layers of each model chunk recompute, the others keep their activations "
        "(Megatron's --recompute-method block --recompute-num-layers N; torchtitan's layer-level "
        "selective checkpointing of every k-th block: layers per chunk / k); default 0: all")
    g.add_argument(
        "--recompute-modules", default="", metavar="M[,M...]",
        help="what --recompute selective checkpoints, by Megatron core's --recompute-modules "
        "names (megatron and nemo stacks): core_attn (the attention core), mla_up_proj (a latent "
        "attention's up-projections), layernorm (the norms that are modules of their own: a "
        "latent attention's input norm, an MoE layer's pre-MLP norm), moe_act (the routed "
        "experts' activation), mlp (a dense layer's MLP whole), moe (an MoE layer whole, its "
        "all-to-alls again), shared_experts; those a model lacks are left be; e.g. "
        "Megatron-Bridge's gpt-oss recipes: layernorm,moe_act. Default: core_attn, or on a latent "
        "attention mla_up_proj,layernorm")
    g.add_argument(
        "--no-flash-attention", action="store_true",
        help="unfused attention (stores the s^2 scores); default: the stack's (deepspeed runs "
        "Megatron-DeepSpeed's unfused attention)")
    g.add_argument(
        "--kernels",
        choices=["fused", "eager"],
        help="elementwise kernels: fused (Megatron-LM, Transformer Engine, torch.compile) or "
        "eager PyTorch (torchtitan without compile, Hugging Face: unfused fp32 norms and rotary); "
        "default: the stack's",
    )
    g.add_argument("--no-overlap-grad-reduce", action="store_true",
                   help="gradient sync after backward, not during")
    g.add_argument(
        "--overlap-tp-comm", action=argparse.BooleanOptionalAction,
        help="hide tensor-parallel collectives behind GEMMs (default: on with sequence parallelism "
             "for megatron and nemo, whose recipes use --tp-comm-overlap, but nemo's NVFP4 "
             "recipes, which turn it off)")
    g.add_argument(
        "--overlap-ep-comm", action="store_true",
        help="hide expert-parallel all-to-alls behind another micro-batch's compute: Megatron "
             "core's combined 1F1B schedule (--overlap-moe-expert-parallel-comm; Megatron-Bridge "
             "recipes' moe_a2a_overlap), megatron and nemo stacks, --ep > 1, no full recompute, "
             "--schedule interleaved under pipeline parallelism (default: off, as Megatron core)")
    g.add_argument(
        "--bucket-mb", type=float, default=0.0, help="data-parallel bucket size in MiB (default: "
        "Megatron-LM's max(40M, 1M x data-parallel size) parameters; PyTorch DDP uses 25)")


def add_whatif_flags(p):
    g = p.add_argument_group(
        "what-if (each changes how data-parallel replicas share gradients or wait)")
    g.add_argument(
        "--grad-accum", type=int,
        help="micro-batches accumulated per replica before each optimizer step: micro-batch = "
        "global batch / (dp x K); DDP syncs once per step, ZeRO-2/3 per micro-batch")
    g.add_argument(
        "--offload-optimizer", action="store_true",
        help="optimizer states and the Adam step on the host: frees their GPU memory, costs "
             "gradients down + weights up over the host link (the cluster's host_link_gbps: PCIe, "
             "or NVLink-C2C on Grace-Blackwell racks) and the step at its host_memory_gbps")
    g.add_argument(
        "--offload-activations", type=int, default=0, metavar="N",
        help="N layers of each model chunk keep their saved activations in host memory between "
        "forward and backward (Megatron/Transformer Engine's cpu_offloading_num_layers): frees "
        "their GPU memory but two, costs each one down and back over the host link beside the "
        "layer's compute (NVLink-C2C on Grace-Blackwell racks, PCIe elsewhere)")
    g.add_argument(
        "--ps-servers", type=int,
        help="aggregate gradients on S parameter servers instead of all-reduce: push and pull "
        "max(grad, weight bytes) at min(GPU NIC, S x server NIC / GPUs) (BytePS)")
    g.add_argument(
        "--ps-server-gbps", type=float, default=0.0,
        help="NIC bandwidth of one parameter server, GB/s per direction (default: the cluster's "
             "per-GPU NIC)")
    g.add_argument(
        "--async-sgd", action="store_true",
        help="asynchronous SGD on the parameter servers: no barrier, push/pull overlap the next "
        "step, servers run the optimizer; reports staleness (replicas - 1 steps)")
    g.add_argument(
        "--compress", choices=["fp16", "bf16", "powersgd", "topk"],
        help="gradient compression: fp16/bf16 cast (2 bytes/element), PowerSGD (r(n+m) per n x m "
             "matrix, two all-reduces) or top-k (k x (value + int32 index), all-gathered); codec "
             "kernels included")
    g.add_argument("--powersgd-rank", type=int, default=4, help="PowerSGD rank r (default 4)")
    g.add_argument("--topk-ratio", type=float, default=0.01,
                   help="share of gradient elements top-k sends (default 0.01)")
    g.add_argument(
        "--backup-workers", type=float, default=0.0, metavar="PCT",
        help="ignore the slowest PCT%% of replicas each step: wait for the (N-b)-th fastest, "
        "T(1+delay(H_N-H_b)), using (N-b)/N of the batch")
    g.add_argument(
        "--straggler-delay", type=float, metavar="PCT",
        help="replica step times vary: each takes T(1+X), X exponential with mean PCT%% of T; a "
        "synchronous step waits T(1+delay H_N) (default: the cluster's, 0)")


def whatif_fields(args) -> dict:
    """Strategy fields from the what-if flags."""
    out = {
        "offload_optimizer": args.offload_optimizer, "async_sgd": args.async_sgd,
        "offload_activations": args.offload_activations,
        "compress": args.compress or "none", "compress_rank": args.powersgd_rank,
        "topk_ratio": args.topk_ratio, "backup_frac": args.backup_workers / 100
    }
    if args.ps_servers is not None:
        out.update(grad_sync="ps", ps_servers=args.ps_servers, ps_server_gbps=args.ps_server_gbps)
    else:
        require(not args.ps_server_gbps, "--ps-server-gbps", args.ps_server_gbps,
                "is the bandwidth of a parameter server: add --ps-servers S")
    return out


def load_specs(args):
    from simpar.specs import JobSpec, load_cluster, load_model

    model = load_model(args.model)
    cluster = load_cluster(args.cluster, args.gpu)
    resolve_stack(args, cluster.gpu)
    if getattr(args, "power_limit_w", None) is not None:
        from dataclasses import replace

        cluster = replace(cluster, gpu=cluster.gpu.power_limited(args.power_limit_w))
    delay = getattr(args, "straggler_delay", None)
    if delay is not None:
        from dataclasses import replace

        require(delay >= 0, "--straggler-delay", delay, "give a percentage >= 0")
        cluster = replace(cluster, straggler_delay_frac=delay / 100)
    require(args.gpus is not None and args.gpus > 0, "--gpus", args.gpus,
            "must be a positive integer")
    job = JobSpec(args.seq_len, args.global_batch, args.dtype, args.tokens)
    positions = model.position_embeddings
    require(not positions or job.seq_len <= positions, "--seq-len", job.seq_len,
            f"is beyond {model.name}'s {positions:,} learned positions: give at most "
            f"{positions:,}, or a model file with position_embeddings: {job.seq_len}")
    return model, cluster, job


def strategy_from(args, gpu):
    from simpar.specs import Strategy

    inner = args.tp * args.pp * args.cp
    require(inner > 0, "--tp*--pp*--cp", inner, "degrees must be positive integers")
    dp = args.dp if args.dp is not None else args.gpus // inner
    if args.dp is None:
        require(
            args.gpus % inner == 0, "--gpus", args.gpus,
            f"must be divisible by tp*pp*cp = {args.tp}*{args.pp}*{args.cp} = {inner}; change "
            "--tp, --pp or --cp")
    whatif = whatif_fields(args)
    whole = Strategy(**whatif).needs_whole_gradients
    return Strategy(dp=dp, tp=args.tp, pp=args.pp, cp=args.cp, ep=args.ep,
                    dp_shard=args.dp_shard, micro_batch=_micro_batch(args, dp),
                    schedule=_schedule(args), vpp=args.vpp,
                    recompute=args.recompute, recompute_layers=args.recompute_layers,
                    recompute_modules=module_names(args.recompute_modules),
                    flash_attention=False if args.no_flash_attention else None,
                    overlap_grad_reduce=False if args.no_overlap_grad_reduce else None,
                    bucket_mb=args.bucket_mb,
                    overlap_ep_comm=args.overlap_ep_comm,
                    **stack_defaults(args, args.tp, whole, (args.dp_shard or dp) * args.cp, gpu),
                    **whatif)


def module_names(flag: str) -> tuple[str, ...]:
    """--recompute-modules' comma-separated names (Strategy.recompute_modules checks them)."""
    return tuple(m.strip() for m in flag.split(",") if m.strip())


def _schedule(args) -> str:
    """--schedule, or the one the stages imply: interleaved 1F1B where --vpp splits each of
    several pipeline ranks into virtual stages (Megatron's --num-layers-per-virtual-pipeline-stage
    alone runs it), else 1F1B."""
    if args.schedule is not None:
        return args.schedule
    return INTERLEAVED.name if args.vpp > 1 and args.pp > 1 else ONE_F_ONE_B.name


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


def net_args(args):
    """The network options the flags name (--network, --placement, --collective-algo, --routing)."""
    from simpar.network.model import NetworkOptions
    from simpar.network.placement import check_order

    return NetworkOptions(model=args.network, order=tuple(check_order(args.placement.split(","))),
                          algo=args.collective_algo, valiant=args.routing == "valiant")
