"""What execpar can run: the checks `simpar plan` makes before it writes a plan and execpar makes
again before it starts (execpar/mesh.py adds what depends on the machine: torchao installed, gloo
or NCCL). Written without torch, so that planning needs none."""

from __future__ import annotations

from simpar.errors import SpecError
from simpar.specs.precision import get_precision


def check_runnable(strategy, model, job) -> None:
    """Refuse what execpar cannot run, with the reason and the change that runs: `simpar plan`
    before it writes a plan, execpar again before any process starts."""
    s = strategy
    _check_precision(model, job.dtype)
    _check_schedule(s, job)
    # options of another stack's code first: a plan priced for that stack says why it differs
    _check_stack_options(s)
    _check_model(model, s)
    _check_parallelism(s, job)
    _check_what_ifs(s)


def _check_model(model, s) -> None:
    """What execpar's model code (execpar/model.py) cannot build, or split as asked."""
    if model.head_dim % 2:  # rotary embedding rotates pairs of a head's dims
        raise SpecError("model.head_dim", model.head_dim,
                        "execpar's rotary embedding needs an even head dim; change hidden or heads")
    if model.is_mla:
        raise SpecError("model.kv_lora_rank", model.kv_lora_rank,
                        "latent attention is not supported by execpar yet")
    _check_llama_block(model)
    if model.is_moe and s.tp > 1:
        raise SpecError(
            "strategy.tp", s.tp,
            "execpar runs mixture-of-experts layers without tensor parallelism; plan with --tp 1 "
            "(and --ep to split the experts)")
    if s.ep > 1 and model.experts % s.ep:
        raise SpecError("strategy.ep", s.ep, f"must divide the model's {model.experts} experts")
    if s.ep > 1 and (s.shards_optimizer or s.pp > 1):
        raise SpecError(
            "strategy.ep", s.ep,
            "execpar runs expert parallelism beside DDP only; plan with --zero 0 and --pp 1, or "
            "--ep 1")
    if s.pp > 1 and model.tied_embeddings:
        raise SpecError(
            "model.tied_embeddings", True,
            "tied embeddings cannot span pipeline stages in execpar; plan an untied model or --pp 1"
        )


# What execpar's block is (execpar/model.py): RMSNorm, rotary positions, linears without biases, no
# dropout, each layer attending to the whole prefix, an unclamped GLU. A model that differs would
# train as another model than the plan prices: (field, what execpar does instead) for each.
_NOT_BUILT = (("attention_window", "its attention spans the whole prefix, no sliding window"),
              ("position_embeddings", "it encodes positions by rotary, not learned embeddings"),
              ("bias", "its linear layers and norms carry no biases"),
              ("dropout", "it trains without dropout"),
              ("glu_clamp", "its gated MLP clamps nothing"))


def _check_llama_block(model) -> None:
    for field, instead in _NOT_BUILT:
        value = getattr(model, field)
        if value:
            raise SpecError(f"model.{field}", value,
                            f"execpar would run another model ({instead}); plan a model without "
                            f"it, or price it with another --stack")


def _check_parallelism(s, job) -> None:
    """Meshes execpar's apply_* steps (execpar/parallelize.py) do not build."""
    if s.cp > 1 and job.seq_len % (2 * s.cp):
        raise SpecError(
            "seq_len", job.seq_len,
            f"context parallelism balances 2*cp = {2 * s.cp} chunks of each sequence over the cp "
            f"ranks; give a multiple of {2 * s.cp}")
    if s.cp > 1 and s.ep > 1:
        raise SpecError("strategy.cp", s.cp,
                        "execpar splits sequences or experts, not both; plan with --cp 1 or --ep 1")
    if s.dp_shard and not s.shards_gradients:
        raise SpecError("strategy.dp_shard", s.dp_shard,
                        "execpar shards over groups of dp ranks through FSDP2 (HSDP): plan with "
                        "--zero 2 or 3, or without --dp-shard")
    if s.compile and s.tp > 1 and s.recompute in ("selective", "full"):
        # torch 2.13's AOT autograd finds a DeviceMesh among a compiled DTensor block's tensors
        # saved for a checkpointed backward and asserts (runtime_wrappers.py)
        raise SpecError(
            "strategy.compile", True, "execpar cannot compile tensor-parallel blocks under "
            f"--recompute {s.recompute} (torch's compiled DTensor blocks fail under activation "
            "checkpointing): plan without --compile, with --recompute op or none, or --tp 1")


