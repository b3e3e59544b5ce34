"""Tensor cores: warp-wide matrix multiply-accumulate instructions, described as data.

A `TensorCore` computes `D = A @ B + C` for one group of `threads` lanes (a warp, SIMD-group or wave), where A is
M×K, B is K×N and C, D are M×N. No lane holds a whole matrix: each holds a few elements (a *fragment*) of each, and
which (row, col) lives in which (lane, element) is the instruction's layout. A and B have the same dtype unless
`dtype_in_b` says otherwise (API 2.5: x86's `vpdpbusd` multiplies unsigned by signed bytes). Both sides of the
contract read the same tables: the codegen loads and stores fragments by them, and the PYTHON interpreter assembles the matrices from
them to execute `Ops.WMMA` — so a wrong layout here, or a lowering that disagrees with it, fails the emulate tier.

**The WMMA uop** (stage 3, the linear program):

```
UOp(Ops.WMMA, tc.dtype_out.vec(tc.elements[2]), (a, b, c), arg=tc.wmma_arg)
  a: tc.dtype_in.vec(tc.elements[0])    this lane's fragment of A, element e at tc.a_layout[lane][e]
  b: tc.dtype_b.vec(tc.elements[1])     this lane's fragment of B, element e at tc.b_layout[lane][e]
  c: tc.dtype_out.vec(tc.elements[2])   this lane's fragment of C; the result is D in the same layout (tc.c_layout)
  arg = (tc.name, tc.device, tc.dims)   the name identifies the instruction within its device family; dims = (N, M, K)
```

`lane` is the thread's position in its group: the linear local id (`lidx0 + lidx1*l0 + lidx2*l0*l1`) modulo
`threads`; the workgroup size must be a multiple of `threads`, and every lane of a group executes the WMMA together.
Use `find_tensor_core(arg)` to get the description back from a uop's arg, and `tc.wmma(a, b, c)` to build one.

**CPU tensor cores** (family "CPU", API 2.5: `CPU_AMX_TENSOR_CORES`, `CPU_AVX512_TENSOR_CORES`). A CPU instruction is
executed by one thread, so `threads` is 1 and the single "lane" holds the instruction's whole operands: a fragment is
the vector register (AVX-512) or the tile (AMX) in the element order the instruction reads it. The TC action then adds
no LOCAL range (opt/tc.py), the interpreter runs each WMMA on one thread's values, and a renderer maps fragment
element e to the register's element e. Where the hardware broadcasts one operand (AVX-512: A's K-long row, one 32-bit
group, to all 16 lanes), the fragment holds it once and the renderer broadcasts it. B is in the instruction's
*VNNI* order: the K values of one column are adjacent (element K·n + p of a 512-bit register is B[p][n]; an AMX B tile
row r holds rows K_r·r .. K_r·r+K_r-1 of B that way, K_r = 4 / bytes per element).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from plugrad.dtype import DType, dtypes
from plugrad.uop.ops import Ops, UOp, UOpError

Layout = tuple[tuple[tuple[int, int], ...], ...]  # layout[lane][element] = (row, col)


def make_layout(threads: int, elements: int, where: Callable[[int, int], tuple[int, int]]) -> Layout:
  """A layout table from a formula `where(lane, element) -> (row, col)`."""
  return tuple(tuple(where(lane, e) for e in range(elements)) for lane in range(threads))


@dataclass(frozen=True)
class TensorCore:
  name: str                          # unique within `device`, e.g. "m16n8k16_float16_float32"
  device: str                        # the device family whose instruction this is: "CUDA", "METAL", "AMD", "AMD_MFMA"
  dims: tuple[int, int, int]         # (N, M, K)
  dtype_in: DType                    # of A and B
  dtype_out: DType                   # of C and D
  threads: int                       # lanes that execute one instruction together
  elements: tuple[int, int, int]     # elements of A, B and C each lane holds
  a_layout: Layout                   # (row, col) of A (M×K) at [lane][element]
  b_layout: Layout                   # (row, col) of B (K×N)
  c_layout: Layout                   # (row, col) of C and D (M×N)
  source: str = ""                   # where the layout is documented
  dtype_in_b: DType | None = None    # of B when it differs from A's (API 2.5); None: dtype_in

  @property
  def n(self) -> int: return self.dims[0]
  @property
  def m(self) -> int: return self.dims[1]
  @property
  def k(self) -> int: return self.dims[2]
  @property
  def dtype_b(self) -> DType: return self.dtype_in if self.dtype_in_b is None else self.dtype_in_b
  @property
  def wmma_arg(self) -> tuple[str, str, tuple[int, int, int]]: return (self.name, self.device, self.dims)

  def __post_init__(self) -> None:
    who = f"TensorCore {self.device}/{self.name}"
    if not (isinstance(self.dims, tuple) and len(self.dims) == 3 and all(isinstance(d, int) and d > 0 for d in self.dims)):
      raise ValueError(f"{who}: dims must be three positive ints (N, M, K), got {self.dims!r}")
    if not (isinstance(self.elements, tuple) and len(self.elements) == 3 and all(isinstance(e, int) and e > 0 for e in self.elements)):
      raise ValueError(f"{who}: elements must be three positive ints (A, B, C per lane), got {self.elements!r}")
    if not isinstance(self.threads, int) or self.threads <= 0: raise ValueError(f"{who}: threads must be a positive int, got {self.threads!r}")
    if self.dtype_in.count != 1 or self.dtype_out.count != 1 or self.dtype_b.count != 1:
      raise ValueError(f"{who}: dtype_in, dtype_in_b and dtype_out must be scalar dtypes")
    n, m, k = self.dims
    for what, layout, (rows, cols), count, exact in (("A", self.a_layout, (m, k), self.elements[0], False),
                                                     ("B", self.b_layout, (k, n), self.elements[1], False),
                                                     ("C", self.c_layout, (m, n), self.elements[2], True)):
      if len(layout) != self.threads or any(len(lane) != count for lane in layout):
        raise ValueError(f"{who}: the {what} layout must have {self.threads} lanes of {count} elements")
      held = [rc for lane in layout for rc in lane]
      if any(not (0 <= r < rows and 0 <= c < cols) for r, c in held): raise ValueError(f"{who}: the {what} layout leaves the {rows}x{cols} matrix")
      if len(set(held)) != rows * cols: raise ValueError(f"{who}: the {what} layout does not cover all {rows}x{cols} elements")
      # D is written back through the C layout, so each element of C must have exactly one owner
      if exact and len(held) != rows * cols: raise ValueError(f"{who}: the {what} layout holds some elements twice")

  def wmma(self, a: UOp, b: UOp, c: UOp) -> UOp:
    """The WMMA uop of this tensor core on fragments `a`, `b`, `c` (checked against the fragment dtypes)."""
    want = (self.dtype_in.vec(self.elements[0]), self.dtype_b.vec(self.elements[1]), self.dtype_out.vec(self.elements[2]))
    for what, u, dt in zip("abc", (a, b, c), want):
      if not isinstance(u, UOp) or u.dtype is not dt:
        got = repr(u.dtype) if isinstance(u, UOp) else type(u).__name__
        raise UOpError(f"WMMA {self.device}/{self.name}: fragment {what} must be a {dt!r} UOp, got {got}")
    return UOp(Ops.WMMA, want[2], (a, b, c), self.wmma_arg)


def _tc(device: str, dims: tuple[int, int, int], dtype_in: DType, dtype_out: DType, elements: tuple[int, int, int], source: str,
        a: Callable[[int, int], tuple[int, int]], b: Callable[[int, int], tuple[int, int]], c: Callable[[int, int], tuple[int, int]],
        threads: int = 32) -> TensorCore:
  n, m, k = dims
  names = {dtypes.float16: "float16", dtypes.bfloat16: "bfloat16", dtypes.float32: "float32"}
  return TensorCore(f"m{m}n{n}k{k}_{names[dtype_in]}_{names[dtype_out]}", device, dims, dtype_in, dtype_out, threads, elements,
                    make_layout(threads, elements[0], a), make_layout(threads, elements[1], b), make_layout(threads, elements[2], c), source)


# ---- CUDA: mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32
# Source: NVIDIA PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" (section 9.7.13.4.8 in PTX 8.x).
# With groupID = lane >> 2 and threadID_in_group = lane % 4:
#   A (16x16): a0..a7; row = groupID (+8 for a2,a3,a6,a7); col = 2*threadID_in_group + (i & 1) (+8 for a4..a7)
#   B (16x8):  b0..b3; row = 2*threadID_in_group + (i & 1) (+8 for b2,b3); col = groupID
#   C/D (16x8, f32): c0..c3; row = groupID (+8 for c2,c3); col = 2*threadID_in_group + (i & 1)
_CUDA_SRC = "NVIDIA PTX ISA: Matrix Fragments for mma.m16n8k16 with floating point type"


def _cuda_a(lane: int, e: int) -> tuple[int, int]: return (lane >> 2) + 8 * ((e >> 1) & 1), 2 * (lane & 3) + (e & 1) + 8 * (e >> 2)
def _cuda_b(lane: int, e: int) -> tuple[int, int]: return 2 * (lane & 3) + (e & 1) + 8 * (e >> 1), lane >> 2
def _cuda_c(lane: int, e: int) -> tuple[int, int]: return (lane >> 2) + 8 * (e >> 1), 2 * (lane & 3) + (e & 1)


CUDA_TENSOR_CORES: tuple[TensorCore, ...] = tuple(
  _tc("CUDA", (8, 16, 16), din, dtypes.float32, (8, 4, 4), _CUDA_SRC, _cuda_a, _cuda_b, _cuda_c) for din in (dtypes.float16, dtypes.bfloat16))


# ---- METAL: simdgroup_multiply_accumulate on simdgroup_float8x8 / simdgroup_half8x8
# Every lane holds two horizontally adjacent elements of each 8x8 matrix (thread_elements() of a simdgroup_matrix),
# A, B and C alike: row = (lane/2 % 4) + 4*(lane/16), cols = 2*(lane % 2) + 4*(lane/8 % 2) + {0, 1}.
# Source: the MSL specification leaves this distribution to the implementation; the layout here is the one Apple
# documents in its own open-source code, MLX `mlx/backend/metal/kernels/steel/gemm/mma.h` (BaseMMAFrag::get_coord).
_METAL_SRC = "Apple MLX steel/gemm/mma.h BaseMMAFrag::get_coord (the MSL spec leaves the distribution implementation-defined)"


def _metal(lane: int, e: int) -> tuple[int, int]: return ((lane >> 1) & 3) + 4 * ((lane >> 4) & 1), 2 * (lane & 1) + 4 * ((lane >> 3) & 1) + e


METAL_TENSOR_CORES: tuple[TensorCore, ...] = tuple(
  _tc("METAL", (8, 8, 8), din, dout, (2, 2, 2), _METAL_SRC, _metal, _metal, _metal)
  for din, dout in ((dtypes.float32, dtypes.float32), (dtypes.float16, dtypes.float32), (dtypes.float16, dtypes.float16)))


# ---- AMD RDNA3 (gfx11): v_wmma_f32_16x16x16_{f16,bf16}, wave32
# Source: AMD RDNA3 ISA reference guide, section 7.9 "Wave Matrix Multiply Accumulate", and AMD GPUOpen
# "How to accelerate AI applications on RDNA 3 using WMMA" (2023). Lane l holds row l%16 of A and column l%16 of B,
# all 16 K values; lanes 16..31 must hold the same A and B values as lanes 0..15 (gfx11 replicates the inputs).
# The f32 result: element i of lane l is D[2*i + l//16][l%16].
# RDNA4 (gfx12) changed the WMMA fragments (no replication, 8 elements per lane): not described here.
_AMD_SRC = "AMD RDNA3 ISA guide 7.9 (WMMA) and GPUOpen 'How to accelerate AI applications on RDNA 3 using WMMA'"


def _amd_a(lane: int, e: int) -> tuple[int, int]: return lane % 16, e
def _amd_b(lane: int, e: int) -> tuple[int, int]: return e, lane % 16
def _amd_c(lane: int, e: int) -> tuple[int, int]: return 2 * e + lane // 16, lane % 16


AMD_TENSOR_CORES: tuple[TensorCore, ...] = tuple(
  _tc("AMD", (16, 16, 16), din, dtypes.float32, (16, 16, 8), _AMD_SRC, _amd_a, _amd_b, _amd_c) for din in (dtypes.float16, dtypes.bfloat16))


# ---- AMD CDNA3 (gfx942, MI300): v_mfma_f32_16x16x16_{f16,bf16} (bf16: the `_1k` form), wave64
# Source: AMD CDNA3 ISA reference guide, chapter 7 "Matrix Arithmetic Instructions", and AMD's Matrix Instruction
# Calculator (`matrix_calculator.py --architecture cdna3 --instruction v_mfma_f32_16x16x16_f16 --detail-instruction`):
#   A[i][k]: lane = i + 16 * (k // 4), item = k % 4     B[k][j]: lane = j + 16 * (k // 4), item = k % 4
#   D[i][j]: lane = j + 16 * (i // 4), item = i % 4
# so lane l holds row l%16 of A and column l%16 of B at K = 4*(l//16) .. +3, and D's rows 4*(l//16) .. +3 of column
# l%16. No lane repeats an element (unlike RDNA3's WMMA). Its own family, "AMD_MFMA": the names repeat RDNA3's.
_AMD_MFMA_SRC = "AMD CDNA3 ISA guide ch. 7 (MFMA) and AMD Matrix Instruction Calculator, v_mfma_f32_16x16x16_f16 --detail-instruction"


def _mfma_a(lane: int, e: int) -> tuple[int, int]: return lane % 16, 4 * (lane // 16) + e
def _mfma_b(lane: int, e: int) -> tuple[int, int]: return 4 * (lane // 16) + e, lane % 16
def _mfma_c(lane: int, e: int) -> tuple[int, int]: return 4 * (lane // 16) + e, lane % 16


AMD_MFMA_TENSOR_CORES: tuple[TensorCore, ...] = tuple(
  _tc("AMD_MFMA", (16, 16, 16), din, dtypes.float32, (4, 4, 4), _AMD_MFMA_SRC, _mfma_a, _mfma_b, _mfma_c, threads=64)
  for din in (dtypes.float16, dtypes.bfloat16))


# ---- CPU (x86): AMX tiles and AVX-512 dot-product instructions, one thread each (threads=1, see the module doc)
# Source: Intel 64 and IA-32 Architectures Software Developer's Manual, vol. 2 (TDPBF16PS, TDPBSSD, VDPBF16PS,
# VPDPBUSD) and the Intel AMX chapter of vol. 1 (tiles of up to 16 rows of 64 bytes). Integer TCs accumulate in int32
# with wraparound (no saturation), bf16 ones in float32.
#   tdpbf16ps (AMX-BF16): C tile 16x16 fp32, A tile 16 rows x 32 bf16 (row-major), B tile 16 rows x 16 bf16 pairs:
#     tile element 32r + 2n + p is B[2r + p][n].
#   tdpbssd (AMX-INT8): C tile 16x16 int32, A tile 16 rows x 64 int8, B tile 16 rows x 16 groups of 4 int8:
#     tile element 64r + 4n + p is B[4r + p][n].
#   vdpbf16ps (AVX512-BF16, zmm): lane n of the 16 fp32 accumulators += A[0]*B[0][n] + A[1]*B[1][n]; A is one bf16 pair
#     (broadcast), B 32 bf16 with element 2n + p = B[p][n].
#   vpdpbusd (AVX512-VNNI, zmm): lane n of the 16 int32 accumulators += sum_p u8 A[p] * s8 B[p][n] for p < 4; A is 4
#     unsigned bytes (broadcast), B 64 signed bytes with element 4n + p = B[p][n].
_X86_SRC = "Intel SDM vol. 2: TDPBF16PS, TDPBSSD, VDPBF16PS, VPDPBUSD; vol. 1: Intel AMX"


def _x86(name: str, dims: tuple[int, int, int], din: DType, dout: DType, dinb: DType | None = None) -> TensorCore:
  n, m, k = dims
  group = 4 // din.itemsize  # the K values of one B column that sit together in a 32-bit element
  def a(_: int, e: int) -> tuple[int, int]: return e // k, e % k
  def b(_: int, e: int) -> tuple[int, int]: return group * (e // (n * group)) + e % group, (e % (n * group)) // group
  def c(_: int, e: int) -> tuple[int, int]: return e // n, e % n
  return TensorCore(name, "CPU", dims, din, dout, 1, (m * k, k * n, m * n), make_layout(1, m * k, a), make_layout(1, k * n, b),
                    make_layout(1, m * n, c), _X86_SRC, dinb)


CPU_AVX512_TENSOR_CORES: tuple[TensorCore, ...] = (_x86("vdpbf16ps", (16, 1, 2), dtypes.bfloat16, dtypes.float32),
                                                   _x86("vpdpbusd", (16, 1, 4), dtypes.uint8, dtypes.int32, dtypes.int8))
# AMX first: the optimizer takes the first tensor core whose dtypes and sizes fit (AVX-512 for what AMX has no form of)
CPU_AMX_TENSOR_CORES: tuple[TensorCore, ...] = (_x86("tdpbf16ps", (16, 16, 32), dtypes.bfloat16, dtypes.float32),
                                                _x86("tdpbssd", (16, 16, 64), dtypes.int8, dtypes.int32), *CPU_AVX512_TENSOR_CORES)

TENSOR_CORES: dict[str, tuple[TensorCore, ...]] = {"CUDA": CUDA_TENSOR_CORES, "METAL": METAL_TENSOR_CORES, "AMD": AMD_TENSOR_CORES,
                                                   "AMD_MFMA": AMD_MFMA_TENSOR_CORES, "CPU": CPU_AMX_TENSOR_CORES}


class UnknownTensorCoreError(ValueError):
  """A WMMA arg that names no known tensor core."""


def find_tensor_core(arg: Any) -> TensorCore:
  """The built-in TensorCore a WMMA uop's arg `(name, device, dims)` refers to."""
  if not (isinstance(arg, tuple) and len(arg) == 3 and isinstance(arg[0], str) and isinstance(arg[1], str)):
    raise UnknownTensorCoreError(f"a WMMA arg must be (tensor core name, device, (N, M, K)), got {arg!r}")
  name, device, dims = arg
  if device not in TENSOR_CORES:
    raise UnknownTensorCoreError(f"WMMA arg {arg!r}: no tensor cores are known for device {device!r}; known: {sorted(TENSOR_CORES)}")
  for tc in TENSOR_CORES[device]:
    if tc.name == name:
      if tc.dims != dims: raise UnknownTensorCoreError(f"WMMA arg {arg!r}: {device}/{name} has dims {tc.dims}, not {dims!r}")
      return tc
  raise UnknownTensorCoreError(f"WMMA arg {arg!r}: {device} has no tensor core {name!r}; it has {[tc.name for tc in TENSOR_CORES[device]]}")
