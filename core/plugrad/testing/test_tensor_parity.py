"""Conformance: behaviour a user porting PyTorch code meets, compared with PyTorch where it is installed (issue 21).

* kernels whose inputs include a buffer that simplification stops reading (a pad gate that is always false, `x ^ x`,
  a one-element sort) launch with the buffers they read;
* gradients through empty tensors, empty selections and comparisons are zeros of the input's shape;
* shape mismatches raise `ShapeError`, which is both a ValueError and PyTorch's RuntimeError;
* extreme inputs (±1e3 and beyond, ±inf) give PyTorch's values and finite gradients, and piecewise functions follow
  PyTorch's gradient conventions at their kinks;
* meshgrid, pad modes, div, diagonal, flip, scatter/scatter_reduce, attention and slices take what PyTorch takes and
  refuse what it refuses, with errors that are RuntimeErrors too (slices with negative steps work, as in numpy and
  tinygrad). dtype handling and integer semantics are in test_tensor_dtypes.py.
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from plugrad.device.registry import Device
from plugrad.dtype import dtypes
from plugrad.tensor.helpers import ArgumentError
from plugrad.tensor.tensor import Tensor
from plugrad.uop.shape import ShapeError

pytestmark = [pytest.mark.plugrad_conformance, pytest.mark.filterwarnings("ignore:.*degrees of freedom"),
              pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")]
RNG = np.random.default_rng(21)


def _torch() -> Any: return pytest.importorskip("torch")


def _data(shape: tuple[int, ...], dt: Any = np.float32) -> np.ndarray:
  return RNG.integers(-3, 4, shape).astype(dt) if np.issubdtype(dt, np.integer) else RNG.uniform(-2, 2, shape).astype(dt)


# (name, op on plugrad or torch tensors (the module is passed for ops spelled differently), input shapes, dtype)
UNREAD: list[tuple[str, Callable[..., Any], tuple[tuple[int, ...], ...], Any]] = [
  ("pad_then_slice_away", lambda m, x: x.pad((2, 1))[0:2] if m == "pg" else _torch().nn.functional.pad(x, (2, 1))[0:2], ((3,),), np.float32),
  ("pad2d_slice_away", lambda m, x: x.pad(((0, 0), (2, 1)))[:, 0:2] if m == "pg" else _torch().nn.functional.pad(x, (2, 1))[:, 0:2],
   ((2, 3),), np.float32),
  ("tril_below_all", lambda m, x: x.tril(-5), ((2, 2),), np.float32),
  ("triu_above_all", lambda m, x: x.triu(5), ((3, 2),), np.float32),
  ("xor_self", lambda m, x: x ^ x, ((3,),), np.int32),
  ("sort_one_values", lambda m, x: x.sort()[0] if m == "pg" else x.sort().values, ((1,),), np.float32),
  ("sort_one_indices", lambda m, x: x.sort(dim=1)[1] if m == "pg" else x.sort(dim=1).indices, ((2, 1),), np.float32),
  ("pow_zero", lambda m, x: x ** 0, ((3,),), np.float32),
  ("int_pow", lambda m, x: x ** 3, ((2, 3),), np.int32),
  ("stack_max", lambda m, x, y: Tensor.stack(x, y).max(1) if m == "pg" else _torch().stack((x, y)).max(1).values, ((1,), (1,)), np.float32),
]


@pytest.mark.parametrize("name,fn,shapes,dt", UNREAD, ids=[c[0] for c in UNREAD])
def test_kernel_with_unread_input(run_device, name, fn, shapes, dt):
  torch = _torch()
  xs = [_data(s, dt) for s in shapes]
  got = fn("pg", *[Tensor(x, device=run_device).realize() for x in xs]).numpy()  # realized: the inputs are buffers
  want = fn("torch", *[torch.tensor(x) for x in xs]).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-6)


# (name, op, input shapes): the gradient of sum(op(*inputs) * w) for every input, against torch.autograd
ZERO_GRAD: list[tuple[str, Callable[..., Any], tuple[tuple[int, ...], ...]]] = [
  ("sum_empty_axis", lambda x: x.sum(1), ((2, 0),)),
  ("mean_empty", lambda x: x.mean().reshape(1) * 0, ((0, 3),)),  # nan forward, as in torch; * 0 keeps the check finite
  ("std_empty_axis", lambda x: x.std(1) * 0, ((2, 0),)),
  ("var_empty_axis", lambda x: x.var(1) * 0, ((2, 0),)),
  ("slice_selects_nothing", lambda x: x[1:1].sum(0), ((3, 2),)),
  ("cat_empty", lambda x, y: x.cat(y, dim=1) if isinstance(x, Tensor) else _torch().cat((x, y), dim=1), ((2, 0), (2, 3))),
  ("expand_empty", lambda x: x.expand(3, 0).sum(1), ((1, 0),)),
  ("roll_empty", lambda x: x.roll(1, 1), ((2, 0),)),
  ("cumsum_empty", lambda x: x.cumsum(1), ((2, 0),)),
  ("unfold_empty_batch", lambda x: x.unfold(1, 2, 1), ((0, 3),)),
  ("matmul_empty_inner", lambda a, b: a @ b, ((3, 0), (0, 4))),
  ("matmul_empty_rows", lambda a, b: (a @ b).sum(0), ((0, 3), (3, 4))),
  ("comparison", lambda x, y: (x < y).float() if isinstance(x, _torch().Tensor) else (x < y).float(), ((4,), (4,))),
  ("comparison_in_sum", lambda x: x * 2 + (x > 0).float(), ((5,),)),
  ("copysign", lambda x, y: x.copysign(y), ((4,), (4,))),
]


@pytest.mark.parametrize("name,fn,shapes", ZERO_GRAD, ids=[c[0] for c in ZERO_GRAD])
def test_zero_and_unused_gradients(run_device, name, fn, shapes):
  torch = _torch()
  xs = [_data(s, np.float32) for s in shapes]
  ts = [Tensor(x, device=run_device, requires_grad=True) for x in xs]
  px = [torch.tensor(x, requires_grad=True) for x in xs]
  pout = fn(*px)
  w = _data(tuple(pout.shape), np.float32)
  out = fn(*ts)
  assert out.shape == tuple(pout.shape)
  np.testing.assert_allclose(out.numpy(), pout.detach().numpy(), rtol=1e-5, atol=1e-6)
  loss = (out * Tensor(w, device=run_device)).sum()
  grads = loss.gradient(*ts)
  pw = (pout * torch.tensor(w)).sum()
  want = torch.autograd.grad(pw, px, allow_unused=True, materialize_grads=True) if pw.requires_grad else [torch.zeros_like(p) for p in px]
  for i, (g, wg, t) in enumerate(zip(grads, want, ts)):
    assert g.shape == t.shape, f"input {i}: gradient shape {g.shape}, want {t.shape}"
    np.testing.assert_allclose(g.numpy(), wg.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"gradient of input {i}")
  loss.backward()  # backward gives every input in the graph a gradient, zeros where it has no effect
  for i, (t, wg) in enumerate(zip(ts, want)):
    assert t.grad is not None, f"input {i} got no gradient"
    np.testing.assert_allclose(t.grad.numpy(), wg.numpy(), rtol=1e-5, atol=1e-6)


def test_detach_still_cuts_the_graph(run_device):
  from plugrad.gradient import GradientError
  x = Tensor(_data((3,)), device=run_device, requires_grad=True)
  with pytest.raises(GradientError, match="not part of"): (x.detach() * 2).sum().gradient(x)


# (name, plugrad call, torch call): PyTorch raises RuntimeError for each
SHAPE_ERRORS: list[tuple[str, Callable[[Any], Any]]] = [
  ("matmul", lambda m: m.ones(2, 3) @ m.ones(4, 5)),
  ("dot", lambda m: m.ones(3).dot(m.ones(4))),
  ("reshape", lambda m: m.ones(2, 3).reshape(4, 2)),
  ("reshape_two_infer", lambda m: m.ones(2, 3).reshape(-1, -1)),
  ("permute_count", lambda m: m.ones(2, 3).permute(0)),
  ("permute_repeat", lambda m: m.ones(2, 3).permute(0, 0)),
  ("gather_ndim", lambda m: m.ones(2, 3).gather(1, m.zeros(2, dtype=m.int64))),
  ("scatter_ndim", lambda m: m.ones(2, 3).scatter(1, m.zeros(2, dtype=m.int64), m.ones(2, 3))),
  ("scatter_larger_index", lambda m: m.ones(2, 3).scatter(1, m.zeros(3, 3, dtype=m.int64), m.ones(2, 3))),
  ("einsum_sizes", lambda m: m.einsum("ij,jk->ik", m.ones(2, 3), m.ones(4, 5))),
  ("einsum_operands", lambda m: m.einsum("ij,jk->ik", m.ones(2, 3))),
  ("einsum_rank", lambda m: m.einsum("ijk->i", m.ones(2, 3))),
  ("broadcast", lambda m: m.ones(2, 3) + m.ones(4)),
  ("expand", lambda m: m.ones(2, 3).expand(4, 3)),
  ("split_sizes", lambda m: m.ones(2, 6).split([1, 2], 1)),
  ("diagonal_same_dims", lambda m: m.ones(3, 3).diagonal(0, 0, 0)),
  ("tril_1d", lambda m: m.ones(3).tril()),
  ("item_many", lambda m: m.ones(2).item()),
]


def _pg_module(device: str) -> Any:
  """A stand-in for the torch module's spellings that the SHAPE_ERRORS cases use, making tensors on `device`."""
  from plugrad.dtype import dtypes
  class M:
    int64 = dtypes.int32  # torch's index dtype; any integer indexes here, and int32 exists on every device (WGSL lacks int64)
    ones, zeros = staticmethod(functools.partial(Tensor.ones, device=device)), staticmethod(functools.partial(Tensor.zeros, device=device))
    einsum = staticmethod(Tensor.einsum)
  return M


