"""float32 vector exp2 as plain arithmetic, so a vector of it stays a vector.

Both CPU compilers lower an exp2 of a vector to one libm call per lane: softmax's exp ran at ~1 G/s on 2 threads and
made every kernel with an exp compute-bound (issue 20: the sum of exponentials 5.5 ms, a projection fed by a tanh
GELU 125 ms). Written as uops before rendering, the C and LLVM paths render the same operations, so they still agree
bit for bit (tiering swaps one for the other).

exp2(x) = 2^n * 2^f with n = round(x), f = x - n in [-1/2, 1/2]; 2^f by its Taylor series to degree 7 (truncation
error below 1e-8; Horner with fused multiply-adds: within 1 ulp of the correctly rounded result over [-150, 128]);
2^n built from exponent bits in two halves so that subnormal results and overflow to inf come out of the
multiplications. nan gives nan, +-inf give inf and 0.
"""
from __future__ import annotations

import math

from plugrad.backend import Ops, UOp, dtypes

_ROUND = 12582912.0  # 1.5 * 2^23: adding and subtracting it rounds a float32 of magnitude < 2^22 to an integer (ties to even)
_CLAMP = 160.0  # beyond +-150 the result is inf or 0 already; both halves of 2^n stay normal floats
_TAYLOR = tuple(math.log(2) ** k / math.factorial(k) for k in range(8))


def _exp2(x: UOp) -> UOp:
  def c(v: float) -> UOp: return UOp.const(x.dtype, v)
  def rnd(v: UOp) -> UOp: return (v + c(_ROUND)) - c(_ROUND)
  isnan = x.ne(x)
  xc = isnan.where(c(0.0), x)
  xc = (xc < c(-_CLAMP)).where(c(-_CLAMP), xc)
  xc = (c(_CLAMP) < xc).where(c(_CLAMP), xc)
  n = rnd(xc)
  f = xc - n
  p = c(_TAYLOR[-1])
  for k in reversed(range(len(_TAYLOR) - 1)): p = UOp(Ops.MULACC, x.dtype, (p, f, c(_TAYLOR[k])))
  n1 = rnd(n * c(0.5))
  idt = dtypes.int32.vec(x.dtype.count) if x.dtype.count > 1 else dtypes.int32
  # the integer e sits in the low bits of e + _ROUND (no float->int conversion: the CPU renderers convert lane by lane)
  def pow2(e: UOp) -> UOp:
    bits = (e + c(_ROUND)).bitcast(idt)
    return ((bits + UOp.const(idt, 127 - 0x4B400000)) * UOp.const(idt, 1 << 23)).bitcast(x.dtype)
  return isnan.where(x, p * pow2(n1) * pow2(n - n1))


def _vexp2(u: UOp) -> bool: return u.op is Ops.EXP2 and u.dtype.scalar() is dtypes.float32 and u.dtype.count > 1


def expand_exp2(uops: tuple[UOp, ...]) -> tuple[UOp, ...]:
  """The linear uops with each float32 vector EXP2 replaced by its arithmetic (inserted where the EXP2 stood). A scalar
  exp2 keeps the libm call: as scalar code the arithmetic measured 5x slower than libm through LLVM (not understood yet)."""
  if not any(_vexp2(u) for u in uops): return uops
  out: list[UOp] = []
  have: set[UOp] = set()
  new: dict[UOp, UOp] = {}
  for u in uops:
    src = tuple(new.get(s, s) for s in u.src)
    nu = u if src == u.src else u.replace(src=src)
    if _vexp2(nu):
      nu = _exp2(nu.src[0])
      for s in nu.toposort:
        if s not in have and s is not nu:
          out.append(s)
          have.add(s)
    new[u] = nu
    if nu not in have: out.append(nu)
    have.add(nu)
  return tuple(out)
