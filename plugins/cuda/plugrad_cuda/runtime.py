"""The CUDA runtime: a program's cubin loaded with `cuModuleLoadData`, launched with `cuLaunchKernel` on the context's
stream.

Timing (`wait=True`: what `DEBUG=2` prints, what BEAM search ranks candidates by, through `ProgramRunner(..)(wait=True)`
and `plugrad.device.search.DeviceTimer.time`) is by CUDA events, never by the host clock: `CUDAProgram.timed_launch`
records the start event on the stream, launches, records the end event, waits for it and returns
`cuEventElapsedTime_v2(start, end)` — the GPU time of the kernel alone, without Python's launch overhead or the time the
stream was busy with earlier work. Events are created with the default flags (timing enabled).

The kernel ABI (also in the README and docs/writing-a-backend.md): `extern "C" __global__ void NAME(T0* buf0, ...,
int32/int64 var_a, ...)` — one device pointer per buffer in slot order, then the variables in name order (int64 for an
int64 variable, else int32); the grid is `global_size` (blocks per dimension), the block `local_size`; no dynamic
shared memory. A program whose source is PTX (ptx.py) may declare more parameters after those (zeros are passed) and
dynamic shared memory (`// plugrad.shared_bytes = N`). `Params` below is the one place that packs these arguments,
shared with the CUDA-graph runner.

UNVERIFIED HERE (no GPU on the development machine): `load` and launches run only on a GPU machine
(bench/gpu/cuda_check.sh); the argument packing is unit-tested without a driver.
"""
from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from plugrad.backend import Dims, LaunchError, Runtime, UOp, c_identifier, dtypes
from plugrad_cuda import ptx
from plugrad_cuda.driver import CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, check, context


class Params:
  """The `void**` kernelParams of one launch: one ctypes value per argument (buffers as 64-bit device pointers, then
  variables as int32/int64) and the array of their addresses. Values are updated in place, so the addresses stay valid
  for a CUDA-graph node built from them."""
  def __init__(self, nbufs: int, var_types: Sequence[Any], extra: Sequence[Any] = ()):
    self.values: list[Any] = [ctypes.c_uint64(0) for _ in range(nbufs)] + [t(0) for t in var_types]
    self.nbufs, self.nargs = nbufs, len(self.values)
    self.extra = list(extra)  # trailing parameters a PTX kernel declares beyond plugrad's (zeros, never changed)
    self.array = (ctypes.c_void_p * max(len(self.values) + len(self.extra), 1))(*[ctypes.addressof(v) for v in (*self.values, *self.extra)])

  def set(self, ptrs: Sequence[int], vals: Sequence[int]) -> Params:
    if len(ptrs) != self.nbufs or len(vals) != self.nargs - self.nbufs:
      raise LaunchError(f"kernel takes {self.nbufs} buffers and {self.nargs - self.nbufs} variables, got {len(ptrs)} and {len(vals)}")
    for v, x in zip(self.values, (*ptrs, *vals)): v.value = x
    return self

  def as_tuple(self) -> tuple[int, ...]: return tuple(v.value for v in self.values)


def ptx_abi(program: UOp, symbol: str, nargs: int) -> tuple[list[Any], int]:
  """(the zero values of the parameters a PTX program declares after plugrad's `nargs`, its dynamic shared memory bytes);
  ([], 0) for a CUDA C program. LaunchError when the PTX entry is missing or takes fewer parameters than plugrad passes."""
  try: src = program.source  # type: ignore[attr-defined]
  except Exception: return [], 0  # a binary-only program: plugrad's ABI as it is
  if not isinstance(src, str) or not ptx.is_ptx(src): return [], 0
  params = ptx.entry_params(src, symbol)
  if params is None: raise LaunchError(f"PTX program {program.name!r}: no `.entry {symbol}(...)` in its source")  # type: ignore[attr-defined]
  if len(params) < nargs:
    raise LaunchError(f"PTX program {program.name!r}: its entry takes {len(params)} parameters, plugrad passes {nargs} "  # type: ignore[attr-defined]
                      "(one per buffer, then one per variable)")
  return [ptx.zero_param(*p) for p in params[nargs:]], ptx.shared_bytes(src)


def var_types(program: UOp) -> list[Any]:
  return [ctypes.c_int64 if v.dtype in (dtypes.int64, dtypes.uint64) else ctypes.c_int32 for v in program.vars]  # type: ignore[attr-defined]


