"""Conformance: the nn-level Tensor methods (activations, convolution, pooling, normalization, attention, losses,
interpolate, einsum) on the device under test, forward against numpy (float64 references) and backward against
central differences of the same references; against PyTorch too where it is installed.

`check` is shared with test_tensor_indexing.py and test_tensor_scan.py."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from plugrad.dtype import dtypes
from plugrad.tensor.tensor import Tensor

pytestmark = pytest.mark.plugrad_conformance
RNG = np.random.default_rng(0)


def rand(*shape: int, lo: float = -2.0, hi: float = 2.0) -> np.ndarray:
  return RNG.uniform(lo, hi, shape).astype(np.float32)


def num_grad(f: Callable[..., np.ndarray], args: list[np.ndarray], i: int, w: np.ndarray, eps: float = 1e-6) -> np.ndarray:
  """d sum(f(*args) * w) / d args[i] by central differences, in float64."""
  a64 = [a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in args]
  x, g = a64[i], np.zeros(a64[i].shape)
  for idx in np.ndindex(x.shape):
    old = x[idx]
    x[idx] = old + eps; hi = float((f(*a64) * w).sum())
    x[idx] = old - eps; lo = float((f(*a64) * w).sum())
    x[idx], g[idx] = old, (hi - lo) / (2 * eps)
  return g


def check(device: str, fn: Callable[..., Tensor], ref: Callable[..., np.ndarray], *args: Any, grad: bool | tuple[int, ...] = True,
          atol: float = 1e-5, rtol: float = 1e-4, gtol: float = 2e-3) -> Tensor:
  """fn(*tensors) against ref(*arrays); with `grad`, the gradient of sum(out * w) (w random) for every float input
  (or the inputs whose positions `grad` lists) against central differences of ref."""
  want = np.asarray(ref(*[a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in args]))
  which = tuple(i for i, a in enumerate(args) if isinstance(a, np.ndarray) and a.dtype.kind == "f") if grad is True else grad or ()
  ts = [Tensor(a, device=device, requires_grad=i in which) if isinstance(a, np.ndarray) else a for i, a in enumerate(args)]
  out = fn(*ts)
  got = out.numpy()
  assert got.shape == want.shape, f"shape {got.shape}, want {want.shape}"
  np.testing.assert_allclose(got, want, atol=atol, rtol=rtol)
  if which:
    w = RNG.standard_normal(want.shape)
    # rebuilt: realizing `out` above replaced its graph by the result buffer
    (fn(*ts) * Tensor(w.astype(np.float32), device=device)).sum().backward()
    for i in which:
      assert (g := ts[i].grad) is not None, f"input {i} got no gradient"
      np.testing.assert_allclose(g.numpy(), num_grad(ref, list(args), i, w), atol=gtol, rtol=gtol, err_msg=f"gradient of input {i}")
  return out


# ---------------------------------------------------------------- activations

def _sig(x): return 1 / (1 + np.exp(-x))
def _softplus(x, beta=1.0): return np.logaddexp(0, beta * x) / beta
def _erf(x): return np.vectorize(math.erf)(x)


ACTIVATIONS: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray]]] = {
  "relu": (Tensor.relu, lambda x: np.maximum(x, 0)),
  "relu6": (Tensor.relu6, lambda x: np.clip(x, 0, 6)),
  "leaky_relu": (lambda t: t.leaky_relu(0.2), lambda x: np.where(x < 0, 0.2 * x, x)),
  "elu": (lambda t: t.elu(0.7), lambda x: np.where(x > 0, x, 0.7 * (np.exp(x) - 1))),
  "celu": (lambda t: t.celu(1.5), lambda x: np.maximum(x, 0) + np.minimum(0, 1.5 * (np.exp(x / 1.5) - 1))),
  "selu": (Tensor.selu, lambda x: 1.0507 * np.where(x >= 0, x, 1.67326 * (np.exp(x) - 1))),
  "gelu": (Tensor.gelu, lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))),
  "gelu_erf": (lambda t: t.gelu("none"), lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2)))),
  "quick_gelu": (Tensor.quick_gelu, lambda x: x * _sig(1.702 * x)),
  "silu": (Tensor.silu, lambda x: x * _sig(x)),
  "swish": (Tensor.swish, lambda x: x * _sig(x)),
  "mish": (Tensor.mish, lambda x: x * np.tanh(_softplus(x))),
  "sigmoid": (Tensor.sigmoid, _sig),
  "hardsigmoid": (Tensor.hardsigmoid, lambda x: np.clip(x / 6 + 0.5, 0, 1)),
  "logsigmoid": (Tensor.logsigmoid, lambda x: -_softplus(-x)),
  "hardswish": (Tensor.hardswish, lambda x: x * np.clip(x + 3, 0, 6) / 6),
  "hardtanh": (lambda t: t.hardtanh(-1.5, 2.5), lambda x: np.clip(x, -1.5, 2.5)),
  "softplus": (lambda t: t.softplus(2.0), lambda x: _softplus(x, 2.0)),
  "softsign": (Tensor.softsign, lambda x: x / (1 + np.abs(x))),
}
# away from every kink (0, ±1.5, ±3, 2.5, 6) so that central differences are exact enough
X_ACT = np.array([[-7.9, -3.7, -2.2, -1.3], [-0.6, -0.15, 0.25, 0.8], [1.4, 2.9, 4.1, 6.5]], dtype=np.float32)


@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation(run_device, name):
  fn, ref = ACTIVATIONS[name]
  check(run_device, fn, ref, X_ACT, atol=2e-5)


@pytest.mark.parametrize("name", ["relu", "sigmoid", "gelu", "softplus", "elu"])
def test_activation_non_contiguous_and_empty(run_device, name):
  fn, ref = ACTIVATIONS[name]
  check(run_device, lambda t: fn(t.transpose(0, 1)[::2]), lambda x: ref(x.T[::2]), X_ACT, atol=2e-5)
  assert fn(Tensor.zeros(0, 3, device=run_device)).numpy().shape == (0, 3)
  np.testing.assert_allclose(fn(Tensor(0.8, device=run_device)).numpy(), ref(np.float64(0.8)), atol=1e-6, rtol=1e-5)


def test_activations_stay_finite_at_extremes(run_device):
  x = Tensor([-200.0, -90.0, 90.0, 200.0], device=run_device, requires_grad=True)
  out = x.sigmoid() + x.softplus() + x.logsigmoid() + x.elu() + x.selu() + x.mish()
  out.sum().backward()
  assert np.isfinite(out.numpy()).all() and np.isfinite(x.grad.numpy()).all()
  np.testing.assert_allclose(Tensor([-200.0, 200.0], device=run_device).sigmoid().numpy(), [0, 1], atol=1e-30)


def test_relu_gradient_at_zero(run_device):
  x = Tensor([-1.0, 0.0, 2.0], device=run_device, requires_grad=True)
  x.relu().sum().backward()
  np.testing.assert_array_equal(x.grad.numpy(), [0, 0, 1])


def _np_softmax(x, axis):
  e = np.exp(x - x.max(axis, keepdims=True))
  return e / e.sum(axis, keepdims=True)


@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_family(run_device, axis):
  x = rand(3, 4, lo=-4, hi=4)
  check(run_device, lambda t: t.softmax(axis), lambda a: _np_softmax(a, axis), x)
  check(run_device, lambda t: t.log_softmax(axis), lambda a: np.log(_np_softmax(a, axis)), x)
  check(run_device, lambda t: t.softmin(axis), lambda a: _np_softmax(-a, axis), x, grad=False)


def test_softmax_large_values_and_dtype(run_device):
  x = np.array([[1000.0, 1001.0, 999.0]], dtype=np.float32)
  np.testing.assert_allclose(Tensor(x, device=run_device).softmax().numpy(), _np_softmax(x.astype(np.float64), -1), rtol=1e-5)
  out = Tensor([[1, 2, 3]], device=run_device).softmax(dtype=dtypes.float32)
  assert out.dtype == dtypes.float32
  np.testing.assert_allclose(out.numpy(), _np_softmax(np.array([[1.0, 2, 3]]), -1), rtol=1e-5)


@pytest.mark.parametrize("p, dim", [(2.0, 1), (1.0, 0), (3.0, -1)])
def test_normalize(run_device, p, dim):
  check(run_device, lambda t: t.normalize(p, dim), lambda a: a / np.maximum((np.abs(a) ** p).sum(dim, keepdims=True) ** (1 / p), 1e-12), rand(3, 4))


# ---------------------------------------------------------------- convolution and pooling

def _tup(v, n): return (v,) * n if isinstance(v, int) else tuple(v)


def np_conv(x, w, b=None, stride=1, pads=None, dilation=1, groups=1):
  """Direct N-d convolution; `pads` are (before, after) pairs per spatial dim."""
  nd = x.ndim - 2
  s, d = _tup(stride, nd), _tup(dilation, nd)
  x = np.pad(x, ((0, 0), (0, 0)) + tuple(pads or ((0, 0),) * nd))
  O, Cg, k = w.shape[0], w.shape[1], w.shape[2:]
  og = O // groups
  osp = [(x.shape[2 + i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(nd)]
  out = np.zeros((x.shape[0], O, *osp))
  for o in np.ndindex(*osp):
    patch = x[(slice(None), slice(None)) + tuple(slice(o[i] * s[i], o[i] * s[i] + d[i] * (k[i] - 1) + 1, d[i]) for i in range(nd))]
    for g in range(groups):
      pg, wg = patch[:, g * Cg:(g + 1) * Cg], w[g * og:(g + 1) * og]
      out[(slice(None), slice(g * og, (g + 1) * og)) + o] = np.einsum("nck,ock->no", pg.reshape(*pg.shape[:2], -1), wg.reshape(*wg.shape[:2], -1))
  return out if b is None else out + b.reshape(1, -1, *(1,) * nd)


CONV_CASES = {  # name: (x shape, w shape, kwargs, pads)
  "plain": ((1, 2, 5, 5), (3, 2, 3, 3), {}, None),
  "stride2_pad1": ((2, 2, 5, 6), (2, 2, 3, 3), {"stride": 2, "padding": 1}, ((1, 1), (1, 1))),
  "dilation2": ((1, 1, 6, 6), (2, 1, 2, 3), {"dilation": 2}, None),
  "groups2_bias": ((1, 4, 4, 4), (4, 2, 2, 2), {"groups": 2}, None),
  "pad_per_dim": ((1, 1, 4, 5), (1, 1, 3, 2), {"padding": (2, 1), "stride": (1, 2)}, ((2, 2), (1, 1))),
  "pad_4_ints": ((1, 1, 4, 4), (2, 1, 2, 2), {"padding": (1, 0, 2, 1)}, ((2, 1), (1, 0))),
  "conv1d": ((2, 2, 7), (3, 2, 3), {"stride": 2, "padding": 1, "dilation": 2}, ((1, 1),)),
  "all": ((1, 4, 7, 6), (2, 2, 2, 2), {"stride": (2, 1), "padding": 1, "dilation": (1, 2), "groups": 2}, ((1, 1), (1, 1))),
}


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d(run_device, case):
  xs, ws, kw, pads = CONV_CASES[case]
  x, w = rand(*xs), rand(*ws)
  b = rand(ws[0]) if case in ("groups2_bias", "all") else None
  args = (x, w) if b is None else (x, w, b)
  fn = lambda t, u, c=None: t.conv2d(u, c, **kw)
  ref = lambda a, u, c=None: np_conv(a, u, c, kw.get("stride", 1), pads, kw.get("dilation", 1), kw.get("groups", 1))
  check(run_device, fn, ref, *args, atol=1e-4, gtol=5e-3, grad=case in ("stride2_pad1", "groups2_bias", "all", "conv1d"))


def test_conv2d_non_contiguous_input(run_device):
  x, w = rand(5, 5, 2, 1), rand(2, 2, 2, 2)
  check(run_device, lambda t, u: t.permute(3, 2, 0, 1).conv2d(u, padding=1), lambda a, u: np_conv(a.transpose(3, 2, 0, 1), u, pads=((1, 1), (1, 1))),
        x, w, atol=1e-4)


def np_conv_transpose(x, w, b=None, stride=1, padding=0, output_padding=0, dilation=1, groups=1):
  nd = x.ndim - 2
  s, p, op, d = (_tup(v, nd) for v in (stride, padding, output_padding, dilation))
  Cg, Og, k, sp = x.shape[1] // groups, w.shape[1], w.shape[2:], x.shape[2:]
  full = [(sp[i] - 1) * s[i] + d[i] * (k[i] - 1) + 1 + op[i] for i in range(nd)]
  out = np.zeros((x.shape[0], Og * groups, *full))
  for i in np.ndindex(*sp):
    for kk in np.ndindex(*k):
      pos = tuple(i[j] * s[j] + kk[j] * d[j] for j in range(nd))
      for g in range(groups):
        xs, ws = x[(slice(None), slice(g * Cg, (g + 1) * Cg)) + i], w[(slice(g * Cg, (g + 1) * Cg), slice(None)) + kk]
        out[(slice(None), slice(g * Og, (g + 1) * Og)) + pos] += xs @ ws
  out = out[(slice(None), slice(None)) + tuple(slice(p[j], full[j] - p[j]) for j in range(nd))]
  return out if b is None else out + b.reshape(1, -1, *(1,) * nd)


@pytest.mark.parametrize("kw", [{}, {"stride": 2}, {"stride": 2, "padding": 1, "output_padding": 1}, {"dilation": 2, "padding": 1},
                                {"groups": 2, "stride": (2, 1)}], ids=["plain", "stride", "pad_outpad", "dilation", "groups"])
def test_conv_transpose2d(run_device, kw):
  g = kw.get("groups", 1)
  x, w, b = rand(1, 2 * g, 3, 3), rand(2 * g, 2, 2, 3), rand(2 * g)
  check(run_device, lambda t, u, c: t.conv_transpose2d(u, c, **kw), lambda a, u, c: np_conv_transpose(a, u, c, **kw), x, w, b,
        atol=1e-4, gtol=5e-3, grad=bool(kw.get("padding")))


def np_avg_pool2d(x, k, s, p, ceil_mode=False, count_include_pad=True):
  """PyTorch's avg_pool2d, written out (symmetric padding p per dim)."""
  H, W = x.shape[-2:]
  def osize(n, k, s, p):
    o = (n + 2 * p - k + (s - 1 if ceil_mode else 0)) // s + 1
    return o - 1 if ceil_mode and (o - 1) * s >= n + p else o
  oh, ow = osize(H, k[0], s[0], p[0]), osize(W, k[1], s[1], p[1])
  out = np.zeros(x.shape[:-2] + (oh, ow))
  for i, j in np.ndindex(oh, ow):
    h0, w0 = i * s[0] - p[0], j * s[1] - p[1]
    h1, w1 = min(h0 + k[0], H + p[0]), min(w0 + k[1], W + p[1])
    size = (h1 - h0) * (w1 - w0)
    h0, w0, h1, w1 = max(h0, 0), max(w0, 0), min(h1, H), min(w1, W)
    div = size if count_include_pad else (h1 - h0) * (w1 - w0)
    out[..., i, j] = x[..., h0:h1, w0:w1].sum((-1, -2)) / div
  return out


