"""`Allocator`: the base every backend's memory allocator subclasses.

A backend implements the underscore methods (raw device memory); the base adds what every device needs the same
way: argument checks, a cache of freed buffers (allocation is slow on most drivers, and the engine frees and
re-allocates buffers of the same sizes on every step), byte accounting, and out-of-memory recovery.
"""
from __future__ import annotations

import ctypes
import gc
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from plugrad.errors import OutOfMemoryError
from plugrad.helpers import ContextVar

H = TypeVar("H")  # a backend's handle type (a pointer int, a ctypes buffer, a memoryview, a driver object ...)

LRU = ContextVar("PLUGRAD_LRU", 1, (0, 1))  # 0 = freed buffers go straight back to the device


@dataclass(frozen=True)
class BufferSpec:
  """Allocation options. Part of the cache key: a buffer is only reused for a request with equal options."""
  host: bool = False        # memory in host RAM that the device can read (staging for transfers)
  uncached: bool = False    # bypass CPU caches (write-combined) where the device supports it
  cpu_access: bool = False  # the host must be able to map it (`_as_memoryview`)
  nolru: bool = False       # never keep this buffer in the cache after it is freed


def fmt_bytes(n: int) -> str:
  """`n` bytes for humans (exact count kept, so messages stay greppable)."""
  for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
    if n >= scale: return f"{n} bytes ({n / scale:.2f} {unit})"
  return f"{n} bytes"


