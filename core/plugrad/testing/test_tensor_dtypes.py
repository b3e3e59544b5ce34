"""Conformance: dtype handling and integer semantics against PyTorch (issue 21).

* reductions and scans take `dtype=` as a name, a DType or a numpy dtype;
* integer sums, products and their scans accumulate in int64 where the device has it (PyTorch's rule), else in the
  32-bit dtype of their kind (tinygrad's rule);
* `arange` gives PyTorch's values with the default int (int32) or float, int64 past the int32 range;
* `DType.min`/`DType.max` are PyTorch's `iinfo`/`finfo` limits;
* an integer tensor to a negative integer power raises like PyTorch; shifts by any count match PyTorch;
* `maximum`/`minimum` promote like PyTorch; `interpolate` on uint8 rounds like PyTorch;
* data that does not fit its dtype (`Tensor([300], dtype=dtypes.int8)`, `full(..., 300, dtype=dtypes.int8)`) raises
  `DTypeRangeError`, while arithmetic wraps.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from plugrad.dtype import DType, DTypeRangeError, dtypes
from plugrad.tensor.helpers import ArgumentError
from plugrad.tensor.tensor import Tensor

pytestmark = pytest.mark.plugrad_conformance
RNG = np.random.default_rng(2121)
# the dtypes PyTorch computes with throughout (its uint16/32/64 lack most ops)
TORCH_NAMES = ["bool", "int8", "uint8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


def _torch() -> Any: return pytest.importorskip("torch")


def has(dev: Any, dt: DType) -> bool:
  """Can the device compute in `dt`? (its renderer's capabilities, never its name)"""
  need = {dtypes.float16: "float16", dtypes.bfloat16: "bfloat16", dtypes.float64: "float64", dtypes.int64: "int64", dtypes.uint64: "int64"}
  return dt not in need or need[dt] in dev.renderer.capabilities


def _from(x: np.ndarray, name: str, device: str) -> Tensor:
  """`x` as a plugrad tensor of dtype `name` (bfloat16 through float32, as numpy lacks it)."""
  return Tensor(x.astype(np.float32) if name == "bfloat16" else x.astype(name), device=device).cast(getattr(dtypes, name))


def _torch_from(x: np.ndarray, name: str) -> Any:
  torch = _torch()
  return torch.tensor(x.astype(np.float32) if name == "bfloat16" else x.astype(name)).to(getattr(torch, name))


def _values(t: Any) -> np.ndarray:
  """Values of a plugrad or torch tensor as float64 (every dtype here is exact in it, bar 64-bit ints past 2**53)."""
  if isinstance(t, Tensor): return t.cast(dtypes.float32).numpy().astype(np.float64) if t.dtype in (dtypes.float16, dtypes.bfloat16) else \
      t.numpy().astype(np.float64)
  return t.double().numpy()


# ---------------------------------------------------------------- the dtype argument of reductions and scans

DTYPE_ARG = ["int8", "int16", "int32", "int64", "float16", "float32", "float64"]


@pytest.mark.parametrize("op", ["sum", "prod", "cumsum", "cumprod"])
@pytest.mark.parametrize("spelling", ["name", "dtype", "numpy"])
def test_reduction_dtype_argument(run_device, plugrad_dev, op, spelling):
  torch = _torch()
  x = np.array([[1, -2, 3], [4, 5, -6]], np.int8)
  for name in DTYPE_ARG:
    if not has(plugrad_dev, getattr(dtypes, name)): continue
    dt = {"name": name, "dtype": getattr(dtypes, name), "numpy": np.dtype(name)}[spelling]
    got = getattr(Tensor(x, device=run_device), op)(1, dtype=dt)
    want = getattr(torch.tensor(x), op)(1, dtype=getattr(torch, name))
    assert got.dtype is getattr(dtypes, name), f"{op}(dtype={dt!r}) gave {got.dtype}"
    np.testing.assert_allclose(_values(got), _values(want), err_msg=f"{op}(dtype={dt!r})")


@pytest.mark.parametrize("op", ["sum", "prod", "cumsum", "cumprod"])
def test_reduction_dtype_argument_gradient(run_device, plugrad_dev, op):
  torch = _torch()
  wide = "float64" if has(plugrad_dev, dtypes.float64) else "float32"
  x = RNG.uniform(0.5, 1.5, (2, 3)).astype(np.float32)
  t, tt = Tensor(x, device=run_device, requires_grad=True), torch.tensor(x, requires_grad=True)
  out, want = getattr(t, op)(1, dtype=wide), getattr(tt, op)(1, dtype=getattr(torch, wide))
  assert out.dtype is getattr(dtypes, wide)
  out.sum().backward()
  want.sum().backward()
  assert t.grad is not None and t.grad.dtype is dtypes.float32
  np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), rtol=1e-5)


