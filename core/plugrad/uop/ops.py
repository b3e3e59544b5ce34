"""`Ops` and `UOp`: the one IR of plugrad. UOps are immutable and hash-consed (weakly), so structural
equality is identity, and a graph is a DAG of shared nodes."""
from __future__ import annotations

import enum
import functools
import math
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, Union

from plugrad.dtype import AddrSpace, DType, PtrDType, dtypes
from plugrad.helpers import cdiv, cmod


class Ops(enum.IntEnum):
  """Every operation of the IR, grouped. The order inside a group is the linearizer's tie-break order."""
  # every UOp's hash-cons key hashes its op: Enum's own __hash__ (a Python call hashing the member's name) took a quarter
  # of a cache hit. The int's hash is the C slot, agrees with IntEnum's == on ints, and is the same in every process.
  __hash__ = int.__hash__
  # --- program stages (the PROGRAM UOp and its parts)
  PROGRAM = enum.auto(); DEVICE = enum.auto(); LINEAR = enum.auto(); SOURCE = enum.auto(); BINARY = enum.auto()
  # --- graph structure
  SINK = enum.auto(); NOOP = enum.auto(); GROUP = enum.auto(); CUSTOM = enum.auto(); CUSTOMI = enum.auto()
  # --- tensor graph
  BUFFER = enum.auto(); UNIQUE = enum.auto(); BUFFER_VIEW = enum.auto(); COPY = enum.auto(); CONTIGUOUS = enum.auto()
  ASSIGN = enum.auto(); DETACH = enum.auto(); REDUCE_AXIS = enum.auto(); KERNEL = enum.auto(); AFTER = enum.auto(); IOTA = enum.auto()
  # data-dependent indexing along one axis (docs/ir.md): GATHER(x, idx) reads, SCATTER(base, idx, src) writes
  GATHER = enum.auto(); SCATTER = enum.auto()
  # --- movement (tensor graph; become index arithmetic in kernels)
  RESHAPE = enum.auto(); PERMUTE = enum.auto(); EXPAND = enum.auto(); PAD = enum.auto(); SHRINK = enum.auto(); FLIP = enum.auto()
  # --- defines
  DEFINE_GLOBAL = enum.auto(); DEFINE_LOCAL = enum.auto(); DEFINE_REG = enum.auto(); DEFINE_VAR = enum.auto(); BIND = enum.auto()
  SPECIAL = enum.auto(); CONST = enum.auto(); VCONST = enum.auto()
  # --- control flow
  RANGE = enum.auto(); END = enum.auto(); ENDRANGE = enum.auto(); IF = enum.auto(); ENDIF = enum.auto(); BARRIER = enum.auto()
  # --- memory
  INDEX = enum.auto(); LOAD = enum.auto(); STORE = enum.auto()
  # --- reduction in a kernel (over RANGEs)
  REDUCE = enum.auto()
  # --- vectors and tensor cores
  VECTORIZE = enum.auto(); GEP = enum.auto(); CAT = enum.auto(); UNROLL = enum.auto(); CONTRACT = enum.auto(); WMMA = enum.auto()
  # --- conversions
  CAST = enum.auto(); BITCAST = enum.auto()
  # --- ALU unary
  EXP2 = enum.auto(); LOG2 = enum.auto(); SIN = enum.auto(); SQRT = enum.auto(); RECIPROCAL = enum.auto(); NEG = enum.auto(); TRUNC = enum.auto()
  # --- ALU binary
  ADD = enum.auto(); MUL = enum.auto(); SUB = enum.auto(); FDIV = enum.auto(); IDIV = enum.auto(); MOD = enum.auto(); MAX = enum.auto()
  POW = enum.auto(); CMPLT = enum.auto(); CMPNE = enum.auto(); CMPEQ = enum.auto(); AND = enum.auto(); OR = enum.auto(); XOR = enum.auto()
  SHL = enum.auto(); SHR = enum.auto(); THREEFRY = enum.auto()
  # --- ALU ternary
  WHERE = enum.auto(); MULACC = enum.auto()
  # --- tensor graph: a value on several devices, MULTI(*pieces, arg=axis) (engine/multi.py). Last, so that adding it
  # changed no other op's value (values order commutative operands in kernels and are pickled in the caches)
  MULTI = enum.auto()

  def __repr__(self) -> str: return f"Ops.{self.name}"
  __str__ = __repr__