@pytest.mark.parametrize("k, s, p, ceil_mode, cip", [((2, 2), (2, 2), (0, 0), False, True), ((3, 3), (2, 2), (1, 1), False, True),
                                                     ((3, 3), (2, 2), (1, 1), False, False), ((2, 3), (2, 2), (1, 1), True, True),
                                                     ((3, 2), (2, 3), (1, 0), True, False)], ids=str)
def test_avg_pool2d(run_device, k, s, p, ceil_mode, cip):
  check(run_device, lambda t: t.avg_pool2d(k, s, padding=p, ceil_mode=ceil_mode, count_include_pad=cip),
        lambda a: np_avg_pool2d(a, k, s, p, ceil_mode, cip), rand(1, 2, 5, 6))


def np_max_pool2d(x, k, s, p, d=(1, 1), ceil_mode=False):
  """Max pooling with -inf padding, and the flat index of the first maximum of each window."""
  H, W = x.shape[-2:]
  def osize(n, k, s, p, d):
    o = (n + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)) // s + 1
    return o - 1 if ceil_mode and (o - 1) * s >= n + p else o
  oh, ow = osize(H, k[0], s[0], p[0], d[0]), osize(W, k[1], s[1], p[1], d[1])
  out, idx = np.full(x.shape[:-2] + (oh, ow), -np.inf), np.zeros(x.shape[:-2] + (oh, ow), np.int32)
  for pre in np.ndindex(*x.shape[:-2]):
    for i, j in np.ndindex(oh, ow):
      for a, b in np.ndindex(*k):
        h, w = i * s[0] - p[0] + a * d[0], j * s[1] - p[1] + b * d[1]
        if 0 <= h < H and 0 <= w < W and x[pre + (h, w)] > out[pre + (i, j)]: out[pre + (i, j)], idx[pre + (i, j)] = x[pre + (h, w)], h * W + w
  return out, idx


