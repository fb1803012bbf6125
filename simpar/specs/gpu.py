"""GPUSpec: peak rates of one accelerator and the achievable fractions the cost model uses."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from simpar.errors import (
    SPEC_MAGNITUDE,
    SpecError,
    is_number,
    positive_float,
    positive_int,
    reject_unknown,
    require,
    require_numbers,
)
from simpar.specs.precision import PRECISIONS, get_precision

# Achievable fractions, used where a GPU entry gives no measured value of its own.
# Streaming kernels (copy, elementwise) reach about 85-90% of HBM peak: BabelStream / nvbandwidth
# on A100 (~1.75 of 2.04 TB/s) and H100 SXM (~2.9-3.0 of 3.35 TB/s).
DEFAULT_HBM_EFFICIENCY = 0.85
# Fixed cost per kernel launch on the GPU timeline (launch + tail), typical for CUDA graphs-free
# PyTorch training loops as profiled by Nsight (3-6 us). Matters only for tiny shapes.
DEFAULT_KERNEL_OVERHEAD_US = 4.0
# Communication overlapped with compute is not free: NCCL runs its channels as thread
# blocks on the same SMs (16-32 of 108-132 SMs by default) and shares HBM bandwidth, so
# concurrent kernels slow down by roughly that share; overlap studies (e.g. FLUX,
# arXiv:2406.06858; Centauri, ASPLOS'24) report 10-30%. On CPUs, collectives and compute
# share the cores: `simpar calibrate` measures it (near 1 when busy).
DEFAULT_OVERLAP_SLOWDOWN = 0.2
# CPU time DTensor adds to each op it dispatches (torch tensor parallelism runs a block's
# ops on DTensors): sharding propagation from its cache, unwrapping and rewrapping the local
# tensors. With torch's C++ fast path, 24-26 us per op on a Skylake server (pytorch/pytorch
# PR #166371, detach(); 36-40 us before it). `simpar calibrate` measures the host's own.
DEFAULT_DTENSOR_OP_US = 25.0
OPTIONAL = ("hbm_efficiency", "kernel_overhead_us", "overlap_slowdown", "tdp_w", "arch",
            "fp8_gemm_efficiency", "gemm_table", "gemm_table_dtype", "dtensor_op_us", "fp4_tflops",
            "clock_fraction", "burst_gemm_efficiency", "gemm_table_efficiency",
            "memory_bound_power_fraction", "flops_per_exp", "attention_flops_per_exp",
            "attention_table", "attention_table_dtype")
# the columns of each measured table's rows
TABLE_COLUMNS = {"gemm_table": ("m", "n", "k", "seconds"),
                 "attention_table": ("sequences x heads", "tokens", "head dim", "forward s",
                                     "backward s")}
ARCHS = ("", "volta", "ampere", "hopper", "blackwell", "cdna3", "cdna4", "cpu")
# Generations whose 16-bit tensor cores take fp16 only: bf16 came with Ampere (NVIDIA A100 Tensor
# Core GPU Architecture whitepaper; Volta's tensor cores multiply fp16, V100 whitepaper), and
# torch.cuda.is_bf16_supported() asks for compute capability 8.0 for it natively
FP16_ONLY_ARCHS = ("volta",)
# A fused attention kernel computes each score's softmax on the SM's special-function units (one
# exponential per score, 16 per SM per clock from Volta to Blackwell) besides its tensor-core
# matmuls: dense 16-bit tensor-core FLOPs per exponential at peak, per generation (dense FLOPs
# per SM per clock over 16: V100 1,024, A100 2,048, H100 4,096, B200 8,192). FlashAttention-3
# (Shah et al. 2024, arXiv:2407.08608): the H100's 989 TFLOP/s of matmul against 3.9 T exp/s is
# "512x more matmul FLOPS than exponential" at head dim 128, so "exponential can take 50% of the
# cycle time compared to matmul". Blackwell Ultra (GB300, B300) doubles the SFU's throughput
# (NVIDIA's blog "Making Softmax More Efficient with NVIDIA Blackwell Ultra": the softmax sits
# between the two matmuls of the attention loop, which wait for it): 256. AMD's: unknown.
FLOPS_PER_EXP = {"volta": 64.0, "ampere": 128.0, "hopper": 256.0, "blackwell": 512.0}
# Generations whose NVLink switches reduce and broadcast in the switch for CUDA multicast objects
# (NVLS: third-generation NVSwitch with Hopper, and on): what Transformer Engine's userbuffers
# need for tensor-parallel comm+GEMM overlap (Stack.tp_overlap_needs_multicast)
MULTICAST_ARCHS = ("hopper", "blackwell")
# Under a power limit the GPU lowers its clock: dynamic power goes as f V^2 and the voltage rises
# with the clock in the DVFS range, so the clock, and with it tensor-core throughput, goes as the
# cube root of the dynamic power; the static floor is about a tenth of the board power (an H100
# SXM idles near 70 W of its 700 W in nvidia-smi). HBM bandwidth does not follow the SM clock.
STATIC_POWER_FRACTION = 0.1
# Dense fp4 rate over the fp8 one that a power-capped part sustains: the ratio of the two peaks on
# B200 and GB200 (datasheets: 9,000 / 4,500 and 10,000 / 5,000 TFLOP/s). Blackwell Ultra's fp4
# peak is three times its fp8 one (15,000 / 5,000): more fp4 units, but no more power to run them,
# so its sustained fp4 rate is taken to stay at twice its fp8 one. The published runs do not settle
# it: Megatron-Bridge's NVFP4 Llama 3.1 405B ran 1.21x faster on GB300 than on GB200 (26.06), its
# 70B 1.50x (26.04.01), each rack on its own layout (tp 4 on both, and tp 1 against tp 2).
FP4_PER_FP8 = 2.0
# A block-scaled GEMM (mxfp8, nvfp4: a scale per 32 or 16 elements along the contraction, which
# the tensor cores load beside the data) sustains this fraction of the rate its format's plain
# GEMM does. Transformer Engine's GEMM profiling on a B300 (docs/features/low_precision_training/
# gemm_profiling, b300_model_config_speedup_prequant.png: hidden 4096, 15,872 tokens, inputs
# already quantized) ran a layer's twelve GEMMs 1.94x as fast as bf16 in per-tensor fp8, 1.74x
# in MXFP8 (0.90 of fp8) and 3.55x in NVFP4 (0.91 of twice fp8, FP4_PER_FP8).
BLOCK_SCALED_GEMM_FRACTION = 0.90
# A power-capped GPU sustains its gemm_efficiency only while tensor-core kernels fill the step: in
# a step that also runs memory-bound kernels, which draw less, the average power leaves room for a
# higher clock in the GEMMs, up to burst_gemm_efficiency (the rate of GEMMs with power to spare).
# On one H100 at 700 W (reports/gpu-gemm-soak, torch 2.11+cu130, bf16 16384x28672x4096 and
# 8192^3): back-to-back GEMMs ran at 675 TFLOP/s at the cap; each followed by a memory-bound pass
# of about its length (48% of the time in GEMMs), 751-755 TFLOP/s, still at the cap. With the
# cube law above, that second run puts the memory-bound kernels' draw at 0.68 of the board power
# (the default of GPUSpec.memory_bound_power_fraction; a GPU soaked on its own has its own).
MEMORY_BOUND_POWER_FRACTION = 0.68


@dataclass(frozen=True)
class GPUSpec:
    name: str
    fp32_tflops: float  # dense, non-tensor-core
    tf32_tflops: float  # dense tensor-core
    bf16_tflops: float  # dense tensor-core, fp16 is the same rate on every catalog GPU
    fp8_tflops: float  # dense tensor-core; 0 where the GPU has no fp8 tensor cores
    hbm_gib: float
    hbm_tbps: float
    sm_count: int  # streaming multiprocessors (compute units on AMD): sets GEMM wave quantization
    gemm_efficiency: float  # achievable fraction of dense peak for large, well-shaped GEMMs
    # achievable fraction of dense peak for fused (flash) attention kernels
    attention_efficiency: float
    hbm_efficiency: float = DEFAULT_HBM_EFFICIENCY
    kernel_overhead_us: float = DEFAULT_KERNEL_OVERHEAD_US
    # compute seconds lost per second of overlapped comm
    overlap_slowdown: float = DEFAULT_OVERLAP_SLOWDOWN
    tdp_w: float = 0.0  # board power the efficiencies hold at; 0: unknown (no power-limit what-if)
    # generation: which kernels run at which rate (e.g. FlashAttention-2 on hopper); "": unknown
    arch: str = ""
    # achievable fraction of the fp8 peak where it was measured apart from the 16-bit
    # one; 0: the same fraction
    fp8_gemm_efficiency: float = 0.0
    # measured GEMM times, ((m, n, k, seconds), ...) at gemm_table_dtype (`simpar
    # calibrate --model`): they override the roofline for the shapes they hold, and lend
    # their rate to the nearest unmeasured ones
    gemm_table: tuple[tuple[float, float, float, float], ...] = ()
    gemm_table_dtype: str = ""
    dtensor_op_us: float = DEFAULT_DTENSOR_OP_US  # host CPU time DTensor's dispatch adds per op
    # dense fp4 tensor-core peak (NVFP4 / MXFP4): --dtype nvfp4 runs its GEMMs at it; 0: none
    fp4_tflops: float = 0.0
    # SM clock as a fraction of the one the efficiencies above hold at (power_limited
    # lowers it): rates the cost model states as fractions of peak at full clock, such
    # as FlashAttention-2's, scale with it
    clock_fraction: float = 1.0
    # fraction of the dense peak GEMMs reach with power to spare (MAMF at the boost clock), above
    # gemm_efficiency, which holds under continuous GEMM load at tdp_w; 0: no headroom modelled
    burst_gemm_efficiency: float = 0.0
    # the gemm_efficiency gemm_table's times hold at (`simpar calibrate` times its table in short
    # bursts, 1, and soaks to a lower sustained gemm_efficiency): priced at another clock, the
    # step's tensor-core share or a power limit, its times scale with it; 0: they hold as they are
    gemm_table_efficiency: float = 0.0
    # the board power a memory-bound kernel draws at the cap, as a fraction (at_tensor_core_share)
    memory_bound_power_fraction: float = MEMORY_BOUND_POWER_FRACTION
    # dense 16-bit tensor-core FLOPs per special-function exponential (FLOPS_PER_EXP); 0: the
    # generation's, where known
    flops_per_exp: float = 0.0
    # FLOPs per exponential of the part attention_efficiency was measured on (at head dim 128);
    # 0: this one (cost/compute.py, attention_softmax_factor)
    attention_flops_per_exp: float = 0.0
    # measured causal attention, ((sequences x heads, tokens, head dim, forward seconds, backward
    # seconds), ...) at attention_table_dtype (`simpar calibrate --model`: SDPA as execpar calls
    # it): like gemm_table, it overrides the attention rate of stacks that call SDPA's own choice
    # ("best") for the shapes it holds and lends its rates to the nearest unmeasured ones
    # (cost/compute.py, attention_from_table)
    attention_table: tuple[tuple[float, float, float, float, float], ...] = ()
    attention_table_dtype: str = ""

    def __post_init__(self):
        # a YAML name such as .nan or 1e3 reads as a number
        require(isinstance(self.name, str) and self.name != "", "gpu.name", self.name,
                "give the GPU a name (quote it if YAML reads it as a number)")
        require_numbers(self, "gpu")
        for f in ("fp32_tflops", "tf32_tflops", "bf16_tflops", "hbm_gib", "hbm_tbps"):
            positive_float(f"gpu.{f}", getattr(self, f))
        require(self.fp8_tflops >= 0, "gpu.fp8_tflops", self.fp8_tflops,
                "must be >= 0 (0 = no fp8)")
        require(self.fp4_tflops >= 0, "gpu.fp4_tflops", self.fp4_tflops,
                "must be >= 0 (0 = no fp4)")
        positive_int("gpu.sm_count", self.sm_count)
        for f in ("gemm_efficiency", "attention_efficiency", "hbm_efficiency", "clock_fraction",
                  "memory_bound_power_fraction"):
            v = getattr(self, f)
            require(0 < v <= 1, f"gpu.{f}", v, "is a fraction of peak: give a value in (0, 1]")
        require(not self.burst_gemm_efficiency
                or self.gemm_efficiency <= self.burst_gemm_efficiency <= 1,
                "gpu.burst_gemm_efficiency", self.burst_gemm_efficiency,
                "is the GEMM fraction of peak with power to spare: give one in [gemm_efficiency, "
                "1], or 0 for none")
        require(
            0 <= self.fp8_gemm_efficiency <= 1, "gpu.fp8_gemm_efficiency", self.fp8_gemm_efficiency,
            "is a fraction of the fp8 peak: give a value in (0, 1], or 0 for gemm_efficiency's")
        low, high = SPEC_MAGNITUDE
        for name, columns in TABLE_COLUMNS.items():
            table = getattr(self, name)
            for row in table:
                require(
                    isinstance(row, tuple) and len(row) == len(columns)
                    and all(is_number(v) and low <= v <= high for v in row),
                    f"gpu.{name}", row, f"each row is [{', '.join(columns)}], all positive "
                    f"(between {low:g} and {high:g})")
            require(not table or getattr(self, f"{name}_dtype") in PRECISIONS,
                    f"gpu.{name}_dtype", getattr(self, f"{name}_dtype"),
                    f"name the precision the table was measured in: one of {', '.join(PRECISIONS)}")
        require(0 <= self.gemm_table_efficiency <= 1, "gpu.gemm_table_efficiency",
                self.gemm_table_efficiency,
                "is the fraction of peak the table was timed at: give one in (0, 1], or 0")
        for f in ("kernel_overhead_us", "dtensor_op_us", "flops_per_exp",
                  "attention_flops_per_exp"):
            require(getattr(self, f) >= 0, f"gpu.{f}", getattr(self, f), "must be >= 0")
        require(self.arch in ARCHS, "gpu.arch", self.arch,
                f"choose one of {', '.join(a for a in ARCHS if a)}")
        require(0 <= self.overlap_slowdown <= 1, "gpu.overlap_slowdown", self.overlap_slowdown,
                "is a fraction of the overlapped communication time: give a value in [0, 1]")

    def power_limited(self, limit_w: float) -> GPUSpec:
        """This GPU run at `limit_w` watts: GEMM and attention rates scaled by the clock
        it can hold."""
        require(self.tdp_w > 0, "power_limit_w", limit_w,
                f"{self.name} has no tdp_w to scale from; give one in a GPU file")
        static = STATIC_POWER_FRACTION * self.tdp_w
        require(static < limit_w <= self.tdp_w, "power_limit_w", limit_w,
                f"give a limit above {static:.0f} W and at most {self.name}'s {self.tdp_w:.0f} W")
        clock = ((limit_w - static) / (self.tdp_w - static)) ** (1.0 / 3.0)
        # the headroom above the sustained rate is measured at the board's own power only
        return replace(self, name=f"{self.name}@{limit_w:g}W", burst_gemm_efficiency=0.0,
                       gemm_efficiency=self.gemm_efficiency * clock,
                       fp8_gemm_efficiency=self.fp8_gemm_efficiency * clock,
                       attention_efficiency=self.attention_efficiency * clock, tdp_w=limit_w,
                       clock_fraction=self.clock_fraction * clock)

    def at_tensor_core_share(self, share: float) -> GPUSpec:
        """This GPU in a step that spends `share` of its time in tensor-core kernels (GEMMs,
        attention): their rates scaled by the clock the power cap allows when the rest of the
        step draws memory_bound_power_fraction of the board power (the cube law of
        power_limited), up to burst_gemm_efficiency."""
        if not self.burst_gemm_efficiency or not 0 < share < 1:
            return self
        # what the tensor-core kernels may draw, in board powers, for the step to average one
        tensor_core_power = (1 - (1 - share) * self.memory_bound_power_fraction) / share
        dynamic = (tensor_core_power - STATIC_POWER_FRACTION) / (1 - STATIC_POWER_FRACTION)
        clock = dynamic ** (1 / 3)
        scale = min(clock, self.burst_gemm_efficiency / self.gemm_efficiency)
        if scale <= 1:
            return self
        return replace(self, gemm_efficiency=self.gemm_efficiency * scale,
                       fp8_gemm_efficiency=self.fp8_gemm_efficiency * scale,
                       attention_efficiency=min(1.0, self.attention_efficiency * scale),
                       burst_gemm_efficiency=0.0)

    def gemm_fraction(self, dtype: str) -> float:
        """Achievable fraction of `dtype`'s dense peak for large GEMMs (the fp8 one for every
        quantized precision where measured apart; no fp4 GEMM has been measured here). An fp4
        GEMM sustains at most FP4_PER_FP8 times what an fp8 one does; a block-scaled one
        BLOCK_SCALED_GEMM_FRACTION of its format's plain rate."""
        p = get_precision(dtype)
        fraction = self.fp8_gemm_efficiency if p.quantized and self.fp8_gemm_efficiency else (
            self.gemm_efficiency)
        if p.rate == "fp4" and self.fp8_tflops and self.fp4_tflops:
            fraction = min(fraction, fraction * FP4_PER_FP8 * self.fp8_tflops / self.fp4_tflops)
        return fraction * (BLOCK_SCALED_GEMM_FRACTION if p.block else 1.0)

    @property
    def exp_ratio(self) -> float:
        """Dense 16-bit FLOPs per exponential (flops_per_exp, else its generation's); 0 unknown."""
        return self.flops_per_exp or FLOPS_PER_EXP.get(self.arch, 0.0)

    @property
    def has_multicast(self) -> bool:
        """The GPU and its NVLink switches support CUDA multicast (MULTICAST_ARCHS); a GPU of
        unknown generation is taken to."""
        return self.arch in MULTICAST_ARCHS or self.arch == ""

    @property
    def attention_exp_ratio(self) -> float:
        """exp_ratio of the part attention_efficiency was measured on."""
        return self.attention_flops_per_exp or self.exp_ratio

    def peak_tflops(self, dtype: str) -> float:
        """Dense peak for the compute precision (fp16 runs at the bf16 rate, mxfp8 at
        the fp8 one)."""
        p = get_precision(dtype)
        rate = getattr(self, f"{p.rate}_tflops")
        sixteen = "fp16" if self.arch in FP16_ONLY_ARCHS else "bf16"
        require(rate > 0, "dtype", dtype,
                f"{self.name} has no {p.rate} tensor cores; use {sixteen}")
        require(not (p.name == "bf16" and self.arch in FP16_ONLY_ARCHS), "dtype", dtype,
                f"{self.name} ({self.arch}) has no bf16 tensor cores, fp16 ones only; use fp16")
        require(
            not p.archs or self.arch in p.archs, "dtype", dtype,
            f"{self.name} ({self.arch or 'unknown generation'}) has no tensor cores for {dtype}'s "
            f"block scales (GPUs of {' and '.join(p.archs)} have them); use "
            f"{'fp8' if self.fp8_tflops else sixteen}")
        return rate

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict, source: str = "gpu") -> GPUSpec:
        known = {f.name for f in fields(cls)}
        reject_unknown(source, data, known)
        missing = [f.name for f in fields(cls) if f.name not in data and f.name not in OPTIONAL]
        if missing:
            raise SpecError(f"{source}.{missing[0]}", None, "is required")
        for name, columns in TABLE_COLUMNS.items():
            if name in data:  # YAML lists -> the frozen spec's tuples
                require(isinstance(data[name], (list, tuple)), f"{source}.{name}", data[name],
                        f"must be a list of [{', '.join(columns)}] rows")
                rows = (tuple(row) if isinstance(row, (list, tuple)) else row for row in data[name])
                data = {**data, name: tuple(rows)}
        return cls(**data)


