"""Conformance: indexing Tensor methods (getitem/setitem, gather, scatter, masked_select, nonzero, tril/triu, diag,
diagonal, unfold) on the device under test, against numpy, with gradients where they are differentiable."""
from __future__ import annotations

import numpy as np
import pytest

from plugrad.dtype import dtypes
from plugrad.tensor.tensor import Tensor
from plugrad.testing.test_tensor_nn import check, rand

pytestmark = pytest.mark.plugrad_conformance
X = np.arange(60, dtype=np.float32).reshape(3, 4, 5) / 10


BASIC = {
  "int": 1, "neg_int": -1, "int_int": (2, -3), "slice": slice(1, 3), "neg_step": (slice(None), slice(None, None, -1)),
  "step2": (slice(None), slice(None), slice(None, None, 2)), "neg_step3": (slice(None), slice(3, 0, -2), slice(4, None, -3)),
  "none": (None, 1, None), "ellipsis": (..., 2), "ellipsis_mid": (0, ..., slice(1, 4)), "empty": (slice(2, 2),),
  "clamped": (slice(-10, 10), slice(5, 1)), "all": (0, slice(1, None, 2), None, -2),
}


@pytest.mark.parametrize("name", BASIC)
def test_getitem_basic(run_device, name):
  idx = BASIC[name]
  check(run_device, lambda t: t[idx], lambda a: a[idx], X, grad=name in ("neg_step3", "all", "none"))


def test_getitem_non_contiguous_and_0d(run_device):
  check(run_device, lambda t: t.permute(2, 0, 1)[1:, ::-2, 1], lambda a: a.transpose(2, 0, 1)[1:, ::-2, 1], X)
  t0 = Tensor(3.5, device=run_device)
  assert t0[...].numpy() == 3.5 and t0[None].shape == (1,)


ADVANCED = {
  "list": [0, 2], "neg_list": [[-1, 0], [1, -3]], "second_dim": (slice(None), [3, 0, 3]), "two_adjacent": ([0, 2, 1], [1, 3, 0]),
  "broadcast": ([[0], [2]], [1, 3, 2]), "separated": ([0, 2], slice(None), [4, 1]), "after_ellipsis": (..., [4, 0]),
  "with_slice_int": (slice(1, 3), 2, [0, 4, 4]), "duplicates": ([1, 1, 0, 1],),
}


@pytest.mark.parametrize("name", ADVANCED)
def test_getitem_advanced(run_device, name):
  idx = ADVANCED[name]
  check(run_device, lambda t: t[idx], lambda a: a[idx], X, grad=name in ("duplicates", "separated", "broadcast"))


def test_getitem_tensor_index(run_device):
  i = np.array([[2, 0], [-1, 1]], dtype=np.int32)
  check(run_device, lambda t: t[Tensor(i, device=run_device), 1:3], lambda a: a[i, 1:3], X)
  j = np.array([4, 0, 2], dtype=np.int64)
  check(run_device, lambda t: t[:, Tensor(i[:, :1], device=run_device), Tensor(j, device=run_device)], lambda a: a[:, i[:, :1], j], X, grad=False)
  # the value of an out-of-range tensor index is only known on the device: it selects nothing (0), as in tinygrad
  np.testing.assert_array_equal(Tensor([1, 2, 3], device=run_device)[Tensor([2, 7], device=run_device)].numpy(), [3, 0])
  assert Tensor(X, device=run_device)[Tensor(np.zeros(0, np.int32), device=run_device)].shape == (0, 4, 5)
  # a 0-d index tensor drops its dim like an int; numpy ints and arrays index like Python ones
  np.testing.assert_array_equal(Tensor(X, device=run_device)[:, Tensor(2, device=run_device)].numpy(), X[:, 2])
  np.testing.assert_array_equal(Tensor(X, device=run_device)[np.int64(1), np.array([3, 0])].numpy(), X[1, [3, 0]])


