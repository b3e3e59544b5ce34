"""WEBGPU memory: storage buffers, filled and read back through mapped staging buffers.

WebGPU copies and bindings work on multiples of 4 bytes, so every buffer is allocated rounded up to a word (at least one
word: a binding may not be empty); the padding is never read back. Views are not supported: a storage binding's
offset must be a multiple of the adapter's `min-storage-buffer-offset-alignment`, and plugrad views start anywhere.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from plugrad.backend import Allocator, BufferSpec


def padded(nbytes: int) -> int: return max(4, (nbytes + 3) & ~3)


class WGPUBuffer:
  """A handle: the GPUBuffer and the bytes the plugrad buffer holds (the GPUBuffer may be a little larger)."""
  __slots__ = ("buf", "nbytes")

  def __init__(self, buf: Any, nbytes: int): self.buf, self.nbytes = buf, nbytes
  def __repr__(self) -> str: return f"<WGPUBuffer {self.nbytes} bytes>"


def _bytes(mv: memoryview) -> np.ndarray:
  if not isinstance(mv, memoryview): raise TypeError(f"expected a memoryview, got {type(mv).__name__}")
  return np.frombuffer(mv if mv.format == "B" and mv.ndim == 1 and mv.c_contiguous else mv.cast("B"), np.uint8)


class WebGPUAllocator(Allocator[WGPUBuffer]):
  """Storage buffers on the process's WebGPU device (`gpu` is a `context.GPUContext`)."""
  def __init__(self, device: str, gpu: Any):
    super().__init__(device)
    import wgpu
    self.gpu, self.dev, self.wgpu = gpu, gpu.device, wgpu
    self.usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    self.oom_errors = (wgpu.GPUOutOfMemoryError,)
    # Every GPUBuffer stays reachable from here until `_free`. A plugrad Buffer that dies in a reference cycle returns its
    # handle to the allocator's cache from its finalizer; without this reference the GPUBuffer would be finalized in the
    # same garbage collection (wgpu-py releases the native buffer in __del__) and the cache would hand out a dead buffer.
    self._owned: set[Any] = set()

  def _alloc(self, nbytes: int, options: BufferSpec | None) -> WGPUBuffer:
    if (size := padded(nbytes)) > self.gpu.limits.buffer_size:
      raise MemoryError(f"{nbytes} bytes is more than one buffer may hold on {self.gpu.adapter_name} (max-buffer-size {self.gpu.limits.buffer_size})")
    buf = self.dev.create_buffer(label="plugrad", size=size, usage=self.usage)
    self._owned.add(buf)
    return WGPUBuffer(buf, nbytes)

  def _free(self, handle: WGPUBuffer, nbytes: int, options: BufferSpec | None) -> None:
    self._owned.discard(handle.buf)
    handle.buf.destroy()

  def _copyin(self, handle: WGPUBuffer, src: memoryview) -> None:
    data = _bytes(src)
    if data.size != handle.nbytes: raise ValueError(f"{self.device}: copyin of {data.size} bytes into a buffer of {handle.nbytes}")
    # queue.write_buffer copies the bytes now into wgpu's own mapped staging memory and schedules the copy into the buffer
    # (a staging buffer of ours, mapped at creation, would do the same with two more objects per copy)
    self.dev.queue.write_buffer(handle.buf, 0, data.tobytes() + b"\0" * (padded(data.size) - data.size))

  def _copyout(self, dest: memoryview, handle: WGPUBuffer) -> None:
    out = _bytes(dest)
    if out.size != handle.nbytes: raise ValueError(f"{self.device}: copyout of a buffer of {handle.nbytes} bytes into {out.size}")
    if out.size and not out.flags.writeable: raise ValueError(f"{self.device}: copyout into a read-only memoryview")
    mu = self.wgpu.BufferUsage
    staging = self.dev.create_buffer(label="plugrad staging out", size=padded(out.size), usage=mu.COPY_DST | mu.MAP_READ)
    enc = self.dev.create_command_encoder()
    enc.copy_buffer_to_buffer(handle.buf, 0, staging, 0, padded(out.size))
    self.dev.queue.submit([enc.finish()])
    staging.map_sync(self.wgpu.MapMode.READ)  # waits for the copy, and so for every kernel queued before it
    try: out[:] = np.frombuffer(staging.read_mapped(0, padded(out.size), copy=False), np.uint8)[:out.size]
    finally:
      staging.unmap()
      staging.destroy()

  def _transfer(self, dest: WGPUBuffer, src: WGPUBuffer, nbytes: int, src_dev: Allocator, dest_dev: Allocator) -> None:
    enc = self.dev.create_command_encoder()
    enc.copy_buffer_to_buffer(src.buf, 0, dest.buf, 0, padded(nbytes))
    self.dev.queue.submit([enc.finish()])
