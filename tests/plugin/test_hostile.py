"""Hostile plugins: ones that never answer (at import, in `plugrad_devices()`, in a probe or a device count) and ones
whose component hooks return the wrong type for every device. Each takes away only its own devices: the import, the
declaration and the probes run under PLUGRAD_PROBE_TIMEOUT, and a wrong result from a plugin that does not declare the
device is skipped like a raise. The blocking calls wait on an event that each test sets at its end, so no thread is
left behind; the end-to-end test installs a hostile distribution the way pip would (package and .dist-info on the path)."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from plugrad.device.registry import DeviceRegistry
from plugrad.device.smoke import run_smoke
from plugrad.errors import DeviceUnavailableError, PluginHookError, PluginTimeoutError
from plugrad.helpers import SettingsError
from plugrad.plugin import API_VERSION, DeviceSpec, hookimpl
from plugrad.plugin.manager import PluginManager, PluginWarning
from tests.plugin.fakes import FakeEntryPoint, PyClone, manager

pytestmark = pytest.mark.filterwarnings("ignore::plugrad.plugin.manager.PluginWarning")
T = "0.3"  # PLUGRAD_PROBE_TIMEOUT in these tests: the blocking calls never return before their test ends


@pytest.fixture
def gate() -> Iterator[threading.Event]:
  ev = threading.Event()
  yield ev
  ev.set()  # lets the abandoned plugin threads finish


class HangingEntryPoint(FakeEntryPoint):
  """An entry point whose import never returns (until the test's gate opens)."""
  def __init__(self, name: str, gate: threading.Event, **kw: Any):
    super().__init__(name, None, **kw)
    self.gate = gate

  def load(self) -> Any:
    self.loads += 1
    self.gate.wait()
    return None


class HangingDevices:
  """A plugin whose plugrad_devices() never returns."""
  def __init__(self, gate: threading.Event): self.gate = gate
  @hookimpl
  def plugrad_devices(self) -> list[DeviceSpec]:
    self.gate.wait()
    return []


class WrongEverywhere(PyClone):
  """Declares ODD, and its tryfirst component hooks return a dict for every device (ODD's own included)."""
  @hookimpl(tryfirst=True)
  def plugrad_renderer(self, device: str) -> Any: return {"device": device}
  @hookimpl(tryfirst=True)
  def plugrad_graph(self, device: str) -> Any: return {"graph": device}


def reg_of(*eps: FakeEntryPoint, **env: str) -> DeviceRegistry:
  return DeviceRegistry(PluginManager(entry_points=lambda: list(eps), env={"PLUGRAD_PROBE_TIMEOUT": T, **env}))


def runs(use: Callable[[PluginManager], None], reg: DeviceRegistry, device: str) -> None:
  """The smoke kernel on `device` through its real components, with `reg`'s manager as the process-wide one."""
  use(reg.manager)
  res = run_smoke(device)
  assert res.passed and (res.computed or device == "NULL"), res.detail  # NULL computes nothing by design


def test_import_that_never_returns_fails_only_its_plugin(gate):
  hang = HangingEntryPoint("hang", gate, dist="plugrad-hang")
  reg = reg_of(hang, FakeEntryPoint("good", PyClone("GOOD"), dist="plugrad-good"), DEV="GOOD")
  assert reg.DEFAULT == "GOOD" and reg.available() == ["GOOD", "PYTHON", "NULL"]
  rec = next(r for r in reg.plugins() if r.name == "hang")
  assert rec.status == "failed" and rec.error_type is PluginTimeoutError
  assert rec.reason == "importing 'plugrad_hang.plugin' did not answer in 0.3 s (PLUGRAD_PROBE_TIMEOUT)"
  with pytest.raises(PluginTimeoutError, match="plugin 'hang' \\(plugrad-hang 0.1\\) timed out: importing .* did not answer in 0.3 s"):
    reg["HANG"]
  assert hang.loads == 1  # never tried again


def test_plugrad_devices_that_never_returns_fails_only_its_plugin(gate, use_manager):
  reg = reg_of(FakeEntryPoint("slow", HangingDevices(gate), dist="plugrad-slow"), FakeEntryPoint("good", PyClone("GOOD"), dist="plugrad-good"))
  rec = next(r for r in reg.plugins() if r.name == "slow")
  assert rec.status == "failed" and rec.reason == "plugrad_devices() did not answer in 0.3 s (PLUGRAD_PROBE_TIMEOUT)"
  assert "with PLUGRAD_PROBE_TIMEOUT" in rec.remedy and isinstance(rec.error, PluginTimeoutError)
  assert reg.DEFAULT == "GOOD"
  runs(use_manager, reg, "GOOD")


def test_probe_that_never_returns_makes_its_plugins_devices_unavailable(gate, use_manager):
  blocked = PyClone("HANG", "HANG2", priority=300, probe=gate.wait)
  reg = reg_of(FakeEntryPoint("hang", blocked, dist="plugrad-hang"), FakeEntryPoint("good", PyClone("GOOD", priority=20), dist="plugrad-good"))
  assert reg.DEFAULT == "GOOD"  # not stuck behind the priority-300 device
  why = "probe did not answer in 0.3 s (device HANG in plugin 'hang' (plugrad-hang 0.1); PLUGRAD_PROBE_TIMEOUT)"
  assert reg.manager.probe("HANG") == why and reg.manager.probe("HANG2") == why  # the second is not waited for again
  with pytest.raises(DeviceUnavailableError, match=f"device HANG is unavailable here: {why.replace('(', '.').replace(')', '.')}"):
    reg["HANG"]
  assert reg.available() == ["GOOD", "PYTHON", "NULL"]
  runs(use_manager, reg, "PYTHON")


def test_device_count_that_never_returns(gate):
  class Counted(PyClone):
    @hookimpl
    def plugrad_devices(self) -> list[DeviceSpec]:
      return [DeviceSpec("MANY", API_VERSION, 5, count=lambda: gate.wait() and 2)]
  reg = reg_of(FakeEntryPoint("many", Counted(), dist="plugrad-many"))
  assert reg.manager.probe("MANY") == "device count did not answer in 0.3 s (device MANY in plugin 'many' (plugrad-many 0.1); PLUGRAD_PROBE_TIMEOUT)"
  assert reg.DEFAULT == "PYTHON"


def test_slow_but_answering_plugins_are_unaffected(use_manager):
  import time
  clone = PyClone("SLOWOK", priority=30, probe=lambda: time.sleep(0.05))
  reg = reg_of(FakeEntryPoint("slowok", clone, dist="plugrad-slowok"), PLUGRAD_PROBE_TIMEOUT="30")
  assert reg.DEFAULT == "SLOWOK"
  runs(use_manager, reg, "SLOWOK")


def test_probe_runs_in_the_callers_context():
  """A probe reading a Context setting sees the caller's value, though it runs in a worker thread."""
  from plugrad.helpers import DEBUG, Context
  seen: list[int] = []
  reg = reg_of(FakeEntryPoint("ctx", PyClone("CTX", probe=lambda: seen.append(DEBUG.value)), dist="plugrad-ctx"))
  with Context(DEBUG=3): assert reg.manager.probe("CTX") is None
  assert seen == [3]


def test_no_deadline_with_zero():
  thread: list[str] = []
  reg = reg_of(FakeEntryPoint("here", PyClone("HERE", probe=lambda: thread.append(threading.current_thread().name)), dist="plugrad-here"),
               PLUGRAD_PROBE_TIMEOUT="0")
  assert reg.manager.probe("HERE") is None and thread == [threading.current_thread().name]


@pytest.mark.parametrize("bad", ["-1", "soon", "nan", "inf"])
def test_malformed_timeout_is_a_settings_error(bad: str):
  with pytest.raises(SettingsError, match=f"PLUGRAD_PROBE_TIMEOUT must be a number of seconds >= 0 .*got '{bad}'"):
    reg_of(PLUGRAD_PROBE_TIMEOUT=bad).available()


def test_system_exit_in_a_probe_thread_is_still_the_plugins_error():
  def leave() -> None: raise SystemExit(3)
  reg = reg_of(FakeEntryPoint("bye", PyClone("BYE", probe=leave), dist="plugrad-bye"))
  with pytest.raises(PluginHookError, match="the probe of device BYE in plugin 'bye' .* raised SystemExit: 3"): reg["BYE"]


def test_wrong_type_from_a_hook_for_every_device_disqualifies_only_that_plugin(use_manager):
  odd = WrongEverywhere("ODD")
  reg = reg_of(FakeEntryPoint("odd", odd, dist="plugrad-odd"), FakeEntryPoint("good", PyClone("GOOD"), dist="plugrad-good"))
  with pytest.warns(PluginWarning, match="plugin 'odd' \\(plugrad-odd 0.1\\): plugrad_renderer\\('PYTHON'\\) returned builtins.dict, expected an "
                    "instance of plugrad.renderer.base.Renderer; it does not declare PYTHON, so it was skipped"):
    runs(use_manager, reg, "PYTHON")
  for name in ("GOOD", "NULL"): runs(use_manager, reg, name)
  assert reg["GOOD"].graph is None  # the dict from its plugrad_graph is skipped too
  with pytest.raises(PluginHookError, match="plugrad_renderer\\('ODD'\\) in plugin 'odd' \\(plugrad-odd 0.1\\) returned builtins.dict, expected"):
    _ = reg["ODD"].renderer
  with pytest.raises(PluginHookError, match="plugrad_graph\\('ODD'\\) in plugin 'odd' .* GraphRunner subclass"): _ = reg["ODD"].graph


def test_wrong_type_for_a_foreign_device_is_an_error_in_strict_mode():
  reg = reg_of(FakeEntryPoint("odd", WrongEverywhere("ODD"), dist="plugrad-odd"), PLUGRAD_STRICT_PLUGINS="1")
  with pytest.raises(PluginHookError, match="plugrad_renderer\\('PYTHON'\\) in plugin 'odd' .* returned builtins.dict"): _ = reg["PYTHON"].renderer


def test_wrong_conformance_xfails_for_a_foreign_device_is_skipped():
  class BadXfails(PyClone):
    @hookimpl
    def plugrad_conformance_xfails(self, device: str) -> Any: return ["not", "a", "dict"]
  mgr = manager(FakeEntryPoint("x", BadXfails("XF"), dist="plugrad-x"))
  assert mgr.conformance_xfails("PYTHON") == {}
  with pytest.raises(PluginHookError, match="plugrad_conformance_xfails\\('XF'\\) in plugin 'x'"): mgr.conformance_xfails("XF")


HOSTILE = '''
import os, time
from plugrad.backend import DeviceSpec, hookimpl

MODE = os.environ["HOSTILE_MODE"]
if MODE == "import": time.sleep(1000)

@hookimpl
def plugrad_devices():
  if MODE == "devices": time.sleep(1000)
  return [DeviceSpec("HOSTILE", api=(2, 1), priority=300, probe=(lambda: time.sleep(1000)) if MODE == "probe" else None)]

@hookimpl(tryfirst=True)
def plugrad_renderer(device):
  return {"not": "a renderer"} if MODE == "wrongtype" else None
'''


@pytest.fixture(scope="module")
def hostile_site(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
  root = tmp_path_factory.mktemp("hostile")
  (root / "plugrad_hostile").mkdir()
  (root / "plugrad_hostile" / "__init__.py").write_text(textwrap.dedent(HOSTILE))
  info = root / "plugrad_hostile-0.1.dist-info"
  info.mkdir()
  (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plugrad-hostile\nVersion: 0.1\n")
  (info / "entry_points.txt").write_text("[plugrad]\nhostile = plugrad_hostile\n")
  return root


SCRIPT = "from plugrad import Tensor; from plugrad.device.registry import Device; print(Device.DEFAULT, (Tensor([1.0, 2.0]) * 3).sum().item())"


@pytest.mark.parametrize("mode, dev", [("import", "CPU"), ("devices", "CPU"), ("probe", ""), ("wrongtype", "CPU")])
def test_installed_hostile_plugin_never_blocks_the_others(hostile_site: pathlib.Path, tmp_path: pathlib.Path, mode: str, dev: str):
  env = {k: v for k, v in os.environ.items() if not k.startswith(("DEV", "PLUGRAD_PLUGINS", "PLUGRAD_NO_PLUGINS", "PYTEST_"))}
  env.update(PYTHONPATH=os.pathsep.join([str(hostile_site), *filter(None, [os.environ.get("PYTHONPATH")])]), HOSTILE_MODE=mode,
             PLUGRAD_PROBE_TIMEOUT="2", PLUGRAD_STRICT_PLUGINS="0", PLUGRAD_CACHE_DIR=str(tmp_path / "cache"), DEV=dev, PLUGRAD_PLUGINS="hostile,cpu")
  proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
  assert proc.returncode == 0 and proc.stdout.split() == ["CPU", "9.0"], proc.stdout + proc.stderr[-3000:]
  proc = subprocess.run([sys.executable, "-m", "plugrad", "devices", "--json"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
  rows = {r["device"]: r for r in json.loads(proc.stdout)["devices"]}
  assert rows["CPU"]["smoke"] == "PASS" and rows["PYTHON"]["smoke"] == "PASS", proc.stdout
  if mode == "probe": assert "probe did not answer in 2 s" in rows["HOSTILE"]["detail"]
  if mode == "wrongtype": assert "returned builtins.dict" in rows["HOSTILE"]["detail"]
  if mode in ("import", "devices"):
    plugins = subprocess.run([sys.executable, "-m", "plugrad", "plugins"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert "did not answer in 2 s (PLUGRAD_PROBE_TIMEOUT)" in plugins.stdout, plugins.stdout
