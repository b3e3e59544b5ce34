"""Gradients at singular points (issue 32, item 4): where a textbook derivative rule meets 0·inf or a rounded argument,
the gradient is PyTorch's (the values here are the exact derivatives PyTorch gives), not nan."""
from __future__ import annotations

import math

import numpy as np

from plugrad import Tensor, dtypes


def grads(f, *values: list, dtype=dtypes.float32, seed: list | None = None) -> list[np.ndarray]:
  xs = [Tensor(v, dtype=dtype) for v in values]
  out = f(*xs)
  g = out.sum() if seed is None else (out * Tensor(seed, dtype=dtype)).sum()
  return [r.float().numpy() if dtype is dtypes.bfloat16 else r.numpy() for r in g.gradient(*xs)]


def test_rounding_division_has_zero_gradient_at_a_zero_divisor():
  for mode in ("trunc", "floor"):
    ga, gb = grads(lambda a, b, m=mode: a.div(b, rounding_mode=m), [1.0, 0.0, 5.0], [0.0, 0.0, 2.0])
    np.testing.assert_array_equal(ga, [0, 0, 0])
    np.testing.assert_array_equal(gb, [0, 0, 0])


def test_remainder_gradient_at_a_zero_divisor():
  # d/da (a - floor(a/b)·b) = 1, d/db = -floor(a/b): no 0·inf from the quotient's 1/b where b is tiny
  ga, gb = grads(lambda a, b: a % b, [0.0, 7.0, 1e-30], [1e-30, 2.0, 1e-30])
  np.testing.assert_array_equal(ga, [1, 1, 1])
  np.testing.assert_array_equal(gb, [0, -3, -1])
  ga, gb = grads(lambda a, b: a.fmod(b), [0.0, -7.0], [1e-30, 2.0])
  np.testing.assert_array_equal(ga, [1, 1])
  np.testing.assert_array_equal(gb, [0, 3])


def test_division_gradient_of_a_tiny_divisor():
  # d(a/b)/db = -(a/b)/b: 0 for a = 0 although 1/b overflows float16
  ga, gb = grads(lambda a, b: a / b, [0.0, 1.0], [-7e-6, 2.0], dtype=dtypes.float16)
  assert np.isinf(ga[0]) and ga[1] == 0.5
  assert gb[0] == 0 and gb[1] == -0.25


def test_sin_gradient_at_large_arguments():
  x = [1e30, 1000.5, 0.5, -3e38]
  (g,) = grads(lambda t: t.sin(), x)
  np.testing.assert_allclose(g, np.cos(np.array(x, dtype=np.float32).astype(np.float64)), atol=2e-7)
  (g,) = grads(lambda t: t.sin(), [100.0, 1000.0], dtype=dtypes.bfloat16)
  np.testing.assert_allclose(g, np.cos([100.0, 1000.0]), atol=8e-3)


def test_sin_second_derivative():
  x = Tensor([0.3, 2.0, 1e4])
  (d1,) = x.sin().sum().gradient(x)
  (d2,) = d1.sum().gradient(x)
  np.testing.assert_allclose(d2.numpy(), -np.sin(np.array([0.3, 2.0, 1e4], dtype=np.float32).astype(np.float64)), atol=1e-6)


def test_scatter_product_gradient_with_zero_factors():
  # r = [0·4, 2·5, 3]: d/dself = [4, 5, 1], d/dsrc = [0, 2]
  for how in ("multiply", "prod"):
    x, src, idx = Tensor([0.0, 2.0, 3.0]), Tensor([4.0, 5.0]), Tensor([0, 1], dtype=dtypes.int32)
    out = x.scatter(0, idx, src, reduce="multiply") if how == "multiply" else x.scatter_reduce(0, idx, src, "prod")
    gx, gs = (g.numpy() for g in out.sum().gradient(x, src))
    np.testing.assert_array_equal(gx, [4, 5, 1])
    np.testing.assert_array_equal(gs, [0, 2])
  # two factors of one position, one of them 0: the zero one gets the product of the others, the rest 0; two zeros: all 0
  x, src, idx = Tensor([3.0, 0.0]), Tensor([0.0, 5.0, 0.0, 2.0]), Tensor([0, 0, 1, 1], dtype=dtypes.int32)
  gx, gs = (g.numpy() for g in x.scatter_reduce(0, idx, src, "prod").sum().gradient(x, src))
  np.testing.assert_array_equal(gx, [0, 0])
  np.testing.assert_array_equal(gs, [15, 0, 0, 0])
  # include_self=False leaves self out of the product
  x, src, idx = Tensor([7.0, 1.0]), Tensor([0.0, 5.0]), Tensor([0, 0], dtype=dtypes.int32)
  gx, gs = (g.numpy() for g in x.scatter_reduce(0, idx, src, "prod", include_self=False).sum().gradient(x, src))
  np.testing.assert_array_equal(gx, [0, 1])
  np.testing.assert_array_equal(gs, [5, 0])


