"""StagedAllocator (plugrad.backend): host copies through two alternating pinned staging buffers in chunks, as the CUDA
and AMD allocators use it. The "device" here is host memory behind the driver calls, with a queue of copies that only
run when an event is waited on, as a DMA engine's would: a staging buffer refilled before its copy ran would corrupt
the data, so the round trips below fail if the allocator skips a wait."""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest

from plugrad.backend import BufferSpec, StagedAllocator


class Event:
  def __init__(self) -> None: self.mark = 0  # how many of the stream's copies were queued when it was recorded


class QueuedDevice(StagedAllocator[ctypes.Array]):
  STAGING = 64

  def __init__(self) -> None:
    super().__init__("FAKE")
    self.queue: list[Any] = []  # copies queued on the "stream", run in order when an event recorded after them is waited on
    self.done = 0
    self.pinned = 0
    self.log: list[str] = []
    self._keep: list[ctypes.Array] = []

  def _alloc(self, nbytes: int, options: BufferSpec | None) -> ctypes.Array: return (ctypes.c_ubyte * max(nbytes, 1))()
  def _free(self, handle: ctypes.Array, nbytes: int, options: BufferSpec | None) -> None: pass

  def _pinned(self, nbytes: int) -> tuple[int, Any]:
    self.pinned += 1
    buf = (ctypes.c_ubyte * nbytes)()
    self._keep.append(buf)
    return ctypes.addressof(buf), Event()

  def _dma_in(self, handle: ctypes.Array, offset: int, host: int, nbytes: int) -> None:
    self.queue.append(lambda: ctypes.memmove(ctypes.addressof(handle) + offset, host, nbytes))
  def _dma_out(self, host: int, handle: ctypes.Array, offset: int, nbytes: int) -> None:
    self.queue.append(lambda: ctypes.memmove(host, ctypes.addressof(handle) + offset, nbytes))
  def _record(self, event: Event) -> None:
    event.mark = len(self.queue)
    self.log.append("record")
  def _wait_event(self, event: Event) -> None:  # a stream runs in order: an event completes after everything queued before it
    while self.done < event.mark:
      self.queue[self.done]()
      self.done += 1
    self.log.append("wait")


@pytest.mark.parametrize("nbytes", [0, 1, 63, 64, 65, 64 * 3 + 5])
def test_round_trip_through_the_staging_buffers(nbytes: int):
  dev = QueuedDevice()
  data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
  h = dev.alloc(nbytes)
  dev.copyin(h, memoryview(data.tobytes()))
  out = bytearray(nbytes)
  dev.copyout(memoryview(out), h)
  assert bytes(out) == data.tobytes()
  assert dev.pinned == (2 if nbytes else 0)  # two buffers alternate, made on first use, never more


def test_a_copy_in_may_return_before_the_device_has_the_data():
  dev = QueuedDevice()
  h = dev.alloc(10)
  dev.copyin(h, memoryview(bytes(range(10))))
  assert bytes(h) == bytes(10) and dev.log == ["wait", "record"]  # queued: the DMA reads the staging buffer later
  out = bytearray(10)
  dev.copyout(memoryview(out), h)  # waits for its own chunk's event, which ran the copy in queued before it too
  assert bytes(out) == bytes(range(10))


def test_a_view_of_another_format_is_copied_as_bytes():
  dev = QueuedDevice()
  x = np.arange(40, dtype=np.float32)
  h = dev.alloc(x.nbytes)
  dev.copyin(h, memoryview(x))
  out = np.empty_like(x)
  dev.copyout(memoryview(out), h)
  assert np.array_equal(out, x)
