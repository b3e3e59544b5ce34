"""The CPU renderer's output: its structure on a few kernels (golden checks), vector accesses, and its errors."""
import numpy as np
import pytest

from plugrad.dtype import AddrSpace, dtypes
from plugrad.renderer.base import RendererError
from plugrad.renderer.cstyle import c_identifier
from plugrad.testing.kernels import LinearBuilder, linear_program, run_linear, suite
from plugrad.uop.ops import AxisType, Ops, UOp

from cpu_helpers import C_ONLY

F32, I32 = dtypes.float32, dtypes.int32


def render(cpu, name: str) -> str:
  return cpu.renderer.render(suite()[name](cpu.renderer).program("CPU", cpu.renderer))


@C_ONLY
def test_loops_registers_and_the_parallel_split(cpu):
  from plugrad_cpu.renderer import PARALLEL_MARK
  src = render(cpu, "reduce_rows")
  assert "void reduce_rows(float* data0, const float* data1, int core_id, int core_count) {" in src
  assert PARALLEL_MARK in src and "for (int ridx0 = ridx0_lo; ridx0 < ridx0_hi; ridx0++) {" in src  # the output loop is split
  assert "for (int ridx1 = 0; ridx1 < 33; ridx1++) {" in src                                       # the reduction is not
  assert "float acc0;" in src and "acc0 = 0.0f;" in src and "acc0 = (val" in src                    # a register, not an array


@C_ONLY
def test_gated_load_and_if(cpu):
  src = render(cpu, "gated")
  assert "if ((0.0f<val" in src
  # gate ? ptr[idx] : alt, the index i+3 as (ptr+i)[3] (offset addressing: one base register per row of addresses)
  assert "<37)?(data2+ridx0)[3]:(-1.0f))" in src


@C_ONLY
def test_vectors_use_gnu_vector_types(cpu):
  src = render(cpu, "vectors")
  assert "typedef float float4 __attribute__((vector_size(16), aligned(4)));" in src
  assert "float4 vconst" in src and "((float4){1.0f,2.0f,3.0f,4.0f})" in src
  assert "= (vec" in src and "*vconst" in src  # the multiply is one vector op
  assert "(data0+alu6)[3] = alu24[0];" in src      # GEP of a lane


@C_ONLY
def test_launch_indices_become_loops(cpu):
  src = render(cpu, "global_ids")
  assert "for (int gidx1 = gidx1_lo; gidx1 < gidx1_hi; gidx1++) {" in src and "for (int gidx0 = 0; gidx0 < 10; gidx0++) {" in src
  assert src.index("gidx1_lo") < src.index("gidx0 = 0")  # the outer launch dimension is the one split across threads


@C_ONLY
def test_helpers_only_when_needed(cpu):
  assert "pg_" not in render(cpu, "ew-add-int32")
  # the guards, nan-propagating MAX and THREEFRY are written out by the shared passes (codegen/decompose.py), not helpers
  assert "pg_" not in render(cpu, "ew-idiv-int32") + render(cpu, "ew-max-float32") + render(cpu, "threefry")
  assert "/((alu10||alu12)?1:val8)" in render(cpu, "ew-idiv-int32").replace(" ", "")


def wide_kernel(n: int, gate_at: int) -> list[UOp]:
  """out[8i..8i+8] = a[8i..8i+8] * (1..8) as float8 loads and stores; lanes at or past `gate_at` (by block) read 0."""
  k = LinearBuilder()
  out, a = k.glob(0, F32, n * 8), k.glob(1, F32, n * 8)
  v8 = F32.vec(8)
  scale = k.emit(UOp.const(v8, tuple(float(j + 1) for j in range(8))))
  i = k.range(n, 0)
  base = k.alu(Ops.MUL, i, k.const(I32, 8))
  gate = k.alu(Ops.CMPLT, i, k.const(I32, gate_at))
  src = k.emit(UOp(Ops.CAST, v8.ptr(n), (UOp(Ops.INDEX, a.dtype, (a, base, gate)),)))
  x = k.emit(UOp(Ops.LOAD, v8, (src, k.emit(UOp.const(v8, 0.0)))))
  dst = k.emit(UOp(Ops.CAST, v8.ptr(n), (UOp(Ops.INDEX, out.dtype, (out, base)),)))
  k.emit(UOp(Ops.STORE, dtypes.void, (dst, k.alu(Ops.MUL, x, scale))))
  k.end(i)
  return k.linear


@C_ONLY
def test_contiguous_vector_load_and_store(cpu):
  n = 6
  p = linear_program("wide8", wide_kernel(n, 4), "CPU")
  src = cpu.renderer.render(p)
  assert "typedef float float8 __attribute__((vector_size(32), aligned(4)));" in src
  assert "*((const float8*)(data1+alu" in src and "*((float8*)(data0+alu" in src
  x = np.arange(n * 8, dtype=np.float32) - 20
  got = np.frombuffer(run_linear(p, [F32, F32], [x])[0], np.float32)
  want = (x.reshape(n, 8) * np.arange(1, 9, dtype=np.float32)).reshape(-1)
  want[4 * 8:] = 0
  np.testing.assert_array_equal(got, want)
  assert run_linear(linear_program("wide8", wide_kernel(n, 4), "PYTHON"), [F32, F32], [x])[0] == got.tobytes()


