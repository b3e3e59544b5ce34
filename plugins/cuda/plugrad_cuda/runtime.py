"""The CUDA runtime: a program's cubin loaded with `cuModuleLoadData`, launched with `cuLaunchKernel` on the context's
stream; with `wait`, timed by a pair of events (the GPU time of the kernel alone).

The kernel ABI (also in the README and docs/writing-a-backend.md): `extern "C" __global__ void NAME(T0* buf0, ...,
int32/int64 var_a, ...)` — one device pointer per buffer in slot order, then the variables in name order (int64 for an
int64 variable, else int32); the grid is `global_size` (blocks per dimension), the block `local_size`; no dynamic
shared memory. `params` below is the one place that packs these arguments, shared with the CUDA-graph runner.

UNVERIFIED HERE (no GPU on the development machine): `load` and launches run only on a GPU machine
(bench/gpu/cuda_check.sh); the argument packing is unit-tested without a driver.
"""
from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from plugrad.backend import Dims, LaunchError, Runtime, UOp, c_identifier, dtypes
from plugrad_cuda.driver import check, context


class Params:
  """The `void**` kernelParams of one launch: one ctypes value per argument (buffers as 64-bit device pointers, then
  variables as int32/int64) and the array of their addresses. Values are updated in place, so the addresses stay valid
  for a CUDA-graph node built from them."""
  def __init__(self, nbufs: int, var_types: Sequence[Any]):
    self.values: list[Any] = [ctypes.c_uint64(0) for _ in range(nbufs)] + [t(0) for t in var_types]
    self.nbufs = nbufs
    self.array = (ctypes.c_void_p * max(len(self.values), 1))(*[ctypes.addressof(v) for v in self.values])

  def set(self, ptrs: Sequence[int], vals: Sequence[int]) -> Params:
    if len(ptrs) != self.nbufs or len(vals) != len(self.values) - self.nbufs:
      raise LaunchError(f"kernel takes {self.nbufs} buffers and {len(self.values) - self.nbufs} variables, got {len(ptrs)} and {len(vals)}")
    for v, x in zip(self.values, (*ptrs, *vals)): v.value = x
    return self

  def as_tuple(self) -> tuple[int, ...]: return tuple(v.value for v in self.values)


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
    self.params = Params(self.nbufs, self.var_types)

  def __call__(self, *handles: Any, global_size: Dims = (1, 1, 1), local_size: Dims = (1, 1, 1), vals: tuple[int, ...] = (),
               wait: bool = False) -> float | None:
    g, l = tuple(global_size) + (1,) * (3 - len(global_size)), tuple(local_size) + (1,) * (3 - len(local_size))
    if 0 in g: return 0.0 if wait else None
    p = self.params.set([h.ptr for h in handles], vals)
    self.ctx.activate()
    lib, stream = self.lib, self.ctx.stream
    if wait: check(lib, lib.cuEventRecord(self.runtime.events[0], stream), "cuEventRecord")
    check(lib, lib.cuLaunchKernel(self.fn, *(ctypes.c_uint(x) for x in g), *(ctypes.c_uint(x) for x in l), ctypes.c_uint(0), stream,
                                  p.array, None), f"cuLaunchKernel({self.name!r}, grid {g}, block {l})")
    if not wait: return None
    return self.runtime.elapsed()


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
    """Seconds between events[0] (recorded before the work) and now on the stream; waits for the work."""
    lib, (start, end) = self.ctx.lib, self.events
    check(lib, lib.cuEventRecord(end, self.ctx.stream), "cuEventRecord")
    check(lib, lib.cuEventSynchronize(end), "cuEventSynchronize")
    ms = ctypes.c_float()
    check(lib, lib.cuEventElapsedTime(ctypes.byref(ms), start, end), "cuEventElapsedTime")
    return ms.value / 1e3

  def describe(self) -> str:
    c = self.ctx
    return f"{c.name} (sm_{c.cc[0]}{c.cc[1]}), driver CUDA {c.driver_version[0]}.{c.driver_version[1]}"

  def synchronize(self) -> None: self.ctx.synchronize()