class CUDAProgram:
  def __init__(self, runtime: CUDARuntime, program: UOp):
    self.runtime, self.ctx, self.lib = runtime, runtime.ctx, runtime.ctx.lib
    self.name: str = program.name  # type: ignore[attr-defined]
    self.symbol = c_identifier(self.name)
    self.nbufs, self.var_types = len(program.globals), var_types(program)  # type: ignore[attr-defined]
    binary: bytes = program.binary  # type: ignore[attr-defined]
    self.ctx.activate()
    self.module, self.fn = ctypes.c_void_p(), ctypes.c_void_p()
    self._image = ctypes.create_string_buffer(binary, len(binary))
    check(self.lib, self.lib.cuModuleLoadData(ctypes.byref(self.module), self._image), f"cuModuleLoadData({self.name!r})")
    check(self.lib, self.lib.cuModuleGetFunction(ctypes.byref(self.fn), self.module, self.symbol.encode()), f"cuModuleGetFunction({self.symbol!r})")
    self.extra, self.shared = ptx_abi(program, self.symbol, self.nbufs + len(self.var_types))
    if self.shared > 48 << 10:  # dynamic shared memory above 48 KiB needs the function's opt-in
      check(self.lib, self.lib.cuFuncSetAttribute(self.fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, ctypes.c_int(self.shared)),
            f"cuFuncSetAttribute({self.symbol!r}, max dynamic shared memory {self.shared})")
    self.params = self.new_params()

  def new_params(self) -> Params: return Params(self.nbufs, self.var_types, [type(v)() for v in self.extra])

  def launch(self, p: Params, g: Dims, l: Dims) -> None:
    check(self.lib, self.lib.cuLaunchKernel(self.fn, *(ctypes.c_uint(x) for x in g), *(ctypes.c_uint(x) for x in l), ctypes.c_uint(self.shared),
                                            self.ctx.stream, p.array, None), f"cuLaunchKernel({self.name!r}, grid {g}, block {l})")

  def timed_launch(self, p: Params, g: Dims, l: Dims) -> float:
    """Seconds of GPU time the launch takes, measured by CUDA events around it on the stream (start recorded right
    before the launch, end right after; the host waits for the end event)."""
    check(self.lib, self.lib.cuEventRecord(self.runtime.events[0], self.ctx.stream), "cuEventRecord(start)")
    self.launch(p, g, l)
    return self.runtime.elapsed()

  def __call__(self, *handles: Any, global_size: Dims = (1, 1, 1), local_size: Dims = (1, 1, 1), vals: tuple[int, ...] = (),
               wait: bool = False) -> float | None:
    g, l = tuple(global_size) + (1,) * (3 - len(global_size)), tuple(local_size) + (1,) * (3 - len(local_size))
    if 0 in g: return 0.0 if wait else None
    p = self.params.set([h.ptr for h in handles], vals)
    self.ctx.activate()
    if wait: return self.timed_launch(p, g, l)  # type: ignore[arg-type]
    self.launch(p, g, l)  # type: ignore[arg-type]
    return None


class CUDARuntime(Runtime):
  capabilities = frozenset({"run", "timing", "transfer", "graph"})

  def __init__(self, device: str, index: int):
    super().__init__(device)
    self.ctx = context(index)
    self.events = [ctypes.c_void_p(), ctypes.c_void_p()]
    self.ctx.activate()
    for e in self.events: check(self.ctx.lib, self.ctx.lib.cuEventCreate(ctypes.byref(e), 0), "cuEventCreate")

  def load(self, program: UOp) -> CUDAProgram: return CUDAProgram(self, program)

  def elapsed(self) -> float:
    """Seconds between events[0] (recorded before the work) and now on the stream, by `cuEventElapsedTime_v2`; records
    events[1] and waits for it (and so for the work)."""
    lib, (start, end) = self.ctx.lib, self.events
    check(lib, lib.cuEventRecord(end, self.ctx.stream), "cuEventRecord")
    check(lib, lib.cuEventSynchronize(end), "cuEventSynchronize")
    ms = ctypes.c_float()
    check(lib, lib.cuEventElapsedTime_v2(ctypes.byref(ms), start, end), "cuEventElapsedTime_v2")
    return ms.value / 1e3

  def describe(self) -> str:
    c = self.ctx
    return f"{c.name} (sm_{c.cc[0]}{c.cc[1]}), driver CUDA {c.driver_version[0]}.{c.driver_version[1]}"

  def synchronize(self) -> None: self.ctx.synchronize()
