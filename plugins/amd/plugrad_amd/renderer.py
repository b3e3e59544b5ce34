"""The HIP renderer: one `extern "C"` HIP kernel per program, on the C-family base, for clang without ROCm's headers.

* No headers (`-nogpuinc -nogpulib`): only what clang itself provides in HIP mode. `__global__`, `__device__` and
  `__shared__` are the attributes `global`, `device`, `shared`; launch indices the builtins
  `__builtin_amdgcn_workgroup_id_{x,y,z}()` and `__builtin_amdgcn_workitem_id_{x,y,z}()` (the grid is the program's
  global size in workgroups, the workgroup its local size); the workgroup size bound is
  `__attribute__((amdgpu_flat_work_group_size(1, N)))` with N the product of the local sizes (what `__launch_bounds__`
  expands to).
* The barrier is `__syncthreads()` spelled out: a release fence at workgroup scope, `__builtin_amdgcn_s_barrier()`,
  an acquire fence (LDS writes before it are visible after it).
* float16 is `_Float16` (clang's native half: AMDGPU has f16 arithmetic), computed in half and rounded per op like the
  interpreter. bfloat16 is emulated by the shared codegen pass (`native_bfloat16` stays False): bits (`unsigned short`)
  in memory, float in registers.
* Math: float32 `exp2`/`log2`/`sqrt`/`fma`/`trunc` and float64 `sqrt`/`fma`/`trunc`/`fmod` are clang builtins that
  the AMDGPU backend lowers itself (IEEE: no fast math, correctly rounded division and square root, denormals kept).
  float32 `sin` is the shared polynomial (`native_math` omits it: the hardware's v_sin_f32 is approximate); float64
  `exp2`/`log2`/`sin` and `pow` have no lowering without ROCm's ocml and are C helpers here (hipmath.py).
* Vectors are element-aligned structs (`pg_float4 { float v[4]; }`), as on CUDA: the codegen makes contiguous vector
  accesses at any element offset.
* Tensor cores: RDNA3 (gfx11) `__builtin_amdgcn_wmma_f32_16x16x16_{f16,bf16}_w32` (wave32, fragments of 16 halves and
  8 floats, `AMD_TENSOR_CORES`) and CDNA3 (gfx942) `__builtin_amdgcn_mfma_f32_16x16x16f16` /
  `__builtin_amdgcn_mfma_f32_16x16x16bf16_1k` (wave64, fragments of 4, `AMD_MFMA_TENSOR_CORES`). bfloat16 operands are
  passed as their bits (`short` vectors): the top halves of the emulated float values.
* Semantics: integer division and shifts are guarded by the shared passes (LLVM's `/ 0` is undefined), float MAX too.
"""
from __future__ import annotations

from collections.abc import Sequence

from plugrad.backend import (
  AMD_MFMA_TENSOR_CORES,
  AMD_TENSOR_CORES,
  CStyleRenderer,
  DType,
  Ops,
  Ptr,
  RendererError,
  UOp,
  dtypes,
  find_tensor_core,
  workgroup_threads,
)
from plugrad_amd import hipmath
from plugrad_amd.targets import ARCHS, Arch

_XYZW = "xyz"
DEVICE_FN = "static __attribute__((device)) inline __attribute__((always_inline)) "
BARRIER = ('__builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup"); __builtin_amdgcn_s_barrier(); '
           '__builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");')
# the float32 builtins clang lowers on AMDGPU itself, and float64's; the rest are hipmath helpers
_F32 = {"exp2": "__builtin_exp2f", "log2": "__builtin_log2f", "sqrt": "__builtin_sqrtf", "trunc": "__builtin_truncf", "fma": "__builtin_fmaf",
        "fmax": "__builtin_fmaxf", "fmod": "__builtin_fmodf"}
_F64 = {"sqrt": "__builtin_sqrt", "trunc": "__builtin_trunc", "fma": "__builtin_fma", "fmax": "__builtin_fmax", "fmod": "__builtin_fmod",
        "exp2": "pg_exp2_f64", "log2": "pg_log2_f64", "sin": "pg_sin_f64", "pow": "pg_pow_f64"}
