import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from plugrad.nn.state import safe_load, safe_load_metadata

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_hello_kernel_runs_on_the_default_device(capsys):
  runpy.run_path(str(EXAMPLES / "hello_kernel.py"), run_name="__main__")
  assert "both kernels match numpy" in capsys.readouterr().out


def test_cli_lists_builtin_devices():
  out = subprocess.run([sys.executable, "-m", "plugrad", "devices"], capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  assert "PYTHON" in out.stdout and "PASS" in out.stdout


def test_gpt_char_smoke(tmp_path):
  """examples/gpt_char.py end to end in --smoke mode on the default device: a few JIT'd AdamW steps of a tiny GPT, a
  validation loss, a sample, the safetensors checkpoint reloaded into a fresh model with the same logits."""
  pytest.importorskip("tqdm", reason="the example needs tqdm (pip install tqdm)")
  weights = tmp_path / "gpt_char.safetensors"
  out = subprocess.run([sys.executable, str(EXAMPLES / "gpt_char.py"), "--smoke", "--weights", str(weights)], capture_output=True, text=True,
                       timeout=600)
  assert out.returncode == 0, out.stdout + out.stderr
  assert "standard-library source" in out.stdout and "val loss" in out.stdout and "sample:" in out.stdout
  assert "loss=" in out.stdout and "chars/s" in out.stdout  # the progress bar
  assert "same logits" in out.stdout
  sd = safe_load(weights)
  assert sd["tok.weight"].shape[1] == 32 and "blocks.0.qkv.weight" in sd and "vocab" in safe_load_metadata(weights)
