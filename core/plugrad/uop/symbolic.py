"""The symbolic simplifier: `symbolic_simple` (cheap rules valid for every dtype) and `symbolic` (the full simplifier
of integer index expressions), plus the helpers that work on `sint` (int | UOp): ssimplify, sym_infer, resolve, smax, smin.

The integer rules treat `index` as mathematical integers (codegen picks a width that does not overflow). Fixed-width
ints wrap, so rules that reason about magnitudes (division, modulo, comparisons) only fire on them when the bounds prove
the expression did not wrap; the ring rules (sum and product normal forms) hold modulo 2**bits and always apply.
IDIV and MOD have C semantics (truncation toward zero). Every rule keeps the tree size (`_tsize`) from growing.

Normal forms: a sum is a left-leaning chain `((t1 + t2) + t3) + c` of terms `base` or `base*k` (k a CONST), bases sorted
by `_okey`, no base twice, the constant last; a product is `((f1*f2)*f3)*k`; a commutative binary op has its CONST on the
right and otherwise its sources in `_okey` order.
"""
from __future__ import annotations

import enum
import functools
import math
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

from plugrad.dtype import DType, PtrDType, dtypes
from plugrad.helpers import cdiv
from plugrad.uop.bounds import min_max
from plugrad.uop.ops import GroupOp, Ops, UOp, UOpError, exec_alu, sint
from plugrad.uop.pattern import PatternMatcher, UPat

__all__ = ["SymbolicError", "resolve", "smax", "smin", "ssimplify", "sym_infer", "symbolic", "symbolic_simple"]


class SymbolicError(ValueError):
  """A symbolic expression could not be evaluated (a Variable without a value, a value outside its range, an unknown op)."""


INTS: tuple[DType, ...] = (*dtypes.ints, dtypes.index)
_INT_SET = frozenset(INTS)
_IDX = dtypes.index
_ADD, _MUL, _CONST, _IDIV, _MOD = Ops.ADD, Ops.MUL, Ops.CONST, Ops.IDIV, Ops.MOD

# ---- small cached structural facts (stored in the UOp's __dict__: a UOp is immutable, so they never go stale)


def _argkey(a: Any) -> tuple[Any, int]:
  """A sortable key of an arg and a hash of it that is the same in every process (str hashing is salted)."""
  c = a.__class__
  if c is int or c is bool: return (0, int(a)), hash(a)
  if c is str: return (1, a), zlib.crc32(a.encode())
  if c is float: return (2, a), hash(a)
  if c is tuple:
    ks = [_argkey(x) for x in a]
    return (3, tuple(k for k, _ in ks)), hash(tuple(h for _, h in ks))
  if a is None: return (-1, 0), 0
  s = str(a.value) if isinstance(a, enum.Enum) else repr(a)
  return (4, s), zlib.crc32(s.encode())


def _okey(u: UOp) -> tuple[int, Any, int]:
  """A total order of UOps that depends only on structure: (op, arg, structural hash). It orders the terms of sums."""
  if (k := u.__dict__.get("_ok")) is not None: return k
  stack = [u]
  while stack:  # sources first, without recursion
    n = stack[-1]
    if "_ok" in n.__dict__: stack.pop(); continue
    todo = [s for s in n.src if "_ok" not in s.__dict__]
    if todo: stack.extend(todo); continue
    stack.pop()
    ak, ah = _argkey(n.arg)
    dt = n.dtype
    h = hash((n.op.value, dt.priority, dt.itemsize, dt.count, ah, *[s.__dict__["_ok"][2] for s in n.src]))
    n.__dict__["_ok"] = (n.op.value, ak, h)
  return u.__dict__["_ok"]


def _tsize(u: UOp) -> int:
  """The size of the expression as a tree (a shared subexpression counts at each use). No rule makes it grow."""
  if (t := u.__dict__.get("_ts")) is not None: return t
  stack = [u]
  while stack:
    n = stack[-1]
    if "_ts" in n.__dict__: stack.pop(); continue
    todo = [s for s in n.src if "_ts" not in s.__dict__]
    if todo: stack.extend(todo); continue
    stack.pop()
    n.__dict__["_ts"] = 1 + sum(s.__dict__["_ts"] for s in n.src)
  return u.__dict__["_ts"]


def _mm(u: UOp) -> tuple[Any, Any]:
  # the bounds cache without the cached_property machinery: this runs for nearly every node rewritten
  return u.__dict__.get("_min_max") or min_max(u)


def _c(dt: DType, v: Any) -> UOp: return UOp(_CONST, dt, (), v if dt is _IDX else dtypes.as_const(v, dt))


