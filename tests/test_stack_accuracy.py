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