@pytest.mark.parametrize("name,fn", SHAPE_ERRORS, ids=[c[0] for c in SHAPE_ERRORS])
def test_shape_errors_are_runtime_errors(run_device, name, fn):
  torch = _torch()
  with pytest.raises(RuntimeError): fn(torch)
  with pytest.raises(ShapeError) as e: fn(_pg_module(run_device))
  assert isinstance(e.value, RuntimeError) and isinstance(e.value, ValueError)  # both styles of except catch it


def test_conv_and_cross_entropy_shape_errors(run_device):
  torch = _torch()
  F = torch.nn.functional
  for pg, pt in [(lambda: Tensor.ones(1, 3, 5, 5).conv2d(Tensor.ones(4, 2, 3, 3)), lambda: F.conv2d(torch.ones(1, 3, 5, 5), torch.ones(4, 2, 3, 3))),
                 (lambda: Tensor.ones(1, 3, 2, 2).conv2d(Tensor.ones(4, 3, 3, 3)), lambda: F.conv2d(torch.ones(1, 3, 2, 2), torch.ones(4, 3, 3, 3))),
                 (lambda: Tensor.ones(2, 3).cross_entropy(Tensor.ones(2, 4)), lambda: F.cross_entropy(torch.ones(2, 3), torch.ones(2, 4)))]:
    with pytest.raises(RuntimeError): pt()
    with pytest.raises(RuntimeError): pg()


