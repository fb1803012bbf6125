#!/usr/bin/env bash
# Regenerates reports/published_accuracy.txt (the calibration set) and reports/heldout_accuracy.txt
# (held-out runs: torchtitan, DeepSeek-V3).
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmarks/published_accuracy.py > reports/published_accuracy.txt.tmp
mv reports/published_accuracy.txt.tmp reports/published_accuracy.txt
python benchmarks/heldout_accuracy.py > reports/heldout_accuracy.txt.tmp
mv reports/heldout_accuracy.txt.tmp reports/heldout_accuracy.txt