def test_gather_through_a_vector_index(cpu):
  """INDEX with a vector of indices is a gather; gates per lane."""
  k = LinearBuilder()
  n = 8
  out, a = k.glob(0, F32, n * 4), k.glob(1, F32, n)
  i = k.range(n, 0)
  idx = k.emit(UOp(Ops.VECTORIZE, I32.vec(4), tuple(k.alu(Ops.MOD, k.alu(Ops.ADD, i, k.const(I32, j * 3)), k.const(I32, n)) for j in range(4))))
  ok = k.alu(Ops.CMPNE, idx, k.emit(UOp.const(I32.vec(4), 5)), dtype=dtypes.bool.vec(4))
  g = k.emit(UOp(Ops.LOAD, F32.vec(4), (UOp(Ops.INDEX, a.dtype, (a, idx, ok)), k.emit(UOp.const(F32.vec(4), -1.0)))))
  dst = k.emit(UOp(Ops.CAST, F32.vec(4).ptr(n), (UOp(Ops.INDEX, out.dtype, (out, k.alu(Ops.MUL, i, k.const(I32, 4)))),)))
  k.emit(UOp(Ops.STORE, dtypes.void, (dst, g)))
  k.end(i)
  x = np.arange(n, dtype=np.float32) * 10
  got = run_linear(linear_program("gather4", k.linear, "CPU"), [F32, F32], [x], out_size=n * 4)[0]
  want = run_linear(linear_program("gather4", k.linear, "PYTHON"), [F32, F32], [x], out_size=n * 4)[0]
  assert got == want and -1.0 in np.frombuffer(got, np.float32)


@C_ONLY
def test_register_array_with_dynamic_index(cpu):
  """A register array indexed by a loop variable stays an array."""
  k = LinearBuilder()
  out = k.glob(0, F32, 4)
  acc = k.emit(UOp(Ops.DEFINE_REG, F32.ptr(4, AddrSpace.REG), (), 0))
  i = k.range(4, 0)
  k.store(acc, i, k.emit(UOp(Ops.CAST, F32, (i,))))
  done = k.end(i)
  j = k.range(4, 1)
  k.store(out, j, k.load(acc, k.alu(Ops.ADD, k.alu(Ops.MUL, j, k.const(I32, -1)), k.const(I32, 3)), after=done))
  k.end(j)
  p = linear_program("reg_array", k.linear, "CPU")
  assert "float acc0[4];" in cpu.renderer.render(p)
  assert np.frombuffer(run_linear(p, [F32], [], out_size=4)[0], np.float32).tolist() == [3.0, 2.0, 1.0, 0.0]


@C_ONLY
def test_kernel_names_become_identifiers(cpu):
  assert c_identifier("r_4 x 4") == "r_4_x_4" and c_identifier("3mm") == "k_3mm" and c_identifier("int") == "k_int"
  k = LinearBuilder()
  out = k.glob(0, F32, 1)
  k.store(out, k.const(I32, 0), k.const(F32, 2.0))
  p = linear_program("odd name-1", k.linear, "CPU")
  src = cpu.renderer.render(p)
  assert "void odd_name_1(" in src and "odd name-1" in src
  assert np.frombuffer(run_linear(p, [F32], [], out_size=1)[0], np.float32)[0] == 2.0


def test_workgroup_kernels_are_refused_with_a_reason(cpu):
  for name in ("workgroup", "shared_reduce"):
    with pytest.raises(RendererError, match="the CPU has no workgroups: this kernel uses lidx0"): render(cpu, name)


def test_no_split_when_a_loop_reduces_into_a_scalar(cpu):
  """A top-level loop whose result is read after it (a full reduction) runs on one thread."""
  from plugrad_cpu.renderer import PARALLEL_MARK, parallel_range
  k = LinearBuilder()
  out, a = k.glob(0, F32, 1), k.glob(1, F32, 16)
  acc = k.emit(UOp(Ops.DEFINE_REG, F32.ptr(1, AddrSpace.REG), (), 0))
  c0 = k.const(I32, 0)
  k.store(acc, c0, k.const(F32, 0.0))
  i = k.range(16, 0)
  k.store(acc, c0, k.alu(Ops.ADD, k.load(acc, c0), k.load(a, i)))
  k.store(out, c0, k.load(acc, c0, after=k.end(i)))
  assert parallel_range(k.linear) is None and PARALLEL_MARK not in cpu.renderer.render(linear_program("full_sum", k.linear, "CPU"))
  x = np.arange(16, dtype=np.float32)
  assert np.frombuffer(run_linear(linear_program("full_sum", k.linear, "CPU"), [F32, F32], [x], out_size=1)[0], np.float32)[0] == x.sum()
  r = UOp.range(k.const(I32, 4), 0, AxisType.REDUCE, I32)
  assert parallel_range([r, UOp(Ops.ENDRANGE, dtypes.void, (r,))]) is None  # never a REDUCE loop
