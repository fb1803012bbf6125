"""benchmarks/stack_accuracy.py prices each published run with the strategy its source states."""

import importlib.util
import json
from pathlib import Path

import yaml

PATH = Path(__file__).parents[1] / "benchmarks" / "stack_accuracy.py"


def _module():
    spec = importlib.util.spec_from_file_location("stack_accuracy", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hybrid_sharded_runs_are_priced_with_fsdp_inside_a_node(tmp_path, capsys):
    """fms-fsdp's 7B rows ran HSDP (its README's table says so): shard inside an 8-GPU node,
    replicate across nodes, which `--dp-shard 8` prices; before, they were priced as FSDP over
    all 96-128 GPUs."""
    from simpar.cli.parser import main

    module = _module()
    points = yaml.safe_load((PATH.parent / "data" / "stacks.yaml").read_text())["points"]
    hybrid = [p for p in points if p["strategy"].get("fsdp_sharding") == "HSDP"]
    assert len(hybrid) == 4
    for pt in hybrid:
        args = module.flags(pt, module._model_file(pt, tmp_path), "analytic")
        assert args[args.index("--dp-shard") + 1] == "8"
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["strategy"]["dp_shard"] == 8
