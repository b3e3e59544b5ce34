"""The CPU renderer for the in-process compiler (CPU_LLVM=1): one kernel as LLVM IR text, compiled by `LLVMCompiler`.

It computes exactly what the C renderer (`CPURenderer`) computes, which is what the PYTHON interpreter computes: the
same signature (buffers in slot order, variables by name, then `core_id, core_count`), the same parallel split of the
same loop (with `PARALLEL_MARK` as a comment), and C's semantics written out where LLVM's differ: float → int casts
truncate with nan/inf giving 0 and huge values wrapping, MULACC on floats is a fused multiply-add and no other float op
is contracted (no fast-math flags anywhere). The integer division and shift guards, nan-propagating MAX and THREEFRY
are lowered before rendering by the shared passes (codegen/decompose.py): sdiv/srem/shl/ashr here are LLVM's own.

Values: bool is `i1` (a byte in memory), float16 computes in `float` and is rounded to `half` after every op; bfloat16
never gets here (the codegen emulates it with float32 values and uint16 memory, codegen/decompose.py). Register arrays
(DEFINE_REG) are `alloca`s in the entry block, which the O2 pipeline's SROA turns into registers. A gated load or
store branches around the access, so memory is never touched when the gate is false.

Tensor cores (`tensor_cores`, tensor_cores.py) are LLVM's x86 intrinsics: `llvm.x86.avx512bf16.dpbf16ps.512` and
`llvm.x86.avx512.vpdpbusd.512` on the fragments (A's 32-bit group broadcast), and for AMX the shaped `.internal` forms
(`llvm.x86.tileloadd64.internal`, `llvm.x86.tdpbf16ps.internal` / `tdpbssd.internal`, `llvm.x86.tilestored64.internal`)
through 64-byte-aligned stack buffers: LLVM writes the tile configuration (`ldtilecfg`) and the `tilerelease` itself.
bfloat16 fragments are float32 lanes holding bfloat16 numbers (the emulation): their top halves are taken exactly.
"""
from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from plugrad.backend import (
  DType,
  GroupOp,
  Ops,
  PtrDType,
  Renderer,
  RendererError,
  TensorCore,
  UOp,
  and_gates,
  c_identifier,
  dtypes,
  find_tensor_core,
  index_parts,
  lane_gate,
  linear_parts,
  no_signed_wrap,
)
from plugrad_cpu.llvm_compiler import QUICK_MARK
from plugrad_cpu.renderer import PARALLEL_MARK, CPUMath, cpu_order, with_tensor_cores
from plugrad_cpu.tensor_cores import AMX_MARK

_F16 = dtypes.float16
_CMP_F = {Ops.CMPLT: "olt", Ops.CMPNE: "une", Ops.CMPEQ: "oeq"}
_CMP_S = {Ops.CMPLT: "slt", Ops.CMPNE: "ne", Ops.CMPEQ: "eq"}
_CMP_U = {Ops.CMPLT: "ult", Ops.CMPNE: "ne", Ops.CMPEQ: "eq"}
_INT_BIN = {Ops.ADD: "add", Ops.SUB: "sub", Ops.MUL: "mul", Ops.AND: "and", Ops.OR: "or", Ops.XOR: "xor"}
_FLOAT_BIN = {Ops.ADD: "fadd", Ops.SUB: "fsub", Ops.MUL: "fmul", Ops.FDIV: "fdiv"}
_BOOL_BIN = {Ops.ADD: "or", Ops.MAX: "or", Ops.OR: "or", Ops.MUL: "and", Ops.AND: "and", Ops.SUB: "xor", Ops.XOR: "xor"}
_MATH = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt", Ops.TRUNC: "trunc", Ops.POW: "pow", Ops.MULACC: "fma"}


def scalar_type(dt: DType) -> str:
  """The LLVM type that holds values of scalar dtype `dt` (16-bit floats compute in float)."""
  if dt is dtypes.bool: return "i1"
  if dtypes.is_int(dt): return f"i{8 * dt.itemsize}"
  return "double" if dt is dtypes.float64 else "float"


def memory_type(dt: DType) -> str:
  """The LLVM type of scalar dtype `dt` in memory."""
  return "i8" if dt is dtypes.bool else "half" if dt is _F16 else scalar_type(dt)


_MANGLE = {"float": "f32", "double": "f64", "half": "f16", "bfloat": "bf16"}  # an intrinsic's name spells a type's elements so


def _vec(t: str, n: int) -> str: return t if n == 1 else f"<{n} x {t}>"
def ltype(dt: DType) -> str: return _vec(scalar_type(dt.scalar()), dt.count)
def mtype(dt: DType) -> str: return _vec(memory_type(dt.scalar()), dt.count)


def _hex(x: float) -> str: return f"0x{struct.unpack('<Q', struct.pack('<d', x))[0]:016X}"