# ---------------------------------------------------------------- integer accumulation

# values whose sum, product and their running forms overflow the input dtype
ACC_DATA = {"bool": [True, True, False, True], "int8": [100, 100, 100, -3], "uint8": [200, 200, 200, 3], "int16": [30000, 30000, 2, -1],
            "uint16": [60000, 60000, 2, 1], "int32": [2**30, 2**30, 2**30, 2**30], "uint32": [2**31, 2**31, 3, 1],
            "int64": [2**40, 2**20, 3, -1]}


@pytest.mark.parametrize("op", ["sum", "prod", "cumsum", "cumprod"])
@pytest.mark.parametrize("name", list(ACC_DATA))
def test_integer_accumulation(run_device, plugrad_dev, name, op):
  """Integer sums and products accumulate in int64 like PyTorch where the device has int64; elsewhere in int32 (uint32
  for unsigned dtypes), wrapping."""
  torch = _torch()
  x = np.array(ACC_DATA[name], dtype=name)
  if name == "int64" and not has(plugrad_dev, dtypes.int64): pytest.skip(f"{run_device} lacks int64")
  got = getattr(Tensor(x, device=run_device), op)(0) if op.startswith("cum") else getattr(Tensor(x, device=run_device), op)()
  tx = torch.tensor(x.astype(np.int64))  # PyTorch's result for every input dtype here is the int64 one
  want = getattr(tx, op)(0).numpy() if op.startswith("cum") else np.array(getattr(tx, op)().item())
  if has(plugrad_dev, dtypes.int64):
    assert got.dtype is dtypes.int64, f"{name}.{op}() gave {got.dtype}, PyTorch int64"
    np.testing.assert_array_equal(got.numpy(), want)
  else:
    acc = dtypes.uint32 if dtypes.is_unsigned(getattr(dtypes, name)) else dtypes.int32
    assert got.dtype is acc
    np.testing.assert_array_equal(got.numpy(), want.astype(dtypes.to_numpy(acc)))  # wrapped like C


def test_uint64_sum_stays_uint64(run_device, plugrad_dev):
  if not has(plugrad_dev, dtypes.uint64): pytest.skip(f"{run_device} lacks uint64")
  out = Tensor(np.array([2**63, 5], np.uint64), device=run_device).sum()
  assert out.dtype is dtypes.uint64 and out.item() == 2**63 + 5  # PyTorch's int64 would wrap


def test_integer_reductions_that_keep_their_dtype(run_device):
  """max/min/argmax keep their dtypes; matmul and einsum of integers keep the promoted input dtype (as PyTorch)."""
  torch = _torch()
  a = np.array([[1, 2], [3, 4]], np.int32)
  t = Tensor(a, device=run_device)
  assert t.max().dtype is dtypes.int32 and t.min().dtype is dtypes.int32
  ta = torch.tensor(a)
  for got, want in [(t @ t, ta @ ta), (Tensor.einsum("ij,jk->ik", t, t), torch.einsum("ij,jk->ik", ta, ta))]:
    assert got.dtype is dtypes.int32 and str(want.dtype) == "torch.int32"
    np.testing.assert_array_equal(got.numpy(), want.numpy())


