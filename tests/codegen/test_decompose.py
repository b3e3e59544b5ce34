"""The shared decomposition passes (codegen/decompose.py): each one on and off by its renderer flag, and the values the
decomposed kernels compute on the PYTHON interpreter and the CPU (both paths) against the constant folder."""
from __future__ import annotations

import numpy as np
import pytest

from plugrad import Tensor
from plugrad.codegen.decompose import decompose
from plugrad.dtype import DType, dtypes
from plugrad.renderer.base import Renderer
from plugrad.testing.kernels import _np_threefry
from plugrad.uop.ops import Ops, UOp, exec_alu
from tests.cpu.helpers import op_kernel, program, run

I32, U32, F32 = dtypes.int32, dtypes.uint32, dtypes.float32


class Plain(Renderer):
  """The least capable device: every shared pass applies."""
  def render(self, program: UOp) -> str: return ""


class Native(Plain):
  safe_int_div = safe_shifts = nan_max = True


def var(dt: DType, lo: int = -100, hi: int = 100) -> UOp:
  return UOp.variable("x", lo, hi, dt) if dtypes.is_int(dt) else UOp.variable("f", 0, 1).cast(dt)
def ops_of(u: UOp) -> set[Ops]: return {x.op for x in u.toposort}


def test_threefry_always_becomes_32_bit_integer_ops():
  x = UOp(Ops.THREEFRY, U32, (var(U32, 0, 2**32 - 1), UOp.const(U32, 3)), (0xDEADBEEF_12345678, 1))
  for r in (Plain("X"), Native("X")):
    out = decompose(x, r)
    assert Ops.THREEFRY not in ops_of(out) and ops_of(out) <= {Ops.ADD, Ops.XOR, Ops.OR, Ops.SHL, Ops.SHR, Ops.CONST, Ops.DEFINE_VAR}
    assert all(u.dtype in (U32, dtypes.index) for u in out.toposort)


def test_threefry_constant_folder_matches_the_numpy_oracle():
  key = 0x1234_5678_9ABC_DEF0
  for ctr in (0, 1, 2**32 - 1, 2**32, 2**64 - 1):
    want = int(_np_threefry(np.array([ctr], np.uint64), key)[0])
    assert [exec_alu(Ops.THREEFRY, U32, (ctr & 0xFFFFFFFF, ctr >> 32), (key, w)) for w in (1, 0)] == [want >> 32, want & 0xFFFFFFFF]


@pytest.mark.parametrize("device", ["PYTHON", "CPU"])
def test_random_numbers_are_threefry_on_every_device(device):
  Tensor.manual_seed(42)
  got = Tensor.rand(64, device=device).numpy()
  want = (_np_threefry(np.arange(64, dtype=np.uint64), 42) >> np.uint64(40)).astype(np.float32) * np.float32(2**-24)
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", [Ops.IDIV, Ops.MOD])
def test_division_guard_by_flag_and_bounds(op):
  x = UOp(op, I32, (var(I32), UOp.variable("y", -3, 3, I32)))
  assert Ops.WHERE in ops_of(decompose(x, Plain("X"))) and decompose(x, Native("X")) is x
  assert decompose(UOp(op, I32, (var(I32), UOp.const(I32, 7))), Plain("X")).op is op  # a safe constant: no guard
  assert Ops.WHERE not in ops_of(decompose(UOp(op, I32, (var(I32), UOp.variable("y", 1, 9, I32))), Plain("X")))
  # a divisor of -1 only matters when the dividend can be the minimum
  assert Ops.WHERE not in ops_of(decompose(UOp(op, I32, (var(I32), UOp.variable("y", -9, -1, I32))), Plain("X")))


@pytest.mark.parametrize("op", [Ops.SHL, Ops.SHR])
def test_shift_guard_by_flag_and_bounds(op):
  x = UOp(op, I32, (var(I32), UOp.variable("y", 0, 40, I32)))
  assert Ops.WHERE in ops_of(decompose(x, Plain("X"))) and decompose(x, Native("X")) is x
  assert decompose(UOp(op, I32, (var(I32), UOp.variable("y", 0, 31, I32))), Plain("X")).op is op


def test_nan_max_by_flag():
  x = UOp(Ops.MAX, F32, (var(F32), UOp.const(F32, 0.5)))
  assert ops_of(decompose(x, Plain("X"))) >= {Ops.WHERE, Ops.CMPNE, Ops.CMPLT} and Ops.MAX not in ops_of(decompose(x, Plain("X")))
  assert decompose(x, Native("X")) is x
  assert decompose(UOp(Ops.MAX, I32, (var(I32), UOp.const(I32, 1))), Plain("X")).op is Ops.MAX  # integers have no nan


