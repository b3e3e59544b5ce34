"""The WEBGPU renderer: one WGSL compute shader per LINEAR program.

It subclasses the base `Renderer`, not `CStyleRenderer`: WGSL is C-like in its expressions but not in what the C base
is built on (typed declarations `T x = e;`, `?:`, casts `(T)x`, unions for bitcasts, pointer arithmetic for vector
access, 64-bit helper code), so sharing it would mean overriding most of it. What it keeps of the C base: values used
once in their own block are inlined, the rest are named with `let`; loads are always named; a pointer is one address
(buffer, index, gate): the codegen splits vectors of addresses (codegen/decompose.py).

The shader's interface, which the runtime relies on:

* storage buffer `slot` of the program is `@group(0) @binding(slot) var<storage, read_write> dataSLOT` (all read_write:
  one buffer may be passed in two slots, and WebGPU refuses a buffer bound read-only and writable in one dispatch);
* the uniform `@binding(len(buffers))` holds, when the kernel needs it, the folded launch size (`FOLD_MARK`) and then
  the variables in `program.vars` order, each an i32;
* the entry point is `identifier(program.name)`, its `@workgroup_size` the sizes of the `lidxN` SPECIALs.

Launch dims: `gidxN` is the workgroup id. A dispatch may have at most `limits.workgroups` (65535 on most adapters) per
dimension, so when a `gidxN` size can exceed that the kernel is rendered "folded" (the source holds `FOLD_MARK`): the
runtime dispatches the product of the three sizes spread over x and y, and the kernel recovers the ids from its linear
workgroup index (workgroups past the end return at once; that is uniform control flow, so barriers stay valid).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from plugrad.backend import (
  PURE,
  DType,
  GroupOp,
  Ops,
  PtrDType,
  Renderer,
  RendererError,
  UOp,
  and_gates,
  define_of,
  dtypes,
  index_parts,
  linear_parts,
  use_analysis,
)
from plugrad_webgpu.context import Limits
from plugrad_webgpu.wgsl import DEPENDS, HELPERS, PACKED, UNSUPPORTED, bits_of, identifier, literal, scalar_type, vector_type

FOLD_MARK = "// plugrad-webgpu: folded launch (workgroup ids recovered from a linear index; sizes in pg_args.g)"
_INFIX = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.FDIV: "/", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^", Ops.CMPLT: "<", Ops.CMPNE: "!=",
          Ops.CMPEQ: "=="}
_INFIX_NAME = {Ops.CMPLT: "lt", Ops.CMPNE: "ne", Ops.CMPEQ: "eq"}  # float comparisons go through nan-testing helpers (wgsl.py)
_BOOL = {Ops.ADD: "({0} || {1})", Ops.MAX: "({0} || {1})", Ops.OR: "({0} || {1})", Ops.MUL: "({0} && {1})", Ops.AND: "({0} && {1})",
         Ops.SUB: "({0} != {1})", Ops.XOR: "({0} != {1})", Ops.NEG: "(!{0})", Ops.CMPLT: "(!{0} && {1})", Ops.CMPNE: "({0} != {1})",
         Ops.CMPEQ: "({0} == {1})", Ops.MULACC: "(({0} && {1}) || {2})", Ops.TRUNC: "{0}", Ops.POW: "({0} || !{1})"}
_MATH = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt", Ops.TRUNC: "trunc", Ops.POW: "pow", Ops.MULACC: "fma"}
_PREFIX = {Ops.LOAD: "val", Ops.CAST: "cast", Ops.BITCAST: "cast", Ops.VECTORIZE: "vec", Ops.GEP: "gep", Ops.VCONST: "vconst", Ops.CUSTOM: "custom"}


class WGSLRenderer(Renderer):
  """WGSL for one adapter: `limits` are the adapter's (see `context.Limits`), `float16` whether it has `shader-f16`."""
  has_local = has_shared = True
  supports_float4 = False
  native_math = GroupOp.Transcendental  # WGSL's exp2, log2, sin (the conformance suite holds them to its float32 tolerances)
  # WGSL's atomicAdd on atomic<i32>/<u32>; float32 as a compare-exchange loop on its bits in an atomic<u32>
  atomic_add = frozenset({dtypes.int32, dtypes.uint32, dtypes.float32})

  def __init__(self, device: str, limits: Limits, float16: bool, adapter: str = "the adapter"):
    super().__init__(device)
    self.limits, self.native_float16, self.adapter = limits, float16, adapter
    self.local_max = limits.workgroup_size
    # a long gidx0 is folded onto two dispatch dimensions (see the module docstring), so the codegen may use up to lim^2
    self.global_max = (min(limits.workgroups ** 2, 2**31 - 1), limits.workgroups, limits.workgroups)
    self.shared_max = limits.workgroup_storage
    self.capabilities = frozenset({"locals", "shared", "float16", "bfloat16"})
    self.validate()

  def __repr__(self) -> str:
    return f"<WGSLRenderer {self.device}: {self.adapter}, float16 {'native (shader-f16)' if self.native_float16 else 'emulated in f32'}>"

  def dtype_support(self, dt: DType) -> str | None:
    return UNSUPPORTED.get(dt.scalar())

  def render(self, program: UOp) -> str:
    name, uops = linear_parts(program)
    return _Kernel(self, name, uops).render()


