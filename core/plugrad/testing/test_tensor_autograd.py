"""Conformance: autograd on the device under test. Gradients of sum(f(x) * w) (w random) are compared with central
differences of a numpy reference — in float64 where the device has the "float64" capability, else in float32 with
looser tolerances — and, where PyTorch is installed, with torch.autograd. Every derivative rule of plugrad/gradient.py
is reached: ALU ops, casts, movement ops, REDUCE_AXIS (ADD, MAX with ties, MUL with zeros), CONTIGUOUS, DETACH."""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from plugrad.dtype import dtypes
from plugrad.gradient import GradientError
from plugrad.tensor.tensor import Tensor

pytestmark = pytest.mark.plugrad_conformance
RNG = np.random.default_rng(2)


@pytest.fixture
def fdt(plugrad_dev: Any) -> Any:
  """The float dtype gradients are checked in, and its tolerance."""
  return (np.float64, 1e-6) if "float64" in plugrad_dev.renderer.capabilities else (np.float32, 2e-2)


def num_grad(f: Callable[..., np.ndarray], args: list[np.ndarray], i: int, w: np.ndarray, eps: float = 1e-6) -> np.ndarray:
  """d sum(f(*args) * w) / d args[i] by central differences in float64."""
  xs = [a.astype(np.float64) for a in args]
  g = np.zeros(xs[i].shape)
  for idx in np.ndindex(xs[i].shape):
    old = xs[i][idx]
    xs[i][idx] = old + eps; hi = float((f(*xs) * w).sum())
    xs[i][idx] = old - eps; lo = float((f(*xs) * w).sum())
    xs[i][idx], g[idx] = old, (hi - lo) / (2 * eps)
  return g


def gradcheck(device: str, fdt: Any, fn: Callable[..., Tensor], ref: Callable[..., np.ndarray], *args: np.ndarray, tol: float | None = None) -> None:
  dt, default_tol = fdt
  tol = tol if tol is not None else default_tol
  ts = [Tensor(a.astype(dt), device=device, requires_grad=True) for a in args]
  out = fn(*ts)
  want = np.asarray(ref(*[a.astype(np.float64) for a in args]))
  assert out.shape == want.shape, f"shape {out.shape}, want {want.shape}"
  w = RNG.standard_normal(want.shape)
  (out * Tensor(w.astype(dt), device=device)).sum().backward()
  for i, t in enumerate(ts):
    assert t.grad is not None, f"input {i} got no gradient"
    assert t.grad.shape == t.shape and t.grad.dtype is t.dtype
    np.testing.assert_allclose(t.grad.numpy(), num_grad(ref, list(args), i, w), rtol=tol, atol=tol, err_msg=f"gradient of input {i}")


def pts(*shape: int, lo: float = -2.0, hi: float = 2.0) -> np.ndarray: return RNG.uniform(lo, hi, shape)


UNARY: list[tuple[str, Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray], tuple[float, float]]] = [
  ("neg", lambda t: -t, np.negative, (-2, 2)), ("exp", Tensor.exp, np.exp, (-2, 2)), ("exp2", Tensor.exp2, np.exp2, (-2, 2)),
  ("log", Tensor.log, np.log, (0.5, 3)), ("log2", Tensor.log2, np.log2, (0.5, 3)), ("sqrt", Tensor.sqrt, np.sqrt, (0.5, 3)),
  ("rsqrt", Tensor.rsqrt, lambda a: 1 / np.sqrt(a), (0.5, 3)), ("reciprocal", Tensor.reciprocal, np.reciprocal, (0.5, 3)),
  ("sin", Tensor.sin, np.sin, (-3, 3)), ("cos", Tensor.cos, np.cos, (-3, 3)), ("tan", Tensor.tan, np.tan, (-1, 1)),
  ("asin", Tensor.asin, np.arcsin, (-0.9, 0.9)), ("acos", Tensor.acos, np.arccos, (-0.9, 0.9)), ("atan", Tensor.atan, np.arctan, (-4, 4)),
  ("sinh", Tensor.sinh, np.sinh, (-2, 2)), ("cosh", Tensor.cosh, np.cosh, (-2, 2)), ("tanh", Tensor.tanh, np.tanh, (-2, 2)),
  ("asinh", Tensor.asinh, np.arcsinh, (-3, 3)), ("acosh", Tensor.acosh, np.arccosh, (1.5, 4)), ("atanh", Tensor.atanh, np.arctanh, (-0.8, 0.8)),
  ("abs", Tensor.abs, np.abs, (0.2, 2)), ("square", Tensor.square, np.square, (-2, 2)), ("sign", Tensor.sign, np.sign, (0.2, 2)),
  ("trunc", Tensor.trunc, np.trunc, (0.1, 0.9)), ("floor", Tensor.floor, np.floor, (0.1, 0.9)), ("ceil", Tensor.ceil, np.ceil, (0.1, 0.9)),
  ("round", Tensor.round, np.round, (0.1, 0.4)), ("pow_c", lambda t: t ** 3, lambda a: a ** 3, (-2, 2)),
  ("rpow", lambda t: 2.0 ** t, np.exp2, (-2, 2)),
  ("div_c", lambda t: 1.5 / t, lambda a: 1.5 / a, (0.5, 3)), ("logsumexp", lambda t: t.logsumexp(1), lambda a: np.log(np.exp(a).sum(1)), (-3, 3)),
  ("mean", lambda t: t.mean(0), lambda a: a.mean(0), (-2, 2)), ("var", lambda t: t.var(1), lambda a: a.var(1, ddof=1), (-2, 2)),
  ("std", lambda t: t.std(), lambda a: a.std(ddof=1), (-2, 2)), ("clip", lambda t: t.clip(-1, 1), lambda a: np.clip(a, -1, 1), (-2, 2)),
  ("cast", lambda t: t.cast(dtypes.float32).cast(t.dtype) * 2, lambda a: a * 2, (-2, 2)),
]


