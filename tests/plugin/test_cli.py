"""`python -m plugrad plugins|devices`, run in-process on a controlled set of plugins."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from plugrad.__main__ import main
from plugrad.plugin import API_VERSION
from tests.plugin.fakes import FakeEntryPoint, PyClone, manager

API = f"{API_VERSION[0]}.{API_VERSION[1]}"
pytestmark = pytest.mark.filterwarnings("ignore::plugrad.plugin.manager.PluginWarning")


def plugin_set(**env: str):
  return manager(FakeEntryPoint("clone", PyClone("CLONE", priority=-1), dist="plugrad-clone", version="1.2"),
                 FakeEntryPoint("broken", ImportError("No module named 'gpu_sdk'"), dist="plugrad-broken", version="0.9"),
                 FakeEntryPoint("gpux", PyClone("GPUX", priority=200, probe=lambda: "no GPUX driver (install gpux-driver)"), dist="plugrad-gpux"),
                 **env)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
  rc = main(list(argv))
  out, err = capsys.readouterr()
  return rc, out, err


def test_plugins_json(use_manager, capsys):
  use_manager(plugin_set(PLUGRAD_PLUGINS="clone,broken,builtin"))
  rc, out, _ = run(capsys, "plugins", "--json")
  rep = json.loads(out)
  assert rc == 0 and rep["api"] == API and rep["strict"] is False
  by = {p["name"]: p for p in rep["plugins"]}
  assert {k: by["clone"][k] for k in ("distribution", "version", "api", "status", "devices")} == \
    {"distribution": "plugrad-clone", "version": "1.2", "api": API, "status": "active", "devices": ["CLONE"]}
  assert by["broken"]["status"].startswith("failed: importing 'plugrad_broken.plugin' raised ImportError: No module named 'gpu_sdk'")
  assert "ImportError" in by["broken"]["traceback"]
  assert by["gpux"]["status"] == "blocked" and by["gpux"]["devices"] == []
  assert by["builtin"]["devices"] == ["PYTHON", "NULL"]


def test_plugins_table_and_strict_exit_status(use_manager, capsys):
  use_manager(plugin_set())
  rc, out, _ = run(capsys, "plugins")
  assert rc == 0 and "plugrad-clone" in out and "failed: importing" in out and "1 plugin(s) failed" in out
  use_manager(plugin_set(PLUGRAD_STRICT_PLUGINS="1"))
  rc, out, _ = run(capsys, "plugins")
  assert rc == 1 and "failed: importing" in out


def test_plugins_tell_absent_hardware_from_active(use_manager, capsys):
  two = PyClone("GPUY", "GPUZ", probe=lambda: "no GPUY driver")
  use_manager(manager(FakeEntryPoint("gpux", PyClone("GPUX", probe=lambda: "no GPUX driver (install gpux-driver)"), dist="plugrad-gpux"),
                      FakeEntryPoint("half", PyClone("HERE"), dist="plugrad-half"), FakeEntryPoint("two", two, dist="plugrad-two")))
  rc, out, _ = run(capsys, "plugins")
  rows = {ln.split()[0]: ln for ln in out.splitlines()[2:] if ln.strip()}
  assert rc == 0 and rows["gpux"].endswith("unavailable here: no GPUX driver (install gpux-driver)") and "active" not in rows["gpux"]
  assert rows["two"].endswith("unavailable here: no GPUY driver") and rows["half"].endswith("active") and rows["builtin"].endswith("active")
  rc, out, _ = run(capsys, "plugins", "--json")
  by = {p["name"]: p for p in json.loads(out)["plugins"]}
  assert by["gpux"]["status"] == "active" and by["gpux"]["unavailable"] == {"GPUX": "no GPUX driver (install gpux-driver)"}
  assert by["half"]["unavailable"] == {}


def test_devices_json(use_manager, capsys):
  use_manager(plugin_set(DEV="clone"))
  rc, out, _ = run(capsys, "devices", "--json")
  rep = json.loads(out)
  by = {d["device"]: d for d in rep["devices"]}
  assert rc == 0 and rep["default"] == "CLONE" and by["CLONE"]["default"] is True
  assert [d["device"] for d in rep["devices"]] == ["GPUX", "PYTHON", "CLONE", "NULL"]  # by priority
  assert by["PYTHON"]["smoke"] == "PASS" and by["PYTHON"]["computed"] is True and by["CLONE"]["smoke"] == "PASS"
  assert by["NULL"]["smoke"] == "PASS" and by["NULL"]["computed"] is False and "computes nothing" in by["NULL"]["detail"]
  # absent here is not broken: its own word, not FAIL, and no failing exit status when it was not named
  assert by["GPUX"]["smoke"] == "UNAVAILABLE" and by["GPUX"]["available"] is False and by["GPUX"]["probe"] == "no GPUX driver (install gpux-driver)"
  assert by["GPUX"]["detail"] == "unavailable here: no GPUX driver (install gpux-driver)"


def test_devices_table_and_exit_status(use_manager, capsys):
  use_manager(plugin_set())
  rc, out, _ = run(capsys, "devices", "python")
  assert rc == 0 and "PYTHON*" in out and "PASS" in out and "default device: PYTHON (highest-priority available device)" in out
  rc, out, _ = run(capsys, "devices", "GPUX")  # a device named explicitly must pass
  assert rc == 1 and "UNAVAILABLE" in out and "FAIL" not in out and "unavailable here: no GPUX driver" in out
  rc, _, err = run(capsys, "devices", "CUDA")
  assert rc == 2 and "pip install plugrad-cuda" in err


def test_devices_report_a_conflict_and_a_raising_probe(use_manager, capsys):
  use_manager(manager(FakeEntryPoint("a", PyClone("TWIN"), dist="plugrad-a"), FakeEntryPoint("b", PyClone("TWIN"), dist="plugrad-b"),
                      FakeEntryPoint("c", PyClone("ODD", probe=lambda: 1 / 0), dist="plugrad-c")))
  rc, out, _ = run(capsys, "devices", "--json")
  by = {d["device"]: d for d in json.loads(out)["devices"]}
  assert rc == 1 and by["TWIN"]["smoke"] == "FAIL" and "PluginConflictError" in by["TWIN"]["detail"] and "plugrad-a" in by["TWIN"]["detail"]
  assert by["ODD"]["smoke"] == "FAIL" and "PluginHookError" in by["ODD"]["detail"] and "ZeroDivisionError" in by["ODD"]["detail"]
  assert by["PYTHON"]["smoke"] == "PASS"


def test_devices_strict_failure_is_reported(use_manager, capsys):
  use_manager(plugin_set(PLUGRAD_STRICT_PLUGINS="1"))
  rc, _, err = run(capsys, "devices")
  assert rc == 1 and "PluginLoadError" in err and "plugrad-broken" in err


def test_cli_entry_point_runs():
  proc = subprocess.run([sys.executable, "-m", "plugrad", "devices", "--json", "PYTHON"], capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr
  assert json.loads(proc.stdout)["devices"][0]["smoke"] == "PASS"
  bad = subprocess.run([sys.executable, "-m", "plugrad"], capture_output=True, text=True)
  assert bad.returncode == 2 and "plugins" in bad.stderr
