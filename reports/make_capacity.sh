#!/usr/bin/env bash
# The README's worked example: Llama-3 70B on 15T tokens on 1,024 / 2,048 / 4,096 H100s (dgx-h100 fabric),
# ranked by cost at $2.50 per GPU-hour, with the Pareto plot (reports/capacity-llama3-70b/).
set -euo pipefail
cd "$(dirname "$0")/.."
out=reports/capacity-llama3-70b
mkdir -p "$out"
args=(--model llama3-70b --cluster dgx-h100 --gpus 1024,2048,4096 --seq-len 8192 --global-batch 2048
      --tokens 15T --price-per-gpu-hour 2.5 --objective cost)
simpar compare "${args[@]}" --pareto "$out/pareto.png" > "$out/compare.txt"
simpar compare "${args[@]}" --json > "$out/compare.json"
cat "$out/compare.txt"