@pytest.mark.parametrize("name,fn,ref,dom", UNARY, ids=[u[0] for u in UNARY])
def test_unary_grad(run_device, fdt, name, fn, ref, dom):
  x = pts(2, 3, lo=dom[0], hi=dom[1])
  gradcheck(run_device, fdt, fn, ref, x, tol=max(fdt[1], 2e-2) if name == "cast" else None)


def test_erf_grad(run_device, fdt):
  # the A&S 7.1.26 approximation is accurate to 1.5e-7, its derivative to about 1e-5
  gradcheck(run_device, fdt, Tensor.erf, np.vectorize(math.erf), pts(2, 3), tol=max(fdt[1], 5e-5))


BINARY: list[tuple[str, Callable[[Tensor, Tensor], Tensor], Callable[[np.ndarray, np.ndarray], np.ndarray]]] = [
  ("add", lambda a, b: a + b, np.add), ("sub", lambda a, b: a - b, np.subtract), ("mul", lambda a, b: a * b, np.multiply),
  ("div", lambda a, b: a / b, np.divide), ("pow", lambda a, b: a.abs() ** b, lambda a, b: np.abs(a) ** b),
  ("maximum", Tensor.maximum, np.maximum), ("minimum", Tensor.minimum, np.minimum), ("logaddexp", Tensor.logaddexp, np.logaddexp),
  ("lerp", lambda a, b: a.lerp(b, 0.3), lambda a, b: a + (b - a) * 0.3),
  ("where", lambda a, b: (a > b).where(a * 2, b.exp()), lambda a, b: np.where(a > b, a * 2, np.exp(b))),
  ("copysign", Tensor.copysign, np.copysign), ("matmul", lambda a, b: a @ b.T, lambda a, b: a @ b.T),
]


@pytest.mark.parametrize("name,fn,ref", BINARY, ids=[b[0] for b in BINARY])
def test_binary_grad(run_device, fdt, name, fn, ref):
  a, b = pts(3, 4), pts(3, 4, lo=0.5, hi=2)
  if name == "copysign":  # differentiable in its first argument only
    gradcheck(run_device, fdt, lambda x: fn(x, Tensor(b.astype(fdt[0]), device=run_device)), lambda x: ref(x, b), a)
  else: gradcheck(run_device, fdt, fn, ref, a, b)


@pytest.mark.parametrize("sa,sb", [((3,), (3,)), ((2, 3), (3,)), ((3,), (3, 2)), ((2, 3), (3, 4)), ((2, 2, 3), (3, 2)), ((2, 1, 2, 3), (2, 3, 2))],
                         ids=str)
def test_matmul_grad(run_device, fdt, sa, sb):
  gradcheck(run_device, fdt, lambda a, b: a @ b, np.matmul, pts(*sa), pts(*sb))


def test_broadcast_grads_sum_back(run_device, fdt):
  gradcheck(run_device, fdt, lambda a, b, c: a * b + c, lambda a, b, c: a * b + c, pts(2, 3, 4), pts(3, 1), pts(4))


@pytest.mark.parametrize("axis", [None, 0, 1, (0, 2)], ids=str)
def test_reduce_grads(run_device, fdt, axis):
  x = pts(2, 3, 4)
  gradcheck(run_device, fdt, lambda t: t.sum(axis), lambda a: a.sum(axis), x)
  gradcheck(run_device, fdt, lambda t: t.max(axis), lambda a: a.max(axis), x)
  gradcheck(run_device, fdt, lambda t: t.min(axis, keepdim=True), lambda a: a.min(axis, keepdims=True), x)
  gradcheck(run_device, fdt, lambda t: t.prod(axis), lambda a: a.prod(axis), pts(2, 3, 4, lo=0.5, hi=1.5))


