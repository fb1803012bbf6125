"""fp8 training: which GEMMs run in fp8 and at what fraction of the fp8 peak."""

from dataclasses import replace

import pytest

from simpar.cost.compute import backward_gemm_factor, gemm_time
from simpar.cost.layer import head_cost, layer_cost
from simpar.errors import SpecError
from simpar.network.model import network_for
from simpar.specs import GPUS, MODELS, Strategy, load_cluster
from simpar.specs.gpu import BLOCK_SCALED_GEMM_FRACTION
from simpar.specs.stack import STACKS
from simpar.workload.layer import Gemm, head_work, layer_work

M = MODELS["llama3-8b"]


def test_output_layer_stays_16_bit_under_fp8():
    cluster = load_cluster("dgx-h100", None)
    net = network_for(cluster, Strategy(dp=8))
    gpu = cluster.gpu
    fp8_f, fp8_b = head_cost(head_work(M, 8192, 1, 1, 1, False, "fp8"), net, gpu, "fp8")
    logits = Gemm("logits", 8192, M.vocab, M.hidden)
    # the logits GEMM runs at the bf16 rate, not the (twice as fast) fp8 one
    assert fp8_f.compute_s > gemm_time(logits, gpu, "bf16") > 1.8 * gemm_time(logits, gpu, "fp8")
    bf16_f, _ = head_cost(head_work(M, 8192, 1, 1, 1, False, "bf16"), net, gpu, "bf16")
    assert fp8_f.compute_s == pytest.approx(bf16_f.compute_s)


def test_fp8_gemms_run_at_their_measured_fraction_of_the_fp8_peak():
    big = Gemm("up", 16384, 8192, 8192)
    h100, b200 = GPUS["h100-sxm"], GPUS["b200"]
    # the same fraction on Hopper
    assert h100.gemm_fraction("fp8") == h100.gemm_fraction("bf16") == pytest.approx(675 / 989)
    assert b200.gemm_fraction("fp8") == 0.57 and b200.gemm_fraction("bf16") == 0.67
    # Transformer Engine's B300 GEMMs: MXFP8 1.74x bf16 where per-tensor fp8 is 1.94x
    assert b200.gemm_fraction("mxfp8") == pytest.approx(0.57 * 0.90)
    # B200: 2 x 0.57 / 0.67 = 1.70x bf16, less the fixed per-tile K overhead at twice the rate (the
    # launch cost, the same at both precisions, set to zero to see the ratio alone)
    b200 = replace(b200, kernel_overhead_us=0.0)
    ratio = gemm_time(big, b200, "bf16") / gemm_time(big, b200, "fp8")
    k = big.k
    assert ratio == pytest.approx(2 * 0.57 / 0.67 * (k + 128) / (k + 256), rel=1e-9)


def test_power_limit_slows_fp8_gemms_like_bf16_ones():
    capped = GPUS["b200"].power_limited(700)
    clock = capped.gemm_efficiency / 0.67
    assert clock < 1 and capped.fp8_gemm_efficiency == pytest.approx(0.57 * clock)


def test_gpu_file_rejects_a_bad_fp8_fraction():
    with pytest.raises(SpecError, match="fp8_gemm_efficiency"):
        replace(GPUS["h100-sxm"], fp8_gemm_efficiency=1.5)



def test_fp8_backward_gemms_pay_hoppers_split_accumulator():
    """Input- and weight-gradient GEMMs run without fast accumulation on Hopper: 1.15x slower each,
    so backward GEMM time is 2 x 1.15 = 2.3x the forward's there and 2x elsewhere and in bf16."""
    h100, a100, b200 = GPUS["h100-sxm"], GPUS["a100-80gb"], GPUS["b200"]
    assert backward_gemm_factor(h100, "fp8") == pytest.approx(2.3)
    assert backward_gemm_factor(h100, "bf16") == backward_gemm_factor(b200, "fp8") == 2.0
    assert backward_gemm_factor(a100, "bf16") == 2.0
    # a layer whose time is almost all GEMMs: its fp8 backward over forward moves from ~2 to ~2.3
    cluster = load_cluster("dgx-h100", None)
    net = network_for(cluster, Strategy(dp=8))
    work = layer_work(MODELS["llama3-70b"], 8192, 2, 1, 1, 1, False, True, "fp8")
    # TE's transposed fp8 copies, Hopper's too (te_transpose_bytes), left out of the comparison
    stack = replace(STACKS["megatron"], te_quantize_launches=False)
    fwd, bwd = layer_cost(work, net, h100, "fp8", "none", False, stack)
    fwd16, bwd16 = layer_cost(work, net, replace(h100, arch="ampere"), "fp8", "none", False, stack)
    assert fwd.compute_s == pytest.approx(fwd16.compute_s)
    gemm_f = sum(gemm_time(g, h100, "fp8") for g in work.gemms)
    assert bwd.compute_s - bwd16.compute_s == pytest.approx(0.3 * gemm_f, rel=1e-6)
    assert bwd.wgrad_s == pytest.approx(1.15 * gemm_f)


