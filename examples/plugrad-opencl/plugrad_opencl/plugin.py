"""Registration only: importing this module must stay cheap (pyopencl and the components are imported inside the hooks)."""
from __future__ import annotations

from typing import Any

from plugrad.backend import DeviceSpec, for_device, hookimpl

NAME = "OPENCL"


def probe() -> str | None:
  from plugrad_opencl.platform import probe as scan_probe
  return scan_probe()


def count() -> int:
  from plugrad_opencl.platform import count as scan_count
  return scan_count()


@hookimpl
def plugrad_devices() -> list[DeviceSpec]:
  # below CPU (100) and WEBGPU (50): OPENCL is chosen only by DEV=OPENCL, or where neither is installed
  return [DeviceSpec(NAME, api=(2, 5), priority=30, probe=probe, aliases=("CL",), count=count,
                     description="OpenCL C kernels through pyopencl (any OpenCL 1.2+ platform; PoCL for the CPU)")]


@hookimpl
@for_device(NAME)
def plugrad_renderer(device: str) -> Any:
  from plugrad_opencl.platform import device_info
  from plugrad_opencl.renderer import OpenCLRenderer
  return OpenCLRenderer(device, device_info(device))


@hookimpl
@for_device(NAME)
def plugrad_compiler(device: str) -> Any:
  from plugrad_opencl.compiler import OpenCLCompiler
  from plugrad_opencl.platform import cl_device, device_info
  cl_device(device)  # OpenCL compiles with the driver: without a device there is no compiler (DeviceUnavailableError)
  return OpenCLCompiler(device, device_info(device))


@hookimpl
@for_device(NAME)
def plugrad_allocator(device: str) -> Any:
  from plugrad_opencl.runtime import OpenCLAllocator
  return OpenCLAllocator(device)


@hookimpl
@for_device(NAME)
def plugrad_runtime(device: str) -> Any:
  from plugrad_opencl.runtime import OpenCLRuntime
  return OpenCLRuntime(device)


@hookimpl
@for_device(NAME)
def plugrad_graph(device: str) -> Any:
  from plugrad_opencl.graph import OpenCLGraph
  return OpenCLGraph


@hookimpl
@for_device(NAME)
def plugrad_conformance_xfails(device: str) -> dict[str, str] | None:
  if (why := probe()) is None: return None
  # OpenCL has no offline compiler: the driver builds the program for a device, so without one only render and emulate run
  return {"test_kernel[*-compile]": f"OpenCL compiles with the driver of a device, and there is none here ({why})"}
