"""The smoke kernel and its checker (shared by `python -m plugrad devices` and the conformance suite)."""
from __future__ import annotations

from typing import Any

import numpy as np

from plugrad.device.smoke import SMOKE_NAME, SMOKE_SIZE, run_smoke, smoke_input, smoke_program
from plugrad.errors import CompileError
from plugrad.plugin import device_name, hookimpl
from plugrad.uop.spec import check
from tests.plugin.fakes import FakeEntryPoint, PyClone, manager


def test_smoke_program_is_a_valid_linear_program():
  p = smoke_program("PYTHON:1")
  check("program", p)
  assert (p.stage, p.name, p.device, p.globals, p.ins, p.outs, p.vars) == ("linear", SMOKE_NAME, "PYTHON:1", (0, 1), (1,), (0,), ())
  assert p.launch_dims() == ((1, 1, 1), (1, 1, 1)) and all(b.dtype.size == SMOKE_SIZE for b in p.buffers)
  assert np.array_equal(smoke_input() + 1, smoke_input() + np.float32(1))  # exact in float32: the check compares exactly


def test_python_and_null_pass():
  py = run_smoke("python")
  assert (py.device, py.passed, py.computed, py.verdict) == ("PYTHON", True, True, "PASS"), py.detail
  null = run_smoke("NULL")
  assert null.passed and not null.computed and "computes nothing" in null.detail


class Idle(PyClone):
  """IDLE launches its kernels without running them, yet claims the 'run' capability: the check must catch it."""
  @hookimpl(tryfirst=True)
  def plugrad_runtime(self, device: str) -> Any:
    if device_name(device) != "IDLE": return None
    from plugrad.builtin.interpreter import PythonRuntime

    class IdleRuntime(PythonRuntime):
      def load(self, program: Any) -> Any:
        super().load(program)
        return lambda *handles, **kw: 0.0
    return IdleRuntime(device)


class Unbuildable(PyClone):
  @hookimpl(tryfirst=True)
  def plugrad_compiler(self, device: str) -> Any:
    if device_name(device) != "UNBUILDABLE": return None
    from plugrad.builtin.interpreter import PythonCompiler

    class Failing(PythonCompiler):
      cache_key = None
      def compile(self, src: str) -> bytes: raise CompileError("line 1: unsupported construct")
    return Failing()


def test_failures_are_results_with_their_stage(use_manager):
  use_manager(manager(FakeEntryPoint("idle", Idle("IDLE"), dist="plugrad-idle"),
                      FakeEntryPoint("unb", Unbuildable("UNBUILDABLE"), dist="plugrad-unb"),
                      FakeEntryPoint("gone", PyClone("GONE", probe=lambda: "no GONE hardware"), dist="plugrad-gone")))
  idle = run_smoke("IDLE")
  assert (idle.passed, idle.stage, idle.computed) == (False, "check", True) and idle.detail.startswith("wrong result: out[0] = nan")
  unb = run_smoke("UNBUILDABLE")
  assert (unb.passed, unb.stage) == (False, "render/compile") and "CompileError" in unb.detail and "unsupported construct" in unb.detail
  gone = run_smoke("GONE")
  assert (gone.passed, gone.stage) == (False, "device") and "no GONE hardware" in gone.detail
  unknown = run_smoke("CUDA")
  assert (unknown.passed, unknown.stage) == (False, "device") and "pip install plugrad-cuda" in unknown.detail
