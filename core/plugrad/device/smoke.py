"""The smoke test of a device: render, compile and run one tiny hand-built kernel, `out[i] = a[i] + 1` for 16 float32s.

It goes through the real path (the device's renderer, compiler through the cache, runtime and allocator, via
`ProgramRunner` and `Buffer`) without the codegen pipeline, so that `python -m plugrad devices` and the conformance
suite can tell "this backend works at all" apart from everything above it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from plugrad.device.buffer import Buffer
from plugrad.device.registry import Device
from plugrad.device.runner import ProgramRunner
from plugrad.dtype import dtypes
from plugrad.errors import DeviceError
from plugrad.uop.ops import AxisType, KernelInfo, Ops, UOp
from plugrad.uop.program import ProgramUOp, make_program

SMOKE_SIZE = 16
SMOKE_NAME = "smoke_add1"


def smoke_ast() -> UOp:
  """The kernel AST (stage 2): SINK(END(STORE(INDEX(out, i), LOAD(INDEX(a, i)) + 1), i))."""
  ptr = dtypes.float32.ptr(SMOKE_SIZE)
  out, a = UOp(Ops.DEFINE_GLOBAL, ptr, (), 0), UOp(Ops.DEFINE_GLOBAL, ptr, (), 1)
  i = UOp.range(SMOKE_SIZE, 0, AxisType.LOOP)
  val = UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, ptr, (a, i)),)) + 1.0
  store = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, ptr, (out, i)), val))
  return UOp(Ops.END, dtypes.void, (store, i)).sink(arg=KernelInfo(SMOKE_NAME))


def smoke_uops() -> list[UOp]:
  """The same kernel linearized (stage 3): one int32 loop over the 16 elements, no SPECIALs (it runs as one thread)."""
  ptr = dtypes.float32.ptr(SMOKE_SIZE)
  out, a = UOp(Ops.DEFINE_GLOBAL, ptr, (), 0), UOp(Ops.DEFINE_GLOBAL, ptr, (), 1)
  bound, one = UOp.const(dtypes.int32, SMOKE_SIZE), UOp.const(dtypes.float32, 1.0)
  i = UOp.range(bound, 0, AxisType.LOOP, dtypes.int32)
  idx_a = UOp(Ops.INDEX, ptr, (a, i))
  load = UOp(Ops.LOAD, dtypes.float32, (idx_a,))
  add = UOp(Ops.ADD, dtypes.float32, (load, one))
  idx_out = UOp(Ops.INDEX, ptr, (out, i))
  store = UOp(Ops.STORE, dtypes.void, (idx_out, add))
  return [out, a, bound, one, i, idx_a, load, add, idx_out, store, UOp(Ops.ENDRANGE, dtypes.void, (i,))]


def smoke_program(device: str) -> ProgramUOp:
  """The smoke kernel as a PROGRAM at the LINEAR stage for the canonical `device`."""
  return make_program(smoke_ast(), device).with_linear(smoke_uops())


def smoke_input() -> np.ndarray: return (np.arange(SMOKE_SIZE, dtype=np.float32) * 0.75 - 4.0).astype(np.float32)


@dataclass(frozen=True)
class SmokeResult:
  """The outcome for one device. `computed` is False for a device whose runtime lacks the "run" capability (NULL): its
  launch is checked, its output is not. `stage` is where a failure happened: "device" (lookup), "render/compile" (which
  includes loading into the runtime), "run" or "check". `detail` is one line; `error` the full text of a failure."""
  device: str
  passed: bool
  detail: str
  computed: bool = False
  stage: str = ""
  seconds: float | None = None
  error: str = ""
  absent: bool = False  # not run: the device is unavailable here (no driver, no hardware), which is not a failure of it

  @property
  def verdict(self) -> str: return "UNAVAILABLE" if self.absent else "PASS" if self.passed else "FAIL"

  def as_dict(self) -> dict[str, object]:
    return {"device": self.device, "smoke": self.verdict, "detail": self.detail, "computed": self.computed, "stage": self.stage or None,
            "seconds": self.seconds, "error": self.error or None}


def _why(e: BaseException, limit: int = 300) -> str:
  """One line for a table: the error's lines joined, cut at `limit` characters (the full text is in `error`)."""
  text = " / ".join(line.strip() for line in str(e).strip().splitlines() if line.strip())
  text = f"{type(e).__name__}: {text}"
  return text if len(text) <= limit else text[:limit - 3] + "..."


def _failed(device: str, e: BaseException, stage: str) -> SmokeResult:
  return SmokeResult(device, False, _why(e), stage=stage, error=f"{type(e).__name__}: {e}")


def run_smoke(device: str) -> SmokeResult:
  """Smoke-test `device` on the process-wide `Device` registry. Never raises for a device problem: it is the result."""
  start = time.perf_counter()
  try: dev = Device[device]
  except DeviceError as e: return _failed(device, e, "device")
  try:
    runner = ProgramRunner(smoke_program(dev.name))  # renders and compiles
    computes = "run" in dev.runtime.capabilities
  except Exception as e: return _failed(dev.name, e, "render/compile")
  a = smoke_input()
  try:
    out = Buffer(dev.name, SMOKE_SIZE, dtypes.float32).copyin(np.full(SMOKE_SIZE, np.nan, np.float32).data)
    inp = Buffer(dev.name, SMOKE_SIZE, dtypes.float32).copyin(a.data)
    runner([out, inp], {}, wait=True)
    dev.synchronize()
    got = out.numpy() if computes else None
  except Exception as e: return _failed(dev.name, e, "run")
  took = time.perf_counter() - start
  if got is None:
    return SmokeResult(dev.name, True, "rendered, compiled and launched without error; this device computes nothing "
                       "(its runtime lacks the 'run' capability), so the output was not checked", False, seconds=took)
  want = a + np.float32(1.0)
  if not np.array_equal(got, want):
    bad = int(np.flatnonzero(got != want)[0])
    why = f"wrong result: out[{bad}] = {float(got[bad])!r}, expected {float(want[bad])!r} (a[{bad}] + 1)"
    return SmokeResult(dev.name, False, why, True, "check", took)
  where = f" on {desc}" if (desc := dev.runtime.describe()) else ""
  return SmokeResult(dev.name, True, f"out[i] = a[i] + 1 over {SMOKE_SIZE} float32s computed correctly{where}", True, seconds=took)
