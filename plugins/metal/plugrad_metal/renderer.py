"""The Metal renderer: one `kernel void` Metal Shading Language function per program, on the C-family base.

**The kernel ABI** (the buffer-binding contract the runtime, the graph runner and `new_program` kernels share):

```metal
#include <metal_stdlib>
using namespace metal;
kernel void NAME(device float* data0 [[buffer(0)]],        // buffer i of the program (slot order) at index i;
                 const device half* data1 [[buffer(1)]],   //   `const` when the kernel only reads it
                 constant int& n [[buffer(2)]],            // then each variable, in name order, at index nbufs + k:
                 constant long& m [[buffer(3)]],           //   `int`, or `long` for an int64 variable
                 uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]])
```

dispatched as `dispatchThreadgroups(global_size) threadsPerThreadgroup(local_size)`: `gidxN` is `gid.{x,y,z}`,
`lidxN` is `lid.{x,y,z}`. bool buffers are bytes (`device uchar*`, 0 or 1), bfloat16 buffers are `device bfloat*`
with METAL_LANGUAGE >= 3.1, else their bits (`device ushort*`, the shared bfloat16 emulation). Metal binds at most 31
buffers per kernel: a kernel with more buffers and variables than that is refused (RendererError).

What it writes:

* `threadgroup` arrays for shared memory, `threadgroup_barrier(mem_flags::mem_threadgroup)`;
* `half` computed in float and rounded after every op; `bfloat` (MSL 3.1+) likewise, else emulated by the shared pass;
  no `double` (the `float64` capability is absent, so the Tensor layer refuses float64 tensors on METAL);
* vectors are Metal's `float4`, `half2`, ... in registers (built with `float4{a, b, c, d}`, lanes read as `v[i]`);
  memory is read and written through the *packed* vector types (`packed_float4`: the alignment of one element),
  because the codegen makes contiguous vector accesses at any element offset and the aligned types need 16 bytes.
  bool vectors go through `packed_uchar4`, 64-bit integer vectors (no packed type) lane by lane;
* precise math: `metal::precise::exp2/log2/sin/sqrt/pow/divide` (and the compiler turns fast math off), float → int
  casts with the interpreter's semantics (truncation, nan/inf → 0, huge values wrap) without `double`, bitcasts with
  `as_type<T>`, integer division, shifts and nan-propagating MAX guarded by the shared passes (Metal's plain operators
  are undefined or drop nan there, so the renderer claims none of `safe_int_div`, `safe_shifts`, `nan_max`);
* tensor cores: WMMA as `simdgroup_multiply_accumulate` on `simdgroup_float8x8`/`simdgroup_half8x8`, each lane's two
  elements moved in and out with `thread_elements()` in the METAL_TENSOR_CORES layout (the layout is Apple's, from
  MLX; it is checked against MLX's formula and computed by the PYTHON interpreter under EMULATE=METAL).

Nothing here has been compiled by Apple's Metal compiler (no Mac in this project): see the README for what the
approximate syntax check does and does not catch.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from plugrad.backend import (
  METAL_TENSOR_CORES,
  CStyleRenderer,
  DType,
  Ops,
  Ptr,
  RendererError,
  UOp,
  dtypes,
  find_tensor_core,
)
from plugrad_metal.abi import MAX_BINDINGS

_XYZW = "xyzw"
_NAMES: dict[DType, str] = {dtypes.bool: "bool", dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.int16: "short", dtypes.uint16: "ushort",
                            dtypes.int32: "int", dtypes.uint32: "uint", dtypes.int64: "long", dtypes.uint64: "ulong", dtypes.float16: "half",
                            dtypes.bfloat16: "bfloat", dtypes.float32: "float", dtypes.float64: "double"}
# scalar types with packed vector types (MSL spec 2.2.3; packed_bfloat from MSL 3.1): element-aligned memory access
_PACKED = frozenset({dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.float16, dtypes.float32})
# identifiers the C-family base could pick for variables that Metal reserves (a variable named `uint` becomes `uint_`)
RESERVED = frozenset({"thread", "threadgroup", "threadgroup_imageblock", "ray_data", "object_data", "metal", "as_type", "main", "uchar",
                      "ushort", "uint", "ulong", "bfloat", "half", "vec", "matrix", "simdgroup_matrix", "packed_vec"} |
                     {f"{p}{n}{c}" for n in _NAMES.values() for c in (2, 3, 4) for p in ("", "packed_")} |
                     {f"simdgroup_{n}8x8" for n in ("float", "half", "bfloat")})
_SPECIAL_BITS = {dtypes.float32: ("0x7fc00000u", "0x7f800000u", "0xff800000u", ""), dtypes.float16: ("0x7e00", "0x7c00", "0xfc00", "(ushort)"),
                 dtypes.bfloat16: ("0x7fc0", "0x7f80", "0xff80", "(ushort)")}
_PRECISE = frozenset({"exp2", "log2", "sin", "sqrt", "pow"})
# float → int with the interpreter's semantics (no `double` on Metal): in range truncate, nan/inf → 0, else wrap mod 2^64
_F2I = """static inline long pg_f2i(float x) {  /* truncation; nan/inf give 0, huge values wrap */
  if (x > -9223372036854775808.0f && x < 9223372036854775808.0f) return (long)x;
  if (x != x || x == 2.0f * x) return 0;
  float r = metal::fmod(x, 18446744073709551616.0f);
  return (long)(ulong)(r < 0.0f ? r + 18446744073709551616.0f : r);
}"""


class MetalRenderer(CStyleRenderer):
  """MSL for language version `language` ("3.0", "3.1", "3.2"); 3.1+ has `bfloat`."""
  has_local = has_shared = supports_float4 = True
  vector_width = 4
  global_max = (2**31 - 1, 65535, 65535)
  local_max = (1024, 1024, 1024)  # maxThreadsPerThreadgroup on Apple GPUs; at most 1024 threads in all
  shared_max = 32768              # threadgroup memory per threadgroup (maxThreadgroupMemoryLength on Apple silicon)
  kernel_prefix = "kernel "
  helper_prefix = "static inline "
  barrier = "threadgroup_barrier(mem_flags::mem_threadgroup);"
  type_map = {**CStyleRenderer.type_map, **_NAMES}
  tensor_cores = METAL_TENSOR_CORES
  full_pow = False  # MSL's pow is undefined for a negative base: the shared pass spells C's cases out
  atomic_add = frozenset({dtypes.float32, dtypes.int32, dtypes.uint32})  # atomic_float from MSL 3.0; no 64-bit atomic add

  def __init__(self, device: str, language: str = "3.1"):
    super().__init__(device)
    if language not in ("3.0", "3.1", "3.2"): raise RendererError(f"METAL: unknown Metal Shading Language version {language!r} (3.0, 3.1, 3.2)")
    self.language = language
    self.arch = f"msl{language}"  # the target, part of the codegen's program cache key
    self.native_bfloat16 = language >= "3.1"
    self.capabilities = frozenset({"float16", "bfloat16", "int64", "locals", "shared", "tensor_cores"})
    self.validate()

  def __repr__(self) -> str: return f"<MetalRenderer {self.device} MSL {self.language}>"

  @property
  def metal_version(self) -> int:
    """`__METAL_VERSION__` of the language version (3.1 → 310)."""
    major, minor = self.language.split(".")
    return int(major) * 100 + int(minor) * 10

  def dtype_support(self, dt: DType) -> str | None:
    if dt.scalar() is dtypes.float64: return "the Metal Shading Language has no 64-bit floats"
    return super().dtype_support(dt)

  # ---- types
  # bool memory is bytes (vectors through packed_uchar4); native bfloat is stored as `bfloat` and computed in float
  # (rounded after every op, like half), so its results never depend on how Metal evaluates bfloat operators
  def compute_dtype(self, dt: DType) -> DType: return dtypes.float32 if dt is dtypes.bfloat16 else dt
  def storage_dtype(self, dt: DType) -> DType: return dtypes.uint8 if dt is dtypes.bool else dt

  def to_storage(self, x: str, dt: DType) -> str:
    return f"((uchar)({x}))" if dt is dtypes.bool else f"((bfloat)({x}))" if dt is dtypes.bfloat16 else x

  def from_storage(self, x: str, dt: DType) -> str:
    return f"(({x})!=0)" if dt is dtypes.bool else f"((float)({x}))" if dt is dtypes.bfloat16 else x

  def render_round(self, x: str, dt: DType) -> str:
    return f"((float)((bfloat)({x})))" if dt is dtypes.bfloat16 else super().render_round(x, dt)

  def _native_vec(self, dt: DType) -> bool: return 2 <= dt.count <= 4

  def vector_name(self, dt: DType) -> str:
    name = f"{_NAMES[dt.scalar()]}{dt.count}"
    return name if self._native_vec(dt) else f"pg_{name}"

  def vector_typedef(self, dt: DType, name: str) -> str | None:
    return None if self._native_vec(dt) else f"struct {name} {{ {self.type_map[dt.scalar()]} v[{dt.count}]; }};"

  def render_vectorize(self, dt: DType, parts: Sequence[str]) -> str:
    return f"{self.tname(dt)}{{{', '.join(parts)}}}" if self._native_vec(dt) else f"{self.tname(dt)}{{{{{', '.join(parts)}}}}}"

  def render_gep(self, x: str, dt: DType, i: int) -> str: return f"{x}[{i}]" if self._native_vec(dt) else f"{x}.v[{i}]"

  def native_vector_op(self, op: Ops, dt: DType) -> bool:
    if not self._native_vec(dt): return False
    s = dt.scalar()
    if s is dtypes.float32: return op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG)  # FDIV: metal::precise::divide, lane by lane
    return s in (dtypes.int32, dtypes.uint32) and op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.AND, Ops.OR, Ops.XOR, Ops.NEG)

  # ---- values
  def render_math(self, fn: str, dt: DType, args: Sequence[str]) -> str:
    if dt is not dtypes.float32: raise RendererError(f"METAL: no {fn} of {dt!r} (no 64-bit floats)")
    return f"metal::{'precise::' if fn in _PRECISE else ''}{fn}({', '.join(args)})"

  def render_special_float(self, v: float, dt: DType) -> str:
    if dt not in _SPECIAL_BITS: raise RendererError(f"METAL: no special values of {dt!r}")
    nan, inf, ninf, cast = _SPECIAL_BITS[dt]
    return f"as_type<{self.type_map[dt]}>({cast}{nan if v != v else inf if v > 0 else ninf})"

  def render_const(self, v: float | int | bool, dt: DType) -> str:
    if dt in (dtypes.int64, dtypes.uint64):  # Metal's 64-bit integers are `long`/`ulong`: no `ll` literals
      v, suffix = int(v), "ul" if dt is dtypes.uint64 else "l"
      if v == -(1 << 63): return "(-9223372036854775807l-1)"
      return f"({v}{suffix})" if v < 0 else f"{v}{suffix}"
    return super().render_const(v, dt)

  def alu(self, op: Ops, dt: DType, sdt: DType, a: list[str], srcs: Sequence[UOp] = ()) -> str:
    if op in (Ops.FDIV, Ops.RECIPROCAL) and dtypes.is_float(dt):  # IEEE division whatever the compile options
      num, den = (a[0], a[1]) if op is Ops.FDIV else ("1.0f", a[0])
      if dt is not dtypes.float32: num, den = f"(float)({num})", f"(float)({den})"
      e = f"metal::precise::divide({num}, {den})"
      return e if dt is dtypes.float32 else self.render_round(e, dt)
    return super().alu(op, dt, sdt, a, srcs)

  def cast(self, x: str, src: DType, dst: DType) -> str:
    if src is not dst and dst is not dtypes.bool and dtypes.is_float(src) and not dtypes.is_float(dst):
      self.need("pg_f2i", _F2I)
      return f"(({self.tname(dst)})pg_f2i({x}))"
    return super().cast(x, src, dst)

  def bitcast(self, x: str, src: DType, dst: DType) -> str:
    return self.convert(f"as_type<{self.tname(self.mdt(dst))}>({self.convert(x, src, True)})", dst, False)

  def render_wmma(self, u: UOp, args: Sequence[str]) -> str:
    tc = find_tensor_core(u.arg)
    if tc.device != "METAL" or tc.dims != (8, 8, 8) or tc.elements != (2, 2, 2):
      raise RendererError(f"METAL cannot render the tensor core {tc.device}/{tc.name}")
    a, b, c = (self.cdt(s.dtype) for s in u.src)
    mat = {dtypes.float32: "simdgroup_float8x8", dtypes.float16: "simdgroup_half8x8", dtypes.bfloat16: "simdgroup_bfloat8x8"}
    ma, mc = mat[a.scalar()], mat[c.scalar()]
    fn = f"pg_wmma_{tc.name}"
    moves = "\n".join(f"  m{x}.thread_elements()[{e}] = {x}[{e}];" for x in "abc" for e in range(2))
    self.need(fn, f"{self.helper_prefix}{self.tname(c)} {fn}({self.tname(a)} a, {self.tname(b)} b, {self.tname(c)} c) {{\n"
                  f"  {ma} ma, mb;\n  {mc} mc;\n{moves}\n  simdgroup_multiply_accumulate(mc, ma, mb, mc);\n"
                  f"  return {self.tname(c)}{{mc.thread_elements()[0], mc.thread_elements()[1]}};\n}}")
    return f"{fn}({', '.join(args)})"

  # ---- memory: vectors through the packed types (element alignment), in the pointer's address space
  def _packed(self, mdt: DType) -> bool:
    return self._native_vec(mdt) and (mdt.scalar() in _PACKED or (mdt.scalar() is dtypes.bfloat16 and self.native_bfloat16))

  def _address(self, p: Any, dt: DType, const: str = "") -> str:
    if p.var or dt.count == 1: return super()._address(p, dt, const)
    mdt, idx = self.mdt(dt), p.idx if p.idx is not None else 0
    if self._packed(mdt):
      ptr = f"(({const}{self._space.get(p.base, 'thread')} packed_{self.vector_name(mdt)}*)({p.base}+{idx}))"
      return f"{self.tname(mdt)}(*{ptr})" if const else f"*{ptr}"
    if not const: raise RendererError(f"METAL: a {mdt!r} vector store must be written lane by lane")
    return self.render_vectorize(mdt, [f"{p.base}[{idx}+{k}]" for k in range(dt.count)])  # no packed type: the lanes

  def render_atomic_add(self, p: Ptr, value: str) -> str:
    space, kind = self._space.get(p.base, "device"), {dtypes.float32: "float", dtypes.int32: "int", dtypes.uint32: "uint"}[p.elem]
    return f"atomic_fetch_add_explicit(({space} atomic_{kind}*)&{self._address(p, p.elem)}, {value}, memory_order_relaxed);"

  def _store(self, u: UOp) -> None:
    p, val = self.ptrs[u.src[0]], u.src[1]
    if p.var or val.dtype.count == 1 or self._packed(self.mdt(val.dtype)): return super()._store(u)
    mdt, idx, tmp = self.mdt(val.dtype), p.idx if p.idx is not None else 0, self.unique("lanes")
    lanes = " ".join(f"{p.base}[{idx}+{k}] = {tmp}[{k}];" for k in range(val.dtype.count))
    st = f"{{ {self.tname(mdt)} {tmp} = {self.convert(self.r[val], val.dtype, True)}; {lanes} }}"
    self.line(st if p.gate is None else f"if ({p.gate}) {st}")

  # ---- the kernel
  def order(self, uops: Sequence[UOp]) -> list[UOp]:
    self._space: dict[str, str] = {}
    self._bindings = 0
    self._names.update(RESERVED)
    self._gid, self._lid = self.unique("gid"), self.unique("lid")
    nb = sum(1 for u in uops if u.op in (Ops.DEFINE_GLOBAL, Ops.DEFINE_VAR))
    if nb > MAX_BINDINGS: raise RendererError(f"METAL: a kernel binds at most {MAX_BINDINGS} buffers and variables, this one needs {nb}")
    return list(uops)

  def _bind(self) -> int:
    self._bindings += 1
    return self._bindings - 1

  def render_buffer_param(self, name: str, dt: DType, slot: int, written: bool) -> str:
    self._space[name] = "device"
    return f"{'' if written else 'const '}device {self.tname(dt)}* {name} [[buffer({self._bind()})]]"

  def render_var_param(self, name: str, dt: DType) -> str: return f"constant {self.tname(dt)}& {name} [[buffer({self._bind()})]]"

  def extra_params(self) -> list[str]:
    return [f"uint3 {self._gid} [[threadgroup_position_in_grid]]", f"uint3 {self._lid} [[thread_position_in_threadgroup]]"]

  def render_special(self, u: UOp, size: str) -> str:
    return f"(({self.tname(u.dtype)}){self._gid if u.arg.startswith('g') else self._lid}.{_XYZW[int(u.arg[-1])]})"

  def render_local(self, name: str, dt: DType, size: int) -> str:
    self._space[name] = "threadgroup"
    return f"threadgroup {self.tname(dt)} {name}[{size}];"

  def render_kernel(self, name: str, params: Sequence[str], body: Sequence[str], prelude: Sequence[str]) -> str:
    head = f"{self.kernel_prefix}void {name}({', '.join(params)}) {{"
    return "\n".join(["#include <metal_stdlib>", "using namespace metal;", *prelude, "", head, *body, "}"]) + "\n"