# Peak rates and board power (tdp_w): vendor datasheets (dense, no sparsity). gemm_efficiency:
# Maximum Achievable Matmul FLOPS (MAMF, bf16, best shape) / peak, from stas00/ml-engineering
# compute/accelerator "MAMF comparison table" (A100 SXM 267.9/312, H100 SXM 792.1/989, GH200
# 821/989, B200 1745/2250, MI300X 781.9/1300). Hopper at 700 W cannot hold its MAMF clock through a
# training step: sustained GEMMs at LLM shapes run near 690-700 TFLOP/s (SemiAnalysis, "MI300X vs
# H100 vs H200 training", Dec 2024, GEMM sweep), and back-to-back bf16 GEMMs ran at 675 on this
# project's H100 at its 700 W cap (reports/gpu-gemm-soak): HOPPER_SUSTAINED. With power to spare
# they run at the MAMF (HOPPER_BURST; `simpar calibrate` measured 789 there), which a step that is
# partly memory-bound gets part of the way to (MEMORY_BOUND_POWER_FRACTION): a Megatron step, 85-90%
# in tensor-core kernels, runs its GEMMs near 0.69-0.70, what the 11 Megatron-LM H100 points of the
# calibration set need with the rest of the model held physical.
# A100 likewise runs a training step below its 1,410 MHz boost: NVIDIA rates its HPL Rpeak at
# 1,305 MHz, the clock an A100 holds at its 400 W limit under sustained tensor-core load
# (A100_SUSTAINED_CLOCK), which scales its MAMF and attention fractions. fp8 on Hopper reaches the
# same fraction of its (doubled) peak: cuBLASLt e4m3 8192^3 runs at ~1,610 of 1,979 TFLOP/s (81%)
# where bf16's MAMF is 80%, so Hopper entries leave fp8_gemm_efficiency unset. Blackwell: B200
# GEMMs of LLM shapes (vLLM benchmarks/kernels/bench_fp8_gemm.py on B200, PRs #18778 and #19566:
# Llama-3.1-8B's N=6144 K=4096 at 16,384 tokens) run at 1,513 TFLOP/s in bf16 (67% of 2,250)
# and 2,545 in per-tensor fp8 without the cast (57% of 4,500), below bf16's best-shape MAMF of
# 78%. attention_efficiency:
# FlashAttention-2 paper (Dao 2023, arXiv:2307.08691) fwd+bwd up to ~72% of A100 peak on long
# sequences, ~60% typical at head dim 128; FlashAttention-3 (Shah et al. 2024, arXiv:2407.08608) ~
# 50-60% of H100 bf16 peak fwd+bwd at head dim 128 (cuDNN / TE kernels similar).
# NVIDIA HGX B200 datasheet (per GPU, dense): 80 fp32, 1100 tf32, 2250 bf16, 4500 fp8, 9000 fp4,
# 180 GB at 8 TB/s. 148 SMs.
A100_SUSTAINED_CLOCK = 1305 / 1410
# vendors state memory in GB (10^9 bytes), the catalog in GiB
GIB_PER_GB = 1e9 / 2**30
HOPPER_SUSTAINED, HOPPER_BURST = 675 / 989, 792.1 / 989
# The H200 soaked on its own (reports/gpu-gemm-soak/gemm_soak-h200.json, torch 2.11+cu130, 700
# W): back to back, 661-666 TFLOP/s; with the memory-bound pass after each GEMM (53% of the time
# in GEMMs), 698-704, a smaller rise than the H100's: its HBM3e streams the pass at 3.5 TB/s
# against the H100's 2.7 (each window's time less its GEMMs') and draws more doing it, 0.82 of
# the board power by the same cube law.
H200_SUSTAINED, H200_MEMORY_BOUND_POWER = 663 / 989, 0.82
_A100_GEMM, _A100_ATTENTION = 0.859 * A100_SUSTAINED_CLOCK, 0.60 * A100_SUSTAINED_CLOCK
_B200 = GPUSpec("b200", 80.0, 1100.0, 2250.0, 4500.0, 179.0, 8.0, 148, gemm_efficiency=0.67,
                fp8_gemm_efficiency=0.57, attention_efficiency=0.50, tdp_w=1000, arch="blackwell",
                fp4_tflops=9000.0)


