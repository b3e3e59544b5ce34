"""Running a schedule: kernels through `ProgramRunner` (compiled once per program), copies through host memory."""
from __future__ import annotations

from plugrad.device.registry import Device
from plugrad.device.runner import ProgramRunner
from plugrad.engine.buffers import buffer_of
from plugrad.engine.schedule import ScheduleItem, create_schedule
from plugrad.uop.ops import UOp

_runners: dict[UOp, ProgramRunner] = {}


def run_schedule(items: list[ScheduleItem], wait: bool = False) -> None:
  for it in items:
    bufs = [buffer_of(b) for b in it.bufs]
    if it.kind == "copy":
      dest, src = bufs
      dest.copyin(src.as_buffer())
      continue
    prg = it.program
    if (runner := _runners.get(prg)) is None: runner = _runners[prg] = ProgramRunner(prg)
    runner(bufs, it.var_vals, wait=wait)
  for dev in {it.device for it in items}: Device[dev].synchronize()


def realize(*uops: UOp) -> dict[UOp, UOp]:
  """Compute the given tensor-graph UOps; returns each realized node's replacement (its buffer, reshaped)."""
  items, becomes = create_schedule(*uops)
  run_schedule(items)
  return becomes