def _wrapc(dt: DType, v: int) -> int: return v if dt is _IDX else dtypes.as_const(v, dt)


def _exact(u: UOp) -> bool:
  """True when `u` computes its integer value without wrapping: bounds.py gives a wrapped result its dtype's full range."""
  if u.dtype is _IDX: return True
  lo, hi = _mm(u)
  return not (lo == dtypes.min(u.dtype) and hi == dtypes.max(u.dtype))


def _fits(dt: DType, *vs: int) -> bool: return dt is _IDX or all(dtypes.min(dt) <= v <= dtypes.max(dt) for v in vs)


# ---- sums as {base: coefficient} + constant

def _split(u: UOp) -> tuple[UOp, int]:
  k = 1
  while u.op is _MUL and u.src[1].op is _CONST:
    k *= u.src[1].arg
    u = u.src[0]
  return u, k


def _bare(s: UOp) -> int:
  """How many terms of the sum `s` have no constant factor (distributing `s*k` costs two nodes for each)."""
  n, stack = 0, [s]
  while stack:
    u = stack.pop()
    if u.op is _ADD: stack.extend(u.src)
    elif u.op is not _CONST and not (u.op is _MUL and u.src[1].op is _CONST): n += 1
  return n


def _collect(x: UOp, expand_all: bool) -> tuple[dict[UOp, int], int, bool]:
  """Flatten the sum `x` into {base: coefficient} and a constant. A term `s*k` whose `s` is a sum is distributed when that
  cannot grow the tree (at most one bare term in `s`), or always with `expand_all`; the flag says a growing one was."""
  coeffs: dict[UOp, int] = {}
  k0, grew = 0, False
  stack = [(x, 1)]
  while stack:
    u, m = stack.pop()
    if u.op is _ADD:
      stack.append((u.src[1], m)); stack.append((u.src[0], m))
      continue
    if u.op is _CONST:
      k0 += u.arg * m
      continue
    b, k = _split(u)
    if b.op is _ADD:
      if (nb := _bare(b)) <= 1 or expand_all:
        grew |= nb > 1
        stack.append((b, m * k))
        continue
    elif b.op is _CONST:
      k0 += b.arg * k * m
      continue
    coeffs[b] = coeffs.get(b, 0) + k * m
  return coeffs, k0, grew


def _add_terms(coeffs: dict[UOp, int], x: UOp, m: int) -> int:
  """Add m*x to `coeffs` (x flattened if it is a sum); returns the constant part."""
  sub, k0, _ = _collect(x, False) if x.op is _ADD else ({x: 1}, 0, False)
  for b, k in sub.items(): coeffs[b] = coeffs.get(b, 0) + k * m
  return k0 * m


def _recombine(dt: DType, coeffs: dict[UOp, int]) -> int:
  """Undo a div/mod decomposition inside a sum: (y//c)*(k*c) + (y%c)*k → y*k and ((y//c)%d)*(k*c) + (y%c)*k → (y%(c*d))*k.
  Both hold for every y under C semantics. Returns the constant that merging `y` may add."""
  k0 = 0
  changed = True
  while changed:
    changed = False
    for b, k in coeffs.items():
      if b.op is not _MOD or k == 0 or (cu := b.src[1]).op is not _CONST or (c := cu.arg) <= 0: continue
      y = b.src[0]
      if y.op is _IDIV and y.src[1].op is _CONST and y.src[1].arg > 0: q = UOp(_IDIV, dt, (y.src[0], _c(dt, y.src[1].arg * c)))
      else: q = UOp(_IDIV, dt, (y, cu))
      if coeffs.get(q) == k * c:
        del coeffs[b], coeffs[q]
        k0 += _add_terms(coeffs, y, k)
        changed = True
        break
      for b2, k2 in coeffs.items():
        if b2.op is _MOD and k2 == k * c and (y2 := b2.src[0]).op is _IDIV and y2.src[0] is y and y2.src[1] is cu and b2.src[1].op is _CONST \
           and b2.src[1].arg > 0:
          del coeffs[b], coeffs[b2]
          nb = UOp(_MOD, dt, (y, _c(dt, c * b2.src[1].arg)))
          coeffs[nb] = coeffs.get(nb, 0) + k
          changed = True
          break
      if changed: break
  return k0


