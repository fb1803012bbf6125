#!/usr/bin/env bash
# Regenerates the scaling plots and CSVs of Llama-3 70B and Llama 3.1 405B on dgx-h100 (reports/scaling-*).
set -euo pipefail
cd "$(dirname "$0")/.."
simpar scale --model llama3-70b --cluster dgx-h100 --gpu-list 256,512,1024,2048,4096 --seq-len 8192 \
  --global-batch 2048 --strong --out reports/scaling-llama3-70b
simpar scale --model llama3.1-405b --cluster dgx-h100 --gpu-list 2048,4096,8192,16384 --seq-len 8192 \
  --global-batch 2048 --strong --out reports/scaling-llama3.1-405b