def test_inverse_trig_gradients_at_the_poles():
  x = [-1.0, 1.0, 0.5, -0.75]
  want = [math.inf, math.inf, 1 / math.sqrt(0.75), 1 / math.sqrt(1 - 0.75 ** 2)]
  for dt in (dtypes.float32, dtypes.float64, dtypes.float16):
    (g,) = grads(lambda t: t.asin(), x, dtype=dt)
    np.testing.assert_allclose(g, want, rtol=2e-3)
    (g,) = grads(lambda t: t.acos(), x, dtype=dt)
    np.testing.assert_allclose(g, [-w for w in want], rtol=2e-3)
  (g,) = grads(lambda t: t.atanh(), [-1.0, 1.0, 0.5])
  np.testing.assert_allclose(g, [math.inf, math.inf, 1 / 0.75], rtol=1e-6)
  # the values keep their accuracy on both sides of 1/2 and at the poles
  v = np.array([-1.0, -0.9999, -0.6, -0.5, 0.3, 0.5, 0.51, 0.9999, 1.0])
  np.testing.assert_allclose(Tensor(v).asin().numpy(), np.arcsin(v), rtol=1e-15, atol=1e-15)
  np.testing.assert_allclose(Tensor(v).acos().numpy(), np.arccos(v), rtol=1e-15, atol=1e-15)
  assert np.isnan(Tensor([1.5, -2.0]).asin().numpy()).all() and np.isnan(Tensor([1.5, -2.0]).acos().numpy()).all()


def test_logaddexp_gradient_with_one_infinite_side():
  inf = math.inf
  ga, gb = grads(lambda a, b: a.logaddexp(b), [inf, 1.0, inf, 0.0], [-1.0, inf, -inf, 0.0])
  np.testing.assert_array_equal(ga, [1, 0, 1, 0.5])
  np.testing.assert_array_equal(gb, [0, 1, 0, 0.5])
  assert np.isnan(grads(lambda a, b: a.logaddexp(b), [inf], [inf])[0]).all()  # PyTorch's nan where both are +inf


def test_clip_with_tied_tensor_bounds():
  # the result is min == max: its gradient goes to min below the bounds, to max above them, to x between (documented)
  gx, glo, ghi = grads(lambda x, lo, hi: x.clip(lo, hi), [-2.6, 0.0, 3.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0])
  np.testing.assert_array_equal(gx, [0, 1, 0])
  np.testing.assert_array_equal(glo, [1, 0, 0])
  np.testing.assert_array_equal(ghi, [0, 0, 1])


def test_binary_crossentropy_gradient_at_0_and_1():
  # PyTorch's backward (p - y)/max(p(1 - p), 1e-12); the target's gradient is the clamped logs' (±100 at the edges)
  for dt in (dtypes.float32, dtypes.float64):
    gp, gy = grads(lambda p, y: p.binary_crossentropy(y, reduction="none"), [0.0, 1.0, 0.5, 1e-13, 1.0], [0.3, 0.2, 0.5, 0.5, 1.0], dtype=dt)
    np.testing.assert_allclose(gp, [-3e11, 8e11, 0, -5e11, 0], rtol=1e-6)
    np.testing.assert_allclose(gy, [100, -100, 0, math.log(1 - 1e-13) - math.log(1e-13), -100], rtol=1e-5)
  (gp, _) = grads(lambda p, y: p.binary_crossentropy(y, reduction="none"), [1.0, 0.0, 0.5], [0.0, 0.0, 0.25], dtype=dtypes.float16)
  np.testing.assert_array_equal(gp, [math.inf, 0, 1])  # 1e12 overflows half, as PyTorch's
  loss = Tensor([0.0, 1.0, 0.5]).binary_crossentropy(Tensor([0.0, 1.0, 0.5]), reduction="none").numpy()
  np.testing.assert_allclose(loss, [0, 0, math.log(2)], rtol=1e-6)


