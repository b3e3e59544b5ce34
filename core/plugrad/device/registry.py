"""`Device`: the registry of devices. `Device["CUDA:1"]` is a `CompiledDevice` whose components (renderer, compiler,
allocator, runtime, graph) come from the plugin hooks, each built on first use and checked for its base type.

Device strings: "NAME" or "NAME:index", case-insensitive, aliases allowed; the canonical form is upper-case, with the
index left out when it is 0 ("cuda:0" → "CUDA", "cuda:1" → "CUDA:1"); an index is checked against the device count
the plugin reports (DeviceSpec.count), when it reports one. The default device is DEV when set, else the
highest-priority available device with a priority >= 0; a device that cannot be used raises, and nothing is ever
silently replaced by another device: a default that falls back past a failed, conflicting or misconfigured device
warns once naming the cause (DeviceFallbackWarning; DeviceFallbackError under PLUGRAD_STRICT_PLUGINS=1).

This module must not import buffer.py or runner.py at module level: they import `Device` from here.
"""
from __future__ import annotations

import functools
import sys
import threading
import warnings
from typing import Any

from plugrad.device.allocator import Allocator
from plugrad.device.compiler import Compiler
from plugrad.device.runtime import Runtime
from plugrad.errors import (
  DeviceError,
  DeviceFallbackError,
  DeviceIndexError,
  DeviceUnavailableError,
  InvalidDeviceStringError,
  PluginHookError,
  UnknownDeviceError,
)
from plugrad.helpers import DEBUG, SettingsError
from plugrad.plugin.hookspecs import DeviceSpec, parse_device
from plugrad.plugin.manager import DeviceEntry, DeviceFallbackWarning, PluginManager, PluginRecord, get_manager, reset_manager
from plugrad.renderer.base import Renderer


def format_device(name: str, index: int) -> str:
  """The canonical device string for a (resolved) name and index."""
  return name if index == 0 else f"{name}:{index}"


# what each component hook must return (its hookspec's return type)
_BASE_CLASS: dict[str, type] = {"renderer": Renderer, "compiler": Compiler, "allocator": Allocator, "runtime": Runtime}


class CompiledDevice:
  """One device: its plugin's components, created on first access (a failure is raised again on the next access)."""
  def __init__(self, name: str, entry: DeviceEntry, manager: PluginManager):
    self.name, self.spec, self._manager = name, entry.spec, manager
    self.plugin: PluginRecord = entry.plugin
    self.distribution, self.plugin_version = entry.plugin.distribution, entry.plugin.version

  def __repr__(self) -> str: return f"<CompiledDevice {self.name} from {self.plugin.label} (plugin {self.plugin.name!r})>"

  def _component(self, hook: str, kind: str, **kwargs: Any) -> Any:
    base = _BASE_CLASS[kind]
    def check(obj: Any) -> str | None:  # the manager skips a wrong result from a plugin that does not declare this device
      if isinstance(obj, base): return None
      return f"returned {type(obj).__module__}.{type(obj).__qualname__}, expected an instance of {base.__module__}.{base.__qualname__}"
    obj, rec = self._manager.call_component(hook, self.name, check, **kwargs)
    if obj is None or rec is None:
      raise PluginHookError(f"no plugin provides a {kind} for device {self.name}: every {hook}({self.name!r}) returned None "
                            f"(the device is declared by plugin {self.plugin.name!r} ({self.plugin.label}), which must implement {hook})")
    return obj

  @functools.cached_property
  def renderer(self) -> Any:
    return self._component("plugrad_renderer", "renderer")
  @functools.cached_property
  def compiler(self) -> Any: return self._component("plugrad_compiler", "compiler", renderer=self.renderer)
  @functools.cached_property
  def allocator(self) -> Any: return self._component("plugrad_allocator", "allocator")
  @functools.cached_property
  def runtime(self) -> Any: return self._component("plugrad_runtime", "runtime")

  @functools.cached_property
  def graph(self) -> type | None:
    """A GraphRunner subclass, or None when the device has no graph support. Only "is a class" is checked here; the
    JIT checks that it subclasses GraphRunner (device/graph.py) when it uses it."""
    def check(obj: Any) -> str | None:
      if isinstance(obj, type): return None
      return f"returned an instance of {type(obj).__qualname__}; it must return a GraphRunner subclass (the class itself) or None"
    return self._manager.call_component("plugrad_graph", self.name, check)[0]

  def synchronize(self) -> None:
    """Wait until all work launched on this device is done."""
    self.runtime.synchronize()


