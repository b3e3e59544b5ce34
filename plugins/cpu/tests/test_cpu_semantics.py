"""The CPU computes exactly what the PYTHON interpreter (the reference) computes, bit for bit, on the edge cases of C:
nan and inf, division by zero, INT_MIN / -1, shifts by the full width or a negative amount, float → int casts of
nan/inf/huge values, 16-bit float rounding (native and emulated), and bool arithmetic."""
import math

import numpy as np
import pytest

from plugrad.dtype import DType, dtypes
from plugrad.testing.kernels import linear_program, op_kernel, run_linear
from plugrad.uop.ops import Ops

from cpu_helpers import C_ONLY

F32, F64, F16, BF16, B = dtypes.float32, dtypes.float64, dtypes.float16, dtypes.bfloat16, dtypes.bool
I8, U8, I16, U16 = dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16
I32, U32, I64, U64 = dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64
nan, inf = math.nan, math.inf
FLOATS = [nan, -nan, inf, -inf, 0.0, -0.0, 1.0, -2.5, 3.0, 65504.0, 65520.0, 1e-8, -3e38, 2.0**-24, 1.0 + 2.0**-8, 1.00390625, 1.01171875, 7.5, 0.1]
FLOATS2 = [1.0, 2.0, nan, 0.0, -0.0, 0.0, inf, -0.0, nan, 3.0, -1.0, 0.5, 2.0, 1e30, 7.0, -inf, 0.25, 7.5, -0.1]


def ints(dt: DType) -> list[int]:
  lo, hi = dtypes.min(dt), dtypes.max(dt)
  return [lo, hi, 0, 1, -1 % (hi + 1) if dtypes.is_unsigned(dt) else -1, 7, lo + 1, hi - 1, 3, 100 % (hi + 1), 2, 5]


def ints2(dt: DType) -> list[int]:
  lo, hi = dtypes.min(dt), dtypes.max(dt)
  return [-1 % (hi + 1) if dtypes.is_unsigned(dt) else -1, 0, 0, 3, 2, lo, hi, 7, 0, 1, 5, 1]


def shifts(dt: DType) -> list[int]:
  bits = 8 * dt.itemsize
  return [0, 1, bits - 1, bits, bits + 3, 3, 2, 63 if dt.itemsize == 8 else 5, 4, 6, 1, 2] if dtypes.is_unsigned(dt) else \
    [0, 1, bits - 1, bits, bits + 3, -1, -bits, 2, 4, 6, 1, 2]


def same_on_cpu_and_python(op: Ops, src: tuple[DType, ...], out: DType, inputs: list[list], renderer=None) -> None:
  with np.errstate(over="ignore"): arrays = [np.array(x, np.float32 if dt is dtypes.bfloat16 else dtypes.to_numpy(dt)) for x, dt in zip(inputs, src)]
  uops = op_kernel(op, src, out, len(arrays[0]))
  name = f"sem_{op.name.lower()}_{'_'.join(d.name.replace(' ', '') for d in src)}_to_{out.name.replace(' ', '')}"
  want = run_linear(linear_program(name, uops, "PYTHON"), [out, *src], arrays)[0]
  got = run_linear(linear_program(name, uops, "CPU"), [out, *src], arrays, renderer)[0]
  npd = np.uint16 if out is dtypes.bfloat16 else dtypes.to_numpy(out)
  w, g = np.frombuffer(want, npd), np.frombuffer(got, npd)
  assert want == got, f"{op.name} {src} -> {out}: inputs {inputs}\n  python {w}\n  cpu    {g}"


@pytest.mark.parametrize("dt", [F32, F64, F16, BF16], ids=lambda d: d.name)
@pytest.mark.parametrize("op", [Ops.MAX, Ops.ADD, Ops.MUL, Ops.FDIV, Ops.CMPLT, Ops.CMPNE, Ops.POW])
def test_float_binary(cpu, op, dt):
  same_on_cpu_and_python(op, (dt, dt), B if op in (Ops.CMPLT, Ops.CMPNE) else dt, [FLOATS, FLOATS2])


@pytest.mark.parametrize("dt", [F32, F64, F16, BF16], ids=lambda d: d.name)
@pytest.mark.parametrize("op", [Ops.RECIPROCAL, Ops.SQRT, Ops.TRUNC, Ops.NEG, Ops.LOG2])
def test_float_unary(cpu, op, dt):
  same_on_cpu_and_python(op, (dt,), dt, [FLOATS])


@pytest.mark.parametrize("dt", [I8, U8, I16, U16, I32, U32, I64, U64], ids=lambda d: d.name.replace(" ", "_"))
@pytest.mark.parametrize("op", [Ops.IDIV, Ops.MOD, Ops.ADD, Ops.MUL, Ops.MAX, Ops.POW, Ops.CMPLT])
def test_int_binary(cpu, op, dt):
  b = ints2(dt) if op is not Ops.POW else [0, 1, 2, 3, 5, 31, 0, 2, 7, 1, 2, 3]
  if op is Ops.POW and not dtypes.is_unsigned(dt): b = [-1, -2, 2, 3, 5, 31, 0, -3, 7, 1, 2, 3]
  same_on_cpu_and_python(op, (dt, dt), B if op is Ops.CMPLT else dt, [ints(dt), b])