class GroupOp:
  Unary = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.NEG, Ops.TRUNC})
  Binary = frozenset({Ops.ADD, Ops.MUL, Ops.SUB, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.POW, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ,
                      Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.THREEFRY})
  Ternary = frozenset({Ops.WHERE, Ops.MULACC})
  Transcendental = frozenset({Ops.EXP2, Ops.LOG2, Ops.SIN})  # a renderer's `native_math`; codegen/decompose.py writes out the rest
  ALU = Unary | Binary | Ternary
  Commutative = frozenset({Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR})
  Associative = frozenset({Ops.ADD, Ops.MUL, Ops.AND, Ops.OR, Ops.MAX})
  Comparison = frozenset({Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ})
  Movement = frozenset({Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP})
  Defines = frozenset({Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL, Ops.DEFINE_REG, Ops.DEFINE_VAR})
  Memory = frozenset({Ops.INDEX, Ops.LOAD, Ops.STORE})
  Stages = frozenset({Ops.PROGRAM, Ops.DEVICE, Ops.LINEAR, Ops.SOURCE, Ops.BINARY})
  Irreducible = frozenset({Ops.CONST, Ops.DEFINE_VAR, Ops.SPECIAL, Ops.RANGE})
  Idempotent = frozenset({Ops.AND, Ops.OR, Ops.MAX})  # x op x == x
  # ops whose integer results can be bounded from their sources' bounds
  Bounded = ALU | frozenset({Ops.CONST, Ops.VCONST, Ops.DEFINE_VAR, Ops.BIND, Ops.SPECIAL, Ops.RANGE, Ops.CAST, Ops.VECTORIZE, Ops.GEP})


class AxisType(enum.Enum):
  """What a RANGE loops over in a kernel AST; the optimizer changes these, the lowerer obeys them."""
  GLOBAL = "g"; THREAD = "t"; LOCAL = "l"; LOOP = "L"; GROUP_REDUCE = "G"; REDUCE = "R"; UPCAST = "u"; UNROLL = "r"
  __hash__ = object.__hash__  # members are singletons compared by identity (Enum's __hash__ hashes the name in Python)

  def __repr__(self) -> str: return f"AxisType.{self.name}"


@dataclass(frozen=True)
class KernelInfo:
  """The arg of a kernel's SINK: its name and the optimizations applied to it."""
  name: str = "kernel"
  applied_opts: tuple[Any, ...] = ()
  opts_to_apply: tuple[Any, ...] | None = None
  dont_use_locals: bool = False
  # written outside plugrad (`new_program`): its LINEAR only declares the signature, so nothing may render it again
  external: bool = False
  # written in lowered form (explicit loops and registers: fused attention): the codegen pass it joins the pipeline at
  # (codegen/passes.py), skipping the optimizer and the passes before; "" = an ordinary kernel AST
  entry_pass: str = ""


ConstType = float | int | bool
sint = Union[int, "UOp"]  # a size that may be symbolic


class UOpError(ValueError):
  """A UOp was built with an arg, dtype or source of the wrong kind."""


# Ops whose UOps are instances of a UOp subclass with extra accessors (PROGRAM → ProgramUOp, see program.py).
OP_CLASSES: dict[Ops, type] = {}

# ---- the hash-cons table: key → weak reference. Entries are removed when their UOp dies (UOp.__del__).
_ucache: dict[tuple, Any] = {}
_weakref = __import__("weakref").ref


def _arg_key(arg: Any) -> Any:
  # 0.0 == -0.0 and 1 == 1.0 == True would merge distinct args; nan != nan would defeat sharing.
  c = arg.__class__
  if c is float: return ("f", struct.pack("<d", arg)) if arg == 0.0 or arg != arg else ("f", arg)
  if c is tuple:
    for a in arg:  # movement ops' args are tuples of ints: they are their own key (no new tuple per lookup)
      if a.__class__ is not int: return tuple(map(_arg_key, arg))
    return arg
  if c is bool: return ("b", arg)
  return arg


SIMPLIFY_MEMO_MAX = 1 << 18  # nodes UOp.simplify remembers (every node of each simplified graph) before it starts afresh
_SIMPLIFIED: dict[UOp, UOp] = {}


