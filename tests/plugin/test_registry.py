"""`Device`: device strings, the default device, lazily composed and type-checked components, probes."""
from __future__ import annotations

import pytest

from plugrad.device.registry import CompiledDevice, Device, DeviceRegistry
from plugrad.errors import (
  DeviceUnavailableError,
  InvalidDeviceStringError,
  PluginHookError,
  UnknownDeviceError,
)
from plugrad.plugin import hookimpl
from plugrad.plugin.manager import FIRST_PARTY, get_manager
from tests.plugin.fakes import FakeEntryPoint, Override, PyClone, manager

pytestmark = pytest.mark.filterwarnings("ignore::plugrad.plugin.manager.PluginWarning")


def registry(*plugins: PyClone | object, **env: str) -> DeviceRegistry:
  eps = [FakeEntryPoint(f"p{i}", p, dist=f"plugrad-p{i}", version=f"0.{i}") for i, p in enumerate(plugins)]
  return DeviceRegistry(manager(*eps, **env))


# ---- device strings

@pytest.mark.parametrize("given, canon", [("python", "PYTHON"), ("PYTHON:0", "PYTHON"), ("python:1", "PYTHON:1"), ("Null:12", "NULL:12"),
                                          ("clone", "CLONE"), ("cl:2", "CLONE:2"), ("CL", "CLONE")])
def test_canonicalize(given: str, canon: str):
  assert registry(PyClone("CLONE", aliases=("CL",))).canonicalize(given) == canon


@pytest.mark.parametrize("bad", ["CPU:x", ":1", "", "CPU:", "CPU:-1", "CPU:1:2", " CPU", "9PU", "CP U", None, 3, ("CPU",)])
def test_malformed_device_strings(bad: object):
  with pytest.raises(InvalidDeviceStringError): registry().canonicalize(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(FIRST_PARTY))
def test_unknown_first_party_device_says_what_to_install(name: str):
  with pytest.raises(UnknownDeviceError) as e: registry()[name.lower() + ":1"]
  assert f"pip install {FIRST_PARTY[name]}" in str(e.value) and "Known devices: NULL, PYTHON" in str(e.value)


def test_unknown_device_suggests_a_close_name():
  with pytest.raises(UnknownDeviceError, match="Did you mean 'PYTHON'"): registry()["PYTHN"]
  with pytest.raises(KeyError): registry()["VULKAN"]  # UnknownDeviceError is a KeyError, as a registry lookup should raise


# ---- composed devices

def test_device_is_cached_and_components_are_lazy():
  clone = PyClone("CLONE")
  reg = registry(clone)
  dev = reg["clone"]
  assert isinstance(dev, CompiledDevice) and dev is reg["CLONE:0"] and dev is not reg["CLONE:1"]
  assert (dev.name, dev.distribution, dev.plugin_version, dev.spec.name) == ("CLONE", "plugrad-p0", "0.0", "CLONE")
  assert clone.calls == []  # nothing built yet
  assert dev.allocator is dev.allocator and clone.calls == [("allocator", "CLONE")]
  _ = dev.compiler  # the compiler hook gets the renderer, so it is built first
  assert [c[0] for c in clone.calls] == ["allocator", "renderer", "compiler"]
  assert reg["CLONE:1"].renderer.device == "CLONE:1"
  assert dev.graph is None  # no plugin offers a graph runner: allowed
  dev.synchronize()


class WrongTypes:
  """Declares BADDEV and returns objects of the wrong type from its component hooks."""
  @hookimpl
  def plugrad_devices(self) -> list:
    from plugrad.plugin import API_VERSION, DeviceSpec
    return [DeviceSpec("BADDEV", API_VERSION)]
  @hookimpl
  def plugrad_renderer(self, device: str) -> object: return "not a renderer" if device.startswith("BADDEV") else None
  @hookimpl
  def plugrad_runtime(self, device: str) -> object:
    if device.startswith("BADDEV"): raise RuntimeError("driver exploded")
    return None
  @hookimpl
  def plugrad_graph(self, device: str) -> object: return object() if device.startswith("BADDEV") else None


def test_wrong_type_from_a_hook_names_hook_device_and_distribution():
  dev = registry(WrongTypes())["BADDEV:1"]
  with pytest.raises(PluginHookError) as e: _ = dev.renderer
  msg = str(e.value)
  assert "plugrad_renderer('BADDEV:1')" in msg and "plugrad-p0 0.0" in msg and "builtins.str" in msg and "plugrad.renderer.base.Renderer" in msg
  with pytest.raises(PluginHookError, match="every plugrad_allocator\\('BADDEV:1'\\) returned None .* must implement plugrad_allocator"):
    _ = dev.allocator
  with pytest.raises(PluginHookError, match="plugrad_runtime\\('BADDEV:1'\\) in plugin 'p0' \\(plugrad-p0 0.0\\) raised RuntimeError: driver"):
    _ = dev.runtime
  with pytest.raises(PluginHookError, match="GraphRunner subclass \\(the class itself\\)"): _ = dev.graph
  with pytest.raises(PluginHookError): _ = dev.renderer  # a failed component is not cached as None: it raises again