class OfflineDevice(CompiledDevice):
  """A device whose probe says it cannot be used here, opened for what needs no hardware: its renderer and compiler
  (the render and compile tiers of a GPU backend on a machine without the GPU). Its allocator, runtime and graph
  runner raise DeviceUnavailableError with the probe's reason; nothing is ever launched on it."""
  def __init__(self, name: str, entry: DeviceEntry, manager: PluginManager, reason: str):
    super().__init__(name, entry, manager)
    self.reason = reason

  def __repr__(self) -> str: return f"<OfflineDevice {self.name} from {self.plugin.label}: {self.reason}>"

  def _unavailable(self, what: str) -> DeviceUnavailableError:
    return DeviceUnavailableError(f"device {self.name} is unavailable here ({self.reason}); Device.offline gives its renderer and "
                                  f"compiler only, not its {what}")

  @functools.cached_property
  def allocator(self) -> Any: raise self._unavailable("allocator")
  @functools.cached_property
  def runtime(self) -> Any: raise self._unavailable("runtime")
  @functools.cached_property
  def graph(self) -> type | None: raise self._unavailable("graph runner")


class DeviceRegistry:
  """The type of `Device`. A registry built with a manager uses that one (tests, embedding); the default one follows the
  process-wide manager of `plugrad.plugin.manager`, dropping its cached devices when that manager is replaced."""
  def __init__(self, manager: PluginManager | None = None):
    self._manager = manager
    self._owner: PluginManager | None = None
    self._devices: dict[str, CompiledDevice] = {}
    self._canonical: dict[str, str] = {}
    self._default: str | None = None
    self._lock = threading.RLock()

  def __repr__(self) -> str: return f"<DeviceRegistry ({'loaded' if self._mgr().loaded else 'plugins not loaded yet'})>"

  def _mgr(self) -> PluginManager:
    mgr = self._manager if self._manager is not None else get_manager()
    if mgr is not self._owner:
      with self._lock: self._owner, self._devices, self._canonical, self._default = mgr, {}, {}, None
    return mgr

  @property
  def manager(self) -> PluginManager: return self._mgr()

  def reset(self, manager: PluginManager | None = None) -> None:
    """Forget every device, the default, and (for the process-wide `Device`) the plugin manager, which then re-reads the
    entry points and the environment. `manager` replaces it instead (tests)."""
    with self._lock:
      if self._manager is None: reset_manager(manager)
      elif manager is not None: self._manager = manager
      self._owner, self._devices, self._canonical, self._default = None, {}, {}, None

  # ---- names
  def canonicalize(self, name: str) -> str:
    """"cuda" → "CUDA", "CPU:0" → "CPU", "cuda:1" → "CUDA:1", aliases resolved. Raises InvalidDeviceStringError for a
    malformed string and UnknownDeviceError (or the recorded plugin failure) for a name no plugin provides."""
    mgr = self._mgr()
    if isinstance(name, str) and (hit := self._canonical.get(name)) is not None: return hit
    base, index = parse_device(name)
    canon = format_device(mgr.resolve(base), index)
    self._canonical[name] = canon
    return canon

  def __getitem__(self, name: str) -> CompiledDevice:
    """The device object for `name` (created once per canonical name). Raises DeviceUnavailableError with the probe's
    reason when the device cannot be used here."""
    canon = self.canonicalize(name)
    if (dev := self._devices.get(canon)) is not None: return dev
    with self._lock:
      if (dev := self._devices.get(canon)) is None:
        mgr = self._mgr()
        base = parse_device(canon)[0]
        entry = mgr.entry(base)
        if (reason := mgr.probe(base)) is not None:
          raise DeviceUnavailableError(f"device {canon} is unavailable here: {reason} (plugin {entry.plugin.name!r}, {entry.plugin.label})")
        _check_index(canon, entry, mgr)
        dev = self._devices[canon] = CompiledDevice(canon, entry, mgr)
    return dev

  def offline(self, name: str) -> CompiledDevice:
    """The device for rendering and compiling only, usable or not: `Device[name]` when the device is available here,
    else an `OfflineDevice` whose renderer and compiler come from its plugin as usual (a GPU backend renders and
    compiles for a target given by its own settings, e.g. CUDA_ARCH) and whose allocator and runtime raise
    DeviceUnavailableError with the probe's reason. Not cached, and never the default device."""
    canon = self.canonicalize(name)
    mgr = self._mgr()
    base = parse_device(canon)[0]
    entry = mgr.entry(base)
    if (reason := mgr.probe(base)) is None: return self[canon]
    return OfflineDevice(canon, entry, mgr, reason)

  def __contains__(self, name: object) -> bool:
    try: return isinstance(name, str) and bool(self.canonicalize(name))
    except DeviceError: return False

  # ---- the default device
  @property
  def DEFAULT(self) -> str:
    """The default device: DEV when set (and usable), else the available device of highest priority (>= 0)."""
    mgr = self._mgr()
    if self._default is None:
      with self._lock: self._default = self._choose_default(mgr)
    return self._default

  @DEFAULT.setter
  def DEFAULT(self, name: str) -> None:
    canon = self.canonicalize(name)
    self[canon]  # an unusable device raises here, not at the first kernel
    self._default = canon

  def _choose_default(self, mgr: PluginManager) -> str:
    if (dev := mgr.env.get("DEV", "").strip()):
      try: canon = self.canonicalize(dev)
      except InvalidDeviceStringError as e: raise InvalidDeviceStringError(f"DEV={dev!r}: {e}") from None
      except UnknownDeviceError as e: raise UnknownDeviceError(f"DEV={dev!r}: {e}") from None
      base = parse_device(canon)[0]
      if (reason := mgr.probe(base)) is not None:
        raise DeviceUnavailableError(f"DEV={dev} selects {canon}, which is unavailable here: {reason}. plugrad does not run on another device "
                                     f"in its place: fix that, or set DEV to an available device ({', '.join(_usable(mgr)) or 'none'})")
      try: _check_index(canon, mgr.entry(base), mgr)
      except DeviceIndexError as e: raise DeviceIndexError(f"DEV={dev}: {e}") from None
      return canon
    skipped: list[str] = []
    for ent in mgr.devices():
      if ent.spec.priority < 0: continue
      if (reason := _probe_text(mgr, ent.spec.name)) is None:
        if DEBUG >= 1: print(f"plugrad: default device {ent.spec.name}" + "".join(f"; skipped {s}" for s in skipped), file=sys.stderr)
        _fallback(mgr, ent.spec)
        return ent.spec.name
      skipped.append(f"{ent.spec.name} ({reason})")
    why = [f"{e.spec.name}: {_probe_text(mgr, e.spec.name) or 'priority < 0 (only used when selected with DEV)'}" for e in mgr.devices()]
    why += [c.text for c in mgr.fallback_causes(None) if c.device is None]  # failures and conflicts: not among the devices above
    raise DeviceUnavailableError(f"no device is available to be the default ({'; '.join(why) or 'no device is registered'}); "
                                 "see `python -m plugrad devices`")

  # ---- listings
  def available(self) -> list[str]:
    """The device names usable here, highest priority first."""
    return self._mgr().available()

  def known(self) -> list[str]:
    """Every device name declared by a loaded plugin, usable here or not."""
    return self._mgr().known()

  def spec(self, name: str) -> DeviceSpec:
    return self._mgr().entry(parse_device(name)[0]).spec

  def plugins(self) -> list[PluginRecord]:
    """The plugin records (active, failed and blocked), as `python -m plugrad plugins` shows them."""
    return self._mgr().records()


