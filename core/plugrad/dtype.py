"""Scalar, vector and pointer dtypes, the promotion lattice and numpy conversion.

DTypes are interned: building the same dtype twice returns the same object, so comparing and hashing
them (which UOp hash-consing does constantly) costs an identity check.
"""
from __future__ import annotations

import builtins
import enum
import math
from typing import Any, Final

import numpy as np


class AddrSpace(enum.Enum):
  __hash__ = object.__hash__  # members are singletons compared by identity (Enum's __hash__ hashes the name in Python)
  GLOBAL = "global"  # device memory, visible to every thread
  LOCAL = "local"    # workgroup / shared memory
  REG = "reg"        # per-thread registers (accumulators)

  def __repr__(self) -> str: return f"AddrSpace.{self.name}"


class DType:
  """A scalar dtype (count == 1) or a vector of `count` scalars. Build vectors with `.vec(n)`, pointers with `.ptr()`."""
  __slots__ = ("priority", "itemsize", "name", "fmt", "count", "_scalar", "__weakref__")
  _interned: dict[tuple, DType] = {}
  priority: int
  itemsize: int
  name: str
  fmt: str | None
  count: int
  _scalar: DType | None

  @classmethod
  def new(cls, priority: int, itemsize: int, name: str, fmt: str | None, count: int = 1, scalar: DType | None = None) -> DType:
    key = (cls, priority, itemsize, name, fmt, count, scalar)
    if (ret := DType._interned.get(key)) is None:
      ret = object.__new__(cls)
      for k, v in zip(("priority", "itemsize", "name", "fmt", "count", "_scalar"), key[1:]): object.__setattr__(ret, k, v)
      DType._interned[key] = ret
    return ret

  def __setattr__(self, *_: Any) -> None: raise AttributeError("DType is immutable")
  def __reduce__(self) -> Any: return (DType.new, (self.priority, self.itemsize, self.name, self.fmt, self.count, self._scalar))
  def __repr__(self) -> str:
    return f"dtypes.{INVERSE_NAMES.get(self.scalar(), self.scalar().name)}" + (f".vec({self.count})" if self.count > 1 else "")
  def __lt__(self, other: DType) -> bool:
    return (self.priority, self.itemsize, self.name, self.count) < (other.priority, other.itemsize, other.name, other.count)

  @property
  def base(self) -> DType: return self
  @property
  def vcount(self) -> int: return self.count

  def scalar(self) -> DType: return self._scalar if self._scalar is not None else self

  def vec(self, n: int) -> DType:
    # memoized: the codegen and the renderers ask for a node's vector dtype over and over (the lookup with its name
    # string built each time was a tenth of a big kernel's rendering)
    if n.__class__ is int and (ret := _VECS.get((self, n))) is not None: return ret
    if not isinstance(n, int) or n < 1: raise ValueError(f"vector width must be a positive int, got {n!r}")
    if self.count != 1: raise TypeError(f"cannot vectorize {self}: it is already a vector")
    ret = self if n == 1 or self == dtypes.void else DType.new(self.priority, self.itemsize * n, f"{INVERSE_NAMES[self]}{n}", None, n, self)
    if n.__class__ is int: _VECS[(self, n)] = ret
    return ret

  def ptr(self, size: int = -1, addrspace: AddrSpace = AddrSpace.GLOBAL) -> PtrDType:
    return PtrDType.new_ptr(self, addrspace, size)

  @property
  def min(self) -> Any:
    """The lowest value of this dtype: PyTorch's `iinfo(dt).min` for ints, `finfo(dt).min` (the lowest finite value)
    for floats, False for bool. `dtypes.min(dt)` is the identity of a max instead (-inf for floats, as tinygrad's
    `dt.min`)."""
    return _limits(self)[0]

  @property
  def max(self) -> Any:
    """The largest value of this dtype: `iinfo(dt).max` for ints, the largest finite value (`finfo(dt).max`) for
    floats, True for bool. `dtypes.max(dt)` is inf for floats."""
    return _limits(self)[1]