@pytest.mark.parametrize("fn", [lambda m: m.ones(2, 3)[5], lambda m: m.ones(2, 3)[0, 3], lambda m: m.ones(2, 3)[0, 0, 0],
                                lambda m: m.ones(2, 3).sum(5), lambda m: m.ones(2, 3).transpose(0, 4), lambda m: m.ones(2, 3).permute(0, 5)],
                         ids=["row", "col", "too_many", "sum_dim", "transpose_dim", "permute_dim"])
def test_index_errors(run_device, fn):
  with pytest.raises(IndexError): fn(_torch())
  with pytest.raises(IndexError): fn(_pg_module(run_device))


# ---------------------------------------------------------------- extreme inputs: values and finite gradients

_F = lambda: _torch().nn.functional
BIG = np.array([-1e4, -1e3, -100, -88.7, -20, -1, -1e-3, 0, 1e-3, 1, 20, 88.7, 100, 1e3, 1e4], np.float32)
INF = np.array([-np.inf, -1e30, -1e10, 1e10, 1e30, np.inf], np.float32)
# (name, plugrad op, torch op, include ±inf/huge inputs)
EXTREME: list[tuple[str, Callable[[Any], Any], Callable[[Any], Any], bool]] = [
  ("sigmoid", lambda t: t.sigmoid(), lambda t: t.sigmoid(), True),
  ("tanh", lambda t: t.tanh(), lambda t: t.tanh(), True),
  ("gelu_tanh", lambda t: t.gelu(), lambda t: _F().gelu(t, approximate="tanh"), False),
  ("gelu_erf", lambda t: t.gelu(approximate="none"), lambda t: _F().gelu(t), False),
  ("erf", lambda t: t.erf(), lambda t: t.erf(), True),
  ("softplus", lambda t: t.softplus(), lambda t: _F().softplus(t), True),
  ("logsigmoid", lambda t: t.logsigmoid(), lambda t: _F().logsigmoid(t), True),
  ("silu", lambda t: t.silu(), lambda t: _F().silu(t), False),
  ("mish", lambda t: t.mish(), lambda t: _F().mish(t), False),
  ("elu", lambda t: t.elu(), lambda t: _F().elu(t), True),
  ("softsign", lambda t: t.softsign(), lambda t: _F().softsign(t), False),
  ("atan", lambda t: t.atan(), lambda t: t.atan(), True),
  ("asinh", lambda t: t.asinh(), lambda t: t.asinh(), True),
  ("abs", lambda t: t.abs(), lambda t: t.abs(), True),
  ("sign", lambda t: t.sign() * t, lambda t: t.sign() * t, False),
  ("log_softmax", lambda t: t.reshape(3, 5).log_softmax(1), lambda t: t.reshape(3, 5).log_softmax(1), False),
  ("softmax", lambda t: t.reshape(3, 5).softmax(0), lambda t: t.reshape(3, 5).softmax(0), False),
  ("logsumexp", lambda t: t.reshape(3, 5).logsumexp(1), lambda t: t.reshape(3, 5).logsumexp(1), False),
  ("logcumsumexp", lambda t: t.logcumsumexp(0), lambda t: t.logcumsumexp(0), False),
  ("logcumsumexp_2d", lambda t: t.reshape(3, 5).logcumsumexp(1), lambda t: t.reshape(3, 5).logcumsumexp(1), False),
]


