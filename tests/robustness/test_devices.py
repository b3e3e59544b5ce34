"""Devices never vanish silently (issue 22, item 3): a plugin whose probe raises takes away only its own device; a
default that falls back past a failed, conflicting or misconfigured plugin warns once naming the cause (an error under
PLUGRAD_STRICT_PLUGINS=1); `python -m plugrad plugins` shows conflicts as `conflict`; device indices are checked
against the count a plugin reports. In-process fake plugins, registered as tests/plugin/ does."""
from __future__ import annotations

import importlib.metadata
import json
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from plugrad.__main__ import main
from plugrad.device.registry import Device, DeviceRegistry
from plugrad.errors import (
  DeviceFallbackError,
  DeviceIndexError,
  DeviceUnavailableError,
  PluginConflictError,
  PluginHookError,
)
from plugrad.helpers import SettingsError
from plugrad.plugin import API_VERSION, DeviceSpec, device_name, hookimpl
from plugrad.plugin.manager import DeviceFallbackWarning, PluginManager, PluginWarning, get_manager
from tests.plugin.fakes import FakeEntryPoint, PyClone, manager


@pytest.fixture
def use_manager() -> Iterator[Callable[[PluginManager], None]]:
  """Make the process-wide `Device` use a given manager for one test, then restore the previous one."""
  before = get_manager()
  yield Device.reset
  Device.reset(before)


def boom() -> str | None: raise ZeroDivisionError("division by zero in the probe")


class Counted(PyClone):
  """A PyClone whose device reports `count` devices (an int or a callable)."""
  def __init__(self, name: str, count: Any, **kw: Any):
    super().__init__(name, **kw)
    self.count = count

  @hookimpl
  def plugrad_devices(self) -> list[DeviceSpec]:
    return [DeviceSpec(self.names[0], self.api, self.priority, self.probe, self.aliases, "counted clone", count=self.count)]


def registry(*plugins: object, **env: str) -> DeviceRegistry:
  eps = [FakeEntryPoint(f"p{i}", p, dist=f"plugrad-p{i}", version=f"0.{i}") for i, p in enumerate(plugins)]
  return DeviceRegistry(manager(*eps, **env))


def default_and_warnings(reg: DeviceRegistry) -> tuple[str, list[str]]:
  with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    default = reg.DEFAULT
  return default, [str(w.message) for w in seen if issubclass(w.category, DeviceFallbackWarning)]


# ---- a probe that raises takes away only its own device

def test_a_raising_probe_leaves_every_other_device():
  reg = registry(PyClone("ODD", priority=200, probe=boom), PyClone("GOOD", priority=50))
  default, warned = default_and_warnings(reg)
  assert default == "GOOD"  # was: PluginHookError from Device.DEFAULT for everyone
  assert len(warned) == 1 and "ODD" in warned[0] and "ZeroDivisionError" in warned[0] and "GOOD" in warned[0]
  assert reg.available() == ["GOOD", "PYTHON", "NULL"]
  assert reg["GOOD"].renderer is not None and reg["PYTHON"] is not None
  with pytest.raises(PluginHookError, match="the probe of device ODD .* raised ZeroDivisionError"): reg["ODD"]


@pytest.mark.parametrize("exc", [SystemExit(3), RuntimeError("driver exploded"), RecursionError("deep")])
def test_a_probe_raising_anything_but_ctrl_c_is_contained(exc: BaseException):
  def probe() -> str | None: raise exc
  reg = registry(PyClone("ODD", priority=200, probe=probe))
  assert default_and_warnings(reg)[0] == "PYTHON"
  with pytest.raises(PluginHookError, match=type(exc).__name__): reg["ODD"]


def test_ctrl_c_in_a_probe_is_not_swallowed():
  def probe() -> str | None: raise KeyboardInterrupt
  with pytest.raises(KeyboardInterrupt): _ = registry(PyClone("ODD", priority=200, probe=probe)).DEFAULT


def test_no_default_at_all_names_every_reason():
  eps = [FakeEntryPoint("p", PyClone("ODD", probe=boom)), FakeEntryPoint("q", PyClone("GONE", probe=lambda: "no driver"))]
  mgr = PluginManager(entry_points=lambda: eps, builtins=False, env={})
  with pytest.raises(DeviceUnavailableError, match="no device is available to be the default.*GONE: no driver.*ODD: .*ZeroDivisionError"):
    _ = DeviceRegistry(mgr).DEFAULT


