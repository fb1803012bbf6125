"""Strategy: how one training step is split over GPUs, and its validation against a
model and job."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import lru_cache

from simpar.errors import one_of, positive_int, require
from simpar.specs.names import canonical
from simpar.specs.precision import get_precision
from simpar.specs.schedule import (
    ONE_F_ONE_B,
    SCHEDULES,
    PipelineSchedule,
    interleaved_warmup,
    schedule_name,
)
from simpar.specs.stack import (
    DEFAULT_STACK,
    KERNELS,
    LOSSES,
    Stack,
    experts_folded,
    get_stack,
    stack_name,
)

ZERO_STAGES = (0, 1, 2, 3)  # 1: optimizer states sharded, 2: and gradients, 3: and parameters
RECOMPUTE = ("none", "selective", "op", "full")  # op: torchtitan's op-level selective checkpointing
# Recompute as trainers' configs and tables write it, in names.normal_form: torchtitan's
# activation_checkpoint modes (mode "none", "full"; "selective" with selective_ac_option "op"),
# fms-fsdp's and torchtitan's tables ("No AC", "Full AC"). Not torchtitan's layer-level selective
# checkpointing (every n-th block whole: --recompute full --recompute-layers), nor a bare "SAC".
RECOMPUTE_ALIASES = {
    **dict.fromkeys(("no", "off", "false", "no-ac", "no-recompute"), "none"),
    **dict.fromkeys(("full-ac", "full-recompute"), "full"),
    **dict.fromkeys(("selective-op", "op-sac", "sac-op", "op-level"), "op"),
}
# what Megatron core's selective recompute can checkpoint, by its --recompute-modules names
# (TransformerConfig.recompute_modules), read in transformer_layer.py, moe/moe_layer.py,
# moe/experts.py and multi_latent_attention.py at Megatron-LM d98e8a64dd. Normal checkpointing
# (the module keeps its input and runs again from it): the attention core ("core_attn"), a dense
# layer's MLP ("mlp"), an MoE layer whole, router, all-to-alls and experts ("moe"), its shared
# experts ("shared_experts"). Output-discarding checkpointing (the output is freed after use and
# made again before the backward needs it): a latent attention's up-projections and rotary
# ("mla_up_proj"), the norms that are modules of their own ("layernorm": a latent attention's input
# norm and an MoE layer's pre-MLP norm; Transformer Engine fuses the others into the linear they
# feed, so the flag leaves them be) and the routed experts' activation ("moe_act").
RECOMPUTE_MODULES = ("core_attn", "mla_up_proj", "layernorm", "moe_act", "mlp", "moe",
                     "shared_experts")
CORE_ATTENTION = frozenset(("core_attn",))  # Megatron's default recompute_modules
WHOLE_MLP = frozenset(("mlp", "moe"))  # the modules that run a layer's MLP (or MoE layer) whole
# data-parallel gradient aggregation: collective, or parameter servers
GRAD_SYNC = ("allreduce", "ps")
COMPRESSIONS = ("none", "fp16", "bf16", "powersgd", "topk")
# Megatron-LM's data-parallel buckets hold max(40M, 1M x data-parallel size) parameters
# (megatron/core/distributed): larger groups get larger buckets, so the per-collective
# latency, paid once per bucket, stays small beside the bandwidth term. A strategy's
# bucket_mb overrides it (PyTorch DDP: 25).
BUCKET_MIN_PARAMS, BUCKET_PARAMS_PER_RANK = 40e6, 1e6


@dataclass(frozen=True)
class Strategy:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1  # context parallel: sequence split for attention (ring attention)
    # expert parallel: experts split over ep ranks of the data-parallel group, or of tp x dp x cp
    # where the stack runs them whole under tp (Stack.folds_experts, Strategy.expert_ranks)
    ep: int = 1
    zero: int = 0  # ZeRO stage 0-3 (3 = FSDP full sharding)
    # hybrid sharding (HSDP; torchtitan's data_parallel_shard_degree, Megatron's distributed
    # optimizer instances): the ZeRO stage shards over groups of dp_shard data-parallel ranks
    # (times cp), which replicate each other and all-reduce their gradient shards; 0: all of dp
    dp_shard: int = 0
    sp: bool = False  # sequence parallel inside the tensor-parallel group
    micro_batch: int = 1  # sequences per micro-batch
    schedule: str = ONE_F_ONE_B.name  # a name of simpar/specs/schedule.py (the object: .pipeline)
    vpp: int = 1  # virtual stages per pipeline rank (interleaved schedule)
    recompute: str = "none"
    # layers of each model chunk that recompute (Megatron's --recompute-method block
    # --recompute-num-layers: the chunk's first N; torchtitan's layer-level selective checkpointing
    # every k-th block: the chunk's layers / k); 0: all of them
    recompute_layers: int = 0
    # what selective recompute checkpoints, as Megatron core's --recompute-modules names it
    # (RECOMPUTE_MODULES); (): the stack's selective (Strategy.selective_modules)
    recompute_modules: tuple[str, ...] = ()
    stack: str = DEFAULT_STACK  # the software that runs the step (simpar/specs/stack.py)
    compile: bool = False  # torch.compile of each block (stacks that have it)
    cuda_graphs: bool = False  # the step replays CUDA graphs (stacks whose trainer captures them)
    # fused attention kernel (no s^2 activations); None: the stack's (Strategy.flash)
    flash_attention: bool | None = None
    # elementwise kernels: fused or eager PyTorch; "": the stack's (Strategy.elementwise)
    kernels: str = ""
    loss: str = ""  # the cross entropy the training code runs (stack.LOSSES); "": the stack's
    optimizer: str = ""  # torch.optim.AdamW's implementation (stack.ADAM_IMPLS); "": the stack's
    grad_reduce: str = ""  # precision gradients are reduced in (stack.GRAD_REDUCE); "": the stack's
    norm: str = ""  # how the norms run (stack.NORMS); "": the stack's
    attention: str = ""  # the fused attention kernel called (stack.ATTENTION); "": the stack's
    fp8_scaling: str = ""  # per-tensor fp8's scaling (stack.FP8_SCALING); "": the stack's
    # torchao's fp8 linears' weights gathered in fp8 under ZeRO-3 (Stack.fp8_weight_gathers);
    # None: as the stack does
    fp8_all_gather: bool | None = None
    # what the pipeline schedule keeps of its stage outputs (stack.PIPELINE_OUTPUTS); "": stack's
    pipeline_outputs: str = ""
    # how MoE dispatches move tokens (stack.MOE_DISPATCHES); "": the stack's
    moe_dispatch: str = ""
    # routed experts whole on each rank under tp (Stack.folds_experts); None: as the stack does
    fold_experts: bool | None = None
    # gradient reduce (and ZeRO param gather) overlap compute; None: as the stack's trainer does
    # (Stack.grad_reduce_overlap), resolved when the strategy is made
    overlap_grad_reduce: bool | None = None
    # tensor-parallel collectives overlap GEMMs (comm/GEMM pipelining)
    overlap_tp_comm: bool = False
    # expert-parallel all-to-alls hide behind another micro-batch's compute (Stack.ep_overlap)
    overlap_ep_comm: bool = False
    # data-parallel bucket size in MiB; 0: Megatron-LM's rule (cost/gradsync.py)
    bucket_mb: float = 0.0
    # optimizer states and the Adam step live on the host (ZeRO-Offload)
    offload_optimizer: bool = False
    # layers of each model chunk whose saved activations wait in host memory between forward and
    # backward (Megatron/Transformer Engine's cpu_offloading_num_layers)
    offload_activations: int = 0
    # what-if: how data-parallel replicas exchange gradients (see
    # simpar/cost/gradsync.py, replicas.py)
    grad_sync: str = "allreduce"
    ps_servers: int = 0  # parameter servers (grad_sync "ps")
    # NIC bandwidth of one server per direction; 0: the cluster's per-GPU NIC
    ps_server_gbps: float = 0.0
    async_sgd: bool = False  # replicas push and pull without a barrier (needs parameter servers)
    compress: str = "none"
    compress_rank: int = 4  # PowerSGD rank r
    topk_ratio: float = 0.01  # share of gradient elements top-k sends
    # share of data-parallel replicas a step does not wait for (backup workers)
    backup_frac: float = 0.0

    def __post_init__(self):
        # a plan file's "compile": "no" was taken as true
        for name in _BOOL_FIELDS:
            value = getattr(self, name)
            if value is not None or name not in _OPTIONAL_BOOL_FIELDS:
                require(isinstance(value, bool), name, value, "give true or false")
        # a plan file's or caller's name for the stack, as the profile is named (plans record it)
        object.__setattr__(self, "stack", stack_name(self.stack))
        object.__setattr__(self, "schedule", schedule_name(self.schedule))
        object.__setattr__(self, "recompute",
                           canonical(self.recompute, RECOMPUTE, RECOMPUTE_ALIASES))
        # one-line errors for an unknown stack or --compile
        profile = get_stack(self.stack, self.compile, self.optimizer, self.grad_reduce, self.norm,
                            self.attention, fp8_scaling=self.fp8_scaling,
                            fp8_all_gather=self.fp8_all_gather,
                            pipeline_outputs=self.pipeline_outputs, cuda_graphs=self.cuda_graphs,
                            moe_dispatch=self.moe_dispatch, fold_experts=self.fold_experts)
        if self.overlap_grad_reduce is None:
            object.__setattr__(self, "overlap_grad_reduce", profile.grad_reduce_overlap)
        require(not self.fp8_scaling or profile.fp8_casts != "torchao", "fp8_scaling",
                self.fp8_scaling, f"{self.stack}'s float8 (torchao, tensorwise) finds each scale "
                "as it casts: drop --fp8-scaling")
        require(self.fp8_all_gather is None or profile.fp8_casts == "torchao", "fp8_all_gather",
                self.fp8_all_gather, f"{self.stack} gathers its weights in 16 bits (Transformer "
                "Engine casts after the gather); torchao's float8 stacks (torchtitan, execpar) "
                "choose: drop --fp8-all-gather")
        for f in ("dp", "tp", "pp", "cp", "ep", "micro_batch", "vpp"):
            positive_int(f, getattr(self, f))
        require(self.zero in ZERO_STAGES, "zero", self.zero, "choose a ZeRO stage 0, 1, 2 or 3")
        self._check_dp_shard()
        one_of("schedule", self.schedule, SCHEDULES)
        pipe = self.pipeline
        if self.overlap_ep_comm:
            refusal = ep_overlap_refusal(profile, self.ep, self.recompute, self.pp, pipe)
            require(not refusal, "overlap_ep_comm", True, f"{refusal}, or drop --overlap-ep-comm")
        one_of("recompute", self.recompute, RECOMPUTE)
        require(type(self.recompute_layers) is int and self.recompute_layers >= 0,
                "recompute_layers", self.recompute_layers,
                "give a number of layers per model chunk >= 0 (0: all)")
        require(not self.recompute_layers or self.recompute != "none", "recompute_layers",
                self.recompute_layers, "says how many layers recompute: add --recompute full "
                "(or selective, op)")
        self._check_recompute_modules(profile)
        if self.kernels:
            one_of("kernels", self.kernels, KERNELS)
        if self.loss:
            one_of("loss", self.loss, LOSSES)
        require(not self.sp or self.tp > 1, "sp", self.sp,
                "sequence parallel needs --tp > 1; drop --sp")
        require(self.vpp == 1 or pipe.virtual_stages, "vpp", self.vpp,
                "virtual stages need --schedule interleaved (or set --vpp 1)")
        require(not pipe.needs_pipeline or self.pp > 1, "schedule", self.schedule,
                f"{self.schedule} needs --pp > 1; use 1f1b")
        require(
            not pipe.virtual_stages or self.vpp > 1, "vpp", self.vpp,
            f"{self.schedule} needs --vpp >= 2 virtual stages per rank (or use --schedule 1f1b)")
        require(self.bucket_mb >= 0, "bucket_mb", self.bucket_mb,
                "must be >= 0 (0: Megatron-LM's rule)")
        require(type(self.offload_activations) is int and self.offload_activations >= 0,
                "offload_activations", self.offload_activations,
                "give a number of layers >= 0 (0: none)")
        require(
            self.pp == 1 or self.zero <= profile.max_zero_with_pp, "zero", self.zero,
            f"{profile.name} runs ZeRO stage {profile.max_zero_with_pp} at most with pipeline "
            f"parallelism; use --zero {profile.max_zero_with_pp} or --pp 1")
        self._check_grad_sync()

    def _check_dp_shard(self):
        d = self.dp_shard
        require(type(d) is int and d >= 0, "dp_shard", d,
                "give the data-parallel ranks each shard group holds, >= 0 (0: all of --dp)")
        if d == self.dp:  # one group of all of dp: plain sharding, one spelling of it
            object.__setattr__(self, "dp_shard", 0)
        if not self.dp_shard:
            return
        require(self.dp % d == 0, "dp_shard", d, f"must divide --dp ({self.dp})")
        require(self.zero >= 1, "dp_shard", d,
                "shards a ZeRO stage over groups of dp ranks: add --zero 1, 2 or 3")
        require(self.ep == 1, "dp_shard", d,
                "hybrid sharding beside expert parallelism is not modelled: use --ep 1 or drop "
                "--dp-shard")

    @property
    def shard_ranks(self) -> int:
        """Ranks one ZeRO shard group spans: dp_shard (all of dp unless hybrid) times cp; expert
        weights shard over shard_ranks // ep of them (hybrid sharding excludes ep)."""
        return (self.dp_shard or self.dp) * self.cp

    def shard_of(self, dense: float, expert: float) -> float:
        """A rank's shard of `dense` + `expert` parameters where they are sharded (ZeRO's
        optimizer states, or its gradients): dense ones over shard_ranks, expert ones over
        expert_shard_ranks."""
        return dense / self.shard_ranks + expert / self.expert_shard_ranks

    @property
    def folds_experts(self) -> bool:
        """Routed experts run whole on each rank of a tensor-parallel group, ep cut from
        tp x dp x cp (stack.experts_folded)."""
        return experts_folded(self.profile.folds_experts, self.tp, self.ep)

    @property
    def expert_tp(self) -> int:
        """Ranks one routed expert's weights split over: 1 where folded, else tp."""
        return 1 if self.folds_experts else self.tp

    @property
    def expert_ranks(self) -> int:
        """Ranks the experts split over (ep) and replicate across (edp): dp x cp, times tp where
        folded (Megatron's EP x ETP x EDP = TP x DP x CP)."""
        return self.dp * self.cp * (self.tp // self.expert_tp)

    @property
    def edp(self) -> int:
        """Replicas of each expert shard: its gradients' reduction group."""
        return self.expert_ranks // self.ep

    @property
    def expert_shard_ranks(self) -> int:
        """Ranks ZeRO shards an expert weight's states over: its replicas within a shard group."""
        return self.shard_ranks * (self.tp // self.expert_tp) // self.ep

    @property
    def shard_replicas(self) -> int:
        """Groups that each hold a whole sharded copy (HSDP's replicas; 1 without it)."""
        return self.dp // (self.dp_shard or self.dp)

    def _check_grad_sync(self):
        one_of("grad_sync", self.grad_sync, GRAD_SYNC)
        ps = self.grad_sync == "ps"
        require(not ps or (isinstance(self.ps_servers, int) and self.ps_servers > 0), "ps_servers",
                self.ps_servers, "parameter-server aggregation needs a positive number of servers")
        require(self.ps_server_gbps >= 0, "ps_server_gbps", self.ps_server_gbps,
                "must be >= 0 (0: the cluster's NIC)")
        require(not self.async_sgd or ps, "async_sgd", True,
                "asynchronous SGD pushes to parameter servers: add --ps-servers S")
        one_of("compress", self.compress, COMPRESSIONS)
        positive_int("compress_rank", self.compress_rank)
        require(0 < self.topk_ratio <= 1, "topk_ratio", self.topk_ratio,
                "is a share of gradient elements: give (0, 1]")
        require(0 <= self.backup_frac < 1, "backup_frac", self.backup_frac,
                "is a share of replicas: give [0, 1)")
        require(not self.grad_reduce or self.compress == "none", "grad_reduce", self.grad_reduce,
                "gradient compression sets what the reduction sends: drop --grad-reduce or "
                "--compress")
        require(
            not self.shards_optimizer or not self.needs_whole_gradients, "zero", self.zero,
            "parameter servers, backup workers, PowerSGD and top-k need whole gradients on each "
            "replica: use --zero 0")

    @property
    def shards_optimizer(self) -> bool:
        """ZeRO-1 and above: each data-parallel rank keeps and updates its shard of the
        optimizer states."""
        return self.zero >= 1

    @property
    def shards_gradients(self) -> bool:
        """ZeRO-2 and above: gradients are reduce-scattered, each rank keeping its shard."""
        return self.zero >= 2

    @property
    def shards_parameters(self) -> bool:
        """ZeRO-3 (FSDP's full sharding): weights are sharded too and gathered for each use."""
        return self.zero >= 3

    def bucket_params(self, bytes_per_param: float) -> float:
        """Parameters per data-parallel gradient bucket: bucket_mb, or Megatron-LM's rule."""
        if self.bucket_mb:
            return self.bucket_mb * 2**20 / bytes_per_param
        return max(BUCKET_MIN_PARAMS, BUCKET_PARAMS_PER_RANK * self.dp * self.cp)

    @property
    def needs_whole_gradients(self) -> bool:
        """Parameter servers, backup workers, PowerSGD and top-k work on each replica's
        whole gradient."""
        return (
            self.grad_sync == "ps" or self.backup_frac > 0 or self.compress in ("powersgd", "topk")
        )

    @property
    def profile(self) -> Stack:
        """The stack profile this strategy is priced with."""
        return get_stack(self.stack, self.compile, self.optimizer, self.grad_reduce, self.norm,
                         self.attention, fsdp=self.shards_gradients or self.tp > 1,
                         fp8_scaling=self.fp8_scaling, fp8_all_gather=self.fp8_all_gather,
                         pipeline_outputs=self.pipeline_outputs, cuda_graphs=self.cuda_graphs,
                         moe_dispatch=self.moe_dispatch, fold_experts=self.fold_experts)

    @property
    def accumulates_unsharded(self) -> bool:
        """ZeRO-2/3 under pipeline parallelism in a stack that keeps each stage gathered
        across micro-batches (torchtitan: FSDP2 without resharding under PP, and
        torch.distributed.pipelining turning gradient sync off until a stage's last
        backward): weights are gathered once per step, gradients accumulate unsharded in
        the reduce precision and are reduce-scattered once."""
        return self.shards_gradients and self.pp > 1 and not self.profile.reshard_under_pp

    def fp32_stream(self, dtype: str) -> bool:
        """The residual stream is fp32 (Stack.fp32_stream): the stack autocasts fp32 weights and
        this strategy shards no parameters (FSDP casts them itself)."""
        return self.profile.fp32_stream(dtype, self.shards_parameters)

    def keeps_fp32_gradients(self, dtype: str) -> bool:
        """DeepSpeed's BF16_Optimizer runs the step (Stack.grad_accumulation "hp_copy"): bf16
        under its pipeline engine (ZeRO 0/1; #1801, April 2022: the engine's bf16 path) or under
        ZeRO 0; its ZeRO-1/2 optimizer takes plain-engine bf16 runs. It keeps an fp32 copy of the
        whole (unpartitioned) gradients beside the bf16 ones (bf16_optimizer.py:
        fp32_groups_gradients_flat, zeros_like each bf16 flat group), adds every micro-batch's
        gradients into it and reduces that copy."""
        return (self.profile.grad_accumulation == "hp_copy" and dtype == "bf16"
                and not self.shards_gradients and (self.pp > 1 or self.zero == 0))

    def optimizer_zero(self, dtype: str) -> int:
        """The ZeRO stage the optimizer step runs at: the strategy's, but at least 1 under
        DeepSpeed's BF16_Optimizer (keeps_fp32_gradients), which at ZeRO 0 too keeps each
        data-parallel rank's partition of the fp32 weights and Adam moments, steps it and
        all-gathers the updated bf16 weights (bf16_optimizer.py: fp32_groups_flat_partition,
        update_lp_params; BLOOM's recipe: "bf16 must use z0! it implements its own zero stage 1
        equivalent")."""
        return max(self.zero, 1) if self.keeps_fp32_gradients(dtype) else self.zero

    @property
    def loss_kind(self) -> str:
        """The cross entropy priced: the user's where given (kept unresolved, so that a copy of this
        strategy with another stack takes that stack's), else the stack's."""
        return self.loss or self.profile.loss_kind

    @property
    def pipeline(self) -> PipelineSchedule:
        """The pipeline schedule this strategy runs."""
        return SCHEDULES[self.schedule]

    def paired_share(self, micro_batches: int) -> float:
        """The share of a stage's forwards that run beside another micro-batch's backward: the
        schedule's own (DualPipeV), or with --overlap-ep-comm each forward that follows a backward
        (combined_1f1b.py: all but the first without pipelining; under the interleaved schedule
        all but each rank's warm-up and the first after it, averaged over the ranks)."""
        if not self.overlap_ep_comm:
            return self.pipeline.paired_share(micro_batches, self.pp)
        total = micro_batches * self.vpp
        warm = [interleaved_warmup(r, self.pp, self.vpp, total) if self.pp > 1 else 0
                for r in range(self.pp)]
        return sum(max(0, total - w - 1) for w in warm) / (self.pp * total)

    def recomputed(self, layers: int, chunks: int = 1) -> int:
        """Of `layers` layers in `chunks` model chunks, how many recompute in backward."""
        if self.recompute == "none":
            return 0
        return min(self.recompute_layers * chunks, layers) if self.recompute_layers else layers

    def _check_recompute_modules(self, profile) -> None:
        # a plan file's JSON list, or a caller's list
        object.__setattr__(self, "recompute_modules", tuple(self.recompute_modules))
        if not self.recompute_modules:
            return
        shown = ",".join(map(str, self.recompute_modules))
        for name in self.recompute_modules:
            one_of("recompute_modules", name, RECOMPUTE_MODULES)
        require(len(set(self.recompute_modules)) == len(self.recompute_modules),
                "recompute_modules", shown, "names a module twice; name each once")
        require(self.recompute == "selective", "recompute_modules", shown,
                "say what selective recompute checkpoints: add --recompute selective")
        require(profile.recompute_modules, "recompute_modules", shown,
                f"{self.stack} does not name its recompute by modules (Megatron core does): use "
                "--stack megatron or nemo, or drop --recompute-modules")

    def selective_modules(self, model) -> frozenset[str]:
        """What selective recompute checkpoints on `model` (RECOMPUTE_MODULES): --recompute-modules,
        else the attention core, or on a latent attention what Megatron-Bridge's DeepSeek-V3
        recipes ask (recompute_modules [mla_up_proj]) with the norms beside it, as simpar priced
        selective there before the modules could be named; of them, those the model has (as
        Megatron leaves a module be that a layer lacks; simpar prices every layer of an MoE model
        as an MoE layer, so "mlp" there, on its dense first layers, is not priced). Empty but
        under selective."""
        if self.recompute != "selective":
            return frozenset()
        named = frozenset(self.recompute_modules) or (
            frozenset(("mla_up_proj", "layernorm")) if model.is_mla else CORE_ATTENTION)
        has = {"core_attn", "layernorm", "moe_act" if model.is_moe else "mlp"}
        if model.is_moe:
            has.add("moe")
        if model.is_mla:
            has.add("mla_up_proj")
        if model.shared_experts:
            has.add("shared_experts")
        return named & has

    @property
    def recompute_label(self) -> str:
        """The recompute mode, e.g. "full", "full (4 layers/chunk)" or "selective (layernorm,
        moe_act)"."""
        label = self.recompute
        if self.recompute_modules:
            label += f" ({', '.join(self.recompute_modules)})"
        return f"{label} ({self.recompute_layers} layers/chunk)" if (
            self.recompute_layers) else label

    def chunk_layers(self, model_layers: int) -> int:
        """The most layers one model chunk (virtual pipeline stage) holds."""
        return -(-model_layers // (self.pp * self.chunks_per_rank))

    def recompute_share(self, model_layers: int) -> float:
        """Share of the model's layers that recompute."""
        chunks = self.pp * self.chunks_per_rank
        return self.recomputed(model_layers, chunks) / model_layers

    @property
    def chunks_per_rank(self) -> int:
        """Pipeline chunks (virtual stages) each pipeline rank runs."""
        return self.pipeline.chunks_per_rank(self.vpp)

    @property
    def mesh_label(self) -> str:
        """The degrees, e.g. "dp64 tp8+sp pp2 cp2" (cp and ep only when split; "dp64/8": shard
        groups of 8 of them, hybrid)."""
        dp = f"dp{self.dp}" + (f"/{self.dp_shard}" if self.dp_shard else "")
        parts = [dp, f"tp{self.tp}{'+sp' if self.sp else ''}", f"pp{self.pp}"]
        return " ".join(parts + [f"{k}{v}" for k, v in (("cp", self.cp), ("ep", self.ep)) if v > 1])

    @property
    def schedule_label(self) -> str:
        """The pipeline schedule, e.g. "interleaved v8"; "-" without pipeline parallelism."""
        if self.pp == 1:
            return "-"
        return f"{self.schedule} v{self.vpp}" if self.pipeline.virtual_stages else self.schedule

    @property
    def label(self) -> str:
        """Degrees, ZeRO stage and schedule on one line, e.g. "dp64 tp8+sp pp2 z1
        interleaved v8"."""
        return f"{self.mesh_label} z{self.zero} {self.schedule_label}"

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    def micro_batches(self, global_batch: int) -> int:
        return global_batch // (self.dp * self.micro_batch)

    @property
    def elementwise(self) -> str:
        """The elementwise kernels priced: the ones the user named, else the stack's. Resolved
        here, not stored, so that replace(s, stack=...) takes the new stack's."""
        return self.kernels or self.profile.elementwise

    @property
    def flash(self) -> bool:
        """A fused attention kernel is priced: as the user said, else as the stack runs."""
        if self.flash_attention is None:
            return self.profile.attention != "unfused"
        return self.flash_attention

    def pinned(self) -> Strategy:
        """The same strategy with the kernels and attention it is priced with written out, as a
        plan records it."""
        return replace(self, kernels=self.elementwise, flash_attention=self.flash)

    def to_dict(self) -> dict:
        """Every field, with the kernels and attention the prediction priced."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)},
                "kernels": self.elementwise, "flash_attention": self.flash}

    @property
    def has_whatifs(self) -> bool:
        """Any what-if set (self != self.without_whatifs(), without building the other strategy)."""
        return any(getattr(self, f) != _PLAIN_WHATIFS[f] for f in WHATIF_FIELDS)

    def without_whatifs(self) -> Strategy:
        """The same mesh and schedule with the plain DDP/ZeRO all-reduce and no offload."""
        plain = Strategy()
        return replace(self, **{f: getattr(plain, f) for f in WHATIF_FIELDS})


WHATIF_FIELDS = ("offload_optimizer", "grad_sync", "ps_servers", "ps_server_gbps", "async_sgd",
                 "compress", "compress_rank", "topk_ratio", "backup_frac")
_PLAIN_WHATIFS = {f.name: f.default for f in fields(Strategy) if f.name in WHATIF_FIELDS}
# the fields that hold a bool (or an optional one), checked on every Strategy: named once here,
# as the search builds tens of thousands of strategies
_BOOL_FIELDS = tuple(f.name for f in fields(Strategy) if f.type in ("bool", "bool | None"))
_OPTIONAL_BOOL_FIELDS = tuple(f.name for f in fields(Strategy) if f.type == "bool | None")


def ep_overlap_refusal(profile: Stack, ep: int, recompute: str, pp: int,
                       pipe: PipelineSchedule) -> str:
    """Why Megatron core would refuse --overlap-ep-comm here (TransformerConfig.__post_init__),
    "" where its combined 1F1B runs (the model's precision: check_ep_overlap_precision)."""
    if not profile.ep_overlap:
        return f"{profile.name} has no combined 1F1B schedule (Megatron core's)"
    if ep == 1:
        return "it hides expert-parallel all-to-alls: give --ep > 1"
    if recompute == "full":
        return "Megatron core runs it without full recompute: give another --recompute"
    if pp > 1 and not pipe.virtual_stages:
        return "with pipeline parallelism it needs virtual stages: give --schedule interleaved"
    return ""


def check_ep_overlap_precision(on: bool, dtype: str) -> None:
    """Megatron core's combined 1F1B runs on a bf16 or fp16 model (fp8 and fp4 included)."""
    require(not on or not get_precision(dtype).wide, "overlap_ep_comm", True,
            f"Megatron core runs it on a bf16 or fp16 model, not {dtype}: give --dtype bf16 "
            "(or fp8), or drop --overlap-ep-comm")


def check_fp8_flags(scaling: str, dtype: str, all_gather: bool | None = None) -> None:
    """--fp8-scaling says how per-tensor fp8 is scaled, --fp8-all-gather how its weights are
    gathered: they mean nothing for another precision."""
    require(not scaling or dtype == "fp8", "fp8_scaling", scaling,
            f"scales per-tensor fp8 (--dtype fp8), not {dtype}: drop --fp8-scaling")
    require(all_gather is None or dtype == "fp8", "fp8_all_gather", all_gather,
            f"gathers the weights of per-tensor fp8 linears (--dtype fp8), not {dtype}: drop "
            "--fp8-all-gather")


def experts_split(ep: int, tp: int, dp: int, cp: int, folds: bool) -> bool:
    """Whether `ep` ranks can split a model's experts: runs of dp x cp, or where the stack `folds`
    them (Strategy.folds_experts) runs of tp x dp x cp made of whole tensor-parallel groups or
    inside one (the rule validate applies and the search enumerates by)."""
    folded = experts_folded(folds, tp, ep)
    ranks = dp * cp * (tp if folded else 1)
    return ranks % ep == 0 and (not folded or ep % tp == 0 or tp % ep == 0)


def validate(strategy: Strategy, model, job, gpus: int) -> None:
    """Reject combinations that cannot run, naming the constraint and the fix."""
    s = strategy
    inner = s.tp * s.pp * s.cp
    fix = f"change --dp to {gpus // inner}"
    if gpus % inner:
        fix = f"choose tp*pp*cp dividing {gpus}"
    require(s.gpus == gpus, "dp*tp*pp*cp", f"{s.dp}*{s.tp}*{s.pp}*{s.cp}={s.gpus}",
            f"must equal --gpus {gpus}; {fix}")
    require(model.heads % s.tp == 0, "tp", s.tp, f"must divide the model's heads ({model.heads})")
    require(model.kv_heads % s.tp == 0, "tp", s.tp,
            f"must divide the model's kv_heads ({model.kv_heads})")
    require(model.ffn_hidden % s.tp == 0, "tp", s.tp,
            f"must divide the model's ffn_hidden ({model.ffn_hidden})")
    # Megatron's account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split
    # count the embedding and the loss as a layer each, so the first and the last chunk may hold
    # no transformer layer (its 405B recipes: 126 layers in pp 16 x vpp 8 chunks)
    chunks = s.pp * s.chunks_per_rank
    require(model.layers + 2 >= chunks, "pp*vpp", chunks,
            f"pipeline chunks must be at most the model's layers plus 2, for the embedding and "
            f"the loss ({model.layers + 2})")
    most = s.chunk_layers(model.layers)
    require(s.recompute_layers <= most, "recompute_layers", s.recompute_layers,
            f"each model chunk holds at most {most} layers: give at most {most} (0: all)")
    require(s.offload_activations <= most, "offload_activations", s.offload_activations,
            f"each model chunk holds at most {most} layers: give at most {most}")
    require(job.seq_len % s.cp == 0, "cp", s.cp, f"must divide --seq-len ({job.seq_len})")
    # PowerSGD sends r (n + m) of each n x m gradient matrix: from r = n m / (n + m), about half
    # the model's width, it sends more than the matrix (a rank of 10^9 priced a 20-hour step)
    widest = model.hidden // 2
    require(s.compress != "powersgd" or s.compress_rank <= widest, "compress_rank",
            s.compress_rank, f"PowerSGD at this rank sends more than the gradient it compresses: "
            f"give at most {widest} (half the model's width; 1-32 is usual)")
    check_fp8_flags(s.fp8_scaling, job.dtype, s.fp8_all_gather)
    check_ep_overlap_precision(s.overlap_ep_comm, job.dtype)
    require(
        not s.sp or job.seq_len % (s.cp * s.tp) == 0, "seq_len", job.seq_len,
        f"sequence parallelism splits each rank's {job.seq_len // s.cp} tokens over tp {s.tp}: "
        f"give a multiple of {s.cp * s.tp}, or --no-sp")
    per_dp = s.dp * s.micro_batch
    require(job.global_batch % per_dp == 0, "global_batch", job.global_batch,
            f"must be divisible by dp*micro_batch = {s.dp}*{s.micro_batch} = {per_dp}")
    require(s.ep == 1 or model.is_moe, "ep", s.ep,
            "expert parallel needs a mixture-of-experts model; use --ep 1")
    require(model.experts % s.ep == 0, "ep", s.ep,
            f"must divide the model's experts ({model.experts})")
    require(experts_split(s.ep, s.tp, s.dp, s.cp, s.profile.folds_experts), "ep", s.ep,
            f"must divide tp*dp*cp ({s.expert_ranks}) and be a multiple or a divisor of tp "
            f"{s.tp}: {s.stack} runs each expert whole on a rank, its ep ranks cut from "
            "tp x dp x cp (--no-fold-experts splits experts over tp)" if s.folds_experts else
            f"must divide dp*cp ({s.dp * s.cp}): experts are split inside the data-parallel group")
    pipe, m = s.pipeline, s.micro_batches(job.global_batch)
    need = pipe.min_micro_batches_per_pp * s.pp
    require(
        m >= need, "global_batch", job.global_batch,
        f"{s.schedule} needs at least {pipe.min_micro_batches_per_pp} x pp = {need} micro-batches "
        f"per step, got {m}")
    require(not pipe.virtual_stages or m % s.pp == 0, "global_batch", job.global_batch,
            f"the {s.schedule} schedule needs micro-batches ({m}) divisible by --pp ({s.pp})")


@lru_cache(maxsize=1024)
def split_layers(layers: int, stages: int) -> tuple[int, ...]:
    """Layers per pipeline stage, as even as possible. Extra layers go to the middle stages, since
    the first stage also holds the embedding and the last the output layer."""
    base, extra = divmod(layers, stages)
    counts = [base] * stages
    order = list(range(1, stages - 1)) + [0, stages - 1] if stages > 2 else list(range(stages))
    for i in order[:extra]:
        counts[i] += 1
    return tuple(counts)


@lru_cache(maxsize=1024)
def stage_kinds(layers: int, stages: int) -> tuple[tuple[int, int], ...]:
    """Each pipeline stage's kind, as (the first stage of that kind, its layer count): stages of
    one layer count that hold neither the embedding nor the output layer cost and hold the same,
    apart from their in-flight micro-batches."""
    first: dict[tuple, int] = {}
    kinds = []
    for i, n in enumerate(split_layers(layers, stages)):
        kinds.append((first.setdefault((n, i == 0, i == stages - 1), i), n))
    return tuple(kinds)


@lru_cache(maxsize=1024)
def stage_kind_counts(layers: int, stages: int) -> tuple[tuple[int, int, int], ...]:
    """(first stage, layer count, number of stages) of each stage kind (stage_kinds)."""
    counts: dict[tuple[int, int], int] = {}
    for kind in stage_kinds(layers, stages):
        counts[kind] = counts.get(kind, 0) + 1
    return tuple((i, n, c) for (i, n), c in counts.items())