@pytest.mark.parametrize("k, s, p, d, ceil_mode", [((2, 2), None, (0, 0), (1, 1), False), ((3, 3), (2, 2), (1, 1), (1, 1), False),
                                                   ((2, 2), (1, 2), (1, 0), (2, 1), False), ((2, 2), (2, 2), (1, 1), (1, 1), True)], ids=str)
def test_max_pool2d(run_device, k, s, p, d, ceil_mode):
  x = RNG.permutation(60).reshape(1, 2, 5, 6).astype(np.float32) / 7  # distinct values: a unique maximum per window
  kw = {"stride": s, "padding": p, "dilation": d, "ceil_mode": ceil_mode}
  check(run_device, lambda t: t.max_pool2d(k, **kw), lambda a: np_max_pool2d(a, k, s or k, p, d, ceil_mode)[0], x)
  out, idx = Tensor(x, device=run_device).max_pool2d(k, return_indices=True, **kw)
  want, want_idx = np_max_pool2d(x, k, s or k, p, d, ceil_mode)
  assert idx.dtype == dtypes.int32
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
  np.testing.assert_array_equal(idx.numpy(), want_idx)


def test_max_pool2d_ties_pick_first_and_int_dtype(run_device):
  x = Tensor([[[[1, 3, 3, 0], [3, 2, 1, 1]]]], device=run_device)
  out, idx = x.max_pool2d(return_indices=True)
  assert out.dtype == x.dtype
  np.testing.assert_array_equal(out.numpy(), [[[[3, 3]]]])
  np.testing.assert_array_equal(idx.numpy(), [[[[1, 2]]]])


