"""Registration of the WEBGPU device (entry point `plugrad: webgpu`). Only the core's plugin API is imported here;
wgpu is imported by the probe and inside the hooks, when the device is first listed or used."""
from __future__ import annotations

from typing import Any

from plugrad.backend import DeviceSpec, for_device, hookimpl

NAME = "WEBGPU"


def probe() -> str | None:
  from plugrad_webgpu.context import probe as find
  return find()


@hookimpl
def plugrad_devices() -> list[DeviceSpec]:
  # priority 50: below CPU (100) when both are installed; a real GPU adapter is still slower to reach than the host here
  # count=1: one adapter per process (WGPU_BACKEND_TYPE / WGPUPY_WGPU_ADAPTER_NAME pick it), so WEBGPU:1 does not exist
  return [DeviceSpec(NAME, api=(2, 5), priority=50, probe=probe, aliases=("WGPU",), count=1,
                     description="WGSL compute shaders through wgpu-native (any WebGPU adapter, Mesa's software rasterizer included)")]


def _gpu(device: str) -> Any:
  from plugrad_webgpu.context import check_device, gpu
  check_device(device)
  return gpu()


@hookimpl
@for_device(NAME)
def plugrad_renderer(device: str) -> Any:
  from plugrad_webgpu.renderer import WGSLRenderer
  g = _gpu(device)
  return WGSLRenderer(device, g.limits, g.float16, g.adapter_name)


@hookimpl
@for_device(NAME)
def plugrad_compiler(device: str) -> Any:
  import wgpu

  from plugrad_webgpu.compiler import WGSLCompiler
  g = _gpu(device)
  return WGSLCompiler(g.device, wgpu.__version__, g.adapter_name)


@hookimpl
@for_device(NAME)
def plugrad_allocator(device: str) -> Any:
  from plugrad_webgpu.allocator import WebGPUAllocator
  return WebGPUAllocator(device, _gpu(device))


@hookimpl
@for_device(NAME)
def plugrad_runtime(device: str) -> Any:
  from plugrad_webgpu.runtime import WebGPURuntime
  return WebGPURuntime(device, _gpu(device))


@hookimpl
@for_device(NAME)
def plugrad_graph(device: str) -> Any:
  from plugrad_webgpu.graph import WebGPUGraph
  return WebGPUGraph


# tensor-level suite tests that need 64-bit dtypes without gating on the capability (the kernel-level tests are gated)
XFAILS = {
  "test_getitem_tensor_index": "indexes with an int64 index tensor; WGSL has no 64-bit integers (UnsupportedDTypeError)",
}


@hookimpl
@for_device(NAME)
def plugrad_conformance_xfails(device: str) -> dict[str, str] | None:
  return dict(XFAILS)
