#!/usr/bin/env bash
# Regenerates reports/cpu-validation/: calibrate this machine, then plan, run and validate six strategies
# of a small model with 2 processes (gloo on CPU). The report says on what it was measured.
set -euo pipefail
cd "$(dirname "$0")/.."
simpar validate --sweep --size small --steps 8 --nproc-per-node 2 --out reports/cpu-validation
rm -f reports/cpu-validation/measured-*.json.tmp
