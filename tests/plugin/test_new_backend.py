"""`python -m plugrad new-backend NAME`: the skeleton installs, is listed with its device as unavailable (with the
skeleton's reason), is ruff-clean, passes its own conformance test (the render tier) and says what to write next."""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import sysconfig
import venv

import pytest

from plugrad.__main__ import main
from plugrad.scaffold import files

ROOT = pathlib.Path(__file__).resolve().parents[2]
REASON = "plugrad-skel is a skeleton: implement the runtime in plugrad_skel/runtime.py"


def _env(**extra: str) -> dict[str, str]:
  drop = ("DEV", "PLUGRAD_PLUGINS", "PLUGRAD_NO_PLUGINS", "PLUGRAD_STRICT_PLUGINS", "PYTEST_", "PIP_", "PYTHONPATH", "EMULATE")
  return {**{k: v for k, v in os.environ.items() if not k.startswith(drop)}, **extra}


def _run(py: pathlib.Path, *args: str, cwd: pathlib.Path, **env: str) -> subprocess.CompletedProcess[str]:
  env = _env(PLUGRAD_CACHE_DIR=str(cwd / ".cache"), **env)
  return subprocess.run([str(py), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def _venv_seeing_this_environment(root: pathlib.Path) -> pathlib.Path:
  """A venv whose interpreter also sees the running interpreter's packages (pip, setuptools, this plugrad). Not
  `system_site_packages`: that is the base interpreter's site, not a user's venv this test may run in. The .pth runs
  site.addsitedir, so the .pth files there (editable installs) are processed too."""
  venv.EnvBuilder(with_pip=False).create(root)
  py = root / "bin" / "python"
  site_dir = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True,
                            check=True).stdout.strip()
  dirs = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
  pathlib.Path(site_dir, "running_env.pth").write_text("".join(f"import site; site.addsitedir({d!r})\n" for d in dirs))
  return py


@pytest.fixture(scope="module")
def skeleton(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, pathlib.Path]:
  """The skeleton for SKEL, written by the CLI and installed (not editable) into a venv that sees this plugrad."""
  tmp = tmp_path_factory.mktemp("newbackend")
  assert main(["new-backend", "skel", "--out", str(tmp)]) == 0
  for tool in ("pip", "setuptools"):  # the build runs without isolation, from this environment's own tools
    if importlib.util.find_spec(tool) is None: pytest.skip(f"needs {tool} in the running environment ({sys.prefix}) to build the skeleton")
  py = _venv_seeing_this_environment(tmp / "venv")
  pip = ["-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--disable-pip-version-check"]
  proc = _run(py, *pip, str(tmp / "plugrad-skel"), cwd=tmp)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  return tmp / "plugrad-skel", py


def test_the_cli_writes_the_files_and_refuses_bad_targets(tmp_path, capsys):
  assert main(["new-backend", "my_npu", "--out", str(tmp_path)]) == 0
  root = tmp_path / "plugrad-my-npu"
  assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == sorted(files("my_npu"))
  assert "python -m plugrad conformance MY_NPU" in capsys.readouterr().out
  plugin = (root / "plugrad_my_npu" / "plugin.py").read_text()
  assert 'NAME = "MY_NPU"' in plugin and "from plugrad_my_npu.runtime import MyNpuRuntime" in plugin
  assert 'my_npu = "plugrad_my_npu.plugin"' in (root / "pyproject.toml").read_text()
  for argv, message in [(["new-backend", "my_npu", "--out", str(tmp_path)], "already exists"),
                        (["new-backend", "9lives", "--out", str(tmp_path)], "'9lives' is not a device name"),
                        (["new-backend", "my-npu", "--out", str(tmp_path)], "'my-npu' is not a device name"),
                        (["new-backend", "python", "--out", str(tmp_path)], "PYTHON is already a device here (plugrad ")]:
    assert main(argv) == 2
    assert message in capsys.readouterr().err
  assert not (tmp_path / "plugrad-python").exists()


def test_generated_code_imports_only_the_backend_namespace():
  for path, text in files("skel").items():
    if path.endswith(".py"):
      imports = [ln.split()[1] for ln in text.splitlines() if ln.lstrip().startswith(("import ", "from ")) and "plugrad" in ln.split()[1]]
      assert all(m in ("plugrad.backend",) or m.startswith("plugrad_skel") for m in imports), (path, imports)


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="needs ruff (pip install ruff)")
def test_generated_files_are_ruff_clean(tmp_path):
  assert main(["new-backend", "skel", "--out", str(tmp_path)]) == 0
  for config in ([], ["--config", str(ROOT / "pyproject.toml")]):  # its own settings, and this repository's stricter rules
    cmd = [sys.executable, "-m", "ruff", "check", "--no-cache", *config, "."]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path / "plugrad-skel")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_installed_skeleton_is_listed_with_its_device_unavailable(skeleton):
  root, py = skeleton
  proc = _run(py, "-m", "plugrad", "plugins", "--json", cwd=root.parent)
  assert proc.returncode == 0, proc.stderr
  by = {p["name"]: p for p in json.loads(proc.stdout)["plugins"]}
  assert {k: by["skel"][k] for k in ("distribution", "version", "status", "devices", "module")} == \
    {"distribution": "plugrad-skel", "version": "0.1.0", "status": "active", "devices": ["SKEL"], "module": "plugrad_skel.plugin"}
  proc = _run(py, "-m", "plugrad", "devices", "--json", cwd=root.parent, PLUGRAD_PLUGINS="skel")
  assert proc.returncode == 0, proc.stdout + proc.stderr  # unavailable is not a failure
  row = {d["device"]: d for d in json.loads(proc.stdout)["devices"]}["SKEL"]
  assert (row["available"], row["probe"], row["distribution"]) == (False, REASON, "plugrad-skel")


