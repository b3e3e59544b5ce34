"""The PYTHON device: a reference interpreter of linear programs, the oracle other devices are checked against.

`PythonCompiler` parses the text `PythonRenderer` wrote and validates it (the binary is that text); `PythonRuntime`
loads it into a `PythonProgram`, which executes every thread of a launch in lockstep: each uop's value is a numpy
array over the threads (plus a trailing axis for vectors), loops run once for all threads (their bounds must agree),
IF blocks narrow a mask of active threads, and barriers hold trivially. Because lockstep execution would hide the
bugs a real GPU exposes, the interpreter checks what it can instead: out-of-bounds accesses, reads of uninitialized
local or register memory, local memory races between barriers, barriers and WMMAs in divergent code, and launch
sizes that disagree with the kernel's SPECIALs. Each raises with the kernel, the uop and the thread.

ALU semantics are C's, per dtype, and agree with `exec_alu` (the constant folder): integers wrap, IDIV truncates,
MOD takes the dividend's sign; floats compute in float64 and round once to their dtype; MAX is numpy's (nan wins).
Like a hardware device, the interpreter leaves integer division by 0 or -1 and out-of-range shifts to the guards the
codegen writes (codegen/decompose.py), and has no THREEFRY (lowered to 32-bit integer ops), no vectors of addresses
(split into scalar accesses: a pointer is one address, a vector access the contiguous elements from it) and no bfloat16
(float32 values rounded by integer ops, uint16 memory: it runs the emulation every device without bfloat16 runs). Where C and
IEEE 754 differ from `exec_alu`, float POW of 0 to a negative power is inf (not nan).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from plugrad.backend import (
  AddrSpace,
  Allocator,
  BufferSpec,
  CompileError,
  Compiler,
  Dims,
  DType,
  GroupOp,
  LaunchError,
  Ops,
  PtrDType,
  Runtime,
  TensorCore,
  UnknownTensorCoreError,
  UOp,
  dtypes,
  find_tensor_core,
  prod,
)

from .python_renderer import TARGETS, Line, SourceSyntaxError, Target, parse_text

# ---- dtypes in numpy (bfloat16 never reaches the interpreter: the codegen emulates it, codegen/decompose.py)

def _np(dt: DType) -> np.dtype: return dtypes.to_numpy(dt.scalar())


def _round(x: np.ndarray, dt: DType) -> np.ndarray:
  """float64 results rounded once to the float dtype `dt`."""
  return x.astype(_np(dt), copy=False)


# ---- ALU semantics on arrays

def _int_div(a: np.ndarray, b: np.ndarray, signed: bool) -> np.ndarray:
  q = np.floor_divide(a, b)
  if signed: q = q + ((q * b != a) & ((a < 0) != (b < 0))).astype(a.dtype)  # floor → truncation toward zero
  return q


def _int_pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  # a**b for b >= 0 (wrapping); for b < 0 only |a| == 1 gives a nonzero integer
  out = np.power(a, np.where(b < 0, 0, b).astype(a.dtype))
  if not np.issubdtype(a.dtype, np.signedinteger): return out
  neg = np.where(a == 1, 1, np.where(a == -1, np.where(b % 2 == 0, 1, -1), 0)).astype(a.dtype)
  return np.where(b < 0, neg, out)


def _shift(a: np.ndarray, b: np.ndarray, left: bool) -> np.ndarray:
  sh = b.astype(a.dtype)  # numpy shifts need one dtype (an amount out of range is unselected by the codegen's guard)
  return np.left_shift(a, sh) if left else np.right_shift(a, sh)


def _log2(x: np.ndarray) -> np.ndarray:
  # a negative operand gives the positive quiet NaN, as the renderers write it: numpy's own sign for it follows the SIMD
  # code it picks for the machine (-nan on AVX-512, +nan on AVX2), and a reference must not depend on the machine
  return np.where(x < 0, np.array(np.nan, x.dtype), np.log2(x))


_COMMON: dict[Ops, Callable[..., np.ndarray]] = {
  Ops.ADD: np.add, Ops.SUB: np.subtract, Ops.MUL: np.multiply, Ops.NEG: np.negative, Ops.MAX: np.maximum, Ops.MULACC: lambda a, b, c: a * b + c,
}
_INT_ALU: dict[Ops, Callable[..., np.ndarray]] = {
  **_COMMON, Ops.AND: np.bitwise_and, Ops.OR: np.bitwise_or, Ops.XOR: np.bitwise_xor, Ops.TRUNC: lambda x: x, Ops.POW: _int_pow,
  Ops.IDIV: lambda a, b: _int_div(a, b, np.issubdtype(a.dtype, np.signedinteger)),
  Ops.MOD: lambda a, b: a - b * _int_div(a, b, np.issubdtype(a.dtype, np.signedinteger)),
  Ops.SHL: lambda a, b: _shift(a, b, True), Ops.SHR: lambda a, b: _shift(a, b, False),
}
_FLOAT_ALU: dict[Ops, Callable[..., np.ndarray]] = {
  **_COMMON, Ops.FDIV: np.divide, Ops.POW: np.power, Ops.EXP2: np.exp2, Ops.LOG2: _log2, Ops.SIN: np.sin, Ops.SQRT: np.sqrt,
  Ops.RECIPROCAL: lambda x: 1.0 / x, Ops.TRUNC: np.trunc,
}
# bool arithmetic as C's (bool)(a op b): + and max are or, * is and, - is xor, -a is !a, a**b is a || !b
_BOOL_ALU: dict[Ops, Callable[..., np.ndarray]] = {
  Ops.ADD: np.logical_or, Ops.MAX: np.logical_or, Ops.OR: np.logical_or, Ops.MUL: np.logical_and, Ops.AND: np.logical_and,
  Ops.SUB: np.logical_xor, Ops.XOR: np.logical_xor, Ops.NEG: np.logical_not, Ops.POW: lambda a, b: a | ~b,
  Ops.MULACC: lambda a, b, c: (a & b) | c,
}


def alu(op: Ops, dt: DType, xs: Sequence[np.ndarray]) -> np.ndarray:
  """One ALU op on arrays in the compute representation of their dtypes; `dt` is the result dtype."""
  if op is Ops.WHERE:
    c, t, f = xs
    return np.where(c[..., None] if c.ndim < t.ndim else c, t, f)
  if op in GroupOp.Comparison: return np.less(*xs) if op is Ops.CMPLT else np.not_equal(*xs) if op is Ops.CMPNE else np.equal(*xs)
  s = dt.scalar()
  if s is dtypes.bool: return _BOOL_ALU[op](*xs)
  if dtypes.is_int(s): return _INT_ALU[op](*xs).astype(_np(s), copy=False)
  return _round(_FLOAT_ALU[op](*(x.astype(np.float64) for x in xs)), s)


def cast(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
  """C conversion of each element; float → int truncates (and wraps like `dtypes.as_const`; nan and inf give 0)."""
  s, d = src.scalar(), dst.scalar()
  if d is dtypes.bool: return x != 0
  if dtypes.is_float(d): return x.astype(_np(d))
  nd = _np(d)
  if not dtypes.is_float(s): return x.astype(nd)
  f = np.trunc(x.astype(np.float64))
  f = np.where(np.isfinite(f), f, 0.0)
  small = np.abs(f) < 2.0**63
  out = np.where(small, f, 0.0).astype(np.int64).astype(nd)
  if small.all(): return out
  r = np.fmod(f, 2.0**64)  # exact: big doubles are multiples of their ulp, so is the remainder
  big = np.where(small, 0.0, np.where(r < 0, r + 2.0**64, r)).astype(np.uint64).astype(nd)
  return np.where(small, out, big)


def bitcast(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
  n = x.shape[0]
  y = np.ascontiguousarray(x).reshape(n, -1).view(np.uint8).view(_np(dst))
  return y.reshape(n) if dst.count == 1 else y


# ---- the compiler: parse and validate

_FLOAT_ONLY = frozenset({Ops.FDIV, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.TRUNC})
_INT_ONLY = frozenset({Ops.IDIV, Ops.MOD, Ops.SHL, Ops.SHR})
_ARITY = {**{op: 1 for op in GroupOp.Unary}, **{op: 2 for op in GroupOp.Binary}, **{op: 3 for op in GroupOp.Ternary}}
_DTYPE_CAP = {dtypes.float16: "float16", dtypes.bfloat16: "bfloat16", dtypes.float64: "float64", dtypes.int64: "int64", dtypes.uint64: "int64"}
_SPECIALS = {f"{k}idx{i}" for k in "gl" for i in range(3)}


@dataclass
class Program:
  """A validated linear program, ready to execute."""
  name: str
  target: Target
  lines: tuple[Line, ...]
  ends: dict[int, int] = field(default_factory=dict)              # RANGE/IF → its ENDRANGE/ENDIF
  frees: list[list[int]] = field(default_factory=list)            # values dead after each line
  tcs: dict[int, TensorCore] = field(default_factory=dict)
  slots: tuple[int, ...] = ()                                     # DEFINE_GLOBAL slots, sorted: the order of handles
  variables: tuple[tuple[str, int, int], ...] = ()                # DEFINE_VAR args sorted by name: the order of vals
  specials: frozenset[str] = frozenset()


def _is_value(dt: DType) -> bool: return not isinstance(dt, PtrDType) and dt.scalar() is not dtypes.void
def _is_int(dt: DType) -> bool: return _is_value(dt) and dtypes.is_int(dt)
def _int_arg(x: Any) -> bool: return isinstance(x, int) and not isinstance(x, bool)


def _const_ok(v: Any, dt: DType) -> bool:
  s = dt.scalar()
  if s is dtypes.bool: return isinstance(v, bool)
  if dtypes.is_int(s): return _int_arg(v) and dtypes.min(s) <= v <= dtypes.max(s)
  return isinstance(v, float)


def _rule(p: Program, i: int, l: Line) -> str | None:
  """What is wrong with line `i`, or None."""
  op, dt, arg = l.op, l.dtype, l.arg
  sd = [p.lines[j].dtype for j in l.src]
  n = len(sd)
  if op in GroupOp.ALU:
    if n != _ARITY[op]: return f"{op.name} needs {_ARITY[op]} sources, got {n}"
    if not all(_is_value(d) for d in sd): return f"{op.name} sources must be values"
    if op in GroupOp.Comparison:
      return None if sd[0] is sd[1] and dt is dtypes.bool.vec(sd[0].count) else f"{op.name} needs 2 sources of one dtype, a bool result"
    if op is Ops.WHERE:
      ok = sd[0].scalar() is dtypes.bool and sd[0].count in (1, dt.count) and sd[1] is dt and sd[2] is dt
      return None if ok else "WHERE needs a bool condition and two values of its dtype"
    if op is Ops.THREEFRY: return "THREEFRY is lowered to 32-bit integer ops by the codegen (codegen/decompose.py)"
    if op in (Ops.SHL, Ops.SHR): ok = sd[0] is dt and _is_int(dt) and _is_int(sd[1]) and sd[1].count == dt.count
    else: ok = all(d is dt for d in sd)
    if not ok: return f"{op.name} sources do not match its dtype {dt!r}"
    if op in _FLOAT_ONLY and not dtypes.is_float(dt): return f"{op.name} needs a float dtype"
    if op in _INT_ONLY and not dtypes.is_int(dt): return f"{op.name} needs an integer dtype"
    return f"{op.name} needs an integer or bool dtype" if op in (Ops.AND, Ops.OR, Ops.XOR) and dtypes.is_float(dt) else None
  if op in (Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL, Ops.DEFINE_REG):
    space = {Ops.DEFINE_GLOBAL: AddrSpace.GLOBAL, Ops.DEFINE_LOCAL: AddrSpace.LOCAL, Ops.DEFINE_REG: AddrSpace.REG}[op]
    if n or not isinstance(dt, PtrDType) or dt.addrspace is not space or dt.v != 1:
      return f"{op.name} needs a {space.name} pointer dtype and no sources"
    if op is not Ops.DEFINE_GLOBAL and dt.size <= 0: return f"{op.name} needs a known size"
    return None if (isinstance(arg, str) if op is Ops.DEFINE_LOCAL else _int_arg(arg) and arg >= 0) else f"{op.name} has a bad arg {arg!r}"
  if op is Ops.DEFINE_VAR:
    ok = isinstance(arg, tuple) and len(arg) == 3 and isinstance(arg[0], str) and _int_arg(arg[1]) and _int_arg(arg[2]) and arg[1] <= arg[2]
    return None if ok and not n and _is_int(dt) and dt.count == 1 else "DEFINE_VAR needs an integer dtype and arg (name, min, max)"
  if op is Ops.SPECIAL:
    ok = arg in _SPECIALS and n == 1 and _is_int(dt) and dt.count == 1 and sd[0] is dt
    return None if ok else "SPECIAL needs arg gidxN/lidxN and a size of its dtype"
  if op is Ops.CONST: return None if not n and _is_value(dt) and dt.count == 1 and _const_ok(arg, dt) else f"CONST {arg!r} does not fit {dt!r}"
  if op is Ops.VCONST:
    ok = isinstance(arg, tuple) and len(arg) == dt.count > 1 and all(_const_ok(v, dt) for v in arg)
    return None if ok and not n and _is_value(dt) else f"VCONST {arg!r} does not fit {dt!r}"
  if op is Ops.RANGE: return None if n == 1 and _is_int(dt) and dt.count == 1 and sd[0] is dt else "RANGE needs an integer bound of its dtype"
  if op is Ops.IF: return None if n and sd[0] is dtypes.bool and all(d is dtypes.void for d in sd[1:]) else "IF needs a bool condition"
  if op in (Ops.ENDRANGE, Ops.ENDIF, Ops.BARRIER): return None if dt is dtypes.void else f"{op.name} has dtype void"
  if op is Ops.INDEX:
    if not 2 <= n <= 3 or not isinstance(sd[0], PtrDType) or sd[0].v != 1 or not _is_int(sd[1]): return "INDEX needs (pointer, integer index[, gate])"
    if sd[1].count != 1: return f"INDEX by a vector of {sd[1].count} indices: the codegen splits vectors of addresses (codegen/decompose.py)"
    if n == 3 and sd[2].scalar() is not dtypes.bool: return "INDEX gate must be a bool, or one bool per lane of a vector access"
    return None if isinstance(dt, PtrDType) and dt.base.scalar() is sd[0].base.scalar() else "INDEX must keep the pointer's element type"
  if op in (Ops.LOAD, Ops.STORE):
    if not n or not isinstance(sd[0], PtrDType): return f"{op.name} needs a pointer first"
    val = dt if op is Ops.LOAD else sd[1] if n == 2 else dtypes.void
    if op is Ops.STORE and (n != 2 or dt is not dtypes.void): return "STORE needs (pointer, value) and dtype void"
    if op is Ops.STORE and arg is not None and (arg is not Ops.ADD or sd[1].count != 1 or sd[1] is dtypes.bool or sd[0].addrspace is AddrSpace.REG):
      return "an atomic STORE (arg Ops.ADD) adds one non-bool scalar into global or local memory"
    if not _is_value(val) or val.scalar() is not sd[0].base.scalar(): return f"{op.name} value must have the pointer's element type"
    if op is Ops.LOAD and not all(d is dtypes.void for d in sd[2 if n > 1 and sd[1] is not dtypes.void else 1:]): return "LOAD takes (pointer[, alt])"
    return "LOAD alt must have the load's dtype" if op is Ops.LOAD and n > 1 and sd[1] is not dtypes.void and sd[1] is not dt else None
  if op is Ops.CAST:
    if n != 1: return "CAST needs 1 source"
    if isinstance(dt, PtrDType): return None if isinstance(sd[0], PtrDType) and sd[0].base.scalar() is dt.base.scalar() else "bad pointer CAST"
    return None if _is_value(dt) and _is_value(sd[0]) and sd[0].count == dt.count else "CAST needs a value of the same width"
  if op is Ops.BITCAST:
    ok = n == 1 and _is_value(dt) and _is_value(sd[0]) and dtypes.bool not in (dt.scalar(), sd[0].scalar()) and dt.itemsize == sd[0].itemsize
    return None if ok else "BITCAST needs a non-bool value of the same byte size"
  if op in (Ops.VECTORIZE, Ops.GEP) and isinstance(dt, PtrDType):
    return f"{op.name} of pointers (a vector of addresses): the codegen splits them (codegen/decompose.py)"
  if op is Ops.VECTORIZE: return None if n == dt.vcount and all(d is dt.scalar() for d in sd) else f"VECTORIZE needs {dt.vcount} {dt.scalar()!r}"
  if op is Ops.GEP:
    ok = n == 1 and isinstance(arg, tuple) and len(arg) > 0 and all(_int_arg(g) and 0 <= g < sd[0].vcount for g in arg)
    return None if ok and dt is sd[0].scalar().vec(len(arg)) else "GEP needs lane indices of its source"
  if op is Ops.WMMA:
    try: tc = find_tensor_core(arg)
    except UnknownTensorCoreError as e: return str(e)
    if tc not in p.target.tensor_cores: return f"{tc.device}/{tc.name} is not a tensor core of target {p.target.name}"
    def held(d: DType) -> DType: return dtypes.float32 if d is dtypes.bfloat16 else d  # emulated bfloat16: float32 fragments
    want = (held(tc.dtype_in).vec(tc.elements[0]), held(tc.dtype_b).vec(tc.elements[1]), tc.dtype_out.vec(tc.elements[2]))
    if tuple(sd) != want or dt is not want[2]: return f"WMMA {tc.name} needs fragments {want} and returns {want[2]!r}"
    p.tcs[i] = tc
    return None
  if op in (Ops.CUSTOM, Ops.CUSTOMI): return f"{op.name} holds device code ({arg!r}) that the interpreter cannot run"
  return f"{op.name} is not allowed in a linear program"


def check_program(text: str) -> Program:
  """Parse and validate a rendered program; every problem raises CompileError naming the line."""
  try: parsed = parse_text(text)
  except SourceSyntaxError as e: raise CompileError(str(e)) from None
  if parsed.target not in TARGETS: raise CompileError(f"line 2: unknown target {parsed.target!r}; known: {sorted(TARGETS)}")
  p = Program(parsed.name, TARGETS[parsed.target], parsed.lines)
  def fail(l: Line, why: str) -> CompileError: return CompileError(f"line {l.lineno}: {why} (uop #{l.text.split()[0]}: {l.text})")
  blocks: list[int] = []
  scope: list[tuple[int, ...]] = []
  slots: set[int] = set()
  names: dict[str, int] = {}
  local_bytes = 0
  for i, l in enumerate(p.lines):
    for j in l.src:
      if scope[j] != tuple(blocks[:len(scope[j])]):
        raise fail(l, f"uses uop #{j}, which was defined inside a {p.lines[scope[j][-1]].op.name} block that has been closed")
    if (why := _rule(p, i, l)) is not None: raise fail(l, why)
    dt = l.dtype.base if isinstance(l.dtype, PtrDType) else l.dtype
    if dt.scalar() is dtypes.bfloat16: raise fail(l, "bfloat16 is emulated by the codegen (codegen/decompose.py), never run as itself")
    if (cap := _DTYPE_CAP.get(dt.scalar())) is not None and cap not in p.target.dtypes:
      raise fail(l, f"target {p.target.name} has no {dt.scalar()!r}")
    # a block's opener and closer belong to the enclosing scope (uops after a loop may order themselves after its ENDRANGE)
    scope.append(tuple(blocks[:-1]) if l.op in (Ops.ENDRANGE, Ops.ENDIF) else tuple(blocks))
    if l.op in (Ops.RANGE, Ops.IF): blocks.append(i)
    elif l.op in (Ops.ENDRANGE, Ops.ENDIF):
      want = Ops.RANGE if l.op is Ops.ENDRANGE else Ops.IF
      if len(l.src) != 1 or not blocks or blocks[-1] != l.src[0] or p.lines[l.src[0]].op is not want:
        raise fail(l, f"{l.op.name} must close the innermost open block, a {want.name}")
      p.ends[blocks.pop()] = i
    elif l.op is Ops.DEFINE_GLOBAL:
      if l.arg in slots: raise fail(l, f"two DEFINE_GLOBALs use slot {l.arg}")
      slots.add(l.arg)
    elif l.op is Ops.DEFINE_VAR:
      if names.setdefault(l.arg[0], i) != i: raise fail(l, f"two DEFINE_VARs are named {l.arg[0]!r}")
    elif l.op is Ops.DEFINE_LOCAL:
      local_bytes += l.dtype.size * l.dtype.base.itemsize  # type: ignore[attr-defined]
      if local_bytes > p.target.shared_max: raise fail(l, f"{local_bytes} bytes of local memory exceed the {p.target.shared_max} of {p.target.name}")
  if blocks: raise fail(p.lines[blocks[-1]], "this block is never closed")
  p.slots, p.variables = tuple(sorted(slots)), tuple(sorted(p.lines[i].arg for i in names.values()))
  p.specials = frozenset(l.arg for l in p.lines if l.op is Ops.SPECIAL)
  # a value lives until its last use; a use inside a loop that the value was defined outside of keeps it to the loop's end
  last = list(range(len(p.lines)))
  for u, l in enumerate(p.lines):
    for j in l.src:
      outer = [b for b in scope[u][len(scope[j]):] if p.lines[b].op is Ops.RANGE]
      last[j] = max(last[j], p.ends[outer[0]] if outer else u)
  p.frees = [[] for _ in p.lines]
  for j, at in enumerate(last): p.frees[at].append(j)
  return p


# ---- memory

class Ptr(NamedTuple):
  """A pointer value (one address per thread): the scalar position into `mem` ((T,); None: 0) and the gate ((T,), or
  (T, lanes) for a masked vector access (Renderer.masked_access); None: always)."""
  mem: Mem
  pos: np.ndarray | None
  gate: np.ndarray | None


class Mem:
  """One buffer as the interpreter sees it: flat storage of `instances` copies of `size` scalars (one per workgroup for
  local memory, one per thread for registers), with the bookkeeping that catches uninitialized reads and races."""
  def __init__(self, label: str, dt: DType, arr: np.ndarray, size: int, owner: np.ndarray | None, track_init: bool, track_races: bool):
    self.label, self.dt, self.arr, self.size, self.owner = label, dt, arr, size, owner
    self.init = np.zeros(arr.shape[0], bool) if track_init else None
    self.writer = np.full(arr.shape[0], -1, np.int64) if track_races else None
    self.reader = np.full(arr.shape[0], -1, np.int64) if track_races else None

  def reset_races(self, groups: np.ndarray) -> None:
    """A barrier passed by the workgroups `groups` (bool per workgroup): accesses before it no longer race."""
    if self.writer is None or self.reader is None: return
    live = np.repeat(groups, self.size)
    self.writer[live] = -1
    self.reader[live] = -1


def _bits(x: np.ndarray) -> np.ndarray:
  """Values as unsigned ints of their width, so that equal nans compare equal."""
  x = np.ascontiguousarray(x)
  return x.view(f"u{x.dtype.itemsize}")


def _as_handle(h: Any, slot: int) -> np.ndarray:
  if not (isinstance(h, np.ndarray) and h.dtype == np.uint8 and h.ndim == 1 and h.flags.c_contiguous):
    raise LaunchError(f"buffer slot {slot}: expected a PYTHON buffer handle (a 1-D uint8 numpy array), got {type(h).__name__}")
  return h


# ---- execution of one launch

class _Launch:
  def __init__(self, prog: Program, handles: Sequence[Any], gs: Dims, ls: Dims, vals: Sequence[int]):
    self.p, self.gs, self.ls = prog, gs, ls
    self.L, G = prod(ls), prod(gs)
    self.T = G * self.L
    t = np.arange(self.T, dtype=np.int64)
    self.tid, self.wg = t, t // self.L
    self.G = G
    self.globals = dict(zip(prog.slots, handles))
    self.vals = {var[0]: val for var, val in zip(prog.variables, vals)}
    self.locals: list[Mem] = []
    self.v: list[Any] = [None] * len(prog.lines)
    self.mask: np.ndarray | None = None

  # -- messages
  def thread(self, t: int) -> str:
    lid, wg = int(t % self.L), int(t // self.L)
    g = (wg % self.gs[0], wg // self.gs[0] % self.gs[1], wg // (self.gs[0] * self.gs[1]))
    loc = (lid % self.ls[0], lid // self.ls[0] % self.ls[1], lid // (self.ls[0] * self.ls[1]))
    return f"gidx={g} lidx={loc}"

  def error(self, pc: int, what: str) -> LaunchError:
    l = self.p.lines[pc]
    return LaunchError(f"kernel {self.p.name!r}, uop #{pc} ({l.op.name}, line {l.lineno}): {what}")

  def coord(self, name: str) -> np.ndarray:
    dims, lin = (self.gs, self.wg) if name[0] == "g" else (self.ls, self.tid % self.L)
    d = int(name[-1])
    return lin // prod(dims[:d]) % dims[d]

  def full(self, value: Any, dt: DType) -> np.ndarray:
    x = np.array(value, _np(dt))
    return np.broadcast_to(x, (self.T,) + x.shape)

  # -- memory access
  def access(self, pc: int, ptr: Ptr, width: int, verb: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(addresses (T, width), active (T, width) or None for all) of a `width`-element access through `ptr` (a vector:
    the contiguous elements from its address)."""
    mem = ptr.mem
    addr = (np.zeros(self.T, np.int64) if ptr.pos is None else ptr.pos)[:, None] + np.arange(width)
    active: np.ndarray | None = None
    if ptr.gate is not None and ptr.gate.ndim == 2:  # one gate per lane: a masked vector access
      if ptr.gate.shape[1] != width: raise self.error(pc, f"{verb} of {width} lanes through a gate of {ptr.gate.shape[1]} lanes")
      active = ptr.gate
    elif ptr.gate is not None: active = np.repeat(ptr.gate.reshape(self.T, 1), width, axis=1)
    if self.mask is not None: active = self.mask[:, None] & (active if active is not None else True)
    bad = (addr < 0) | (addr >= mem.size)
    if active is not None: bad &= active
    if bad.any():
      t, k = (int(x[0]) for x in np.nonzero(bad))
      raise self.error(pc, f"out-of-bounds {verb} of {mem.label} ({mem.size} elements of {mem.dt!r}): index {int(addr[t, k])} "
                           f"by thread {self.thread(t)}" + (f" and {int(bad.sum()) - 1} more" if bad.sum() > 1 else ""))
    if mem.owner is not None: addr = addr + mem.owner[:, None] * mem.size
    return addr, active

  def load(self, pc: int, l: Line) -> np.ndarray:
    ptr, width = self.v[l.src[0]], l.dtype.count
    alt = self.v[l.src[1]] if len(l.src) > 1 and self.p.lines[l.src[1]].dtype is not dtypes.void else None
    addr, active = self.access(pc, ptr, width, "LOAD")
    mem = ptr.mem
    used = addr if active is None else addr[active]
    if mem.init is not None and not mem.init[used].all():
      raise self.error(pc, f"LOAD of {mem.label} reads memory no thread has written" + self.who(mem, addr, active, ~mem.init[addr]))
    if mem.writer is not None: self.check_race(pc, mem, addr, active, mem.writer, "reads", "written")
    # every access of an empty buffer is gated off (checked above): there is no element 0 to stand in for them
    out = mem.arr[addr if active is None else np.where(active, addr, 0)] if mem.arr.size else np.zeros(addr.shape, mem.arr.dtype)
    if active is not None: out = np.where(active, out, alt.reshape(self.T, width) if alt is not None else np.zeros((), out.dtype))
    if mem.reader is not None: self.mark_readers(mem, addr, active)
    return out.reshape(self.T) if width == 1 else out

  def store(self, pc: int, l: Line) -> None:
    ptr, val = self.v[l.src[0]], self.v[l.src[1]]
    width = self.p.lines[l.src[1]].dtype.count
    addr, active = self.access(pc, ptr, width, "STORE")
    mem = ptr.mem
    val = np.broadcast_to(val.reshape(self.T, width), (self.T, width))
    if l.arg is Ops.ADD:  # atomic: every thread's add lands, in any order; atomics never race with each other
      if active is not None: addr, val = addr[active], val[active]
      np.add.at(mem.arr, addr.reshape(-1), val.reshape(-1))
      if mem.init is not None: mem.init[addr] = True
      return
    if mem.writer is not None and mem.reader is not None:
      self.check_race(pc, mem, addr, active, mem.reader, "writes", "read")
      self.check_race(pc, mem, addr, active, mem.writer, "writes", "written", val)
    tids = np.broadcast_to(self.tid[:, None], addr.shape)
    if active is not None: addr, val, tids = addr[active], val[active], tids[active]
    addr, val, tids = addr.reshape(-1), val.reshape(-1), tids.reshape(-1)
    if mem.writer is not None and addr.size > 1:
      o = np.argsort(addr, kind="stable")
      bits = _bits(val[o])
      clash = (addr[o][1:] == addr[o][:-1]) & (tids[o][1:] != tids[o][:-1]) & (bits[1:] != bits[:-1])
      if clash.any():
        k = int(np.nonzero(clash)[0][0])
        raise self.error(pc, f"race on {mem.label}: threads {self.thread(int(tids[o][k]))} and {self.thread(int(tids[o][k + 1]))} write different "
                             f"values to address {int(addr[o][k]) % mem.size} at once")
    mem.arr[addr] = val
    if mem.init is not None: mem.init[addr] = True
    if mem.writer is not None: mem.writer[addr] = tids

  def who(self, mem: Mem, addr: np.ndarray, active: np.ndarray | None, bad: np.ndarray) -> str:
    if active is not None: bad = bad & active
    t, k = (int(x[0]) for x in np.nonzero(bad))
    return f" (thread {self.thread(t)}, address {int(addr[t, k]) % mem.size})"

  def check_race(self, pc: int, mem: Mem, addr: np.ndarray, active: np.ndarray | None, owners: np.ndarray, verb: str, past: str,
                 val: np.ndarray | None = None) -> None:
    """Local memory touched by another thread since the last barrier is a race (a write of the same value is not)."""
    o = owners[addr]
    bad = (o != -1) & (o != self.tid[:, None])
    if val is not None: bad &= _bits(mem.arr[addr]) != _bits(val)
    if active is not None: bad &= active
    if bad.any():
      t, k = (int(x[0]) for x in np.nonzero(bad))
      other = f"thread {self.thread(int(o[t, k]))}" if o[t, k] >= 0 else "other threads"
      raise self.error(pc, f"race on {mem.label}: thread {self.thread(t)} {verb} address {int(addr[t, k]) % mem.size} that {other} {past} "
                           "since the last BARRIER")

  def mark_readers(self, mem: Mem, addr: np.ndarray, active: np.ndarray | None) -> None:
    if mem.reader is None: return
    a = addr if active is None else addr[active]
    r = np.broadcast_to(self.tid[:, None], addr.shape)
    r = r if active is None else r[active]
    lo, hi = np.full(mem.reader.shape, np.iinfo(np.int64).max), np.full(mem.reader.shape, -1)
    np.minimum.at(lo, a.reshape(-1), r.reshape(-1))
    np.maximum.at(hi, a.reshape(-1), r.reshape(-1))
    touched = np.unique(a)
    new = np.where(lo[touched] == hi[touched], lo[touched], -2)  # -2: several threads
    old = mem.reader[touched]
    mem.reader[touched] = np.where(old == -1, new, np.where(old == new, old, -2))

  # -- the main loop
  def run(self) -> None:
    p, v = self.p, self.v
    loops: list[list[int]] = []  # [range pc, trips, iteration]
    masks: list[np.ndarray | None] = []
    pc, n = 0, len(p.lines)
    while pc < n:
      l = p.lines[pc]
      op = l.op
      if op is Ops.RANGE:
        trips = self.trips(pc, v[l.src[0]])
        if trips <= 0:
          pc = p.ends[pc]
          for j in p.frees[pc]: v[j] = None
          pc += 1
          continue
        loops.append([pc, trips, 0])
        v[pc] = self.full(0, l.dtype)
      elif op is Ops.ENDRANGE:
        top = loops[-1]
        top[2] += 1
        if top[2] < top[1]:
          v[top[0]] = self.full(top[2], p.lines[top[0]].dtype)
          pc = top[0] + 1
          continue
        loops.pop()
      elif op is Ops.IF:
        masks.append(self.mask)
        self.mask = v[l.src[0]] if self.mask is None else self.mask & v[l.src[0]]
      elif op is Ops.ENDIF: self.mask = masks.pop()
      else: v[pc] = _EXEC[op](self, pc, l)
      for j in p.frees[pc]: v[j] = None
      pc += 1

  def trips(self, pc: int, bound: np.ndarray) -> int:
    live = bound if self.mask is None else bound[self.mask]
    if live.size == 0: return 0
    lo, hi = int(live.min()), int(live.max())
    if lo != hi: raise self.error(pc, f"the loop bound differs between threads ({lo} to {hi}); the interpreter needs uniform loop bounds")
    return lo

  # -- uops
  def special(self, pc: int, l: Line) -> np.ndarray:
    size = self.v[l.src[0]]
    launch = (self.gs if l.arg[0] == "g" else self.ls)[int(l.arg[-1])]
    if (size != launch).any():
      raise self.error(pc, f"SPECIAL {l.arg} has size {int(size.flat[0])}, but the launch gives {launch} "
                           f"(global_size={self.gs}, local_size={self.ls})")
    return self.coord(l.arg).astype(_np(l.dtype))

  def define(self, pc: int, l: Line) -> Ptr:
    dt: PtrDType = l.dtype  # type: ignore[assignment]
    base = dt.base.scalar()
    per = dt.base.count
    if l.op is Ops.DEFINE_GLOBAL:
      h = _as_handle(self.globals[l.arg], l.arg)
      item = _np(base).itemsize
      have = h.nbytes // item
      if dt.size >= 0 and have < dt.size * per:
        raise self.error(pc, f"buffer slot {l.arg} holds {have} elements of {base!r}, the kernel declares {dt.size * per}")
      arr = h[:have * item].view(_np(base))
      return Ptr(Mem(f"buffer slot {l.arg}", base, arr, dt.size * per if dt.size >= 0 else have, None, False, False), None, None)
    size = dt.size * per
    local = l.op is Ops.DEFINE_LOCAL
    owner = self.wg if local else self.tid
    arr = np.zeros((self.G if local else self.T) * size, _np(base))
    mem = Mem(f"local buffer {l.arg!r}" if local else f"register array {l.arg}", base, arr, size, owner, True, local)
    if local: self.locals.append(mem)
    return Ptr(mem, None, None)

  def index(self, pc: int, l: Line) -> Ptr:
    base: Ptr = self.v[l.src[0]]
    idx = self.v[l.src[1]].astype(np.int64) * self.p.lines[l.src[0]].dtype.base.count
    pos = idx if base.pos is None else base.pos + idx
    gate = self.v[l.src[2]] if len(l.src) == 3 else None
    if base.gate is not None: gate = base.gate if gate is None else gate & (base.gate if gate.ndim == 1 else base.gate[:, None])
    return Ptr(base.mem, pos, gate)

  def vectorize(self, pc: int, l: Line) -> Any:
    xs = [self.v[j] for j in l.src]
    return np.stack(xs, axis=-1) if len(xs) > 1 else xs[0]

  def gep(self, pc: int, l: Line) -> Any:
    x, sel = self.v[l.src[0]], list(l.arg)
    if x.ndim == 1: return x
    return x[:, sel[0]] if len(sel) == 1 else x[:, sel]

  def barrier(self, pc: int, l: Line) -> None:
    if self.mask is None: groups = np.ones(self.G, bool)
    else:
      m = self.mask.reshape(self.G, self.L)
      if (partial := m.any(1) & ~m.all(1)).any():
        wg = int(np.nonzero(partial)[0][0])
        raise self.error(pc, f"BARRIER in divergent code: only some threads of workgroup {wg} reach it (e.g. {self.thread(wg * self.L)} "
                             f"{'does' if m[wg, 0] else 'does not'})")
      groups = np.asarray(m.all(1))
    for mem in self.locals: mem.reset_races(groups)

  def wmma(self, pc: int, l: Line) -> np.ndarray:
    tc = self.p.tcs[pc]
    if self.L % tc.threads: raise self.error(pc, f"WMMA {tc.name} needs workgroups of a multiple of {tc.threads} threads, the launch has {self.L}")
    g = self.T // tc.threads
    if self.mask is not None and ((m := self.mask.reshape(g, tc.threads)).any(1) & ~m.all(1)).any():
      raise self.error(pc, f"WMMA {tc.name} in divergent code: every lane of a group of {tc.threads} must execute it")
    mats = []
    for frag, layout, shape, what in ((l.src[0], tc.a_layout, (tc.m, tc.k), "A"), (l.src[1], tc.b_layout, (tc.k, tc.n), "B"),
                                      (l.src[2], tc.c_layout, (tc.m, tc.n), "C")):
      lay = np.array(layout)
      x = self.v[frag].astype(np.float64).reshape(g, tc.threads, -1)
      mat = np.zeros((g, *shape))
      mat[:, lay[..., 0], lay[..., 1]] = x
      # lanes that hold the same element (AMD's replicated inputs) must agree
      back = mat[:, lay[..., 0], lay[..., 1]]
      if not ((back == x) | (np.isnan(back) & np.isnan(x))).all():
        raise self.error(pc, f"WMMA {tc.device}/{tc.name}: lanes holding the same element of {what} disagree (the layout repeats it)")
      mats.append(mat)
    d = mats[0] @ mats[1] + mats[2]
    lay = np.array(tc.c_layout)
    return _round(d[:, lay[..., 0], lay[..., 1]].reshape(self.T, -1), tc.dtype_out)

  def value(self, pc: int, l: Line) -> np.ndarray:
    op, src = l.op, [self.v[j] for j in l.src]
    if op is Ops.CAST: return src[0] if isinstance(l.dtype, PtrDType) else cast(src[0], self.p.lines[l.src[0]].dtype, l.dtype)
    if op is Ops.BITCAST: return bitcast(src[0], self.p.lines[l.src[0]].dtype, l.dtype)
    return alu(op, l.dtype, src)