INT_MIN = -(2**31)
EDGES = {
  (Ops.IDIV, I32): ([7, -7, INT_MIN, INT_MIN, 5, -9, 0], [0, 0, -1, 1, -1, 2, -1]),
  (Ops.MOD, I32): ([7, -7, INT_MIN, INT_MIN, 5, -9, 0], [0, 0, -1, 3, -1, 2, -1]),
  (Ops.IDIV, U32): ([7, 2**32 - 1, 0, 9], [0, 2**32 - 1, 0, 2]),
  (Ops.MOD, U32): ([7, 2**32 - 1, 0, 9], [0, 2**32 - 1, 0, 2]),
  (Ops.SHL, I32): ([1, -8, 1, 3, 1], [32, 40, -1, 31, 0]),
  (Ops.SHR, I32): ([-8, 8, -8, -8, 1], [32, 40, -1, 2, 0]),
  (Ops.SHR, U32): ([2**32 - 1, 8, 5], [32, 2**32 - 1, 1]),
  (Ops.MAX, F32): ([np.nan, 1.0, np.nan, -0.0, -np.inf, 3.0], [1.0, np.nan, np.nan, 0.0, -1.0, np.inf]),
}


@pytest.mark.parametrize("device", ["PYTHON", "CPU"])
@pytest.mark.parametrize("case", list(EDGES), ids=lambda c: f"{c[0].name}-{c[1].name}")
def test_edge_values_match_the_constant_folder(device, case):
  op, dt = case
  a, b = (np.array(v, dtypes.to_numpy(dt)) for v in EDGES[case])
  got = np.frombuffer(run(program(f"edge_{op.name.lower()}", op_kernel(op, (dt, dt), dt, len(a)), device), [dt, dt, dt], [a, b])[0],
                      dtypes.to_numpy(dt))
  # a negative shift is a shift by the full width (the interpreter's rule; Python raises)
  want = np.array([exec_alu(op, dt, (x.item(), 64 if op in (Ops.SHL, Ops.SHR) and y < 0 else y.item())) for x, y in zip(a, b)], dtypes.to_numpy(dt))
  np.testing.assert_array_equal(got, want)


# ---- bfloat16 emulation

BF16 = dtypes.bfloat16


def _bf16_bits(f32_bits: int) -> int:
  """The reference: float32 bits → bfloat16 bits, nearest with ties to even, nan → the quiet nan of its sign."""
  if f32_bits & 0x7FFFFFFF > 0x7F800000: return (f32_bits >> 16 & 0x8000) | 0x7FC0
  top, low = f32_bits >> 16, f32_bits & 0xFFFF
  return (top + (low > 0x8000 or (low == 0x8000 and top & 1))) & 0xFFFF


# ties (to even both ways), just above and below a tie, quiet and signaling nans of both signs, inf, the largest floats
# (one rounds to inf), subnormals (ties, rounding up into the normals), signed zeros
BF16_EDGES = [0x3F808000, 0x3F818000, 0x3F808001, 0x3F807FFF, 0x7FC00001, 0xFFC12345, 0x7F800001, 0xFF800001, 0x7F800000, 0xFF800000,
              0x7F7FFFFF, 0x7F7F7FFF, 0x00008000, 0x00018000, 0x0000FFFF, 0x807FFFFF, 0x80000000, 0x00000000, 0x3EAAAAAB, 0xC2F6E979]


def test_bfloat16_emulation_by_flag():
  x = UOp(Ops.ADD, BF16, (var(BF16), UOp.const(BF16, 1 / 3)))
  out = decompose(UOp(Ops.SINK, dtypes.void, (x,)), Plain("X"))
  assert not any(BF16 in (u.dtype.scalar(), u.dtype.base.scalar()) for u in out.toposort) and Ops.BITCAST in ops_of(out)
  native = type("NativeBF16", (Plain,), {"native_bfloat16": True})("X")
  assert decompose(x, native) is x


@pytest.mark.parametrize("device", ["PYTHON", "CPU", "WEBGPU"])
def test_bfloat16_rounding_is_the_references_on_every_device(device):
  if device == "WEBGPU": pytest.importorskip("plugrad_webgpu")
  bits = np.array(BF16_EDGES, np.uint32)
  got = np.frombuffer(run(program("bf16_cast", op_kernel(Ops.CAST, (F32,), BF16, len(bits)), device), [BF16, F32], [bits.view(np.float32)])[0],
                      np.uint16)
  assert [hex(int(g)) for g in got] == [hex(_bf16_bits(int(b))) for b in bits]
  # arithmetic rounds its float32 result the same way; a load and a store keep every bit (a signaling nan too)
  a, b = np.array([1.0, 1.00390625, 3e38, -1e-39, 7.0], np.float32), np.array([2**-9, 2**-8, 3e38, -1e-39, 0.1], np.float32)
  got = np.frombuffer(run(program("bf16_add", op_kernel(Ops.ADD, (BF16, BF16), BF16, len(a)), device), [BF16, BF16, BF16], [a, b])[0], np.uint16)
  ta, tb = ((x.view(np.uint32) >> 16 << 16).view(np.float32) for x in (a, b))
  with np.errstate(over="ignore"): want = [_bf16_bits(int(s)) for s in (ta + tb).view(np.uint32)]
  assert [int(g) for g in got] == want
  sig = np.array([0x7F81, 0xFFA0, 0x0001], np.uint16)
  copy = program("bf16_copy", op_kernel(Ops.CAST, (BF16,), dtypes.float32, 3), device)
  got = run(copy, [F32, BF16], [(sig.astype(np.uint32) << 16).view(np.float32)])
  np.testing.assert_array_equal(np.frombuffer(got[0], np.uint32) >> 16, sig)
