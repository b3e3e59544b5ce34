"""Host memory for the CPU device: 64-byte aligned (a cache line; the widest vector loads), shared zero-copy with numpy."""
from __future__ import annotations

import ctypes

import numpy as np

from plugrad.backend import Allocator, BufferSpec

ALIGN = 64


class CPUBuffer:
  """A handle: the address kernels get, and the numpy array that owns (a view of) the memory."""
  __slots__ = ("addr", "mem", "nbytes")

  def __init__(self, mem: np.ndarray, addr: int):
    self.mem, self.nbytes, self.addr = mem, mem.nbytes, addr  # numpy does not report the address of an empty slice: keep our own

  def __repr__(self) -> str: return f"<CPUBuffer {self.nbytes} bytes at {self.addr:#x}>"


def _bytes(mv: memoryview) -> np.ndarray:
  if not isinstance(mv, memoryview): raise TypeError(f"expected a memoryview, got {type(mv).__name__}")
  return np.frombuffer(mv if mv.format == "B" and mv.ndim == 1 and mv.c_contiguous else mv.cast("B"), np.uint8)


class CPUAllocator(Allocator[CPUBuffer]):
  """Zero-initialized, 64-byte aligned numpy memory; views share it; `_as_memoryview` is the memory itself."""
  def _alloc(self, nbytes: int, options: BufferSpec | None) -> CPUBuffer:
    raw = np.zeros(nbytes + ALIGN, np.uint8)  # calloc: large buffers are zero pages until written
    start = -raw.ctypes.data % ALIGN
    return CPUBuffer(raw[start:start + nbytes], raw.ctypes.data + start)

  def _free(self, handle: CPUBuffer, nbytes: int, options: BufferSpec | None) -> None: pass  # numpy frees it with the last view

  def _copyin(self, handle: CPUBuffer, src: memoryview) -> None:
    data = _bytes(src)
    if data.size != handle.nbytes: raise ValueError(f"{self.device}: copyin of {data.size} bytes into a buffer of {handle.nbytes}")
    ctypes.memmove(handle.addr, data.ctypes.data, data.size)

  def _copyout(self, dest: memoryview, handle: CPUBuffer) -> None:
    out = _bytes(dest)
    if out.size != handle.nbytes: raise ValueError(f"{self.device}: copyout of a buffer of {handle.nbytes} bytes into {out.size}")
    if out.size and not out.flags.writeable: raise ValueError(f"{self.device}: copyout into a read-only memoryview")
    ctypes.memmove(out.ctypes.data, handle.addr, out.size)

  def _offset(self, handle: CPUBuffer, offset: int, nbytes: int) -> CPUBuffer:
    if offset < 0 or nbytes < 0 or offset + nbytes > handle.nbytes:
      raise ValueError(f"{self.device}: a view of {nbytes} bytes at offset {offset} does not fit a buffer of {handle.nbytes} bytes")
    return CPUBuffer(handle.mem[offset:offset + nbytes], handle.addr + offset)

  def _as_memoryview(self, handle: CPUBuffer, nbytes: int) -> memoryview:
    if nbytes != handle.nbytes: raise ValueError(f"{self.device}: asked for {nbytes} bytes of a buffer of {handle.nbytes}")
    return handle.mem.data  # kernels run synchronously: nothing is pending
