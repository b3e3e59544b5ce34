#!/usr/bin/env bash
# The CUDA check on an NVIDIA GPU machine (conventions: /work/shared/gpu/README.md). Installs the working tree, prints
# the GPU and driver, runs the conformance suite on CUDA with every tier (run included), the repository's CUDA tests,
# the Triton-through-plugrad example and the benchmark (bench/gpu/cuda_bench.py: matmuls next to cuBLAS and Triton,
# elementwise next to HBM, softmax/layernorm, TinyJit replay next to a PyTorch CUDA graph, the digits CNN step);
# every log goes to $OUT (default ./gpu-logs), the benchmark's table to $OUT/bench.log and $OUT/bench.json.
# The machine has no network: the NVRTC/nvJitLink wheels must be there already (PyTorch brings them) or be passed as
# files in $WHEELS (a directory of nvidia_cuda_nvrtc-*.whl / nvidia_nvjitlink-*.whl).
# Time: every step has a hard limit (`timeout`); the limits add up to 12 minutes (13 with WHEELS), a normal run takes
# less (the device budget is 15 minutes, the machine's start included); the benchmark stops starting workers at its
# own --budget, so its table is printed before its step's limit. STEPS="bench triton" (names below) runs only those,
# for a rerun that fits what is left; BENCH_ARGS passes options to the benchmark (e.g. "--quick" or "--only mm16,ew").
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-./gpu-logs}"
mkdir -p "$OUT"
export PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PLUGRAD_STRICT_PLUGINS=1 PLUGRAD_CACHE_DIR="$OUT/cache" PYTHONUNBUFFERED=1
STEPS="${STEPS:-gpu driver wheels install toolchain devices bench triton cuda_tests conformance}"
status=0
start=$SECONDS
want() { [[ " $STEPS " == *" $1 "* ]]; }
step() {  # step NAME TIMEOUT CMD...: run CMD with its log in $OUT/NAME.log, keep going on failure, remember it
  local name="$1" limit="$2"; shift 2
  want "$name" || return 0
  echo "== $name (limit ${limit}s, at $((SECONDS - start))s): $*" | tee -a "$OUT/summary.txt"
  timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -n "${TAIL:-3}" "$OUT/$name.log" | sed 's/^/   /' | tee -a "$OUT/summary.txt"
  echo "   -> exit $rc$([ "$rc" = 124 ] && echo ' (timed out)')" | tee -a "$OUT/summary.txt"
  [ "$rc" = 0 ] || status=1
}
: >"$OUT/summary.txt"
step gpu 20 nvidia-smi
step driver 20 bash -c 'nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv'
if [ -n "${WHEELS:-}" ]; then step wheels 60 python3 -m pip install --no-deps --no-index "$WHEELS"/*.whl; fi
step install 60 python3 -m pip install --no-deps -e core -e plugins/cuda
step toolchain 30 python3 -c 'from plugrad_cuda import nvrtc; l = nvrtc.libs(); print(l.nvrtc_path, l.version, l.jitlink_path, l.jitlink_version)'
step devices 30 python3 -m plugrad devices CUDA
# the figures first (what only a GPU can give), each workload in its own worker with its own cap
TAIL=40 step bench 270 python3 bench/gpu/cuda_bench.py --cap 60 --budget 240 --json "$OUT/bench.json" ${BENCH_ARGS:-}
TAIL=2 step triton 60 python3 examples/triton_matmul.py --size 4096
# plugrad-cuda's own tests, and the repository's around it (this script, the benchmark's dry run, the Triton example)
step cuda_tests 60 python3 -m pytest -q -p no:cacheprovider -p no:xdist plugins/cuda/tests tests/test_plugin_scripts.py -k "cuda or triton" -o addopts=
step conformance 170 python3 -m pytest -q -p no:cacheprovider -p no:xdist --pyargs plugrad.testing --plugrad-device=CUDA -o addopts= -x -rs
echo "logs in $OUT (summary.txt); $((SECONDS - start)) s; overall exit $status" | tee -a "$OUT/summary.txt"
exit "$status"
