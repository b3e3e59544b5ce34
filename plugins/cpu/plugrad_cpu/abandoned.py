"""Launches that Ctrl-C left running (runtime.py's module doc): every later launch or copy on the CPU device waits for
them first (`settle`), so nothing reads or reuses their memory meanwhile. The allocator, the runtime and the graph
runner all ask; this module imports none of them."""
from __future__ import annotations

import threading
from typing import Protocol


class Unfinished(Protocol):
  def finish(self, timeout: float | None) -> bool: ...


ABANDONED: list[Unfinished] = []  # runtime.Launch objects still running after a KeyboardInterrupt
_SETTLING = threading.Lock()


def settle() -> None:
  """Wait for the launches Ctrl-C abandoned (each still runs its last chunk) before the CPU device is used again. The
  wait is interruptible; an interrupted wait leaves them listed, to be waited for at the next use."""
  if not ABANDONED: return
  with _SETTLING:
    while ABANDONED:
      ABANDONED[0].finish(None)
      ABANDONED.pop(0)
