"""Bad input to the Tensor API raises a clear, typed error at the call — before anything is scheduled — naming the
shapes, axes or dtypes involved."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import plugrad.engine.realize
import plugrad.engine.schedule
from plugrad import Tensor, dtypes
from plugrad.gradient import GradientError
from plugrad.uop.shape import ShapeError

DEV = "NULL"  # nothing here may compute, so the device that runs nothing is enough


@pytest.fixture(autouse=True)
def no_scheduling(monkeypatch: pytest.MonkeyPatch) -> None:
  def refuse(*_: Any, **__: Any) -> Any: raise AssertionError("something was scheduled before the error was raised")
  monkeypatch.setattr(plugrad.engine.schedule, "create_schedule", refuse)
  monkeypatch.setattr(plugrad.engine.realize, "realize", refuse)


def t(*shape: int, dtype: Any = dtypes.float32) -> Tensor: return Tensor.full(shape, 1, dtype=dtype, device=DEV, buffer=False)


SHAPE_ERRORS = [
  ("add", lambda: t(2, 3) + t(4), r"add: shapes \(2, 3\) and \(4,\) do not broadcast"),
  ("mul", lambda: t(2, 3).mul(t(3, 2)), r"mul: shapes \(2, 3\) and \(3, 2\)"),
  ("where", lambda: (t(2) > 0).where(t(3), 0), r"where: shapes \(2,\) and \(3,\)"),
  ("matmul", lambda: t(2, 3) @ t(4, 5), r"matmul of shapes \(2, 3\) and \(4, 5\): contracted sizes 3 and 4 differ"),
  ("matmul_batch", lambda: t(2, 3, 4) @ t(5, 4, 2), r"matmul of shapes \(2, 3, 4\) and \(5, 4, 2\)"),
  ("matmul_0d", lambda: t() @ t(3), r"at least 1 dimension, got shapes \(\) and \(3,\)"),
  ("reshape", lambda: t(2, 3).reshape(4, 2), r"cannot reshape \(2, 3\) \(6 elements\) to \(4, 2\) \(8 elements\)"),
  ("reshape_two_holes", lambda: t(2, 3).reshape(-1, -1), r"only one size can be -1"),
  ("reshape_hole", lambda: t(2, 3).reshape(4, -1), r"cannot reshape \(2, 3\) \(6 elements\) to \(4, -1\)"),
  ("expand", lambda: t(2, 3).expand(4, 3), r"cannot expand \(2, 3\) to \(4, 3\): axis 0 has size 2"),
  ("permute", lambda: t(2, 3).permute(0, 1, 2), r"permute of shape \(2, 3\) needs 2 axes"),
  ("cat", lambda: t(2, 3).cat(t(3, 3), dim=1), r"cat along dim 1: shapes \(2, 3\) and \(3, 3\) differ"),
  ("cat_ndim", lambda: t(2, 3).cat(t(3)), r"same number \(> 0\) of dimensions, got shapes \(2, 3\), \(3,\)"),
  ("stack", lambda: t(2).stack(t(3)), r"stack needs tensors of one shape, got \(2,\) and \(3,\)"),
  ("shrink", lambda: t(2, 3).shrink(((0, 3), None)), r"axis 0 of size 2 cannot be cut to \[0, 3\)"),
  ("pad_pairs", lambda: t(2, 3).pad(((1, 1),)), r"pad: shape \(2, 3\) needs 2 \(before, after\) pairs, got 1"),
  ("pad_flat", lambda: t(2, 3).pad((1, 1, 1)), r"flat padding needs an even number of values"),
  ("assign", lambda: Tensor.empty(2, 3, device=DEV).assign(t(4)), r"assign of shape \(4,\) to a tensor of shape \(2, 3\)"),
  ("bitcast", lambda: t(3, dtype=dtypes.uint8).bitcast(dtypes.float32), r"bitcast of shape \(3,\) from dtypes.uint8 to dtypes.float32"),
  ("backward_seed", lambda: t(3).backward(t(2)), r"the gradient has shape \(2,\), the tensor has \(3,\)"),
]


@pytest.mark.parametrize("name,fn,match", SHAPE_ERRORS, ids=[e[0] for e in SHAPE_ERRORS])
def test_shape_errors(name, fn, match):
  with pytest.raises(ShapeError, match=match): fn()


AXIS_ERRORS = [
  ("sum", lambda: t(2, 3).sum(axis=2), r"dimension 2 is out of range for a tensor of shape \(2, 3\) \(expected -2..1\)"),
  ("max_neg", lambda: t(2, 3).max(axis=-3), r"dimension -3 is out of range"),
  ("mean_tuple", lambda: t(2, 3).mean(axis=(0, 5)), r"dimension 5"),
  ("transpose", lambda: t(2, 3).transpose(0, 2), r"dimension 2 is out of range for a tensor of shape \(2, 3\)"),
  ("T_1d", lambda: t(3).T, r"dimension 1 is out of range for a tensor of shape \(3,\)"),
  ("squeeze", lambda: t(2, 1).squeeze(2), r"dimension 2"),
  ("unsqueeze", lambda: t(2, 3).unsqueeze(4), r"dimension 4 is out of range .* \(expected -3..2\)"),
  ("argmax", lambda: t(2, 3).argmax(axis=2), r"dimension 2"),
  ("cat", lambda: t(2).cat(t(2), dim=1), r"dimension 1"),
  ("split", lambda: t(2).split(1, dim=-2), r"dimension -2"),
  ("flatten", lambda: t(2, 3).flatten(0, 3), r"dimension 3"),
  ("permute", lambda: t(2, 3).permute(0, 2), r"dimension 2"),
]


@pytest.mark.parametrize("name,fn,match", AXIS_ERRORS, ids=[e[0] for e in AXIS_ERRORS])
def test_axis_errors(name, fn, match):
  with pytest.raises(IndexError, match=match): fn()


VALUE_ERRORS = [
  ("duplicate_axes", lambda: t(2, 3).sum(axis=(0, -2)), r"repeats an axis of shape \(2, 3\)"),
  ("flip_duplicate", lambda: t(2, 3).flip(1, 1), r"flip: dimension \[1, 1\] repeats"),
  ("split_sizes", lambda: t(5).split([2, 2]), r"sizes \[2, 2\] must be >= 0 and add up to 5"),
  ("chunk", lambda: t(5).chunk(0), r"chunks must be an int > 0"),
  ("reflect", lambda: t(3).pad((3, 0), mode="reflect"), r"reflect padding \(3, 0\) of axis 0 needs at most 2"),
  ("pad_mode", lambda: t(3).pad((1, 1), mode="wrap"), r"mode must be one of"),
  ("rounding", lambda: t(3).div(2, rounding_mode="round"), r"rounding_mode must be None, 'trunc' or 'floor'"),
  ("clip", lambda: t(3).clip(), r"clip needs at least one of"),
  ("arange_step", lambda: Tensor.arange(0, 5, 0, device=DEV), r"step must not be 0"),
  ("linspace", lambda: Tensor.linspace(0, 1, -1, device=DEV), r"steps must be an int >= 0"),
  ("meshgrid", lambda: t(2).meshgrid(t(3), indexing="yx"), r"indexing must be 'ij' or 'xy'"),
  ("zeros_shape", lambda: Tensor.zeros(2, -1, device=DEV), r"a shape must be ints >= 0"),
  ("randint", lambda: Tensor.randint(3, low=5, high=5, device=DEV), r"low < high"),
  ("int_neg_pow", lambda: t(3, dtype=dtypes.int32) ** -1, r"negative integer power"),
  ("item", lambda: t(2, 2).item(), r"item\(\) needs a tensor with one element, got shape \(2, 2\)"),
  ("ragged", lambda: Tensor([[1, 2], [3]], device=DEV), r"rectangular nested list"),
  ("overflow", lambda: Tensor([2**40], device=DEV), r"does not fit in dtypes.int32"),
  ("overflow_scalar", lambda: Tensor(300, dtype=dtypes.uint8, device=DEV), r"does not fit in dtypes.uint8"),
  ("devices", lambda: t(2) + Tensor.full((2,), 1.0, device="PYTHON", buffer=False), r"add: tensors on different devices \(NULL and PYTHON\)"),
  ("assign_device", lambda: t(2).assign(Tensor.full((2,), 1.0, device="PYTHON", buffer=False)), r"assign of a tensor on PYTHON to a tensor on NULL"),
  ("unknown_dtype", lambda: t(2).cast("float31"), r"unknown dtype name 'float31'"),
  ("assign_view", lambda: Tensor.empty(1, 3, device=DEV).expand(2, 3).assign(t(2, 3)), r"assign to a view through EXPAND of a buffer"),
]


@pytest.mark.parametrize("name,fn,match", VALUE_ERRORS, ids=[e[0] for e in VALUE_ERRORS])
def test_value_errors(name, fn, match):
  with pytest.raises(ValueError, match=match): fn()


TYPE_ERRORS = [
  ("bitwise_float", lambda: t(2) & t(2), r"bitwise_and needs integer or bool tensors, got dtypes.float32"),
  ("not_float", lambda: ~t(2), r"bitwise_not needs integer or bool tensors, got dtypes.float32"),
  ("shift_float", lambda: t(2) >> 1, r"rshift needs integer tensors, got dtypes.float32"),
  ("sub_bool", lambda: t(2, dtype=dtypes.bool) - t(2, dtype=dtypes.bool), r"sub of bool tensors is not defined"),
  ("rand_int", lambda: Tensor.rand(2, dtype=dtypes.int32, device=DEV), r"rand makes floats; got dtype dtypes.int32"),
  ("randn_int", lambda: Tensor.randn(2, dtype=dtypes.uint8, device=DEV), r"randn makes floats"),
  ("randint_float", lambda: Tensor.randint(2, dtype=dtypes.float32, device=DEV), r"randint makes integers; got dtype dtypes.float32"),
  ("bitcast_bool", lambda: t(2).bitcast(dtypes.bool), r"bool has no defined bit layout"),
  ("bitcast_0d", lambda: t().bitcast(dtypes.float64), None),
  ("data_str", lambda: Tensor("abc", device=DEV), r"cannot make a Tensor from a str"),
  ("data_list_str", lambda: Tensor([1, "a"], device=DEV), r"cannot infer a dtype from a Python str"),
  ("numpy_complex", lambda: Tensor(np.array([1j]), device=DEV), r"numpy array of dtype complex128"),
  ("scalar_type", lambda: t(2) + "x", r"cannot combine a Tensor with a str"),
  ("bool_truth", lambda: bool(t(2)), r"truth value of a Tensor is not defined"),
  ("backward_int", lambda: t(1, dtype=dtypes.int32).backward(), r"only float tensors can be differentiated, this one is dtypes.int32"),
  ("gradient_int_target", lambda: t(1).gradient(t(1, dtype=dtypes.int32)), r"only float tensors have gradients"),
  ("len_0d", lambda: len(t()), r"len\(\) of a 0-d tensor"),
  ("device_type", lambda: Tensor([1], device=3), r"device must be a device name str"),  # type: ignore[arg-type]
  ("vector_dtype", lambda: t(2).cast(dtypes.float32.vec(4)), r"a Tensor needs a scalar dtype"),
]


@pytest.mark.parametrize("name,fn,match", TYPE_ERRORS, ids=[e[0] for e in TYPE_ERRORS])
def test_type_errors(name, fn, match):
  if name == "bitcast_0d":  # 0-d with a size change has no axis to grow: a shape error
    with pytest.raises(ShapeError, match="0-d tensor"): fn()
    return
  with pytest.raises(TypeError, match=match): fn()


def test_backward_errors():
  x = Tensor.full((3,), 1.0, device=DEV, buffer=False, requires_grad=True)
  with pytest.raises(GradientError, match=r"backward\(\) without a gradient needs a tensor with one element; this one has shape \(3,\)"):
    (x * 2).backward()
  with pytest.raises(GradientError, match=r"no tensor with requires_grad=True"):
    Tensor.full((1,), 1.0, device=DEV, buffer=False).sum().backward()
  with pytest.raises(GradientError, match=r"target\(s\) \[0\] are not part of this tensor's graph"):
    (x * 2).sum().gradient(Tensor(2.0, device=DEV))  # a scalar Tensor is not the constant 2 inside x * 2
  with pytest.raises(GradientError, match=r"not part"):
    (x.detach() * 2).sum().gradient(x)  # only reachable through detach
  assert isinstance(GradientError("x"), ValueError)


def test_errors_leave_tensors_unchanged():
  a = Tensor.empty(2, 3, device=DEV)
  before = a.uop
  with pytest.raises(ShapeError): a.assign(t(4))
  with pytest.raises(TypeError): a.assign(t(2, 3, dtype=dtypes.int32))
  assert a.uop is before