@dataclass(frozen=True)
class Mem:
  """A memory a kernel indexes: a storage buffer (`kind` "global"), workgroup memory ("local") or a register array ("reg")."""
  name: str
  kind: str
  dtype: DType          # the scalar element dtype
  packed: bool = False  # elements packed into u32 words (8/16-bit dtypes in storage buffers)
  atomic: bool = False  # the words are atomic<u32> (the kernel writes this packed buffer), or atomic (it adds to it atomically)


@dataclass(frozen=True)
class Ptr:
  """A pointer value: element `idx` ("": element 0) of `mem`, accessed where `gate` holds (None: always)."""
  mem: Mem
  idx: str
  gate: str | None


@dataclass
class _Kernel:
  """The state of rendering one program (a fresh one per `render`, so one renderer may render from several threads)."""
  ren: WGSLRenderer
  name: str
  uops: Sequence[UOp]
  r: dict[UOp, str] = field(default_factory=dict)
  ptrs: dict[UOp, Ptr] = field(default_factory=dict)
  body: list[str] = field(default_factory=list)
  decls: list[str] = field(default_factory=list)
  helpers: dict[str, str] = field(default_factory=dict)
  depth: int = 1
  names: set[str] = field(default_factory=set)

  # ---- names, types, helpers
  def unique(self, base: str) -> str:
    n, i = base, 1
    while n in self.names: n, i = f"{base}_{i}", i + 1
    self.names.add(n)
    return n

  def st(self, dt: DType) -> str: return scalar_type(dt.scalar(), self.ren.native_float16)
  def ty(self, dt: DType) -> str: return vector_type(self.st(dt), dt.count)
  def lit(self, v: float | int | bool, dt: DType) -> str:
    s = literal(v, dt, self.ren.native_float16)
    for h in ("pg_inf_f32", "pg_nan_f32", "pg_inf_f16", "pg_nan_f16"):
      if h in s: self.need(h)
    return s

  def need(self, name: str, code: str | None = None) -> str:
    if name not in self.helpers:
      for dep in DEPENDS.get(name, ()): self.need(dep)
      self.helpers[name] = code if code is not None else HELPERS[name]
    return name

  def line(self, s: str) -> None: self.body.append("  " * self.depth + s)

  def emulated(self, dt: DType) -> bool:
    """A float16 computed in f32 and rounded after every op (bfloat16 never gets here: codegen/decompose.py)."""
    return dt is dtypes.float16 and not self.ren.native_float16

  def packed(self, dt: DType) -> bool: return dt in PACKED or (dt is dtypes.float16 and not self.ren.native_float16)

  def round16(self, x: str, dt: DType) -> str:
    """An f32 value rounded to float16 (kept in f32)."""
    return f"{self.need('pg_f16')}({x})"

  def narrow(self, x: str, dt: DType) -> str:
    """An i32/u32 value brought back into the range of the narrow integer `dt` (wrap-around, like C's conversion)."""
    if dt in (dtypes.int8, dtypes.int16): return f"(({x} << {32 - bits_of(dt)}u) >> {32 - bits_of(dt)}u)"
    if dt in (dtypes.uint8, dtypes.uint16): return f"({x} & {(1 << bits_of(dt)) - 1}u)"
    return x

  def to_bits(self, x: str, dt: DType) -> str:
    """The bit pattern of scalar value `x` of `dt` in the low bits of a u32 (higher bits may be set for signed narrow ints)."""
    if dt is dtypes.bool: return f"select(0u, 1u, {x})"
    # (naga cannot bitcast vec2<f16>; packing an f16 value widened to f32 is exact)
    if dt is dtypes.float16: return f"pack2x16float(vec2<f32>({'f32(' + x + ')' if self.ren.native_float16 else x}, 0.0f))"
    return x if self.st(dt) == "u32" else f"bitcast<u32>({x})"

  def from_bits(self, b: str, dt: DType) -> str:
    """The value of `dt` whose bit pattern is in the low bits of u32 `b` (the bits above are zero)."""
    if dt is dtypes.bool: return f"({b} != 0u)"
    if dt is dtypes.float16: return f"f16(unpack2x16float({b}).x)" if self.ren.native_float16 else f"unpack2x16float({b}).x"
    if dt in (dtypes.int8, dtypes.int16): return f"(bitcast<i32>({b} << {32 - bits_of(dt)}u) >> {32 - bits_of(dt)}u)"
    if dt is dtypes.int32: return f"bitcast<i32>({b})"
    if dt is dtypes.float32: return f"bitcast<f32>({b})"
    return b

  # ---- the kernel
  def render(self) -> str:
    ren = self.ren
    for u in self.uops:
      if (bad := UNSUPPORTED.get(u.dtype.scalar() if not isinstance(u.dtype, PtrDType) else u.dtype.base.scalar())) is not None:
        raise RendererError(f"WEBGPU cannot render kernel {self.name!r}: {u.op.name} of {u.dtype!r} ({bad})")
    self._analyze()
    buffers = sorted((u for u in self.uops if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg)
    if len(buffers) > ren.limits.storage_buffers:
      raise RendererError(f"kernel {self.name!r} binds {len(buffers)} storage buffers; {ren.adapter} allows {ren.limits.storage_buffers} per kernel")
    variables = sorted((u for u in self.uops if u.op is Ops.DEFINE_VAR), key=lambda u: u.arg[0])
    wg = self._workgroup_size()
    gidx = [u for u in self.uops if u.op is Ops.SPECIAL and u.arg.startswith("g")]
    fold = any(u.src[0].vmax > ren.limits.workgroups for u in gidx)
    for u in buffers:
      dt = u.dtype.base.scalar()
      packed = self.packed(dt)
      mem = Mem(f"data{u.arg}", "global", dt, packed, packed and u in self.written or u in self.added)
      self.names.add(mem.name)
      self.ptrs[u] = Ptr(mem, "", None)
      elem = ("atomic<u32>" if mem.atomic else "u32") if packed else f"atomic<{self._word(dt)}>" if mem.atomic else self.st(dt)
      self.decls.append(f"@group(0) @binding({u.arg}) var<storage, read_write> {mem.name}: array<{elem}>;")
    fields = (["g: vec3<u32>"] if fold else []) + [f"{self.var_name(v)}: i32" for v in variables]
    if fields:
      self.decls.append("struct PgArgs {\n" + "".join(f"  {f},\n" for f in fields) + "}")
      self.decls.append(f"@group(0) @binding({len(buffers)}) var<uniform> pg_args: PgArgs;")
    for v in variables: self.r[v] = f"pg_args.{self.var_name(v)}"
    if fold:
      self.line("let pg_lin = pg_wid.x + pg_wid.y * pg_nwg.x;")
      self.line("if (pg_lin >= pg_args.g.x * pg_args.g.y * pg_args.g.z) { return; }")
    for i, u in enumerate(self.uops): self._uop(i, u, fold)
    self._check_shared()
    kname = identifier(self.name)
    head = [FOLD_MARK] if fold else []
    if ren.native_float16 and any((u.dtype.base if isinstance(u.dtype, PtrDType) else u.dtype).scalar() is dtypes.float16 for u in self.uops):
      head.append("enable f16;")
    sig = (f"@compute @workgroup_size({wg[0]}, {wg[1]}, {wg[2]})\nfn {kname}(@builtin(workgroup_id) pg_wid: vec3<u32>, "
           "@builtin(local_invocation_id) pg_lid: vec3<u32>, @builtin(num_workgroups) pg_nwg: vec3<u32>) {")
    parts = [*head, f"// kernel {self.name}", *self.decls, *self.helpers.values(), sig, *self.body, "}"]
    return "\n".join(parts) + "\n"

  def var_name(self, v: UOp) -> str: return identifier(f"v_{v.arg[0]}")

  def _workgroup_size(self) -> tuple[int, int, int]:
    wg = [1, 1, 1]
    for u in self.uops:
      if u.op is Ops.SPECIAL and u.arg.startswith("l"):
        if u.src[0].op is not Ops.CONST: raise RendererError(f"kernel {self.name!r}: the workgroup size {u.arg} must be a constant in WGSL")
        wg[int(u.arg[-1])] = u.src[0].arg
    lim = self.ren.limits
    if any(w > m for w, m in zip(wg, lim.workgroup_size)) or wg[0] * wg[1] * wg[2] > lim.invocations:
      raise RendererError(f"kernel {self.name!r}: workgroup {tuple(wg)} exceeds {self.ren.adapter}'s limits "
                          f"({lim.workgroup_size} per dimension, {lim.invocations} threads)")
    return wg[0], wg[1], wg[2]

  def _check_shared(self) -> None:
    # narrow dtypes take a whole 32-bit word each in workgroup memory (they are kept in their compute type)
    used = sum((2 if self.st(u.dtype.base) == "f16" else 4) * _elems(u.dtype) for u in self.uops if u.op is Ops.DEFINE_LOCAL)
    if used > self.ren.limits.workgroup_storage:
      raise RendererError(f"kernel {self.name!r} needs {used} bytes of workgroup memory; {self.ren.adapter} has {self.ren.limits.workgroup_storage}")

  def _analyze(self) -> None:
    """Use counts and the block of each use (to inline single-use values), and the buffers the kernel writes."""
    self.uses, self.inline, self.written = use_analysis(self.uops)
    self.added = {b for u in self.uops if u.op is Ops.STORE and u.arg is Ops.ADD and (b := define_of(u.src[0])) is not None}

  def _define(self, i: int, u: UOp, expr: str) -> None:
    if u in self.inline: self.r[u] = expr
    elif self.uses.get(u, 0) == 0 and u.op in PURE | {Ops.VECTORIZE, Ops.VCONST, Ops.LOAD}: return  # unused, no effects
    else:
      self.r[u] = n = self.unique(f"{_PREFIX.get(u.op, 'alu')}{i}")
      self.line(f"let {n} = {expr};")

  def _uop(self, i: int, u: UOp, fold: bool) -> None:
    op, r = u.op, self.r
    if op in (Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR): return
    if op is Ops.CONST: r[u] = self.lit(u.arg, u.dtype)
    elif op is Ops.VCONST: self._define(i, u, f"{self.ty(u.dtype)}({', '.join(self.lit(v, u.dtype.scalar()) for v in u.arg)})")
    elif op is Ops.SPECIAL:
      axis = "xyz"[int(u.arg[-1])]
      if u.arg.startswith("l"): expr = f"i32(pg_lid.{axis})"
      elif not fold: expr = f"i32(pg_wid.{axis})"
      else: expr = {"x": "i32(pg_lin % pg_args.g.x)", "y": "i32((pg_lin / pg_args.g.x) % pg_args.g.y)",
                    "z": "i32(pg_lin / (pg_args.g.x * pg_args.g.y))"}[axis]
      r[u] = self.unique(u.arg)
      self.line(f"let {r[u]} = {expr};")
    elif op is Ops.DEFINE_LOCAL:
      mem = Mem(self.unique(identifier(u.arg, "l_")), "local", u.dtype.base.scalar())
      self.ptrs[u] = Ptr(mem, "", None)
      self.decls.append(f"var<workgroup> {mem.name}: array<{self.st(mem.dtype)}, {_elems(u.dtype)}>;")
    elif op is Ops.DEFINE_REG:
      mem = Mem(self.unique(f"acc{u.arg}"), "reg", u.dtype.base.scalar())
      self.ptrs[u] = Ptr(mem, "", None)
      self.line(f"var {mem.name}: array<{self.st(mem.dtype)}, {_elems(u.dtype)}>;")
    elif op is Ops.RANGE:
      n = r[u] = self.unique(f"ridx{u.arg[0]}")
      self.line(f"for (var {n}: {self.st(u.dtype)} = {self.lit(0, u.dtype)}; {n} < {r[u.src[0]]}; {n}++) {{")
      self.depth += 1
    elif op is Ops.IF:
      self.line(f"if ({r[u.src[0]]}) {{")
      self.depth += 1
    elif op in (Ops.ENDRANGE, Ops.ENDIF):
      self.depth -= 1
      self.line("}")
    elif op is Ops.BARRIER: self.line("workgroupBarrier();")
    elif isinstance(u.dtype, PtrDType): self._pointer(u)
    elif op is Ops.LOAD: self._load(i, u)
    elif op is Ops.STORE: self._store(u)
    elif op is Ops.VECTORIZE: self._define(i, u, f"{self.ty(u.dtype)}({', '.join(r[s] for s in u.src)})")
    elif op is Ops.GEP:
      s = u.src[0]
      lanes = [self.gep(r[s], s.dtype, j) for j in u.arg]
      self._define(i, u, lanes[0] if len(lanes) == 1 else f"{self.ty(u.dtype)}({', '.join(lanes)})")
    elif op is Ops.CAST:
      s0 = u.src[0]
      self._define(i, u, self._lanewise(u.dtype, [s0], lambda a: self.cast(a[0], s0.dtype.scalar(), u.dtype.scalar())))
    elif op is Ops.BITCAST:
      s0 = u.src[0]
      self._define(i, u, self._lanewise(u.dtype, [s0], lambda a: self.bitcast(a[0], s0.dtype.scalar(), u.dtype.scalar())))
    elif (op is Ops.FDIV and u.src[1].op is Ops.CONST and u.src[1].arg == 0) or \
        (op is Ops.MUL and dtypes.is_float(u.dtype) and any(s.op is Ops.CONST and s.arg == 0 for s in u.src)):
      x, zero = (u.src[0], u.src[1]) if u.src[1].op is Ops.CONST and u.src[1].arg == 0 else (u.src[1], u.src[0])
      helper, sign = ("pg_fdiv0_f32", "-1.0f" if math.copysign(1.0, zero.arg) < 0 else "1.0f") if op is Ops.FDIV else \
        ("pg_fmul0_f32", "0x80000000u" if math.copysign(1.0, zero.arg) < 0 else "0u")
      self._define(i, u, self._lanewise(u.dtype, [x], lambda a: self.by_zero(helper, a[0], u.dtype.scalar(), sign)))
    elif op in GroupOp.ALU:
      sdt = u.src[-1].dtype if op is Ops.WHERE else u.src[0].dtype
      self._define(i, u, self._lanewise(u.dtype, list(u.src), lambda a: self.alu(op, u.dtype.scalar(), sdt.scalar(), a)))
    elif op in (Ops.CUSTOM, Ops.CUSTOMI):
      code = u.arg.format(*(r[s] for s in u.src if s in r))
      if u.dtype is dtypes.void: self.line(code if code.rstrip().endswith((";", "}")) else code + ";")
      else: self._define(i, u, code)
    else: raise RendererError(f"WEBGPU cannot render {op.name} (uop #{i} of kernel {self.name!r})")

  def gep(self, x: str, dt: DType, j: int) -> str: return x if dt.count == 1 else f"{x}[{j}]"

  def _lanewise(self, dt: DType, srcs: list[UOp], fn: Callable[[list[str]], str]) -> str:
    args = [self.r[s] for s in srcs]
    if dt.count == 1 and all(s.dtype.count == 1 for s in srcs): return fn(args)
    n = max(dt.count, *(s.dtype.count for s in srcs))
    return f"{self.ty(dt)}({', '.join(fn([self.gep(a, s.dtype, j) for a, s in zip(args, srcs)]) for j in range(n))})"

  # ---- values
  def alu(self, op: Ops, dt: DType, sdt: DType, a: list[str]) -> str:
    """Scalar `op` with result dtype `dt` on operands `a` of dtype `sdt` (the first source's; WHERE: the values')."""
    if op is Ops.WHERE: return f"select({a[2]}, {a[1]}, {a[0]})"
    if sdt is dtypes.bool or dt is dtypes.bool and op not in GroupOp.Comparison:
      if op not in _BOOL: raise RendererError(f"WEBGPU: no bool {op.name}")
      return _BOOL[op].format(*a)
    if op in GroupOp.Comparison and dtypes.is_float(sdt):
      return f"{self.need(f'pg_{_INFIX_NAME[op]}_{self.st(sdt)}')}({a[0]}, {a[1]})"
    if op in GroupOp.Comparison: return f"({a[0]} {_INFIX[op]} {a[1]})"
    t = self.st(dt)
    if dtypes.is_int(dt):
      if op in _INFIX: e = f"({a[0]} {_INFIX[op]} {a[1]})"
      elif op is Ops.NEG: e = f"(-{a[0]})" if t == "i32" else f"(0u - {a[0]})"
      elif op is Ops.MULACC: e = f"(({a[0]} * {a[1]}) + {a[2]})"
      elif op is Ops.MAX: return f"max({a[0]}, {a[1]})"
      elif op is Ops.TRUNC: return a[0]
      elif op in (Ops.IDIV, Ops.MOD) and t == "u32": e = f"({a[0]} {'/' if op is Ops.IDIV else '%'} {a[1]})"
      elif op in (Ops.IDIV, Ops.MOD, Ops.POW): e = f"{self.need(f'pg_{op.name.lower()}_{t}')}({a[0]}, {a[1]})"
      # the amount is in [0, bits) (codegen/decompose.py guards it); WGSL wants it as u32
      elif op in (Ops.SHL, Ops.SHR): e = f"({a[0]} {'<<' if op is Ops.SHL else '>>'} u32({a[1]}))"
      else: raise RendererError(f"WEBGPU: no integer {op.name} for {dt!r}")
      return self.narrow(e, dt)
    if op in _INFIX: e = f"({a[0]} {_INFIX[op]} {a[1]})"
    elif op is Ops.NEG: return f"(-{a[0]})"
    elif op is Ops.RECIPROCAL: e = f"({self.lit(1.0, dt)} / {a[0]})"
    elif op in _MATH: e = f"{_MATH[op]}({', '.join(a)})"
    else: raise RendererError(f"WEBGPU: no float {op.name}")
    return self.round16(e, dt) if self.emulated(dt) else e

  def by_zero(self, helper: str, x: str, dt: DType, sign: str) -> str:
    """x / ±0 or x * ±0 with a literal zero, through a helper that llvmpipe cannot fold (wgsl.py)."""
    e = f"{self.need(helper)}({x if self.st(dt) == 'f32' else f'f32({x})'}, {sign})"
    return e if self.st(dt) == "f32" else f"f16({e})"

  def cast(self, x: str, src: DType, dst: DType) -> str:
    """Scalar conversion with the interpreter's semantics."""
    if src is dst: return x
    if dst is dtypes.bool: return f"({x} != {self.lit(0, src)})"
    if src is dtypes.bool: return f"select({self.lit(0, dst)}, {self.lit(1, dst)}, {x})"
    ts, td = self.st(src), self.st(dst)
    if dtypes.is_int(dst):
      if dtypes.is_int(src): return self.narrow(x if ts == td else f"{td}({x})", dst)
      bits = f"{self.need('pg_f2u')}({x if ts == 'f32' else f'f32({x})'})"
      return self.narrow(bits if td == "u32" else f"bitcast<i32>({bits})", dst)
    v = x if ts == td else f"{td}({x})"
    return self.round16(v, dst) if self.emulated(dst) else v

  def bitcast(self, x: str, src: DType, dst: DType) -> str:
    if src.itemsize != dst.itemsize: raise RendererError(f"WEBGPU: bitcast between sizes ({src!r} to {dst!r})")
    b = self.to_bits(x, src)
    if bits_of(src) < 32 and src in (dtypes.int8, dtypes.int16): b = f"({b} & {(1 << bits_of(src)) - 1}u)"
    return self.from_bits(b, dst)

  # ---- memory
  def _pointer(self, u: UOp) -> None:
    src = self.ptrs[u.src[0]]
    if (parts := index_parts("WEBGPU", u)) is None:
      self.ptrs[u] = src
      return
    ix, gate = self.r[parts[0]], (None if parts[1] is None else self.r[parts[1]])
    if (per := u.src[0].dtype.base.count) != 1: ix = f"({ix} * {per})"
    self.ptrs[u] = Ptr(src.mem, ix if not src.idx else f"({src.idx} + {ix})", and_gates(src.gate, gate, lambda a, b: f"({a} && {b})"))

  def _read(self, mem: Mem, idx: str) -> str:
    if mem.atomic and not mem.packed: return self._from_word(f"atomicLoad(&{mem.name}[{idx}])", mem.dtype)
    if not mem.packed: return f"{mem.name}[{idx}]"
    return self.from_bits(f"{self._packed_helper(mem, 'ld')}({idx})", mem.dtype)

  def _write(self, mem: Mem, idx: str, v: str) -> str:
    if mem.atomic and not mem.packed: return f"atomicStore(&{mem.name}[{idx}], {self._to_word(v, mem.dtype)});"
    if not mem.packed: return f"{mem.name}[{idx}] = {v};"
    return f"{self._packed_helper(mem, 'st')}({idx}, {self.to_bits(v, mem.dtype)});"

  # a 32-bit buffer the kernel adds to atomically holds atomic words: i32 for int32, u32 (the bits) for the others
  def _word(self, dt: DType) -> str: return "i32" if dt is dtypes.int32 else "u32"
  def _to_word(self, v: str, dt: DType) -> str: return v if dt in (dtypes.int32, dtypes.uint32) else f"bitcast<u32>({v})"
  def _from_word(self, w: str, dt: DType) -> str: return w if dt in (dtypes.int32, dtypes.uint32) else f"bitcast<{self.st(dt)}>({w})"

  def _atomic_add(self, mem: Mem, idx: str, v: str) -> str:
    if mem.kind != "global" or mem.dtype not in self.ren.atomic_add:
      raise RendererError(f"WEBGPU: no atomic add of {mem.dtype!r} into {mem.kind} memory (kernel {self.name!r})")
    if mem.dtype is not dtypes.float32: return f"atomicAdd(&{mem.name}[{idx}], {v});"
    # per buffer, as _packed_helper: WGSL cannot pass a pointer into a storage buffer to a function
    name = f"pg_add_{mem.name}"
    self.need(name, f"""fn {name}(i: i32, v: f32) {{
  var old = atomicLoad(&{mem.name}[i]);
  loop {{
    let r = atomicCompareExchangeWeak(&{mem.name}[i], old, bitcast<u32>(bitcast<f32>(old) + v));
    if (r.exchanged) {{ break; }}
    old = r.old_value;
  }}
}}""")
    return f"{name}({idx}, {v});"

  def _packed_helper(self, mem: Mem, kind: str) -> str:
    """Per-buffer load/store of element `i` of a packed buffer (WGSL cannot pass a pointer to a storage buffer to a function)."""
    name, per = f"pg_{kind}_{mem.name}", 32 // bits_of(mem.dtype)
    mask, lg, sh = (1 << bits_of(mem.dtype)) - 1, per.bit_length() - 1, bits_of(mem.dtype).bit_length() - 1
    word, shift = f"{mem.name}[u32(i) >> {lg}u]", f"((u32(i) & {per - 1}u) << {sh}u)"
    if kind == "ld": code = f"fn {name}(i: i32) -> u32 {{ return ({'atomicLoad(&' + word + ')' if mem.atomic else word} >> {shift}) & {mask}u; }}"
    else:
      code = (f"fn {name}(i: i32, b: u32) {{\n  let s = {shift};\n  atomicAnd(&{word}, ~({mask}u << s));\n"
              f"  atomicOr(&{word}, (b & {mask}u) << s);\n}}")
    return self.need(name, code)

  # a vector access is the contiguous elements from the address, one by one (WGSL arrays hold scalars)
  def _element(self, p: Ptr, j: int) -> str: return (p.idx or "0") if j == 0 else f"({p.idx or '0'} + {j})"

  def _load(self, i: int, u: UOp) -> None:
    p, dt = self.ptrs[u.src[0]], u.dtype
    alt = u.src[1] if len(u.src) > 1 and u.src[1].dtype is not dtypes.void else None
    parts = []
    for j in range(dt.count):
      v = self._read(p.mem, self._element(p, j))
      if p.gate is not None: v = f"select({self.gep(self.r[alt], dt, j) if alt is not None else self.lit(0, p.mem.dtype)}, {v}, {p.gate})"
      parts.append(v)
    self._define(i, u, parts[0] if dt.count == 1 else f"{self.ty(dt)}({', '.join(parts)})")

  def _store(self, u: UOp) -> None:
    p, val = self.ptrs[u.src[0]], u.src[1]
    for j in range(val.dtype.count):
      idx, v = self._element(p, j), self.gep(self.r[val], val.dtype, j)
      st = self._atomic_add(p.mem, idx, v) if u.arg is Ops.ADD else self._write(p.mem, idx, v)
      self.line(st if p.gate is None else f"if ({p.gate}) {{ {st} }}")


def _elems(dt: DType) -> int:
  """Scalar elements of a LOCAL/REG pointer's memory."""
  if not isinstance(dt, PtrDType): raise RendererError(f"expected a pointer dtype, got {dt!r}")
  return dt.size * dt.base.count



__all__ = ["FOLD_MARK", "Mem", "Ptr", "WGSLRenderer"]
