"""Conformance: gathers and scatters as indexed loads and stores (GATHER/SCATTER, docs/ir.md) on the device under test:
values against numpy, the bounds behaviour, gradients (the scatter-add backward), and the kernels' structure (one
kernel per lookup, the index tensor loaded inside it, no reduction over the table's rows)."""
from __future__ import annotations

import numpy as np
import pytest

import plugrad.nn as nn
from plugrad.device.registry import Device
from plugrad.engine.schedule import SCATTER_ATOMIC
from plugrad.helpers import Context
from plugrad.tensor.tensor import Tensor
from plugrad.testing.test_tensor_nn import check, rand
from plugrad.uop.ops import Ops, UOp

pytestmark = pytest.mark.plugrad_conformance
RNG = np.random.default_rng(7)


def np_take(a: np.ndarray, idx: np.ndarray, axis: int) -> np.ndarray:
  """a indexed by idx along axis, negative indices wrapped once and rows still out of range reading 0 (our semantics)."""
  n = a.shape[axis]
  w = np.where(idx < 0, idx + n, idx)
  ok = (w >= 0) & (w < n)
  out = np.take(a, np.clip(w, 0, n - 1), axis=axis)
  return np.where(ok.reshape((1,) * axis + ok.shape + (1,) * (a.ndim - axis - 1)), out, 0)


GETITEM = {
  "first": (lambda t, i: t[i], 0, (2, 3)), "middle": (lambda t, i: t[:, i], 1, (4,)), "last": (lambda t, i: t[..., i], 2, (3, 2)),
  "scalar_idx": (lambda t, i: t[i], 0, ()),
}


@pytest.mark.parametrize("name", GETITEM)
def test_getitem_int_tensor(run_device, name):
  fn, axis, ishape = GETITEM[name]
  x = rand(5, 6, 7)
  idx = RNG.integers(-x.shape[axis], x.shape[axis], ishape).astype(np.int32)
  check(run_device, lambda t: fn(t, Tensor(idx, device=run_device)), lambda a: np_take(a, idx, axis), x)


def test_getitem_two_index_tensors(run_device):
  x = rand(4, 5, 6)
  i, j = np.array([[0, 3], [2, 1]], np.int32), np.array([4, -1], np.int32)
  check(run_device, lambda t: t[Tensor(i, device=run_device), :, Tensor(j, device=run_device)], lambda a: a[i, :, j], x)  # apart: to the front
  check(run_device, lambda t: t[:, Tensor(j, device=run_device), Tensor(i, device=run_device)], lambda a: a[:, j, i], x)  # adjacent: in place


def test_getitem_out_of_range_reads_zero(run_device):
  x = np.arange(12, dtype=np.float32).reshape(4, 3)
  got = Tensor(x, device=run_device)[Tensor([1, 4, -1, -5, 100], device=run_device)].numpy()
  np.testing.assert_array_equal(got, np.stack([x[1], np.zeros(3), x[3], np.zeros(3), np.zeros(3)]))


def test_getitem_bool_and_int_tables(run_device):
  idx = Tensor([2, 0, 2], device=run_device)
  b = np.array([True, False, True])
  np.testing.assert_array_equal(Tensor(b, device=run_device)[idx].numpy(), b[[2, 0, 2]])
  i = np.array([5, 1, 2], np.int32)
  np.testing.assert_array_equal(Tensor(i, device=run_device)[idx].numpy(), i[[2, 0, 2]])


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_gather_each_dim(run_device, dim):
  x = rand(4, 5, 6)
  shape = [3, 4, 5]
  d = dim % 3
  shape[d] = 7
  idx = RNG.integers(0, x.shape[d], shape).astype(np.int32)
  cut = tuple(slice(0, s) if i != d else slice(None) for i, s in enumerate(shape))
  check(run_device, lambda t: t.gather(dim, Tensor(idx, device=run_device)), lambda a: np.take_along_axis(a[cut], idx, d), x)


def test_gather_out_of_range_reads_zero(run_device):
  x = np.arange(6, dtype=np.float32).reshape(2, 3)
  got = Tensor(x, device=run_device).gather(1, Tensor([[0, 3], [-1, 2]], device=run_device)).numpy()
  np.testing.assert_array_equal(got, [[0, 0], [0, 5]])


def test_gather_backward_repeated_and_out_of_range(run_device):
  w = rand(6, 3)
  idx = np.array([[1, 1, 5], [0, 1, 9]], np.int32)  # 9 is out of range: no gradient anywhere
  t = Tensor(w, device=run_device, requires_grad=True)
  g = RNG.standard_normal((2, 3, 3)).astype(np.float32)
  (t[Tensor(idx, device=run_device)] * Tensor(g, device=run_device)).sum().backward()
  want = np.zeros_like(w)
  for (b, s), v in np.ndenumerate(idx):
    if v < 6: want[v] += g[b, s]
  assert t.grad is not None
  np.testing.assert_allclose(t.grad.numpy(), want, rtol=1e-5, atol=1e-6)


