"""Conformance: the core Tensor methods (creation, data, dtypes, elementwise math, reductions, movement, matmul,
random) computed on the device under test and compared with numpy — with broadcasting, non-contiguous views,
zero-size and 0-d tensors. numpy's answers are the reference; where plugrad follows tinygrad instead (integer division
semantics, result dtypes) the expected value is written out."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from plugrad.dtype import DType, dtypes
from plugrad.tensor.tensor import Tensor

pytestmark = pytest.mark.plugrad_conformance
RNG = np.random.default_rng(1)
NP = {dtypes.bool: np.bool_, dtypes.int8: np.int8, dtypes.uint8: np.uint8, dtypes.int16: np.int16, dtypes.uint16: np.uint16,
      dtypes.int32: np.int32, dtypes.uint32: np.uint32, dtypes.int64: np.int64, dtypes.uint64: np.uint64, dtypes.float16: np.float16,
      dtypes.float32: np.float32, dtypes.float64: np.float64}


def rand(*shape: int, lo: float = -2.0, hi: float = 2.0) -> np.ndarray: return RNG.uniform(lo, hi, shape).astype(np.float32)


def close(t: Tensor, want: Any, rtol: float = 1e-5, atol: float = 1e-6, dtype: DType | None = None) -> None:
  got = t.numpy()
  want = np.asarray(want)
  assert got.shape == want.shape, f"shape {got.shape}, want {want.shape}"
  if dtype is not None: assert t.dtype is dtype, f"dtype {t.dtype}, want {dtype}"
  if want.dtype.kind in "biu" and got.dtype.kind in "biu": np.testing.assert_array_equal(got, want)
  else: np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def supported(dev: Any, dt: DType) -> bool:
  """Can the device compute in `dt`? (capabilities, never the device name)"""
  need = {dtypes.float16: "float16", dtypes.bfloat16: "bfloat16", dtypes.float64: "float64", dtypes.int64: "int64", dtypes.uint64: "int64"}
  return dt not in need or need[dt] in dev.renderer.capabilities


# ---------------------------------------------------------------- creation and data

@pytest.mark.parametrize("dt", [d for d in NP], ids=lambda d: d.name)
def test_numpy_roundtrip(run_device, plugrad_dev, dt):
  if not supported(plugrad_dev, dt): pytest.skip(f"{run_device} lacks {dt}")
  x = (np.arange(12).reshape(3, 4) % 5).astype(NP[dt])
  t = Tensor(x, device=run_device)
  assert t.dtype is dt and t.shape == (3, 4) and t.device == run_device
  got = t.numpy()
  assert got.dtype == x.dtype
  np.testing.assert_array_equal(got, x)
  np.testing.assert_array_equal(Tensor(x.T, device=run_device).numpy(), x.T)  # a non-contiguous numpy array


def test_from_python(run_device):
  close(Tensor([[1, 2], [3, 4]], device=run_device), [[1, 2], [3, 4]], dtype=dtypes.int32)
  close(Tensor([1, 2.5], device=run_device), [1, 2.5], dtype=dtypes.float32)
  close(Tensor([True, False], device=run_device), [True, False], dtype=dtypes.bool)
  close(Tensor([True, 2], device=run_device), [1, 2], dtype=dtypes.int32)
  close(Tensor((1, 2, 3), device=run_device, dtype=dtypes.float32), [1, 2, 3], dtype=dtypes.float32)
  close(Tensor(2.5, device=run_device), np.float32(2.5), dtype=dtypes.float32)
  close(Tensor(7, device=run_device), np.int32(7), dtype=dtypes.int32)
  close(Tensor(False, device=run_device), np.bool_(False), dtype=dtypes.bool)
  close(Tensor(b"\x01\x02\xff", device=run_device), np.array([1, 2, 255], np.uint8), dtype=dtypes.uint8)
  assert Tensor([], device=run_device).shape == (0,) and Tensor(None, device=run_device).shape == (0,)
  assert Tensor([[], []], device=run_device).numpy().shape == (2, 0)


def test_bfloat16_through_float32(run_device, plugrad_dev):
  if not supported(plugrad_dev, dtypes.bfloat16): pytest.skip(f"{run_device} lacks bfloat16")
  t = Tensor([1.0, 2.5, -3.0, 1 / 3], dtype=dtypes.bfloat16, device=run_device)
  got = t.numpy()
  assert t.dtype is dtypes.bfloat16 and got.dtype == np.float32
  np.testing.assert_allclose(got, [1.0, 2.5, -3.0, 1 / 3], rtol=4e-3)


def test_item_tolist_properties(run_device):
  t = Tensor([[1.5, 2.0, 3.0]], device=run_device)
  assert t.tolist() == [[1.5, 2.0, 3.0]] and Tensor(3, device=run_device).tolist() == 3
  assert t.shrink(((0, 1), (1, 2))).item() == 2.0
  assert t.sum().item() == 6.5 and isinstance(Tensor(True, device=run_device).item(), bool)
  assert (t.ndim, t.numel(), t.element_size(), t.nbytes(), len(t)) == (2, 3, 4, 12, 1)
  assert Tensor.zeros(2, 0, device=run_device).numel() == 0


def test_full_zeros_ones(run_device):
  close(Tensor.full((2, 3), 7, device=run_device), np.full((2, 3), 7), dtype=dtypes.int32)
  close(Tensor.full((2,), 1.5, device=run_device, dtype=dtypes.float32), [1.5, 1.5])
  close(Tensor.full((2, 2), 3, device=run_device, buffer=False), np.full((2, 2), 3))
  close(Tensor.zeros(2, 3, device=run_device), np.zeros((2, 3)), dtype=dtypes.float32)
  close(Tensor.ones((3,), device=run_device, dtype=dtypes.int8), np.ones(3, np.int8), dtype=dtypes.int8)
  base = Tensor([[1, 2]], device=run_device, dtype=dtypes.int16)
  close(base.zeros_like(), [[0, 0]], dtype=dtypes.int16)
  close(base.ones_like(dtype=dtypes.float32), [[1, 1]], dtype=dtypes.float32)
  close(base.full_like(9), [[9, 9]], dtype=dtypes.int16)
  e = Tensor.empty(4, 2, device=run_device, dtype=dtypes.int32)
  assert e.shape == (4, 2) and e.dtype is dtypes.int32 and e.numpy().shape == (4, 2)
  close(Tensor.zeros(0, 3, device=run_device), np.zeros((0, 3)))
  close(Tensor.ones(device=run_device), np.float32(1))


def test_full_buffers_are_private(run_device):
  a, b = Tensor.zeros(3, device=run_device).realize(), Tensor.zeros(3, device=run_device).realize()
  a += 1
  a.realize()
  close(a, [1, 1, 1])
  close(b, [0, 0, 0])


@pytest.mark.parametrize("args,kw", [((5,), {}), ((2, 9), {}), ((9, 2, -2), {}), ((0.5, 3.0, 0.75), {}), ((1, 4), {"dtype": dtypes.float32}),
                                     ((3, 3), {}), ((0, 10, 3), {"dtype": dtypes.int16}), ((-3.0, 1), {}), ((300,), {})])
def test_arange(run_device, args, kw):
  want = np.arange(*args)
  t = Tensor.arange(*args, **kw, device=run_device)
  if "dtype" not in kw: assert t.dtype is (dtypes.float32 if want.dtype.kind == "f" else dtypes.int32)
  close(t, want.astype(NP[t.dtype]))


def test_linspace_eye_meshgrid(run_device):
  close(Tensor.linspace(-1, 2, 7, device=run_device), np.linspace(-1, 2, 7), rtol=1e-6)
  close(Tensor.linspace(3, 3, 1, device=run_device), [3.0])
  close(Tensor.linspace(0, 1, 0, device=run_device), np.zeros(0))
  close(Tensor.linspace(0, 10, 5, dtype=dtypes.int32, device=run_device), np.linspace(0, 10, 5).astype(np.int32))
  close(Tensor.eye(3, device=run_device), np.eye(3), dtype=dtypes.float32)
  close(Tensor.eye(2, 4, dtype=dtypes.int32, device=run_device), np.eye(2, 4, dtype=np.int32))
  x, y, z = (Tensor.arange(n, device=run_device) for n in (2, 3, 4))
  for indexing in ("ij", "xy"):
    for got, want in zip(x.meshgrid(y, z, indexing=indexing), np.meshgrid(np.arange(2), np.arange(3), np.arange(4), indexing=indexing)):
      close(got, want)


# ---------------------------------------------------------------- dtypes, casts, copies

CASTS = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.float16, dtypes.float32,
         dtypes.float64]


@pytest.mark.parametrize("src", CASTS, ids=lambda d: d.name)
def test_cast(run_device, plugrad_dev, src):
  if not supported(plugrad_dev, src): pytest.skip(f"{run_device} lacks {src}")
  x = np.array([0, 1, 2, 7, 100], NP[src]) if src is not dtypes.bool else np.array([True, False, True])
  t = Tensor(x, device=run_device)
  for dst in CASTS:
    if supported(plugrad_dev, dst): close(t.cast(dst), x.astype(NP[dst]), dtype=dst)
  close(t.float(), x.astype(np.float32), dtype=dtypes.float32)
  close(t.int(), x.astype(np.int32), dtype=dtypes.int32)
  close(t.bool(), x.astype(np.bool_), dtype=dtypes.bool)
  if supported(plugrad_dev, dtypes.float16): close(t.half(), x.astype(np.float16), dtype=dtypes.float16)


def test_cast_float_to_int_truncates(run_device):
  x = np.array([-2.7, -0.5, 0.5, 2.7, 100.9], np.float32)
  close(Tensor(x, device=run_device).cast(dtypes.int32), x.astype(np.int32))
  close(Tensor(x[2:], device=run_device).cast("uint8"), x[2:].astype(np.uint8))


@pytest.mark.parametrize("src,dst", [(dtypes.float32, dtypes.int32), (dtypes.int32, dtypes.float32), (dtypes.uint32, dtypes.uint8),
                                     (dtypes.uint8, dtypes.uint32), (dtypes.float32, dtypes.uint16), (dtypes.int16, dtypes.float32),
                                     (dtypes.float32, dtypes.float64), (dtypes.int8, dtypes.int16)])
def test_bitcast(run_device, plugrad_dev, src, dst):
  if not (supported(plugrad_dev, src) and supported(plugrad_dev, dst)): pytest.skip(f"{run_device} lacks {src} or {dst}")
  x = np.array([[1.5, -2.0, 3.25, 100.0, 0.0, -7.5, 1e-3, 12.0]], np.float32).view(NP[src]) if src.itemsize == 4 else \
    (np.arange(-8, 8, dtype=np.int64) * 37).astype(NP[src]).reshape(2, 8)
  t = Tensor(x, device=run_device)
  close(t.bitcast(dst), x.view(NP[dst]), dtype=dst)
  close(t.T.bitcast(dst) if src.itemsize == dst.itemsize else t.bitcast(dst), (x.T if src.itemsize == dst.itemsize else x).view(NP[dst]))


def test_contiguous_clone_detach_to(run_device):
  x = rand(3, 4)
  t = Tensor(x, device=run_device)
  close(t.T.contiguous(), x.T)
  c = t.clone()
  t += 1
  t.realize()
  close(c, x)
  close(t, x + 1)
  close(t.detach() * 2, (x + 1) * 2)
  assert t.to(run_device) is t
  close(t.to(None if run_device == t.device else run_device), x + 1)


def test_to_other_device(run_device):
  other = "PYTHON:1" if run_device.startswith("PYTHON") else "PYTHON"  # the reference interpreter is always there
  x = rand(2, 3)
  t = Tensor(x, device=run_device)
  moved = (t * 2).to(other)
  assert moved.device == other
  close(moved + 1, x * 2 + 1)
  close(moved.to(run_device), x * 2)
  c = t.clone(device=other)
  assert c.device == other
  close(c, x)
  t.to_(other)
  assert t.device == other
  close(t, x)


def test_schedule_and_realize(run_device):
  a = Tensor(rand(4), device=run_device)
  b = (a + 1) * 2
  items = b.schedule()
  assert len(items) >= 1 and all(hasattr(it, "ast") for it in items)
  assert b.uop.op is not None and b.uop.op.name != "BUFFER"  # schedule() runs nothing and replaces nothing
  c = b + 3
  b.realize()
  assert b.uop.op.name in ("BUFFER", "RESHAPE")
  assert any(u is b.uop or (b.uop.op.name == "RESHAPE" and u is b.uop.src[0]) for u in c.uop.toposort)  # c reuses b's result
  close(c, (a.numpy() + 1) * 2 + 3)
  assert Tensor.realize(a, b, c) is a


def test_assign(run_device):
  t = Tensor([1.0, 2.0, 3.0], device=run_device).realize()
  t.assign(Tensor([4.0, 5.0, 6.0], device=run_device))
  close(t, [4, 5, 6])
  t.assign(0.5)  # a Python value broadcasts
  close(t, [0.5, 0.5, 0.5])
  t.assign(t * 2 + 1)
  t.assign(t * 10)  # a second assign before realize builds on the first
  close(t, [20, 20, 20])
  m = Tensor([[1, 2], [3, 4]], device=run_device).realize()
  m -= Tensor([1, 2], device=run_device)
  m *= 3
  close(m, [[0, 0], [6, 6]])
  lazy = Tensor([1.0], device=run_device) + 1
  lazy.assign(Tensor([7.0], device=run_device))
  close(lazy, [7.0])


# ---------------------------------------------------------------- elementwise

UNARY: list[tuple[str, Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray], tuple[float, float]]] = [
  ("neg", Tensor.neg, np.negative, (-3, 3)), ("abs", Tensor.abs, np.abs, (-3, 3)), ("sign", Tensor.sign, np.sign, (-3, 3)),
  ("exp", Tensor.exp, np.exp, (-5, 5)), ("exp2", Tensor.exp2, np.exp2, (-5, 5)), ("log", Tensor.log, np.log, (0.01, 10)),
  ("log2", Tensor.log2, np.log2, (0.01, 10)), ("log10", Tensor.log10, np.log10, (0.01, 10)), ("sqrt", Tensor.sqrt, np.sqrt, (0, 10)),
  ("rsqrt", Tensor.rsqrt, lambda a: 1 / np.sqrt(a), (0.1, 10)), ("reciprocal", Tensor.reciprocal, np.reciprocal, (0.5, 4)),
  ("square", Tensor.square, np.square, (-3, 3)), ("sin", Tensor.sin, np.sin, (-6, 6)), ("cos", Tensor.cos, np.cos, (-6, 6)),
  ("tan", Tensor.tan, np.tan, (-1.4, 1.4)), ("asin", Tensor.asin, np.arcsin, (-1, 1)), ("acos", Tensor.acos, np.arccos, (-1, 1)),
  ("atan", Tensor.atan, np.arctan, (-20, 20)), ("sinh", Tensor.sinh, np.sinh, (-4, 4)), ("cosh", Tensor.cosh, np.cosh, (-4, 4)),
  ("tanh", Tensor.tanh, np.tanh, (-6, 6)), ("asinh", Tensor.asinh, np.arcsinh, (-20, 20)), ("acosh", Tensor.acosh, np.arccosh, (1, 20)),
  ("atanh", Tensor.atanh, np.arctanh, (-0.95, 0.95)), ("erf", Tensor.erf, np.vectorize(math.erf), (-3, 3)),
  ("floor", Tensor.floor, np.floor, (-5, 5)), ("ceil", Tensor.ceil, np.ceil, (-5, 5)), ("trunc", Tensor.trunc, np.trunc, (-5, 5)),
  ("round", Tensor.round, np.round, (-5, 5)), ("isfinite", Tensor.isfinite, np.isfinite, (-5, 5)),
]


@pytest.mark.parametrize("name,fn,ref,dom", UNARY, ids=[u[0] for u in UNARY])
def test_unary(run_device, name, fn, ref, dom):
  x = rand(3, 5, lo=dom[0], hi=dom[1])
  tol = {"rtol": 3e-5, "atol": 3e-6} if name != "erf" else {"rtol": 1e-5, "atol": 3e-7}
  close(fn(Tensor(x, device=run_device)), ref(x.astype(np.float64)).astype(ref(x).dtype), **tol)
  close(fn(Tensor(x, device=run_device).T), ref(x.T.astype(np.float64)).astype(ref(x).dtype), **tol)  # a permuted view
  close(fn(Tensor(np.float32(x[0, 0]), device=run_device)), ref(np.float64(x[0, 0])), **tol)  # 0-d
  assert fn(Tensor.zeros(0, 2, device=run_device)).numpy().shape == (0, 2)  # zero-size


def test_unary_special_values(run_device):
  x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0], np.float32)
  t = Tensor(x, device=run_device)
  close(t.isnan(), np.isnan(x))
  close(t.isinf(), np.isinf(x))
  close(t.isinf(detect_negative=False), np.isposinf(x))
  close(t.isinf(detect_positive=False), np.isneginf(x))
  close(t.isfinite(), np.isfinite(x))
  close(t.atan(), np.arctan(x), rtol=1e-6)
  close(t.exp(), np.exp(x))
  with np.errstate(invalid="ignore"):  # a literal zero factor or divisor keeps IEEE results (shader compilers fold x * 0 to 0)
    np.testing.assert_array_equal((t * 0).numpy(), x * np.float32(0))
    np.testing.assert_array_equal((t * -0.0).numpy(), x * np.float32(-0.0))
    np.testing.assert_array_equal((0 * t).numpy(), np.float32(0) * x)
  halves = [0.5, 1.5, 2.5, -0.5, -2.5, 3.49, -3.51, 2**24 + 2.0]
  close(Tensor(halves, device=run_device).round(), np.round(halves))
  close(Tensor([1.0, 2.0], device=run_device).logical_not(), [False, False])
  close(Tensor([3, -4], device=run_device).abs(), [3, 4], dtype=dtypes.int32)
  close(Tensor([3, -4, 0], device=run_device).sign(), [1, -1, 0], dtype=dtypes.int32)
  close(Tensor([1, 2], device=run_device).exp(), np.exp([1.0, 2.0]).astype(np.float32), dtype=dtypes.float32)  # ints compute in float
  close(Tensor([2.5, -1], device=run_device).floor().ceil(), [2, -1])
  close(Tensor([7, -7], device=run_device).floor(), [7, -7], dtype=dtypes.int32)


BROADCASTS = [((3, 4), (3, 4)), ((3, 4), (4,)), ((3, 1), (1, 4)), ((2, 1, 4), (3, 1)), ((), (2, 3)), ((0, 3), (1, 3)), ((5,), ())]
BINARY: list[tuple[str, Callable[[Any, Any], Any], Callable[[Any, Any], Any]]] = [
  ("add", lambda a, b: a + b, np.add), ("sub", lambda a, b: a - b, np.subtract), ("mul", lambda a, b: a * b, np.multiply),
  ("div", lambda a, b: a / b, np.divide), ("pow", lambda a, b: a.abs() ** b, lambda a, b: np.abs(a) ** b),
  ("maximum", Tensor.maximum, np.maximum), ("minimum", Tensor.minimum, np.minimum), ("mod", lambda a, b: a % b, np.mod),
  ("floordiv", lambda a, b: a // b, np.floor_divide), ("fmod", Tensor.fmod, np.fmod), ("lt", lambda a, b: a < b, np.less),
  ("le", lambda a, b: a <= b, np.less_equal), ("gt", lambda a, b: a > b, np.greater), ("ge", lambda a, b: a >= b, np.greater_equal),
  ("eq", lambda a, b: a == b, np.equal), ("ne", lambda a, b: a != b, np.not_equal), ("copysign", Tensor.copysign, np.copysign),
  ("logaddexp", Tensor.logaddexp, np.logaddexp), ("lerp", lambda a, b: a.lerp(b, 0.25), lambda a, b: a + (b - a) * 0.25),
]


@pytest.mark.parametrize("shapes", BROADCASTS, ids=str)
@pytest.mark.parametrize("name,fn,ref", BINARY, ids=[b[0] for b in BINARY])
def test_binary_broadcast(run_device, name, fn, ref, shapes):
  a, b = rand(*shapes[0], lo=-3, hi=3), rand(*shapes[1], lo=0.5, hi=2)
  if b.ndim: b[b.size // 2:] *= -1
  want = ref(a.astype(np.float64), b.astype(np.float64)).astype(np.result_type(ref(a, b)))
  close(fn(Tensor(a, device=run_device), Tensor(b, device=run_device)), want, rtol=3e-5, atol=3e-6)


@pytest.mark.parametrize("name,fn,ref", BINARY[:8], ids=[b[0] for b in BINARY[:8]])
def test_binary_scalars(run_device, name, fn, ref):
  a = rand(2, 3, lo=0.5, hi=3)
  t = Tensor(a, device=run_device)
  close(fn(t, 1.5), ref(a, np.float32(1.5)), rtol=3e-5)
  if name not in ("maximum", "minimum", "pow"): close(fn(2.0, t), ref(np.float32(2.0), a), rtol=3e-5)  # reflected operator


INTS = np.array([-7, -6, -1, 0, 1, 5, 7, 100], np.int32)
DIVS = np.array([2, -3, 4, 7, -1, 3, -7, 9], np.int32)


def test_integer_arithmetic(run_device):
  a, b = Tensor(INTS, device=run_device), Tensor(DIVS, device=run_device)
  close(a // b, INTS // DIVS, dtype=dtypes.int32)  # Python's floor division
  close(a % b, INTS % DIVS, dtype=dtypes.int32)  # Python's remainder (sign of the divisor)
  close(a.div(b, rounding_mode="trunc"), np.trunc(INTS / DIVS).astype(np.int32), dtype=dtypes.int32)
  close(a.div(b, rounding_mode="floor"), INTS // DIVS)
  close(a.fmod(b), np.fmod(INTS, DIVS), dtype=dtypes.int32)
  close(a / b, INTS / DIVS, dtype=dtypes.float32)  # int / int is default_float
  close(a - b, INTS - DIVS)
  close(-a, -INTS)
  close(a * 3 - 1, INTS * 3 - 1)
  close(b ** 2, DIVS ** 2, dtype=dtypes.int32)
  close(7 // b, 7 // DIVS)
  close(a % 3, INTS % 3)
  u = Tensor(np.array([200, 5, 0], np.uint8), device=run_device)
  close(u + 100, np.array([200, 5, 0], np.uint8) + np.uint8(100), dtype=dtypes.uint8)  # wraps like C
  close(u // 3, np.array([66, 1, 0], np.uint8))
  close(u - 10, np.array([190, 251, 246], np.uint8))


def test_bitwise_and_shifts(run_device):
  a, b = Tensor(INTS, device=run_device), Tensor(DIVS, device=run_device)
  close(a & b, INTS & DIVS); close(a | b, INTS | DIVS); close(a ^ b, INTS ^ DIVS); close(~a, ~INTS)
  close(a.bitwise_and(6), INTS & 6); close(3 | a, 3 | INTS)
  close(a << 2, INTS << 2); close(a >> 1, INTS >> 1); close(a.lshift(b.abs() % 4), INTS << (np.abs(DIVS) % 4))
  u = np.array([1, 128, 255], np.uint8)
  close(Tensor(u, device=run_device) >> 3, u >> 3, dtype=dtypes.uint8)
  p, q = np.array([True, False, True]), np.array([True, True, False])
  tp, tq = Tensor(p, device=run_device), Tensor(q, device=run_device)
  close(tp & tq, p & q); close(tp | tq, p | q); close(tp ^ tq, p ^ q); close(~tp, ~p); close(tp.logical_not(), ~p)
  close(tp + tq, p | q, dtype=dtypes.bool); close(tp * tq, p & q, dtype=dtypes.bool)


def test_promotion_values(run_device):
  i8 = Tensor(np.array([100, -100], np.int8), device=run_device)
  close(i8 + Tensor(np.array([100, 100], np.uint8), device=run_device), [200, 0], dtype=dtypes.int16)
  close(i8 + 1.5, [101.5, -98.5], dtype=dtypes.float32)
  close(i8 * 2, np.array([100, -100], np.int8) * np.int8(2), dtype=dtypes.int8)
  close(Tensor([True, False], device=run_device) + 1, [2, 1], dtype=dtypes.int32)
  close(Tensor([1, 2], device=run_device) < 1.5, [True, False])
  close(Tensor([1.0, 2.0], device=run_device) + np.float64(1), [2.0, 3.0], dtype=dtypes.float32)


def test_where_masked_fill_clip(run_device):
  x, y = rand(3, 4), rand(4)
  c = x > 0
  tx, ty, tc = Tensor(x, device=run_device), Tensor(y, device=run_device), Tensor(c, device=run_device)
  close(tc.where(tx, ty), np.where(c, x, y))
  close(tc.where(tx, 0.5), np.where(c, x, 0.5))
  close(tc.where(1, 2), np.where(c, 1, 2), dtype=dtypes.int32)
  close(tc.where(1, 2.5), np.where(c, 1, 2.5), dtype=dtypes.float32)
  close(tx.where(1.0, 0.0), np.where(x != 0, 1.0, 0.0))  # a non-bool condition means != 0
  close(tx.masked_fill(tc, -1.0), np.where(c, -1.0, x))
  close(tx.clip(-0.5, 0.5), np.clip(x, -0.5, 0.5)); close(tx.clamp(min_=0), np.maximum(x, 0)); close(tx.clip(max_=0.1), np.minimum(x, 0.1))
  close(tx.isclose(tx + 1e-7), np.isclose(x, x + np.float32(1e-7)))
  n = np.array([np.nan, 1.0, np.inf])
  tn = Tensor(n.astype(np.float32), device=run_device)
  close(tn.isclose(tn), np.isclose(n, n)); close(tn.isclose(tn, equal_nan=True), np.isclose(n, n, equal_nan=True))
  close(tn.maximum(0.0).isnan(), [True, False, False])


# ---------------------------------------------------------------- reductions

AXES = [None, 0, 1, -1, (0, 2), (2, 0, 1)]


@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
def test_reductions(run_device, axis, keepdim):
  x = rand(2, 3, 4)
  t = Tensor(x, device=run_device).permute(1, 0, 2).contiguous().permute(1, 0, 2)  # computed, then viewed
  kw = {"axis": axis, "keepdims": keepdim}
  close(t.sum(axis, keepdim), x.sum(**kw), rtol=1e-5)
  close(t.prod(axis, keepdim), x.prod(**kw), rtol=1e-5)
  close(t.max(axis, keepdim), x.max(**kw))
  close(t.min(axis, keepdim), x.min(**kw))
  close(t.mean(axis, keepdim), x.mean(**kw), rtol=1e-5)
  close(t.var(axis, keepdim), x.var(ddof=1, **kw), rtol=1e-4)
  close(t.std(axis, keepdim, correction=0), x.std(**kw), rtol=1e-4)
  s, m = t.std_mean(axis, keepdim)
  close(s, x.std(ddof=1, **kw), rtol=1e-4); close(m, x.mean(**kw), rtol=1e-5)
  close(t.logsumexp(axis, keepdim), np.log(np.exp(x.astype(np.float64)).sum(**kw)), rtol=1e-5)
  close((t > 0).any(axis, keepdim), (x > 0).any(**kw)); close((t > -1.5).all(axis, keepdim), (x > -1.5).all(**kw))


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_argmax_argmin(run_device, axis):
  x = np.array([[1, 5, 5, 0], [7, 7, 2, 7], [-1, -3, -3, 2]], np.float32)
  for arr in (x, x.astype(np.int32)):
    t = Tensor(arr, device=run_device)
    close(t.argmax(axis), np.argmax(arr, axis), dtype=dtypes.int32); close(t.argmin(axis), np.argmin(arr, axis), dtype=dtypes.int32)
    close(t.argmax(axis, keepdim=True), np.argmax(arr, axis, keepdims=True))
  close(Tensor([1.0, np.nan, 3.0, np.nan], device=run_device).argmax(), 1)
  close(Tensor(2.0, device=run_device).argmax(), 0)


def test_reduction_dtypes_and_edges(run_device, plugrad_dev):
  i8 = Tensor(np.array([100, 100, 100], np.int8), device=run_device)
  # integers and bools accumulate in int64 where the device has it (PyTorch), else in int32 (uint32 for unsigned)
  wide = supported(plugrad_dev, dtypes.int64)
  close(i8.sum(), 300, dtype=dtypes.int64 if wide else dtypes.int32)
  close(Tensor(np.array([200, 200], np.uint8), device=run_device).sum(), 400, dtype=dtypes.int64 if wide else dtypes.uint32)
  close(Tensor([True, True, False], device=run_device).sum(), 2, dtype=dtypes.int64 if wide else dtypes.int32)
  close(i8.mean(), 100.0, dtype=dtypes.float32); close(Tensor([1, 2], device=run_device).var(), 0.5, dtype=dtypes.float32)
  close(i8.max(), 100, dtype=dtypes.int8); close(i8.prod(dtype=dtypes.int32), 10**6, dtype=dtypes.int32)
  close(Tensor([3, 1, 2], device=run_device).min(), 1); close(Tensor(np.array([3, 1, 2], np.uint8), device=run_device).min(), 1)
  close(Tensor([True, False], device=run_device).min(), False); close(Tensor([True, False], device=run_device).max(), True)
  close(Tensor([[1, 2]], device=run_device).sum(dtype=dtypes.float32), 3.0, dtype=dtypes.float32)
  z = Tensor.zeros(2, 0, device=run_device)
  close(z.sum(1), [0, 0]); close(z.prod(1), [1, 1]); close(z.max(1), [-np.inf, -np.inf]); close(z.mean(), np.nan)
  close(z.sum(0), np.zeros(0)); close(z.any(), False); close(z.all(), True)
  s = Tensor(2.5, device=run_device)
  close(s.sum(), 2.5); close(s.max(0), 2.5); close(s.mean(-1), 2.5)
  close(Tensor([1.0, 1.0], device=run_device).var(correction=2), np.nan)  # 0 / 0
  close(Tensor([-np.inf, -np.inf], device=run_device).logsumexp(), -np.inf)


# ---------------------------------------------------------------- movement

def test_reshape_view_permute_transpose_expand(run_device):
  x = rand(2, 3, 4)
  t = Tensor(x, device=run_device)
  close(t.reshape(6, -1), x.reshape(6, -1)); close(t.reshape((4, 6)), x.reshape(4, 6)); close(t.view(-1), x.reshape(-1))
  close(t.reshape(None, 12), x.reshape(2, 12)); close(t.reshape(24).reshape(2, 3, 4).permute(2, 0, 1), x.transpose(2, 0, 1))
  close(t.permute((1, -1, 0)), x.transpose(1, 2, 0)); close(t.transpose(0, 2), x.swapaxes(0, 2)); close(t.transpose(-1, -2), x.swapaxes(-1, -2))
  close(t.shrink(((0, 1), None, None)).reshape(3, 4).T, x[0].T)
  close(t.shrink((None, (1, 3), (0, 2))), x[:, 1:3, 0:2])
  close(t.sum(1, keepdim=True).expand(2, 5, 4), np.broadcast_to(x.sum(1, keepdims=True), (2, 5, 4)), rtol=1e-5)
  close(t.reshape(2, 1, 3, 4).expand(-1, 2, -1, -1), np.broadcast_to(x[:, None], (2, 2, 3, 4)))
  close(Tensor(x[0, 0], device=run_device).expand(3, 4), np.broadcast_to(x[0, 0], (3, 4)))
  close(Tensor(np.float32(5.0), device=run_device).reshape(1, 1), [[5.0]])
  close(Tensor.zeros(0, 4, device=run_device).reshape(2, 0, 2), np.zeros((2, 0, 2)))


def test_flip_flatten_squeeze(run_device):
  x = rand(2, 1, 3, 1)
  t = Tensor(x, device=run_device)
  close(t.flip(0), x[::-1]); close(t.flip(0, 2), x[::-1, :, ::-1]); close(t.flip((-2,)), x[:, :, ::-1])
  close(t.flatten(), x.reshape(-1)); close(t.flatten(1), x.reshape(2, -1)); close(t.flatten(1, 2), x.reshape(2, 3, 1))
  close(Tensor(np.float32(2), device=run_device).flatten(), [2.0])
  close(t.unflatten(2, (3, 1)), x.reshape(2, 1, 3, 1, 1)); close(t.flatten().unflatten(0, (-1, 2)), x.reshape(3, 2))
  close(t.squeeze(), x.squeeze()); close(t.squeeze(1), x.squeeze(1)); close(t.squeeze(0), x); close(t.squeeze(-1), x.squeeze(-1))
  close(t.unsqueeze(0), x[None]); close(t.unsqueeze(-1), x[..., None]); close(t.unsqueeze(2), np.expand_dims(x, 2))
  close(Tensor(np.float32(2), device=run_device).unsqueeze(0), [2.0])


PADS = [((1, 2), "constant"), ((1, 2, 0, 1), "constant"), ((2, 1), "reflect"), ((1, 2, 2, 0), "reflect"), ((2, 3), "replicate"),
        ((3, 1, 1, 1), "replicate"), ((2, 1), "circular"), ((1, 3, 2, 2), "circular"), ((-1, 2), "constant"), ((1, -2, -1, 0), "reflect")]


@pytest.mark.parametrize("pad,mode", PADS, ids=str)
def test_pad(run_device, pad, mode):
  x = rand(3, 4)
  np_pairs = [(0, 0)] * (2 - len(pad) // 2) + [(pad[2 * i], pad[2 * i + 1]) for i in range(len(pad) // 2)][::-1]
  crop = x[tuple(slice(max(-b, 0), x.shape[i] - max(-a, 0)) for i, (b, a) in enumerate(np_pairs))]
  np_mode = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}[mode]
  want = np.pad(crop, [(max(b, 0), max(a, 0)) for b, a in np_pairs], mode=np_mode)
  close(Tensor(x, device=run_device).pad(pad, mode=mode), want)


def test_pad_forms_and_value(run_device):
  x = rand(2, 3)
  t = Tensor(x, device=run_device)
  close(t.pad(((1, 0), None)), np.pad(x, ((1, 0), (0, 0)))); close(t.pad([(0, 1), (2, 0)]), np.pad(x, ((0, 1), (2, 0))))
  close(t.pad((1, 1), value=-2.5), np.pad(x, ((0, 0), (1, 1)), constant_values=-2.5))
  close(t.pad((1, 1, 1, 1), value=np.inf).max(), np.inf)
  close(Tensor([1, 2], device=run_device).pad((1, 0), value=7), [7, 1, 2], dtype=dtypes.int32)
  close(Tensor([True], device=run_device).pad((1, 1)), [False, True, False])


def test_cat_stack_split_chunk(run_device):
  a, b, c = rand(2, 3), rand(2, 1), rand(2, 2)
  ta, tb, tc = (Tensor(v, device=run_device) for v in (a, b, c))
  close(ta.cat(tb, tc, dim=1), np.concatenate([a, b, c], 1)); close(ta.cat(ta, dim=0), np.concatenate([a, a], 0))
  close(ta.cat(Tensor.zeros(2, 0, device=run_device), dim=-1), a)
  close(ta.cat(Tensor([[1, 2, 3]], device=run_device), dim=0), np.concatenate([a, [[1, 2, 3]]]), dtype=dtypes.float32)  # promoted
  close(Tensor([True], device=run_device).cat(Tensor([False, True], device=run_device)), [True, False, True])
  close(ta.stack(ta * 2), np.stack([a, a * 2])); close(ta.stack(ta, dim=-1), np.stack([a, a], -1))
  close(Tensor(1.0, device=run_device).stack(Tensor(2.0, device=run_device)), [1.0, 2.0])
  x = rand(7, 2)
  tx = Tensor(x, device=run_device)
  for got, want in zip(tx.split(3), np.split(x, [3, 6])): close(got, want)
  for got, want in zip(tx.split([2, 0, 5]), np.split(x, [2, 2])): close(got, want)
  for got, want in zip(tx.split(1, dim=1), np.split(x, 2, 1)): close(got, want)
  parts = tx.chunk(3)
  assert [p.shape for p in parts] == [(3, 2), (3, 2), (1, 2)] and isinstance(parts, list)
  close(parts[2], x[6:])


def test_repeat_roll(run_device):
  x = rand(2, 3)
  t = Tensor(x, device=run_device)
  close(t.repeat(2, 3), np.tile(x, (2, 3))); close(t.repeat((2, 1, 2)), np.tile(x, (2, 1, 2))); close(t.repeat(0, 1), np.tile(x, (0, 1)))
  close(t.repeat_interleave(2), np.repeat(x, 2)); close(t.repeat_interleave(3, dim=1), np.repeat(x, 3, 1))
  close(t.repeat_interleave(2, dim=-2), np.repeat(x, 2, 0))
  close(t.roll(1, 1), np.roll(x, 1, 1)); close(t.roll(-4, 1), np.roll(x, -4, 1)); close(t.roll((1, 2), (0, 1)), np.roll(x, (1, 2), (0, 1)))
  close(t.roll(4), np.roll(x, 4)); close(t.T.roll(1, 0), np.roll(x.T, 1, 0))


# ---------------------------------------------------------------- matmul

@pytest.mark.parametrize("sa,sb", [((4,), (4,)), ((3, 4), (4,)), ((4,), (4, 2)), ((3, 4), (4, 2)), ((2, 3, 4), (4, 5)),
                                   ((3, 4), (2, 4, 5)), ((2, 1, 3, 4), (3, 4, 2)), ((1, 4), (4, 1)), ((0, 4), (4, 3)), ((3, 0), (0, 2))], ids=str)
def test_matmul(run_device, sa, sb):
  a, b = rand(*sa), rand(*sb)
  ta, tb = Tensor(a, device=run_device), Tensor(b, device=run_device)
  want = np.matmul(a.astype(np.float64), b.astype(np.float64))
  close(ta @ tb, want, rtol=1e-5, atol=1e-5); close(ta.matmul(tb), want, rtol=1e-5, atol=1e-5); close(ta.dot(tb), want, rtol=1e-5, atol=1e-5)
  close(tb.matmul(ta, reverse=True), want, rtol=1e-5, atol=1e-5)


def test_matmul_dtypes_and_views(run_device):
  a, b = np.arange(6, dtype=np.int32).reshape(2, 3), np.arange(12, dtype=np.int32).reshape(3, 4) - 5
  close(Tensor(a, device=run_device) @ Tensor(b, device=run_device), a @ b, dtype=dtypes.int32)
  x = rand(4, 3)
  close(Tensor(x, device=run_device).T @ Tensor(x, device=run_device), x.T @ x, rtol=1e-5, atol=1e-6)
  close(Tensor(a, device=run_device).matmul(Tensor(b, device=run_device), dtype=dtypes.float32), (a @ b).astype(np.float32), dtype=dtypes.float32)


# ---------------------------------------------------------------- random

def test_random_ranges_and_moments(run_device):
  Tensor.manual_seed(1234)
  r = Tensor.rand(16, 16, device=run_device).numpy()
  assert r.dtype == np.float32 and r.min() >= 0 and r.max() < 1 and 0.4 < r.mean() < 0.6 and len(np.unique(r)) > 250
  n = Tensor.randn(256, device=run_device).numpy()
  assert abs(n.mean()) < 0.2 and 0.8 < n.std() < 1.2
  i = Tensor.randint(200, low=-3, high=4, device=run_device).numpy()
  assert i.dtype == np.int32 and i.min() == -3 and i.max() == 3
  u = Tensor.uniform(100, low=2, high=5, device=run_device).numpy()
  assert u.min() >= 2 and u.max() < 5
  g = Tensor.normal(200, mean=10, std=0.1, device=run_device).numpy()
  assert 9.9 < g.mean() < 10.1
  for init in (Tensor.scaled_uniform, Tensor.glorot_uniform, Tensor.kaiming_uniform, Tensor.kaiming_normal):
    w = init(8, 4, device=run_device)
    assert w.shape == (8, 4) and np.isfinite(w.numpy()).all() and np.abs(w.numpy()).max() < 3


def test_random_half_and_double(run_device, plugrad_dev):
  for dt in (dtypes.float16, dtypes.float64):
    if not supported(plugrad_dev, dt): continue
    r = Tensor.rand(64, dtype=dt, device=run_device)
    assert r.dtype is dt and 0 <= r.numpy().min() and r.numpy().max() < 1
