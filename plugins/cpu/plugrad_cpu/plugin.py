"""Registration of the CPU device (entry point `plugrad: cpu`). Only the core's plugin API is imported here; the
components are imported inside the hooks, and the compiler is only searched for on PATH by the probe."""
from __future__ import annotations

from typing import Any

from plugrad.plugin import DeviceSpec, device_name, hookimpl

NAME = "CPU"


def probe() -> str | None:
  from plugrad_cpu.toolchain import probe as find
  return find()


@hookimpl
def plugrad_devices() -> list[DeviceSpec]:
  # priority 100: the default device once installed, unless a GPU plugin (200) is available
  return [DeviceSpec(NAME, api=(1, 0), priority=100, probe=probe, description="C compiled by the system compiler (clang/gcc), run on host threads")]


@hookimpl
def plugrad_renderer(device: str) -> Any:
  if device_name(device) != NAME: return None
  from plugrad_cpu.renderer import CPURenderer
  from plugrad_cpu.toolchain import toolchain
  tc = toolchain()
  return CPURenderer(device, native_float16=tc.float16, native_bfloat16=tc.bfloat16, vector_width=tc.float_lanes)


@hookimpl
def plugrad_compiler(device: str) -> Any:
  if device_name(device) != NAME: return None
  from plugrad_cpu.compiler import CPUCompiler
  from plugrad_cpu.toolchain import toolchain
  return CPUCompiler(toolchain())


@hookimpl
def plugrad_allocator(device: str) -> Any:
  if device_name(device) != NAME: return None
  from plugrad_cpu.allocator import CPUAllocator
  return CPUAllocator(device)


@hookimpl
def plugrad_runtime(device: str) -> Any:
  if device_name(device) != NAME: return None
  from plugrad_cpu.runtime import CPURuntime
  return CPURuntime(device)


@hookimpl
def plugrad_graph(device: str) -> Any:
  if device_name(device) != NAME: return None
  from plugrad_cpu.graph import CPUGraph
  return CPUGraph
