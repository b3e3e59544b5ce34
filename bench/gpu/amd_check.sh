#!/usr/bin/env bash
# The first check of plugrad-amd on a machine with ROCm and a supported AMD GPU (gfx942, gfx1100-1102, gfx1200/1201).
# NEVER RUN: no AMD GPU exists on this project's machines; everything this script exercises past the compile step is
# unverified. Installs the working tree, prints the GPU, runs the smoke test, the repository's AMD tests, the
# hand-written RDNA3 assembly example (on gfx1100 only) and the conformance suite with every tier (run included).
# Logs go to $OUT (default ./amd-logs); each step has a hard limit and the script keeps going after a failure.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-./amd-logs}"
mkdir -p "$OUT"
export PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PLUGRAD_STRICT_PLUGINS=1 PLUGRAD_CACHE_DIR="$OUT/cache" PYTHONUNBUFFERED=1
status=0
start=$SECONDS
step() {  # step NAME TIMEOUT CMD...: run CMD with its log in $OUT/NAME.log, keep going on failure, remember it
  local name="$1" limit="$2"; shift 2
  echo "== $name (limit ${limit}s, at $((SECONDS - start))s): $*" | tee -a "$OUT/summary.txt"
  timeout -k 10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 3 "$OUT/$name.log" | sed 's/^/   /' | tee -a "$OUT/summary.txt"
  echo "   -> exit $rc$([ "$rc" = 124 ] && echo ' (timed out)')" | tee -a "$OUT/summary.txt"
  [ "$rc" = 0 ] || status=1
}
: >"$OUT/summary.txt"
step gpu 30 bash -c 'rocminfo | grep -E "Marketing Name|Name: +gfx" || rocm-smi'
step install 120 python3 -m pip install --no-deps -e core -e plugins/amd
step toolchain 30 python3 -c 'from plugrad_amd.toolchain import find; t = find(); print(t.clang, t.version, t.lld, t.objdump)'
step devices 60 python3 -m plugrad devices AMD
step byo_assembly 60 python3 plugins/amd/examples/byo_assembly.py
# plugrad-amd's own tests, and the repository's around it (this script, the assembly example)
step amd_tests 300 python3 -m pytest -q -p no:cacheprovider -p no:xdist plugins/amd/tests tests/test_plugin_scripts.py -k "amd or byo or rdna3" -o addopts=
step conformance 600 python3 -m pytest -q -p no:cacheprovider -p no:xdist --pyargs plugrad.testing --plugrad-device=AMD -o addopts= -rs
echo "logs in $OUT (summary.txt); $((SECONDS - start)) s; overall exit $status" | tee -a "$OUT/summary.txt"
exit "$status"
