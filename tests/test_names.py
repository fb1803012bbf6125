"""Names as users copy them from the tools they run (torchtitan's schedules, torch's dtypes, a
datasheet's GPU names) mean simpar's, and a name that means nothing is still refused in one
line."""

import json

import pytest

from simpar.cli import main
from simpar.errors import SpecError
from simpar.search.space import SearchSpace
from simpar.specs.job import JobSpec
from simpar.specs.loaders import load_model
from simpar.specs.model_catalog import MODELS
from simpar.specs.names import canonical, normal_form
from simpar.specs.schedule import get_schedule
from simpar.specs.strategy import Strategy

BASE = ["simulate", "--gpus", "16", "--pp", "2", "--seq-len", "4096", "--global-batch", "32",
        "--json", "--engine", "analytic"]


def _priced(capsys, *args) -> dict:
    assert main(BASE + list(args)) == 0
    return json.loads(capsys.readouterr().out)


def _exit(args) -> int:
    try:
        return main(BASE + list(args))
    except SystemExit as exc:
        return exc.code


def test_the_normal_form_ignores_case_and_the_separator():
    assert normal_form(" H100_SXM ") == normal_form("h100 sxm") == "h100-sxm"
    assert canonical("ZB_H1", ("1f1b", "zb-h1")) == "zb-h1"
    assert canonical("bfloat16", ("bf16",), {"bfloat16": "bf16"}) == "bf16"
    # nothing matches: the name comes back as typed, for the lookup to refuse
    assert canonical("LoopedBFS", ("1f1b",)) == "LoopedBFS"
    assert canonical(None, ("none",)) is None
    # words run together or split apart: the one name they mean, and none where two are meant
    assert canonical("Mosaic ML", ("mosaic",), {"mosaicml": "mosaic"}) == "mosaic"
    assert canonical("H100SXM", ("h100-sxm", "h100-pcie")) == "h100-sxm"
    assert canonical("ab", ("a-b", "ab-")) == "ab"


