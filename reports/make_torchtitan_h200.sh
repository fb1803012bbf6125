#!/usr/bin/env bash
# torchtitan 0.2.2's own trainer on one H200 (torch 2.11.0+cu130), eager and compiled, measured
# on the device machine with
#   python3 benchmarks/torchtitan_single_gpu.py --out /tmp/tt [--configs ID...]
# (its per-run JSON and console logs are in reports/torchtitan-h200), predicted again with the
# model at hand: writes reports/torchtitan-h200/report.md and report.json (no GPU or torch).
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmarks/torchtitan_report.py reports/torchtitan-h200
