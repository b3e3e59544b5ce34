"""`CStyleRenderer`: the base of every C-family renderer (CPU C, CUDA, Metal, HIP). It turns a LINEAR program into one
kernel function; a backend subclasses it and writes only its dialect: type names, qualifiers, intrinsics and launch
indices.

What the base does, with the C semantics of the PYTHON interpreter (`builtin/interpreter.py`), per dtype:

* values used once in their own block are inlined, all others (loads, vectors, values used twice) become named locals;
* every ALU op: narrow integers are cast back to their type (C promotes them to int), 16-bit float results are
  rounded to their type (C may keep excess precision), and bool arithmetic is logic (`+` is or, `*` is and). The
  integer division and shift guards, nan-propagating MAX and THREEFRY are written out before rendering by the shared
  passes (codegen/decompose.py), so `/ % << >>` are C's plain operators;
* float → int casts truncate, give 0 for nan/inf and wrap huge values (like the interpreter); bitcasts go through a union;
* pointers are tracked per lane (buffer, element index, gate): a vector INDEX or VECTORIZE of pointers is a gather,
  a wide LOAD/STORE through one address is a contiguous vector access, gates become `g ? p[i] : alt` and `if (g)`;
* loops (RANGE/ENDRANGE), IF/ENDIF, DEFINE_REG (plain variables when only constant indices reach them), DEFINE_LOCAL
  and BARRIER through hooks, SPECIAL through `render_special`, vector ALU ops natively or lane by lane.

The signature is the buffers in slot order (`const` when only read), then the variables in `program.vars` order
(DEFINE_VARs sorted by name), then `extra_params()`. Dialect hooks are the attributes and `render_*` methods below;
`need(key, code)` adds a helper or typedef to the prelude once. `render` works on a shallow copy, so one renderer may
render from several threads.
"""
from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from plugrad.dtype import DType, PtrDType, dtypes
from plugrad.renderer.base import PURE, Renderer, RendererError, and_gates, index_parts, linear_parts, use_analysis
from plugrad.uop.ops import GroupOp, Ops, UOp, lane_gate, round_bf16

C_KEYWORDS = frozenset("auto break case char const continue default do double else enum extern float for goto if inline int long register "
                       "restrict return short signed sizeof static struct switch typedef union unsigned void volatile while bool true false "
                       "half kernel device global local constant".split())


def c_identifier(name: str) -> str:
  """`name` as a C identifier (the kernel's symbol): other characters become `_`, a leading digit or keyword gets a prefix."""
  out = re.sub(r"\W", "_", name, flags=re.ASCII) or "kernel"
  return f"k_{out}" if out[0].isdigit() or out in C_KEYWORDS else out


@dataclass(frozen=True)
class Ptr:
  """A pointer value (one address: the codegen splits vectors of addresses into lanes): the buffer's name, the element
  index (None: element 0), the gate (None: always) and the scalar dtype of the memory it points into."""
  base: str
  idx: str | None
  gate: str | None
  elem: DType
  var: bool = False  # `base` is a plain variable (a DEFINE_REG kept in registers), not an array


_INFIX = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.FDIV: "/", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^",
          Ops.CMPLT: "<", Ops.CMPNE: "!=", Ops.CMPEQ: "=="}
_BOOL = {Ops.ADD: "({0}||{1})", Ops.MAX: "({0}||{1})", Ops.OR: "({0}||{1})", Ops.MUL: "({0}&&{1})", Ops.AND: "({0}&&{1})",
         Ops.SUB: "({0}!={1})", Ops.XOR: "({0}!={1})", Ops.NEG: "(!{0})", Ops.POW: "({0}||!{1})", Ops.MULACC: "(({0}&&{1})||{2})",
         Ops.TRUNC: "{0}"}
_INT_INFIX = {Ops.IDIV: "/", Ops.MOD: "%", Ops.SHL: "<<", Ops.SHR: ">>"}  # guarded before rendering (codegen/decompose.py)
# float MAX reaches a renderer only when it claims `nan_max`: its `render_math("fmax")` must propagate nan
_MATH = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt", Ops.TRUNC: "trunc", Ops.POW: "pow", Ops.MULACC: "fma",
         Ops.MAX: "fmax"}
