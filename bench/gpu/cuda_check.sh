#!/usr/bin/env bash
# The CUDA check on an NVIDIA GPU machine (conventions: ../shared/gpu/README.md). Installs the working tree, prints
# the GPU and driver, runs the conformance suite on CUDA with every tier (run included), the repository's CUDA tests
# and the TinyJit/CUDA-graph replay bench next to PyTorch's; every log goes to $OUT (default ./gpu-logs).
# The machine has no network: the NVRTC/nvJitLink wheels must be there already (PyTorch brings them) or be passed as
# files in $WHEELS (a directory of nvidia_cuda_nvrtc-*.whl / nvidia_nvjitlink-*.whl). Keep it well under 10 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-./gpu-logs}"
mkdir -p "$OUT"
export PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PLUGRAD_STRICT_PLUGINS=1 PLUGRAD_CACHE_DIR="$OUT/cache"
status=0
step() {  # step NAME TIMEOUT CMD...: run CMD with its log in $OUT/NAME.log, keep going on failure, remember it
  local name="$1" limit="$2"; shift 2
  echo "== $name: $*" | tee -a "$OUT/summary.txt"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 3 "$OUT/$name.log" | sed 's/^/   /' | tee -a "$OUT/summary.txt"
  echo "   -> exit $rc" | tee -a "$OUT/summary.txt"
  [ "$rc" = 0 ] || status=1
}
: >"$OUT/summary.txt"
step gpu 30 nvidia-smi
step driver 30 bash -c 'nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv'
if [ -n "${WHEELS:-}" ]; then step wheels 120 python3 -m pip install --no-deps --no-index "$WHEELS"/*.whl; fi
step install 180 python3 -m pip install --no-deps -e core -e plugins/cuda
step toolchain 60 python3 -c 'from plugrad_cuda import nvrtc; l = nvrtc.libs(); print(l.nvrtc_path, l.version, l.jitlink_path, l.jitlink_version)'
step devices 60 python3 -m plugrad devices CUDA
step conformance 300 python3 -m pytest -q -p no:cacheprovider -p no:xdist --pyargs plugrad.testing --plugrad-device=CUDA -o addopts= -x -rs
step cuda_tests 120 python3 -m pytest -q -p no:cacheprovider -p no:xdist tests/cuda -o addopts=
step replay 120 python3 bench/gpu/cuda_replay.py
echo "logs in $OUT (summary.txt); overall exit $status" | tee -a "$OUT/summary.txt"
exit "$status"
