"""Multi-device tensors (docs/sharding.md): a tensor graph whose values live on several devices is lowered, before it is
scheduled, into ordinary single-device graphs joined by COPYs, so its kernels and copies are scheduled, run, captured by
TinyJit and planned by the memory planner like any others.

A value on the device tuple `devices` is, once lowered, MULTI(*pieces, arg=axis): piece i is an ordinary graph on
devices[i]. With axis None every piece holds the whole value (replicated); with an axis, piece i holds rows [lo, hi)
of that axis (its `bounds`), the pieces in device order (sharded). The logical graph the Tensor methods build on such
values (ALU, movement, REDUCE_AXIS, COPY ... over a tuple DEVICE, with the full logical shapes) is rewritten bottom-up,
one rule per op:

* elementwise ops run per piece, their operands first brought to the layout of the first sharded one: a replicated
  operand is sliced where it lies (no copy), one sharded differently is moved by copies;
* movement ops along unsharded axes run per piece; along the sharded axis shrink, pad and a reshape that keeps every
  piece a whole block move the piece boundaries, and what cannot (a flip, a reshape across pieces) moves data first;
* a reduction over the sharded axis reduces each piece, then all-reduces: every device receives every partial result
  (COPY) and combines them in device order, so all devices hold the same bits;
* COPY to one device gathers (the pieces copied over and joined by pad + add); COPY to a device tuple shards along its
  arg (an axis), replicates (arg None) or reshards.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from plugrad.dtype import DType, dtypes
from plugrad.engine.buffers import new_buffer
from plugrad.errors import DeviceMismatchError, ShardAxisError, ShardingError
from plugrad.uop.ops import GroupOp, Ops, UOp, sint
from plugrad.uop.pattern import PatternMatcher, UPat
from plugrad.uop.rewrite import graph_rewrite
from plugrad.uop.shape import fmt

Devices = tuple[str, ...]
Bounds = tuple[tuple[int, int], ...]


class _Seen:
  # set once anything multi-device is made: until then the scheduler skips looking for it (single-device programs pay nothing)
  any = False


def note_multi() -> None: _Seen.any = True


def multi(pieces: Sequence[UOp], axis: int | None) -> UOp:
  """MULTI of single-device `pieces` (one per device, in device order), sharded along `axis` or replicated (None)."""
  _Seen.any = True
  return UOp(Ops.MULTI, pieces[0].dtype, tuple(pieces), axis)


def per_device(device: str | Devices, make: Callable[[str], UOp]) -> UOp:
  """`make(device)`, or for a device tuple the replicated MULTI of `make(d)` for each device."""
  return make(device) if isinstance(device, str) else multi([make(d) for d in device], None)


def devices_of(m: UOp) -> Devices: return tuple(p.tensor_device for p in m.src)


def bounds_of(m: UOp) -> Bounds:
  """The [lo, hi) rows of each piece of a sharded MULTI along its axis (() for a replicated one)."""
  if m.arg is None: return ()
  out, lo = [], 0
  for p in m.src:
    n = _dim(p.shape, m.arg)
    out.append((lo, lo + n))
    lo += n
  return tuple(out)


def split_bounds(n: int, k: int) -> Bounds:
  """`n` rows over `k` devices: pieces of ceil(n / k) rows in device order, so the last ones are shorter (or empty)."""
  c = -(-n // k)
  return tuple((min(i * c, n), min((i + 1) * c, n)) for i in range(k))


def has_multi(roots: Sequence[UOp]) -> bool:
  """Whether any of these graphs has a value on several devices."""
  if not _Seen.any: return False
  return any(u.op is Ops.MULTI or (u.op is Ops.DEVICE and isinstance(u.arg, tuple)) for r in roots for u in r.toposort)


def _dim(shape: tuple[sint, ...] | None, axis: int) -> int:
  assert shape is not None
  if not isinstance(n := shape[axis], int):
    raise ShardAxisError(f"axis {axis} of shape {fmt(shape)} is symbolic: a sharded axis needs a concrete size")
  return n


def _device(d: str | Devices) -> UOp: return UOp(Ops.DEVICE, dtypes.void, (), d)
def _to(x: UOp, d: str) -> UOp: return x if x.tensor_device == d else UOp(Ops.COPY, x.dtype, (x, _device(d)))


def _cut(x: UOp, axis: int, lo: int, hi: int) -> UOp:
  shape = x.shape
  assert shape is not None
  return x.shrink(tuple((lo, hi) if d == axis else (0, n) for d, n in enumerate(shape)))


def _join(parts: list[tuple[int, UOp]], axis: int, shape: tuple[sint, ...], dev: str, dtype: DType) -> UOp:
  """The parts (offset along `axis`, value on `dev`) placed in one value of `shape`: each padded to the full length and
  the padded parts added (OR for bools), as Tensor.cat does; zeros where no part lies."""
  total = _dim(shape, axis)
  if len(parts) == 1 and parts[0][0] == 0 and _dim(parts[0][1].shape, axis) == total: return parts[0][1]
  if not parts:  # an empty region, or zeros
    zero = UOp(Ops.CONST, dtype, (_device(dev),), dtypes.as_const(0, dtype))
    return zero.reshape((1,) * len(shape)).expand(shape) if shape else zero
  padded = []
  for off, p in parts:
    n = _dim(p.shape, axis)
    padded.append(p.pad(tuple((off, total - off - n) if d == axis else (0, 0) for d in range(len(shape)))))
  op = Ops.OR if padded[0].dtype is dtypes.bool else Ops.ADD
  return functools.reduce(lambda a, b: a.alu(op, b), padded)


def _region(x: UOp, dev: str, axis: int | None, lo: int = 0, hi: int = 0) -> UOp:
  """Rows [lo, hi) along `axis` of the (lowered) value `x` — all of it when `axis` is None — as a graph on `dev`: taken
  from the piece on `dev` where one holds them, else copied over from the pieces that do."""
  shape = x.shape
  assert shape is not None
  def part(p: UOp) -> UOp: return p if axis is None else _cut(p, axis, lo, hi)
  if axis is not None and hi <= lo:  # an empty piece: made where it goes, nothing to copy
    return _join([], axis, tuple(0 if d == axis else n for d, n in enumerate(shape)), dev, x.dtype)
  if x.op is not Ops.MULTI: return _to(part(x), dev)
  if x.arg is None: return _to(part(next((p for p in x.src if p.tensor_device == dev), x.src[0])), dev)
  xa, parts = x.arg, []
  for p, (plo, phi) in zip(x.src, bounds_of(x)):
    if xa == axis:
      a, b = max(lo, plo), min(hi, phi)
      if a < b: parts.append((a - lo, _to(_cut(p, xa, a - plo, b - plo), dev)))
    elif phi > plo: parts.append((plo, _to(part(p), dev)))
  out_shape = shape if axis is None else tuple(hi - lo if d == axis else n for d, n in enumerate(shape))
  return _join(parts, xa, out_shape, dev, x.dtype)


def to_layout(x: UOp, devices: Devices, axis: int | None, bounds: Bounds | None = None) -> UOp:
  """The lowered value `x` as a MULTI on `devices` sharded along `axis` with `bounds` (default: `split_bounds`), or
  replicated (axis None); `x` itself when it already is."""
  shape = x.shape
  assert shape is not None
  if axis is not None:
    if not 0 <= axis < len(shape): raise ShardAxisError(f"cannot shard shape {fmt(shape)} along axis {axis}")
    if bounds is None: bounds = split_bounds(_dim(shape, axis), len(devices))
  if x.op is Ops.MULTI and devices_of(x) == devices and x.arg == axis and (axis is None or bounds_of(x) == bounds): return x
  if axis is None or bounds is None: return multi([_region(x, d, None) for d in devices], None)
  return multi([_region(x, d, axis, lo, hi) for d, (lo, hi) in zip(devices, bounds)], axis)


def _devices(u: UOp, srcs: Sequence[UOp]) -> Devices:
  """The device tuple the multi-device sources of `u` share; a source on another device (tuple) is an error."""
  devs = next(devices_of(s) for s in srcs if s.op is Ops.MULTI)
  for s in srcs:
    d = devices_of(s) if s.op is Ops.MULTI else s.tensor_device
    if d is not None and d != devs:
      raise DeviceMismatchError(f"{u.op.name} of a tensor on {devs} and one on {d}: move one with .to() or .shard() first")
  return devs


def _per_piece(u: UOp, srcs: Sequence[UOp], axis: int | None, n: int) -> UOp:
  """`u`'s op on piece i of each multi-device source (a source on no device, a bound Variable, as it is)."""
  return multi([UOp(u.op, u.dtype, tuple(s.src[i] if s.op is Ops.MULTI else s for s in srcs), u.arg) for i in range(n)], axis)


