"""bench/transformer.py --quick runs end to end and prints its lines: the agreement check against PyTorch, the
encoder forwards, the decoder training step and the first-result latency (no timing asserts: the machine is shared)."""
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "transformer.py"


@pytest.mark.slow
def test_transformer_bench_quick():
  pytest.importorskip("torch", reason="the agreement check needs PyTorch (pip install torch)")
  out = subprocess.run([sys.executable, str(BENCH), "--quick", "--peers", "plugrad,torch", "--layers", "1", "--threads", "1", "--reps", "2"],
                       capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stdout + out.stderr
  lines = out.stdout.splitlines()
  assert lines[0].startswith("plugrad on ") and "1 thread(s)" in lines[0]
  assert lines[1].startswith("check ") and "torch: encoder" in lines[1] and "MISMATCH" not in lines[1]
  for prefix in ("a encoder fwd", "a bert-base fwd", "b gpt train AdamW", "c first result encoder L1"):
    line = next((ln for ln in lines if ln.startswith(prefix)), None)
    assert line is not None, f"no line {prefix!r} in:\n{out.stdout}"
    assert "plugrad " in line and "torch " in line and "failed" not in line, line