def _sum(dt: DType, items: Iterable[tuple[UOp, int]], k0: int, mark: bool = False) -> UOp:
  """Build the normal form of sum(base*k) + k0. `mark` records the partial sums as fixed points of `_fold_add`."""
  ret: UOp | None = None
  terms = [(b, kk) for b, k in items if (kk := _wrapc(dt, k)) != 0]
  if len(terms) > 1: terms.sort(key=lambda t: _okey(t[0]))
  for b, k in terms:
    t = b if k == 1 else UOp(_MUL, dt, (b, _c(dt, k)))
    ret = t if ret is None else UOp(_ADD, dt, (ret, t))
    if mark: ret.__dict__["_fa"] = True
  if (k0 := _wrapc(dt, k0)) != 0 or ret is None: ret = _c(dt, k0) if ret is None else UOp(_ADD, dt, (ret, _c(dt, k0)))
  return ret


def _terms(u: UOp) -> tuple[dict[UOp, int], int]:
  """The sum u as {base: nonzero coefficient} and a constant (a top-down rewrite can see sums not yet in normal form)."""
  if u.op is _CONST: return {}, u.arg
  coeffs, k0 = _collect(u, False)[:2] if u.op is _ADD else ({(bk := _split(u))[0]: bk[1]}, 0)
  dt = u.dtype
  return {b: kk for b, k in coeffs.items() if (kk := _wrapc(dt, k))}, k0


def _term_bounds(items: Iterable[tuple[UOp, int]], k0: int) -> tuple[int, int]:
  lo = hi = k0
  for b, k in items:
    b0, b1 = _mm(b)
    if k >= 0: lo, hi = lo + b0 * k, hi + b1 * k
    else: lo, hi = lo + b1 * k, hi + b0 * k
  return lo, hi


# ---- the rules of `symbolic` (integer dtypes)

def _fold_add(x: UOp) -> UOp | None:
  d = x.__dict__
  if "_fa" in d or x.dtype.count != 1: return None
  dt = x.dtype
  coeffs, k0, grew = _collect(x, True)
  k0 += _recombine(dt, coeffs)
  plain = not grew and not any(b.op is _ADD for b in coeffs)
  r = _sum(dt, coeffs.items(), k0, mark=plain)
  if grew and _tsize(r) > _tsize(x):  # distributing every s*k made it bigger: keep those products whole
    coeffs, k0, _ = _collect(x, False)
    k0 += _recombine(dt, coeffs)
    r = _sum(dt, coeffs.items(), k0)
  if r is x or _tsize(r) > _tsize(x):
    d["_fa"] = True
    return None
  r.__dict__["_fa"] = True
  return r


def _fold_mul(x: UOp) -> UOp | None:
  d = x.__dict__
  if "_fm" in d or x.dtype.count != 1: return None
  dt = x.dtype
  a, b = x.src
  if b.op is _CONST:
    k = b.arg
    if k == 0: return b
    if k == 1: return a
    if a.op is _MUL and a.src[1].op is _CONST: return _sum(dt, ((a.src[0], a.src[1].arg * k),), 0)
    if a.op is _ADD and _bare(a) <= 1:
      coeffs, k0, _ = _collect(a, False)
      return _sum(dt, ((t, c * k) for t, c in coeffs.items()), k0 * k)
    if a.op is not _MUL: d["_fm"] = True; return None
  # a product of several non-constant factors: flatten, sort, constant last
  factors: list[UOp] = []
  kc, stack = 1, [x]
  while stack:
    u = stack.pop()
    if u.op is _MUL: stack.extend(u.src)
    elif u.op is _CONST: kc *= u.arg
    else: factors.append(u)
  if (kc := _wrapc(dt, kc)) == 0: return _c(dt, 0)
  factors.sort(key=_okey)
  r = factors[0]
  for f in factors[1:]: r = UOp(_MUL, dt, (r, f))
  if kc != 1: r = UOp(_MUL, dt, (r, _c(dt, kc)))
  if r is x: d["_fm"] = True; return None
  return r


