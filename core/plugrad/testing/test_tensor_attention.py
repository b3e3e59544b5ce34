"""Conformance: the row reductions of attention (softmax, log-softmax, layernorm) on inputs that break naive kernels
(large values, -inf entries from masks), exp over every range where it changes form (vectorized on the CPU), and
scaled_dot_product_attention with each kind of mask, forward and backward, against float64 numpy references, by the
plain formula and by the fused online-softmax kernel."""
from __future__ import annotations

import numpy as np
import pytest

from plugrad.device.registry import Device
from plugrad.dtype import dtypes
from plugrad.engine import schedule as _schedule  # noqa: F401  (registers ROW_FUSE for Context(ROW_FUSE=...) when run alone)
from plugrad.tensor.tensor import Tensor
from plugrad.testing.test_tensor_nn import _np_softmax, check, np_sdpa, rand
from plugrad.uop.ops import Ops

pytestmark = pytest.mark.plugrad_conformance
RNG = np.random.default_rng(20)


def _rows(n: int, w: int) -> np.ndarray:
  """Rows of width w (a multiple of 16: the CPU's vector paths) with large offsets and -inf entries (masked positions)."""
  x = rand(n, w) * 30 + RNG.choice([0.0, 1e4, -1e4, 80.0], (n, 1)).astype(np.float32)
  x[RNG.random((n, w)) < 0.2] = -np.inf
  x[:, 0] = np.where(np.isinf(x[:, 0]), 0.0, x[:, 0])  # every row keeps a finite entry
  return x


def test_softmax_large_values_and_masks(run_device):
  x = _rows(6, 48)
  got = Tensor(x, device=run_device).softmax(-1).numpy()
  np.testing.assert_allclose(got, _np_softmax(x.astype(np.float64), -1), rtol=2e-6, atol=1e-7)
  assert np.allclose(got.sum(-1), 1, rtol=1e-5)


def test_log_softmax_large_values_and_masks(run_device):
  x = _rows(6, 48)
  x64 = x.astype(np.float64)
  want = x64 - x64.max(-1, keepdims=True) - np.log(np.exp(x64 - x64.max(-1, keepdims=True)).sum(-1, keepdims=True))
  got = Tensor(x, device=run_device).log_softmax(-1).numpy()
  fin = np.isfinite(want)
  assert (np.isneginf(got) == ~fin).all()
  np.testing.assert_allclose(got[fin], want[fin], rtol=1e-5, atol=2e-5)


def test_softmax_and_layernorm_gradients(run_device):
  check(run_device, lambda t: t.softmax(-1), lambda a: _np_softmax(a, -1), rand(3, 32) * 4, atol=1e-6, gtol=5e-3)
  def ln(a):
    y = a - a.mean(-1, keepdims=True)
    return y / np.sqrt((y * y).mean(-1, keepdims=True) + 1e-5)
  check(run_device, lambda t: t.layernorm(-1), ln, rand(3, 32), atol=1e-4, gtol=5e-3)


def test_layernorm_large_offset(run_device):
  x = (rand(8, 64) + 1000).astype(np.float32)
  x64 = x.astype(np.float64)
  y = x64 - x64.mean(-1, keepdims=True)
  want = y / np.sqrt((y * y).mean(-1, keepdims=True) + 1e-5)
  np.testing.assert_allclose(Tensor(x, device=run_device).layernorm().numpy(), want, rtol=1e-3, atol=2e-3)


@pytest.mark.parametrize("fn", ["exp2", "exp"])
def test_exp_ranges_and_specials(run_device, fn):
  """exp2 and exp where the CPU computes them with vector arithmetic: every range up to overflow, subnormal results,
  nan and +-inf. exp2 within 2 ulp; exp also carries the rounding of x*log2(e) (relative error up to |x| * 2^-24)."""
  lo, hi = (-160, 140) if fn == "exp2" else (-110, 95)
  x = np.concatenate([np.linspace(lo, hi, 992), [np.nan, np.inf, -np.inf, 0.0, -0.0, 88.7, 88.8, -87.3, -103.0, -104.0,
                                                 1e-30, -1e-30, 0.5, -0.5, 127.9, -149.5]]).astype(np.float32)
  with np.errstate(over="ignore"): want = getattr(np, fn)(x.astype(np.float64)).astype(np.float32)
  got = getattr(Tensor(x, device=run_device), fn)().numpy()
  same_class = (np.isnan(got) == np.isnan(want)) & (np.isinf(got) == np.isinf(want))
  assert same_class.all(), f"special values differ at {x[~same_class]}: {got[~same_class]} vs {want[~same_class]}"
  normal = np.isfinite(want) & (want >= np.finfo(np.float32).tiny)
  np.testing.assert_allclose(got[normal], want[normal], rtol=2.4e-7 if fn == "exp2" else 1e-5)
  # a subnormal result may be flushed to zero (WGSL and MSL allow it; lavapipe does it), else it must be close
  sub = ~normal & np.isfinite(want)
  flushed = got[sub] == 0
  np.testing.assert_allclose(got[sub][~flushed], want[sub][~flushed], rtol=1e-2 if fn == "exp2" else 1e-1, atol=3e-45)


