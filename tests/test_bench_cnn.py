"""bench/cnn.py: its sweep is what the models run (recorded from their lazy forwards), the models in torchvision's
layout compute what the same PyTorch modules compute after the weight copy, and --quick runs end to end (no timing
asserts: the machine is shared)."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "cnn.py"


def _cnn(monkeypatch):
  pytest.importorskip("torch", reason="bench/cnn.py compares with PyTorch (pip install torch)")
  monkeypatch.setenv("THREADS", os.environ.get("THREADS", "1"))  # the script sets THREADS when imported: restored after
  sys.path.insert(0, str(BENCH.parent))
  try:
    import cnn
  finally: sys.path.remove(str(BENCH.parent))
  return cnn


def test_sweep_records_the_models_distinct_ops(monkeypatch):
  cnn = _cnn(monkeypatch)
  ops = cnn.sweep_ops(["resnet18", "mobilenetv2"], [1])
  labels = [cnn.op_label(o) for o in ops]
  assert len(labels) == len(set(ops)) and "conv 1x512x7x7 3x3/1 p1 ->512" in labels and "dw 1x960x7x7 3x3/1 p1 ->960" in labels
  assert "global avg pool 1x512x7x7" in labels and "maxpool 1x64x112x112 3x3/2 p1" in labels and "linear 1x1280 @ 1280x1000" in labels


@pytest.mark.parametrize("name", ["resnet18", "mobilenetv2"])
def test_models_match_pytorch_after_the_weight_copy(name, monkeypatch):
  cnn = _cnn(monkeypatch)
  import torch
  pg, th = cnn.MODELS[name](cnn.plugrad_ops()), cnn.MODELS[name](cnn.TORCH)
  cnn.copy_random_weights(pg, th)
  for m in cnn._torch_modules(th): m.eval()
  x = np.random.default_rng(0).standard_normal((1, 3, 32, 32), dtype=np.float32)
  with torch.inference_mode(): want = th(torch.from_numpy(x)).numpy()
  got = pg(cnn.Tensor(x)).numpy()
  assert got.shape == (1, 1000) and cnn.rel_err(got, want) < 1e-4


@pytest.mark.slow
def test_cnn_bench_quick(monkeypatch):
  _cnn(monkeypatch)
  out = subprocess.run([sys.executable, str(BENCH), "--quick", "--threads", "1", "--rounds", "1"], capture_output=True, text=True, timeout=1200)
  assert out.returncode == 0, out.stdout + out.stderr
  assert "MISMATCH" not in out.stdout and "sweep geometric mean" in out.stdout, out.stdout
  assert "models geometric mean" in out.stdout and "train step" in out.stdout, out.stdout