# ---------------------------------------------------------------- arange

ARANGE = [(5,), (5.0,), (0, 5, 0.5), (1, 5.5), (0.5, 3), (0, 10, 3), (10, 0, -3), (-3, 3, 2.5), (3, 3), (0, 1, 0.1),
          (2**31, 2**31 + 3), (-2**31 - 2, -2**31 + 1), (0, 2**33, 2**32), (True,)]


@pytest.mark.parametrize("args", ARANGE, ids=[str(a) for a in ARANGE])
def test_arange_dtype_and_values(run_device, plugrad_dev, args):
  """PyTorch's rule: integer bounds give an integer tensor, a float anywhere the default float. The integer one is the
  default int (int32, as tinygrad) while every value fits it, else int64 (PyTorch's is always int64)."""
  torch = _torch()
  want = torch.arange(*args)
  if want.dtype == torch.int64:
    fits = want.numel() == 0 or (int(want.min()) >= dtypes.int32.min and int(want.max()) <= dtypes.int32.max)
    if not fits and not has(plugrad_dev, dtypes.int64): pytest.skip(f"{run_device} lacks int64")
    expect = dtypes.int32 if fits else dtypes.int64
  else: expect = dtypes.float32
  got = Tensor.arange(*args, device=run_device)
  assert got.dtype is expect, f"arange{args} gave {got.dtype}, want {expect}"
  assert got.shape == tuple(want.shape)
  np.testing.assert_allclose(_values(got), _values(want), rtol=1e-6, atol=1e-7)


def test_arange_numpy_bounds_and_explicit_dtype(run_device):
  torch = _torch()
  got = Tensor.arange(np.int64(2), np.int32(9), np.int16(3), device=run_device)
  assert got.dtype is dtypes.int32 and got.tolist() == torch.arange(2, 9, 3).tolist()
  got = Tensor.arange(np.float32(0.5), 3, device=run_device)
  assert got.dtype is dtypes.float32 and got.tolist() == [0.5, 1.5, 2.5]
  got = Tensor.arange(0, 5, dtype="int16", device=run_device)
  assert got.dtype is dtypes.int16 and got.tolist() == [0, 1, 2, 3, 4]
  # a step pointing away from stop gives nothing (numpy and tinygrad; PyTorch raises)
  assert Tensor.arange(5, 0, device=run_device).shape == (0,) == np.arange(5, 0).shape
  got = Tensor.arange(4, dtype=dtypes.float16, device=run_device)
  assert got.dtype is dtypes.float16 and got.tolist() == [0, 1, 2, 3]
  # an explicit dtype the values do not fit raises (PyTorch wraps them silently)
  for args, dt in [((0, 300, 100), dtypes.int8), ((2**31, 2**31 + 2), dtypes.int32), ((-1, 2), dtypes.uint8)]:
    with pytest.raises(DTypeRangeError, match="does not fit"): Tensor.arange(*args, dtype=dt, device=run_device)


# ---------------------------------------------------------------- dtype limits

