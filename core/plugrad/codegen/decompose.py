"""Shared decompositions: semantics every backend needs, lowered once to plainer uops before rendering (docs/ir.md).

`decompose(sink, renderer)` runs on the lowered kernel graph, after the reductions become accumulators and before
linearizing, so the LINEAR a renderer sees holds only the operations its device spells natively. Each pass is switched
by a capability flag of the `Renderer` (the defaults describe the least capable device, so a new backend is correct
before it claims anything); `renderer.extra_matcher` runs after them for a backend's own rewrites.

* THREEFRY (always) → its 20 rounds of uint32 `+ ^ | << >>` (`threefry2x32` in uop/ops.py, the one definition).
* integer IDIV/MOD (unless `safe_int_div`) → a divisor of 0 (and -1 where the dividend may be the minimum) is replaced
  by 1 and the result chosen after: x / 0 = x % 0 = 0, INT_MIN / -1 = INT_MIN, INT_MIN % -1 = 0. Only where the
  symbolic bounds of the operands allow the case, so division by a constant stays one instruction.
* SHL/SHR (unless `safe_shifts`) → a shift by an amount outside [0, bits) gives 0 (the sign for `>>` of a negative
  signed value), again only where the bounds of the amount allow it.
* float MAX (unless `nan_max`) → two selects, nan wins like numpy: `a != a ? a : (b < a ? a : b)`. No branch and no
  `||`: a C compiler turns the selects into max and blend instructions and vectorizes them.
* bfloat16 (unless `native_bfloat16`) → no bfloat16 is left: values are float32 holding bfloat16 numbers, global and
  local memory is uint16 (the top half of the float32 bits), register arrays float32. Every arithmetic result and every
  CAST to bfloat16 is rounded by `round_bf16_bits` (uint32 ops: to nearest, ties to even; nan becomes the quiet nan of
  its sign); loads, stores and bitcasts move the bits unchanged.
"""
from __future__ import annotations

import functools

from plugrad.dtype import AddrSpace, DType, PtrDType, dtypes
from plugrad.renderer.base import Renderer
from plugrad.uop.ops import GroupOp, Ops, UOp, round_bf16, threefry2x32
from plugrad.uop.pattern import PatternMatcher, UPat
from plugrad.uop.rewrite import graph_rewrite


def _threefry(x: UOp) -> UOp:
  key, word = x.arg
  return threefry2x32(x.src[0], x.src[1], key, x.src[0].const_like)[word]


def _int_div(ctx: set[UOp], x: UOp) -> UOp | None:
  if x in ctx or not dtypes.is_int(x.dtype): return None
  a, b = x.src
  dt = x.dtype.scalar()
  (blo, bhi), alo = b._min_max, a._min_max[0]
  zero = blo <= 0 <= bhi
  # a / -1 is -a, which only overflows (and traps on x86) for the minimum of a wrapping signed dtype
  neg1 = dt is not dtypes.index and not dtypes.is_unsigned(dt) and blo <= -1 <= bhi and alo <= dtypes.min(dt)
  if not zero and not neg1: return None
  bad = b.eq(0) | b.eq(-1) if zero and neg1 else b.eq(0) if zero else b.eq(-1)
  q = UOp(x.op, x.dtype, (a, bad.where(b.const_like(1), b)))
  ctx.add(q)
  if x.op is Ops.MOD: return q  # a % 1 is 0, the answer for both cases
  if neg1: q = b.eq(-1).where(a.alu(Ops.NEG), q)
  return b.eq(0).where(a.const_like(0), q) if zero else q


def _shift(ctx: set[UOp], x: UOp) -> UOp | None:
  if x in ctx or not dtypes.is_int(x.dtype): return None
  a, b = x.src
  bits = 8 * x.dtype.scalar().itemsize
  lo, hi = b._min_max
  if 0 <= lo and hi < bits: return None
  ctx.add(x)
  ok = b < bits if lo >= 0 else (b.const_like(-1) < b) & (b < bits)
  fill = a >> (bits - 1) if x.op is Ops.SHR and not dtypes.is_unsigned(x.dtype.scalar()) else a.const_like(0)
  return ok.where(x, fill)


