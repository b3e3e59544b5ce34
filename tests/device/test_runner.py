"""ProgramRunner: finishing a PROGRAM's stages with the device's components, the argument checks, launch errors and the
DEBUG=2 line, end to end on the PYTHON reference device with hand-built LINEAR programs (docs/ir.md stage 3)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from plugrad.device.buffer import Buffer
from plugrad.device.registry import Device
from plugrad.device.runner import ProgramRunner
from plugrad.dtype import dtypes
from plugrad.errors import CompileError, LaunchError
from plugrad.helpers import Context
from plugrad.uop.ops import AxisType, KernelInfo, Ops, UOp, Variable
from plugrad.uop.program import ProgramUOp, make_program


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(tmp_path))


def program(name: str, ast_store: UOp, uops: list[UOp], device: str = "PYTHON") -> ProgramUOp:
  return make_program(ast_store.sink(arg=KernelInfo(name)), device).with_linear(uops)


def add_program(n: int = 8, device: str = "PYTHON") -> ProgramUOp:
  """out[g] = a[g] + b[g] over n workgroups (one SPECIAL gidx0)."""
  ptr = dtypes.float32.ptr(n)
  out, a, b = (UOp(Ops.DEFINE_GLOBAL, ptr, (), i) for i in range(3))
  # the kernel AST (stage 2)
  i = UOp.range(n, 0, AxisType.GLOBAL)
  val = UOp(Ops.LOAD, dtypes.float32, (a.index(i),)) + UOp(Ops.LOAD, dtypes.float32, (b.index(i),))
  ast = UOp(Ops.END, dtypes.void, (out.index(i).store(val), i))
  # linearized (stage 3)
  g = UOp.special(UOp.const(dtypes.int32, n), "gidx0", dtypes.int32)
  la, lb = UOp(Ops.LOAD, dtypes.float32, (a.index(g),)), UOp(Ops.LOAD, dtypes.float32, (b.index(g),))
  add = la + lb
  st = out.index(g).store(add)
  return program(f"E_{n}_add", ast, [out, a, b, g.src[0], g, a.index(g), la, b.index(g), lb, add, out.index(g), st], device)


def scale_program() -> ProgramUOp:
  """out[g] = a[g] * 2 for g < n, with n a variable in [1, 16]: the launch size depends on it."""
  ptr = dtypes.int32.ptr(16)
  out, a = UOp(Ops.DEFINE_GLOBAL, ptr, (), 0), UOp(Ops.DEFINE_GLOBAL, ptr, (), 1)
  n_idx = Variable("n", 1, 16)
  i = UOp.range(n_idx, 0, AxisType.GLOBAL)
  ast = UOp(Ops.END, dtypes.void, (out.index(i).store(UOp(Ops.LOAD, dtypes.int32, (a.index(i),)) * 2), i))
  n = Variable("n", 1, 16, dtypes.int32)
  g = UOp.special(n, "gidx0", dtypes.int32)
  two = UOp.const(dtypes.int32, 2)
  la = UOp(Ops.LOAD, dtypes.int32, (a.index(g),))
  mul = la * two
  return program("E_n_scale", ast, [out, a, n, two, g, a.index(g), la, mul, out.index(g), out.index(g).store(mul)])


def host(arr: np.ndarray, device: str = "PYTHON") -> Buffer: return Buffer.from_numpy(device, arr)


def test_runs_a_linear_program_end_to_end():
  p = add_program()
  r = ProgramRunner(p)
  assert r.program.stage == "binary" and r.program.binary == r.program.source.encode() and r.device == "PYTHON"
  a, b = np.arange(8, dtype=np.float32), np.full(8, 0.5, np.float32)
  out = Buffer("PYTHON", 8, dtypes.float32)  # not allocated: the runner allocates it
  t = r([out, host(a), host(b)], wait=True)
  assert isinstance(t, float) and t >= 0
  assert np.array_equal(out.numpy(), a + b)
  assert r([out, host(b), host(b)]) is None and np.array_equal(out.numpy(), b + b)


def test_starts_from_any_stage_after_ast():
  p = add_program()
  src = Device["PYTHON"].renderer.render(p)
  from_source = ProgramRunner(p.with_source(src))
  from_binary = ProgramRunner(p.with_source(src).with_binary(src.encode()))
  assert from_source.program is from_binary.program
  a = np.ones(8, np.float32)
  out = Buffer("PYTHON", 8, dtypes.float32)
  from_binary([out, host(a), host(a)])
  assert out.numpy().tolist() == [2.0] * 8
  with pytest.raises(CompileError, match="not PYTHON program text"):  # the runtime's own device errors pass through as they are
    ProgramRunner(p.with_source(src).with_binary(b"\xff\xfe"))
  with pytest.raises(ValueError, match="'E_8_add' is at the AST stage"): ProgramRunner(make_program(p.ast, "PYTHON"))
  with pytest.raises(TypeError, match="needs a PROGRAM UOp, got Ops.SINK"): ProgramRunner(p.ast)
  with pytest.raises(TypeError, match="needs a PROGRAM UOp, got str"): ProgramRunner("E_8_add")  # type: ignore[arg-type]


def test_variables_set_launch_size_and_values():
  r = ProgramRunner(scale_program())
  a = host(np.arange(16, dtype=np.int32))
  out = host(np.full(16, -1, np.int32))
  r([out, a], {"n": 5})
  assert out.numpy().tolist() == [0, 2, 4, 6, 8] + [-1] * 11
  r([out, a], {Variable("n", 1, 16): 16, "unused": 3})  # Variables as keys; values of other kernels' variables are ignored
  assert out.numpy().tolist() == [2 * i for i in range(16)]


def test_variable_errors():
  r = ProgramRunner(scale_program())
  bufs = [host(np.zeros(16, np.int32)), host(np.zeros(16, np.int32))]
  with pytest.raises(ValueError, match=r"'E_n_scale' needs a value for variable 'n' \(in \[1, 16\]\); got values for \['m'\]"): r(bufs, {"m": 1})
  with pytest.raises(ValueError, match=r"variable 'n' = 17 is outside its range \[1, 16\]"): r(bufs, {"n": 17})
  with pytest.raises(TypeError, match="variable 'n' must be an int, got 2.0"): r(bufs, {"n": 2.0})  # type: ignore[dict-item]
  with pytest.raises(TypeError, match="keys must be names or Variables, got a Ops.CONST UOp"): r(bufs, {UOp.const(dtypes.int32, 1): 1})
  with pytest.raises(TypeError, match="keys must be names or Variables, got int"): r(bufs, {1: 1})  # type: ignore[dict-item]


def test_buffer_argument_errors():
  r = ProgramRunner(add_program())
  f32 = [Buffer("PYTHON", 8, dtypes.float32) for _ in range(3)]
  with pytest.raises(ValueError, match="'E_8_add' takes 3 buffers, got 2"): r(f32[:2])
  with pytest.raises(TypeError, match="pass the buffers as a sequence"): r(f32[0])  # type: ignore[arg-type]
  with pytest.raises(TypeError, match="buffer slot 1: expected a Buffer, got ndarray"): r([f32[0], np.zeros(8, np.float32), f32[2]])  # type: ignore[list-item]
  with pytest.raises(ValueError, match="buffer slot 2: the kernel runs on PYTHON, the buffer is on NULL"):
    r([*f32[:2], Buffer("NULL", 8, dtypes.float32)])
  with pytest.raises(TypeError, match=r"buffer slot 0: expected dtypes.float32 elements, got a dtypes.float16 buffer"):
    r([Buffer("PYTHON", 8, dtypes.float16), *f32[1:]])
  with pytest.raises(ValueError, match="buffer slot 1: expected 8 elements, got a buffer of 4"):
    r([f32[0], Buffer("PYTHON", 4, dtypes.float32), f32[2]])
  assert not any(b.is_allocated() for b in f32)  # nothing was launched or allocated


def test_runtime_failures_become_launch_errors():
  # out[g + 4] = 1 over 4 workgroups writes past the end of a 4-element buffer: the interpreter refuses at launch
  ptr = dtypes.float32.ptr(4)
  out = UOp(Ops.DEFINE_GLOBAL, ptr, (), 0)
  i = UOp.range(4, 0, AxisType.GLOBAL)
  ast = UOp(Ops.END, dtypes.void, (out.index(i + 4).store(UOp.const(dtypes.float32, 1.0)), i))
  four, one = UOp.const(dtypes.int32, 4), UOp.const(dtypes.float32, 1.0)
  g = UOp.special(four, "gidx0", dtypes.int32)
  idx = g + four
  r = ProgramRunner(program("E_4_oob", ast, [out, four, one, g, idx, out.index(idx), out.index(idx).store(one)]))
  with pytest.raises(LaunchError) as ei:
    r([Buffer("PYTHON", 4, dtypes.float32)])
  assert str(ei.value).startswith("kernel 'E_4_oob' failed to launch on PYTHON (plugin plugrad): LaunchError: ")
  assert isinstance(ei.value.__cause__, LaunchError) and "E_4_oob" in str(ei.value.__cause__)


def test_compile_errors_name_the_kernel():
  p = add_program()
  src = Device["PYTHON"].renderer.render(p).splitlines()
  src[5] = "   3 BOGUS_OP garbage"
  with pytest.raises(CompileError, match="kernel 'E_8_add' failed to compile") as ei:
    ProgramRunner(p.with_source("\n".join(src)))
  assert "source near line 6:" in str(ei.value) and ">    6 |    3 BOGUS_OP garbage" in str(ei.value)


def test_debug_2_prints_one_line_per_run(capsys: pytest.CaptureFixture):
  r = ProgramRunner(add_program())
  bufs = [host(np.ones(8, np.float32)) for _ in range(3)]
  with Context(DEBUG=2):
    r(bufs, wait=True)
    r(bufs)
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 2
  assert lines[0].startswith("E_8_add") and "PYTHON" in lines[0] and "global (8, 1, 1)" in lines[0] and "local (1, 1, 1)" in lines[0]
  assert " us " in lines[0] and "GFLOPS" in lines[0] and "GB/s" in lines[0]
  assert "global (8, 1, 1)" in lines[1] and "GFLOPS" in lines[1]  # at DEBUG>=2 every launch waits and is timed


def test_null_device_launches_without_computing():
  r = ProgramRunner(add_program(device="NULL"))
  out = Buffer("NULL", 8, dtypes.float32)
  r([out, Buffer("NULL", 8, dtypes.float32), Buffer("NULL", 8, dtypes.float32)])
  assert out.is_allocated() and out.numpy().tolist() == [0.0] * 8
