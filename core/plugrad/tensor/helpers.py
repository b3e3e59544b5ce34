"""Small pieces the Tensor modules share: argument normalization, dimension checks, broadcasting, and the UOps that
build constants and index ramps directly in the tensor graph (no host data)."""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from plugrad.dtype import DType, dtypes
from plugrad.uop.ops import Ops, UOp, sint
from plugrad.uop.shape import ShapeError, fmt

if TYPE_CHECKING:
  from plugrad.tensor.tensor import Tensor

Shape = tuple[sint, ...]
Devices = str | tuple[str, ...]  # one device, or the devices of a multi-device tensor (docs/sharding.md)


class ArgumentError(ValueError, RuntimeError):
  """An argument the operation does not take: an unknown mode (`div(rounding_mode=)`, `scatter(reduce=)`, `meshgrid
  (indexing=)`), options that exclude each other, an integer tensor to a negative integer power. The message names the
  op and the value. A ValueError, and a RuntimeError as PyTorch raises in these cases, so code written for either catches it."""


class UnsupportedModeError(ArgumentError, NotImplementedError):
  """A mode name the operation does not know (`pad(mode=)`): also a NotImplementedError, which PyTorch raises."""


class DTypeError(TypeError, RuntimeError):
  """Operands whose dtypes the operation will not combine (`scatter`'s src and self differ). A TypeError, and a
  RuntimeError as PyTorch raises."""


class IndexDTypeError(IndexError, TypeError):
  """An index tensor that is not of an integer dtype: an IndexError as PyTorch raises, and a TypeError."""


class DTypeNotImplementedError(DTypeError, NotImplementedError):
  """An operation that is not defined for a dtype (shifts and bitwise ops of floats, a bool `linspace`): also a
  NotImplementedError, as PyTorch's "not implemented for 'Float'"."""


@functools.cache
def tensor_cls() -> type[Tensor]:
  """The Tensor class (imported on first use: the op modules are imported by tensor.py itself)."""
  from plugrad.tensor.tensor import Tensor
  return Tensor


def argfix(*x: Any) -> tuple[Any, ...]:
  """`f(2, 3)`, `f((2, 3))` and `f([2, 3])` all give (2, 3)."""
  if x and isinstance(x[0], (tuple, list)):
    if len(x) != 1: raise ValueError(f"pass either one sequence or separate values, not both: got {x!r}")
    return tuple(x[0])
  return x


def resolve_dim(shape: Shape, dim: int, extra: bool = False) -> int:
  """`dim` as an index in 0..ndim-1 (0..ndim with `extra`, for inserting an axis). A 0-d tensor accepts 0 and -1."""
  if not isinstance(dim, int) or isinstance(dim, bool): raise TypeError(f"a dimension must be an int, got {type(dim).__name__} {dim!r}")
  n = len(shape) + 1 if extra else max(len(shape), 1)
  if not -n <= dim < n: raise IndexError(f"dimension {dim} is out of range for a tensor of shape {fmt(shape)} (expected {-n}..{n - 1})")
  return dim + n if dim < 0 else dim


def resolve_dims(shape: Shape, dims: Sequence[int], what: str) -> tuple[int, ...]:
  out = tuple(resolve_dim(shape, d) for d in dims)
  if len(set(out)) != len(out): raise ShapeError(f"{what}: dimension {list(dims)} repeats an axis of shape {fmt(shape)}")
  return out


def broadcast_shape(*shapes: Shape, op: str = "broadcast") -> Shape:
  """numpy broadcasting: shapes aligned on the right, each axis equal or 1."""
  nd = max(len(s) for s in shapes)
  padded = [(1,) * (nd - len(s)) + tuple(s) for s in shapes]
  out: list[sint] = []
  for axis in zip(*padded):
    sizes = {d for d in axis if not (isinstance(d, int) and d == 1)}
    if len(sizes) > 1: raise ShapeError(f"{op}: shapes {' and '.join(fmt(s) for s in shapes)} do not broadcast")
    out.append(sizes.pop() if sizes else 1)
  return tuple(out)


def device_uop(device: Devices) -> UOp: return UOp(Ops.DEVICE, dtypes.void, (), device)


def const_uop(value: Any, dtype: DType, device: Devices | None, shape: Shape) -> UOp:
  """`value` of `dtype` broadcast to `shape` on `device`: a CONST reshaped and expanded (nothing is stored)."""
  if isinstance(value, UOp):  # a symbolic int (Variable / BIND)
    c = value if value.dtype is dtype else value.cast(dtype)
  else:
    v = dtypes.as_const(value, dtype)
    if isinstance(v, float) and math.isnan(v): v = math.nan
    c = UOp(Ops.CONST, dtype, (device_uop(device),) if device is not None else (), v)
  return c.reshape((1,) * len(shape)).expand(shape) if shape else c


