"""Registration of the METAL device (entry point `plugrad: metal`). Only the core's plugin API is imported here; Metal
itself (through pyobjc) is touched by the probe on macOS only, and the components are imported inside the hooks.

The renderer and the compiler need no Mac: `METAL_LANGUAGE` (3.0, 3.1, 3.2) picks the Metal Shading Language version
to write for (3.1+ has `bfloat`), and off macOS the compiler is the approximate syntax check (MSL compiled as C++ by
clang against the shim header in `plugrad_metal/include`: "syntax-checked, not Metal-compiled"). That is how the
render and compile tiers run in CI (`Device.offline("METAL")`). The allocator, runtime and graph runner need macOS and
a Metal device; they are written against Apple's documented API and have never run (no Mac in this project).
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from plugrad.backend import DeviceSpec, for_device, hookimpl, parse_device
from plugrad_metal.language import LANGUAGES, OFFLINE_LANGUAGE, language, macos_language

NAME = "METAL"


def _find_metal() -> Any:
  import Metal  # type: ignore[import-not-found]  # pyobjc-framework-Metal, a dependency on macOS only
  return Metal


def probe_with(system: str, importer: Callable[[], Any]) -> str | None:
  """Why METAL cannot be used on a machine whose `sys.platform` is `system` (None: it can). Never raises."""
  if system != "darwin":
    return f"not macOS (sys.platform is {system!r}): Metal exists only on Apple platforms; the render and syntax-check tiers work anywhere"
  try: metal = importer()
  except ImportError as e: return f"pyobjc-framework-Metal is not installed ({e}): pip install pyobjc-framework-Metal"
  except Exception as e: return f"the Metal framework could not be loaded: {type(e).__name__}: {e}"
  try: dev = metal.MTLCreateSystemDefaultDevice()
  except Exception as e: return f"MTLCreateSystemDefaultDevice failed: {type(e).__name__}: {e}"
  return None if dev is not None else "no Metal device (MTLCreateSystemDefaultDevice returned nil)"


def probe() -> str | None: return probe_with(sys.platform, _find_metal)


@hookimpl
def plugrad_devices() -> list[DeviceSpec]:
  # priority 200: an available Apple GPU is the default device over the CPU (100)
  return [DeviceSpec(NAME, api=(2, 5), priority=200, probe=probe, aliases=("MTL",),
                     description="Metal Shading Language kernels on Apple GPUs (pyobjc); off macOS rendered and syntax-checked only")]


@hookimpl
@for_device(NAME)
def plugrad_renderer(device: str) -> Any:
  from plugrad_metal.renderer import MetalRenderer
  return MetalRenderer(device, language())


@hookimpl
@for_device(NAME)
def plugrad_compiler(device: str, renderer: Any) -> Any:
  lang = getattr(renderer, "language", None) or language()
  if sys.platform == "darwin":  # Apple's compiler: the command-line tools', else the framework's (needs a Metal device)
    from plugrad_metal.compiler import MetalCompiler, xcrun_metal
    if xcrun_metal() is not None or probe() is None: return MetalCompiler(lang)
  from plugrad_metal.syntax import SyntaxCheckCompiler  # elsewhere: the approximate syntax check (syntax.py)
  return SyntaxCheckCompiler(lang)


@hookimpl
@for_device(NAME)
def plugrad_allocator(device: str) -> Any:
  from plugrad_metal.allocator import MetalAllocator
  return MetalAllocator(device, parse_device(device)[1])


@hookimpl
@for_device(NAME)
def plugrad_runtime(device: str) -> Any:
  from plugrad_metal.runtime import MetalRuntime
  return MetalRuntime(device, parse_device(device)[1])


@hookimpl
@for_device(NAME)
def plugrad_graph(device: str) -> Any:
  from plugrad_metal.graph import MetalGraph
  return MetalGraph


__all__ = ["LANGUAGES", "NAME", "OFFLINE_LANGUAGE", "language", "macos_language", "probe", "probe_with"]