def test_max_unpool2d(run_device):
  x = RNG.permutation(32).reshape(1, 2, 4, 4).astype(np.float32)
  out, idx = Tensor(x, device=run_device).max_pool2d(return_indices=True)
  want = np.zeros_like(x)
  for c, a, b in np.ndindex(2, 2, 2):
    win = x[0, c, 2 * a:2 * a + 2, 2 * b:2 * b + 2]
    r, q = np.unravel_index(win.argmax(), (2, 2))
    want[0, c, 2 * a + r, 2 * b + q] = win.max()
  np.testing.assert_array_equal(out.max_unpool2d(idx).numpy(), want)
  assert out.max_unpool2d(idx, output_size=(1, 2, 5, 5)).shape == (1, 2, 5, 5)


# ---------------------------------------------------------------- normalization, dropout, attention

def test_batchnorm(run_device):
  x, w, b, m, v = rand(2, 3, 2, 2), rand(3), rand(3), rand(3), rand(3, lo=0.5, hi=2)
  ref = lambda a, w_, b_, m_, v_: (a - m_.reshape(1, 3, 1, 1)) * w_.reshape(1, 3, 1, 1) * v_.reshape(1, 3, 1, 1) + b_.reshape(1, 3, 1, 1)
  check(run_device, lambda t, w_, b_, m_, v_: t.batchnorm(w_, b_, m_, v_), ref, x, w, b, m, v)
  check(run_device, lambda t, m_, v_: t.batchnorm(None, None, m_, v_, axis=(1, 3)),
        lambda a, m_, v_: (a - m_.reshape(1, 3, 1, 2)) * v_.reshape(1, 3, 1, 2), x, rand(3, 2), rand(3, 2), grad=False)


