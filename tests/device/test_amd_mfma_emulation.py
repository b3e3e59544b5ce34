"""The CDNA3 MFMA layouts (`AMD_MFMA_TENSOR_CORES`) against AMD's description, executed by the interpreter under
`EMULATE=AMD_MFMA`, and the TC lowering (explicit and chosen by the heuristics) checked with numbers. RDNA3's WMMA
(`EMULATE=AMD`) is checked the same way in tests/device/test_tensor_cores.py and tests/codegen/test_optimizer.py.

These need only the core (the PYTHON device's emulation), so they are the core's tests, not plugrad-amd's
(plugins/amd/tests compiles the same layouts for gfx942)."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from plugrad.builtin.python_renderer import PythonRenderer
from plugrad.dtype import dtypes
from plugrad.errors import CompileError, LaunchError
from plugrad.renderer.tensor_cores import AMD_MFMA_TENSOR_CORES, AMD_TENSOR_CORES, TENSOR_CORES, TensorCore, find_tensor_core
from plugrad.uop.ops import Ops, UOp
from tests.codegen import test_optimizer
from tests.device.test_interpreter import build, glob, lin, run, special

# ---- the layout in AMD's words: the Matrix Instruction Calculator's (row, col) -> (lane, item) for
# v_mfma_f32_16x16x16_f16 / _bf16 (--detail-instruction): A[i][k], B[k][j], D[i][j]

def calc_a(i: int, k: int) -> tuple[int, int]: return i + 16 * (k // 4), k % 4
def calc_b(k: int, j: int) -> tuple[int, int]: return j + 16 * (k // 4), k % 4
def calc_d(i: int, j: int) -> tuple[int, int]: return j + 16 * (i // 4), i % 4


@pytest.mark.parametrize("tc", AMD_MFMA_TENSOR_CORES, ids=lambda tc: tc.name)
def test_mfma_tables_match_the_calculator(tc: TensorCore):
  assert (tc.device, tc.dims, tc.threads, tc.elements, tc.dtype_out) == ("AMD_MFMA", (16, 16, 16), 64, (4, 4, 4), dtypes.float32)
  for layout, calc in ((tc.a_layout, calc_a), (tc.b_layout, calc_b), (tc.c_layout, calc_d)):
    for lane in range(64):
      for item in range(4):
        r, c = layout[lane][item]
        assert calc(r, c) == (lane, item), (tc.name, lane, item)
  assert find_tensor_core(tc.wmma_arg) is tc and TENSOR_CORES["AMD_MFMA"] == AMD_MFMA_TENSOR_CORES and tc.source
  # the same names as RDNA3's, told apart by the family
  assert [t.name for t in AMD_TENSOR_CORES] == [t.name for t in AMD_MFMA_TENSOR_CORES] and AMD_TENSOR_CORES[0] is not tc


def test_emulated_targets():
  r = PythonRenderer("PYTHON", "AMD_MFMA")
  assert r.tensor_cores == AMD_MFMA_TENSOR_CORES and r.shared_max == 65536 and "tensor_cores" in r.capabilities and r.emulate == "AMD_MFMA"
  assert PythonRenderer("PYTHON", "amd_mfma").target.name == "AMD_MFMA"


# ---- MFMA on the interpreter: two workgroups of 128 work-items, two wave64s each, every wave its own D = A @ B + C

def _host(x: np.ndarray, dt: Any) -> np.ndarray:
  return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16) if dt is dtypes.bfloat16 else x.astype(dtypes.to_numpy(dt))


def mfma_kernel(tc: TensorCore, transpose_a: bool = False, upper_half_only: bool = False) -> list[UOp]:
  m, n, k = tc.m, tc.n, tc.k
  A, B, C, D = glob(0, tc.dtype_in, 4 * m * k), glob(1, tc.dtype_in, 4 * k * n), glob(2, tc.dtype_out, 4 * m * n), glob(3, tc.dtype_out, 4 * m * n)
  g, l = special("gidx0", 2), special("lidx0", 128)
  grp, lane = g * 2 + l // 64, l % 64
  # where lane holds its items, in the calculator's terms: A row lane%16, K 4*(lane//16)+item; D column lane%16, rows 4*(lane//16)+item
  row16, kq = lane % 16, lane // 16
  def a_at(item: int) -> tuple[Any, Any]: return (kq * 4 + item, row16) if transpose_a else (row16, kq * 4 + item)
  a = UOp(Ops.VECTORIZE, tc.dtype_in.vec(4), tuple(A.index(grp * (m * k) + r * k + c).load() for r, c in map(a_at, range(4))))
  b = UOp(Ops.VECTORIZE, tc.dtype_in.vec(4), tuple(B.index(grp * (k * n) + (kq * 4 + i) * n + row16).load() for i in range(4)))
  c = UOp(Ops.VECTORIZE, tc.dtype_out.vec(4), tuple(C.index(grp * (m * n) + (kq * 4 + i) * n + row16).load() for i in range(4)))
  d = tc.wmma(a, b, c)
  stores = [D.index(grp * (m * n) + (kq * 4 + i) * n + row16).store(d.gep(i)) for i in range(4)]
  return lin(A, B, C, D, g, l, *stores)


def run_mfma(tc: TensorCore, kernel: list[UOp], local: int = 128, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  # small multiples of 1/4: every product and sum is exact, so the comparison is exact
  gen = np.random.default_rng(seed)
  a, b, c = (gen.integers(-4, 5, (4, *shape)).astype(np.float64) / 4 for shape in ((tc.m, tc.k), (tc.k, tc.n), (tc.m, tc.n)))
  bufs = [_host(a, tc.dtype_in), _host(b, tc.dtype_in), _host(c, tc.dtype_out), _host(np.zeros_like(c), tc.dtype_out)]
  out = run(kernel, *bufs, global_size=(2, 1, 1), local_size=(local, 1, 1), emulate="AMD_MFMA", name="mfma")[3]
  return a, b, c, out.astype(np.float64).reshape(c.shape)


@pytest.mark.parametrize("tc", AMD_MFMA_TENSOR_CORES, ids=lambda tc: tc.name)
def test_mfma_computes_a_times_b_plus_c(tc: TensorCore):
  a, b, c, got = run_mfma(tc, mfma_kernel(tc))
  np.testing.assert_array_equal(got, a @ b + c)


def test_a_wrong_layout_gives_a_wrong_product():
  tc = AMD_MFMA_TENSOR_CORES[0]
  a, b, c, got = run_mfma(tc, mfma_kernel(tc, transpose_a=True), seed=1)
  assert not np.array_equal(got, a @ b + c)
  np.testing.assert_array_equal(got, a.transpose(0, 2, 1) @ b + c)  # the kernel fed A transposed, and that is what it got


def test_mfma_needs_whole_wave64s():
  tc = AMD_MFMA_TENSOR_CORES[0]
  A, D = glob(0, dtypes.float16, 64), glob(1, dtypes.float32, 64)
  l = special("lidx0", 32)
  frag = UOp(Ops.VECTORIZE, dtypes.float16.vec(4), tuple(A.index(l * 2).load() for _ in range(4)))
  acc = UOp.const(dtypes.float32.vec(4), 0.0)
  prog = lin(A, D, l, D.index(l).store(tc.wmma(frag, frag, acc).gep(0)))
  with pytest.raises(LaunchError, match="needs workgroups of a multiple of 64 threads, the launch has 32"):
    run(prog, np.ones(64, np.float16), np.zeros(64, np.float32), local_size=(32, 1, 1), emulate="AMD_MFMA")
  with pytest.raises(CompileError, match="AMD_MFMA/m16n16k16_float16_float32 is not a tensor core of target AMD"):
    build(prog, emulate="AMD")  # RDNA3 has no MFMA


# ---- the TC lowering onto MFMA, checked with numbers (the same checks the other families get in test_optimizer)

def test_tc_lowering_onto_mfma_computes_matmuls():
  test_optimizer.test_tensor_cores_emulated("AMD_MFMA")


def test_heuristics_pick_mfma_for_a_matching_matmul():
  test_optimizer.test_workgroup_heuristics_use_tensor_cores("AMD_MFMA")
