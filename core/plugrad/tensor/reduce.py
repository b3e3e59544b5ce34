"""Reductions and matrix products. Every reduction is one REDUCE_AXIS (ADD, MUL or MAX) plus elementwise ops. Result
dtypes: integer and bool sums and products give int64 where the device has it (PyTorch; `int_acc_dtype`), half floats
accumulate in float32 and come back as half, means and variances of integers are floats, argmax/argmin give int32 (the
rest as tinygrad)."""
from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import TYPE_CHECKING

from plugrad.dtype import DType, DTypeLike, dtypes, least_upper_dtype, least_upper_float, sum_acc_dtype, to_dtype
from plugrad.helpers import prod
from plugrad.tensor.creation import dtype_problem
from plugrad.tensor.helpers import broadcast_shape, const_uop, ints, iota, pow2_scale, resolve_dims
from plugrad.uop.ops import Ops
from plugrad.uop.shape import ShapeError, fmt

if TYPE_CHECKING:
  from plugrad.tensor.tensor import Tensor

Axis = int | Sequence[int] | None


def _axes(self: Tensor, axis: Axis, what: str) -> tuple[int, ...]:
  if axis is None: return tuple(range(self.ndim))
  axes = resolve_dims(self.shape, (axis,) if isinstance(axis, int) else tuple(axis), what)
  return axes if self.ndim else ()


def _reduce(self: Tensor, op: Ops, axis: Axis, keepdim: bool, what: str) -> Tensor:
  axes = _axes(self, axis, what)
  # an empty reduction stays a REDUCE_AXIS (its kernel stores the op's identity), not a constant: the graph keeps its
  # source, so the source still gets its (zero) gradient
  ret = self._wrap(self.uop.reduce_axis(op, axes))
  return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))


def _count(self: Tensor, axis: Axis) -> int:
  return prod(self.shape[a] for a in _axes(self, axis, "count"))


def int_acc_dtype(dt: DType, device: str | tuple[str, ...]) -> DType:
  """The dtype an integer or bool sum or product (and their scans) accumulates in and returns: int64 where the device
  has it, as in PyTorch (uint64 stays uint64, which int64 would wrap); on a device without int64 tinygrad's rule,
  int32 (uint32 for unsigned ints)."""
  if dt in (dtypes.int64, dtypes.uint64): return dt
  return dtypes.int64 if dtype_problem(device, dtypes.int64) is None else sum_acc_dtype(dt)


def result_dtype(self: Tensor, dtype: DTypeLike | None) -> DType:
  """What sum/prod/cumsum/cumprod return: `dtype` when given (a name, DType or numpy dtype), else the integer
  accumulation dtype for ints and bools, else self's dtype."""
  if dtype is not None: return to_dtype(dtype)
  return self.dtype if dtypes.is_float(self.dtype) else int_acc_dtype(self.dtype, self.device)


def sum(self: Tensor, axis: Axis = None, keepdim: bool = False, dtype: DTypeLike | None = None) -> Tensor:
  """The sum over `axis` (all axes by default). Integers and bools sum to int64 where the device has it (PyTorch's
  rule; `int_acc_dtype`); half floats accumulate in float32 and come back as half; `dtype=` casts first."""
  out = result_dtype(self, dtype)
  if out is dtypes.bool: return self.cast(dtypes.bool).any(axis, keepdim)  # a sum kept as bool is "any nonzero"
  acc = sum_acc_dtype(out) if dtypes.is_float(out) else out
  ret = _reduce(self.cast(acc), Ops.ADD, axis, keepdim, "sum")
  return ret.cast(out)


def prod_(self: Tensor, axis: Axis = None, keepdim: bool = False, dtype: DTypeLike | None = None) -> Tensor:
  """The product over `axis`; integers and bools multiply in int64 where the device has it (as `sum`)."""
  x = self.cast(result_dtype(self, dtype))
  if x.dtype is dtypes.bool: return x.all(axis, keepdim)
  return _reduce(x, Ops.MUL, axis, keepdim, "prod")


def max(self: Tensor, axis: Axis = None, keepdim: bool = False) -> Tensor: return _reduce(self, Ops.MAX, axis, keepdim, "max")


