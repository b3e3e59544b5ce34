"""Tensor cores: warp-wide matrix multiply-accumulate instructions, described as data.

A `TensorCore` computes `D = A @ B + C` for one group of `threads` lanes (a warp, SIMD-group or wave), where A is
M×K, B is K×N and C, D are M×N. No lane holds a whole matrix: each holds a few elements (a *fragment*) of each, and
which (row, col) lives in which (lane, element) is the instruction's layout. Both sides of the contract read the
same tables: the codegen loads and stores fragments by them, and the PYTHON interpreter assembles the matrices from
them to execute `Ops.WMMA` — so a wrong layout here, or a lowering that disagrees with it, fails the emulate tier.

**The WMMA uop** (stage 3, the linear program):

```
UOp(Ops.WMMA, tc.dtype_out.vec(tc.elements[2]), (a, b, c), arg=tc.wmma_arg)
  a: tc.dtype_in.vec(tc.elements[0])    this lane's fragment of A, element e at tc.a_layout[lane][e]
  b: tc.dtype_in.vec(tc.elements[1])    this lane's fragment of B, element e at tc.b_layout[lane][e]
  c: tc.dtype_out.vec(tc.elements[2])   this lane's fragment of C; the result is D in the same layout (tc.c_layout)
  arg = (tc.name, tc.device, tc.dims)   the name identifies the instruction within its device family; dims = (N, M, K)
```

`lane` is the thread's position in its group: the linear local id (`lidx0 + lidx1*l0 + lidx2*l0*l1`) modulo
`threads`; the workgroup size must be a multiple of `threads`, and every lane of a group executes the WMMA together.
Use `find_tensor_core(arg)` to get the description back from a uop's arg, and `tc.wmma(a, b, c)` to build one.
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

  @property
  def n(self) -> int: return self.dims[0]
  @property
  def m(self) -> int: return self.dims[1]
  @property
  def k(self) -> int: return self.dims[2]
  @property
  def wmma_arg(self) -> tuple[str, str, tuple[int, int, int]]: return (self.name, self.device, self.dims)

  def __post_init__(self) -> None:
    who = f"TensorCore {self.device}/{self.name}"
    if not (isinstance(self.dims, tuple) and len(self.dims) == 3 and all(isinstance(d, int) and d > 0 for d in self.dims)):
      raise ValueError(f"{who}: dims must be three positive ints (N, M, K), got {self.dims!r}")
    if not (isinstance(self.elements, tuple) and len(self.elements) == 3 and all(isinstance(e, int) and e > 0 for e in self.elements)):
      raise ValueError(f"{who}: elements must be three positive ints (A, B, C per lane), got {self.elements!r}")
    if not isinstance(self.threads, int) or self.threads <= 0: raise ValueError(f"{who}: threads must be a positive int, got {self.threads!r}")
    if self.dtype_in.count != 1 or self.dtype_out.count != 1: raise ValueError(f"{who}: dtype_in and dtype_out must be scalar dtypes")
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
    want = (self.dtype_in.vec(self.elements[0]), self.dtype_in.vec(self.elements[1]), self.dtype_out.vec(self.elements[2]))
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

TENSOR_CORES: dict[str, tuple[TensorCore, ...]] = {"CUDA": CUDA_TENSOR_CORES, "METAL": METAL_TENSOR_CORES, "AMD": AMD_TENSOR_CORES,
                                                   "AMD_MFMA": AMD_MFMA_TENSOR_CORES}


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
