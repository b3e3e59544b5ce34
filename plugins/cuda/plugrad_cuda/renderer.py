"""The CUDA renderer: one `extern "C" __global__` CUDA C kernel per program, on the C-family base.

* Launch indices: `gidxN` is `blockIdx.{x,y,z}`, `lidxN` is `threadIdx.{x,y,z}`; the grid is the program's
  global size in blocks and the block its local size, which also gives `__launch_bounds__`.
* Shared memory is `__shared__` (16-byte aligned), the barrier `__syncthreads()`.
* 16-bit floats without headers: the NVRTC wheels ship no `cuda_fp16.h`/`cuda_bf16.h` (checked for 12.9 and 13.5), so
  float16 is stored as its bits (`unsigned short`) and converted by the PTX `cvt` instructions (round to nearest even,
  IEEE, no flush to zero); arithmetic is in float and rounded after every op, like the interpreter. bfloat16 is
  emulated by the shared codegen pass (`native_bfloat16` stays False): bits in memory, float in registers.
* Vectors are structs of elements (`pg_float4 { float v[4]; }`), element-aligned: the codegen makes contiguous vector
  loads and stores at any element offset, and CUDA's own `float4`/`ushort4` need their full alignment (a misaligned
  access faults). A vector access of 2 or 4 elements (at most 16 bytes) whose element index is provably a multiple of
  its lane count (`UOp.const_factor`: every addend of the index a multiple of it — an UPCAST of 4 along a contiguous
  axis gives `gidx*4k + lidx*4`) goes through the native type instead (`float4`, `float2`, `ushort4` for 4 halves,
  ...): one `ld.global.v4.f32` / `st.global.v4.f32` (64-bit for 4 halves) instead of 4 scalar accesses. That is
  sound because every buffer a CUDA kernel gets starts at a `cuMemAlloc` address (256-byte aligned) — the allocator
  has no views (`_offset`), so no kernel sees a pointer into the middle of an allocation — and `__shared__` arrays are
  declared 16-byte aligned. Any other index keeps the element-aligned struct (scalar accesses).
* Tensor cores: WMMA is inline PTX `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32`, fragments
  packed two 16-bit values per register in the element order of `CUDA_TENSOR_CORES` (lower index in the low half).
* Semantics: nothing fast-math (NVRTC gets `--fmad=false`: no contraction, MULACC is an explicit `fma`); integer
  division and shifts are guarded by the shared passes (CUDA's `/ 0` is undefined), and float MAX too (`fmaxf`
  drops a nan operand).
"""
from __future__ import annotations

from collections.abc import Sequence

from plugrad.backend import CUDA_TENSOR_CORES, CStyleRenderer, DType, Ops, Ptr, RendererError, UOp, dtypes, find_tensor_core, workgroup_threads

_XYZW = "xyzw"
# CUDA's built-in vector types by the memory dtype of their elements (`float4`, `ushort4`, ...: aligned to their size)
_NATIVE = {dtypes.float32: "float", dtypes.float64: "double", dtypes.int32: "int", dtypes.uint32: "uint", dtypes.int16: "short",
           dtypes.uint16: "ushort", dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.int64: "longlong", dtypes.uint64: "ulonglong"}
DEVICE_FN = "static __device__ __forceinline__ "

_F16 = f"""\
{DEVICE_FN}float pg_h2f(unsigned short h) {{ float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }}
{DEVICE_FN}unsigned short pg_f2h(float f) {{ unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }}"""
_D2H = f"{DEVICE_FN}unsigned short pg_d2h(double d) {{ unsigned short h; asm(\"cvt.rn.f16.f64 %0, %1;\" : \"=h\"(h) : \"d\"(d)); return h; }}"