def iota(n: int, device: Devices, dtype: DType = dtypes.int32) -> UOp:
  """[0, 1, ..., n-1] as an IOTA leaf: in a kernel it is the index itself, so it costs nothing and no host data."""
  return UOp(Ops.IOTA, dtype, (UOp(Ops.DEVICE, dtypes.void, (), device),), n)


def is_buffer_form(u: UOp) -> bool:
  """The value sits contiguously in one buffer (a BUFFER, or a BUFFER reshaped), or on several devices in one per device."""
  if u.op is Ops.MULTI: return all(is_buffer_form(p) for p in u.src)
  return u.op is Ops.BUFFER or (u.op is Ops.RESHAPE and u.src[0].op is Ops.BUFFER)


def ints(shape: Sequence[sint], what: str) -> tuple[int, ...]:
  """The sizes as ints; a symbolic size raises (for the operations that need concrete sizes)."""
  if not all(isinstance(s, int) for s in shape): raise TypeError(f"{what} needs concrete sizes, got the symbolic shape {fmt(tuple(shape))}")
  return tuple(int(s) for s in shape)  # type: ignore[arg-type]


def check_shape(shape: Sequence[Any], what: str) -> tuple[int, ...]:
  """A concrete shape of ints >= 0 (ValueError otherwise)."""
  if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
    raise ValueError(f"{what}: a shape must be ints >= 0, got {shape!r}")
  return tuple(shape)


def compute_dtype(dt: DType) -> DType:
  """The dtype an op's intermediates are formed in for `dt`: float32 for float16/bfloat16, as PyTorch's kernels compute
  them (its "opmath" type: a product of two half factors, x·x or x·6 overflow half at 256 or 10923, and small results
  lose their digits), every other dtype itself (so float32/float64 graphs, and their kernels, are unchanged)."""
  return dtypes.float32 if dt in (dtypes.float16, dtypes.bfloat16) else dt


def in_float32(fn: Any) -> Any:
  """`fn` (a Tensor method) computed in `compute_dtype`: half-precision Tensor arguments are cast to float32, the result
  is rounded once back to self's dtype. The backward runs in float32 too (a cast's gradient is cast back)."""
  @functools.wraps(fn)
  def wrapper(self: Tensor, *args: Any, **kw: Any) -> Any:
    dt = self.dtype
    if compute_dtype(dt) is dt: return fn(self, *args, **kw)
    T = tensor_cls()
    def up(a: Any) -> Any: return a.cast(compute_dtype(a.dtype)) if isinstance(a, T) else a
    ret = fn(up(self), *map(up, args), **{k: up(v) for k, v in kw.items()})
    return ret.cast(dt)
  return wrapper


_EXPONENT_BITS = {4: (dtypes.uint32, 0x7F800000), 8: (dtypes.uint64, 0x7FF0000000000000)}


def pow2_scale(m: Tensor) -> Tensor:
  """For magnitudes m >= 0 (float32 or float64): the power of two 2^floor(log2 m), or 1 where m is 0, subnormal, inf or
  nan. Dividing by it is exact, so x/s computes as x does, without the overflow of x·x or of a sum for huge x."""
  u, mask = _EXPONENT_BITS[m.dtype.itemsize]
  p = (m.bitcast(u) & mask).bitcast(m.dtype)  # the mantissa cleared: 0 for a subnormal, inf for inf and nan
  return ((p > 0) & (p < math.inf)).where(p, 1.0)


_MOVEMENT = (Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP)
# the views a kernel can store through: each names every element of the buffer at most once (no EXPAND; no PAD, whose
# padding is no memory)
WRITABLE_VIEW = frozenset({Ops.RESHAPE, Ops.SHRINK, Ops.PERMUTE, Ops.FLIP})


def view_chain(u: UOp) -> list[UOp]:
  """The movement ops between a view and its base, outermost first."""
  out: list[UOp] = []
  while u.op in _MOVEMENT: out, u = [*out, u], u.src[0]
  return out


def view_base(u: UOp) -> UOp:
  """The node under a view's movement ops."""
  while u.op in _MOVEMENT: u = u.src[0]
  return u


def is_view_of_buffer(u: UOp) -> bool:
  base = view_base(u)
  return base.op is Ops.BUFFER or (base.op is Ops.MULTI and is_buffer_form(base))


def is_writable_view(u: UOp) -> bool:
  """A realized buffer, or a view of one that a kernel can store through (see Tensor.assign)."""
  return is_view_of_buffer(u) and all(m.op in WRITABLE_VIEW for m in view_chain(u))
