"""HIP (`libamdhip64.so`, ROCm's runtime) through ctypes: loading, error names, the probe and the device's arch.

Only what plugrad uses is declared; every call goes through `check`, which raises `HIPError` with `hipGetErrorName`
/ `hipGetErrorString` and the call that failed. UNVERIFIED: no AMD GPU and no ROCm exist on this project's machines,
so everything past the probe's "not found" branch is written against HIP's documented API (hip_runtime_api.h,
ROCm 6) and has never run against the real library. The probe and the calls are tested with a stand-in (plugins/amd/tests).
"""
from __future__ import annotations

import ctypes
import functools
import re
from typing import Any

from plugrad.backend import DeviceError, DeviceUnavailableError

LIBS = ("libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5", "/opt/rocm/lib/libamdhip64.so")
hipSuccess = 0
hipErrorOutOfMemory = 2
hipStreamNonBlocking = 1
hipMemcpyHostToDevice, hipMemcpyDeviceToHost = 1, 2
hipHostMallocPortable = 1
PROPS_BYTES = 8192  # hipDeviceProp_t is about 1.5 KiB (R0600); read into a larger buffer, its layout changes between releases
_ARCH_RE = re.compile(rb"gfx[0-9a-f]+(?::[a-z0-9_-]+[+-])*")


class HIPError(DeviceError):
  """A HIP call failed: `code` is the hipError_t, `name` its hipError* name."""
  def __init__(self, message: str, code: int = -1, name: str = ""):
    super().__init__(message)
    self.code, self.name = code, name


class HIPOutOfMemory(HIPError, MemoryError):
  """hipErrorOutOfMemory (the allocator lists it in `oom_errors`: the base frees its cache and retries)."""


def load_libhip() -> Any:
  """The HIP runtime library; OSError when ROCm is not installed."""
  errors = []
  for name in LIBS:
    try: lib = ctypes.CDLL(name)
    except OSError as e:
      errors.append(str(e))
      continue
    for fn in ("hipGetErrorName", "hipGetErrorString"): getattr(lib, fn).restype = ctypes.c_char_p
    return lib
  raise OSError("; ".join(errors))


def error_text(lib: Any, code: int) -> tuple[str, str]:
  """(hipError* name, description) of a hipError_t."""
  try: name, desc = lib.hipGetErrorName(code), lib.hipGetErrorString(code)
  except (AttributeError, OSError): name, desc = None, None
  def text(x: Any) -> str: return x.decode(errors="replace") if isinstance(x, bytes) else x if isinstance(x, str) else ""
  return text(name) or "hipErrorUnknown", text(desc)


def check(lib: Any, code: int, what: str) -> None:
  """Raise HIPError (HIPOutOfMemory for hipErrorOutOfMemory) when `code` is not hipSuccess."""
  if code == hipSuccess: return
  name, desc = error_text(lib, code)
  cls = HIPOutOfMemory if code == hipErrorOutOfMemory else HIPError
  raise cls(f"{what} failed: {name} ({code}): {desc}", code, name)


def arch_of(lib: Any, index: int) -> tuple[str, str]:
  """(marketing name, target ID such as `gfx942:sramecc+:xnack-`) of device `index`, read from hipDeviceProp_t: the
  name is its first field; the gcnArchName field is found by its contents, since its offset differs between ROCm 5's
  hipGetDeviceProperties and ROCm 6's hipGetDevicePropertiesR0600."""
  props = (ctypes.c_char * PROPS_BYTES)()
  fn = getattr(lib, "hipGetDevicePropertiesR0600", None) or lib.hipGetDeviceProperties
  check(lib, fn(props, index), f"hipGetDeviceProperties({index})")
  raw = bytes(props)
  name = raw[:256].split(b"\0", 1)[0].decode(errors="replace")
  if (m := _ARCH_RE.search(raw, 256)) is None: raise HIPError(f"hipGetDeviceProperties({index}) has no gfx arch name")
  return name, m.group(0).decode()


def probe_with(load: Any) -> str | None:
  """Why the AMD device cannot be used here (None: it can), using `load()` to get the HIP library. Never raises."""
  from plugrad_amd.targets import ARCHS, base_arch
  try: lib = load()
  except OSError:
    return ("no HIP runtime (libamdhip64.so not found): install ROCm on a machine with an AMD GPU; without one the AMD kernels can "
            "still be rendered and compiled (AMD_ARCH=gfx942 or gfx1100, see plugrad-amd's README)")
  try:
    if (code := lib.hipInit(0)) != hipSuccess:
      name, desc = error_text(lib, code)
      return f"HIP failed to initialize: hipInit returned {name} ({desc or code})"
    n = ctypes.c_int()
    if (code := lib.hipGetDeviceCount(ctypes.byref(n))) != hipSuccess:
      name, desc = error_text(lib, code)
      return f"no AMD GPU: hipGetDeviceCount returned {name} ({desc or code})"
    if n.value == 0: return "HIP reports no AMD GPUs (HIP_VISIBLE_DEVICES or ROCR_VISIBLE_DEVICES may hide them)"
    gpu, target = arch_of(lib, 0)
    if (arch := base_arch(target)) not in ARCHS:
      return f"the GPU ({gpu}, {target}) is an arch plugrad-amd does not support: {arch}; supported: {', '.join(ARCHS)}"
  except Exception as e:  # a broken ROCm install must not break `python -m plugrad devices`
    return f"the HIP runtime could not be queried: {type(e).__name__}: {e}"
  return None


def probe() -> str | None:
  return probe_with(load_libhip)


@functools.cache
def hip() -> Any:
  """The initialized HIP library (once per process)."""
  try: lib = load_libhip()
  except OSError as e: raise DeviceUnavailableError(f"no HIP runtime (libamdhip64.so not found): {e}") from None
  check(lib, lib.hipInit(0), "hipInit")
  return lib


def device_count() -> int:
  n = ctypes.c_int()
  check(hip(), hip().hipGetDeviceCount(ctypes.byref(n)), "hipGetDeviceCount")
  return n.value


class Context:
  """Device `index` made current before each use (HIP's current device is per thread), with one non-blocking stream."""
  def __init__(self, index: int):
    lib = self.lib = hip()
    if not 0 <= index < (n := device_count()): raise DeviceError(f"AMD:{index} does not exist: HIP reports {n} device(s)")
    self.index = index
    self.activate()
    self.stream = ctypes.c_void_p()
    check(lib, lib.hipStreamCreateWithFlags(ctypes.byref(self.stream), hipStreamNonBlocking), "hipStreamCreateWithFlags")
    self.name, self.target = arch_of(lib, index)
    ver = ctypes.c_int()
    check(lib, lib.hipRuntimeGetVersion(ctypes.byref(ver)), "hipRuntimeGetVersion")
    self.runtime_version = ver.value  # HIP_VERSION: major * 10000000 + minor * 100000 + patch

  def activate(self) -> None: check(self.lib, self.lib.hipSetDevice(self.index), f"hipSetDevice({self.index})")

  def synchronize(self) -> None:
    self.activate()
    check(self.lib, self.lib.hipStreamSynchronize(self.stream), "hipStreamSynchronize")


@functools.cache
def context(index: int) -> Context:
  """One context per device index (`AMD` is 0, `AMD:1` is 1)."""
  return Context(index)


def device_arch(index: int) -> str:
  """The base arch (gfx942, ...) of device `index`."""
  from plugrad_amd.targets import base_arch
  return base_arch(arch_of(hip(), index)[1])
