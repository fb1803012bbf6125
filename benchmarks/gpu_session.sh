#!/usr/bin/env bash
# Everything a session with one lent GPU measures for simpar, in one command on the device machine
# (its image has torch but neither simpy nor torchtitan: carry their wheels, see below). Writes
# into OUT (default ./gpu-out): gpu.txt (nvidia-smi), log.txt, gemm_soak.json, gv.tgz (issue
# 12's six execpar runs with their plans, and a calibrated profile per model:
# benchmarks/gpu_validation.py measure) and tt.tgz (torchtitan's own trainer on the same models:
# benchmarks/torchtitan_single_gpu.py). Then, here:
#   tar xzf gv.tgz -C /tmp && cp /tmp/gv/* reports/gpu-validation-<gpu>/ && \
#   cp gemm_soak.json reports/gpu-gemm-soak/ && bash reports/make_gpu_validation.sh
#   tar xzf tt.tgz -C /tmp && cp /tmp/tt/tt-*.json /tmp/tt/tt-*.log reports/torchtitan-<gpu>/ && \
#   python benchmarks/torchtitan_report.py reports/torchtitan-<gpu>
# Before the call, on this machine:
#   echo /.whl/ >> .git/info/exclude
#   pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl simpy==4.1.2
# (and torchtitan's wheels: benchmarks/torchtitan_single_gpu.py says which), and name .whl in
# the call's carry. GROUPED_S (e.g. 150) first times MoE expert GEMMs grouped and looped
# (benchmarks/grouped_gemm.py, into grouped_gemm.json); CALIBRATE=0 skips the calibrations,
# SOAK_S=0 the soak. RUNS=0 calibrates without re-running the six plans (their measurements are
# in reports/ already); SET=heldout runs the seven held-out shapes instead of the six (the
# calibrations are the same); each part runs under its own limit (MEASURE_S, SOAK_S, HOST_S, TORCHTITAN_S; the host-bound
# runs (benchmarks/host_bound.py, about 2 minutes, into hb.tgz) only when HOST_S is set, e.g.
# 150, the torchtitan part only when TORCHTITAN_S is, e.g. 400). Timings of 2026-11-26: the runs
# and calibrations 4.6 minutes on an H100 (the calibrations alone about 1.5 on an H200), the soak
# in three modes about 1, torchtitan's eight runs about 3.5 on an H200.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-out}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 3
    export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv \
    > "$out/gpu.txt" 2>&1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())" \
    >> "$out/gpu.txt" 2>&1
if [ "${GROUPED_S:-0}" != 0 ]; then
    # MoE expert FFNs as one grouped GEMM and as a loop over experts (grouped_gemm.json)
    timeout "$GROUPED_S" python3 benchmarks/grouped_gemm.py measure --out "$out" \
        > "$out/grouped.txt" 2>&1
    echo "grouped exit $?" >> "$out/grouped.txt"
fi
runs=()
[ "${RUNS:-1}" = 0 ] && runs=(--no-runs)
calibrate=()
[ "${CALIBRATE:-1}" = 0 ] && calibrate=(--calibrate)
timeout "${MEASURE_S:-330}" python3 benchmarks/gpu_validation.py measure --out /tmp/gv --steps 15 \
    --set "${SET:-six}" "${runs[@]}" "${calibrate[@]}" > "$out/log.txt" 2>&1
echo "measure exit $?" >> "$out/log.txt"
tar czf "$out/gv.tgz" -C /tmp gv
if [ "${SOAK_S:-120}" != 0 ]; then
    timeout "${SOAK_S:-120}" python3 benchmarks/gemm_soak.py --out "$out" \
        --seconds "${SOAK_SECONDS:-6}" --modes gemm mixed eager >> "$out/log.txt" 2>&1
    echo "soak exit $?" >> "$out/log.txt"
fi
if [ "${HOST_S:-0}" != 0 ]; then
    # the host's time per eager kernel and per recomputed one (EAGER_LAUNCH_US, CHECKPOINT_HOOK_US)
    timeout "$HOST_S" python3 benchmarks/host_bound.py measure --out /tmp/hb >> "$out/log.txt" 2>&1
    echo "host exit $?" >> "$out/log.txt"
    tar czf "$out/hb.tgz" -C /tmp hb
fi
if [ "${TORCHTITAN_S:-0}" != 0 ]; then
    # the eager runs and, unless TT_CONFIGS names others, the same compiled
    read -r -a configs <<< "${TT_CONFIGS:-tt-1b-s2k-mb8 tt-1b-s4k-mb4-sel tt-3b-s8k-mb1-full \
tt-8b4l-s4k-mb2 tt-1b-s2k-mb8-compile tt-1b-s4k-mb4-sel-compile tt-3b-s8k-mb1-full-compile \
tt-8b4l-s4k-mb2-compile}"
    timeout "$TORCHTITAN_S" python3 benchmarks/torchtitan_single_gpu.py --out /tmp/tt \
        --timeout "${TT_CONFIG_S:-75}" --configs "${configs[@]}" >> "$out/log.txt" 2>&1
    echo "torchtitan exit $?" >> "$out/log.txt"
    rm -rf /tmp/tt/tokenizer-*
    tar czf "$out/tt.tgz" -C /tmp tt
fi
cat "$out/gpu.txt"
grep -E "exit|step .* \(median\)|^tt-" "$out/log.txt"
if [ -f "$out/grouped.txt" ]; then cut -c1-400 "$out/grouped.txt"; fi