@pytest.mark.parametrize("dt", [I8, U8, I32, U32, I64, U64], ids=lambda d: d.name.replace(" ", "_"))
@pytest.mark.parametrize("op", [Ops.SHL, Ops.SHR])
def test_shifts(cpu, op, dt):
  same_on_cpu_and_python(op, (dt, dt), dt, [ints(dt), shifts(dt)])


@pytest.mark.parametrize("dst", [I8, U8, I32, U32, I64, U64, B, F16, BF16, F64], ids=lambda d: d.name.replace(" ", "_"))
@pytest.mark.parametrize("src", [F32, F64], ids=lambda d: d.name)
def test_float_casts(cpu, src, dst):
  vals = [nan, inf, -inf, 1e10, -1e10, 3e9, -3.7, 2.5, 1e19, -0.0, 65519.0, 1.00390625, 255.9, 1e-40]
  same_on_cpu_and_python(Ops.CAST, (src,), dst, [vals])


@pytest.mark.parametrize("pair", [(I64, F16), (I32, BF16), (U64, F32), (I8, U16), (B, F16), (BF16, F16), (F16, BF16), (BF16, I32), (F16, U8)],
                         ids=lambda p: f"{p[0].name}->{p[1].name}".replace(" ", "_"))
def test_other_casts(cpu, pair):
  src, dst = pair
  vals = [1, 0, 100, 7, 3, 1, 0, 5] if src is B else [1.0, 3.5, 0.0, 2.0**20 + 1, 255.0, -0.0, nan, inf] if dtypes.is_float(src) else ints(src)[:8]
  if dtypes.is_int(dst) and dtypes.is_float(src): vals = [1.0, 3.5, 0.0, 2.0**20 + 1, 255.0, -0.0, 17.0, 200.0]
  same_on_cpu_and_python(Ops.CAST, (src,), dst, [vals])


@pytest.mark.parametrize("pair", [(F32, I32), (I32, F32), (F16, I16), (BF16, U16), (U16, BF16), (F64, U64)],
                         ids=lambda p: f"{p[0].name}->{p[1].name}".replace(" ", "_"))
def test_bitcasts(cpu, pair):
  src, dst = pair
  vals = [1.0, -2.5, nan, inf, -0.0, 3.0] if dtypes.is_float(src) else [0, 1, 0x7f80 if src.itemsize == 2 else 0x7fc00000, 12345, 7, 3]
  same_on_cpu_and_python(Ops.BITCAST, (src,), dst, [vals])


@pytest.mark.parametrize("op", [Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.AND, Ops.XOR, Ops.CMPLT])
def test_bool_ops(cpu, op):
  same_on_cpu_and_python(op, (B, B), B, [[False, False, True, True], [False, True, False, True]])


def test_where_and_mulacc(cpu):
  same_on_cpu_and_python(Ops.WHERE, (B, F32, F32), F32, [[True, False, True, False], [1.0, 2.0, nan, -0.0], [3.0, nan, 4.0, 0.0]])
  same_on_cpu_and_python(Ops.MULACC, (F32, F32, F32), F32, [[1.5, 2.0, nan, 1e30], [2.0, -3.0, 1.0, 1e30], [0.25, 6.0, 1.0, -inf]])
  same_on_cpu_and_python(Ops.MULACC, (I8, I8, I8), I8, [[100, -128, 3, 7], [3, -1, 2, 9], [1, 0, -5, 127]])


@C_ONLY
@pytest.mark.parametrize("dt", [F16, BF16], ids=lambda d: d.name)
def test_emulated_16bit_floats(cpu, dt):
  """Without compiler support 16-bit floats are stored as uint16 (float16 converted in C, bfloat16 by the codegen's
  emulation): same bits as the interpreter."""
  from plugrad_cpu.renderer import CPURenderer
  emu = CPURenderer("CPU", native_float16=False, native_bfloat16=False)
  assert emu.storage_dtype(dt) is (dtypes.uint16 if dt is F16 else dt) and not emu.native_bfloat16
  for op in (Ops.ADD, Ops.MUL, Ops.FDIV, Ops.MAX, Ops.SQRT):
    same_on_cpu_and_python(op, (dt,) * (1 if op is Ops.SQRT else 2), dt, [FLOATS, FLOATS2][:1 if op is Ops.SQRT else 2], emu)
  for other in (F32, F64, I32, U8):
    same_on_cpu_and_python(Ops.CAST, (other, ), dt, [[0.1, 65520.0, 2.0**-25, 3.0, nan, -inf, 1e-7, 2049.0] if dtypes.is_float(other) else
                                                    [1, 0, 7, 100, 255, 3, 2, 1]], emu)
    same_on_cpu_and_python(Ops.CAST, (dt,), other, [[0.5, 65504.0, 2.0**-24, 3.0, 1.0, -0.0, 7.0, 100.0]], emu)