def scalar_const(v: float | int | bool, dt: DType) -> str:
  """A constant of scalar dtype `dt`, as an operand of its LLVM type."""
  if dt is dtypes.bool: return "true" if v else "false"
  if dtypes.is_float(dt):
    x = float(v)
    if math.isfinite(x) and dt is not dtypes.float64:
      x = float(np.float16(x)) if dt is _F16 else float(np.float32(x))
    return _hex(x)
  bits = 8 * dt.itemsize
  i = int(v) & ((1 << bits) - 1)
  return str(i - (1 << bits) if i >= 1 << (bits - 1) else i)


def _is_const(x: str) -> bool: return not x.startswith("%")


# ops + bytes moved (`p.estimates`) below which a kernel is compiled by the quick pipeline: about 30 us of work, where
# its ~7 ms shorter compile outweighs what the full O2 pipeline gains over hundreds of runs (without LICM and the loop
# passes a kernel may run up to ~2x slower: the MLP's 256x512x10 output layer, 3 Mi of work, took 88 instead of 47 us)
QUICK_WORK_MAX = 1 << 20


@dataclass(frozen=True)
class Ptr:
  """A pointer value (one address: the codegen splits vectors of addresses, codegen/decompose.py): the base pointer, the
  element index (an i64 operand; None: element 0), the gate (None: always) and the scalar dtype of the memory."""
  base: str
  idx: str | None
  gate: str | None
  elem: DType


class LLVMRenderer(CPUMath):
  """LLVM IR for the host (see the module docstring). `cpu` / `features`: the `target-cpu` and `target-features` the
  kernel is marked with (default: the host's, from llvmlite); `vector_width`: float lanes of one vector instruction."""
  has_local = has_shared = False
  supports_float4 = masked_access = True
  capabilities = frozenset({"float16", "bfloat16", "float64", "int64"})

  def __init__(self, device: str, vector_width: int | None = None, cpu: str | None = None, features: str | None = None,
               tensor_cores: tuple[TensorCore, ...] = ()):
    super().__init__(device)
    if cpu is None or features is None or vector_width is None:
      from plugrad_cpu.llvm_compiler import host, host_float_lanes
      cpu, features = (cpu, features) if cpu is not None and features is not None else host()
      vector_width = host_float_lanes() if vector_width is None else vector_width
    self.cpu, self.features, self.vector_width = cpu, features, vector_width
    with_tensor_cores(self, tensor_cores)
    self.validate()

  def __repr__(self) -> str: return f"<LLVMRenderer {self.device}: {self.cpu}, {self.vector_width}-wide float vectors>"

  def c_renderer(self) -> Renderer:
    """The C renderer of this machine: it renders the same LINEAR programs to C that computes the same results (the
    tiering recompile relies on it; `plugrad.export` asks for it to write the C of kernels captured on the LLVM path)."""
    from plugrad_cpu.renderer import c_renderer
    return c_renderer(self.device)

  def render(self, program: UOp) -> str:
    name, uops = linear_parts(program)
    src = _Kernel(self).render(name, uops)
    est = program.estimates  # type: ignore[attr-defined]  # ProgramUOp accessor (uop/program.py)
    small = isinstance(est.ops, int) and isinstance(est.lds, int) and est.ops + est.lds < QUICK_WORK_MAX
    return f"{QUICK_MARK}\n{src}" if small else src


