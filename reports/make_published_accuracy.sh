#!/usr/bin/env bash
# Regenerates reports/published_accuracy.txt: simpar's predictions against the published calibration set.
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmarks/published_accuracy.py > reports/published_accuracy.txt.tmp
mv reports/published_accuracy.txt.tmp reports/published_accuracy.txt