def min(self: Tensor, axis: Axis = None, keepdim: bool = False) -> Tensor:
  # min(x) = -max(-x) for floats, ~max(~x) for integers (~ is order-reversing and cannot overflow), likewise for bools
  if dtypes.is_float(self.dtype): return -((-self).max(axis, keepdim))
  return self.bitwise_not().max(axis, keepdim).bitwise_not()


def any(self: Tensor, axis: Axis = None, keepdim: bool = False) -> Tensor: return self.cast(dtypes.bool).max(axis, keepdim)
def all(self: Tensor, axis: Axis = None, keepdim: bool = False) -> Tensor: return self.logical_not().any(axis, keepdim).logical_not()


def mean(self: Tensor, axis: Axis = None, keepdim: bool = False) -> Tensor:
  out = least_upper_float(self.dtype)
  return (self.cast(sum_acc_dtype(out)).sum(axis, keepdim) / _count(self, axis)).cast(out)


def _safe_mean(x: Tensor, axis: Axis, keepdim: bool) -> Tensor:
  """The mean of x (a float tensor) as the sum of x/2^k over n/2^k (2^k >= n): the same bits as sum(x)/n (both scaled
  exactly), but a sum of large values cannot overflow (two 3e38 have the mean 3e38, not inf; PyTorch's var_mean)."""
  n = _count(x, axis)
  p2 = 1 << builtins.max(n - 1, 0).bit_length()
  return (x * (1 / p2)).sum(axis, keepdim) / (n / p2)


def _deviations(self: Tensor, axis: Axis) -> Tensor:
  """x - mean(x) in the accumulation dtype. The mean is detached: the deviations sum to 0, so its path adds nothing to
  the gradient (but inf - inf where they overflow)."""
  x = self.cast(sum_acc_dtype(least_upper_float(self.dtype)))
  return x - _safe_mean(x, axis, True).detach()


def var(self: Tensor, axis: Axis = None, keepdim: bool = False, correction: int | float = 1) -> Tensor:
  dev, n = _deviations(self, axis), _count(self, axis)
  return ((dev * dev).sum(axis, keepdim) / (n - correction if n > correction else 0)).cast(least_upper_float(self.dtype))


def std(self: Tensor, axis: Axis = None, keepdim: bool = False, correction: int | float = 1) -> Tensor:
  """sqrt(var) taken before rounding to the result dtype, of the deviations scaled by a power of two near their largest
  magnitude (exact): a standard deviation that fits the dtype is finite where its variance overflows (float16 [1000, 1,
  2, 3]: the variance 2.5e5 does not fit half, 499 does), as PyTorch's."""
  dev, n = _deviations(self, axis), _count(self, axis)
  s = pow2_scale(dev.abs().max(axis, keepdim=True).detach())
  d, div = dev / s, n - correction if n > correction else 0
  t = (d * d).sum(axis, keepdim=True)
  # a constant slice: sqrt'(0) = inf would meet the deviations' 0 as nan; PyTorch's gradient there is 0, so nothing flows
  const = t.eq(0) if div else None  # (with nothing to divide by, the result stays 0/0 = nan, as PyTorch's)
  ret = ((t if const is None else const.where(1.0, t)) / div).sqrt() * s
  if const is not None: ret = const.where(0.0, ret)
  return (ret if keepdim else ret.reshape(tuple(sz for i, sz in enumerate(self.shape) if i not in _axes(self, axis, "std")))).cast(
    least_upper_float(self.dtype))


def _mean_of(self: Tensor, axis: Axis, keepdim: bool) -> Tensor:
  out = least_upper_float(self.dtype)
  return _safe_mean(self.cast(sum_acc_dtype(out)), axis, keepdim).cast(out)


def std_mean(self: Tensor, axis: Axis = None, keepdim: bool = False, correction: int | float = 1) -> tuple[Tensor, Tensor]:
  return self.std(axis, keepdim, correction), _mean_of(self, axis, keepdim)


def var_mean(self: Tensor, axis: Axis = None, keepdim: bool = False, correction: int | float = 1) -> tuple[Tensor, Tensor]:
  return self.var(axis, keepdim, correction), _mean_of(self, axis, keepdim)


