"""The third-party path, end to end: real distributions, each built in its own isolated build environment (pip's
default PEP 517 build isolation) and installed into a brand-new virtual environment that sees nothing of this one:
plugrad itself is built from core/ into a wheel there, with its dependencies from the package index. Four plugins:

* plugrad-thirdpy: a working device THIRDPY that reuses the PYTHON device's components (priority 7);
* plugrad-brokenpy: raises at import (it needs a driver module that does not exist);
* plugrad-futurepy: built for the next plugin API major version;
* plugrad-mydev: the minimal backend of docs/writing-a-backend.md (C through cc and ctypes), copied from the page
  as a reader would, and written only against `plugrad.backend`.
"""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import textwrap
import venv

import numpy as np
import pytest

from plugrad.backend import API_VERSION

pytestmark = pytest.mark.slow

API = f"({API_VERSION[0]}, {API_VERSION[1]})"  # what these plugins are "built for": a literal, as a real plugin writes it

PLUGINS: dict[str, str] = {
  "thirdpy": f'''
from plugrad.backend import DeviceSpec, device_name, hookimpl

@hookimpl
def plugrad_devices():
  return [DeviceSpec("THIRDPY", api={API}, priority=7, description="a third-party device on the PYTHON interpreter")]

@hookimpl
def plugrad_renderer(device):
  if device_name(device) != "THIRDPY": return None
  from plugrad.builtin.python_renderer import PythonRenderer
  return PythonRenderer(device)

@hookimpl
def plugrad_compiler(device, renderer):
  if device_name(device) != "THIRDPY": return None
  from plugrad.builtin.interpreter import PythonCompiler
  return PythonCompiler()

@hookimpl
def plugrad_allocator(device):
  if device_name(device) != "THIRDPY": return None
  from plugrad.builtin.interpreter import PythonAllocator
  return PythonAllocator(device)

@hookimpl
def plugrad_runtime(device):
  if device_name(device) != "THIRDPY": return None
  from plugrad.builtin.interpreter import PythonRuntime
  return PythonRuntime(device)
''',
  "brokenpy": '''
import brokenpy_driver_sdk  # not installed: importing this plugin fails
''',
  "futurepy": f'''
from plugrad.backend import DeviceSpec, hookimpl

@hookimpl
def plugrad_devices():
  return [DeviceSpec("FUTUREPY", api=({API_VERSION[0] + 1}, 0))]

@hookimpl
def plugrad_renderer(device):
  raise RuntimeError("a refused plugin's component hooks must never be called")
''',
}


DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "writing-a-backend.md"
CORE = pathlib.Path(__file__).resolve().parents[2] / "core"


def _doc_example(root: pathlib.Path) -> pathlib.Path:
  """The distribution shown in the "A complete minimal backend" section of the doc: its toml block, and each python
  block whose first line names its file (`# plugrad_mydev/device.py`)."""
  section = DOC.read_text().split("## A complete minimal backend", 1)[1].split("\n## ", 1)[0]
  d = root / "plugrad-mydev"
  (d / "plugrad_mydev").mkdir(parents=True)
  (d / "pyproject.toml").write_text(section.split("```toml\n", 1)[1].split("```", 1)[0])
  (d / "plugrad_mydev" / "__init__.py").write_text("")
  blocks = [b.split("```", 1)[0] for b in section.split("```python\n")[1:]]
  files = {b.split("\n", 1)[0].removeprefix("# "): b for b in blocks if b.startswith("# plugrad_mydev/")}
  assert {"plugrad_mydev/plugin.py", "plugrad_mydev/device.py"} <= set(files), f"the doc's example blocks are {sorted(files)}"
  for name, code in files.items(): (d / name).write_text(code)
  return d