@pytest.mark.parametrize("flag, spelled, name", [
    ("--schedule", "1F1B", "1f1b"), ("--schedule", "Schedule1F1B", "1f1b"),
    ("--schedule", "GPipe", "gpipe"), ("--schedule", "ZBVZeroBubble", "zbv"),
    ("--schedule", "DualPipeV", "dualpipev"), ("--schedule", "InterleavedZeroBubble", "zb-h1"),
    ("--schedule", "PipeDream-Flush", "1f1b"), ("--schedule", "fill-drain", "gpipe"),
    ("--dtype", "bfloat16", "bf16"),
    ("--dtype", "BF16", "bf16"), ("--recompute", "FULL", "full"),
    # Lightning's, llm-foundry's and NeMo 2's precision names
    ("--dtype", "bf16-mixed", "bf16"), ("--dtype", "amp_bf16", "bf16"),
    ("--dtype", "16-mixed", "fp16"), ("--dtype", "amp_fp8", "fp8"),
    ("--dtype", "bf16_with_fp8_mixed", "fp8"), ("--dtype", "E4M3", "fp8"),
    # recompute as torchtitan's configs and fms-fsdp's and torchtitan's tables write it
    ("--recompute", "No AC", "none"), ("--recompute", "off", "none"),
    ("--recompute", "Full AC", "full"), ("--recompute", "selective_op", "op"),
    ("--gpu", "H100-SXM", "h100-sxm"), ("--model", "Llama3-8B", "llama3-8b"),
    # the vendor's bare name and nvidia-smi's
    ("--gpu", "H100", "h100-sxm"), ("--gpu", "NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("--gpu", "NVIDIA A100-SXM4-40GB", "a100-40gb"), ("--gpu", "nvidia-h100", "h100-sxm"),
    ("--gpu", "H100-SXM-80GB", "h100-sxm"), ("--gpu", "NVIDIA GB300", "gb300"),
    ("--gpu", "AMD Instinct MI355X", "mi355x"),
    # systems and racks as the published tables name them, memory as a datasheet writes it
    ("--gpu", "DGX-B200", "b200"), ("--gpu", "DGX-GB300", "gb300"),
    ("--gpu", "HGX H100", "h100-sxm"),
    ("--gpu", "GB200 NVL72", "gb200"), ("--gpu", "A100-80G", "a100-80gb"),
    ("--gpu", "NVIDIA H200 141GB HBM3e", "h200"), ("--gpu", "B200-180GB", "b200"),
    ("--gpu", "H100 96GB", "h100-sxm-96gb"),
    ("--model", "LLAMA31_405B", "llama3.1-405b"), ("--cluster", "DGX-GB200", "gb200-nvl72"),
    ("--cluster", "DGX H100", "dgx-h100"), ("--model", "Qwen3_30B_a3B", "qwen3-30b-a3b"),
    # projects as their users write them, with or without the space
    ("--stack", "Mosaic ML", "mosaic"), ("--stack", "LLM Foundry", "mosaic"),
    # (DeepSpeed named plainly on an H100 is its era of the runs there)
    ("--stack", "deepspeed-megatron", "deepspeed-0.6"), ("--stack", "NVIDIA NeMo", "nemo"),
    ("--stack", "NeMo Framework", "nemo"), ("--stack", "TorchTitan", "torchtitan"),
    ("--stack", "MegatronCore", "megatron"),
    # Megatron core's release tags, as its repository writes them
    ("--stack", "megatron@core_r0.8.0", "megatron"),
])
def test_a_name_as_another_tool_spells_it_prices_as_simpars(capsys, flag, spelled, name):
    given = {"--gpu": "h100-sxm", "--model": "llama3-8b"}
    plain = [a for k, v in given.items() if k != flag and (k, flag) != ("--gpu", "--cluster")
             for a in (k, v)]
    priced = _priced(capsys, *plain, flag, spelled)
    assert priced == _priced(capsys, *plain, flag, name)
    assert {"--gpu": priced["priced"]["gpu"], "--model": priced["priced"]["model"],
            "--dtype": priced["priced"]["dtype"], "--cluster": priced["priced"]["cluster"],
            "--stack": priced["strategy"]["stack"]}.get(flag, name) == name


def test_megatron_bridges_fp8_names_say_their_scaling_and_the_flag_still_wins(capsys):
    """Megatron-Bridge's tables write per-tensor fp8 as FP8-CS (current scaling) and FP8-DS
    (delayed): each prices --dtype fp8 with that --fp8-scaling, and a --fp8-scaling given beside
    it, before or after, wins; FP8-MX is mxfp8 (on a Blackwell GPU)."""
    args = ["--gpu", "h100-sxm", "--model", "llama3-8b", "--stack", "megatron"]
    for spelled, scaling in (("FP8-CS", "current"), ("FP8-DS", "delayed"), ("fp8_cs", "current")):
        priced = _priced(capsys, *args, "--dtype", spelled)
        assert priced["strategy"]["fp8_scaling"] == scaling
        assert priced == _priced(capsys, *args, "--dtype", "fp8", "--fp8-scaling", scaling)
    for order in (["--fp8-scaling", "current", "--dtype", "FP8-DS"],
                  ["--dtype", "FP8-DS", "--fp8-scaling", "current"]):
        assert _priced(capsys, *args, *order)["strategy"]["fp8_scaling"] == "current"
    # the header says the scaling priced
    assert main(BASE[:-3] + ["--engine", "analytic", *args, "--dtype", "FP8-DS"]) == 0
    assert "fp8 (delayed scaling)\nstrategy" in capsys.readouterr().out
    blackwell = ["--gpu", "b200", "--model", "llama3-8b"]
    assert _priced(capsys, *blackwell, "--dtype", "FP8-MX")["priced"]["dtype"] == "mxfp8"
    assert _priced(capsys, *args, "--dtype", "bf16-mixed")["strategy"]["fp8_scaling"] == ""


def test_torchtitans_interleaved_schedule_is_simpars_and_a_plan_records_simpars_name(capsys):
    args = ["--gpu", "h100-sxm", "--model", "llama3-8b", "--vpp", "4"]
    priced = _priced(capsys, *args, "--schedule", "Interleaved1F1B")
    assert priced["strategy"]["schedule"] == "interleaved"
    assert priced == _priced(capsys, *args, "--schedule", "interleaved")
    assert get_schedule("interleaved_1f1b").name == "interleaved"
    assert Strategy(pp=2, schedule="GPipe", recompute="Full").schedule == "gpipe"
    assert JobSpec(4096, 32, "BFloat16").dtype == "bf16"
    space = SearchSpace(recompute=("No AC", "FULL"), schedules=("1F1B", "Interleaved1F1B"))
    assert space.recompute == ("none", "full") and space.schedules == ("1f1b", "interleaved")


@pytest.mark.parametrize("flag, value", [("--schedule", "LoopedBFS"), ("--dtype", "fp4"),
                                         ("--gpu", "h100-nvl"), ("--model", "llama-9b"),
                                         # a memory the GPU does not have, a system alone
                                         ("--gpu", "B200-80GB"), ("--gpu", "DGX")])
def test_a_name_that_means_nothing_is_still_refused_in_one_line(capsys, flag, value):
    given = {"--gpu": "h100-sxm", "--model": "llama3-8b", flag: value}
    assert _exit([a for kv in given.items() for a in kv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and value in err[0]
    with pytest.raises(SpecError, match="schedule='LoopedBFS'"):
        Strategy(pp=2, schedule="LoopedBFS")


def test_a_hub_id_means_the_catalog_model_built_from_its_config(capsys):
    args = ["--gpu", "h100-sxm", "--model"]
    for hub_id, name in (("meta-llama/Meta-Llama-3-8B", "llama3-8b"),
                         ("meta-llama/Llama-3.1-8B-Instruct", "llama3-8b"),
                         ("meta-llama/Llama-2-7b-hf", "llama2-7b"),
                         ("Qwen/Qwen3-30B-A3B", "qwen3-30b-a3b"),
                         ("mistralai/Mixtral-8x22B-Instruct-v0.1", "mixtral-8x22b")):
        priced = _priced(capsys, *args, hub_id)
        assert priced["priced"]["model"] == name and priced == _priced(capsys, *args, name)
    # one it does not hold asks for its config.json, in one line
    assert _exit(args + ["Qwen/Qwen3-Coder-480B-A35B"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "config.json" in err[0]


@pytest.mark.parametrize("spelled, name", [
    ("Llama-3.1-8B", "llama3-8b"), ("llama-3.3-70b-instruct", "llama3-70b"),
    ("Llama-3.1-405B", "llama3.1-405b"), ("Nemotron-4-340B", "nemotron4-340b"),
    ("Llama-3.2-1B-Instruct", "llama3.2-1b"), ("Meta-Llama-3-70B", "llama3-70b"),
    ("bigscience/bloom", "bloom-176b"), ("Megatron-Turing-NLG-530B", "megatron2021-529.6b"),
    ("mt-nlg-530b", "megatron2021-529.6b"), ("MPT-30B", "mpt-30b"),
    ("llama-2-34b", "codellama-34b")])
def test_a_model_as_its_vendor_writes_it_is_the_catalogs(spelled, name):
    # the family and its version apart, a release of the same shape, the Hub's suffixes
    assert load_model(spelled) is MODELS[name]


@pytest.mark.parametrize("spelled", ["A100", "A100-SXM4"])
def test_an_a100_without_its_memory_is_asked_for_it(capsys, spelled):
    assert _exit(["--model", "llama3-8b", "--gpu", spelled]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a100-40gb or a100-80gb" in err[0]


def test_virtual_stages_alone_mean_the_interleaved_schedule(capsys):
    """--vpp 5 with --pp 4 and no --schedule is interleaved 1F1B, as Megatron's
    --num-layers-per-virtual-pipeline-stage alone runs it; a schedule the user names still wins,
    and one without virtual stages is still refused beside them."""
    args = ["--gpu", "h100-sxm", "--model", "llama3-8b", "--pp", "4"]
    alone = _priced(capsys, *args, "--vpp", "4")
    assert (alone["strategy"]["schedule"], alone["strategy"]["vpp"]) == ("interleaved", 4)
    assert alone == _priced(capsys, *args, "--vpp", "4", "--schedule", "interleaved")
    assert _priced(capsys, *args)["strategy"]["schedule"] == "1f1b"
    assert _exit([*args, "--vpp", "4", "--schedule", "1f1b"]) == 2
    assert "virtual stages need --schedule interleaved" in capsys.readouterr().err


@pytest.mark.parametrize("spelled, stage", [("ZeRO-3", 3), ("zero 1", 1), ("stage 2", 2),
                                            ("FULL_SHARD", 3), ("SHARD_GRAD_OP", 2),
                                            ("NO_SHARD", 0), ("distributed optimizer", 1)])
def test_a_zero_stage_as_deepspeed_and_fsdp_name_it(capsys, spelled, stage):
    """DeepSpeed's ZeRO-N and FSDP's sharding strategies are the ZeRO stage they shard as; hybrid
    sharding asks for the group it shards in."""
    args = ["--gpu", "h100-sxm", "--model", "llama3-8b"]
    priced = _priced(capsys, *args, "--zero", spelled)
    assert priced["strategy"]["zero"] == stage
    assert priced == _priced(capsys, *args, "--zero", str(stage))


def test_hybrid_sharding_by_name_asks_for_its_group(capsys):
    assert _exit(["--gpu", "h100-sxm", "--model", "llama3-8b", "--zero", "HSDP"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--dp-shard" in err[0]