def _nan_max(x: UOp) -> UOp | None:
  if not dtypes.is_float(x.dtype): return None
  a, b = x.src
  return a.ne(a).where(a, (b < a).where(a, b))


# ---- bfloat16 emulation

_BF16, _F32, _U16, _U32 = dtypes.bfloat16, dtypes.float32, dtypes.uint16, dtypes.uint32


def _retype(dt: DType, s: DType) -> DType:
  """`dt` (a scalar, vector or pointer dtype) with its scalar replaced by `s`."""
  if isinstance(dt, PtrDType): return PtrDType.new_ptr(_retype(dt.base, s), dt.addrspace, dt.size, dt.v)
  return s.vec(dt.count)


def round_bf16_bits(x: UOp) -> UOp:
  """float32 `x` rounded to the nearest bfloat16 (ties to even), still float32; nan becomes the quiet nan of its sign.
  Integer ops on the bits only: a device's float compare may ignore nan, its conversion may flush subnormals."""
  b = x.bitcast(_retype(x.dtype, _U32))
  rounded = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
  isnan = b.const_like(0x7F800000) < (b & 0x7FFFFFFF)
  return isnan.where((b & 0x80000000) | 0x7FC00000, rounded).bitcast(x.dtype)


def _bits_to_f32(h: UOp) -> UOp: return (h.cast(_retype(h.dtype, _U32)) << 16).bitcast(_retype(h.dtype, _F32))
def _f32_to_bits(x: UOp) -> UOp: return (x.bitcast(_retype(x.dtype, _U32)) >> 16).cast(_retype(x.dtype, _U16))


def _bf16_define(x: UOp) -> UOp | None:
  if x.dtype.base.scalar() is not _BF16: return None  # type: ignore[union-attr]
  return x.replace(dtype=_retype(x.dtype, _F32 if x.dtype.addrspace is AddrSpace.REG else _U16))  # type: ignore[attr-defined]


def _bf16_pointer(x: UOp) -> UOp | None:
  # INDEX, CAST, GEP, VECTORIZE of pointers: the memory's scalar is the (already lowered) source's
  if x.dtype.base.scalar() is not _BF16 or not x.src or not isinstance(x.src[0].dtype, PtrDType): return None  # type: ignore[union-attr]
  return x.replace(dtype=_retype(x.dtype, x.src[0].dtype.base.scalar()))


def _bf16_load(x: UOp) -> UOp | None:
  if x.dtype.scalar() is not _BF16: return None
  mem = x.src[0].dtype.base.scalar()  # type: ignore[union-attr]
  if mem is not _U16: return x.replace(dtype=_retype(x.dtype, mem))
  alt = (_f32_to_bits(x.src[1]),) if len(x.src) > 1 and x.src[1].dtype is not dtypes.void else ()
  return _bits_to_f32(x.replace(dtype=_retype(x.dtype, _U16), src=(x.src[0], *alt, *x.src[1 + len(alt):])))


def _bf16_store(x: UOp) -> UOp | None:
  ptr, val = x.src[:2]
  if ptr.dtype.base.scalar() is not _U16 or val.dtype.scalar() is not _F32: return None  # type: ignore[union-attr]
  return x.replace(src=(ptr, _f32_to_bits(val), *x.src[2:]))


def _bf16_value(x: UOp) -> UOp | None:
  if x.dtype.scalar() is not _BF16: return None
  f = _retype(x.dtype, _F32)
  if x.op is Ops.CONST: return UOp.const(f, round_bf16(x.arg))
  if x.op is Ops.VCONST: return UOp.const(f, tuple(round_bf16(v) for v in x.arg))
  if x.op is Ops.BITCAST: return _bits_to_f32(x.src[0].bitcast(_retype(x.dtype, _U16)))
  if x.op is Ops.CAST:
    s = x.src[0].dtype.scalar()
    return round_bf16_bits(x.src[0].cast(_retype(x.dtype, dtypes.float32)) if s is not _F32 else x.src[0])
  y = x.replace(dtype=f)
  # NEG, WHERE and MAX of bfloat16 numbers are bfloat16 numbers
  return round_bf16_bits(y) if x.op in GroupOp.ALU - {Ops.NEG, Ops.WHERE, Ops.MAX} else y