@pytest.mark.parametrize("name,fn,tfn,with_inf", EXTREME, ids=[c[0] for c in EXTREME])
def test_extreme_inputs(run_device, name, fn, tfn, with_inf):
  """±1e3-scale inputs (and ±inf where PyTorch's gradient is a number) give PyTorch's values and finite gradients.
  The reference is PyTorch in float64 on the same float32 numbers (PyTorch's own float32 logcumsumexp gradient is off
  by 3e-4 at ±1e4, more than ours)."""
  torch = _torch()
  xs = [BIG] + ([np.resize(INF, BIG.shape)] if with_inf else [])
  for x in xs:
    w = RNG.uniform(0.5, 1.5, tuple(tfn(torch.tensor(x)).shape)).astype(np.float32)
    t, tt = Tensor(x, device=run_device, requires_grad=True), torch.tensor(x.astype(np.float64), requires_grad=True)
    out, want = fn(t), tfn(tt)
    np.testing.assert_allclose(out.numpy(), want.detach().numpy().astype(np.float32), rtol=1e-5, atol=1e-6, err_msg=f"{name} values at {x}")
    (out * Tensor(w, device=run_device)).sum().backward()
    (want * torch.tensor(w.astype(np.float64))).sum().backward()
    assert t.grad is not None
    assert np.isfinite(t.grad.numpy()).all() == np.isfinite(tt.grad.numpy()).all(), f"{name}: gradients {t.grad.numpy()} at {x}"
    np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy().astype(np.float32), rtol=1e-5, atol=1e-6, err_msg=f"{name} gradients at {x}")


# (name, plugrad op, torch op, inputs at the op's kinks): the gradient convention exactly at a boundary
KINKS = np.array([-7, -6, -3, -1, -0.5, 0, 0.5, 1, 3, 6, 7], np.float32)
BOUNDARY: list[tuple[str, Callable[[Any], Any], Callable[[Any], Any]]] = [
  ("relu", lambda t: t.relu(), lambda t: t.relu()),
  ("abs", lambda t: t.abs(), lambda t: t.abs()),
  ("clip", lambda t: t.clip(-1, 1), lambda t: t.clamp(-1, 1)),
  ("clip_min", lambda t: t.clip(-0.5, None), lambda t: t.clamp(-0.5, None)),
  ("clip_max", lambda t: t.clip(None, 3), lambda t: t.clamp(None, 3)),
  ("clip_empty_range", lambda t: t.clip(1, -1), lambda t: t.clamp(1, -1)),
  ("clamp_tensor", lambda t: t.clamp(t * 0 - 1, t * 0 + 3), lambda t: t.clamp(t * 0 - 1, t * 0 + 3)),
  ("maximum", lambda t: t.maximum(t.flip(0)), lambda t: t.maximum(t.flip(0))),
  ("minimum", lambda t: t.minimum(t.flip(0)), lambda t: t.minimum(t.flip(0))),
  ("maximum_scalar", lambda t: t.maximum(1.0), lambda t: t.maximum(t.new_tensor(1.0))),
  ("hardtanh", lambda t: t.hardtanh(), lambda t: _F().hardtanh(t)),
  ("relu6", lambda t: t.relu6(), lambda t: _F().relu6(t)),
  ("hardsigmoid", lambda t: t.hardsigmoid(), lambda t: _F().hardsigmoid(t)),
  ("hardswish", lambda t: t.hardswish(), lambda t: _F().hardswish(t)),
  ("leaky_relu", lambda t: t.leaky_relu(), lambda t: _F().leaky_relu(t)),
  ("elu", lambda t: t.elu(), lambda t: _F().elu(t)),
  ("celu", lambda t: t.celu(), lambda t: _F().celu(t)),
  ("selu", lambda t: t.selu(), lambda t: 1.0507 * _F().elu(t, 1.67326)),  # tinygrad's rounded constants (the defaults)
  ("sign", lambda t: t.sign(), lambda t: t.sign()),
]