def _probe_text(mgr: PluginManager, name: str) -> str | None:
  """The probe's reason, or the error of a probe or count that raised, as text (never raises for a plugin's fault)."""
  try: return mgr.probe(name)
  except (DeviceError, SettingsError) as e: return f"{type(e).__name__}: {e}"


def _usable(mgr: PluginManager) -> list[str]:
  return [e.spec.name for e in mgr.devices() if _probe_text(mgr, e.spec.name) is None]


def _check_index(canon: str, entry: DeviceEntry, mgr: PluginManager) -> None:
  """Refuse `NAME:i` when the plugin reports fewer than i+1 devices of that name (DeviceSpec.count)."""
  name, index = parse_device(canon)
  if index == 0 or (n := mgr.count(name)) is None or index < n: return
  have = f"{name}" if n == 1 else f"{name} to {name}:{n - 1}"
  raise DeviceIndexError(f"device {canon} does not exist here: plugin {entry.plugin.name!r} ({entry.plugin.label}) reports {n} {name} "
                         f"device{'s' if n != 1 else ''} ({have})")


def _fallback(mgr: PluginManager, chosen: DeviceSpec) -> None:
  """Warn (once: the default is chosen once per registry) when `chosen` is the default only because devices of higher
  priority failed, conflict or are misconfigured, or because every faster device is missing and only the reference
  interpreter is left; under PLUGRAD_STRICT_PLUGINS=1 raise DeviceFallbackError instead."""
  if not (causes := mgr.fallback_causes(chosen)): return
  text = "; ".join(c.text for c in causes)
  what = f"{chosen.name} (priority {chosen.priority}" + (", the reference interpreter: thousands of times slower)" if chosen.priority <= 0 else ")")
  msg = (f"the default device is {what}, not a device of higher priority, because: {text}. Fix that, or choose the device "
         f"with DEV (DEV={chosen.name} keeps this one); `python -m plugrad plugins` and `python -m plugrad devices` show every plugin and device")
  if mgr.strict:
    err = DeviceFallbackError(f"PLUGRAD_STRICT_PLUGINS=1 and {msg}")
    err.__cause__ = next((c.error() for c in causes if c.error is not None), None)
    raise err
  warnings.warn(f"plugrad: {msg}", DeviceFallbackWarning, stacklevel=4)


Device = DeviceRegistry()