def test_max_ties_share_and_prod_zeros(run_device, fdt):
  dt = fdt[0]
  t = Tensor(np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]], dt), device=run_device, requires_grad=True)
  t.max(1).sum().backward()
  np.testing.assert_allclose(t.grad.numpy(), [[0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]], rtol=1e-6)
  m = Tensor(np.array([1.0, 2.0], dt), device=run_device, requires_grad=True)
  m.maximum(Tensor(np.array([1.0, 3.0], dt), device=run_device)).sum().backward()
  np.testing.assert_allclose(m.grad.numpy(), [0.5, 0.0])
  p = Tensor(np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 5.0], [1.0, 2.0, 3.0]], dt), device=run_device, requires_grad=True)
  p.prod(1).sum().backward()
  np.testing.assert_allclose(p.grad.numpy(), [[0, 6, 0], [0, 0, 0], [6, 3, 2]])
  z = Tensor(np.array([0.0, 2.0], dt), device=run_device, requires_grad=True)
  (z ** 2.0).sum().backward()
  np.testing.assert_allclose(z.grad.numpy(), [0.0, 4.0])
  e = Tensor(np.array([0.0, 2.0], dt), device=run_device, requires_grad=True)
  Tensor(np.array([0.0, 3.0], dt), device=run_device).pow(e).sum().backward()  # d/de 0^e at e = 0 is taken as 0, not nan
  assert np.isfinite(e.grad.numpy()).all()


MOVES: list[tuple[str, Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray]]] = [
  ("reshape", lambda t: t.reshape(4, 6), lambda a: a.reshape(4, 6)), ("permute", lambda t: t.permute(2, 0, 1), lambda a: a.transpose(2, 0, 1)),
  ("expand", lambda t: t.reshape(2, 1, 3, 4).expand(2, 3, 3, 4), lambda a: np.broadcast_to(a[:, None], (2, 3, 3, 4))),
  ("pad", lambda t: t.pad((1, 2)), lambda a: np.pad(a, ((0, 0), (0, 0), (1, 2)))),
  ("pad_value", lambda t: t.pad((1, 1, 2, 0), value=3.0), lambda a: np.pad(a, ((0, 0), (2, 0), (1, 1)), constant_values=3.0)),
  ("pad_reflect", lambda t: t.pad((2, 1), mode="reflect"), lambda a: np.pad(a, ((0, 0), (0, 0), (2, 1)), mode="reflect")),
  ("pad_replicate", lambda t: t.pad((2, 1), mode="replicate"), lambda a: np.pad(a, ((0, 0), (0, 0), (2, 1)), mode="edge")),
  ("pad_circular", lambda t: t.pad((2, 1), mode="circular"), lambda a: np.pad(a, ((0, 0), (0, 0), (2, 1)), mode="wrap")),
  ("shrink", lambda t: t.shrink(((0, 1), (1, 3), None)), lambda a: a[0:1, 1:3]), ("flip", lambda t: t.flip(1, 2), lambda a: a[:, ::-1, ::-1]),
  ("cat", lambda t: t.cat(t * 2, dim=1), lambda a: np.concatenate([a, a * 2], 1)),
  ("stack", lambda t: t.stack(t.exp()), lambda a: np.stack([a, np.exp(a)])),
  ("split", lambda t: t.split([1, 3], dim=2)[1] * 2, lambda a: a[:, :, 1:] * 2),
  ("repeat", lambda t: t.repeat(2, 1, 2), lambda a: np.tile(a, (2, 1, 2))),
  ("repeat_interleave", lambda t: t.repeat_interleave(2, 1), lambda a: np.repeat(a, 2, 1)),
  ("roll", lambda t: t.roll(1, 2), lambda a: np.roll(a, 1, 2)),
  ("flatten", lambda t: t.flatten(1), lambda a: a.reshape(2, 12)), ("squeeze", lambda t: t.unsqueeze(1).squeeze(), lambda a: a),
  ("transpose", lambda t: t.transpose(0, 2).contiguous(), lambda a: a.swapaxes(0, 2)),
]


@pytest.mark.parametrize("name,fn,ref", MOVES, ids=[m[0] for m in MOVES])
def test_movement_grads(run_device, fdt, name, fn, ref):
  gradcheck(run_device, fdt, fn, ref, pts(2, 3, 4))


