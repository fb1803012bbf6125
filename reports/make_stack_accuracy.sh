#!/usr/bin/env bash
# Accuracy per software stack: the published runs of benchmarks/data/stacks.yaml, the 3 execpar H100 runs and
# torchtitan 0.2.2's 8 H200 runs (reports/torchtitan-h200),
# each predicted with `simpar simulate --json --stack STACK` and the published strategy (about a minute).
set -euo pipefail
cd "$(dirname "$0")/.."
python benchmarks/stack_accuracy.py > reports/stack_accuracy.txt
# the bands simulate quotes: each stack priced as a user who gives only --stack would price it
python benchmarks/stack_accuracy.py --stack-defaults --bands simpar/report/accuracy_bands.json \
  > reports/stack_accuracy_stack_defaults.txt
# ... and as one who names only the project (megatron, not megatron-2021): its GPU picks the era
python benchmarks/stack_accuracy.py --stack-defaults --plain-names \
  > reports/stack_accuracy_plain_names.txt
python benchmarks/published_accuracy.py > reports/published_accuracy.txt
python benchmarks/heldout_accuracy.py > reports/heldout_accuracy.txt
tail -20 reports/stack_accuracy.txt
