"""The CUDA driver API (`libcuda.so.1`, installed with the NVIDIA driver) through ctypes: loading, error names, and
the probe. No toolkit is needed at run time; the kernels are compiled by the NVRTC wheel (nvrtc.py).

Only what plugrad uses is declared (PROTOTYPES, bound by `Driver`); every call goes through `check`, which raises
`CUDAError` with the driver's `cuGetErrorName`/`cuGetErrorString` and the call that failed. UNVERIFIED ON A GPU: the
development machines have none; the declarations are checked against cuda.h and run against a C stand-in for libcuda
in tests/test_cuda_standin.py, the real driver only on a GPU machine (bench/gpu/cuda_check.sh).
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
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


class CUDAError(DeviceError):
  """A driver call failed: `code` is the CUresult, `name` its CUDA_ERROR_* name."""
  def __init__(self, message: str, code: int = -1, name: str = ""):
    super().__init__(message)
    self.code, self.name = code, name


class CUDAOutOfMemory(CUDAError, MemoryError):
  """CUDA_ERROR_OUT_OF_MEMORY (the allocator lists it in `oom_errors`: the base frees its cache and retries)."""


# Every driver function plugrad calls, by the exported symbol cuda.h maps its name to (`cuMemAlloc` is `cuMemAlloc_v2`):
# per parameter, the C type as cuda.h spells it and the ctypes type passed; all return CUresult (an int). Calls go
# through these argtypes only (`Driver`), so a size_t or a 64-bit pointer never travels as a 32-bit C int.
# tests/test_cuda_standin.py compiles them against the real cuda.h (the types must match the header's prototypes, the
# ctypes sizes and kinds the C types'), and drives the allocator, runtime and graph runner through a C stand-in.
_u32, _i32, _u64, _size, _ptr = ctypes.c_uint, ctypes.c_int, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p
_pp = ctypes.POINTER(ctypes.c_void_p)  # an out-parameter for a handle (CUstream*, CUevent*, void**, ...)
PROTOTYPES: dict[str, tuple[tuple[str, Any], ...]] = {
  "cuGetErrorName": (("CUresult", _i32), ("const char **", ctypes.POINTER(ctypes.c_char_p))),
  "cuGetErrorString": (("CUresult", _i32), ("const char **", ctypes.POINTER(ctypes.c_char_p))),
  "cuInit": (("unsigned int", _u32),),
  "cuDriverGetVersion": (("int *", ctypes.POINTER(_i32)),),
  "cuDeviceGetCount": (("int *", ctypes.POINTER(_i32)),),
  "cuDeviceGet": (("CUdevice *", ctypes.POINTER(_i32)), ("int", _i32)),
  "cuDeviceGetName": (("char *", ctypes.c_char_p), ("int", _i32), ("CUdevice", _i32)),
  "cuDeviceGetAttribute": (("int *", ctypes.POINTER(_i32)), ("CUdevice_attribute", _i32), ("CUdevice", _i32)),
  "cuDevicePrimaryCtxRetain": (("CUcontext *", _pp), ("CUdevice", _i32)),
  "cuCtxSetCurrent": (("CUcontext", _ptr),),
  "cuStreamCreate": (("CUstream *", _pp), ("unsigned int", _u32)),
  "cuStreamSynchronize": (("CUstream", _ptr),),
  "cuMemAlloc_v2": (("CUdeviceptr *", ctypes.POINTER(_u64)), ("size_t", _size)),
  "cuMemFree_v2": (("CUdeviceptr", _u64),),
  "cuMemHostAlloc": (("void **", _pp), ("size_t", _size), ("unsigned int", _u32)),
  "cuMemcpyHtoDAsync_v2": (("CUdeviceptr", _u64), ("const void *", _ptr), ("size_t", _size), ("CUstream", _ptr)),
  "cuMemcpyDtoHAsync_v2": (("void *", _ptr), ("CUdeviceptr", _u64), ("size_t", _size), ("CUstream", _ptr)),
  "cuMemcpyPeerAsync": (("CUdeviceptr", _u64), ("CUcontext", _ptr), ("CUdeviceptr", _u64), ("CUcontext", _ptr), ("size_t", _size),
                        ("CUstream", _ptr)),
  "cuEventCreate": (("CUevent *", _pp), ("unsigned int", _u32)),
  "cuEventRecord": (("CUevent", _ptr), ("CUstream", _ptr)),
  "cuEventSynchronize": (("CUevent", _ptr),),
  "cuEventElapsedTime_v2": (("float *", ctypes.POINTER(ctypes.c_float)), ("CUevent", _ptr), ("CUevent", _ptr)),
  "cuModuleLoadData": (("CUmodule *", _pp), ("const void *", _ptr)),
  "cuModuleGetFunction": (("CUfunction *", _pp), ("CUmodule", _ptr), ("const char *", ctypes.c_char_p)),
  "cuFuncSetAttribute": (("CUfunction", _ptr), ("CUfunction_attribute", _i32), ("int", _i32)),
  "cuLaunchKernel": (("CUfunction", _ptr), *((("unsigned int", _u32),) * 7), ("CUstream", _ptr), ("void **", _pp), ("void **", _pp)),
  "cuGraphCreate": (("CUgraph *", _pp), ("unsigned int", _u32)),
  "cuGraphAddKernelNode_v2": (("CUgraphNode *", _pp), ("CUgraph", _ptr), ("const CUgraphNode *", _pp), ("size_t", _size),
                              ("const CUDA_KERNEL_NODE_PARAMS *", _ptr)),
  "cuGraphInstantiateWithFlags": (("CUgraphExec *", _pp), ("CUgraph", _ptr), ("unsigned long long", ctypes.c_ulonglong)),
  "cuGraphExecKernelNodeSetParams_v2": (("CUgraphExec", _ptr), ("CUgraphNode", _ptr), ("const CUDA_KERNEL_NODE_PARAMS *", _ptr)),
  "cuGraphLaunch": (("CUgraphExec", _ptr), ("CUstream", _ptr)),
  "cuGraphExecDestroy": (("CUgraphExec", _ptr),),
  "cuGraphDestroy": (("CUgraph", _ptr),),
}
# the enum values and macros above, by their cuda.h names (checked against the header with the prototypes)
CONSTANTS = {n: globals()[n] for n in ("CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY", "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR",
                                       "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR", "CU_EVENT_DEFAULT", "CU_STREAM_NON_BLOCKING",
                                       "CU_MEMHOSTALLOC_PORTABLE", "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES")}


class DriverSignatureError(DeviceError):
  """A driver function plugrad has no prototype for, or a library that lacks a declared symbol."""


class Driver:
  """A driver library with every function of PROTOTYPES bound to its argtypes (restype CUresult). Only those exist
  here: an undeclared name is a DriverSignatureError, never ctypes' untyped default (ints as 32-bit C ints)."""
  def __init__(self, lib: ctypes.CDLL, prototypes: dict[str, tuple[tuple[str, Any], ...]] | None = None):
    self.lib, self.path = lib, getattr(lib, "_name", "?")
    for name, params in (PROTOTYPES if prototypes is None else prototypes).items():
      try: fn = getattr(lib, name)
      except AttributeError:
        # a driver older than the header's cuEventElapsedTime -> _v2 mapping exports only the legacy name (same prototype)
        if name != "cuEventElapsedTime_v2" or not hasattr(lib, "cuEventElapsedTime"):
          raise DriverSignatureError(f"{self.path} has no {name}: the NVIDIA driver is too old for plugrad-cuda") from None
        fn = lib.cuEventElapsedTime
      fn.argtypes, fn.restype = [t for _, t in params], ctypes.c_int
      setattr(self, name, fn)

  def __getattr__(self, name: str) -> Any:  # only reached for names PROTOTYPES does not declare
    raise DriverSignatureError(f"{name} is not declared in plugrad_cuda.driver.PROTOTYPES: add its cuda.h prototype before calling it")


def load_libcuda() -> Driver:
  """The driver library with its prototypes bound; OSError when it is not installed."""
  return Driver(ctypes.CDLL(LIBCUDA))


def error_text(lib: Any, code: int) -> tuple[str, str]:
  """(CUDA_ERROR_* name, description) of a CUresult."""
  name, desc = ctypes.c_char_p(), ctypes.c_char_p()
  try:
    lib.cuGetErrorName(code, ctypes.byref(name))
    lib.cuGetErrorString(code, ctypes.byref(desc))
  except (AttributeError, OSError, DeviceError): pass
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
  except DriverSignatureError as e: return str(e)
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

