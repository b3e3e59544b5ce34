"""The NULL device: every component is real but does no work, so the scheduler and codegen can be tested (and timed)
without computing anything. Its buffers have no memory and its kernels do not run: results read back are zeros."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from plugrad.backend import CAPABILITIES, Allocator, BufferSpec, Compiler, Dims, GroupOp, Renderer, Runtime, UOp, linear_parts


class NullRenderer(Renderer):
  """Claims a capable GPU-like device (workgroups, shared memory, every dtype; no tensor cores) so the codegen exercises
  its full lowering; `render` returns a one-line description of the kernel instead of code."""
  has_local = has_shared = supports_float4 = True
  global_max = (2**31 - 1, 65535, 65535)
  local_max = (1024, 1024, 64)
  shared_max = 49152
  capabilities = CAPABILITIES - {"tensor_cores", "images"}
  native_math = GroupOp.Transcendental

  def __init__(self, device: str):
    super().__init__(device)
    self.validate()

  def render(self, program: UOp) -> str:
    name, uops = linear_parts(program)
    return f"// NULL kernel {name!r}: {len(uops)} uops, not rendered\n"


class NullCompiler(Compiler):
  """Returns empty bytes for every source (and is not cached: there is nothing to save)."""
  cache_key = None

  def compile(self, src: str) -> bytes:
    if not isinstance(src, str): raise TypeError(f"NullCompiler.compile needs a str, got {type(src).__name__}")
    return b""


@dataclass(frozen=True, eq=False)
class NullHandle:
  """A buffer of the NULL device: a size and no memory."""
  nbytes: int


class NullAllocator(Allocator[NullHandle]):
  """Hands out `NullHandle`s. Copies in are discarded; copies out fill the destination with zeros."""
  def _alloc(self, nbytes: int, options: BufferSpec | None) -> NullHandle: return NullHandle(nbytes)
  def _free(self, handle: NullHandle, nbytes: int, options: BufferSpec | None) -> None: pass
  def _copyin(self, handle: NullHandle, src: memoryview) -> None: pass
  def _copyout(self, dest: memoryview, handle: NullHandle) -> None:
    out = dest if dest.format == "B" and dest.ndim == 1 else dest.cast("B")
    out[:] = bytes(out.nbytes)

  def _offset(self, handle: NullHandle, offset: int, nbytes: int) -> NullHandle:
    if offset < 0 or nbytes < 0 or offset + nbytes > handle.nbytes:
      raise ValueError(f"{self.device}: a view of {nbytes} bytes at offset {offset} does not fit a buffer of {handle.nbytes} bytes")
    return NullHandle(nbytes)


class NullProgram:
  """A loaded NULL kernel: a call returns at once (0.0 seconds when `wait`)."""
  def __init__(self, name: str): self.name = name
  def __repr__(self) -> str: return f"<NullProgram {self.name!r}>"

  def __call__(self, *handles: Any, global_size: Dims = (1, 1, 1), local_size: Dims = (1, 1, 1), vals: tuple[int, ...] = (),
               wait: bool = False) -> float | None:
    return 0.0 if wait else None


class NullRuntime(Runtime):
  """Loads any PROGRAM at the binary stage into a `NullProgram`. Claims no capabilities: nothing runs."""
  capabilities: frozenset[str] = frozenset()

  def __init__(self, device: str):
    if not isinstance(device, str) or not device: raise TypeError(f"NullRuntime needs the device name as a non-empty str, got {device!r}")
    self.device = device

  def load(self, program: UOp) -> NullProgram:
    program.binary  # type: ignore[attr-defined]  # noqa: B018 - a program that is not at the binary stage raises here
    return NullProgram(program.name)  # type: ignore[attr-defined]
