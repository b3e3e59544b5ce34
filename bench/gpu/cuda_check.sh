#!/usr/bin/env bash
# The CUDA check on an NVIDIA GPU machine (its limits: /work/shared/gpu/README.md; docs/gpu-check.md). From the
# repository root, with $OUT the folder that comes back:
#   OUT=/some/dir bash bench/gpu/cuda_check.sh            # every step; STEPS="smoke bench" reruns only those
# Steps, each under `timeout -s INT` (pytest and the bench print their summaries when interrupted), in this order:
#   gpu          nvidia-smi: the GPU, driver and memory (decides whether the GPU steps run)
#   install      plugrad and plugrad-cuda from this tree, offline: --no-build-isolation (the image's setuptools),
#                --no-deps, PIP_NO_INDEX=1 (no index is reachable; a missing package fails at once, not after retries)
#   smoke        bench/gpu/cuda_smoke.py: every driver path once, PASS/FAIL with the CUDA error name
#   conformance  the suite's run tier on CUDA, 8 workers, a per-test deadline, --maxfail, the report as JSON
#   bench        bench/gpu/cuda_bench.py: device time by CUDA events next to host time, cuBLAS and Triton in the
#                same process, HBM bandwidth, TinyJit/CUDA-graph replay (output checked), all in bench.json
# The limits add up to 350 s (the device budget is 15 minutes with the machine's start, so a failed first run can
# be fixed and rerun). $OUT gets at most 5 files: summary.txt, logs.tgz (every step's full log, rewritten after each
# step), smoke.json, conformance.json, bench.json; the logs and the compile cache live in a temporary folder.
# Without a GPU (no nvidia-smi, or it lists none) every GPU step says "no GPU" and the script exits 0 in a second;
# a step named in STEPS runs anyway when it needs no GPU (install). PYTHON picks the interpreter (default python3).
# The shared machinery (steps, limits, logs, the no-GPU rule) is bench/gpu/check_lib.sh.
set -uo pipefail
cd "$(dirname "$0")/../.."
ALL="gpu install smoke conformance bench"
source bench/gpu/check_lib.sh
export TRITON_CACHE_DIR="$WORK/triton"
if ! command -v nvidia-smi >/dev/null 2>&1; then GPU_WHY="nvidia-smi not found"
elif ! timeout 15 nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then GPU_WHY="nvidia-smi lists no GPU"; fi
step gpu 15 1 nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total,clocks.max.sm --format=csv
install_step plugins/cuda plugrad plugrad_cuda
step smoke 60 1 "$PY" bench/gpu/cuda_smoke.py --json "$OUT/smoke.json"
TAIL=25 step conformance 120 1 "$PY" -m pytest -q -p no:cacheprovider -p pytest_deadline --deadline 60 -n 8 --maxfail 20 -rfE -o addopts= \
  --pyargs plugrad.testing --plugrad-device=CUDA --plugrad-tiers=run --plugrad-results "$OUT/conformance.json"
TAIL=40 step bench 110 1 "$PY" bench/gpu/cuda_bench.py --budget 100 --cap 45 --json "$OUT/bench.json"
finish
