"""The built-in devices, registered through the same hooks as any installed plugin (distribution "plugrad"):

* PYTHON (priority 0): the reference interpreter, slow and exact; the default when no backend plugin is installed.
* NULL (priority -100, never chosen unless DEV=NULL): renders, compiles and launches, but computes nothing
  (for measuring the core's own overhead and for testing the pipeline without a device).

Like any plugin module, this one imports its component classes only inside the hooks.
"""
from __future__ import annotations

from typing import Any

from plugrad.backend import API_VERSION, DeviceSpec, device_name, hookimpl


@hookimpl
def plugrad_devices() -> list[DeviceSpec]:
  return [DeviceSpec("PYTHON", API_VERSION, priority=0, description="reference interpreter (pure Python; slow, exact)"),
          DeviceSpec("NULL", API_VERSION, priority=-100, description="renders, compiles and launches kernels but computes nothing")]


@hookimpl
def plugrad_renderer(device: str) -> Any:
  if (name := device_name(device)) == "PYTHON":
    from .python_renderer import PythonRenderer
    return PythonRenderer(device)
  if name == "NULL":
    from .null import NullRenderer
    return NullRenderer(device)
  return None


@hookimpl
def plugrad_compiler(device: str) -> Any:
  if (name := device_name(device)) == "PYTHON":
    from .interpreter import PythonCompiler
    return PythonCompiler()
  if name == "NULL":
    from .null import NullCompiler
    return NullCompiler()
  return None


@hookimpl
def plugrad_allocator(device: str) -> Any:
  if (name := device_name(device)) == "PYTHON":
    from .interpreter import PythonAllocator
    return PythonAllocator(device)
  if name == "NULL":
    from .null import NullAllocator
    return NullAllocator(device)
  return None


@hookimpl
def plugrad_runtime(device: str) -> Any:
  if (name := device_name(device)) == "PYTHON":
    from .interpreter import PythonRuntime
    return PythonRuntime(device)
  if name == "NULL":
    from .null import NullRuntime
    return NullRuntime(device)
  return None


@hookimpl
def plugrad_graph(device: str) -> Any:
  if device_name(device) == "PYTHON":
    from .interpreter_graph import PythonGraph
    return PythonGraph
  return None