def test_getitem_bool_and_int_dtypes(run_device):
  b = np.array([[True, False, True], [False, False, True]])
  np.testing.assert_array_equal(Tensor(b, device=run_device)[[1, 0], ::-1].numpy(), b[[1, 0], ::-1])
  x = np.arange(12, dtype=np.int8).reshape(3, 4)
  got = Tensor(x, device=run_device)[[2, 0], 1:]
  assert got.dtype == dtypes.int8
  np.testing.assert_array_equal(got.numpy(), x[[2, 0], 1:])


SETS = {
  "int": (1, 7.0), "slice_row": ((slice(None), 2), np.arange(15, dtype=np.float32).reshape(3, 5)), "neg_step": ((0, slice(None, None, -2)), -1.0),
  "broadcast": ((slice(0, 2), slice(1, 3)), np.array([1.0, 2, 3, 4, 5], np.float32)), "ellipsis_none": ((..., None, 3), 9.0),
  "advanced": (([0, 2], slice(None), [1, 4]), np.array([[1.0], [2.0]], np.float32)), "tensor_list": (([2, 0, 1],), 5.0),
  "adv_dup_last_wins": (([1, 0, 1], [3, 3, 3]), np.array([[10.0] * 5, [20.0] * 5, [30.0] * 5], np.float32)),
}


@pytest.mark.parametrize("name", SETS)
def test_setitem(run_device, name):
  idx, v = SETS[name]
  t = Tensor(X.copy(), device=run_device).realize()
  t[idx] = Tensor(v, device=run_device) if isinstance(v, np.ndarray) else v
  want = X.copy()
  want[idx] = v
  np.testing.assert_array_equal(t.numpy(), want)


def test_setitem_int_dtype_and_tensor_index(run_device):
  t = Tensor(np.zeros((2, 4), np.int32), device=run_device).realize()
  t[:, Tensor([3, 1], device=run_device)] = Tensor([[5, 6]], device=run_device)
  t[0, 0] = 9
  np.testing.assert_array_equal(t.numpy(), [[9, 6, 0, 5], [0, 6, 0, 5]])


def test_gather(run_device):
  idx = np.array([[0, 2, 2], [1, 0, 0]], dtype=np.int32)
  check(run_device, lambda t: t.gather(1, Tensor(idx, device=run_device)), lambda a: np.take_along_axis(a[:, :3], idx, 1), rand(2, 4))
  idx0 = np.array([[1], [0], [1]], dtype=np.int32)
  check(run_device, lambda t: t.gather(0, Tensor(idx0, device=run_device)), lambda a: np.take_along_axis(a[:, :1], idx0, 0), rand(2, 3))
  check(run_device, lambda t: t.T.gather(-1, Tensor(idx0, device=run_device)), lambda a: np.take_along_axis(a.T, idx0, -1), rand(2, 3))


def np_scatter(x, dim, idx, src, reduce=None, include_self=True):
  """PyTorch's scatter / scatter_reduce by definition (later writes win for plain scatter)."""
  out = x.astype(np.float64).copy()
  seen: dict[tuple, list] = {}
  for pos in np.ndindex(idx.shape):
    tgt = pos[:dim] + (idx[pos],) + pos[dim + 1:]
    seen.setdefault(tgt, []).append(src[pos] if isinstance(src, np.ndarray) else src)
  for tgt, vals in seen.items():
    if reduce is None: out[tgt] = vals[-1]; continue
    vals = ([x[tgt]] if include_self else []) + vals
    out[tgt] = {"sum": np.sum, "prod": np.prod, "mean": np.mean, "amax": np.max, "amin": np.min}[reduce](vals)
  return out


IDX = np.array([[0, 1, 0], [2, 0, 0]], dtype=np.int32)