class PtrDType(DType):
  """A pointer to `base` elements in `addrspace`; `size` is the element count when known (-1 otherwise)."""
  __slots__ = ("_base", "addrspace", "size", "v")
  _base: DType
  addrspace: AddrSpace
  size: int
  v: int

  @classmethod
  def new_ptr(cls, base: DType, addrspace: AddrSpace = AddrSpace.GLOBAL, size: int = -1, v: int = 1) -> PtrDType:
    if isinstance(base, PtrDType): raise TypeError(f"pointer to pointer is not supported ({base})")
    key = (cls, base, addrspace, size, v)
    if (ret := DType._interned.get(key)) is None:
      ret = object.__new__(cls)
      for k, val in (("priority", base.priority), ("itemsize", 8), ("name", base.name), ("fmt", None), ("count", 1), ("_scalar", None),
                     ("_base", base), ("addrspace", addrspace), ("size", size), ("v", v)): object.__setattr__(ret, k, val)
      DType._interned[key] = ret
    return ret  # type: ignore[return-value]

  def __reduce__(self) -> Any: return (PtrDType.new_ptr, (self._base, self.addrspace, self.size, self.v))
  def __repr__(self) -> str:
    return f"{self._base!r}.ptr({self.size}{'' if self.addrspace is AddrSpace.GLOBAL else f', {self.addrspace!r}'})" + \
      (f".vec({self.v})" if self.v != 1 else "")

  @property
  def base(self) -> DType: return self._base
  @property
  def vcount(self) -> int: return self.v
  def scalar(self) -> PtrDType: return PtrDType.new_ptr(self._base, self.addrspace, self.size) if self.v != 1 else self
  def vec(self, n: int) -> PtrDType:
    if self.v != 1: raise TypeError(f"cannot vectorize {self}: it is already a vector")
    return self if n == 1 else PtrDType.new_ptr(self._base, self.addrspace, self.size, n)
  def ptr(self, size: int = -1, addrspace: AddrSpace = AddrSpace.GLOBAL) -> PtrDType:
    raise TypeError(f"pointer to pointer is not supported ({self})")
  @property
  def min(self) -> Any: raise TypeError(f"a pointer dtype ({self}) has no value range")
  @property
  def max(self) -> Any: raise TypeError(f"a pointer dtype ({self}) has no value range")


_S = DType.new
INVERSE_NAMES: dict[DType, str] = {}
_VECS: dict[tuple[DType, int], DType] = {}  # (scalar dtype, n) -> its vector (dtypes are interned: this never goes stale)