@pytest.mark.parametrize("name,fn,tfn", BOUNDARY, ids=[c[0] for c in BOUNDARY])
def test_boundary_gradient_conventions(run_device, name, fn, tfn):
  """Values and gradients at the kinks of piecewise functions follow PyTorch: clamp passes the gradient at its bounds,
  hardtanh/relu6/hardsigmoid do not, relu and abs give 0 at 0, maximum/minimum share it at ties, leaky_relu and
  selu take the negative side at 0."""
  torch = _torch()
  for x in (KINKS, KINKS * 1e10):  # the second: large values, where relu(x) - relu(x - 6) would cancel
    t, tt = Tensor(x, device=run_device, requires_grad=True), torch.tensor(x, requires_grad=True)
    out, want = fn(t), tfn(tt)
    np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=1e-6, err_msg=f"{name} values")
    out.sum().backward()
    want.sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), tt.grad.numpy(), rtol=1e-6, err_msg=f"{name} gradients at {x}")


def test_special_values(run_device):
  """abs/sign of ±inf and clip of nan as PyTorch; sign(nan) is nan (numpy, tinygrad; PyTorch gives 0) and relu(nan)
  is 0 (tinygrad; PyTorch gives nan)."""
  torch = _torch()
  x = np.array([-np.inf, np.inf, np.nan, -0.0, 0.0], np.float32)
  np.testing.assert_array_equal(Tensor(x, device=run_device).abs().numpy(), torch.tensor(x).abs().numpy())
  np.testing.assert_array_equal(Tensor(x, device=run_device).sign().numpy(), np.sign(x))
  np.testing.assert_array_equal(Tensor(x, device=run_device).clip(-1, 1).numpy(), torch.tensor(x).clamp(-1, 1).numpy())
  np.testing.assert_array_equal(Tensor(x, device=run_device).relu().numpy(), [0, np.inf, 0, 0, 0])


# ---------------------------------------------------------------- API: meshgrid, pad, div, diagonal, flip, scatter, attention, slices

def _grads(fn: Callable[..., Any], tfn: Callable[..., Any], xs: list[np.ndarray], dev: str, rtol: float = 1e-5) -> None:
  """fn on plugrad tensors against tfn on torch tensors: values and the gradient of sum(out * w) for every float input."""
  torch = _torch()
  # int64 indices go in as int32 on a device without 64-bit integers (WGSL); PyTorch takes them as they are
  narrow = "int64" not in Device[dev].renderer.capabilities
  ts = [Tensor(x.astype(np.int32) if narrow and x.dtype == np.int64 else x, device=dev, requires_grad=x.dtype.kind == "f") for x in xs]
  ps = [torch.tensor(x, requires_grad=x.dtype.kind == "f") for x in xs]
  out, want = fn(*ts), tfn(*ps)
  assert out.shape == tuple(want.shape), f"shape {out.shape}, want {tuple(want.shape)}"
  np.testing.assert_allclose(out.numpy(), want.detach().numpy(), rtol=rtol, atol=1e-6)
  if not want.requires_grad: return
  w = RNG.uniform(-1, 1, tuple(want.shape)).astype(np.float32)
  (out * Tensor(w, device=dev)).sum().backward()
  (want * torch.tensor(w)).sum().backward()
  for t, p in zip(ts, ps):
    if p.requires_grad:
      assert t.grad is not None
      np.testing.assert_allclose(t.grad.numpy(), p.grad.numpy(), rtol=rtol, atol=1e-6)


def test_meshgrid(run_device):
  torch = _torch()
  a, b, c = _data((3,)), _data((4,)), _data((2,))
  for indexing in ("ij", "xy"):
    for xs in ([a, b], [a, b, c], [a], [np.float32(2.5), b], [a, np.zeros(0, np.float32)]):
      got = Tensor(xs[0], device=run_device).meshgrid(*[Tensor(x, device=run_device) for x in xs[1:]], indexing=indexing)
      want = torch.meshgrid(*[torch.tensor(x) for x in xs], indexing=indexing)
      assert len(got) == len(want)
      for g, wt in zip(got, want): np.testing.assert_array_equal(g.numpy(), wt.numpy())
  _grads(lambda x, y: (lambda g: g[0] * g[1])(x.meshgrid(y, indexing="xy")),
         lambda x, y: (lambda g: g[0] * g[1])(torch.meshgrid(x, y, indexing="xy")), [a, b], run_device)


