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

from plugrad.backend import Allocator, BufferSpec
from plugrad_amd.hip import HIPOutOfMemory, check, context, hipHostMallocPortable, hipMemcpyDeviceToHost, hipMemcpyHostToDevice


class HIPBuffer:
  """A handle: the device pointer and its size."""
  __slots__ = ("ptr", "nbytes")

  def __init__(self, ptr: int, nbytes: int): self.ptr, self.nbytes = ptr, nbytes
  def __repr__(self) -> str: return f"<HIPBuffer 0x{self.ptr:x} {self.nbytes} bytes>"


class Staging:
  """A pinned host buffer with the event of the last copy that used it."""
  def __init__(self, lib: Any, nbytes: int):
    self.lib, self.nbytes, self.ptr = lib, nbytes, ctypes.c_void_p()
    check(lib, lib.hipHostMalloc(ctypes.byref(self.ptr), ctypes.c_size_t(nbytes), hipHostMallocPortable), f"hipHostMalloc({nbytes})")
    self.event = ctypes.c_void_p()
    check(lib, lib.hipEventCreate(ctypes.byref(self.event)), "hipEventCreate")

  def view(self, n: int) -> memoryview: return memoryview((ctypes.c_ubyte * n).from_address(self.ptr.value or 0)).cast("B")
  def wait(self) -> None: check(self.lib, self.lib.hipEventSynchronize(self.event), "hipEventSynchronize")


class HIPAllocator(Allocator[HIPBuffer]):
  oom_errors = (HIPOutOfMemory,)
  STAGING = 4 << 20  # bytes per pinned staging buffer; larger copies go in chunks

  def __init__(self, device: str, index: int):
    super().__init__(device)
    self.ctx = context(index)
    self.lib = self.ctx.lib
    self._staging: list[Staging] = []
    self._next = 0

  def _alloc(self, nbytes: int, options: BufferSpec | None) -> HIPBuffer:
    self.ctx.activate()
    ptr = ctypes.c_void_p()
    check(self.lib, self.lib.hipMalloc(ctypes.byref(ptr), ctypes.c_size_t(max(nbytes, 1))), f"hipMalloc({nbytes})")
    return HIPBuffer(ptr.value or 0, nbytes)

  def _free(self, handle: HIPBuffer, nbytes: int, options: BufferSpec | None) -> None:
    self.ctx.synchronize()  # a kernel still running may use it
    check(self.lib, self.lib.hipFree(ctypes.c_void_p(handle.ptr)), "hipFree")

  def _stage(self) -> Staging:
    # two buffers alternate: filling one while the DMA reads the other
    while len(self._staging) < 2: self._staging.append(Staging(self.lib, self.STAGING))
    s = self._staging[self._next]
    self._next ^= 1
    s.wait()
    return s

  def _copyin(self, handle: HIPBuffer, src: memoryview) -> None:
    self.ctx.activate()
    data = src.cast("B") if src.format != "B" or src.ndim != 1 else src
    for off in range(0, len(data), self.STAGING):
      n = min(self.STAGING, len(data) - off)
      s = self._stage()
      s.view(n)[:] = data[off:off + n]
      check(self.lib, self.lib.hipMemcpyAsync(ctypes.c_void_p(handle.ptr + off), s.ptr, ctypes.c_size_t(n), hipMemcpyHostToDevice,
                                              self.ctx.stream), "hipMemcpyAsync(host to device)")
      check(self.lib, self.lib.hipEventRecord(s.event, self.ctx.stream), "hipEventRecord")

  def _copyout(self, dest: memoryview, handle: HIPBuffer) -> None:
    self.ctx.activate()
    out = dest.cast("B") if dest.format != "B" or dest.ndim != 1 else dest
    for off in range(0, len(out), self.STAGING):
      n = min(self.STAGING, len(out) - off)
      s = self._stage()
      check(self.lib, self.lib.hipMemcpyAsync(s.ptr, ctypes.c_void_p(handle.ptr + off), ctypes.c_size_t(n), hipMemcpyDeviceToHost,
                                              self.ctx.stream), "hipMemcpyAsync(device to host)")
      check(self.lib, self.lib.hipEventRecord(s.event, self.ctx.stream), "hipEventRecord")
      s.wait()
      out[off:off + n] = s.view(n)

  def _transfer(self, dest: HIPBuffer, src: HIPBuffer, nbytes: int, src_dev: Allocator, dest_dev: Allocator) -> None:
    # between two devices (AMD:0 → AMD:1): HIP picks peer-to-peer or a copy through the host
    assert isinstance(src_dev, HIPAllocator) and isinstance(dest_dev, HIPAllocator)
    src_dev.ctx.synchronize()
    dest_dev.ctx.activate()
    check(self.lib, self.lib.hipMemcpyPeerAsync(ctypes.c_void_p(dest.ptr), dest_dev.ctx.index, ctypes.c_void_p(src.ptr), src_dev.ctx.index,
                                                ctypes.c_size_t(nbytes), dest_dev.ctx.stream), "hipMemcpyPeerAsync")
