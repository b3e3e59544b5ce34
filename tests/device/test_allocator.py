"""The Allocator base: the cache of freed buffers, byte accounting and out-of-memory recovery, on a real host-memory allocator."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from plugrad.device.allocator import Allocator, BufferSpec
from plugrad.device.buffer import Buffer
from plugrad.dtype import dtypes
from plugrad.errors import OutOfMemoryError
from plugrad.helpers import Context


class HostAllocator(Allocator[np.ndarray]):
  """Host memory as numpy byte arrays, with an optional budget past which `_alloc` raises MemoryError like a full device."""
  def __init__(self, device: str = "HOST", budget: int | None = None):
    super().__init__(device)
    self.budget, self.held = budget, 0
    self.calls = {"alloc": 0, "free": 0, "transfer": 0}

  def _alloc(self, nbytes: int, options: BufferSpec | None) -> np.ndarray:
    self.calls["alloc"] += 1
    if self.budget is not None and self.held + nbytes > self.budget: raise MemoryError(f"{nbytes} bytes requested, {self.budget - self.held} free")
    self.held += nbytes
    return np.zeros(nbytes, np.uint8)

  def _free(self, handle: np.ndarray, nbytes: int, options: BufferSpec | None) -> None:
    self.calls["free"] += 1
    self.held -= nbytes

  def _copyin(self, handle: np.ndarray, src: memoryview) -> None: handle[:] = np.frombuffer(src, np.uint8)
  def _copyout(self, dest: memoryview, handle: np.ndarray) -> None: dest[:] = handle.data
  def _offset(self, handle: np.ndarray, offset: int, nbytes: int) -> np.ndarray: return handle[offset:offset + nbytes]
  def _as_memoryview(self, handle: np.ndarray, nbytes: int) -> memoryview: return memoryview(handle)

  def _transfer(self, dest: np.ndarray, src: np.ndarray, nbytes: int, src_dev: Allocator, dest_dev: Allocator) -> None:
    self.calls["transfer"] += 1
    dest[:nbytes] = src[:nbytes]


class BytesAllocator(Allocator[bytearray]):
  """The minimum a backend must write: no views, no transfers, no zero-copy host access."""
  def _alloc(self, nbytes: int, options: BufferSpec | None) -> bytearray: return bytearray(nbytes)
  def _free(self, handle: bytearray, nbytes: int, options: BufferSpec | None) -> None: pass
  def _copyin(self, handle: bytearray, src: memoryview) -> None: handle[:] = src
  def _copyout(self, dest: memoryview, handle: bytearray) -> None: dest[:] = handle


class DriverOOM(Exception):
  """What a driver binding raises when the device is full (not a MemoryError)."""


class DriverAllocator(HostAllocator):
  oom_errors = (DriverOOM,)

  def _alloc(self, nbytes: int, options: BufferSpec | None) -> np.ndarray:
    try: return super()._alloc(nbytes, options)
    except MemoryError as e: raise DriverOOM("CUDA_ERROR_OUT_OF_MEMORY") from e


def test_freed_buffer_is_reused_for_the_same_size_and_options():
  a = HostAllocator()
  h = a.alloc(64)
  a.free(h, 64)
  assert (a.mem_used, a.cached_bytes) == (0, 64)
  assert a.alloc(64) is h and a.calls["alloc"] == 1 and a.cached_bytes == 0
  assert a.alloc(64) is not h and a.calls["alloc"] == 2


def test_cache_key_includes_size_and_options():
  a = HostAllocator()
  h = a.alloc(64, BufferSpec(host=True))
  a.free(h, 64, BufferSpec(host=True))
  assert a.alloc(32) is not h
  assert a.alloc(64) is not h
  assert a.alloc(64, BufferSpec(cpu_access=True)) is not h
  assert a.alloc(64, BufferSpec(host=True)) is h


def test_nolru_and_lru_off_free_to_the_device():
  a = HostAllocator()
  a.free(a.alloc(16, BufferSpec(nolru=True)), 16, BufferSpec(nolru=True))
  assert (a.cached_bytes, a.held, a.calls["free"]) == (0, 0, 1)
  with Context(PLUGRAD_LRU=0):
    a.free(a.alloc(16), 16)
  assert (a.cached_bytes, a.held, a.calls["free"]) == (0, 0, 2)


def test_accounting_and_free_cache():
  a = HostAllocator()
  h1, h2 = a.alloc(100), a.alloc(50)
  assert (a.mem_used, a.peak) == (150, 150)
  a.free(h1, 100)
  assert (a.mem_used, a.peak, a.cached_bytes, a.held) == (50, 150, 100, 150)
  a.alloc(10)
  assert (a.mem_used, a.peak) == (60, 150)
  a.free(h2, 50)
  a.free_cache()
  assert (a.cached_bytes, a.held, a.calls["free"]) == (0, 10, 2)
  assert "HOST" in repr(a) and "10 bytes used" in repr(a)


def test_zero_byte_allocation_is_valid():
  a = HostAllocator()
  h = a.alloc(0)
  assert h.nbytes == 0 and a.mem_used == 0
  a.free(h, 0)
  assert a.alloc(0) is h


def test_oom_frees_the_cache_and_retries_once():
  a = HostAllocator(budget=100)
  a.free(a.alloc(60), 60)
  assert (a.cached_bytes, a.held) == (60, 60)
  h = a.alloc(80)  # does not fit next to the cached 60 bytes: the cache is freed, then the retry fits
  assert h.nbytes == 80 and a.calls["alloc"] == 3 and a.calls["free"] == 1
  assert (a.cached_bytes, a.mem_used, a.held) == (0, 80, 80)


def test_oom_after_retry_raises_with_sizes():
  a = HostAllocator("TESTDEV:1", budget=100)
  a.alloc(60)
  a.free(a.alloc(30), 30)
  with pytest.raises(OutOfMemoryError) as ei:
    a.alloc(80)
  msg = str(ei.value)
  assert "TESTDEV:1" in msg and "allocating 80 bytes" in msg and "60 bytes in use" in msg and "freed 30 bytes" in msg
  assert isinstance(ei.value, MemoryError) and isinstance(ei.value.__cause__, MemoryError)
  assert a.calls["alloc"] == 4 and (a.mem_used, a.cached_bytes, a.held) == (60, 0, 60)  # nothing half-done


def test_oom_of_a_driver_error_type():
  a = DriverAllocator(budget=10)
  with pytest.raises(OutOfMemoryError, match="CUDA_ERROR_OUT_OF_MEMORY"):
    a.alloc(11)
  assert a.calls["alloc"] == 2


def test_other_alloc_errors_are_not_treated_as_oom():
  class Broken(HostAllocator):
    def _alloc(self, nbytes: int, options: BufferSpec | None) -> np.ndarray: raise OSError("driver not loaded")
  with pytest.raises(OSError, match="driver not loaded"):
    Broken().alloc(8)


def test_oom_collects_buffers_that_died_in_cycles():
  a = HostAllocator(budget=100)
  gc.disable()
  try:
    b = Buffer("HOST", 20, dtypes.float32, allocator=a).allocate()
    b.cycle = b  # type: ignore[attr-defined]
    del b  # unreachable, but only the cycle collector can free it
    assert a.mem_used == 80
    assert a.alloc(80).nbytes == 80
  finally: gc.enable()
  assert (a.mem_used, a.cached_bytes) == (80, 0)


def test_bad_requests():
  a = HostAllocator()
  with pytest.raises(ValueError, match=">= 0"): a.alloc(-1)
  with pytest.raises(TypeError, match="nbytes must be an int"): a.alloc(1.5)  # type: ignore[arg-type]
  with pytest.raises(TypeError, match="BufferSpec"): a.alloc(4, {"host": True})  # type: ignore[arg-type]
  h = a.alloc(4)
  a.free(h, 4)
  with pytest.raises(ValueError, match="double free"): a.free(h, 4)
  with pytest.raises(TypeError, match="device name"): HostAllocator("")


def test_optional_features_are_detected():
  full, minimal = HostAllocator(), BytesAllocator("MIN")
  assert (full.supports_views, full.supports_transfer, full.supports_memoryview) == (True, True, True)
  assert (minimal.supports_views, minimal.supports_transfer, minimal.supports_memoryview) == (False, False, False)
  with pytest.raises(NotImplementedError, match="MIN: BytesAllocator does not support buffer views"): minimal.offset(bytearray(4), 0, 4)
  with pytest.raises(NotImplementedError, match="no zero-copy host access"): minimal.as_memoryview(bytearray(4), 4)
  with pytest.raises(NotImplementedError, match="must implement _alloc"): Allocator("X").alloc(4)


def test_as_memoryview_result_is_checked():
  class Lying(HostAllocator):
    def _as_memoryview(self, handle: np.ndarray, nbytes: int) -> memoryview: return memoryview(bytes(3))
  with pytest.raises(TypeError, match="memoryview of 8 bytes, got a memoryview of 3 bytes"):
    Lying().as_memoryview(np.zeros(8, np.uint8), 8)
