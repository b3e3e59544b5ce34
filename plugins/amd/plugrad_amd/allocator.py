"""AMD memory: `hipMalloc` device buffers behind the core's allocator (its LRU cache of freed buffers and its
out-of-memory retry: `hipErrorOutOfMemory` frees the cache and tries again); host copies through pinned staging
buffers with `hipMemcpyAsync` on the device's stream.

UNVERIFIED (no AMD GPU on this project's machines): written against HIP's documented API, never run against HIP;
plugins/amd/tests drives it through a stand-in library that records the calls (amd_fake_hip.py there).

A copy in goes host → pinned staging (a memcpy) → device: the staging buffer, not the caller's memory, is what the
DMA reads, so `_copyin` may return before the copy is done. A staging buffer is reused once its event has completed.
A copy out waits for its event (kernels writing the buffer were launched on the same stream before it).
"""
from __future__ import annotations

import ctypes
from typing import Any

from plugrad.backend import Allocator, BufferSpec, StagedAllocator
from plugrad_amd.hip import HIPOutOfMemory, check, context, hipHostMallocPortable, hipMemcpyDeviceToHost, hipMemcpyHostToDevice


class HIPBuffer:
  """A handle: the device pointer and its size."""
  __slots__ = ("ptr", "nbytes")

  def __init__(self, ptr: int, nbytes: int): self.ptr, self.nbytes = ptr, nbytes
  def __repr__(self) -> str: return f"<HIPBuffer 0x{self.ptr:x} {self.nbytes} bytes>"


class HIPAllocator(StagedAllocator[HIPBuffer]):
  oom_errors = (HIPOutOfMemory,)

  def __init__(self, device: str, index: int):
    super().__init__(device)
    self.ctx = context(index)
    self.lib = self.ctx.lib

  def _alloc(self, nbytes: int, options: BufferSpec | None) -> HIPBuffer:
    self.ctx.activate()
    ptr = ctypes.c_void_p()
    check(self.lib, self.lib.hipMalloc(ctypes.byref(ptr), ctypes.c_size_t(max(nbytes, 1))), f"hipMalloc({nbytes})")
    return HIPBuffer(ptr.value or 0, nbytes)

  def _free(self, handle: HIPBuffer, nbytes: int, options: BufferSpec | None) -> None:
    self.ctx.synchronize()  # a kernel still running may use it
    check(self.lib, self.lib.hipFree(ctypes.c_void_p(handle.ptr)), "hipFree")

  # the staged copies (StagedAllocator): pinned host buffers, async copies and events on the device's stream
  def _activate(self) -> None: self.ctx.activate()

  def _pinned(self, nbytes: int) -> tuple[int, Any]:
    ptr, event = ctypes.c_void_p(), ctypes.c_void_p()
    check(self.lib, self.lib.hipHostMalloc(ctypes.byref(ptr), ctypes.c_size_t(nbytes), hipHostMallocPortable), f"hipHostMalloc({nbytes})")
    check(self.lib, self.lib.hipEventCreate(ctypes.byref(event)), "hipEventCreate")
    return ptr.value or 0, event

  def _dma_in(self, handle: HIPBuffer, offset: int, host: int, nbytes: int) -> None:
    check(self.lib, self.lib.hipMemcpyAsync(ctypes.c_void_p(handle.ptr + offset), ctypes.c_void_p(host), ctypes.c_size_t(nbytes),
                                            hipMemcpyHostToDevice, self.ctx.stream), "hipMemcpyAsync(host to device)")

  def _dma_out(self, host: int, handle: HIPBuffer, offset: int, nbytes: int) -> None:
    check(self.lib, self.lib.hipMemcpyAsync(ctypes.c_void_p(host), ctypes.c_void_p(handle.ptr + offset), ctypes.c_size_t(nbytes),
                                            hipMemcpyDeviceToHost, self.ctx.stream), "hipMemcpyAsync(device to host)")

  def _record(self, event: Any) -> None: check(self.lib, self.lib.hipEventRecord(event, self.ctx.stream), "hipEventRecord")
  def _wait_event(self, event: Any) -> None: check(self.lib, self.lib.hipEventSynchronize(event), "hipEventSynchronize")

  def _transfer(self, dest: HIPBuffer, src: HIPBuffer, nbytes: int, src_dev: Allocator, dest_dev: Allocator) -> None:
    # between two devices (AMD:0 → AMD:1): HIP picks peer-to-peer or a copy through the host
    assert isinstance(src_dev, HIPAllocator) and isinstance(dest_dev, HIPAllocator)
    src_dev.ctx.synchronize()
    dest_dev.ctx.activate()
    check(self.lib, self.lib.hipMemcpyPeerAsync(ctypes.c_void_p(dest.ptr), dest_dev.ctx.index, ctypes.c_void_p(src.ptr), src_dev.ctx.index,
                                                ctypes.c_size_t(nbytes), dest_dev.ctx.stream), "hipMemcpyPeerAsync")
