"""Plugins and entry points for the plugin-system tests.

`FakeEntryPoint` stands in for `importlib.metadata.EntryPoint` only (the manager takes any object with name, value,
dist and load()); the plugins themselves are real: `PyClone` serves the PYTHON device's own components under other
device names, so a device built from it renders, compiles and runs kernels.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from plugrad.plugin import API_VERSION, DeviceSpec, device_name, hookimpl
from plugrad.plugin.manager import PluginManager


@dataclass(frozen=True)
class FakeDist:
  name: str
  version: str


class FakeEntryPoint:
  """An entry point whose `load()` returns `target`, or raises it when it is an exception. Counts its loads."""
  def __init__(self, name: str, target: Any, dist: str = "plugrad-fake", version: str = "0.1"):
    self.name, self.value, self.dist, self._target, self.loads = name, f"{dist.replace('-', '_')}.plugin", FakeDist(dist, version), target, 0

  def load(self) -> Any:
    self.loads += 1
    if isinstance(self._target, BaseException): raise self._target
    return self._target


class PyClone:
  """A plugin that provides `names` as devices backed by the PYTHON interpreter's components. `calls` logs every
  component hook call, so tests can show which hooks ran."""
  def __init__(self, *names: str, priority: int = 10, api: tuple[int, int] = API_VERSION, probe: Callable[[], Any] | None = None,
               aliases: tuple[str, ...] = ()):
    self.names, self.priority, self.api, self.probe, self.aliases = names, priority, api, probe, aliases
    self.calls: list[tuple[str, str]] = []

  def _mine(self, hook: str, device: str) -> bool:
    self.calls.append((hook, device))
    return device_name(device) in self.names

  @hookimpl
  def plugrad_devices(self) -> list[DeviceSpec]:
    return [DeviceSpec(n, self.api, self.priority, self.probe, self.aliases if i == 0 else (), f"{n} (PYTHON clone)")
            for i, n in enumerate(self.names)]

  @hookimpl
  def plugrad_renderer(self, device: str) -> Any:
    if not self._mine("renderer", device): return None
    from plugrad.builtin.python_renderer import PythonRenderer
    return PythonRenderer(device)

  @hookimpl
  def plugrad_compiler(self, device: str, renderer: Any) -> Any:
    if not self._mine("compiler", device): return None
    from plugrad.builtin.interpreter import PythonCompiler
    return PythonCompiler()

  @hookimpl
  def plugrad_allocator(self, device: str) -> Any:
    if not self._mine("allocator", device): return None
    from plugrad.builtin.interpreter import PythonAllocator
    return PythonAllocator(device)

  @hookimpl
  def plugrad_runtime(self, device: str) -> Any:
    if not self._mine("runtime", device): return None
    from plugrad.builtin.interpreter import PythonRuntime
    return PythonRuntime(device)


class Override:
  """A plugin that declares no device and replaces one component of another device (the tryfirst contract)."""
  def __init__(self, target: str, make: Callable[[str], Any]):
    self.target, self.make = target, make

  @hookimpl(tryfirst=True)
  def plugrad_renderer(self, device: str) -> Any: return self.make(device) if device_name(device) == self.target else None


def manager(*eps: FakeEntryPoint, builtins: bool = True, **env: str) -> PluginManager:
  """A manager over exactly these entry points and this environment (nothing from the real one leaks in)."""
  return PluginManager(entry_points=lambda: list(eps), builtins=builtins, env=dict(env))
