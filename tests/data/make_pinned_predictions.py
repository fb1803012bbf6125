"""Write tests/data/pinned_predictions.json: `simpar simulate --json` and `simpar
compare --json` outputs for a handful of strategies across schedules, stacks, ZeRO
stages, context and expert parallelism, fp8 and clusters. tests/test_pinned.py holds the
code to them, so a refactor that changes a number fails.

Run it again (python tests/data/make_pinned_predictions.py) only when a change of the
model is meant, and say in the commit which numbers moved and why."""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

CASES = {  # name: simpar arguments
    "70b_3d_interleaved": (
        "simulate --model llama3-70b --gpu h100-sxm --gpus 64 --seq-len 4096 --global-batch 64 "
        "--tp 4 --pp 4 --schedule interleaved --vpp 2"
    ).split(),
    "8b_torchtitan_fsdp_compile": (
        "simulate --model llama3-8b --gpu h100-sxm --gpus 8 --seq-len 8192 --global-batch 16 "
        "--stack torchtitan --compile --zero 3"
    ).split(),
    "8b_cp4_event": (
        "simulate --model llama3-8b --gpu h100-sxm --gpus 32 --seq-len 32768 --global-batch 8 "
        "--cp 4 --stack torchtitan --zero 3 --engine event"
    ).split(),
    "mixtral_ep8": (
        "simulate --model mixtral-8x7b --gpu h100-sxm --gpus 64 --seq-len 4096 --global-batch 256 "
        "--ep 8 --tp 2 --pp 2 --zero 1"
    ).split(),
    "gpt3_zbv_a100": (
        "simulate --model gpt3-175b --gpu a100-80gb --gpus 512 --seq-len 2048 --global-batch 512 "
        "--tp 8 --pp 8 --schedule zbv --engine event --stack megatron@2023"
    ).split(),
    "70b_fp8_nemo": (
        "simulate --model llama3-70b --gpu h100-sxm --gpus 128 --seq-len 8192 --global-batch 128 "
        "--dtype fp8 --stack nemo --tp 4 --pp 4 --cp 2 --schedule interleaved --vpp 5 --recompute "
        "selective"
    ).split(),
    "deepseek_gb200": (
        "simulate --model deepseek-v3 --cluster gb200-nvl72 --gpus 256 --seq-len 4096 "
        "--global-batch 1024 --ep 64 --pp 4 --dtype fp8 --schedule dualpipev"
    ).split(),
    "7b_deepspeed06_zero2_a100": (
        "simulate --model llama2-7b --gpu a100-80gb --gpus 16 --seq-len 2048 --global-batch 64 "
        "--stack deepspeed-0.6 --zero 2 --recompute full"
    ).split(),
    "8b_torchtitan_tp8_sp": (
        "simulate --model llama3-8b --gpu h100-sxm --gpus 64 --seq-len 8192 --global-batch 96 "
        "--stack torchtitan --compile --tp 8 --sp --zero 3 --micro-batch 12 --recompute op"
    ).split(),
    "compare_70b_256": (
        "compare --model llama3-70b --gpu h100-sxm --gpus 256 --seq-len 4096 --global-batch 256 "
        "--top 5"
    ).split(),
}
# timings of simpar itself, not predictions
VOLATILE = ("events_per_s", "priced_per_s", "elapsed_s", "seconds", "rerank_seconds")


def run_case(args: list[str]) -> dict:
    from simpar.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main([*args, "--json"])
    if code != 0:
        raise SystemExit(f"simpar {' '.join(args)} exited {code}")
    return strip(json.loads(out.getvalue()))


def strip(doc):
    """The document without keys that time simpar itself."""
    if isinstance(doc, dict):
        return {k: strip(v) for k, v in doc.items() if k not in VOLATILE}
    if isinstance(doc, list):
        return [strip(v) for v in doc]
    return doc


def main() -> None:
    target = Path(__file__).with_name("pinned_predictions.json")
    pinned = {name: {"args": args, "output": run_case(args)} for name, args in CASES.items()}
    tmp = target.with_suffix(".tmp")
    tmp.write_text(json.dumps(pinned, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, target)
    print(f"wrote {target} ({len(pinned)} cases)", file=sys.stderr)


if __name__ == "__main__":
    main()
