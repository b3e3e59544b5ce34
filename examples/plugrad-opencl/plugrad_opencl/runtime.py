"""Device memory (cl.Buffer) and kernel launches on the device's one in-order queue."""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from plugrad.backend import Allocator, BufferSpec, LaunchError, Runtime, UOp, c_identifier, dtypes
from plugrad_opencl.platform import Handles, handles


class OpenCLAllocator(Allocator):
  def __init__(self, device: str):
    super().__init__(device)
    self.h = handles(device)
    import pyopencl as cl
    self.cl = cl
    self.oom_errors = (cl.MemoryError,)

  def _alloc(self, nbytes: int, options: BufferSpec | None) -> Any:
    # OpenCL has no empty buffers; a zero-byte plugrad buffer still needs a handle to pass to kernels
    return self.cl.Buffer(self.h.context, self.cl.mem_flags.READ_WRITE, max(nbytes, 1))

  def _free(self, handle: Any, nbytes: int, options: BufferSpec | None) -> None: handle.release()

  def _copyin(self, handle: Any, src: memoryview) -> None: self.cl.enqueue_copy(self.h.queue, handle, src, is_blocking=True)
  def _copyout(self, dest: memoryview, handle: Any) -> None: self.cl.enqueue_copy(self.h.queue, dest, handle, is_blocking=True)

  def _transfer(self, dest: Any, src: Any, nbytes: int, src_dev: Allocator, dest_dev: Allocator) -> None:
    s, d = src_dev.h, dest_dev.h  # type: ignore[attr-defined]  # both are OpenCLAllocators (the contract of _transfer)
    if s.context == d.context:
      self.cl.enqueue_copy(d.queue, dest, src, byte_count=nbytes)
      return
    host = np.empty(nbytes, np.uint8)  # each device has a context of its own: between two, through host memory
    self.cl.enqueue_copy(s.queue, host, src, is_blocking=True)
    self.cl.enqueue_copy(d.queue, dest, host, is_blocking=True)


class OpenCLProgram:
  """A loaded kernel. Handles are cl.Buffers in slot order, `vals` the variables in `program.vars` order."""
  def __init__(self, h: Handles, program: UOp):
    import pyopencl as cl
    self.h, self.cl, self.name = h, cl, c_identifier(program.name)  # type: ignore[attr-defined]
    self.program = cl.Program(h.context, [h.device], [program.binary]).build()  # type: ignore[attr-defined]
    # each variable is an int (long for an int64 variable), as the renderer declared it
    self.val_types = tuple(np.int64 if v.dtype in (dtypes.int64, dtypes.uint64) else np.int32 for v in program.vars)  # type: ignore[attr-defined]
    self.kernel = self.new_kernel()

  def new_kernel(self) -> Any:
    """A fresh cl.Kernel of this program (each keeps its own arguments: a graph sets them once per node)."""
    return self.cl.Kernel(self.program, self.name)

  def set_args(self, kernel: Any, handles: tuple[Any, ...], vals: tuple[int, ...]) -> None:
    if len(vals) != len(self.val_types): raise LaunchError(f"kernel {self.name!r} takes {len(self.val_types)} variable values, got {len(vals)}")
    kernel.set_args(*handles, *(t(v) for t, v in zip(self.val_types, vals)))

  def enqueue(self, kernel: Any, global_size: tuple[int, ...], local_size: tuple[int, ...]) -> Any:
    """Enqueue one launch: `global_size` workgroups of `local_size` items. None for an empty launch (OpenCL refuses it)."""
    if 0 in global_size or 0 in local_size: return None
    return self.cl.enqueue_nd_range_kernel(self.h.queue, kernel, tuple(g * l for g, l in zip(global_size, local_size)), tuple(local_size))

  def __call__(self, *handles: Any, global_size: tuple[int, int, int] = (1, 1, 1), local_size: tuple[int, int, int] = (1, 1, 1),
               vals: tuple[int, ...] = (), wait: bool = False) -> float | None:
    self.set_args(self.kernel, handles, vals)
    st = time.perf_counter()
    ev = self.enqueue(self.kernel, global_size, local_size)
    if not wait: return None
    return elapsed(self.h, [ev] if ev is not None else [], st)


def elapsed(h: Handles, events: list[Any], st: float) -> float:
  """Wait for the events and give their device time (first start to last end), or the host's time without profiling."""
  if not events: return 0.0
  events[-1].wait()
  if not h.timed: return time.perf_counter() - st
  return (events[-1].profile.end - events[0].profile.start) * 1e-9


class OpenCLRuntime(Runtime):
  capabilities = frozenset({"run", "transfer", "timing", "graph"})

  def __init__(self, device: str):
    super().__init__(device)
    self.h = handles(device)

  def load(self, program: UOp) -> OpenCLProgram: return OpenCLProgram(self.h, program)
  def synchronize(self) -> None: self.h.queue.finish()
  def describe(self) -> str: return f"{self.h.device.name.strip()} on {self.h.device.platform.name.strip()} ({self.h.device.version.strip()})"