class dtypes:
  """The dtype namespace: `dtypes.float32`, `dtypes.is_float(dt)`, `dtypes.least_upper(a, b)`, ..."""
  void: Final = _S(-1, 0, "void", None)
  index: Final = _S(-1, 8, "index", None)  # symbolic index arithmetic: lowered to int32/int64 by codegen
  bool: Final = _S(0, 1, "bool", "?")
  int8: Final = _S(1, 1, "signed char", "b")
  uint8: Final = _S(2, 1, "unsigned char", "B")
  int16: Final = _S(3, 2, "short", "h")
  uint16: Final = _S(4, 2, "unsigned short", "H")
  int32: Final = _S(5, 4, "int", "i")
  uint32: Final = _S(6, 4, "unsigned int", "I")
  int64: Final = _S(7, 8, "long", "q")
  uint64: Final = _S(8, 8, "unsigned long", "Q")
  float16: Final = _S(9, 2, "half", "e")
  bfloat16: Final = _S(10, 2, "__bf16", None)
  float32: Final = _S(11, 4, "float", "f")
  float64: Final = _S(12, 8, "double", "d")

  # aliases users know from numpy/PyTorch/C
  half = float16; float = float32; double = float64
  uchar = uint8; char = int8; short = int16; ushort = uint16; int = int32; uint = uint32; long = int64; ulong = uint64
  default_float: DType = float32
  default_int: DType = int32

  floats: tuple[DType, ...] = (float16, bfloat16, float32, float64)
  uints: tuple[DType, ...] = (uint8, uint16, uint32, uint64)
  sints: tuple[DType, ...] = (int8, int16, int32, int64)
  ints: tuple[DType, ...] = uints + sints
  all: tuple[DType, ...] = (bool,) + ints + floats

  @staticmethod
  def is_float(x: DType) -> builtins.bool: return (x._scalar or x) in _FLOATS or isinstance(x, PtrDType) and x.base in _FLOATS
  # (x._scalar or x) is x.scalar() but for a pointer (itself, not its scalar pointer: neither is in these sets), without
  # the call: the codegen and the renderers ask these for nearly every node
  @staticmethod
  def is_int(x: DType) -> builtins.bool: return (x._scalar or x) in _INTS
  @staticmethod
  def is_unsigned(x: DType) -> builtins.bool: return (x._scalar or x) in _UINTS
  @staticmethod
  def is_bool(x: DType) -> builtins.bool: return x.scalar() is dtypes.bool

  @staticmethod
  def from_py(x: Any) -> DType:
    """The dtype a Python value gets: float → default_float, int → default_int, bool → bool; lists by their widest element."""
    if isinstance(x, float): return dtypes.default_float
    if isinstance(x, bool): return dtypes.bool
    if isinstance(x, int): return dtypes.default_int
    if isinstance(x, (list, tuple)):
      if not x: return dtypes.default_float
      return max((dtypes.from_py(e) for e in x), key=lambda d: d.priority)
    raise TypeError(f"cannot infer a dtype from a Python {type(x).__name__} ({x!r})")

  @staticmethod
  def as_const(x: Any, dt: DType) -> Any:
    """`x` converted to the Python type that holds a value of `dt` (C semantics: ints wrap, floats round)."""
    if isinstance(x, tuple): return tuple(dtypes.as_const(e, dt) for e in x)
    s = dt.scalar()
    if isinstance(s, PtrDType): raise TypeError(f"no constant of pointer dtype {dt}")
    if s is dtypes.bool: return bool(x)
    if dtypes.is_int(s):
      if isinstance(x, float) and not math.isfinite(x): raise ValueError(f"cannot convert {x} to {dt}")
      v = int(x)
      if s is dtypes.index: return v
      bits = 8 * s.itemsize
      v &= (1 << bits) - 1
      return v - (1 << bits) if s in dtypes.sints and v >> (bits - 1) else v
    if s in dtypes.floats: return float(x)
    raise TypeError(f"no constant of dtype {dt}")

  @staticmethod
  def min(dt: DType) -> Any:
    s = dt.scalar()
    if s is dtypes.bool: return False
    if s is dtypes.index: return -(2**63)
    if dtypes.is_int(s): return 0 if s in dtypes.uints else -(2 ** (8 * s.itemsize - 1))
    return -math.inf

  @staticmethod
  def max(dt: DType) -> Any:
    s = dt.scalar()
    if s is dtypes.bool: return True
    if s is dtypes.index: return 2**63 - 1
    if dtypes.is_int(s): return 2 ** (8 * s.itemsize) - 1 if s in dtypes.uints else 2 ** (8 * s.itemsize - 1) - 1
    return math.inf

  @staticmethod
  def finfo(dt: DType) -> tuple[builtins.int, builtins.int]:
    """(exponent bits, mantissa bits) of a float dtype."""
    table = {dtypes.float16: (5, 10), dtypes.bfloat16: (8, 7), dtypes.float32: (8, 23), dtypes.float64: (11, 52)}
    if dt.scalar() not in table: raise TypeError(f"finfo needs a float dtype, got {dt}")
    return table[dt.scalar()]

  @staticmethod
  def least_upper(*ds: DType) -> DType: return least_upper_dtype(*ds)

  @staticmethod
  def from_numpy(x: np.dtype | type) -> DType:
    key = np.dtype(x)
    if key not in _FROM_NP: raise TypeError(f"numpy dtype {key} has no plugrad dtype")
    return _FROM_NP[key]

  @staticmethod
  def to_numpy(dt: DType) -> np.dtype:
    """The numpy dtype matching `dt`. numpy has no bfloat16: that raises (convert through float32)."""
    if dt.scalar() not in _TO_NP:
      raise TypeError(f"{dt} has no numpy dtype" + (" (numpy lacks bfloat16; cast to float32)" if dt.scalar() is dtypes.bfloat16 else ""))
    return _TO_NP[dt.scalar()]

  @staticmethod
  def from_name(name: str) -> DType:
    if (dt := getattr(dtypes, name, None)) is None or not isinstance(dt, DType): raise ValueError(f"unknown dtype name {name!r}")
    return dt


class DTypeRangeError(OverflowError, ValueError, RuntimeError):
  """A value that does not fit the dtype it is to be stored in (`Tensor([300], dtype=dtypes.int8)`,
  `Tensor.full(s, 300, dtype=dtypes.int8)`, an `arange` past its dtype's range); the message names the value, the dtype
  and its range. An OverflowError and a ValueError, and a RuntimeError as PyTorch raises, so every style of except
  catches it."""


def _limits(dt: DType) -> tuple[Any, Any]:
  s = dt.scalar()
  if s is dtypes.bool: return False, True
  if dtypes.is_int(s): return dtypes.min(s), dtypes.max(s)
  if s in dtypes.floats:
    e, m = dtypes.finfo(s)
    big = (2 - 2.0 ** -m) * 2.0 ** (2 ** (e - 1) - 1)
    return -big, big
  raise TypeError(f"{dt} has no value range")


