"""OpenCL C on the C-family base: the dialect (qualifiers, launch indices, vectors, half) and nothing else.

The semantics the base and the shared passes already give (integer wrap and C division, division and shift guards,
nan-propagating max, Threefry, bfloat16) are kept by leaving those renderer flags at their defaults: OpenCL's own
`/ %` by zero and out-of-range shifts are undefined, and its `fmax` drops nan.
"""
from __future__ import annotations

from collections.abc import Sequence

from plugrad.backend import CStyleRenderer, DType, Ops, RendererError, UOp, dtypes
from plugrad_opencl.platform import DeviceInfo

_NATIVE_COUNTS = frozenset({2, 3, 4, 8, 16})  # OpenCL C's vector widths; other widths and bool vectors are structs
_SHORT = {dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.int16: "short", dtypes.uint16: "ushort", dtypes.int32: "int", dtypes.uint32: "uint",
          dtypes.int64: "long", dtypes.uint64: "ulong", dtypes.float16: "half", dtypes.float32: "float", dtypes.float64: "double"}
# half as 16 bits in memory, computed in float, where the device lacks cl_khr_fp16: vload_half/vstore_half are core OpenCL C
_HALF_HELPERS = {
  "pg_h2f": "static inline float pg_h2f(ushort x) { return vload_half(0, (const half*)&x); }",
  "pg_f2h": "static inline ushort pg_f2h(float x) { ushort r; vstore_half_rte(x, 0, (half*)&r); return r; }",
  "pg_round_half": "static inline float pg_round_half(float x) {\n  ushort r;\n  vstore_half_rte(x, 0, (half*)&r);\n"
                   "  return vload_half(0, (const half*)&r);\n}",
}
# float -> integer in float arithmetic (the base's helper works in double, which a device without fp64 lacks): truncation,
# 0 for nan/inf, huge values wrapped modulo 2^64 (exact: such floats are multiples of 2^40)
_F2I = ("static inline long pg_f2i_f(float x) {\n  if (x > -9223372036854775808.0f && x < 9223372036854775808.0f) return (long)x;\n"
        "  if (x != x || x == 2 * x) return 0;\n  float r = fmod(x, 18446744073709551616.0f);\n"
        "  return (long)(ulong)(r < 0 ? r + 18446744073709551616.0f : r);\n}")


