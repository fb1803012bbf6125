"""A number field of a cluster or GPU file that holds something else is refused in one line naming
the field and the value, exit 2, no traceback (a range check on a string used to raise
TypeError, and a GPU's tdp_w took any string)."""

import dataclasses

import pytest
import yaml

from simpar.cli import main
from simpar.specs.cluster import builtin_clusters
from simpar.specs.gpu import GPUS

SIMULATE = ["--model", "llama3-8b", "--gpus", "16", "--seq-len", "4096", "--global-batch", "64"]


def _refused(capsys, argv, field: str, says: str) -> None:
    assert main(["simulate", *argv, *SIMULATE]) == 2
    err = capsys.readouterr().err
    assert field in err and says in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("field,value,says", [
    ("net_post_us", -1, "must be a number >= 0"),
    ("net_post_us", "fast", "must be a number"),
    ("net_post_us", True, "must be a number"),
    ("straggler_delay_frac", "x", "must be a number"),
    ("straggler_delay_frac", -0.5, "give a value >= 0"),
    ("intra_node_efficiency", "x", "must be a number"),
    ("intra_node_efficiency", 1.5, "give a value in (0, 1]"),
    ("gpus_per_node", "x", "must be a number"),
])
def test_a_bad_number_in_a_cluster_file(tmp_path, capsys, field, value, says):
    lines = builtin_clusters()["dgx-a100"].read_text().splitlines()
    lines = [line for line in lines if not line.startswith(f"{field}:")] + [f"{field}: {value}"]
    path = tmp_path / "bad.yaml"
    path.write_text("\n".join(lines) + "\n")
    _refused(capsys, ["--cluster", str(path)], f"cluster.{field}", says)


@pytest.mark.parametrize("field,value", [
    ("gemm_efficiency", "high"), ("tdp_w", "x"), ("flops_per_exp", "x"),
    ("burst_gemm_efficiency", "x"), ("sm_count", "x"), ("fp8_tflops", True),
])
def test_a_non_number_in_a_gpu_file(tmp_path, capsys, field, value):
    cluster = yaml.safe_load(builtin_clusters()["dgx-h100"].read_text())
    gpu = dataclasses.asdict(GPUS["h100-sxm"])
    gpu["gemm_table"] = [list(row) for row in gpu["gemm_table"]]
    cluster["gpu"] = {**gpu, field: value}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cluster))
    _refused(capsys, ["--cluster", str(path)], f"gpu.{field}", "must be a number")


@pytest.mark.parametrize("field,value,says", [
    ("tiers", 4, "give 2 (leaves and spines) or 3"),
    ("tiers", "x", "give 2 (leaves and spines) or 3"),
    ("rail_optimized", 3, "give true or false"),
    ("nics_per_node", "x", "give a whole number of NICs per node"),
    ("leaf_radix", "x", "give a whole number from 2"),
])
def test_a_bad_fat_tree_parameter(tmp_path, capsys, field, value, says):
    cluster = yaml.safe_load(builtin_clusters()["dgx-a100"].read_text())
    cluster["topology"][field] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cluster))
    _refused(capsys, ["--cluster", str(path)], f"topology.{field}", says)
