"""Scans and sorting as Tensor methods: cumulative sums/products/extrema, logcumsumexp, sort, argsort, topk.

A scan of length n is a reduction over a window view: pad n-1 identity elements in front and take the n windows
of length n (`indexing.pool`), so element i reduces x[0..i] — one kernel, O(n²) work; long axes are split in blocks
(scan inside blocks, then a scan of the block totals) to keep the work near O(n·block).

`sort` ranks each element by comparisons (rank = #smaller + #equal-before-it, so equal elements keep their order)
and places it with a one-hot sum: O(n²) work per row, in two fused kernels and differentiable in the values; NaNs
sort as larger than everything, as in PyTorch.

The methods are plain functions taking the tensor first, bound as methods by `ScanMixin` at the bottom.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Literal

from plugrad.dtype import DTypeLike, dtypes
from plugrad.tensor.helpers import ints, tensor_cls
from plugrad.tensor.indexing import pad_constant, pool, resolve_dim, select_sum
from plugrad.tensor.reduce import result_dtype
from plugrad.uop.shape import ShapeError, fmt

if TYPE_CHECKING:
  from plugrad.tensor.tensor import Tensor

ScanOp = Literal["sum", "prod", "max", "min"]
_BLOCK = 256  # scans longer than 2*_BLOCK run in blocks


def _identity(op: ScanOp, x: Tensor) -> float | int | bool:
  if op == "sum": return 0
  if op == "prod": return True if x.dtype == dtypes.bool else 1  # a Python 1 would promote a bool tensor to int
  return dtypes.min(x.dtype) if op == "max" else dtypes.max(x.dtype)


def _reduce(x: Tensor, op: ScanOp, axis: int) -> Tensor:
  # sums and products keep x's dtype (the scan casts to its result dtype first): an int32 scan stays int32
  if op == "sum": return x.sum(axis, dtype=x.dtype)
  if op == "prod": return x.prod(axis, dtype=x.dtype)
  return x.max(axis) if op == "max" else x.min(axis)


def _scan_last(x: Tensor, op: ScanOp) -> Tensor:
  """Inclusive scan of the last dim (size n >= 1)."""
  n = ints(x.shape, "scan")[-1]
  if n <= 2 * _BLOCK:
    return _reduce(pool(pad_constant(x, ((n - 1, 0),), _identity(op, x)), (n,)), op, -1)
  nb = -(-n // _BLOCK)
  # pad in front to whole blocks: identities do not change any prefix
  blocks = pad_constant(x, ((nb * _BLOCK - n, 0),), _identity(op, x)).reshape(*x.shape[:-1], nb, _BLOCK)
  inner = _scan_last(blocks, op)                                         # (..., nb, B)
  carry = _scan_last(inner[..., -1], op)                                 # (..., nb): totals up to each block
  carry = pad_constant(carry, ((1, -1),), _identity(op, inner)).unsqueeze(-1)  # exclusive: what comes before each block
  if op == "sum": out = inner + carry
  elif op == "prod": out = inner * carry
  else: out = inner.maximum(carry) if op == "max" else inner.minimum(carry)
  return out.flatten(-2)[..., nb * _BLOCK - n:]


def _scan(x: Tensor, axis: int, op: ScanOp, name: str) -> Tensor:
  axis = resolve_dim(axis, x.ndim, name)
  if x.ndim == 0 or x.shape[axis] == 0: return _reduce(x.unsqueeze(0), op, 0)  # x itself, in the dtype a reduction gives
  return _scan_last(x.transpose(axis, -1), op).transpose(axis, -1)


def _cum_extreme(x: Tensor, axis: int, op: ScanOp, name: str) -> tuple[Tensor, Tensor]:
  """The running max/min and the int32 index of the first element of x[..:i+1] equal to it."""
  T = tensor_cls()
  values = _scan(x, axis, op, name)
  axis = resolve_dim(axis, x.ndim, name)
  if x.ndim == 0 or x.shape[axis] == 0: return values, T.zeros(x.shape, dtype=dtypes.int32, device=x.device, buffer=False)
  xt, vt = x.transpose(axis, -1), values.transpose(axis, -1)
  n = ints(xt.shape, "cummax/cummin")[-1]
  j = T.arange(n, device=x.device)
  upto = j.unsqueeze(0) <= j.unsqueeze(1)                                   # (i, j): j <= i
  hit = upto & _same(xt.unsqueeze(-2), vt.unsqueeze(-1))                   # (..., i, j): a running nan is the first nan
  first = n - hit.where(T.arange(n, 0, -1, dtype=dtypes.int32, device=x.device), 0).max(-1)
  return values, first.transpose(axis, -1).detach()


def _before(a: Tensor, b: Tensor, descending: bool) -> Tensor:
  """a sorts strictly before b; NaN counts as the largest value."""
  lt = b < a if descending else a < b
  if not dtypes.is_float(a.dtype): return lt
  na, nb = a.isnan(), b.isnan()
  return lt | (nb & na.logical_not()) if not descending else lt | (na & nb.logical_not())


def _same(a: Tensor, b: Tensor) -> Tensor:
  return a.eq(b) | (a.isnan() & b.isnan()) if dtypes.is_float(a.dtype) else a.eq(b)


def _sorted(x: Tensor, dim: int, descending: bool, k: int) -> tuple[Tensor, Tensor]:
  """The first k entries of the stable sort of x along dim: values and int32 indices."""
  T = tensor_cls()
  xt = x.transpose(dim, -1)
  n = ints(xt.shape, "sort")[-1]
  a, b = xt.unsqueeze(-1), xt.unsqueeze(-2)                    # (..., i, 1) and (..., 1, j)
  j = T.arange(n, dtype=dtypes.int32, device=x.device)
  earlier = j.unsqueeze(0) < j.unsqueeze(1)                    # (i, j): j < i
  rank = (_before(b, a, descending) | (earlier & _same(a, b))).sum(-1, dtype=dtypes.int32)  # (..., i): where element i goes
  place = rank.unsqueeze(-2).eq(T.arange(k, dtype=rank.dtype, device=x.device).unsqueeze(-1))  # (..., r, i)
  values, indices = select_sum(place, xt.unsqueeze(-2), -1), select_sum(place, j, -1)
  return values.transpose(dim, -1), indices.transpose(dim, -1).detach()


def cumsum(self: Tensor, axis: int = 0, dtype: DTypeLike | None = None) -> Tensor:
  """Running sum along `axis`, in the dtype `sum` gives (integers and bools in int64 where the device has it) or
  `dtype` (a name, DType or numpy dtype), which the input is cast to first."""
  return _scan(self.cast(result_dtype(self, dtype)), axis, "sum", "cumsum")


def cumprod(self: Tensor, axis: int, dtype: DTypeLike | None = None) -> Tensor:
  """Running product along `axis`, in the dtype `prod` gives (or `dtype`)."""
  return _scan(self.cast(result_dtype(self, dtype)), axis, "prod", "cumprod")


def cummax(self: Tensor, axis: int = 0) -> tuple[Tensor, Tensor]:
  """Running maximum along `axis`, and the int32 index where it was first reached."""
  return _cum_extreme(self, axis, "max", "cummax")


def cummin(self: Tensor, axis: int = 0) -> tuple[Tensor, Tensor]:
  """Running minimum along `axis`, and the int32 index where it was first reached."""
  return _cum_extreme(self, axis, "min", "cummin")


def logcumsumexp(self: Tensor, axis: int = 0) -> Tensor:
  """log(cumsum(exp(x))) along `axis`, computed against the running maximum so that nothing overflows."""
  T = tensor_cls()
  axis = resolve_dim(axis, self.ndim, "logcumsumexp")
  if self.ndim == 0 or self.shape[axis] == 0: return self.cast(self.exp().dtype)
  x = self.transpose(axis, -1)
  x = x if dtypes.is_float(x.dtype) else x.cast(dtypes.float32)
  n = ints(x.shape, "logcumsumexp")[-1]
  # the running max of the finite values: shifting by +inf would make x - m nan, and by 0 would overflow exp of a large
  # earlier element (its gradient 0·inf = nan; [0, 1000, 0, inf]); an all -inf prefix shifts by 0 (any finite shift is exact)
  m = x.isinf(detect_negative=False).where(-math.inf, x).cummax(-1)[0].detach()
  m = m.isinf().where(0, m)
  j = T.arange(n, device=self.device)
  upto = j.unsqueeze(0) <= j.unsqueeze(1)  # (i, j): j <= i
  # the terms after i are masked before the exp: exp(x_j - m_i) for j > i may overflow, and inf * 0 in its gradient is nan
  terms = upto.where(x.unsqueeze(-2) - m.unsqueeze(-1), -math.inf).exp()  # (..., i, j)
  return (terms.sum(-1).log() + m).transpose(axis, -1)


def sort(self: Tensor, dim: int = -1, descending: bool = False) -> tuple[Tensor, Tensor]:
  """The values sorted along `dim` and their int32 indices in self; equal values keep their order (stable)."""
  T = tensor_cls()
  dim = resolve_dim(dim, self.ndim, "sort")
  if self.ndim == 0: return self, T.zeros((), dtype=dtypes.int32, device=self.device, buffer=False)
  return _sorted(self, dim, descending, ints(self.shape, "sort")[dim])


def argsort(self: Tensor, dim: int = -1, descending: bool = False) -> Tensor:
  """The int32 indices that sort self along `dim` (stable)."""
  return self.sort(dim, descending)[1]


def topk(self: Tensor, k: int, dim: int = -1, largest: bool = True, sorted_: bool = True) -> tuple[Tensor, Tensor]:
  """The k largest (or smallest) values along `dim`, in sorted order, and their int32 indices."""
  T = tensor_cls()
  dim = resolve_dim(dim, self.ndim, "topk")
  n = ints(self.shape, "topk")[dim] if self.ndim else 1
  if not isinstance(k, int) or not 0 <= k <= n: raise ShapeError(f"topk: k={k!r} is out of range for dim {dim} of shape {fmt(self.shape)}")
  if self.ndim == 0: return self, T.zeros((), dtype=dtypes.int32, device=self.device, buffer=False)
  return _sorted(self, dim, largest, k)


class ScanMixin:
  """Mixed into `Tensor`: scans and sorting."""

  cumsum = cumsum; cumprod = cumprod; cummax = cummax; cummin = cummin; logcumsumexp = logcumsumexp; sort = sort; argsort = argsort; topk = topk