def test_tryfirst_overrides_one_component_of_another_plugins_device():
  from plugrad.builtin.python_renderer import PythonRenderer

  class LoudRenderer(PythonRenderer):
    pass
  clone = PyClone("CLONE")
  reg = registry(clone, Override("CLONE", LoudRenderer))
  dev = reg["CLONE"]
  assert type(dev.renderer) is LoudRenderer and type(reg["PYTHON"].renderer) is PythonRenderer
  assert ("renderer", "CLONE") not in clone.calls  # the firstresult hook stopped at the override


# ---- probes

def test_probe_reason_is_raised_when_the_device_is_used():
  reg = registry(PyClone("GPUX", priority=200, probe=lambda: "no GPUX driver found (install gpux-driver)"))
  assert reg.available() == ["PYTHON", "NULL"] and "GPUX" in reg.known()
  with pytest.raises(DeviceUnavailableError, match="device GPUX:1 is unavailable here: no GPUX driver found \\(install gpux-driver\\)"): reg["gpux:1"]
  assert reg.DEFAULT == "PYTHON"  # an unavailable device is passed over when nothing selects it


@pytest.mark.parametrize("probe, why", [(lambda: 1 / 0, "raised ZeroDivisionError"),
                                         (lambda: 42, "returned int 42; expected None or a reason string")])
def test_a_probe_that_misbehaves_is_a_plugin_error(probe: object, why: str):
  reg = registry(PyClone("ODD", probe=probe))  # type: ignore[arg-type]
  with pytest.raises(PluginHookError, match=why): reg["ODD"]
  assert "ODD" not in reg.available()
  strict = registry(PyClone("ODD", probe=probe), PLUGRAD_STRICT_PLUGINS="1")  # type: ignore[arg-type]
  with pytest.raises(PluginHookError, match=why): strict.available()


# ---- the default device

def test_default_is_the_highest_priority_available_device():
  reg = registry(PyClone("LOW", priority=5), PyClone("HIGH", priority=50), PyClone("NEG", priority=-1))
  assert reg.DEFAULT == "HIGH" and reg.available() == ["HIGH", "LOW", "PYTHON", "NEG", "NULL"]


def test_negative_priority_is_never_the_default():
  reg = DeviceRegistry(manager(builtins=True))
  assert reg.DEFAULT == "PYTHON"
  assert DeviceRegistry(manager(FakeEntryPoint("p", PyClone("NEG", priority=-1)), DEV="NULL")).DEFAULT == "NULL"


@pytest.mark.parametrize("dev, want", [("low", "LOW"), ("LOW:3", "LOW:3"), ("null", "NULL"), ("python:1", "PYTHON:1")])
def test_dev_selects_the_default(dev: str, want: str):
  assert registry(PyClone("LOW", priority=5), PyClone("HIGH", priority=50), DEV=dev).DEFAULT == want


def test_dev_errors_never_fall_back():
  with pytest.raises(UnknownDeviceError, match="DEV='CUDA': .*pip install plugrad-cuda"): _ = registry(DEV="CUDA").DEFAULT
  with pytest.raises(InvalidDeviceStringError, match="DEV='CPU:x'"): _ = registry(DEV="CPU:x").DEFAULT
  reg = registry(PyClone("GPUX", probe=lambda: "no GPUX driver"), DEV="GPUX")
  with pytest.raises(DeviceUnavailableError, match="DEV=GPUX selects GPUX, which is unavailable here: no GPUX driver.*not run on another device"):
    _ = reg.DEFAULT


def test_default_can_be_set():
  reg = registry(PyClone("GPUX", probe=lambda: "no GPUX driver"))
  reg.DEFAULT = "null:2"
  assert reg.DEFAULT == "NULL:2"
  with pytest.raises(DeviceUnavailableError): reg.DEFAULT = "GPUX"
  with pytest.raises(UnknownDeviceError): reg.DEFAULT = "NOPE"
  assert reg.DEFAULT == "NULL:2"


def test_reset_rereads_the_environment():
  mgr = manager(DEV="NULL")
  reg = DeviceRegistry(mgr)
  assert reg.DEFAULT == "NULL"
  reg.reset(manager(DEV="PYTHON"))
  assert reg.DEFAULT == "PYTHON"


def test_process_wide_device_follows_the_process_wide_manager():
  before = get_manager()
  try:
    Device.reset(manager(FakeEntryPoint("c", PyClone("CLONE"))))
    assert "CLONE" in Device.known() and Device["clone"].distribution == "plugrad-fake"
    assert [r.name for r in Device.plugins()] == ["builtin", "c"]
  finally: Device.reset(before)
  assert "CLONE" not in Device.known()