class Allocator(Generic[H]):
  """Base allocator. Subclasses implement `_alloc`, `_free`, `_copyin`, `_copyout` and optionally `_offset` (views),
  `_transfer` (device-to-device copies) and `_as_memoryview` (zero-copy host access).

  Accounting: `mem_used` is the bytes held by live (not freed) buffers, `cached_bytes` the bytes of freed buffers
  kept for reuse, `peak` the largest `mem_used` seen. The device holds `mem_used + cached_bytes`.
  """
  # exceptions of the driver that mean "out of memory" besides MemoryError (e.g. a CUDA error class)
  oom_errors: tuple[type[BaseException], ...] = ()

  def __init__(self, device: str):
    if not isinstance(device, str) or not device: raise TypeError(f"Allocator needs the device name as a non-empty str, got {device!r}")
    self.device = device
    bool(LRU)  # a bad PLUGRAD_LRU fails here; `free` reads it in finalizers, where an error would only be printed
    self.mem_used = self.peak = self.cached_bytes = 0
    self._cache: dict[tuple[int, BufferSpec | None], list[H]] = {}

  def __repr__(self) -> str:
    return f"<{type(self).__name__} {self.device}: {self.mem_used} bytes used, {self.cached_bytes} cached, peak {self.peak}>"

  # ---- what a backend implements
  def _alloc(self, nbytes: int, options: BufferSpec | None) -> H:
    """Return a handle to `nbytes` of fresh device memory (`nbytes` may be 0). Raise MemoryError or one of `oom_errors` when out of memory."""
    raise NotImplementedError(f"{type(self).__name__} must implement _alloc(nbytes, options)")
  def _free(self, handle: H, nbytes: int, options: BufferSpec | None) -> None:
    raise NotImplementedError(f"{type(self).__name__} must implement _free(handle, nbytes, options)")
  def _copyin(self, handle: H, src: memoryview) -> None:
    """Copy `src` (bytes, len == the buffer's nbytes) into the buffer. May return before the copy is done only if `src` was copied."""
    raise NotImplementedError(f"{type(self).__name__} must implement _copyin(handle, src)")
  def _copyout(self, dest: memoryview, handle: H) -> None:
    """Copy the buffer into `dest`; waits for pending device work that writes the buffer."""
    raise NotImplementedError(f"{type(self).__name__} must implement _copyout(dest, handle)")
  def _offset(self, handle: H, offset: int, nbytes: int) -> H:
    """A handle to `nbytes` at byte `offset` inside `handle`'s memory, sharing it (a view). Never freed on its own."""
    raise NotImplementedError(f"{type(self).__name__} does not support buffer views (no _offset)")
  def _transfer(self, dest: H, src: H, nbytes: int, src_dev: Allocator, dest_dev: Allocator) -> None:
    """Copy `nbytes` from `src` (owned by `src_dev`) to `dest` (owned by `dest_dev`), two allocators of this class."""
    raise NotImplementedError(f"{type(self).__name__} does not support device-to-device transfers (no _transfer)")
  def _as_memoryview(self, handle: H, nbytes: int) -> memoryview:
    """The buffer's memory itself as a writable byte memoryview (after waiting for pending device work)."""
    raise NotImplementedError(f"{type(self).__name__} has no zero-copy host access (no _as_memoryview)")

  # ---- optional features, detected by override
  def _overrides(self, name: str) -> bool: return getattr(type(self), name) is not getattr(Allocator, name)
  @property
  def supports_views(self) -> bool: return self._overrides("_offset")
  @property
  def supports_transfer(self) -> bool: return self._overrides("_transfer")
  @property
  def supports_memoryview(self) -> bool: return self._overrides("_as_memoryview")

  # ---- what the core calls
  def alloc(self, nbytes: int, options: BufferSpec | None = None) -> H:
    """A handle to `nbytes` of device memory: a cached freed buffer of the same size and options if there is one."""
    _check_request(nbytes, options)
    key = (nbytes, options)
    if (cached := self._cache.get(key)):
      handle = cached.pop()
      if not cached: del self._cache[key]
      self.cached_bytes -= nbytes
    else: handle = self._alloc_or_retry(nbytes, options)
    self.mem_used += nbytes
    self.peak = max(self.peak, self.mem_used)
    return handle

  def _alloc_or_retry(self, nbytes: int, options: BufferSpec | None) -> H:
    oom: tuple[type[BaseException], ...] = (MemoryError, *self.oom_errors)
    try: return self._alloc(nbytes, options)
    except oom: pass  # leave the except block first, so the failed attempt's frames can be collected before the retry
    # Buffers that died in reference cycles only return to the cache when collected, so collect before emptying it.
    gc.collect()
    freed = self.cached_bytes
    self.free_cache()
    try: return self._alloc(nbytes, options)
    except oom as e:
      raise OutOfMemoryError(f"{self.device}: out of memory allocating {fmt_bytes(nbytes)}{_fmt_opts(options)}; {fmt_bytes(self.mem_used)} in use "
                             f"by live buffers (peak {fmt_bytes(self.peak)}); freed {fmt_bytes(freed)} of cached buffers and retried once. "
                             f"Driver said: {type(e).__name__}: {e}") from e

  def free(self, handle: H, nbytes: int, options: BufferSpec | None = None) -> None:
    """Give back a buffer from `alloc`: it is kept for reuse unless the cache is off (PLUGRAD_LRU=0) or `options.nolru`."""
    _check_request(nbytes, options)
    if nbytes > self.mem_used: raise ValueError(f"{self.device}: freeing {nbytes} bytes but only {self.mem_used} bytes are allocated (double free?)")
    self.mem_used -= nbytes
    if LRU and not (options is not None and options.nolru):
      self._cache.setdefault((nbytes, options), []).append(handle)
      self.cached_bytes += nbytes
    else: self._free(handle, nbytes, options)

  def free_cache(self) -> None:
    """Return every cached buffer to the device."""
    cache, self._cache = self._cache, {}
    for (nbytes, options), handles in cache.items():
      for h in handles:
        self._free(h, nbytes, options)
        self.cached_bytes -= nbytes

  # ---- checked wrappers of the data movement methods (the sizes are checked by Buffer, which knows them)
  def copyin(self, handle: H, src: memoryview) -> None:
    if src.nbytes: self._copyin(handle, src)
  def copyout(self, dest: memoryview, handle: H) -> None:
    if dest.nbytes: self._copyout(dest, handle)
  def offset(self, handle: H, offset: int, nbytes: int) -> H:
    if not self.supports_views: raise NotImplementedError(f"{self.device}: {type(self).__name__} does not support buffer views (no _offset)")
    return self._offset(handle, offset, nbytes)
  def as_memoryview(self, handle: H, nbytes: int) -> memoryview:
    if not self.supports_memoryview:
      raise NotImplementedError(f"{self.device}: {type(self).__name__} has no zero-copy host access (no _as_memoryview)")
    mv = self._as_memoryview(handle, nbytes)
    if not isinstance(mv, memoryview) or mv.nbytes != nbytes:
      raise TypeError(f"{self.device}: {type(self).__name__}._as_memoryview must return a memoryview of {nbytes} bytes, got {_describe(mv)}")
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def _check_request(nbytes: Any, options: Any) -> None:
  if not isinstance(nbytes, int) or isinstance(nbytes, bool): raise TypeError(f"nbytes must be an int, got {type(nbytes).__name__} {nbytes!r}")
  if nbytes < 0: raise ValueError(f"nbytes must be >= 0, got {nbytes}")
  if options is not None and not isinstance(options, BufferSpec):
    raise TypeError(f"options must be a BufferSpec or None, got {type(options).__name__}")