def test_a_raising_probe_in_the_devices_listing(use_manager, capsys):
  use_manager(manager(FakeEntryPoint("c", PyClone("ODD", priority=200, probe=boom), dist="plugrad-c")))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", PluginWarning)
    rc = main(["devices", "--json"])
  rep = json.loads(capsys.readouterr().out)
  assert rep["default"] == "PYTHON" and rep["default_error"] is None
  by = {d["device"]: d for d in rep["devices"]}
  assert by["ODD"]["smoke"] == "FAIL" and "ZeroDivisionError" in by["ODD"]["detail"] and by["PYTHON"]["smoke"] == "PASS" and rc == 1


def test_strict_mode_makes_a_raising_probe_an_error_for_the_default():
  reg = registry(PyClone("ODD", priority=200, probe=boom), PyClone("GOOD", priority=50), PLUGRAD_STRICT_PLUGINS="1")
  with pytest.raises(DeviceFallbackError, match="PLUGRAD_STRICT_PLUGINS=1.*GOOD.*ODD.*ZeroDivisionError") as e: _ = reg.DEFAULT
  assert isinstance(e.value.__cause__, PluginHookError)
  assert reg["GOOD"] is not None  # only the default is refused; a device asked for by name still works


# ---- a component hook that raises for another plugin's device

class Meddler:
  """Declares no device; its renderer hook raises for every device (a buggy override or a plugin importing a driver)."""
  @hookimpl(tryfirst=True)
  def plugrad_renderer(self, device: str) -> Any: raise RuntimeError(f"meddler cannot render {device}")


def test_a_hook_raising_for_a_device_it_does_not_declare_is_skipped():
  reg = registry(PyClone("CLONE"), Meddler())
  why = "'p1'.*plugrad_renderer\\('CLONE'\\) raised RuntimeError: meddler cannot render CLONE; it does not declare CLONE"
  with pytest.warns(PluginWarning, match=why):
    r = reg["CLONE"].renderer
  assert type(r).__name__ == "PythonRenderer"
  strict = registry(PyClone("CLONE"), Meddler(), PLUGRAD_STRICT_PLUGINS="1")
  with pytest.raises(PluginHookError, match="meddler cannot render"): _ = strict["CLONE"].renderer


def test_a_hook_raising_for_its_own_device_is_still_an_error():
  class Broken(PyClone):
    @hookimpl
    def plugrad_renderer(self, device: str) -> Any:
      if device_name(device) == "BROKEN": raise RuntimeError("renderer exploded")
  with pytest.raises(PluginHookError, match="renderer exploded"): _ = registry(Broken("BROKEN"))["BROKEN"].renderer


# ---- a default that falls back warns once, naming the cause

def test_conflicting_plugins_fall_back_with_one_warning():
  reg = registry(PyClone("CPU", priority=100), PyClone("CPU", priority=100))
  default, warned = default_and_warnings(reg)
  assert default == "PYTHON" and len(warned) == 1
  assert "'CPU' is claimed by more than one plugin" in warned[0] and "plugrad-p0" in warned[0] and "plugrad-p1" in warned[0]
  assert default_and_warnings(reg) == ("PYTHON", [])  # once
  with pytest.raises(PluginConflictError): reg["CPU"]
  # strict: a conflict is already fatal at the first device use
  strict = registry(PyClone("CPU", priority=100), PyClone("CPU", priority=100), PLUGRAD_STRICT_PLUGINS="1")
  with pytest.raises(PluginConflictError): _ = strict.DEFAULT


def test_a_misconfigured_device_falls_back_with_a_warning_naming_the_setting():
  def probe() -> str | None: raise SettingsError("CC='gccc' names no program on PATH (a typo?)")
  reg = registry(PyClone("FAST", priority=100, probe=probe), PyClone("SLOWER", priority=50))
  default, warned = default_and_warnings(reg)
  assert default == "SLOWER" and len(warned) == 1 and "CC='gccc'" in warned[0]
  with pytest.raises(SettingsError, match="CC='gccc'"): reg["FAST"]  # a settings error, not a plugin bug
  assert "FAST" not in reg.available()
  with pytest.raises(SettingsError, match="CC='gccc'"): _ = registry(PyClone("FAST", priority=100, probe=probe), DEV="FAST").DEFAULT
  strict = registry(PyClone("FAST", priority=100, probe=probe), PyClone("SLOWER", priority=50), PLUGRAD_STRICT_PLUGINS="1")
  with pytest.raises(DeviceFallbackError, match="CC='gccc'"): _ = strict.DEFAULT


