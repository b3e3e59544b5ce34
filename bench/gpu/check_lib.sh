# What the GPU check scripts share (sourced by bench/gpu/cuda_check.sh, bench/gpu/amd_check.sh and
# plugins/metal/mac_check.sh, after `cd` to the repository root and with ALL set to their step names in order).
# The discipline (docs/gpu-check.md): an offline install; each step under `timeout -s INT` (pytest prints its summary
# when interrupted), its full log in a temporary folder tarred into $OUT/logs.tgz after every step; $OUT holds only
# summary.txt, logs.tgz and the reports the steps write there; the compile caches live outside $OUT. STEPS= runs a
# subset. Without the device ($GPU_WHY set by the script) a GPU step says "no GPU (why)" and is not run; a step that
# needs no GPU (install) runs then only when STEPS names it.
ROOT="$PWD"
OUT="${OUT:-./gpu-out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
PY="${PYTHON:-python3}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")"
mkdir -p "$WORK/logs"
trap 'rm -rf "$WORK"' EXIT
# PIP_BREAK_SYSTEM_PACKAGES: a distribution's python3 marked externally managed (PEP 668) would refuse the install
# (an older pip ignores the variable)
export PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INDEX="${PIP_NO_INDEX:-1}" PIP_BREAK_SYSTEM_PACKAGES=1
export PLUGRAD_STRICT_PLUGINS=1 PYTHONUNBUFFERED=1
export PLUGRAD_CACHE_DIR="$WORK/cache" PYTHONPATH="$ROOT/bench/gpu${PYTHONPATH:+:$PYTHONPATH}"
NAMED="${STEPS:-}"  # the steps the caller asked for by name
STEPS="${STEPS:-$ALL}"
for s in $STEPS; do [[ " $ALL " == *" $s "* ]] || { echo "$(basename "$0"): unknown step '$s' (steps: $ALL)" >&2; exit 2; }; done
status=0
start=$SECONDS
GPU_WHY=""
: >"$OUT/summary.txt"

want() { [[ " $STEPS " == *" $1 "* ]]; }
say() { echo "$*" | tee -a "$OUT/summary.txt"; }
pack() { tar -czf "$OUT/logs.tgz.tmp" -C "$WORK" logs && mv "$OUT/logs.tgz.tmp" "$OUT/logs.tgz"; }

step() {  # step NAME LIMIT GPU(1|0) CMD...: CMD under the limit, its log in $WORK/logs/NAME.log, keep going on failure
  local name="$1" limit="$2" gpu="$3"; shift 3
  want "$name" || return 0
  if [ -n "$GPU_WHY" ] && { [ "$gpu" = 1 ] || [[ " $NAMED " != *" $name "* ]]; }; then
    say "== $name: no GPU ($GPU_WHY), not run$([ "$gpu" = 0 ] && echo " (STEPS=$name runs it anyway)")"
    return 0
  fi
  say "== $name (limit ${limit}s, at $((SECONDS - start))s): $*"
  timeout -s INT -k 15 "$limit" "$@" >"$WORK/logs/$name.log" 2>&1
  local rc=$?
  tail -n "${TAIL:-4}" "$WORK/logs/$name.log" | sed 's/^/   /' | tee -a "$OUT/summary.txt"
  say "   -> exit $rc$({ [ "$rc" = 124 ] || [ "$rc" = 130 ]; } && echo ' (timed out: interrupted)') after $((SECONDS - start))s"
  [ "$rc" = 0 ] || status=1
  pack
}

install_step() {  # install_step DIST_DIR IMPORT...: the tree's core and one plugin, offline, then import them
  local plugin="$1"; shift
  local imports; imports="$(IFS=,; echo "$*")"
  step install 45 0 bash -c "$PY -m pip install --no-deps --no-build-isolation -e core -e $plugin && $PY -c 'import $imports; print(\"installed: $imports\")'"
}

finish() {
  say "$((SECONDS - start)) s; overall exit $status; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
  pack
  exit "$status"
}
