"""The third-party path, end to end: real distributions built with setuptools and installed with pip into a fresh venv.

The venv is made with `--system-site-packages` to save time: plugrad itself is installed (editable) in the system
site-packages, so the venv sees it, while the throwaway plugins go only into the venv. Three distributions:

* plugrad-thirdpy: a working device THIRDPY that reuses the PYTHON device's components (priority 7);
* plugrad-brokenpy: raises at import (it needs a driver module that does not exist);
* plugrad-futurepy: built for the next plugin API major version;
* plugrad-mydev: the minimal plugin of docs/writing-a-backend.md, copied from the page as a reader would.

Building a setuptools wheel needs `wheel` (or setuptools >= 70.1); the dev extras install it.
"""
from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import textwrap
import venv

import pytest

from plugrad.plugin import API_VERSION

pytestmark = pytest.mark.slow

API = f"({API_VERSION[0]}, {API_VERSION[1]})"  # what these plugins are "built for": a literal, as a real plugin writes it

PLUGINS: dict[str, str] = {
  "thirdpy": f'''
from plugrad.plugin import DeviceSpec, device_name, hookimpl

@hookimpl
def plugrad_devices():
  return [DeviceSpec("THIRDPY", api={API}, priority=7, description="a third-party device on the PYTHON interpreter")]

@hookimpl
def plugrad_renderer(device):
  if device_name(device) != "THIRDPY": return None
  from plugrad.renderer.python import PythonRenderer
  return PythonRenderer(device)

@hookimpl
def plugrad_compiler(device, renderer):
  if device_name(device) != "THIRDPY": return None
  from plugrad.device.interpreter import PythonCompiler
  return PythonCompiler()

@hookimpl
def plugrad_allocator(device):
  if device_name(device) != "THIRDPY": return None
  from plugrad.device.interpreter import PythonAllocator
  return PythonAllocator(device)

@hookimpl
def plugrad_runtime(device):
  if device_name(device) != "THIRDPY": return None
  from plugrad.device.interpreter import PythonRuntime
  return PythonRuntime(device)
''',
  "brokenpy": '''
import brokenpy_driver_sdk  # not installed: importing this plugin fails
''',
  "futurepy": f'''
from plugrad.plugin import DeviceSpec, hookimpl

@hookimpl
def plugrad_devices():
  return [DeviceSpec("FUTUREPY", api=({API_VERSION[0] + 1}, 0))]

@hookimpl
def plugrad_renderer(device):
  raise RuntimeError("a refused plugin's component hooks must never be called")
''',
}


DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "writing-a-backend.md"


def _doc_example(root: pathlib.Path) -> pathlib.Path:
  """The distribution shown in the "A complete minimal plugin" section of the doc, from its first toml and python blocks."""
  section = DOC.read_text().split("## A complete minimal plugin", 1)[1].split("\n## ", 1)[0]
  toml, py = (section.split(f"```{lang}\n", 1)[1].split("```", 1)[0] for lang in ("toml", "python"))
  d = root / "plugrad-mydev"
  (d / "plugrad_mydev").mkdir(parents=True)
  (d / "pyproject.toml").write_text(toml)
  (d / "plugrad_mydev" / "__init__.py").write_text("")
  (d / "plugrad_mydev" / "plugin.py").write_text(py)
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
  import setuptools
  if importlib.util.find_spec("wheel") is None and tuple(int(x) for x in setuptools.__version__.split(".")[:2]) < (70, 1):
    pytest.fail("building the test plugins needs the 'wheel' package or setuptools >= 70.1: pip install -e './core[dev]'")
  root = tmp_path_factory.mktemp("thirdparty")
  venv.EnvBuilder(system_site_packages=True, with_pip=False).create(root / "venv")
  py = root / "venv" / "bin" / "python"
  dists = [str(_write_dist(root / "src", n, m)) for n, m in PLUGINS.items()] + [str(_doc_example(root / "src"))]
  # pip comes from the system site-packages (the venv has none of its own, which is faster to create)
  proc = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps", "--disable-pip-version-check", *dists],
                        capture_output=True, text=True, env=_env(), cwd=root)
  assert proc.returncode == 0, f"pip install of the test plugins failed:\n{proc.stdout}\n{proc.stderr}"
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
    import plugrad, plugrad.device.registry
    from plugrad.device.registry import Device
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
  strict = _run(venv_python, "-c", "import plugrad.device.registry as r; r.Device['PYTHON']", PLUGRAD_STRICT_PLUGINS="1")
  assert strict.returncode != 0 and "PluginLoadError" in strict.stderr and "plugrad-brokenpy" in strict.stderr


def test_plugin_for_the_next_api_major_is_refused(venv_python: pathlib.Path):
  want = (f"plugrad-futurepy 0.1.0 was built for plugin API {API_VERSION[0] + 1}.0, this plugrad has {API_VERSION[0]}.{API_VERSION[1]}: "
          f"upgrade plugrad (pip install -U plugrad) or install a plugrad-futurepy built for API {API_VERSION[0]}.x")
  plugins = {p["name"]: p for p in json.loads(_run(venv_python, "-m", "plugrad", "plugins", "--json").stdout)["plugins"]}
  assert plugins["futurepy"]["status"] == f"failed: {want}"
  proc = _run(venv_python, "-m", "plugrad", "devices", "--json", "FUTUREPY")
  row = json.loads(proc.stdout)["devices"][0]
  assert proc.returncode == 1 and row["smoke"] == "FAIL" and row["detail"].startswith("PluginAPIVersionError") and want in row["detail"]


def test_the_documented_example_plugin_works(venv_python: pathlib.Path):
  proc = _run(venv_python, "-m", "plugrad", "devices", "--json", "MY", DEV="my")  # by its alias
  rep = json.loads(proc.stdout)
  assert proc.returncode == 0 and rep["default"] == "MYDEV", proc.stdout + proc.stderr
  assert rep["devices"][0]["smoke"] == "PASS" and rep["devices"][0]["distribution"] == "plugrad-mydev"


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
