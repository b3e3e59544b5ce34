"""Movement Tensor methods. Each one is a chain of the UOp movement ops (RESHAPE, EXPAND, PERMUTE, PAD, SHRINK, FLIP):
no data is copied; the scheduler turns them into index arithmetic in whatever kernel reads the result. `cat` and the
non-constant pad modes combine shifted views with an elementwise op."""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from plugrad.dtype import dtypes, least_upper_dtype
from plugrad.helpers import ceildiv, prod
from plugrad.helpers import flatten as flat_list
from plugrad.tensor.helpers import (
  ArgumentError,
  UnsupportedModeError,
  argfix,
  broadcast_shape,
  const_uop,
  ints,
  resolve_dim,
  resolve_dims,
  tensor_cls,
)
from plugrad.uop.ops import sint
from plugrad.uop.shape import ShapeError, fmt

if TYPE_CHECKING:
  from plugrad.tensor.tensor import Tensor

PAD_MODES = ("constant", "reflect", "replicate", "circular")


def reshape(self: Tensor, shape: Any, *args: Any) -> Tensor:
  """A new shape with the same elements; one size may be -1 (inferred), and None keeps that axis's size."""
  new = tuple(self.shape[i] if s is None else s for i, s in enumerate(argfix(shape, *args)))
  if not all(isinstance(s, int) and not isinstance(s, bool) or hasattr(s, "op") for s in new):
    raise TypeError(f"reshape: sizes must be ints, got {new!r}")
  if (holes := sum(1 for s in new if isinstance(s, int) and s == -1)) > 1: raise ShapeError(f"reshape to {fmt(new)}: only one size can be -1")
  if holes:
    known = prod(s for s in new if not (isinstance(s, int) and s == -1))
    if known == 0 or self.numel() % known != 0:
      raise ShapeError(f"cannot reshape {fmt(self.shape)} ({self.numel()} elements) to {fmt(new)}: the -1 size cannot be inferred")
    new = tuple(self.numel() // known if isinstance(s, int) and s == -1 else s for s in new)
  return self._wrap(self.uop.reshape(new))


def permute(self: Tensor, order: Any, *args: Any) -> Tensor:
  order = argfix(order, *args)
  if len(order) != self.ndim: raise ShapeError(f"permute of shape {fmt(self.shape)} needs {self.ndim} axes, got order {order}")
  return self._wrap(self.uop.permute(resolve_dims(self.shape, order, "permute") if self.ndim else ()))


def transpose(self: Tensor, dim0: int = 1, dim1: int = 0) -> Tensor:
  d0, d1 = resolve_dim(self.shape, dim0), resolve_dim(self.shape, dim1)
  order = list(range(self.ndim))
  if self.ndim == 0: return self
  order[d0], order[d1] = order[d1], order[d0]
  return self.permute(order)


def broadcast_to(self: Tensor, shape: tuple[sint, ...]) -> Tensor:
  """numpy's broadcast_to: new leading axes, size-1 axes expanded."""
  if tuple(self.shape) == tuple(shape): return self
  if len(shape) < self.ndim: raise ShapeError(f"cannot broadcast shape {fmt(self.shape)} to {fmt(shape)}: fewer dimensions")
  broadcast_shape(self.shape, shape, op=f"broadcast {fmt(self.shape)} to {fmt(shape)}")
  return self._wrap(self.uop.reshape((1,) * (len(shape) - self.ndim) + tuple(self.shape)).expand(tuple(shape)))


def expand(self: Tensor, shape: Any, *args: Any) -> Tensor:
  """Broadcast to `shape` (new axes on the left; -1 or None keeps a size)."""
  new = argfix(shape, *args)
  if len(new) < self.ndim: raise ShapeError(f"cannot expand shape {fmt(self.shape)} to {fmt(new)}: fewer dimensions")
  old = (1,) * (len(new) - self.ndim) + tuple(self.shape)
  target = tuple(o if n is None or (isinstance(n, int) and n == -1) else n for o, n in zip(old, new))
  for i, (o, n) in enumerate(zip(old, target)):
    if isinstance(o, int) and isinstance(n, int) and o != 1 and o != n:
      raise ShapeError(f"cannot expand {fmt(self.shape)} to {fmt(new)}: axis {i} has size {o}; only size-1 axes expand")
  return self._wrap(self.uop.reshape(old).expand(target))


def shrink(self: Tensor, arg: tuple[tuple[sint, sint] | None, ...]) -> Tensor:
  """Keep [start, end) of each axis (None keeps the whole axis)."""
  if len(arg) != self.ndim: raise ShapeError(f"shrink of shape {fmt(self.shape)} needs {self.ndim} (start, end) pairs, got {len(arg)}")
  return self._wrap(self.uop.shrink(tuple((0, s) if a is None else a for a, s in zip(arg, self.shape))))


def _pad_pairs(self: Tensor, padding: Any) -> list[tuple[int, int]]:
  padding = tuple(padding)
  if all(isinstance(p, int) for p in padding):
    # PyTorch's flat form: (left, right) of the last axis first, then the axis before it, ...
    if len(padding) % 2 or len(padding) // 2 > self.ndim:
      raise ShapeError(f"pad: a flat padding needs an even number of values, at most 2 per axis of shape {fmt(self.shape)}; got {padding}")
    pairs = [(padding[2 * i], padding[2 * i + 1]) for i in range(len(padding) // 2)][::-1]
    return [(0, 0)] * (self.ndim - len(pairs)) + pairs
  if len(padding) != self.ndim: raise ShapeError(f"pad: shape {fmt(self.shape)} needs {self.ndim} (before, after) pairs, got {len(padding)}")
  out = []
  for p in padding:
    if p is None: out.append((0, 0))
    elif isinstance(p, (tuple, list)) and len(p) == 2 and all(isinstance(v, int) for v in p): out.append((p[0], p[1]))
    else: raise TypeError(f"pad: each axis takes None or a (before, after) pair of ints, got {p!r}")
  return out


def pad(self: Tensor, padding: Any, mode: str = "constant", value: float | int | bool = 0.0) -> Tensor:
  """Pad (or, with negative amounts, crop) each axis. `padding` is PyTorch's flat form `(left, right, top, bottom, ...)`
  starting at the last axis, or one `(before, after)` pair (or None) per axis."""
  if mode not in PAD_MODES: raise UnsupportedModeError(f"pad: mode must be one of {PAD_MODES}, got {mode!r}")
  # only a constant pad has a fill: a value with another mode would be silently ignored (PyTorch raises too)
  if mode != "constant" and value != 0: raise ArgumentError(f"pad: mode {mode!r} takes no value, got value={value!r}")
  pairs = _pad_pairs(self, padding)
  crop = [(max(-b, 0), max(-a, 0)) for b, a in pairs]
  grow = [(max(b, 0), max(a, 0)) for b, a in pairs]
  if mode == "constant":
    # negative amounts crop first (the same result either way, and the padded view is smaller)
    x = self.shrink(tuple((b, s - a) for (b, a), s in zip(crop, self.shape))) if any(map(any, crop)) else self
    if all(p == (0, 0) for p in grow): return x
    padded = x._wrap(x.uop.pad(tuple(grow)))
    if value == 0: return padded
    inside = x._wrap(const_uop(True, dtypes.bool, x.device, x.shape).pad(tuple(grow)))
    return inside.where(padded, value)
  # circular pads the cropped input; reflect and replicate pad the whole input, then crop (as PyTorch: a reflection is
  # about the input's own edges)
  if mode == "circular" and any(map(any, crop)):
    return self.shrink(tuple((b, s - a) for (b, a), s in zip(crop, self.shape))).pad(tuple(grow), mode=mode)
  x = self
  for axis, (b, a) in enumerate(grow):
    if b or a: x = _pad_axis(x, axis, b, a, mode)
  if not any(map(any, crop)): return x
  n = ints(x.shape, f"{mode} padding")
  if any(b + a > s for (b, a), s in zip(crop, n)):
    raise ShapeError(f"pad: the negative amounts of {tuple(pairs)} crop more than the {mode}-padded shape {fmt(x.shape)} holds")
  return x.shrink(tuple((b, s - a) for (b, a), s in zip(crop, n)))


def _slice(x: Tensor, axis: int, start: int, end: int) -> Tensor:
  return x.shrink(tuple((start, end) if i == axis else None for i in range(x.ndim)))


def _pad_axis(x: Tensor, axis: int, before: int, after: int, mode: str) -> Tensor:
  n = ints(x.shape, f"{mode} padding")[axis]
  limit = {"reflect": n - 1, "replicate": None, "circular": n}[mode]
  if (limit is not None and max(before, after) > limit) or n == 0:
    need = f"at most {limit}" if limit is not None and n else "a nonempty axis"
    raise ShapeError(f"pad: {mode} padding ({before}, {after}) of axis {axis} needs {need} for shape {fmt(x.shape)}")
  if mode == "reflect":
    left, right = _slice(x, axis, 1, before + 1).flip(axis), _slice(x, axis, n - after - 1, n - 1).flip(axis)
  elif mode == "replicate":
    def edge(i: int, k: int) -> Tensor:
      e = _slice(x, axis, i, i + 1)
      return e.expand(tuple(k if j == axis else s for j, s in enumerate(x.shape)))
    left, right = edge(0, before), edge(n - 1, after)
  else:
    left, right = _slice(x, axis, n - before, n), _slice(x, axis, 0, after)
  return left.cat(x, right, dim=axis)


def flip(self: Tensor, axis: Any, *args: Any) -> Tensor:
  axes = resolve_dims(self.shape, argfix(axis, *args), "flip") if self.ndim else ()
  return self._wrap(self.uop.flip(tuple(i in axes for i in range(self.ndim))))


def flatten(self: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
  if self.ndim == 0: return self.reshape(1)
  start, end = resolve_dim(self.shape, start_dim), resolve_dim(self.shape, end_dim)
  if start > end: raise ShapeError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim} for shape {fmt(self.shape)}")
  return self.reshape(self.shape[:start] + (prod(self.shape[start:end + 1]),) + self.shape[end + 1:])


def unflatten(self: Tensor, dim: int, sizes: tuple[int, ...]) -> Tensor:
  d = resolve_dim(self.shape, dim)
  try: return self.reshape(self.shape[:d] + tuple(sizes) + self.shape[d + 1:])
  except ShapeError:
    raise ShapeError(f"unflatten: axis {dim} of shape {fmt(self.shape)} (size {self.shape[d]}) cannot be split into {tuple(sizes)}") from None


def squeeze(self: Tensor, dim: int | None = None) -> Tensor:
  """Drop size-1 axes (only `dim`, when given; an axis that is not size 1 is kept, as in PyTorch)."""
  if dim is None: return self.reshape(tuple(s for s in self.shape if s != 1))
  d = resolve_dim(self.shape, dim)
  return self if self.ndim == 0 or self.shape[d] != 1 else self.reshape(self.shape[:d] + self.shape[d + 1:])


def unsqueeze(self: Tensor, dim: int) -> Tensor:
  d = resolve_dim(self.shape, dim, extra=True)
  return self.reshape(self.shape[:d] + (1,) + self.shape[d:])


def _tensor_list(op: str, self: Any, args: tuple[Any, ...]) -> tuple[Tensor, ...]:
  """The tensors of `cat`/`stack`, given as `a.cat(b, c)`, `Tensor.cat(a, b)` or PyTorch's `Tensor.cat([a, b])`: a
  list or tuple in the first position (or as the only argument after self) is unpacked."""
  if isinstance(self, (list, tuple)): ts = (*self, *args)
  elif len(args) == 1 and isinstance(args[0], (list, tuple)): ts = (self, *args[0])
  else: ts = (self, *args)
  if not ts: raise ArgumentError(f"{op} needs a non-empty list of tensors")
  T = tensor_cls()
  for i, t in enumerate(ts):
    if not isinstance(t, T): raise TypeError(f"{op}: expected a Tensor as element {i}, got {type(t).__name__} ({t!r:.60})")
  return ts


def cat(self: Tensor | Sequence[Tensor], *args: Tensor | Sequence[Tensor], dim: int = 0) -> Tensor:
  """Join along `dim`: every tensor is padded to the full length and the padded tensors are added."""
  ts = _tensor_list("cat", self, args)
  self = ts[0]
  if (zero := next((i for i, t in enumerate(ts) if t.ndim == 0), None)) is not None:
    raise ShapeError(f"cat: a zero-dimensional tensor (at position {zero}) cannot be concatenated; use stack")
  if any(t.ndim != self.ndim for t in ts):
    raise ShapeError(f"cat needs tensors with the same number (> 0) of dimensions, got shapes {', '.join(fmt(t.shape) for t in ts)}")
  d = resolve_dim(self.shape, dim)
  for t in ts:
    if any(a != b for i, (a, b) in enumerate(zip(t.shape, self.shape)) if i != d):
      raise ShapeError(f"cat along dim {dim}: shapes {fmt(self.shape)} and {fmt(t.shape)} differ outside that axis")
    if t.device != self.device: raise ValueError(f"cat: tensors on different devices ({self.device} and {t.device})")
  dt = least_upper_dtype(*(t.dtype for t in ts))
  sizes = [ints(t.shape, "cat")[d] for t in ts]
  total, parts, offset = sum(sizes), [], 0
  for t, n in zip(ts, sizes):
    parts.append(t.cast(dt).pad(tuple((offset, total - offset - n) if i == d else None for i in range(self.ndim))))
    offset += n
  return functools.reduce(lambda a, b: a + b, parts)


def stack(self: Tensor | Sequence[Tensor], *args: Tensor | Sequence[Tensor], dim: int = 0) -> Tensor:
  ts = _tensor_list("stack", self, args)
  self = ts[0]
  for t in ts:
    if t.shape != self.shape: raise ShapeError(f"stack needs tensors of one shape, got {fmt(self.shape)} and {fmt(t.shape)}")
  d = resolve_dim(self.shape, dim, extra=True)
  return ts[0].unsqueeze(d).cat(*(t.unsqueeze(d) for t in ts[1:]), dim=d)


def split(self: Tensor, sizes: int | Any, dim: int = 0) -> tuple[Tensor, ...]:
  d = resolve_dim(self.shape, dim)
  n = ints(self.shape, "split")[d]
  if isinstance(sizes, int):
    if sizes <= 0: raise ValueError(f"split: the chunk size must be > 0, got {sizes}")
    sizes = [min(sizes, n - i) for i in range(0, n, sizes)] or [0]
  sizes = list(sizes)
  if sum(sizes) != n or any(s < 0 for s in sizes):
    raise ShapeError(f"split: sizes {sizes} must be >= 0 and add up to {n}, the size of axis {dim} of shape {fmt(self.shape)}")
  starts = [sum(sizes[:i]) for i in range(len(sizes))]
  return tuple(_slice(self, d, s, s + k) for s, k in zip(starts, sizes))


def chunk(self: Tensor, chunks: int, dim: int = 0) -> list[Tensor]:
  if not isinstance(chunks, int) or chunks <= 0: raise ValueError(f"chunk: chunks must be an int > 0, got {chunks!r}")
  n = ints(self.shape, "chunk")[resolve_dim(self.shape, dim)]
  return list(self.split(ceildiv(n, chunks) if n else [0] * chunks, dim))


def repeat(self: Tensor, repeats: Any, *args: Any) -> Tensor:
  """Tile the tensor `repeats[i]` times along each axis (extra leading repeats add axes)."""
  reps = argfix(repeats, *args)
  if len(reps) < self.ndim: raise ShapeError(f"repeat: {len(reps)} repeat counts for shape {fmt(self.shape)}; need at least {self.ndim}")
  if any(not isinstance(r, int) or r < 0 for r in reps): raise ValueError(f"repeat: counts must be ints >= 0, got {reps}")
  base = (1,) * (len(reps) - self.ndim) + tuple(self.shape)
  x = self.reshape(flat_list((1, s) for s in base)).expand(flat_list((r, s) for r, s in zip(reps, base)))
  return x.reshape(tuple(r * s for r, s in zip(reps, base)))


def repeat_interleave(self: Tensor, repeats: int, dim: int | None = None) -> Tensor:
  if not isinstance(repeats, int) or repeats < 0: raise ValueError(f"repeat_interleave: repeats must be an int >= 0, got {repeats!r}")
  x = self.flatten() if dim is None else self
  d = 0 if dim is None else resolve_dim(x.shape, dim)
  s = x.shape
  return x.reshape(s[:d + 1] + (1,) + s[d + 1:]).expand(s[:d + 1] + (repeats,) + s[d + 1:]).reshape(s[:d] + (s[d] * repeats,) + s[d + 1:])


def roll(self: Tensor, shifts: int | tuple[int, ...], dims: int | tuple[int, ...] | None = None) -> Tensor:
  if dims is None: return self.flatten().roll(shifts, 0).reshape(self.shape)
  sh, ds = (shifts,) if isinstance(shifts, int) else tuple(shifts), (dims,) if isinstance(dims, int) else tuple(dims)
  if len(sh) != len(ds): raise ShapeError(f"roll: {len(sh)} shifts for {len(ds)} dims")
  x = self
  for s, d in zip(sh, ds):
    d = resolve_dim(x.shape, d)
    n = ints(x.shape, "roll")[d]
    if n == 0 or s % n == 0: continue
    k = s % n
    # two copies side by side (a view), then the window that starts k before the end of the first copy
    doubled = x.repeat(tuple(2 if i == d else 1 for i in range(x.ndim)))
    x = _slice(doubled, d, n - k, 2 * n - k)
  return x


def T(self: Tensor) -> Tensor: return self.transpose()


class MovementMixin:
  """Mixed into `Tensor`: the movement (view) methods, joining and splitting."""

  reshape = reshape; view = reshape; permute = permute; transpose = transpose; expand = expand; pad = pad
  flip = flip; flatten = flatten; unflatten = unflatten; squeeze = squeeze; unsqueeze = unsqueeze
  cat = cat; stack = stack; split = split; chunk = chunk; repeat = repeat; repeat_interleave = repeat_interleave
  roll = roll; shrink = shrink; _broadcast_to = broadcast_to
  T = property(T)
