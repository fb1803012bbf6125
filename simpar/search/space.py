"""Enumerate the strategies for a model, job and GPU count: itertools.product over
divisors and choices.

Sequence parallelism is always on with tensor parallelism here: it moves the same bytes
as plain tensor parallelism and needs less memory and memory traffic, so it is never
worse. Selective recompute is skipped with flash attention, where it recomputes nothing,
except for latent attention (its up-projections)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from simpar.errors import SpecError, require
from simpar.specs.names import canonical
from simpar.specs.schedule import ONE_F_ONE_B, SCHEDULES, schedule_name
from simpar.specs.strategy import (
    RECOMPUTE,
    RECOMPUTE_ALIASES,
    ZERO_STAGES,
    Strategy,
    check_fp8_flags,
    ep_overlap_refusal,
    experts_split,
)

MAX_MICRO_BATCH = 16
MIN_TOKENS_PER_CP_RANK = 2048  # below this ring attention cannot hide its KV transfers
VPP_CHOICES = (2, 3, 4, 6, 8)


@dataclass(frozen=True)
class SearchSpace:
    tp: tuple[int, ...] | None = None  # None: every valid value
    pp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    ep: tuple[int, ...] | None = None
    zero: tuple[int, ...] = ZERO_STAGES
    # hybrid shard groups to try (Strategy.dp_shard; 0: all of dp); None: all of dp, and for
    # ZeRO-3 the dp ranks one node holds
    dp_shard: tuple[int, ...] | None = None
    recompute: tuple[str, ...] = ("none", "selective", "full")
    # what the selective candidates checkpoint, by Megatron core's module names
    # (Strategy.recompute_modules); (): the stack's selective
    recompute_modules: tuple[str, ...] = ()
    # a candidate that fits with full recompute recomputes only the layers memory needs
    partial_recompute: bool = False
    # None: the pipeline schedules the candidates' stack runs (Stack.schedules); ("all",): all
    schedules: tuple[str, ...] | None = None
    micro_batch: tuple[int, ...] | None = None
    # only strategies with this many micro-batches per replica and step
    accumulation: int | None = None
    overrides: tuple = ()  # (Strategy field, value) pairs every candidate gets: the what-ifs
    # Megatron's combined 1F1B on every candidate that can run it (Strategy.overlap_ep_comm)
    overlap_ep_comm: bool = False

    def __post_init__(self):
        for name in ("tp", "pp", "cp", "ep", "micro_batch"):
            values = getattr(self, name) or ()
            require(all(isinstance(v, int) and v > 0 for v in values),
                    f"--{name.replace('_', '-')}", ",".join(map(str,
                                                                values)), "give positive integers")
        require(all(isinstance(v, int) and v >= 0 for v in self.dp_shard or ()), "--dp-shard",
                ",".join(map(str, self.dp_shard or ())), "give dp ranks per group, >= 0 (0: all)")
        require(
            bool(self.zero) and all(z in ZERO_STAGES for z in self.zero), "--zero",
            ",".join(map(str, self.zero)), "choose ZeRO stages among 0, 1, 2, 3")
        # each mode and schedule as a user may spell it (names.canonical)
        modes = tuple(canonical(r, RECOMPUTE, RECOMPUTE_ALIASES) for r in self.recompute)
        object.__setattr__(self, "recompute", modes)
        require(all(r in RECOMPUTE for r in self.recompute), "--recompute",
                ",".join(self.recompute), f"choose from {', '.join(RECOMPUTE)}")
        if self.recompute_modules:  # the names, once, and the stack's taking them
            Strategy(recompute="selective", recompute_modules=self.recompute_modules,
                     **dict(self.overrides))
            require("selective" in self.recompute, "recompute_modules",
                    ",".join(self.recompute_modules), "name what selective recompute "
                    "checkpoints: search selective too (--recompute ...,selective)")
        if self.schedules is not None:
            every = [s.strip().lower() for s in self.schedules] == ["all"]
            named = tuple(SCHEDULES) if every else tuple(schedule_name(s) for s in self.schedules)
            object.__setattr__(self, "schedules", named)
            require(all(s in SCHEDULES for s in named), "--schedules", ",".join(named),
                    f"choose from {', '.join(SCHEDULES)}, or all")

    def restrictions(self) -> str:
        """The degrees the user fixed, as flags (for an error when none of them can be placed)."""
        return " ".join(f"--{n} {','.join(map(str, v))}" for n in ("tp", "pp", "cp", "ep")
                        if (v := getattr(self, n)))


def divisors(n: int) -> list[int]:
    """The divisors of n in ascending order, found in pairs (d, n // d) up to sqrt(n)."""
    low = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return low + [n // d for d in reversed(low) if d * d != n]


def _mesh_shapes(model, job, gpus: int, gpus_per_node: int, space: SearchSpace):
    for tp, cp in itertools.product(space.tp or divisors(gpus), space.cp or divisors(gpus)):
        if gpus % (tp * cp) or tp > gpus_per_node and space.tp is None:
            continue
        if model.heads % tp or model.kv_heads % tp or model.ffn_hidden % tp:
            continue
        # the search runs tp > 1 with sequence parallelism, which splits each rank's tokens over tp
        if job.seq_len % (cp * tp) or (cp > 1 and space.cp is None and
                                       job.seq_len // cp < MIN_TOKENS_PER_CP_RANK):
            continue
        for pp in space.pp or divisors(gpus // (tp * cp)):
            if gpus % (tp * cp * pp) == 0 and pp <= model.layers:
                yield tp, cp, pp, gpus // (tp * cp * pp)


def _schedules(model, pp: int, micro_batches: int, schedules: tuple[str, ...]):
    if pp == 1:
        yield ONE_F_ONE_B.name, 1
        return
    for name in schedules:
        pipe = SCHEDULES[name]
        if (model.layers < pipe.chunks_per_rank(1) * pp
                or micro_batches < pipe.min_micro_batches_per_pp * pp):
            continue
        if not pipe.virtual_stages:
            yield name, 1
        elif micro_batches % pp == 0:
            for v in VPP_CHOICES:
                if model.layers % (pp * v) == 0:
                    yield name, v


def _shards(space: SearchSpace, dp: int, zero: int, ep: int, hybrid: int) -> tuple[int, ...]:
    """The hybrid shard groups to try for one candidate: the user's that it can have, or all of
    dp and, for ZeRO-3, a node's dp ranks (`hybrid`, 0 where a node holds all or one)."""
    if space.dp_shard is not None:
        fits = tuple(d for d in space.dp_shard
                     if d == 0 or (zero >= 1 and ep == 1 and d < dp and dp % d == 0))
        return tuple(dict.fromkeys(fits))
    return (0, hybrid) if hybrid and zero == 3 and ep == 1 else (0,)


def enumerate_strategies(model, job, gpus: int, gpus_per_node: int,
                         space: SearchSpace | None = None, *, gpu):
    """Yield every valid Strategy; `flash_attention` and overlap flags keep their defaults."""
    space = space or SearchSpace()
    # the stack is the same for every candidate, and the candidates are not validated again
    overrides = dict(space.overrides)
    check_fp8_flags(overrides.get("fp8_scaling", ""), job.dtype,
                      overrides.get("fp8_all_gather"))
    base = Strategy(**overrides)
    profile = base.profile
    overlaps_tp = profile.overlaps_tp(job.dtype, gpu)
    schedules = profile.schedules if space.schedules is None else space.schedules
    # selective recompute of the attention core saves nothing behind a fused attention kernel;
    # an unfused core's scores, a whole attention module (Stack.selective "attention"), a latent
    # attention's up-projections or modules the user names save memory
    saves = (not base.flash or profile.selective != "core" or model.is_mla
             or bool(space.recompute_modules))
    recompute = [r for r in space.recompute if r != "selective" or saves]
    for tp, cp, pp, dp in _mesh_shapes(model, job, gpus, gpus_per_node, space):
        if job.global_batch % dp:
            continue
        per_rank = job.global_batch // dp
        mbs = [
            m for m in (space.micro_batch or divisors(per_rank))
            if per_rank % m == 0 and m <= MAX_MICRO_BATCH and space.accumulation in (None,
                                                                                     per_rank // m)
        ]
        eps = [
            e for e in (space.ep or divisors(model.experts))
            if model.experts % e == 0 and experts_split(e, tp, dp, cp, profile.folds_experts)
        ]
        # nothing to shard over a single data-parallel rank
        zeros = space.zero if dp * cp > 1 else (0,)
        # the stack's recipes overlap TP communication where it has any
        fixed = {"overlap_tp_comm": tp > 1 and overlaps_tp, **dict(space.overrides)}
        # FSDP over the data-parallel ranks of a node, replicated across nodes (HSDP), where
        # a node holds several of them and the job spans more than one node
        in_node = gpus_per_node // (tp * cp)
        hybrid = in_node if 1 < in_node < dp and dp % in_node == 0 else 0
        for mb, ep, zero, rec in itertools.product(mbs, eps, zeros, recompute):
            shards = _shards(space, dp, zero, ep, hybrid)
            for (sched, vpp), shard in itertools.product(
                    _schedules(model, pp, per_rank // mb, schedules), shards):
                # the loops above make only what `validate` accepts (tests/test_search.py holds
                # them to it), so it is not asked again; the strategy refuses a stack's own limits
                paired = space.overlap_ep_comm and not ep_overlap_refusal(
                    profile, ep, rec, pp, SCHEDULES[sched])
                try:
                    s = Strategy(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=zero, sp=tp > 1,
                                 dp_shard=shard, micro_batch=mb, schedule=sched, vpp=vpp,
                                 recompute=rec, overlap_ep_comm=paired,
                                 recompute_modules=space.recompute_modules
                                 if rec == "selective" else (), **fixed)
                except SpecError:
                    continue
                yield s
