import runpy
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_hello_kernel_runs_on_the_default_device(capsys):
  runpy.run_path(str(EXAMPLES / "hello_kernel.py"), run_name="__main__")
  assert "both kernels match numpy" in capsys.readouterr().out


def test_cli_lists_builtin_devices():
  out = subprocess.run([sys.executable, "-m", "plugrad", "devices"], capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  assert "PYTHON" in out.stdout and "PASS" in out.stdout