def test_a_failed_plugin_that_leaves_only_the_interpreter_warns():
  reg = registry(ImportError("No module named 'fastdev_sdk'"))
  default, warned = default_and_warnings(reg)
  assert default == "PYTHON" and len(warned) == 1 and "fastdev_sdk" in warned[0] and "reference interpreter" in warned[0]


def test_a_refused_plugin_with_a_higher_priority_warns():
  reg = registry(PyClone("NEWER", priority=200, api=(API_VERSION[0] + 1, 0)), PyClone("OK", priority=100))
  default, warned = default_and_warnings(reg)
  assert default == "OK" and len(warned) == 1 and "NEWER" in warned[0] and "plugin API" in warned[0]


def test_absent_hardware_is_not_a_fault():
  # a GPU plugin on a machine without the GPU: the CPU-like device is the expected default, in strict mode too
  reg = registry(PyClone("GPUX", priority=200, probe=lambda: "no GPUX driver"), PyClone("FAST", priority=100), PLUGRAD_STRICT_PLUGINS="1")
  assert default_and_warnings(reg) == ("FAST", [])


def test_absent_hardware_leaving_only_the_interpreter_warns():
  reg = registry(PyClone("FAST", priority=100, probe=lambda: "no C compiler found"))
  default, warned = default_and_warnings(reg)
  assert default == "PYTHON" and len(warned) == 1 and "FAST" in warned[0] and "no C compiler found" in warned[0]
  strict = registry(PyClone("FAST", priority=100, probe=lambda: "no C compiler found"), PLUGRAD_STRICT_PLUGINS="1")
  with pytest.raises(DeviceFallbackError, match="DEV=PYTHON"): _ = strict.DEFAULT
  assert registry(PyClone("FAST", priority=100, probe=lambda: "no C compiler found"), DEV="PYTHON", PLUGRAD_STRICT_PLUGINS="1").DEFAULT == "PYTHON"


def test_blocked_plugins_and_a_chosen_dev_never_warn():
  reg = registry(PyClone("FAST", priority=100), PLUGRAD_NO_PLUGINS="1")
  assert default_and_warnings(reg) == ("PYTHON", [])
  assert default_and_warnings(registry(PyClone("ODD", priority=200, probe=boom), DEV="python")) == ("PYTHON", [])


def _cpu_only_manager(**env: str) -> PluginManager:
  eps = [ep for ep in importlib.metadata.entry_points(group="plugrad") if ep.name == "cpu"]
  if not eps: pytest.skip("plugrad-cpu is not installed")
  return PluginManager(entry_points=lambda: eps, env=env)


def test_a_misspelled_cc_is_a_warning_naming_cc(monkeypatch: pytest.MonkeyPatch):
  monkeypatch.setenv("CC", "gccc-typo")
  reg = DeviceRegistry(_cpu_only_manager())
  default, warned = default_and_warnings(reg)
  assert default == "PYTHON" and len(warned) == 1 and "CC" in warned[0] and "gccc-typo" in warned[0]
  with pytest.raises(SettingsError, match="gccc-typo"): reg["CPU"]
  with pytest.raises(DeviceFallbackError, match="gccc-typo"): _ = DeviceRegistry(_cpu_only_manager(PLUGRAD_STRICT_PLUGINS="1")).DEFAULT


# ---- conflicts in `python -m plugrad plugins`

def test_plugins_lists_conflicts_as_conflict(use_manager, capsys):
  eps = (FakeEntryPoint("a", PyClone("TWIN", "SOLO"), dist="plugrad-a", version="1.0"),
         FakeEntryPoint("b", PyClone("TWIN"), dist="plugrad-b", version="2.0"), FakeEntryPoint("c", PyClone("OTHER"), dist="plugrad-c"))
  use_manager(manager(*eps))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", PluginWarning)
    rc = main(["plugins", "--json"])
  by = {p["name"]: p for p in json.loads(capsys.readouterr().out)["plugins"]}
  assert rc == 0 and by["c"]["status"] == "active" and by["builtin"]["status"] == "active"
  for n, other in (("a", "plugrad-b 2.0"), ("b", "plugrad-a 1.0")):
    assert by[n]["status"].startswith("conflict: ") and "TWIN" in by[n]["status"] and other in by[n]["status"], by[n]
  rc = main(["plugins"])
  out = capsys.readouterr().out
  assert rc == 0 and "conflict: " in out and "active" in out and "1 device name(s) claimed by more than one plugin" in out
  use_manager(manager(*eps, PLUGRAD_STRICT_PLUGINS="1"))
  assert main(["plugins"]) == 1 and "conflict" in capsys.readouterr().out