def _const(x: _Launch, pc: int, l: Line) -> np.ndarray: return x.full(l.arg, l.dtype)
def _var(x: _Launch, pc: int, l: Line) -> np.ndarray: return x.full(x.vals[l.arg[0]], l.dtype)


_EXEC: dict[Ops, Callable[[_Launch, int, Line], Any]] = {
  **{op: _Launch.value for op in GroupOp.ALU | {Ops.CAST, Ops.BITCAST}},
  Ops.CONST: _const, Ops.VCONST: _const, Ops.DEFINE_VAR: _var, Ops.SPECIAL: _Launch.special,
  Ops.DEFINE_GLOBAL: _Launch.define, Ops.DEFINE_LOCAL: _Launch.define, Ops.DEFINE_REG: _Launch.define,
  Ops.INDEX: _Launch.index, Ops.LOAD: _Launch.load, Ops.STORE: _Launch.store, Ops.BARRIER: _Launch.barrier,
  Ops.VECTORIZE: _Launch.vectorize, Ops.GEP: _Launch.gep, Ops.WMMA: _Launch.wmma,
}


# ---- the device components

_MAX_THREADS = 1 << 24  # lockstep execution holds arrays of this length per live value


def _launch_dims(x: Any, what: str) -> Dims:
  if not isinstance(x, Sequence) or not 1 <= len(x) <= 3 or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in x):
    raise LaunchError(f"{what} must be 1 to 3 positive ints, got {x!r}")
  d = (*x, 1, 1)
  return (d[0], d[1], d[2])


