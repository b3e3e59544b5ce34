#!/usr/bin/env bash
# The first run of plugrad-metal on a Mac (never run yet: no Mac in this project). From the repository root:
#   bash plugins/metal/mac_check.sh            # logs in $OUT (default /tmp/plugrad-metal-check)
# It installs the packages, smoke-tests the device, runs every conformance tier for METAL (the run tier included),
# the JIT tests through the ICB graph runner, and the METAL unit tests, and keeps each log.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/plugrad-metal-check}"
mkdir -p "$OUT"
if [ "$(uname -s)" != "Darwin" ]; then echo "mac_check.sh: not macOS ($(uname -s)); nothing to check here" >&2; exit 2; fi
python3 -m pip install -q -e "./core[dev]" -e ./plugins/metal 2>&1 | tee "$OUT/install.log"
status=0
run() { name=$1; shift; echo "== $name: $*"; "$@" >"$OUT/$name.log" 2>&1; rc=$?; echo "   rc=$rc ($OUT/$name.log)"; [ $rc = 0 ] || status=1; }
run devices python3 -m plugrad devices METAL
run xcrun xcrun -sdk macosx -f metal
for lang in 3.0 3.1; do
  run "conformance-$lang" env METAL_LANGUAGE=$lang PLUGRAD_STRICT_PLUGINS=1 python3 -m pytest -q --pyargs plugrad.testing --plugrad-device=METAL -o addopts=
done
run jit env PLUGRAD_STRICT_PLUGINS=1 DEBUG=1 python3 -m pytest -q --pyargs plugrad.testing.test_jit --plugrad-device=METAL -o addopts=
run unit python3 -m pytest -q plugins/metal/tests
run timing env DEV=METAL DEBUG=2 python3 -c "from plugrad import Tensor; import numpy as np; print((Tensor(np.ones((256, 256), np.float32)) @ Tensor(np.ones((256, 256), np.float32))).numpy()[0, :4])"
echo "mac_check.sh: $([ $status = 0 ] && echo all passed || echo some steps FAILED), logs in $OUT"
exit $status
