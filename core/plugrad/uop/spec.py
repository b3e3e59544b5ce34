"""What a valid UOp graph is at each stage of the compiler (docs/ir.md), checked in one pass over the graph.

`check(stage, root)` raises `SpecError(stage, uop, rule)` on the first violation; `maybe_check` does so only under `SPEC=1`.
Each op of a stage maps to one plain check function that returns None (valid) or the rule, in words, that the UOp breaks:
a dict lookup per node keeps the check linear in the size of the graph, so every stage of every kernel can be checked in tests.
A graph that passed a stage is remembered on its root (UOps are immutable), so re-checking a grown PROGRAM costs only its new part.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from plugrad.dtype import AddrSpace, DType, PtrDType, dtypes
from plugrad.helpers import SPEC
from plugrad.uop.ops import AxisType, GroupOp, KernelInfo, Ops, UOp, lane_gate

STAGES: tuple[str, ...] = ("tensor", "kernel", "linear", "program")
DEVICE_RE = re.compile(r"[A-Z][A-Z0-9_]*(:[0-9]+)?")  # canonical device string: NAME or NAME:index
SPECIAL_RE = re.compile(r"[gl]idx[0-2]")


class SpecError(ValueError):
  """A UOp graph breaks the spec of a stage: names the stage, the offending UOp and the rule."""
  def __init__(self, stage: str, uop: UOp, rule: str):
    self.stage, self.uop, self.rule = stage, uop, rule
    super().__init__(f"{stage} spec: {rule} — at {short(uop)}")

  def __reduce__(self) -> Any: return (SpecError, (self.stage, self.uop, self.rule))


def short(u: UOp) -> str:
  """A one-line form of a UOp for messages: op, dtype, arg and the ops of its sources."""
  arg = repr(u.arg)
  if len(arg) > 80: arg = arg[:77] + "..."
  srcs = ", ".join(s.op.name for s in u.src[:8]) + (f", ... ({len(u.src)} in all)" if len(u.src) > 8 else "")
  return f"{u.op.name} {u.dtype!r} arg={arg} src=({srcs})"


Check = Callable[[UOp], str | None]

# ---- small predicates

def _is_int(x: Any) -> bool: return isinstance(x, int) and not isinstance(x, bool)
def _is_ptr(dt: DType) -> bool: return isinstance(dt, PtrDType)
def _is_value(dt: DType) -> bool: return not isinstance(dt, PtrDType) and dt.scalar() is not dtypes.void
def _int_dt(dt: DType) -> bool: return not _is_ptr(dt) and dtypes.is_int(dt)
def _sint(x: Any) -> bool: return (_is_int(x) and x >= 0) or (isinstance(x, UOp) and _int_dt(x.dtype))
def _name(u: UOp) -> str: return u.op.name


def _const_ok(v: Any, dt: DType) -> bool:
  s = dt.scalar()
  if s is dtypes.bool: return isinstance(v, bool)
  if dtypes.is_int(s): return _is_int(v) and dtypes.min(s) <= v <= dtypes.max(s)
  if dtypes.is_float(s): return isinstance(v, float)
  return False


# ---- checks shared by the stages

def _const_value(u: UOp) -> str | None:
  if isinstance(u.dtype, PtrDType) or u.dtype.count != 1 or u.dtype is dtypes.void: return "CONST needs a scalar value dtype"
  if not _const_ok(u.arg, u.dtype):
    return f"CONST arg must be a Python {'bool' if u.dtype is dtypes.bool else 'int' if dtypes.is_int(u.dtype) else 'float'} " \
           f"that fits {u.dtype!r}, got {type(u.arg).__name__} {u.arg!r}"
  return None


def _const(u: UOp) -> str | None: return "CONST takes no sources" if u.src else _const_value(u)


def _vconst(u: UOp) -> str | None:
  if u.src or not _is_value(u.dtype) or u.dtype.count < 2: return "VCONST needs a vector value dtype and no sources"
  if not isinstance(u.arg, tuple) or len(u.arg) != u.dtype.count or not all(_const_ok(v, u.dtype) for v in u.arg):
    return f"VCONST arg must be a tuple of {u.dtype.count} values of {u.dtype.scalar()!r}"
  return None


def _define_var(u: UOp) -> str | None:
  a = u.arg
  if not (isinstance(a, tuple) and len(a) == 3 and isinstance(a[0], str) and a[0] and _is_int(a[1]) and _is_int(a[2]) and a[1] <= a[2]):
    return "DEFINE_VAR arg must be (name: str, min: int, max: int) with min <= max"
  if not _int_dt(u.dtype) or u.dtype.count != 1: return "DEFINE_VAR needs a scalar integer dtype"
  return None if not u.src else "DEFINE_VAR takes no sources"


def _bind(u: UOp) -> str | None:
  if len(u.src) != 2 or u.src[0].op is not Ops.DEFINE_VAR or u.src[1].op is not Ops.CONST: return "BIND needs sources (DEFINE_VAR, CONST)"
  if u.src[0].dtype is not u.dtype or u.src[1].dtype is not u.dtype: return "BIND, its variable and its value need one dtype"
  lo, hi = u.src[0].arg[1], u.src[0].arg[2]
  return None if lo <= u.src[1].arg <= hi else f"BIND value {u.src[1].arg} is outside [{lo}, {hi}]"


_FLOAT_ONLY = frozenset({Ops.FDIV, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.TRUNC})
_INT_ONLY = frozenset({Ops.IDIV, Ops.MOD, Ops.SHL, Ops.SHR})
_ARITY = {**{op: 1 for op in GroupOp.Unary}, **{op: 2 for op in GroupOp.Binary}, **{op: 3 for op in GroupOp.Ternary}}


def _alu(u: UOp) -> str | None:
  op, dt, src, n = u.op, u.dtype, u.src, _ARITY[u.op]
  if len(src) != n: return f"{_name(u)} needs {n} source{'s' if n > 1 else ''}, got {len(src)}"
  if any(not _is_value(s.dtype) for s in src): return f"{_name(u)} sources must be values (not void or pointers)"
  if op in GroupOp.Comparison:
    if src[0].dtype is not src[1].dtype or dt is not dtypes.bool.vec(src[0].dtype.count):
      return f"{_name(u)} needs 2 sources of one dtype and a bool result of their width"
    return None
  if not _is_value(dt): return f"{_name(u)} needs a value result dtype (not void or a pointer)"
  if op is Ops.WHERE:
    if src[0].dtype.scalar() is not dtypes.bool or src[0].dtype.count not in (1, dt.count): return "WHERE needs a bool condition"
    return None if src[1].dtype is dt and src[2].dtype is dt else "WHERE needs two values of the result dtype"
  if op is Ops.THREEFRY:
    ok = dt.scalar() is dtypes.uint32 and dt is src[0].dtype is src[1].dtype and isinstance(u.arg, tuple) and len(u.arg) == 2 and u.arg[1] in (0, 1)
    return None if ok else "THREEFRY needs uint32 counter words, a uint32 result and arg (key, word 0 or 1)"
  if op in (Ops.SHL, Ops.SHR):
    if src[0].dtype is not dt or not dtypes.is_int(dt) or not dtypes.is_int(src[1].dtype) or src[1].dtype.count != dt.count:
      return f"{_name(u)} needs an integer value of the result dtype and an integer shift of the same width"
    return None
  if any(s.dtype is not dt for s in src): return f"{_name(u)} needs {n} source{'s' if n > 1 else ''} of the result dtype {dt!r}"
  if op in _FLOAT_ONLY and not dtypes.is_float(dt): return f"{_name(u)} needs a float dtype"
  if op in _INT_ONLY and not dtypes.is_int(dt): return f"{_name(u)} needs an integer dtype"
  if op in (Ops.AND, Ops.OR, Ops.XOR) and dtypes.is_float(dt): return f"{_name(u)} needs an integer or bool dtype"
  return None


def _cast(u: UOp) -> str | None:
  if len(u.src) != 1 or not _is_value(u.dtype) or not _is_value(u.src[0].dtype) or u.src[0].dtype.count != u.dtype.count:
    return "CAST needs 1 value source of the same vector width and a value result"
  return None


def _bitcast(u: UOp) -> str | None:
  if len(u.src) != 1 or not _is_value(u.dtype) or not _is_value(u.src[0].dtype): return "BITCAST needs 1 value source and a value result"
  a, b = u.src[0].dtype, u.dtype
  if dtypes.bool in (a.scalar(), b.scalar()) or dtypes.index in (a.scalar(), b.scalar()):
    return "BITCAST cannot involve bool or index (they have no fixed bit layout)"
  return None if a.itemsize == b.itemsize else f"BITCAST needs a source of the same byte size ({a.itemsize} bytes → {b.itemsize})"


def _vectorize(u: UOp) -> str | None:
  if not u.src or len(u.src) != u.dtype.vcount or any(s.dtype is not u.dtype.scalar() for s in u.src):
    return f"VECTORIZE of {u.dtype!r} needs {u.dtype.vcount} sources of {u.dtype.scalar()!r}"
  return None


def _gep(u: UOp) -> str | None:
  if len(u.src) != 1: return "GEP needs 1 source"
  sdt = u.src[0].dtype
  if not isinstance(u.arg, tuple) or not u.arg or not all(_is_int(i) and 0 <= i < sdt.vcount for i in u.arg):
    return f"GEP arg must be a non-empty tuple of lane indices below {sdt.vcount}"
  return None if u.dtype is sdt.scalar().vec(len(u.arg)) else f"GEP of {len(u.arg)} lane(s) must have dtype {sdt.scalar().vec(len(u.arg))!r}"


def _cat(u: UOp) -> str | None:
  if not u.src or any(s.dtype.scalar() is not u.dtype.scalar() for s in u.src) or sum(s.dtype.vcount for s in u.src) != u.dtype.vcount:
    return "CAT needs sources of the result's scalar dtype whose widths add up to the result's"
  return None


def _same_as_src0(name: str, lo: int = 1, hi: int | None = 1) -> Check:
  def check(u: UOp) -> str | None:
    n = len(u.src)
    if n < lo or (hi is not None and n > hi): return f"{name} needs {lo if lo == hi else f'at least {lo}'} source{'s' if lo > 1 else ''}"
    return None if u.dtype is u.src[0].dtype else f"{name} must have the dtype of its (first) source"
  return check


def _reduce_op(x: Any) -> bool: return x in (Ops.ADD, Ops.MUL, Ops.MAX)


# ---- the tensor graph

def _device(u: UOp) -> str | None:
  ok = (isinstance(u.arg, str) and u.arg) or (isinstance(u.arg, tuple) and u.arg and all(isinstance(d, str) and d for d in u.arg))
  if not ok: return "DEVICE arg must be a device name (str) or a tuple of them"
  return None if not u.src and u.dtype is dtypes.void else "DEVICE takes no sources and has dtype void"


def _tensor_const(u: UOp) -> str | None:
  if u.src and not (len(u.src) == 1 and u.src[0].op is Ops.DEVICE): return "a tensor CONST takes no sources or one DEVICE"
  return _const_value(u)


def _buffer(u: UOp) -> str | None:
  if len(u.src) != 2 or u.src[0].op is not Ops.UNIQUE or u.src[1].op is not Ops.DEVICE: return "BUFFER needs sources (UNIQUE, DEVICE)"
  if not _is_int(u.arg) or u.arg < 0: return "BUFFER arg must be its element count (an int >= 0)"
  return None if _is_value(u.dtype) else "BUFFER needs a value dtype"


def _iota(u: UOp) -> str | None:
  if len(u.src) != 1 or u.src[0].op is not Ops.DEVICE: return "IOTA needs one DEVICE source"
  if isinstance(u.arg, UOp):  # a symbolic length: a bound Variable expression
    if u.arg.dtype is not dtypes.index or u.arg.vmin < 0: return "IOTA's symbolic length must be an index expression >= 0"
  elif not _is_int(u.arg) or u.arg < 0: return "IOTA arg must be its length (an int >= 0 or a bound Variable expression)"
  return None if u.dtype in dtypes.ints else "IOTA needs an integer dtype"


def _unique(u: UOp) -> str | None: return None if _is_int(u.arg) and not u.src else "UNIQUE arg must be an int, with no sources"


def _copy(u: UOp) -> str | None:
  if len(u.src) != 2 or u.src[1].op is not Ops.DEVICE: return "COPY needs sources (value, DEVICE)"
  return None if u.dtype is u.src[0].dtype else "COPY must have the dtype of its source"


def _movement(u: UOp) -> str | None:
  if len(u.src) != 1 or u.src[0].dtype is not u.dtype: return f"{_name(u)} needs 1 source of its dtype"
  a, op = u.arg, u.op
  if not isinstance(a, tuple): return f"{_name(u)} arg must be a tuple"
  if op in (Ops.RESHAPE, Ops.EXPAND) and not all(_sint(x) for x in a):
    return f"{_name(u)} arg must be a tuple of sizes (ints >= 0 or integer UOps)"
  if op is Ops.PERMUTE and sorted(a) != list(range(len(a))): return "PERMUTE arg must be a permutation of 0..n-1"
  pairs = all(isinstance(p, tuple) and len(p) == 2 and _sint(p[0]) and _sint(p[1]) for p in a)
  if op is Ops.PAD and not pairs: return "PAD arg must be a tuple of (before, after) pairs of sizes >= 0"
  if op is Ops.SHRINK and not (pairs and all(not (_is_int(s) and _is_int(e)) or s <= e for s, e in a)):
    return "SHRINK arg must be a tuple of (start, end) pairs with 0 <= start <= end"
  if op is Ops.FLIP and not all(isinstance(x, bool) for x in a): return "FLIP arg must be a tuple of bools, one per axis"
  return None


def _reduce_axis(u: UOp) -> str | None:
  a = u.arg
  if not (isinstance(a, tuple) and len(a) == 2 and _reduce_op(a[0]) and isinstance(a[1], tuple) and all(_is_int(x) and x >= 0 for x in a[1])):
    return "REDUCE_AXIS arg must be (Ops.ADD|MUL|MAX, tuple of axis ints)"
  return None if len(u.src) == 1 and u.src[0].dtype is u.dtype else "REDUCE_AXIS needs 1 source of its dtype"


def _any(u: UOp) -> str | None: return None


def _kernel(u: UOp) -> str | None:
  # a precompiled kernel in the tensor graph (run_program): its slot tensors, then the BINDs of its variables
  if not isinstance(u.arg, UOp) or u.arg.op is not Ops.PROGRAM or u.dtype is not dtypes.void: return "KERNEL needs a PROGRAM arg and dtype void"
  nb = sum(s.op is not Ops.BIND for s in u.src)
  return None if all(s.op is Ops.BIND for s in u.src[nb:]) else "KERNEL sources are the slot tensors, then BINDs"


def _multi(u: UOp) -> str | None:
  # a value on several devices (engine/multi.py): one single-device piece per device, sharded along arg or replicated (None)
  if not u.src or any(s.dtype is not u.dtype for s in u.src): return "MULTI needs one or more pieces of its dtype"
  if u.arg is not None and not (_is_int(u.arg) and u.arg >= 0): return "MULTI arg must be the sharded axis (an int >= 0) or None (replicated)"
  return None if all(isinstance(s.tensor_device, str) for s in u.src) else "every piece of a MULTI must be on one device (a str device)"


SCATTER_HOW = ("set", "add", "mul", "max", "min")


def _gather(u: UOp) -> str | None:
  if len(u.src) != 2 or u.src[0].dtype is not u.dtype: return "GATHER needs sources (value of its dtype, index)"
  if not _int_dt(u.src[1].dtype) or u.src[1].dtype is dtypes.bool: return "GATHER index must have an integer dtype"
  return None if _is_int(u.arg) and u.arg >= 0 else "GATHER arg must be the axis (an int >= 0)"


def _scatter(u: UOp) -> str | None:
  if len(u.src) != 3 or u.src[0].dtype is not u.dtype or u.src[2].dtype is not u.dtype: return "SCATTER needs sources (base, index, src) of its dtype"
  if not _int_dt(u.src[1].dtype) or u.src[1].dtype is dtypes.bool: return "SCATTER index must have an integer dtype"
  ok = isinstance(u.arg, tuple) and len(u.arg) == 2 and _is_int(u.arg[0]) and u.arg[0] >= 0 and u.arg[1] in SCATTER_HOW
  return None if ok else f"SCATTER arg must be (axis, one of {SCATTER_HOW})"


# ---- kernels and linear programs

def _define_global(u: UOp) -> str | None:
  if not _is_int(u.arg) or u.arg < 0: return "DEFINE_GLOBAL arg must be its buffer slot (an int >= 0)"
  if not isinstance(u.dtype, PtrDType) or u.dtype.addrspace is not AddrSpace.GLOBAL or u.dtype.v != 1:
    return "DEFINE_GLOBAL needs a GLOBAL pointer dtype"
  return None if not u.src else "DEFINE_GLOBAL takes no sources"


def _define_local(u: UOp) -> str | None:
  if not isinstance(u.arg, str): return "DEFINE_LOCAL arg must be its name (a str)"
  if not isinstance(u.dtype, PtrDType) or u.dtype.addrspace is not AddrSpace.LOCAL or u.dtype.size <= 0:
    return "DEFINE_LOCAL needs a LOCAL pointer dtype of known size"
  return None if not u.src else "DEFINE_LOCAL takes no sources"


def _define_reg(u: UOp) -> str | None:
  if not _is_int(u.arg): return "DEFINE_REG arg must be an int id"
  if not isinstance(u.dtype, PtrDType) or u.dtype.addrspace is not AddrSpace.REG or u.dtype.size <= 0:
    return "DEFINE_REG needs a REG pointer dtype of known size"
  return None if not u.src else "DEFINE_REG takes no sources"


def _range(u: UOp) -> str | None:
  if not (isinstance(u.arg, tuple) and len(u.arg) == 2 and _is_int(u.arg[0]) and isinstance(u.arg[1], AxisType)):
    return "RANGE arg must be (axis_id: int, AxisType)"
  if len(u.src) != 1 or not _int_dt(u.dtype) or u.dtype.count != 1 or u.src[0].dtype is not u.dtype:
    return "RANGE needs a scalar integer dtype and 1 bound of that dtype"
  return None


def _special(u: UOp) -> str | None:
  if not isinstance(u.arg, str) or not SPECIAL_RE.fullmatch(u.arg): return "SPECIAL arg must be 'gidxN' or 'lidxN' with N in 0..2"
  if len(u.src) != 1 or not _int_dt(u.dtype) or u.dtype.count != 1 or u.src[0].dtype is not u.dtype:
    return "SPECIAL needs a scalar integer dtype and 1 size of that dtype"
  return None


def _index(u: UOp) -> str | None:
  if not 2 <= len(u.src) <= 3 or not isinstance(buf := u.src[0].dtype, PtrDType): return "INDEX needs sources (pointer, index[, gate])"
  if not _int_dt(u.src[1].dtype): return "INDEX needs an integer index"
  if len(u.src) == 3 and u.src[2].dtype.scalar() is not dtypes.bool: return "INDEX gate must be bool"
  if len(u.src) == 3 and (g := u.src[2].dtype.count) > 1 and u.src[1].dtype.count not in (1, g):
    return "INDEX's vector gate needs one bool per lane of its vector index"
  if not isinstance(u.dtype, PtrDType) or u.dtype.base.scalar() is not buf.base.scalar() or u.dtype.addrspace is not buf.addrspace:
    return "INDEX must have a pointer dtype to the buffer's element type and address space"
  return None


def _ptr_cast(u: UOp) -> str | None:
  # a pointer CAST re-types an INDEX for a vector access (float* → float4*); anything else is a value cast
  if not isinstance(u.dtype, PtrDType): return _cast(u)
  if len(u.src) != 1 or not isinstance(s := u.src[0].dtype, PtrDType) or s.base.scalar() is not u.dtype.base.scalar():
    return "a pointer CAST needs 1 pointer source to the same scalar type"
  return None


def _load(u: UOp) -> str | None:
  if not u.src or not isinstance(p := u.src[0].dtype, PtrDType): return "LOAD needs a pointer as its first source"
  if not _is_value(u.dtype) or u.dtype.scalar() is not p.base.scalar(): return "LOAD must have the pointer's element dtype"
  rest = u.src[1:]
  if rest and rest[0].dtype is not dtypes.void:
    if rest[0].dtype is not u.dtype: return "LOAD's alternative value must have the load's dtype"
    rest = rest[1:]
  if (g := lane_gate(u.src[0])) is not None and g.dtype.count != u.dtype.count: return "a LOAD through a vector gate has one lane per gate lane"
  return None if all(s.dtype is dtypes.void for s in rest) else "LOAD takes (pointer[, alt]) and then only effects for ordering"


def _store(u: UOp) -> str | None:
  if len(u.src) != 2 or not isinstance(p := u.src[0].dtype, PtrDType): return "STORE needs sources (pointer, value)"
  if not _is_value(u.src[1].dtype) or u.src[1].dtype.scalar() is not p.base.scalar(): return "STORE value must have the pointer's element dtype"
  if u.arg is not None and (err := _atomic_store(u.arg, p, u.src[1].dtype)): return err
  if (g := lane_gate(u.src[0])) is not None and g.dtype.count != u.src[1].dtype.count:
    return "a STORE through a vector gate has one lane per gate lane"
  return None if u.dtype is dtypes.void else "STORE has dtype void"


def _atomic_store(arg: object, p: PtrDType, val: DType) -> str | None:
  """STORE arg: None (a plain write) or Ops.ADD (an atomic add of one scalar into global or workgroup memory)."""
  if arg is not Ops.ADD: return f"STORE arg must be None or Ops.ADD (an atomic add), got {arg!r}"
  ok = val.count == 1 and val is not dtypes.bool and p.addrspace is not AddrSpace.REG
  return None if ok else "an atomic STORE (arg Ops.ADD) adds one non-bool scalar into global or local memory"


def _reduce(u: UOp) -> str | None:
  if not _reduce_op(u.arg): return "REDUCE arg must be Ops.ADD, Ops.MUL or Ops.MAX"
  if not u.src or u.src[0].dtype is not u.dtype or not _is_value(u.dtype): return "REDUCE needs a value source of its dtype"
  return None if all(s.op is Ops.RANGE for s in u.src[1:]) else "REDUCE sources after the value must be RANGEs"


def _end(u: UOp) -> str | None:
  if len(u.src) < 2 or u.src[0].dtype is not dtypes.void or u.dtype is not dtypes.void: return "END needs sources (effect, *ranges) and dtype void"
  return None if all(s.op is Ops.RANGE for s in u.src[1:]) else "END sources after the effect must be RANGEs"


def _kernel_sink(u: UOp) -> str | None:
  if u.arg is not None and not isinstance(u.arg, KernelInfo): return "a kernel SINK arg must be a KernelInfo (or None)"
  return None if u.dtype is dtypes.void and all(s.dtype is dtypes.void for s in u.src) else "a kernel SINK takes effects (void)"


def _void(name: str) -> Check:
  return lambda u: None if u.dtype is dtypes.void else f"{name} has dtype void"


def _wmma(u: UOp) -> str | None:
  if len(u.src) != 3 or u.src[2].dtype is not u.dtype or not isinstance(u.arg, tuple):
    return "WMMA needs sources (a, b, acc) with acc of the result dtype, and a tuple arg"
  return None


def _custom(u: UOp) -> str | None: return None if isinstance(u.arg, str) else f"{_name(u)} arg must be a format str"
def _unroll(u: UOp) -> str | None: return None if len(u.src) == 1 and isinstance(u.arg, tuple) else f"{_name(u)} needs 1 source and a tuple arg"


def _endrange(u: UOp) -> str | None:
  return None if len(u.src) == 1 and u.src[0].op is Ops.RANGE and u.dtype is dtypes.void else "ENDRANGE needs one RANGE source and dtype void"


def _if(u: UOp) -> str | None:
  if not u.src or u.src[0].dtype is not dtypes.bool or u.dtype is not dtypes.void: return "IF needs a bool condition and dtype void"
  return None if all(s.dtype is dtypes.void for s in u.src[1:]) else "IF takes a condition and then only effects for ordering"


def _endif(u: UOp) -> str | None:
  return None if len(u.src) == 1 and u.src[0].op is Ops.IF and u.dtype is dtypes.void else "ENDIF needs one IF source and dtype void"


_VALUES: dict[Ops, Check] = {**{op: _alu for op in GroupOp.ALU}, Ops.CONST: _const, Ops.CAST: _cast, Ops.BITCAST: _bitcast}

TENSOR_RULES: dict[Ops, Check] = {
  **_VALUES, **{op: _movement for op in GroupOp.Movement}, Ops.CONST: _tensor_const,
  Ops.SINK: _any, Ops.KERNEL: _kernel, Ops.BUFFER: _buffer, Ops.IOTA: _iota, Ops.UNIQUE: _unique, Ops.DEVICE: _device,
  Ops.DEFINE_VAR: _define_var, Ops.BIND: _bind,
  Ops.REDUCE_AXIS: _reduce_axis, Ops.GATHER: _gather, Ops.SCATTER: _scatter,
  Ops.COPY: _copy, Ops.CONTIGUOUS: _same_as_src0("CONTIGUOUS", 1, None), Ops.DETACH: _same_as_src0("DETACH"),
  Ops.ASSIGN: _same_as_src0("ASSIGN", 2, 2), Ops.AFTER: _same_as_src0("AFTER", 1, None), Ops.BUFFER_VIEW: _same_as_src0("BUFFER_VIEW"),
  Ops.MULTI: _multi,
}

_MEMORY: dict[Ops, Check] = {
  **_VALUES, Ops.CAST: _ptr_cast, Ops.VECTORIZE: _vectorize, Ops.GEP: _gep, Ops.WMMA: _wmma, Ops.CUSTOM: _custom, Ops.CUSTOMI: _custom,
  Ops.DEFINE_GLOBAL: _define_global, Ops.DEFINE_LOCAL: _define_local, Ops.DEFINE_REG: _define_reg, Ops.DEFINE_VAR: _define_var,
  Ops.SPECIAL: _special, Ops.RANGE: _range, Ops.INDEX: _index, Ops.LOAD: _load, Ops.STORE: _store, Ops.BARRIER: _void("BARRIER"),
}

KERNEL_RULES: dict[Ops, Check] = {
  **_MEMORY, Ops.SINK: _kernel_sink, Ops.END: _end, Ops.REDUCE: _reduce, Ops.VCONST: _vconst, Ops.CAT: _cat, Ops.UNROLL: _unroll,
  Ops.CONTRACT: _unroll, Ops.GROUP: _void("GROUP"), Ops.NOOP: _same_as_src0("NOOP"),
}

LINEAR_RULES: dict[Ops, Check] = {**_MEMORY, Ops.VCONST: _vconst, Ops.ENDRANGE: _endrange, Ops.IF: _if, Ops.ENDIF: _endif}


# ---- whole-graph checks

def _check_nodes(stage: str, nodes: Any, rules: dict[Ops, Check]) -> None:
  slots: dict[int, UOp] = {}
  var_names: dict[str, UOp] = {}
  for u in nodes:
    if (fn := rules.get(u.op)) is None: raise SpecError(stage, u, f"{_name(u)} is not allowed at the {stage} stage")
    if (why := fn(u)) is not None: raise SpecError(stage, u, why)
    # one buffer per slot and one bound per variable name, or launch arguments become ambiguous
    if u.op is Ops.DEFINE_GLOBAL and slots.setdefault(u.arg, u) is not u: raise SpecError(stage, u, f"two DEFINE_GLOBALs share slot {u.arg}")
    if u.op is Ops.DEFINE_VAR and var_names.setdefault(u.arg[0], u) is not u:
      raise SpecError(stage, u, f"two DEFINE_VARs are named {u.arg[0]!r}")


def _check_tensor(root: UOp) -> None: _check_nodes("tensor", root.toposort, TENSOR_RULES)


def _check_kernel(root: UOp) -> None:
  if root.op is not Ops.SINK: raise SpecError("kernel", root, "a kernel AST must be rooted at a SINK")
  _check_nodes("kernel", root.toposort, KERNEL_RULES)


def _check_linear(root: UOp) -> None:
  stage = "linear"
  if root.op is not Ops.LINEAR or root.dtype is not dtypes.void or root.arg is not None:
    raise SpecError(stage, root, "a linear program is a LINEAR (dtype void, arg None) whose sources are the uops in order")
  uops = root.src
  pos: dict[UOp, int] = {}
  for i, u in enumerate(uops):
    if pos.setdefault(u, i) != i: raise SpecError(stage, u, f"uop #{i} appears twice in the program (first at #{pos[u]})")
  _check_nodes(stage, uops, LINEAR_RULES)
  open_blocks: list[UOp] = []  # the RANGEs and IFs entered and not yet closed, innermost last
  closed: set[UOp] = set()
  for i, u in enumerate(uops):
    dt = u.dtype.base if isinstance(u.dtype, PtrDType) else u.dtype
    if dt.scalar() is dtypes.index: raise SpecError(stage, u, f"uop #{i} has dtype index, which must be lowered to int32/int64 before linearizing")
    for s in u.src:
      if (j := pos.get(s)) is None: raise SpecError(stage, u, f"uop #{i} uses a source ({_name(s)}) that is not in the program")
      if j >= i: raise SpecError(stage, u, f"uop #{i} uses #{j} ({_name(s)}), which comes after it")
      if s in closed and u.op is not Ops.ENDRANGE: raise SpecError(stage, u, f"uop #{i} uses RANGE #{j} after its ENDRANGE")
    if u.op in (Ops.RANGE, Ops.IF): open_blocks.append(u)
    elif u.op in (Ops.ENDRANGE, Ops.ENDIF):
      if not open_blocks or open_blocks[-1] is not u.src[0]:
        inner = f"the innermost open block is {_name(open_blocks[-1])} #{pos[open_blocks[-1]]}" if open_blocks else "no block is open"
        raise SpecError(stage, u, f"{_name(u)} #{i} does not close the innermost open block ({inner})")
      if open_blocks.pop().op is Ops.RANGE: closed.add(u.src[0])
  if open_blocks: raise SpecError(stage, open_blocks[-1], f"{_name(open_blocks[-1])} #{pos[open_blocks[-1]]} is never closed")


# the "program" stage's check is uop/program.py's (only it knows PROGRAM's layout): it registers it on import
_CHECKERS: dict[str, Callable[[UOp], None]] = {"tensor": _check_tensor, "kernel": _check_kernel, "linear": _check_linear}


def register_stage(stage: str, fn: Callable[[UOp], None]) -> None:
  """Make `fn` the check of `stage` (one of STAGES): it raises SpecError on the first violation."""
  if stage not in STAGES: raise ValueError(f"unknown spec stage {stage!r}; the stages are {STAGES}")
  _CHECKERS[stage] = fn


def check(stage: str, root: UOp) -> None:
  """Raise SpecError if the graph under `root` is not valid at `stage` (one of STAGES)."""
  if (fn := _CHECKERS.get(stage)) is None: raise ValueError(f"unknown spec stage {stage!r}; the stages are {STAGES}")
  if not isinstance(root, UOp): raise TypeError(f"spec check of stage {stage!r} needs a UOp, got {type(root).__name__}")
  key = "_spec_ok_" + stage
  if key in root.__dict__: return
  fn(root)
  root.__dict__[key] = True


def maybe_check(stage: str, root: UOp) -> None:
  """`check` when the SPEC flag is on (it is in tests), else nothing."""
  if SPEC: check(stage, root)