def test_embedding_values_and_backward(run_device):
  emb = nn.Embedding(50, 8)
  emb.weight = Tensor(w := rand(50, 8), device=run_device, requires_grad=True)
  ids = RNG.integers(0, 50, (3, 7)).astype(np.int32)
  ids[0, :3] = 4  # repeated rows accumulate
  out = emb(Tensor(ids, device=run_device))
  np.testing.assert_allclose(out.numpy(), w[ids], rtol=1e-6)
  g = RNG.standard_normal((3, 7, 8)).astype(np.float32)
  (emb(Tensor(ids, device=run_device)) * Tensor(g, device=run_device)).sum().backward()
  want = np.zeros_like(w)
  np.add.at(want, ids, g)
  assert emb.weight.grad is not None
  np.testing.assert_allclose(emb.weight.grad.numpy(), want, rtol=1e-5, atol=1e-5)


def test_setitem_tensor_index_last_write_wins(run_device):
  x = np.zeros((5, 3), np.float32)
  t = Tensor(x, device=run_device).contiguous().realize()
  t[Tensor([1, 3, 1], device=run_device)] = Tensor(np.arange(9, dtype=np.float32).reshape(3, 3), device=run_device)
  want = x.copy()
  want[[1, 3, 1]] = np.arange(9, dtype=np.float32).reshape(3, 3)
  np.testing.assert_array_equal(t.numpy(), want)


def test_linear(run_device):
  x, w, b = rand(4, 3), rand(3, 5), rand(5)
  check(run_device, lambda t, u, c: t.linear(u, c), lambda a, u, c: a @ u + c, x, w, b)
  check(run_device, lambda t, u: t.linear(u), lambda a, u: a @ u, x, w)
  check(run_device, lambda t, u: t.linear(u), lambda a, u: a * u, x, rand(3))


# ---------------------------------------------------------------- structure: indexed loads, not one-hot reductions

def _kernels(t: Tensor) -> list[UOp]: return [it.ast for it in t.schedule() if it.kind == "kernel"]


def _data_dependent_indices(ast: UOp) -> list[UOp]:
  return [u for u in ast.toposort if u.op is Ops.INDEX and any(x.op is Ops.LOAD for x in u.src[1].toposort)]


def test_gather_is_one_indexed_load_kernel(run_device):
  W = Tensor(rand(1000, 16), device=run_device).realize()
  ids = Tensor(RNG.integers(0, 1000, (4, 8)).astype(np.int32), device=run_device).realize()
  (ast,) = _kernels(W[ids] * 2)  # the index tensor is read in the lookup kernel itself
  assert not any(u.op is Ops.REDUCE for u in ast.toposort), "a lookup must not reduce over the table's rows"
  (ix,) = _data_dependent_indices(ast)
  assert len(ix.src) == 3, "the indexed load needs a bounds gate"


def test_embedding_backward_is_a_scatter_not_a_product(run_device):
  W = Tensor(rand(1000, 16), device=run_device, requires_grad=True)
  ids = Tensor(RNG.integers(0, 1000, (4, 8)).astype(np.int32), device=run_device).realize()
  (grad,) = (W[ids] * 3).sum().gradient(W)
  asts = _kernels(grad)
  assert not any(u.op is Ops.REDUCE for a in asts for u in a.toposort)
  stores = [u for a in asts for u in a.toposort if u.op is Ops.STORE and any(x.op is Ops.LOAD for x in u.src[0].src[1].toposort)]
  assert stores, "the gradient must be an indexed store (scatter-add)"


@pytest.mark.parametrize("mode", [0, 2])
def test_scatter_add_serial_and_atomic_forms(run_device, mode):
  """SCATTER_ATOMIC=0: the serial loop along the indexed axis (plain read-add-writes); 2: one parallel loop of atomic
  adds (STORE arg Ops.ADD) where the renderer declares them. Both give an embedding's gradient, collisions and an
  out-of-range id included, and an int32 1-d index_add (counts into 4 bins from 300 positions)."""
  atomic = mode == 2 and Device[run_device].renderer.atomic_add
  assert SCATTER_ATOMIC.value in (0, 1, 2)
  with Context(SCATTER_ATOMIC=mode):
    W = Tensor(w := rand(20, 6), device=run_device, requires_grad=True)
    ids = RNG.integers(0, 20, (5, 9)).astype(np.int32)
    ids[:, :4], ids[0, 5] = 3, 25  # one row hit 20 times; 25 reads 0 and gets no gradient
    g = RNG.standard_normal((5, 9, 6)).astype(np.float32)
    (grad,) = (W[Tensor(ids, device=run_device)] * Tensor(g, device=run_device)).sum().gradient(W)
    stores = [u for a in _kernels(grad) for u in a.toposort if u.op is Ops.STORE and any(x.op is Ops.LOAD for x in u.src[0].src[1].toposort)]
    assert stores and all((u.arg is Ops.ADD) == bool(atomic) for u in stores)
    want = np.zeros_like(w)
    ok = ids < 20
    np.add.at(want, ids[ok], g[ok])
    np.testing.assert_allclose(grad.numpy(), want, rtol=1e-5, atol=1e-5)
    bins = RNG.integers(0, 4, 300).astype(np.int32)
    counts = Tensor.zeros(4, dtype="int32", device=run_device).contiguous().scatter_reduce(
      0, Tensor(bins, device=run_device), Tensor.ones(300, dtype="int32", device=run_device), "sum")
    np.testing.assert_array_equal(counts.numpy(), np.bincount(bins, minlength=4))