def _fold_divmod(x: UOp, n: UOp, c: UOp) -> UOp | None:
  """x = n // c or n % c with a constant c."""
  if x.dtype.count != 1 or (cv := c.arg) == 0 or cv == 1: return None
  dt, is_mod = x.dtype, x.op is _MOD
  if not _exact(n): return None
  lo, hi = _mm(n)
  if (q := cdiv(lo, cv)) == cdiv(hi, cv):  # one quotient for every value: truncation is monotonic
    if not is_mod: return _c(dt, q)
    return n if q == 0 else UOp(_ADD, dt, (n, _c(dt, -q * cv)))
  if cv < 0:  # n % -c == n % c (the sign follows n); n // -c is left alone: -(n // c) would be bigger
    return UOp(_MOD, dt, (n, _c(dt, -cv))) if is_mod and _fits(dt, -cv) else None
  if n.op is x.op and n.src[1].op is _CONST and (a := n.src[1].arg) > 0:
    if not is_mod and _fits(dt, a * cv): return UOp(_IDIV, dt, (n.src[0], _c(dt, a * cv)))  # trunc(trunc(y/a)/c) == trunc(y/(a*c))
    if is_mod and a % cv == 0: return UOp(_MOD, dt, (n.src[0], c))  # (y % (c*m)) % c keeps y's sign and residue
  coeffs, k0 = _terms(n)
  if (g := math.gcd(cv, k0, *coeffs.values())) > 1:  # n = g*n', c = g*c': n/c == n'/c' exactly
    n2 = _sum(dt, ((b, k // g) for b, k in coeffs.items()), k0 // g)
    if not _exact(n2): return None
    if not is_mod: return UOp(_IDIV, dt, (n2, _c(dt, cv // g)))
    if g == cv: return _c(dt, 0)
    inner = _fold_divmod(m2 := UOp(_MOD, dt, (n2, _c(dt, cv // g))), n2, m2.src[1])
    if inner is not None and _tsize(inner) + 2 <= _tsize(x): return UOp(_MUL, dt, (inner, _c(dt, g)))
  # n % c == n' % c when n' keeps every coefficient modulo c and n, n' are never negative (e.g. (a*2 + b*9) % 8 → (a*2 + b) % 8)
  if is_mod and cv > 0 and lo >= 0 and (any(k % cv != k for k in coeffs.values()) or k0 % cv != k0):
    kept = [(b, k % cv) for b, k in coeffs.items() if k % cv]
    if _term_bounds(kept, k0 % cv)[0] >= 0 and _exact(rem := _sum(dt, kept, k0 % cv)): return UOp(_MOD, dt, (rem, c))
  # n = q*c + r: n // c == q + r // c and n % c == r % c when r and n never have opposite signs (or r is always 0)
  quot = {b: k // cv for b, k in coeffs.items() if k % cv == 0}
  if quot:
    rest = [(b, k) for b, k in coeffs.items() if k % cv != 0]
    r0, r1 = _term_bounds(rest, k0)
    if (not rest and k0 == 0) or (r0 >= 0 and lo >= 0) or (r1 <= 0 and hi <= 0):
      rem, q_part = _sum(dt, rest, k0), _sum(dt, quot.items(), 0)
      if not (_exact(rem) and _exact(q_part)): return None  # a new order of the terms may wrap where the old did not
      if is_mod: return UOp(_MOD, dt, (rem, c))
      return q_part if not rest and k0 == 0 else UOp(_ADD, dt, (q_part, UOp(_IDIV, dt, (rem, c))))
  # n = f*t + r with 0 <= r < f (or mirrored for t <= 0) and f | c: n // c == t // (c/f), n % c == (t % (c/f))*f + r
  items = sorted(coeffs.items(), key=lambda t: abs(t[1]))
  for j in range(len(items) - 1, -1, -1):
    big, small = items[j:], items[:j]
    if (f := math.gcd(cv, *(k for _, k in big))) == 1: continue
    r0, r1 = _term_bounds(small, k0)
    t0, t1 = _term_bounds(((b, k // f) for b, k in big), 0)
    if (t0 >= 0 and 0 <= r0 and r1 < f) or (t1 <= 0 and -f < r0 and r1 <= 0):
      t = _sum(dt, ((b, k // f) for b, k in big), 0)
      if not _exact(t): return None
      c2 = _c(dt, cv // f)
      if not is_mod: return t if cv == f else UOp(_IDIV, dt, (t, c2))
      ret = _sum(dt, small if cv == f else [(UOp(_MOD, dt, (t, c2)), f), *small], k0)
      return ret if _tsize(ret) <= _tsize(x) and _exact(ret) else None
  return None


def _lt_const(x: UOp, s: UOp, cv: int, s_left: bool) -> UOp | None:
  """`s < cv` (s_left) or `cv < s` for an integer sum s. Writing s = f*t + r with r in [r0, r1]: s < c <=> t <= floor((c-1-r)/f),
  which is one threshold for every r when floor((c-1-r1)/f) == floor((c-1-r0)/f); the terms in r drop out."""
  if not _exact(s): return None
  dt = s.dtype
  coeffs, k0 = _terms(s)
  if not coeffs: return None
  items = sorted(coeffs.items(), key=lambda t: abs(t[1]))
  for j in range(len(items) - 1, -1, -1):
    big, small = items[j:], items[:j]
    f = math.gcd(*(k for _, k in big))
    if f == 1 and j: continue
    r0, r1 = _term_bounds(small, k0)
    if s_left:
      if (m := (cv - 1 - r1) // f) != (cv - 1 - r0) // f: continue
      lim = m + 1  # t < lim
    else:
      if (m := -((r1 - cv - 1) // f)) != -((r0 - cv - 1) // f): continue
      lim = m - 1  # lim < t
    neg = all(k < 0 for _, k in big)  # -t has positive coefficients: compare that instead
    if neg: s_left, lim = not s_left, -lim
    if not _fits(dt, lim): return None
    t = _sum(dt, ((b, (-k if neg else k) // f) for b, k in big), 0)
    if dt is not _IDX and not _exact(t): return None
    lc = _c(dt, lim)
    ret = UOp(Ops.CMPLT, dtypes.bool, (t, lc) if s_left else (lc, t))
    return None if ret is x or _tsize(ret) > _tsize(x) else ret
  return None


def _lt_sums(x: UOp, a: UOp, b: UOp) -> UOp | None:
  """`a < b` for two integer sums: cancel like terms and write it as `p < q + m` with positive coefficients divided by their gcd
  f on both sides (f*p' < f*q' + k <=> p' < q' + floor((k-1)/f) + 1), the constant on the right."""
  if not (_exact(a) and _exact(b)): return None
  dt = a.dtype
  (ca, ka), (cb, kb) = _terms(a), _terms(b)
  for t, k in cb.items(): ca[t] = ca.get(t, 0) - k
  pos = [(t, k) for t, k in ca.items() if k > 0]
  neg = [(t, -k) for t, k in ca.items() if k < 0]
  if not pos or not neg:  # one side cancels to a constant: `_lt_const` takes it from there
    if not _fits(dt, kb - ka, ka - kb): return None
    if pos: ret = UOp(Ops.CMPLT, dtypes.bool, (_sum(dt, pos, 0), _c(dt, kb - ka)))
    elif neg: ret = UOp(Ops.CMPLT, dtypes.bool, (_c(dt, ka - kb), _sum(dt, neg, 0)))
    else: return UOp.const(dtypes.bool, ka < kb)
  else:
    f = math.gcd(*(k for _, k in pos), *(k for _, k in neg))
    m = (kb - ka - 1) // f + 1
    p, q = _sum(dt, ((t, k // f) for t, k in pos), 0), _sum(dt, ((t, k // f) for t, k in neg), m)
    if not _fits(dt, m): return None
    ret = UOp(Ops.CMPLT, dtypes.bool, (p, q))
  if dt is not _IDX and not all(_exact(s) for s in ret.src): return None
  return None if ret is x or _tsize(ret) > _tsize(x) else ret


def _fold_lt(x: UOp) -> UOp | None:
  a, b = x.src
  if a.dtype not in _INT_SET: return None
  if b.op is _CONST: return _lt_const(x, a, b.arg, True) if a.op is not _CONST else None
  if a.op is _CONST: return _lt_const(x, b, a.arg, False)
  return _lt_sums(x, a, b)


def _fold_ne_eq(x: UOp, s: UOp, c: UOp) -> UOp | None:
  """`s != c` / `s == c`: divide by the gcd of the coefficients (no solution when it does not divide c - k0), move the constant
  across, and make the first coefficient positive."""
  if s.op is _CONST or not _exact(s): return None
  dt = s.dtype
  coeffs, k0 = _terms(s)
  if not coeffs: return None
  g = math.gcd(*coeffs.values())
  if (c.arg - k0) % g: return UOp.const(dtypes.bool, x.op is Ops.CMPNE)
  items = sorted(coeffs.items(), key=lambda t: _okey(t[0]))
  sign = -1 if items[0][1] < 0 else 1
  rhs = (c.arg - k0) // g * sign
  if not _fits(dt, rhs): return None
  t = _sum(dt, ((b, k // g * sign) for b, k in items), 0)
  if dt is not _IDX and not _exact(t): return None
  ret = UOp(x.op, dtypes.bool, (t, _c(dt, rhs)))
  return None if ret is x else ret


def _not_lt(a: UOp, c: UOp, const_right: bool) -> UOp | None:
  """not (a < c) → (c-1) < a; not (c < a) → a < (c+1): integers only."""
  v = c.arg - 1 if const_right else c.arg + 1
  if not _fits(a.dtype, v): return None
  nc = _c(a.dtype, v)
  return UOp(Ops.CMPLT, dtypes.bool, (nc, a) if const_right else (a, nc))


def _fold_bounds(x: UOp) -> UOp | None:
  if x.dtype.count != 1: return None
  lo, hi = _mm(x)
  return UOp.const(x.dtype, lo) if lo == hi else None


def _order(x: UOp) -> UOp | None:
  """A commutative binary op: constant on the right, otherwise sources in `_okey` order."""
  a, b = x.src
  if b.op is _CONST: return None
  if a.op is _CONST or _okey(a) > _okey(b): return UOp(x.op, x.dtype, (b, a), x.arg)
  return None


def _fold_max(x: UOp) -> UOp | None:
  a, b = x.src
  if x.dtype.count != 1: return None
  (a0, a1), (b0, b1) = _mm(a), _mm(b)
  if a0 >= b1: return a
  if b0 >= a1: return b
  return _order(x)


# ---- the rules of `symbolic_simple` (every dtype, where valid)

def _fold_const(x: UOp, **_: UOp) -> UOp | None:
  if x.dtype.count != 1 or isinstance(x.dtype, PtrDType): return None
  try: return UOp.const(x.dtype, exec_alu(x.op, x.dtype, tuple(s.arg for s in x.src), x.arg))
  except (ValueError, OverflowError, ZeroDivisionError, UOpError): return None  # e.g. a negative shift: leave it to run time


def _cast_const(x: UOp, a: UOp) -> UOp | None:
  if x.dtype.count != 1 or isinstance(x.dtype, PtrDType) or x.dtype is dtypes.void: return None
  try: return UOp.const(x.dtype, exec_alu(Ops.MUL, x.dtype, (a.arg, 1)))  # `* 1` is exact; exec_alu rounds/wraps to the dtype
  except (ValueError, OverflowError, UOpError): return None  # inf/nan to an int: undefined, leave it


def _is_int(u: UOp) -> bool: return u.dtype.scalar() in _INT_SET
def _is_bool(u: UOp) -> bool: return u.dtype.scalar() is dtypes.bool


def _add_zero(x: UOp, c: UOp) -> UOp | None:
  if c.arg != 0: return None
  # float x + 0.0 turns -0.0 into 0.0; only x + -0.0 is exact for floats
  return x if _is_int(x) or (isinstance(c.arg, float) and math.copysign(1.0, c.arg) < 0) else None


def _mul_const(x: UOp, c: UOp) -> UOp | None:
  if c.arg == 1 and not _is_bool(x): return x
  if c.arg == 0 and _is_int(x): return c  # not for floats: nan*0 and inf*0 are nan
  return None


def _and_const(x: UOp, c: UOp) -> UOp | None:
  if c.arg == 0: return c  # x & 0, x & False
  if (c.arg is True and _is_bool(x)) or (c.arg == -1 and _is_int(x) and c.arg is not True): return x
  return None


def _or_const(x: UOp, c: UOp) -> UOp | None:
  if c.arg == 0: return x
  if c.arg is True and _is_bool(x): return c
  return None


def _all_true(v: UOp) -> bool: return all(s.op is Ops.CONST and s.arg is True for s in v.src)


def _uniform_gate(x: UOp, p: UOp, i: UOp, g: UOp) -> UOp | None:
  """A vector access through one address whose lanes' gates are one value: gated by that value (none if it is True)."""
  if i.dtype.count != 1 or any(s is not g.src[0] for s in g.src): return None
  return x.replace(src=(p, i) if _all_true(g) else (p, i, g.src[0]))


_var, _cst = UPat.var("x"), UPat(Ops.CONST, name="c")
_tf = (UPat(Ops.CONST, name="a"),)

symbolic_simple = PatternMatcher([
  # constant folding (WHERE with a constant condition is below)
  (UPat(GroupOp.Unary, src=_tf, name="x"), _fold_const),
  (UPat(GroupOp.Binary, src=(UPat(Ops.CONST, name="a"), UPat(Ops.CONST, name="b")), name="x"), _fold_const),
  (UPat(Ops.CAST, src=_tf, name="x"), _cast_const),
  (UPat(Ops.CAST, name="x"), lambda x: x.src[0] if x.src[0].dtype is x.dtype else None),
  # identities with a constant
  (UPat(Ops.ADD, src=[_var, _cst]), _add_zero),
  (UPat(Ops.MUL, src=[_var, _cst]), _mul_const),
  (UPat(Ops.SUB, src=(_var, UPat.const(None, 0))), lambda x: x),
  (UPat(Ops.FDIV, src=(_var, UPat.const(None, 1))), lambda x: x),
  (UPat(Ops.IDIV, src=(_var, UPat.const(None, 1))), lambda x: x),
  (UPat(Ops.MOD, src=(_var, UPat.const(None, 1))), lambda x: x.const_like(0) if _is_int(x) else None),
  (UPat(Ops.AND, src=[_var, _cst]), _and_const),
  (UPat(Ops.OR, src=[_var, _cst]), _or_const),
  (UPat(Ops.XOR, src=[_var, _cst]), lambda x, c: x if c.arg == 0 else None),
  # x - x (ints only: inf - inf is nan), double negation
  (UPat(Ops.ADD, src=[_var, UPat(Ops.MUL, src=(_var, UPat.const(None, -1)))]), lambda x: x.const_like(0) if _is_int(x) else None),
  (UPat(Ops.MUL, src=(UPat(Ops.MUL, src=(_var, UPat.const(None, -1))), UPat.const(None, -1))), lambda x: x if not _is_bool(x) else None),
  (UPat(Ops.NEG, src=(UPat(Ops.NEG, src=(_var,)),)), lambda x: x),
  (UPat(Ops.CMPNE, src=(UPat(Ops.CMPNE, src=(_var, UPat.const(dtypes.bool, True))), UPat.const(dtypes.bool, True))),
   lambda x: x if _is_bool(x) else None),
  # where
  (UPat(Ops.WHERE, src=(UPat(Ops.CONST, name="c"), UPat.var("t"), UPat.var("f"))), lambda c, t, f: t if c.arg else f),
  (UPat(Ops.WHERE, src=(UPat.var(), UPat.var("t"), UPat.var("t"))), lambda t: t),
  (UPat(Ops.WHERE, dtypes.bool, src=(UPat.var("c"), UPat.const(dtypes.bool, True), UPat.const(dtypes.bool, False))), lambda c: c),
  # x op x
  (UPat(Ops.CMPLT, src=(_var, _var), name="r"), lambda r, x: r.const_like(False)),
  (UPat((Ops.CMPNE, Ops.CMPEQ), src=(_var, _var), name="r"), lambda r, x: r.const_like(r.op is Ops.CMPEQ) if _is_int(x) or _is_bool(x) else None),
  (UPat((Ops.AND, Ops.OR, Ops.MAX), src=(_var, _var)), lambda x: x),
  (UPat(Ops.XOR, src=(_var, _var)), lambda x: x.const_like(0) if _is_int(x) or _is_bool(x) else None),
  # a vector of gates (a masked access's lanes: codegen/expand.py) whose lanes agree
  (UPat(Ops.AND, src=[_var, UPat(Ops.VECTORIZE, name="v")]), lambda x, v: x if _is_bool(x) and _all_true(v) else None),
  (UPat(Ops.INDEX, src=(UPat.var("p"), UPat.var("i"), UPat(Ops.VECTORIZE, name="g")), name="x"), _uniform_gate),
])

_i = UPat.var("s", INTS)
symbolic = symbolic_simple + PatternMatcher([
  # an integer or bool node whose bounds pin it to one value is that value
  (UPat(GroupOp.ALU, (*INTS, dtypes.bool), name="x"), _fold_bounds),
  (UPat(Ops.ADD, INTS, name="x"), _fold_add),
  (UPat(Ops.MUL, INTS, name="x"), _fold_mul),
  (UPat((Ops.IDIV, Ops.MOD), INTS, src=(UPat.var("n"), UPat(Ops.CONST, name="c")), name="x"), _fold_divmod),
  (UPat(Ops.CMPLT, name="x"), _fold_lt),
  (UPat((Ops.CMPNE, Ops.CMPEQ), src=(_i, UPat(Ops.CONST, name="c")), name="x"), _fold_ne_eq),
  (UPat(Ops.CMPNE, src=(UPat(Ops.CMPLT, src=(UPat.var("a", INTS), UPat(Ops.CONST, name="c"))), UPat.const(dtypes.bool, True))),
   lambda a, c: _not_lt(a, c, True)),
  (UPat(Ops.CMPNE, src=(UPat(Ops.CMPLT, src=(UPat(Ops.CONST, name="c"), UPat.var("a", INTS))), UPat.const(dtypes.bool, True))),
   lambda a, c: _not_lt(a, c, False)),
  (UPat(Ops.WHERE, src=(UPat(Ops.CMPNE, src=(UPat.var("c", dtypes.bool), UPat.const(dtypes.bool, True))), UPat.var("t"), UPat.var("f"))),
   lambda c, t, f: UOp(Ops.WHERE, t.dtype, (c, f, t))),
  (UPat(Ops.MAX, INTS, name="x"), _fold_max),
  (UPat((Ops.MAX, Ops.AND, Ops.OR, Ops.XOR, Ops.CMPNE, Ops.CMPEQ), name="x"), _order),
])


# ---- sint helpers

def ssimplify(x: sint) -> sint:
  """Simplify a sint: ints pass through; a UOp that simplifies to a CONST comes back as its Python value."""
  if isinstance(x, int): return x
  if not isinstance(x, UOp): raise TypeError(f"ssimplify needs an int or a UOp, got {type(x).__name__} {x!r}")
  return r.arg if (r := x.simplify()).op is Ops.CONST else r


def sym_infer(x: sint, var_vals: Mapping[Any, int]) -> int:
  """Evaluate `x` with the Variables given by UOp or by name. A BIND whose Variable is not given evaluates to its bound value."""
  if isinstance(x, int): return x
  if not isinstance(x, UOp): raise TypeError(f"sym_infer needs an int or a UOp, got {type(x).__name__} {x!r}")
  by_var: dict[UOp, int] = {}
  by_name: dict[str, int] = {}
  for k, v in var_vals.items():
    if isinstance(k, UOp) and k.op is Ops.BIND: k = k.src[0]
    if not isinstance(k, str) and not (isinstance(k, UOp) and k.op is Ops.DEFINE_VAR):
      raise SymbolicError(f"sym_infer: var_vals keys must be Variables (DEFINE_VAR or BIND) or their names, got {type(k).__name__} {k!r}")
    name = k if isinstance(k, str) else k.arg[0]
    if not isinstance(v, int) or isinstance(v, bool):
      raise SymbolicError(f"sym_infer: the value of {name!r} must be an int, got {type(v).__name__} {v!r}")
    if isinstance(k, str): by_name[k] = v
    else: by_var[k] = v
  vals: dict[UOp, Any] = {}
  bound = {u.src[0]: u.src[1].arg for u in x.toposort if u.op is Ops.BIND}
  for u in x.toposort:
    op = u.op
    if op is Ops.CONST: vals[u] = u.arg
    elif op is Ops.DEFINE_VAR:
      name, lo, hi = u.arg
      val = by_var.get(u, by_name.get(name, bound.get(u)))
      if val is None: raise SymbolicError(f"sym_infer: no value for Variable {name!r} (give it in var_vals by UOp or by name)")
      if not lo <= val <= hi: raise SymbolicError(f"sym_infer: value {val} is out of the range [{lo}, {hi}] of Variable {name!r}")
      vals[u] = val
    elif op is Ops.BIND: vals[u] = vals[u.src[0]]
    elif op in GroupOp.ALU: vals[u] = exec_alu(op, u.dtype, tuple(vals[s] for s in u.src), u.arg)
    elif op is Ops.CAST: vals[u] = exec_alu(Ops.MUL, u.dtype, (vals[u.src[0]], 1))
    else: raise SymbolicError(f"sym_infer cannot evaluate {op!r} (in {x.render(False)})")
  return vals[x]


def resolve(x: UOp | bool, default: bool = True) -> bool:
  """The value of a bool expression when its bounds decide it, else `default`."""
  if isinstance(x, bool): return x
  if not isinstance(x, UOp): raise TypeError(f"resolve needs a bool or a bool UOp, got {type(x).__name__} {x!r}")
  if x.dtype is not dtypes.bool: raise TypeError(f"resolve needs a bool UOp, got a {x.dtype} one: {x.render(False)}")
  lo, hi = _mm(x)
  if lo == hi: return bool(lo)
  lo, hi = x.simplify()._min_max
  return bool(lo) if lo == hi else default


def _sints(xs: tuple[Any, ...], fn: str) -> list[sint]:
  vals = list(xs[0]) if len(xs) == 1 and isinstance(xs[0], (list, tuple)) else list(xs)
  if not vals: raise ValueError(f"{fn}() needs at least one value")
  for v in vals:
    if not isinstance(v, (int, UOp)) or isinstance(v, bool): raise TypeError(f"{fn}() takes ints and UOps, got {type(v).__name__} {v!r}")
  return vals


def _sreduce(vals: list[sint], pick: Any, method: str) -> sint:
  ints = [v for v in vals if isinstance(v, int)]
  uops = [v for v in vals if isinstance(v, UOp)]
  if not uops: return pick(ints)
  acc = functools.reduce(lambda a, b: getattr(a, method)(b), uops[1:], uops[0])
  if ints: acc = getattr(acc, method)(pick(ints))
  return ssimplify(acc)


def smax(*xs: sint | Iterable[sint]) -> sint:
  """max of ints and UOps (`smax(a, b)` or `smax([a, b])`), simplified."""
  return _sreduce(_sints(xs, "smax"), max, "maximum")


def smin(*xs: sint | Iterable[sint]) -> sint:
  """min of ints and UOps (`smin(a, b)` or `smin([a, b])`), simplified."""
  return _sreduce(_sints(xs, "smin"), min, "minimum")
