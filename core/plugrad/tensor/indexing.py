"""Indexing Tensor methods: `__getitem__`/`__setitem__`, gather/scatter, masked_select, nonzero, triangles, diagonals,
unfold; built from movement ops, comparisons with `arange` and reductions.

Basic indices (ints, slices, None, ...) are pure views. Integer-tensor indices (getitem, gather, Embedding) become a
GATHER node: an indexed load, the index tensor read in the same kernel, that fuses into its consumer; an index tensor's
values are only known on the device, so an out-of-range value in one selects nothing (0), as in tinygrad. Writes
(setitem with tensor indices, scatter, scatter_reduce) become a SCATTER node: an indexed store loop (docs/ir.md).
Python int indices, and lists of ints, are checked at the call and raise IndexError.

The methods are plain functions taking the tensor first (so type checkers see `self` as a Tensor), bound as methods by
the mixin class at the bottom. The helpers above them (`resolve_dim`, `make_tuple`, `pad_constant`, `pool`, ...) are
shared with nn_ops.py and scan.py.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from plugrad.dtype import DType, dtypes
from plugrad.helpers import all_int, prod
from plugrad.tensor.helpers import ArgumentError, DTypeError, IndexDTypeError, broadcast_shape, ints, is_writable_view, tensor_cls
from plugrad.uop.ops import Ops, UOp, sint
from plugrad.uop.shape import ShapeError, fmt
from plugrad.uop.windows import window_view

if TYPE_CHECKING:
  from plugrad.tensor.tensor import Tensor


# ---------------------------------------------------------------- helpers shared by the three mixins

class IndexShapeError(ShapeError, IndexError):
  """Index tensors (or lists) whose shapes do not broadcast together: an IndexError, as PyTorch raises."""


def resolve_dim(dim: int, ndim: int, op: str, extra: bool = False) -> int:
  """`dim` as a non-negative axis of an `ndim`-d tensor (one past the end when `extra`); IndexError when out of range.
  A 0-d tensor accepts 0 and -1, as in PyTorch."""
  total = ndim + int(extra)
  if isinstance(dim, bool) or not isinstance(dim, int): raise TypeError(f"{op}: dim must be an int, got {dim!r}")
  if not -max(total, 1) <= dim < max(total, 1): raise IndexError(f"{op}: dim {dim} is out of range for a {ndim}-d tensor")
  return dim + max(total, 1) if dim < 0 else dim  # -1 of a 0-d tensor is 0


def make_tuple(x: int | Sequence[int], n: int, what: str) -> tuple[int, ...]:
  """An int repeated `n` times, or a sequence of exactly `n` ints."""
  if isinstance(x, int): return (x,) * n
  if len(x := tuple(x)) != n or not all_int(x): raise ValueError(f"{what} must be an int or {n} ints, got {x}")
  return x


def pad_pairs(padding: int | Sequence[int], n: int, what: str = "padding") -> tuple[tuple[int, int], ...]:
  """tinygrad's padding forms for `n` spatial dims, as (before, after) pairs in dim order: an int (all sides), `n` ints
  (one per dim, both sides), or `2n` ints in PyTorch's F.pad order (last dim first: left, right, top, bottom, ...)."""
  if isinstance(padding, int): return ((padding, padding),) * n
  p = tuple(padding)
  if not all_int(p) or len(p) not in (n, 2 * n):
    raise ValueError(f"{what} must be an int or a sequence of {n} or {2 * n} ints, got {padding!r}")
  if len(p) == n: return tuple((x, x) for x in p)
  return tuple((p[2 * i], p[2 * i + 1]) for i in range(n))[::-1]


def pad_constant(x: Tensor, pads: Sequence[tuple[int, int]], value: float | int | bool = 0) -> Tensor:
  """Pad the last len(pads) dims with `value`; negative amounts cut (conv_transpose2d and ceil_mode pooling need that)."""
  return x.pad(((0, 0),) * (x.ndim - len(pads)) + tuple(pads), value=value)


