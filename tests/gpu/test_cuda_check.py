"""The CUDA check (bench/gpu/cuda_check.sh) is ready for a machine with no network and a 15-minute budget: its install
step works offline in a fresh virtual environment holding only what the GPU image has that matters; without a GPU
every GPU step says so and $OUT stays within its file limit; the smoke script reports PASS/FAIL with the driver's error
names (run against the libcuda stand-in of plugins/cuda/tests); its PTX kernels link for sm_90; the per-test deadline
plugin fails a test that runs too long and lets the rest run."""
from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench/gpu/cuda_check.sh"
HAS_GPU = shutil.which("nvidia-smi") is not None
MAX_OUT_FILES = 6  # of the 8 the device tool brings back, two spare


def _module(folder: str, name: str) -> ModuleType:
  sys.path.insert(0, str(ROOT / folder))
  try: return importlib.import_module(name)
  finally: sys.path.remove(str(ROOT / folder))


def _check(out: Path, steps: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
  e = {k: v for k, v in os.environ.items() if k != "STEPS"}
  e.update(OUT=str(out), **env)
  if steps is not None: e["STEPS"] = steps
  return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=600, env=e, cwd=ROOT)


@pytest.mark.skipif(HAS_GPU, reason="this machine has nvidia-smi: the check runs for real (bash bench/gpu/cuda_check.sh)")
def test_dry_run_without_a_gpu_says_so_per_step_and_keeps_out_small(tmp_path: Path):
  res = _check(tmp_path / "out")
  assert res.returncode == 0, res.stdout + res.stderr
  for name in ("gpu", "install", "smoke", "conformance", "bench"):
    assert f"== {name}: no GPU (nvidia-smi not found)" in res.stdout, res.stdout
  files = sorted(p.name for p in (tmp_path / "out").iterdir())
  assert files == ["logs.tgz", "summary.txt"] and len(files) <= MAX_OUT_FILES
  assert (tmp_path / "out/summary.txt").read_text().count("no GPU") == 5
  bad = _check(tmp_path / "out2", steps="smoke nonsense")
  assert bad.returncode == 2 and "unknown step 'nonsense'" in bad.stderr


def _image_like_venv(path: Path) -> Path:
  """A fresh venv with only what the GPU image has that the install needs (setuptools, wheel, numpy, pluggy), fetched
  while an index is still allowed; skips when they cannot be had here."""
  venv.create(path, with_pip=True)
  py = path / "bin/python"
  env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
  res = subprocess.run([str(py), "-m", "pip", "install", "-q", "setuptools>=64", "wheel", "numpy", "pluggy"], capture_output=True, text=True,
                       timeout=600, env=env)
  if res.returncode != 0: pytest.skip(f"cannot prepare the venv (no index or pip cache here?): {res.stderr.strip()[-300:]}")
  return py


@pytest.mark.slow
def test_install_step_works_offline_in_a_fresh_venv(tmp_path: Path):
  py = _image_like_venv(tmp_path / "venv")
  env = {"PIP_NO_INDEX": "1", "PYTHON": str(py)}
  # the old way (an isolated build) needs an index for setuptools: proof that this venv is offline like the GPU machine
  iso = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "-e", "core"], capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, **env})
  assert iso.returncode != 0 and "setuptools" in iso.stdout + iso.stderr, iso.stdout + iso.stderr
  res = _check(tmp_path / "out", steps="install", **env)
  assert res.returncode == 0, res.stdout + res.stderr
  assert "installed:" in res.stdout and "-> exit 0" in res.stdout, res.stdout
  imp = subprocess.run([str(py), "-c", "import plugrad_cuda.driver, plugrad; print(plugrad_cuda.driver.LIBCUDA)"], capture_output=True, text=True,
                       timeout=120)
  assert imp.returncode == 0 and "libcuda.so.1" in imp.stdout, imp.stderr
  assert len(list((tmp_path / "out").iterdir())) <= MAX_OUT_FILES


def test_smoke_ptx_kernels_link_for_sm_90():
  pytest.importorskip("plugrad_cuda", reason="plugrad-cuda is not installed (.ci/run installs it)")
  from plugrad_cuda import nvrtc, ptx
  from plugrad_cuda.compiler import CUDACompiler
  try: nvrtc.libs()
  except Exception as e: pytest.skip(f"no NVRTC/nvJitLink here: {e}")
  cuda_smoke = _module("bench/gpu", "cuda_smoke")
  for offset in (0, 64 << 10):
    src, shared = cuda_smoke.ptx_reverse(offset)
    assert ptx.shared_bytes(src) == shared and (shared > 48 << 10) == (offset > 0)
    assert CUDACompiler("sm_90").compile(src)[:4] == b"\x7fELF"


SMOKE_WITH_STANDIN = """
import runpy, sys
from plugrad_cuda import driver
driver.LIBCUDA = sys.argv[1]
sys.argv = [{script!r}, *sys.argv[2:]]
runpy.run_path({script!r}, run_name="__main__")
"""


def test_smoke_reports_pass_and_fail_with_the_cuda_error_name(tmp_path: Path):
  pytest.importorskip("plugrad_cuda", reason="plugrad-cuda is not installed (.ci/run installs it)")
  standin = _module("plugins/cuda/tests", "standin")
  if (include := standin.find_cuda_h()) is None: pytest.skip("no cuda.h: pip install nvidia-cuda-runtime (the libcuda stand-in is built against it)")
  if standin.compiler() is None: pytest.skip("no C compiler to build the libcuda stand-in")
  so = standin.build_standin(include, tmp_path)
  code = SMOKE_WITH_STANDIN.format(script=str(ROOT / "bench/gpu/cuda_smoke.py"))
  res = subprocess.run([sys.executable, "-c", code, str(so), "--only", "copy_small,copy_large,launch", "--json", str(tmp_path / "s.json")],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert res.returncode == 1, res.stdout + res.stderr  # the stand-in runs no real kernels: the launch fails, by name
  assert "GPU: plugrad CUDA stand-in (no GPU) (sm_90)" in res.stdout, res.stdout
  assert "PASS  copy_small: 4000 bytes in and out" in res.stdout and "PASS  copy_large: 9437196 bytes in and out" in res.stdout, res.stdout
  assert "FAIL  launch: LaunchError [CUDA_ERROR_NOT_SUPPORTED]: kernel 'E_100003' failed to launch on CUDA" in res.stdout, res.stdout
  assert "smoke: 2 of 3 passed; FAILED: launch" in res.stdout
  got = json.loads((tmp_path / "s.json").read_text())
  assert [got[k]["status"] for k in ("copy_small", "copy_large", "launch")] == ["PASS", "PASS", "FAIL"]


def test_deadline_plugin_fails_a_slow_test_and_runs_the_rest(tmp_path: Path):
  (tmp_path / "test_slow.py").write_text("import time\ndef test_slow(): time.sleep(30)\ndef test_fast(): pass\n")
  env = {**os.environ, "PYTHONPATH": f"{ROOT / 'bench/gpu'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
  res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "pytest_deadline", "--deadline", "1", "-n", "0",
                        "-o", "addopts=", "-rfE", str(tmp_path / "test_slow.py")], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
  assert res.returncode == 1, res.stdout + res.stderr
  assert "DeadlineExceeded: test_slow.py::test_slow ran past --deadline 1 s" in res.stdout and "1 failed, 1 passed" in res.stdout, res.stdout