@pytest.mark.parametrize("axis", [-1, (1, 2)])
def test_layernorm(run_device, axis):
  def ref(a):
    y = a - a.mean(axis, keepdims=True)
    return y / np.sqrt((y * y).mean(axis, keepdims=True) + 1e-5)
  check(run_device, lambda t: t.layernorm(axis), ref, rand(2, 3, 4), atol=1e-4, gtol=5e-3)


def test_dropout(run_device):
  x = Tensor.ones(20, 20, device=run_device)
  old = Tensor.training
  try:
    Tensor.training = False
    assert x.dropout(0.5) is x
    Tensor.training = True
    got = x.dropout(0.25).numpy()
    assert set(np.unique(got)) <= {0.0, np.float32(1 / 0.75)}
    assert 0.1 < (got == 0).mean() < 0.4  # 400 draws at p=0.25: far outside 6 sigma otherwise
    assert (x.dropout(0.0).numpy() == 1).all() and (x.dropout(1.0).numpy() == 0).all()
  finally:
    Tensor.training = old


def test_one_hot(run_device):
  out = Tensor([[0, 2], [3, 1]], device=run_device).one_hot(4)
  assert out.dtype == dtypes.int32
  np.testing.assert_array_equal(out.numpy(), np.eye(4, dtype=np.int32)[[[0, 2], [3, 1]]])


def np_sdpa(q, k, v, mask=None, causal=False):
  s = q @ np.swapaxes(k, -1, -2) / math.sqrt(q.shape[-1])
  if causal: mask = np.tril(np.ones(s.shape[-2:], bool))
  if mask is not None: s = s + (np.where(mask, 0, -np.inf) if mask.dtype == bool else mask)
  return _np_softmax(s, -1) @ v


