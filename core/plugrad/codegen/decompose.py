"""Shared decompositions: semantics every backend needs, lowered once to plainer uops before rendering (docs/ir.md).

`decompose(sink, renderer)` runs on the lowered kernel graph, after the reductions become accumulators and before
linearizing, so the LINEAR a renderer sees holds only the operations its device spells natively. Each pass is switched
by a capability flag of the `Renderer` (the defaults describe the least capable device, so a new backend is correct
before it claims anything); `renderer.extra_matcher` runs after them for a backend's own rewrites.

* a LOAD/STORE through a vector of addresses (always) → one scalar INDEX/LOAD/STORE per lane, the values joined by
  VECTORIZE and taken apart by GEP: a renderer sees only scalar pointers and contiguous vector accesses.
* EXP2, LOG2, SIN (unless `renderer.math_is_native(op, dtype)`) → float32 polynomials and exponent bits (16-bit floats
  through float32; float64 is never rewritten: a device with float64 must have its transcendentals).
* THREEFRY (always) → its 20 rounds of uint32 `+ ^ | << >>` (`threefry2x32` in uop/ops.py, the one definition).
* integer IDIV/MOD (unless `safe_int_div`) → a divisor of 0 (and -1 where the dividend may be the minimum) is replaced
  by 1 and the result chosen after: x / 0 = x % 0 = 0, INT_MIN / -1 = INT_MIN, INT_MIN % -1 = 0. Only where the
  symbolic bounds of the operands allow the case, so division by a constant stays one instruction.
* SHL/SHR (unless `safe_shifts`) → a shift by an amount outside [0, bits) gives 0 (the sign for `>>` of a negative
  signed value), again only where the bounds of the amount allow it.
* float MAX (unless `nan_max`) → two selects, nan wins like numpy: `a != a ? a : (b < a ? a : b)`. No branch and no
  `||`: a C compiler turns the selects into max and blend instructions and vectorizes them.
* float POW (unless `full_pow`) → C's pow around the device's pow of |a|: a negative base to an integral power gets its
  sign (nan for a fractional one), 0 to a negative power is inf and to a positive one 0, a**0 and 1**b are 1.
* bfloat16 (unless `native_bfloat16`) → no bfloat16 is left: values are float32 holding bfloat16 numbers, global and
  local memory is uint16 (the top half of the float32 bits), register arrays float32. Every arithmetic result and every
  CAST to bfloat16 is rounded by `round_bf16_bits` (uint32 ops: to nearest, ties to even; nan becomes the quiet nan of
  its sign); loads, stores and bitcasts move the bits unchanged.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable

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
  fill = a >> (bits - 1) if x.op is Ops.SHR and not dtypes.is_unsigned(x.dtype.scalar()) else a.const_like(0)
  ok = b < bits if lo >= 0 else (b.const_like(-1) < b) & (b < bits)
  # never in range (a constant count past the width): the untaken shift is by 0, as WGSL rejects a constant one past the
  # width even there; it stays (not just `fill`) so the kernel still reads every buffer its signature lists
  if lo >= bits or hi < 0: x = x.replace(src=(a, b.const_like(0)))
  return ok.where(x, fill)


def _pow(ctx: set[UOp], x: UOp) -> UOp | None:
  if x in ctx or not dtypes.is_float(x.dtype): return None
  a, b = x.src
  neg, inf = a < a.const_like(0), a.const_like(math.inf)
  mag = x.replace(src=(neg.where(a.alu(Ops.NEG), a), b))  # pow of |a|: asked only for a finite or infinite |a| > 0
  ctx.add(mag)
  half = b * b.const_like(0.5)
  integral = b.alu(Ops.TRUNC).eq(b)
  odd = integral & half.alu(Ops.TRUNC).ne(half)  # an odd integer (inf is not)
  fractional = integral.logical_not() & a.ne(-inf)  # -inf to any power is ±inf or 0
  signed = fractional.where(a.const_like(math.nan), odd.where(mag.alu(Ops.NEG), mag))
  ret = a.eq(0).where((b < b.const_like(0)).where(inf, a.const_like(0)), neg.where(signed, mag))
  ret = (a.ne(a) | b.ne(b)).where(a.const_like(math.nan), ret)
  one = b.eq(0) | a.eq(1) | (a.eq(-1) & (b.eq(inf) | b.eq(-inf)))  # 1 even for a nan base or exponent, as C
  return one.where(a.const_like(1), ret)


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


def _bits_of(v: UOp) -> UOp | None:
  """The uint16 bits `h` of a float32 `v` made by `_bits_to_f32(h)`, else None."""
  if v.op is not Ops.BITCAST or (sh := v.src[0]).op is not Ops.SHL or (c := sh.src[0]).op is not Ops.CAST: return None
  k = sh.src[1]
  sixteen = (k.op is Ops.CONST and k.arg == 16) or (k.op is Ops.VCONST and set(k.arg) == {16}) or \
    (k.op is Ops.VECTORIZE and all(c.op is Ops.CONST and c.arg == 16 for c in k.src))
  return c.src[0] if sixteen and c.src[0].dtype.scalar() is _U16 else None


def _shuffled_bits(x: UOp) -> UOp | None:
  """Lanes of bfloat16 loads put in another order (a tensor core's operand joined from row loads: "joined accesses")
  shuffled as their 16-bit bits, then widened once: the instruction takes bits again, so the compiler drops the
  widening instead of shifting every row twice around the shuffle."""
  if x.dtype.scalar() is not _F32 or x.dtype.count < 2: return None
  lanes = []
  for g in x.src:
    if g.op is not Ops.GEP or len(g.arg) != 1 or (h := _bits_of(g.src[0])) is None: return None
    lanes.append(h.gep(g.arg[0]))
  return _bits_to_f32(UOp(Ops.VECTORIZE, _U16.vec(len(lanes)), tuple(lanes)))


_BF16_RULES: list[tuple[UPat, Callable[..., UOp | None]]] = [
  (UPat(Ops.VECTORIZE, name="x"), _shuffled_bits),
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

# ---- transcendentals the device lacks: polynomials and exponent bits, in float32

_ROUND = 12582912.0  # 1.5 * 2^23: adding and subtracting it rounds a float32 of magnitude < 2^22 to an integer (ties to even)
_ROUND_BITS = 0x4B400000  # the bits of _ROUND: those of `v + _ROUND` are these plus the integer v
_LN2 = math.log(2)
_EXP2_TAYLOR = tuple(_LN2 ** k / math.factorial(k) for k in range(8))
_CLAMP = 160.0  # beyond +-150 exp2 is inf or 0 already; both halves of 2^n stay normal floats
_ATANH = tuple(2 / (2 * k + 1) for k in range(5))  # ln((1+s)/(1-s)) = 2s + 2s^3/3 + ...
_SIN = tuple((-1) ** k / math.factorial(2 * k + 1) for k in range(1, 5))
_COS = tuple((-1) ** k / math.factorial(2 * k) for k in range(6))
# pi/2 as a sum of float32 numbers of 13 significant bits each (from its first 90 bits): n times one of them is exact
# for |n| < 2^11, so x - n*pi/2 loses nothing to the reduction over the range below
PIO2_PARTS = (1.57080078125, -4.454515874385834e-06, 6.076561476220377e-11, 5.390653201597928e-15, -3.5035400280806e-19,
              1.0562708681390029e-23)
SIN_RANGE = 2.0 ** 22  # |x| (float32) within which SIN is reduced exactly; outside it (and at +-inf, nan) SIN gives nan


def _ivec(x: UOp, dt: DType) -> DType: return dt.vec(x.dtype.count) if x.dtype.count > 1 else dt
def _rnd(v: UOp) -> UOp: return (v + _ROUND) - _ROUND
def _horner(x: UOp, coeffs: tuple[float, ...]) -> UOp:
  p = x.const_like(coeffs[-1])
  for c in reversed(coeffs[:-1]): p = UOp(Ops.MULACC, x.dtype, (p, x, x.const_like(c)))
  return p


def _exp2_f32(x: UOp) -> UOp:
  """2^n * 2^f with n = round(x), f in [-1/2, 1/2]: 2^f by its Taylor series to degree 7 (within 1 ulp over [-150, 128]
  with fused multiply-adds), 2^n from exponent bits in two halves, so subnormal results and overflow to inf come out of
  the multiplications. No float -> int conversion: the integer is read from the bits of n + _ROUND."""
  isnan = x.ne(x)
  xc = isnan.where(x.const_like(0.0), x)
  xc = (xc < -_CLAMP).where(x.const_like(-_CLAMP), xc)
  xc = (xc.const_like(_CLAMP) < xc).where(x.const_like(_CLAMP), xc)
  n = _rnd(xc)
  p = _horner(xc - n, _EXP2_TAYLOR)
  n1 = _rnd(n * 0.5)
  i32 = _ivec(x, dtypes.int32)
  def pow2(e: UOp) -> UOp: return (((e + _ROUND).bitcast(i32) + (127 - _ROUND_BITS)) * (1 << 23)).bitcast(x.dtype)
  return isnan.where(x, p * pow2(n1) * pow2(n - n1))


def _log2_f32(x: UOp) -> UOp:
  """e + log2(m) with x = m * 2^e, m in [sqrt(1/2), sqrt(2)); log(m) = 2 atanh(s), s = (m-1)/(m+1) in [-0.172, 0.172],
  to s^9 (within 4 ulp). Subnormal x is scaled by 2^24 first; 0 -> -inf, inf -> inf, x < 0 and nan -> nan."""
  u32, i32 = _ivec(x, dtypes.uint32), _ivec(x, dtypes.int32)
  tiny = x < 2.0 ** -126
  # bits minus those of sqrt(1/2): the exponent (arithmetic shift) is e of the centred mantissa, the low bits its fraction
  b = tiny.where(x * 2.0 ** 24, x).bitcast(u32) + (-0x3F3504F3 & 0xFFFFFFFF)
  e = (b.bitcast(i32) >> 23) + tiny.where(UOp.const(i32, -24), UOp.const(i32, 0))
  f = ((b & 0x7FFFFF) + 0x3F3504F3).bitcast(x.dtype) - 1.0
  s = f / (f + 2.0)
  ef = (e + _ROUND_BITS).bitcast(x.dtype) - _ROUND
  r = UOp(Ops.MULACC, x.dtype, (s * _horner(s * s, _ATANH), x.const_like(1 / _LN2), ef))
  r = x.eq(0.0).where(x.const_like(-math.inf), x.eq(math.inf).where(x, r))
  return ((x < 0.0) | x.ne(x)).where(x.const_like(math.nan), r)


def _sin_f32(x: UOp) -> UOp:
  """sin(r) or cos(r) by Taylor series (to r^9 and r^10) of r = x - n*pi/2 in [-pi/4, pi/4], chosen and signed by n mod 4
  (within 5 ulp or 1e-7 absolute for |x| < SIN_RANGE)."""
  ok = (x < SIN_RANGE) & (x.const_like(-SIN_RANGE) < x)
  xc = ok.where(x, x.const_like(0.0))
  n = _rnd(xc * (2 / math.pi))
  nh = _rnd(n * 2.0 ** -11) * 2.0 ** 11
  nl = n - nh
  r = xc
  for c in PIO2_PARTS: r = (r - nh * c) - nl * c
  r2 = r * r
  sin = UOp(Ops.MULACC, x.dtype, (r * r2, _horner(r2, _SIN), r))
  cos = _horner(r2, _COS)
  q = (n + _ROUND).bitcast(_ivec(x, dtypes.int32))
  v = (q & 1).ne(0).where(cos, sin)
  return ok.where((q & 2).ne(0).where(-v, v), x.const_like(math.nan))


_POLYNOMIAL = {Ops.EXP2: _exp2_f32, Ops.LOG2: _log2_f32, Ops.SIN: _sin_f32}


def _needs_polynomial(renderer: Renderer, x: UOp) -> bool:
  return x.op in GroupOp.Transcendental and x.dtype.scalar() is not dtypes.float64 and not renderer.math_is_native(x.op, x.dtype)


def _transcendental(ctx: Renderer, x: UOp) -> UOp | None:
  if not _needs_polynomial(ctx, x): return None
  if x.dtype.scalar() is _F32: return _POLYNOMIAL[x.op](x.src[0])
  return _POLYNOMIAL[x.op](x.src[0].cast(_retype(x.dtype, _F32))).cast(x.dtype)  # 16-bit floats: in float32


_MATH_PM = PatternMatcher([(UPat(GroupOp.Transcendental, name="x"), _transcendental)])

# ---- vectors of addresses: one scalar access per lane

def _lanes(p: UOp) -> list[UOp]:
  """The addresses of pointer value `p`, one pointer per lane (a lane may point at a contiguous vector)."""
  if p.op is Ops.VECTORIZE: return [ln for s in p.src for ln in _lanes(s)]
  if p.op is Ops.GEP: return [(src := _lanes(p.src[0]))[j] for j in p.arg]
  if p.op is Ops.CAST and len(src := _lanes(p.src[0])) > 1: return src
  if p.op is Ops.INDEX and (n := p.src[1].dtype.count) > 1:
    return [p.replace(src=(p.src[0], *(s.gep(j) for s in p.src[1:3]))) for j in range(n)]
  return [p]


def _split_load(x: UOp) -> UOp | None:
  if (lanes := _lanes(x.src[0])) == [x.src[0]]: return None
  per = x.dtype.count // len(lanes)
  alt = x.src[1] if len(x.src) > 1 and x.src[1].dtype is not dtypes.void else None
  rest = x.src[2:] if alt is not None else x.src[1:]
  def part(j: int) -> UOp: return alt.gep(tuple(range(j * per, (j + 1) * per))) if alt is not None else None  # type: ignore[return-value]
  loads = [UOp(Ops.LOAD, x.dtype.scalar().vec(per), (ln, *((part(j),) if alt is not None else ()), *rest)) for j, ln in enumerate(lanes)]
  return UOp(Ops.VECTORIZE, x.dtype, tuple(ld.gep(k) for ld in loads for k in range(per)))


def _split_store(x: UOp) -> UOp | None:
  if (lanes := _lanes(x.src[0])) == [x.src[0]]: return None
  per = x.src[1].dtype.count // len(lanes)
  return UOp(Ops.GROUP, dtypes.void, tuple(UOp(Ops.STORE, dtypes.void, (ln, x.src[1].gep(tuple(range(j * per, (j + 1) * per))), *x.src[2:]), x.arg)
                                           for j, ln in enumerate(lanes)))


def _is_address_vector(u: UOp) -> bool:
  return (u.op in (Ops.VECTORIZE, Ops.GEP) and isinstance(u.dtype, PtrDType)) or (u.op is Ops.INDEX and u.src[1].dtype.count > 1)


_SPLIT_PM = PatternMatcher([(UPat(Ops.LOAD, name="x"), _split_load), (UPat(Ops.STORE, name="x"), _split_store)])

_THREEFRY = [(UPat(Ops.THREEFRY, name="x"), _threefry)]
_INT_DIV = [(UPat((Ops.IDIV, Ops.MOD), name="x"), _int_div)]
_SHIFTS = [(UPat((Ops.SHL, Ops.SHR), name="x"), _shift)]
_NAN_MAX = [(UPat(Ops.MAX, name="x"), _nan_max)]
_POW = [(UPat(Ops.POW, name="x"), _pow)]


_BF16_PM = PatternMatcher(_BF16_RULES)


@functools.cache
def _matcher(safe_int_div: bool, safe_shifts: bool, nan_max: bool, full_pow: bool) -> PatternMatcher:
  return PatternMatcher(_THREEFRY + ([] if safe_int_div else _INT_DIV) + ([] if safe_shifts else _SHIFTS) + ([] if nan_max else _NAN_MAX) +
                        ([] if full_pow else _POW))


def decompositions(renderer: Renderer) -> PatternMatcher:
  """The semantic guards `renderer`'s capability flags ask for, as one matcher (rules take a `ctx` set; see `decompose`)."""
  return _matcher(renderer.safe_int_div, renderer.safe_shifts, renderer.nan_max, renderer.full_pow)


def split_address_lanes(sink: UOp, renderer: Renderer) -> UOp:
  """Vector loads and stores through a vector of addresses (a gather, a scatter) split into one access per lane."""
  return graph_rewrite(sink, _SPLIT_PM, name="address lanes") if any(_is_address_vector(u) for u in sink.toposort) else sink


def transcendentals(sink: UOp, renderer: Renderer) -> UOp:
  """EXP2, LOG2 and SIN the device does not compute itself written out as float32 polynomials."""
  return graph_rewrite(sink, _MATH_PM, ctx=renderer, name="transcendentals") if any(_needs_polynomial(renderer, u) for u in sink.toposort) else sink


def guards(sink: UOp, renderer: Renderer) -> UOp:
  """The semantic guards `renderer`'s capability flags ask for (integer division and shifts, nan-propagating MAX, POW,
  Threefry). ctx: the guarded ops already written, so the guard around one is not matched again. A rewrite in which no
  rule fires on any node returns its input, so the kernel is walked only when one fires somewhere: most kernels have
  none of these ops, or only divisions by constants (no guard needed)."""
  pm = decompositions(renderer)
  if not any(u.op in pm.fast and pm.rewrite(u, set()) is not None for u in sink.toposort): return sink
  return graph_rewrite(sink, pm, ctx=set(), name="decompose")


def bfloat16_emulation(sink: UOp, renderer: Renderer) -> UOp:
  """bfloat16 as float32 arithmetic on 16-bit storage, for a renderer without native bfloat16. After the guards (a
  bfloat16 MAX may have become selects); the emulation's own shifts are by constants in range."""
  if renderer.native_bfloat16 or not any(u.dtype.base.scalar() is _BF16 for u in sink.toposort): return sink
  return graph_rewrite(sink, _BF16_PM, name="bfloat16 emulation")


def renderer_rules(sink: UOp, renderer: Renderer) -> UOp:
  """The renderer's own rewrites (`Renderer.extra_matcher`), after the shared ones."""
  return sink if renderer.extra_matcher is None else graph_rewrite(sink, renderer.extra_matcher, name="renderer extra_matcher")


# the last passes of the codegen pipeline (codegen/passes.py), in their order: what `decompose` applies
DECOMPOSITIONS: tuple[tuple[str, Callable[[UOp, Renderer], UOp]], ...] = (
  ("address lanes", split_address_lanes), ("transcendentals", transcendentals), ("guards", guards), ("bfloat16", bfloat16_emulation),
  ("renderer rules", renderer_rules))


def decompose(sink: UOp, renderer: Renderer) -> UOp:
  """`sink` with the shared decompositions for `renderer` applied, then the renderer's `extra_matcher`: the pipeline's
  DECOMPOSITIONS, for graphs built outside it (hand-written linear kernels, tests)."""
  for _, fn in DECOMPOSITIONS: sink = fn(sink, renderer)
  return sink


def decompose_linear(uops: list[UOp], renderer: Renderer) -> list[UOp]:
  """`decompose` for a program that is already linear (hand-built kernels, e.g. the conformance suite's): the new uops
  of each rewrite are placed right before their first user."""
  new = decompose(UOp(Ops.SINK, dtypes.void, tuple(uops)), renderer)
  out: dict[UOp, None] = {}
  # a vector of addresses whose accesses were split is left unused: it is not placed
  for root in (r for r in new.src if not _is_address_vector(r)):
    stack = [root]
    while stack:
      if (x := stack[-1]) in out: stack.pop()
      elif missing := [s for s in x.src if s not in out]: stack.extend(reversed(missing))
      else: out[stack.pop()] = None
  if not any(u.op is Ops.GROUP for u in out): return list(out)
  # a GROUP only holds effects together (as in linearize): its effects take its place, and a user orders after them all
  done: dict[UOp, UOp] = {}
  for u in out:
    src = tuple(t for s in u.src for t in (done[s].src if s.op is Ops.GROUP else (done[s],)))
    done[u] = u if src == u.src else u.replace(src=src)
  return [done[u] for u in out if u.op is not Ops.GROUP]