@pytest.mark.parametrize("mode", ["none", "bool_mask", "float_mask", "causal"])
def test_attention_masks_forward_backward(run_device, mode):
  """The plain formula's reference; the float mask holds -inf entries (a padding mask), broadcast over batch and heads."""
  q, k, v = rand(2, 2, 8, 4), rand(2, 2, 8, 4), rand(2, 2, 8, 4)
  mask: np.ndarray | None = None
  if mode == "bool_mask":
    mask = RNG.random((2, 1, 8, 8)) < 0.6
    mask[..., 0] = True
  if mode == "float_mask":
    mask = rand(2, 1, 1, 8)
    mask[0, ..., 5:] = -np.inf
  m = None if mask is None else Tensor(mask, device=run_device)
  check(run_device, lambda a, b, c: a.scaled_dot_product_attention(b, c, m, is_causal=mode == "causal"),
        lambda a, b, c: np_sdpa(a, b, c, mask, mode == "causal"), q, k, v, atol=1e-5, rtol=1e-4, gtol=5e-3, grad=(0, 1, 2))


@pytest.mark.parametrize("fuse", [0, 2], ids=["apart", "fused"])
def test_row_statistics_fused_or_apart(run_device, fuse):
  """softmax, log-softmax and layernorm with their row statistics in the kernel that broadcasts them (ROW_FUSE=2, the
  CPU's default; a workgroup device keeps them apart unless told) and in kernels of their own: the same values and
  gradients, with -inf entries, large offsets, a row width that is no multiple of a vector, and the softmax's backward
  (its row sum of g*y is a row statistic too)."""
  from plugrad.helpers import Context
  x, odd = _rows(5, 48), rand(3, 37) * 3
  x64 = x.astype(np.float64)
  lsm = x64 - x64.max(-1, keepdims=True) - np.log(np.exp(x64 - x64.max(-1, keepdims=True)).sum(-1, keepdims=True))
  def ln(a):
    y = a - a.mean(-1, keepdims=True)
    return y / np.sqrt((y * y).mean(-1, keepdims=True) + 1e-5)
  with Context(ROW_FUSE=fuse):
    np.testing.assert_allclose(Tensor(x, device=run_device).softmax(-1).numpy(), _np_softmax(x64, -1), rtol=2e-6, atol=1e-7)
    got = Tensor(x, device=run_device).log_softmax(-1).numpy()
    assert (np.isneginf(got) == ~np.isfinite(lsm)).all()
    np.testing.assert_allclose(got[np.isfinite(lsm)], lsm[np.isfinite(lsm)], rtol=1e-5, atol=2e-5)
    big = rand(4, 48) * 30 + 500
    np.testing.assert_allclose(Tensor(big, device=run_device).layernorm().numpy(), ln(big.astype(np.float64)), rtol=1e-3, atol=2e-3)
    check(run_device, lambda t: t.softmax(-1), lambda a: _np_softmax(a, -1), odd, atol=1e-6, gtol=5e-3)
    check(run_device, lambda t: t.log_softmax(-1), lambda a: a - np.log(np.exp(a).sum(-1, keepdims=True)), odd, atol=1e-5, gtol=5e-3)
    check(run_device, lambda t: t.layernorm(-1), ln, odd, atol=1e-4, gtol=5e-3)
    check(run_device, lambda t: t.softmax(0), lambda a: _np_softmax(a, 0), odd, atol=1e-6, gtol=5e-3)  # columns: kept apart


@pytest.mark.parametrize("mode", ["none", "bool_mask", "float_mask", "causal"])
def test_attention_masks_row_fused(run_device, mode):
  """scaled_dot_product_attention with the softmax's statistics fused into the probabilities' kernel on every device."""
  from plugrad.helpers import Context
  with Context(ROW_FUSE=2): test_attention_masks_forward_backward(run_device, mode)


def _fused(out: Tensor) -> bool:
  return any(u.op is Ops.KERNEL and u.arg.name.startswith("flash_attn") for u in out.uop.toposort)


