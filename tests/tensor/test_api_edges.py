"""Edges of the Tensor API (issue 32, item 5), each checked against PyTorch: its values and gradients where the call is
valid, the type of its exception where it is not. Where PyTorch is missing the comparisons skip, and the error cases
still check plugrad's own typed exception and message."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from plugrad import Tensor, dtypes
from plugrad.tensor.helpers import ArgumentError, DTypeError, DTypeNotImplementedError, IndexDTypeError, UnsupportedModeError
from plugrad.tensor.indexing import IndexShapeError
from plugrad.uop.shape import ShapeError

try:
  import torch
except ImportError:  # the comparisons skip; plugrad's own checks still run
  torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")
TORCH_DTYPES = {} if torch is None else {dtypes.bool: torch.bool, dtypes.int8: torch.int8, dtypes.int16: torch.int16, dtypes.int32: torch.int32,
  dtypes.int64: torch.int64, dtypes.uint8: torch.uint8, dtypes.float16: torch.float16, dtypes.bfloat16: torch.bfloat16,
  dtypes.float32: torch.float32, dtypes.float64: torch.float64}


def close(ours: Tensor, theirs: Any, atol: float = 1e-6) -> None:
  want = theirs.detach()
  assert TORCH_DTYPES[ours.dtype] == want.dtype, f"dtype {ours.dtype}, PyTorch {want.dtype}"
  assert ours.shape == tuple(want.shape), f"shape {ours.shape}, PyTorch {tuple(want.shape)}"
  a = ours.float().numpy() if ours.dtype is dtypes.bfloat16 else ours.numpy()  # numpy has no bfloat16
  b = want.float().numpy() if want.dtype == torch.bfloat16 else want.numpy()
  np.testing.assert_allclose(a, b, atol=atol, rtol=1e-6, equal_nan=True)


# ---------------------------------------------------------------- errors: plugrad's type and message, PyTorch's type

ERRORS: list[tuple[str, Callable[[], Any], Callable[[], Any] | None, type[Exception], str]] = [
  # clip/clamp with no bound
  ("clip_none", lambda: Tensor([1.0]).clip(), lambda: torch.clamp(torch.tensor([1.0])), ArgumentError, r"clip needs at least one of min_ and max_"),
  ("clamp_none", lambda: Tensor([1.0]).clamp(None, None), lambda: torch.tensor([1.0]).clamp(None, None), ArgumentError, r"at least one"),
  # cat/stack of what cannot be joined
  ("cat_0d", lambda: Tensor.cat([Tensor(1.0), Tensor(2.0)]), lambda: torch.cat([torch.tensor(1.0), torch.tensor(2.0)]), ShapeError,
   r"zero-dimensional tensor \(at position 0\) cannot be concatenated"),
  ("cat_1d_0d", lambda: Tensor([1.0]).cat(Tensor(2.0)), lambda: torch.cat([torch.tensor([1.0]), torch.tensor(2.0)]), ShapeError,
   r"zero-dimensional tensor \(at position 1\)"),
  ("cat_empty", lambda: Tensor.cat([]), lambda: torch.cat([]), ArgumentError, r"cat needs a non-empty list of tensors"),
  ("stack_empty", lambda: Tensor.stack(()), lambda: torch.stack(()), ArgumentError, r"stack needs a non-empty list of tensors"),
  ("cat_not_tensor", lambda: Tensor.cat([Tensor([1.0]), 2]), lambda: torch.cat([torch.tensor([1.0]), 2]), TypeError,
   r"cat: expected a Tensor as element 1, got int"),
  ("stack_not_tensor", lambda: Tensor.stack([[1.0], Tensor([1.0])]), lambda: torch.stack([[1.0], torch.tensor([1.0])]), TypeError,
   r"stack: expected a Tensor as element 0, got list"),
  ("stack_0d_dim", lambda: Tensor.stack([Tensor(1.0), Tensor(2.0)], dim=1), lambda: torch.stack([torch.tensor(1.0)] * 2, dim=1), IndexError,
   r"dimension 1 is out of range"),
  # shifts and bitwise ops of non-integer tensors
  ("lshift_float", lambda: Tensor([1.5]) << 1, lambda: torch.tensor([1.5]) << 1, DTypeNotImplementedError,
   r"lshift needs integer tensors, got dtypes.float32"),
  ("rshift_float", lambda: Tensor([1.5]).rshift(1), lambda: torch.tensor([1.5]) >> 1, DTypeNotImplementedError, r"rshift needs integer tensors"),
  ("rlshift_float", lambda: 1 << Tensor([1.5]), lambda: 1 << torch.tensor([1.5]), DTypeNotImplementedError, r"lshift needs integer tensors"),
  ("lshift_by_float", lambda: Tensor([1]) << 1.5, lambda: torch.tensor([1]) << 1.5, DTypeNotImplementedError, r"lshift needs integer tensors"),
  ("lshift_by_float_tensor", lambda: Tensor([1]) << Tensor([1.0]), lambda: torch.tensor([1]) << torch.tensor([1.0]), DTypeNotImplementedError,
   r"lshift needs integer tensors"),
  ("lshift_bools", lambda: Tensor([True]) << Tensor([True]), lambda: torch.tensor([True]) << torch.tensor([True]), DTypeNotImplementedError,
   r"lshift needs integer tensors, got dtypes.bool"),
  ("rshift_half", lambda: Tensor([2.0], dtype=dtypes.float16) >> 1, lambda: torch.tensor([2.0], dtype=torch.float16) >> 1, DTypeNotImplementedError,
   r"got dtypes.float16"),
  ("and_float", lambda: Tensor([1.5]) & 1, lambda: torch.tensor([1.5]) & 1, DTypeNotImplementedError, r"bitwise_and needs integer or bool tensors"),
  ("xor_float", lambda: Tensor([1.5]).bitwise_xor(1), lambda: torch.tensor([1.5]).bitwise_xor(1), DTypeNotImplementedError, r"bitwise_xor"),
  ("invert_float", lambda: ~Tensor([1.5]), lambda: ~torch.tensor([1.5]), DTypeNotImplementedError, r"bitwise_not needs integer or bool tensors"),
  # scatter/scatter_reduce with a src of another dtype
  ("scatter_int_src", lambda: Tensor.zeros(3, 3).scatter(0, Tensor([[0, 1, 2]]), Tensor([[1, 2, 3]])),
   lambda: torch.zeros(3, 3).scatter(0, torch.tensor([[0, 1, 2]]), torch.tensor([[1, 2, 3]])), DTypeError,
   r"scatter: src dtype dtypes.int32 differs from self's dtypes.float32"),
  ("scatter_float_src_int_self", lambda: Tensor.zeros(3, 3, dtype=dtypes.int32).scatter(0, Tensor([[0, 1, 2]]), Tensor([[1.5, 2, 3]])),
   lambda: torch.zeros(3, 3, dtype=torch.int32).scatter(0, torch.tensor([[0, 1, 2]]), torch.tensor([[1.5, 2, 3]])), DTypeError,
   r"src dtype dtypes.float32 differs from self's dtypes.int32"),
  ("scatter_f64_src", lambda: Tensor.zeros(3).scatter(0, Tensor([0]), Tensor(np.array([1.0]))),
   lambda: torch.zeros(3).scatter(0, torch.tensor([0]), torch.tensor([1.0], dtype=torch.float64)), DTypeError, r"dtypes.float64 differs"),
  ("scatter_add_int_src", lambda: Tensor.zeros(3).scatter(0, Tensor([0]), Tensor([1]), reduce="add"),
   lambda: torch.zeros(3).scatter(0, torch.tensor([0]), torch.tensor([1]), reduce="add"), DTypeError, r"src dtype dtypes.int32 differs"),
  ("scatter_reduce_int_src", lambda: Tensor.zeros(3).scatter_reduce(0, Tensor([0, 0]), Tensor([1, 2]), "sum"),
   lambda: torch.zeros(3).scatter_reduce(0, torch.tensor([0, 0]), torch.tensor([1, 2]), "sum"), DTypeError,
   r"scatter_reduce: src dtype dtypes.int32 differs from self's dtypes.float32"),
  ("scatter_reduce_amax_half_src", lambda: Tensor.zeros(3).scatter_reduce(0, Tensor([1]), Tensor([1.0], dtype=dtypes.float16), "amax"),
   lambda: torch.zeros(3).scatter_reduce(0, torch.tensor([1]), torch.tensor([1.0], dtype=torch.float16), "amax"), DTypeError,
   r"dtypes.float16 differs"),
  # out-of-range and ill-typed indices
  ("index_oob", lambda: Tensor.arange(10)[10], lambda: torch.arange(10)[10], IndexError,
   r"index 10 is out of bounds for dimension 0 with size 10 \(shape \(10,\)\)"),
  ("index_oob_neg", lambda: Tensor.arange(10)[-11], lambda: torch.arange(10)[-11], IndexError,
   r"index -11 is out of bounds for dimension 0 with size 10"),
  ("index_oob_dim1", lambda: Tensor.zeros(3, 4)[0, 4], lambda: torch.zeros(3, 4)[0, 4], IndexError,
   r"index 4 is out of bounds for dimension 1 with size 4"),
  ("list_oob", lambda: Tensor.arange(10)[[1, 10]], lambda: torch.arange(10)[[1, 10]], IndexError, r"index 10 is out of bounds for dimension 0"),
  ("list_oob_dim1", lambda: Tensor.zeros(3, 4)[:, [0, 4]], lambda: torch.zeros(3, 4)[:, [0, 4]], IndexError, r"index 4 is out of bounds"),
  ("fancy_broadcast", lambda: Tensor.zeros(3, 4)[[0, 1], [0, 1, 2]], lambda: torch.zeros(3, 4)[[0, 1], [0, 1, 2]], IndexShapeError,
   r"shape mismatch: indexing tensors could not be broadcast together with shapes \(2,\), \(3,\)"),
  ("fancy_broadcast_tensors", lambda: Tensor.zeros(3, 4)[Tensor([0, 1]), Tensor([0, 1, 2])],
   lambda: torch.zeros(3, 4)[torch.tensor([0, 1]), torch.tensor([0, 1, 2])], IndexShapeError, r"with shapes \(2,\), \(3,\)"),
  ("float_index_tensor", lambda: Tensor.arange(10)[Tensor([1.5])], lambda: torch.arange(10)[torch.tensor([1.5])], IndexDTypeError,
   r"index tensors must have an integer dtype, got dtypes.float32"),
  ("float_index", lambda: Tensor.arange(10)[1.5], lambda: torch.arange(10)[1.5], IndexError, r"indices of type float are not supported"),
  ("too_many", lambda: Tensor.arange(10)[1, 2], lambda: torch.arange(10)[1, 2], IndexError, r"too many indices for a tensor of shape \(10,\)"),
  ("index_0d", lambda: Tensor(1.0)[0], lambda: torch.tensor(1.0)[0], IndexError, r"too many indices for a tensor of shape \(\)"),
  ("step_zero", lambda: Tensor.arange(10)[::0], lambda: torch.arange(10)[::0], ValueError, r"step cannot be zero"),
  ("setitem_oob", lambda: Tensor.zeros(3, 4).contiguous().__setitem__(3, 1.0), lambda: torch.zeros(3, 4).__setitem__(3, 1.0), IndexError,
   r"index 3 is out of bounds for dimension 0 with size 3"),
  ("setitem_list_oob", lambda: Tensor.zeros(3, 4).contiguous().__setitem__(([0, 3],), 1.0), lambda: torch.zeros(3, 4).__setitem__(([0, 3],), 1.0),
   IndexError, r"index 3 is out of bounds"),
  # linspace
  ("linspace_negative", lambda: Tensor.linspace(0, 1, -1), lambda: torch.linspace(0, 1, -1), ArgumentError,
   r"linspace: steps must be an int >= 0, got -1"),
  ("linspace_float_steps", lambda: Tensor.linspace(0, 1, 2.5), lambda: torch.linspace(0, 1, 2.5), TypeError, r"steps must be an int >= 0, got 2.5"),
  ("linspace_bool_steps", lambda: Tensor.linspace(0, 1, True), lambda: torch.linspace(0, 1, True), TypeError, r"got True"),
  ("linspace_str_steps", lambda: Tensor.linspace(0, 1, "3"), lambda: torch.linspace(0, 1, "3"), TypeError, r"got '3'"),
  ("linspace_bool", lambda: Tensor.linspace(0, 1, 3, dtype=dtypes.bool), lambda: torch.linspace(0, 1, 3, dtype=torch.bool), DTypeNotImplementedError,
   r"linspace is not defined for dtypes.bool"),
  # unfold
  ("unfold_too_big", lambda: Tensor.arange(10.0).unfold(0, 11, 1), lambda: torch.arange(10.0).unfold(0, 11, 1), ShapeError,
   r"unfold: size 11 is larger than dim 0 of shape \(10,\)"),
  ("unfold_step_zero", lambda: Tensor.arange(10.0).unfold(0, 3, 0), lambda: torch.arange(10.0).unfold(0, 3, 0), ArgumentError,
   r"unfold: size must be >= 0 and step > 0, got size=3, step=0"),
  ("unfold_step_negative", lambda: Tensor.arange(10.0).unfold(0, 3, -1), lambda: torch.arange(10.0).unfold(0, 3, -1), ArgumentError, r"step=-1"),
  ("unfold_size_negative", lambda: Tensor.arange(10.0).unfold(0, -1, 1), lambda: torch.arange(10.0).unfold(0, -1, 1), ArgumentError, r"size=-1"),
  ("unfold_dim", lambda: Tensor.arange(10.0).unfold(1, 3, 1), lambda: torch.arange(10.0).unfold(1, 3, 1), IndexError,
   r"unfold: dim 1 is out of range"),
  ("unfold_float_size", lambda: Tensor.arange(10.0).unfold(0, 2.5, 1), lambda: torch.arange(10.0).unfold(0, 2.5, 1), TypeError,
   r"unfold: size and step must be ints, got size=2.5"),
  ("unfold_0d_too_big", lambda: Tensor(1.0).unfold(0, 2, 1), lambda: torch.tensor(1.0).unfold(0, 2, 1), ShapeError, r"size 2 is larger"),
  ("unfold_0d_dim", lambda: Tensor(1.0).unfold(1, 1, 1), lambda: torch.tensor(1.0).unfold(1, 1, 1), IndexError, r"dim 1 is out of range"),
  # pad
  ("pad_unknown_mode", lambda: Tensor.ones(1, 4).pad((1, 1), mode="foo"), lambda: torch.nn.functional.pad(torch.ones(1, 4), (1, 1), mode="foo"),
   UnsupportedModeError, r"pad: mode must be one of \('constant', 'reflect', 'replicate', 'circular'\), got 'foo'"),
  ("pad_mode_zeros", lambda: Tensor.ones(1, 4).pad((1, 1), mode="zeros"), lambda: torch.nn.functional.pad(torch.ones(1, 4), (1, 1), mode="zeros"),
   UnsupportedModeError, r"got 'zeros'"),
  ("pad_mode_case", lambda: Tensor.ones(1, 4).pad((1, 1), mode="Reflect"), lambda: torch.nn.functional.pad(torch.ones(1, 4), (1, 1), mode="Reflect"),
   UnsupportedModeError, r"got 'Reflect'"),
  ("pad_reflect_value", lambda: Tensor.ones(1, 4).pad((1, 1), mode="reflect", value=1.0),
   lambda: torch.nn.functional.pad(torch.ones(1, 4), (1, 1), mode="reflect", value=1.0), ArgumentError,
   r"pad: mode 'reflect' takes no value, got value=1.0"),
]


@pytest.mark.parametrize("name,ours,theirs,kind,match", ERRORS, ids=[e[0] for e in ERRORS])
def test_errors(name, ours, theirs, kind, match):
  with pytest.raises(kind, match=match) as ours_info: ours()
  if torch is None: return
  with pytest.raises(Exception) as theirs_info: theirs()
  assert isinstance(ours_info.value, type(theirs_info.value)), \
    f"plugrad raised {type(ours_info.value).__mro__}, PyTorch {type(theirs_info.value).__name__}: {theirs_info.value}"


def test_error_classes():
  # each typed error is also what code written for PyTorch (or plain Python) catches
  assert issubclass(DTypeNotImplementedError, TypeError) and issubclass(DTypeNotImplementedError, NotImplementedError)
  assert issubclass(DTypeError, TypeError) and issubclass(DTypeError, RuntimeError)
  assert issubclass(IndexDTypeError, IndexError) and issubclass(IndexDTypeError, TypeError)
  assert issubclass(IndexShapeError, IndexError) and issubclass(IndexShapeError, ShapeError)
  assert issubclass(UnsupportedModeError, ValueError) and issubclass(UnsupportedModeError, NotImplementedError)


# ---------------------------------------------------------------- gradients through non-differentiable ops

A, B = [1.0, -2.0, 3.0, 0.5, -1.0, 2.0], [2.0, -2.0, 1.0, 0.5, 1.0, 5.0]

# f(a, b, m): m is the Tensor class or the torch module, for the few calls whose spelling differs
GRAPHS: dict[str, Callable[[Any, Any, Any], Any]] = {
  "lt": lambda a, b, m: (a * b + (a < b).float() * a).sum(),
  "ne": lambda a, b, m: ((a != b).float() * a * b).sum() + (a != b).sum(),
  "eq_where": lambda a, b, m: m.where(a == b, a, b * 2).sum(),
  "bool_mask_mul": lambda a, b, m: (a * (a < b)).sum(),
  "compare_only": lambda a, b, m: (a * (a < 0).float()).sum() + (b > 0).float().sum(),  # b joins only through a comparison: zeros
  "ge_le": lambda a, b, m: ((a >= b).float() * b + (a <= 0).float() * a).sum(),
  "logical_not": lambda a, b, m: (a * m.logical_not(a < b).float()).sum(),
  "and_or": lambda a, b, m: (a * ((a < b) & (a > 0)).float() + b * ((a < b) | (b < 0)).float()).sum(),
  "isnan_isfinite": lambda a, b, m: (a * m.isnan(a).logical_not().float() + m.isfinite(b).float()).sum(),
  "rounding": lambda a, b, m: (a.floor() * b + a.ceil() + a.trunc() * a + a.round()).sum(),
  "sign_abs": lambda a, b, m: (a.sign() * b + a.abs()).sum(),
  "argmax_index": lambda a, b, m: a[a.argmax()] * b.sum(),
  "int_cast": lambda a, b, m: (a.int().float() * b + a).sum(),
  "max_eq": lambda a, b, m: ((a == a.max()).float() * b).sum() + a.sum(),
  "sort_indices": lambda a, b, m: (b[(m.sort(a) if m is torch else a.sort())[1]] * a).sum(),
  "nested_where": lambda a, b, m: m.where(a > 0, m.where(b > 1, a * b, a), -a).sum(),
  "mod": lambda a, b, m: ((a % 2) * b).sum(),
  "detach_compare": lambda a, b, m: (a.detach() * b + a * (a.detach() < b)).sum(),
}


@needs_torch
@pytest.mark.parametrize("name", list(GRAPHS))
def test_gradient_through_non_differentiable_ops(name):
  f = GRAPHS[name]
  a, b = Tensor(A, requires_grad=True), Tensor(B, requires_grad=True)
  y = f(a, b, Tensor)
  ga, gb = y.gradient(a, b)
  ta, tb = torch.tensor(A, requires_grad=True), torch.tensor(B, requires_grad=True)
  ty = f(ta, tb, torch)
  tga, tgb = torch.autograd.grad(ty, (ta, tb), allow_unused=True, materialize_grads=True)
  close(y, ty); close(ga, tga); close(gb, tgb)
  # backward() accumulates the same into .grad
  f(a, b, Tensor).backward()
  close(a.grad, tga); close(b.grad, tgb)


# ---------------------------------------------------------------- sigmoid at extreme inputs

EXTREMES = [-1e4, -1e3, -100.0, -88.0, -20.0, 0.0, 20.0, 88.0, 100.0, 1e3, 1e4, float("inf"), float("-inf"), float("nan")]


@needs_torch
@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64], ids=str)
def test_sigmoid_extremes(dt):
  x = Tensor(EXTREMES, dtype=dt, requires_grad=True)
  y = x.sigmoid()
  y.sum().backward()
  tx = torch.tensor(EXTREMES, dtype=TORCH_DTYPES[dt], requires_grad=True)
  ty = tx.sigmoid()
  ty.sum().backward()
  assert not np.isnan(y.float().numpy()[:-1]).any() and not np.isnan(x.grad.float().numpy()[:-1]).any()
  close(y, ty, atol=1e-3 if dt in (dtypes.float16, dtypes.bfloat16) else 1e-7)
  close(x.grad, tx.grad, atol=1e-3 if dt in (dtypes.float16, dtypes.bfloat16) else 1e-7)


@needs_torch
def test_sigmoid_of_integers():
  close(Tensor([-1000, 0, 1000]).sigmoid(), torch.tensor([-1000, 0, 1000]).sigmoid())


# ---------------------------------------------------------------- clip/clamp with one bound

X = [-3.0, -1.0, 0.0, 0.5, 1.0, 2.0, float("inf"), float("-inf")]
CLIPS: list[tuple[str, Callable[[Tensor], Tensor], Callable[[Any], Any]]] = [
  ("min_only", lambda x: x.clip(0), lambda x: x.clamp(0)),
  ("max_only", lambda x: x.clip(None, 1), lambda x: x.clamp(None, 1)),
  ("max_keyword", lambda x: x.clip(max_=1), lambda x: x.clamp(max=1)),
  ("min_keyword", lambda x: x.clamp(min_=-1), lambda x: x.clamp(min=-1)),
  ("both", lambda x: x.clamp(-1, 1), lambda x: x.clamp(-1, 1)),
  ("min_above_max", lambda x: x.clip(1, -1), lambda x: x.clamp(1, -1)),
  ("tensor_min", lambda x: x.clip(Tensor([0.0] * 8)), lambda x: x.clamp(torch.zeros(8))),
  ("tensor_max", lambda x: x.clip(None, Tensor([1.0] * 8)), lambda x: x.clamp(None, torch.ones(8))),
]


@needs_torch
@pytest.mark.parametrize("name,ours,theirs", CLIPS, ids=[c[0] for c in CLIPS])
def test_clip_bounds(name, ours, theirs):
  x = Tensor(X, requires_grad=True)
  y = ours(x)
  y.sum().backward()
  tx = torch.tensor(X, requires_grad=True)
  ty = theirs(tx)
  ty.sum().backward()
  close(y, ty); close(x.grad, tx.grad)


@needs_torch
@pytest.mark.parametrize("lo,hi", [(2.5, None), (None, 2.5), (0.5, 2.5), (2, None)])
def test_clip_integer_tensor(lo, hi):
  # a float bound makes the result float, as in PyTorch; an int bound keeps the int dtype
  close(Tensor([1, 5, -3]).clip(lo, hi), torch.tensor([1, 5, -3], dtype=torch.int32).clamp(lo, hi))


# ---------------------------------------------------------------- cat/stack: 0-d tensors, list and tuple arguments

@needs_torch
def test_stack_0d():
  close(Tensor.stack([Tensor(1.0), Tensor(2.0)]), torch.stack([torch.tensor(1.0), torch.tensor(2.0)]))
  close(Tensor.stack(Tensor(1.0), Tensor(2.0), dim=-1), torch.stack([torch.tensor(1.0), torch.tensor(2.0)], dim=-1))
  close(Tensor(3).stack(Tensor(4)), torch.stack([torch.tensor(3, dtype=torch.int32), torch.tensor(4, dtype=torch.int32)]))


def arrays(*shapes: tuple[int, ...]) -> list[np.ndarray]:
  rng = np.random.default_rng(0)
  return [rng.standard_normal(s).astype(np.float32) for s in shapes]


@needs_torch
@pytest.mark.parametrize("spelling", ["list", "tuple", "method_list", "varargs"])
@pytest.mark.parametrize("op,shapes,dim", [("cat", [(2, 3), (1, 3), (4, 3)], 0), ("cat", [(2, 1), (2, 3)], -1), ("stack", [(2, 3)] * 3, 1),
                                           ("stack", [(2,)] * 2, -1), ("cat", [(2, 3)], 0), ("stack", [(3,)], 0)])
def test_cat_stack_sequences(spelling, op, shapes, dim):
  xs = arrays(*shapes)
  ts = [Tensor(x, requires_grad=True) for x in xs]
  call = {"list": lambda: getattr(Tensor, op)(ts, dim=dim), "tuple": lambda: getattr(Tensor, op)(tuple(ts), dim=dim),
          "method_list": lambda: getattr(ts[0], op)(ts[1:], dim=dim), "varargs": lambda: getattr(Tensor, op)(*ts, dim=dim)}[spelling]
  y = call()
  tts = [torch.tensor(x, requires_grad=True) for x in xs]
  ty = getattr(torch, op)(tts, dim=dim)
  close(y, ty)
  w = np.arange(float(np.prod(ty.shape)), dtype=np.float32).reshape(ty.shape)  # a seed that tells the positions apart
  grads = y.gradient(*ts, gradient=Tensor(w))
  tgrads = torch.autograd.grad(ty, tts, torch.tensor(w))
  for g, tg in zip(grads, tgrads): close(g, tg)


@needs_torch
def test_cat_promotes_dtypes():
  close(Tensor.cat([Tensor([1, 2]), Tensor([0.5])]), torch.cat([torch.tensor([1, 2], dtype=torch.int32), torch.tensor([0.5])]))
  close(Tensor.stack((Tensor([True]), Tensor([3]))), torch.stack((torch.tensor([True]), torch.tensor([3], dtype=torch.int32))))


# ---------------------------------------------------------------- scatter with a Python value of another kind

@needs_torch
@pytest.mark.parametrize("value", [2.5, 2, True])
def test_scatter_python_value(value):
  idx = [[0, 1, 2]]
  close(Tensor.zeros(3, 3, dtype=dtypes.int32).scatter(0, Tensor(idx), value),
        torch.zeros(3, 3, dtype=torch.int32).scatter(0, torch.tensor(idx), value))
  close(Tensor.zeros(3, 3).scatter(0, Tensor(idx), value), torch.zeros(3, 3).scatter(0, torch.tensor(idx), value))


@needs_torch
def test_scatter_same_dtype_after_cast():
  # the fix a user applies for the dtype error gives PyTorch's result
  idx, src = [[0, 1, 2], [2, 0, 1]], [[1, 2, 3], [4, 5, 6]]
  close(Tensor.zeros(3, 3).scatter(0, Tensor(idx), Tensor(src).float()), torch.zeros(3, 3).scatter(0, torch.tensor(idx), torch.tensor(src).float()))
  close(Tensor.zeros(3, 3).scatter_reduce(0, Tensor(idx), Tensor(src).cast("float32"), "sum"),
        torch.zeros(3, 3).scatter_reduce(0, torch.tensor(idx), torch.tensor(src).float(), "sum"))


# ---------------------------------------------------------------- sum/prod/cumsum dtype= in every spelling

SPELLINGS: list[tuple[Any, Any]] = [] if torch is None else [
  (dtypes.float32, torch.float32), ("float32", torch.float32), (np.float32, torch.float32), (np.dtype("float32"), torch.float32),
  ("float", torch.float32), ("double", torch.float64), (np.float64, torch.float64), ("half", torch.float16), (dtypes.float16, torch.float16),
  ("bfloat16", torch.bfloat16), ("long", torch.int64), ("int64", torch.int64), (np.int64, torch.int64), ("int", torch.int32),
  ("short", torch.int16), (np.int16, torch.int16), ("int8", torch.int8), ("uint8", torch.uint8), ("bool", torch.bool), (dtypes.bool, torch.bool),
]


@needs_torch
@pytest.mark.parametrize("op", ["sum", "prod", "cumsum"])
@pytest.mark.parametrize("src", [dtypes.int8, dtypes.float32])
@pytest.mark.parametrize("spelling", range(len(SPELLINGS) or 1))
def test_reduce_dtype_spellings(op, src, spelling):
  ours_dt, theirs_dt = SPELLINGS[spelling]
  data = [[3, -2, 5], [1, 0, 4]] if op != "prod" else [[3, -2, 1], [1, 2, 4]]
  x, tx = Tensor(data, dtype=src), torch.tensor(data, dtype=TORCH_DTYPES[src])
  for kw in ({}, {"axis": 1}) if op != "cumsum" else ({"axis": 1},):
    ours = getattr(x, op)(**kw, dtype=ours_dt)
    if op == "cumsum" and theirs_dt == torch.bool: theirs = tx.bool().cumsum(1).bool()  # PyTorch raises; ours is the running any
    else: theirs = getattr(tx, op)(*((kw["axis"],) if kw else ()), dtype=theirs_dt)
    close(ours, theirs, atol=0.05 if theirs_dt in (torch.float16, torch.bfloat16) else 1e-6)


@needs_torch
def test_running_bool_scans():
  # cumsum/cumprod(dtype=bool) are the running any/all (PyTorch raises "not implemented for 'Bool'")
  data = [[1, 0, 2], [0, 0, 1], [-1, 1, 1]]
  close(Tensor(data).cumsum(1, dtype=dtypes.bool), torch.tensor(data).bool().cumsum(1).bool())
  close(Tensor(data).cumprod(1, dtype="bool"), torch.tensor(data).bool().cumprod(1).bool())


def test_reduce_dtype_bad_spellings():
  with pytest.raises(ValueError, match="unknown dtype name 'float31'"): Tensor([1, 2]).sum(dtype="float31")
  with pytest.raises(TypeError, match="cannot interpret 3 as a dtype"): Tensor([1, 2]).cumsum(0, dtype=3)


# ---------------------------------------------------------------- out-of-range slices and 0-d index tensors

SLICES: list[tuple[str, Any]] = [
  ("past_end", (slice(5, 100),)), ("before_start", (slice(-100, 2),)), ("empty_past_end", (slice(10, 20),)), ("stop_before_start", (slice(3, 1),)),
  ("both_axes", (slice(2, 100), slice(1, -10))), ("neg_past", (slice(-3, 100), slice(-100, -1))), ("int_and_past", (1, slice(2, 50))),
  ("none_and_past", (None, slice(1, 99), slice(None, 2))), ("ellipsis_past", (Ellipsis, slice(3, 10))),
]


@needs_torch
@pytest.mark.parametrize("name,index", SLICES, ids=[s[0] for s in SLICES])
def test_out_of_range_slices(name, index):
  data = np.arange(12, dtype=np.float32).reshape(3, 4)
  x, tx = Tensor(data, requires_grad=True), torch.tensor(data, requires_grad=True)
  y, ty = x[index], tx[index]
  close(y, ty)
  w = np.arange(float(np.prod(ty.shape)), dtype=np.float32).reshape(ty.shape)
  close(y.gradient(x, gradient=Tensor(w))[0], torch.autograd.grad(ty, tx, torch.tensor(w))[0])
  # writing through the same index
  z, tz = Tensor.zeros(3, 4).contiguous(), torch.zeros(3, 4)
  z[index] = Tensor(w + 1)
  tz[index] = torch.tensor(w + 1)
  close(z, tz)


@needs_torch
def test_zero_dim_index_tensor():
  a, ta = Tensor([1.0, 5.0, 2.0], requires_grad=True), torch.tensor([1.0, 5.0, 2.0], requires_grad=True)
  y, ty = a[a.argmax()] * 2, ta[ta.argmax()] * 2
  close(y, ty)
  close(y.gradient(a)[0], torch.autograd.grad(ty, ta)[0])
  m, tm = Tensor.arange(12.0).reshape(3, 4), torch.arange(12.0).reshape(3, 4)
  close(m[Tensor(1), Tensor(2)], tm[torch.tensor(1), torch.tensor(2)])
  close(m[:, Tensor(3)], tm[:, torch.tensor(3)])


# ---------------------------------------------------------------- linspace and unfold values at their edges

@needs_torch
@pytest.mark.parametrize("args,dt", [((0, 1, 0), None), ((0, 1, 1), None), ((-1, 1, 5), None), ((5, 5, 3), None), ((1, 0, 4), None),
                                     ((0, 10, 4), dtypes.int32), ((0.0, 1.0, 3), dtypes.float64), ((0, 1, 5), dtypes.float16)])
def test_linspace_edges(args, dt):
  want = torch.linspace(*args, dtype=TORCH_DTYPES[dt or dtypes.float32])
  close(Tensor.linspace(*args, dtype=dt), want, atol=1e-3 if dt is dtypes.float16 else 1e-6)


@needs_torch
@pytest.mark.parametrize("shape,dim,size,step", [((10,), 0, 3, 2), ((10,), 0, 10, 1), ((10,), -1, 0, 1), ((10,), 0, 1, 20), ((), 0, 1, 1),
                                                 ((), -1, 0, 3), ((3, 5), 1, 2, 2), ((3, 5), 0, 3, 1), ((3, 0), 1, 0, 1)])
def test_unfold_edges(shape, dim, size, step):
  data = np.arange(float(np.prod(shape)), dtype=np.float32).reshape(shape)
  close(Tensor(data).unfold(dim, size, step), torch.tensor(data).unfold(dim, size, step))
