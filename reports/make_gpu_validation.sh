#!/usr/bin/env bash
# Issue 12's GPU check: six single-GPU execpar runs on an H100 80GB HBM3 and on an H200 (torch
# 2.11.0+cu130), measured on the device machine with
#   python benchmarks/gpu_validation.py measure --out /tmp/gv --steps 15 [--calibrate MODEL...]
# (the measurements, plans and calibrated profiles are in reports/gpu-validation-*). This
# predicts each run again with the model at hand and writes each folder's report.md and
# report.json (no GPU or torch needed; about a minute).
# On 2026-11-26 a second H200 (gpu.txt in each folder) ran seven held-out shapes, chosen before
# they ran (`measure --set heldout --calibrate`, no calibration: the folder's profiles are the
# first H200's), and the six again (gpu-validation-h200-rerun: the same plans on another
# machine, for the run-to-run spread).
# Later that day a third H200 (torchao 0.17.0 carried in) ran fp8 as execpar runs it, torchao's
# tensorwise Float8Linear, eager and compiled, beside bf16 twins (`--set fp8`:
# gpu-validation-h200-fp8), and then, after torchao's casts were priced from those,
# five fp8 shapes chosen before they ran (`--set fp8-heldout`); benchmarks/fp8_cast.py's
# micro-benchmark of the casts ran in each call (fp8_cast.json in each folder).
# On 2026-11-27 an H200 ran mixture-of-experts slices as execpar runs them (torch's grouped GEMM,
# the experts' 16-bit copies made once a step): `--set moe`, chosen before they ran
# (gpu-validation-h200-moe; `GROUPED_S=120 CALIBRATE=0 SOAK_S=0 SET=moe bash
# benchmarks/gpu_session.sh`), and, in the same call, benchmarks/grouped_gemm.py's expert GEMMs
# grouped and looped (grouped-gemm-h200, its report.md written below); then
# `python3 benchmarks/moe_layer_profile.py --model benchmarks/data/h100_execpar/M.yaml --tokens 8192
# --out reports/moe-layer-h200/M` profiled one MoE layer of each model op by op. Last, three MoE
# shapes the moe set lacks, chosen after its runs were priced and before they ran (`SET=moe-heldout`:
# gpu-validation-h200-moe-heldout).
set -euo pipefail
cd "$(dirname "$0")/.."
for gpu in h100 h200 h200-rerun h200-heldout h200-fp8 h200-fp8-heldout h200-moe \
    h200-moe-heldout; do
    python benchmarks/gpu_validation.py report "reports/gpu-validation-$gpu" > /dev/null
    # the step-time table and its summary lines
    sed -n "1,/^Peak memory/p" "reports/gpu-validation-$gpu/report.md" | sed '$d'
done
python benchmarks/grouped_gemm.py report reports/grouped-gemm-h200/grouped_gemm.json \
    > reports/grouped-gemm-h200/report.md
cat reports/grouped-gemm-h200/report.md
