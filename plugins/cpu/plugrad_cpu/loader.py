"""Loading a compiled shared object into this process: the one piece the runtime, the graph runner, the tiered
recompile and the native thread pool all need, kept apart so that none of them imports another for it."""
from __future__ import annotations

import _ctypes
import ctypes
import os
import tempfile
import weakref


def load_shared(binary: bytes) -> ctypes.CDLL:
  """A shared object's bytes loaded into this process, unloaded (dlclose) once nothing holds it: ctypes never does,
  and every function taken from it holds the library object, so no code in use is unmapped."""
  with tempfile.NamedTemporaryFile(prefix="plugrad-cpu-", suffix=".so", delete=False) as f:
    f.write(binary)
  try: lib = ctypes.CDLL(f.name)
  finally: os.unlink(f.name)  # the mapping outlives the file
  if (close := getattr(_ctypes, "dlclose", None)) is not None:
    weakref.finalize(lib, close, lib._handle).atexit = False  # at exit threads may still be parked in its code: leave it
  return lib
