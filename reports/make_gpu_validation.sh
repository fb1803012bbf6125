#!/usr/bin/env bash
# Issue 12's GPU check: six single-GPU execpar runs on an H100 80GB HBM3 and on an H200 (torch
# 2.11.0+cu130), measured on the device machine with
#   python benchmarks/gpu_validation.py measure --out /tmp/gv --steps 15 [--calibrate MODEL...]
# (the measurements, plans and calibrated profiles are in reports/gpu-validation-*). This
# predicts each run again with the model at hand and writes each folder's report.md and
# report.json (no GPU or torch needed; about a minute).
set -euo pipefail
cd "$(dirname "$0")/.."
for gpu in h100 h200; do
    python benchmarks/gpu_validation.py report "reports/gpu-validation-$gpu" > /dev/null
    head -14 "reports/gpu-validation-$gpu/report.md"
done