class _Kernel:
  """The state of rendering one kernel (a renderer may render from several threads)."""
  def __init__(self, r: LLVMRenderer):
    self.r = r
    self.body: list[str] = []
    self.allocas: list[str] = []
    self.decls: dict[str, str] = {}
    self.v: dict[UOp, str] = {}
    self.ptrs: dict[UOp, Ptr] = {}
    self.n = 0
    self.block = "entry"
    self.open: list[tuple] = []  # the blocks open now: ("if", end label) or ("loop", i, type, head, done, phi line, lo, pre-header)
    self.split: UOp | None = None
    self.amx: tuple[str, str, str] | None = None  # the stack buffers of the AMX tiles (A, B, C), once a WMMA needs them

  # ---- emitting
  def tmp(self, base: str = "t") -> str:
    self.n += 1
    return f"%{base}{self.n}"

  def label(self, base: str) -> str:
    self.n += 1
    return f"{base}{self.n}"

  def emit(self, ins: str) -> str:
    self.body.append(f"  {(x := self.tmp())} = {ins}")
    return x

  def line(self, s: str) -> None: self.body.append(f"  {s}")

  def start(self, lab: str) -> None:
    self.body.append(f"{lab}:")
    self.block = lab

  def need(self, key: str, code: str) -> None: self.decls.setdefault(key, code)

  def intrinsic(self, name: str, t: str, nargs: int) -> str:
    """The name of LLVM intrinsic `name` (exp2, fma, ...) on type `t` (declared once)."""
    count, elem = t[1:-1].split(" x ") if t.startswith("<") else ("", t)
    fn = f"@llvm.{name}.{'v' + count if count else ''}{'f64' if elem == 'double' else 'f32'}"
    self.need(fn, f"declare {t} {fn}({', '.join([t] * nargs)})")
    return fn

  # ---- values
  def const(self, v: float | int | bool, dt: DType) -> str:
    c = scalar_const(v, dt.scalar())
    return c if dt.count == 1 else f"<{', '.join([f'{ltype(dt.scalar())} {c}'] * dt.count)}>"

  def splat(self, x: str, dt: DType, n: int) -> str:
    """Scalar `x` of dtype `dt` in every lane of an n-vector (n == 1: `x`)."""
    if n == 1 or dt.count == n: return x
    t = scalar_type(dt)
    if _is_const(x): return f"<{', '.join([f'{t} {x}'] * n)}>"
    v = self.emit(f"insertelement <1 x {t}> poison, {t} {x}, i64 0")
    return self.emit(f"shufflevector <1 x {t}> {v}, <1 x {t}> poison, <{n} x i32> zeroinitializer")

  def lane(self, x: str, dt: DType, j: int) -> str:
    return x if dt.count == 1 else self.emit(f"extractelement {ltype(dt)} {x}, i32 {j}")

  def vector(self, parts: Sequence[str], dt: DType) -> str:
    """An n-vector of dtype `dt` (a vector dtype) from scalar operands."""
    t = scalar_type(dt.scalar())
    if len(parts) == 1: return parts[0]
    if all(_is_const(p) for p in parts): return f"<{', '.join(f'{t} {p}' for p in parts)}>"
    v = "poison"
    for j, p in enumerate(parts): v = self.emit(f"insertelement {ltype(dt)} {v}, {t} {p}, i32 {j}")
    return v

  def lanewise(self, dt: DType, args: Sequence[tuple[str, DType]], fn: Callable[[list[str]], str]) -> str:
    """`fn` on scalar operands; on vectors lane by lane (for ops with a scalar helper only)."""
    if dt.count == 1: return fn([a for a, _ in args])
    return self.vector([fn([self.lane(a, d, j) for a, d in args]) for j in range(dt.count)], dt)

  # ---- storage representation
  def to_memory(self, x: str, dt: DType) -> str:
    s, n = dt.scalar(), dt.count
    if s is dtypes.bool: return self.emit(f"zext {ltype(dt)} {x} to {_vec('i8', n)}")
    if s is _F16: return self.emit(f"fptrunc {ltype(dt)} {x} to {_vec('half', n)}")
    return x

  def from_memory(self, x: str, dt: DType) -> str:
    s, n = dt.scalar(), dt.count
    if s is dtypes.bool: return self.emit(f"icmp ne {_vec('i8', n)} {x}, zeroinitializer")
    if s is _F16: return self.emit(f"fpext {_vec('half', n)} {x} to {ltype(dt)}")
    return x

  def round16(self, x: str, dt: DType) -> str:
    """A float value rounded to float16 (nearest even), still as float; other dtypes: `x`."""
    if dt.scalar() is not _F16: return x
    ht = _vec("half", dt.count)
    return self.emit(f"fpext {ht} {self.emit(f'fptrunc {ltype(dt)} {x} to {ht}')} to {ltype(dt)}")

  # ---- the kernel
  def render(self, kname: str, uops: tuple[UOp, ...]) -> str:
    fname = c_identifier(kname)
    order, self.split = cpu_order(uops)
    params: list[str] = []
    for g in sorted((u for u in uops if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg):
      params.append(f"ptr %data{g.arg}")
      self.ptrs[g] = Ptr(f"%data{g.arg}", None, None, g.dtype.base.scalar())
    names: set[str] = set()
    for v in sorted((u for u in uops if u.op is Ops.DEFINE_VAR), key=lambda u: u.arg[0]):
      name = f"%var_{c_identifier(v.arg[0])}"
      while name in names: name += "_"
      names.add(name)
      self.v[v] = name
      params.append(f"{ltype(v.dtype)} {name}")
    params += ["i32 %core_id", "i32 %core_count"]
    for i, u in enumerate(order):
      if u.op not in (Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR): self.uop(i, u)
    while self.open: self.close()
    attrs = f'"target-cpu"="{self.r.cpu}" "target-features"="{self.r.features}"'
    head = ([] if fname == kname else [f"; kernel {kname!r}"]) + ([f"; {AMX_MARK}"] if self.amx else [])
    return "\n".join([*head, f"define void @{fname}({', '.join(params)}) #0 {{", "entry:", *self.allocas, *self.body, "  ret void", "}", "",
                      *self.decls.values(), "", f"attributes #0 = {{ nounwind {attrs} }}",
                      f"attributes #1 = {{ nounwind alwaysinline {attrs} }}", ""])

  def open_loop(self, u: UOp, bound: str) -> str:
    t = ltype(u.dtype)
    lo, hi = "0", bound
    if u is self.split:
      self.line(f"; {PARALLEL_MARK}")
      cid, cnt = "%core_id", "%core_count"
      if t != "i32": cid, cnt = self.emit(f"sext i32 %core_id to {t}"), self.emit(f"sext i32 %core_count to {t}")
      q, rem = self.emit(f"sdiv {t} {bound}, {cnt}"), self.emit(f"srem {t} {bound}, {cnt}")
      below = self.emit(f"icmp slt {t} {cid}, {rem}")
      lo = self.emit(f"add {t} {self.emit(f'mul {t} {cid}, {q}')}, {self.emit(f'select i1 {below}, {t} {cid}, {t} {rem}')}")
      hi = self.emit(f"add {t} {self.emit(f'add {t} {lo}, {q}')}, {self.emit(f'zext i1 {below} to {t}')}")
    head, body, done = self.label("loop"), self.label("body"), self.label("done")
    pre = self.block
    self.line(f"br label %{head}")
    self.start(head)
    i = self.tmp("i")
    self.body.append("")  # the induction variable's phi, written when the loop closes (its latch is known then)
    self.open.append(("loop", i, t, head, done, len(self.body) - 1, lo, pre))
    self.line(f"br i1 {self.emit(f'icmp slt {t} {i}, {hi}')}, label %{body}, label %{done}")
    self.start(body)
    return i

  def close(self) -> None:
    top = self.open.pop()
    if top[0] == "if":
      self.line(f"br label %{top[1]}")
      self.start(top[1])
      return
    _, i, t, head, done, at, lo, pre = top
    nxt = self.emit(f"add nsw {t} {i}, 1")  # i < hi: never overflows
    self.body[at] = f"  {i} = phi {t} [ {lo}, %{pre} ], [ {nxt}, %{self.block} ]"
    self.line(f"br label %{head}")
    self.start(done)

  def uop(self, i: int, u: UOp) -> None:
    op, v = u.op, self.v
    if op is Ops.CONST: v[u] = self.const(u.arg, u.dtype)
    elif op is Ops.VCONST: v[u] = self.vector([scalar_const(x, u.dtype.scalar()) for x in u.arg], u.dtype)
    elif op in (Ops.SPECIAL, Ops.RANGE): v[u] = self.open_loop(u, v[u.src[0]])  # a SPECIAL's loop is closed at the end
    elif op is Ops.IF:
      then, end = self.label("then"), self.label("endif")
      self.line(f"br i1 {v[u.src[0]]}, label %{then}, label %{end}")
      self.start(then)
      self.open.append(("if", end))
    elif op in (Ops.ENDRANGE, Ops.ENDIF): self.close()
    elif op is Ops.DEFINE_REG:
      base = u.dtype.base
      size = (u.dtype.size if isinstance(u.dtype, PtrDType) else 1) * base.count
      self.allocas.append(f"  %acc{i} = alloca [{size} x {memory_type(base.scalar())}], align 64")
      self.ptrs[u] = Ptr(f"%acc{i}", None, None, base.scalar())
    elif op is Ops.WMMA: v[u] = self.wmma(u)
    elif op in (Ops.DEFINE_LOCAL, Ops.BARRIER):
      raise RendererError(f"the CPU has no workgroups: LLVMRenderer cannot render {op.name} (uop #{i})")
    elif op in (Ops.CUSTOM, Ops.CUSTOMI): raise RendererError(f"LLVMRenderer cannot render {op.name} (uop #{i}): its code is C text")
    elif isinstance(u.dtype, PtrDType): self.pointer(u)
    elif op is Ops.LOAD: v[u] = self.load(u)
    elif op is Ops.STORE: self.store(u)
    elif op is Ops.VECTORIZE: v[u] = self.vector([v[s] for s in u.src], u.dtype)
    elif op is Ops.GEP:
      s = u.src[0]
      if len(u.arg) == 1: v[u] = self.lane(v[s], s.dtype, u.arg[0])
      else: v[u] = self.emit(f"shufflevector {ltype(s.dtype)} {v[s]}, {ltype(s.dtype)} poison, <{len(u.arg)} x i32> "
                             f"<{', '.join(f'i32 {j}' for j in u.arg)}>")
    elif op is Ops.CAST: v[u] = self.cast(v[u.src[0]], u.src[0].dtype, u.dtype)
    elif op is Ops.BITCAST:
      sd = u.src[0].dtype
      m = self.to_memory(v[u.src[0]], sd)
      v[u] = self.from_memory(m if mtype(sd) == mtype(u.dtype) else self.emit(f"bitcast {mtype(sd)} {m} to {mtype(u.dtype)}"), u.dtype)
    elif op in GroupOp.ALU:
      n = u.dtype.count
      args = [(self.splat(v[s], s.dtype, n), s.dtype.scalar().vec(n) if n > 1 else s.dtype) for s in u.src]
      v[u] = self.alu(op, u.dtype, args, nsw=no_signed_wrap(u))
    else: raise RendererError(f"LLVMRenderer cannot render {op.name} (uop #{i})")

  # ---- ALU
  def alu(self, op: Ops, dt: DType, args: list[tuple[str, DType]], nsw: bool = False) -> str:
    """`op` with result dtype `dt` (scalar or vector) on operands (value, dtype) with as many lanes as `dt`; `nsw`: a
    signed ADD/SUB/MUL that cannot overflow (`no_signed_wrap`)."""
    a = [x for x, _ in args]
    sdt = args[-1][1] if op is Ops.WHERE else args[0][1]
    s, t = sdt.scalar(), ltype(sdt)
    if op is Ops.WHERE: return self.emit(f"select {ltype(args[0][1])} {a[0]}, {t} {a[1]}, {t} {a[2]}")
    if op in GroupOp.Comparison:
      if dtypes.is_float(s): return self.emit(f"fcmp {_CMP_F[op]} {t} {a[0]}, {a[1]}")
      return self.emit(f"icmp {(_CMP_U if s is dtypes.bool or dtypes.is_unsigned(s) else _CMP_S)[op]} {t} {a[0]}, {a[1]}")
    d = dt.scalar()
    if d is dtypes.bool:
      if op in _BOOL_BIN: return self.emit(f"{_BOOL_BIN[op]} {t} {a[0]}, {a[1]}")
      true = self.const(True, dt)
      if op is Ops.NEG: return self.emit(f"xor {t} {a[0]}, {true}")
      if op is Ops.POW: return self.emit(f"or {t} {a[0]}, {self.emit(f'xor {t} {a[1]}, {true}')}")
      if op is Ops.MULACC: return self.emit(f"or {t} {self.emit(f'and {t} {a[0]}, {a[1]}')}, {a[2]}")
      if op is Ops.TRUNC: return a[0]
      raise RendererError(f"LLVMRenderer: no bool {op.name}")
    if dtypes.is_int(d): return self.int_alu(op, dt, args, nsw)
    if op in _FLOAT_BIN: e = self.emit(f"{_FLOAT_BIN[op]} {t} {a[0]}, {a[1]}")
    elif op is Ops.NEG: return self.emit(f"fneg {t} {a[0]}")
    elif op is Ops.RECIPROCAL: e = self.emit(f"fdiv {t} {self.const(1.0, dt)}, {a[0]}")
    elif op in _MATH:
      fn = self.intrinsic(_MATH[op], t, len(a))
      e = self.emit(f"call {t} {fn}({', '.join(f'{t} {x}' for x in a)})")
      if op is Ops.LOG2:  # libm leaves the sign of log2(<0)'s nan open (glibc's AVX2 one: -nan); the interpreter's is +nan
        neg = self.emit(f"fcmp olt {t} {a[0]}, {self.const(0.0, dt)}")
        e = self.emit(f"select {_vec('i1', dt.count)} {neg}, {t} {self.const(math.nan, dt)}, {t} {e}")
    else: raise RendererError(f"LLVMRenderer: no float {op.name}")
    return self.round16(e, dt)

  def int_alu(self, op: Ops, dt: DType, args: list[tuple[str, DType]], nsw: bool = False) -> str:
    a, d = [x for x, _ in args], dt.scalar()
    t, signed = ltype(dt), not dtypes.is_unsigned(d)
    b1 = _vec("i1", dt.count)
    if op in _INT_BIN: return self.emit(f"{_INT_BIN[op]}{' nsw' if nsw else ''} {t} {a[0]}, {a[1]}")
    if op is Ops.NEG: return self.emit(f"sub {t} zeroinitializer, {a[0]}")
    if op is Ops.MULACC: return self.emit(f"add {t} {self.emit(f'mul {t} {a[0]}, {a[1]}')}, {a[2]}")
    if op is Ops.TRUNC: return a[0]
    if op is Ops.MAX:
      gt = self.emit(f"icmp {'sgt' if signed else 'ugt'} {t} {a[0]}, {a[1]}")
      return self.emit(f"select {b1} {gt}, {t} {a[0]}, {t} {a[1]}")
    if op in (Ops.IDIV, Ops.MOD):
      return self.emit(f"{('sdiv' if signed else 'udiv') if op is Ops.IDIV else ('srem' if signed else 'urem')} {t} {a[0]}, {a[1]}")
    if op in (Ops.SHL, Ops.SHR):  # an amount of another integer type is converted as C converts it (the guard kept it in range)
      bx, bdt = args[1]
      if (bt := ltype(bdt)) != t:
        wider = bdt.scalar().itemsize > d.itemsize
        bx = self.emit(f"{'trunc' if wider else 'zext' if dtypes.is_unsigned(bdt.scalar()) else 'sext'} {bt} {bx} to {t}")
      return self.emit(f"{'shl' if op is Ops.SHL else 'ashr' if signed else 'lshr'} {t} {a[0]}, {bx}")
    if op is Ops.POW:
      fn = self.int_pow(d)
      return self.lanewise(dt, args, lambda x: self.emit(f"call {scalar_type(d)} {fn}({scalar_type(d)} {x[0]}, {scalar_type(d)} {x[1]})"))
    raise RendererError(f"LLVMRenderer: no integer {op.name}")

  # ---- casts
  def cast(self, x: str, src: DType, dst: DType) -> str:
    """C conversion with the interpreter's semantics, lane-wise on vectors."""
    s, d, n = src.scalar(), dst.scalar(), dst.count
    if s is d: return x
    st, dtt = ltype(src), ltype(dst)
    if d is dtypes.bool:
      return self.emit(f"fcmp une {st} {x}, zeroinitializer" if dtypes.is_float(s) else f"icmp ne {st} {x}, zeroinitializer")
    if dtypes.is_float(d):
      if not dtypes.is_float(s):
        conv = "uitofp" if s is dtypes.bool or dtypes.is_unsigned(s) else "sitofp"
        return self.round16(self.emit(f"{conv} {st} {x} to {dtt}"), dst)  # through float: exact below 2**24, inf as half above
      if st == dtt: return self.round16(x, dst)
      if d is _F16 and s is dtypes.float64: return self.round16(self.round_to_odd(x, n), dst)
      return self.round16(self.emit(f"{'fpext' if d is dtypes.float64 else 'fptrunc'} {st} {x} to {dtt}"), dst)
    if not dtypes.is_float(s):
      sb, db = (1 if s is dtypes.bool else 8 * s.itemsize), 8 * d.itemsize
      if sb == db: return x
      if sb > db: return self.emit(f"trunc {st} {x} to {dtt}")
      return self.emit(f"{'zext' if s is dtypes.bool or dtypes.is_unsigned(s) else 'sext'} {st} {x} to {dtt}")
    fn = self.f2i()
    def one(a: list[str]) -> str:
      wide = a[0] if s is dtypes.float64 else self.emit(f"fpext float {a[0]} to double")
      r = self.emit(f"call i64 {fn}(double {wide})")
      return r if d.itemsize == 8 else self.emit(f"trunc i64 {r} to {scalar_type(d)}")
    return self.lanewise(dst, [(x, src)], one)

  def round_to_odd(self, x: str, n: int) -> str:
    """double → float rounding toward zero with the sticky bit in the last place: rounding that float to half then
    rounds like one direct conversion (float has more than 11 + 2 bits), without a libcall for double → half."""
    dt, ft, it = _vec("double", n), _vec("float", n), _vec("i32", n)
    b1 = _vec("i1", n)
    f = self.emit(f"fptrunc {dt} {x} to {ft}")
    back = self.emit(f"fpext {ft} {f} to {dt}")
    fabs = self.intrinsic("fabs", dt, 1)
    over = self.emit(f"fcmp ogt {dt} {self.emit(f'call {dt} {fabs}({dt} {back})')}, {self.emit(f'call {dt} {fabs}({dt} {x})')}")
    bits = self.emit(f"bitcast {ft} {f} to {it}")
    bits = self.emit(f"sub {it} {bits}, {self.emit(f'zext {b1} {over} to {it}')}")  # toward zero: one step down in magnitude
    inexact = self.emit(f"fcmp one {dt} {back}, {x}")
    bits = self.emit(f"or {it} {bits}, {self.emit(f'zext {b1} {inexact} to {it}')}")
    return self.emit(f"bitcast {it} {bits} to {ft}")

  # ---- tensor cores
  def bf16_bits(self, x: str, n: int) -> str:
    """`<n x bfloat>` of float lanes `x` that hold bfloat16 numbers: their top halves, exactly."""
    hi = self.emit(f"lshr <{n} x i32> {self.emit(f'bitcast <{n} x float> {x} to <{n} x i32>')}, {self.const(16, dtypes.int32.vec(n))}")
    return self.emit(f"bitcast <{n} x i16> {self.emit(f'trunc <{n} x i32> {hi} to <{n} x i16>')} to <{n} x bfloat>")

  def broadcast32(self, x: str, t: str) -> str:
    """A 32-bit group `x` of type `t` (<2 x bfloat>, <4 x i8>) in each of 16 lanes, as <16 x i32>."""
    return self.splat(self.emit(f"bitcast {t} {x} to i32"), dtypes.int32, 16)

  def call(self, ret: str, fn: str, args: list[tuple[str, str]]) -> str:
    """A call of intrinsic `fn` (declared once) on (type, value) operands; its value ("" for void)."""
    self.need(fn, f"declare {ret} {fn}({', '.join(t for t, _ in args)})")
    call = f"call {ret} {fn}({', '.join(f'{t} {x}' for t, x in args)})"
    if ret == "void":
      self.line(call)
      return ""
    return self.emit(call)

  def wmma(self, u: UOp) -> str:
    tc = find_tensor_core(u.arg)
    if tc not in self.r.tensor_cores:
      raise RendererError(f"{self.r!r} does not declare the tensor core {tc.device}/{tc.name} (CPU_TC, the CPU's features)")
    a, b, c = (self.v[s] for s in u.src)
    bf16 = tc.dtype_in is dtypes.bfloat16
    ct = ltype(u.dtype)
    if tc.name == "vdpbf16ps":
      av = self.emit(f"bitcast <16 x i32> {self.broadcast32(self.bf16_bits(a, 2), '<2 x bfloat>')} to <32 x bfloat>")
      return self.call(ct, "@llvm.x86.avx512bf16.dpbf16ps.512", [(ct, c), ("<32 x bfloat>", av), ("<32 x bfloat>", self.bf16_bits(b, 32))])
    if tc.name == "vpdpbusd":
      av = self.emit(f"bitcast <16 x i32> {self.broadcast32(a, '<4 x i8>')} to <64 x i8>")
      return self.call(ct, "@llvm.x86.avx512.vpdpbusd.512", [(ct, c), ("<64 x i8>", av), ("<64 x i8>", b)])
    # AMX: 16-row tiles of 64 bytes (A, B, C) through stack buffers; i16 16, i16 64: rows and bytes per row
    if self.amx is None:
      self.amx = ("%amx_a", "%amx_b", "%amx_c")
      self.allocas += [f"  {p} = alloca [1024 x i8], align 64" for p in self.amx]
    pa, pb, pc = self.amx
    frag_t = "<512 x bfloat>" if bf16 else "<1024 x i8>"
    for p, x in ((pa, self.bf16_bits(a, 512) if bf16 else a), (pb, self.bf16_bits(b, 512) if bf16 else b), (pc, c)):
      self.line(f"store {frag_t if p != pc else ct} {x}, ptr {p}, align 64")
    shape = [("i16", "16"), ("i16", "64")]
    ta, tb, tcc = (self.call("x86_amx", "@llvm.x86.tileloadd64.internal", [*shape, ("ptr", p), ("i64", "64")]) for p in (pa, pb, pc))
    td = self.call("x86_amx", f"@llvm.x86.{tc.name}.internal", [*shape, ("i16", "64"), ("x86_amx", tcc), ("x86_amx", ta), ("x86_amx", tb)])
    self.call("void", "@llvm.x86.tilestored64.internal", [*shape, ("ptr", pc), ("i64", "64"), ("x86_amx", td)])
    return self.emit(f"load {ct}, ptr {pc}, align 64")

  # ---- helper functions
  def f2i(self) -> str:
    self.need("@pg_f2i", """\
define internal i64 @pg_f2i(double %x) #1 {  ; truncation; nan/inf give 0, huge values wrap (like the interpreter)
entry:
  %lo = fcmp ogt double %x, 0xC3E0000000000000
  %hi = fcmp olt double %x, 0x43E0000000000000
  %in = and i1 %lo, %hi
  br i1 %in, label %small, label %big
small:
  %r = fptosi double %x to i64
  ret i64 %r
big:
  %nan = fcmp uno double %x, %x
  %x2 = fmul double %x, 2.0
  %inf = fcmp oeq double %x, %x2
  %zero = or i1 %nan, %inf
  br i1 %zero, label %none, label %wrap
none:
  ret i64 0
wrap:
  %m = frem double %x, 0x43F0000000000000
  %neg = fcmp olt double %m, 0.0
  %p = fadd double %m, 0x43F0000000000000
  %s = select i1 %neg, double %p, double %m
  %u = fptoui double %s to i64
  ret i64 %u
}""")
    return "@pg_f2i"

  def int_pow(self, d: DType) -> str:
    t, signed = scalar_type(d), not dtypes.is_unsigned(d)
    fn = f"@pg_pow_{'i' if signed else 'u'}{t[1:]}"
    neg = f"""\
  %neg = icmp slt {t} %b, 0
  br i1 %neg, label %negative, label %loop
negative:  ; only 1 and -1 have nonzero integer powers
  %one = icmp eq {t} %a, 1
  %mone = icmp eq {t} %a, -1
  %oddb = trunc {t} %b to i1
  %sgn = select i1 %oddb, {t} -1, {t} 1
  %m = select i1 %mone, {t} %sgn, {t} 0
  %rn = select i1 %one, {t} 1, {t} %m
  ret {t} %rn""" if signed else "  br label %loop"
    self.need(fn, f"""\
define internal {t} {fn}({t} %a, {t} %b) #1 {{  ; square and multiply, wrapping
entry:
{neg}
loop:
  %r = phi {t} [ 1, %entry ], [ %r2, %step ]
  %x = phi {t} [ %a, %entry ], [ %x2, %step ]
  %e = phi {t} [ %b, %entry ], [ %e2, %step ]
  %done = icmp eq {t} %e, 0
  br i1 %done, label %exit, label %step
step:
  %odd = trunc {t} %e to i1
  %rx = mul {t} %r, %x
  %r2 = select i1 %odd, {t} %rx, {t} %r
  %x2 = mul {t} %x, %x
  %e2 = lshr {t} %e, 1
  br label %loop
exit:
  ret {t} %r
}}""")
    return fn

  # ---- memory
  def pointer(self, u: UOp) -> None:
    src = self.ptrs[u.src[0]]
    if (parts := index_parts("LLVMRenderer", u)) is None:
      self.ptrs[u] = src
      return
    idx, gate = parts[0], (None if parts[1] is None else self.v[parts[1]])
    ix = self.v[idx]
    if idx.dtype.itemsize < 8 and not _is_const(ix):
      ix = self.emit(f"{'zext' if dtypes.is_unsigned(idx.dtype) else 'sext'} {ltype(idx.dtype)} {ix} to i64")
    if (per := u.src[0].dtype.base.count) != 1: ix = str(int(ix) * per) if _is_const(ix) else self.emit(f"mul i64 {ix}, {per}")
    if src.idx is not None: ix = self.emit(f"add i64 {src.idx}, {ix}")
    self.ptrs[u] = Ptr(src.base, ix, and_gates(src.gate, gate, lambda a, b: self.emit(f"and i1 {a}, {b}")), src.elem)

  def address(self, p: Ptr) -> str:
    return p.base if p.idx is None else self.emit(f"getelementptr inbounds {memory_type(p.elem)}, ptr {p.base}, i64 {p.idx}")

  def gated(self, gate: str | None, t: str, access: Callable[[], str], alt: str) -> str:
    """The value `access()` emits, or `alt` where `gate` is false (memory is only touched in a branch taken on the gate)."""
    if gate is None: return access()
    yes, join, pre = self.label("load"), self.label("loaded"), self.block
    self.line(f"br i1 {gate}, label %{yes}, label %{join}")
    self.start(yes)
    x = access()
    came = self.block
    self.line(f"br label %{join}")
    self.start(join)
    return self.emit(f"phi {t} [ {x}, %{came} ], [ {alt}, %{pre} ]")

  def masked(self, store: bool, d: DType) -> str:
    """LLVM's masked load (store) of vector `d` in memory (declared once): only the lanes whose i1 is set touch memory."""
    t = mtype(d)
    elem = memory_type(d.scalar())
    fn = f"@llvm.masked.{'store' if store else 'load'}.v{d.count}{_MANGLE.get(elem, elem)}.p0"
    mask = f"<{d.count} x i1>"
    self.need(fn, f"declare void {fn}({t}, ptr, i32, {mask})" if store else f"declare {t} {fn}(ptr, i32, {mask}, {t})")
    return fn

  def load(self, u: UOp) -> str:
    p, dt = self.ptrs[u.src[0]], u.dtype
    if lane_gate(u.src[0]) is not None:  # a vector gate (Renderer.masked_access): one masked load, the other lanes 0
      x = self.emit(f"call {mtype(dt)} {self.masked(False, dt)}(ptr {self.address(p)}, i32 {p.elem.itemsize}, <{dt.count} x i1> {p.gate}, "
                    f"{mtype(dt)} zeroinitializer)")
      return self.from_memory(x, dt)
    alt = u.src[1] if len(u.src) > 1 and u.src[1].dtype is not dtypes.void else None
    d = dt if dt.count > 1 else p.elem  # a vector: the contiguous elements from the address
    def access() -> str: return self.from_memory(self.emit(f"load {mtype(d)}, ptr {self.address(p)}, align {p.elem.itemsize}"), d)
    return self.gated(p.gate, ltype(d), access, self.v[alt] if alt is not None else "zeroinitializer" if dt.count > 1 else scalar_const(0, p.elem))

  def store(self, u: UOp) -> None:
    p, val = self.ptrs[u.src[0]], u.src[1]
    d = val.dtype if val.dtype.count > 1 else p.elem
    def write() -> None:
      if u.arg is not Ops.ADD: return self.line(f"store {mtype(d)} {self.to_memory(self.v[val], d)}, ptr {self.address(p)}, align {p.elem.itemsize}")
      if p.elem not in self.r.atomic_add: raise RendererError(f"{self.r.device}: no atomic add of {p.elem!r} (Renderer.atomic_add)")
      op = "add" if dtypes.is_int(d) else "fadd"
      self.emit(f"atomicrmw {op} ptr {self.address(p)}, {mtype(d)} {self.v[val]} monotonic, align {p.elem.itemsize}")
    if p.gate is None: return write()
    if lane_gate(u.src[0]) is not None:
      return self.line(f"call void {self.masked(True, d)}({mtype(d)} {self.to_memory(self.v[val], d)}, ptr {self.address(p)}, "
                       f"i32 {p.elem.itemsize}, <{d.count} x i1> {p.gate})")
    yes, join = self.label("store"), self.label("stored")
    self.line(f"br i1 {p.gate}, label %{yes}, label %{join}")
    self.start(yes)
    write()
    self.line(f"br label %{join}")
    self.start(join)


__all__ = ["LLVMRenderer", "ltype", "memory_type", "mtype", "scalar_const", "scalar_type"]