@pytest.mark.parametrize("mode", ["none", "bool_mask", "float_mask", "causal"])
def test_scaled_dot_product_attention(run_device, mode):
  q, k, v = rand(1, 2, 3, 4), rand(1, 2, 5, 4), rand(1, 2, 5, 2)
  mask = {"bool_mask": RNG.random((3, 5)) < 0.7, "float_mask": rand(3, 5)}.get(mode)
  if mask is not None and mask.dtype == bool: mask[:, 0] = True  # every row keeps something
  if mode == "causal": k, v = k[:, :, :3], v[:, :, :3]
  m = None if mask is None else Tensor(mask, device=run_device)
  check(run_device, lambda a, b, c: a.scaled_dot_product_attention(b, c, m, is_causal=mode == "causal"),
        lambda a, b, c: np_sdpa(a, b, c, mask, mode == "causal"), q, k, v, atol=1e-4, gtol=5e-3, grad=(0, 1, 2) if mode != "float_mask" else False)


# ---------------------------------------------------------------- losses

def _np_log_softmax(x, axis): return x - x.max(axis, keepdims=True) - np.log(np.exp(x - x.max(axis, keepdims=True)).sum(axis, keepdims=True))
def _red(x, reduction): return x.mean() if reduction == "mean" else x.sum() if reduction == "sum" else x


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_indices(run_device, reduction):
  x, y = rand(4, 3, 2), np.array([[0, 2], [1, 1], [2, 0], [0, 1]], dtype=np.int32)
  def ref(a, ls=0.0):
    lp = _np_log_softmax(a, 1)
    hot = np.moveaxis(np.eye(3)[y], -1, 1) * (1 - ls) + ls / 3
    return _red(-(lp * hot).sum(1), reduction)
  check(run_device, lambda t: t.cross_entropy(Tensor(y, device=run_device), reduction), ref, x)
  check(run_device, lambda t: t.cross_entropy(Tensor(y, device=run_device), reduction, label_smoothing=0.2), lambda a: ref(a, 0.2), x, grad=False)


def test_cross_entropy_probabilities_and_1d(run_device):
  x, p = rand(3, 4), _np_softmax(rand(3, 4).astype(np.float64), 1).astype(np.float32)
  check(run_device, lambda t, q: t.cross_entropy(q), lambda a, q: -(_np_log_softmax(a, 1) * q).sum(1).mean(), x, p, grad=(0,))
  check(run_device, lambda t: t.cross_entropy(Tensor(2, device=run_device)), lambda a: -_np_log_softmax(a, 0)[2], rand(4))


@pytest.mark.parametrize("weighted, ignore, reduction", [(False, None, "mean"), (True, None, "mean"), (True, 1, "mean"), (False, 2, "sum"),
                                                         (True, None, "none")])
def test_nll_loss(run_device, weighted, ignore, reduction):
  x, y, wc = rand(5, 3, lo=-3, hi=0), np.array([0, 2, 1, 1, 2], dtype=np.int32), np.array([0.5, 2.0, 1.5], dtype=np.float32)
  def ref(a):
    w = (wc if weighted else np.ones(3))[y] * (y != ignore)
    nll = -a[np.arange(5), y] * w
    return nll.sum() / w.sum() if reduction == "mean" else _red(nll, reduction)
  wt = Tensor(wc, device=run_device) if weighted else None
  check(run_device, lambda t: t.nll_loss(Tensor(y, device=run_device), wt, ignore, reduction), ref, x)


@pytest.mark.parametrize("ignore, ls, reduction", [(-1, 0.0, "mean"), (1, 0.0, "mean"), (-1, 0.3, "sum"), (2, 0.1, "none")])
def test_sparse_categorical_crossentropy(run_device, ignore, ls, reduction):
  x, y = rand(2, 3, 4), np.array([[0, 3, 1], [2, 1, 3]], dtype=np.int32)
  def ref(a):
    lp = _np_log_softmax(a, -1)
    keep = y != ignore
    loss = -np.where(keep, (1 - ls) * np.take_along_axis(lp, y[..., None], -1)[..., 0] + ls * lp.mean(-1), 0)
    return loss.sum() / keep.sum() if reduction == "mean" else _red(loss, reduction)
  check(run_device, lambda t: t.sparse_categorical_crossentropy(Tensor(y, device=run_device), ignore, ls, reduction), ref, x)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_binary_crossentropy(run_device, reduction):
  p, y = rand(2, 3, lo=0.05, hi=0.95), (RNG.random((2, 3)) < 0.5).astype(np.float32)
  check(run_device, lambda t, u: t.binary_crossentropy(u, reduction), lambda a, u: _red(-(u * np.log(a) + (1 - u) * np.log(1 - a)), reduction), p, y,
        grad=(0,))
  z, pw = rand(2, 3, lo=-4, hi=4), np.array([0.5, 1.0, 3.0], dtype=np.float32)
  ls = lambda a: -np.logaddexp(0, -a)
  check(run_device, lambda t, u: t.binary_crossentropy_logits(u, reduction), lambda a, u: _red(-(u * ls(a) + (1 - u) * ls(-a)), reduction), z, y,
        grad=(0,))
  check(run_device, lambda t, u, w: t.binary_crossentropy_logits(u, reduction, pos_weight=w),
        lambda a, u, w: _red(-(w * u * ls(a) + (1 - u) * ls(-a)), reduction), z, y, pw, grad=(0,))