def _fmt_opts(options: BufferSpec | None) -> str: return "" if options is None or options == BufferSpec() else f" with {options}"
def _describe(x: Any) -> str: return f"a memoryview of {x.nbytes} bytes" if isinstance(x, memoryview) else type(x).__name__


class StagedAllocator(Allocator[H]):
  """An allocator for device memory the host cannot address (a discrete GPU): host copies go through pinned host
  buffers that the device's DMA engine reads and writes, in chunks of `STAGING` bytes. Two staging buffers alternate,
  so the host fills one while the DMA reads the other; a buffer is reused only once the event of its last copy has
  completed. A copy in may return before the device has the data (the DMA reads the staging buffer, not the caller's
  memory); a copy out waits for each chunk's event, after the kernels queued before it on the same stream.

  A backend implements `_alloc`/`_free` as for any allocator and the driver's five calls below, in place of
  `_copyin`/`_copyout`."""
  STAGING = 4 << 20  # bytes per staging buffer; larger copies go in chunks

  def __init__(self, device: str):
    super().__init__(device)
    self._staging: list[Any] = []
    self._next = 0

  # ---- what a backend implements
  def _pinned(self, nbytes: int) -> tuple[int, Any]:
    """A new page-locked host buffer of `nbytes` and an event for it: (its address, the event)."""
    raise NotImplementedError(f"{type(self).__name__} must implement _pinned(nbytes)")
  def _dma_in(self, handle: H, offset: int, host: int, nbytes: int) -> None:
    """Queue a copy of `nbytes` from host address `host` to byte `offset` of `handle` on the device's stream."""
    raise NotImplementedError(f"{type(self).__name__} must implement _dma_in(handle, offset, host, nbytes)")
  def _dma_out(self, host: int, handle: H, offset: int, nbytes: int) -> None:
    """Queue a copy of `nbytes` from byte `offset` of `handle` to host address `host` on the device's stream."""
    raise NotImplementedError(f"{type(self).__name__} must implement _dma_out(host, handle, offset, nbytes)")
  def _record(self, event: Any) -> None:
    """Record `event` on the device's stream (after the copy just queued)."""
    raise NotImplementedError(f"{type(self).__name__} must implement _record(event)")
  def _wait_event(self, event: Any) -> None:
    """Block until `event` has completed."""
    raise NotImplementedError(f"{type(self).__name__} must implement _wait_event(event)")
  def _activate(self) -> None:
    """Make this device's context current for the calls that follow (default: nothing to do)."""

  # ---- the staged copies
  def _stage(self) -> tuple[int, Any]:
    while len(self._staging) < 2: self._staging.append(self._pinned(self.STAGING))
    host, event = self._staging[self._next]
    self._next ^= 1
    self._wait_event(event)
    return host, event

  @staticmethod
  def _view(host: int, n: int) -> memoryview: return memoryview((ctypes.c_ubyte * n).from_address(host)).cast("B")

  def _copyin(self, handle: H, src: memoryview) -> None:
    self._activate()
    data = src.cast("B") if src.format != "B" or src.ndim != 1 else src
    for off in range(0, len(data), self.STAGING):
      n = min(self.STAGING, len(data) - off)
      host, event = self._stage()
      self._view(host, n)[:] = data[off:off + n]
      self._dma_in(handle, off, host, n)
      self._record(event)

  def _copyout(self, dest: memoryview, handle: H) -> None:
    self._activate()
    out = dest.cast("B") if dest.format != "B" or dest.ndim != 1 else dest
    for off in range(0, len(out), self.STAGING):
      n = min(self.STAGING, len(out) - off)
      host, event = self._stage()
      self._dma_out(host, handle, off, n)
      self._record(event)
      self._wait_event(event)
      out[off:off + n] = self._view(host, n)
