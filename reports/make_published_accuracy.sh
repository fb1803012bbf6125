#!/usr/bin/env bash
# Regenerates reports/published_accuracy.txt (the calibration set) and reports/pytorch_native_accuracy.txt
# (held-out torchtitan runs).
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmarks/published_accuracy.py > reports/published_accuracy.txt.tmp
mv reports/published_accuracy.txt.tmp reports/published_accuracy.txt
python benchmarks/pytorch_native_accuracy.py > reports/pytorch_native_accuracy.txt.tmp
mv reports/pytorch_native_accuracy.txt.tmp reports/pytorch_native_accuracy.txt
