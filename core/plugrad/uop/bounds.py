"""Interval bounds (vmin, vmax) of integer and boolean expressions, used by the simplifier to fold
comparisons, divisions and modulos. Float expressions get their dtype's bounds unless constant."""
from __future__ import annotations

from typing import Any

from plugrad.dtype import PtrDType, dtypes
from plugrad.helpers import cdiv, cmod
from plugrad.uop.ops import GroupOp, Ops, UOp


def min_max(root: UOp) -> tuple[Any, Any]:
  # fill the per-node cache sources-first, so deep chains never recurse; stop at nodes already bounded (while rewriting,
  # the sources of a new node usually are), and do not cache a toposort on every node asked
  stack = [root]
  while stack:
    u = stack[-1]
    if "_min_max" in u.__dict__: stack.pop(); continue
    todo = [s for s in u.src if "_min_max" not in s.__dict__]
    if todo: stack.extend(todo); continue
    stack.pop()
    u.__dict__["_min_max"] = _node_bounds(u)
  return root.__dict__["_min_max"]


def _dtype_bounds(u: UOp) -> tuple[Any, Any]:
  if isinstance(u.dtype, PtrDType) or u.dtype.scalar() is dtypes.void: return (0, 0)
  return dtypes.min(u.dtype), dtypes.max(u.dtype)


def _clamp(u: UOp, lo: Any, hi: Any) -> tuple[Any, Any]:
  if u.dtype is dtypes.index: return lo, hi  # the common case, first: index arithmetic does not wrap
  dlo, dhi = _dtype_bounds(u)
  if dtypes.is_int(u.dtype) and u.dtype.scalar() is not dtypes.index and (lo < dlo or hi > dhi): return dlo, dhi  # may wrap
  return lo, hi


def _node_bounds(u: UOp) -> tuple[Any, Any]:
  op, src = u.op, u.src
  if op is Ops.CONST: return u.arg, u.arg
  if op is Ops.VCONST: return min(u.arg), max(u.arg)
  if op is Ops.DEFINE_VAR: return u.arg[1], u.arg[2]
  if op is Ops.BIND: return src[0]._min_max
  if op in (Ops.RANGE, Ops.SPECIAL): return 0, max(0, src[0]._min_max[1] - 1)
  if op in (Ops.VECTORIZE, Ops.GEP) and src: return min(s._min_max[0] for s in src), max(s._min_max[1] for s in src)
  if op is Ops.CAST: return _cast_bounds(u)
  if op not in GroupOp.ALU: return _dtype_bounds(u)
  if dtypes.is_float(u.dtype) and not all(s.op is Ops.CONST for s in src): return _dtype_bounds(u)
  if op is Ops.WHERE:
    (c0, c1), (t0, t1), (f0, f1) = (s._min_max for s in src)
    if c0 and c1: return t0, t1
    if not c0 and not c1: return f0, f1
    return min(t0, f0), max(t1, f1)
  a0, a1 = src[0]._min_max
  if op is Ops.NEG: return (not a1, not a0) if u.dtype is dtypes.bool else _clamp(u, -a1, -a0)
  if op in GroupOp.Unary: return _dtype_bounds(u)
  b0, b1 = src[1]._min_max
  if op is Ops.MUL and u.dtype is dtypes.bool: return a0 and b0, a1 and b1
  if op in (Ops.ADD, Ops.SUB, Ops.MUL): return _clamp(u, *exact_bounds(op, (a0, a1), (b0, b1)))
  if op is Ops.MAX: return max(a0, b0), max(a1, b1)
  if op is Ops.CMPLT:
    if a1 < b0: return True, True
    if a0 >= b1: return False, False
    return False, True
  if op in (Ops.CMPNE, Ops.CMPEQ):
    same = a0 == a1 == b0 == b1
    disjoint = a1 < b0 or b1 < a0
    ne = (True, True) if disjoint else (False, False) if same else (False, True)
    return ne if op is Ops.CMPNE else (not ne[1], not ne[0])
  if op is Ops.IDIV:
    if b0 > 0 or b1 < 0:
      qs = [cdiv(x, y) for x in (a0, a1) for y in (b0, b1)]
      if b0 < 0 < b1 or (a0 < 0 < a1): qs += [0]
      return min(qs), max(qs)
    return _dtype_bounds(u)
  if op is Ops.MOD:
    if b0 > 0:
      if b0 == b1 and a0 >= 0 and a1 - a0 < b0 and cmod(a0, b0) <= cmod(a1, b0): return cmod(a0, b0), cmod(a1, b0)
      m = b1 - 1
      return (0 if a0 >= 0 else max(a0, -m)), (0 if a1 <= 0 else min(a1, m))
    return _dtype_bounds(u)
  if u.dtype.scalar() is dtypes.bool:
    if op is Ops.AND: return a0 and b0, a1 and b1
    if op is Ops.OR: return a0 or b0, a1 or b1
    if op is Ops.XOR and a0 == a1 and b0 == b1: return a0 ^ b0, a0 ^ b0
    return False, True
  if op is Ops.AND and a0 >= 0 and b0 >= 0: return 0, min(a1, b1)
  if op in (Ops.OR, Ops.XOR) and a0 >= 0 and b0 >= 0: return (0 if op is Ops.XOR else max(a0, b0)), (1 << max(a1, b1).bit_length()) - 1
  if op is Ops.SHL and a0 >= 0 and b0 == b1 and b0 >= 0: return _clamp(u, a0 << b0, a1 << b0)
  if op is Ops.SHR and a0 >= 0 and b0 == b1 and b0 >= 0: return a0 >> b0, a1 >> b0
  return _dtype_bounds(u)


def exact_bounds(op: Ops, a: tuple[Any, Any], b: tuple[Any, Any]) -> tuple[Any, Any]:
  """The bounds of ADD, SUB or MUL over operand bounds `a`, `b`, before any wrap-around."""
  if op is Ops.ADD: return a[0] + b[0], a[1] + b[1]
  if op is Ops.SUB: return a[0] - b[1], a[1] - b[0]
  prods = (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])
  return min(prods), max(prods)


def _cast_bounds(u: UOp) -> tuple[Any, Any]:
  a0, a1 = u.src[0]._min_max
  dt = u.dtype
  if dt.scalar() is dtypes.bool: return (bool(a0), bool(a1)) if a0 == a1 else (False, True)
  if dtypes.is_float(dt):
    return (float(a0), float(a1)) if not dtypes.is_float(u.src[0].dtype) or u.src[0].op is Ops.CONST else _dtype_bounds(u)
  lo, hi = dtypes.min(dt), dtypes.max(dt)
  try: a0, a1 = int(a0), int(a1)
  except (OverflowError, ValueError): return lo, hi
  return (a0, a1) if lo <= a0 and a1 <= hi else (lo, hi)
