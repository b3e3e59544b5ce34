"""The plugin contract: pluggy markers, the `DeviceSpec` record and the hooks a backend implements.

A backend's registration module holds `@hookimpl` functions named like the hooks below. It must stay cheap to
import: driver and compiler imports belong inside the component hooks, which run only when the device is used.
See docs/writing-a-backend.md for the full contract.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pluggy

from plugrad.device.allocator import Allocator
from plugrad.device.compiler import Compiler
from plugrad.device.runtime import Runtime
from plugrad.errors import InvalidDeviceStringError
from plugrad.renderer.base import Renderer

T = TypeVar("T")
PROJECT_NAME = "plugrad"
API_VERSION: tuple[int, int] = (2, 7)  # versions exactly the names of plugrad.backend (docs/writing-a-backend.md: what each minor added)

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

_NAME_RE = re.compile(r"[A-Z][A-Z0-9_]*")
_DEVICE_RE = re.compile(r"([A-Za-z][A-Za-z0-9_]*)(?::([0-9]+))?")


@dataclass(frozen=True)
class DeviceSpec:
  """What a plugin declares about one device. Built by `plugrad_devices()`; validated on construction so that a
  malformed record fails inside the plugin that made it (and is recorded against that plugin).

  `count` (API 2.1, optional): how many devices of this name exist here, an int or a callable returning one (called
  once, after the probe passed, so it may ask the driver). `NAME:i` with i >= count is refused with DeviceIndexError,
  and a count of 0 makes the device unavailable. None (the default, and what a plugin built for 2.0 gives): not
  reported, every index is accepted (virtual devices like PYTHON:3)."""
  name: str
  api: tuple[int, int]
  priority: int = 0
  probe: Callable[[], str | None] | None = None
  aliases: tuple[str, ...] = ()
  description: str = ""
  count: int | Callable[[], int] | None = None

  def __post_init__(self) -> None:
    if not isinstance(self.name, str) or not _NAME_RE.fullmatch(self.name):
      raise ValueError(f"DeviceSpec.name must be an upper-case identifier like 'VULKAN', got {self.name!r}")
    if not (isinstance(self.api, tuple) and len(self.api) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in self.api)):
      raise TypeError(f"DeviceSpec({self.name}).api must be a (major, minor) tuple of ints, got {self.api!r}")
    if not isinstance(self.priority, int) or isinstance(self.priority, bool):
      raise TypeError(f"DeviceSpec({self.name}).priority must be an int, got {self.priority!r}")
    if self.probe is not None and not callable(self.probe):
      raise TypeError(f"DeviceSpec({self.name}).probe must be a callable returning None or a reason string, got {self.probe!r}")
    if not isinstance(self.aliases, tuple) or not all(isinstance(a, str) and _NAME_RE.fullmatch(a) for a in self.aliases):
      raise ValueError(f"DeviceSpec({self.name}).aliases must be a tuple of upper-case identifiers, got {self.aliases!r}")
    if self.name in self.aliases: raise ValueError(f"DeviceSpec({self.name}) lists its own name among its aliases")
    if not isinstance(self.description, str): raise TypeError(f"DeviceSpec({self.name}).description must be a str, got {self.description!r}")
    if self.count is not None and not callable(self.count):
      if not isinstance(self.count, int) or isinstance(self.count, bool):
        raise TypeError(f"DeviceSpec({self.name}).count must be None, an int >= 0 or a callable returning one, got {self.count!r}")
      if self.count < 0: raise ValueError(f"DeviceSpec({self.name}).count must be >= 0, got {self.count}")

  @property
  def api_str(self) -> str: return f"{self.api[0]}.{self.api[1]}"


def parse_device(device: str) -> tuple[str, int]:
  """Split a device string into its upper-cased name and index: "cuda:1" → ("CUDA", 1), "CPU" → ("CPU", 0).
  Aliases are not resolved here (that needs the installed plugins: `Device.canonicalize`)."""
  if not isinstance(device, str):
    raise InvalidDeviceStringError(f"a device must be a str like 'CPU' or 'CUDA:1', got {type(device).__name__} {device!r}")
  if (m := _DEVICE_RE.fullmatch(device)) is None:
    raise InvalidDeviceStringError(f"malformed device string {device!r}: expected NAME or NAME:index, e.g. 'CPU' or 'CUDA:1'")
  return m.group(1).upper(), int(m.group(2) or 0)


def device_name(device: str) -> str:
  """The name part of a canonical device string ("CUDA:1" → "CUDA"): what a component hook compares against."""
  return parse_device(device)[0]


def for_device(*names: str) -> Callable[[Callable[..., T]], Callable[..., T | None]]:
  """A component hook's decorator, under `@hookimpl`: the hook answers None (not mine) for a device whose name is not
  one of `names`, so its body runs only for the plugin's own devices. pluggy still sees the hook's own argument names."""
  wanted = frozenset(n.upper() for n in names)
  def wrap(fn: Callable[..., T]) -> Callable[..., T | None]:
    @functools.wraps(fn)
    def hook(device: str, *args: Any) -> T | None: return fn(device, *args) if device_name(device) in wanted else None
    return hook
  return wrap


# ---- the hooks (pluggy reads the names and argument names; the bodies are never run)

@hookspec
def plugrad_devices() -> list[DeviceSpec]:  # type: ignore[empty-body]
  """Return the devices this plugin provides, as a list of `DeviceSpec` (may be empty for a plugin that only overrides
  components of other devices). Called once per process, when plugins are first loaded; must not import drivers."""


@hookspec(firstresult=True)
def plugrad_renderer(device: str) -> Renderer | None:
  """Return a new `plugrad.backend.Renderer` for the canonical `device` ("NAME" or "NAME:i"), or None if the
  device is not yours. The first non-None result wins (`@hookimpl(tryfirst=True)` overrides another plugin's)."""


@hookspec(firstresult=True)
def plugrad_compiler(device: str, renderer: Renderer) -> Compiler | None:
  """Return a new `plugrad.backend.Compiler` for `device`, whose sources come from `renderer`, or None."""


@hookspec(firstresult=True)
def plugrad_allocator(device: str) -> Allocator | None:
  """Return a new `plugrad.backend.Allocator` for `device`, or None."""


@hookspec(firstresult=True)
def plugrad_runtime(device: str) -> Runtime | None:
  """Return a new `plugrad.backend.Runtime` for `device` (loads PROGRAM binaries, synchronizes), or None."""


@hookspec(firstresult=True)
def plugrad_graph(device: str) -> type | None:
  """Return a GraphRunner subclass (a class, not an instance) that batches JIT-captured kernels on `device`, or None
  when the device has no graph support (None from every plugin is allowed for this hook). Typed `type`: GraphRunner
  sits above the registry that loads these hooks; the JIT checks the subclass when it uses it."""


@hookspec
def plugrad_conformance_xfails(device: str) -> dict[str, str] | None:
  """Return {test name pattern: reason} for the conformance tests `device` is known to fail (glob patterns (`*`, `?`) on the
  test name, e.g. "test_kernel[ew-idiv-long-*]"), or None. The suite marks them xfail(strict=True): a listed test that
  passes fails the run, so the list stays true. All plugins' answers are merged."""


COMPONENT_HOOKS: tuple[str, ...] = ("plugrad_renderer", "plugrad_compiler", "plugrad_allocator", "plugrad_runtime", "plugrad_graph")