def _blackwell(name: str, fp32: float, tf32: float, bf16: float, fp8: float, hbm_gib: float,
               hbm_tbps: float, sms: int, *, tdp_w: float, fp4_tflops: float,
               ultra: bool = False, power_scaled: bool = True) -> GPUSpec:
    """A Blackwell part without measurements of its own: it sustains B200's measured GEMM and
    attention rates (TFLOP/s), at the clock its larger power budget holds over B200's 1000 W
    (power_limited's law, run upward from the same static floor), on its own count of SMs. A
    datasheet peak assumes a boost clock that sustained tensor-core work does not hold (as on
    Hopper, see above), so a higher peak at a higher board power raises the sustained rate by
    the power law, not by the ratio of peaks; more SMs at one power each run slower,
    sms^(2/3) (GB300, 160 SMs at 1400 W: x1.19, where its peaks are x1.11).
    Blackwell Ultra (`ultra`) computes exponentials twice as fast; its attention keeps B200's
    measured efficiency with B200's exponential rate beside it (attention_flops_per_exp), so
    that cost/compute.py's attention_softmax_factor prices the difference in each direction: at
    head dim 128 a forward 2 / 1.5 as fast as B200's, a backward 1.4 / 1.2. A part that is
    B200's die on a larger budget but runs no faster (`power_scaled` False) keeps B200's rates."""
    static = STATIC_POWER_FRACTION * _B200.tdp_w
    # each SM draws (power - static) / sms, so its clock goes as the cube root of that and the
    # part's rate as sms x clock
    per_sm = ((tdp_w - static) / sms) / ((_B200.tdp_w - static) / _B200.sm_count)
    rate = sms / _B200.sm_count * per_sm ** (1.0 / 3.0) if power_scaled else 1.0

    def fraction(b200_fraction: float, b200_peak: float, peak: float) -> float:
        return min(1.0, b200_fraction * b200_peak * rate / peak)

    return GPUSpec(name, fp32, tf32, bf16, fp8, hbm_gib, hbm_tbps, sms,
                   gemm_efficiency=fraction(_B200.gemm_efficiency, _B200.bf16_tflops, bf16),
                   fp8_gemm_efficiency=fraction(_B200.fp8_gemm_efficiency, _B200.fp8_tflops, fp8),
                   attention_efficiency=fraction(_B200.attention_efficiency, _B200.bf16_tflops,
                                                 bf16),
                   tdp_w=tdp_w, arch="blackwell", fp4_tflops=fp4_tflops,
                   flops_per_exp=_B200.exp_ratio / (2.0 if ultra else 1.0),
                   attention_flops_per_exp=_B200.exp_ratio)


GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in [
        # NVIDIA V100 SXM2 32GB datasheet: 15.7 fp32, 125 fp16 tensor, 900 GB/s; no bf16/tf32 tensor
        # cores (their rates are given as the fp16 tensor rate for bf16 and fp32 for tf32). 80 SMs.
        GPUSpec("v100-32gb", 15.7, 15.7, 125.0, 0.0, 32.0, 0.9, 80, gemm_efficiency=0.75,
                attention_efficiency=0.45, tdp_w=300, arch="volta"),
        # NVIDIA A100 datasheet (40GB SXM): 19.5 fp32, 156 tf32, 312 bf16, 1555 GB/s. 108 SMs.
        GPUSpec("a100-40gb", 19.5, 156.0, 312.0, 0.0, 40.0, 1.555, 108, gemm_efficiency=_A100_GEMM,
                attention_efficiency=_A100_ATTENTION, tdp_w=400, arch="ampere"),
        # NVIDIA A100 datasheet (80GB SXM): same compute, 2039 GB/s.
        GPUSpec("a100-80gb", 19.5, 156.0, 312.0, 0.0, 80.0, 2.039, 108, gemm_efficiency=_A100_GEMM,
                attention_efficiency=_A100_ATTENTION, tdp_w=400, arch="ampere"),
        # NVIDIA H100 datasheet (SXM5): 67 fp32, 494.5 tf32, 989 bf16, 1979 fp8, 80GB
        # HBM3 at 3.35 TB/s. 132 SMs.
        GPUSpec("h100-sxm", 67.0, 494.5, 989.0, 1979.0, 79.6, 3.35, 132,
                gemm_efficiency=HOPPER_SUSTAINED, burst_gemm_efficiency=HOPPER_BURST,
                attention_efficiency=0.5, tdp_w=700, arch="hopper"),
        # Meta's Grand Teton H100 (torchtitan's benchmark hardware,
        # benchmarks/llama3_h100_202412_torchtitan.md): H100 SXM compute with 96 GB
        # HBM2e at 2.4 TB/s, run at a 500 W default power limit (--power-limit-w 500). The
        # same compute die as the H100 SXM, so the same sustained and burst GEMM fractions.
        GPUSpec("h100-sxm-96gb", 67.0, 494.5, 989.0, 1979.0, 95.6, 2.4, 132,
                gemm_efficiency=HOPPER_SUSTAINED, burst_gemm_efficiency=HOPPER_BURST,
                attention_efficiency=0.5, tdp_w=700, arch="hopper"),
        # NVIDIA H100 datasheet (PCIe): 51 fp32, 378 tf32, 756 bf16, 1513 fp8, 80GB
        # HBM2e at 2.0 TB/s. 114 SMs.
        GPUSpec("h100-pcie", 51.0, 378.0, 756.0, 1513.0, 79.6, 2.0, 114, gemm_efficiency=0.70,
                attention_efficiency=0.5, tdp_w=350, arch="hopper"),
        # NVIDIA H200 datasheet (SXM): H100 compute, 141 GB HBM3e at 4.8 TB/s; same 700
        # W limit as H100.
        GPUSpec("h200", 67.0, 494.5, 989.0, 1979.0, 140.4, 4.8, 132,
                gemm_efficiency=H200_SUSTAINED, burst_gemm_efficiency=HOPPER_BURST,
                memory_bound_power_fraction=H200_MEMORY_BOUND_POWER,
                attention_efficiency=0.5, tdp_w=700, arch="hopper"),
        _B200,
        # Rack-scale and Blackwell Ultra parts (NVIDIA datasheets, per GPU, dense; rack figures
        # / 72): no GEMM or attention measurement of their own yet, so _blackwell gives them
        # B200's, at the clock each one's power budget holds; `simpar calibrate` on the
        # machine replaces them. GB200 NVL72: 80 fp32, 1250 tf32, 2500 bf16, 5000 fp8, 10000
        # fp4; 13.4 TB HBM3e at 576 TB/s per rack = 186 GB at 8 TB/s; 1200 W; B200's die, 148 SMs.
        # Measured, its 200 W over B200 buy no speed, so it keeps B200's rates (the power law
        # would price it 1.07x): Megatron-Bridge 25.11 ran the identical Llama 3 8B recipe 1.03x
        # (fp8 current scaling) and 1.01x (mxfp8) B200's tokens/s, and NVIDIA's MLPerf Training
        # v5.1 runs of identical recipes and software on GB300 and GB200 (Theia and Tyche: Llama
        # 3.1 8B NVFP4 on 8 and 72 GPUs, Llama 2 70B LoRA FP8 on 72 and 512) stepped 1.15-1.17x
        # faster on GB300, which this law prices 1.19x over B200: over a 1.07x GB200 that ratio
        # would be 1.11x
        _blackwell("gb200", 80.0, 1250.0, 2500.0, 5000.0, 186.0, 8.0, 148, tdp_w=1200,
                   fp4_tflops=10000.0, power_scaled=False),
        # GB300 NVL72 (Blackwell Ultra): 80 fp32, 1250 tf32, 2500 bf16, 5000 fp8, 15000 fp4;
        # 20 TB HBM3e per rack = 279 GB at 8 TB/s; 1400 W; 160 SMs, whose dense 16- and 8-bit
        # peaks are GB200's: the extra SMs do not raise them.
        _blackwell("gb300", 80.0, 1250.0, 2500.0, 5000.0, 279.0, 8.0, 160, tdp_w=1400,
                   fp4_tflops=15000.0, ultra=True),
        # HGX B300: 75 fp32, 1100 tf32, 2250 bf16, 4500 fp8, 14000 fp4; 2.1 TB HBM3e per 8
        # GPUs = 270 GB at 7.7 TB/s; 1100 W; 160 SMs.
        _blackwell("b300", 75.0, 1100.0, 2250.0, 4500.0, 270.0, 7.7, 160, tdp_w=1100,
                   fp4_tflops=14000.0, ultra=True),
        # AMD Instinct MI355X datasheet (dense): 157.3 fp32, 1258.3 tf32 (as bf16/2), 2516.6
        # bf16, 5033.2 fp8, 10066.3 mxfp4; 288 GB HBM3E at 8 TB/s; 1400 W. 256 CUs. No measurement
        # of its own yet: MI300X's MAMF fraction (781.9/1300) and attention efficiency.
        GPUSpec("mi355x", 157.3, 1258.3, 2516.6, 5033.2, 288.0, 8.0, 256, gemm_efficiency=0.601,
                attention_efficiency=0.40, tdp_w=1400, arch="cdna4", fp4_tflops=10066.3),
        # AMD Instinct MI300X datasheet: 163.4 fp32, 653.7 tf32, 1307.4 bf16, 2614.9
        # fp8, 192 GB at 5.3 TB/s. 304 CUs.
        GPUSpec("mi300x", 163.4, 653.7, 1307.4, 2614.9, 192.0, 5.3, 304, gemm_efficiency=0.601,
                attention_efficiency=0.40, tdp_w=750, arch="cdna3"),
        # AMD Instinct MI325X datasheet: MI300X compute, 256 GB HBM3E at 6 TB/s.
        GPUSpec("mi325x", 163.4, 653.7, 1307.4, 2614.9, 256.0, 6.0, 304, gemm_efficiency=0.601,
                attention_efficiency=0.40, tdp_w=1000, arch="cdna3"),
        # Export variants: H800 SXM = H100 SXM compute and memory with NVLink cut to 400
        # GB/s (both directions); A800 80GB = A100 80GB with NVLink cut to 400 GB/s. The
        # node table in cluster.py carries the links.
        GPUSpec("h800", 67.0, 494.5, 989.0, 1979.0, 79.6, 3.35, 132,
                gemm_efficiency=HOPPER_SUSTAINED, burst_gemm_efficiency=HOPPER_BURST,
                attention_efficiency=0.5, tdp_w=700, arch="hopper"),
        GPUSpec("a800-80gb", 19.5, 156.0, 312.0, 0.0, 80.0, 2.039, 108, gemm_efficiency=_A100_GEMM,
                attention_efficiency=_A100_ATTENTION, tdp_w=400, arch="ampere"),
        # NVIDIA GH200 (the superchip's Hopper GPU: 96 GB HBM3, 95.6 GiB usable as 80 GB
        # is 79.6, at 4.0 TB/s): H100 SXM compute, but the module's power budget (up to
        # 1000 W with the CPU) lets GEMMs hold their MAMF clock: 821/989 (stas00).
        GPUSpec("gh200", 67.0, 494.5, 989.0, 1979.0, 95.6, 4.0, 132, gemm_efficiency=0.83,
                attention_efficiency=0.5, arch="hopper"),
    ]
}

