"""`simpar simulate --explain`: one layer's time kernel by kernel, as the prediction prices it."""

import json

import pytest

from simpar.cli import main
from simpar.report.kernels import layer_time
from simpar.specs import MODELS, JobSpec, Strategy, load_cluster
from simpar.specs.model import ModelSpec
from simpar.specs.stack import EAGER_LAUNCH_US

H100 = load_cluster("dgx-h100", None)


def test_the_layer_rows_add_up_to_what_the_step_prices_for_its_layers(capsys):
    args = ["simulate", "--model", "llama2-7b", "--gpu", "h100-sxm", "--gpus", "1", "--seq-len",
            "4096", "--global-batch", "4", "--micro-batch", "2", "--stack", "megatron",
            "--engine", "analytic", "--json", "--explain"]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    layer = doc["layer"]
    names = [k["name"] for k in layer["kernels"]]
    assert names == ["qkv", "proj", "mlp_up", "mlp_down", "attention", "elementwise"]
    for k in layer["kernels"]:
        assert k["forward_s"] > 0 and k["backward_s"] > k["forward_s"]
    # 2 micro-batches of 32 layers, and the output layer and loss: the layers' forward is most
    # of the step's forward compute, never more
    layers = 2 * 32 * layer["forward_s"]
    assert 0.85 * doc["breakdown"]["forward_compute"] < layers < doc["breakdown"][
        "forward_compute"]


def test_a_gemms_rate_is_its_flops_over_its_time_and_the_host_waits_only_for_small_kernels():
    job = JobSpec(2048, 8, "bf16")
    big = layer_time(MODELS["llama3-8b"], H100, job, Strategy(stack="torchtitan"))
    qkv = big.kernels[0]
    assert qkv.name == "qkv" and qkv.forward_flops == 2 * 2048 * (4096 + 2 * 1024) * 4096
    assert big.host_wait_forward_s == 0.0
    # a 256-wide layer of 128 tokens runs its eager kernels faster than the host launches them:
    # the forward takes 7 GEMMs (torchtitan's Llama keeps wq, wk, wv and w1, w3 apart), the
    # attention kernel and 36 elementwise kernels at EAGER_LAUNCH_US each
    tiny = layer_time(ModelSpec(name="tiny", layers=2, hidden=256, heads=4, kv_heads=2,
                                ffn_hidden=768, vocab=1000),
                      H100, JobSpec(128, 1, "bf16"), Strategy(stack="torchtitan", zero=3))
    assert tiny.host_wait_forward_s > 0
    assert sum(k.forward_s for k in tiny.kernels) + tiny.host_wait_forward_s == pytest.approx(
        (7 + 1 + 36) * EAGER_LAUNCH_US * 1e-6)


def _explain_table(capsys, zero: str) -> str:
    assert main(["simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8",
                 "--seq-len", "8192", "--global-batch", "32", "--stack", "execpar", "--zero", zero,
                 "--recompute", "selective", "--explain"]) == 0
    out = capsys.readouterr().out
    return out[out.index("one layer, one micro-batch"):]


def test_the_text_table_names_each_kernel_and_the_layer_total(capsys):
    """execpar over DDP runs autocast over fp32 weights: the weights' gradient casts and the fp32
    stream have rows; under FSDP (ZeRO-3), which casts the weights itself, neither has."""
    table = _explain_table(capsys, "0")
    for row in ("qkv", "mlp_up", "attention", "elementwise", "gradient casts", "fp32 stream",
                "rope (op by op)", "recompute", "layer"):
        assert f"\n{row} " in table
    assert "TFLOP/s (" in table and "GB/s" in table
    sharded = _explain_table(capsys, "3")
    assert "\ngradient casts " not in sharded and "\nfp32 stream " not in sharded
    assert "\nelementwise " in sharded and "\nrope (op by op) " in sharded


def test_explain_is_in_the_help(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    assert "--explain" in capsys.readouterr().out


def test_attention_is_measured_against_the_16_bit_peak_it_runs_at_in_fp8_recipes(capsys):
    assert main(["simulate", "--model", "llama3-8b", "--gpu", "h100-sxm", "--gpus", "8",
                 "--seq-len", "8192", "--global-batch", "8", "--stack", "megatron", "--dtype",
                 "fp8", "--explain"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line}
    rate, share = rows["attention"].split("TFLOP/s (")[0].split()[-1], rows["attention"].split(
        "TFLOP/s (")[1].split("%")[0]
    assert int(share) == round(100 * float(rate.replace(",", "")) / 989)
    qkv_rate, qkv_share = rows["qkv"].split("TFLOP/s (")[0].split()[-1], rows["qkv"].split(
        "TFLOP/s (")[1].split("%")[0]
    assert int(qkv_share) == round(100 * float(qkv_rate.replace(",", "")) / 1979)