def _check_stack_options(s) -> None:
    """Options of other stacks' code that execpar's does not have."""
    if s.cuda_graphs:
        raise SpecError("strategy.cuda_graphs", True, "execpar launches every kernel from the "
                        "host (Megatron core captures CUDA graphs); plan without --cuda-graphs")
    if s.pipeline_outputs not in ("", "none"):
        raise SpecError("strategy.pipeline_outputs", s.pipeline_outputs,
                        "execpar's pipeline steps keep no stage outputs (return_outputs=False); "
                        "plan without --pipeline-outputs")
    if s.overlap_ep_comm:
        raise SpecError("strategy.overlap_ep_comm", True,
                        "execpar runs each micro-batch's forward and backward on their own "
                        "(torch's schedules), not Megatron's combined 1F1B; plan without "
                        "--overlap-ep-comm")


def _check_what_ifs(s) -> None:
    """What-ifs simpar prices and execpar does not run."""
    simulate_only = (("offload_optimizer", s.offload_optimizer),
                     ("ps_servers", s.grad_sync == "ps" and s.ps_servers),
                     ("async_sgd", s.async_sgd), ("backup_frac", s.backup_frac),
                     ("compress", s.compress == "topk" and "topk"))
    for name, value in simulate_only:
        if value:
            raise SpecError(
                f"strategy.{name}", value,
                "is a what-if simpar predicts but execpar does not run; plan without it")
    if s.compress != "none" and (s.shards_gradients or s.tp > 1 or s.pp > 1):
        raise SpecError(
            "strategy.compress", s.compress, "execpar compresses through a DDP communication "
            "hook: plan with --zero 0 or 1, --tp 1 and --pp 1")


def _check_schedule(s, job) -> None:
    """What torch.distributed.pipelining's schedule classes refuse (schedules.py)."""
    if s.pp == 1:
        return
    schedule, m = s.pipeline, s.micro_batches(job.global_batch)
    if m < schedule.torch_min_micro_batches_per_pp * s.pp:
        raise SpecError(
            "micro-batches", m, f"torch's {schedule.torch_class} needs at least one per "
            f"pipeline stage ({s.pp}): raise --global-batch or lower --micro-batch or --pp")
    if schedule.splits_backward and s.compile:
        raise SpecError(
            "compile", True, f"torch's {schedule.torch_class} refuses compiled stages: plan "
            "without --compile or with --schedule 1f1b, gpipe or interleaved")
    if schedule.splits_backward and s.recompute == "op":
        raise SpecError(
            "recompute", s.recompute, f"{schedule.name} runs each layer's backward in two "
            "passes, which torch's selective activation checkpoint cannot (it backwards its "
            "region once): plan --recompute selective or full, or --schedule 1f1b")


def _check_precision(model, dtype: str) -> None:
    """fp8 runs through torchao's per-tensor float8 linears; block-scaled formats are what-ifs."""
    precision = get_precision(dtype)
    if precision.quantized and dtype != "fp8":
        raise SpecError("dtype", dtype, "execpar runs fp8 with per-tensor scaling (torchao); "
                        "block-scaled formats are a what-if simpar prices: plan with --dtype fp8 "
                        "or bf16")
    widths = {"hidden": model.hidden, "heads*head_dim": model.heads * model.head_dim,
              "kv_heads*head_dim": model.kv_heads * model.head_dim,
              "ffn_hidden": model.ffn_hidden}
    odd = [f"{k} {v}" for k, v in widths.items() if v % 16]
    if dtype == "fp8" and odd:
        raise SpecError("dtype", dtype, f"fp8 GEMMs (torch._scaled_mm) need widths that are "
                        f"multiples of 16; this model has {', '.join(odd)}: plan with bf16")
