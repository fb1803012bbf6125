"""Launch files for a plan: a torchrun line per node, a Slurm batch script and a
Kubeflow PyTorchJob.

They are what an operator submits after filling in the container image and paths (marked
CHANGE_ME)."""

from __future__ import annotations

import math
import os
import shlex
from pathlib import Path

import yaml

from simpar.files import write_text

EMITTERS = ("torchrun", "slurm", "k8s")


def _shape(plan) -> tuple[int, int]:
    per_node = min(plan.cluster.gpus_per_node, plan.strategy.gpus)
    return math.ceil(plan.strategy.gpus / per_node), per_node


def torchrun_lines(plan, plan_path: str) -> str:
    nodes, per = _shape(plan)
    lines = [
        "#!/usr/bin/env bash",
        f"# {plan.model.name}: {plan.strategy.gpus} GPUs as {nodes} nodes x {per}; run line i on "
        "node i.", "# Set HEAD to the address of node 0.", "HEAD=${HEAD:-CHANGE_ME_HEAD_NODE}"
    ]
    for node in range(nodes):
        cmd = [
            "torchrun", f"--nnodes={nodes}", f"--nproc-per-node={per}", f"--node-rank={node}",
            "--rdzv-backend=c10d", "--rdzv-endpoint=$HEAD:29500", "--rdzv-id=simpar", "-m",
            "execpar.cli", "run", plan_path, "--checkpoint-dir", "/checkpoints",
            "--checkpoint-every", "500"
        ]
        lines.append(f"# node {node}\n" + " ".join(c if "$" in c else shlex.quote(c) for c in cmd))
    return "\n".join(lines) + "\n"


def slurm_script(plan, plan_path: str) -> str:
    nodes, per = _shape(plan)
    return f"""#!/bin/bash
#SBATCH --job-name=simpar-{plan.model.name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={per}
#SBATCH --exclusive
#SBATCH --time=72:00:00
#SBATCH --requeue
# {plan.model.name} with dp{plan.strategy.dp} tp{plan.strategy.tp} pp{plan.strategy.pp}:
# one torchrun per node.
set -euo pipefail
HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export OMP_NUM_THREADS=1
srun --kill-on-bad-exit=1 torchrun \\
  --nnodes="$SLURM_JOB_NUM_NODES" --nproc-per-node={per} \\
  --rdzv-backend=c10d --rdzv-endpoint="$HEAD:29500" --rdzv-id="$SLURM_JOB_ID" --max-restarts=3 \\
  -m execpar.cli run {shlex.quote(plan_path)} \\
  --checkpoint-dir "${{CKPT_DIR:-/checkpoints}}" --checkpoint-every 500
"""


def pytorchjob(plan, plan_path: str) -> dict:
    nodes, per = _shape(plan)

    def replica(count: int) -> dict:
        return {
            "replicas": count, "restartPolicy": "OnFailure", "template": {
                "spec": {
                    "containers": [{
                        "name": "pytorch", "image": "CHANGE_ME/execpar:latest", "command": [
                            "python", "-m", "execpar.cli", "run", plan_path, "--checkpoint-dir",
                            "/checkpoints", "--checkpoint-every", "500"
                        ], "resources": {"limits": {"nvidia.com/gpu": per}},
                        "volumeMounts": [{"name": "checkpoints", "mountPath": "/checkpoints"},
                                         {"name": "dshm", "mountPath": "/dev/shm"}]
                    }], "volumes": [{
                        "name": "checkpoints",
                        "persistentVolumeClaim": {"claimName": "CHANGE_ME-checkpoints"}
                    }, {"name": "dshm", "emptyDir": {"medium": "Memory"}}]
                }
            }
        }

    specs = {"Master": replica(1)}
    if nodes > 1:
        specs["Worker"] = replica(nodes - 1)
    return {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": f"simpar-{plan.model.name}".replace(".", "-").lower()}, "spec": {
            "runPolicy": {"backoffLimit": 3}, "elasticPolicy": {
                "rdzvBackend": "c10d", "minReplicas": nodes, "maxReplicas": nodes,
                "nProcPerNode": per, "maxRestarts": 3
            }, "nprocPerNode": str(per), "pytorchReplicaSpecs": specs
        }
    }


def emit(plan, plan_path: str, kinds: list[str], out_dir: str) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for kind in kinds:
        if kind == "torchrun":
            path, text = Path(out_dir) / "torchrun.sh", torchrun_lines(plan, plan_path)
        elif kind == "slurm":
            path, text = Path(out_dir) / "job.slurm", slurm_script(plan, plan_path)
        else:
            path, text = (
                Path(out_dir) / "pytorchjob.yaml",
                yaml.safe_dump(pytorchjob(plan, plan_path), sort_keys=False),
            )
        write_text(str(path), text)
        written.append(str(path))
    return written