def test_detach_and_requires_grad(run_device, fdt):
  dt = fdt[0]
  a = Tensor(np.array([1.0, 2.0], dt), device=run_device, requires_grad=True)
  b = Tensor(np.array([3.0, 4.0], dt), device=run_device)  # requires_grad not set: gets no .grad
  (a * a.detach() * b).sum().backward()
  np.testing.assert_allclose(a.grad.numpy(), [3.0, 8.0])  # d/da (a * const * b) only
  assert b.grad is None
  c = Tensor(np.array([1.0], dt), device=run_device).requires_grad_()
  assert c.requires_grad is True and a.detach().requires_grad is False


def test_accumulation_and_gradient_api(run_device, fdt):
  dt = fdt[0]
  a = Tensor(np.array([1.0, 2.0], dt), device=run_device, requires_grad=True)
  b = Tensor(np.array([3.0, 4.0], dt), device=run_device, requires_grad=True)
  (a * b).sum().backward()
  (a * b).sum().backward()
  np.testing.assert_allclose(a.grad.numpy(), [6.0, 8.0]); np.testing.assert_allclose(b.grad.numpy(), [2.0, 4.0])
  ga, gb = (a * a * b).sum().gradient(a, b)
  np.testing.assert_allclose(ga.numpy(), [6.0, 16.0]); np.testing.assert_allclose(gb.numpy(), [1.0, 4.0])
  (g,) = (a * 3).gradient(a, gradient=Tensor(np.array([1.0, -1.0], dt), device=run_device))
  np.testing.assert_allclose(g.numpy(), [3.0, -3.0])
  y = a.exp()
  y.backward(Tensor(np.array([1.0, 0.5], dt), device=run_device))
  np.testing.assert_allclose(a.grad.numpy(), np.array([6.0, 8.0]) + np.exp([1.0, 2.0]) * [1.0, 0.5], rtol=1e-5)
  with pytest.raises(GradientError, match="not part of"):
    (a * 2).sum().gradient(Tensor(np.array([1.0], dt), device=run_device))


def test_gradient_of_realized_and_shared_graphs(run_device, fdt):
  dt = fdt[0]
  w = Tensor(np.array([[1.0, 2.0], [3.0, 4.0]], dt), device=run_device, requires_grad=True)
  h = (w * 2).contiguous()
  loss = (h * h).sum() + h.sum()
  h.realize()  # realizing an intermediate keeps it differentiable: the CONTIGUOUS node is replaced only in the forward values
  loss.backward()
  np.testing.assert_allclose(w.grad.numpy(), 2 * (2 * 2 * w.numpy() + 1), rtol=1e-6)
  x = Tensor(np.array([0.5, -1.0], dt), device=run_device, requires_grad=True)
  z = x.sin()
  (z * z + z).sum().backward()  # z used twice: contributions add
  np.testing.assert_allclose(x.grad.numpy(), (2 * np.sin([0.5, -1.0]) + 1) * np.cos([0.5, -1.0]), rtol=1e-5)


def test_grad_through_copy(run_device, fdt):
  other = "PYTHON:1" if run_device.startswith("PYTHON") else "PYTHON"
  gradcheck(run_device, fdt, lambda t: (t.to(other).exp() * 2).to(run_device), lambda a: np.exp(a) * 2, pts(2, 3))
  a = Tensor(np.array([1.0, 2.0], fdt[0]), device=run_device, requires_grad=True)
  (a.to(other) ** 2).sum().backward()
  assert a.grad.device == run_device
  np.testing.assert_allclose(a.grad.numpy(), [2.0, 4.0])


def test_against_torch(run_device, fdt):
  torch = pytest.importorskip("torch")
  x, y = pts(3, 4), pts(4, 2)
  def ours(a: Tensor, b: Tensor) -> Tensor: return ((a @ b).tanh() * a.sum(1, keepdim=True)).logsumexp(0).sqrt().sum()
  def theirs(a: Any, b: Any) -> Any: return ((a @ b).tanh() * a.sum(1, keepdim=True)).logsumexp(0).sqrt().sum()
  ta, tb = Tensor(x.astype(fdt[0]), device=run_device, requires_grad=True), Tensor(y.astype(fdt[0]), device=run_device, requires_grad=True)
  ours(ta, tb).backward()
  pa, pb = torch.tensor(x, requires_grad=True), torch.tensor(y, requires_grad=True)
  theirs(pa, pb).backward()
  np.testing.assert_allclose(ta.grad.numpy(), pa.grad.numpy(), rtol=fdt[1] * 10, atol=fdt[1] * 10)
  np.testing.assert_allclose(tb.grad.numpy(), pb.grad.numpy(), rtol=fdt[1] * 10, atol=fdt[1] * 10)