def _write_dist(root: pathlib.Path, name: str, module: str) -> pathlib.Path:
  d = root / f"plugrad-{name}"
  (d / f"plugrad_{name}").mkdir(parents=True)
  (d / "pyproject.toml").write_text(textwrap.dedent(f'''
    [build-system]
    requires = ["setuptools>=64"]
    build-backend = "setuptools.build_meta"

    [project]
    name = "plugrad-{name}"
    version = "0.1.0"
    requires-python = ">=3.11"

    [project.entry-points.plugrad]
    {name} = "plugrad_{name}.plugin"

    [tool.setuptools]
    packages = ["plugrad_{name}"]
  '''))
  (d / f"plugrad_{name}" / "__init__.py").write_text("")
  (d / f"plugrad_{name}" / "plugin.py").write_text(module)
  return d


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
  root = tmp_path_factory.mktemp("thirdparty")
  venv.EnvBuilder(system_site_packages=False, with_pip=True).create(root / "venv")
  py = root / "venv" / "bin" / "python"
  dists = [str(_write_dist(root / "src", n, m)) for n, m in PLUGINS.items()] + [str(_doc_example(root / "src"))]
  # as a stranger installs: plugrad from its own wheel, each plugin built in isolation; pytest for the conformance run
  env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}  # nothing of this interpreter's path leaks in
  proc = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(CORE), "pytest", *dists],
                        capture_output=True, text=True, cwd=root, timeout=900, env=env)
  assert proc.returncode == 0, f"pip install of plugrad and the test plugins failed:\n{proc.stdout}\n{proc.stderr}"
  where = _run(py, "-c", "import plugrad, plugrad_mydev; print(plugrad.__file__)").stdout
  assert str(CORE) not in where and "site-packages" in where, f"the venv must use its own plugrad, got {where}"
  return py


def _env(**extra: str) -> dict[str, str]:
  """The test process's environment without the plugrad/pytest settings the suite sets, plus `extra`."""
  drop = ("DEV", "PLUGRAD_PLUGINS", "PLUGRAD_NO_PLUGINS", "PLUGRAD_STRICT_PLUGINS", "PYTEST_", "PIP_")
  env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
  return {**env, **extra}


