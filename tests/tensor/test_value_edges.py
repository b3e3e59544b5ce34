"""Values at the edges PyTorch gets right (issue 32, the differential tester's former value KnownBugs): exact float
remainders and PyTorch's floor division, cos/tan of large arguments through each range reduction, nan indices, losses
with -inf logits or ignored non-finite rows, interpolate of non-finite input, and the smaller ones."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = pytest.importorskip("torch.nn.functional")

import plugrad.tensor.elementwise as E
from plugrad import Device, Tensor, dtypes
from plugrad.uop.ops import Ops

RNG = np.random.default_rng(32)


def _wide_floats(n: int) -> np.ndarray:
  """float32 values over the whole range (subnormals to 3e38), both signs, a few infinities."""
  v = RNG.standard_normal(n) * 10.0 ** RNG.integers(-45, 39, n)
  v[RNG.random(n) < 0.03] = np.inf
  return v.astype(np.float32)


def _same(got: np.ndarray, want: np.ndarray) -> np.ndarray: return (got == want) | (np.isnan(got) & np.isnan(want))


@pytest.mark.parametrize("path", ["long-division", "uint64", "uint32"])
def test_float32_remainders_are_exact(path, monkeypatch):
  """fmod, % and // of float32 equal the exact remainder (C's fmod in float64, which is exact for float32 values) and
  PyTorch's floor division, bit for bit, at every quotient: 1e10 % 3, 2 % 1e-40, fmod(0.3, 0.1), x % inf. By float64
  long division, and by the integer steps of devices without float64 (in uint64, or uint32 without int64)."""
  if path != "long-division":
    monkeypatch.setattr(E, "_has_float64", lambda device: False)
    monkeypatch.setattr(E, "_U64_OK", {"CPU": path == "uint64"})
  a, b = _wide_floats(600), _wide_floats(600)
  a[:6], b[:6] = [1e10, 2.0, 0.3, -1.9, 5.0, np.inf], [3.0, 1e-40, 0.1, np.inf, -np.inf, 2.0]
  ta, tb = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
  for got, want in ((Tensor(a).fmod(Tensor(b)), torch.fmod(ta, tb)), (Tensor(a) % Tensor(b), torch.remainder(ta, tb)),
                    (Tensor(a) // Tensor(b), torch.floor_divide(torch.tensor(a), torch.tensor(b)).double())):
    g, w = got.numpy(), want.float().numpy()
    assert _same(g, w).all(), list(zip(a[~_same(g, w)][:4], b[~_same(g, w)][:4], g[~_same(g, w)][:4], w[~_same(g, w)][:4]))


@pytest.mark.parametrize("dt", ["float16", "bfloat16"])
def test_half_remainders_are_exact(dt):
  a, b = _wide_floats(300), _wide_floats(300)
  ta, tb = torch.tensor(a).to(getattr(torch, dt)), torch.tensor(b).to(getattr(torch, dt))
  got = Tensor(ta.float().numpy()).cast(dt).fmod(Tensor(tb.float().numpy()).cast(dt)).cast(dtypes.float32).numpy()
  assert _same(got, torch.fmod(ta.double(), tb.double()).to(ta.dtype).float().numpy()).all()


def test_remainder_gradients():
  """d fmod/db = -trunc(a/b) and d(a % b)/db = -floor(a/b), also where the float32 quotient overflows (±inf); // has none."""
  a, b = Tensor([7.5, -7.5, 2.0], requires_grad=True), Tensor([2.0, 2.0, 1e-40], requires_grad=True)
  ga, gb = a.fmod(b).sum().gradient(a, b)
  assert ga.numpy().tolist() == [1, 1, 1] and gb.numpy().tolist() == [-3, 3, -np.inf]
  ga, gb = (a % b).sum().gradient(a, b)
  assert ga.numpy().tolist() == [1, 1, 1] and gb.numpy().tolist() == [-3, 4, -np.inf]
  ga, gb = (a // b).sum().gradient(a, b)
  assert ga.numpy().tolist() == [0, 0, 0] and gb.numpy().tolist() == [0, 0, 0]


def _big_args(dt: str) -> np.ndarray:
  top = 38 if dt == "float32" else 300
  v = RNG.standard_normal(400) * 10.0 ** RNG.integers(-3, top, 400)
  return np.concatenate([v, [1000.5, 2.0 ** 31, 1e30, 13176795.0, 1.5707964, -3e38 if dt == "float32" else 1e300]]).astype(dt)


@pytest.mark.parametrize("path", ["payne-hanek", "cody-waite"])
def test_sin_cos_tan_large_float32_arguments(path, monkeypatch):
  """sin/cos/tan of float32 anywhere in its range within a few ulp of the exact value (float64 numpy of the same float32),
  by Payne-Hanek in float64 and by the float32 Cody-Waite reduction of devices without float64 (exact below 2^22).
  Past 2^22 that path takes the device's own sin: on a device whose vector sin is the shared polynomial (the CPU's) that
  is nan, as docs/writing-a-backend.md says; otherwise cos is absolutely within 2 ulp of 1 there."""
  if path == "cody-waite": monkeypatch.setattr(E, "_has_float64", lambda device: False)
  x = _big_args("float32")
  xd = x.astype(np.float64)
  want_sin, want_cos, want_tan = np.sin(xd), np.cos(xd), np.tan(xd)
  sin, cos, tan = Tensor(x).sin().numpy(), Tensor(x).cos().numpy(), Tensor(x).tan().numpy()
  exact = np.abs(x) < 2.0 ** 22 if path == "cody-waite" else np.ones(x.shape, bool)
  assert (np.abs(sin - want_sin) <= 2e-7 * np.maximum(np.abs(want_sin), 1e-3))[exact].all()
  assert (np.abs(cos - want_cos) <= 2e-7 * np.maximum(np.abs(want_cos), 1e-3))[exact].all()
  assert (np.abs(tan - want_tan) <= 4e-7 * np.abs(want_tan))[exact].all()
  if Device[Device.DEFAULT].renderer.math_is_native(Ops.SIN, dtypes.float32.vec(16)):
    assert (np.abs(cos - want_cos) <= 2.4e-7)[~exact].all() and (np.abs(sin - want_sin) <= 2.4e-7)[~exact].all()
  else: assert np.isnan(cos[~exact]).all() and np.isnan(sin[~exact]).all()


def test_sin_cos_of_a_bounded_argument_skip_payne_hanek():
  """An argument whose magnitude the graph bounds below 2^22 (randn's 2πu, RoPE's position x frequency) is reduced by
  float32 Cody-Waite, with no float64 in the kernel, and is as exact."""
  angles = Tensor.arange(4096).float() * 0.37
  assert E.magnitude_bound(angles.uop) < 1600 and E.magnitude_bound(Tensor.rand(4).realize().uop) == float("inf")
  want = np.arange(4096) * np.float32(0.37)
  np.testing.assert_allclose(angles.cos().numpy(), np.cos(want.astype(np.float32).astype(np.float64)), atol=2e-7)
  np.testing.assert_allclose(angles.sin().numpy(), np.sin(want.astype(np.float32).astype(np.float64)), atol=2e-7)
  assert not any(u.dtype.scalar() is dtypes.float64 for u in angles.sin().uop.toposort)


def test_cos_tan_float64_and_half():
  x = _big_args("float64")
  assert np.abs(Tensor(x).cos().numpy() - np.cos(x)).max() < 1e-15
  h = np.array([-1.286, 1000.5, 30000.0, 0.5], np.float16)
  np.testing.assert_allclose(Tensor(h).tan().numpy().astype(np.float64), np.tan(h.astype(np.float64)), rtol=1e-3)
  np.testing.assert_allclose(Tensor(h).cos().numpy().astype(np.float64), np.cos(h.astype(np.float64)), atol=1e-3)


def test_cos_tan_gradients_at_large_arguments():
  x = Tensor(np.array([1e30, 1000.5, 0.0, 2.0 ** 31], np.float32), requires_grad=True)
  xd = x.numpy().astype(np.float64)
  (gc,) = x.cos().sum().gradient(x)
  (gt,) = x.tan().sum().gradient(x)
  (gs,) = x.sin().sum().gradient(x)
  np.testing.assert_allclose(gs.numpy(), np.cos(xd), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(gc.numpy(), -np.sin(xd), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(gt.numpy(), 1 / np.cos(xd) ** 2, rtol=1e-5)


def test_nan_indices():
  v, i = Tensor([1.0, np.nan, 2.0, np.nan]).cummax(0)
  assert i.numpy().tolist() == [0, 1, 1, 1] and np.isnan(v.numpy()[1:]).all()
  assert Tensor([1.0, np.nan, 2.0]).cummin(0)[1].numpy().tolist() == [0, 1, 1]
  x = np.array([[[[1.0, np.nan], [np.nan, 3.0]]]], np.float32)
  _, idx = Tensor(x).max_pool2d(2, return_indices=True)
  assert idx.numpy().item() == F.max_pool2d(torch.tensor(x), 2, return_indices=True)[1].item() == 2  # the last nan, as PyTorch


def test_losses_with_non_finite_entries():
  logits = np.array([[-np.inf, 2.49], [0.2, 2.49]], np.float32)
  want = F.cross_entropy(torch.tensor(logits), torch.tensor([1, 0]), reduction="sum").item()
  assert Tensor(logits).cross_entropy(Tensor([1, 0]), reduction="sum").item() == pytest.approx(want, rel=1e-6)
  assert Tensor(logits).sparse_categorical_crossentropy(Tensor([1, 0]), reduction="sum").item() == pytest.approx(want, rel=1e-6)
  logp = np.array([[-0.1, -2.0], [np.nan, -np.inf]], np.float32)
  assert Tensor(logp).nll_loss(Tensor([0, 1]), ignore_index=1).item() == pytest.approx(0.1)


def test_interpolate_non_finite_and_float64():
  x = np.array([[[1.0, np.inf, 2.0, 3.0]]], np.float32)
  for mode in ("nearest", "linear"):
    got, want = Tensor(x).interpolate((6,), mode=mode).numpy(), F.interpolate(torch.tensor(x), size=6, mode=mode).numpy()
    assert _same(got, want).all(), (mode, got, want)
  x64 = np.array([[[1.0, 2.0, 4.0, 3.0]]])
  np.testing.assert_allclose(Tensor(x64).interpolate((6,)).numpy(), F.interpolate(torch.tensor(x64), size=6, mode="linear").numpy(), rtol=1e-15)


def test_small_edges():
  got = Tensor([1.7, 2.0, 3.0]).copysign(Tensor(np.array([-np.nan, np.nan, -0.0], np.float32))).numpy()
  assert got.tolist() == pytest.approx([-1.7, 2.0, -3.0])
  assert np.isnan(Tensor([-1e30, -1e4, 0.5]).acosh().numpy()).all()
  assert Tensor([0.0, 1.0, np.inf]).isclose(Tensor([np.inf, -np.inf, np.inf])).numpy().tolist() == [False, False, True]
  assert Tensor([-1e30, 1000.0]).lerp(Tensor([2.9, 1.1]), 1.0).numpy().tolist() == pytest.approx([2.9, 1.1], rel=1e-7)


def test_random_draws_of_one_size_share_their_kernel():
  """The stream offset is a buffer of each draw, not a constant of the kernel: every draw of one size is the same kernel
  (an initialization compiled one kernel per parameter), and the numbers still continue the stream."""
  from plugrad.engine.schedule import create_schedule
  def kernel(t: Tensor) -> object: return next(it.ast for it in create_schedule(t.uop)[0] if it.kind == "kernel")
  Tensor.manual_seed(5)
  a, b = Tensor.rand(64, 3, 3), Tensor.rand(64, 3, 3)
  assert kernel(a) is kernel(b)
  both = np.concatenate([a.numpy().ravel(), b.numpy().ravel()])
  Tensor.manual_seed(5)
  np.testing.assert_array_equal(Tensor.rand(2 * 576).numpy(), both)
