import numpy as np
import pytest

from plugrad.codegen import get_program
from plugrad.codegen.linearize import LinearizeError, linearize
from plugrad.codegen.lower import add_gpudims, lower_reduces, split_ends
from plugrad.device.registry import Device
from plugrad.dtype import dtypes
from plugrad.engine.buffers import buffer_of, from_numpy
from plugrad.engine.realize import realize
from plugrad.uop.ops import AxisType, KernelInfo, Ops, UOp
from plugrad.uop.spec import check

F32 = dtypes.float32


def glob(slot, size): return UOp(Ops.DEFINE_GLOBAL, F32.ptr(size), (), slot)


def matmul_ast(n=3, m=2, k=4):
  out, a, b = glob(0, n * m), glob(1, n * k), glob(2, k * m)
  i, j, r = UOp.range(n, 0), UOp.range(m, 1), UOp.range(k, 2, AxisType.REDUCE)
  la = UOp(Ops.LOAD, F32, (a.index(i * k + r),))
  lb = UOp(Ops.LOAD, F32, (b.index(r * m + j),))
  red = UOp(Ops.REDUCE, F32, (la * lb, r), Ops.ADD)
  st = UOp(Ops.STORE, dtypes.void, (out.index(i * m + j), red))
  return UOp(Ops.END, dtypes.void, (st, i, j)).sink(arg=KernelInfo("mm"))


def test_linearize_nests_loops_and_hoists_invariants():
  lin = linearize(split_ends(lower_reduces(matmul_ast())))
  ops = [u.op for u in lin]
  assert ops.count(Ops.RANGE) == 3 and ops.count(Ops.ENDRANGE) == 3
  pos = {u: p for p, u in enumerate(lin)}
  rngs = [u for u in lin if u.op is Ops.RANGE]
  ends = {u.src[0]: pos[u] for u in lin if u.op is Ops.ENDRANGE}
  # i ⊃ j ⊃ r: opened in order, closed in reverse
  assert pos[rngs[0]] < pos[rngs[1]] < pos[rngs[2]] < ends[rngs[2]] < ends[rngs[1]] < ends[rngs[0]]
  # the row offset i*k is computed outside the reduce loop
  i_times_k = next(u for u in lin if u.op is Ops.MUL and rngs[0] in u.src)
  assert pos[i_times_k] < pos[rngs[2]]
  assert all(u.dtype is not dtypes.index for u in lin)
  check("linear", UOp(Ops.LINEAR, dtypes.void, tuple(lin)))


def test_program_runs_on_python():
  prg = get_program(matmul_ast(), Device["PYTHON"].renderer)
  assert prg.stage == "source" and prg.name == "mm"
  a, b = np.arange(12, dtype=np.float32).reshape(3, 4), np.arange(8, dtype=np.float32).reshape(4, 2)
  from plugrad.device.buffer import Buffer
  from plugrad.device.runner import ProgramRunner
  bufs = [Buffer("PYTHON", 6, F32)] + [Buffer.from_numpy("PYTHON", x) for x in (a, b)]
  ProgramRunner(prg)(bufs)
  np.testing.assert_allclose(bufs[0].numpy().reshape(3, 2), a @ b)


def test_gpudims_flatten_and_gate():
  ast = matmul_ast(n=5, m=3)
  lowered = add_gpudims(ast, Device["PYTHON"].renderer)
  specials = {u.arg: u for u in lowered.toposort if u.op is Ops.SPECIAL}
  assert set(specials) == {"gidx0", "lidx0"}
  assert not any(u.op is Ops.RANGE and u.arg[1] is AxisType.LOOP for u in lowered.toposort)


def test_sibling_reductions_get_separate_loops():
  x = from_numpy(np.arange(12, dtype=np.float32).reshape(3, 4), "PYTHON")
  y = x.reduce_axis(Ops.ADD, (1,)) + x.reduce_axis(Ops.MAX, (1,))
  out = realize(y)[y]
  np.testing.assert_allclose(buffer_of(out.src[0]).numpy(), np.arange(12).reshape(3, 4).sum(1) + np.arange(12).reshape(3, 4).max(1))