def test_meshgrid_argument_checks(run_device):
  torch = _torch()
  a = Tensor(_data((3,)), device=run_device)
  with pytest.raises(RuntimeError, match="indexing"): torch.meshgrid(torch.ones(3), torch.ones(3), indexing="zz")
  with pytest.raises(ArgumentError, match="indexing must be 'ij' or 'xy', got 'zz'") as e: a.meshgrid(a, indexing="zz")
  assert isinstance(e.value, RuntimeError) and isinstance(e.value, ValueError)
  with pytest.raises(RuntimeError, match="0D or 1D"): torch.meshgrid(torch.ones(1, 3), torch.ones(3), indexing="ij")
  with pytest.raises(ShapeError, match=r"0-d or 1-d tensors, got shape \(1, 3\)") as s: a.reshape(1, 3).meshgrid(a)
  assert isinstance(s.value, RuntimeError)
  with pytest.raises(TypeError, match="meshgrid takes Tensors, got a list"): a.meshgrid([1, 2])
  # different dtypes are allowed (tinygrad; PyTorch raises): each grid keeps its own dtype
  g = a.meshgrid(Tensor([1, 2], device=run_device))
  assert (g[0].dtype, g[1].dtype) == (dtypes.float32, dtypes.int32)


PADS = [(3, 0), (4, 0), (0, 4), (2, 2), (3, 3), (1, 1, 2, 2), (1, 1, 3, 0), (-1, 2), (2, -1), (-2, 3), (3, -2), (-4, 1), (0, 0), (1, 0, 0, 2)]


@pytest.mark.parametrize("mode", ["reflect", "replicate", "circular", "constant"])
def test_pad_modes_edge_sizes(run_device, mode):
  """Every pad amount PyTorch takes gives its values and gradients (negative amounts: reflect and replicate crop the
  padded input, circular pads the cropped one, as PyTorch); every amount it refuses (reflect by >= the size, circular by
  more than the size) raises a ShapeError, a RuntimeError."""
  torch = _torch()
  x = _data((2, 3, 4))
  for p in PADS:
    pairs = [(p[i], p[i + 1]) for i in range(0, len(p), 2)]  # last axis first
    if mode == "circular" and any(max(b, a) > n - max(-b, 0) - max(-a, 0) for (b, a), n in zip(pairs, x.shape[::-1])):
      # wrapping more than the cropped axis holds: PyTorch reads uninitialized memory (or raises), plugrad raises
      with pytest.raises(ShapeError, match="circular padding"): Tensor(x, device=run_device).pad(p, mode=mode)
      continue
    try: torch.nn.functional.pad(torch.tensor(x), p, mode=mode)
    except RuntimeError:
      with pytest.raises(ShapeError, match=rf"{mode} padding"): Tensor(x, device=run_device).pad(p, mode=mode)
      continue
    _grads(lambda t, p=p: t.pad(p, mode=mode), lambda t, p=p: torch.nn.functional.pad(t, p, mode=mode), [x], run_device)


def test_pad_errors(run_device):
  t = Tensor(_data((2, 3)), device=run_device)
  with pytest.raises(ShapeError, match=r"reflect padding \(3, 0\) of axis 1 needs at most 2 for shape \(2, 3\)"): t.pad((3, 0), mode="reflect")
  with pytest.raises(ShapeError, match="circular padding"): t.pad((0, 4), mode="circular")
  with pytest.raises(ShapeError, match="replicate padding .* nonempty"): Tensor.ones(2, 0, device=run_device).pad((1, 0), mode="replicate")
  with pytest.raises(ValueError, match="mode must be one of"): t.pad((1, 1), mode="wrap")


def test_div_rounding_mode_errors(run_device):
  torch = _torch()
  with pytest.raises(RuntimeError, match="rounding_mode"): torch.ones(2).div(torch.ones(2), rounding_mode="round")
  for bad in ("round", "FLOOR", ""):
    with pytest.raises(ArgumentError, match=f"rounding_mode must be None, 'trunc' or 'floor', got '{bad}'") as e:
      Tensor.ones(2, device=run_device).div(2, rounding_mode=bad)
    assert isinstance(e.value, RuntimeError)
  a, b = np.array([7, -7, 7, -7], np.int32), np.array([2, 2, -2, -2], np.int32)
  for mode in ("trunc", "floor", None):
    np.testing.assert_allclose(Tensor(a, device=run_device).div(Tensor(b, device=run_device), rounding_mode=mode).numpy(),
                               torch.tensor(a).div(torch.tensor(b), rounding_mode=mode).numpy())