def pool(x: Tensor, k_: Sequence[int], stride: int | Sequence[int] = 1, dilation: int | Sequence[int] = 1) -> Tensor:
  """The sliding windows over the last len(k_) dims as a view: (..., *i) → (..., *o, *k), o = (i - d*(k-1) - 1)//s + 1.

  No data moves: non-overlapping windows are a reshape, overlapping ones uop/windows.py's window_view (whose gradient
  the derivative walk takes as a fold)."""
  nk = len(k_)
  s_, d_ = make_tuple(stride, nk, "stride"), make_tuple(dilation, nk, "dilation")
  if x.ndim < nk: raise ShapeError(f"pool of shape {fmt(x.shape)} with a {nk}-d window {tuple(k_)}: too few dims")
  if any(k < 1 for k in k_) or any(s < 1 for s in s_) or any(d < 1 for d in d_):
    raise ValueError(f"pool: kernel {tuple(k_)}, stride {s_} and dilation {d_} must be >= 1")
  pre, i_ = x.shape[:-nk], ints(x.shape[-nk:], "pool")
  if any(d * (k - 1) + 1 > i for k, d, i in zip(k_, d_, i_)):
    raise ShapeError(f"pool: the window {tuple(k_)} (dilation {d_}) is larger than the (padded) input {fmt(tuple(i_))}")
  o_ = [(i - d * (k - 1) - 1) // s + 1 for i, k, s, d in zip(i_, k_, s_, d_)]
  n = len(pre)
  if all(d == 1 and s == k for k, s, d in zip(k_, s_, d_)):  # non-overlapping windows: a plain reshape
    x = x.shrink(tuple((0, p) for p in pre) + tuple((0, o * k) for o, k in zip(o_, k_)))
    x = x.reshape(*pre, *[v for o, k in zip(o_, k_) for v in (o, k)])
    return x.permute(*range(n), *[n + 2 * j for j in range(nk)], *[n + 2 * j + 1 for j in range(nk)])
  return x._wrap(window_view(x.uop, tuple(k_), s_, d_))


def broadcast_to(x: Tensor, shape: tuple[int, ...], op: str) -> Tensor:
  if x.shape == shape: return x
  if x.ndim > len(shape) or any(a != b and a != 1 for a, b in zip(x.shape[::-1], shape[::-1])):
    raise ShapeError(f"{op}: shape {fmt(x.shape)} does not broadcast to {fmt(shape)}")
  return x.reshape((1,) * (len(shape) - x.ndim) + x.shape).expand(shape)


def one_hot_last(idx: Tensor, n: int) -> Tensor:
  """bool (*idx.shape, n): True where idx == position along the new last axis."""
  T = tensor_cls()
  return idx.unsqueeze(-1).eq(T.arange(n, device=idx.device))


def select_sum(mask: Tensor, x: Tensor, axis: int) -> Tensor:
  """sum over `axis` of x where mask (else 0), keeping x's dtype: the contraction behind every gather here.
  `where` rather than a multiply so that an inf or nan outside the selection does not leak in as 0*inf."""
  if x.dtype == dtypes.bool: return mask.where(x, False).any(axis)
  return mask.where(x, 0).sum(axis, dtype=x.dtype)


def _check_index_tensor(t: Tensor, op: str) -> None:
  if not dtypes.is_int(t.dtype) or t.dtype == dtypes.bool:
    raise IndexDTypeError(f"{op}: index tensors must have an integer dtype, got {t.dtype}")


def _same_device(x: Tensor, idx: Tensor) -> Tensor: return idx if idx.device == x.device else idx.to(x.device)


def gather_axis(x: Tensor, idx: Tensor, axis: int) -> Tensor:
  """x read at row idx[p] along `axis` for every position p of idx (idx has x's shape outside the axis); a row outside
  [0, x.shape[axis]) reads 0. One GATHER node: an indexed load, not a comparison against every row."""
  return x._wrap(UOp(Ops.GATHER, x.dtype, (x.uop, _same_device(x, idx).uop), axis))


def scatter_axis(base: Tensor, idx: Tensor, src: Tensor, axis: int, how: str) -> Tensor:
  """base with src[p] combined (`how`: set, add, mul, max, min) into row idx[p] along `axis` for every position p of idx
  (src has idx's shape, no larger than base outside the axis), in order along the axis; out-of-range rows are skipped."""
  return base._wrap(UOp(Ops.SCATTER, base.dtype, (base.uop, _same_device(base, idx).uop, src.cast(base.dtype).uop), (axis, how)))


def _nested_shape(x: Any) -> tuple[int, ...]:
  if not isinstance(x, (list, tuple)): return ()
  inner = [_nested_shape(e) for e in x]
  if any(s != inner[0] for s in inner): raise IndexError(f"index list {x!r} is ragged")
  return (len(x),) + (inner[0] if inner else ())


def _flat(x: Any) -> list[Any]: return [v for e in x for v in _flat(e)] if isinstance(x, (list, tuple)) else [x]


# ---------------------------------------------------------------- __getitem__ / __setitem__

class _Parsed:
  """The basic part of an index expression, applied to `x` as views, and the advanced (tensor) part left over."""
  def __init__(self, x: Tensor, indices: Any):
    T = tensor_cls()
    if not isinstance(indices, tuple): indices = (indices,)
    if sum(i is Ellipsis for i in indices) > 1: raise IndexError("an index can only have a single ellipsis ('...')")
    n_real = sum(i is not None and i is not Ellipsis for i in indices)
    if n_real > x.ndim: raise IndexError(f"too many indices for a tensor of shape {fmt(x.shape)}: {n_real} were given")
    # identity tests: `in` and `.index` would compare index tensors elementwise
    if not any(i is Ellipsis for i in indices): indices = (*indices, Ellipsis)
    e = next(j for j, i in enumerate(indices) if i is Ellipsis)
    indices = indices[:e] + (slice(None),) * (x.ndim - n_real) + indices[e + 1:]
    # per dim of x: the box (start, count, step) it keeps (an int index keeps 1 element and drops the dim)
    self.base_shape = shape = tuple(x.shape)  # symbolic sizes: basic indices only (advanced ones check for ints)
    self.boxes: list[tuple[sint, sint, int]] = []
    layout: list[int | None] = []   # per output dim of the basic view: the dim of x it comes from, None for new axes
    adv: list[tuple[int, Tensor]] = []  # (output dim of the basic view, index tensor)
    dim = 0
    for i in indices:
      if i is None:
        layout.append(None); continue
      if isinstance(i, np.integer): i = int(i)
      elif isinstance(i, np.ndarray): i = i.tolist()
      elif isinstance(i, slice): i = slice(*(int(v) if isinstance(v, np.integer) else v for v in (i.start, i.stop, i.step)))
      size = shape[dim]
      if isinstance(i, bool): raise IndexError("bool indices are not supported; use masked_select or where")
      if isinstance(i, UOp) or (isinstance(i, slice) and any(isinstance(v, UOp) for v in (i.start, i.stop))) or not isinstance(size, int):
        self.boxes.append(_symbolic_box(i, size, dim, x.shape))
        if not isinstance(i, UOp) and not isinstance(i, int): layout.append(dim)
      elif isinstance(i, int):
        if not -size <= i < size: raise IndexError(f"index {i} is out of bounds for dimension {dim} with size {size} (shape {fmt(x.shape)})")
        self.boxes.append((i % size, 1, 1))
      elif isinstance(i, slice):
        if not all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in (i.start, i.stop, i.step)):
          raise TypeError(f"slice {i} must have int (or None) start, stop and step")
        if i.step == 0: raise ValueError(f"slice {i}: step cannot be zero")
        start, stop, step = i.indices(size)
        count = max(0, -(-(stop - start) // step))
        self.boxes.append((start, count, step)); layout.append(dim)
      elif isinstance(i, (list, tuple, T)):
        size = ints(x.shape, "advanced indexing")[dim]
        if isinstance(i, T):
          _check_index_tensor(i, "indexing")
          t = (i < 0).where(i + size, i)
        else:
          vals = _flat(i)
          if any(isinstance(v, bool) or not isinstance(v, int) for v in vals): raise IndexError(f"index list {i!r} must hold only ints")
          if (bad := [v for v in vals if not -size <= v < size]):
            raise IndexError(f"index {bad[0]} is out of bounds for dimension {dim} with size {size} (shape {fmt(x.shape)})")
          t = T([v % size for v in vals] if vals else [], dtype=dtypes.int32, device=x.device).reshape(_nested_shape(i))
        self.boxes.append((0, size, 1))
        adv.append((len(layout), t)); layout.append(dim)
      else: raise IndexError(f"indices of type {type(i).__name__} are not supported ({i!r})")
      dim += 1
    self.layout, self.adv = layout, adv

  def view(self, x: Tensor) -> Tensor:
    """x with the basic indices applied: shrink, flip (negative steps), stride, new axes and collapsed ints."""
    shrink, flips = [], []
    for start, count, step in self.boxes:
      lo, hi = (start, start + (count - 1) * step + 1) if step > 0 else (start + (count - 1) * step, start + 1)
      shrink.append((lo, hi) if not isinstance(count, int) or count else (start, start) if step > 0 else (0, 0))
      flips.append(step < 0)
    x = x.shrink(tuple(shrink))
    if any(flips): x = x.flip(tuple(d for d, f in enumerate(flips) if f))
    if any(abs(st) != 1 and c > 1 for _, c, st in self.boxes):
      sts = [abs(st) if c > 1 else 1 for _, c, st in self.boxes]
      x = x.pad(tuple((0, c * st - s) for (_, c, _), st, s in zip(self.boxes, sts, x.shape)))
      x = x.reshape(*[v for (_, c, _), st in zip(self.boxes, sts) for v in (c, st)])
      x = x.shrink(tuple(v for (_, c, _) in self.boxes for v in ((0, c), (0, 1)))).reshape(*[c for _, c, _ in self.boxes])
    return x.reshape(tuple(1 if d is None else self.boxes[d][1] for d in self.layout))

  def unview(self, v: Tensor) -> tuple[Tensor, Tensor]:
    """The inverse placement of `v` (shaped like view()'s result) into the base shape, and the bool mask of the
    positions it covers: drop new axes, restore collapsed dims, un-stride (interleave zeros), un-flip, pad back."""
    T = tensor_cls()
    box = tuple(c for _, c, _ in self.boxes)
    sts = [abs(st) if c > 1 else 1 for _, c, st in self.boxes]
    extent = [(c - 1) * st + 1 if c else 0 for c, st in zip(box, sts)]
    los = [0 if not c else start if step > 0 else start + (c - 1) * step for (start, c, step) in self.boxes]
    def place(t: Tensor) -> Tensor:
      if any(st != 1 for st in sts):
        t = t.reshape(*[e for c in box for e in (c, 1)]).pad(tuple(e for st in sts for e in ((0, 0), (0, st - 1))))
        t = t.reshape(*[c * st for c, st in zip(box, sts)]).shrink(tuple((0, e) for e in extent))
      if any(st < 0 for _, _, st in self.boxes): t = t.flip(tuple(d for d, (_, _, st) in enumerate(self.boxes) if st < 0))
      return t.pad(tuple((lo, size - lo - e) for lo, size, e in zip(los, self.base_shape, extent)))
    return place(v.reshape(box)), place(T.ones(box, dtype=dtypes.bool, device=v.device, buffer=False))


def _symbolic_box(i: Any, size: sint, dim: int, shape: tuple[sint, ...]) -> tuple[sint, sint, int]:
  """The box of a basic index that holds a bound Variable or indexes a dim of symbolic size: an int or a Variable
  expression (one element), or a slice with step 1 and non-negative (or symbolic) bounds. Its range is checked against
  the dim's for every value the Variables can take, so one kernel serves the whole range."""
  def bounds(v: sint) -> tuple[int, int]: return (v, v) if isinstance(v, int) else (int(v.vmin), int(v.vmax))
  lo_size = bounds(size)[0]
  if isinstance(i, (int, UOp)):
    if isinstance(i, UOp) and i.dtype is not dtypes.index:
      raise IndexError(f"a UOp index must be a bound Variable expression (dtypes.index), got a {i.op.name} of {i.dtype}")
    lo, hi = bounds(i)
    if lo < 0 or hi >= lo_size:
      raise IndexError(f"index {_show(i)} (values {lo}..{hi}) can be out of range for dim {dim} of size {_show(size)} (shape {fmt(shape)})")
    return (i, 1, 1)
  if not isinstance(i, slice): raise IndexError(f"indices of type {type(i).__name__} are not supported on a symbolic shape ({i!r})")
  if i.step not in (None, 1): raise IndexError(f"slice {_show_slice(i)}: a slice with Variable bounds (or of a symbolic dim) needs step 1")
  for v in (i.start, i.stop):
    if not (v is None or isinstance(v, UOp) or (isinstance(v, int) and not isinstance(v, bool))):
      raise TypeError(f"slice {_show_slice(i)} must have int, bound Variable (or None) start and stop")
  start: sint = 0 if i.start is None else i.start
  stop: sint = size if i.stop is None else i.stop
  slo, (elo, ehi) = bounds(start)[0], bounds(stop)
  if slo < 0 or elo < 0: raise IndexError(f"slice {_show_slice(i)}: negative bounds are not supported with Variables (dim {dim})")
  if i.stop is not None and ehi > bounds(size)[1]:
    raise IndexError(f"slice {_show_slice(i)} (stop up to {ehi}) can run past dim {dim} of size {_show(size)} (shape {fmt(shape)})")
  count = stop - start
  if not isinstance(count, int) and (count := count.simplify()).op is Ops.CONST: count = int(count.arg)  # x[p:p+1] is one row
  if bounds(count)[0] < 0: raise IndexError(f"slice {_show_slice(i)}: its stop can be below its start for some Variable values")
  return (start, count, 1)


def _show(v: Any) -> str: return v.render() if isinstance(v, UOp) else str(v)
def _show_slice(i: slice) -> str:
  return ":".join("" if v is None else _show(v) for v in (i.start, i.stop, *((i.step,) if i.step is not None else ())))


def _adv_layout(x: Tensor, adv: list[tuple[int, Tensor]]) -> tuple[Tensor, Tensor, int, tuple[int, ...], list[int], tuple[int, ...]]:
  """Move the advanced dims of x together (where numpy puts their result: in place when adjacent, else first) and
  flatten them. Returns (x as (*pre, N, *post), the linear index (shape B), position p, B, the permutation, x's
  permuted shape)."""
  dims = [d for d, _ in adv]
  try: B = ints(broadcast_shape(*(t.shape for _, t in adv), op="indexing"), "indexing")
  except ShapeError:  # PyTorch's IndexError (and its words), still a ShapeError
    raise IndexShapeError("shape mismatch: indexing tensors could not be broadcast together with shapes "
                          + ", ".join(fmt(t.shape) for _, t in adv)) from None
  p = dims[0] if dims == list(range(dims[0], dims[0] + len(dims))) else 0
  rest = [d for d in range(x.ndim) if d not in dims]
  order = rest[:p] + dims + rest[p:]
  xp = x.permute(*order)
  sizes = [ints(x.shape, "indexing")[d] for d in dims]
  ts = [broadcast_to(t, B, "indexing") for _, t in adv]
  lin = ts[0]  # one index: GATHER/SCATTER check its range themselves
  if len(ts) > 1:
    lin, valid = ts[0] * prod(sizes[1:]), (ts[0] >= 0) & (ts[0] < sizes[0])
    for j in range(1, len(ts)): lin, valid = lin + ts[j] * prod(sizes[j + 1:]), valid & (ts[j] >= 0) & (ts[j] < sizes[j])
    lin = valid.where(lin, -1)  # out of range in any index selects nothing
  perm_shape = ints(xp.shape, "indexing")
  xp = xp.reshape(*perm_shape[:p], prod(sizes), *perm_shape[p + len(dims):])
  return xp, lin, p, B, order, perm_shape


def _getitem(self: Tensor, indices: Any) -> Tensor:
  parsed = _Parsed(self, indices)
  x = parsed.view(self)
  if not parsed.adv: return x
  xp, lin, p, B, _, _ = _adv_layout(x, parsed.adv)
  shape = ints(xp.shape, "indexing")
  pre, post, nb = shape[:p], shape[p + 1:], prod(B)
  idx = lin.reshape(*(1,) * len(pre), nb, *(1,) * len(post)).expand(*pre, nb, *post)
  return gather_axis(xp, idx, len(pre)).reshape((*pre, *B, *post))  # a tuple: () for a 0-d index into a 1-d tensor


def _setitem_value(self: Tensor, indices: Any, v: Any) -> Tensor:
  """The whole of `self` with `v` written at `indices` (a functional update: where(mask, placed v, self))."""
  T = tensor_cls()
  parsed = _Parsed(self, indices)
  x = parsed.view(self)
  if isinstance(v, T): v = v.cast(self.dtype)
  elif isinstance(v, (bool, int, float)): v = T.full((), v, dtype=self.dtype, device=self.device, buffer=False)  # a constant, no buffer
  else: v = T(v, dtype=self.dtype, device=self.device)
  if not parsed.adv:
    placed, mask = parsed.unview(broadcast_to(v, ints(x.shape, "setitem"), "setitem"))
    return mask.where(placed, self)
  xp, lin, p, B, order, perm_shape = _adv_layout(x, parsed.adv)
  shape = ints(xp.shape, "setitem")
  pre, post = shape[:p], shape[p + 1:]
  if (nb := prod(B)) == 0: return self  # nothing is written
  vb = broadcast_to(v, (*pre, *B, *post), "setitem").reshape(*pre, nb, *post)
  idx = lin.reshape(*(1,) * len(pre), nb, *(1,) * len(post)).expand(*pre, nb, *post)
  # the store loop runs in index order, so with repeated indices the last write wins (numpy)
  merged = scatter_axis(xp, idx, vb, len(pre), "set").reshape(perm_shape).permute(*[order.index(d) for d in range(len(order))])
  placed, mask = parsed.unview(merged)
  return mask.where(placed, self)


def _identity(reduce: str, dt: DType) -> Any:
  return {"sum": 0, "mean": 0, "prod": 1, "amax": dtypes.min(dt), "amin": dtypes.max(dt)}[reduce]


def _triangle(x: Tensor, diagonal: int, lower: bool) -> Tensor:
  T = tensor_cls()
  if x.ndim < 2: raise ShapeError(f"{'tril' if lower else 'triu'} needs at least 2 dims, got shape {fmt(x.shape)}")
  r, c = ints(x.shape[-2:], "tril/triu")
  diff = T.arange(c, device=x.device).unsqueeze(0) - T.arange(r, device=x.device).unsqueeze(1)  # j - i
  keep = diff <= diagonal if lower else diff >= diagonal
  return keep.where(x, False if x.dtype == dtypes.bool else 0)


# ---------------------------------------------------------------- the methods

def getitem(self: Tensor, indices: Any) -> Tensor:
  """Index like numpy/PyTorch: ints, slices (any step), `None`, `...`, and integer tensors or lists (advanced
  indexing; several index tensors broadcast together). Ints collapse their dim first, as in PyTorch."""
  return _getitem(self, indices)


def setitem(self: Tensor, indices: Any, v: Any) -> None:
  """Write `v` (a tensor or Python value, broadcast to the indexed shape) at `indices`, through an ASSIGN on `self`.
  With repeated advanced indices the last write wins. Basic indices (ints, slices of step ±1, bound Variables) into a
  realized tensor are written now, in place, by a kernel over the indexed region only (a KV cache's one new row per
  step); with Variable bounds that kernel takes their values, so it serves every position."""
  T = tensor_cls()
  parsed = _Parsed(self, indices)
  symbolic = any(not isinstance(b, int) for box in parsed.boxes for b in box[:2])
  grad = self.requires_grad or (isinstance(v, T) and v.requires_grad)
  if parsed.adv or any(abs(st) != 1 for _, _, st in parsed.boxes) or not (symbolic or (is_writable_view(self.uop) and not grad)):
    if symbolic: raise IndexError("setitem with Variable bounds takes ints, slices of step 1 and Variables, no tensor or list indices")
    self.assign(_setitem_value(self, indices, v))
    return
  if not is_writable_view(self.uop): self.realize()  # a lazy tensor gets its buffer, then the region is written into it
  target = parsed.view(self)
  if not isinstance(v, T): v = T.full((), v, dtype=self.dtype, device=self.device, buffer=False) if isinstance(v, (bool, int, float)) \
    else T(v, dtype=self.dtype, device=self.device)
  target.assign(v.cast(self.dtype)).realize()


def gather(self: Tensor, dim: int, index: Tensor) -> Tensor:
  """out[i][j][k] = self[index[i][j][k]][j][k] for dim 0 (and so on): `index` has self's ndim and is no larger
  than self in the other dims."""
  dim = resolve_dim(dim, self.ndim, "gather")
  _check_index_tensor(index, "gather")
  if index.ndim != self.ndim: raise ShapeError(f"gather: index {fmt(index.shape)} must have the ndim of self {fmt(self.shape)}")
  if self.ndim == 0: return self.reshape(1).gather(0, index.reshape(1)).reshape(())
  if any(i > s for d, (s, i) in enumerate(zip(self.shape, index.shape)) if d != dim):
    raise ShapeError(f"gather: index {fmt(index.shape)} is larger than self {fmt(self.shape)} outside dim {dim}")
  x = self.shrink(tuple((0, s if d == dim else i) for d, (s, i) in enumerate(zip(self.shape, index.shape))))
  return gather_axis(x, index, dim)


def _scatter_args(self: Tensor, dim: int, index: Tensor, src: Tensor, op: str) -> tuple[int, Tensor]:
  """The checked dim, and src cut to index's shape."""
  dim = resolve_dim(dim, self.ndim, op)
  _check_index_tensor(index, op)
  if index.ndim != self.ndim: raise ShapeError(f"{op}: index {fmt(index.shape)} must have the ndim of self {fmt(self.shape)}")
  if any(i > s for d, (s, i) in enumerate(zip(self.shape, index.shape)) if d != dim):
    raise ShapeError(f"{op}: index {fmt(index.shape)} is larger than self {fmt(self.shape)} outside dim {dim}")
  if src.ndim != self.ndim or any(i > s for s, i in zip(src.shape, index.shape)):
    raise ShapeError(f"{op}: index {fmt(index.shape)} is larger than src {fmt(src.shape)}")
  return dim, src.shrink(tuple((0, i) for i in index.shape))


def scatter(self: Tensor, dim: int, index: Tensor, src: Tensor | float | int | bool,
            reduce: Literal["multiply", "add"] | None = None) -> Tensor:
  """self with src[i][j] written at [index[i][j]][j] (dim 0); src may be a Python value. `reduce='add'` or
  `'multiply'` combines with the existing value; without it, a position hit twice takes the last write."""
  T = tensor_cls()
  if reduce not in (None, "add", "multiply"): raise ArgumentError(f"scatter: reduce must be None, 'add' or 'multiply', got {reduce!r}")
  if not isinstance(src, T): src = T.full(index.shape, src, dtype=self.dtype, device=self.device, buffer=False)
  if reduce is not None: return self.scatter_reduce(dim, index, src, "sum" if reduce == "add" else "prod")
  if src.dtype != self.dtype: raise DTypeError(f"scatter: src dtype {src.dtype} differs from self's {self.dtype}")
  dim, s = _scatter_args(self, dim, index, src, "scatter")
  return scatter_axis(self, index, s, dim, "set")


def scatter_reduce(self: Tensor, dim: int, index: Tensor, src: Tensor, reduce: Literal["sum", "prod", "mean", "amax", "amin"],
                   include_self: bool = True) -> Tensor:
  """self with src reduced into the positions `index` names along `dim`. `include_self=False` leaves self's value
  out of the reduction at the positions written (others keep self). 'max' and 'min' mean 'amax' and 'amin', as in
  PyTorch's forward."""
  T = tensor_cls()
  reduce = {"max": "amax", "min": "amin"}.get(reduce, reduce)  # type: ignore[assignment]
  if reduce not in ("sum", "prod", "mean", "amax", "amin"):
    raise ArgumentError(f"scatter_reduce: reduce must be one of 'sum', 'prod', 'mean', 'amax', 'amin', got {reduce!r}")
  if src.dtype != self.dtype: raise DTypeError(f"scatter_reduce: src dtype {src.dtype} differs from self's {self.dtype}")
  dim, s = _scatter_args(self, dim, index, src, "scatter_reduce")
  def fill(v: Any, dt: DType, shape: tuple) -> Tensor: return T.full(shape, v, dtype=dt, device=self.device, buffer=False)
  hit = None if include_self else scatter_axis(fill(False, dtypes.bool, self.shape), index, fill(True, dtypes.bool, index.shape), dim, "set")
  keep = self if hit is None else hit.where(_identity(reduce, self.dtype), self)
  how = {"sum": "add", "mean": "add", "prod": "mul", "amax": "max", "amin": "min"}[reduce]
  total = scatter_axis(keep, index, s, dim, how)
  if reduce != "mean": return total
  count = scatter_axis(fill(0, dtypes.int32, self.shape), index, fill(1, dtypes.int32, index.shape), dim, "add")
  count = (count + (1 if hit is None else hit.logical_not())).maximum(1).cast(self.dtype)
  return total.div(count, rounding_mode="floor") if dtypes.is_int(self.dtype) else total / count


def masked_select(self: Tensor, mask: Tensor, size: int | None = None, fill_value: Any = 0) -> Tensor:
  """The elements of self where `mask` (bool, broadcast to self) is True, as a 1-d tensor. Without `size` the length
  is the number of True values (this reads the count back from the device); with `size` the result has exactly
  `size` elements, cut or padded with `fill_value`."""
  T = tensor_cls()
  if mask.dtype != dtypes.bool: raise TypeError(f"masked_select: mask must be bool, got {mask.dtype}")
  out_shape = ints(broadcast_shape(self.shape, mask.shape, op="masked_select"), "masked_select")
  x, m = broadcast_to(self, out_shape, "masked_select").flatten(), broadcast_to(mask, out_shape, "masked_select").flatten()
  if size is None: size = int(m.sum().item()) if m.shape[0] else 0
  if size < 0: raise ValueError(f"masked_select: size must be >= 0, got {size}")
  pos = m.cumsum(dtype=dtypes.int32) - 1  # output position of each selected element
  sel = m.unsqueeze(0) & pos.unsqueeze(0).eq(T.arange(size, device=self.device).unsqueeze(1))  # (size, n)
  out = select_sum(sel, x.unsqueeze(0), 1)
  return sel.any(1).where(out, T.full((size,), fill_value, dtype=self.dtype, device=self.device, buffer=False)) if size else out


def nonzero(self: Tensor, size: int | None = None, fill_value: Any = 0) -> Tensor:
  """The indices of the non-zero elements, shape (count, ndim), int32. Without `size` the count is read back from
  the device; with `size` the result has `size` rows, cut or padded with `fill_value`."""
  T = tensor_cls()
  nz = self.ne(0)
  if self.ndim == 0:
    n = int(nz.item()) if size is None else size
    return T.zeros((n, 0), dtype=dtypes.int32, device=self.device, buffer=False)
  coords = T.stack(*[T.arange(s, dtype=dtypes.int32, device=self.device)
                          .reshape(*[s if j == i else 1 for j in range(self.ndim)]).expand(self.shape).flatten()
                          for i, s in enumerate(ints(self.shape, "nonzero"))], dim=-1)  # (numel, ndim)
  mask = nz.flatten().unsqueeze(-1).expand(coords.shape)
  return coords.masked_select(mask, None if size is None else size * self.ndim, fill_value).reshape(-1, self.ndim)


def tril(self: Tensor, diagonal: int = 0) -> Tensor:
  """The lower triangle of the last two dims (j - i <= diagonal); the rest is 0."""
  return _triangle(self, diagonal, lower=True)


def triu(self: Tensor, diagonal: int = 0) -> Tensor:
  """The upper triangle of the last two dims (j - i >= diagonal); the rest is 0."""
  return _triangle(self, diagonal, lower=False)


def diag(self: Tensor) -> Tensor:
  """A 1-d tensor → the square matrix with it on the diagonal (a view: pad and reshape); a 2-d one → its diagonal."""
  if self.ndim == 2: return self.diagonal()
  if self.ndim != 1: raise ShapeError(f"diag needs a 1-d or 2-d tensor, got shape {fmt(self.shape)}")
  n = self.shape[0]
  # each value followed by n zeros, read back n per row: the values land on the diagonal
  return self.unsqueeze(-1).pad(((0, 0), (0, n))).flatten().shrink(((0, n * n),)).reshape(n, n)


def diagonal(self: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
  """The diagonal (`offset` above the main one, negative below) of dims dim1 and dim2, as a new last dim (a view)."""
  d1, d2 = resolve_dim(dim1, self.ndim, "diagonal"), resolve_dim(dim2, self.ndim, "diagonal")
  if d1 == d2: raise ShapeError(f"diagonal: dim1 and dim2 must differ, both are {d1}")
  x = self.permute(*[i for i in range(self.ndim) if i not in (d1, d2)], d1, d2)
  *pre, r, c = x.shape
  r0, c0 = (0, offset) if offset >= 0 else (-offset, 0)
  d = max(0, min(r - r0, c - c0))
  x = x.shrink(tuple((0, p) for p in pre) + ((min(r0, r), min(r0, r) + d), (min(c0, c), min(c0, c) + d)))
  if d == 0: return x.reshape(*pre, 0)
  # row i of the flattened d*d block read with stride d+1 hits (i, i)
  x = x.reshape(*pre, d * d).pad(tuple((0, 0) for _ in pre) + ((0, d),)).reshape(*pre, d, d + 1)
  return x.shrink(tuple((0, p) for p in pre) + ((0, d), (0, 1))).reshape(*pre, d)


def unfold(self: Tensor, dim: int, size: int, step: int) -> Tensor:
  """Windows of `size` every `step` along `dim`: that dim becomes the window count and the windows a new last dim."""
  dim = resolve_dim(dim, self.ndim, "unfold")
  n = ints(self.shape, "unfold")[dim] if self.ndim else 1
  if not all(isinstance(v, int) and not isinstance(v, bool) for v in (size, step)):
    raise TypeError(f"unfold: size and step must be ints, got size={size!r}, step={step!r}")
  if size < 0 or step <= 0: raise ArgumentError(f"unfold: size must be >= 0 and step > 0, got size={size}, step={step}")
  if size > n: raise ShapeError(f"unfold: size {size} is larger than dim {dim} of shape {fmt(self.shape)}")
  x = self.reshape(1) if self.ndim == 0 else self
  order = [i for i in range(x.ndim) if i != dim] + [dim]
  xt = x.permute(*order)
  if size == 0:  # empty windows: any empty view of the right shape
    out = xt.shrink(tuple((0, 0) if i == x.ndim - 1 else (0, s) for i, s in enumerate(xt.shape))).reshape(*xt.shape[:-1], n // step + 1, 0)
  else: out = pool(xt, (size,), step)
  out = out.permute(*[order.index(i) for i in range(x.ndim)], x.ndim)
  return out.reshape(size) if self.ndim == 0 else out


class IndexingMixin:
  """Mixed into `Tensor`: indexing methods."""

  __getitem__ = getitem; __setitem__ = setitem; gather = gather; scatter = scatter; scatter_reduce = scatter_reduce
  masked_select = masked_select; nonzero = nonzero; tril = tril; triu = triu; diag = diag; diagonal = diagonal; unfold = unfold
