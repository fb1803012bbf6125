#!/usr/bin/env bash
# Accuracy per software stack: 175 published runs (benchmarks/data/stacks.yaml) and the 3 execpar H100 runs,
# each predicted with `simpar simulate --json --stack STACK` and the published strategy (about a minute).
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmarks/stack_accuracy.py > reports/stack_accuracy.txt
python benchmarks/published_accuracy.py > reports/published_accuracy.txt
python benchmarks/heldout_accuracy.py > reports/heldout_accuracy.txt
tail -20 reports/stack_accuracy.txt