def test_binary_crossentropy_clamps_log(run_device):
  out = Tensor([0.0, 1.0], device=run_device).binary_crossentropy(Tensor([1.0, 0.0], device=run_device))
  np.testing.assert_allclose(out.numpy(), 100.0, rtol=1e-6)


# ---------------------------------------------------------------- interpolate, einsum

def np_interp_dim(x, axis, out, mode, align_corners):
  """Resample one axis with PyTorch's source-coordinate rules."""
  n = x.shape[axis]
  x = np.moveaxis(x, axis, -1)
  res = np.zeros(x.shape[:-1] + (out,))
  for o in range(out):
    if mode == "linear":
      src = (o * (n - 1) / (out - 1) if out > 1 else 0.0) if align_corners else max((o + 0.5) * n / out - 0.5, 0.0)
      lo = min(int(math.floor(src)), n - 1)
      hi, f = min(lo + 1, n - 1), src - lo
      res[..., o] = x[..., lo] * (1 - f) + x[..., hi] * f
    else:
      src = math.floor((o + 0.5) * n / out) if mode == "nearest-exact" else math.floor(o * n / out)
      res[..., o] = x[..., min(src, n - 1)]
  return np.moveaxis(res, -1, axis)


@pytest.mark.parametrize("size, mode, align", [((7,), "linear", False), ((3,), "linear", True), ((5, 3), "linear", False), ((6, 2), "nearest", False),
                                               ((3, 7), "nearest-exact", False), ((2, 5), "linear", True)], ids=str)
def test_interpolate(run_device, size, mode, align):
  def ref(a):
    for i, s in zip(range(a.ndim - len(size), a.ndim), size): a = np_interp_dim(a, i, s, mode, align)
    return a
  check(run_device, lambda t: t.interpolate(size, mode, align), ref, rand(1, 2, 4, 5), grad=len(size) == 2)


def test_interpolate_int_keeps_dtype(run_device):
  out = Tensor([1, 2, 3], device=run_device).interpolate((5,))
  assert out.dtype == dtypes.int32
  np.testing.assert_array_equal(out.numpy(), [1, 1, 2, 2, 3])


@pytest.mark.parametrize("formula, shapes", [("ij,jk->ik", [(2, 3), (3, 4)]), ("ij->ji", [(2, 3)]), ("ii->i", [(3, 3)]), ("ii", [(3, 3)]),
                                             ("bij,bjk->bik", [(2, 2, 3), (2, 3, 2)]), ("i,i->", [(4,), (4,)]), ("...ij,...jk", [(2, 2, 3), (3, 2)]),
                                             ("i,j->ij", [(2,), (3,)]), ("ij,ij,ij->i", [(2, 3)] * 3), ("bi j ,jk", [(2, 3, 4), (4, 2)])], ids=str)
def test_einsum(run_device, formula, shapes):
  xs = [rand(*s) for s in shapes]
  check(run_device, lambda *ts: Tensor.einsum(formula, *ts), lambda *a: np.einsum(formula.replace(" ", ""), *a), *xs,
        grad=formula in ("ij,jk->ik", "ii->i", "...ij,...jk"), atol=1e-4)


def test_einsum_takes_a_list(run_device):
  a, b = rand(2, 3), rand(3, 2)
  out = Tensor.einsum("ij,jk->ik", [Tensor(a, device=run_device), Tensor(b, device=run_device)])
  np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5, atol=1e-5)


