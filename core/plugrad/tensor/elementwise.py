"""Elementwise Tensor methods: broadcasting and dtype promotion, arithmetic, comparisons, bitwise ops and the math
functions, each composed from the IR's ALU ops (docs/tensor.md lists the formulas' domains and accuracy).

Promotion: two tensors meet at `least_upper_dtype`. A Python scalar adopts the tensor's dtype when it fits its kind
(a bool always does, an int fits int and float tensors, a float fits float tensors); otherwise a float scalar makes the
result `default_float` and an int scalar with a bool tensor makes it `default_int`.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from plugrad.dtype import DType, dtypes, least_upper_dtype, least_upper_float
from plugrad.errors import DeviceMismatchError
from plugrad.tensor.helpers import ArgumentError, DTypeNotImplementedError, broadcast_shape, const_uop, in_float32, tensor_cls
from plugrad.uop.ops import GroupOp, Ops, UOp

if TYPE_CHECKING:
  from plugrad.tensor.tensor import Tensor

Scalar = bool | int | float

# atan(t)/t on t^2 in [0, tan(pi/8)^2]: a degree-9 Chebyshev fit (relative error ~1.4e-15), evaluated by Horner's rule
_ATAN_COEFFS = (0.9999999999999993, -0.3333333333322494, 0.19999999978932675, -0.14285712693360106, 0.11111049788060764,
                -0.09089545490365898, 0.07673687489125985, -0.06506851911716473, 0.05027443131598921, -0.025350979773298036)
# erf: Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7)
_ERF_P, _ERF_A = 0.3275911, (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)


# ---- promotion and broadcasting

def scalar_dtype(dt: DType, x: Any) -> DType:
  """The dtype a tensor of `dt` combined with the Python scalar `x` computes in."""
  if isinstance(x, bool): return dt
  if isinstance(x, (int, UOp)): return dtypes.default_int if dt is dtypes.bool else dt
  if isinstance(x, float): return dt if dtypes.is_float(dt) else dtypes.default_float
  raise TypeError(f"cannot combine a Tensor with a {type(x).__name__} ({x!r:.60}); use a Tensor, bool, int or float")


def _pyscalar(x: Any) -> Any:
  if isinstance(x, np.generic): return x.item()
  if isinstance(x, np.ndarray) and x.ndim == 0: return x.item()
  return x


def broadcasted(self: Tensor, x: Any, reverse: bool = False, op: str = "op") -> tuple[Tensor, Tensor]:
  """(self, x) — or (x, self) with `reverse` — promoted to one dtype and broadcast to one shape."""
  T = tensor_cls()
  x = _pyscalar(x)
  if isinstance(x, T):
    if x.device != self.device: raise DeviceMismatchError(f"{op}: tensors on different devices ({self.device} and {x.device}); move one with .to()")
    dt = least_upper_dtype(self.dtype, x.dtype)
    shape = broadcast_shape(self.shape, x.shape, op=op)
    a, b = self.cast(dt)._broadcast_to(shape), x.cast(dt)._broadcast_to(shape)
  else:
    dt = scalar_dtype(self.dtype, x)
    a = self.cast(dt)
    b = T._wrap(const_uop(x, dt, self.device, self.shape))
  return (b, a) if reverse else (a, b)


def _alu(op: Ops, a: Tensor, *rest: Tensor) -> Tensor: return a._wrap(a.uop.alu(op, *(r.uop for r in rest)))
def _const_like(t: Tensor, value: Any) -> Tensor: return t._wrap(const_uop(value, t.dtype, t.device, t.shape))
def _floats(t: Tensor) -> Tensor: return t if dtypes.is_float(t.dtype) else t.cast(least_upper_float(t.dtype))


_SAME_SIZE_INT = {2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}


def _sign_bit(t: Tensor) -> Tensor:
  """Whether the sign bit of each element of float tensor t is set (-0.0 and a negative nan included)."""
  return t.bitcast(_SAME_SIZE_INT[t.dtype.itemsize]) < 0


def _need(t: Tensor, ok: bool, op: str, kinds: str) -> None:
  if not ok: raise DTypeNotImplementedError(f"{op} needs {kinds} tensors, got {t.dtype}")


# ---- arithmetic

def add(self: Tensor, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
  a, b = broadcasted(self, x, reverse, "add")
  return _alu(Ops.OR if a.dtype is dtypes.bool else Ops.ADD, a, b)


def sub(self: Tensor, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
  a, b = broadcasted(self, x, reverse, "sub")
  if a.dtype is dtypes.bool: raise TypeError("sub of bool tensors is not defined; use logical_xor (^) or logical_not")
  if dtypes.is_float(a.dtype): return _alu(Ops.SUB, a, b)
  return _alu(Ops.ADD, a, _alu(Ops.MUL, b, _const_like(b, -1)))  # the IR has no integer SUB


def mul(self: Tensor, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
  a, b = broadcasted(self, x, reverse, "mul")
  return _alu(Ops.AND if a.dtype is dtypes.bool else Ops.MUL, a, b)


def _int_operands(self: Tensor, x: Any, reverse: bool, op: str) -> tuple[Tensor, Tensor]:
  a, b = broadcasted(self, x, reverse, op)
  if a.dtype is dtypes.bool: a, b = a.cast(dtypes.default_int), b.cast(dtypes.default_int)
  return a, b


def _floordiv_int(a: Tensor, b: Tensor) -> Tensor:
  q = _alu(Ops.IDIV, a, b)
  if dtypes.is_unsigned(a.dtype): return q
  # C division truncates; step down when the remainder is nonzero and the signs differ
  r = _alu(Ops.MOD, a, b)
  return (r.ne(0) & ((r < 0).ne(b < 0))).where(q - 1, q)


def div(self: Tensor, x: Tensor | Scalar, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
  if rounding_mode not in (None, "trunc", "floor"):
    raise ArgumentError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")
  a, b = broadcasted(self, x, reverse, "div")
  if rounding_mode is not None and not dtypes.is_float(a.dtype):
    if a.dtype is dtypes.bool: a, b = a.cast(dtypes.default_int), b.cast(dtypes.default_int)
    return _alu(Ops.IDIV, a, b) if rounding_mode == "trunc" else _floordiv_int(a, b)
  a, b = _floats(a), _floats(b)
  q = _alu(Ops.FDIV, a, b)
  return q if rounding_mode is None else q.trunc() if rounding_mode == "trunc" else _floordiv_float(a, b, q)


def _floordiv_float(a: Tensor, b: Tensor, q: Tensor) -> Tensor:
  """PyTorch's floor division of floats (q = a/b): (a - fmod(a, b))/b, one less where the remainder's sign differs from
  b's, rounded to the nearest integer; ±0 where that is 0, a/b itself where b is 0. So an infinite a gives nan, and a
  quotient that rounds to -0 (-1.9 // inf) gives -1, as Python's //. Its gradient is 0."""
  a, b, qd = a.detach(), b.detach(), q.detach()
  m = _fmod_float(a, b)
  d = (a - m) / b
  d = (m.ne(0) & (b < 0).ne(m < 0)).where(d - 1, d)
  f = d.floor()
  f = (d - f > 0.5).where(f + 1, f)
  v = b.eq(0).where(qd.floor(), d.ne(0).where(f, qd * 0.0))  # qd·0: the zero with the quotient's sign
  return q.isnan().where(q.floor(), v)  # q's floor (nan where chosen) keeps the result on the graph, with gradient 0


_U64_OK: dict[Any, bool] = {}


def _fmod_bits(a: Tensor, b: Tensor) -> Tensor:
  """|a| mod |b| with a's sign, exactly, for float32 a and b (b finite and nonzero; the caller selects the other cases).
  With a = ma·2^ea, b = mb·2^eb (integer mantissas), the remainder is ((ma mod mb)·2^(ea-eb) mod mb)·2^eb: the power of two
  enters a few bits per step, so every intermediate fits an unsigned integer (40 bits a step in uint64 where the device
  has it, else 8 in uint32: ea - eb is at most 253)."""
  from plugrad.tensor.creation import dtype_problem
  dev = a.device if isinstance(a.device, str) else a.device[0]
  if dev not in _U64_OK: _U64_OK[dev] = dtype_problem(dev, dtypes.uint64) is None
  u, step = (dtypes.uint64, 40) if _U64_OK[dev] else (dtypes.uint32, 8)
  u32, i32 = dtypes.uint32, dtypes.int32
  def parts(x: Tensor) -> tuple[Tensor, Tensor]:
    bits = x.bitcast(u32)
    field = (bits >> 23) & 0xFF
    mant = (bits & 0x7FFFFF) | field.ne(0).where(0x800000, 0).cast(u32)  # the implicit bit of a normal number
    return mant.cast(u), field.maximum(1).cast(i32)                         # subnormals: exponent field 0 means 1
  ma, ea = parts(a)
  mb, eb = parts(b)
  mb = mb.eq(0).where(1, mb).cast(u)  # b = 0 is selected away; no division by 0 meanwhile
  d = ea - eb
  r = ma % mb
  for k in range(-(-253 // step)): r = (r << (d - k * step).maximum(0).minimum(step).cast(u)) % mb
  e = eb - 150                                   # b = mb·2^e; the remainder r·2^e scaled in two normal powers of two
  e1 = e >> 1
  def pow2(n: Tensor) -> Tensor: return ((n + 127) << 23).bitcast(dtypes.float32)
  mag = (d < 0).where(a.abs(), r.cast(dtypes.float32) * pow2(e1) * pow2(e - e1))
  return _sign_bit(a).where(-mag, mag)


def _fmod_long_division(a: Tensor, b: Tensor) -> Tensor:
  """|a| mod |b| with a's sign, exactly, for float32 values a and b held in float64 (b finite and nonzero; the caller
  selects the other cases): long division by quotient digits of 29 bits. A digit n times |b| (24 bits) is exact in float64,
  and r - n·|b| is exact (r and n·|b| are within a factor of 2); ten digits cover the largest quotient, 2^277. Vector
  float64 arithmetic: ~70x faster on a CPU than the integer steps (`_fmod_bits`) that devices without float64 take."""
  r, d = a.abs(), b.abs()
  inv = 1 / d  # a digit off by one is taken by the next step (or the fix-ups): no division per step
  for _ in range(11):
    q = r * inv
    top = q * (2.0 ** 24 + 1)
    top = top - (top - q)  # q rounded to its first 29 bits (Veltkamp's split)
    n = (q.abs() < 2.0 ** 29).where(q.trunc(), top)  # the last digits: whole
    r = r - n * d
  r = (r < 0).where(r + d, r)  # a digit from a quotient rounded up to an integer
  r = (r >= d).where(r - d, r)
  return _sign_bit(a).where(-r, r)


def _fmod_float(a: Tensor, b: Tensor) -> Tensor:
  """C's fmod of float tensors a and b (one dtype and shape): exact for float32 and narrower (`_fmod_bits`); float64 is
  a - trunc(a/b)·b, rounded where a/b has more than 53 bits (docs/tensor.md). fmod(a, ±inf) = a, fmod(±inf, b) and
  fmod(a, 0) are nan. Its gradient is 1 for a and -trunc(a/b) for b (0 where b is infinite; a/b in float64 where the
  device has it, so that an overflowing float32 quotient gives ±inf, not 0)."""
  if a.dtype is dtypes.float64: v = a - (a / b).trunc() * b
  elif _has_float64(a.device): v = _fmod_long_division(a.detach().cast(dtypes.float64), b.detach().cast(dtypes.float64)).cast(a.dtype)
  else: v = _fmod_bits(a.detach().cast(dtypes.float32), b.detach().cast(dtypes.float32)).cast(a.dtype)
  bad = a.isinf() | b.eq(0) | a.isnan() | b.isnan()
  v = bad.where(math.nan, b.isinf().where(a.detach(), v))
  wide = dtypes.float64 if a.dtype is not dtypes.float64 and _has_float64(a.device) else a.dtype
  bw = b.cast(wide)
  q = (a.cast(wide) / bw).trunc().detach()
  # (b - b)·q is nan where b or q is not finite: no gradient there, except where fmod is nan anyway (b = 0 or an infinite
  # a: ±inf, as PyTorch)
  lost = (bw.isinf() | (q.isinf() & bw.ne(0) & a.isfinite())).detach()
  bg = lost.where(0.0, bw)
  return v.detach() + (a - a.detach()) - ((bg - bg.detach()) * lost.where(0.0, q)).cast(a.dtype)


def mod(self: Tensor, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
  """Python's remainder: the result has the sign of the divisor."""
  a, b = _int_operands(self, x, reverse, "mod")
  if dtypes.is_float(a.dtype):
    m = _fmod_float(a, b)
    return (m.ne(0) & (b < 0).ne(m < 0)).where(m + b, m)  # PyTorch's: fmod moved to b's side
  r = _alu(Ops.MOD, a, b)
  if dtypes.is_unsigned(a.dtype): return r
  return (r.ne(0) & ((r < 0).ne(b < 0))).where(r + b, r)


def fmod(self: Tensor, x: Tensor | Scalar) -> Tensor:
  """C's remainder: the result has the sign of the dividend."""
  a, b = _int_operands(self, x, False, "fmod")
  if dtypes.is_float(a.dtype): return _fmod_float(a, b)
  return _alu(Ops.MOD, a, b)


def pow(self: Tensor, x: Tensor | Scalar, reverse: bool = False) -> Tensor:
  base, exponent = broadcasted(self, x, reverse, "pow")
  if not dtypes.is_float(base.dtype) and isinstance(x, int) and not isinstance(x, bool) and not reverse and x < 0:
    raise ArgumentError(f"pow: an integer tensor ({self.dtype}) to a negative integer power ({x}) is not an integer "
                        "(PyTorch raises too); cast to float first")
  if base.dtype is dtypes.bool: base, exponent = base.cast(dtypes.default_int), exponent.cast(dtypes.default_int)
  return _alu(Ops.POW, base, exponent)


def neg(self: Tensor) -> Tensor:
  if self.dtype is dtypes.bool: return self.logical_not()
  return _alu(Ops.NEG, self) if dtypes.is_float(self.dtype) else self * -1


def reciprocal(self: Tensor) -> Tensor: return _alu(Ops.RECIPROCAL, _floats(self))
def square(self: Tensor) -> Tensor: return self * self


def sign(self: Tensor) -> Tensor:
  if self.dtype is dtypes.bool: return self
  if dtypes.is_unsigned(self.dtype): return (self > 0).cast(self.dtype)
  s = (self < 0).where(_const_like(self, -1), (self > 0).cast(self.dtype))
  return self.isnan().where(self.detach(), s) if dtypes.is_float(self.dtype) else s  # nan stays nan; the gradient is 0


def abs(self: Tensor) -> Tensor:
  if self.dtype is dtypes.bool or dtypes.is_unsigned(self.dtype): return self
  # floats: max(x, -x), whose gradient is sign(x) (0 at 0, where the tie splits it, as PyTorch), also at ±inf
  return _alu(Ops.MAX, self, -self) if dtypes.is_float(self.dtype) else (self < 0).where(-self, self)


def copysign(self: Tensor, other: Tensor | Scalar) -> Tensor:
  a, b = broadcasted(_floats(self), other, False, "copysign")
  a, b = _floats(a), _floats(b)
  negative = _sign_bit(b)  # of a zero and a nan too (numpy, PyTorch and C read the bit)
  mag = a.abs()
  return negative.where(-mag, mag)


def lerp(self: Tensor, end: Tensor, weight: Tensor | Scalar) -> Tensor:
  """PyTorch's two-sided form: a + (b - a)·w for w < 1/2, else b - (b - a)·(1 - w), so that the result is b at w = 1
  (a + (b - a) loses b where |a| >> |b|)."""
  d = end - self
  if not isinstance(weight, tensor_cls()): return self + d * weight if weight < 0.5 else end - d * (1 - weight)
  return (weight < 0.5).where(self + d * weight, end - d * (1 - weight))


def maximum(self: Tensor, x: Tensor | Scalar) -> Tensor:
  a, b = broadcasted(self, x, False, "maximum")
  return _alu(Ops.OR if a.dtype is dtypes.bool else Ops.MAX, a, b)


def minimum(self: Tensor, x: Tensor | Scalar) -> Tensor:
  a, b = broadcasted(self, x, False, "minimum")
  if a.dtype is dtypes.bool: return _alu(Ops.AND, a, b)
  # floats: -max(-a, -b) keeps MAX's nan propagation; ints: a select (negating INT_MIN would overflow)
  return -_alu(Ops.MAX, -a, -b) if dtypes.is_float(a.dtype) else (a < b).where(a, b)


def clip(self: Tensor, min_: Tensor | Scalar | None = None, max_: Tensor | Scalar | None = None) -> Tensor:
  """min(max(x, min_), max_) (so max_ wins where min_ > max_), with PyTorch's gradient: x's passes where
  min_ <= x <= max_, bounds included (tinygrad's maximum/minimum would halve it there); nan stays nan."""
  if min_ is None and max_ is None: raise ArgumentError("clip needs at least one of min_ and max_ (both are None)")
  ret = self if min_ is None else (self < min_).where(min_, self)
  return ret if max_ is None else (ret > max_).where(max_, ret)


# ---- selection

def where(self: Tensor, x: Tensor | Scalar, y: Tensor | Scalar) -> Tensor:
  """`x` where self is true, else `y` (self is cast to bool; broadcast across all three)."""
  T = tensor_cls()
  x, y = _pyscalar(x), _pyscalar(y)
  cond = self if self.dtype is dtypes.bool else self.cast(dtypes.bool)
  tensors = [t for t in (x, y) if isinstance(t, T)]
  for t in tensors:
    if t.device != self.device: raise DeviceMismatchError(f"where: tensors on different devices ({self.device} and {t.device})")
  if isinstance(x, T) and isinstance(y, T): dt = least_upper_dtype(x.dtype, y.dtype)
  elif isinstance(x, T): dt = scalar_dtype(x.dtype, y)
  elif isinstance(y, T): dt = scalar_dtype(y.dtype, x)
  else: dt = least_upper_dtype(scalar_dtype(dtypes.bool, x), scalar_dtype(dtypes.bool, y))
  shape = broadcast_shape(cond.shape, *(t.shape for t in tensors), op="where")
  def side(v: Any) -> UOp:
    return v.cast(dt)._broadcast_to(shape).uop if isinstance(v, T) else const_uop(v, dt, self.device, shape)
  return self._wrap(cond._broadcast_to(shape).uop.alu(Ops.WHERE, side(x), side(y)))


def masked_fill(self: Tensor, mask: Tensor, value: Tensor | Scalar) -> Tensor: return mask.where(value, self)


# ---- comparisons and logic

def _cmp(self: Tensor, x: Any, op: Ops, reverse: bool, name: str) -> Tensor:
  a, b = broadcasted(self, x, reverse, name)
  return _alu(op, a, b)


def lt(self: Tensor, x: Tensor | Scalar) -> Tensor: return _cmp(self, x, Ops.CMPLT, False, "<")
def gt(self: Tensor, x: Tensor | Scalar) -> Tensor: return _cmp(self, x, Ops.CMPLT, True, ">")
def _or_equal(self: Tensor, x: Any, reverse: bool, name: str) -> Tensor:
  a, b = broadcasted(self, x, reverse, name)
  # not (b < a) would call nan <= x true: floats need (a < b) or (a == b)
  return (_alu(Ops.CMPLT, a, b) | _alu(Ops.CMPEQ, a, b)) if dtypes.is_float(a.dtype) else _alu(Ops.CMPLT, b, a).logical_not()


def le(self: Tensor, x: Tensor | Scalar) -> Tensor: return _or_equal(self, x, False, "<=")
def ge(self: Tensor, x: Tensor | Scalar) -> Tensor: return _or_equal(self, x, True, ">=")
def eq(self: Tensor, x: Tensor | Scalar) -> Tensor: return _cmp(self, x, Ops.CMPEQ, False, "==")
def ne(self: Tensor, x: Tensor | Scalar) -> Tensor: return _cmp(self, x, Ops.CMPNE, False, "!=")


def logical_not(self: Tensor) -> Tensor:
  b = self.cast(dtypes.bool)
  return _alu(Ops.CMPNE, b, _const_like(b, True))


def _bitwise(self: Tensor, x: Any, reverse: bool, op: Ops, name: str) -> Tensor:
  a, b = broadcasted(self, x, reverse, name)
  _need(a, dtypes.is_int(a.dtype) or a.dtype is dtypes.bool, name, "integer or bool")
  return _alu(op, a, b)


def bitwise_and(self: Tensor, x: Tensor | int | bool, reverse: bool = False) -> Tensor: return _bitwise(self, x, reverse, Ops.AND, "bitwise_and")
def bitwise_or(self: Tensor, x: Tensor | int | bool, reverse: bool = False) -> Tensor: return _bitwise(self, x, reverse, Ops.OR, "bitwise_or")
def bitwise_xor(self: Tensor, x: Tensor | int | bool, reverse: bool = False) -> Tensor: return _bitwise(self, x, reverse, Ops.XOR, "bitwise_xor")


def bitwise_not(self: Tensor) -> Tensor:
  if self.dtype is dtypes.bool: return self.logical_not()
  _need(self, dtypes.is_int(self.dtype), "bitwise_not", "integer or bool")
  return _alu(Ops.XOR, self, _const_like(self, -1))  # -1 wraps to all ones in every integer dtype


def _shift(self: Tensor, x: Any, reverse: bool, op: Ops, name: str) -> Tensor:
  """A count outside [0, bits) shifts every bit out (0, or -1 for a negative value shifted right), as PyTorch: the
  decomposition passes guard SHL/SHR so that no device sees C's undefined shift."""
  if isinstance(x, int) and not isinstance(x, bool) and not reverse and (x < 0 or x >= 8 * self.dtype.itemsize) and dtypes.is_int(self.dtype):
    x = 8 * self.dtype.itemsize  # out of range: any count past the width (the constant must fit the dtype)
  a, b = broadcasted(self, x, reverse, name)
  _need(a, dtypes.is_int(a.dtype), name, "integer")
  return _alu(op, a, b)


def lshift(self: Tensor, x: Tensor | int, reverse: bool = False) -> Tensor: return _shift(self, x, reverse, Ops.SHL, "lshift")
def rshift(self: Tensor, x: Tensor | int, reverse: bool = False) -> Tensor: return _shift(self, x, reverse, Ops.SHR, "rshift")


def isnan(self: Tensor) -> Tensor: return self.ne(self) if dtypes.is_float(self.dtype) else _const_like(self.cast(dtypes.bool), False)


def isinf(self: Tensor, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
  ret = _const_like(self.cast(dtypes.bool), False)
  if not dtypes.is_float(self.dtype): return ret
  if detect_positive: ret = ret | self.eq(math.inf)
  if detect_negative: ret = ret | self.eq(-math.inf)
  return ret


def isfinite(self: Tensor) -> Tensor: return (self.isnan() | self.isinf()).logical_not()


def isclose(self: Tensor, other: Tensor | Scalar, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
  a, b = broadcasted(self, other, False, "isclose")
  a, b = _floats(a), _floats(b)
  # equality first (inf == inf); an infinite b is close to nothing else (|a - inf| <= inf would call every a close)
  close = a.eq(b) | (b.isinf().logical_not() & ((a - b).abs() <= atol + rtol * b.abs()))
  return (close | (a.isnan() & b.isnan())) if equal_nan else close


# ---- exponentials, logarithms, roots

def exp2(self: Tensor) -> Tensor: return _alu(Ops.EXP2, _floats(self))
def exp(self: Tensor) -> Tensor: return (_floats(self) * (1 / math.log(2))).exp2()
def log2(self: Tensor) -> Tensor: return _alu(Ops.LOG2, _floats(self))
def log(self: Tensor) -> Tensor: return self.log2() * math.log(2)
def log10(self: Tensor) -> Tensor: return self.log2() * math.log10(2)
def sqrt(self: Tensor) -> Tensor: return _alu(Ops.SQRT, _floats(self))
def rsqrt(self: Tensor) -> Tensor: return self.sqrt().reciprocal()


def logaddexp(self: Tensor, other: Tensor | Scalar) -> Tensor:
  a, b = broadcasted(self, other, False, "logaddexp")
  a, b = _floats(a), _floats(b)
  # exactly one side +inf: the result is that side (gradient 1 to it, 0 to the other, as PyTorch), and the formula sees
  # zeros there, whose gradient is not 0·inf; both +inf keep the formula (inf, and PyTorch's nan gradient)
  one_inf = a.isinf(detect_negative=False).ne(b.isinf(detect_negative=False))
  a_s, b_s = one_inf.where(0.0, a), one_inf.where(0.0, b)
  m = a_s.maximum(b_s).detach()
  m = m.isinf().where(0.0, m)  # both -inf (or both +inf): shift by 0 so the result is -inf/+inf, not nan
  return one_inf.where(a.maximum(b), ((a_s - m).exp() + (b_s - m).exp()).log() + m)


# ---- trigonometric and hyperbolic

def sin(self: Tensor) -> Tensor:
  """sin(θ + k·π/2) from the reduced θ (`_reduced`): ±sin(θ) or ±sin(π/2 - θ), as cos does, so the device's SIN only
  ever sees |θ| <= 3π/4 (where its polynomial, if it has one, is exact); past the exact range the device's own sin."""
  x = _floats(self)
  k, theta, big, wide = _reduced(x)
  v = _is(k, 1, 3).where(math.pi / 2 - theta, theta).cast(wide)._sin_device()
  ret = _is(k, 2, 3).where(-v, v)
  if big is not None: ret = big.where(big.where(x, 0.0).cast(wide)._sin_device(), ret)
  return ret.cast(x.dtype)


def _sin_device(self: Tensor) -> Tensor: return _alu(Ops.SIN, _floats(self))


def _binary_digits(k: int, denominator: int) -> int:
  """floor(2^k · c / denominator) for c = 4/π (denominator 2: 2/π) or π (denominator 0), from Machin's formula in integers."""
  guard = 64
  prec = k + guard
  def atan_inv(m: int) -> int:  # atan(1/m) · 2^prec
    total = power = (1 << prec) // m
    j = 1
    while power:
      power //= m * m
      total += (-1) ** j * (power // (2 * j + 1))
      j += 1
    return total
  pi = 16 * atan_inv(5) - 4 * atan_inv(239)  # π · 2^prec
  return (pi >> guard) if denominator == 0 else ((4 << (2 * prec)) // pi // denominator) >> guard


def _chunks(k: int, bits: int, denominator: int) -> tuple[float, ...]:
  """The constant (2/π, or π/2 for denominator -1) as k floats of `bits` significant bits each, in decreasing order:
  n · chunk is exact for |n| < 2^(53 - bits) in float64 (or 2^(24 - bits) in float32)."""
  # the first k·bits bits: π/2 = 1.57... from 2^0 on (π·2^(kb-2)), 2/π = 0.63... from 2^-1 on
  top = 1 if denominator == -1 else 0
  whole = _binary_digits(k * bits - 2, 0) if top else _binary_digits(k * bits, denominator)
  mask = (1 << bits) - 1
  return tuple(math.ldexp((whole >> (bits * (k - 1 - i))) & mask, top - bits * (i + 1)) for i in range(k))


# 2/π in 8 pieces of 28 bits (224 bits): a float32 times one piece is exact in float64, and 224 bits reach 2^-90 past the
# last bit of the largest float32's product with 2/π; π/2 in 4 pieces of 33 bits for float64's reduction (n < 2^20)
_TWO_OVER_PI_28 = _chunks(8, 28, 2)
_PIO2_33 = _chunks(4, 33, -1)
_F64_REDUCED = 2.0 ** 20  # |x| (float64) that _PIO2_33 reduces exactly


def _round_nearest(x: Tensor) -> Tensor: return (x + 0.5).floor()
def _mod4(n: Tensor) -> Tensor: return n - (n * 0.25).floor() * 4


def _reduce_payne_hanek(x: Tensor) -> tuple[Tensor, Tensor]:
  """x (float32 or narrower, as float64) as k·π/2 + θ: (k mod 4, θ in [-π/4, π/4]) in float64, exactly for every finite x.
  Each piece of 2/π times x is exact; only its part below 4 matters (k mod 4), and the sum keeps its fraction in
  [-1/2, 1/2] with the whole quarters apart, so no bit of the reduced argument is lost to rounding."""
  frac, quarters = x * 0.0, x * 0.0
  for c in _TWO_OVER_PI_28:
    frac = frac + _mod4(x * c)
    whole = _round_nearest(frac)
    frac, quarters = frac - whole, quarters + whole
  return _mod4(quarters), frac * (math.pi / 2)


def _reduce_cody_waite(x: Tensor, parts: tuple[float, ...], split: int) -> tuple[Tensor, Tensor]:
  """x as k·π/2 + θ: (k mod 4, θ) with π/2 in `parts` of few bits, so that each n·part is exact; n is split in two
  halves of `split` bits when `split` (float32: n < 2^22 with 11-bit halves)."""
  n = _round_nearest(x * (2 / math.pi))
  hi = _round_nearest(n * 2.0 ** -split) * 2.0 ** split if split else n * 0.0
  r = x
  for c in parts: r = (r - hi * c) - (n - hi) * c
  return _mod4(n), r


_PASS_BOUND = GroupOp.Movement | {Ops.CONTIGUOUS, Ops.DETACH, Ops.CAST}
_MAGNITUDE_NODES = 512  # a bound is looked for this far into the graph, no further


def magnitude_bound(root: UOp) -> float:
  """An upper bound on |value| of every element of tensor-graph `root`, inf where it cannot tell: interval arithmetic
  through constants, iotas, bound Variables, movement ops, casts and + - * max where, from the integers up (a random
  draw's words, `arange`). A realized buffer is unbounded. Float rounding is covered by a margin, so the bound is for
  choosing an algorithm (sin's argument reduction), never for folding a comparison."""
  memo: dict[UOp, float] = {}
  stack = [root]
  while stack:
    u = stack[-1]
    if u in memo: stack.pop(); continue
    inner = u.op in _PASS_BOUND or u.op in GroupOp.ALU or u.op is Ops.BIND  # bounded by its sources'
    if inner and (todo := [x for x in u.src if x not in memo]):
      if len(memo) + len(stack) > _MAGNITUDE_NODES: return math.inf
      stack.extend(todo)
      continue
    stack.pop()
    memo[u] = _node_magnitude(u, [memo[x] for x in u.src] if inner else [])
  return memo[root] * (1 + 2.0 ** -10)


def _node_magnitude(u: UOp, src: list[float]) -> float:
  dt = u.dtype.scalar()
  if dt is dtypes.bool: return 1.0
  # an integer is bounded by its dtype, also where a wrap-around makes the interval below meaningless
  limit = math.inf if dtypes.is_float(dt) or dt is dtypes.index else float(max(-dtypes.min(dt), dtypes.max(dt)))
  op = u.op
  if op is Ops.CONST: b = math.fabs(u.arg) if not (isinstance(u.arg, float) and math.isnan(u.arg)) else math.inf
  elif op is Ops.IOTA: b = float(max(u.arg - 1, 0))
  elif op is Ops.DEFINE_VAR: b = float(max(-u.arg[1], u.arg[2], 0))
  elif not src: b = math.inf
  elif op in _PASS_BOUND or op is Ops.BIND: b = src[0]
  elif op in (Ops.ADD, Ops.SUB): b = src[0] + src[1]
  elif op is Ops.MUL: b = src[0] * src[1] if src[0] and src[1] else 0.0
  elif op in (Ops.NEG, Ops.TRUNC): b = src[0]
  elif op is Ops.MAX: b = max(src)
  elif op is Ops.WHERE: b = max(src[1], src[2])
  elif op is Ops.SHR and dtypes.is_unsigned(dt): b = math.ldexp(src[0], -u.src[1].arg) if u.src[1].op is Ops.CONST else src[0]
  elif op is Ops.AND and dtypes.is_unsigned(dt): b = min(src)
  else: b = math.inf
  return min(b, limit)


def _has_float64(device: Any) -> bool:
  from plugrad.tensor.creation import dtype_problem
  return all(dtype_problem(d, dtypes.float64) is None for d in ((device,) if isinstance(device, str) else device))


def _reduced(x: Tensor) -> tuple[Tensor, Tensor, Tensor | None, DType]:
  """x = k·π/2 + θ: (k mod 4, θ in [-π/4, π/4], where |x| is past the exact range (None: nowhere), the dtype to take
  sin in). The reduction is exact: for float32 (and narrower) by Payne-Hanek in float64 where the device has it, else
  Cody-Waite in float32 to |x| < 2^22; float64 by Cody-Waite to |x| < 2^20."""
  from plugrad.codegen.decompose import PIO2_PARTS, SIN_RANGE
  wide = dtypes.float32 if x.dtype.itemsize < 4 else x.dtype  # 16-bit floats: sin in float32, one rounding at the end
  limit, parts, split = (_F64_REDUCED, _PIO2_33, 0) if x.dtype is dtypes.float64 else (SIN_RANGE, PIO2_PARTS, 11)
  if magnitude_bound(x.uop) < limit: return *_reduce_cody_waite(x.cast(wide), parts, split), None, wide  # e.g. randn's 2πu, RoPE's angles
  if x.dtype is not dtypes.float64 and _has_float64(x.device): return *_reduce_payne_hanek(x.cast(dtypes.float64)), None, wide
  big = x.abs() >= limit
  return *_reduce_cody_waite(big.where(0.0, x).cast(wide), parts, split), big, wide


def _with_derivative(value: Tensor, x: Tensor, derivative: Tensor) -> Tensor:
  """`value` whose gradient with respect to x is `derivative` (x - x is 0 wherever x is finite, and value is nan where not)."""
  return value.detach() + (x - x.detach()) * derivative.detach()


def _cos_big(x: Tensor, big: Tensor, wide: DType) -> Tensor:
  """cos past the exact reduction: 1 - 2·sin²(x/2), within an ulp of 1 (the device's sin reduces x/2); its derivative
  -sin(x) given directly (sin's own derivative rounds π/2 - x there)."""
  xb = big.where(x, 0.0).cast(wide)
  return _with_derivative(1 - 2 * (xb * 0.5)._sin_device().square(), xb, -xb._sin_device())


def _is(k: Tensor, *values: int) -> Tensor:
  """k (a float 0, 1, 2 or 3) is one of `values`."""
  ret = (k - values[0]).abs() < 0.5
  for v in values[1:]: ret = ret | ((k - v).abs() < 0.5)
  return ret


def cos(self: Tensor) -> Tensor:
  """cos(θ + k·π/2) from the reduced θ (`_reduced`): ±sin(θ) or ±sin(π/2 - θ), the latter in [π/4, 3π/4] where rounding
  π/2 - θ costs an ulp of cos; past the exact range 1 - 2·sin²(x/2)."""
  x = _floats(self)
  k, theta, big, wide = _reduced(x)
  v = _is(k, 0, 2).where(math.pi / 2 - theta, theta).cast(wide)._sin_device()
  ret = _is(k, 1, 2).where(-v, v)
  if big is not None: ret = big.where(_cos_big(x, big, wide), ret)
  return ret.cast(x.dtype)


def tan(self: Tensor) -> Tensor:
  """tan(θ + k·π/2) = sin(θ)/cos(θ), or -cos(θ)/sin(θ) for odd k, from the reduced θ (the gradient too: sin's own
  derivative at a large x would round π/2 - x)."""
  x = _floats(self)
  k, theta, big, wide = _reduced(x)
  s, c = theta.cast(wide)._sin_device(), (math.pi / 2 - theta).cast(wide)._sin_device()
  odd = _is(k, 1, 3)
  ret = odd.where(-c, s) / odd.where(s, c)  # one quotient: the other one's pole would make the gradient nan
  if big is not None:
    xb = big.where(x, 0.0).cast(wide)
    t = xb._sin_device().detach() / _cos_big(x, big, wide).detach()
    ret = big.where(_with_derivative(t, xb, 1 + t * t), ret)
  return ret.cast(x.dtype)


def _odd(x: Tensor, f: Any) -> Tensor:
  """f on |x| with x's sign restored, for odd functions; d|x|/dx is taken as 1 at 0, so f'(0) survives."""
  s = (x < 0).where(_const_like(x, -1.0), _const_like(x, 1.0))
  return f(x * s) * s


def _atan_pos(x: Tensor) -> Tensor:
  # reduce x >= 0 to |t| <= tan(pi/8): atan(x) = pi/2 + atan(-1/x) above tan(3pi/8), pi/4 + atan((x-1)/(x+1)) above tan(pi/8)
  big, mid = x > 2.414213562373095, x > 0.41421356237309503
  xm = big.where(1.0, x)
  t = big.where(-1 / big.where(x, 1.0), mid.where((xm - 1) / (xm + 1), x))  # each branch sees finite inputs (no nan gradients at inf)
  z = t * t
  p = _const_like(z, _ATAN_COEFFS[-1])
  for c in reversed(_ATAN_COEFFS[:-1]): p = p * z + c
  return big.where(_const_like(x, math.pi / 2), mid.where(_const_like(x, math.pi / 4), _const_like(x, 0.0))) + t * p


def atan(self: Tensor) -> Tensor: return _odd(_floats(self), _atan_pos)


def _asin_near0(z: Tensor) -> Tensor: return (z / ((1 - z) * (1 + z)).sqrt()).atan()  # for |z| <= 1/2


def _asin_parts(self: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
  """(x, |x| <= 1/2, asin of x there, asin(sqrt((1 - |x|)/2)) elsewhere): past 1/2, asin(|x|) = π/2 - 2·asin(that) and
  acos(|x|) = 2·asin(that), whose derivative through the sqrt is the ±inf of PyTorch at ±1 (x/sqrt(1 - x²) gave
  atan'(inf)·inf = nan) and whose 1 - |x| is exact. Each branch sees only its own inputs: no 0·inf in the other."""
  x = _floats(self)
  near = x.abs() <= 0.5
  return x, near, _asin_near0(near.where(x, 0.0)), _asin_near0(((1 - near.where(0.75, x.abs())) * 0.5).sqrt())


def asin(self: Tensor) -> Tensor:
  x, near, small, half = _asin_parts(self)
  return near.where(small, (x < 0).where(2 * half - math.pi / 2, math.pi / 2 - 2 * half))


def acos(self: Tensor) -> Tensor:
  x, near, small, half = _asin_parts(self)
  return near.where(math.pi / 2 - small, (x < 0).where(math.pi - 2 * half, 2 * half))


def _half_exps(self: Tensor) -> tuple[Tensor, Tensor]:
  """exp(x)/2 and exp(-x)/2 as exp2(±x·log2(e) - 1) (the - 1 is exact from |x·log2(e)| >= 1 on): finite, and so is
  the gradient, wherever the result is, where exp(x) overflows first (float32 sinh(89) = 2.2e38)."""
  t = _floats(self) * (1 / math.log(2))
  return (t - 1).exp2(), (-t - 1).exp2()


@in_float32
def sinh(self: Tensor) -> Tensor:
  a, b = _half_exps(self)
  return a - b


@in_float32
def cosh(self: Tensor) -> Tensor:
  a, b = _half_exps(self)
  return a + b


def tanh(self: Tensor) -> Tensor:
  """(1 - e) / (1 + e) with e = exp(-2|x|) in (0, 1], the sign restored: no overflow, so no inf * 0 in the gradient."""
  def pos(y: Tensor) -> Tensor:
    e = (y * -2).exp()
    return (1 - e) / (1 + e)
  return _odd(_floats(self), pos)


def _big(x: Tensor) -> float:
  """Above this, x*x + 1 rounds to x*x in x's dtype (and x*x still fits it): log(x + sqrt(x*x ± 1)) is log(2x)."""
  return float(2 ** ((dtypes.finfo(x.dtype)[1] + 2) // 2 + 1))


def _log_hypot_sum(x: Tensor, sign: int, safe: float) -> Tensor:
  """log(x + sqrt(x*x + sign)) for x >= 1 (or >= 0 with sign=1), as log(x) + ln 2 for large x: x*x would overflow."""
  big = x > _big(x)
  xs, xb = big.where(safe, x), big.where(x, safe)  # each branch sees finite inputs: no inf * 0 in the gradient
  return big.where(xb.log() + math.log(2), (xs + (xs * xs + sign).sqrt()).log())


def asinh(self: Tensor) -> Tensor: return _odd(_floats(self), lambda x: _log_hypot_sum(x, 1, 1.0))
def acosh(self: Tensor) -> Tensor:
  x = _floats(self)
  return (x < 1).where(math.nan, _log_hypot_sum(x, -1, 2.0))  # below 1 the formula cancels to a number, not nan
# ½·(log(1 + x) - log(1 - x)): at ±1 the derivative of the log of 0 is PyTorch's inf (log of the quotient gave 0·inf)
def atanh(self: Tensor) -> Tensor: return (lambda x: ((1 + x).log() - (1 - x).log()) / 2)(_floats(self))


@in_float32  # half: 1 - P(t)·exp(-x²) cancels near 0 when rounded in half (float16 erf(0.01) = 0.00879)
def erf(self: Tensor) -> Tensor:
  def pos(x: Tensor) -> Tensor:
    t = 1 / (1 + _ERF_P * x)
    poly = _const_like(t, _ERF_A[-1])
    for a in reversed(_ERF_A[:-1]): poly = poly * t + a
    return 1 - poly * t * (-(x * x)).exp()
  # erf is 1 to every float's precision from 6 on: clamping there keeps x*x finite (and its gradient 0, not inf * 0)
  return _odd(_floats(self), lambda x: pos((x > 6).where(6.0, x)))


# ---- rounding (integer tensors are returned as they are)

def trunc(self: Tensor) -> Tensor: return _alu(Ops.TRUNC, self) if dtypes.is_float(self.dtype) else self


def floor(self: Tensor) -> Tensor:
  if not dtypes.is_float(self.dtype): return self
  t = self.trunc()
  return (self < t).where(t - 1, t)


def ceil(self: Tensor) -> Tensor:
  if not dtypes.is_float(self.dtype): return self
  t = self.trunc()
  return (self > t).where(t + 1, t)


def round(self: Tensor) -> Tensor:
  """Round half to even, like numpy. Exact: x - trunc(x) is exact in floating point, so no x + 0.5 rounding error."""
  if not dtypes.is_float(self.dtype): return self
  t = self.trunc()
  frac = (self - t).abs()
  odd = (t - (t / 2).trunc() * 2).ne(0)
  away = (frac > 0.5) | (frac.eq(0.5) & odd)
  return away.where(t + self.sign(), t)


class ElementwiseMixin:
  """Mixed into `Tensor`: the elementwise methods and the comparison operators."""

  add = add; sub = sub; mul = mul; div = div; mod = mod; fmod = fmod; pow = pow
  neg = neg; abs = abs; sign = sign; copysign = copysign; reciprocal = reciprocal; square = square
  exp = exp; exp2 = exp2; log = log; log2 = log2; log10 = log10; sqrt = sqrt; rsqrt = rsqrt
  sin = sin; cos = cos; tan = tan; asin = asin; acos = acos; atan = atan; _sin_device = _sin_device
  sinh = sinh; cosh = cosh; tanh = tanh; asinh = asinh; acosh = acosh; atanh = atanh; erf = erf
  floor = floor; ceil = ceil; round = round; trunc = trunc; lerp = lerp
  maximum = maximum; minimum = minimum; clip = clip; clamp = clip; where = where; masked_fill = masked_fill
  isnan = isnan; isinf = isinf; isfinite = isfinite; isclose = isclose; logical_not = logical_not
  bitwise_not = bitwise_not; bitwise_and = bitwise_and; bitwise_or = bitwise_or; bitwise_xor = bitwise_xor
  lshift = lshift; rshift = rshift; logaddexp = logaddexp; eq = eq; ne = ne
  __lt__ = lt; __gt__ = gt; __le__ = le; __ge__ = ge
