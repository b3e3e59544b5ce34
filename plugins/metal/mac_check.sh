#!/usr/bin/env bash
# The first run of plugrad-metal on a Mac (never run yet: no Mac in this project). From the repository root, with
# $OUT the folder to keep (the same discipline as bench/gpu/cuda_check.sh, docs/gpu-check.md):
#   OUT=/tmp/plugrad-metal-check bash plugins/metal/mac_check.sh     # every step; STEPS="conformance" reruns that
# Steps, each under `timeout -s INT`; the limits add up to 330 s:
#   gpu          macOS and its GPU (system_profiler); off macOS every GPU step says "no GPU" and the script exits 0
#   install      plugrad and plugrad-metal from this tree, offline (--no-build-isolation --no-deps, PIP_NO_INDEX=1;
#                pyobjc-framework-Metal must be installed already, or set PIP_NO_INDEX=0 on a Mac with a network)
#   devices      `python -m plugrad devices METAL`, and the Metal compiler xcrun finds
#   smoke        a 256x256 matmul on METAL with DEBUG=2 (GPU time per kernel), checked against numpy
#   conformance  the suite's run tier on METAL (the JIT's ICB graph runner included), 4 workers, a per-test deadline,
#                --maxfail, the report as JSON
# $OUT gets summary.txt, logs.tgz and conformance.json; the CPU-only tests (plugins/metal/tests) are CI's.
set -uo pipefail
cd "$(dirname "$0")/../.."
ALL="gpu install devices smoke conformance"
source bench/gpu/check_lib.sh
if [ "$(uname -s)" != "Darwin" ]; then GPU_WHY="not macOS: $(uname -s)"
elif ! command -v xcrun >/dev/null 2>&1; then GPU_WHY="no xcrun (install the Xcode command line tools)"; fi
step gpu 15 1 bash -c 'sw_vers; system_profiler SPDisplaysDataType | grep -E "Chipset Model|Metal"'
install_step plugins/metal plugrad plugrad_metal
step devices 60 1 bash -c "$PY -m plugrad devices METAL && xcrun -sdk macosx -f metal"
step smoke 60 1 env DEV=METAL DEBUG=2 "$PY" -c "import numpy as np; from plugrad import Tensor; a = np.random.default_rng(0).standard_normal((256, 256), dtype=np.float32); got = (Tensor(a) @ Tensor(a)).numpy(); np.testing.assert_allclose(got, a @ a, rtol=1e-4, atol=1e-4); print('matmul 256 on METAL matches numpy')"
TAIL=25 step conformance 180 1 "$PY" -m pytest -q -p no:cacheprovider -p pytest_deadline --deadline 60 -n 4 --maxfail 20 -rfE -o addopts= \
  --pyargs plugrad.testing --plugrad-device=METAL --plugrad-tiers=run --plugrad-results "$OUT/conformance.json"
finish
