#!/usr/bin/env bash
# Regenerates reports/cpu-partial-recompute.txt: the small model of reports/cpu-validation/, planned
# against that sweep's calibrated profile with no recompute, 2 of its 4 layers recomputed
# (--recompute-layers 2) and full recompute, each run twice with 2 processes (gloo on CPU) and
# validated (about 2 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
out=reports/cpu-partial-recompute.txt
{
  echo "# $(uname -m), $(nproc) cores, torch $(python -c 'import torch; print(torch.__version__)'), $(date -u +%F)"
  printf '%-6s %-4s %12s %12s %8s\n' variant run predicted_s measured_s error
} > "$work/report.txt"
for variant in "none:" "half:--recompute full --recompute-layers 2" "full:--recompute full"; do
  name=${variant%%:*}
  simpar plan --model reports/cpu-validation/model.yaml --cluster reports/cpu-validation/profile.yaml \
    --gpus 2 --seq-len 256 --global-batch 8 --dtype fp32 ${variant#*:} --force \
    --out "$work/plan-$name.json" > /dev/null
  for run in 1 2; do
    OMP_NUM_THREADS=1 execpar launch "$work/plan-$name.json" --nproc-per-node 2 --steps 8 \
      --device cpu --out "$work/measured-$name-$run.json" > /dev/null 2>&1
    simpar validate "$work/plan-$name.json" "$work/measured-$name-$run.json" --json \
      | python -c "import json, sys
f = next(f for f in json.load(sys.stdin)['figures'] if f['figure'] == 'step time (s)')
print(f\"%-6s %-4s %12.4f %12.4f %+7.1f%%\" % ('$name', '$run', f['predicted'], f['measured'], 100 * f['error']))" \
      >> "$work/report.txt"
  done
done
mv "$work/report.txt" "$out"
cat "$out"
