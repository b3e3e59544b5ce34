"""The Metal device, command queue and in-flight command buffers of one METAL device index (macOS only, via pyobjc).

UNVERIFIED: written against Apple's documented Metal API (MTLDevice, MTLCommandQueue, MTLCommandBuffer) and pyobjc's
naming of it (`newBufferWithLength_options_`, ...); no Mac is available to this project, so none of it has run.
"""
from __future__ import annotations

import functools
import threading
from typing import Any

from plugrad.backend import DeviceUnavailableError, LaunchError


@functools.lru_cache(maxsize=1)
def metal() -> Any:
  """The pyobjc Metal module (`import Metal`)."""
  try:
    import Metal  # type: ignore[import-not-found]  # pyobjc-framework-Metal, macOS only
  except ImportError as e: raise DeviceUnavailableError(f"METAL needs pyobjc-framework-Metal on macOS ({e})") from None
  return Metal


def command_error(cb: Any) -> str | None:
  """Why a completed command buffer failed (its status is MTLCommandBufferStatusError), or None."""
  m = metal()
  if cb.status() != m.MTLCommandBufferStatusError: return None
  err = cb.error()
  return str(err.localizedDescription()) if err is not None else "unknown error"


class MetalContext:
  """One MTLDevice with one command queue. Command buffers are committed in order on the queue; `track` remembers the
  last ones so that `synchronize` (host access to shared memory, frees) can wait for them and report GPU errors."""
  def __init__(self, index: int):
    m = metal()
    devices = list(m.MTLCopyAllDevices() or ())
    if index == 0 and (dev := m.MTLCreateSystemDefaultDevice()) is not None: self.device = dev
    elif index < len(devices): self.device = devices[index]
    else: raise DeviceUnavailableError(f"METAL:{index} does not exist: this Mac has {len(devices)} Metal device(s)")
    self.queue = self.device.newCommandQueueWithMaxCommandBufferCount_(1024)
    self.name = str(self.device.name())
    self.lock = threading.Lock()
    self.in_flight: list[Any] = []

  def track(self, cb: Any) -> None:
    with self.lock:
      self.in_flight.append(cb)
      if len(self.in_flight) > 64: self._wait(self.in_flight[:32])

  def _wait(self, cbs: list[Any]) -> None:
    for cb in cbs:
      cb.waitUntilCompleted()
      if (why := command_error(cb)) is not None:
        self.in_flight = [c for c in self.in_flight if c not in cbs]
        raise LaunchError(f"METAL command buffer failed: {why}")
    self.in_flight = [c for c in self.in_flight if c not in cbs]

  def synchronize(self) -> None:
    with self.lock: self._wait(list(self.in_flight))


_contexts: dict[int, MetalContext] = {}
_lock = threading.Lock()


def context(index: int) -> MetalContext:
  with _lock:
    if index not in _contexts: _contexts[index] = MetalContext(index)
    return _contexts[index]
