"""Shapes and devices of tensor-graph UOps (docs/ir.md, stage 1), and the checks that make a bad movement or a
shape mismatch fail where it is written, naming both shapes."""
from __future__ import annotations

from typing import Any

from plugrad.helpers import prod
from plugrad.uop.ops import GroupOp, Ops, UOp, sint

Shape = tuple[sint, ...]


class ShapeError(ValueError, RuntimeError):
  """Shapes that do not fit an operation; the message names the op and both shapes. A RuntimeError as well, which is
  what PyTorch raises for a shape mismatch, so code written for either catches it."""


def _eq(a: sint, b: sint) -> bool:
  if isinstance(a, int) and isinstance(b, int): return a == b
  from plugrad.uop.symbolic import ssimplify
  sa, sb = ssimplify(a), ssimplify(b)
  return sa is sb if isinstance(sa, UOp) or isinstance(sb, UOp) else sa == sb


def _simple(x: sint) -> sint:
  """A symbolic size folded (so `n - 0` stays `n`: sizes are compared and rendered)."""
  if isinstance(x, int): return x
  from plugrad.uop.symbolic import ssimplify
  return ssimplify(x)


def fmt(shape: Shape | None) -> str:
  if shape is None: return "(no shape)"
  return "(" + ", ".join(s.render() if isinstance(s, UOp) else str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


def _node_shape(u: UOp) -> Shape | None:
  op, src = u.op, u.src
  if op in (Ops.BUFFER, Ops.IOTA): return (u.arg,)
  if op in (Ops.CONST, Ops.DEFINE_VAR, Ops.BIND): return ()
  if op in (Ops.DEVICE, Ops.UNIQUE, Ops.SINK, Ops.KERNEL): return None
  if op in (Ops.RESHAPE, Ops.EXPAND): return u.arg
  s: Any = src[0].__dict__["_shape"] if src else None
  if op is Ops.PERMUTE: return tuple(s[i] for i in u.arg)
  if op is Ops.PAD: return tuple(d + b + a if isinstance(d, int) else _simple(d + b + a) for d, (b, a) in zip(s, u.arg))
  if op is Ops.SHRINK: return tuple(e if isinstance(b, int) and b == 0 else _simple(e - b) for b, e in u.arg)
  if op is Ops.REDUCE_AXIS: return tuple(1 if i in u.arg[1] else d for i, d in enumerate(s))
  if op is Ops.GATHER: return _gather_shape(u)
  if op is Ops.MULTI: return _multi_shape(u)
  if op is Ops.SCATTER: _scatter_check(u)
  if op is Ops.BITCAST and s is not None and src[0].dtype.itemsize != u.dtype.itemsize and s:
    return (*s[:-1], s[-1] * src[0].dtype.itemsize // u.dtype.itemsize)
  if op in GroupOp.ALU:
    shapes = [x.__dict__["_shape"] for x in src if x.__dict__["_shape"] is not None]
    for other in shapes[1:]:
      if len(other) != len(shapes[0]) or not all(_eq(a, b) for a, b in zip(other, shapes[0])):
        raise ShapeError(f"{op.name} of mismatched shapes {fmt(shapes[0])} and {fmt(other)}")
    return shapes[0] if shapes else None
  return s


def _gather_shape(u: UOp) -> Shape:
  """GATHER(x, idx) arg=axis: the shape of idx, which must be x's except along the axis."""
  xs, ix, ax = u.src[0].__dict__["_shape"], u.src[1].__dict__["_shape"], u.arg
  if xs is None or ix is None or len(xs) != len(ix) or not 0 <= ax < len(xs) or \
     any(not _eq(a, b) for d, (a, b) in enumerate(zip(xs, ix)) if d != ax):
    raise ShapeError(f"GATHER along axis {ax}: index {fmt(ix)} must have the shape of the source {fmt(xs)} except along the axis")
  return ix


def _multi_shape(u: UOp) -> Shape:
  """MULTI(*pieces, arg=axis): the pieces' shape (replicated, axis None) or the pieces joined along the axis."""
  shapes, ax = [s.__dict__["_shape"] for s in u.src], u.arg
  first = shapes[0] if shapes else None
  if first is None or any(s is None or len(s) != len(first) for s in shapes) or (ax is not None and not 0 <= ax < len(first)) or \
     any(not _eq(a, b) for s in shapes for d, (a, b) in enumerate(zip(s, first)) if d != ax):
    raise ShapeError(f"MULTI along axis {ax}: pieces of shapes {', '.join(fmt(s) for s in shapes)} must match"
                     f"{'' if ax is None else ' outside that axis'}")
  if ax is None: return first
  return tuple(_simple(sum(s[ax] for s in shapes)) if d == ax else n for d, n in enumerate(first))


def _scatter_check(u: UOp) -> None:
  """SCATTER(base, idx, src) arg=(axis, how): idx and src share a shape, no larger than base's outside the axis."""
  bs, ix, ss = (s.__dict__["_shape"] for s in u.src)
  ax = u.arg[0]
  if bs is None or ix is None or ss is None or len(ix) != len(bs) or not 0 <= ax < len(bs) or len(ss) != len(ix) or \
     any(not _eq(a, b) for a, b in zip(ix, ss)) or \
     any(isinstance(i, int) and isinstance(b, int) and i > b for d, (b, i) in enumerate(zip(bs, ix)) if d != ax):
    raise ShapeError(f"SCATTER along axis {ax}: index {fmt(ix)} and source {fmt(ss)} must match and fit in {fmt(bs)} outside the axis")


def shape_of(root: UOp) -> Shape | None:
  """The shape of a tensor-graph UOp (None for nodes without one: DEVICE, SINK, ...). Cached on each node."""
  if "_shape" in root.__dict__: return root.__dict__["_shape"]
  if all("_shape" in s.__dict__ for s in root.src):  # the common case: a new node on known ones (no graph walk)
    root.__dict__["_shape"] = _node_shape(root)
    return root.__dict__["_shape"]
  for u in root.toposort:
    if "_shape" not in u.__dict__: u.__dict__["_shape"] = _node_shape(u)
  return root.__dict__["_shape"]


def device_of(root: UOp) -> Any:
  """The device a tensor-graph UOp lives on: from its BUFFER, DEVICE-sourced CONST or COPY (None if it has none)."""
  if "_device" in root.__dict__: return root.__dict__["_device"]
  nodes = [root] if all("_device" in s.__dict__ for s in root.src) else root.toposort
  for u in nodes:
    if "_device" in u.__dict__: continue
    if u.op is Ops.DEVICE: d = u.arg
    elif u.op is Ops.BUFFER: d = u.src[1].arg
    elif u.op is Ops.COPY: d = u.src[1].arg
    elif u.op is Ops.IOTA: d = u.src[0].arg
    elif u.op is Ops.MULTI: d = tuple(s.__dict__["_device"] for s in u.src)
    else: d = next((s.__dict__["_device"] for s in u.src if s.__dict__["_device"] is not None), None)
    u.__dict__["_device"] = d
  return root.__dict__["_device"]


def check_movement(op: Ops, shape: Shape, arg: tuple) -> None:
  """Raise ShapeError when the movement `op` with `arg` does not fit `shape`."""
  nd = len(shape)
  where = f"{op.name.lower()} of shape {fmt(shape)} to {arg}"
  if op is Ops.RESHAPE:
    if any(isinstance(d, int) and d < 0 for d in arg): raise ShapeError(f"{where}: sizes must be >= 0")
    if not _eq(prod(shape), prod(arg)): raise ShapeError(f"cannot reshape {fmt(shape)} ({prod(shape)} elements) to {fmt(arg)} ({prod(arg)} elements)")
  elif op is Ops.EXPAND:
    if len(arg) != nd: raise ShapeError(f"{where}: expand needs {nd} sizes, got {len(arg)}")
    for i, (old, new) in enumerate(zip(shape, arg)):
      if not _eq(old, new) and not (isinstance(old, int) and old == 1):
        raise ShapeError(f"cannot expand {fmt(shape)} to {fmt(arg)}: axis {i} has size {old}, only size-1 axes expand")
  elif op is Ops.PERMUTE:
    if sorted(arg) != list(range(nd)): raise ShapeError(f"{where}: the order must be a permutation of 0..{nd - 1}")
  elif op in (Ops.PAD, Ops.SHRINK):
    if len(arg) != nd: raise ShapeError(f"{where}: needs one pair per axis ({nd}), got {len(arg)}")
    for i, (a, b) in enumerate(arg):
      if op is Ops.PAD and ((isinstance(a, int) and a < 0) or (isinstance(b, int) and b < 0)):
        raise ShapeError(f"{where}: padding of axis {i} must be >= 0, got ({a}, {b})")
      if op is Ops.SHRINK and isinstance(a, int) and isinstance(b, int) and isinstance(shape[i], int) and not 0 <= a <= b <= shape[i]:
        raise ShapeError(f"{where}: axis {i} of size {shape[i]} cannot be cut to [{a}, {b})")
  elif op is Ops.FLIP:
    if len(arg) != nd: raise ShapeError(f"{where}: needs one bool per axis ({nd}), got {len(arg)}")