def _run(py: pathlib.Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
  return subprocess.run([str(py), *args], capture_output=True, text=True, env=_env(**env), timeout=300)


def test_installed_plugin_is_listed_as_active(venv_python: pathlib.Path):
  proc = _run(venv_python, "-m", "plugrad", "plugins", "--json")
  assert proc.returncode == 0, proc.stderr
  by = {p["name"]: p for p in json.loads(proc.stdout)["plugins"]}
  assert {k: by["thirdpy"][k] for k in ("distribution", "version", "api", "status", "devices")} == \
    {"distribution": "plugrad-thirdpy", "version": "0.1.0", "api": f"{API_VERSION[0]}.{API_VERSION[1]}", "status": "active", "devices": ["THIRDPY"]}
  assert by["builtin"]["status"] == "active"


def test_dev_selects_it_and_the_smoke_kernel_passes(venv_python: pathlib.Path):
  for env in ({"DEV": "THIRDPY"}, {"DEV": "thirdpy", "PLUGRAD_PLUGINS": "thirdpy", "PLUGRAD_STRICT_PLUGINS": "1"}):
    proc = _run(venv_python, "-m", "plugrad", "devices", "--json", "THIRDPY", "PYTHON", **env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = json.loads(proc.stdout)
    by = {d["device"]: d for d in rep["devices"]}
    assert rep["default"] == "THIRDPY" and by["THIRDPY"]["default"] is True
    assert (by["THIRDPY"]["smoke"], by["THIRDPY"]["computed"], by["THIRDPY"]["distribution"]) == ("PASS", True, "plugrad-thirdpy"), by["THIRDPY"]
    assert by["PYTHON"]["smoke"] == "PASS"
  text = _run(venv_python, "-m", "plugrad", "devices", "THIRDPY", DEV="PYTHON")
  assert text.returncode == 0 and "THIRDPY " in text.stdout and "PASS" in text.stdout and "default device: PYTHON (DEV=PYTHON)" in text.stdout
  # without DEV its priority (7) beats PYTHON's (0) (the allowlist keeps out plugins this machine may have, like plugrad-cpu)
  assert json.loads(_run(venv_python, "-m", "plugrad", "devices", "--json", "NULL", PLUGRAD_PLUGINS="thirdpy").stdout)["default"] == "THIRDPY"


def test_broken_plugin_leaves_everything_else_working(venv_python: pathlib.Path):
  code = textwrap.dedent("""
    import json, sys
    import plugrad
    from plugrad import Device
    from plugrad.device.smoke import run_smoke
    lazy = not any(m.startswith(("plugrad_brokenpy", "plugrad_thirdpy", "plugrad_futurepy")) for m in sys.modules)
    out = {"lazy": lazy, "python": run_smoke("PYTHON").verdict, "thirdpy": run_smoke("THIRDPY").verdict}
    for name in ("BROKENPY", "FUTUREPY"):
      try: Device[name]
      except Exception as e: out[name] = [type(e).__name__, str(e)]
    print(json.dumps(out))
  """)
  proc = _run(venv_python, "-W", "ignore", "-c", code)
  assert proc.returncode == 0, proc.stderr
  out = json.loads(proc.stdout)
  assert out["lazy"] and out["python"] == "PASS" and out["thirdpy"] == "PASS"
  kind, msg = out["BROKENPY"]
  assert kind == "PluginLoadError" and "plugrad-brokenpy 0.1.0" in msg and "brokenpy_driver_sdk" in msg and "pip install -U plugrad-brokenpy" in msg
  plugins = {p["name"]: p for p in json.loads(_run(venv_python, "-m", "plugrad", "plugins", "--json").stdout)["plugins"]}
  assert plugins["brokenpy"]["status"].startswith("failed: importing 'plugrad_brokenpy.plugin' raised ModuleNotFoundError")
  assert "brokenpy_driver_sdk" in plugins["brokenpy"]["status"]
  # PLUGRAD_STRICT_PLUGINS=1 turns the same failure into an error at first device use (but never at import)
  strict = _run(venv_python, "-c", "from plugrad import Device; Device['PYTHON']", PLUGRAD_STRICT_PLUGINS="1")
  assert strict.returncode != 0 and "PluginLoadError" in strict.stderr and "plugrad-brokenpy" in strict.stderr


def test_plugin_for_the_next_api_major_is_refused(venv_python: pathlib.Path):
  want = (f"plugrad-futurepy 0.1.0 was built for plugin API {API_VERSION[0] + 1}.0, this plugrad has {API_VERSION[0]}.{API_VERSION[1]}: "
          f"upgrade plugrad (pip install -U plugrad) or install a plugrad-futurepy built for API {API_VERSION[0]}.x")
  plugins = {p["name"]: p for p in json.loads(_run(venv_python, "-m", "plugrad", "plugins", "--json").stdout)["plugins"]}
  assert plugins["futurepy"]["status"] == f"failed: {want}"
  proc = _run(venv_python, "-m", "plugrad", "devices", "--json", "FUTUREPY")
  row = json.loads(proc.stdout)["devices"][0]
  assert proc.returncode == 1 and row["smoke"] == "FAIL" and row["detail"].startswith("PluginAPIVersionError") and want in row["detail"]


def test_the_documented_example_backend_works(venv_python: pathlib.Path):
  proc = _run(venv_python, "-m", "plugrad", "devices", "--json", "MY", DEV="my")  # by its alias
  rep = json.loads(proc.stdout)
  assert proc.returncode == 0 and rep["default"] == "MYDEV", proc.stdout + proc.stderr
  assert rep["devices"][0]["smoke"] == "PASS" and rep["devices"][0]["distribution"] == "plugrad-mydev"
  code = textwrap.dedent("""
    import json
    import numpy as np
    from plugrad import Tensor
    a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4), requires_grad=True)
    y = (((a @ a.T).relu().sum(1) + a.max()) * 0.01).exp().log() * 100
    y.sum().backward()
    print(json.dumps({"device": a.device, "y": y.numpy().tolist(), "grad": a.grad.numpy().tolist()}))
  """)
  proc = _run(venv_python, "-c", code, DEV="MYDEV")
  assert proc.returncode == 0, proc.stderr
  out, a = json.loads(proc.stdout), np.arange(12, dtype=np.float32).reshape(3, 4)
  assert out["device"] == "MYDEV"
  np.testing.assert_allclose(out["y"], np.maximum(a @ a.T, 0).sum(1) + a.max(), rtol=1e-5)
  np.testing.assert_allclose(out["grad"], np.tile(2 * a.sum(0), (3, 1)) + 3 * (a == a.max()), rtol=1e-5)


def _conformance_modules() -> list[pathlib.Path]:
  spec = importlib.util.find_spec("plugrad.testing")
  if spec is None or not spec.submodule_search_locations: return []
  return [p for loc in spec.submodule_search_locations for p in pathlib.Path(loc).rglob("*.py") if p.name != "__init__.py"]


@pytest.mark.skipif(not _conformance_modules(), reason="plugrad.testing has no conformance tests yet")
def test_conformance_suite_passes_on_the_third_party_device(venv_python: pathlib.Path, tmp_path: pathlib.Path):
  proc = subprocess.run([str(venv_python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pyargs", "plugrad.testing", "--plugrad-device=THIRDPY"],
                        capture_output=True, text=True, cwd=tmp_path, timeout=600,
                        env=_env(PLUGRAD_PLUGINS="thirdpy", PLUGRAD_STRICT_PLUGINS="1", PLUGRAD_CACHE_DIR=str(tmp_path / "cache")))
  if proc.returncode == 5: pytest.skip("plugrad.testing has no conformance tests yet (pytest collected none)")
  assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