class PythonProgram:
  """A loaded PYTHON kernel: call it with buffer handles (slot order), launch sizes and variable values."""
  def __init__(self, prog: Program):
    self.prog, self.name = prog, prog.name

  def __repr__(self) -> str: return f"<PythonProgram {self.name!r} for {self.prog.target.name}>"

  def __call__(self, *handles: Any, global_size: Dims = (1, 1, 1), local_size: Dims = (1, 1, 1), vals: tuple[int, ...] = (),
               wait: bool = False) -> float | None:
    p, t = self.prog, self.prog.target
    gs, ls = _launch_dims(global_size, "global_size"), _launch_dims(local_size, "local_size")
    def fail(why: str) -> LaunchError: return LaunchError(f"kernel {self.name!r}: {why}")
    if len(handles) != len(p.slots): raise fail(f"takes {len(p.slots)} buffers (slots {list(p.slots)}), got {len(handles)}")
    if len(vals) != len(p.variables): raise fail(f"takes {len(p.variables)} variable values ({[v[0] for v in p.variables]}), got {len(vals)}")
    for (name, lo, hi), val in zip(p.variables, vals):
      if not isinstance(val, int) or isinstance(val, bool) or not lo <= val <= hi:
        raise fail(f"variable {name!r} = {val!r} is not an int in [{lo}, {hi}]")
    if any(l > m for l, m in zip(ls, t.local_max)) or prod(ls) > t.max_threads:
      raise fail(f"local_size {ls} exceeds the limits of {t.name} ({t.local_max}, {t.max_threads} threads per workgroup)")
    if any(g > m for g, m in zip(gs, t.global_max)): raise fail(f"global_size {gs} exceeds the limits of {t.name} ({t.global_max})")
    for kind, dims in (("gidx", gs), ("lidx", ls)):
      for i, d in enumerate(dims):
        if d > 1 and f"{kind}{i}" not in p.specials: raise fail(f"the launch has {d} along {kind}{i}, but the kernel has no SPECIAL {kind}{i}")
    if prod(gs) * prod(ls) > _MAX_THREADS: raise fail(f"{prod(gs) * prod(ls)} threads are more than the interpreter runs at once ({_MAX_THREADS})")
    st = time.perf_counter()
    with np.errstate(all="ignore"): _Launch(p, handles, gs, ls, vals).run()
    return time.perf_counter() - st if wait else None