def test_reduction_of_an_inner_axis_runs_inside_the_outer_loop():
  # avg_pool2d with ceil_mode: the count of valid cells depends on the inner output axis only; its reduction loop
  # must run inside the outer axis's loop (it was placed beside it: "MUL is used inside two sibling loops")
  from plugrad import Tensor
  torch = pytest.importorskip("torch")
  x = np.random.default_rng(0).uniform(size=(1, 1, 5, 4)).astype(np.float32)
  got = Tensor(x, device="PYTHON").avg_pool2d(kernel_size=(2, 3), stride=(1, 2), ceil_mode=True).numpy()
  want = torch.nn.functional.avg_pool2d(torch.tensor(x), (2, 3), (1, 2), ceil_mode=True).numpy()
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_value_in_two_sibling_loops_is_an_error():
  out = glob(0, 4)
  r1, r2 = UOp.range(4, 0), UOp.range(4, 1)
  bad = UOp(Ops.STORE, dtypes.void, (out.index(r1 + r2), UOp.const(F32, 1.0)))
  with pytest.raises(LinearizeError, match="never closed"): linearize(UOp(Ops.END, dtypes.void, (bad, r1)).sink())


def test_upcast_on_a_device_without_workgroups():
  # the heuristics' register tile, through the scheduler: 16 lanes along the innermost output loop
  from plugrad.codegen import lower
  from plugrad.codegen.opt import Opt, OptOps, Scheduler
  from plugrad.renderer.base import Renderer

  class NoLocals(Renderer):  # the codegen reads only has_local and vector_width here
    def render(self, program): return ""
  r = NoLocals("NOLOCALS")
  ast = matmul_ast(n=3, m=32, k=5)
  up = Scheduler(ast, r).apply_opts([Opt(OptOps.UPCAST, 1, 16)]).get_optimized_ast()
  assert [x.arg[1] for x in up.toposort if x.op is Ops.RANGE].count(AxisType.UPCAST) == 1
  lin = lower(up, r)
  assert sum(1 for u in lin if u.op is Ops.DEFINE_REG) == 16  # one accumulator per upcast lane
  from plugrad.device.buffer import Buffer
  from plugrad.device.runner import ProgramRunner
  from plugrad.uop.program import make_program
  prg = make_program(up, "PYTHON").with_linear(lin)
  a, b = np.arange(15, dtype=np.float32).reshape(3, 5), np.arange(160, dtype=np.float32).reshape(5, 32) / 7
  bufs = [Buffer("PYTHON", 96, F32)] + [Buffer.from_numpy("PYTHON", x) for x in (a, b)]
  ProgramRunner(prg)(bufs)
  np.testing.assert_allclose(bufs[0].numpy().reshape(3, 32), a @ b, rtol=1e-5)


def test_workgroup_threads_multiplies_the_constant_local_sizes():
  from plugrad.backend import RendererError, workgroup_threads
  def special(name: str, size: UOp) -> UOp: return UOp(Ops.SPECIAL, dtypes.int32, (size,), name)
  c = lambda n: UOp.const(dtypes.int32, n)
  uops = [special("gidx0", c(1000)), special("lidx0", c(16)), special("lidx1", c(4)), special("gidx1", c(7))]
  assert workgroup_threads(uops, "CUDA") == 64 and workgroup_threads([], "CUDA") == 1  # the global sizes do not count
  n = UOp(Ops.DEFINE_VAR, dtypes.int32, (), ("n", 1, 64))
  with pytest.raises(RendererError, match="AMD: the workgroup size lidx1 must be a constant"):
    workgroup_threads([special("lidx0", c(8)), special("lidx1", n)], "AMD")