class UOp:
  """An immutable node of the IR: `UOp(op, dtype, src, arg)`. Building an equal UOp returns the same object."""
  __slots__ = ("op", "dtype", "src", "arg", "_key", "__weakref__", "__dict__")
  op: Ops
  dtype: DType
  src: tuple[UOp, ...]
  arg: Any
  _key: tuple
  _below: tuple[UOp, ...] | None = None  # the cached toposort order (in the instance dict once computed)

  def __new__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None) -> UOp:
    if src.__class__ is not tuple:
      if isinstance(src, list): return UOp(op, dtype, tuple(src), arg)
      raise UOpError(f"{op!r}: src must be a tuple of UOps, got {type(src).__name__}")
    key = (op, dtype, src, arg if arg.__class__ not in (float, tuple, bool) else _arg_key(arg))
    try:
      if (ref := _ucache.get(key)) is not None and (ret := ref()) is not None: return ret
    except TypeError:
      raise UOpError(f"the arg of a UOp must be hashable: {op!r} got {type(arg).__name__} {arg!r}") from None
    if op.__class__ is not Ops: raise UOpError(f"unknown op {op!r} (expected a member of Ops)")
    if not isinstance(dtype, DType): raise UOpError(f"{op!r}: dtype must be a DType, got {type(dtype).__name__} {dtype!r}")
    for s in src:
      if not isinstance(s, UOp): raise UOpError(f"{op!r}: every src must be a UOp, got {type(s).__name__} {s!r}")
    ret = object.__new__(OP_CLASSES.get(op, cls))
    # the slots' own setters (__setattr__ refuses these names): cheaper than object.__setattr__ by name
    _set_op(ret, op); _set_dtype(ret, dtype); _set_src(ret, src); _set_arg(ret, arg); _set_key(ret, key)
    _ucache[key] = _weakref(ret)
    return ret

  def __del__(self) -> None:
    try:
      if (ref := _ucache.get(key := self._key)) is not None and ((r := ref()) is None or r is self): del _ucache[key]
    except (AttributeError, TypeError, KeyError): pass  # interpreter shutdown or half-built object

  def __setattr__(self, name: str, value: Any) -> None:
    if name in ("op", "dtype", "src", "arg", "_key"): raise AttributeError(f"UOp is immutable (tried to set {name})")
    object.__setattr__(self, name, value)

  def __reduce__(self) -> Any: return (UOp, (self.op, self.dtype, self.src, self.arg))
  def __copy__(self) -> UOp: return self
  def __deepcopy__(self, memo: Any) -> UOp: return self
  def __bool__(self) -> bool:
    raise TypeError(f"the truth value of a UOp is not defined (use .simplify() / .vmin / .vmax): {self.render(simplify=False)}")

  # ---- graph utilities
  @property
  def toposort(self) -> dict[UOp, None]:
    """Every node of the graph, sources before users (iterative: deep graphs do not hit the recursion limit). The order
    is cached without the node itself, so the cache makes no reference cycle and a dropped graph is freed at once."""
    if (below := self._below) is None:
      out: dict[UOp, None] = {}
      # sources in order, depth first, each node after its sources; a source whose order is known is not walked: its
      # nodes not seen yet go in in its order (what walking it would add, since everything below a seen node is
      # seen; dict.update keeps the seen ones where they are), then itself
      stack = [(self, iter(self.src))]
      while stack:
        node, it = stack[-1]
        for s in it:
          if s in out: continue
          if (done := s._below) is not None:
            out.update(dict.fromkeys(done))
            out[s] = None
            continue
          stack.append((s, iter(s.src)))
          break
        else:
          stack.pop()
          out[node] = None
      del out[self]
      below = self.__dict__["_below"] = tuple(out)
    ret = dict.fromkeys(below)
    ret[self] = None
    return ret

  def replace(self, **kwargs: Any) -> UOp:
    """A copy with some of op, dtype, src, arg changed."""
    bad = set(kwargs) - {"op", "dtype", "src", "arg"}
    if bad: raise TypeError(f"UOp.replace got unknown field(s) {sorted(bad)}")
    return UOp(kwargs.get("op", self.op), kwargs.get("dtype", self.dtype), tuple(kwargs.get("src", self.src)), kwargs.get("arg", self.arg))

  def substitute(self, mapping: dict[UOp, UOp], memo: dict[UOp, UOp] | None = None) -> UOp:
    """Replace every occurrence of each key by its value, rebuilding the users above them (no re-matching of the result).
    `memo`: the result of each node, kept across calls with the same `mapping` (graphs that share parts rebuild them once)."""
    if not mapping: return self
    done: dict[UOp, UOp] = {} if memo is None else memo
    for node in self.toposort:
      if node in done: continue
      if (rep := mapping.get(node)) is not None: done[node] = rep
      elif not (src := node.src): done[node] = node
      else:
        new_src = tuple([done[s] for s in src])
        done[node] = node if new_src == src else UOp(node.op, node.dtype, new_src, node.arg)  # == compares UOps by identity
    return done[self]

  def sink(self, *srcs: UOp, arg: Any = None) -> UOp: return UOp(Ops.SINK, dtypes.void, (self, *srcs), arg)

  @property
  def size_hint(self) -> int: return len(self.toposort)

  # ---- printing
  def __repr__(self) -> str: return pretty_print(self)

  def to_python(self) -> str:
    """Python source that rebuilds this graph (evaluate it with `uop_from_python`)."""
    names: dict[UOp, str] = {}
    lines: list[str] = []
    for i, u in enumerate(self.toposort):
      names[u] = f"x{i}"
      srcs = "".join(names[s] + ", " for s in u.src) if len(u.src) == 1 else ", ".join(names[s] for s in u.src)
      lines.append(f"x{i} = UOp({u.op!r}, {u.dtype!r}, ({srcs}), {u.arg!r})")
    return "\n".join(lines + [f"ret = {names[self]}"])

  # ---- constants and ALU construction
  @staticmethod
  def const(dtype: DType, b: ConstType | tuple[ConstType, ...]) -> UOp:
    if isinstance(b, UOp): raise UOpError(f"UOp.const got a UOp ({b.render()}); use it directly")
    if isinstance(dtype, PtrDType): raise UOpError(f"no constant of pointer dtype {dtype}")
    if isinstance(b, tuple):
      if len(b) != dtype.count: raise UOpError(f"VCONST of {dtype} needs {dtype.count} values, got {len(b)}")
      if all(x == b[0] for x in b): return UOp.const(dtype, b[0])
      return UOp(Ops.VCONST, dtype, (), dtypes.as_const(b, dtype.scalar()))
    v = dtypes.as_const(b, dtype.scalar())
    if isinstance(v, float) and v != v: v = math.nan
    ret = UOp(Ops.CONST, dtype.scalar(), (), v)
    return ret if dtype.count == 1 else UOp(Ops.VECTORIZE, dtype, (ret,) * dtype.count)

  def const_like(self, b: ConstType | tuple[ConstType, ...]) -> UOp: return UOp.const(self.dtype, b)

  def ufix(self, x: Any) -> UOp:
    """Turn a Python number into a constant of this UOp's dtype (bool/int/float aware)."""
    if isinstance(x, UOp): return x
    if isinstance(x, float) and not dtypes.is_float(self.dtype) and not math.isclose(x, int(x)) and math.isfinite(x):
      raise UOpError(f"cannot combine the float {x} with the {self.dtype} UOp {self.render()} without a cast")
    return self.const_like(x)

  def alu(self, op: Ops, *src: UOp) -> UOp:
    srcs = (self, *src)
    if op in GroupOp.Comparison: out = dtypes.bool.vec(self.dtype.count) if self.dtype.count > 1 else dtypes.bool
    elif op is Ops.WHERE: out = srcs[1].dtype
    else: out = self.dtype
    return UOp(op, out, srcs)

  def _binop(self, op: Ops, x: Any, reverse: bool) -> UOp:
    other = self.ufix(x)
    return other.alu(op, self) if reverse else self.alu(op, other)

  def __add__(self, x: Any) -> UOp: return self._binop(Ops.ADD, x, False)
  def __radd__(self, x: Any) -> UOp: return self._binop(Ops.ADD, x, True)
  def __sub__(self, x: Any) -> UOp: return self._binop(Ops.ADD, -self.ufix(x), False) if dtypes.is_int(self.dtype) else self._binop(Ops.SUB, x, False)
  def __rsub__(self, x: Any) -> UOp: return self.ufix(x) + (-self) if dtypes.is_int(self.dtype) else self._binop(Ops.SUB, x, True)
  def __mul__(self, x: Any) -> UOp: return self._binop(Ops.MUL, x, False)
  def __rmul__(self, x: Any) -> UOp: return self._binop(Ops.MUL, x, True)
  def __floordiv__(self, x: Any) -> UOp: return self._binop(Ops.IDIV, x, False)
  def __rfloordiv__(self, x: Any) -> UOp: return self._binop(Ops.IDIV, x, True)
  def __truediv__(self, x: Any) -> UOp: return self._binop(Ops.FDIV, x, False)
  def __rtruediv__(self, x: Any) -> UOp: return self._binop(Ops.FDIV, x, True)
  def __mod__(self, x: Any) -> UOp: return self._binop(Ops.MOD, x, False)
  def __rmod__(self, x: Any) -> UOp: return self._binop(Ops.MOD, x, True)
  def __and__(self, x: Any) -> UOp: return self._binop(Ops.AND, x, False)
  def __rand__(self, x: Any) -> UOp: return self._binop(Ops.AND, x, True)
  def __or__(self, x: Any) -> UOp: return self._binop(Ops.OR, x, False)
  def __ror__(self, x: Any) -> UOp: return self._binop(Ops.OR, x, True)
  def __xor__(self, x: Any) -> UOp: return self._binop(Ops.XOR, x, False)
  def __rxor__(self, x: Any) -> UOp: return self._binop(Ops.XOR, x, True)
  def __lshift__(self, x: Any) -> UOp: return self._binop(Ops.SHL, x, False)
  def __rshift__(self, x: Any) -> UOp: return self._binop(Ops.SHR, x, False)
  def __lt__(self, x: Any) -> UOp: return self._binop(Ops.CMPLT, x, False)  # type: ignore[override]
  def __gt__(self, x: Any) -> UOp: return self._binop(Ops.CMPLT, x, True)  # type: ignore[override]
  def __ge__(self, x: Any) -> UOp: return (self < x).logical_not()  # type: ignore[override]
  def __le__(self, x: Any) -> UOp: return (self > x).logical_not()  # type: ignore[override]
  def __neg__(self) -> UOp:
    if dtypes.is_bool(self.dtype): raise UOpError("negation of a bool UOp; use logical_not()")
    return self * -1 if dtypes.is_int(self.dtype) else self.alu(Ops.NEG)
  __hash__ = object.__hash__
  __eq__ = object.__eq__

  def eq(self, x: Any) -> UOp: return self._binop(Ops.CMPEQ, x, False)
  def ne(self, x: Any) -> UOp: return self._binop(Ops.CMPNE, x, False)
  def logical_not(self) -> UOp: return self.ne(True)
  def maximum(self, x: Any) -> UOp: return self._binop(Ops.MAX, x, False)
  def minimum(self, x: Any) -> UOp: return -(-self).maximum(-self.ufix(x))
  def where(self, t: Any, f: Any) -> UOp:
    tt = t if isinstance(t, UOp) else f.ufix(t) if isinstance(f, UOp) else UOp.const(dtypes.from_py(t), t)
    return self.alu(Ops.WHERE, tt, tt.ufix(f))
  def cast(self, dtype: DType) -> UOp: return self if self.dtype is dtype else UOp(Ops.CAST, dtype, (self,))
  def bitcast(self, dtype: DType) -> UOp: return self if self.dtype is dtype else UOp(Ops.BITCAST, dtype, (self,))
  def gep(self, i: int | tuple[int, ...]) -> UOp:
    idx = (i,) if isinstance(i, int) else tuple(i)
    if self.dtype.vcount == 1 and idx == (0,): return self
    return UOp(Ops.GEP, self.dtype.scalar().vec(len(idx)), (self,), idx)
  def vectorize(self, *srcs: UOp) -> UOp:
    return UOp(Ops.VECTORIZE, self.dtype.vec(1 + len(srcs)), (self, *srcs))
  def index(self, idx: UOp, valid: UOp | None = None) -> UOp:
    return UOp(Ops.INDEX, self.dtype, (self, idx) if valid is None else (self, idx, valid))
  def load(self, *src: UOp, dtype: DType | None = None) -> UOp:
    return UOp(Ops.LOAD, dtype if dtype is not None else self.dtype.base, (self, *src))
  def store(self, value: UOp, *src: UOp) -> UOp: return UOp(Ops.STORE, dtypes.void, (self, value, *src))
  def reciprocal(self) -> UOp: return self.alu(Ops.RECIPROCAL)
  def sqrt(self) -> UOp: return self.alu(Ops.SQRT)
  def exp2(self) -> UOp: return self.alu(Ops.EXP2)
  def log2(self) -> UOp: return self.alu(Ops.LOG2)
  def sin(self) -> UOp: return self.alu(Ops.SIN)
  def trunc(self) -> UOp: return self.alu(Ops.TRUNC)

  # ---- tensor graph (stage 1): shapes, devices and movement, checked where they are written (uop/shape.py)
  @property
  def shape(self) -> tuple[sint, ...] | None:
    from plugrad.uop.shape import shape_of
    return shape_of(self)

  @property
  def tensor_device(self) -> Any:
    from plugrad.uop.shape import device_of
    return device_of(self)

  def _mop(self, op: Ops, arg: tuple) -> UOp:
    from plugrad.uop.shape import ShapeError, check_movement
    if (shape := self.shape) is None: raise ShapeError(f"{op.name.lower()} of a {self.op.name}, which has no shape")
    check_movement(op, shape, arg)
    if op in (Ops.RESHAPE, Ops.EXPAND) and arg == shape: return self
    if (op is Ops.PERMUTE and arg == tuple(range(len(arg)))) or (op is Ops.FLIP and not any(arg)): return self
    if op is Ops.PAD and all(p == (0, 0) for p in arg): return self
    if op is Ops.SHRINK and all(se == (0, d) for se, d in zip(arg, shape)): return self
    return UOp(op, self.dtype, (self,), arg)

  def reshape(self, shape: tuple[sint, ...]) -> UOp: return self._mop(Ops.RESHAPE, tuple(shape))
  def expand(self, shape: tuple[sint, ...]) -> UOp: return self._mop(Ops.EXPAND, tuple(shape))
  def permute(self, order: tuple[int, ...]) -> UOp: return self._mop(Ops.PERMUTE, tuple(order))
  def pad(self, padding: tuple[tuple[sint, sint], ...]) -> UOp: return self._mop(Ops.PAD, tuple((b, a) for b, a in padding))
  def shrink(self, bounds: tuple[tuple[sint, sint], ...]) -> UOp: return self._mop(Ops.SHRINK, tuple((b, e) for b, e in bounds))
  def flip(self, axes: tuple[bool, ...]) -> UOp: return self._mop(Ops.FLIP, tuple(bool(x) for x in axes))

  def reduce_axis(self, op: Ops, axes: tuple[int, ...]) -> UOp:
    """REDUCE_AXIS over `axes` (kept as size 1). An empty `axes` is no reduction."""
    shape = self.shape or ()
    axes = tuple(sorted({a + len(shape) if a < 0 else a for a in axes}))
    if any(not 0 <= a < len(shape) for a in axes):
      from plugrad.uop.shape import ShapeError, fmt
      raise ShapeError(f"reduce axes {axes} out of range for shape {fmt(shape)}")
    return self if not axes else UOp(Ops.REDUCE_AXIS, self.dtype, (self,), (op, axes))

  # ---- symbolic
  @staticmethod
  def variable(name: str, min_val: ConstType, max_val: ConstType, dtype: DType = dtypes.index) -> UOp:
    if not isinstance(name, str) or not name: raise UOpError(f"a Variable needs a non-empty str name, got {name!r}")
    if not isinstance(min_val, int) or not isinstance(max_val, int):
      raise UOpError(f"Variable {name!r}: bounds must be ints, got {min_val!r}, {max_val!r}")
    if min_val > max_val: raise UOpError(f"Variable {name!r}: min {min_val} is greater than max {max_val}")
    return UOp(Ops.DEFINE_VAR, dtype, (), (name, min_val, max_val))

  @staticmethod
  def range(end: sint, axis_id: int, axis_type: AxisType = AxisType.LOOP, dtype: DType = dtypes.index) -> UOp:
    return UOp(Ops.RANGE, dtype, (end if isinstance(end, UOp) else UOp.const(dtype, end),), (axis_id, axis_type))

  @staticmethod
  def special(end: sint, name: str, dtype: DType = dtypes.index) -> UOp:
    return UOp(Ops.SPECIAL, dtype, (end if isinstance(end, UOp) else UOp.const(dtype, end),), name)

  def bind(self, val: int) -> UOp:
    if self.op is not Ops.DEFINE_VAR: raise UOpError(f"only a Variable can be bound, not {self.op!r}")
    name, lo, hi = self.arg
    if not isinstance(val, int) or isinstance(val, bool): raise UOpError(f"Variable {name!r} must be bound to an int, got {val!r}")
    if not lo <= val <= hi: raise UOpError(f"value {val} is out of the range [{lo}, {hi}] of Variable {name!r}")
    return UOp(Ops.BIND, self.dtype, (self, self.const_like(val)))

  def unbind(self) -> tuple[UOp, int]:
    if self.op is not Ops.BIND: raise UOpError(f"unbind needs a BIND, got {self.op!r}")
    return self.src[0], self.src[1].arg

  @property
  def expr(self) -> str:
    if self.op is not Ops.DEFINE_VAR: raise UOpError(f"expr is the name of a Variable, not of {self.op!r}")
    return self.arg[0]

  def variables(self) -> list[UOp]:
    """The DEFINE_VARs this graph uses (BINDs count as their variable), sorted by name."""
    found = {u.src[0] if u.op is Ops.BIND else u: None for u in self.toposort if u.op in (Ops.DEFINE_VAR, Ops.BIND)}
    return sorted(found, key=lambda v: v.arg)

  @functools.cached_property
  def _min_max(self) -> tuple[Any, Any]:
    from plugrad.uop.bounds import min_max
    return min_max(self)

  @property
  def vmin(self) -> Any: return self._min_max[0]
  @property
  def vmax(self) -> Any: return self._min_max[1]

  def simplify(self, name: str = "simplify") -> UOp:
    from plugrad.uop.rewrite import graph_rewrite
    from plugrad.uop.symbolic import symbolic
    # one memo for the process: a node's simplified form depends only on its subgraph, and UOps are unique, so the
    # kernels of the next training step (the same index expressions over the same numbered ranges) look each node up
    # instead of rewriting it again (a ResNet-18 step's scheduling spent half its time here); started afresh when full
    global _SIMPLIFIED
    if (done := _SIMPLIFIED.get(self)) is not None: return done
    # a new dict, not clear(): a rewrite under way (another thread's, or one whose rule simplifies) keeps the old one
    if len(_SIMPLIFIED) > SIMPLIFY_MEMO_MAX: _SIMPLIFIED = {}
    return graph_rewrite(self, symbolic, name=name, cache=_SIMPLIFIED)

  def render(self, simplify: bool = True) -> str:
    """A short human-readable expression, e.g. `((a*4)+b)` (for shapes, names and errors)."""
    from plugrad.uop.render_expr import render_expr
    return render_expr(self.simplify() if simplify else self)

  def const_factor(self) -> int:
    """The largest known integer factor of this expression (1 when nothing is known)."""
    if self.op is Ops.CONST: return self.arg if isinstance(self.arg, int) and not isinstance(self.arg, bool) else 1
    if self.op is Ops.ADD: return math.gcd(self.src[0].const_factor(), self.src[1].const_factor())
    if self.op is Ops.MUL and self.src[1].op is Ops.CONST: return abs(self.src[1].arg) if isinstance(self.src[1].arg, int) else 1
    if self.op is Ops.MUL and self.src[0].op is Ops.CONST: return abs(self.src[0].arg) if isinstance(self.src[0].arg, int) else 1
    return 1

  def divides(self, v: int) -> UOp | None:
    """`self // v` when v divides self exactly (structurally), else None."""
    if v == 1: return self
    if self.op is Ops.CONST: return self.const_like(self.arg // v) if self.arg % v == 0 else None
    if self.op is Ops.ADD:
      a, b = self.src[0].divides(v), self.src[1].divides(v)
      return a + b if a is not None and b is not None else None
    if self.op is Ops.MUL:
      if (a := self.src[0].divides(v)) is not None: return a * self.src[1]
      if (b := self.src[1].divides(v)) is not None: return self.src[0] * b
    return None


# the setters of UOp's field slots, for __new__
_set_op, _set_dtype, _set_src, _set_arg, _set_key = (UOp.__dict__[n].__set__ for n in ("op", "dtype", "src", "arg", "_key"))


def Variable(name: str, min_val: int, max_val: int, dtype: DType = dtypes.index) -> UOp:
  """A symbolic integer `name` in [min_val, max_val] (a DEFINE_VAR UOp)."""
  return UOp.variable(name, min_val, max_val, dtype)


# ---- evaluating ALU ops on Python values (constant folding, bounds, the PYTHON interpreter)

def _wrap(dtype: DType) -> Callable[[Any], Any]:
  s = dtype.scalar()
  if s is dtypes.bool: return bool
  if s is dtypes.index: return int
  if dtypes.is_int(s): return functools.partial(dtypes.as_const, dt=s)
  if s is dtypes.float32: return functools.partial(_round_via, fmt="<f")
  if s is dtypes.float16: return functools.partial(_round_via, fmt="<e")
  if s is dtypes.bfloat16: return _round_bf16
  return float


def _round_via(x: float, fmt: str) -> float:
  if not math.isfinite(x): return x
  try: return struct.unpack(fmt, struct.pack(fmt, x))[0]
  except OverflowError: return math.copysign(math.inf, x)


def round_bf16(x: float) -> float:
  """`x` rounded to float32, then to bfloat16 (nearest, ties to even): constant folding's twin of the codegen's
  emulation (`round_bf16_bits` in codegen/decompose.py), which every device without native bfloat16 runs."""
  return _round_bf16(x)


def _round_bf16(x: float) -> float:
  if not math.isfinite(x): return x
  bits = struct.unpack("<I", struct.pack("<f", _round_via(x, "<f")))[0]
  bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round to nearest even
  return struct.unpack("<f", struct.pack("<I", bits))[0]


def _safe(fn: Callable[..., float], *a: float) -> float:
  try: return fn(*a)
  except (ValueError, ZeroDivisionError): return math.nan
  except OverflowError: return math.inf


def _fdiv(a: Any, b: Any) -> Any:
  if b == 0:
    if a == 0 or a != a: return math.nan
    return math.copysign(math.inf, a) * math.copysign(1.0, b)
  return a / b


def _idiv(a: int, b: int) -> int: return cdiv(a, b) if b != 0 else 0
def _imod(a: int, b: int) -> int: return cmod(a, b) if b != 0 else 0


def _log2(x: float) -> float:
  if x != x or x < 0: return math.nan
  return -math.inf if x == 0 else math.inf if x == math.inf else math.log2(x)


def _exp2(x: float) -> float:
  if x != x: return x
  return _safe(lambda v: 2.0 ** v, x) if x < 1100 else math.inf


def _sin(x: float) -> float: return math.nan if not math.isfinite(x) else math.sin(x)
def _sqrt(x: float) -> float: return math.nan if x != x or x < 0 else math.sqrt(x)
def _recip(x: float) -> float: return _fdiv(1.0, x)
def _trunc(x: Any) -> Any: return x if not isinstance(x, float) or not math.isfinite(x) else float(math.trunc(x))
def _max(a: Any, b: Any) -> Any: return a if a != a else b if b != b else max(a, b)


def _pow(a: Any, b: Any) -> Any:
  if isinstance(a, float) or isinstance(b, float): return _safe(math.pow, a, b)
  return a ** b if b >= 0 else 0 if abs(a) != 1 else a ** b


def _shr(a: int, b: int) -> int: return a >> b
def _shl(a: int, b: int) -> int: return a << b


python_alu: dict[Ops, Callable[..., Any]] = {
  Ops.EXP2: _exp2, Ops.LOG2: _log2, Ops.SIN: _sin, Ops.SQRT: _sqrt, Ops.RECIPROCAL: _recip, Ops.TRUNC: _trunc,
  Ops.NEG: lambda x: (not x) if isinstance(x, bool) else -x,
  Ops.ADD: lambda a, b: a + b, Ops.SUB: lambda a, b: a - b, Ops.MUL: lambda a, b: a * b, Ops.FDIV: _fdiv,
  Ops.IDIV: _idiv, Ops.MOD: _imod, Ops.MAX: _max, Ops.POW: _pow,
  Ops.CMPLT: lambda a, b: a < b, Ops.CMPNE: lambda a, b: a != b, Ops.CMPEQ: lambda a, b: a == b,
  Ops.AND: lambda a, b: a & b, Ops.OR: lambda a, b: a | b, Ops.XOR: lambda a, b: a ^ b, Ops.SHL: _shl, Ops.SHR: _shr,
  Ops.WHERE: lambda c, t, f: t if c else f, Ops.MULACC: lambda a, b, c: a * b + c,
}


def lane_gate(u: UOp) -> UOp | None:
  """The vector gate (one bool per lane) of a masked vector access through pointer `u` (an INDEX with one index and a
  gate of several lanes: `Renderer.masked_access`, docs/ir.md), or None when its gate, if any, is one bool."""
  return u.src[2] if u.op is Ops.INDEX and len(u.src) == 3 and u.src[1].dtype.count == 1 and u.src[2].dtype.count > 1 else None


def reduce_identity(op: Ops, dt: DType) -> float | int | bool:
  """The value a REDUCE of `op` over `dt` starts from (and a padded element of its input holds)."""
  if op is Ops.ADD: return 0
  if op is Ops.MUL: return 1
  if op is Ops.MAX: return -math.inf if dtypes.is_float(dt) else dtypes.min(dt)
  raise ValueError(f"no identity for a {op.name} reduction")


def exec_alu(op: Ops, dtype: DType, operands: tuple[Any, ...], arg: Any = None) -> Any:
  """Evaluate one ALU op on Python scalars (or tuples, elementwise) with the C semantics of `dtype` (`arg`: the UOp's,
  which only THREEFRY reads)."""
  if dtype.count > 1:
    return tuple(exec_alu(op, dtype.scalar(), tuple(o[i] if isinstance(o, tuple) else o for o in operands), arg) for i in range(dtype.count))
  if op is Ops.THREEFRY: return threefry2x32(_Word(operands[0]), _Word(operands[1]), arg[0], _Word)[arg[1]].v
  return _wrap(dtype)(python_alu[op](*operands))


THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_W = TypeVar("_W")


def threefry2x32(x0: _W, x1: _W, key: int, const: Callable[[int], _W]) -> tuple[_W, _W]:
  """Threefry-2x32 with 20 rounds (Salmon et al. 2011): the two output words for the counter words (x0, x1) and the
  64-bit `key`, from wrapping 32-bit `+ ^ | << >>` only. The one definition of THREEFRY: the codegen runs it on uint32
  UOps (`const` makes a constant; codegen/decompose.py), the constant folder on `_Word`s."""
  k0, k1 = key & 0xFFFFFFFF, (key >> 32) & 0xFFFFFFFF
  ks = (k0, k1, 0x1BD11BDA ^ k0 ^ k1)
  x0, x1 = x0 + const(ks[0]), x1 + const(ks[1])  # type: ignore[operator]
  for i in range(5):
    for r in THREEFRY_ROTATIONS[i % 2]:
      x0 = x0 + x1  # type: ignore[operator]
      x1 = ((x1 << const(r)) | (x1 >> const(32 - r))) ^ x0  # type: ignore[operator]
    x0, x1 = x0 + const(ks[(i + 1) % 3]), x1 + const((ks[(i + 2) % 3] + i + 1) & 0xFFFFFFFF)  # type: ignore[operator]
  return x0, x1


class _Word:
  """A uint32 Python value with C's wrapping operators (what `threefry2x32` uses)."""
  __slots__ = ("v",)
  def __init__(self, v: int): self.v = v & 0xFFFFFFFF
  def __add__(self, o: _Word) -> _Word: return _Word(self.v + o.v)
  def __xor__(self, o: _Word) -> _Word: return _Word(self.v ^ o.v)
  def __or__(self, o: _Word) -> _Word: return _Word(self.v | o.v)
  def __lshift__(self, o: _Word) -> _Word: return _Word(self.v << o.v)
  def __rshift__(self, o: _Word) -> _Word: return _Word(self.v >> o.v)


# ---- printing

def pretty_print(root: UOp, max_nodes: int = 400) -> str:
  """Nested, indented form; a node used more than once is printed once and then referred to by its number."""
  topo = root.toposort
  uses: dict[UOp, int] = {}
  for u in topo:
    for s in u.src: uses[s] = uses.get(s, 0) + 1
  shared = {u: i for i, u in enumerate(u for u in topo if uses.get(u, 0) > 1 and u.src)}
  printed: set[UOp] = set()
  budget = [max_nodes]

  def fmt(u: UOp, depth: int) -> str:
    pad = "  " * depth
    if u in printed: return f"{pad}<x{shared[u]}>"
    budget[0] -= 1
    if budget[0] < 0: return f"{pad}..."
    if u in shared: printed.add(u)
    label = f"x{shared[u]}:=" if u in shared else ""
    head = f"{pad}{label}UOp({u.op!r}, {u.dtype!r}, arg={u.arg!r}"
    if not u.src: return head + ", src=())"
    inner = ",\n".join(fmt(s, depth + 2) for s in u.src)
    return f"{head}, src=(\n{inner}))"
  return fmt(root, 0)


def uop_from_python(code: str) -> UOp:
  """Rebuild a graph from `UOp.to_python()` output."""
  import plugrad.dtype as dtype_mod
  ns: dict[str, Any] = {"UOp": UOp, "Ops": Ops, "dtypes": dtypes, "AddrSpace": AddrSpace, "AxisType": AxisType, "KernelInfo": KernelInfo,
                        "inf": math.inf, "nan": math.nan, "DType": dtype_mod.DType, "PtrDType": PtrDType}
  exec(code, ns)
  return ns["ret"]


def iter_ranges(u: UOp) -> Iterator[UOp]:
  """The RANGE uops a graph depends on, in first-use order."""
  return (x for x in u.toposort if x.op is Ops.RANGE)

