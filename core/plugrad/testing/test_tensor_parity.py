"""Conformance: behaviour a user porting PyTorch code meets, compared with PyTorch where it is installed (issue 21).

* kernels whose inputs include a buffer that simplification stops reading (a pad gate that is always false, `x ^ x`,
  a one-element sort) launch with the buffers they read;
* gradients through empty tensors, empty selections and comparisons are zeros of the input's shape;
* shape mismatches raise `ShapeError`, which is both a ValueError and PyTorch's RuntimeError.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from plugrad.tensor.tensor import Tensor
from plugrad.uop.shape import ShapeError

pytestmark = [pytest.mark.plugrad_conformance, pytest.mark.filterwarnings("ignore:.*degrees of freedom")]
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


def _pg_module() -> Any:
  """A stand-in for the torch module's spellings that the SHAPE_ERRORS cases use."""
  from plugrad.dtype import dtypes
  class M:
    int64 = dtypes.int64
    ones, zeros, einsum = staticmethod(Tensor.ones), staticmethod(Tensor.zeros), staticmethod(Tensor.einsum)
  return M


@pytest.mark.parametrize("name,fn", SHAPE_ERRORS, ids=[c[0] for c in SHAPE_ERRORS])
def test_shape_errors_are_runtime_errors(run_device, name, fn):
  torch = _torch()
  with pytest.raises(RuntimeError): fn(torch)
  with pytest.raises(ShapeError) as e: fn(_pg_module())
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
  with pytest.raises(IndexError): fn(_pg_module())
