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
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT="$PWD"
OUT="${OUT:-./gpu-out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PY="${PYTHON:-python3}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/cuda-check.XXXXXX")"
mkdir -p "$WORK/logs"
trap 'rm -rf "$WORK"' EXIT
export PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INDEX=1 PLUGRAD_STRICT_PLUGINS=1 PYTHONUNBUFFERED=1
export PLUGRAD_CACHE_DIR="$WORK/cache" TRITON_CACHE_DIR="$WORK/triton" PYTHONPATH="$ROOT/bench/gpu${PYTHONPATH:+:$PYTHONPATH}"
ALL="gpu install smoke conformance bench"
NAMED="${STEPS:-}"  # the steps the caller asked for by name
STEPS="${STEPS:-$ALL}"
for s in $STEPS; do [[ " $ALL " == *" $s "* ]] || { echo "cuda_check.sh: unknown step '$s' (steps: $ALL)" >&2; exit 2; }; done
status=0
start=$SECONDS
GPU_WHY=""
want() { [[ " $STEPS " == *" $1 "* ]]; }
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
pack() { tar -czf "$OUT/logs.tgz.tmp" -C "$WORK" logs && mv "$OUT/logs.tgz.tmp" "$OUT/logs.tgz"; }
step() {  # step NAME LIMIT GPU(1|0) CMD...: CMD under the limit, its log in $WORK/logs/NAME.log, keep going on failure
  local name="$1" limit="$2" gpu="$3"; shift 3
  want "$name" || return 0
  if [ "$gpu" = 1 ] && [ -n "$GPU_WHY" ]; then say "== $name: no GPU ($GPU_WHY), not run"; return 0; fi
  if [ "$name" = install ] && [ -n "$GPU_WHY" ] && [[ " $NAMED " != *" install "* ]]; then
    say "== $name: no GPU ($GPU_WHY), not run (STEPS=install runs it anyway)"; return 0
  fi
  say "== $name (limit ${limit}s, at $((SECONDS - start))s): $*"
  timeout -s INT -k 15 "$limit" "$@" >"$WORK/logs/$name.log" 2>&1
  local rc=$?
  tail -n "${TAIL:-4}" "$WORK/logs/$name.log" | sed 's/^/   /' | tee -a "$OUT/summary.txt"
  say "   -> exit $rc$([ "$rc" = 124 ] || [ "$rc" = 130 ] && echo ' (timed out: interrupted)') after $((SECONDS - start))s"
  [ "$rc" = 0 ] || status=1
  pack
}
: >"$OUT/summary.txt"
if ! command -v nvidia-smi >/dev/null 2>&1; then GPU_WHY="nvidia-smi not found"
elif ! timeout 15 nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then GPU_WHY="nvidia-smi lists no GPU"; fi
step gpu 15 1 nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total,clocks.max.sm --format=csv
step install 45 0 bash -c "$PY -m pip install --no-deps --no-build-isolation -e core -e plugins/cuda && $PY -c 'import plugrad, plugrad_cuda; print(\"installed:\", plugrad.__file__, plugrad_cuda.__file__)'"
step smoke 60 1 "$PY" bench/gpu/cuda_smoke.py --json "$OUT/smoke.json"
TAIL=25 step conformance 120 1 "$PY" -m pytest -q -p no:cacheprovider -p pytest_deadline --deadline 60 -n 8 --maxfail 20 -rfE -o addopts= \
  --pyargs plugrad.testing --plugrad-device=CUDA --plugrad-tiers=run --plugrad-results "$OUT/conformance.json"
TAIL=40 step bench 110 1 "$PY" bench/gpu/cuda_bench.py --budget 100 --cap 45 --json "$OUT/bench.json"
say "$((SECONDS - start)) s; overall exit $status; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
pack
exit "$status"
