"""The shared decomposition passes (codegen/decompose.py): each one on and off by its renderer flag, and the values the
decomposed kernels compute on the PYTHON interpreter and the CPU (both paths) against the constant folder."""
from __future__ import annotations

import numpy as np
import pytest

from plugrad import Tensor
from plugrad.codegen.decompose import decompose
from plugrad.dtype import DType, PtrDType, dtypes
from plugrad.renderer.base import Renderer
from plugrad.testing.kernels import _np_threefry, op_kernel
from plugrad.testing.kernels import linear_program as program
from plugrad.testing.kernels import run_linear as run
from plugrad.uop.ops import GroupOp, Ops, UOp, exec_alu

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


# ---- transcendentals written out for a device without them

F16, F64 = dtypes.float16, dtypes.float64


@pytest.mark.parametrize("op", sorted(GroupOp.Transcendental, key=lambda o: o.name))
def test_transcendentals_by_flag(op):
  for dt in (F32, F32.vec(4), F16):
    assert op not in ops_of(decompose(UOp(op, dt, (var(dt),)), Plain("X"))), dt
  assert Ops.CAST in ops_of(decompose(UOp(op, F16, (var(F16),)), Plain("X")))  # a 16-bit float computes in float32
  native = type("NativeMath", (Plain,), {"native_math": GroupOp.Transcendental})("X")
  for x in (UOp(op, F32, (var(F32),)), UOp(op, F64, (var(F64),))):
    assert decompose(x, native) is x
  assert decompose(UOp(op, F64, (var(F64),)), Plain("X")).op is op  # float64 is never written out: it must be native


def test_cpu_writes_out_the_float32_vector_transcendentals():
  """Both CPU compilers call libm once per lane for a vector exp2/log2/sin: those are the shared polynomials; scalars
  and float64 keep libm."""
  from plugrad_cpu.llvm_renderer import LLVMRenderer
  from plugrad_cpu.renderer import CPURenderer
  for r in (CPURenderer("CPU"), LLVMRenderer("CPU", 8, "x86-64", "")):
    for op in (Ops.EXP2, Ops.LOG2, Ops.SIN):
      assert not r.math_is_native(op, F32.vec(8)) and r.math_is_native(op, F32) and r.math_is_native(op, F64.vec(4))


def test_pi_over_2_parts_sum_to_pi_over_2():
  from fractions import Fraction

  from plugrad.codegen.decompose import PIO2_PARTS
  pio2 = Fraction("1.5707963267948966192313216916397514420985846996875529104874722961539082031431044993140174126710585339")
  assert all(float(np.float32(c)) == c and abs(Fraction(c).numerator).bit_length() <= 13 + 80 for c in PIO2_PARTS)
  assert abs(sum(map(Fraction, PIO2_PARTS)) - pio2) < Fraction(1, 2**85)


def _wide_inputs(op: Ops, dt: DType) -> np.ndarray:
  rng = np.random.default_rng(7)
  specials = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5]
  if op is Ops.EXP2: body = rng.uniform(-160, 140, 2000) if dt is F32 else rng.uniform(-30, 20, 2000)
  elif op is Ops.LOG2:
    lo = -103 if dt is F32 else -16  # down to the smallest subnormal
    body = np.exp(rng.uniform(lo, 88 if dt is F32 else 11, 2000))
    specials += [1e-45, 1e-40, 1.17e-38, 3.4e38, -1e-3] if dt is F32 else [6e-8, 65504.0]
  else: body = np.concatenate([rng.uniform(-10, 10, 1000), rng.uniform(-1e4, 1e4, 500), rng.uniform(-4e6, 4e6, 500)]) if dt is F32 \
    else rng.uniform(-100, 100, 2000)
  if dt is F32: specials += [1e-40, -1e-40, 1e-30, 149.5, -149.5, 127.9, 128.0]
  return np.concatenate([body, specials]).astype(dtypes.to_numpy(dt))


@pytest.fixture
def no_native_math(monkeypatch):
  """Clear `native_math` of a device's renderer (and the caches that hold kernels made with it)."""
  import plugrad.codegen
  import plugrad.engine.schedule
  from plugrad.device.registry import Device
  monkeypatch.setattr(plugrad.codegen, "_cache", {})
  monkeypatch.setattr(plugrad.engine.schedule, "_cache", type(plugrad.engine.schedule._cache)())
  def clear(device: str) -> None: monkeypatch.setattr(Device[device].renderer, "native_math", frozenset())
  return clear