class CUDARenderer(CStyleRenderer):
  """CUDA C for compute capability `arch` (`sm_80`, `sm_90`, ...). Tensor cores from sm_80 (m16n8k16 f16 and bf16)."""
  has_local = has_shared = supports_float4 = True
  vector_width = 4
  global_max = (2**31 - 1, 65535, 65535)
  local_max = (1024, 1024, 64)
  shared_max = 49152  # static __shared__ per block (more needs the dynamic opt-in)
  kernel_prefix = 'extern "C" __global__ '
  helper_prefix = DEVICE_FN
  barrier = "__syncthreads();"
  type_map = {**CStyleRenderer.type_map, dtypes.float16: "unsigned short", dtypes.bfloat16: "unsigned short"}
  # atomicAdd's overloads (double from sm_60; 64-bit integers through the unsigned long long one: two's complement)
  atomic_add = frozenset({dtypes.float32, dtypes.float64, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64})

  def __init__(self, device: str, arch: str = "sm_80"):
    super().__init__(device)
    from plugrad_cuda.nvrtc import parse_arch
    self.arch, self.cc = arch, parse_arch(arch)
    self.tensor_cores = CUDA_TENSOR_CORES if self.cc >= (8, 0) else ()
    caps = {"float16", "bfloat16", "float64", "int64", "locals", "shared"}
    self.capabilities = frozenset(caps | ({"tensor_cores"} if self.tensor_cores else set()))
    self.validate()

  def __repr__(self) -> str: return f"<CUDARenderer {self.device} {self.arch}>"

  # ---- types
  def compute_dtype(self, dt: DType) -> DType: return dtypes.float32 if dt in (dtypes.float16, dtypes.bfloat16) else dt
  def storage_dtype(self, dt: DType) -> DType: return dtypes.uint16 if dt in (dtypes.float16, dtypes.bfloat16) else dt

  def vector_name(self, dt: DType) -> str: return f"pg_{super().vector_name(dt)}"  # never CUDA's own float4 etc. (see the module doc)

  def render_vectorize(self, dt: DType, parts: Sequence[str]) -> str:
    return f"{self.tname(dt)}{{{{{','.join(parts)}}}}}"  # C++ aggregate initialization (C's compound literals are not C++)

  def to_storage(self, x: str, dt: DType) -> str:
    if dt is dtypes.float16: return f"{self._f16('pg_f2h')}({x})"
    raise RendererError("CUDA: bfloat16 must be lowered by the shared emulation pass before rendering")

  def from_storage(self, x: str, dt: DType) -> str:
    if dt is dtypes.float16: return f"{self._f16('pg_h2f')}({x})"
    raise RendererError("CUDA: bfloat16 must be lowered by the shared emulation pass before rendering")

  def _f16(self, fn: str) -> str:
    self.need("convert float16", _F16)
    return fn

  # ---- values
  def render_round(self, x: str, dt: DType) -> str: return self.from_storage(self.to_storage(x, dt), dt)

  def cast(self, x: str, src: DType, dst: DType) -> str:
    if dst is dtypes.float16 and src is dtypes.float64:  # one rounding, not two through float
      self.need("convert double to float16", _D2H)
      return f"{self._f16('pg_h2f')}(pg_d2h({x}))"
    return super().cast(x, src, dst)

  def render_special_float(self, v: float, dt: DType) -> str:
    if dt is dtypes.float64:
      return "__longlong_as_double(0x7ff8000000000000LL)" if v != v else "__longlong_as_double(0x7ff0000000000000LL)" if v > 0 else \
        "__longlong_as_double(0xfff0000000000000LL)"
    s = "__int_as_float(0x7fc00000)" if v != v else "__int_as_float(0x7f800000)" if v > 0 else "__int_as_float(0xff800000)"
    return s if dt is dtypes.float32 else f"(({self.tname(dt)}){s})"

  def render_wmma(self, u: UOp, args: Sequence[str]) -> str:
    tc = find_tensor_core(u.arg)
    if tc.device != "CUDA" or tc.dims != (8, 16, 16) or tc.dtype_out is not dtypes.float32:
      raise RendererError(f"CUDA cannot render the tensor core {tc.device}/{tc.name}")
    kind = {dtypes.float16: "f16", dtypes.bfloat16: "bf16"}[tc.dtype_in]
    a, b, c = (s.dtype for s in u.src)
    fn = f"pg_mma_m16n8k16_{kind}"
    # the values are float (float16 and emulated bfloat16 compute in float); pack each pair into one .f16x2/.bf16x2
    pack = f"pg_pack_{kind}"
    if kind == "f16": self._f16("pg_f2h")
    bits = "(unsigned int)pg_f2h({})" if kind == "f16" else "(__float_as_uint({}) >> 16)"  # bfloat16 values: their top half is exact
    self.need(pack, f"{DEVICE_FN}unsigned int {pack}(float lo, float hi) {{ return {bits.format('lo')} | ({bits.format('hi')} << 16); }}")
    ta, tb, tcc = (self.tname(self.cdt(s.dtype)) for s in u.src)
    def lanes(x: str, dt: DType, n: int) -> str:
      return ", ".join(f"{pack}({self.render_gep(x, self.cdt(dt), 2 * j)}, {self.render_gep(x, self.cdt(dt), 2 * j + 1)})" for j in range(n))
    regs_a, regs_b = lanes("x", a, 4), lanes("y", b, 2)
    outs = ", ".join(f'"+f"({self.render_gep("c", self.cdt(c), j)})' for j in range(4))
    self.need(fn, f"{DEVICE_FN}{tcc} {fn}({ta} x, {tb} y, {tcc} c) {{\n"
                  f"  unsigned int A[4] = {{{regs_a}}}, B[2] = {{{regs_b}}};\n"
                  f'  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32 {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, '
                  f'{{%0,%1,%2,%3}};"\n    : {outs}\n    : "r"(A[0]), "r"(A[1]), "r"(A[2]), "r"(A[3]), "r"(B[0]), "r"(B[1]));\n'
                  f"  return c;\n}}")
    return f"{fn}({', '.join(args)})"

  # ---- the kernel
  # ---- memory: proven-aligned vector accesses through CUDA's native vector types (see the module doc)
  def _native_vector(self, u: UOp, dt: DType) -> str | None:
    """The CUDA vector type (`float4`, `ushort4`, ...) for the access of `dt` through pointer uop `u` when it is
    provably aligned to the whole vector, else None."""
    m = self.mdt(dt)
    if dt.count not in (2, 4) or (name := _NATIVE.get(m.scalar())) is None or m.scalar().itemsize * dt.count > 16: return None
    # only a plain INDEX into a buffer of scalars of this very dtype (a pointer CAST could change the element size the
    # index counts in)
    if u.op is not Ops.INDEX or u.src[0].op not in (Ops.DEFINE_GLOBAL, Ops.DEFINE_LOCAL) or u.src[0].dtype.base != dt.scalar(): return None
    if u.src[1].dtype.count != 1 or u.src[1].const_factor() % dt.count: return None
    return f"{name}{dt.count}"

  def _native_access(self, nat: str, dt: DType, load: bool) -> str:
    m = self.mdt(dt)
    scal, vec = self.tname(m.scalar()), self.tname(m)
    lanes = "xyzw"[:dt.count]
    if load:
      fn = f"pg_ld_{nat}"
      body = f"{nat} t = *(const {nat}*)p; return {vec}{{{{{', '.join(f't.{c}' for c in lanes)}}}}};"
      self.need(fn, f"{DEVICE_FN}{vec} {fn}(const {scal}* p) {{ {body} }}")
    else:
      fn = f"pg_st_{nat}"
      body = f"{nat} t; {' '.join(f't.{c} = v.v[{n}];' for n, c in enumerate(lanes))} *({nat}*)p = t;"
      self.need(fn, f"{DEVICE_FN}void {fn}({scal}* p, {vec} v) {{ {body} }}")
    return fn

  def _load(self, i: int, u: UOp) -> None:
    p, dt = self.ptrs[u.src[0]], u.dtype
    if p.var or (nat := self._native_vector(u.src[0], dt)) is None: return super()._load(i, u)
    alt = u.src[1] if len(u.src) > 1 and u.src[1].dtype is not dtypes.void else None
    v = self.convert(f"{self._native_access(nat, dt, True)}({p.base}+{p.idx if p.idx is not None else 0})", dt, False)
    if p.gate is not None:
      zero = self.r[alt] if alt is not None else self.render_vectorize(self.cdt(dt), [self.render_const(0, p.elem)] * dt.count)
      v = f"({p.gate}?{v}:{zero})"
    self._define(i, u, v)

  def _store(self, u: UOp) -> None:
    p, val = self.ptrs[u.src[0]], u.src[1]
    if p.var or (nat := self._native_vector(u.src[0], val.dtype)) is None: return super()._store(u)
    st = f"{self._native_access(nat, val.dtype, False)}({p.base}+{p.idx if p.idx is not None else 0}, {self.convert(self.r[val], val.dtype, True)});"
    self.line(st if p.gate is None else f"if ({p.gate}) {st}")

  def render_atomic_add(self, p: Ptr, value: str) -> str:
    at = f"&{self._address(p, p.elem)}"
    if p.elem in (dtypes.int64, dtypes.uint64): return f"atomicAdd((unsigned long long*){at}, (unsigned long long){value});"
    return f"atomicAdd({at}, {value});"

  def render_special(self, u: UOp, size: str) -> str:
    return f"(({self.tname(u.dtype)}){'blockIdx' if u.arg.startswith('g') else 'threadIdx'}.{_XYZW[int(u.arg[-1])]})"

  def render_local(self, name: str, dt: DType, size: int) -> str: return f"__shared__ __align__(16) {self.tname(dt)} {name}[{size}];"

  def order(self, uops: Sequence[UOp]) -> list[UOp]:
    self._threads = workgroup_threads(uops, "CUDA")
    return list(uops)

  def render_kernel(self, name: str, params: Sequence[str], body: Sequence[str], prelude: Sequence[str]) -> str:
    head = f"{self.kernel_prefix}void __launch_bounds__({self._threads}) {name}({', '.join(params)}) {{"
    return "\n".join([*prelude, *([""] if prelude else []), head, *body, "}"]) + "\n"
