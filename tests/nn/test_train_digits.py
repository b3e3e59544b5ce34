"""The main job (examples/train_digits.py) end to end in --smoke mode on the PYTHON reference device: train a few
batches, save the weights as safetensors, reload them into a fresh model and get the same predictions."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plugrad.nn.state import safe_load

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_digits.py"


def test_train_digits_smoke_on_python(tmp_path):
  pytest.importorskip("sklearn", reason="the main job needs scikit-learn (pip install scikit-learn)")
  pytest.importorskip("tqdm", reason="the main job needs tqdm (pip install tqdm)")
  weights = tmp_path / "digits.safetensors"
  env = {**os.environ, "DEV": "PYTHON"}
  out = subprocess.run([sys.executable, str(EXAMPLE), "--smoke", "--weights", str(weights)], capture_output=True, text=True, env=env, timeout=600)
  assert out.returncode == 0, out.stdout + out.stderr
  assert "device PYTHON" in out.stdout and "same predictions" in out.stdout and "test accuracy" in out.stdout
  assert "samples/s" in out.stdout and "loss=" in out.stdout  # the progress bar
  sd = safe_load(weights)
  assert sd["conv1.weight"].shape == (16, 1, 3, 3) and sd["fc.weight"].shape == (10, 512) and "bn2.running_var" in sd
