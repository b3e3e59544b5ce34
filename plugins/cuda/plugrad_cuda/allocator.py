"""CUDA memory: `cuMemAlloc` device buffers; host copies through pinned staging buffers on the context's stream.

UNVERIFIED HERE (no GPU on the development machine): written against the driver API, run by bench/gpu/cuda_check.sh.

A copy in goes host → pinned staging (a memcpy) → device (`cuMemcpyHtoDAsync`): the staging buffer, not the caller's
memory, is what the DMA reads, so `_copyin` may return before the copy is done. The staging buffer is reused once its
event has completed. A copy out waits for the stream (kernels that write the buffer were launched on it), so the
base's contract "waits for pending device work" holds.
"""
from __future__ import annotations

import ctypes
from typing import Any

from plugrad.backend import Allocator, BufferSpec
from plugrad_cuda.driver import CU_MEMHOSTALLOC_PORTABLE, CUDAOutOfMemory, check, context


class CUDABuffer:
  """A handle: the device pointer (CUdeviceptr) and its size."""
  __slots__ = ("ptr", "nbytes")

  def __init__(self, ptr: int, nbytes: int): self.ptr, self.nbytes = ptr, nbytes
  def __repr__(self) -> str: return f"<CUDABuffer 0x{self.ptr:x} {self.nbytes} bytes>"


class Staging:
  """A pinned host buffer with the event of the last copy that used it."""
  def __init__(self, lib: Any, nbytes: int):
    self.lib, self.nbytes, self.ptr = lib, nbytes, ctypes.c_void_p()
    check(lib, lib.cuMemHostAlloc(ctypes.byref(self.ptr), ctypes.c_size_t(nbytes), CU_MEMHOSTALLOC_PORTABLE), f"cuMemHostAlloc({nbytes})")
    self.event = ctypes.c_void_p()
    check(lib, lib.cuEventCreate(ctypes.byref(self.event), 0), "cuEventCreate")

  def view(self, n: int) -> memoryview:
    return memoryview((ctypes.c_ubyte * n).from_address(self.ptr.value or 0)).cast("B")

  def wait(self) -> None: check(self.lib, self.lib.cuEventSynchronize(self.event), "cuEventSynchronize")


class CUDAAllocator(Allocator[CUDABuffer]):
  oom_errors = (CUDAOutOfMemory,)
  STAGING = 4 << 20  # bytes per pinned staging buffer; larger copies go in chunks

  def __init__(self, device: str, index: int):
    super().__init__(device)
    self.ctx = context(index)
    self.lib = self.ctx.lib
    self._staging: list[Staging] = []
    self._next = 0

  def _alloc(self, nbytes: int, options: BufferSpec | None) -> CUDABuffer:
    self.ctx.activate()
    ptr = ctypes.c_uint64()
    check(self.lib, self.lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(max(nbytes, 1))), f"cuMemAlloc({nbytes})")
    return CUDABuffer(ptr.value, nbytes)

  def _free(self, handle: CUDABuffer, nbytes: int, options: BufferSpec | None) -> None:
    self.ctx.synchronize()  # a kernel still running may use it
    check(self.lib, self.lib.cuMemFree_v2(ctypes.c_uint64(handle.ptr)), "cuMemFree")

  def _stage(self) -> Staging:
    # two buffers alternate: filling one while the DMA reads the other
    while len(self._staging) < 2: self._staging.append(Staging(self.lib, self.STAGING))
    s = self._staging[self._next]
    self._next ^= 1
    s.wait()
    return s

  def _copyin(self, handle: CUDABuffer, src: memoryview) -> None:
    self.ctx.activate()
    data = src.cast("B") if src.format != "B" or src.ndim != 1 else src
    for off in range(0, len(data), self.STAGING):
      n = min(self.STAGING, len(data) - off)
      s = self._stage()
      s.view(n)[:] = data[off:off + n]
      dst = ctypes.c_uint64(handle.ptr + off)
      check(self.lib, self.lib.cuMemcpyHtoDAsync_v2(dst, s.ptr, ctypes.c_size_t(n), self.ctx.stream), "cuMemcpyHtoDAsync")
      check(self.lib, self.lib.cuEventRecord(s.event, self.ctx.stream), "cuEventRecord")

  def _copyout(self, dest: memoryview, handle: CUDABuffer) -> None:
    self.ctx.activate()
    out = dest.cast("B") if dest.format != "B" or dest.ndim != 1 else dest
    for off in range(0, len(out), self.STAGING):
      n = min(self.STAGING, len(out) - off)
      s = self._stage()
      src = ctypes.c_uint64(handle.ptr + off)
      check(self.lib, self.lib.cuMemcpyDtoHAsync_v2(s.ptr, src, ctypes.c_size_t(n), self.ctx.stream), "cuMemcpyDtoHAsync")
      check(self.lib, self.lib.cuEventRecord(s.event, self.ctx.stream), "cuEventRecord")
      s.wait()
      out[off:off + n] = s.view(n)

  def _transfer(self, dest: CUDABuffer, src: CUDABuffer, nbytes: int, src_dev: Allocator, dest_dev: Allocator) -> None:
    # between two contexts (CUDA:0 → CUDA:1): the driver picks peer-to-peer or a copy through the host
    assert isinstance(src_dev, CUDAAllocator) and isinstance(dest_dev, CUDAAllocator)
    src_dev.ctx.synchronize()
    dest_dev.ctx.activate()
    check(self.lib, self.lib.cuMemcpyPeerAsync(ctypes.c_uint64(dest.ptr), dest_dev.ctx.ctx, ctypes.c_uint64(src.ptr), src_dev.ctx.ctx,
                                               ctypes.c_size_t(nbytes), dest_dev.ctx.stream), "cuMemcpyPeerAsync")