class PythonCompiler(Compiler):
  """Validates a rendered PYTHON program; the binary is its text. Errors name the line."""
  cache_key = "plugrad-python-interpreter-v1"

  def compile(self, src: str) -> bytes:
    check_program(src)
    return src.encode()


def _flat(mv: memoryview) -> memoryview:
  if not isinstance(mv, memoryview): raise TypeError(f"expected a memoryview, got {type(mv).__name__}")
  return mv if mv.format == "B" and mv.ndim == 1 else mv.cast("B")


class PythonAllocator(Allocator[np.ndarray]):
  """Host memory. A handle is a 1-D uint8 numpy array; `_offset` views share its memory, `_as_memoryview` is zero-copy."""
  def _alloc(self, nbytes: int, options: BufferSpec | None) -> np.ndarray: return np.zeros(nbytes, np.uint8)
  def _free(self, handle: np.ndarray, nbytes: int, options: BufferSpec | None) -> None: pass  # numpy frees it with the last reference

  def _copyin(self, handle: np.ndarray, src: memoryview) -> None:
    data = np.frombuffer(_flat(src), np.uint8)
    if data.size != handle.size: raise ValueError(f"{self.device}: copyin of {data.size} bytes into a buffer of {handle.size}")
    handle[:] = data

  def _copyout(self, dest: memoryview, handle: np.ndarray) -> None:
    out = _flat(dest)
    if out.nbytes != handle.size: raise ValueError(f"{self.device}: copyout of a buffer of {handle.size} bytes into {out.nbytes}")
    out[:] = handle.data

  def _transfer(self, dest: np.ndarray, src: np.ndarray, nbytes: int, src_dev: Allocator, dest_dev: Allocator) -> None:
    dest[:nbytes] = src[:nbytes]  # between PYTHON instances (PYTHON:1, ...): host memory on both ends

  def _offset(self, handle: np.ndarray, offset: int, nbytes: int) -> np.ndarray:
    if offset < 0 or nbytes < 0 or offset + nbytes > handle.size:
      raise ValueError(f"{self.device}: a view of {nbytes} bytes at offset {offset} does not fit a buffer of {handle.size} bytes")
    return handle[offset:offset + nbytes]

  def _as_memoryview(self, handle: np.ndarray, nbytes: int) -> memoryview:
    if nbytes != handle.size: raise ValueError(f"{self.device}: asked for {nbytes} bytes of a buffer of {handle.size}")
    return handle.data


class PythonRuntime(Runtime):
  """Loads PYTHON binaries (validated program text) into `PythonProgram`s; everything runs synchronously."""
  capabilities = frozenset({"run", "timing"})

  def __init__(self, device: str):
    if not isinstance(device, str) or not device: raise TypeError(f"PythonRuntime needs the device name as a non-empty str, got {device!r}")
    self.device = device

  def load(self, program: UOp) -> PythonProgram:
    binary: Any = program.binary  # type: ignore[attr-defined]  # ProgramUOp accessor
    try: text = binary.decode()
    except UnicodeDecodeError as e: raise CompileError(f"kernel {program.name!r}: the binary is not PYTHON program text ({e})") from None  # type: ignore[attr-defined]
    return PythonProgram(check_program(text))
