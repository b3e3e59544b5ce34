"""The CUDA driver API (`libcuda.so.1`, installed with the NVIDIA driver) through ctypes: loading, error names, and
the probe. No toolkit is needed at run time; the kernels are compiled by the NVRTC wheel (nvrtc.py).

Only what plugrad uses is declared; every call goes through `check`, which raises `CUDAError` with the driver's
`cuGetErrorName`/`cuGetErrorString` and the call that failed. UNVERIFIED HERE: this machine has no GPU and no
libcuda, so everything below the probe's "not found" branch runs only on a GPU machine (bench/gpu/cuda_check.sh).
"""
from __future__ import annotations

import ctypes
import functools
from typing import Any

from plugrad.backend import DeviceError

LIBCUDA = "libcuda.so.1"
CUDA_SUCCESS = 0
CUDA_ERROR_OUT_OF_MEMORY = 2
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CU_EVENT_DEFAULT = 0
CU_STREAM_NON_BLOCKING = 1
CU_MEMHOSTALLOC_PORTABLE = 1


class CUDAError(DeviceError):
  """A driver call failed: `code` is the CUresult, `name` its CUDA_ERROR_* name."""
  def __init__(self, message: str, code: int = -1, name: str = ""):
    super().__init__(message)
    self.code, self.name = code, name


class CUDAOutOfMemory(CUDAError, MemoryError):
  """CUDA_ERROR_OUT_OF_MEMORY (the allocator lists it in `oom_errors`: the base frees its cache and retries)."""


def load_libcuda() -> ctypes.CDLL:
  """The driver library; OSError when it is not installed."""
  return ctypes.CDLL(LIBCUDA)


def error_text(lib: Any, code: int) -> tuple[str, str]:
  """(CUDA_ERROR_* name, description) of a CUresult."""
  name, desc = ctypes.c_char_p(), ctypes.c_char_p()
  try:
    lib.cuGetErrorName(code, ctypes.byref(name))
    lib.cuGetErrorString(code, ctypes.byref(desc))
  except (AttributeError, OSError): pass
  return (name.value or b"CUDA_ERROR_UNKNOWN").decode(), (desc.value or b"").decode()


def check(lib: Any, code: int, what: str) -> None:
  """Raise CUDAError (CUDAOutOfMemory for CUDA_ERROR_OUT_OF_MEMORY) when `code` is not CUDA_SUCCESS."""
  if code == CUDA_SUCCESS: return
  name, desc = error_text(lib, code)
  cls = CUDAOutOfMemory if code == CUDA_ERROR_OUT_OF_MEMORY else CUDAError
  raise cls(f"{what} failed: {name} ({code}): {desc}", code, name)


def probe_with(load: Any) -> str | None:
  """Why CUDA cannot be used here (None: it can), using `load()` to get the driver library. Never raises."""
  try: lib = load()
  except OSError:
    return ("no NVIDIA driver (libcuda.so.1 not found): install the NVIDIA driver on a machine with an NVIDIA GPU; "
            "without one the CUDA kernels can still be rendered and compiled (see plugrad-cuda's README)")
  try:
    if (code := lib.cuInit(0)) != CUDA_SUCCESS:
      name, desc = error_text(lib, code)
      return f"the NVIDIA driver failed to initialize: cuInit returned {name} ({desc or code})"
    n = ctypes.c_int()
    if (code := lib.cuDeviceGetCount(ctypes.byref(n))) != CUDA_SUCCESS:
      name, desc = error_text(lib, code)
      return f"cuDeviceGetCount returned {name} ({desc or code})"
    if n.value == 0: return "the NVIDIA driver reports no CUDA devices (CUDA_VISIBLE_DEVICES may hide them)"
  except Exception as e:  # a broken driver install must not break `python -m plugrad devices`
    return f"the NVIDIA driver could not be queried: {type(e).__name__}: {e}"
  return None


def probe() -> str | None:
  return probe_with(load_libcuda)


@functools.cache
def cuda() -> Any:
  """The initialized driver library (once per process)."""
  try: lib = load_libcuda()
  except OSError as e:
    from plugrad.backend import DeviceUnavailableError
    raise DeviceUnavailableError(f"no NVIDIA driver (libcuda.so.1 not found): {e}") from None
  check(lib, lib.cuInit(0), "cuInit")
  return lib


def device_count() -> int:
  n = ctypes.c_int()
  check(cuda(), cuda().cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
  return n.value


def compute_capability(index: int) -> tuple[int, int]:
  lib, dev = cuda(), ctypes.c_int()
  check(lib, lib.cuDeviceGet(ctypes.byref(dev), index), f"cuDeviceGet({index})")
  major, minor = ctypes.c_int(), ctypes.c_int()
  check(lib, lib.cuDeviceGetAttribute(ctypes.byref(major), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cuDeviceGetAttribute")
  check(lib, lib.cuDeviceGetAttribute(ctypes.byref(minor), CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cuDeviceGetAttribute")
  return major.value, minor.value


class Context:
  """The primary context of device `index`, retained for the process, with one non-blocking stream for all work."""
  def __init__(self, index: int):
    lib = self.lib = cuda()
    if not 0 <= index < (n := device_count()): raise DeviceError(f"CUDA:{index} does not exist: the driver reports {n} device(s)")
    self.index, self.dev = index, ctypes.c_int()
    check(lib, lib.cuDeviceGet(ctypes.byref(self.dev), index), f"cuDeviceGet({index})")
    self.ctx = ctypes.c_void_p()
    check(lib, lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), self.dev), "cuDevicePrimaryCtxRetain")
    self.activate()
    self.stream = ctypes.c_void_p()
    check(lib, lib.cuStreamCreate(ctypes.byref(self.stream), CU_STREAM_NON_BLOCKING), "cuStreamCreate")
    name = ctypes.create_string_buffer(256)
    check(lib, lib.cuDeviceGetName(name, 256, self.dev), "cuDeviceGetName")
    self.name, self.cc = name.value.decode(errors="replace"), compute_capability(index)
    ver = ctypes.c_int()
    check(lib, lib.cuDriverGetVersion(ctypes.byref(ver)), "cuDriverGetVersion")
    self.driver_version = (ver.value // 1000, ver.value % 1000 // 10)

  def activate(self) -> None: check(self.lib, self.lib.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

  def synchronize(self) -> None:
    self.activate()
    check(self.lib, self.lib.cuStreamSynchronize(self.stream), "cuStreamSynchronize")


@functools.cache
def context(index: int) -> Context:
  """One context per device index (`CUDA` is 0, `CUDA:1` is 1)."""
  return Context(index)

