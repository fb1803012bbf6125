"""benchmarks/stack_accuracy.py prices each published run with the strategy its source states."""

import json
from pathlib import Path

import yaml

STACKS = Path(__file__).parents[1] / "benchmarks" / "data" / "stacks.yaml"


def test_hybrid_sharded_runs_are_priced_with_fsdp_inside_a_node(benchmark, tmp_path, capsys):
    """fms-fsdp's 7B rows ran HSDP (its README's table says so): shard inside an 8-GPU node,
    replicate across nodes, which `--dp-shard 8` prices; before, they were priced as FSDP over
    all 96-128 GPUs."""
    from simpar.cli.parser import main

    module = benchmark("stack_accuracy")
    points = yaml.safe_load(STACKS.read_text())["points"]
    hybrid = [p for p in points if p["strategy"].get("fsdp_sharding") == "HSDP"]
    assert len(hybrid) == 4
    for pt in hybrid:
        args = module.flags(pt, module._model_file(pt, tmp_path), "analytic")
        assert args[args.index("--dp-shard") + 1] == "8"
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["strategy"]["dp_shard"] == 8


def _tokens_per_s(args: list, flag: str, values, capsys) -> dict:
    """simulate's tokens/s for `args` with `flag` set to each of `values`."""
    from simpar.cli.parser import main

    out = {}
    for value in values:
        args[args.index(flag) + 1] = value
        assert main(args) == 0
        out[value] = json.loads(capsys.readouterr().out)["tokens_per_s"]
    return out


def test_nemo_2407_runs_are_priced_with_the_attention_kernel_their_launcher_chose(
        benchmark, tmp_path, capsys):
    """NeMo-Framework-Launcher 24.07 set NVTE_FUSED_ATTN=0, so Transformer Engine ran flash-attn 2
    in the NeMo 24.07 table's runs: each is priced with `--attention fa2`, which on an H100 is
    slower than the nemo stack's default (cuDNN's attention)."""
    module = benchmark("stack_accuracy")
    points = yaml.safe_load(STACKS.read_text())["points"]
    nemo2407 = [p for p in points if p["id"].startswith("nemo2407")]
    assert len(nemo2407) == 12
    assert all(p["strategy"]["attention"] == "fa2" and "NVTE_FUSED_ATTN" in p["attention_source"]
               for p in nemo2407)
    pt = next(p for p in nemo2407 if p["id"] == "nemo2407_llama3_8b_8h100_fp8")
    args = module.flags(pt, module._model_file(pt, tmp_path), "analytic")
    assert args[args.index("--attention") + 1] == "fa2"
    tokens = _tokens_per_s(args, "--attention", ("fa2", "best"), capsys)
    assert tokens["fa2"] < 0.99 * tokens["best"]


def test_stack_defaults_leave_out_what_the_sources_code_ran_otherwise(benchmark, tmp_path):
    """--stack-defaults prices a run as a user who gives only --stack: no --loss, --optimizer,
    --norm, --attention or --grad-reduce from the source's code, the strategy unchanged."""
    module = benchmark("stack_accuracy")
    points = yaml.safe_load(STACKS.read_text())["points"]
    pt = next(p for p in points if p["id"] == "nemo2407_llama2_70b_64h100_fp8")
    model = module._model_file(pt, tmp_path)
    full, plain = (module.flags(pt, model, "analytic", d) for d in (False, True))
    said = {"--loss", "--attention", "--fp8-scaling"}
    assert said <= set(full) and not said & set(plain)
    assert [a for a in full
            if a not in ("--loss", "fp32", "--attention", "fa2", "--fp8-scaling", "delayed")
            ] == plain


def test_nemo_runs_before_megatron_bridge_are_priced_with_delayed_fp8_scaling(
        benchmark, tmp_path, capsys):
    """NeMo 24.07 and 25.02 built Transformer Engine's DelayedScaling recipe; the nemo stack
    describes Megatron-Bridge's fp8_cs (current scaling). Each of those rows says so, with its
    source, and is priced faster than it would be with current scaling (no amax pass)."""
    module = benchmark("stack_accuracy")
    points = yaml.safe_load(STACKS.read_text())["points"]
    old = [p for p in points if p["id"].startswith(("nemo2407", "nemo2502"))]
    assert len(old) == 19
    assert all(p["strategy"]["fp8_scaling"] == "delayed" and "DelayedScaling" in
               p["fp8_scaling_source"] for p in old)
    assert not any(p["strategy"].get("fp8_scaling") for p in points
                   if p["id"].startswith("nemo_mbridge"))
    pt = next(p for p in old if p["id"] == "nemo2502_llama3_8b_8b200_fp8")
    args = module.flags(pt, module._model_file(pt, tmp_path), "analytic")
    tokens = _tokens_per_s(args, "--fp8-scaling", ("delayed", "current"), capsys)
    assert tokens["current"] < 0.99 * tokens["delayed"]