def test_scatter(run_device):
  x, src = rand(3, 4), rand(2, 5)
  check(run_device, lambda t, s: t.scatter(0, Tensor(IDX, device=run_device), s), lambda a, s: np_scatter(a, 0, IDX, s), x, src)
  check(run_device, lambda t: t.scatter(1, Tensor(IDX, device=run_device), 2.5), lambda a: np_scatter(a, 1, IDX, 2.5), x)
  check(run_device, lambda t, s: t.scatter(0, Tensor(IDX, device=run_device), s, reduce="add"), lambda a, s: np_scatter(a, 0, IDX, s, "sum"), x, src)
  check(run_device, lambda t, s: t.scatter(1, Tensor(IDX, device=run_device), s, reduce="multiply"), lambda a, s: np_scatter(a, 1, IDX, s, "prod"),
        x, src, grad=False)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(run_device, reduce, include_self):
  x, src = rand(3, 4), rand(2, 3)
  check(run_device, lambda t, s: t.scatter_reduce(0, Tensor(IDX, device=run_device), s, reduce, include_self=include_self),
        lambda a, s: np_scatter(a, 0, IDX, s, reduce, include_self), x, src, grad=reduce in ("sum", "mean", "amax"))


def test_scatter_reduce_int_mean_floors(run_device):
  t = Tensor([0, 10, 0], device=run_device).scatter_reduce(0, Tensor([1, 1, 0], device=run_device), Tensor([1, 2, 5], device=run_device), "mean")
  np.testing.assert_array_equal(t.numpy(), [2, 4, 0])


def test_masked_select_and_nonzero(run_device):
  x = rand(3, 4)
  m = x > 0.3
  check(run_device, lambda t: t.masked_select(Tensor(m, device=run_device)), lambda a: a[m], x)
  row = np.array([True, False, True, True])
  np.testing.assert_allclose(Tensor(x, device=run_device).masked_select(Tensor(row, device=run_device)).numpy(), x[np.broadcast_to(row, x.shape)])
  got = Tensor(x, device=run_device).masked_select(Tensor(m, device=run_device), size=int(m.sum()) + 2, fill_value=-1).numpy()
  np.testing.assert_allclose(got, np.concatenate([x[m], [-1, -1]]))
  nz = Tensor(m, device=run_device).nonzero()
  assert nz.dtype == dtypes.int32
  np.testing.assert_array_equal(nz.numpy(), np.argwhere(m))
  np.testing.assert_array_equal(Tensor(m, device=run_device).nonzero(size=2).numpy(), np.argwhere(m)[:2])
  assert Tensor(np.zeros((2, 3), np.float32), device=run_device).nonzero().shape == (0, 2)


@pytest.mark.parametrize("diagonal", [0, 1, -1, 3])
def test_tril_triu(run_device, diagonal):
  x = rand(2, 3, 4)
  check(run_device, lambda t: t.tril(diagonal), lambda a: np.tril(a, diagonal), x)
  check(run_device, lambda t: t.triu(diagonal), lambda a: np.triu(a, diagonal), x, grad=False)


def test_diag(run_device):
  check(run_device, Tensor.diag, np.diag, rand(4))
  check(run_device, Tensor.diag, np.diag, rand(3, 4), grad=False)


@pytest.mark.parametrize("off, d1, d2", [(0, 0, 1), (1, 0, 1), (-1, 1, 2), (2, 2, 0), (5, 0, 1)])
def test_diagonal(run_device, off, d1, d2):
  check(run_device, lambda t: t.diagonal(off, d1, d2), lambda a: np.diagonal(a, off, d1, d2), rand(3, 4, 3), grad=off == -1)


@pytest.mark.parametrize("dim, size, step", [(0, 2, 2), (-1, 3, 1), (1, 2, 3), (1, 4, 1)])
def test_unfold(run_device, dim, size, step):
  def ref(a):
    w = np.lib.stride_tricks.sliding_window_view(a, size, axis=dim % a.ndim)
    return np.take(w, range(0, w.shape[dim % a.ndim], step), axis=dim % a.ndim)
  check(run_device, lambda t: t.unfold(dim, size, step), ref, rand(4, 5), grad=step == 1)
