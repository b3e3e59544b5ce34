"""Conformance: scans and sorting (cumsum, cumprod, cummax, cummin, logcumsumexp, sort, argsort, topk) on the device
under test, against numpy, with gradients for the differentiable ones."""
from __future__ import annotations

import numpy as np
import pytest

import plugrad.tensor.scan as scan_mod
from plugrad.dtype import dtypes
from plugrad.tensor.tensor import Tensor
from plugrad.testing.test_tensor_nn import RNG, check, rand

pytestmark = pytest.mark.plugrad_conformance


def np_cum_arg(x, axis, better):
  """Running extremum along axis and the index where it was first reached."""
  x = np.moveaxis(x, axis, -1)
  vals, idx = x.copy(), np.zeros(x.shape, np.int32)
  for pre in np.ndindex(x.shape[:-1]):
    for i in range(1, x.shape[-1]):
      if better(x[pre + (i,)], vals[pre + (i - 1,)]): vals[pre + (i,)], idx[pre + (i,)] = x[pre + (i,)], i
      else: vals[pre + (i,)], idx[pre + (i,)] = vals[pre + (i - 1,)], idx[pre + (i - 1,)]
  return np.moveaxis(vals, -1, axis), np.moveaxis(idx, -1, axis)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumsum_cumprod(run_device, axis):
  x = rand(3, 4, 2, lo=0.5, hi=1.5)
  check(run_device, lambda t: t.cumsum(axis), lambda a: np.cumsum(a, axis), x)
  check(run_device, lambda t: t.cumprod(axis), lambda a: np.cumprod(a, axis), x, grad=axis == 1)


def test_cumsum_dtypes_and_edges(run_device, plugrad_dev):
  acc = dtypes.int64 if "int64" in plugrad_dev.renderer.capabilities else dtypes.int32  # as sum: PyTorch's int64 where the device has it
  assert Tensor([1, 2, 3], dtype=dtypes.int8, device=run_device).cumsum().dtype == acc
  out = Tensor([True, False, True, True], device=run_device).cumsum()
  assert out.dtype == acc
  np.testing.assert_array_equal(out.numpy(), [1, 1, 2, 3])
  assert Tensor(2.5, device=run_device).cumsum().numpy() == 2.5
  assert Tensor.zeros(2, 0, device=run_device).cumsum(1).shape == (2, 0)
  check(run_device, lambda t: t[:, ::-1].cumsum(1), lambda a: np.cumsum(a[:, ::-1], 1), rand(2, 5))


@pytest.mark.parametrize("n", [11, 40])
def test_long_scans_run_in_blocks(run_device, monkeypatch, n):
  monkeypatch.setattr(scan_mod, "_BLOCK", 4)  # the blocked path, at a size the interpreter runs quickly
  x = rand(2, n, lo=0.9, hi=1.1)
  check(run_device, lambda t: t.cumsum(1), lambda a: np.cumsum(a, 1), x, grad=n == 11, atol=1e-4)
  check(run_device, lambda t: t.cumprod(1), lambda a: np.cumprod(a, 1), x, grad=False, atol=1e-4)
  np.testing.assert_allclose(Tensor(x, device=run_device).cummax(1)[0].numpy(), np.maximum.accumulate(x, 1))
  ints = RNG.integers(-5, 5, (n,)).astype(np.int32)
  np.testing.assert_array_equal(Tensor(ints, device=run_device).cumsum().numpy(), np.cumsum(ints))


