#!/usr/bin/env bash
# The first check of plugrad-amd on a machine with ROCm and a supported AMD GPU (gfx942, gfx1100-1102, gfx1200/1201).
# NEVER RUN: no AMD GPU exists on this project's machines; everything past the compile step is unverified. From the
# repository root, with $OUT the folder that comes back (the same discipline as cuda_check.sh, docs/gpu-check.md):
#   OUT=/some/dir bash bench/gpu/amd_check.sh            # every step; STEPS="conformance" reruns only that
# Steps, each under `timeout -s INT`; the limits add up to 330 s:
#   gpu          rocminfo's GPU agents (decides whether the GPU steps run)
#   install      plugrad and plugrad-amd from this tree, offline (--no-build-isolation --no-deps, PIP_NO_INDEX=1)
#   devices      `python -m plugrad devices AMD`: render, compile and run a tiny kernel
#   assembly     plugins/amd/examples/byo_assembly.py: hand-written RDNA3 assembly run on the GPU (gfx1100), checked
#   conformance  the suite's run tier on AMD, 8 workers, a per-test deadline, --maxfail, the report as JSON
# $OUT gets summary.txt, logs.tgz and conformance.json; the CPU-only tests (plugins/amd/tests: render, compile,
# emulate) are CI's, not this machine's. Without a GPU every GPU step says "no GPU" and the script exits 0.
set -uo pipefail
cd "$(dirname "$0")/../.."
ALL="gpu install devices assembly conformance"
source bench/gpu/check_lib.sh
if ! command -v rocminfo >/dev/null 2>&1; then GPU_WHY="rocminfo not found"
elif ! timeout 15 rocminfo 2>/dev/null | grep -Eq "Name: +gfx"; then GPU_WHY="rocminfo lists no gfx agent"; fi
step gpu 15 1 bash -c 'rocminfo | grep -E "Marketing Name|Name: +gfx"; rocm-smi --showproductname 2>/dev/null || true'
install_step plugins/amd plugrad plugrad_amd
step devices 60 1 "$PY" -m plugrad devices AMD
step assembly 60 1 "$PY" plugins/amd/examples/byo_assembly.py
TAIL=25 step conformance 150 1 "$PY" -m pytest -q -p no:cacheprovider -p pytest_deadline --deadline 60 -n 8 --maxfail 20 -rfE -o addopts= \
  --pyargs plugrad.testing --plugrad-device=AMD --plugrad-tiers=run --plugrad-results "$OUT/conformance.json"
finish