def test_dtype_limits():
  torch = _torch()
  for name in ["int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]:
    info = torch.iinfo(getattr(torch, name))
    dt = getattr(dtypes, name)
    assert (dt.min, dt.max) == (info.min, info.max), name
    assert isinstance(dt.max, int)
  for name in ["float16", "bfloat16", "float32", "float64"]:
    info = torch.finfo(getattr(torch, name))
    dt = getattr(dtypes, name)
    assert (dt.min, dt.max) == (info.min, info.max), name
  assert (dtypes.bool.min, dtypes.bool.max) == (False, True)
  assert dtypes.int32.vec(4).max == dtypes.int32.max and dtypes.default_int.min == -2**31
  # the identities of max/min reductions are unchanged: infinite for floats
  assert dtypes.min(dtypes.float32) == -np.inf and dtypes.max(dtypes.float32) == np.inf
  with pytest.raises(TypeError, match="pointer"): _ = dtypes.float32.ptr().max


# ---------------------------------------------------------------- pow and shifts

def test_integer_pow_negative_exponent(run_device):
  torch = _torch()
  for name in ["int8", "int32", "uint8"]:
    for e in (-1, -3):
      with pytest.raises(RuntimeError, match="negative"): torch.tensor([2, 3], dtype=getattr(torch, name)) ** e
      t = Tensor([2, 3], dtype=getattr(dtypes, name), device=run_device)
      for fn in (lambda t, e=e: t ** e, lambda t, e=e: t.pow(e)):
        with pytest.raises(ArgumentError, match=rf"{t.dtype}.*negative integer power \({e}\)") as err: fn(t)
        assert isinstance(err.value, RuntimeError) and isinstance(err.value, ValueError)
  # exponent tensors, float exponents and reversed powers compute like PyTorch
  base, ex = np.array([2, 3, 1, -1, -2, 5], np.int32), np.array([-1, -2, -1, -3, 2, 0], np.int32)
  cases = [(lambda m, b, e: b ** e), (lambda m, b, e: b ** -1.0), (lambda m, b, e: 2 ** e), (lambda m, b, e: b ** 0), (lambda m, b, e: b ** 3)]
  for fn in cases:
    got, want = fn(None, Tensor(base, device=run_device), Tensor(ex, device=run_device)), fn(None, torch.tensor(base), torch.tensor(ex))
    np.testing.assert_allclose(_values(got), _values(want))


SHIFT_DATA = {"int8": [1, -8, 127, -128, -1, 7], "uint8": [1, 200, 255, 0, 128, 7], "int16": [1, -8, 32767, -32768, -1, 300],
              "int32": [1, -8, 2**30, -2**31, -1, 7], "int64": [1, -8, 2**62, -2**63, -1, 7]}


@pytest.mark.parametrize("name", list(SHIFT_DATA))
def test_shifts(run_device, plugrad_dev, name):
  """`<<` and `>>` (and lshift/rshift) by any count, in range or not, negative or not, as a Python int or a tensor:
  PyTorch's answers (a count past the width or negative shifts everything out: 0, or -1 for a negative value >>)."""
  torch = _torch()
  if not has(plugrad_dev, getattr(dtypes, name)): pytest.skip(f"{run_device} lacks {name}")
  x = np.array(SHIFT_DATA[name], dtype=name)
  bits = 8 * np.dtype(name).itemsize
  counts = [0, 1, 3, bits - 1, bits, bits + 1, 2 * bits, 100, -1, -bits - 1]
  t, tt = Tensor(x, device=run_device), torch.tensor(x)
  for c in counts:
    for op, pg, pt in [("<<", lambda a, c: a << c, lambda a, c: a << c), (">>", lambda a, c: a >> c, lambda a, c: a >> c),
                       ("lshift", lambda a, c: a.lshift(c), lambda a, c: a << c), ("rshift", lambda a, c: a.rshift(c), lambda a, c: a >> c)]:
      got, want = pg(t, c), pt(tt, c)
      assert got.dtype is getattr(dtypes, name)
      np.testing.assert_array_equal(got.numpy(), want.numpy(), err_msg=f"{name} {op} {c}")
  cnt = np.resize(np.array([c for c in counts if (name != "uint8" or c >= 0) and -128 <= c <= 127], dtype=name), x.shape)
  np.testing.assert_array_equal((t << Tensor(cnt, device=run_device)).numpy(), (tt << torch.tensor(cnt)).numpy())
  np.testing.assert_array_equal((t >> Tensor(cnt, device=run_device)).numpy(), (tt >> torch.tensor(cnt)).numpy())
  # a Python int shifted by a tensor, and a narrower tensor by a wider one (promoted)
  small = np.array([0, 1, 2, 3, 4, 5], dtype=name)
  np.testing.assert_array_equal((1 << Tensor(small, device=run_device)).numpy(), (1 << torch.tensor(small)).numpy())
  wide = Tensor(small, device=run_device).cast(dtypes.int32)
  got = Tensor(np.ones(6, np.int8), device=run_device) << wide
  assert got.dtype is dtypes.int32 and got.tolist() == [1, 2, 4, 8, 16, 32]


def test_shifts_need_integers(run_device):
  with pytest.raises(TypeError, match="lshift needs integer"): Tensor([1.0], device=run_device) << 1
  with pytest.raises(TypeError, match="rshift needs integer"): Tensor([1], device=run_device) >> 1.5


# ---------------------------------------------------------------- maximum / minimum across dtypes

@pytest.mark.parametrize("op", ["maximum", "minimum"])
def test_maximum_minimum_promotion(run_device, plugrad_dev, op):
  torch = _torch()
  av, bv = np.array([1, 0, 3, -2, 5, 1]), np.array([2, 0, 1, 4, -7, 1])
  bad = []
  for a in TORCH_NAMES:
    for b in TORCH_NAMES:
      if not (has(plugrad_dev, getattr(dtypes, a)) and has(plugrad_dev, getattr(dtypes, b))): continue
      xa, xb = (av != 0 if a == "bool" else av % 256 if a == "uint8" else av), (bv != 0 if b == "bool" else bv % 256 if b == "uint8" else bv)
      want = getattr(torch, op)(_torch_from(xa, a), _torch_from(xb, b))
      got = getattr(_from(xa, a, run_device), op)(_from(xb, b, run_device))
      name = next((n for n in TORCH_NAMES if getattr(dtypes, n) is got.dtype), str(got.dtype))
      if str(want.dtype) != f"torch.{name}" or not np.array_equal(_values(got), _values(want)): bad.append((a, b, str(want.dtype), name))
  assert bad == []


def test_maximum_minimum_nan_and_ties(run_device):
  torch = _torch()
  a, b = np.array([np.nan, 1, np.nan, 2, 3], np.float32), np.array([1, np.nan, np.nan, 2, -1], np.float32)
  for op in ("maximum", "minimum"):
    ta, tb = Tensor(a, device=run_device, requires_grad=True), Tensor(b, device=run_device, requires_grad=True)
    pa, pb = torch.tensor(a, requires_grad=True), torch.tensor(b, requires_grad=True)
    out, want = getattr(ta, op)(tb), getattr(torch, op)(pa, pb)
    np.testing.assert_array_equal(out.numpy(), want.detach().numpy())  # nan on either side propagates
    fin = np.isfinite(a) & np.isfinite(b)
    w = np.where(fin, 1.0, 0.0).astype(np.float32)  # gradients where both are numbers (ties share it: 0.5 each)
    (out * Tensor(w, device=run_device)).sum().backward()
    (want * torch.tensor(w)).sum().backward()
    np.testing.assert_array_equal(ta.grad.numpy()[fin], pa.grad.numpy()[fin])
    np.testing.assert_array_equal(tb.grad.numpy()[fin], pb.grad.numpy()[fin])


# ---------------------------------------------------------------- interpolate on uint8

@pytest.mark.parametrize("mode,align", [("linear", False), ("linear", True), ("nearest", False), ("nearest-exact", False)])
def test_interpolate_uint8(run_device, mode, align):
  """uint8 images resize like PyTorch: bilinear rounds to the nearest value (not truncates), nearest copies."""
  torch = _torch()
  F = torch.nn.functional
  img = RNG.integers(0, 256, (2, 3, 5, 7)).astype(np.uint8)
  tmode = {"linear": "bilinear"}.get(mode, mode)
  for size in [(7, 3), (10, 14), (2, 2), (5, 7), (11, 4)]:
    want = F.interpolate(torch.tensor(img), size=size, mode=tmode, **({"align_corners": align} if mode == "linear" else {})).numpy()
    got = Tensor(img, device=run_device).interpolate(size, mode=mode, align_corners=align)
    assert got.dtype is dtypes.uint8
    np.testing.assert_array_equal(got.numpy(), want, err_msg=f"{mode} align_corners={align} size={size}")


# ---------------------------------------------------------------- data that does not fit its dtype

def _setitem(dev: str) -> None:
  t = Tensor.zeros(3, dtype=dtypes.int8, device=dev).contiguous().realize()
  t[0] = 300


OUT_OF_RANGE = [
  ("full_int8", lambda m, d: m.full((2,), 300, dtype=m.int8, **d), True),
  ("full_like_int8", lambda m, d: m.full_like(m.zeros(2, dtype=m.int8, **d), 300), True),
  ("full_int32", lambda m, d: m.full((2,), 1e10, dtype=m.int32, **d), True),
  ("full_uint8_negative", lambda m, d: m.full((2,), -1000, dtype=m.uint8, **d), True),
  ("full_float16", lambda m, d: m.full((2,), 70000.0, dtype=m.float16, **d), True),
  ("full_float32", lambda m, d: m.full((2,), 1e39, dtype=m.float32, **d), True),
  ("list_int8", lambda m, d: m.tensor([[1, 300]], dtype=m.int8, **d), True),
  ("scalar_int8", lambda m, d: m.tensor(300, dtype=m.int8, **d), True),
  ("list_uint8_negative", lambda m, d: m.tensor([-1000], dtype=m.uint8, **d), True),
  ("list_default_int", lambda m, d: m.tensor([2**40, 1], dtype=m.int32, **d), True),
]


def _pg_module(dev: str) -> Any:
  class M:
    int8, int32, uint8, float16, float32 = dtypes.int8, dtypes.int32, dtypes.uint8, dtypes.float16, dtypes.float32
    full, zeros, full_like = staticmethod(Tensor.full), staticmethod(Tensor.zeros), staticmethod(Tensor.full_like)
    tensor = Tensor
  return M


@pytest.mark.parametrize("name,fn,torch_raises", OUT_OF_RANGE, ids=[c[0] for c in OUT_OF_RANGE])
def test_out_of_range_data_raises(run_device, name, fn, torch_raises):
  torch = _torch()
  if torch_raises:
    with pytest.raises(RuntimeError): fn(torch, {})
  with pytest.raises(DTypeRangeError, match="does not fit|cannot be stored") as e: fn(_pg_module(run_device), {"device": run_device})
  assert isinstance(e.value, OverflowError) and isinstance(e.value, ValueError) and isinstance(e.value, RuntimeError)


def test_out_of_range_setitem_raises(run_device):
  torch = _torch()
  with pytest.raises(RuntimeError): torch.zeros(3, dtype=torch.int8)[0] = 300
  with pytest.raises(DTypeRangeError, match="300"): _setitem(run_device)


def test_in_range_data_and_wrapping_arithmetic(run_device):
  torch = _torch()
  checks = [(lambda m, d: m.full((2,), 127, dtype=m.int8, **d)), (lambda m, d: m.full((2,), -128, dtype=m.int8, **d)),
            (lambda m, d: m.full((2,), 2.7, dtype=m.int32, **d)), (lambda m, d: m.full((2,), 255, dtype=m.uint8, **d)),
            (lambda m, d: m.full((2,), float("inf"), dtype=m.float32, **d)), (lambda m, d: m.full((2,), 65504.0, dtype=m.float16, **d)),
            (lambda m, d: m.tensor([127, -128], dtype=m.int8, **d)),
            # arithmetic wraps (C semantics, as PyTorch)
            (lambda m, d: m.tensor([100, -100], dtype=m.int8, **d) + 100), (lambda m, d: m.tensor([100, 7], dtype=m.int8, **d) * 3),
            (lambda m, d: m.tensor([2**31 - 1], dtype=m.int32, **d) + 1)]
  for fn in checks:
    np.testing.assert_array_equal(_values(fn(_pg_module(run_device), {"device": run_device})), _values(fn(torch, {})))
  assert np.isnan(Tensor.full((1,), float("nan"), dtype=dtypes.float16, device=run_device).numpy()).all()