# (builtin, element type of the A and B fragments, their lanes, lanes of C, the trailing cbsz/abid/blgp arguments of MFMA)
# per (tensor core family, input dtype)
_MATRIX = {("AMD", dtypes.float16): ("__builtin_amdgcn_wmma_f32_16x16x16_f16_w32", "_Float16", 16, 8, ""),
           ("AMD", dtypes.bfloat16): ("__builtin_amdgcn_wmma_f32_16x16x16_bf16_w32", "short", 16, 8, ""),
           ("AMD_MFMA", dtypes.float16): ("__builtin_amdgcn_mfma_f32_16x16x16f16", "_Float16", 4, 4, ", 0, 0, 0"),
           ("AMD_MFMA", dtypes.bfloat16): ("__builtin_amdgcn_mfma_f32_16x16x16bf16_1k", "short", 4, 4, ", 0, 0, 0")}


class HIPRenderer(CStyleRenderer):
  """HIP for AMDGPU arch `arch` (gfx942, gfx1100, gfx1201, ...: plugrad_amd.targets.ARCHS)."""
  has_local = has_shared = supports_float4 = True
  vector_width = 4
  global_max = (2**31 - 1, 65535, 65535)
  local_max = (1024, 1024, 1024)
  shared_max = 65536  # LDS per workgroup (CDNA3 and RDNA3/4)
  native_math = frozenset({Ops.EXP2, Ops.LOG2})
  kernel_prefix = 'extern "C" __attribute__((global)) '
  helper_prefix = DEVICE_FN
  barrier = BARRIER
  type_map = {**CStyleRenderer.type_map, dtypes.float16: "_Float16", dtypes.bfloat16: "unsigned short"}
  # clang's __hip_atomic_fetch_add (no ROCm headers here, so no atomicAdd): global atomics for these on every arch
  atomic_add = frozenset({dtypes.float32, dtypes.float64, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64})

  def __init__(self, device: str, arch: str = "gfx942"):
    super().__init__(device)
    if arch not in ARCHS: raise RendererError(f"AMD: unsupported arch {arch!r}; supported: {', '.join(ARCHS)}")
    self.arch: str = arch
    self.target: Arch = ARCHS[arch]
    self.emulate_target = self.target.emulate
    self.tensor_cores = {"MFMA": AMD_MFMA_TENSOR_CORES, "WMMA": AMD_TENSOR_CORES}.get(self.target.matrix or "", ())
    caps = {"float16", "bfloat16", "float64", "int64", "locals", "shared"}
    self.capabilities = frozenset(caps | ({"tensor_cores"} if self.tensor_cores else set()))
    self.validate()

  def __repr__(self) -> str: return f"<HIPRenderer {self.device} {self.arch}>"

  def render_atomic_add(self, p: Ptr, value: str) -> str:
    return f"__hip_atomic_fetch_add(&{self._address(p, p.elem)}, {value}, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);"

  # ---- types
  def compute_dtype(self, dt: DType) -> DType: return dtypes.float32 if dt is dtypes.bfloat16 else dt
  def storage_dtype(self, dt: DType) -> DType: return dtypes.uint16 if dt is dtypes.bfloat16 else dt
  def vector_name(self, dt: DType) -> str: return f"pg_{super().vector_name(dt)}"  # HIP's float4 etc. are header types: not here

  def render_vectorize(self, dt: DType, parts: Sequence[str]) -> str:
    return f"{self.tname(dt)}{{{{{','.join(parts)}}}}}"  # C++ aggregate initialization (HIP is C++)

  def to_storage(self, x: str, dt: DType) -> str: raise RendererError("AMD: bfloat16 must be lowered by the shared emulation pass before rendering")
  def from_storage(self, x: str, dt: DType) -> str: raise RendererError("AMD: bfloat16 must be lowered by the shared emulation pass before rendering")

  # ---- values
  def render_special_float(self, v: float, dt: DType) -> str:
    f64 = dt is dtypes.float64
    s = f"__builtin_nan{'' if f64 else 'f'}(\"\")" if v != v else f"{'' if v > 0 else '-'}__builtin_inf{'' if f64 else 'f'}()"
    return s if dt in (dtypes.float32, dtypes.float64) else f"(({self.tname(dt)}){s})"

  def render_math(self, fn: str, dt: DType, args: Sequence[str]) -> str:
    table = _F64 if dt is dtypes.float64 else _F32
    if (name := table.get(fn)) is None:  # float32 sin and pow: through double
      if fn == "pow": name = "pg_pow_f32"
      elif fn == "sin": return f"((float){self._helper('pg_sin_f64')}((double){args[0]}))"
      else: raise RendererError(f"AMD: no {fn} for {dt!r}")
    if name.startswith("pg_"): self._helper(name)
    return f"{name}({','.join(args)})"

  def _helper(self, name: str) -> str:
    for key, code in hipmath.source(name, self.helper_prefix): self.need(key, code)
    return name

  def render_wmma(self, u: UOp, args: Sequence[str]) -> str:
    tc = find_tensor_core(u.arg)
    if tc not in self.tensor_cores: raise RendererError(f"AMD {self.arch} cannot render the tensor core {tc.device}/{tc.name}")
    builtin, elem, nab, nc, tail = _MATRIX[(tc.device, tc.dtype_in)]
    fn = f"pg_{tc.device.lower()}_{tc.name}"
    ta, tb, tcc = (self.tname(self.cdt(s.dtype)) for s in u.src)
    vab, vc = f"pg_v{nab}_{elem.strip('_').lower()}", f"pg_v{nc}_float"
    self.need(f"type {vab}", f"typedef {elem} {vab} __attribute__((ext_vector_type({nab})));")
    self.need(f"type {vc}", f"typedef float {vc} __attribute__((ext_vector_type({nc})));")
    # bfloat16 values are float32 holding bfloat16 numbers: their top half is the exact bfloat16
    bits = "(short)(__builtin_bit_cast(unsigned int, {}) >> 16)" if elem == "short" else "{}"
    def pack(x: str, dt: DType, n: int, lane: str) -> str: return ", ".join(lane.format(self.render_gep(x, self.cdt(dt), j)) for j in range(n))
    a, b, c = (s.dtype for s in u.src)
    outs = ", ".join(f"d[{j}]" for j in range(nc))
    self.need(fn, f"{DEVICE_FN}{tcc} {fn}({ta} x, {tb} y, {tcc} c) {{\n"
                  f"  {vab} a = {{{pack('x', a, nab, bits)}}}, b = {{{pack('y', b, nab, bits)}}};\n"
                  f"  {vc} d = {{{pack('c', c, nc, '{}')}}};\n"
                  f"  d = {builtin}(a, b, d{tail});\n"
                  f"  return {self.render_vectorize(self.cdt(c), [outs])};\n}}")
    return f"{fn}({', '.join(args)})"

  # ---- the kernel
  def render_special(self, u: UOp, size: str) -> str:
    kind = "workgroup" if u.arg.startswith("g") else "workitem"
    return f"(({self.tname(u.dtype)})__builtin_amdgcn_{kind}_id_{_XYZW[int(u.arg[-1])]}())"

  def render_local(self, name: str, dt: DType, size: int) -> str:
    return f"__attribute__((shared, aligned(16))) {self.tname(dt)} {name}[{size}];"

  def order(self, uops: Sequence[UOp]) -> list[UOp]:
    self._threads = workgroup_threads(uops, "AMD")
    return list(uops)

  def render_kernel(self, name: str, params: Sequence[str], body: Sequence[str], prelude: Sequence[str]) -> str:
    head = f"{self.kernel_prefix}void __attribute__((amdgpu_flat_work_group_size(1, {self._threads}))) {name}({', '.join(params)}) {{"
    return "\n".join([*prelude, *([""] if prelude else []), head, *body, "}"]) + "\n"
