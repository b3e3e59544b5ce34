"""METAL memory: shared-storage MTLBuffers (CPU and GPU see the same memory on Apple silicon), with the core's LRU
reuse cache (the `Allocator` base). A handle is the MTLBuffer, a byte offset into it (views) and a size.

Host access (`_copyin`, `_copyout`, `_as_memoryview`) waits for the device's committed command buffers first: kernels
read and write the same memory, and nothing orders the CPU's writes after them otherwise.

UNVERIFIED: written against Apple's documented API through pyobjc (`newBufferWithLength_options_`, `contents()`
as a buffer); no Mac is available to this project.
"""
from __future__ import annotations

from typing import Any

from plugrad.backend import Allocator, BufferSpec
from plugrad_metal.context import context, metal


class MetalBuffer:
  """A handle: the MTLBuffer, the offset of this view in it and its size in bytes."""
  __slots__ = ("buf", "offset", "nbytes")

  def __init__(self, buf: Any, offset: int, nbytes: int): self.buf, self.offset, self.nbytes = buf, offset, nbytes
  def __repr__(self) -> str: return f"<MetalBuffer +{self.offset} {self.nbytes} bytes>"


class MetalAllocator(Allocator[MetalBuffer]):
  def __init__(self, device: str, index: int):
    super().__init__(device)
    self.ctx = context(index)
    self._live: dict[int, Any] = {}  # the MTLBuffers of handles not yet freed (pyobjc releases an MTLBuffer with its last reference)

  def _alloc(self, nbytes: int, options: BufferSpec | None) -> MetalBuffer:
    buf = self.ctx.device.newBufferWithLength_options_(max(nbytes, 1), metal().MTLResourceStorageModeShared)
    if buf is None: raise MemoryError(f"METAL: newBufferWithLength({nbytes}) returned nil")
    h = MetalBuffer(buf, 0, nbytes)
    self._live[id(h)] = buf
    return h

  def _free(self, handle: MetalBuffer, nbytes: int, options: BufferSpec | None) -> None:
    self.ctx.synchronize()  # a command buffer still running may use it
    self._live.pop(id(handle), None)

  def view(self, h: MetalBuffer) -> memoryview:
    return h.buf.contents().as_buffer(h.offset + h.nbytes)[h.offset:h.offset + h.nbytes]

  def _copyin(self, handle: MetalBuffer, src: memoryview) -> None:
    self.ctx.synchronize()
    data = src.cast("B") if src.format != "B" or src.ndim != 1 else src
    self.view(handle)[:len(data)] = data

  def _copyout(self, dest: memoryview, handle: MetalBuffer) -> None:
    self.ctx.synchronize()
    out = dest.cast("B") if dest.format != "B" or dest.ndim != 1 else dest
    out[:] = self.view(handle)[:len(out)]

  def _offset(self, handle: MetalBuffer, offset: int, nbytes: int) -> MetalBuffer:
    return MetalBuffer(handle.buf, handle.offset + offset, nbytes)

  def _as_memoryview(self, handle: MetalBuffer, nbytes: int) -> memoryview:
    self.ctx.synchronize()
    return self.view(handle)[:nbytes]
