"""Registration of the AMD device (entry point `plugrad: amd`). Only the core's plugin API is imported here; HIP is
touched by the probe (dlopen of libamdhip64.so, hipInit, the device's arch) and the components are imported inside
the hooks.

The renderer and compiler need no GPU: `AMD_ARCH=gfx942` (or gfx1100, gfx1201, ...) picks the target on a machine
without one, which is how the render and compile tiers run in CI (`Device.offline("AMD")`); on a GPU machine the
target is the device's arch unless AMD_ARCH is set. The compiler needs clang and lld (toolchain.py); the allocator,
runtime and graph runner need ROCm's HIP runtime and an AMD GPU, and have never run (see the README).
"""
from __future__ import annotations

from typing import Any

from plugrad.backend import DeviceSpec, for_device, hookimpl, parse_device

NAME = "AMD"


def probe() -> str | None:
  from plugrad_amd.hip import probe as find
  return find()


def arch(device: str) -> str:
  """AMD_ARCH, else the arch of the device (when HIP and the device exist), else DEFAULT_ARCH."""
  from plugrad_amd.targets import DEFAULT_ARCH, env_arch
  if (a := env_arch()) is not None: return a.name  # a malformed or unsupported value fails here, naming the variable
  from plugrad_amd.hip import device_arch
  from plugrad_amd.hip import probe as find
  if find() is not None: return DEFAULT_ARCH
  from plugrad.backend import DeviceUnavailableError
  from plugrad_amd.targets import ARCHS
  if (gpu := device_arch(index := parse_device(device)[1])) not in ARCHS:  # the probe checked AMD:0 only
    raise DeviceUnavailableError(f"AMD:{index} is a {gpu}, an arch plugrad-amd does not support; supported: {', '.join(ARCHS)}")
  return gpu


@hookimpl
def plugrad_devices() -> list[DeviceSpec]:
  # priority 200: an available AMD GPU is the default device over the CPU (100)
  return [DeviceSpec(NAME, api=(2, 6), priority=200, probe=probe,
                     description="HIP kernels compiled by clang + lld to AMDGPU code objects, run through HIP (libamdhip64)")]


@hookimpl
@for_device(NAME)
def plugrad_renderer(device: str) -> Any:
  from plugrad_amd.renderer import HIPRenderer
  return HIPRenderer(device, arch(device))


@hookimpl
@for_device(NAME)
def plugrad_compiler(device: str, renderer: Any) -> Any:
  from plugrad_amd.compiler import AMDCompiler
  return AMDCompiler(getattr(renderer, "arch", None) or arch(device))


@hookimpl
@for_device(NAME)
def plugrad_allocator(device: str) -> Any:
  from plugrad_amd.allocator import HIPAllocator
  return HIPAllocator(device, parse_device(device)[1])


@hookimpl
@for_device(NAME)
def plugrad_runtime(device: str) -> Any:
  from plugrad_amd.runtime import AMDRuntime
  return AMDRuntime(device, parse_device(device)[1])


@hookimpl
@for_device(NAME)
def plugrad_graph(device: str) -> Any:
  from plugrad_amd.graph import HIPGraph
  return HIPGraph
