"""Registration of the CUDA device (entry point `plugrad: cuda`). Only the core's plugin API is imported here; the
driver is touched by the probe (dlopen of libcuda.so.1, cuInit) and the components are imported inside the hooks.

The renderer and compiler need no GPU: `CUDA_ARCH=sm_90` (or sm_80, ...) picks the target on a machine without one,
which is how the render and compile tiers run in CI (`Device.offline("CUDA")`); on a GPU machine the target is the
device's compute capability unless CUDA_ARCH is set. The allocator, runtime and graph runner need the driver.
"""
from __future__ import annotations

import os
from typing import Any

from plugrad.backend import DeviceSpec, for_device, hookimpl, parse_device

NAME = "CUDA"
DEFAULT_ARCH = "sm_80"  # without CUDA_ARCH and without a GPU to ask: the oldest arch with the m16n8k16 tensor cores


def probe() -> str | None:
  from plugrad_cuda.driver import probe as find
  return find()


def arch(device: str) -> str:
  """CUDA_ARCH, else the compute capability of the device (when a driver and the device exist), else DEFAULT_ARCH."""
  if (env := os.environ.get("CUDA_ARCH", "").strip()):
    from plugrad_cuda.nvrtc import parse_arch
    parse_arch(env)  # a malformed value fails here, naming the variable
    return env
  from plugrad_cuda.driver import compute_capability
  from plugrad_cuda.driver import probe as find
  if find() is not None: return DEFAULT_ARCH
  major, minor = compute_capability(parse_device(device)[1])
  return f"sm_{major}{minor}"


@hookimpl
def plugrad_devices() -> list[DeviceSpec]:
  # priority 200: an available NVIDIA GPU is the default device over the CPU (100)
  return [DeviceSpec(NAME, api=(2, 6), priority=200, probe=probe, aliases=("NV",),
                     description="CUDA C compiled by NVRTC + nvJitLink (pip wheels) to cubins, run through the CUDA driver API")]


@hookimpl
@for_device(NAME)
def plugrad_renderer(device: str) -> Any:
  from plugrad_cuda.renderer import CUDARenderer
  return CUDARenderer(device, arch(device))


@hookimpl
@for_device(NAME)
def plugrad_compiler(device: str, renderer: Any) -> Any:
  from plugrad_cuda.compiler import CUDACompiler
  return CUDACompiler(getattr(renderer, "arch", None) or arch(device))


@hookimpl
@for_device(NAME)
def plugrad_allocator(device: str) -> Any:
  from plugrad_cuda.allocator import CUDAAllocator
  return CUDAAllocator(device, parse_device(device)[1])


@hookimpl
@for_device(NAME)
def plugrad_runtime(device: str) -> Any:
  from plugrad_cuda.runtime import CUDARuntime
  return CUDARuntime(device, parse_device(device)[1])


@hookimpl
@for_device(NAME)
def plugrad_graph(device: str) -> Any:
  from plugrad_cuda.graph import CUDAGraph
  return CUDAGraph