@pytest.mark.parametrize("dims", [(0, 1), (1, 0), (0, 2), (2, 0), (-1, 1), (1, -3)])
def test_diagonal(run_device, dims):
  torch = _torch()
  x = _data((3, 4, 5))
  for off in (-5, -3, -1, 0, 1, 2, 4, 6):
    _grads(lambda t, off=off: t.diagonal(off, *dims), lambda t, off=off: t.diagonal(off, *dims), [x], run_device)
  with pytest.raises(RuntimeError): torch.ones(3, 3).diagonal(0, 1, -1)
  with pytest.raises(ShapeError, match="must differ"): Tensor.ones(3, 3, device=run_device).diagonal(0, 1, -1)


def test_flip(run_device):
  torch = _torch()
  x = _data((2, 3, 4))
  for axes in ((0,), (2, 0), (-1,), (), (0, 1, 2)):
    _grads(lambda t, axes=axes: t.flip(axes), lambda t, axes=axes: t.flip(axes), [x], run_device)
  for axes in ((0, 0), (1, -2), (2, 0, 2)):
    with pytest.raises(RuntimeError, match="multiple times"): torch.tensor(x).flip(axes)
    with pytest.raises(ShapeError, match="repeats an axis") as e: Tensor(x, device=run_device).flip(axes)
    assert isinstance(e.value, RuntimeError)


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce_modes(run_device, reduce, include_self):
  """Every reduce PyTorch takes, values and gradients, for floats and ints."""
  base, src = RNG.uniform(0.5, 2, (3, 5)).astype(np.float32), RNG.uniform(0.5, 2, (2, 5)).astype(np.float32)
  idx = np.array([[0, 1, 2, 0, 0], [2, 0, 0, 1, 2]], np.int64)
  _grads(lambda b, s, i: b.scatter_reduce(0, i, s, reduce, include_self=include_self),
         lambda b, s, i: b.scatter_reduce(0, i, s, reduce, include_self=include_self), [base, src, idx], run_device)
  ib, isrc = RNG.integers(-9, 9, (3, 5)).astype(np.int32), RNG.integers(-9, 9, (2, 5)).astype(np.int32)
  _grads(lambda b, s, i: b.scatter_reduce(0, i, s, reduce, include_self=include_self),
         lambda b, s, i: b.scatter_reduce(0, i, s, reduce, include_self=include_self), [ib, isrc, idx], run_device)


def test_scatter_modes(run_device):
  torch = _torch()
  base, src = _data((3, 5)), _data((2, 5))
  idx = np.array([[0, 1, 2, 0, 0], [2, 0, 0, 1, 2]], np.int64)
  pi = Tensor(idx if "int64" in Device[run_device].renderer.capabilities else idx.astype(np.int32), device=run_device)
  pb, ps = Tensor(base, device=run_device), Tensor(src, device=run_device)
  for reduce in (None, "add", "multiply"):
    kw = {"reduce": reduce} if reduce else {}
    np.testing.assert_allclose(pb.scatter(0, pi, ps, **kw).numpy(), torch.tensor(base).scatter(0, torch.tensor(idx), torch.tensor(src), **kw).numpy(),
                               rtol=1e-6)
    np.testing.assert_allclose(pb.scatter(0, pi, 2.5, **kw).numpy(), torch.tensor(base).scatter(0, torch.tensor(idx), 2.5, **kw).numpy(), rtol=1e-6)
  # gradients with distinct targets (with a repeated one, PyTorch gives every writer the gradient, plugrad the last: docs/tensor.md)
  _grads(lambda b, s, i: b.scatter(0, i, s), lambda b, s, i: b.scatter(0, i, s), [base, src[:, :3], np.array([[0, 1, 2], [2, 0, 1]])], run_device)
  t, i = Tensor(base, device=run_device), pi
  with pytest.raises(RuntimeError, match="reduce argument"): torch.tensor(base).scatter(0, torch.tensor(idx), torch.tensor(src), reduce="max")
  with pytest.raises(ArgumentError, match="scatter: reduce must be None, 'add' or 'multiply', got 'max'"): t.scatter(0, i, t, reduce="max")
  with pytest.raises(RuntimeError, match="reduce"): torch.tensor(base).scatter_reduce(0, torch.tensor(idx), torch.tensor(src), "foo")
  with pytest.raises(ArgumentError, match="scatter_reduce: reduce must be one of .* got 'foo'"): t.scatter_reduce(0, i, t, "foo")
  # PyTorch's forward also takes 'max'/'min' for amax/amin (its backward does not); so do we, with gradients
  for alias in ("max", "min"):
    np.testing.assert_array_equal(t.scatter_reduce(0, i, Tensor(src, device=run_device), alias).numpy(),
                                  torch.tensor(base).scatter_reduce(0, torch.tensor(idx), torch.tensor(src), alias).numpy())


