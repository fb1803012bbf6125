"""Data-parallel gradient synchronisation without ZeRO: all-reduce, parameter servers, compression.

Each function returns the seconds one rank spends to synchronise `dense` + `expert` local gradient
elements, encode/decode kernels included: a DDP communication hook runs them in series with its
collectives, so they stretch the sync that overlaps the backward pass.

- fp16/bf16: the gradient travels in 2 bytes; a cast down and up costs two memory-bound passes.
- PowerSGD (Vogels et al. 2019, rank r): an n x m gradient matrix travels as P (n x r)
and Q (m x r) in
  two all-reduces; error feedback and the two skinny GEMMs read the gradient about five times.
- top-k (Aji & Heafield 2017; Lin et al. 2018 DGC): k of the elements with int32
indices; sparse vectors
  do not sum in a ring, so they are all-gathered and every rank adds all N of them.
- parameter servers (Li et al. 2014; BytePS, Jiang et al. 2020): every GPU pushes its
gradient and pulls
  the weights back; push and pull use opposite link directions and are chunk-pipelined,
  so the time is the larger transfer at the slower of the GPU's NIC and its share of the
  servers' NICs. The servers only sum (as BytePS); the optimizer stays on the GPUs,
  except in asynchronous SGD (see replicas.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from simpar.cost.compute import hbm_rate, memory_bound_time
from simpar.cost.pricing import Pricing
from simpar.memory.model import state_bytes_per_param
from simpar.specs.precision import get_precision
from simpar.specs.stack import (
    BARE_OP_US,
    DEEPSPEED_PERSISTENCE_THRESHOLD,
    DEEPSPEED_PREFETCH_BUCKET,
    VIEW_OP_US,
)
from simpar.workload.layer import act_bytes, layer_linears, matmul_sequence, weight_tensors
from simpar.workload.params import linear_weights

INDEX_BYTES = 4  # int32 index per element top-k keeps
# error feedback add and residual, M Q, M^T P, P Q^T: reads/writes of the gradient
POWERSGD_PASSES = 5
TOPK_PASSES = 6  # error feedback add, threshold estimate, compaction, residual write
CAST_PASSES = 2  # cast down before the collective, up after it




def dp_groups(s, dense: float, expert: float) -> tuple:
    """((elements, mesh group, ranks), ...) a rank synchronises: expert weights have their own group
    when experts are split (ep > 1); otherwise both kinds share one group and one set of buckets."""
    if s.ep == 1:
        return ((dense + expert, "dpcp", s.dp * s.cp),)
    return ((dense, "dpcp", s.dp * s.cp), (expert, "edp", s.edp))


def zero_groups(s, dense: float, expert: float) -> tuple:
    """dp_groups for the ZeRO collectives: hybrid sharding (Strategy.dp_shard, which excludes
    expert parallelism) gathers and reduce-scatters inside each shard group."""
    if s.shard_replicas == 1:
        return dp_groups(s, dense, expert)
    return ((dense + expert, "shard", s.shard_ranks),)


def buckets(s, params: float, bytes_per_param: float) -> int:
    return max(1, math.ceil(params / s.bucket_params(bytes_per_param)))


def bucketed(net, op: str, nbytes: float, group: str, buckets: int) -> float:
    """A collective of `nbytes` issued as `buckets` equal collectives one after another
    (one stream)."""
    return buckets * net.collective(op, nbytes / buckets, group) if nbytes > 0 else 0.0


def grad_bytes(s, job) -> int:
    """Bytes per gradient element on the wire of a plain reduction: the stack's reduce
    precision (fp32 in Megatron-LM's bf16 training and torchtitan's FSDP2, 16-bit in
    DeepSpeed but fp32 from its BF16_Optimizer; fp32 in fp32 training unless the user says
    --grad-reduce), 2 when cast to fp16/bf16."""
    wide = ((get_precision(job.dtype).wide and not s.grad_reduce)
            or s.keeps_fp32_gradients(job.dtype))
    gb = 4 if wide else s.profile.grad_reduce_bytes
    return min(gb, 2) if s.compress in ("fp16", "bf16") else gb


def tied_embedding_sync(p: Pricing) -> float:
    """Seconds the first and the last pipeline stage spend each step summing their two copies of
    a tied word embedding's gradient (the last stage keeps its own copy for the output layer):
    vocab/tp x hidden gradient elements all-reduced between the two ranks after the data-parallel
    sync, before the optimizer, waited for. Megatron-LM's train_step all-reduces the word
    embeddings' grad over its embedding group (training.py, 2021), Megatron core's
    finalize_model_grads after finish_grad_sync (_allreduce_word_embedding_grads), DeepSpeed's
    PipelineEngine in its ReduceTiedGrads step (_exec_reduce_tied_grads: the fp32 _hp_grad under
    its BF16_Optimizer); learned position tables stay on the first stage. An all-reduce of two
    ranks moves the tensor once each way: a ring shift of it. A V schedule runs the first and the
    last chunk on one rank, which holds one table."""
    s, model = p.strategy, p.model
    if s.pp == 1 or not model.tied_embeddings or s.pipeline.v_shape:
        return 0.0
    return p.net.ring_shift(model.vocab * model.hidden / s.tp * grad_bytes(s, p.job), "pp")


@lru_cache(maxsize=256)
def powersgd_fraction(model, tp: int, ep: int, rank: int) -> float:
    """Share of one rank's matrix elements PowerSGD sends: r(n + m) for each n x m matrix.
    Norm and bias vectors (under 0.1% of a transformer's parameters) are left out."""
    mats = [(g.n, g.k, g.count) for g in matmul_sequence(model, model.experts, tp, ep)]
    full = model.layers * sum(n * m * k for n, m, k in mats)
    sent = model.layers * sum(rank * (n + m) * k for n, m, k in mats)
    tables = 1 if model.tied_embeddings else 2  # input embedding and output layer
    full += tables * model.vocab // tp * model.hidden
    sent += tables * rank * (model.vocab // tp + model.hidden)
    return min(1.0, sent / full)


def wire_bytes(p: Pricing, elements: float) -> float:
    """Bytes one rank contributes to the gradient exchange for `elements` local gradient
    elements."""
    s = p.strategy
    gb = grad_bytes(s, p.job)
    if s.compress == "powersgd":
        return elements * gb * powersgd_fraction(p.model, s.tp, s.ep, s.compress_rank)
    if s.compress == "topk":
        return elements * s.topk_ratio * (gb + INDEX_BYTES)
    return elements * gb


def codec_seconds(p: Pricing, elements: float, group_size: int) -> float:
    """Encode and decode kernels on one rank for `elements` gradient elements."""
    s, job, gpu = p.strategy, p.job, p.gpu
    _, gb, _ = state_bytes_per_param(job.dtype, s.profile)
    if s.compress in ("fp16", "bf16"):
        return 0.0 if gb <= 2 else memory_bound_time(CAST_PASSES * elements * (gb + 2), gpu, 2)
    if s.compress == "powersgd":
        flops = 6.0 * elements * s.compress_rank  # M Q, M^T P and P Q^T: 2nmr each
        rate = gpu.peak_tflops(job.dtype) * 1e12 * gpu.gemm_fraction(job.dtype)
        return max(flops / rate, POWERSGD_PASSES * elements * gb / hbm_rate(gpu))
    if s.compress == "topk":
        # read and scatter-add
        received = group_size * s.topk_ratio * elements * (2 * gb + INDEX_BYTES)
        return memory_bound_time(TOPK_PASSES * elements * gb + received, gpu, 3)
    return 0.0


def allreduce_sync(p: Pricing, groups) -> float:
    """DDP gradient sync of `groups` ((elements, mesh group name, group size), ...) by
    collectives."""
    s, net, total = p.strategy, p.net, 0.0
    for elements, group, n in groups:
        if elements <= 0 or n <= 1:
            continue
        nbytes = wire_bytes(p, elements)
        # DDP buckets before any hook
        k = buckets(s, elements, state_bytes_per_param(p.job.dtype, s.profile)[1])
        if s.compress == "topk":  # the gathered output holds every rank's sparse vector
            total += bucketed(net, "allgather", nbytes * n, group, k)
        # P, then Q after orthogonalising P: two dependent all-reduces
        elif s.compress == "powersgd":
            total += 2 * bucketed(net, "allreduce", nbytes / 2, group, k)
        else:
            total += bucketed(net, "allreduce", nbytes, group, k)
        total += codec_seconds(p, elements, n)
    return total


def ps_rate(s, cluster) -> float:
    """Bytes per second one GPU moves to (or from) the parameter servers, per direction."""
    nic = cluster.inter_bw_bytes_per_s
    server = (s.ps_server_gbps * 1e9 * cluster.inter_node_efficiency) if s.ps_server_gbps else nic
    return min(nic, s.ps_servers * server / s.gpus)  # every GPU pushes its own shard


def ps_sync(p: Pricing, groups) -> float:
    """Push gradients and pull weights through the parameter servers (pipelined, full duplex)."""
    wb = act_bytes(p.job.dtype)  # 16-bit weights pulled back (fp32 in fp32 training)
    elements = sum(e for e, _, _ in groups)
    push = sum(wire_bytes(p, e) for e, _, _ in groups)
    codec = sum(codec_seconds(p, e, 1) for e, _, _ in groups)
    cluster = p.cluster
    return (
        max(push, elements * wb) / ps_rate(p.strategy, cluster)
        + 2 * cluster.inter_node_latency_us * 1e-6
        + codec
    )


@dataclass(frozen=True)
class SyncParts:
    """One ZeRO pass on one rank (an all-gather of its 16-bit weights or a reduce-scatter of its
    gradients), in the parts `sharded_sync` adds up; `simpar simulate --explain` prints them."""
    collectives: int  # issued one after another (per block, prefetch bucket, tensor or bucket)
    bytes_per_collective: float  # the mean gathered (or reduced) tensor, as nccl-tests counts
    wire_s: float  # the collectives on the network, their message steps' latency included
    latency_s: float  # of wire_s: the same collectives of one byte each (0 unless asked for)
    host_s: float  # per-rank list building on the host, the GPU waiting (list_ops_seconds)
    copies_s: float  # GPU passes over the bytes around the collectives (list_copies_seconds)
    replica_s: float  # hybrid sharding: each shard all-reduced over the replicas

    @property
    def total_s(self) -> float:
        return self.wire_s + self.host_s + self.copies_s + self.replica_s


def sharded_sync(p: Pricing, op: str, dense: float, expert: float, blocks: int) -> float:
    """Seconds of one ZeRO pass (sharded_sync_parts) over a rank's parameters."""
    return sharded_sync_parts(p, op, dense, expert, blocks).total_s


def sharded_sync_parts(p: Pricing, op: str, dense: float, expert: float, blocks: int, *,
                       with_latency: bool = False) -> SyncParts:
    """A ZeRO reduce-scatter of gradients or all-gather of 16-bit weights (act_bytes:
    the compute type) over a rank's parameters, which belong to `blocks` transformer
    blocks: bucket by bucket for ZeRO-1/2, unit by unit for ZeRO-3. The latency share is
    priced only `with_latency` (the report's), so the search's hot path pays nothing for it."""
    s = p.strategy
    per = act_bytes(p.job.dtype) if op == "allgather" else grad_bytes(s, p.job)
    # linear weights cast to fp8 before the gather move a byte each (Stack.fp8_weight_gathers)
    fp8 = (linear_weights(p.model, s, blocks) if op == "allgather" and
           s.profile.gathers_fp8_weights(p.job.dtype, s.shards_parameters) else 0.0)

    def units(params: float) -> int:
        return (
            zero3_units(s, params, blocks, p.model)
            if s.shards_parameters
            else buckets(s, params, per)
        )

    run = zero_reduce_op(s, p.job) if op == "reducescatter" else op
    count = total = wire = latency = host = copies = replica = 0.0
    for i, (n, group, size) in enumerate(zero_groups(s, dense, expert)):
        k, nbytes = units(n), n * per
        if i == 0 and fp8:  # the linears are in the first group (dense weights, or all)
            nbytes -= min(n, fp8) * (per - get_precision(p.job.dtype).gemm_input_bytes)
        count, total = count + k, total + nbytes
        wire += bucketed(p.net, run, nbytes, group, k)
        if with_latency and nbytes > 0:
            latency += k * p.net.collective(run, 1.0, group)
        host += k * list_ops_seconds(s, run, size)
        copies += list_copies_seconds(p, run, nbytes)
        replica += replica_reduce(p, op, nbytes / size, k)
    return SyncParts(int(count), total / max(count, 1.0), wire, min(latency, wire), host, copies,
                     replica)


def replica_reduce(p: Pricing, op: str, shard_bytes: float, units: int) -> float:
    """Under hybrid sharding each reduce-scatter's shard is then all-reduced over the shard
    group's replicas, unit by unit (FSDP2's HSDP all-reduces each reduce-scatter output over the
    replicate dimension)."""
    if op != "reducescatter" or p.strategy.shard_replicas == 1:
        return 0.0
    return bucketed(p.net, "allreduce", shard_bytes, "replicate", units)


def zero_reduce_op(s, job) -> str:
    """The collective a ZeRO pass over the gradients runs: a reduce-scatter, or an all-reduce
    where the stack's ZeRO-3 all-reduces its gradient buckets (Stack.zero3_grad_allreduce), and
    where DeepSpeed's BF16_Optimizer reduces its fp32 gradients under ZeRO-1: whole, bucket by
    bucket (its pipeline engine's _bf16_reduce_grads, buffered_allreduce_fallback over
    get_grads_for_reduction; April 2022, #1801), each rank then stepping its own shard."""
    return ("allreduce" if (s.shards_parameters and s.profile.zero3_grad_allreduce)
            or s.keeps_fp32_gradients(job.dtype) else "reducescatter")


def list_ops_seconds(s, op: str, group_size: int) -> float:
    """Host time of one ZeRO-3 collective `op` of a stack whose collectives take one tensor
    per rank (Stack.per_rank_list_ops): a bare op per rank of the group (an all-reduce takes
    one flat tensor)."""
    if not (s.shards_parameters and s.profile.per_rank_list_ops) or op == "allreduce":
        return 0.0
    return group_size * BARE_OP_US * 1e-6


# Passes over the collective's bytes (reads and writes) the GPU makes around a ZeRO-3 collective
# of a stack whose collectives take one tensor per rank (Stack.per_rank_list_ops), beside the
# transfer: DeepSpeed before v0.6 zero-fills each weight it gathers (torch.zeros in
# partition_parameters.py, _allgather_param) and divides each gradient by the world size in place
# before reducing it (stage3.py, average_tensor); torch's list all_gather copies the gathered
# flat buffer out to the rank's views, and its list reduce_scatter copies every input into a flat
# buffer first (ProcessGroupNCCL, flatten_for_scatter_gather). Its gradient all-reduce
# (Stack.zero3_grad_allreduce; stage3.py allreduce_and_copy) flattens the bucket, divides it in
# place and copies the result back into the gradients.
LIST_COPY_PASSES = {"allgather": 1 + 2, "reducescatter": 2 + 2, "allreduce": 2 + 2 + 2}


def list_copies_seconds(p: Pricing, op: str, nbytes: float) -> float:
    """Memory-bound time of LIST_COPY_PASSES over a rank's `nbytes` of one ZeRO-3 pass; the
    collectives are waited for (torch.cuda.synchronize), so nothing hides it."""
    s = p.strategy
    if not (s.shards_parameters and s.profile.per_rank_list_ops):
        return 0.0
    return LIST_COPY_PASSES[op] * nbytes / hbm_rate(p.gpu)


@lru_cache(maxsize=256)  # every candidate of a search prices its step's end
def persistent_tensors(model, tp: int, ep: int, pp: int, fused: bool) -> tuple[int, ...]:
    """Elements of each parameter of a rank's model that DeepSpeed's ZeRO-3 keeps whole between
    its uses (fewer than DEEPSPEED_PERSISTENCE_THRESHOLD): per block the two norms' weights (and
    biases, in a GPT) and each linear's bias as the model code holds it (q, k and v in one where
    it fuses them, `fused`; split over tp where the weight is column-parallel), and the final
    norm's."""
    norm = (model.hidden,) * (1 + model.bias)
    block = list(norm * 2)
    if model.bias:
        biases: list[list[int]] = []  # [elements, tensors]
        for lin in layer_linears(model):
            n = lin.n_out // tp if lin.split == "out" else lin.n_out
            if fused and lin.name in ("wk", "wv", "w3"):
                biases[-1][0] += n
            else:
                biases.append([n, model.experts // ep if lin.routed else 1])
        block += [n for n, k in biases for _ in range(k)]
    blocks = max(1, round(model.layers / pp))
    return tuple(n for n in block * blocks + list(norm) if n < DEEPSPEED_PERSISTENCE_THRESHOLD)


def persistent_regather_parts(p: Pricing) -> SyncParts | None:
    """A step's end where the stack gathers its persistent parameters again
    (Stack.zero3_persistent_regather): one list all-gather of all of them in the compute type, then,
    from Python, for each parameter a narrow, a view, a narrow and a copy_ for every rank that
    holds a piece of it (a piece is ceil(n / ranks) elements). The next step's forward is issued
    after the loop, so the step waits for all of it; None where the stack does not."""
    s = p.strategy
    if not (s.shards_parameters and s.profile.zero3_persistent_regather):
        return None
    tensors = persistent_tensors(p.model, s.tp, s.ep, s.pp, s.profile.fused_input_linears)
    ranks = s.dp * s.cp
    nbytes = sum(tensors) * act_bytes(p.job.dtype)
    wire = p.net.collective("allgather", nbytes, "dpcp")
    latency = min(wire, p.net.collective("allgather", 1.0, "dpcp"))
    pieces = sum(math.ceil(n / math.ceil(n / ranks)) for n in tensors)
    host = pieces * (3 * VIEW_OP_US + BARE_OP_US) * 1e-6 + list_ops_seconds(s, "allgather", ranks)
    return SyncParts(1, nbytes, wire, latency, host, 0.0, 0.0)


def persistent_regather_seconds(p: Pricing) -> float:
    """Seconds of persistent_regather_parts (0 where the stack has none)."""
    parts = persistent_regather_parts(p)
    return parts.total_s if parts else 0.0


def zero3_units(s, params: float, blocks: int, model) -> int:
    """ZeRO-3 collectives per pass over a rank's `params` of `blocks` transformer
    blocks: one per block (FSDP wraps each), per DeepSpeed prefetch bucket, or per
    weight tensor (DeepSpeed before v0.6); a collective's latency is paid per unit.
    Norm weights and biases are not gathered: DeepSpeed keeps parameters under
    stage3_param_persistence_threshold (1e5 elements) whole on every rank."""
    unit = s.profile.zero3_unit
    if unit == "bucket":
        return max(1, math.ceil(params / DEEPSPEED_PREFETCH_BUCKET))
    if unit == "param":
        return max(1, blocks * len(weight_tensors(model, s.profile.fused_input_linears)))
    return max(1, blocks)


def ddp_sync(p: Pricing, dense: float, expert: float) -> float:
    """Seconds for one rank to synchronise its stage's gradients without ZeRO, per the
    strategy's what-ifs."""
    groups = dp_groups(p.strategy, dense, expert)
    return ps_sync(p, groups) if p.strategy.grad_sync == "ps" else allreduce_sync(p, groups)