class OpenCLRenderer(CStyleRenderer):
  kernel_prefix = "__kernel "
  barrier = "barrier(CLK_LOCAL_MEM_FENCE);"
  has_local = True
  has_shared = True
  type_map = {**CStyleRenderer.type_map, dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.uint16: "ushort", dtypes.uint32: "uint",
              dtypes.int64: "long", dtypes.uint64: "ulong"}

  def __init__(self, device: str, info: DeviceInfo):
    super().__init__(device)
    self.info = info
    self.local_max = (min(info.max_work_items[0], info.max_work_group), min(info.max_work_items[1], info.max_work_group),
                      min(info.max_work_items[2], info.max_work_group))
    self.global_max = ((1 << 31) - 1,) * 3  # launch indices are int
    self.shared_max = info.local_mem
    caps = {"locals", "shared", "float16", "bfloat16"}  # bfloat16 is emulated by the shared passes (native_bfloat16 stays False)
    if info.fp64: caps.add("float64")
    if info.int64: caps.add("int64")
    self.capabilities = frozenset(caps)
    self.validate()

  def dtype_support(self, dt: DType) -> str | None:
    if dt.scalar() is dtypes.float64 and not self.info.fp64: return f"{self.info.name} has no cl_khr_fp64"
    if dt.scalar() in (dtypes.int64, dtypes.uint64) and not self.info.int64:
      return f"{self.info.name} is an embedded-profile device without cles_khr_int64"
    return super().dtype_support(dt)

  # ---- types: bool is a byte in memory (a kernel may not take bool pointers); half is ushort bits without cl_khr_fp16
  def compute_dtype(self, dt: DType) -> DType: return dtypes.float32 if dt is dtypes.float16 and not self.info.fp16 else dt
  def storage_dtype(self, dt: DType) -> DType:
    if dt is dtypes.bool: return dtypes.uint8
    return dtypes.uint16 if dt is dtypes.float16 and not self.info.fp16 else dt

  def to_storage(self, x: str, dt: DType) -> str:
    if dt is dtypes.bool: return f"((uchar)({x}))"
    self._half_helpers()
    return f"pg_f2h({x})"

  def from_storage(self, x: str, dt: DType) -> str:
    if dt is dtypes.bool: return f"({x}!=0)"
    self._half_helpers()
    return f"pg_h2f({x})"

  def render_round(self, x: str, dt: DType) -> str:
    if dt is dtypes.float16 and not self.info.fp16:
      self._half_helpers()
      return f"pg_round_half({x})"
    return super().render_round(x, dt)

  def _half_helpers(self) -> None:
    for k, code in _HALF_HELPERS.items(): self.need(k, code)

  # ---- vectors: OpenCL's own types where they exist
  def _native(self, dt: DType) -> bool: return dt.count in _NATIVE_COUNTS and dt.scalar() in _SHORT
  def vector_name(self, dt: DType) -> str: return f"{_SHORT[dt.scalar()]}{dt.count}" if self._native(dt) else f"pg_{super().vector_name(dt)}"
  def vector_typedef(self, dt: DType, name: str) -> str | None: return None if self._native(dt) else super().vector_typedef(dt, name)

  def render_vectorize(self, dt: DType, parts: Sequence[str]) -> str:
    return f"(({self.tname(dt)})({','.join(parts)}))" if self._native(dt) else super().render_vectorize(dt, parts)

  def render_gep(self, x: str, dt: DType, i: int) -> str: return f"{x}.s{i:x}" if self._native(dt) else super().render_gep(x, dt, i)
  def native_vector_op(self, op: Ops, dt: DType) -> bool: return self._native(dt)

  # ---- values
  def render_math(self, fn: str, dt: DType, args: Sequence[str]) -> str: return f"{fn}({','.join(args)})"  # OpenCL's math is overloaded

  def cast(self, x: str, src: DType, dst: DType) -> str:
    if dtypes.is_float(src) and src is not dtypes.float64 and dtypes.is_int(dst) and dst is not dtypes.bool:
      self.need("pg_f2i_f", _F2I)
      return f"(({self.tname(dst)})pg_f2i_f({x}))"
    return super().cast(x, src, dst)

  # ---- the kernel
  def render_buffer_param(self, name: str, dt: DType, slot: int, written: bool) -> str:
    return f"__global {'' if written else 'const '}{self.tname(dt)}* {name}"

  def render_special(self, u: UOp, size: str) -> str:
    kind, dim = u.arg[:4], u.arg[4:]
    fn = {"gidx": "get_group_id", "lidx": "get_local_id"}.get(kind)
    if fn is None or dim not in ("0", "1", "2"): raise RendererError(f"{type(self).__name__}: unknown launch index {u.arg!r}")
    return f"(({self.tname(u.dtype)}){fn}({dim}))"

  def render_local(self, name: str, dt: DType, size: int) -> str: return f"__local {self.tname(dt)} {name}[{size}];"

  def order(self, uops: Sequence[UOp]) -> list[UOp]:
    # OpenCL C declares __local variables at kernel scope only, so they go first (they have no sources)
    return [u for u in uops if u.op is Ops.DEFINE_LOCAL] + [u for u in uops if u.op is not Ops.DEFINE_LOCAL]

  def render_kernel(self, name: str, params: Sequence[str], body: Sequence[str], prelude: Sequence[str]) -> str:
    pragmas = [f"#pragma OPENCL EXTENSION {e} : enable" for e in ("cl_khr_fp64", "cl_khr_fp16") if e in self.info.extensions]
    return super().render_kernel(name, params, body, [*pragmas, *prelude])
