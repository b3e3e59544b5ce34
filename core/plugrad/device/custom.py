"""Bring your own kernel: PROGRAMs written outside plugrad, run on Tensors like any scheduled kernel.

`new_program` builds the PROGRAM (uop/program.py holds the construction; here the device name is resolved through the
registry). `run_program` sits on the device floor, below the engine and the Tensor layer, so it imports neither: it
hands the work to the `run_program` of the tensors' own class (`Tensor.run_program`, tensor/custom.py), which puts a
KERNEL node into the tensor graph and realizes it. The scheduler turns that node into a ScheduleItem that carries the
given program, so ordering, buffer lifetimes and TinyJit capture work as for any kernel.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from plugrad.device.registry import Device
from plugrad.dtype import DType
from plugrad.uop.ops import UOp, sint
from plugrad.uop.program import ProgramArgumentError, ProgramUOp
from plugrad.uop.program import new_program as _new_program


def new_program(name: str, device: str, *, source: str | None = None, binary: bytes | None = None, buffers: Sequence[tuple[DType, str]],
                global_size: Sequence[sint], local_size: Sequence[sint] = (1, 1, 1), vars: Sequence[Any] = ()) -> ProgramUOp:
  """A PROGRAM UOp for a kernel written outside plugrad (docs/writing-a-backend.md, "Bring your own kernel").

  `source` goes through `device`'s compiler when the program is first run; `binary` is loaded as is by its runtime.
  `buffers` lists each parameter buffer in order as `(dtype, "in" | "out" | "inout")`; `vars` the integer variables
  (Variables or `(name, min, max)`, sorted by name); `global_size`/`local_size` the launch dims (ints or expressions
  of the vars). The accessors (`globals`, `ins`, `outs`, `vars`, `launch_dims`, `signature`, ...) follow from them.
  Raises ProgramError for a malformed signature, UnknownDeviceError for a device no plugin provides."""
  return _new_program(name, Device.canonicalize(device), source=source, binary=binary, buffers=buffers, global_size=global_size,
                      local_size=local_size, vars=vars)


def run_program(program: UOp, *tensors: Any, **var_vals: Any) -> None:
  """Run `program` on `tensors` (one per buffer slot, in order), with its variables' values as keywords (ints or bound
  Variables). Inputs ("in") may be lazy (they are realized first); outputs ("out", "inout") must be realized tensors of
  the buffer's dtype on the program's device and are written in place. Inside a TinyJit function the launch is captured
  and replayed like any kernel. Raises ProgramArgumentError naming the kernel and the argument."""
  if not isinstance(program, ProgramUOp): raise TypeError(f"run_program needs a PROGRAM UOp (from new_program), got {type(program).__name__}")
  if not tensors: raise ProgramArgumentError(f"kernel {program.name!r} takes {len(program.signature)} buffers, got no tensors")
  if (run := getattr(type(tensors[0]), "run_program", None)) is None:
    raise ProgramArgumentError(f"kernel {program.name!r}, buffer 0: expected a plugrad Tensor, got {type(tensors[0]).__name__}")
  run(program, *tensors, **var_vals)