def test_block_scaled_precisions_bytes_worked_by_hand():
    from simpar.specs.precision import PRECISIONS

    fp8, mx, nv = PRECISIONS["fp8"], PRECISIONS["mxfp8"], PRECISIONS["nvfp4"]
    assert fp8.gemm_input_bytes == 1.0 and fp8.cast_bytes == 3.0  # read 2 B, write one 1-byte copy
    assert mx.gemm_input_bytes == 1 + 1 / 32  # an 8-bit scale per 32 elements
    assert mx.cast_bytes == 2 + 2 * (1 + 1 / 32)  # row-wise and column-wise copies
    assert nv.gemm_input_bytes == 0.5 + 1 / 16  # 4-bit elements, an 8-bit scale per 16
    assert PRECISIONS["bf16"].cast_bytes == 0.0 and PRECISIONS["tf32"].word_bytes == 4


def test_block_scaled_precisions_need_their_tensor_cores():
    with pytest.raises(SpecError,
                       match="h100-sxm .hopper. has no tensor cores for mxfp8's block scales"):
        GPUS["h100-sxm"].peak_tflops("mxfp8")
    with pytest.raises(SpecError, match="mi355x .cdna4. has no tensor cores for nvfp4"):
        GPUS["mi355x"].peak_tflops("nvfp4")
    assert GPUS["mi355x"].peak_tflops("mxfp8") == GPUS["mi355x"].fp8_tflops
    assert (
        GPUS["gb200"].peak_tflops("nvfp4")
        == GPUS["gb200"].fp4_tflops
        == 2 * GPUS["gb200"].fp8_tflops
    )


def test_a_v100_runs_fp16_and_is_refused_bf16_and_fp8_with_fp16_named(capsys):
    """Volta's tensor cores multiply fp16 only (bf16 came with Ampere): bf16 and fp8 jobs on a
    V100 are refused in one line that names fp16, which prices at the 16-bit tensor-core rate."""
    from simpar.cli.parser import main

    v100 = GPUS["v100-32gb"]
    assert v100.peak_tflops("fp16") == v100.bf16_tflops == 125.0
    with pytest.raises(SpecError, match="no bf16 tensor cores, fp16 ones only; use fp16"):
        v100.peak_tflops("bf16")
    with pytest.raises(SpecError, match="no fp8 tensor cores; use fp16"):
        v100.peak_tflops("fp8")
    assert GPUS["a100-80gb"].peak_tflops("bf16") == 312.0  # and Ampere has bf16
    base = ["simulate", "--model", "llama2-7b", "--gpu", "v100-32gb", "--gpus", "8",
            "--seq-len", "2048", "--global-batch", "64", "--engine", "analytic"]
    assert main(base + ["--dtype", "bf16"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "use fp16" in err
    assert main(base + ["--dtype", "fp16"]) == 0


def test_on_blackwell_nvfp4_beats_fp8_which_beats_mxfp8_by_its_casts_and_block_scales():
    from simpar.cost.step import predict
    from simpar.specs import JobSpec

    cluster, s = load_cluster("gb200-nvl72", None), Strategy(dp=16, tp=4, sp=True, zero=1)
    p = {
        d: predict(MODELS["llama3-70b"], cluster, JobSpec(8192, 64, d), s)
        for d in ("bf16", "fp8", "mxfp8", "nvfp4")
    }
    assert (
        p["nvfp4"].step_time_s
        < p["fp8"].step_time_s
        < p["mxfp8"].step_time_s
        < p["bf16"].step_time_s
    )
    # a second copy and scales, and block-scaled GEMMs at 0.9 of fp8's rate: slower than the
    # casts alone make it, faster than the whole step at the GEMMs' ratio
    assert 1.03 < p["mxfp8"].step_time_s / p["fp8"].step_time_s < 1 / BLOCK_SCALED_GEMM_FRACTION
    act = {d: p[d].memory.activations_gib for d in p}
    # the kept GEMM inputs, scales included
    assert act["nvfp4"] < act["fp8"] < act["mxfp8"] < act["bf16"]