def test_attention_causal_and_mask(run_device):
  """is_causal gives PyTorch's top-left causal mask (also when L != S); is_causal with attn_mask raises, as in PyTorch
  and tinygrad 0.14."""
  torch = _torch()
  F = torch.nn.functional
  q, k, v = _data((2, 3, 4)), _data((2, 5, 4)), _data((2, 5, 6))
  _grads(lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True),
         lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), [q, k, v], run_device, rtol=1e-4)
  mask = RNG.uniform(0, 1, (3, 5)) > 0.3
  mask[:, 0] = True
  _grads(lambda q, k, v, m: q.scaled_dot_product_attention(k, v, attn_mask=m),
         lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m), [q, k, v, mask], run_device, rtol=1e-4)
  with pytest.raises(RuntimeError, match="attn_mask"):
    F.scaled_dot_product_attention(torch.tensor(q), torch.tensor(k), torch.tensor(v), attn_mask=torch.tensor(mask), is_causal=True)
  tq, tk, tv = (Tensor(a, device=run_device) for a in (q, k, v))
  with pytest.raises(ArgumentError, match="attn_mask .* is_causal") as e:
    tq.scaled_dot_product_attention(tk, tv, Tensor(mask, device=run_device), is_causal=True)
  assert isinstance(e.value, RuntimeError)


SLICES = [np.s_[::-1], np.s_[5:1:-2], np.s_[-1:-10:-3], np.s_[::-3], np.s_[100::-1], np.s_[-100::-1], np.s_[:-100:-1], np.s_[10:20],
          np.s_[-100:2], np.s_[2:100], np.s_[8:2], np.s_[3::4], np.s_[-3:], np.s_[:0], np.s_[7:7:-1]]


@pytest.mark.parametrize("sl", SLICES, ids=[str(s) for s in SLICES])
def test_slices(run_device, sl):
  """Out-of-range slices clamp like Python's (as PyTorch); negative steps work as in numpy and tinygrad (PyTorch
  raises for them), with gradients; `__setitem__` writes through them."""
  x = _data((10, 3))
  t = Tensor(x, device=run_device, requires_grad=True)
  out = t[sl]
  np.testing.assert_array_equal(out.numpy(), x[sl])
  w = _data(x[sl].shape)
  (out * Tensor(w, device=run_device)).sum().backward()
  want = np.zeros_like(x)
  want[sl] += w
  np.testing.assert_array_equal(t.grad.numpy(), want)
  if sl.step is None or sl.step > 0:  # PyTorch agrees (it has no negative steps)
    torch = _torch()
    np.testing.assert_array_equal(out.numpy(), torch.tensor(x)[sl].numpy())
  y = Tensor(x, device=run_device).contiguous().realize()
  y[sl] = Tensor(w, device=run_device)
  expect = x.copy()
  expect[sl] = w
  np.testing.assert_array_equal(y.numpy(), expect)
  np.testing.assert_array_equal(Tensor(x, device=run_device)[sl, ::-1].numpy(), x[sl, ::-1])


def test_pow_special_cases_follow_c(run_device):
  """Every device's float pow gives C's answers (devices whose pow is undefined below zero get them from the shared
  pass): negative bases to integral powers keep their sign, fractional ones give nan, 0 to a negative power inf,
  x**0 and 1**y are 1 with nan operands too. (-0.0 to an odd negative power: inf of either sign.)"""
  a = np.array([-2, -1.5, -1, 0, 1, 2, 0.5, np.nan, np.inf, -np.inf], np.float32)
  b = np.array([-3, -2, -1, -0.5, 0, 0.5, 1, 2, 3, np.nan, np.inf], np.float32)
  aa, bb = np.meshgrid(a, b, indexing="ij")
  got = (Tensor(aa, device=run_device) ** Tensor(bb, device=run_device)).numpy()
  with np.errstate(all="ignore"): want = np.power(aa, bb)
  np.testing.assert_allclose(got, want, rtol=3e-6, err_msg=f"bases {a}, exponents {b}")
