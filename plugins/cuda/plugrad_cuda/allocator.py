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

from plugrad.backend import Allocator, BufferSpec, StagedAllocator
from plugrad_cuda.driver import CU_MEMHOSTALLOC_PORTABLE, CUDAOutOfMemory, check, context


class CUDABuffer:
  """A handle: the device pointer (CUdeviceptr) and its size."""
  __slots__ = ("ptr", "nbytes")

  def __init__(self, ptr: int, nbytes: int): self.ptr, self.nbytes = ptr, nbytes
  def __repr__(self) -> str: return f"<CUDABuffer 0x{self.ptr:x} {self.nbytes} bytes>"


class CUDAAllocator(StagedAllocator[CUDABuffer]):
  oom_errors = (CUDAOutOfMemory,)

  def __init__(self, device: str, index: int):
    super().__init__(device)
    self.ctx = context(index)
    self.lib = self.ctx.lib

  def _alloc(self, nbytes: int, options: BufferSpec | None) -> CUDABuffer:
    self.ctx.activate()
    ptr = ctypes.c_uint64()
    check(self.lib, self.lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(max(nbytes, 1))), f"cuMemAlloc({nbytes})")
    return CUDABuffer(ptr.value, nbytes)

  def _free(self, handle: CUDABuffer, nbytes: int, options: BufferSpec | None) -> None:
    self.ctx.synchronize()  # a kernel still running may use it
    check(self.lib, self.lib.cuMemFree_v2(ctypes.c_uint64(handle.ptr)), "cuMemFree")

  # the staged copies (StagedAllocator): pinned host buffers, async copies and events on the context's stream
  def _activate(self) -> None: self.ctx.activate()

  def _pinned(self, nbytes: int) -> tuple[int, Any]:
    ptr, event = ctypes.c_void_p(), ctypes.c_void_p()
    check(self.lib, self.lib.cuMemHostAlloc(ctypes.byref(ptr), ctypes.c_size_t(nbytes), CU_MEMHOSTALLOC_PORTABLE), f"cuMemHostAlloc({nbytes})")
    check(self.lib, self.lib.cuEventCreate(ctypes.byref(event), 0), "cuEventCreate")
    return ptr.value or 0, event

  def _dma_in(self, handle: CUDABuffer, offset: int, host: int, nbytes: int) -> None:
    check(self.lib, self.lib.cuMemcpyHtoDAsync_v2(ctypes.c_uint64(handle.ptr + offset), ctypes.c_void_p(host), ctypes.c_size_t(nbytes),
                                                  self.ctx.stream), "cuMemcpyHtoDAsync")

  def _dma_out(self, host: int, handle: CUDABuffer, offset: int, nbytes: int) -> None:
    check(self.lib, self.lib.cuMemcpyDtoHAsync_v2(ctypes.c_void_p(host), ctypes.c_uint64(handle.ptr + offset), ctypes.c_size_t(nbytes),
                                                  self.ctx.stream), "cuMemcpyDtoHAsync")

  def _record(self, event: Any) -> None: check(self.lib, self.lib.cuEventRecord(event, self.ctx.stream), "cuEventRecord")
  def _wait_event(self, event: Any) -> None: check(self.lib, self.lib.cuEventSynchronize(event), "cuEventSynchronize")

  def _transfer(self, dest: CUDABuffer, src: CUDABuffer, nbytes: int, src_dev: Allocator, dest_dev: Allocator) -> None:
    # between two contexts (CUDA:0 → CUDA:1): the driver picks peer-to-peer or a copy through the host
    assert isinstance(src_dev, CUDAAllocator) and isinstance(dest_dev, CUDAAllocator)
    src_dev.ctx.synchronize()
    dest_dev.ctx.activate()
    check(self.lib, self.lib.cuMemcpyPeerAsync(ctypes.c_uint64(dest.ptr), dest_dev.ctx.ctx, ctypes.c_uint64(src.ptr), src_dev.ctx.ctx,
                                               ctypes.c_size_t(nbytes), dest_dev.ctx.stream), "cuMemcpyPeerAsync")
