"""Intermediates PyTorch keeps from overflowing (issue 32, item 4): half-precision ops compute in float32 and round
once (`in_float32`, the products of matmul/conv/einsum), and float32 ops whose textbook formula overflows where the
result fits (var/std, sinh/cosh, softplus with beta, normalize) are written so that it does not."""
from __future__ import annotations

import math

import numpy as np
import pytest

from plugrad import Tensor, dtypes
from plugrad.tensor.helpers import compute_dtype, in_float32, pow2_scale

HALVES = [dtypes.float16, dtypes.bfloat16]


def _np(t: Tensor) -> np.ndarray: return t.cast(dtypes.float32).numpy().astype(np.float64)


@pytest.mark.parametrize("dt", HALVES, ids=str)
@pytest.mark.parametrize("op", ["matmul", "dot", "linear", "einsum"])
def test_half_products_in_float32(dt, op):
  # 300·300 = 9e4 overflows float16; the sum 9e4 - 9e4 is 0 (PyTorch multiplies in float32 too)
  a, b = Tensor([[300.0, 300.0]], dtype=dt), Tensor([[300.0], [-300.0]], dtype=dt)
  out = {"matmul": lambda: a @ b, "dot": lambda: a.dot(b), "linear": lambda: a.linear(b), "einsum": lambda: Tensor.einsum("ij,jk->ik", a, b)}[op]()
  assert out.dtype is dt
  np.testing.assert_array_equal(_np(out), [[0.0]])


@pytest.mark.parametrize("dt", HALVES, ids=str)
def test_half_conv_products_in_float32(dt):
  x = Tensor(np.full((1, 1, 2, 2), 300.0, np.float32)).cast(dt)
  w = Tensor([[[[300.0, -300.0], [1.0, 1.0]]]]).cast(dt)
  np.testing.assert_allclose(_np(x.conv2d(w)), [[[[600.0]]]])
  xt = Tensor(np.full((1, 2, 1, 1), 300.0, np.float32)).cast(dt)
  wt = Tensor(np.array([[[[300.0]]], [[[-300.0]]]], np.float32)).cast(dt)
  out = xt.conv_transpose2d(wt)
  assert out.dtype is dt
  np.testing.assert_array_equal(_np(out), [[[[0.0]]]])


def test_half_matmul_rounds_once():
  # products and sum in float32, one rounding: the float64 product of the half inputs, rounded to half
  rng = np.random.default_rng(1)
  a, b = (rng.standard_normal(s).astype(np.float16) * 10 for s in ((16, 64), (64, 8)))  # products up to ~1e3: past 256·256 only in float32
  want = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float16).astype(np.float64)
  got = (Tensor(a) @ Tensor(b)).numpy().astype(np.float64)
  np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-2)


def test_in_float32_leaves_other_dtypes_alone():
  x = Tensor([1.0, 2.0])
  assert in_float32(lambda t: t * 2)(x).uop is (x * 2).uop  # float32 graphs (and their kernels) are unchanged
  assert compute_dtype(dtypes.float16) is dtypes.float32 and compute_dtype(dtypes.float64) is dtypes.float64
  h = in_float32(lambda t: t * t / 1000)(Tensor([300.0], dtype=dtypes.float16))  # 300·300 is inf in half
  assert h.dtype is dtypes.float16 and _np(h)[0] == 90.0


def test_pow2_scale():
  m = Tensor([0.0, 1e-45, 1.5, 3e38, math.inf, math.nan, 1000.0, 0.75])
  np.testing.assert_array_equal(pow2_scale(m).numpy(), np.array([1, 1, 1, 2.0 ** 127, 1, 1, 512, 0.5], np.float32))
  np.testing.assert_array_equal(pow2_scale(Tensor([1e300, 3.0], dtype=dtypes.float64)).numpy(), [2.0 ** 996, 2.0])


def test_std_takes_the_root_before_rounding():
  assert Tensor([1000.0, 1.0, 2.0, 3.0], dtype=dtypes.float16).std().item() == pytest.approx(499.0, rel=1e-3)
  std, mean = Tensor([1000.0, 1.0, 2.0, 3.0], dtype=dtypes.float16).std_mean()
  assert std.dtype is dtypes.float16 and std.item() == pytest.approx(499.0, rel=1e-3) and mean.item() == pytest.approx(251.5, rel=1e-3)
  # float32: the variance 6.7e59 overflows, the deviation 8.2e29 does not
  assert Tensor([2.0, -1e30, -0.8]).std(correction=2).item() == pytest.approx(math.sqrt(np.var([2.0, -1e30, -0.8]) * 3), rel=1e-5)


def test_var_of_huge_equal_values():
  x = Tensor([[3e38], [3e38]], requires_grad=True)
  var, mean = x.var_mean(0)
  assert var.item() == 0.0 and mean.item() == pytest.approx(3e38, rel=1e-6)
  x.var(0).sum().backward()
  np.testing.assert_array_equal(x.grad.numpy(), [[0.0], [0.0]])


def test_var_std_unchanged_on_ordinary_values():
  a = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32) * 3 + 10
  for axis in (0, 1, None):
    np.testing.assert_allclose(Tensor(a).var(axis).numpy(), np.var(a.astype(np.float64), axis=axis, ddof=1), rtol=1e-5)
    np.testing.assert_allclose(Tensor(a).std(axis, correction=0).numpy(), np.std(a.astype(np.float64), axis=axis), rtol=1e-5)
  x = Tensor(a, requires_grad=True)
  x.std(1).sum().backward()
  d = a.astype(np.float64) - a.mean(1, keepdims=True)
  np.testing.assert_allclose(x.grad.numpy(), d / (6 * np.sqrt((d * d).sum(1, keepdims=True) / 6)), rtol=1e-4)


