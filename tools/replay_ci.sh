#!/usr/bin/env bash
# Process replay in CI (docs/replay.md): record the kernels of a small workload at the previous commit's tree, then
# regenerate them at this tree and print every kernel whose source or applied actions changed, and the count compared.
# A change is reported, not fatal (an intended codegen change is a normal commit); exit 1 only if the step itself fails.
# Usage: tools/replay_ci.sh [PREV_TREE]   (default: HEAD~1, checked out with `git worktree` into a temporary folder)
set -euo pipefail
cd "$(dirname "$0")/.."
here=$PWD tmp=$(mktemp -d)
trap 'git worktree remove --force "$tmp/prev" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
if [ $# -ge 1 ]; then prev=$1
else
  if ! git rev-parse -q --verify HEAD~1 >/dev/null; then echo "replay: no previous commit here (shallow clone?); skipped"; exit 0; fi
  git worktree add -q --detach "$tmp/prev" HEAD~1
  prev=$tmp/prev
fi
if [ ! -f "$prev/core/plugrad/replay.py" ]; then echo "replay: the previous tree has no process replay yet; skipped"; exit 0; fi
# the previous tree's packages come first on the path (before the editable installs of this one); plugins by entry point
pp="$prev/core"; for p in "$prev"/plugins/*/; do pp="$pp:$p"; done
export CPU_LLVM=0  # C source: the renderer the CPU's tiered compiler and the exports use; PYTHON is checked too
(cd "$prev" && PYTHONPATH="$pp" python3 -m plugrad replay record --db "$tmp/kernels.db" -- \
  python3 examples/train_digits.py --smoke) >"$tmp/record.log" 2>&1 || { cat "$tmp/record.log"; exit 1; }
(cd "$prev" && PYTHONPATH="$pp" DEV=PYTHON python3 -m plugrad replay record --db "$tmp/kernels.db" -- \
  python3 -c "from plugrad import Tensor; x = Tensor.rand(8, 16); print(((x @ x.T).relu().softmax() + x.sum()).numpy().sum())") \
  >>"$tmp/record.log" 2>&1 || { cat "$tmp/record.log"; exit 1; }
tail -n 1 "$tmp/record.log"
cd "$here" && python3 -m plugrad replay check --db "$tmp/kernels.db" --allow-change