def test_moe_rows_name_their_model_and_expert_parallelism(benchmark, tmp_path):
    """An MoE row names simpar's built-in model (DeepSeek-V3) or gives its expert fields (Qwen3),
    passes its expert-parallel degree, and is summarised under the MoE architecture."""
    module = benchmark("stack_accuracy")
    points = yaml.safe_load(STACKS.read_text())["points"]
    moe = [p for p in points if "_moe_" in p["id"]]
    # 25.11: 11 runs; 26.06: 13 (its DeepSeek-V3, Qwen3-30B-A3B, Qwen3-235B-A22B, gpt-oss rows);
    # 26.04.01: gpt-oss's 5 BF16 rows
    assert len(moe) == 29 and {module._architecture(p) for p in moe} == {"MoE"}
    assert module._architecture(points[0]) == "dense"
    ds = next(p for p in moe if "deepseekv3_256gb300_bf16" in p["id"])
    args = module.flags(ds, module._model_file(ds, tmp_path), "analytic")
    assert args[args.index("--model") + 1] == "deepseek-v3" and args[args.index("--ep") + 1] == "32"
    # sized by simpar's own count of the built-in model where the row states none
    assert module._size({"model": {"builtin": "deepseek-v3"}}) == ">100B"
    # a recipe's recompute modules, dispatcher and overlap reach simulate as their flags
    oss = next(p for p in moe if p["id"] == "nemo_mbridge260401_moe_gpt_oss_120b_64gb200_bf16")
    args = module.flags(oss, module._model_file(oss, tmp_path), "analytic")
    assert args[args.index("--recompute") + 1] == "selective"
    assert args[args.index("--recompute-modules") + 1] == "layernorm,moe_act"
    assert args[args.index("--moe-dispatch") + 1] == "alltoall" and "--overlap-ep-comm" in args
    qwen = next(p for p in moe if "qwen3_30b" in p["id"])
    spec = yaml.safe_load(Path(module._model_file(qwen, tmp_path)).read_text())
    assert (spec["experts"], spec["experts_per_token"], spec["head_dim"]) == (128, 8, 128)


def test_megatron_2022_rows_run_gpt_dropout_on_megatron_lm_of_2022(benchmark, tmp_path, capsys):
    """Korthikanti et al. 2022 ran Megatron-LM's GPT of that year: dropout 0.1, biases and tied
    embeddings (its defaults) on the megatron-2022 stack (no fused attention kernel,
    tensor-parallel collectives waited for), which prices the run slower than today's Megatron-LM
    (--stack megatron@2023: fused attention); the dropout masks make the step slower than the same
    model without them. Named without a version on these A100s, megatron prices the 2021 code."""
    from simpar.cli.parser import main

    module = benchmark("stack_accuracy")
    points = yaml.safe_load(STACKS.read_text())["points"]
    rows = [p for p in points if p["id"].startswith("megatron_korthikanti2022")]
    assert len(rows) == 8 and {p["stack"] for p in rows} == {"megatron-2022"}
    pt = next(p for p in rows if p["id"] == "megatron_korthikanti2022_22b_8a100_full")
    model = module._model_file(pt, tmp_path)
    spec = yaml.safe_load(Path(model).read_text())
    assert spec["dropout"] is True and spec["bias"] is True and spec["position_embeddings"] == 2048
    assert spec["tied_embeddings"] is True
    args = module.flags(pt, model, "analytic")
    plain = module.flags(pt, model, "analytic", plain_names=True)
    assert plain[plain.index("--stack") + 1] == "megatron"
    assert "--attention" not in args and "--no-overlap-tp-comm" not in args
    steps = {}
    for dropout in (True, False):
        Path(model).write_text(yaml.safe_dump({**spec, "dropout": dropout}))
        assert main(args) == 0
        steps[dropout] = json.loads(capsys.readouterr().out)["step_time_s"]
    assert steps[True] > 1.02 * steps[False]
    assert main(plain) == 0
    assert json.loads(capsys.readouterr().out)["strategy"]["stack"] == "megatron-2021"
    args[args.index("--stack") + 1] = "megatron@2023"
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] < 0.95 * steps[True]


def test_the_files_header_counts_its_priced_points():
    """stacks.yaml says how many points carry a measured tokens/s, and how many each stack has:
    the counts a reader quotes, kept to the points below them."""
    from collections import Counter

    data = yaml.safe_load(STACKS.read_text())
    priced = [p for p in data["points"] if p["measured"].get("tokens_per_s_per_gpu")]
    assert data["num_points"] == len(priced)
    assert data["points_per_stack"] == dict(Counter(p["stack"] for p in priced))


def test_runs_group_by_job_size_in_ranges_that_sort_by_size(benchmark):
    """The benchmark's GPUs table puts each run in a range of job sizes, and the ranges print
    from the smallest jobs to the largest, so that a bias growing with scale reads as a trend."""
    module = benchmark("stack_accuracy")
    rows = [{"gpus": n, "error": 0.0} for n in (1, 8, 9, 64, 512, 3072, 65, 2)]
    labels = [module._job_size(r) for r in rows]
    assert labels == ["   1", "   2-8", "   9-64", "   9-64", " 257-1024", "1025+", "  65-256",
                      "   2-8"]
    groups = [g for g, *_ in module.summary(rows, module._job_size)]
    assert groups == ["   1", "   2-8", "   9-64", "  65-256", " 257-1024", "1025+"]


def test_torchtitan_a100_rows_run_on_the_aws_instances_their_launcher_targets(
        benchmark, tmp_path, capsys):
    """torchtitan's 64-A100 rows name no cluster; the repository's launcher at the commits adding
    them targets AWS EFA, so they are priced on p4de instances: 400 Gb/s per 8 GPUs, an eighth of
    a DGX A100's 8 x 200 Gb/s per GPU, which slows their FSDP collectives."""
    module = benchmark("stack_accuracy")
    points = yaml.safe_load(STACKS.read_text())["points"]
    rows = [p for p in points if p["id"].startswith("tt_a100")]
    assert len(rows) == 8 and all(p["cluster"] == "aws-p4de" and "EFA" in p["cluster_source"]
                                  for p in rows)
    pt = next(p for p in rows if p["id"] == "tt_a100_llama2_70b_full_ac")
    args = module.flags(pt, module._model_file(pt, tmp_path), "analytic")
    tokens = _tokens_per_s(args, "--cluster", ("aws-p4de", "dgx-a100"), capsys)
    assert tokens["aws-p4de"] < 0.97 * tokens["dgx-a100"]
