"""The CPU renderer: C with GNU vector types, one kernel per shared object, run by host threads.

The kernel takes two extra parameters, `core_id` and `core_count`: when the program has one parallel output loop (a
RANGE of axis type LOOP or GLOBAL around all of the kernel's memory effects) or launch indices (`gidxN`, rendered as
loops over their sizes), thread `core_id` of `core_count` runs its own contiguous share of that loop, and the source
says so with `PARALLEL_MARK`. Kernels without one are run by a single thread.

16-bit floats: `_Float16` where the compiler has it, else stored as uint16 and converted with round-to-nearest-even,
exactly like the interpreter; bfloat16 values compute in float and are stored as `__bf16` where the compiler has it
(`native_bfloat16`), else the codegen emulates them before rendering (codegen/decompose.py).

Tensor cores (`tensor_cores`, chosen by tensor_cores.py from the CPU and the compiler): a WMMA is a call of a small
helper around the compiler's intrinsics from <immintrin.h> (`_mm512_dpbf16_ps`, `_mm512_dpbusd_epi32`; AMX:
`_tile_loadconfig`, `_tile_loadd`, `_tile_dpbf16ps` / `_tile_dpbssd`, `_tile_stored`, `_tile_release`). bfloat16
fragments arrive as floats holding bfloat16 numbers (native or emulated alike), so their top halves are the bfloat16
bits, taken exactly. The AMX helper configures the tiles itself (16 rows of 64 bytes; the configuration is thread
state that a call may not preserve) and releases them, so each WMMA stands alone: correct, not fast.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from plugrad.backend import (
  AddrSpace,
  AxisType,
  CStyleRenderer,
  DType,
  GroupOp,
  Ops,
  Ptr,
  PtrDType,
  Renderer,
  RendererError,
  TensorCore,
  UOp,
  c_identifier,
  dtypes,
  find_tensor_core,
)
from plugrad_cpu.tensor_cores import AMX_MARK, FUSE_ACCUMULATE, emulate_target

# CPUProgram runs a kernel on several threads when its source contains this text (the LLVM renderer writes it as a comment too)
PARALLEL_MARK = "/* plugrad-cpu: parallel loop, split across core_count threads */"

_NATIVE_VEC = frozenset({dtypes.float32, dtypes.float64, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64})
_NATIVE_OPS = frozenset({Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.AND, Ops.OR, Ops.XOR, Ops.NEG})

# float <-> IEEE half without compiler support (F. Giesen's branch-light conversions, round to nearest even)
_F16_HELPERS = """\
static inline float pg_f16_to_f32(unsigned short h) {
  union { unsigned int u; float f; } o, magic; magic.u = 113u << 23;
  o.u = (h & 0x7fffu) << 13;
  unsigned int exp = o.u & (0x7c00u << 13);
  o.u += (127u - 15u) << 23;
  if (exp == (0x7c00u << 13)) o.u += (128u - 16u) << 23;  /* inf, nan */
  else if (exp == 0) { o.u += 1u << 23; o.f -= magic.f; }  /* zero, subnormal */
  o.u |= (unsigned int)(h & 0x8000u) << 16;
  return o.f;
}
static inline unsigned short pg_f32_to_f16(float f) {
  union { float f; unsigned int u; } x, magic; x.f = f; magic.u = 126u << 23;
  unsigned int sign = x.u & 0x80000000u, o;
  x.u ^= sign;
  if (x.u >= (143u << 23)) o = x.u > 0x7f800000u ? 0x7e00u : 0x7c00u;  /* overflow to inf; nan stays nan */
  else if (x.u < (113u << 23)) { x.f += magic.f; o = x.u - magic.u; }  /* subnormal or zero */
  else { unsigned int odd = (x.u >> 13) & 1u; x.u += ((unsigned int)(15 - 127) << 23) + 0xfffu + odd; o = x.u >> 13; }
  return (unsigned short)(o | (sign >> 16));
}"""


class CPUMath(Renderer):
  """The transcendentals of both CPU renderers: libm's, except float32 vector exp2. Both compilers turn an exp2 of a vector
  into one libm call per lane (softmax's exp ran at ~1 G/s on 2 threads and made every kernel with an exp compute-bound,
  issue 20), so the codegen writes it out as vector arithmetic (codegen/decompose.py). A scalar exp2 keeps libm: as
  scalar code the arithmetic measured 5x slower through LLVM."""
  native_math = GroupOp.Transcendental
  full_pow = True  # libm's pow
  atomic_add = frozenset({dtypes.float32, dtypes.float64, *dtypes.ints})  # lock-prefixed instructions (floats: compare-exchange loops)

  def math_is_native(self, op: Ops, dtype: DType) -> bool:
    return op in self.native_math and not (dtype.count > 1 and dtype.scalar() is dtypes.float32)


class CPURenderer(CPUMath, CStyleRenderer):
  """C for the host's compiler. `native_float16` / `native_bfloat16`: whether the compiler has `_Float16` / `__bf16`
  (from the toolchain probe); `vector_width`: the float lanes of one vector instruction (8 with AVX2, else 4)."""
  has_local = has_shared = False
  supports_float4 = offset_addressing = masked_access = True
  capabilities = frozenset({"float16", "bfloat16", "float64", "int64"})
  type_map = {**CStyleRenderer.type_map, dtypes.bool: "_Bool", dtypes.float16: "_Float16"}

  def __init__(self, device: str, native_float16: bool = True, native_bfloat16: bool = False, vector_width: int = 4,
               tensor_cores: tuple[TensorCore, ...] = ()):
    super().__init__(device)
    self.native_float16, self.native_bfloat16, self.vector_width = native_float16, native_bfloat16, vector_width
    with_tensor_cores(self, tensor_cores)
    self.validate()

  def __repr__(self) -> str:
    return (f"<CPURenderer {self.device}: float16 {'native' if self.native_float16 else 'emulated'}, "
            f"bfloat16 {'native' if self.native_bfloat16 else 'emulated'}, {self.vector_width}-wide float vectors>")

  # ---- masked vector access (a padded row's borders: codegen/expand.py)
  def _masked(self, dt: DType, store: bool) -> str:
    """The helper that loads (stores) vector `dt` of memory elements through a vector of bool gates, touching only the
    lanes whose gate is true: AVX's vmaskmovps for 4 or 8 lanes of 4 bytes, AVX-512's masked moves for 16, lane by
    lane elsewhere (a compiler may not turn that into one instruction: it could fault on a lane the gate excludes)."""
    t, n, s = self.tname(dt), dt.count, dt.scalar()
    m, fn = self.tname(dtypes.bool.vec(n)), f"pg_mask{'store' if store else 'load'}_{self.vector_name(dt)}"
    lanes = [self.render_gep("m", dtypes.bool.vec(n), j) for j in range(n)]
    sig = f"{self.helper_prefix}{'void' if store else t} {fn}({'' if store else 'const '}{self.tname(s)} *p, {m} m{f', {t} x' if store else ''})"
    plain = (" ".join(f"if ({g}) p[{j}] = x[{j}];" for j, g in enumerate(lanes)) if store else
             f"return ({t}){{{', '.join(f'{g} ? p[{j}] : ({self.tname(s)})0' for j, g in enumerate(lanes))}}};")
    fast = None
    if s.itemsize == 4 and self._gnu(dt) and n in (4, 8, 16):
      f32 = self.tname(dtypes.float32.vec(n))
      if n == 16:  # the mask is 16 bits, one per lane
        bits = " | ".join(f"((unsigned short){g} << {j})" for j, g in enumerate(lanes))
        fast = ("defined(__AVX512F__)", f"__builtin_ia32_storeups512_mask((void *)p, ({f32})x, {bits});" if store else
                f"return ({t})__builtin_ia32_loadups512_mask((const void *)p, ({f32}){{0}}, {bits});")
      else:  # a lane's sign bit selects it
        mask = f"(pg_imask{n}){{{', '.join(f'-(int){g}' for g in lanes)}}}"
        self.need(f"pg_imask{n}", f"typedef int pg_imask{n} __attribute__((vector_size({4 * n})));")
        b = "256" if n == 8 else ""
        fast = ("defined(__AVX__)", f"__builtin_ia32_maskstoreps{b}((void *)p, {mask}, ({f32})x);" if store else
                f"return ({t})__builtin_ia32_maskloadps{b}((const void *)p, {mask});")
    body = plain if fast is None else f"#if {fast[0]}\n  {fast[1]}\n#else\n  {plain}\n#endif"
    self.need(fn, f"{sig} {{\n  {body}\n}}")
    return fn

  def render_masked_load(self, p: Ptr, dt: DType) -> str:
    return f"{self._masked(self.mdt(dt), False)}({p.base}+{p.idx if p.idx is not None else 0}, {p.gate})"

  def render_masked_store(self, p: Ptr, dt: DType, value: str) -> str:
    return f"{self._masked(self.mdt(dt), True)}({p.base}+{p.idx if p.idx is not None else 0}, {p.gate}, {value});"

  def render_atomic_add(self, p: Ptr, value: str) -> str:
    ptr, dt = f"&{self._address(p, p.elem)}", p.elem
    if dtypes.is_int(dt): return f"__atomic_fetch_add({ptr}, {value}, __ATOMIC_RELAXED);"
    # GCC's atomic float `+=` brackets its loop with fenv calls (feholdexcept): the exchange on the bits does without
    t, bits = self.tname(dt), "unsigned int" if dt.itemsize == 4 else "unsigned long long"
    fn = f"atomic_add_{t}"
    self.need(fn, f"""static inline void {fn}({t} *p, {t} v) {{
  union {{ {t} f; {bits} u; }} old, add;
  old.u = __atomic_load_n(({bits} *)p, __ATOMIC_RELAXED);
  do add.f = old.f + v; while (!__atomic_compare_exchange_n(({bits} *)p, &old.u, add.u, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
}}""")
    return f"{fn}({ptr}, {value});"

  # ---- types
  def compute_dtype(self, dt: DType) -> DType:
    if dt is dtypes.bfloat16 or (dt is dtypes.float16 and not self.native_float16): return dtypes.float32
    return dt

  def storage_dtype(self, dt: DType) -> DType: return dtypes.uint16 if dt is dtypes.float16 and not self.native_float16 else dt

  # a GNU vector type for power-of-two lane counts below LONG_VECTOR; an AMX tile's fragment (256+ lanes) is a struct of
  # an array instead: clang spent minutes on a kernel of four 512-lane GNU vectors, the struct form compiles in seconds
  LONG_VECTOR = 256
  def _gnu(self, dt: DType) -> bool: return dt.scalar() is not dtypes.bool and dt.count & (dt.count - 1) == 0 and dt.count < self.LONG_VECTOR

  def vector_typedef(self, dt: DType, name: str) -> str | None:
    if not self._gnu(dt): return super().vector_typedef(dt, name)
    s = dt.scalar()
    # element alignment: vectors are loaded from any element offset (unaligned loads cost nothing on aligned data)
    return f"typedef {self.type_map[s]} {name} __attribute__((vector_size({s.itemsize * dt.count}), aligned({s.itemsize})));"

  def render_vectorize(self, dt: DType, parts: Sequence[str]) -> str:
    return f"(({self.tname(dt)}){{{','.join(parts)}}})" if self._gnu(dt) else super().render_vectorize(dt, parts)

  def render_gep(self, x: str, dt: DType, i: int) -> str: return f"{x}[{i}]" if self._gnu(dt) else super().render_gep(x, dt, i)

  def native_vector_op(self, op: Ops, dt: DType) -> bool:
    return self._gnu(dt) and dt.scalar() in _NATIVE_VEC and op in _NATIVE_OPS and (op is not Ops.FDIV or dtypes.is_float(dt))

  def mask_type(self, operand: DType, value: DType) -> str | None:
    # GNU C compares vectors lane by lane into a vector of signed ints as wide as the operands' lanes (-1 or 0)
    if not (self._gnu(operand) and self._gnu(value) and operand.count == value.count and operand.itemsize == value.itemsize): return None
    if operand.scalar() not in _NATIVE_VEC or value.scalar() not in _NATIVE_VEC: return None
    return self.tname({1: dtypes.int8, 2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}[operand.scalar().itemsize].vec(operand.count))

  def render_vector_alu(self, op: Ops, dt: DType, args: Sequence[str]) -> str | None:
    # MULACC on float vectors: one fused multiply-add instruction where the target has FMA (the compiler flags forbid
    # contracting a*b+c on its own), else fmaf lane by lane; both round once, like the interpreter
    if op is not Ops.MULACC or dt.scalar() is not dtypes.float32 or dt.count not in (4, 8, 16): return None
    t, fn = self.tname(dt), f"pg_fma_{self.vector_name(dt)}"
    builtin = {16: "__builtin_ia32_vfmaddps512_mask", 8: "__builtin_ia32_vfmaddps256", 4: "__builtin_ia32_vfmaddps"}[dt.count]
    guard = {16: "defined(__AVX512F__)", 8: "defined(__FMA__) && defined(__AVX__)", 4: "defined(__FMA__)"}[dt.count]
    extra = ", (unsigned short)-1, 4" if dt.count == 16 else ""  # all lanes, the current rounding mode
    lanes = ", ".join(f"__builtin_fmaf(a[{j}], b[{j}], c[{j}])" for j in range(dt.count))
    self.need(fn, f"#if {guard}\n{self.helper_prefix}{t} {fn}({t} a, {t} b, {t} c) {{ return ({t}){builtin}(a, b, c{extra}); }}\n#else\n"
                  f"{self.helper_prefix}{t} {fn}({t} a, {t} b, {t} c) {{ return ({t}){{{lanes}}}; }}\n#endif")
    return f"{fn}({', '.join(args)})"

  def native_cast(self, x: str, src: DType, dst: DType) -> str | None:
    s, d = self.cdt(src), self.cdt(dst)
    ok = self._gnu(s) and self._gnu(d) and not (dtypes.is_float(s) and not dtypes.is_float(d)) and \
      all(t.scalar() not in (dtypes.float16, dtypes.bfloat16) for t in (src, dst))
    return f"__builtin_convertvector({x}, {self.tname(d)})" if ok else None

  def to_storage(self, x: str, dt: DType) -> str:
    if dt is dtypes.bfloat16 and self.native_bfloat16: return f"((__bf16)(float)({x}))"
    return f"{self._f16('pg_f32_to_f16')}({x})" if self.storage_dtype(dt) is dtypes.uint16 else x

  def from_storage(self, x: str, dt: DType) -> str:
    if dt is dtypes.bfloat16 and self.native_bfloat16: return f"((float)({x}))"
    return f"{self._f16('pg_f16_to_f32')}({x})" if self.storage_dtype(dt) is dtypes.uint16 else x

  def _f16(self, fn: str) -> str:
    self.need("convert float16", _F16_HELPERS)
    return fn

  # ---- values
  def render_math(self, fn: str, dt: DType, args: Sequence[str]) -> str:
    # GCC/clang builtins: inlined where the ISA has the op (sqrt, trunc, fma), else calls into libm (exp2, log2, sin, pow)
    call = f"__builtin_{fn}{'f' if dt is dtypes.float32 else ''}({','.join(args)})"
    # log2 of a negative number is nan, whose sign libm leaves open (glibc's AVX2 variant gives -nan); the interpreter
    # and the LLVM path give +nan, and a tier-up swap must not change a bit
    if fn == "log2": return f"(({args[0]}) < 0 ? {self.render_special_float(math.nan, dt)} : {call})"
    return call

  def render_round(self, x: str, dt: DType) -> str:
    if dt is dtypes.bfloat16 and self.native_bfloat16: return f"((float)(__bf16)(float)({x}))"
    if self.storage_dtype(dt) is dtypes.uint16: return self.from_storage(self.to_storage(x, dt), dt)
    return super().render_round(x, dt)

  def render_special_float(self, v: float, dt: DType) -> str:
    sfx = "" if dt is dtypes.float64 else "f"
    s = f'__builtin_nan{sfx}("")' if v != v else f"__builtin_inf{sfx}()" if v > 0 else f"(-__builtin_inf{sfx}())"
    return s if dt in (dtypes.float32, dtypes.float64) else f"(({self.tname(dt)}){s})"

  # ---- tensor cores
  def render_wmma(self, u: UOp, args: Sequence[str]) -> str:
    tc = find_tensor_core(u.arg)
    if tc not in self.tensor_cores:
      raise RendererError(f"{self!r} does not declare the tensor core {tc.device}/{tc.name} (CPU_TC, the CPU's features)")
    ta, tb, tcc = (self.tname(self.cdt(s.dtype)) for s in u.src)
    fn = f"pg_{tc.name}"
    self.need("immintrin", "#include <immintrin.h>")
    macro = {"vdpbf16ps": "__AVX512BF16__", "vpdpbusd": "__AVX512VNNI__", "tdpbf16ps": "__AMX_BF16__", "tdpbssd": "__AMX_INT8__"}[tc.name]
    self.need(f"guard {tc.name}", f'#if !defined({macro})\n#error "{tc.name} needs {macro} (compile for a CPU that has it)"\n#endif')
    def bits(x: str, n: int) -> str:  # bfloat16 numbers held as floats: the top 16 bits of each float are the bfloat16, exactly
      u32, u16 = f"pg_u32x{n}", f"pg_u16x{n}"
      self.need(f"type {u32}", f"typedef unsigned int {u32} __attribute__((vector_size({4 * n})));")
      self.need(f"type {u16}", f"typedef unsigned short {u16} __attribute__((vector_size({2 * n})));")
      return f"__builtin_convertvector(({u32}){x} >> 16, {u16})"
    if tc.name == "vdpbf16ps":  # A's pair is one 32-bit group, broadcast to the 16 lanes
      body = (f"  pg_u16x2 ah = {bits('a', 2)};\n  unsigned int a32;\n  __builtin_memcpy(&a32, &ah, 4);\n  pg_u16x32 bh = {bits('b', 32)};\n"
              f"  return ({tcc})_mm512_dpbf16_ps((__m512)c, (__m512bh)_mm512_set1_epi32((int)a32), (__m512bh)bh);")
    elif tc.name == "vpdpbusd":  # A's 4 unsigned bytes broadcast likewise
      body = (f"  unsigned int a32;\n  __builtin_memcpy(&a32, &a, 4);\n"
              f"  return ({tcc})_mm512_dpbusd_epi32((__m512i)c, _mm512_set1_epi32((int)a32), (__m512i)b);")
    else:
      self.need("amx config", f"/* {AMX_MARK} */\nstatic const struct {{ unsigned char palette, start_row, reserved[14]; unsigned short colsb[16]; "
                "unsigned char rows[16]; } __attribute__((aligned(64))) pg_amx_cfg = {1, 0, {0}, {64, 64, 64}, {16, 16, 16}};")
      if tc.dtype_in is dtypes.bfloat16:  # the fragments are structs of floats (LONG_VECTOR): their top halves, one by one
        load = ("  unsigned short ah[512] __attribute__((aligned(64))), bh[512] __attribute__((aligned(64)));\n"
                "  for (int i = 0; i < 512; i++) {\n    unsigned int x, y;\n"
                "    __builtin_memcpy(&x, &a.v[i], 4);\n    __builtin_memcpy(&y, &b.v[i], 4);\n"
                "    ah[i] = (unsigned short)(x >> 16);\n    bh[i] = (unsigned short)(y >> 16);\n  }\n")
        pa, pb = "ah", "bh"
      else: load, pa, pb = "", "a.v", "b.v"
      # tile 0: C (16 rows of 16 lanes), 1: A (16 rows of 64 bytes), 2: B (16 rows of 16 four-byte groups)
      body = (f"{load}  _tile_loadconfig(&pg_amx_cfg);\n  _tile_loadd(0, c.v, 64);\n  _tile_loadd(1, {pa}, 64);\n  _tile_loadd(2, {pb}, 64);\n"
              f"  _tile_{tc.name[1:]}(0, 1, 2);\n  _tile_stored(0, c.v, 64);\n  _tile_release();\n  return c;")
    self.need(fn, f"{self.helper_prefix}{tcc} {fn}({ta} a, {tb} b, {tcc} c) {{\n{body}\n}}")
    return f"{fn}({', '.join(args)})"

  # ---- the kernel
  def extra_params(self) -> list[str]: return ["int core_id", "int core_count"]

  def order(self, uops: Sequence[UOp]) -> list[UOp]:
    ordered, split = cpu_order(uops)
    self._split: UOp | None = split
    return ordered

  def render_special(self, u: UOp, size: str) -> str:
    name = self.unique(c_identifier(u.arg))
    self.open_until_end(self.render_range(u, name, size))
    return name

  def render_range(self, u: UOp, name: str, bound: str) -> list[str]:
    if self._split is None or u is not self._split: return super().render_range(u, name, bound)
    t = self.tname(u.dtype)
    q, r, lo, hi = (self.unique(f"{name}_{s}") for s in ("q", "r", "lo", "hi"))
    return [PARALLEL_MARK, f"{t} {q} = ({bound}) / core_count, {r} = ({bound}) % core_count;",
            f"{t} {lo} = core_id * {q} + (core_id < {r} ? core_id : {r}), {hi} = {lo} + {q} + (core_id < {r});",
            f"for ({t} {name} = {lo}; {name} < {hi}; {name}++) {{"]


def with_tensor_cores(r: Renderer, tcs: tuple[TensorCore, ...]) -> None:
  """Declare the CPU tensor cores `tcs` on renderer `r` (none: `r` stays as it was, so no kernel changes): the
  capability, the PYTHON target that emulates them, and the rewrite that makes the instruction do the accumulation."""
  if not isinstance(tcs, tuple) or not all(isinstance(tc, TensorCore) and tc.device == "CPU" for tc in tcs):
    raise RendererError(f"{type(r).__name__}: tensor_cores must be a tuple of CPU TensorCores (plugrad.backend.CPU_AMX_TENSOR_CORES), got {tcs!r}")
  if not tcs: return
  r.tensor_cores, r.capabilities = tcs, r.capabilities | {"tensor_cores"}
  r.emulate_target, r.extra_matcher = emulate_target(tcs), FUSE_ACCUMULATE


def c_renderer(device: str) -> CPURenderer:
  """The C renderer for this machine's compiler (its 16-bit float support and vector width) and CPU (its tensor cores)."""
  from plugrad_cpu.tensor_cores import cpu_features, from_macros, host_tensor_cores
  from plugrad_cpu.toolchain import toolchain
  tc = toolchain()
  return CPURenderer(device, native_float16=tc.float16, native_bfloat16=tc.bfloat16, vector_width=tc.float_lanes,
                     tensor_cores=host_tensor_cores(cpu_features(), from_macros(tc.macros)))


def cpu_order(uops: Sequence[UOp]) -> tuple[list[UOp], UOp | None]:
  """(the uops in rendering order, the loop to split across threads or None). Launch indices become loops around the
  whole kernel: they are hoisted (outermost dimension first) with their sizes, and the outermost one is split."""
  specials = sorted((u for u in uops if u.op is Ops.SPECIAL), key=lambda u: u.arg[-1], reverse=True)
  if (lidx := [u.arg for u in specials if u.arg.startswith("l")]):
    raise RendererError(f"the CPU has no workgroups: this kernel uses {', '.join(lidx)} (render it for a device with has_local=True)")
  if not specials: return list(uops), parallel_range(uops)
  deps = {x for s in specials for x in s.src[0].toposort}
  return [u for u in uops if u in deps] + specials + [u for u in uops if u not in deps and u.op is not Ops.SPECIAL], specials[0]


def parallel_range(uops: Sequence[UOp]) -> UOp | None:
  """The loop whose iterations may run on different threads, or None: the only top-level RANGE that stores to memory
  other than the thread's own arrays (a PACK copy loop before it stores only into one, and every thread runs it whole),
  of axis type LOOP or GLOBAL or THREAD (never REDUCE), when nothing outside it stores to memory, reads memory after it,
  or reads a buffer it writes."""
  depth, top, span, start_of = 0, [], {}, {}
  for i, u in enumerate(uops):
    if u.op in (Ops.ENDRANGE, Ops.ENDIF): depth -= 1
    if depth == 0 and u.op is Ops.RANGE: top.append(u); start_of[u] = i
    if u.op is Ops.ENDRANGE and depth == 0: span[u.src[0]] = i
    if u.op in (Ops.RANGE, Ops.IF): depth += 1
  def shared_store(r: UOp) -> bool:
    return any(u.op is Ops.STORE and _space(u.src[0]) is not AddrSpace.REG for u in uops[start_of[r]:span.get(r, len(uops)) + 1])
  top = [r for r in top if shared_store(r)] if len(top) > 1 else top
  if len(top) != 1 or top[0].arg[1] not in (AxisType.LOOP, AxisType.GLOBAL, AxisType.THREAD): return None
  r = top[0]
  if (end := span.get(r)) is None: return None
  start = uops.index(r)
  inside = set(uops[start:end + 1])
  written = {_buffer(u.src[0]) for u in inside if u.op is Ops.STORE}
  for i, u in enumerate(uops):
    if u in inside: continue
    if u.op is Ops.STORE and _space(u.src[0]) is not AddrSpace.REG: return None
    if u.op is Ops.LOAD and (i > end or _buffer(u.src[0]) in written): return None
  return r


def _buffer(u: UOp) -> UOp:
  while u.op not in GroupOp.Defines and u.src: u = u.src[0]
  return u


def _space(u: UOp) -> AddrSpace:
  dt = u.dtype
  return dt.addrspace if isinstance(dt, PtrDType) else AddrSpace.GLOBAL