@pytest.mark.parametrize("device", ["PYTHON", "CPU"])
@pytest.mark.parametrize("dt", [F32, F16], ids=lambda d: d.name)
@pytest.mark.parametrize("op", sorted(GroupOp.Transcendental, key=lambda o: o.name), ids=lambda o: o.name)
def test_written_out_transcendentals_match_numpy(no_native_math, device, dt, op):
  """Over each function's whole float range, with nan, +-inf, zeros and subnormals, through the Tensor (vectors on both
  devices): within the conformance suite's tolerances for transcendentals; a subnormal result may be flushed to 0."""
  no_native_math(device)
  x = _wide_inputs(op, dt)
  t = Tensor(x, device=device)
  got = {Ops.EXP2: t.exp2, Ops.LOG2: t.log2, Ops.SIN: t.sin}[op]().numpy()
  with np.errstate(all="ignore"): want = {Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin}[op](x.astype(np.float64)).astype(x.dtype)
  same = (np.isnan(got) == np.isnan(want)) & (np.isinf(got) == np.isinf(want)) & ((got > 0) == (want > 0)) | (got == 0) & (want == 0)
  assert same[np.isinf(want) | np.isnan(want)].all(), (x[~same], got[~same], want[~same])
  fin = np.isfinite(want) & (np.abs(want) >= np.finfo(x.dtype).tiny) | (want == 0)
  tol = 2e-6 if dt is F32 else 2e-3
  np.testing.assert_allclose(got[fin], want[fin], rtol=tol, atol=tol)
  sub = np.isfinite(want) & ~fin
  np.testing.assert_allclose(got[sub][got[sub] != 0], want[sub][got[sub] != 0], rtol=1e-2, atol=3e-45)


def test_sin_outside_its_exact_range_is_nan(no_native_math):
  no_native_math("PYTHON")
  from plugrad.codegen.decompose import SIN_RANGE
  x = np.array([SIN_RANGE * 0.999, SIN_RANGE, -SIN_RANGE, 1e30], np.float32)
  got = Tensor(x, device="PYTHON")._sin_device().numpy()  # the device's SIN itself: Tensor.sin reduces the argument first
  assert abs(got[0] - np.sin(np.float64(x[0]))) < 2e-6 and np.isnan(got[1:]).all()
  np.testing.assert_allclose(Tensor(x, device="PYTHON").sin().numpy(), np.sin(x.astype(np.float64)), atol=2e-7)


# ---- vectors of addresses

def test_vectors_of_addresses_become_scalar_accesses():
  """A gathered load (a vector index, gates per lane, an alt value) and a scattered store (a VECTORIZE of pointers) become
  one scalar INDEX/LOAD/STORE per lane; a contiguous vector access through a CAST pointer is kept."""
  from plugrad.codegen.decompose import decompose_linear
  from plugrad.testing.kernels import LinearBuilder
  k = LinearBuilder()
  out, a = k.glob(0, F32, 32), k.glob(1, F32, 8)
  i = k.range(8, 0)
  idx = k.emit(UOp(Ops.VECTORIZE, I32.vec(4), tuple(k.alu(Ops.ADD, i, k.const(I32, j)) for j in range(4))))
  ok = k.alu(Ops.CMPNE, idx, k.emit(UOp.const(I32.vec(4), 5)), dtype=dtypes.bool.vec(4))
  g = k.emit(UOp(Ops.LOAD, F32.vec(4), (UOp(Ops.INDEX, a.dtype, (a, idx, ok)), k.emit(UOp.const(F32.vec(4), -1.0)))))
  row = k.alu(Ops.MUL, i, k.const(I32, 4))
  ptrs = UOp(Ops.VECTORIZE, out.dtype.vec(4), tuple(out.index(k.alu(Ops.ADD, row, k.const(I32, 3 - j))) for j in range(4)))
  k.emit(UOp(Ops.STORE, dtypes.void, (ptrs, g)))
  contiguous = k.emit(UOp(Ops.LOAD, F32.vec(4), (UOp(Ops.CAST, F32.vec(4).ptr(8), (a.index(k.const(I32, 0)),)),)))
  k.emit(UOp(Ops.STORE, dtypes.void, (UOp(Ops.CAST, F32.vec(4).ptr(32), (out.index(k.const(I32, 0)),)), contiguous)))
  k.end(i)
  uops = decompose_linear(k.linear, Plain("X"))
  assert not any(u.op is Ops.INDEX and u.src[1].dtype.count > 1 or u.op in (Ops.VECTORIZE, Ops.GEP, Ops.GROUP) and isinstance(u.dtype, PtrDType)
                 or u.op is Ops.GROUP for u in uops)
  assert sum(u.op is Ops.LOAD and u.dtype is F32 for u in uops) == 4 and sum(u.op is Ops.STORE and u.src[1].dtype is F32 for u in uops) == 4
  assert any(u.op is Ops.LOAD and u.dtype == F32.vec(4) for u in uops)  # the contiguous one
  assert all(s in uops[:n] for n, u in enumerate(uops) for s in u.src)  # still in order