def test_zero_size(run_device):
  z = lambda *s: Tensor(np.zeros(s, np.float32), device=run_device)
  assert z(0, 2, 5, 5).conv2d(z(3, 2, 3, 3), padding=1).numpy().shape == (0, 3, 5, 5)
  assert z(1, 2, 5, 5).conv2d(z(0, 2, 3, 3)).numpy().shape == (1, 0, 3, 3)
  out, idx = z(0, 1, 4, 4).max_pool2d(return_indices=True)
  assert out.numpy().shape == idx.numpy().shape == (0, 1, 2, 2)
  assert z(0, 3).softmax().numpy().shape == (0, 3) and z(3, 0).log_softmax().numpy().shape == (3, 0)
  assert z(0, 4).layernorm().numpy().shape == (0, 4)
  assert z(0, 3).cross_entropy(Tensor(np.zeros(0, np.int32), device=run_device), reduction="sum").numpy() == 0
  np.testing.assert_array_equal(Tensor.einsum("ij,jk->ik", z(2, 0), z(0, 3)).numpy(), np.zeros((2, 3)))
  assert z(0, 1, 3).interpolate((5,)).numpy().shape == (0, 1, 5)


# ---------------------------------------------------------------- against PyTorch, where it is installed

def test_conv_and_pool_match_torch(run_device):
  torch = pytest.importorskip("torch")
  F = torch.nn.functional
  x, w, b = rand(2, 4, 6, 5), rand(6, 2, 3, 2), rand(6)
  tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
  px, pw, pb = (Tensor(a, device=run_device, requires_grad=True) for a in (x, w, b))
  kw = {"stride": (2, 1), "padding": (1, 2), "dilation": (1, 2), "groups": 2}
  gw = RNG.standard_normal(F.conv2d(tx, tw, tb, **kw).shape).astype(np.float32)
  out_t = F.conv2d(tx, tw, tb, **kw)
  np.testing.assert_allclose(px.conv2d(pw, pb, **kw).numpy(), out_t.detach().numpy(), atol=1e-4, rtol=1e-4)
  (out_t * torch.tensor(gw)).sum().backward()
  (px.conv2d(pw, pb, **kw) * Tensor(gw, device=run_device)).sum().backward()
  for p, t in ((px, tx), (pw, tw), (pb, tb)): np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), atol=1e-3, rtol=1e-3)
  ct = F.conv_transpose2d(torch.tensor(x), torch.tensor(rand(4, 3, 3, 3)), stride=2, padding=1, output_padding=1, groups=2)
  assert ct.shape == Tensor(x, device=run_device).conv_transpose2d(Tensor(rand(4, 3, 3, 3), device=run_device), stride=2, padding=1,
                                                                   output_padding=1, groups=2).shape
  xp = rand(1, 2, 5, 7)
  for kw2 in ({"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}, {"kernel_size": (2, 3), "stride": 1, "padding": (1, 0)}):
    np.testing.assert_allclose(Tensor(xp, device=run_device).avg_pool2d(kw2["kernel_size"], kw2["stride"], padding=kw2["padding"],
                                                                         ceil_mode=kw2.get("ceil_mode", False)).numpy(),
                               F.avg_pool2d(torch.tensor(xp), **kw2).numpy(), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(Tensor(xp, device=run_device).max_pool2d(kw2["kernel_size"], kw2["stride"], padding=kw2["padding"],
                                                                         ceil_mode=kw2.get("ceil_mode", False)).numpy(),
                               F.max_pool2d(torch.tensor(xp), **kw2).numpy(), atol=1e-6)


def test_losses_and_interpolate_match_torch(run_device):
  torch = pytest.importorskip("torch")
  F = torch.nn.functional
  x, y = rand(4, 5), np.array([1, 0, 4, 2], dtype=np.int64)
  np.testing.assert_allclose(Tensor(x, device=run_device).cross_entropy(Tensor(y.astype(np.int32), device=run_device), label_smoothing=0.1).numpy(),
                             F.cross_entropy(torch.tensor(x), torch.tensor(y), label_smoothing=0.1).numpy(), rtol=1e-5)
  lp = _np_log_softmax(x.astype(np.float64), 1).astype(np.float32)
  wc = rand(5, lo=0.1, hi=2)
  np.testing.assert_allclose(Tensor(lp, device=run_device).nll_loss(Tensor(y.astype(np.int32), device=run_device), Tensor(wc, device=run_device),
                                                                  ignore_index=0).numpy(),
                             F.nll_loss(torch.tensor(lp), torch.tensor(y), torch.tensor(wc), ignore_index=0).numpy(), rtol=1e-5)
  img = rand(1, 1, 3, 4)
  for size, mode, ac in (((5, 7), "bilinear", False), ((5, 7), "bilinear", True), ((2, 9), "nearest", None), ((5, 3), "nearest-exact", None)):
    want = F.interpolate(torch.tensor(img), size=size, mode=mode, align_corners=ac).numpy()
    got = Tensor(img, device=run_device).interpolate(size, "linear" if mode == "bilinear" else mode, bool(ac)).numpy()
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
