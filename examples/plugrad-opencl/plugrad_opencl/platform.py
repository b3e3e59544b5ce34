"""The OpenCL devices of this machine and the one context and in-order queue each gets.

`OPENCL:i` is the i-th device over all platforms, in the order the ICD loader lists them. Nothing here touches the
driver until a function is called; the scan and each device's context are made once per process.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

from plugrad.backend import DeviceUnavailableError, parse_device

INSTALL = "pip install pyopencl pocl-binary-distribution (PoCL: an OpenCL CPU device from pip), or install your GPU vendor's OpenCL driver"


@dataclass(frozen=True)
class DeviceInfo:
  """What the renderer and compiler need to know about a device; `generic()` when there is none to ask (offline)."""
  name: str
  platform: str
  version: str               # CL_DEVICE_VERSION
  driver: str                # CL_DRIVER_VERSION
  extensions: frozenset[str]
  max_work_group: int        # CL_DEVICE_MAX_WORK_GROUP_SIZE (all dimensions together)
  max_work_items: tuple[int, int, int]
  local_mem: int             # bytes of __local memory
  fp64: bool
  int64: bool                # the embedded profile may lack 64-bit integers
  exact_div_sqrt: bool       # the device can round float32 / and sqrt correctly (-cl-fp32-correctly-rounded-divide-sqrt)

  @property
  def fp16(self) -> bool: return "cl_khr_fp16" in self.extensions

  @property
  def identity(self) -> str: return f"{self.platform} | {self.name} | {self.version} | driver {self.driver}"

  @staticmethod
  def generic() -> DeviceInfo:
    """An OpenCL 1.2 full-profile device with no optional extensions: what the render tier assumes without a device."""
    return DeviceInfo("generic OpenCL 1.2 device", "none", "OpenCL 1.2", "none", frozenset(), 256, (256, 256, 64), 32768, False, True, False)


def _platform_error(e: BaseException) -> str:
  vendors = os.environ.get("OCL_ICD_VENDORS")
  hint = f"; OCL_ICD_VENDORS={vendors!r} is set: it must name an existing directory of .icd files or one .icd file" if vendors else ""
  return f"no OpenCL platform found ({type(e).__name__}: {e}){hint}; {INSTALL}"


@functools.cache
def scan() -> tuple[tuple[Any, ...], str | None]:
  """(the OpenCL devices, None) or ((), why there are none and what to do). Never raises."""
  try:
    import pyopencl as cl
  except ModuleNotFoundError as e:
    if e.name == "pyopencl": return (), f"pyopencl is not installed: {INSTALL}"
    return (), f"pyopencl failed to import ({e}); reinstall it: {INSTALL}"
  except Exception as e: return (), f"pyopencl failed to import ({type(e).__name__}: {e}); reinstall it: {INSTALL}"
  try: platforms = cl.get_platforms()
  except Exception as e: return (), _platform_error(e)
  found: list[Any] = []
  for p in platforms:
    try: found += p.get_devices()
    except cl.Error: pass  # a platform without devices (DEVICE_NOT_FOUND): the others may have some
  if not found: return (), f"the OpenCL platforms here ({', '.join(p.name for p in platforms) or 'none'}) have no devices; {INSTALL}"
  # a device whose driver cannot build programs is no device: PoCL's LLVM, for one, does not know every new CPU (it
  # asks for target CPU 'generic' and every build fails)
  broken = {d: why for d in found if (why := _build_fails(cl, d)) is not None}
  if len(broken) == len(found):
    return (), "no OpenCL device here can build programs: " + "; ".join(f"{d.name.strip()}: {why}" for d, why in broken.items())
  return tuple(d for d in found if d not in broken), None


def _build_fails(cl: Any, d: Any) -> str | None:
  """None when the device's driver builds a one-line kernel, else the first line of its build error."""
  try:
    cl.Program(cl.Context(devices=[d]), "__kernel void plugrad_probe(__global float* a) { a[0] = 1.0f; }").build()
    return None
  except Exception as e:
    lines = [line.strip() for line in str(e).splitlines() if line.strip() and not line.startswith(("clBuildProgram", "Build on", "="))]
    return (lines[0] if lines else type(e).__name__)[:200]


def probe() -> str | None:
  return scan()[1]


def count() -> int: return len(scan()[0])


def cl_device(device: str) -> Any:
  """The pyopencl Device behind `OPENCL` / `OPENCL:i`; DeviceUnavailableError when there is none."""
  devs, why = scan()
  index = parse_device(device)[1]
  if why is not None: raise DeviceUnavailableError(f"{device}: {why}")
  if index >= len(devs): raise DeviceUnavailableError(f"{device}: this machine has {len(devs)} OpenCL device(s) (OPENCL to OPENCL:{len(devs) - 1})")
  return devs[index]


def device_info(device: str) -> DeviceInfo:
  """The capabilities of `device`, or `DeviceInfo.generic()` when it does not exist here (the render tier offline)."""
  devs, why = scan()
  if why is not None or parse_device(device)[1] >= len(devs): return DeviceInfo.generic()
  import pyopencl as cl
  d = cl_device(device)
  ext = frozenset(d.extensions.split())
  embedded = d.profile.strip() == "EMBEDDED_PROFILE"
  items = tuple(d.max_work_item_sizes)[:3]
  return DeviceInfo(d.name.strip(), d.platform.name.strip(), d.version.strip(), d.driver_version.strip(), ext, int(d.max_work_group_size),
                    (int(items[0]), int(items[1]), int(items[2])), int(d.local_mem_size),
                    "cl_khr_fp64" in ext or bool(d.double_fp_config), not embedded or "cles_khr_int64" in ext,
                    bool(d.single_fp_config & cl.device_fp_config.CORRECTLY_ROUNDED_DIVIDE_SQRT))


@dataclass(frozen=True)
class Handles:
  """One device's pyopencl objects: everything of a device runs on its one in-order queue."""
  device: Any
  context: Any
  queue: Any
  timed: bool  # the queue records event times (PROFILING_ENABLE)


@functools.cache
def handles(device: str) -> Handles:
  import pyopencl as cl
  d = cl_device(device)
  ctx = cl.Context(devices=[d])
  try: return Handles(d, ctx, cl.CommandQueue(ctx, d, properties=cl.command_queue_properties.PROFILING_ENABLE), True)
  except cl.Error: return Handles(d, ctx, cl.CommandQueue(ctx, d), False)  # a queue without profiling: launches are timed by the host