_PREFIX = {Ops.LOAD: "val", Ops.CAST: "cast", Ops.BITCAST: "cast", Ops.VECTORIZE: "vec", Ops.GEP: "gep", Ops.VCONST: "vconst", Ops.WMMA: "wmma",
           Ops.CUSTOM: "custom"}
SHORT_NAMES: dict[DType, str] = {dtypes.bool: "bool", dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.int16: "short", dtypes.uint16: "ushort",
                                 dtypes.int32: "int", dtypes.uint32: "uint", dtypes.int64: "long", dtypes.uint64: "ulong", dtypes.float16: "half",
                                 dtypes.bfloat16: "bf16", dtypes.float32: "float", dtypes.float64: "double"}


def float32_repr(x: float) -> str:
  """The shortest decimal that reads back as the float32 nearest to `x` (numpy's repr, which C parses to the same float)."""
  return str(np.float32(x))


class CStyleRenderer(Renderer):
  """The C-family base. Subclasses set the dialect attributes and override the `render_*` hooks they need."""
  kernel_prefix = ""                    # before `void name(...)`, e.g. 'extern "C" __global__ '
  helper_prefix = "static inline "      # before every helper function
  barrier: str | None = None            # the workgroup barrier statement; None: BARRIER is an error
  # `(p+i)[c]` for an index `i+c`: the addresses of one row (i shared, c constant) share a base register. With 32-bit
  # wrapping ints (-fwrapv) a C compiler may not fold `c` into the address after sign extension, and keeps a pointer
  # per address instead (a 8x32 matmul tile spilled 32 of them, one extra load per FMA pair)
  offset_addressing = False
  native_math = GroupOp.Transcendental  # the math library's exp2, log2, sin
  full_pow = True  # C's pow (a dialect whose pow is undefined below zero sets False)
  type_map: dict[DType, str] = {dtypes.bool: "bool", dtypes.int8: "signed char", dtypes.uint8: "unsigned char", dtypes.int16: "short",
                                dtypes.uint16: "unsigned short", dtypes.int32: "int", dtypes.uint32: "unsigned int", dtypes.int64: "long long",
                                dtypes.uint64: "unsigned long long", dtypes.float16: "half", dtypes.bfloat16: "__bf16", dtypes.float32: "float",
                                dtypes.float64: "double"}

  # ---- dialect hooks: types
  def compute_dtype(self, dt: DType) -> DType:
    """The scalar dtype whose C type holds values of scalar `dt` (float32 where a 16-bit float is emulated)."""
    return dt

  def storage_dtype(self, dt: DType) -> DType:
    """The scalar dtype of `dt` in memory (uint16 where a 16-bit float is emulated)."""
    return dt

  def vector_name(self, dt: DType) -> str: return f"{SHORT_NAMES[dt.scalar()]}{dt.count}"

  def vector_typedef(self, dt: DType, name: str) -> str | None:
    """The definition of vector type `name` for `dt` (None: the dialect has it built in). Portable default: a struct."""
    return f"typedef struct {{ {self.type_map[dt.scalar()]} v[{dt.count}]; }} {name};"

  def render_vectorize(self, dt: DType, parts: Sequence[str]) -> str: return f"(({self.tname(dt)}){{{{{','.join(parts)}}}}})"
  def render_gep(self, x: str, dt: DType, i: int) -> str: return f"{x}.v[{i}]"
  def native_vector_op(self, op: Ops, dt: DType) -> bool:
    """Whether `a op b` (an arithmetic/bitwise infix op or NEG) works on whole vectors of C-level dtype `dt` with the scalar
    semantics and no rounding or narrowing to add (else the base renders it lane by lane)."""
    return False

  def mask_type(self, operand: DType, value: DType) -> str | None:
    """The C type of the lane mask `a < b` gives on vectors of C-level dtype `operand`, when a WHERE can choose between
    vectors of `value` with it by bit selection (lanes of the same count and size); None (the default): the comparison
    makes a bool vector and the WHERE goes lane by lane."""
    return None

  def render_vector_alu(self, op: Ops, dt: DType, args: Sequence[str]) -> str | None:
    """`op` on whole vectors of C-level dtype `dt` as one native expression (e.g. a vector fused multiply-add), or None
    for the base's handling (native infix operators, else lane by lane)."""
    return None

  def to_storage(self, x: str, dt: DType) -> str: return x    # a scalar value of dtype `dt` → its memory representation
  def from_storage(self, x: str, dt: DType) -> str: return x  # and back

  # ---- dialect hooks: values
  def render_math(self, fn: str, dt: DType, args: Sequence[str]) -> str:
    """The libm-style function `fn` (exp2, log2, sin, sqrt, trunc, pow, fma) on float32 or float64 arguments."""
    return f"{fn}{'f' if dt is dtypes.float32 else ''}({','.join(args)})"

  def render_round(self, x: str, dt: DType) -> str:
    """`x` (computed in a wider type) rounded to the 16-bit float `dt`."""
    return f"(({self.type_map[dt]})({x}))"

  def render_special_float(self, v: float, dt: DType) -> str:
    """inf, -inf or nan of float dtype `dt` (C-level)."""
    s = "NAN" if math.isnan(v) else "INFINITY" if v > 0 else "(-INFINITY)"
    return s if dt is dtypes.float32 else f"(({self.tname(dt)}){s})"

  def render_const(self, v: float | int | bool, dt: DType) -> str:
    """A scalar constant of dtype `dt`, typed as its C-level value."""
    if dt is dtypes.bool: return "1" if v else "0"
    if dtypes.is_float(dt):
      cd = self.compute_dtype(dt)
      if math.isinf(v) or math.isnan(v): return self.render_special_float(float(v), cd)
      if dt is dtypes.float64: s = repr(float(v))
      else:
        x = float(np.float16(v)) if dt is dtypes.float16 else round_bf16(float(v)) if dt is dtypes.bfloat16 else float(v)
        s = float32_repr(x) + "f"
      s = f"({s})" if s.startswith("-") else s
      return s if cd in (dtypes.float32, dtypes.float64) else f"(({self.tname(cd)}){s})"
    v = int(v)
    bits = 8 * dt.itemsize
    if v == -(1 << (bits - 1)) and bits >= 32: return f"({v + 1}{'ll' if bits == 64 else ''}-1)"
    s = f"{v}{'u' if dtypes.is_unsigned(dt) and bits >= 32 else ''}{'ll' if bits == 64 else ''}"
    return f"({s})" if v < 0 else s

  # ---- dialect hooks: the kernel
  def render_buffer_param(self, name: str, dt: DType, slot: int, written: bool) -> str:
    return f"{'' if written else 'const '}{self.tname(dt)}* {name}"

  def render_var_param(self, name: str, dt: DType) -> str: return f"{self.tname(dt)} {name}"
  def extra_params(self) -> list[str]: return []

  def render_special(self, u: UOp, size: str) -> str:
    """The expression of a launch index (`gidxN`: workgroup index, `lidxN`: index in the workgroup) of extent `size`."""
    raise RendererError(f"{type(self).__name__} has no launch indices (SPECIAL {u.arg})")

  def render_local(self, name: str, dt: DType, size: int) -> str:
    raise RendererError(f"{type(self).__name__} has no workgroup memory (DEFINE_LOCAL {name})")

  def render_range(self, u: UOp, name: str, bound: str) -> list[str]:
    """The lines that open the loop `name` over [0, bound) (the base closes it with `}`)."""
    return [f"for ({self.tname(u.dtype)} {name} = 0; {name} < {bound}; {name}++) {{"]

  def render_wmma(self, u: UOp, args: Sequence[str]) -> str:
    raise RendererError(f"{type(self).__name__} has no tensor cores (WMMA {u.arg!r})")

  def render_kernel(self, name: str, params: Sequence[str], body: Sequence[str], prelude: Sequence[str]) -> str:
    head = f"{self.kernel_prefix}void {name}({', '.join(params)}) {{"
    return "\n".join([*prelude, *([""] if prelude else []), head, *body, "}"]) + "\n"

  def order(self, uops: Sequence[UOp]) -> list[UOp]:
    """The uops in the order to render them (a dialect may hoist some, e.g. launch indices that become loops)."""
    return list(uops)

  # ---- helpers for dialects
  def need(self, key: str, code: str) -> None:
    """Put `code` (a helper or a typedef) in the prelude, once per kernel."""
    self._prelude.setdefault(key, code)

  def line(self, s: str) -> None: self._body.append("  " * self._depth + s)

  def open_until_end(self, lines: Sequence[str]) -> None:
    """Emit `lines`, which open a block (`... {`) that stays open to the end of the kernel (e.g. a loop around it all)."""
    self._open(list(lines))
    self._closers += 1

  def tname(self, dt: DType) -> str:
    """The C name of C-level dtype `dt` (scalar or vector; a vector's typedef is added to the prelude)."""
    if dt.count == 1: return self.type_map[dt]
    name = self.vector_name(dt)
    if (td := self.vector_typedef(dt, name)) is not None: self.need(f"type {name}", td)
    return name

  def cdt(self, dt: DType) -> DType:
    """The C-level dtype of values of `dt`."""
    c = self.compute_dtype(dt.scalar())
    return c if dt.count == 1 else c.vec(dt.count)

  def mdt(self, dt: DType) -> DType:
    """The C-level dtype of `dt` in memory."""
    m = self.storage_dtype(dt.scalar())
    return m if dt.count == 1 else m.vec(dt.count)

  def ctype(self, dt: DType) -> str: return self.tname(self.cdt(dt))

  def unique(self, base: str) -> str:
    name = base
    while name in self._names: name += "_"
    self._names.add(name)
    return name

  # ---- rendering
  def render(self, program: UOp) -> str:
    name, uops = linear_parts(program)
    return copy.copy(self)._render(name, uops)

  def _render(self, kname: str, uops: tuple[UOp, ...]) -> str:
    self._prelude: dict[str, str] = {}
    self._body: list[str] = []
    self._depth, self._closers = 1, 0
    self._names: set[str] = set()
    self.r: dict[UOp, str] = {}
    self.ptrs: dict[UOp, Ptr] = {}
    fname = c_identifier(kname)
    self._names.add(fname)
    order = self.order(uops)
    self._analyze(order)
    params: list[str] = []
    for g in sorted((u for u in uops if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg):
      elem = g.dtype.base.scalar()
      self.ptrs[g] = Ptr(n := self.unique(f"data{g.arg}"), None, None, elem)
      params.append(self.render_buffer_param(n, self.storage_dtype(elem), g.arg, g in self._written))
    for v in sorted((u for u in uops if u.op is Ops.DEFINE_VAR), key=lambda u: u.arg[0]):
      self.r[v] = self.unique(c_identifier(v.arg[0]))
      params.append(self.render_var_param(self.r[v], v.dtype))
    params += self.extra_params()
    for i, u in enumerate(order):
      if u.op not in (Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR): self._uop(i, u)
    while self._closers:
      self._close()
      self._closers -= 1
    head = [] if fname == kname else [f"/* kernel {kname.replace('*/', '* /')!r} */"]  # the name as given, when the symbol differs
    return self.render_kernel(fname, params, self._body, head + list(self._prelude.values()))

  def _analyze(self, uops: list[UOp]) -> None:
    """Use counts, the block of each use, written buffers, and which register arrays can be plain variables."""
    self._uses, self._inline, self._written = use_analysis(uops)
    # a register array reached only through constant indices by scalar loads and stores is kept as plain variables
    self._regs_as_vars: set[UOp] = set()
    idx_users: dict[UOp, list[UOp]] = {}
    for u in uops:
      for s in u.src: idx_users.setdefault(s, []).append(u)
    for d in (u for u in uops if u.op is Ops.DEFINE_REG):
      ok = True
      for ix in idx_users.get(d, []):
        ok &= ix.op is Ops.INDEX and len(ix.src) == 2 and ix.src[1].op is Ops.CONST and 0 <= ix.src[1].arg < _size(d.dtype)
        ok &= all(m.op in (Ops.LOAD, Ops.STORE) and m.src[0] is ix and (m.dtype if m.op is Ops.LOAD else m.src[1].dtype).count == d.dtype.base.count
                  for m in idx_users.get(ix, []))
      if ok: self._regs_as_vars.add(d)
    # a vector comparison whose every user is a WHERE choosing by it can stay a native lane mask (no bool vector)
    self._masks: dict[UOp, str] = {}
    for u in uops:
      if u.op not in GroupOp.Comparison or u.dtype.count == 1 or not (users := idx_users.get(u, [])): continue
      if not all(w.op is Ops.WHERE and w.src[0] is u and u not in w.src[1:] for w in users): continue
      masks = {self.mask_type(self.cdt(u.src[0].dtype), self.cdt(w.dtype)) for w in users}
      if len(masks) == 1 and (m := masks.pop()) is not None: self._masks[u] = m

  def _open(self, lines: list[str]) -> None:
    for s in lines: self.line(s)
    self._depth += 1

  def _close(self) -> None:
    self._depth -= 1
    self.line("}")

  def _name(self, i: int, u: UOp) -> str:
    return self.unique(f"{_PREFIX.get(u.op, 'alu')}{i}")

  def _define(self, i: int, u: UOp, expr: str, ctype: str | None = None) -> None:
    if u in self._inline: self.r[u] = expr
    elif self._uses.get(u, 0) == 0 and u.op in PURE | {Ops.VECTORIZE, Ops.VCONST, Ops.LOAD}: return  # unused and without effects
    else:
      self.r[u] = n = self._name(i, u)
      self.line(f"{ctype or self.ctype(u.dtype)} {n} = {expr};")

  def _uop(self, i: int, u: UOp) -> None:
    op, r = u.op, self.r
    if op is Ops.CONST: r[u] = self.render_const(u.arg, u.dtype)
    elif op is Ops.VCONST: self._define(i, u, self.render_vectorize(self.cdt(u.dtype), [self.render_const(v, u.dtype.scalar()) for v in u.arg]))
    elif op is Ops.SPECIAL: r[u] = self.render_special(u, r[u.src[0]])
    elif op is Ops.DEFINE_LOCAL:
      self.ptrs[u] = Ptr(n := self.unique(c_identifier(u.arg)), None, None, u.dtype.base.scalar())
      self.line(self.render_local(n, self.storage_dtype(u.dtype.base.scalar()), _size(u.dtype) * u.dtype.base.count))
    elif op is Ops.DEFINE_REG: self._define_reg(u)
    elif op is Ops.RANGE:
      r[u] = self.unique(f"ridx{u.arg[0]}")
      self._open(self.render_range(u, r[u], r[u.src[0]]))
    elif op is Ops.IF: self._open([f"if ({r[u.src[0]]}) {{"])
    elif op in (Ops.ENDRANGE, Ops.ENDIF): self._close()
    elif op is Ops.BARRIER:
      if self.barrier is None: raise RendererError(f"{type(self).__name__} has no workgroup barrier")
      self.line(self.barrier)
    elif isinstance(u.dtype, PtrDType): self._pointer(u)
    elif op is Ops.LOAD: self._load(i, u)
    elif op is Ops.STORE: self._store(u)
    elif op is Ops.VECTORIZE: self._define(i, u, self.render_vectorize(self.cdt(u.dtype), [r[s] for s in u.src]))
    elif op is Ops.GEP:
      s = u.src[0]
      lanes = [self.gep(r[s], s.dtype, j) for j in u.arg]
      self._define(i, u, lanes[0] if len(lanes) == 1 else self.render_vectorize(self.cdt(u.dtype), lanes))
    elif op is Ops.CAST:
      s0 = u.src[0]
      if u.dtype.count > 1 and (native := self.native_cast(r[s0], s0.dtype, u.dtype)) is not None: self._define(i, u, native)
      else: self._define(i, u, self._lanewise(u.dtype, [s0], lambda a: self.cast(a[0], s0.dtype.scalar(), u.dtype.scalar())))
    elif op is Ops.BITCAST: self._define(i, u, self.bitcast(r[u.src[0]], u.src[0].dtype, u.dtype))
    elif u in self._masks: self._define(i, u, f"({r[u.src[0]]}{_INFIX[op]}{r[u.src[1]]})", self._masks[u])
    elif op is Ops.WHERE and (m := self._masks.get(u.src[0])) is not None:
      cond, yes, no = (r[s] for s in u.src)
      self._define(i, u, f"(({self.tname(self.cdt(u.dtype))})(({cond}&({m}){yes})|(~{cond}&({m}){no})))")
    elif op in GroupOp.ALU:
      sdt = u.src[-1].dtype if op is Ops.WHERE else u.src[0].dtype
      if u.dtype.count > 1 and (vec := self.render_vector_alu(op, self.cdt(u.dtype), [r[s] for s in u.src])) is not None: self._define(i, u, vec)
      elif u.dtype.count > 1 and (op in _INFIX or op is Ops.NEG) and op not in GroupOp.Comparison and self.native_vector_op(op, self.cdt(u.dtype)):
        a = [r[s] for s in u.src]
        self._define(i, u, f"(-{a[0]})" if op is Ops.NEG else f"({a[0]}{_INFIX[op]}{a[1]})")
      else: self._define(i, u, self._lanewise(u.dtype, list(u.src), lambda a: self.alu(op, u.dtype.scalar(), sdt.scalar(), a, u.src)))
    elif op is Ops.WMMA: self._define(i, u, self.render_wmma(u, [r[s] for s in u.src]))
    elif op in (Ops.CUSTOM, Ops.CUSTOMI):
      code = u.arg.format(*(r[s] for s in u.src if s in r))
      if u.dtype is dtypes.void: self.line(code if code.rstrip().endswith((";", "}")) else code + ";")
      else: self._define(i, u, code)
    else: raise RendererError(f"{type(self).__name__} cannot render {op.name} (uop #{i})")

  def _lanewise(self, dt: DType, srcs: list[UOp], fn: Callable[[list[str]], str]) -> str:
    """`fn(args)` on scalar values; on vectors, lane by lane (vector sources are named, so taking lanes repeats no work)."""
    args = [self.r[s] for s in srcs]
    if dt.count == 1 and all(s.dtype.count == 1 for s in srcs): return fn(args)
    lanes = [fn([self.gep(a, s.dtype, j) for a, s in zip(args, srcs)]) for j in range(max(dt.count, *(s.dtype.count for s in srcs)))]
    return self.render_vectorize(self.cdt(dt), lanes)

  def gep(self, x: str, dt: DType, i: int) -> str: return x if dt.count == 1 else self.render_gep(x, self.cdt(dt), i)

  # ---- values
  def alu(self, op: Ops, dt: DType, sdt: DType, a: list[str], srcs: Sequence[UOp] = ()) -> str:
    """Scalar `op` with result dtype `dt` on operands `a` of dtype `sdt` (the first source's; WHERE: the values')."""
    if op in GroupOp.Comparison: return f"({a[0]}{_INFIX[op]}{a[1]})"
    if op is Ops.WHERE: return f"({a[0]}?{a[1]}:{a[2]})"
    if dt is dtypes.bool: return _BOOL[op].format(*a)
    t = self.tname(self.cdt(dt))
    if dtypes.is_int(dt):
      if op in _INFIX or op in _INT_INFIX: e = f"({a[0]}{_INFIX.get(op) or _INT_INFIX[op]}{a[1]})"
      elif op is Ops.NEG: e = f"(-{a[0]})"
      elif op is Ops.MULACC: e = f"(({a[0]}*{a[1]})+{a[2]})"
      elif op is Ops.TRUNC: return a[0]
      else: return f"{self._int_helper(op, dt)}({','.join(a)})"
      return f"(({t}){e})" if dt.itemsize < 4 else e
    # floats: 16-bit floats compute in float and round once
    wide = dt if dt in (dtypes.float32, dtypes.float64) else dtypes.float32
    if op in _INFIX: e = f"({a[0]}{_INFIX[op]}{a[1]})"
    elif op is Ops.NEG: return f"(-{a[0]})"
    elif op is Ops.RECIPROCAL: e = f"({self.render_const(1.0, wide)}/{a[0]})"
    elif op in _MATH: e = self.render_math(_MATH[op], wide, [x if wide is dt else f"(float){x}" for x in a])
    else: raise RendererError(f"{type(self).__name__}: no float {op.name}")
    return e if wide is dt else self.render_round(e, dt)

  def _int_helper(self, op: Ops, dt: DType) -> str:
    t, short, signed = self.tname(dt), SHORT_NAMES[dt], not dtypes.is_unsigned(dt)
    fn = f"pg_{op.name.lower()}_{short}"
    if op is Ops.MAX: body = "return a > b ? a : b;"
    elif op is Ops.POW:
      neg = "if (b < 0) return a == 1 ? 1 : a == -1 ? ((b & 1) ? -1 : 1) : 0; " if signed else ""
      body = f"{neg}{t} r = 1; while (b) {{ if (b & 1) r = ({t})(r * a); a = ({t})(a * a); b >>= 1; }} return r;"
    else: raise RendererError(f"{type(self).__name__}: no integer {op.name}")
    self.need(fn, f"{self.helper_prefix}{t} {fn}({t} a, {t} b) {{ {body} }}")
    return fn

  def native_cast(self, x: str, src: DType, dst: DType) -> str | None:
    """A vector CAST of `x` from `src` to `dst` as one native conversion, or None to render it lane by lane."""
    return None

  def cast(self, x: str, src: DType, dst: DType) -> str:
    """Scalar C conversion with the interpreter's semantics."""
    if src is dst: return x
    if dst is dtypes.bool: return f"({x}!=0)"
    if dtypes.is_float(dst): return f"(({self.ctype(dst)}){x})" if dst in (dtypes.float32, dtypes.float64) else self.render_round(x, dst)
    if dtypes.is_float(src):
      i64 = self.type_map[dtypes.int64]
      self.need("pg_f2i", f"{self.helper_prefix}{i64} pg_f2i(double x) {{  /* truncation; nan/inf give 0, huge values wrap */\n"
                f"  if (x > -9223372036854775808.0 && x < 9223372036854775808.0) return ({self.type_map[dtypes.int64]})x;\n"
                f"  if (x != x || x == 2 * x) return 0;\n  double r = {self.render_math('fmod', dtypes.float64, ['x', '18446744073709551616.0'])};\n"
                f"  return ({self.type_map[dtypes.int64]})({self.type_map[dtypes.uint64]})(r < 0 ? r + 18446744073709551616.0 : r);\n}}")
      return f"(({self.tname(dst)})pg_f2i({x}))"
    return f"(({self.tname(dst)}){x})"

  def bitcast(self, x: str, src: DType, dst: DType) -> str:
    """Reinterpret the bytes of `x` (through a union of the memory representations)."""
    ms, md = self.mdt(src), self.mdt(dst)
    fn = f"pg_bitcast_{self.vector_name(ms) if ms.count > 1 else SHORT_NAMES[ms]}_{self.vector_name(md) if md.count > 1 else SHORT_NAMES[md]}"
    s, d = self.tname(ms), self.tname(md)
    self.need(fn, f"{self.helper_prefix}{d} {fn}({s} x) {{ union {{ {s} a; {d} b; }} u; u.a = x; return u.b; }}")
    return self.convert(f"{fn}({self.convert(x, src, True)})", dst, False)

  def convert(self, x: str, dt: DType, store: bool) -> str:
    """A value of `dt` to its memory representation (`store`) or back; vectors through a per-type helper."""
    s = dt.scalar()
    if self.storage_dtype(s) is self.compute_dtype(s): return x
    if dt.count == 1: return self.to_storage(x, s) if store else self.from_storage(x, s)
    src, dst = (self.cdt(dt), self.mdt(dt)) if store else (self.mdt(dt), self.cdt(dt))
    fn = f"pg_{'pack' if store else 'unpack'}_{self.vector_name(dt)}"
    conv = self.to_storage if store else self.from_storage
    lanes = [conv(self.render_gep("x", src, j), s) for j in range(dt.count)]
    self.need(fn, f"{self.helper_prefix}{self.tname(dst)} {fn}({self.tname(src)} x) {{ return {self.render_vectorize(dst, lanes)}; }}")
    return f"{fn}({x})"

  # ---- memory
  def _define_reg(self, u: UOp) -> None:
    base = u.dtype.base
    name = self.unique(f"acc{u.arg}")
    self.ptrs[u] = Ptr(name, None, None, base.scalar(), var=u in self._regs_as_vars)
    if u in self._regs_as_vars:
      names = [name] if _size(u.dtype) == 1 else [f"{name}_{k}" for k in range(_size(u.dtype))]
      self._names.update(names)
      self.line(f"{self.ctype(base)} {', '.join(names)};")
    else: self.line(f"{self.tname(self.mdt(base.scalar()))} {name}[{_size(u.dtype) * base.count}];")

  def _pointer(self, u: UOp) -> None:
    src = self.ptrs[u.src[0]]
    if (parts := index_parts(type(self).__name__, u)) is None:
      self.ptrs[u] = src
      return
    idx, gate = parts[0], (None if parts[1] is None else self.r[parts[1]])
    if src.var: self.ptrs[u] = Ptr(src.base if _size(u.src[0].dtype) == 1 else f"{src.base}_{idx.arg}", None, gate, src.elem, var=True)
    else:
      g = and_gates(src.gate, gate, lambda a, b: f"({a}&&{b})")
      if self.offset_addressing and u.src[0].dtype.base.count == 1 and src.idx is None and idx.op is Ops.ADD and idx.src[1].op is Ops.CONST:
        self.ptrs[u] = Ptr(f"({src.base}+{self.r[idx.src[0]]})", self.r[idx.src[1]], g, src.elem)
      else:
        ix = self.r[idx] if (per := u.src[0].dtype.base.count) == 1 else f"({self.r[idx]}*{per})"
        self.ptrs[u] = Ptr(src.base, ix if src.idx is None else f"({src.idx}+{ix})", g, src.elem)

  def _address(self, p: Ptr, dt: DType, const: str = "") -> str:
    """The memory at `p` as a value of `dt` (a vector: the contiguous elements from there)."""
    if p.var: return p.base
    if dt.count == 1: return f"{p.base}[{p.idx if p.idx is not None else 0}]"
    return f"*(({const}{self.tname(self.mdt(dt))}*)({p.base}+{p.idx if p.idx is not None else 0}))"

  def render_masked_load(self, p: Ptr, dt: DType) -> str:
    """A vector load of `dt` (in memory dtype `self.mdt(dt)`) from `p`, whose gate `p.gate` is a vector of bools: lanes
    whose gate is false read nothing and are 0. Only for a renderer with `masked_access`."""
    raise RendererError(f"{self.device}: this renderer declares no masked vector access (Renderer.masked_access), got a load gated per lane")

  def render_masked_store(self, p: Ptr, dt: DType, value: str) -> str:
    """The statement storing vector `value` of `dt` at `p` in the lanes whose gate (`p.gate`, a vector of bools) is true."""
    raise RendererError(f"{self.device}: this renderer declares no masked vector access (Renderer.masked_access), got a store gated per lane")

  def _load(self, i: int, u: UOp) -> None:
    p, dt = self.ptrs[u.src[0]], u.dtype
    if lane_gate(u.src[0]) is not None: return self._define(i, u, self.convert(f"({self.render_masked_load(p, dt)})", dt, False))
    alt = u.src[1] if len(u.src) > 1 and u.src[1].dtype is not dtypes.void else None
    v = self._address(p, dt, "const ")
    if not p.var: v = self.convert(v, p.elem, False) if dt.count == 1 else self.convert(f"({v})", dt, False)
    if p.gate is not None and not (p.var and dt.count > 1):
      zero = self.r[alt] if alt is not None else self.render_const(0, p.elem) if dt.count == 1 else \
        self.render_vectorize(self.cdt(dt), [self.render_const(0, p.elem)] * dt.count)
      v = f"({p.gate}?{v}:{zero})"
    self._define(i, u, v)

  def render_atomic_add(self, p: Ptr, value: str) -> str:
    """The statement that adds `value` to the element at `p` atomically (a STORE with arg Ops.ADD; `p.elem` is one of
    the renderer's `atomic_add` dtypes; `&{self._address(p, p.elem)}` is its address). The gate is added around it."""
    raise RendererError(f"{self.device}: this renderer declares no atomic add (Renderer.atomic_add), got one of {p.elem!r}")

  def _store(self, u: UOp) -> None:
    p, val = self.ptrs[u.src[0]], u.src[1]
    if u.arg is Ops.ADD:
      if p.elem not in self.atomic_add: raise RendererError(f"{self.device}: no atomic add of {p.elem!r} (Renderer.atomic_add)")
      st = self.render_atomic_add(p, self.r[val])
      return self.line(st if p.gate is None else f"if ({p.gate}) {st}")
    v = self.r[val] if p.var else self.convert(self.r[val], val.dtype if val.dtype.count > 1 else p.elem, True)
    if lane_gate(u.src[0]) is not None: return self.line(self.render_masked_store(p, val.dtype, v))
    st = f"{self._address(p, val.dtype)} = {v};"
    self.line(st if p.gate is None or (p.var and val.dtype.count > 1) else f"if ({p.gate}) {st}")


def _size(dt: DType) -> int: return dt.size if isinstance(dt, PtrDType) else 1



__all__ = ["C_KEYWORDS", "SHORT_NAMES", "CStyleRenderer", "Ptr", "c_identifier", "float32_repr"]