def test_hardswish_gradient_next_to_the_bounds():
  below3, above_m3 = np.nextafter(3.0, 0.0), np.nextafter(-3.0, 0.0)
  (g,) = grads(lambda t: t.hardswish(), [below3, above_m3, 3.0, -3.0, math.inf, -math.inf], dtype=dtypes.float64)
  np.testing.assert_allclose(g, [1.5, -0.5, 1, 0, 1, 0])
  v = Tensor([below3, -3.0, -math.inf], dtype=dtypes.float64).hardswish().numpy()
  assert abs(v[0] - below3) < 1e-15 and v[1] == 0 and np.isnan(v[2])  # PyTorch's -inf·0


def test_mish_gradient_at_huge_inputs():
  (g,) = grads(lambda t: t.mish(), [3e38, 25.0, 1.0])
  np.testing.assert_allclose(g, [1, 1, 1.0490361], rtol=1e-6)
  np.testing.assert_array_equal(Tensor([3e38, 25.0]).mish().numpy(), np.float32([3e38, 25.0]))


def test_normalize_gradient_of_a_zero_slice():
  # x / max(||x||, eps): a zero column has the x-independent gradient seed/eps, as PyTorch
  (g,) = grads(lambda t: t.normalize(2.0, dim=0), [[0.0, 1.0], [0.0, 2.0]], seed=[[1.0, 0.0], [2.0, 0.0]])
  np.testing.assert_allclose(g[:, 0], [1e12, 2e12], rtol=1e-6)
  assert np.isfinite(g).all()


def test_std_gradient_of_a_constant_slice():
  for op in ("std", "std_mean"):
    (g,) = grads(lambda t, o=op: getattr(t, o)(axis=1)[0] if o == "std_mean" else t.std(axis=1), [[0.0, 0.0], [1.0, 2.0]])
    np.testing.assert_allclose(g, [[0, 0], [-math.sqrt(0.5), math.sqrt(0.5)]], rtol=1e-6)
  # with nothing to divide by (N - correction = 0) the result stays nan
  assert np.isnan(Tensor([[1.0, 1.0]]).std(axis=1, correction=2).numpy()).all()


def test_logcumsumexp_gradient_with_a_later_inf():
  # the +inf row gives the finite elements nothing: [1, 2, 0] from the earlier rows; the inf element's is nan (PyTorch's)
  (g,) = grads(lambda t: t.logcumsumexp(0), [0.0, 1000.0, 0.0, math.inf])
  np.testing.assert_allclose(g[:3], [1, 2, 0], atol=1e-6)
  assert np.isnan(g[3])
  np.testing.assert_array_equal(Tensor([0.0, 1000.0, 0.0, math.inf]).logcumsumexp(0).numpy(), [0, 1000, 1000, math.inf])


def test_product_of_one_factor_passes_the_gradient():
  (g,) = grads(lambda t: t.cumprod(0), [[math.inf, 2.0]])
  np.testing.assert_array_equal(g, [[1, 1]])
  (g,) = grads(lambda t: t.prod(1, keepdim=True), [[math.inf], [-math.inf]])
  np.testing.assert_array_equal(g, [[1], [1]])


def test_product_gradient_where_the_product_under_or_overflows():
  # float16 [-1.2e-7, -0.284] along 0: the product is subnormal in half; d/dx0 = 1 + x1 (formed in float32)
  x = [[-1.1920928955078125e-07], [-0.284423828125]]
  (g,) = grads(lambda t: t.cumprod(0), x, dtype=dtypes.float16)
  np.testing.assert_allclose(g[:, 0], [1 - 0.284423828125, 1.0 * np.float16(-1.1920928955078125e-07)], rtol=2e-3)
  # the seed multiplies before the division: the product over x2 overflows float32 although the gradient fits
  (g,) = grads(lambda t: t.prod().mul(0.25), [4.0, 0.25, 3e38])
  np.testing.assert_allclose(g, [1.875e37, 3e38, 0.25], rtol=1e-6)
