"""The plugin manager in-process: lazy loading, isolation, version checks, conflicts, allowlist, strict mode."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from plugrad.device.registry import DeviceRegistry
from plugrad.errors import PluginAPIVersionError, PluginConflictError, PluginLoadError, UnknownDeviceError
from plugrad.plugin import API_VERSION, DeviceSpec, hookimpl
from plugrad.plugin.manager import PluginManager, PluginWarning, normalize_dist
from tests.plugin.fakes import FakeEntryPoint, PyClone, manager

pytestmark = pytest.mark.filterwarnings("ignore::plugrad.plugin.manager.PluginWarning")


# ---- lazy loading

def test_import_plugrad_loads_no_plugin():
  code = """
import json, sys, importlib.metadata as md
calls = []
orig = md.entry_points
md.entry_points = lambda *a, **k: calls.append(1) or orig(*a, **k)
import plugrad, plugrad.plugin, plugrad.device.registry, plugrad.device.buffer, plugrad.device.runner
m = sys.modules["plugrad.plugin.manager"]
print(json.dumps({"entry_points_read": len(calls), "manager_loaded": m._manager is not None and m._manager.loaded,
                  "builtin_imported": "plugrad.builtin.plugin" in sys.modules}))
"""
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
  assert json.loads(out) == {"entry_points_read": 0, "manager_loaded": False, "builtin_imported": False}


def test_entry_points_read_on_first_use_and_once():
  reads: list[int] = []
  ep = FakeEntryPoint("clone", PyClone("CLONE"))
  mgr = PluginManager(entry_points=lambda: reads.append(1) or [ep], env={})
  reg = DeviceRegistry(mgr)
  assert not mgr.loaded and reads == [] and ep.loads == 0
  assert reg.canonicalize("clone") == "CLONE"
  assert mgr.loaded and reads == [1] and ep.loads == 1
  reg.known(), reg.available(), reg.plugins(), mgr.load()
  assert reads == [1] and ep.loads == 1


def test_builtins_register_through_the_hooks():
  mgr = manager()
  (rec,) = mgr.records()
  assert (rec.name, rec.distribution, rec.status, rec.devices, rec.api, rec.builtin) == \
    ("builtin", "plugrad", "active", ("PYTHON", "NULL"), f"{API_VERSION[0]}.{API_VERSION[1]}", True)
  assert mgr.entry("python").spec.priority == 0 and mgr.entry("NULL").spec.priority == -100


# ---- isolation

def test_import_failure_is_recorded_and_reraised_for_its_device():
  broken = FakeEntryPoint("vulkan", ModuleNotFoundError("No module named 'vk_sdk'"), dist="plugrad-vulkan", version="0.3")
  good = FakeEntryPoint("clone", PyClone("CLONE"), dist="plugrad-clone")
  mgr = manager(broken, good)
  with pytest.warns(PluginWarning, match="plugrad-vulkan 0.3"): mgr.load()
  rec = next(r for r in mgr.records() if r.name == "vulkan")
  assert (rec.distribution, rec.version, rec.status) == ("plugrad-vulkan", "0.3", "failed")
  assert rec.status_text.startswith("failed: importing 'plugrad_vulkan.plugin' raised ModuleNotFoundError: No module named 'vk_sdk'")
  assert "ModuleNotFoundError" in rec.traceback
  reg = DeviceRegistry(mgr)
  assert reg.canonicalize("CLONE") == "CLONE" and reg.canonicalize("python") == "PYTHON"  # everything else still works
  with pytest.raises(PluginLoadError) as e: reg["VULKAN"]
  msg = str(e.value)
  assert "device 'VULKAN' is unavailable" in msg and "plugrad-vulkan 0.3" in msg and "vk_sdk" in msg and "pip install -U plugrad-vulkan" in msg
  assert isinstance(e.value.__cause__, ModuleNotFoundError)


def test_failed_plugin_without_a_matching_name_is_mentioned_for_unknown_devices():
  mgr = manager(FakeEntryPoint("mystery", RuntimeError("boom"), dist="acme-accel"))
  with pytest.raises(UnknownDeviceError, match="'mystery' \\(acme-accel 0.1\\): importing .* RuntimeError: boom"): mgr.resolve("ACME")


def test_system_exit_at_import_is_contained():
  mgr = manager(FakeEntryPoint("quitter", SystemExit(3)))
  assert next(r for r in mgr.records() if r.name == "quitter").status == "failed"
  assert mgr.resolve("PYTHON") == "PYTHON"


class RaisingDevices:
  @hookimpl
  def plugrad_devices(self) -> list[DeviceSpec]: raise OSError("driver table unreadable")


class WrongDevices:
  def __init__(self, ret: object): self.ret = ret
  @hookimpl
  def plugrad_devices(self) -> object: return self.ret


@pytest.mark.parametrize("plugin, why", [
  (RaisingDevices(), "plugrad_devices\\(\\) raised OSError: driver table unreadable"),
  (WrongDevices({"name": "X"}), "plugrad_devices\\(\\) must return a list of plugrad.plugin.DeviceSpec, got dict"),
  (WrongDevices(["X"]), "must return a list of plugrad.plugin.DeviceSpec, got a list containing str"),
  (WrongDevices(None), "got NoneType None"),
])
def test_bad_plugrad_devices_fails_only_that_plugin(plugin: object, why: str):
  mgr = manager(FakeEntryPoint("bad", plugin, dist="plugrad-bad"), FakeEntryPoint("clone", PyClone("CLONE"), dist="plugrad-clone"))
  rec = next(r for r in mgr.records() if r.name == "bad")
  assert rec.status == "failed"
  assert __import__("re").search(why, rec.reason), rec.reason
  assert mgr.resolve("CLONE") == "CLONE"
  with pytest.raises(PluginLoadError, match="plugrad-bad"): mgr.resolve("BAD")


class NoHooks:
  def plugrad_devices(self) -> list[DeviceSpec]: return []  # forgot @hookimpl


class TypoHook:
  @hookimpl
  def plugrad_renderr(self, device: str) -> None: return None


class Wrapper:
  @hookimpl(wrapper=True)
  def plugrad_renderer(self, device: str) -> object: return (yield)


@pytest.mark.parametrize("plugin, why", [(NoHooks(), "defines no hook implementations"), (TypoHook(), "unknown hook 'plugrad_renderr'"),
                                         (Wrapper(), "hook wrapper")])
def test_malformed_plugin_modules_fail_to_load(plugin: object, why: str):
  mgr = manager(FakeEntryPoint("odd", plugin))
  rec = next(r for r in mgr.records() if r.name == "odd")
  assert rec.status == "failed" and why in rec.reason


def test_device_spec_is_validated():
  with pytest.raises(ValueError, match="upper-case identifier"): DeviceSpec("vulkan", API_VERSION)
  with pytest.raises(TypeError, match="api must be a \\(major, minor\\)"): DeviceSpec("VK", "1.0")  # type: ignore[arg-type]
  with pytest.raises(TypeError, match="priority must be an int"): DeviceSpec("VK", API_VERSION, priority=1.5)  # type: ignore[arg-type]
  with pytest.raises(TypeError, match="probe must be a callable"): DeviceSpec("VK", API_VERSION, probe="no")  # type: ignore[arg-type]
  with pytest.raises(ValueError, match="aliases"): DeviceSpec("VK", API_VERSION, aliases=["VULKAN"])  # type: ignore[arg-type]
  with pytest.raises(ValueError, match="its own name"): DeviceSpec("VK", API_VERSION, aliases=("VK",))


# ---- API versions

def test_newer_api_major_is_refused_with_the_upgrade_message():
  plugin = PyClone("FUTURE", api=(API_VERSION[0] + 1, 0))
  mgr = manager(FakeEntryPoint("future", plugin, dist="plugrad-foo", version="0.3"))
  reg = DeviceRegistry(mgr)
  with pytest.raises(PluginAPIVersionError) as e: reg["FUTURE"]
  want = (f"plugrad-foo 0.3 was built for plugin API {API_VERSION[0] + 1}.0, this plugrad has {API_VERSION[0]}.{API_VERSION[1]}: "
          f"upgrade plugrad (pip install -U plugrad) or install a plugrad-foo built for API {API_VERSION[0]}.x")
  assert want in str(e.value)
  assert next(r for r in mgr.records() if r.name == "future").status_text == f"failed: {want}"
  assert "FUTURE" in reg.known() and "FUTURE" not in reg.available()
  _ = reg["PYTHON"].renderer  # other devices' component hooks run, the refused plugin's never do
  assert plugin.calls == []


def test_newer_minor_and_older_major_are_refused():
  newer = manager(FakeEntryPoint("n", PyClone("NEWER", api=(API_VERSION[0], API_VERSION[1] + 1)), dist="plugrad-newer"))
  with pytest.raises(PluginAPIVersionError, match="upgrade plugrad \\(pip install -U plugrad\\)"): newer.resolve("NEWER")
  older = manager(FakeEntryPoint("o", PyClone("OLDER", api=(API_VERSION[0] - 1, 9)), dist="plugrad-older", version="0.0.1"))
  with pytest.raises(PluginAPIVersionError, match="upgrade plugrad-older \\(pip install -U plugrad-older\\)"): older.resolve("OLDER")


def test_same_major_older_minor_is_accepted():
  mgr = manager(FakeEntryPoint("c", PyClone("CLONE", api=(API_VERSION[0], 0))))
  assert mgr.resolve("CLONE") == "CLONE"


# ---- conflicts

def test_two_distributions_claiming_a_name_conflict():
  mgr = manager(FakeEntryPoint("a", PyClone("TWIN"), dist="plugrad-a", version="1.0"),
                FakeEntryPoint("b", PyClone("TWIN"), dist="plugrad-b", version="2.0"))
  with pytest.raises(PluginConflictError) as e: mgr.resolve("twin")
  assert "plugrad-a 1.0" in str(e.value) and "plugrad-b 2.0" in str(e.value) and "PLUGRAD_PLUGINS" in str(e.value)
  assert mgr.resolve("PYTHON") == "PYTHON" and "TWIN" in mgr.known() and "TWIN" not in mgr.available()


def test_alias_claiming_another_name_conflicts():
  mgr = manager(FakeEntryPoint("a", PyClone("GPU1", aliases=("GPU",)), dist="plugrad-a"), FakeEntryPoint("b", PyClone("GPU"), dist="plugrad-b"))
  with pytest.raises(PluginConflictError, match="as an alias of GPU1"): mgr.resolve("GPU")
  assert mgr.resolve("GPU1") == "GPU1"


def test_plugin_claiming_a_builtin_name_conflicts():
  mgr = manager(FakeEntryPoint("py", PyClone("PYTHON"), dist="plugrad-python-fork"))
  with pytest.raises(PluginConflictError, match="plugrad 0.*plugrad-python-fork|plugrad-python-fork.*plugrad "): mgr.resolve("PYTHON")
  assert mgr.resolve("NULL") == "NULL"


def test_allowlist_resolves_a_conflict():
  mgr = manager(FakeEntryPoint("a", PyClone("TWIN"), dist="plugrad-a"), FakeEntryPoint("b", PyClone("TWIN"), dist="plugrad-b"), PLUGRAD_PLUGINS="b")
  assert mgr.entry("TWIN").plugin.distribution == "plugrad-b"


# ---- allowlist and no-plugins

def test_allowlist_by_entry_point_or_distribution_name():
  a, b, c = (FakeEntryPoint("a", PyClone("DEVA"), dist="plugrad-a"), FakeEntryPoint("b", PyClone("DEVB"), dist="Plugrad_B"),
             FakeEntryPoint("c", PyClone("DEVC"), dist="plugrad-c"))
  mgr = manager(a, b, c, PLUGRAD_PLUGINS=" a , plugrad-b ")
  status = {r.name: r.status for r in mgr.records()}
  assert status == {"builtin": "active", "a": "active", "b": "active", "c": "blocked"}
  assert c.loads == 0  # a blocked plugin is never imported
  assert "not in PLUGRAD_PLUGINS" in next(r for r in mgr.records() if r.name == "c").reason
  with pytest.raises(UnknownDeviceError, match="blocked"): mgr.resolve("C")
  assert normalize_dist("Plugrad_B") == "plugrad-b"


def test_allowlist_naming_nothing_installed_warns():
  with pytest.warns(PluginWarning, match="match no installed plugin"): manager(PLUGRAD_PLUGINS="nosuch").load()


def test_no_plugins_loads_only_the_builtins():
  ep = FakeEntryPoint("a", PyClone("DEVA"))
  mgr = manager(ep, PLUGRAD_NO_PLUGINS="1")
  assert [(r.name, r.status) for r in mgr.records()] == [("builtin", "active"), ("a", "blocked")] and ep.loads == 0
  assert mgr.known() == ["NULL", "PYTHON"]


def test_malformed_flags_are_rejected():
  with pytest.raises(ValueError, match="PLUGRAD_NO_PLUGINS must be 0 or 1, got 'yes'"): manager(PLUGRAD_NO_PLUGINS="yes").load()


# ---- strict mode

def test_strict_mode_makes_a_failure_fatal_at_first_use():
  eps = (FakeEntryPoint("broken", ImportError("no driver"), dist="plugrad-broken"), FakeEntryPoint("clone", PyClone("CLONE")))
  mgr = manager(*eps, PLUGRAD_STRICT_PLUGINS="1")
  with pytest.raises(PluginLoadError, match="plugrad-broken"): mgr.resolve("PYTHON")
  with pytest.raises(PluginLoadError, match="plugrad-broken"): mgr.resolve("CLONE")  # and at every later use
  assert {r.name: r.status for r in mgr.records()} == {"builtin": "active", "broken": "failed", "clone": "active"}


def test_strict_mode_reports_every_problem():
  eps = (FakeEntryPoint("broken", ImportError("no driver"), dist="plugrad-broken"), FakeEntryPoint("a", PyClone("TWIN"), dist="plugrad-a"),
         FakeEntryPoint("b", PyClone("TWIN"), dist="plugrad-b"))
  with pytest.raises(PluginLoadError, match="2 plugin problems") as e: manager(*eps, PLUGRAD_STRICT_PLUGINS="1").load()
  assert "plugrad-broken" in str(e.value) and "'TWIN' is claimed" in str(e.value)


def test_strict_mode_single_version_problem_keeps_its_type():
  with pytest.raises(PluginAPIVersionError):
    manager(FakeEntryPoint("f", PyClone("F", api=(API_VERSION[0] + 1, 0))), PLUGRAD_STRICT_PLUGINS="1").load()


def test_strict_mode_with_a_clean_install_loads():
  mgr = manager(FakeEntryPoint("clone", PyClone("CLONE")), PLUGRAD_STRICT_PLUGINS="1")
  assert mgr.known() == ["CLONE", "NULL", "PYTHON"]


def test_register_directly():
  mgr = manager()
  rec = mgr.register(PyClone("EMBED"), "embed", "my-app", "2.1")
  assert rec.status == "active" and mgr.resolve("embed") == "EMBED" and mgr.entry("EMBED").plugin.label == "my-app 2.1"