def gather_scatter(gather: bool = True, scatter: bool = True) -> list[UOp]:
  """out[4i + 3-j] = a[(i + 3j) % 8] where that index is not 5, else -1: a gathered load (a vector index, gates per lane,
  an alt value) and a scattered store (a VECTORIZE of pointers); either may be a plain scalar access instead."""
  from plugrad.testing.kernels import LinearBuilder
  k = LinearBuilder()
  out, a = k.glob(0, F32, 32), k.glob(1, F32, 8)
  i = k.range(8, 0)
  ix = [k.alu(Ops.MOD, k.alu(Ops.ADD, i, k.const(I32, 3 * j)), k.const(I32, 8)) for j in range(4)]
  if gather:
    idx = k.emit(UOp(Ops.VECTORIZE, I32.vec(4), tuple(ix)))
    ok = k.alu(Ops.CMPNE, idx, k.emit(UOp.const(I32.vec(4), 5)), dtype=dtypes.bool.vec(4))
    g = k.emit(UOp(Ops.LOAD, F32.vec(4), (UOp(Ops.INDEX, a.dtype, (a, idx, ok)), k.emit(UOp.const(F32.vec(4), -1.0)))))
  else: g = k.emit(UOp(Ops.VECTORIZE, F32.vec(4), tuple(k.load(a, x, k.alu(Ops.CMPNE, x, k.const(I32, 5)), k.const(F32, -1.0)) for x in ix)))
  row = k.alu(Ops.MUL, i, k.const(I32, 4))
  if scatter:
    ptrs = UOp(Ops.VECTORIZE, out.dtype.vec(4), tuple(out.index(k.alu(Ops.ADD, row, k.const(I32, 3 - j))) for j in range(4)))
    k.emit(UOp(Ops.STORE, dtypes.void, (ptrs, g)))
  else:
    for j in range(4): k.store(out, k.alu(Ops.ADD, row, k.const(I32, 3 - j)), k.emit(g.gep(j)))
  k.end(i)
  return k.linear


@pytest.mark.parametrize("device", ["PYTHON", "CPU"])
def test_split_lanes_compute_the_gather_and_scatter(device):
  x = np.arange(8, dtype=np.float32) * 10
  got = np.frombuffer(run(program("scatter", gather_scatter(), device), [F32, F32], [x], out_size=32)[0], np.float32).reshape(8, 4)
  ix = (np.arange(8)[:, None] + 3 * np.arange(4)) % 8
  np.testing.assert_array_equal(got[:, ::-1], np.where(ix != 5, x[ix], -1.0))


@pytest.mark.parametrize("gather, scatter", [(True, False), (False, True)], ids=["gather", "scatter"])
def test_renderers_refuse_a_vector_of_addresses(gather, scatter):
  """Handed a vector of addresses without the split (a program that skipped `decompose_linear`), every renderer refuses
  it with one error, and the interpreter's compiler refuses the program text."""
  import importlib.util

  from plugrad.builtin.interpreter import PythonCompiler
  from plugrad.builtin.python_renderer import PythonRenderer
  from plugrad.errors import CompileError
  from plugrad.renderer.base import RendererError
  from plugrad.uop.ops import KernelInfo
  from plugrad.uop.program import make_program
  from plugrad_cpu.renderer import CPURenderer
  renderers: list[Renderer] = [CPURenderer("CPU")]
  if importlib.util.find_spec("llvmlite") is not None:
    from plugrad_cpu.llvm_renderer import LLVMRenderer
    renderers.append(LLVMRenderer("CPU", 8, "generic", ""))
  if importlib.util.find_spec("plugrad_webgpu") is not None:
    from plugrad_webgpu.context import Limits
    from plugrad_webgpu.renderer import WGSLRenderer
    renderers.append(WGSLRenderer("WEBGPU", Limits((256, 256, 64), 256, 1024, 16384, 8, 1 << 27, 1 << 28), True, "a test adapter"))
  ast, uops = UOp(Ops.SINK, dtypes.void, (), KernelInfo("lanes")), gather_scatter(gather, scatter)
  op = "INDEX" if gather else "VECTORIZE"
  for r in renderers:
    with pytest.raises(RendererError, match=rf"cannot render {op} of a vector of addresses \(codegen/decompose.py splits them\)"):
      r.render(make_program(ast, r.device).with_linear(uops))
  src = PythonRenderer("PYTHON").render(make_program(ast, "PYTHON").with_linear(uops))
  with pytest.raises(CompileError, match=rf"{op} .*vector.* \(codegen/decompose.py\)"): PythonCompiler().compile(src)
  assert all(u.op is not Ops.INDEX or u.src[1].dtype.count == 1 for u in program("lanes", uops, "PYTHON").uops)  # with the split: none