# ---- the rules (each gets a node whose sources are lowered already)

def _elementwise(u: UOp) -> UOp | None:
  if not any(s.op is Ops.MULTI for s in u.src): return None
  devs = _devices(u, u.src)
  lead = next((s for s in u.src if s.op is Ops.MULTI and s.arg is not None), None)
  axis, bounds = (lead.arg, bounds_of(lead)) if lead is not None else (None, None)
  srcs = [to_layout(s, devs, axis, bounds) if s.op is Ops.MULTI else s for s in u.src]
  return _per_piece(u, srcs, axis, len(devs))


def _leaf(u: UOp) -> UOp | None:
  # a constant or an index ramp on a device tuple: made on each device (replicated), nothing is copied
  if not (u.src and u.src[0].op is Ops.DEVICE and isinstance(devs := u.src[0].arg, tuple)): return None
  return multi([u.replace(src=(_device(d), *u.src[1:])) for d in devs], None)


def _movement(u: UOp) -> UOp | None:
  x = u.src[0]
  if x.op is not Ops.MULTI: return None
  n, axis = len(x.src), x.arg
  if axis is None: return multi([p._mop(u.op, u.arg) for p in x.src], None)
  shape, bounds = x.shape, bounds_of(x)
  assert shape is not None
  if u.op is Ops.PERMUTE: return multi([p.permute(u.arg) for p in x.src], u.arg.index(axis))
  if u.op is Ops.FLIP:
    if not u.arg[axis]: return multi([p.flip(u.arg) for p in x.src], axis)
    # the rows of the last piece come first: piece j holds the flipped piece n-1-j, moved to device j
    devs = devices_of(x)
    return multi([_to(x.src[n - 1 - j].flip(u.arg), devs[j]) for j in range(n)], axis)
  if u.op is Ops.EXPAND:
    if u.arg[axis] != shape[axis]: return _movement(u.replace(src=(to_layout(x, devices_of(x), None),)))
    return multi([p.expand(tuple(p.shape[d] if d == axis else s for d, s in enumerate(u.arg))) for p in x.src], axis)  # type: ignore[index]
  if u.op is Ops.PAD:
    before, after = u.arg[axis]
    def pads(i: int) -> tuple[tuple[sint, sint], ...]:
      return tuple(((before if i == 0 else 0), (after if i == n - 1 else 0)) if d == axis else pa for d, pa in enumerate(u.arg))
    return multi([p._mop(Ops.PAD, pads(i)) for i, p in enumerate(x.src)], axis)
  if u.op is Ops.SHRINK:
    s, e = u.arg[axis]
    if not isinstance(s, int) or not isinstance(e, int): raise ShardingError(f"a symbolic shrink {u.arg[axis]} along the sharded axis {axis}")
    def cut(i: int) -> tuple[tuple[sint, sint], ...]:
      lo, hi = bounds[i]
      a = min(max(s - lo, 0), hi - lo)
      return tuple((a, max(min(e - lo, hi - lo), a)) if d == axis else se for d, se in enumerate(u.arg))
    return multi([p._mop(Ops.SHRINK, cut(i)) for i, p in enumerate(x.src)], axis)
  # RESHAPE: the sharded axis goes to the new axis b that starts at the same flat offset, when every piece boundary
  # falls on a whole row of b (the pieces stay contiguous blocks); otherwise the value is gathered first
  if (b := _reshape_axis(shape, u.arg, axis, bounds)) is not None:
    r, q = _prod(shape[axis + 1:]) or 0, _prod(u.arg[b + 1:]) or 1  # both ints (checked by _reshape_axis)
    return multi([p.reshape(tuple((hi - lo) * r // q if d == b else s for d, s in enumerate(u.arg)))
                  for p, (lo, hi) in zip(x.src, bounds)], b)
  return multi([p.reshape(u.arg) for p in to_layout(x, devices_of(x), None).src], None)


def _prod(xs: Sequence[sint]) -> int | None:
  out = 1
  for v in xs:
    if not isinstance(v, int): return None
    out *= v
  return out


def _reshape_axis(shape: tuple[sint, ...], new: tuple[sint, ...], axis: int, bounds: Bounds) -> int | None:
  pre, r = _prod(shape[:axis]), _prod(shape[axis + 1:])
  if pre is None or r is None: return None
  for b in range(len(new)):
    if _prod(new[:b]) != pre or (q := _prod(new[b + 1:])) is None or q == 0: continue
    if all(lo * r % q == 0 and hi * r % q == 0 for lo, hi in bounds): return b
  return None


def _reduce(u: UOp) -> UOp | None:
  x = u.src[0]
  if x.op is not Ops.MULTI: return None
  op, axes = u.arg
  parts = [UOp(Ops.REDUCE_AXIS, u.dtype, (p,), u.arg) for p in x.src]
  if x.arg is None or x.arg not in axes: return multi(parts, x.arg)
  # all-reduce: the partial results of the non-empty pieces, each device combining all of them in device order
  live = [p for p, (lo, hi) in zip(parts, bounds_of(x)) if hi > lo] or parts[:1]
  return multi([functools.reduce(lambda a, b: a.alu(op, b), [_to(p, d) for p in live]) for d in devices_of(x)], None)


def _gather(u: UOp) -> UOp | None:
  x, idx = u.src
  if x.op is not Ops.MULTI and idx.op is not Ops.MULTI: return None
  devs, g = _devices(u, u.src), u.arg
  if idx.op is Ops.MULTI and idx.arg is not None: axis, bounds = idx.arg, bounds_of(idx)
  elif x.op is Ops.MULTI and x.arg is not None and x.arg != g: axis, bounds = x.arg, bounds_of(x)
  else: axis, bounds = None, None
  # along the gathered axis every device needs all of x; along another, x and the index split alike
  xs = to_layout(x, devs, None) if axis is None or axis == g else to_layout(x, devs, axis, bounds)
  return _per_piece(u, [xs, to_layout(idx, devs, axis, bounds)], axis, len(devs))


def _replicated(u: UOp) -> UOp | None:
  # SCATTER: every device computes the whole result from replicated operands (correct, not cheap: docs/sharding.md)
  if not any(s.op is Ops.MULTI for s in u.src): return None
  devs = _devices(u, u.src)
  return _per_piece(u, [to_layout(s, devs, None) if s.op is Ops.MULTI else s for s in u.src], None, len(devs))


def _copy(u: UOp) -> UOp | None:
  x, dest = u.src[0], u.src[1].arg
  if isinstance(dest, str): return _region(x, dest, None) if x.op is Ops.MULTI else None
  if x.tensor_device is None: return None  # nothing device-bound to move (a bound Variable)
  return to_layout(x, dest, u.arg)


def _assign(u: UOp) -> UOp | None:
  target, value = u.src
  if target.op is not Ops.MULTI and value.op is not Ops.MULTI: return None
  if target.op is not Ops.MULTI: raise DeviceMismatchError(f"assign of a tensor on {devices_of(value)} to one on {target.tensor_device}")
  devs = devices_of(target)
  if value.op is Ops.MULTI: value = to_layout(value, devs, target.arg, bounds_of(target) or None)
  elif value.tensor_device is not None: raise DeviceMismatchError(f"assign of a tensor on {value.tensor_device} to one on {devs}")
  return _per_piece(u, [target, value], target.arg, len(devs))


def _unsupported(u: UOp) -> UOp | None:
  if not any(s.op is Ops.MULTI for s in u.src): return None
  raise ShardingError(f"{u.op.name} has no multi-device form: a precompiled kernel (run_program) or a buffer view takes single-device "
                      "tensors; gather with .to(device) first")


_RULES = PatternMatcher([
  (UPat(GroupOp.ALU | {Ops.CAST, Ops.BITCAST, Ops.CONTIGUOUS, Ops.DETACH}, name="u"), _elementwise),
  (UPat((Ops.CONST, Ops.IOTA), name="u"), _leaf),
  (UPat(GroupOp.Movement, name="u"), _movement),
  (UPat(Ops.REDUCE_AXIS, name="u"), _reduce),
  (UPat(Ops.GATHER, name="u"), _gather),
  (UPat(Ops.SCATTER, name="u"), _replicated),
  (UPat(Ops.COPY, name="u"), _copy),
  (UPat(Ops.ASSIGN, name="u"), _assign),
  (UPat((Ops.KERNEL, Ops.AFTER, Ops.BUFFER_VIEW), name="u"), _unsupported),
])


def lower(roots: Sequence[UOp], cache: dict[UOp, UOp] | None = None) -> list[UOp]:
  """Each root lowered: a MULTI of single-device graphs for a value on several devices, else a single-device graph.
  `cache` receives every node's lowered form (bottom-up rewrite; VIZ's recorder does not fill it)."""
  sink = UOp(Ops.SINK, dtypes.void, tuple(roots))
  return list(graph_rewrite(sink, _RULES, name="lower multi-device", cache=cache).src)


def layout(u: UOp) -> tuple[Devices, int | None] | None:
  """(devices, sharded axis or None) of a multi-device tensor-graph value, None for a single-device one."""
  if not isinstance(u.tensor_device, tuple): return None
  m = u if u.op is Ops.MULTI else lower([u])[0]
  return devices_of(m), m.arg


def fresh_like(u: UOp) -> UOp:
  """A MULTI of new buffers with the layout `u` lowers to, each shaped like its piece (the target `Tensor.clone` assigns to)."""
  m = u if u.op is Ops.MULTI else lower([u])[0]
  pieces = []
  for p in m.src:
    shape = p.shape
    assert shape is not None
    if not all(isinstance(s, int) for s in shape): raise ShardingError(f"a new multi-device buffer needs concrete shapes, got {fmt(shape)}")
    pieces.append(new_buffer(p.tensor_device, _prod(shape) or 0, p.dtype).reshape(shape))
  return multi(pieces, m.arg)