def logsumexp(self: Tensor, axis: Axis = None, keepdim: bool = False) -> Tensor:
  m = self.max(axis, keepdim=True).detach()
  m = m.isinf().where(0.0, m)  # all -inf (or a +inf): shift by 0 so the answer is -inf/+inf rather than nan
  ret = (self - m).exp().sum(axis, keepdim=True).log() + m
  return ret if keepdim else ret.reshape(tuple(s for i, s in enumerate(self.shape) if i not in _axes(self, axis, "logsumexp")))


def argmax(self: Tensor, axis: int | None = None, keepdim: bool = False) -> Tensor:
  """The index of the first maximum (nan counts as the maximum, like numpy)."""
  if axis is None:
    ret = self.flatten().argmax(0)
    return ret.reshape((1,) * self.ndim) if keepdim else ret
  (a,) = _axes(self, axis, "argmax") or (0,)
  if self.ndim == 0: return self._wrap(const_uop(0, dtypes.int32, self.device, ()))
  n = ints(self.shape, "argmax")[a]
  if n == 0: raise ShapeError(f"argmax of an empty axis {axis} (shape {fmt(self.shape)})")
  hit = self.eq(self.max(a, keepdim=True))
  if dtypes.is_float(self.dtype): hit = hit | self.isnan()
  # descending indices n..1, so the max over the hits picks the first one
  rev = self._wrap(const_uop(n, dtypes.int32, self.device, (n,))) - self._wrap(iota(n, self.device))
  rev = rev.reshape((n,) + (1,) * (self.ndim - a - 1))
  return (n - hit.where(rev, 0).max(a, keepdim)).cast(dtypes.int32)


def argmin(self: Tensor, axis: int | None = None, keepdim: bool = False) -> Tensor:
  if dtypes.is_float(self.dtype): return (-self).argmax(axis, keepdim)
  return self.bitwise_not().argmax(axis, keepdim)


def dot(self: Tensor, w: Tensor, dtype: DTypeLike | None = None) -> Tensor:
  """numpy's matmul: 1-D operands are vectors, more than 2 dimensions are batches (broadcast)."""
  x, nx, nw = self, self.ndim, w.ndim
  if nx == 0 or nw == 0: raise ShapeError(f"matmul needs tensors of at least 1 dimension, got shapes {fmt(x.shape)} and {fmt(w.shape)}")
  k_axis = -builtins.min(nw, 2)
  if x.shape[-1] != w.shape[k_axis]:
    raise ShapeError(f"matmul of shapes {fmt(x.shape)} and {fmt(w.shape)}: contracted sizes {x.shape[-1]} and {w.shape[k_axis]} differ")
  if nx >= 2 and nw >= 2: broadcast_shape(x.shape[:-2], w.shape[:-2], op=f"matmul of shapes {fmt(x.shape)} and {fmt(w.shape)} (batch axes)")
  if nw >= 2:
    # w (..., k, m) → (..., m, k); with a matrix x (..., n, k) → (..., n, 1, k) against (..., 1, m, k)
    wt = w.transpose(-1, -2)
    if nx >= 2: x, wt = x.unsqueeze(-2), wt.unsqueeze(-3)
  else: wt = w
  out = least_upper_dtype(self.dtype, w.dtype) if dtype is None else to_dtype(dtype)
  if dtypes.is_float(out):
    # the products are formed, not only summed, in the accumulation dtype (float32 for half) and rounded once, as
    # PyTorch's: 300·300 overflows float16. The factors' casts are what a tensor core's half inputs match (opt/tc.py)
    acc = sum_acc_dtype(out)
    return (x.cast(acc) * wt.cast(acc)).sum(-1).cast(out)
  # integers accumulate in sum_acc_dtype and come back as the promoted dtype (PyTorch's int matmul keeps it too)
  return (x * wt).sum(-1, dtype=dtype if dtype is not None else sum_acc_dtype(out)).cast(out)


def matmul(self: Tensor, x: Tensor, reverse: bool = False, dtype: DTypeLike | None = None) -> Tensor:
  return x.dot(self, dtype=dtype) if reverse else self.dot(x, dtype=dtype)


class ReduceMixin:
  """Mixed into `Tensor`: reductions and the matrix products."""

  sum = sum; prod = prod_; max = max; min = min; mean = mean; var = var; std = std
  std_mean = std_mean; var_mean = var_mean; argmax = argmax; argmin = argmin; any = any; all = all
  logsumexp = logsumexp; dot = dot; matmul = matmul
