"""The GPU checks (bench/gpu/cuda_check.sh, bench/gpu/amd_check.sh, plugins/metal/mac_check.sh, sharing
bench/gpu/check_lib.sh) are ready for a machine with no network and a 15-minute budget: each install step works
offline in a fresh virtual environment holding only what the GPU image has that matters; without the device every GPU
step says so and $OUT stays within its file limit; the CUDA smoke script reports PASS/FAIL with the driver's error
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
SCRIPTS = {"cuda": ("bench/gpu/cuda_check.sh", "nvidia-smi not found", "gpu install smoke conformance bench", "plugrad_cuda"),
           "amd": ("bench/gpu/amd_check.sh", "rocminfo not found", "gpu install devices assembly conformance", "plugrad_amd"),
           "metal": ("plugins/metal/mac_check.sh", f"not macOS: {os.uname().sysname}", "gpu install devices smoke conformance", "plugrad_metal")}
HAS_DEVICE = {"cuda": shutil.which("nvidia-smi") is not None, "amd": shutil.which("rocminfo") is not None, "metal": sys.platform == "darwin"}
MAX_OUT_FILES = 6  # of the 8 the device tool brings back, two spare


def _module(folder: str, name: str) -> ModuleType:
  sys.path.insert(0, str(ROOT / folder))
  try: return importlib.import_module(name)
  finally: sys.path.remove(str(ROOT / folder))


def _check(out: Path, steps: str | None = None, script: str = "cuda", **env: str) -> subprocess.CompletedProcess[str]:
  e = {k: v for k, v in os.environ.items() if k != "STEPS"}
  e.update(OUT=str(out), **env)
  if steps is not None: e["STEPS"] = steps
  return subprocess.run(["bash", str(ROOT / SCRIPTS[script][0])], capture_output=True, text=True, timeout=600, env=e, cwd=ROOT)


@pytest.mark.parametrize("script", list(SCRIPTS))
def test_dry_run_without_the_device_says_so_per_step_and_keeps_out_small(tmp_path: Path, script: str):
  if HAS_DEVICE[script]: pytest.skip(f"this machine has the device: run {SCRIPTS[script][0]} for real")
  path, why, steps, _ = SCRIPTS[script]
  assert subprocess.run(["bash", "-n", str(ROOT / path)], capture_output=True, timeout=60).returncode == 0
  res = _check(tmp_path / "out", script=script)
  assert res.returncode == 0, res.stdout + res.stderr
  for name in steps.split():
    assert f"== {name}: no GPU ({why}), not run" in res.stdout, res.stdout
  files = sorted(p.name for p in (tmp_path / "out").iterdir())
  assert files == ["logs.tgz", "summary.txt"] and len(files) <= MAX_OUT_FILES
  assert (tmp_path / "out/summary.txt").read_text().count("no GPU") == len(steps.split())
  bad = _check(tmp_path / "out2", steps="gpu nonsense", script=script)
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


@pytest.fixture(scope="module")
def image_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
  py = _image_like_venv(tmp_path_factory.mktemp("venv") / "venv")
  # the old way (an isolated build) needs an index for setuptools: proof that this venv is offline like the GPU machine
  iso = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "-e", "core"], capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**os.environ, "PIP_NO_INDEX": "1"})
  assert iso.returncode != 0 and "setuptools" in iso.stdout + iso.stderr, iso.stdout + iso.stderr
  return py


@pytest.mark.slow
@pytest.mark.parametrize("script", list(SCRIPTS))
def test_install_step_works_offline_in_a_fresh_venv(image_venv: Path, tmp_path: Path, script: str):
  res = _check(tmp_path / "out", steps="install", script=script, PIP_NO_INDEX="1", PYTHON=str(image_venv))
  assert res.returncode == 0, res.stdout + res.stderr
  module = SCRIPTS[script][3]
  assert f"installed: plugrad,{module}" in res.stdout and "-> exit 0" in res.stdout, res.stdout
  imp = subprocess.run([str(image_venv), "-c", f"import plugrad, {module}; print({module}.__file__)"], capture_output=True, text=True, timeout=120)
  assert imp.returncode == 0 and str(ROOT) in imp.stdout, imp.stderr
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
  assert ptx.entry_params(cuda_smoke.ADD_N_PTX, "pg_add_n") is not None and CUDACompiler("sm_90").compile(cuda_smoke.ADD_N_PTX)[:4] == b"\x7fELF"


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
  checks = "copy_small,copy_large,graph_rebuild,launch"
  res = subprocess.run([sys.executable, "-c", code, str(so), "--only", checks, "--json", str(tmp_path / "s.json")],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert res.returncode == 1, res.stdout + res.stderr  # the stand-in runs no real kernels: the launch fails, by name
  assert "GPU: plugrad CUDA stand-in (no GPU) (sm_90)" in res.stdout, res.stdout
  assert "PASS  copy_small: 4000 bytes in and out" in res.stdout and "PASS  copy_large: 9437196 bytes in and out" in res.stdout, res.stdout
  assert "FAIL  launch: LaunchError [CUDA_ERROR_NOT_SUPPORTED]: kernel 'E_100003' failed to launch on CUDA" in res.stdout, res.stdout
  # the graph check's kernel is one the stand-in runs itself (pg_add_n): TinyJit, the graph runner and its rebuilds
  assert "PASS  graph_rebuild: patched replays, n = 0 drops a node (rebuilt)" in res.stdout, res.stdout
  assert "smoke: 3 of 4 passed; FAILED: launch" in res.stdout
  got = json.loads((tmp_path / "s.json").read_text())
  assert [got[k]["status"] for k in ("copy_small", "copy_large", "graph_rebuild", "launch")] == ["PASS", "PASS", "PASS", "FAIL"]


def test_deadline_plugin_fails_a_slow_test_and_runs_the_rest(tmp_path: Path):
  (tmp_path / "test_slow.py").write_text("import time\ndef test_slow(): time.sleep(30)\ndef test_fast(): pass\n")
  env = {**os.environ, "PYTHONPATH": f"{ROOT / 'bench/gpu'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
  res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "pytest_deadline", "--deadline", "1", "-n", "0",
                        "-o", "addopts=", "-rfE", str(tmp_path / "test_slow.py")], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
  assert res.returncode == 1, res.stdout + res.stderr
  assert "DeadlineExceeded: test_slow.py::test_slow ran past --deadline 1 s" in res.stdout and "1 failed, 1 passed" in res.stdout, res.stdout
