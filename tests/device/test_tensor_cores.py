"""Tensor-core layouts against the vendors' documentation, and WMMA on the interpreter against numpy.

The kernels below load fragments with index arithmetic written the way each vendor's document states it (not from
the tables in renderer/tensor_cores.py), issue the WMMA, and store D the same way: if a table disagreed with its
document, the interpreter (which assembles the matrices from the tables) would compute the wrong product."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from plugrad.builtin.python_renderer import PythonRenderer
from plugrad.dtype import dtypes
from plugrad.errors import CompileError, LaunchError
from plugrad.renderer.tensor_cores import (
  AMD_TENSOR_CORES,
  CUDA_TENSOR_CORES,
  METAL_TENSOR_CORES,
  TensorCore,
  UnknownTensorCoreError,
  find_tensor_core,
  make_layout,
)
from plugrad.uop.ops import Ops, UOp, UOpError
from tests.device.test_interpreter import build, endif, glob, if_, lin, run, special

Where = Callable[[Any, int], tuple[Any, Any]]  # (lane, element) -> (row, col); lane may be an int or a UOp


# ---- the documented layouts, in the documents' own words

def ptx_a(lane: Any, i: int) -> tuple[Any, Any]:
  # PTX ISA, mma.m16n8k16 A fragment: row = groupID for a0,a1,a4,a5 else groupID+8; col = tig*2 + (i & 1), +8 for a4..a7
  group, tig = lane >> 2, lane % 4
  return (group if i < 2 or 4 <= i < 6 else group + 8), tig * 2 + (i & 1) + (0 if i < 4 else 8)


def ptx_b(lane: Any, i: int) -> tuple[Any, Any]:
  group, tig = lane >> 2, lane % 4
  return tig * 2 + (i & 1) + (0 if i < 2 else 8), group


def ptx_c(lane: Any, i: int) -> tuple[Any, Any]:
  group, tig = lane >> 2, lane % 4
  return (group if i < 2 else group + 8), tig * 2 + (i & 1)


def mlx_coord(lane: Any, i: int) -> tuple[Any, Any]:
  # MLX BaseMMAFrag::get_coord: qid = lane / 4; fm = (qid & 4) + (lane / 2) % 4; fn = (qid & 2) * 2 + (lane % 2) * 2
  qid = lane // 4
  return (qid & 4) + (lane // 2) % 4, (qid & 2) * 2 + (lane % 2) * 2 + i


def gpuopen_a(lane: Any, ele: int) -> tuple[Any, Any]: return lane % 16, ele         # a_frag[ele] = a[16 * lane + ele]
def gpuopen_b(lane: Any, ele: int) -> tuple[Any, Any]: return ele, lane % 16         # b_frag[ele] = b[16 * ele + lane]
def gpuopen_c(lane: Any, ele: int) -> tuple[Any, Any]: return ele * 2 + lane // 16, lane % 16  # c[16 * (ele*2 + lIdx/16) + lane]


DOCUMENTED: dict[str, tuple[Where, Where, Where]] = {"CUDA": (ptx_a, ptx_b, ptx_c), "METAL": (mlx_coord, mlx_coord, mlx_coord),
                                                     "AMD": (gpuopen_a, gpuopen_b, gpuopen_c)}
ALL_TCS = CUDA_TENSOR_CORES + METAL_TENSOR_CORES + AMD_TENSOR_CORES


def tc_id(tc: TensorCore) -> str: return f"{tc.device}-{tc.name}"


@pytest.mark.parametrize("tc", ALL_TCS, ids=tc_id)
def test_tables_match_the_documents(tc: TensorCore):
  a, b, c = DOCUMENTED[tc.device]
  assert tc.a_layout == make_layout(tc.threads, tc.elements[0], a)
  assert tc.b_layout == make_layout(tc.threads, tc.elements[1], b)
  assert tc.c_layout == make_layout(tc.threads, tc.elements[2], c)
  assert tc.source and tc.wmma_arg == (tc.name, tc.device, tc.dims) and find_tensor_core(tc.wmma_arg) is tc


def test_known_fragment_positions():
  cuda, metal, amd = CUDA_TENSOR_CORES[0], METAL_TENSOR_CORES[0], AMD_TENSOR_CORES[0]
  assert (cuda.m, cuda.n, cuda.k) == (16, 8, 16) and cuda.elements == (8, 4, 4)
  assert cuda.c_layout[0] == ((0, 0), (0, 1), (8, 0), (8, 1)) and cuda.c_layout[5] == ((1, 2), (1, 3), (9, 2), (9, 3))
  assert cuda.a_layout[0][4:6] == ((0, 8), (0, 9)) and cuda.b_layout[1] == ((2, 0), (3, 0), (10, 0), (11, 0))
  assert [metal.c_layout[lane] for lane in (0, 1, 2, 8, 16)] == [((0, 0), (0, 1)), ((0, 2), (0, 3)), ((1, 0), (1, 1)), ((0, 4), (0, 5)),
                                                                 ((4, 0), (4, 1))]
  assert amd.a_layout[17] == amd.a_layout[1] and amd.c_layout[17][:2] == ((1, 1), (3, 1)) and amd.elements == (16, 16, 8)


# ---- WMMA on the interpreter

def _host(x: np.ndarray, dt: Any) -> np.ndarray:
  return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16) if dt is dtypes.bfloat16 else x.astype(dtypes.to_numpy(dt))


def wmma_kernel(tc: TensorCore, where: tuple[Where, Where, Where] | None = None, gate_upper: bool = False) -> list[UOp]:
  """Two workgroups of 64 threads: four lane groups, each computing its own D = A @ B + C."""
  m, n, k = tc.m, tc.n, tc.k
  fa, fb, fc = where or DOCUMENTED[tc.device]
  A, B, C, D = glob(0, tc.dtype_in, 4 * m * k), glob(1, tc.dtype_in, 4 * k * n), glob(2, tc.dtype_out, 4 * m * n), glob(3, tc.dtype_out, 4 * m * n)
  g, l = special("gidx0", 2), special("lidx0", 64)
  grp, lane = g * 2 + l // 32, l % 32
  def frag(buf: UOp, f: Where, count: int, rows: int, cols: int, ldt: Any) -> UOp:
    elems = []
    for i in range(count):
      r, c = f(lane, i)
      idx = buf.index(grp * (rows * cols) + r * cols + c, lane < 16) if gate_upper else buf.index(grp * (rows * cols) + r * cols + c)
      elems.append(idx.load())
    return UOp(Ops.VECTORIZE, ldt.vec(count), tuple(elems))
  a = frag(A, fa, tc.elements[0], m, k, tc.dtype_in)
  b = frag(B, fb, tc.elements[1], k, n, tc.dtype_in)
  c = frag(C, fc, tc.elements[2], m, n, tc.dtype_out)
  d = tc.wmma(a, b, c)
  stores = []
  for i in range(tc.elements[2]):
    r, col = fc(lane, i)
    stores.append(D.index(grp * (m * n) + r * n + col).store(d.gep(i)))
  return lin(A, B, C, D, g, l, *stores)


def wmma_inputs(tc: TensorCore, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  # small multiples of 1/4 (1/2 for a half accumulator): every product and sum is exact, so the comparison can be exact
  gen = np.random.default_rng(seed)
  scale = 2 if tc.dtype_out is dtypes.float16 else 4
  a, b, c = (gen.integers(-4, 5, (4, *shape)).astype(np.float64) / scale for shape in ((tc.m, tc.k), (tc.k, tc.n), (tc.m, tc.n)))
  return a, b, c


def run_wmma(tc: TensorCore, kernel: list[UOp], a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
  bufs = [_host(a, tc.dtype_in), _host(b, tc.dtype_in), _host(c, tc.dtype_out), _host(np.zeros_like(c), tc.dtype_out)]
  return run(kernel, *bufs, global_size=(2, 1, 1), local_size=(64, 1, 1), emulate=tc.device, name="wmma")[3].astype(np.float64).reshape(c.shape)


@pytest.mark.parametrize("tc", ALL_TCS, ids=tc_id)
def test_wmma_computes_a_times_b_plus_c(tc: TensorCore):
  a, b, c = wmma_inputs(tc)
  got = run_wmma(tc, wmma_kernel(tc), a, b, c)
  np.testing.assert_array_equal(got, a @ b + c)


@pytest.mark.parametrize("tc", [CUDA_TENSOR_CORES[0], METAL_TENSOR_CORES[0], AMD_TENSOR_CORES[0]], ids=tc_id)
def test_a_wrong_layout_gives_a_wrong_product(tc: TensorCore):
  a_doc, b_doc, c_doc = DOCUMENTED[tc.device]
  def transposed(lane: Any, i: int) -> tuple[Any, Any]: return a_doc(lane, i)[::-1]  # type: ignore[return-value]
  a, b, c = wmma_inputs(tc, seed=1)
  got = run_wmma(tc, wmma_kernel(tc, (transposed, b_doc, c_doc)), a, b, c)
  assert not np.array_equal(got, a @ b + c)
  np.testing.assert_array_equal(got, a.transpose(0, 2, 1) @ b + c)  # the kernel fed A transposed, and that is what it got


def test_amd_lanes_must_replicate_their_inputs():
  tc = AMD_TENSOR_CORES[0]
  a, b, c = wmma_inputs(tc)
  with pytest.raises(LaunchError, match=r"lanes holding the same element of A disagree"):
    run_wmma(tc, wmma_kernel(tc, gate_upper=True), a, b, c)  # lanes 16..31 load 0 instead of repeating lanes 0..15


def test_wmma_needs_whole_lane_groups():
  tc = METAL_TENSOR_CORES[0]
  A, D = glob(0, dtypes.float32, 64), glob(1, dtypes.float32, 64)
  l = special("lidx0", 32)
  frag = UOp(Ops.VECTORIZE, dtypes.float32.vec(2), (A.index(l * 2).load(), A.index(l * 2 + 1).load()))
  d = tc.wmma(frag, frag, frag)
  half = if_(l < 16)
  prog = lin(A, D, l, frag, half, D.index(l * 2).store(d.gep(0)), endif(half))
  with pytest.raises(LaunchError, match="WMMA m8n8k8_float32_float32 in divergent code"):
    run(prog, np.ones(64, np.float32), np.zeros(64, np.float32), local_size=(32, 1, 1), emulate="METAL")
  l16 = special("lidx0", 16)
  f16 = UOp(Ops.VECTORIZE, dtypes.float32.vec(2), (A.index(l16 * 2).load(), A.index(l16 * 2 + 1).load()))
  with pytest.raises(LaunchError, match="needs workgroups of a multiple of 32 threads, the launch has 16"):
    run(lin(A, D, l16, D.index(l16 * 2).store(tc.wmma(f16, f16, f16).gep(0))), np.ones(64, np.float32), np.zeros(64, np.float32),
        local_size=(16, 1, 1), emulate="METAL")


def test_wmma_only_for_the_emulated_devices_tensor_cores():
  tc = CUDA_TENSOR_CORES[0]
  with pytest.raises(CompileError, match="CUDA/m16n8k16_float16_float32 is not a tensor core of target METAL"):
    build(wmma_kernel(tc), emulate="METAL")
  with pytest.raises(CompileError, match="is not a tensor core of target PYTHON"): build(wmma_kernel(tc), emulate="")
  assert PythonRenderer("PYTHON", "CUDA").tensor_cores == CUDA_TENSOR_CORES


def test_bad_tensor_core_descriptions_and_args():
  half4 = UOp.const(dtypes.half, 1.0).vectorize(*[UOp.const(dtypes.half, 1.0)] * 3)
  with pytest.raises(UOpError, match="fragment a must be a dtypes.float16.vec\\(8\\) UOp, got dtypes.float16.vec\\(4\\)"):
    CUDA_TENSOR_CORES[0].wmma(half4, half4, half4)
  with pytest.raises(UnknownTensorCoreError, match="no tensor cores are known for device 'TPU'"): find_tensor_core(("x", "TPU", (1, 1, 1)))
  with pytest.raises(UnknownTensorCoreError, match="CUDA has no tensor core 'm1'"): find_tensor_core(("m1", "CUDA", (8, 16, 16)))
  with pytest.raises(UnknownTensorCoreError, match="has dims"): find_tensor_core(("m16n8k16_float16_float32", "CUDA", (16, 16, 16)))
  good = METAL_TENSOR_CORES[0]
  with pytest.raises(ValueError, match="the C layout does not cover all 8x8 elements"):
    TensorCore("bad", "METAL", (8, 8, 8), dtypes.float32, dtypes.float32, 32, (2, 2, 2), good.a_layout, good.b_layout,
               make_layout(32, 2, lambda lane, e: (lane % 8, e)))
  with pytest.raises(ValueError, match="must have 32 lanes of 2 elements"):
    TensorCore("bad", "METAL", (8, 8, 8), dtypes.float32, dtypes.float32, 32, (2, 2, 2), good.a_layout[:16], good.b_layout, good.c_layout)