# What the vendors and nvidia-smi call the catalog's GPUs (names.normal_form): "H100" alone is the
# SXM5 module of DGX and HGX H100 systems; nvidia-smi's names spell out the module and memory.
GPU_ALIASES = {
    **{name: "h100-sxm" for name in ("h100", "h100-sxm5", "h100-80gb", "h100-sxm5-80gb",
                                     "h100-sxm-80gb", "nvidia-h100", "nvidia-h100-sxm",
                                     "nvidia-h100-80gb-hbm3", "h100-80gb-hbm3")},
    **{name: "a100-80gb" for name in ("a100-sxm4-80gb", "nvidia-a100-sxm4-80gb", "a100-sxm-80gb")},
    **{name: "a100-40gb" for name in ("a100-sxm4-40gb", "nvidia-a100-sxm4-40gb", "a100-sxm-40gb")},
    **{name: "h200" for name in ("h200-sxm", "nvidia-h200", "h200-141gb")},
    **{f"nvidia-{name}": name for name in ("b200", "gb200", "gb300", "b300")},
    **{f"{vendor}-{name}": name for vendor in ("amd", "amd-instinct", "instinct")
       for name in ("mi300x", "mi325x", "mi355x")},
    "h200-sxm-141gb": "h200", "nvidia-h100-pcie": "h100-pcie", "h100-96gb": "h100-sxm-96gb",
    "tesla-v100-sxm2-32gb": "v100-32gb", "v100-sxm2-32gb": "v100-32gb",
}
# names that mean more than one catalog GPU: the error names them all
GPU_AMBIGUOUS = {name: ("a100-40gb", "a100-80gb")
                 for name in ("a100", "nvidia-a100", "a100-sxm", "a100-sxm4")}

