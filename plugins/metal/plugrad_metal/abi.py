"""The METAL kernel ABI as data (pure Python, tested without a Mac): which argument-table index each buffer and
variable of a program gets, and how variable values are packed. The renderer writes the same ABI into the MSL
signature (renderer.py's module doc); the runtime (`setBuffer`/`setBytes`) and the graph runner (indirect commands)
bind by it.

* buffer i (slot order) at index i;
* variable k (name order) at index nbufs + k, its value as a 4-byte little-endian `int` (an 8-byte `long` for an int64
  variable), passed by `setBytes` for a launch, or through a shared variables buffer in an indirect command buffer.
"""
from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from plugrad.backend import LaunchError, UOp, dtypes

MAX_BINDINGS = 31  # Metal's buffer argument table per kernel


@dataclass(frozen=True)
class Signature:
  name: str
  nbufs: int
  var_formats: tuple[str, ...]  # struct formats of the variables: "<i" (int) or "<q" (long)

  @property
  def buffer_indices(self) -> range: return range(self.nbufs)
  @property
  def var_indices(self) -> range: return range(self.nbufs, self.nbufs + len(self.var_formats))

  def pack(self, vals: Sequence[int]) -> list[tuple[int, bytes]]:
    """(index, bytes) for `setBytes:length:atIndex:` of each variable value."""
    if len(vals) != len(self.var_formats):
      raise LaunchError(f"METAL kernel {self.name!r} takes {len(self.var_formats)} variable values, got {len(vals)}")
    return [(i, struct.pack(f, v)) for i, f, v in zip(self.var_indices, self.var_formats, vals)]


def signature(program: UOp) -> Signature:
  """The binding layout of a PROGRAM (its `globals` and `vars`)."""
  nbufs: int = len(program.globals)  # type: ignore[attr-defined]  # ProgramUOp accessors
  fmts = tuple("<q" if v.dtype in (dtypes.int64, dtypes.uint64) else "<i" for v in program.vars)  # type: ignore[attr-defined]
  if nbufs + len(fmts) > MAX_BINDINGS:
    raise LaunchError(f"METAL kernel {program.name!r} binds {nbufs + len(fmts)} buffers and variables, Metal allows {MAX_BINDINGS}")  # type: ignore[attr-defined]
  return Signature(program.name, nbufs, fmts)  # type: ignore[attr-defined]