def _bf16_source(x: UOp) -> UOp | None:
  """A CAST or BITCAST whose source was bfloat16 and is now float32."""
  s = x.src[0]
  if isinstance(x.dtype, PtrDType) or s.dtype.scalar() is not _F32: return None
  if x.op is Ops.CAST: return s if x.dtype is s.dtype else None
  # a bitcast keeps the size: a float32 source of another size was a bfloat16
  return _f32_to_bits(s).bitcast(x.dtype) if s.dtype.itemsize != x.dtype.itemsize else None


_BF16_RULES = [
  (UPat((Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL, Ops.DEFINE_REG), name="x"), _bf16_define),
  (UPat((Ops.INDEX, Ops.CAST, Ops.GEP, Ops.VECTORIZE), name="x"), lambda x: _bf16_pointer(x) if isinstance(x.dtype, PtrDType) else None),
  (UPat(Ops.LOAD, name="x"), _bf16_load),
  (UPat(Ops.STORE, name="x"), _bf16_store),
  (UPat((Ops.CAST, Ops.BITCAST), name="x"), _bf16_source),
  # the bits of a value that was just made from bits (a store of a rounded result)
  (UPat(Ops.BITCAST, src=(UPat(Ops.BITCAST, name="y"),), name="x"), lambda x, y: y.src[0] if y.src[0].dtype is x.dtype else None),
  (UPat(GroupOp.ALU | {Ops.CONST, Ops.VCONST, Ops.CAST, Ops.BITCAST, Ops.VECTORIZE, Ops.GEP}, name="x"),
   lambda x: None if isinstance(x.dtype, PtrDType) else _bf16_value(x)),
]

_THREEFRY = [(UPat(Ops.THREEFRY, name="x"), _threefry)]
_INT_DIV = [(UPat((Ops.IDIV, Ops.MOD), name="x"), _int_div)]
_SHIFTS = [(UPat((Ops.SHL, Ops.SHR), name="x"), _shift)]
_NAN_MAX = [(UPat(Ops.MAX, name="x"), _nan_max)]


_BF16_PM = PatternMatcher(_BF16_RULES)


@functools.cache
def _matcher(safe_int_div: bool, safe_shifts: bool, nan_max: bool) -> PatternMatcher:
  return PatternMatcher(_THREEFRY + ([] if safe_int_div else _INT_DIV) + ([] if safe_shifts else _SHIFTS) + ([] if nan_max else _NAN_MAX))


def decompositions(renderer: Renderer) -> PatternMatcher:
  """The semantic guards `renderer`'s capability flags ask for, as one matcher (rules take a `ctx` set; see `decompose`)."""
  return _matcher(renderer.safe_int_div, renderer.safe_shifts, renderer.nan_max)


def decompose(sink: UOp, renderer: Renderer) -> UOp:
  """`sink` with the shared decompositions for `renderer` applied, then the renderer's `extra_matcher`."""
  # ctx: the guarded ops already written, so the guard around one is not matched again
  sink = graph_rewrite(sink, decompositions(renderer), ctx=set(), name="decompose")
  # after the guards (a bfloat16 MAX may have become selects); the emulation's own shifts are by constants in range
  if not renderer.native_bfloat16 and any(u.dtype.base.scalar() is _BF16 for u in sink.toposort):
    sink = graph_rewrite(sink, _BF16_PM, name="bfloat16 emulation")
  return sink if renderer.extra_matcher is None else graph_rewrite(sink, renderer.extra_matcher, name="renderer extra_matcher")


def decompose_linear(uops: list[UOp], renderer: Renderer) -> list[UOp]:
  """`decompose` for a program that is already linear (hand-built kernels, e.g. the conformance suite's): the new uops
  of each rewrite are placed right before their first user."""
  new = decompose(UOp(Ops.SINK, dtypes.void, tuple(uops)), renderer)
  out: dict[UOp, None] = {}
  for root in new.src:
    stack = [root]
    while stack:
      if (x := stack[-1]) in out: stack.pop()
      elif missing := [s for s in x.src if s not in out]: stack.extend(reversed(missing))
      else: out[stack.pop()] = None
  return list(out)