@pytest.mark.parametrize("op,fn", [("sinh", np.sinh), ("cosh", np.cosh)])
def test_sinh_cosh_near_overflow(op, fn):
  v = np.array([89.0, -89.3, 1.0, -0.25])
  x = Tensor(v.astype(np.float32), requires_grad=True)
  y = getattr(x, op)()
  np.testing.assert_allclose(y.numpy(), fn(v), rtol=2e-5)
  y.sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), np.cosh(v) if op == "sinh" else np.sinh(v), rtol=2e-5)
  assert np.isinf(getattr(Tensor([90.0]), op)().numpy()).all()  # past float32 it overflows, as PyTorch's


def test_softplus_beta_huge():
  x = Tensor([3e38, 1.0, -3.0], requires_grad=True)
  y = x.softplus(beta=2.0)
  np.testing.assert_allclose(y.numpy(), [3e38, np.log1p(np.exp(2.0)) / 2, np.log1p(np.exp(-6.0)) / 2], rtol=1e-4)  # log(1 + e), no log1p
  y.sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), [1.0, 1 / (1 + np.exp(-2.0)), 1 / (1 + np.exp(6.0))], rtol=1e-5)


def test_layernorm_half():
  x = Tensor([[1000.0, 1.0, 2.0, 3.0]], dtype=dtypes.float16)
  d = np.array([1000.0, 1.0, 2.0, 3.0]) - 251.5
  np.testing.assert_allclose(_np(x.layernorm()), [d / np.sqrt((d * d).mean() + 1e-5)], rtol=2e-3)  # float16 squares overflow from 256
  z = Tensor.zeros(1, 4, dtype=dtypes.float16, requires_grad=True)
  (z.layernorm() * Tensor([[1.0, 2.0, 3.0, 4.0]], dtype=dtypes.float16)).sum().backward()
  assert z.grad.dtype is dtypes.float16 and np.isfinite(_np(z.grad)).all()


def test_normalize_half_and_huge():
  np.testing.assert_allclose(_np(Tensor([[1000.0, 1.0], [2.0, 3.0]], dtype=dtypes.float16).normalize(dim=1)),
                             [[1.0, 1e-3], [2 / math.sqrt(13), 3 / math.sqrt(13)]], rtol=2e-3)
  np.testing.assert_allclose(_np(Tensor([[0.0, -1e-6], [1.0, 2.0]], dtype=dtypes.float16).normalize(dim=-1)),
                             [[0.0, -1.0], [1 / math.sqrt(5), 2 / math.sqrt(5)]], rtol=2e-3)
  np.testing.assert_allclose(Tensor([[1e20, 1e20]]).normalize(dim=1).numpy(), [[math.sqrt(0.5)] * 2], rtol=1e-6)
  np.testing.assert_allclose(Tensor([[1e-30, 1e-30]]).normalize(dim=1).numpy(), [[1e-18, 1e-18]], rtol=1e-6)  # below eps: x/eps


def test_half_activations_in_float32():
  bf = Tensor([-2.98, 1.0], dtype=dtypes.bfloat16)
  np.testing.assert_allclose(_np(bf.mish()), [-2.98 * math.tanh(math.log1p(math.exp(-2.98))), math.tanh(math.log1p(math.e))], rtol=1.6e-2)
  assert _np(Tensor([-8.0], dtype=dtypes.float16).mish())[0] == pytest.approx(-8 * math.tanh(math.log1p(math.exp(-8))), rel=4e-3)
  np.testing.assert_allclose(_np(Tensor([20000.0, 60000.0], dtype=dtypes.float16).hardswish()), [20000.0, 60000.0], rtol=1e-3)
  x = Tensor([60000.0, -60000.0, 1.0], dtype=dtypes.float16, requires_grad=True)
  x.gelu().sum().backward()
  np.testing.assert_allclose(_np(x.grad)[:2], [1.0, 0.0], atol=1e-3)
  for dt in HALVES:
    assert _np(Tensor([0.01], dtype=dt).erf())[0] == pytest.approx(math.erf(0.01), rel=1e-2)


@pytest.mark.parametrize("dt", HALVES, ids=str)
def test_nll_loss_keeps_half(dt):
  logp, y = Tensor([[-1.0, -2.0], [-0.5, -3.0]], dtype=dt), Tensor([0, 1])
  loss = logp.nll_loss(y)
  assert loss.dtype is dt and _np(loss) == pytest.approx(2.0, rel=1e-2)
  assert Tensor([[-1.0, -2.0]]).nll_loss(Tensor([1])).dtype is dtypes.float32


@pytest.mark.parametrize("dt", HALVES, ids=str)
def test_half_matmul_kernel_takes_half_tensor_cores(dt):
  # the float32 casts sit on the factors, where the TC action looks through them: half inputs, float32 accumulator
  from plugrad.builtin.python_renderer import PythonRenderer
  from plugrad.codegen import get_program
  from plugrad.codegen.opt import OptOps
  from plugrad.engine.schedule import create_schedule
  from plugrad.uop.ops import Ops
  renderer = PythonRenderer("PYTHON", emulate="CUDA")
  if not any(tc.dtype_in is dt and tc.dtype_out is dtypes.float32 for tc in renderer.tensor_cores): pytest.skip(f"no {dt} tensor core")
  a, b = Tensor.empty(32, 64, dtype=dt, device="PYTHON"), Tensor.empty(64, 32, dtype=dt, device="PYTHON")
  items, _ = create_schedule((a @ b).uop)
  prg = get_program([it for it in items if it.kind == "kernel"][-1].ast, renderer)
  assert prg.applied_opts[0].op is OptOps.TC and any(u.op is Ops.WMMA for u in prg.uops), prg.applied_opts