@pytest.mark.parametrize("mode", ["none", "bool_mask", "float_mask", "causal", "gqa"])
@pytest.mark.parametrize("dims", [(8, 8, 4, 4), (16, 32, 8, 16), (5, 7, 3, 6)], ids=["square", "vectors", "odd"])
def test_fused_attention_matches_the_plain_formula(run_device, mode, dims):
  """The fused online-softmax kernel and its fused backward (FLASH_ATTENTION=3, on every device), against
  the plain formula in float64 and against this device's own unfused result: masks broadcast over batch and heads with
  -inf entries (a fully masked row gives nan, as the plain formula does), causal with more keys than queries, the head
  dims of k and v apart, key counts that are and are not multiples of the vector width, grouped-query heads."""
  from plugrad.helpers import Context
  L, S, E, Ev = dims
  if mode == "causal": S = max(S, L)
  q, k, v = rand(2, 2, L, E), rand(2, 1 if mode == "gqa" else 2, S, E), rand(2, 1 if mode == "gqa" else 2, S, Ev)
  mask: np.ndarray | None = None
  if mode == "bool_mask":
    mask = RNG.random((2, 1, L, S)) < 0.6
    mask[..., 0] = True
  if mode == "float_mask":
    mask = rand(1, 2, 1, S)
    mask[0, 0, 0, S // 2:] = -np.inf
  m = None if mask is None else Tensor(mask, device=run_device, requires_grad=mode == "float_mask")
  def sdpa(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    return a.scaled_dot_product_attention(b, c, m, is_causal=mode == "causal", enable_gqa=mode == "gqa")
  def ref(a, b, c):
    if mode == "gqa": b, c = np.repeat(b, 2, 1), np.repeat(c, 2, 1)
    return np_sdpa(a, b, c, mask, mode == "causal")
  with Context(FLASH_ATTENTION=3):
    assert _fused(sdpa(*(Tensor(x, device=run_device) for x in (q, k, v))))
    fused = check(run_device, sdpa, ref, q, k, v, atol=1e-5, rtol=1e-4, gtol=5e-3, grad=(0, 1, 2)).numpy()
  with Context(FLASH_ATTENTION=0):
    plain = sdpa(*(Tensor(x, device=run_device) for x in (q, k, v)))
    assert not _fused(plain)
    np.testing.assert_allclose(fused, plain.numpy(), atol=2e-6, rtol=2e-5)
  if mode == "float_mask":  # the mask's own gradient: dS summed over the dims it broadcasts along
    with Context(FLASH_ATTENTION=3):
      tq, tk, tv = (Tensor(x, device=run_device) for x in (q, k, v))
      assert m is not None
      m.grad = None
      (sdpa(tq, tk, tv) * 1.5).sum().backward()
      fused_grad = m.grad.numpy()
    with Context(FLASH_ATTENTION=0):
      m.grad = None
      (sdpa(tq, tk, tv) * 1.5).sum().backward()
      np.testing.assert_allclose(fused_grad, m.grad.numpy(), atol=1e-5, rtol=1e-4)


def test_fused_attention_fully_masked_rows_and_float16(run_device):
  """A row whose keys are all masked is nan (as softmax of all -inf is), its neighbours are untouched; float16 inputs
  compute in float32 inside the kernel and return float16."""
  from plugrad.helpers import Context
  q, k, v = rand(1, 1, 4, 8), rand(1, 1, 8, 8), rand(1, 1, 8, 8)
  mask = np.ones((4, 8), bool)
  mask[2] = False
  with Context(FLASH_ATTENTION=1):
    got = Tensor(q, device=run_device).scaled_dot_product_attention(Tensor(k, device=run_device), Tensor(v, device=run_device),
                                                                    Tensor(mask, device=run_device)).numpy()
    assert np.isnan(got[0, 0, 2]).all() and np.isfinite(np.delete(got, 2, axis=2)).all()
    np.testing.assert_allclose(np.delete(got, 2, axis=2), np.delete(np_sdpa(q, k, v, mask), 2, axis=2), atol=1e-5, rtol=1e-4)
    if "float16" not in Device[run_device].renderer.capabilities: return
    h = [Tensor(x.astype(np.float16), device=run_device) for x in (q, k, v)]
    out = h[0].scaled_dot_product_attention(h[1], h[2], is_causal=True)
    assert _fused(out) and out.dtype == dtypes.float16
    np.testing.assert_allclose(out.numpy().astype(np.float64), np_sdpa(*(x.astype(np.float16).astype(np.float64) for x in (q, k, v)), causal=True),
                               atol=2e-3, rtol=2e-3)
