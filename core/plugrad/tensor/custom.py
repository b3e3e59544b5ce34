"""`Tensor.run_program`: a precompiled PROGRAM (from `plugrad.backend.new_program`, or any compiled program) run on tensors.

The launch becomes a node of the tensor graph, `KERNEL(*slot tensors, *BINDs, arg=program)`, and every tensor it writes
becomes `AFTER(its buffer, KERNEL)`; realizing those AFTERs has the scheduler emit one ScheduleItem that carries the
program, after the kernels that compute its inputs and after (or before) whatever else reads or writes its buffers,
as for an ASSIGN. So the launch is recorded by TinyJit like any kernel.
"""
from __future__ import annotations

from typing import Any

from plugrad.dtype import dtypes
from plugrad.tensor.helpers import is_buffer_form, tensor_cls
from plugrad.uop.ops import Ops, UOp
from plugrad.uop.program import ProgramArgumentError, ProgramUOp


def _var_binds(p: ProgramUOp, var_vals: dict[str, Any]) -> list[UOp]:
  def fail(why: str) -> ProgramArgumentError: return ProgramArgumentError(f"kernel {p.name!r}: {why}")
  names = [v.arg[0] for v in p.vars]
  if extra := sorted(set(var_vals) - set(names)): raise fail(f"it has no variable {', '.join(map(repr, extra))}; its variables are {names}")
  binds = []
  for v in p.vars:
    name, lo, hi = v.arg
    if name not in var_vals: raise fail(f"it needs a value for variable {name!r} (an int in [{lo}, {hi}]); pass {name}=...")
    val = var_vals[name]
    if isinstance(val, UOp) and val.op is Ops.BIND: val = val.unbind()[1]  # a bound Variable: a TinyJit argument passes its value per call
    if not isinstance(val, int) or isinstance(val, bool): raise fail(f"variable {name!r} must be an int or a bound Variable, got {val!r}")
    if not lo <= val <= hi: raise fail(f"variable {name!r} = {val} is outside its range [{lo}, {hi}]")
    binds.append(v.bind(val))
  return binds


def run_program(program: ProgramUOp, *tensors: Any, **var_vals: Any) -> None:
  """Run `program` on `tensors`, one per buffer slot; outputs are written in place (see plugrad.backend.run_program)."""
  outs = launch_program(program, *tensors, **var_vals)
  before = {id(t): t.uop.src[0] for t in outs}
  first, *rest = outs
  try: first.realize(*rest)
  except BaseException:
    for t in outs: t.uop = before[id(t)]  # a failed launch leaves the tensors as they were
    raise


def launch_program(program: ProgramUOp, *tensors: Any, **var_vals: Any) -> list[Any]:
  """`run_program` without the realize: the written tensors (returned) become AFTER(buffer, KERNEL), so the launch runs
  when they (or a result computed from them) are realized, scheduled with the rest of the graph."""
  if not isinstance(program, ProgramUOp): raise TypeError(f"run_program needs a PROGRAM UOp (from new_program), got {type(program).__name__}")
  p, sig, T = program, program.signature, tensor_cls()
  def fail(why: str) -> ProgramArgumentError: return ProgramArgumentError(f"kernel {p.name!r}: {why}")
  if len(tensors) != len(sig):
    raise fail(f"it takes {len(sig)} buffers ({', '.join(f'{m} {dt}' for dt, m in sig)}), got {len(tensors)} tensors")
  for i, (t, (dt, mode)) in enumerate(zip(tensors, sig)):
    if not isinstance(t, T): raise fail(f"buffer {i} ({mode}): expected a Tensor, got {type(t).__name__}")
    if t.dtype is not dt: raise fail(f"buffer {i} ({mode}) holds {dt} elements, got a {t.dtype} tensor")
    if t.device != p.device: raise fail(f"buffer {i} ({mode}): the kernel runs on {p.device}, the tensor is on {t.device}")
  binds = _var_binds(p, var_vals)
  outs: dict[int, Any] = {}
  for i, (t, (_, mode)) in enumerate(zip(tensors, sig)):
    if mode == "in": continue
    if t.uop.op is Ops.ASSIGN: t.realize()  # a pending write to it lands first
    if not is_buffer_form(t.uop):
      raise fail(f"buffer {i} ({mode}) is written in place, so it needs a realized, contiguous tensor (Tensor.empty(...), or "
                 f"x.contiguous().realize()); got a lazy {t.uop.op.name}")
    outs[id(t)] = t
  kernel = UOp(Ops.KERNEL, dtypes.void, (*(t.uop for t in tensors), *binds), p)
  for t in outs.values(): t.uop = UOp(Ops.AFTER, t.dtype, (t.uop, kernel))
  return list(outs.values())


class CustomMixin:
  """Mixed into `Tensor`: running kernels written outside plugrad."""

  run_program = staticmethod(run_program)
