#!/usr/bin/env bash
# Rack-scale example: Llama-3.1 405B and DeepSeek-V3 on 1,152 GPUs, as 16 GB200 NVL72 racks against 144
# DGX H100 nodes: the best strategy of each, step time, time and cost for a token budget
# (reports/racks-gb200-vs-h100/). Prices per GPU-hour are inputs, not predictions: $2.50 for an H100 (the
# capacity example's), $5.00 for a GB200 (about twice, as rented in 2025-26); change them to yours.
set -euo pipefail
cd "$(dirname "$0")/.."
out=reports/racks-gb200-vs-h100
mkdir -p "$out"
: > "$out/compare.txt"
for model in "llama3.1-405b --seq-len 8192 --global-batch 2304 --tokens 15T" \
             "deepseek-v3 --seq-len 4096 --global-batch 4608 --dtype fp8 --tokens 15T"; do
  for cluster in "gb200-nvl72 --price-per-gpu-hour 5.0" "dgx-h100 --price-per-gpu-hour 2.5"; do
    # shellcheck disable=SC2086  # the strings hold flags
    args=(--model $model --cluster $cluster --gpus 1152 --top 3)
    echo "\$ simpar compare ${args[*]}" >> "$out/compare.txt"
    simpar compare "${args[@]}" >> "$out/compare.txt"
    echo >> "$out/compare.txt"
  done
done
cat "$out/compare.txt"