@pytest.mark.slow
def test_its_conformance_test_passes_the_render_tier(skeleton):
  root, py = skeleton
  proc = _run(py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "tests", cwd=root)
  assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
  assert "1 passed" in proc.stdout


@pytest.mark.slow
def test_the_unwritten_parts_fail_naming_what_to_write(skeleton):
  root, py = skeleton
  out = root.parent / "compile.json"
  proc = _run(py, "-m", "plugrad", "conformance", "SKEL", "--tiers", "render,compile", "--json", str(out), "--", "-k", "ew-add-float32 or global_ids",
              cwd=root.parent)
  rep = json.loads(out.read_text())
  todo = "NotImplementedError: plugrad-skel is a skeleton: write SkelCompiler.compile(src) -> bytes in plugrad_skel/compiler.py"
  assert proc.returncode == 1 and rep["failures"] == [{"test": "test_kernel[ew-add-float32-compile]", "tier": "compile", "message": todo}]
  declared = {x["test"]: x["outcome"] for x in rep["xfails"]}  # the renderer cannot render launch indices: declared, and so it fails
  assert declared == {"test_kernel[global_ids-render]": "xfailed", "test_kernel[global_ids-compile]": "xfailed",
                      "test_kernel[global_ids-run]": "not run"}
  code = """
import json
from plugrad_skel.runtime import SkelAllocator, SkelRuntime
out = []
for call in (lambda: SkelRuntime("SKEL").load(None), lambda: SkelAllocator("SKEL").alloc(16)):
  try: call()
  except NotImplementedError as e: out.append(str(e))
print(json.dumps(out))
"""
  proc = _run(py, "-c", code, cwd=root.parent)
  assert json.loads(proc.stdout) == [
    "plugrad-skel is a skeleton: write SkelRuntime.load in plugrad_skel/runtime.py (program.binary to a launchable kernel)",
    "plugrad-skel is a skeleton: write SkelAllocator._alloc in plugrad_skel/runtime.py (a handle to nbytes of device memory)"], proc.stderr