def check_fits(value: Any, dt: DType, what: str) -> None:
  """Raise DTypeRangeError unless the Python number `value` can be stored in `dt` without overflow: an int (or a
  float, whose fraction is dropped) within an integer dtype's range, a finite float within a float dtype's finite range
  (inf and nan are values of every float dtype). Anything goes into bool. `what` names the operation for the message."""
  s = dt.scalar()
  if s is dtypes.bool or isinstance(value, bool) or not isinstance(value, (int, float)): return
  lo, hi = _limits(s)
  v: int | float
  if dtypes.is_int(s):
    if isinstance(value, float) and not math.isfinite(value):
      raise DTypeRangeError(f"{what}: {value} cannot be stored in {s!r} (an integer dtype)")
    v = math.trunc(value)
  elif math.isfinite(value): v = value
  else: return
  if not lo <= v <= hi:
    raise DTypeRangeError(f"{what}: {value!r} does not fit in {s!r} (range {lo!r}..{hi!r}); pass a wider dtype")


_ALIASES = ("half", "float", "double", "uchar", "char", "short", "ushort", "int", "uint", "long", "ulong", "default_float", "default_int")
INVERSE_NAMES.update({v: k for k, v in dtypes.__dict__.items() if isinstance(v, DType) and k not in _ALIASES})
_FLOATS, _INTS, _UINTS = frozenset(dtypes.floats), frozenset((*dtypes.ints, dtypes.index)), frozenset(dtypes.uints)

_TO_NP: dict[DType, np.dtype] = {d: np.dtype(d.fmt) for d in dtypes.all if d.fmt is not None}
_FROM_NP: dict[np.dtype, DType] = {v: k for k, v in _TO_NP.items()}

# The promotion lattice (the same as tinygrad's, which is numpy's minus value-based casting): an edge a → b
# means a value of a is representable (or conventionally promoted) in b. The result of combining dtypes is
# the lowest-priority dtype that every operand reaches.
PROMO_LATTICE: dict[DType, tuple[DType, ...]] = {
  dtypes.bool: (dtypes.int8, dtypes.uint8),
  dtypes.int8: (dtypes.int16,), dtypes.int16: (dtypes.int32,), dtypes.int32: (dtypes.int64,),
  dtypes.int64: (dtypes.float16, dtypes.bfloat16),
  dtypes.uint8: (dtypes.int16, dtypes.uint16), dtypes.uint16: (dtypes.int32, dtypes.uint32),
  dtypes.uint32: (dtypes.int64, dtypes.uint64), dtypes.uint64: (dtypes.float16, dtypes.bfloat16),
  dtypes.float16: (dtypes.float32,), dtypes.bfloat16: (dtypes.float32,), dtypes.float32: (dtypes.float64,),
  dtypes.float64: (),
}


def _ancestors(dt: DType) -> set[DType]:
  out = {dt}
  for up in PROMO_LATTICE[dt]: out |= _ancestors(up)
  return out


_ANCESTORS: dict[DType, frozenset[DType]] = {d: frozenset(_ancestors(d)) for d in PROMO_LATTICE}


def least_upper_dtype(*ds: DType) -> DType:
  """The dtype that every one of `ds` promotes to (e.g. int8 + uint8 → int16, int64 + float16 → float16)."""
  if not ds: raise ValueError("least_upper_dtype needs at least one dtype")
  for d in ds:
    if d.scalar() not in _ANCESTORS: raise TypeError(f"{d} does not take part in type promotion")
  common = frozenset.intersection(*(_ANCESTORS[d.scalar()] for d in ds))
  return min(common, key=lambda d: d.priority)


def least_upper_float(dt: DType) -> DType:
  """`dt` if it is a float, else the default float (what int / int gives)."""
  return dt if dtypes.is_float(dt) else least_upper_dtype(dt, dtypes.default_float)


def sum_acc_dtype(dt: DType) -> DType:
  """The accumulation dtype of a sum: bool and small ints accumulate in at least default_int (uints in uint32)."""
  if dtypes.is_unsigned(dt): return least_upper_dtype(dt, dtypes.uint32)
  if dtypes.is_int(dt) or dt is dtypes.bool: return least_upper_dtype(dt, dtypes.int32)
  return least_upper_dtype(dt, dtypes.float32)


DTypeLike = str | DType


def to_dtype(x: DTypeLike) -> DType:
  if isinstance(x, DType): return x
  if isinstance(x, str): return dtypes.from_name(x)
  try: return dtypes.from_numpy(x)
  except TypeError: raise TypeError(f"cannot interpret {x!r} as a dtype") from None
