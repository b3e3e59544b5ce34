"""The process's WebGPU adapter and device, found once and shared by the renderer, compiler, allocator and runtime.

wgpu-py picks the adapter (`WGPU_BACKEND_TYPE=Vulkan|OpenGL|...` chooses the backend, `WGPUPY_WGPU_ADAPTER_NAME` a name
substring); on a machine without a GPU that is Mesa's software rasterizer: lavapipe through Vulkan (apt
`mesa-vulkan-drivers`) or llvmpipe through OpenGL. The device is requested with the adapter's own compute limits (the
WebGPU defaults are far lower: 256 invocations per workgroup, 16 KiB of workgroup memory) and the optional features the
backend uses when they exist: `shader-f16` (float16) and `timestamp-query` (kernel times).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from plugrad.backend import DeviceUnavailableError

NAME = "WEBGPU"
INSTALL = "pip install wgpu; on a machine without a GPU also apt-get install mesa-vulkan-drivers (lavapipe) or libgl1-mesa-dri (llvmpipe)"

# the limits the device is created with: the adapter's values, since only compute matters here
COMPUTE_LIMITS = ("max-storage-buffer-binding-size", "max-buffer-size", "max-compute-workgroup-storage-size", "max-compute-invocations-per-workgroup",
                  "max-compute-workgroup-size-x", "max-compute-workgroup-size-y", "max-compute-workgroup-size-z",
                  "max-compute-workgroups-per-dimension", "max-storage-buffers-per-shader-stage", "max-uniform-buffer-binding-size")
OPTIONAL_FEATURES = ("shader-f16", "timestamp-query")


@dataclass(frozen=True)
class Limits:
  """What kernels may use on one adapter (the renderer reads these; nothing here is hard-coded per adapter)."""
  workgroup_size: tuple[int, int, int]  # the largest workgroup per dimension
  invocations: int                      # threads per workgroup (the product of the three sizes)
  workgroups: int                       # workgroups per dispatch dimension
  workgroup_storage: int                # bytes of var<workgroup> memory
  storage_buffers: int                  # storage buffers one kernel may bind
  binding_size: int                     # bytes one storage buffer binding may span
  buffer_size: int                      # bytes of one buffer

  @classmethod
  def from_wgpu(cls, lim: Any) -> Limits:
    return cls((lim["max-compute-workgroup-size-x"], lim["max-compute-workgroup-size-y"], lim["max-compute-workgroup-size-z"]),
               lim["max-compute-invocations-per-workgroup"], lim["max-compute-workgroups-per-dimension"], lim["max-compute-workgroup-storage-size"],
               lim["max-storage-buffers-per-shader-stage"], lim["max-storage-buffer-binding-size"], lim["max-buffer-size"])


@dataclass(frozen=True)
class GPUContext:
  """The adapter, the device made from it, and what they offer."""
  adapter: Any
  device: Any
  limits: Limits
  features: frozenset[str]
  adapter_name: str   # e.g. "llvmpipe (LLVM 15.0.6, 256 bits)"
  backend: str        # "Vulkan", "OpenGL", "Metal", ...
  driver: str         # the adapter's description, e.g. "Mesa 22.3.6 (LLVM 15.0.6)"
  software: bool      # a CPU adapter (Mesa's software rasterizer): numbers are real, speed is a CPU's

  @property
  def float16(self) -> bool: return "shader-f16" in self.features
  @property
  def timestamps(self) -> bool: return "timestamp-query" in self.features

  def describe(self) -> str:
    kind = ", software rasterizer" if self.software else ""
    return f"{self.adapter_name} via {self.backend}{kind}"


def _import_wgpu() -> Any:
  try:
    import wgpu
  except ImportError as e: raise DeviceUnavailableError(f"the wgpu package is not installed ({e}): {INSTALL}") from None
  return wgpu


@functools.cache
def gpu() -> GPUContext:
  """The process-wide adapter and device. Raises DeviceUnavailableError with the reason when there is no adapter."""
  wgpu = _import_wgpu()
  try: adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
  except Exception as e: raise DeviceUnavailableError(f"no WebGPU adapter: {type(e).__name__}: {_one_line(str(e))} ({INSTALL})") from None
  if adapter is None: raise DeviceUnavailableError(f"no WebGPU adapter found ({INSTALL})")
  features = frozenset(f for f in OPTIONAL_FEATURES if f in adapter.features)
  limits = {k: adapter.limits[k] for k in COMPUTE_LIMITS if k in adapter.limits}
  try: device = adapter.request_device_sync(label="plugrad", required_features=sorted(features), required_limits=limits)
  except Exception as e:
    raise DeviceUnavailableError(f"the WebGPU adapter {adapter.info.get('device', '?')} refused a device: {_one_line(str(e))}") from None
  info = adapter.info
  return GPUContext(adapter, device, Limits.from_wgpu(device.limits), features, str(info.get("device") or "unknown adapter"),
                    str(info.get("backend_type") or "?"), str(info.get("description") or ""), info.get("adapter_type") == "CPU")


def _one_line(text: str) -> str:
  """wgpu-native's multi-line error as one line (a probe's reason is printed in a table)."""
  return " / ".join(line.strip() for line in text.splitlines() if line.strip())


def probe() -> str | None:
  """None when a WebGPU adapter and device can be had here, else why not. Never raises (the device's probe)."""
  try: gpu()
  except DeviceUnavailableError as e: return str(e)
  except Exception as e: return f"WebGPU failed to start: {type(e).__name__}: {_one_line(str(e))}"
  return None


def check_device(device: str) -> None:
  """Only one WebGPU device per process (the adapter wgpu picks): WEBGPU:1 and up are refused with the reason."""
  from plugrad.backend import parse_device
  if parse_device(device)[1] != 0:
    raise DeviceUnavailableError(f"{device}: plugrad-webgpu drives one adapter per process (WEBGPU); choose it with WGPU_BACKEND_TYPE or "
                                 "WGPUPY_WGPU_ADAPTER_NAME")