@pytest.mark.parametrize("axis", [0, -1])
def test_cummax_cummin(run_device, axis):
  x = np.array([[1.0, 3, 3, 2], [5, 5, 1, 7], [0, 4, 4, 9]], dtype=np.float32)
  for name, better in (("cummax", np.greater), ("cummin", np.less)):
    vals, idx = getattr(Tensor(x, device=run_device), name)(axis)
    want_v, want_i = np_cum_arg(x, axis, better)
    assert idx.dtype == dtypes.int32
    np.testing.assert_array_equal(vals.numpy(), want_v)
    np.testing.assert_array_equal(idx.numpy(), want_i)
  xs = rand(3, 4)  # distinct values: the gradient goes to the running extremum
  check(run_device, lambda t: t.cummax(axis)[0], lambda a: np_cum_arg(a, axis, np.greater)[0], xs)
  ints = np.array([3, -1, 4, 4, -5], dtype=np.int32)
  np.testing.assert_array_equal(Tensor(ints, device=run_device).cummin(0)[0].numpy(), np.minimum.accumulate(ints))


def test_logcumsumexp(run_device):
  check(run_device, lambda t: t.logcumsumexp(1), lambda a: np.logaddexp.accumulate(a, 1), rand(2, 5, lo=-3, hi=3))
  big = np.array([1000.0, 1001.0, -1000.0, 999.0], dtype=np.float32)
  np.testing.assert_allclose(Tensor(big, device=run_device).logcumsumexp().numpy(), np.logaddexp.accumulate(big.astype(np.float64)), rtol=1e-6)
  ninf = Tensor([-np.inf, -np.inf, 0.0], device=run_device).logcumsumexp().numpy()
  np.testing.assert_array_equal(ninf, [-np.inf, -np.inf, 0.0])


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dim", [-1, 0])
def test_sort_and_argsort(run_device, dim, descending):
  x = np.array([[3.0, 1, 2, 1, 5], [0, 0, -1, 7, 0], [2, 2, 2, 2, 2]], dtype=np.float32)  # ties: the sort must be stable
  vals, idx = Tensor(x, device=run_device).sort(dim, descending)
  want_i = np.argsort(-x if descending else x, axis=dim, kind="stable")
  assert idx.dtype == dtypes.int32
  np.testing.assert_array_equal(idx.numpy(), want_i)
  np.testing.assert_array_equal(vals.numpy(), np.take_along_axis(x, want_i, dim))
  np.testing.assert_array_equal(Tensor(x, device=run_device).argsort(dim, descending).numpy(), want_i)


def test_sort_gradient_nan_and_edges(run_device):
  x = rand(2, 6)
  check(run_device, lambda t: t.sort(-1, descending=True)[0], lambda a: -np.sort(-a, -1), x)
  nan = np.array([2.0, np.nan, -1.0, np.nan, 0.5], dtype=np.float32)
  np.testing.assert_array_equal(Tensor(nan, device=run_device).sort()[0].numpy(), np.sort(nan))      # NaN last
  np.testing.assert_array_equal(Tensor(nan, device=run_device).sort()[1].numpy(), [2, 4, 0, 1, 3])
  np.testing.assert_array_equal(Tensor(nan, device=run_device).sort(descending=True)[1].numpy(), [1, 3, 0, 4, 2])  # NaN first
  ints = np.array([5, -3, 5, 0], dtype=np.int32)
  np.testing.assert_array_equal(Tensor(ints, device=run_device).sort()[0].numpy(), np.sort(ints))
  v, i = Tensor(4.0, device=run_device).sort()
  assert v.numpy() == 4.0 and i.numpy() == 0 and i.shape == ()
  assert Tensor.zeros(0, device=run_device).sort()[0].shape == (0,)


@pytest.mark.parametrize("k, largest", [(2, True), (3, False), (5, True), (0, True)])
def test_topk(run_device, k, largest):
  x = np.array([[4.0, 1, 4, 0, 2], [1, 3, 3, 3, 9]], dtype=np.float32)
  vals, idx = Tensor(x, device=run_device).topk(k, largest=largest)
  want_i = np.argsort(-x if largest else x, axis=-1, kind="stable")[:, :k]
  np.testing.assert_array_equal(idx.numpy(), want_i)
  np.testing.assert_array_equal(vals.numpy(), np.take_along_axis(x, want_i, -1))
  if k == 2:
    check(run_device, lambda t: t.topk(2, dim=0)[0], lambda a: -np.sort(-a, 0)[:2], rand(4, 3))