def test_a_conflicting_plugins_other_devices_stay_usable():
  mgr = manager(FakeEntryPoint("a", PyClone("TWIN", "SOLO"), dist="plugrad-a"), FakeEntryPoint("b", PyClone("TWIN"), dist="plugrad-b"))
  reg = DeviceRegistry(mgr)
  assert reg["SOLO"].renderer is not None and "SOLO" in reg.available() and "TWIN" in reg.known()
  mgr.register(PyClone("LATE"), "late")  # re-registering rebuilds the tables: the conflict stays a conflict
  with pytest.raises(PluginConflictError): reg["TWIN"]
  assert {r.name: r.status for r in mgr.records()} == {"builtin": "active", "a": "conflict", "b": "conflict", "late": "active"}


# ---- device indices against the count a plugin reports

def test_an_index_beyond_the_reported_count_is_refused():
  reg = registry(Counted("ONE", 1), Counted("TWO", lambda: 2))
  assert reg["ONE"].name == "ONE" and reg["one:0"].name == "ONE" and reg["TWO:1"].name == "TWO:1"
  with pytest.raises(DeviceIndexError, match="device ONE:7 does not exist here: plugin 'p0' \\(plugrad-p0 0.0\\) reports 1 ONE device \\(ONE\\)"):
    reg["ONE:7"]
  with pytest.raises(DeviceIndexError, match="reports 2 TWO devices \\(TWO to TWO:1\\)"): reg["TWO:2"]
  with pytest.raises(DeviceIndexError, match="DEV=ONE:7"): _ = registry(Counted("ONE", 1), DEV="ONE:7").DEFAULT
  with pytest.raises(DeviceIndexError): registry(Counted("ONE", 1)).DEFAULT = "ONE:1"
  assert registry(DEV="PYTHON:5").DEFAULT == "PYTHON:5"  # no count reported: any index (the built-ins are virtual)


def test_a_count_of_zero_makes_the_device_unavailable():
  reg = registry(Counted("NONE", lambda: 0, priority=200))
  assert default_and_warnings(reg)[0] == "PYTHON" and "NONE" not in reg.available()
  with pytest.raises(DeviceUnavailableError, match="reports no NONE devices"): reg["NONE"]


@pytest.mark.parametrize("count, why", [(lambda: 1 / 0, "raised ZeroDivisionError"), (lambda: "2", "returned str '2'"),
                                        (lambda: -1, "returned int -1")])
def test_a_misbehaving_count_is_a_plugin_error_for_that_device_only(count: Any, why: str):
  reg = registry(Counted("ODD", count, priority=200), PyClone("GOOD", priority=50))
  assert default_and_warnings(reg)[0] == "GOOD"
  with pytest.raises(PluginHookError, match=f"the device count of ODD .*{why}"): reg["ODD"]


@pytest.mark.parametrize("count", [-1, 1.5, True, "2"])
def test_device_spec_checks_count(count: Any):
  with pytest.raises((TypeError, ValueError), match="count"): DeviceSpec("VK", API_VERSION, count=count)


def test_device_spec_stays_backward_compatible():
  s = DeviceSpec("VK", (2, 0), 5, None, ("V",), "vulkan")  # positional, as a plugin written for API 2.0 builds it
  assert s.count is None and s.description == "vulkan"


def test_dev_cpu_7_is_refused_on_a_machine_with_one_cpu():
  reg = DeviceRegistry(_cpu_only_manager(DEV="CPU:7"))
  with pytest.raises(DeviceIndexError, match="DEV=CPU:7.*reports 1 CPU device"): _ = reg.DEFAULT
  with pytest.raises(DeviceIndexError): reg["CPU:1"]
  assert DeviceRegistry(_cpu_only_manager(DEV="cpu:0")).DEFAULT == "CPU"
