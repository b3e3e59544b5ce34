"""The kernel optimizer: every action on a set of kernels computes the same numbers as the unoptimized kernel, on the
CPU (C) and on the PYTHON interpreter; invalid actions raise KernelOptError; tensor cores are checked under emulation."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from plugrad.builtin.python_renderer import PythonRenderer
from plugrad.codegen import get_program
from plugrad.codegen.opt import KernelOptError, Opt, OptOps, Scheduler, hand_coded_optimizations
from plugrad.device.buffer import Buffer
from plugrad.device.registry import Device
from plugrad.device.runner import ProgramRunner
from plugrad.dtype import AddrSpace, PtrDType, dtypes
from plugrad.engine.schedule import create_schedule
from plugrad.helpers import Context
from plugrad.tensor.tensor import Tensor
from plugrad.testing.kernels import matmul_ast
from plugrad.uop.ops import AxisType, KernelInfo, Ops, UOp, Variable

F32 = dtypes.float32
RNG = np.random.default_rng(7)


def _ast(t: Tensor) -> tuple[UOp, dict[str, int]]:
  items, _ = create_schedule(t.uop)
  ks = [it for it in items if it.kind == "kernel"]
  return ks[-1].ast, ks[-1].var_vals


def kernels(dev: str) -> dict[str, tuple[UOp, dict[str, int]]]:
  def T(*shape: int) -> Tensor: return Tensor(RNG.standard_normal(shape).astype(np.float32), device=dev)
  a, b = T(16, 24), T(24, 32)
  x = T(2, 4, 10, 10)
  w = T(8, 4, 3, 3)
  n = Variable("n", 1, 48)
  v = Tensor(RNG.standard_normal((48, 16)).astype(np.float32), device=dev)
  return {
    "matmul": _ast(a @ b),
    "conv": _ast(x.conv2d(w, padding=1)),
    "sum": _ast(T(1000).sum()),
    "rowsum": _ast(T(12, 64).sum(1)),
    "colmax": _ast(T(24, 16).max(0)),
    "broadcast": _ast(T(8, 1) * T(1, 32) + T(32)),
    "symbolic": _ast(v.shrink(((0, n.bind(20)), (0, 16))).sum(0)),
  }


def run(prg, var_vals: dict[str, int], seed: int = 0) -> list[np.ndarray]:
  """Run `prg` on fresh random inputs (the same for a given seed); return every buffer's contents."""
  rng = np.random.default_rng(seed)
  bufs = []
  for g in prg.buffers:
    dt, size = g.dtype.base, g.dtype.size
    data = rng.standard_normal(size).astype(dtypes.to_numpy(dt)) if dtypes.is_float(dt) else rng.integers(0, 5, size).astype(dtypes.to_numpy(dt))
    bufs.append(Buffer.from_numpy(prg.device, data))
  ProgramRunner(prg)(bufs, var_vals)
  return [b.numpy() for b in bufs]


def vector_fma(src: str, w: int) -> bool:
  """Whether CPU source `src` has fused multiply-adds on w-wide float vectors (C: the pg_fma helper; LLVM: the intrinsic)."""
  return f"pg_fma_float{w}(" in src or f"@llvm.fma.v{w}f32(" in src


def check_same(ast: UOp, renderer, opts: list[Opt], var_vals: dict[str, int]) -> None:
  want = run(get_program(ast, renderer, opts=[]), var_vals)
  prg = get_program(ast, renderer, opts=opts)
  assert list(prg.applied_opts) == opts
  got = run(prg, var_vals)
  for slot in prg.outs: np.testing.assert_allclose(got[slot], want[slot], rtol=2e-5, atol=2e-5, err_msg=f"{opts} slot {slot}")


def candidate_opts(k: Scheduler) -> list[Opt]:
  outs, reds = len(k.output_axes), len(k.reduce_axes)
  cands = [Opt(OptOps.NOLOCALS)]
  for ax in range(outs):
    cands += [Opt(OptOps.UPCAST, ax, 2), Opt(OptOps.UPCAST, ax, 4), Opt(OptOps.UPCAST, ax, 8), Opt(OptOps.LOCAL, ax, 2), Opt(OptOps.LOCAL, ax, 4),
              Opt(OptOps.THREAD, ax, 2), Opt(OptOps.PADTO, ax, 32)]
    if ax: cands.append(Opt(OptOps.SWAP, 0, ax))
  for ax in range(reds):
    cands += [Opt(OptOps.UNROLL, ax, 2), Opt(OptOps.UNROLL, ax, 4), Opt(OptOps.UNROLL, ax, 8), Opt(OptOps.UNROLL, ax, 0), Opt(OptOps.GROUP, ax, 4),
              Opt(OptOps.GROUPTOP, ax, 4), Opt(OptOps.PADTO, outs + ax, 32)]
  return cands


def valid(ast: UOp, renderer, opts: list[Opt]) -> bool:
  try: Scheduler(ast, renderer).apply_opts(opts)
  except KernelOptError: return False
  return True


@pytest.mark.parametrize("dev", ["CPU", "PYTHON"])
@pytest.mark.parametrize("name", ["matmul", "conv", "sum", "rowsum", "colmax", "broadcast", "symbolic"])
def test_every_action_matches_the_unoptimized_kernel(dev, name):
  ast, var_vals = kernels(dev)[name]
  renderer = Device[dev].renderer
  k = Scheduler(ast, renderer)
  singles = [o for o in candidate_opts(k) if valid(ast, renderer, [o])]
  assert singles, "no action applies"
  for o in singles: check_same(ast, renderer, [o], var_vals)
  # pairs: an UPCAST/LOCAL/THREAD with an UNROLL/GROUP (the combinations the heuristics and BEAM build)
  firsts = [o for o in singles if o.op in (OptOps.UPCAST, OptOps.LOCAL, OptOps.THREAD, OptOps.GROUP)][:4]
  seconds = [o for o in singles if o.op in (OptOps.UNROLL, OptOps.UPCAST)][:4]
  pairs = [[a, b] for a, b in itertools.product(firsts, seconds) if a != b and valid(ast, renderer, [a, b])]
  for p in pairs[:6]: check_same(ast, renderer, p, var_vals)


@pytest.mark.parametrize("dev", ["CPU", "PYTHON"])
def test_default_heuristics_match(dev):
  renderer = Device[dev].renderer
  for name, (ast, var_vals) in kernels(dev).items():
    want = run(get_program(ast, renderer, opts=[]), var_vals)
    prg = get_program(ast, renderer)
    got = run(prg, var_vals)
    for slot in prg.outs: np.testing.assert_allclose(got[slot], want[slot], rtol=2e-5, atol=2e-5, err_msg=f"{name} {prg.applied_opts}")


def test_heuristics_tile_a_cpu_matmul():
  ast, _ = _ast(Tensor(np.ones((64, 64), np.float32), device="CPU") @ Tensor(np.ones((64, 64), np.float32), device="CPU"))
  prg = get_program(ast, Device["CPU"].renderer)
  ops = {o.op for o in prg.applied_opts}
  assert OptOps.UPCAST in ops and OptOps.UNROLL in ops
  w = Device["CPU"].renderer.vector_width
  if w > 1: assert vector_fma(prg.source, w)  # the register tile is vector code, fused multiply-adds
  assert "MULACC" not in prg.source


def test_noopt_applies_nothing():
  from plugrad.helpers import Context
  ast, _ = kernels("CPU")["matmul"]
  with Context(NOOPT=1): prg = get_program(ast, Device["CPU"].renderer)
  assert prg.applied_opts == ()


def test_opts_to_apply_in_the_kernel_info():
  ast, var_vals = kernels("CPU")["matmul"]
  want = [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 0, 2)]
  info = ast.arg
  prg = get_program(ast.replace(arg=KernelInfo(info.name, (), tuple(want))), Device["CPU"].renderer)
  assert list(prg.applied_opts) == want


@pytest.mark.parametrize("opt, why", [
  (Opt(OptOps.UPCAST, 5, 2), "axis must be"),
  (Opt(OptOps.UPCAST, 0, 5), "does not divide"),
  (Opt(OptOps.UNROLL, 1, 2), "axis must be"),
  (Opt(OptOps.LOCAL, 0, 2), "no workgroups"),
  (Opt(OptOps.GROUP, 0, 4), "no workgroup memory"),
  (Opt(OptOps.NOLOCALS), "no workgroups"),
  # a float32 matmul: the CPU has no tensor cores, or (AVX512-BF16 / VNNI) none for float32
  (Opt(OptOps.TC, 0), r"no tensor cores|no tensor core of CPU takes dtypes\.float32 -> dtypes\.float32"),
  (Opt(OptOps.PADTO, 0, 16), "already a multiple"),
  (Opt(OptOps.SWAP, 0, 0), "itself"),
  (Opt(OptOps.UPCAST, 0, -1), "positive"),
])
def test_invalid_actions_raise_with_the_reason(opt, why):
  ast, _ = kernels("CPU")["matmul"]
  k = Scheduler(ast, Device["CPU"].renderer)
  with pytest.raises(KernelOptError, match=why): k.apply_opt(opt)
  assert k.ast is ast and k.applied == []  # nothing half-applied


def test_symbolic_axis_cannot_be_split():
  ast, _ = kernels("CPU")["symbolic"]
  k = Scheduler(ast, Device["CPU"].renderer)
  sym = [n for n, r in enumerate(k.reduce_axes) if r.src[0].op is not Ops.CONST]
  assert sym
  with pytest.raises(KernelOptError, match="symbolic"): k.apply_opt(Opt(OptOps.UNROLL, sym[0], 2))


def test_upcast_limit():
  ast, _ = _ast(Tensor(np.ones((64, 64), np.float32), device="CPU") @ Tensor(np.ones((64, 64), np.float32), device="CPU"))
  k = Scheduler(ast, Device["CPU"].renderer).apply_opts([Opt(OptOps.UPCAST, 0, 32), Opt(OptOps.UPCAST, 1, 32)])
  with pytest.raises(KernelOptError, match="lanes"): k.apply_opt(Opt(OptOps.UNROLL, 0, 2))


# ---- TILE (cache blocking) and PACK (operand panels in a scratch array)

def _layouts(dev: str) -> dict[str, tuple[UOp, dict[str, int]]]:
  """The three matmul layouts of a training step (reduce axis contiguous in A only, in both, in neither) and one with
  elementwise work fused into both operands (a ReLU backward)."""
  def T(*shape: int) -> Tensor: return Tensor(RNG.standard_normal(shape).astype(np.float32), device=dev)
  a, b, at, bt = T(24, 40), T(40, 32), T(40, 24), T(32, 40)
  return {"ab": _ast(a @ b), "abt": _ast(a @ bt.T), "atb": _ast(at.T @ b), "fused": _ast((at * (T(40, 24) > 0)).T @ (b + 1.0).relu())}


PACK_OPTS = [
  [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.TILE, 1, 2), Opt(OptOps.PACK, 1)],
  [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.TILE, 1, 2), Opt(OptOps.PACK, 1), Opt(OptOps.PACK, 0)],
  [Opt(OptOps.TILE, 1, 4), Opt(OptOps.PACK, 0), Opt(OptOps.UNROLL, 0, 2)],  # the packed loops may still be split
  [Opt(OptOps.TILE, 0, 3), Opt(OptOps.PACK, 1), Opt(OptOps.UPCAST, 0, 4)],
]


@pytest.mark.parametrize("dev", ["CPU", "PYTHON"])
@pytest.mark.parametrize("layout", ["ab", "abt", "atb", "fused"])
def test_tile_and_pack_match_the_unoptimized_kernel(dev, layout):
  ast, var_vals = _layouts(dev)[layout]
  renderer = Device[dev].renderer
  n = 0
  for opts in PACK_OPTS:
    if valid(ast, renderer, opts):
      check_same(ast, renderer, opts, var_vals)
      n += 1
  assert n >= 2, "the PACK sequences should apply to every layout"


@pytest.mark.parametrize("layout", ["ab", "abt", "atb", "fused"])
def test_heuristics_pack_every_matmul_layout(layout):
  # big enough that the copy pays off (PACK_MIN_REUSE rows), like a training step's matmuls
  def T(*shape: int) -> Tensor: return Tensor(RNG.standard_normal(shape).astype(np.float32), device="CPU")
  a, b, at, bt = T(64, 96), T(96, 128), T(96, 64), T(128, 96)
  t = {"ab": a @ b, "abt": a @ bt.T, "atb": at.T @ b, "fused": (at * (T(96, 64) > 0)).T @ (b + 1.0).relu()}[layout]
  ast, var_vals = _ast(t)
  renderer = Device["CPU"].renderer
  prg = get_program(ast, renderer)
  assert OptOps.PACK in {o.op for o in prg.applied_opts}, prg.applied_opts
  want = run(get_program(ast, renderer, opts=[]), var_vals)
  got = run(prg, var_vals)
  np.testing.assert_allclose(got[0], want[0], rtol=2e-5, atol=2e-5)
  assert "parallel loop" in prg.source  # the copy loops do not stop the threads from splitting the tile loop


@pytest.mark.parametrize("layout, k, vector", [("ab", 96, True), ("abt", 96, True), ("abt", 2048, False)])
def test_pack_copies_write_vectors_or_read_along_the_source_rows(layout: str, k: int, vector: bool) -> None:
  """A PACK copy keeps the panel's lanes innermost, and the expander writes them as whole vectors (B of x @ W: vector
  loads too; B of x @ W.T with K = 96: one element of each of 16 rows of W, which lie in different L1 sets). Where
  those rows all fall in one L1 set (K = 2048: 8 KiB apart) the copy's inner loop is instead one the source runs along
  contiguously: each row of W read a line at a time and scattered into the panel. The results match the unoptimized
  kernel's."""
  from plugrad.codegen import optimize
  from plugrad.codegen.expand import linear_coefficient
  from plugrad.codegen.opt.kernel import _PACK_ID
  from plugrad.codegen.passes import lower
  renderer = Device["CPU"].renderer
  if renderer.vector_width != 8: pytest.skip("the L1-set rule is stated for 8-lane vectors (16-lane panels)")
  def T(*shape: int) -> Tensor: return Tensor(RNG.standard_normal(shape).astype(np.float32), device="CPU")
  a, b, bt = T(64, k), T(k, 128), T(128, k)
  ast, var_vals = _ast(a @ b if layout == "ab" else a @ bt.T)
  def copies(u: UOp) -> list[UOp]:
    return [e for e in u.toposort if e.op is Ops.END and e.src[0].op is Ops.STORE and e.src[0].src[0].src[0].op is Ops.DEFINE_REG
            and e.src[0].src[0].src[0].arg >= _PACK_ID]
  opt = optimize(ast, renderer)
  assert copies(opt), "no PACK copy: the test lost its point"
  for c in copies(opt):
    loads = [u.src[0].src[1] for u in c.src[0].src[1].toposort if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX]
    if vector: assert linear_coefficient(c.src[0].src[0].src[1], c.src[-1]) == 1, f"{layout}: the copy's inner loop is not the panel's lanes"
    else: assert loads and all(linear_coefficient(ix, c.src[-1]) == 1 for ix in loads), f"{layout}: the copy's inner loop strides the source"
  stores = [u for u in lower(opt, renderer) if u.op is Ops.STORE and isinstance(p := u.src[0].dtype, PtrDType) and p.addrspace is AddrSpace.REG
            and u.src[0].src[0].op is Ops.DEFINE_REG and u.src[0].src[0].arg >= _PACK_ID]
  assert stores and all((u.src[1].dtype.count > 1) == vector for u in stores), [u.src[1].dtype for u in stores]
  prg = get_program(ast, renderer)
  np.testing.assert_allclose(run(prg, var_vals)[0], run(get_program(ast, renderer, opts=[]), var_vals)[0], rtol=2e-4, atol=2e-4)


def test_heuristics_pack_a_long_reduction_whose_tile_panel_exceeds_the_budget():
  # K=3072 and a 32-column register tile: one tile's B panel is 384 KB, above PACK_BUDGET; without the panel the tile
  # gathered B (nn.Linear's x @ W.T in a BERT FFN ran 7-10x slower)
  def T(*shape: int) -> Tensor: return Tensor(RNG.standard_normal(shape).astype(np.float32), device="CPU")
  ast, var_vals = _ast(T(32, 3072) @ T(64, 3072).T)
  renderer = Device["CPU"].renderer
  prg = get_program(ast, renderer)
  assert OptOps.PACK in {o.op for o in prg.applied_opts}, prg.applied_opts
  # 12544-term sums of products of N(0, 1) values in another order: rounding of ~1e-7 of the terms' total (~1e4)
  np.testing.assert_allclose(run(prg, var_vals)[0], run(get_program(ast, renderer, opts=[]), var_vals)[0], rtol=1e-4, atol=3e-3)


@pytest.mark.parametrize("fn", [lambda x: (x.exp() * 2 + 1), lambda x: x.softmax(-1)])
def test_heuristics_pad_an_axis_off_the_vector_width_to_vectorize_elementwise_and_row_kernels(fn):
  # 50257 columns (GPT-2's vocabulary, a prime times 29) are not a multiple of 16: without padding to a vector the
  # cross-entropy gradient's elementwise kernel ran scalar, at 5 GB/s (87 ms for 1024 rows)
  x = Tensor(RNG.standard_normal((4, 50257)).astype(np.float32), device="CPU")
  ast, var_vals = _ast(fn(x))
  renderer = Device["CPU"].renderer
  prg = get_program(ast, renderer)
  if (w := renderer.vector_width) < 2: pytest.skip("this CPU's renderer has no vector lanes")
  # the elementwise kernel's two loops are one (4 x 50257 contiguous: axis 0), the row kernel keeps its rows (axis 1)
  assert {(o.op, o.amount) for o in prg.applied_opts} >= {(OptOps.PADTO, w), (OptOps.UPCAST, w)}, prg.applied_opts
  np.testing.assert_allclose(run(prg, var_vals)[0], run(get_program(ast, renderer, opts=[]), var_vals)[0], rtol=1e-5, atol=1e-6)


def test_heuristics_pack_a_transposed_operand_per_row_tile_under_a_column_tile_loop():
  # A^T @ B (a weight gradient, dH^T @ x): A walks memory with a stride along the reduction. Under the column-tile loop
  # a copy of all of A would not fit, so the copy's scope reaches into the row loop: one row tile's panel, reused by the
  # column tiles within the tile (GPT's FFN weight gradient 3072x768, K=1024: 44 -> 26 ms)
  def T(*shape: int) -> Tensor: return Tensor(RNG.standard_normal(shape).astype(np.float32), device="CPU")
  ast, var_vals = _ast(T(1024, 512).T @ T(1024, 128))
  renderer = Device["CPU"].renderer
  prg = get_program(ast, renderer)
  assert [o.op for o in prg.applied_opts].count(OptOps.PACK) == 2 and OptOps.TILE in {o.op for o in prg.applied_opts}, prg.applied_opts
  # 12544-term sums of products of N(0, 1) values in another order: rounding of ~1e-7 of the terms' total (~1e4)
  np.testing.assert_allclose(run(prg, var_vals)[0], run(get_program(ast, renderer, opts=[]), var_vals)[0], rtol=1e-4, atol=3e-3)


@pytest.mark.parametrize("opts, why", [
  ([Opt(OptOps.PACK, 5)], "packable operand"),
  ([Opt(OptOps.PACK, 0, 2)], "no amount"),
  ([Opt(OptOps.TILE, 0, 0)], "whole axis"),
  ([Opt(OptOps.TILE, 0, 5)], "does not divide"),
  ([Opt(OptOps.THREAD, 0, 2), Opt(OptOps.TILE, 1, 2)], "before THREAD"),
  ([Opt(OptOps.TILE, 1, 2), Opt(OptOps.PACK, 1), Opt(OptOps.UPCAST, 0, 2)], "split it before PACK"),
])
def test_invalid_tile_and_pack_raise_with_the_reason(opts, why):
  _assert_refused(_layouts("CPU")["ab"][0], opts, why)


def _assert_refused(ast, opts, why):
  """The last of `opts` raises KernelOptError naming `why` and leaves the kernel as the others made it."""
  k = Scheduler(ast, Device["CPU"].renderer)
  k.apply_opts(opts[:-1])
  before = k.ast
  with pytest.raises(KernelOptError, match=why): k.apply_opt(opts[-1])
  assert k.ast is before


def test_pack_refuses_a_copy_over_the_size_limit():
  from plugrad.codegen.opt.kernel import MAX_PACK_BYTES
  n = 512
  ast, _ = _ast(Tensor.empty(n, n, device="CPU") @ Tensor.empty(n, n, device="CPU"))
  assert n * n * 4 > MAX_PACK_BYTES
  with pytest.raises(KernelOptError, match="TILE the loops first"): Scheduler(ast, Device["CPU"].renderer).apply_opt(Opt(OptOps.PACK, 1))


# ---- tensor cores, lowered for each emulated device and run by the interpreter

@pytest.mark.parametrize("target", ["CUDA", "METAL", "AMD"])
def test_tensor_cores_emulated(target):
  renderer = PythonRenderer("PYTHON", emulate=target)
  for tc in renderer.tensor_cores:
    m, n, kk = 2 * tc.m, tc.n, 2 * tc.k
    ast = matmul_ast(m, n, kk, tc.dtype_in, tc.dtype_out)
    sel = [t for t in renderer.tensor_cores if t.dtype_in is tc.dtype_in and t.dtype_out is tc.dtype_out].index(tc)
    prg = get_program(ast, renderer, opts=[Opt(OptOps.TC, sel)])
    assert any(u.op is Ops.WMMA for u in prg.uops)
    rng = np.random.default_rng(3)
    npin = np.float32 if tc.dtype_in in (dtypes.float32, dtypes.bfloat16) else np.float16
    A = rng.uniform(-1, 1, (m, kk)).astype(npin)
    B = rng.uniform(-1, 1, (kk, n)).astype(npin)
    if tc.dtype_in is dtypes.bfloat16:
      from plugrad.testing.kernels import bf16_round
      A, B = bf16_round(A), bf16_round(B)
    bufs = [Buffer("PYTHON", m * n, tc.dtype_out), Buffer("PYTHON", m * kk, tc.dtype_in), Buffer("PYTHON", kk * n, tc.dtype_in)]
    bufs[1].copyin(memoryview(A if tc.dtype_in is not dtypes.bfloat16 else (A.view(np.uint32) >> 16).astype(np.uint16)).cast("B"))
    bufs[2].copyin(memoryview(B if tc.dtype_in is not dtypes.bfloat16 else (B.view(np.uint32) >> 16).astype(np.uint16)).cast("B"))
    ProgramRunner(prg)(bufs)
    got = bufs[0].numpy().reshape(m, n).astype(np.float64)
    np.testing.assert_allclose(got, A.astype(np.float64) @ B.astype(np.float64), rtol=2e-2, atol=2e-2, err_msg=f"{target} {tc.name}")


def test_workgroup_heuristics_shape_gpu_kernels():
  # on a device with workgroups (the PYTHON device describes one): a matmul gets a 4x4 register tile per thread and a
  # workgroup over its output axes; a long reduction into one output is split across a workgroup (GROUPTOP)
  renderer = Device["PYTHON"].renderer
  ks = kernels("PYTHON")
  mm = get_program(ks["matmul"][0], renderer)
  ops = [o.op for o in mm.applied_opts]
  assert ops.count(OptOps.UPCAST) == 2 and OptOps.UNROLL in ops and OptOps.LOCAL in ops, mm.applied_opts
  assert any(u.op is Ops.SPECIAL and u.arg.startswith("lidx") for u in mm.uops)
  total = get_program(ks["sum"][0], renderer)
  assert total.applied_opts[0].op is OptOps.GROUPTOP and total.estimates.local_bytes > 0, total.applied_opts
  for name in ("matmul", "sum"):
    ast, var_vals = ks[name]
    want, got = run(get_program(ast, renderer, opts=[]), var_vals), run(get_program(ast, renderer), var_vals)
    np.testing.assert_allclose(got[0], want[0], rtol=2e-5, atol=2e-5, err_msg=name)


@pytest.mark.parametrize("target", ["CUDA", "METAL", "AMD"])
def test_workgroup_heuristics_use_tensor_cores(target):
  renderer = PythonRenderer("PYTHON", emulate=target)
  tc = renderer.tensor_cores[0]
  prg = get_program(matmul_ast(2 * tc.m, 2 * tc.n, 2 * tc.k, tc.dtype_in, tc.dtype_out), renderer)
  assert prg.applied_opts[0].op is OptOps.TC and any(u.op is Ops.WMMA for u in prg.uops)
  # the estimate counts the instruction's multiply-adds once, not once per thread of the warp
  assert prg.estimates.ops >= 2 * (2 * tc.m) * (2 * tc.n) * (2 * tc.k) and prg.estimates.ops < 4 * (2 * tc.m) * (2 * tc.n) * (2 * tc.k)


def test_tc_refuses_what_it_cannot_do():
  renderer = PythonRenderer("PYTHON", emulate="CUDA")
  with pytest.raises(KernelOptError, match="not a multiple"):
    Scheduler(matmul_ast(20, 8, 16, dtypes.float16, F32), renderer).apply_opt(Opt(OptOps.TC, 0))
  with pytest.raises(KernelOptError, match="no tensor core"):
    Scheduler(matmul_ast(16, 8, 16, F32, F32), renderer).apply_opt(Opt(OptOps.TC, 0))
  with pytest.raises(KernelOptError, match="first action"):
    Scheduler(matmul_ast(16, 8, 16, dtypes.float16, F32), renderer).apply_opts([Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.TC, 0)])


# ---- BEAM search (small: every candidate compiles with the real C compiler)

def test_beam_picks_a_correct_candidate_and_caches_it(tmp_path, monkeypatch):
  from plugrad.codegen.opt import search
  from plugrad.helpers import Context
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(tmp_path))
  monkeypatch.setenv("BEAM_STEPS", "1")
  ast, var_vals = _ast(Tensor(RNG.standard_normal((16, 32)).astype(np.float32), device="CPU").sum(1))
  renderer = Device["CPU"].renderer
  before = dict(search.stats)
  from plugrad.device.search import DeviceTimer
  with Context(BEAM=2): prg = get_program(ast, renderer, timer=DeviceTimer)
  assert search.stats["searches"] == before["searches"] + 1 and search.stats["candidates"] > before["candidates"]
  assert all(isinstance(o, Opt) for o in prg.applied_opts)
  Scheduler(ast, renderer).apply_opts(prg.applied_opts)  # a valid sequence
  want = run(get_program(ast, renderer, opts=[]), var_vals)
  got = run(prg, var_vals)
  np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
  assert list((tmp_path / "beam").glob("*.json"))
  # the second time: straight from the disk cache, no search
  k = search.beam_search(Scheduler(ast, renderer), 2)
  assert search.stats["cache_hits"] == before["cache_hits"] + 1 and search.stats["searches"] == before["searches"] + 1
  assert k.applied == list(prg.applied_opts)


def test_beam_without_a_timer_is_a_clear_error(tmp_path, monkeypatch):
  from plugrad.codegen.opt import search
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(tmp_path))
  ast, _ = kernels("CPU")["sum"]
  with pytest.raises(search.BeamError, match="needs a timer"): search.beam_search(Scheduler(ast, Device["CPU"].renderer), 2)


# ---- convolutions: the channel tile (vector lanes along the output channels, the weights PACKed into a panel)

def _conv_kernels(dev: str) -> dict[str, tuple[UOp, dict[str, int]]]:
  """The kernels of padded 3x3 convolutions that reduce a product, with a ReLU after each so the backward operands carry
  fused elementwise work: a stride-1 conv's forward, its input gradient (a transposed conv of the output gradient) and
  its weight gradient (summing over batch and pixels); and a stride-2 conv's input gradient, whose unfolded windows
  (W^T.dY, summing over the output channels) are folded afterwards."""
  def T(*shape: int, grad: bool = False) -> Tensor:
    return Tensor(RNG.standard_normal(shape).astype(np.float32), device=dev, requires_grad=grad)
  x, w, g = T(2, 16, 6, 6, grad=True), T(16, 16, 3, 3, grad=True), T(2, 16, 6, 6)
  x2, w2 = T(2, 16, 12, 12, grad=True), T(16, 16, 3, 3)
  y, y2 = x.conv2d(w, padding=1), x2.conv2d(w2, stride=2, padding=1)
  ((y.relu() + y2.relu()) * g).sum().backward()
  assert x.grad is not None and w.grad is not None and x2.grad is not None
  out: dict[str, tuple[UOp, dict[str, int]]] = {}
  for name, roots in (("stride 1", (y.uop, x.grad.uop, w.grad.uop)), ("stride 2", (x2.grad.uop,))):
    items, _ = create_schedule(*roots)
    for it in items:
      if it.kind != "kernel": continue
      k = Scheduler(it.ast, Device[dev].renderer)
      if len(k.packable_values()) != 2: continue  # (the fold of the windows' gradient reduces no product)
      shape = [r.src[0].arg for r in k.output_axes]
      if name == "stride 2": out["input_grad"] = (it.ast, it.var_vals)
      # the forward conv is scheduled before the input gradient's, which has the same output shape
      else: out["weight_grad" if shape == [16, 16, 3, 3] else "transposed_input_grad" if "forward" in out else "forward"] = (it.ast, it.var_vals)
  assert set(out) == {"forward", "transposed_input_grad", "input_grad", "weight_grad"}, list(out)
  return out


CONV_OPTS = {  # the channel tile's actions: lanes along the channel axis, rows along the pixels, the window width unrolled, PACK
  "forward": [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 3, 6), Opt(OptOps.UNROLL, 2, 3), Opt(OptOps.PACK, 1)],
  "transposed_input_grad": [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 3, 6), Opt(OptOps.UNROLL, 2, 3), Opt(OptOps.PACK, 1)],
  # the window gradient (b, c*k, pixels): window offsets outermost, so channels and offsets merge into one lane axis
  "input_grad": [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 2, 6), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.PACK, 0)],
  "weight_grad": [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 3, 3), Opt(OptOps.UPCAST, 2, 3), Opt(OptOps.UNROLL, 2, 3), Opt(OptOps.PACK, 0)],
}


@pytest.mark.parametrize("dev", ["CPU", "PYTHON"])
@pytest.mark.parametrize("name", ["forward", "transposed_input_grad", "input_grad", "weight_grad"])
def test_conv_channel_tile_matches_the_unoptimized_kernel(dev, name):
  ast, var_vals = _conv_kernels(dev)[name]
  renderer = Device[dev].renderer
  opts = CONV_OPTS[name]
  # the packed operand is the one the channel lanes read: find its number after the splits
  k = Scheduler(ast, renderer).apply_opts(opts[:-1])
  lane = k.ranges_of(AxisType.UPCAST)[0]
  pk = next(n for n, v in enumerate(k.packable_values()) if lane in v.toposort)
  opts = opts[:-1] + [Opt(OptOps.PACK, pk)]
  check_same(ast, renderer, opts, var_vals)
  # and with the channel loop TILEd first (a panel too big for one copy is packed per tile)
  tiled = [Opt(OptOps.UPCAST, opts[0].axis, 2), Opt(OptOps.TILE, opts[0].axis, 2)]
  k = Scheduler(ast, renderer).apply_opts(tiled)
  lane = k.ranges_of(AxisType.UPCAST)[0]
  check_same(ast, renderer, tiled + [Opt(OptOps.PACK, next(n for n, v in enumerate(k.packable_values()) if lane in v.toposort))], var_vals)


@pytest.mark.parametrize("name", ["forward", "transposed_input_grad", "input_grad", "weight_grad"])
def test_heuristics_channel_tile_convolutions(name):
  ast, var_vals = _conv_kernels("CPU")[name]
  renderer = Device["CPU"].renderer
  prg = get_program(ast, renderer)
  applied = list(prg.applied_opts)
  w = renderer.vector_width
  if name == "input_grad" and w > 1 and -36 % w <= 36 // 4:
    # the unfolded windows W^T.dY: 36 pixels, contiguous and ungated in dY, padded to whole vectors carry the lanes
    # (_one_vector_pad); W^T gives the rows, packed
    assert applied[:2] == [Opt(OptOps.PADTO, 2, w), Opt(OptOps.UPCAST, 2, w)] and OptOps.PACK in {o.op for o in applied}, applied
  elif w > 1:  # the lanes go along a channel axis (one vector), its operand packed into one panel
    assert applied[0] == Opt(OptOps.UPCAST, applied[0].axis, w) and OptOps.PACK in {o.op for o in applied}, applied
  want = run(get_program(ast, renderer, opts=[]), var_vals)
  got = run(prg, var_vals)
  for slot in prg.outs: np.testing.assert_allclose(got[slot], want[slot], rtol=2e-5, atol=2e-5, err_msg=f"{name} {applied}")
  # the same decisions on the interpreter (whose own defaults are the workgroup split) give the same numbers
  past, pvals = _conv_kernels("PYTHON")[name]
  check_same(past, Device["PYTHON"].renderer, applied, pvals)


def test_channel_tile_vectorizes_along_scattered_stores():
  # the output channels are 36 floats apart in the output: the lanes still make vector FMAs on the packed panel
  ast, _ = _conv_kernels("CPU")["forward"]
  renderer = Device["CPU"].renderer
  w = renderer.vector_width
  if w <= 1: pytest.skip("the CPU renderer has no vector lanes on this machine")
  prg = get_program(ast, renderer)
  assert vector_fma(prg.source, w)


@pytest.mark.parametrize("opts, why", [
  ([Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.PACK, 7)], "packable operand"),
  ([Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.PACK, 1, 4)], "no amount"),
  ([Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.TILE, 1, 4)], "whole axis"),
  ([Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.TILE, 1, 2), Opt(OptOps.PACK, 1), Opt(OptOps.UPCAST, 0, 2)], "split it before PACK"),
  ([Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 3, 7)], "does not divide"),
])
def test_invalid_conv_tile_actions_raise_with_the_reason(opts, why):
  _assert_refused(_conv_kernels("CPU")["forward"][0], opts, why)


def _window_sum_kernel(dev: str) -> tuple[UOp, dict[str, int]]:
  """A col2im kernel as the op-by-op derivative of the window view gives it: a sum of the unfolded windows' gradient
  (no product) over the view's repeated rows, its loads gated by which window positions fall inside the padding. The
  derivative walk folds a conv's windows directly now (uop/windows.py); any other chain of movement ops that reads
  elements repeatedly still sums through this form."""
  from plugrad.gradient import RULES
  def T(*shape: int) -> Tensor: return Tensor(RNG.standard_normal(shape).astype(np.float32), device=dev)
  x = T(2, 4, 6, 6).pad(((0, 0), (0, 0), (1, 1), (1, 1)))
  view = x.conv2d(T(8, 4, 3, 3)).uop.src[0].src[0].src[0]  # conv's windows, below its reshape and the product
  while view.op is not Ops.PERMUTE: view = view.src[0]
  g = T(*view.shape).uop
  u = view
  while u is not x.uop: g, u = RULES[u.op](u, g)[0], u.src[0]
  items, _ = create_schedule(g)
  for it in items:
    if it.kind != "kernel": continue
    if any(u.op is Ops.REDUCE for u in it.ast.toposort) and any(len(u.src) > 2 for u in it.ast.toposort if u.op is Ops.INDEX):
      return it.ast, it.var_vals
  raise AssertionError("no gated window-sum kernel in the generic derivative's schedule")


def test_heuristics_copy_out_a_gated_axis_of_a_window_sum():
  ast, var_vals = _window_sum_kernel("CPU")
  renderer = Device["CPU"].renderer
  prg = get_program(ast, renderer)
  applied = list(prg.applied_opts)
  k = Scheduler(ast, renderer)
  sizes = [r.src[0].arg for r in k.output_axes]
  # the innermost small output axis the gates test is UPCAST whole
  assert any(o.op is OptOps.UPCAST and o.amount == 0 and 2 <= sizes[o.axis] <= 8 for o in applied), applied
  want = run(get_program(ast, renderer, opts=[]), var_vals)
  got = run(prg, var_vals)
  for slot in prg.outs: np.testing.assert_allclose(got[slot], want[slot], rtol=2e-5, atol=2e-5, err_msg=f"{applied}")
  past, pvals = _window_sum_kernel("PYTHON")
  check_same(past, Device["PYTHON"].renderer, applied, pvals)


def test_gated_index_simplification_keeps_the_values_where_the_gate_holds():
  from plugrad.codegen.lower import simplify_gated_index
  from plugrad.uop.rewrite import graph_rewrite
  from plugrad.uop.symbolic import symbolic
  r1, r2, r4 = UOp.range(16, 1, AxisType.LOOP), UOp.range(6, 2, AxisType.LOOP), UOp.range(4, 4, AxisType.REDUCE)
  x = r2 + r4 * 6
  idx = (x // 21) * 1000 + (r1 * 21 + r2 + r4 * 6) // 336 * 2304 + (x % 7) * 36 + ((x % 7) * 4 + r1 * 16) // 256
  gate = (x < 21) & ((x % 7) < 4)
  simp = simplify_gated_index(idx, gate, lambda u: graph_rewrite(u, symbolic))
  def divs(u: UOp) -> int: return sum(1 for n in u.toposort if n.op in (Ops.IDIV, Ops.MOD))
  assert divs(simp) < divs(idx), simp.render(simplify=False)
  checked = 0
  for a, b, c in itertools.product(range(16), range(6), range(4)):
    env = {r1: UOp.const(dtypes.index, a), r2: UOp.const(dtypes.index, b), r4: UOp.const(dtypes.index, c)}
    if not gate.substitute(env).simplify().arg: continue
    assert simp.substitute(env).simplify().arg == idx.substitute(env).simplify().arg, (a, b, c)
    checked += 1
  assert checked > 0


def _batchnorm_var_kernel(dev: str) -> tuple[UOp, dict[str, int]]:
  """BatchNorm's variance: sum over N, H, W of (x - mean[c])^2. The mean is read once per channel (contiguous along the
  channels, but not along the reduction)."""
  x = Tensor(RNG.standard_normal((16, 16, 8, 8)).astype(np.float32), device=dev)
  m = x.mean((0, 2, 3), keepdim=True).realize()
  return _ast(((x - m) * (x - m)).sum((0, 2, 3)))


def test_heuristics_do_not_gather_channels_for_a_broadcast_operand():
  ast, var_vals = _batchnorm_var_kernel("CPU")
  renderer = Device["CPU"].renderer
  prg = get_program(ast, renderer)
  applied = list(prg.applied_opts)
  # no vector lanes along the channels (they would gather x); the lanes go along the contiguous pixels (N*H*W merged
  # where memory runs on: 16 x 64), and a few channels at once are copies, independent accumulator chains
  assert not any(o.op is OptOps.UPCAST and o.amount >= max(2, renderer.vector_width) for o in applied), applied
  assert any(o.op is OptOps.UNROLL for o in applied) or renderer.vector_width <= 1, applied
  want = run(get_program(ast, renderer, opts=[]), var_vals)
  got = run(prg, var_vals)
  for slot in prg.outs: np.testing.assert_allclose(got[slot], want[slot], rtol=2e-5, atol=2e-5, err_msg=f"{applied}")
  past, pvals = _batchnorm_var_kernel("PYTHON")
  if applied: check_same(past, Device["PYTHON"].renderer, applied, pvals)


def _linear_relu_kernel(dev: str) -> tuple[UOp, dict[str, int]]:
  """A hidden Linear layer's matmul as a training step schedules it: the previous layer's pre-activation h and bias b
  fused into A = relu(h + b), times the weight transposed (A.B^T)."""
  def T(*shape: int) -> Tensor: return Tensor(RNG.standard_normal(shape).astype(np.float32), device=dev)
  h, b, w = T(64, 96), T(96), T(128, 96)
  with Context(RECOMPUTE_MAX=0): return _ast((h + b).relu() @ w.T)  # the scheduler would end relu(h + b) in its own kernel


def test_heuristics_pack_the_whole_fused_operand():
  ast, var_vals = _linear_relu_kernel("CPU")
  renderer = Device["CPU"].renderer
  k = hand_coded_optimizations(Scheduler(ast, renderer))
  copied = [pk.src[0].src[1] for pk in k._packs()]
  # A's copy computes relu(h + b) once per element; the bias alone (a part of A, contiguous along the unrolled reduction)
  # is no operand of its own: packing just it left the add and the max recomputed once per tile column (2x slower)
  assert len(copied) == 2, k.applied
  assert any({Ops.ADD, Ops.MAX} <= {u.op for u in v.toposort} or {Ops.ADD, Ops.WHERE} <= {u.op for u in v.toposort} for v in copied), k.applied
  applied = list(k.applied)
  want = run(get_program(ast, renderer, opts=[]), var_vals)
  got = run(get_program(ast, renderer, opts=applied), var_vals)
  np.testing.assert_allclose(got[0], want[0], rtol=2e-5, atol=2e-5)
  past, pvals = _linear_relu_kernel("PYTHON")
  check_same(past, Device["PYTHON"].renderer, applied, pvals)


def _conv_input_grad_fused_kernel(dev: str) -> tuple[UOp, dict[str, int]]:
  """A strided convolution's input gradient whose output gradient carries fused elementwise work with a sqrt and a
  division per element (like BatchNorm's backward): the kernel reduces over the output channels, once per window
  position (a stride-1 conv's is a transposed conv instead)."""
  def T(*shape: int, grad: bool = False) -> Tensor:
    return Tensor(RNG.standard_normal(shape).astype(np.float32), device=dev, requires_grad=grad)
  x, w, g, v = T(2, 16, 12, 12, grad=True), T(16, 16, 3, 3), T(2, 16, 6, 6), T(1, 16, 1, 1)
  y = x.conv2d(w, stride=2, padding=1)
  # no ReLU: its mask would depend on the forward conv, and the scheduler would then end the work in that kernel
  (y * g / (v * v + 1).sqrt()).sum().backward()
  assert x.grad is not None
  with Context(RECOMPUTE_MAX=0): items, _ = create_schedule(x.grad.uop)  # else the scheduler ends the fused work in its own kernel
  # the windows' gradient, window offsets outermost (uop/windows.py): (batch, channels x 3 x 3 offsets, height x width),
  # the scheduler's contiguous loops merged
  for it in items:
    sizes = [r.src[0].arg for r in Scheduler(it.ast, Device[dev].renderer).output_axes] if it.kind == "kernel" else []
    if sizes == [2, 144, 36]: return it.ast, it.var_vals
  raise AssertionError("no input gradient kernel reducing a product")


def test_heuristics_pack_the_fused_operand_of_a_channel_tile():
  ast, var_vals = _conv_input_grad_fused_kernel("CPU")
  renderer = Device["CPU"].renderer
  k = hand_coded_optimizations(Scheduler(ast, renderer))
  copied = [pk.src[0].src[1] for pk in k._packs()]
  if renderer.vector_width > 1:
    # the weights' panel and the output gradient's fused work (its sqrt computed once per element, not once per window
    # position)
    assert len(copied) == 2 and any(Ops.SQRT in {u.op for u in v.toposort} for v in copied), k.applied
  applied = list(k.applied)
  want = run(get_program(ast, renderer, opts=[]), var_vals)
  got = run(get_program(ast, renderer, opts=applied), var_vals)
  np.testing.assert_allclose(got[0], want[0], rtol=2e-5, atol=2e-5, err_msg=f"{applied}")
  past, pvals = _conv_input_grad_fused_kernel("PYTHON")
  check_same(past, Device["PYTHON"].renderer, applied, pvals)


def test_max_of_nan_and_signed_zeros_on_cpu():
  # the CPU's max helper is branch-free (two selects); numpy's semantics hold: nan wins from either side, equal values
  # give the second operand
  a = np.array([np.nan, 1.0, -0.0, 2.0, np.nan, 0.0], dtype=np.float32)
  b = np.array([1.0, np.nan, 0.0, -3.0, np.nan, -0.0], dtype=np.float32)
  got = Tensor(a, device="CPU").maximum(Tensor(b, device="CPU")).numpy()
  np.testing.assert_array_equal(np.isnan(got), np.isnan(np.maximum(a, b)))
  np.testing.assert_array_equal(got[~np.isnan(got)], np.maximum(a, b)[~np.isnan(got)])


@pytest.mark.parametrize("dev", ["CPU", "PYTHON"])
def test_heuristics_pad_an_odd_vector_count_to_the_full_tile(dev):
  # a weight gradient A^T.B whose vector axis is an odd number of vectors (784 = 49 x 16 on AVX-512): PADTO two vectors
  # keeps the two-vector register tile; the padded columns are never stored
  w = max(1, Device["CPU"].renderer.vector_width)
  def T(*shape: int) -> Tensor: return Tensor(RNG.standard_normal(shape).astype(np.float32), device=dev)
  ast, var_vals = _ast(T(32, 64).T @ T(32, 49 * w))
  applied = list(get_program(ast, Device["CPU"].renderer).applied_opts)
  if w > 1: assert applied[:2] == [Opt(OptOps.PADTO, 1, 2 * w), Opt(OptOps.UPCAST, 1, 2 * w)], applied
  check_same(ast, Device[dev].renderer, applied, var_vals)


def test_heuristics_pad_an_lm_head_to_the_register_tile():
  # a tied LM head over a vocabulary with no small divisors (50257 = 29 x 1733; here 1073 = 29 x 37): the logits x.W^T
  # PADTO the vocabulary to two vectors, the weight gradient g^T.x PADTOs it to the tile's rows, the input gradient g.W
  # PADTOs it (the reduction) to the unroll; without them the tile had one row (or one vector) and a scalar reduce loop
  w = max(1, Device["CPU"].renderer.vector_width)
  if w == 1: pytest.skip("no vector lanes")
  rows = 8 if w >= 16 else 4
  def T(*shape: int) -> Tensor: return Tensor(RNG.standard_normal(shape).astype(np.float32), device="CPU")
  x, W, g = T(64, 96), T(1073, 96), T(64, 1073)
  for t, want in ((x @ W.T, Opt(OptOps.UPCAST, 1, 2 * w)), (g.T @ x, Opt(OptOps.UPCAST, 0, rows)), (g @ W, Opt(OptOps.UNROLL, 0, 4))):
    ast, var_vals = _ast(t)
    applied = list(get_program(ast, Device["CPU"].renderer).applied_opts)
    assert want in applied and any(o.op is OptOps.PADTO for o in applied), applied
    check_same(ast, Device["CPU"].renderer, applied, var_vals)


def test_heuristics_channel_tile_a_convolution_whose_panel_exceeds_the_budget(monkeypatch):
  # ResNet's 512-channel 3x3 convs: one register tile's weight panel (16 channels x 512 x 3x3: 288 KiB) is over
  # PACK_BUDGET, no channel tile was left, and the kernel got no actions (scalar loops, 0.5-1 GFLOPS). Scaled down here:
  # the budget is set so that one tile's panel lies between it and twice it.
  from plugrad.codegen.opt import heuristic
  renderer = Device["CPU"].renderer
  if (w := renderer.vector_width) <= 1: pytest.skip("the CPU renderer has no vector lanes on this machine")
  monkeypatch.setattr(heuristic, "PACK_BUDGET", 600 * w)  # one tile's panel: w x 24 x 3 x 3 x 4 bytes = 864 w
  x, wt = RNG.standard_normal((1, 24, 5, 5)).astype(np.float32), RNG.standard_normal((2 * w, 24, 3, 3)).astype(np.float32)
  ast, var_vals = _ast(Tensor(x, device="CPU").conv2d(Tensor(wt, device="CPU"), padding=1))
  prg = get_program(ast, renderer)
  applied = list(prg.applied_opts)
  assert Opt(OptOps.UPCAST, 0, w) in applied and Opt(OptOps.TILE, 0, 1) in applied and OptOps.PACK in {o.op for o in applied}, applied
  np.testing.assert_allclose(run(prg, var_vals)[0], run(get_program(ast, renderer, opts=[]), var_vals)[0], rtol=2e-5, atol=2e-5)
  past, pvals = _ast(Tensor(x, device="PYTHON").conv2d(Tensor(wt, device="PYTHON"), padding=1))
  check_same(past, Device["PYTHON"].renderer, applied, pvals)


@pytest.mark.parametrize("rows", [1, 8, 64])
def test_heuristics_take_dot_products_for_few_rows_of_a_transposed_matmul(rows):
  # x @ W.T (nn.Linear) with few rows: transposing all of W into a panel cost more than the rows' dot products (a
  # classifier head 8x512 @ (1000x512)^T: 0.57 -> 0.21 ms on one thread); from TRANSPOSE_MIN_REUSE rows on the tile wins
  from plugrad.codegen.opt.heuristic import TRANSPOSE_MIN_REUSE
  renderer = Device["CPU"].renderer
  if (w := renderer.vector_width) <= 1: pytest.skip("the CPU renderer has no vector lanes on this machine")
  x, wt = RNG.standard_normal((rows, 96)).astype(np.float32), RNG.standard_normal((80, 96)).astype(np.float32)
  ast, var_vals = _ast(Tensor(x, device="CPU") @ Tensor(wt, device="CPU").T)
  prg = get_program(ast, renderer)
  ops = {o.op for o in prg.applied_opts}
  if rows < TRANSPOSE_MIN_REUSE:  # vector accumulators along the reduction: both operands read in vectors
    assert OptOps.PACK not in ops and any(o.op is OptOps.UNROLL and o.amount % w == 0 for o in prg.applied_opts), prg.applied_opts
    assert vector_fma(prg.source, w)
  else: assert OptOps.PACK in ops, prg.applied_opts
  np.testing.assert_allclose(run(prg, var_vals)[0], run(get_program(ast, renderer, opts=[]), var_vals)[0], rtol=2e-5, atol=2e-5)
  past, pvals = _ast(Tensor(x, device="PYTHON") @ Tensor(wt, device="PYTHON").T)
  check_same(past, Device["PYTHON"].renderer, list(prg.applied_opts), pvals)


def test_heuristics_put_the_outputs_of_a_short_row_reduction_into_lanes():
  # global average pooling (7x7 pixels per channel): one chain of dependent adds per output; the channels go into
  # vector lanes, one independent accumulator each (8x512x7x7: 82 -> 35 us of kernel on one thread)
  renderer = Device["CPU"].renderer
  if (w := renderer.vector_width) <= 1: pytest.skip("the CPU renderer has no vector lanes on this machine")
  x = RNG.standard_normal((2, 4 * w, 7, 7)).astype(np.float32)
  ast, var_vals = _ast(Tensor(x, device="CPU").mean((2, 3)))
  prg = get_program(ast, renderer)
  # the (2, 4w) outputs are one loop of 8w and the 7x7 pixels one reduce loop of 49 (merged by the scheduler), unrolled
  # by 7: no vector accumulators over a run that is no multiple of a vector
  assert list(prg.applied_opts)[:2] == [Opt(OptOps.UPCAST, 0, w), Opt(OptOps.UNROLL, 0, 7)], prg.applied_opts
  np.testing.assert_allclose(run(prg, var_vals)[0], run(get_program(ast, renderer, opts=[]), var_vals)[0], rtol=2e-5, atol=2e-5)
  past, pvals = _ast(Tensor(x, device="PYTHON").mean((2, 3)))
  check_same(past, Device["PYTHON"].renderer, list(prg.applied_opts), pvals)


def test_heuristics_pad_a_channel_count_off_the_vector_width_for_the_channel_tile():
  # MobileNetV2's 1x1 projections to 24 channels: no output axis a multiple of the vector width, so no channel tile
  # and no actions (4.6 ms for 1x96x56x56 -> 24); one axis is now PADTO'd to a vector (0.34 ms, one thread)
  renderer = Device["CPU"].renderer
  if (w := renderer.vector_width) <= 1: pytest.skip("the CPU renderer has no vector lanes on this machine")
  x, wt = RNG.standard_normal((1, 16, 6, 6)).astype(np.float32), RNG.standard_normal((w + w // 2, 16, 1, 1)).astype(np.float32)
  ast, var_vals = _ast(Tensor(x, device="CPU").conv2d(Tensor(wt, device="CPU")))
  prg = get_program(ast, renderer)
  ops = [o.op for o in prg.applied_opts]
  assert ops[:2] == [OptOps.PADTO, OptOps.UPCAST] and OptOps.PACK in ops, prg.applied_opts
  np.testing.assert_allclose(run(prg, var_vals)[0], run(get_program(ast, renderer, opts=[]), var_vals)[0], rtol=2e-5, atol=2e-5)
  past, pvals = _ast(Tensor(x, device="PYTHON").conv2d(Tensor(wt, device="PYTHON")))
  check_same(past, Device["PYTHON"].renderer, list(prg.applied_opts), pvals)


def test_heuristics_put_the_channel_tile_lanes_where_the_packed_operand_is_reused_most():
  # a stride-2 stem conv whose output width is a multiple of the vector width: lanes along the width packed the input
  # for Cout rows of reuse (8x3x224x224 -> 32: 11 ms); along the channels the weights are packed and every pixel
  # reuses them (3.4 ms, one thread)
  renderer = Device["CPU"].renderer
  if (w := renderer.vector_width) <= 1: pytest.skip("the CPU renderer has no vector lanes on this machine")
  x, wt = RNG.standard_normal((1, 3, 2 * w, 2 * w)).astype(np.float32), RNG.standard_normal((w, 3, 3, 3)).astype(np.float32)
  ast, var_vals = _ast(Tensor(x, device="CPU").conv2d(Tensor(wt, device="CPU"), stride=2, padding=1))
  prg = get_program(ast, renderer)
  assert list(prg.applied_opts)[0] == Opt(OptOps.UPCAST, 0, w) and OptOps.PACK in {o.op for o in prg.applied_opts}, prg.applied_opts
  np.testing.assert_allclose(run(prg, var_vals)[0], run(get_program(ast, renderer, opts=[]), var_vals)[0], rtol=2e-5, atol=2e-5)
  past, pvals = _ast(Tensor(x, device="PYTHON").conv2d(Tensor(wt, device="PYTHON"), stride=2, padding=1))
  check_same(past, Device["PYTHON"].renderer, list(prg.applied_opts), pvals)


def test_heuristics_pad_a_prime_pixel_axis_for_the_channel_tile_rows():
  # 17x17 pixels have no divisor for the tile's rows: padded instead of none (4x384x17x17 1x1 -> 192:
  # 4.7 -> 2.6 ms, one thread)
  renderer = Device["CPU"].renderer
  if (w := renderer.vector_width) <= 1: pytest.skip("the CPU renderer has no vector lanes on this machine")
  x, wt = RNG.standard_normal((1, 8, 17, 17)).astype(np.float32), RNG.standard_normal((w, 8, 1, 1)).astype(np.float32)
  ast, var_vals = _ast(Tensor(x, device="CPU").conv2d(Tensor(wt, device="CPU")))
  prg = get_program(ast, renderer)
  applied = list(prg.applied_opts)
  # the 17x17 pixels are one loop of 289 (merged by the scheduler), padded to a multiple of the tile's rows
  pad = next((o for o in applied if o.op is OptOps.PADTO and o.axis == 1), None)
  assert pad is not None and Opt(OptOps.UPCAST, 1, pad.amount) in applied and -289 % pad.amount <= 289 // 16, applied
  np.testing.assert_allclose(run(prg, var_vals)[0], run(get_program(ast, renderer, opts=[]), var_vals)[0], rtol=2e-5, atol=2e-5)
  past, pvals = _ast(Tensor(x, device="PYTHON").conv2d(Tensor(wt, device="PYTHON")))
  check_same(past, Device["PYTHON"].renderer, applied, pvals)


def _sibling_convs(dev: str) -> tuple[UOp, dict[str, int]]:
  """A ResNet bottleneck's conv3 and downsample, both 1x1 over as many channels (the first block of ResNet-50: 64 -> 256
  each), summed: one kernel with two sibling reductions over equal loops."""
  def T(*shape: int) -> Tensor: return Tensor(RNG.standard_normal(shape).astype(np.float32), device=dev)
  x, y, w1, w2 = T(1, 16, 8, 8), T(1, 16, 8, 8), T(64, 16, 1, 1), T(64, 16, 1, 1)
  return _ast((x.conv2d(w1) + y.conv2d(w2)).relu())


def test_heuristics_tile_sibling_reductions():
  # untiled, the fused conv3 + downsample of ResNet-50's first block ran scalar: 82 ms of a 93 ms forward at batch 1
  from plugrad_cpu.llvm_renderer import LLVMRenderer
  from plugrad_cpu.renderer import CPURenderer
  renderer = Device["CPU"].renderer
  if renderer.vector_width <= 1: pytest.skip("the CPU renderer has no vector lanes on this machine")
  ast, var_vals = _sibling_convs("CPU")
  k = Scheduler(ast, renderer)
  assert len(k.reduces) == 2 and [r.src[0].arg for r in k.output_axes] == [64, 64]  # (Cout, H*W): the pixels are one loop
  applied = list(hand_coded_optimizations(k).applied)
  w = renderer.vector_width
  assert Opt(OptOps.UPCAST, 1, 2 * w) in applied and any(o.op is OptOps.UPCAST and o.axis == 0 for o in applied), applied
  want, got = run(get_program(ast, renderer, opts=[]), var_vals), run(get_program(ast, renderer, opts=applied), var_vals)
  np.testing.assert_allclose(got[0], want[0], rtol=2e-5, atol=2e-5)
  for other in (CPURenderer("CPU", vector_width=w), LLVMRenderer("CPU", w, "x86-64", "")):  # both CPU renderers take it
    assert "r_64_64" in other.render(get_program(ast, other, opts=applied))
  past, pvals = _sibling_convs("PYTHON")
  check_same(past, Device["PYTHON"].renderer, applied, pvals)


@pytest.mark.parametrize("m", [1, 8])
def test_heuristics_give_a_long_dot_product_independent_chains(m):
  # one FMA chain per output made x @ W.T latency-bound: 4 outputs of W's rows at once, and 2 of x's rows
  x, wt = (Tensor(RNG.standard_normal(s).astype(np.float32), device="CPU") for s in ((m, 512), (64, 512)))
  ast, var_vals = _ast(x @ wt.T)
  renderer = Device["CPU"].renderer
  prg = get_program(ast, renderer)
  applied = list(prg.applied_opts)
  n_axis = len(Scheduler(ast, renderer).output_axes) - 1
  assert Opt(OptOps.UPCAST, n_axis, 4) in applied and (m == 1 or Opt(OptOps.UPCAST, 0, 2) in applied), applied
  np.testing.assert_allclose(run(prg, var_vals)[0], run(get_program(ast, renderer, opts=[]), var_vals)[0], rtol=2e-5, atol=2e-5)
  past, pvals = _ast(Tensor(x.numpy(), device="PYTHON") @ Tensor(wt.numpy(), device="PYTHON").T)
  check_same(past, Device["PYTHON"].renderer, applied, pvals)


def test_scheduler_merges_only_loops_nothing_tells_apart():
  x = Tensor(RNG.standard_normal((8, 16, 3, 3)).astype(np.float32), device="CPU")
  def sizes(t: Tensor) -> list[int]:
    return [r.src[0].arg for r in Scheduler(_ast(t)[0], Device["CPU"].renderer).output_axes]
  assert sizes(x * 2) == [1152]                          # contiguous: one loop
  assert sizes(x.permute(1, 0, 2, 3) * 2) == [16, 8, 9]  # a transpose keeps its axes, the window is still one
  assert sizes(x.pad(((0, 0), (0, 0), (1, 1), (1, 1))) + 1) == [128, 5, 5]  # a pad's gate keeps h and w apart
  assert sizes(x + Tensor.ones(16, 1, 1, device="CPU")) == [8, 16, 9]     # a per-channel broadcast keeps the channels
  np.testing.assert_allclose((x.permute(1, 0, 2, 3) * 2).numpy(), x.numpy().transpose(1, 0, 2, 3) * 2)
  np.testing.assert_allclose((x.pad(((0, 0), (0, 0), (1, 1), (1, 1))) + 1).numpy(), np.pad(x.numpy(), ((0, 0), (0, 0), (1, 1), (1, 1))) + 1)


def test_scheduler_merges_reduce_loops_only_where_memory_runs_on():
  # a reduction's own loops are merged like output loops: BatchNorm's statistics over 8x8 pixels are one loop of 64 (a
  # vector accumulator run); a strided window (a stride-2 conv's weight gradient reads the image at 2*ow + kw) keeps its
  # loops apart, where one loop would index through a division and a modulo (the stem's gradient: 12544 -> 112 x 112)
  def reds(t: Tensor) -> list[int]:
    return [r.src[0].arg for r in Scheduler(_ast(t)[0], Device["CPU"].renderer).reduce_axes]
  x = Tensor(RNG.standard_normal((4, 8, 8, 8)).astype(np.float32), device="CPU")
  assert reds(x.sum((0, 2, 3))) == [4, 64]
  img, g = (Tensor(RNG.standard_normal(s).astype(np.float32), device="CPU") for s in ((1, 2, 16, 16), (1, 3, 8, 8)))
  w = Tensor(RNG.standard_normal((3, 2, 3, 3)).astype(np.float32), device="CPU", requires_grad=True)
  (img.conv2d(w, stride=2, padding=1) * g).sum().backward()
  assert w.grad is not None and reds(w.grad) == [8, 8]
  torch = pytest.importorskip("torch")
  tw = torch.from_numpy(w.numpy()).requires_grad_()
  (torch.nn.functional.conv2d(torch.from_numpy(img.numpy()), tw, stride=2, padding=1) * torch.from_numpy(g.numpy())).sum().backward()
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_heuristics_give_a_strided_weight_gradient_vector_accumulators_along_its_rows():
  # a stem's weight gradient: outputs (Cout, Cin, 7, 7), per image a 112x112 reduction reading the gradient
  # contiguously and the image at 2*ow + kw. The kernel's 7 columns cannot carry the register tile's lanes, and the
  # channel tile's gradient panel (16 channels x 12544 positions) does not fit: it gets the kernel columns copied out
  # (their pad gates fold), 4 output channels at once and vector accumulators along the gradient's rows (ResNet-18's
  # stem at batch 8: 1.1 s -> 46 ms; it got one UNROLL before)
  renderer = Device["CPU"].renderer
  if (w := renderer.vector_width) <= 1: pytest.skip("the CPU renderer has no vector lanes on this machine")
  img = Tensor(RNG.standard_normal((2, 3, 224, 224)).astype(np.float32), device="CPU")
  g = Tensor(RNG.standard_normal((2, 16, 112, 112)).astype(np.float32), device="CPU")
  wt = Tensor(RNG.standard_normal((16, 3, 7, 7)).astype(np.float32), device="CPU", requires_grad=True)
  (img.conv2d(wt, stride=2, padding=3) * g).sum().backward()
  assert wt.grad is not None
  items, _ = create_schedule(wt.grad.uop)
  it = max((it for it in items if it.kind == "kernel"), key=lambda it: len(it.ast.toposort))
  ast, var_vals = it.ast, it.var_vals
  reds = [r.src[0].arg for r in Scheduler(ast, renderer).reduce_axes]
  assert reds[-2:] == [112, 112], reds  # not one loop indexed through // and %
  prg = get_program(ast, renderer)
  applied = list(prg.applied_opts)
  # which of the two layouts wins depends on the vector width (and so the panel size): an 8-lane machine takes the
  # channel tile with a per-tile panel, a 16-lane one the row accumulators
  rows = Opt(OptOps.UNROLL, len(reds) - 1, w) in applied and any(o.op is OptOps.UPCAST and o.amount == 4 for o in applied)
  assert rows or (OptOps.PACK in {o.op for o in applied} and OptOps.TILE in {o.op for o in applied}), applied
  # 12544-term sums of products of N(0, 1) values in another order: rounding of ~1e-7 of the terms' total (~1e4)
  np.testing.assert_allclose(run(prg, var_vals)[0], run(get_program(ast, renderer, opts=[]), var_vals)[0], rtol=1e-4, atol=3e-3)


@pytest.mark.parametrize("w", [8, 16])
def test_channel_tile_keeps_its_lanes_on_the_channels_when_its_rows_are_a_vector_long(w):
  # a channel tile whose pixel rows are as many as the vector's lanes (56-wide output rows in 8 rows of 7 on an AVX2
  # machine): the stores are contiguous along the rows, but lanes there would gather the padded input with a gate per
  # lane; on the channels they read whole vectors of the packed weights (ResNet's 1x64x56x56 3x3: 58 -> 112 GFLOPS)
  from plugrad_cpu.renderer import CPURenderer
  renderer = CPURenderer("CPU", vector_width=w)
  x, wt = RNG.standard_normal((1, 4, 3, 2 * w)).astype(np.float32), RNG.standard_normal((w, 4, 3, 3)).astype(np.float32)
  ast, var_vals = _ast(Tensor(x, device="CPU").conv2d(Tensor(wt, device="CPU"), padding=1))
  k = Scheduler(ast, renderer)
  assert [r.src[0].arg for r in k.output_axes] == [w, 3, 2 * w], k.output_axes
  opts = [Opt(OptOps.UPCAST, 0, w), Opt(OptOps.UPCAST, 2, w), Opt(OptOps.UNROLL, 2, 3)]
  k.apply_opts(opts)
  lane = k.ranges_of(AxisType.UPCAST)[0]
  opts.append(Opt(OptOps.PACK, next(n for n, v in enumerate(k.packable_values()) if lane in v.toposort)))
  src = renderer.render(get_program(ast, renderer, opts=opts))
  assert f"(const float{w}*)((acc" in src and vector_fma(src, w), src  # FMAs on vector loads of the panel
  if w == Device["CPU"].renderer.vector_width: check_same(ast, Device["CPU"].renderer, opts, var_vals)


@pytest.mark.parametrize("width, pad", [(7, False), (13, True)])
def test_heuristics_give_an_8_lane_channel_tile_its_rows(width, pad):
  # 16 vector registers hold 12 accumulators: a 7-wide output gets 7 rows (it got none with a limit of 6, and each
  # weight vector fed one FMA: ResNet's 1x512x7x7 3x3 at 21 GFLOPS, 86 with the rows); 13 columns have no divisor for
  # the rows, so they are padded to 14 = 2 x 7 (1/13 more work) rather than left without (4x256x13x13: 14.3 -> 8.2 ms)
  from plugrad_cpu.renderer import CPURenderer
  renderer = CPURenderer("CPU", vector_width=8)
  x, wt = RNG.standard_normal((1, 16, width, width)).astype(np.float32), RNG.standard_normal((16, 16, 3, 3)).astype(np.float32)
  ast, var_vals = _ast(Tensor(x, device="CPU").conv2d(Tensor(wt, device="CPU"), padding=1))
  applied = list(hand_coded_optimizations(Scheduler(ast, renderer)).applied)
  assert Opt(OptOps.UPCAST, 0, 8) in applied and Opt(OptOps.UPCAST, 2, 7) in applied, applied
  assert (Opt(OptOps.PADTO, 2, 7) in applied) == pad, applied
  if Device["CPU"].renderer.vector_width == 8: check_same(ast, Device["CPU"].renderer, applied, var_vals)
  past, pvals = _ast(Tensor(x, device="PYTHON").conv2d(Tensor(wt, device="PYTHON"), padding=1))
  check_same(past, Device["PYTHON"].renderer, applied, pvals)


@pytest.mark.parametrize("width, stride, second", [(7, 1, True), (14, 1, False), (14, 2, False)])
def test_heuristics_give_a_whole_short_row_a_second_lane_vector(width, stride, second):
  # rows that are a whole 7-wide output row, read at unit stride, share their window loads: two vectors of channels
  # let each broadcast feed two FMAs (8x512x7x7 3x3: 28.6 -> 21.6 ms, one thread). Half a row (14 wide) or a strided
  # input (stride 2, a 7-wide output) keep one vector: they measured up to 6% and 13-70% slower with two
  from plugrad_cpu.renderer import CPURenderer
  renderer = CPURenderer("CPU", vector_width=8)
  x, wt = RNG.standard_normal((1, 32, width, width)).astype(np.float32), RNG.standard_normal((32, 32, 3, 3)).astype(np.float32)
  ast, var_vals = _ast(Tensor(x, device="CPU").conv2d(Tensor(wt, device="CPU"), stride=stride, padding=1))
  applied = list(hand_coded_optimizations(Scheduler(ast, renderer)).applied)
  assert Opt(OptOps.UPCAST, 0, 8) in applied and Opt(OptOps.UPCAST, 2, 7) in applied, applied
  assert (Opt(OptOps.UPCAST, 0, 2) in applied) == second, applied
  if Device["CPU"].renderer.vector_width == 8: check_same(ast, Device["CPU"].renderer, applied, var_vals)
  past, pvals = _ast(Tensor(x, device="PYTHON").conv2d(Tensor(wt, device="PYTHON"), stride=stride, padding=1))
  check_same(past, Device["PYTHON"].renderer, applied, pvals)


@pytest.mark.parametrize("width, stride, budget, small_copies, hoisted",
                         [(7, 1, None, True, True), (14, 2, None, True, True), (7, 1, 0, True, False), (7, 1, None, False, False)])
def test_heuristics_hoist_a_small_maps_panel_above_the_batch(monkeypatch, width, stride, budget, small_copies, hoisted):
  # at a 7x7 output the channel tile's panel copy is 10-30% of the kernel; packed per image it is paid once per image.
  # Where every image fits HOIST_BYTES the tile loop goes outermost (TILE before PACK) and one panel serves the batch
  # (8x512x14x14 3x3/2: 37.3 -> 31.0 ms, one thread); with no budget the image loop stays outermost, and so it does
  # where the copy already serves every image (all the weights fit one copy). MAX_PACK_BYTES is lowered to make these
  # small weights (36 KiB) too large for one copy, as a ResNet's are
  import plugrad.codegen.opt.heuristic as heuristic
  import plugrad.codegen.opt.kernel as kernel
  from plugrad_cpu.renderer import CPURenderer
  if budget is not None: monkeypatch.setattr(heuristic, "HOIST_BYTES", budget)
  if small_copies: monkeypatch.setattr(kernel, "MAX_PACK_BYTES", 24 << 10)
  renderer = CPURenderer("CPU", vector_width=8)
  x, wt = RNG.standard_normal((2, 32, width, width)).astype(np.float32), RNG.standard_normal((32, 32, 3, 3)).astype(np.float32)
  ast, var_vals = _ast(Tensor(x, device="CPU").conv2d(Tensor(wt, device="CPU"), stride=stride, padding=1))
  applied = list(hand_coded_optimizations(Scheduler(ast, renderer)).applied)
  tiles = [n for n, o in enumerate(applied) if o.op is OptOps.TILE]
  pack = next(n for n, o in enumerate(applied) if o.op is OptOps.PACK)
  assert bool(tiles and tiles[0] < pack and applied[tiles[0]].axis == 1) == hoisted, applied
  if Device["CPU"].renderer.vector_width == 8: check_same(ast, Device["CPU"].renderer, applied, var_vals)
  past, pvals = _ast(Tensor(x, device="PYTHON").conv2d(Tensor(wt, device="PYTHON"), stride=stride, padding=1))
  check_same(past, Device["PYTHON"].renderer, applied, pvals)


@pytest.mark.parametrize("budget, per_row", [(4 << 10, True), (None, False)])
def test_heuristics_pack_a_strided_input_per_output_row(monkeypatch, budget, per_row):
  # a stride-2 1x1 convolution's rows broadcast input pixels a channel apart; its subsampled input is packed, but at a
  # 56x56 input that copy fits no scope in the plain loop order (the channel-tile loop outermost: the whole input).
  # Then the output rows go outermost (TILE(row, 1)) and each row's copy serves every channel tile (1x256x56x56 ->
  # 512: 4.7 -> 2.9 ms, one thread). PACK_BUDGET is lowered to put this small input (25 KiB subsampled) in that case
  import plugrad.codegen.opt.heuristic as heuristic
  from plugrad_cpu.renderer import CPURenderer
  if budget is not None: monkeypatch.setattr(heuristic, "PACK_BUDGET", budget)
  renderer = CPURenderer("CPU", vector_width=8)
  x, wt = RNG.standard_normal((1, 32, 28, 28)).astype(np.float32), RNG.standard_normal((32, 32, 1, 1)).astype(np.float32)
  ast, var_vals = _ast(Tensor(x, device="CPU").conv2d(Tensor(wt, device="CPU"), stride=2))
  applied = list(hand_coded_optimizations(Scheduler(ast, renderer)).applied)
  ops = [o.op for o in applied]
  assert ops.count(OptOps.PACK) == 2, applied  # the weights' panel and the subsampled input
  assert (OptOps.TILE in ops and ops.index(OptOps.TILE) < ops.index(OptOps.PACK)) == per_row, applied
  if Device["CPU"].renderer.vector_width == 8: check_same(ast, Device["CPU"].renderer, applied, var_vals)
  past, pvals = _ast(Tensor(x, device="PYTHON").conv2d(Tensor(wt, device="PYTHON"), stride=2))
  check_same(past, Device["PYTHON"].renderer, applied, pvals)


@pytest.mark.parametrize("batch", [1, 2])
def test_heuristics_pad_a_1x1_convolutions_pixel_row_to_whole_vectors(batch):
  # a 1x1 convolution at 7x7 (49 pixels, no multiple of a vector) took the channel tile, whose rows broadcast input pixels
  # a channel apart along the reduction (new cache lines every step; 1x320x7x7 -> 1280: 0.91 ms, one thread): the pixels
  # are now PADTO'd to whole vectors and carry the lanes, with twice the rows of weights (0.60 ms). Checked against the
  # unoptimized kernel on the CPU (LLVM, and C through the C compiler) and on PYTHON
  import ctypes

  from plugrad.codegen.opt.heuristic import ONE_VECTOR_PAD_MAX
  w = max(1, Device["CPU"].renderer.vector_width)
  if w == 1: pytest.skip("no vector lanes")
  # 49 pixels pad to 56 for 8 lanes; 16 lanes would grow them by more than 1/ONE_VECTOR_PAD_MAX (to 64: the channel tile
  # runs as fast there), so a 9x9 map (81 -> 96) stands in
  side = 7 if -49 % w <= 49 // ONE_VECTOR_PAD_MAX else 9
  x, wt = RNG.standard_normal((batch, 24, side, side)).astype(np.float32), RNG.standard_normal((4 * w, 24, 1, 1)).astype(np.float32)
  ast, var_vals = _ast(Tensor(x, device="CPU").conv2d(Tensor(wt, device="CPU")))
  applied = list(get_program(ast, Device["CPU"].renderer).applied_opts)
  pix = len(Scheduler(ast, Device["CPU"].renderer).output_axes) - 1  # the merged pixels, innermost
  rows = 16 if w >= 16 else 8
  assert applied[:3] == [Opt(OptOps.PADTO, pix, w), Opt(OptOps.UPCAST, pix, w), Opt(OptOps.UPCAST, pix - 1, rows)], applied
  assert any(o.op is OptOps.PACK for o in applied), applied
  check_same(ast, Device["CPU"].renderer, applied, var_vals)
  # the C renderer's kernel, compiled by the system compiler and called directly on one thread
  from plugrad_cpu.tiering import compile_c
  prg = get_program(ast, Device["CPU"].renderer, opts=applied)
  _, fn = compile_c(prg)
  want = np.einsum("nchw,oc->nohw", x, wt[:, :, 0, 0])
  out = np.zeros(want.shape, np.float32)
  assert [g.arg for g in prg.buffers] == [0, 1, 2]  # the output, the input, the weights
  fn(*(a.ctypes.data_as(ctypes.c_void_p) for a in (out, x, wt)), ctypes.c_int(0), ctypes.c_int(1))
  np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
  past, pvals = _ast(Tensor(x, device="PYTHON").conv2d(Tensor(wt, device="PYTHON")))
  check_same(past, Device["PYTHON"].renderer, applied, pvals)


@pytest.mark.parametrize("dev", ["CPU", "PYTHON"])
def test_heuristics_pack_the_strided_input_of_a_stride_2_pointwise_convolution(dev):
  # a stride-2 1x1 convolution takes the channel tile; its rows broadcast input pixels a channel apart along the
  # reduction (new cache lines at every step), so the input is packed too, once per image (8x1024x14x14 -> 2048:
  # 24.8 -> 16.7 ms); a padded input (gated) is not (tested by the 3x3 channel-tile tests above)
  w = max(1, Device["CPU"].renderer.vector_width)
  if w == 1: pytest.skip("no vector lanes")
  x, wt = RNG.standard_normal((2, 16, 8, 8)).astype(np.float32), RNG.standard_normal((2 * w, 16, 1, 1)).astype(np.float32)
  ast, _ = _ast(Tensor(x, device="CPU").conv2d(Tensor(wt, device="CPU"), stride=2))
  applied = list(get_program(ast, Device["CPU"].renderer).applied_opts)
  assert applied[0] == Opt(OptOps.UPCAST, 1, w) and [o.op for o in applied].count(OptOps.PACK) == 2, applied
  dast, dvals = _ast(Tensor(x, device=dev).conv2d(Tensor(wt, device=dev), stride=2))
  check_same(dast, Device[dev].renderer, applied, dvals)


@pytest.mark.parametrize("dev", ["CPU", "PYTHON"])
def test_heuristics_unroll_a_prime_window_run_of_a_weight_gradient_whole(dev):
  # a 3x3 convolution's weight gradient at 7x7 reduces over 7 output columns last: no amount up to 4 divides 7, so it
  # was not unrolled at all; unrolled whole, its gated window loads fold per copy (512x512x3x3: 25.7 -> 14.0 ms)
  w = max(1, Device["CPU"].renderer.vector_width)
  if w == 1: pytest.skip("no vector lanes")
  def grads(d: str) -> tuple[UOp, dict[str, int]]:
    x = Tensor(RNG.standard_normal((2, 4, 7, 7)).astype(np.float32), device=d)
    wt = Tensor(RNG.standard_normal((w, 4, 3, 3)).astype(np.float32), device=d, requires_grad=True)
    (x.conv2d(wt, padding=1) * Tensor(RNG.standard_normal((2, w, 7, 7)).astype(np.float32), device=d)).sum().backward()
    assert wt.grad is not None
    return _ast(wt.grad)
  ast, _ = grads("CPU")
  k = Scheduler(ast, Device["CPU"].renderer)
  assert _size_of(k.reduce_axes[-1]) == 7
  applied = list(get_program(ast, Device["CPU"].renderer).applied_opts)
  assert Opt(OptOps.UNROLL, len(k.reduce_axes) - 1, 7) in applied, applied
  dast, dvals = grads(dev)
  check_same(dast, Device[dev].renderer, applied, dvals)


def _size_of(r: UOp) -> int: return r.src[0].arg


def _depthwise_ref(x: np.ndarray, wt: np.ndarray, pad: int) -> np.ndarray:
  xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
  k, (h, wd) = wt.shape[-1], x.shape[2:]
  return sum(xp[:, :, i:i + h, j:j + wd] * wt[None, :, 0, i, j, None, None] for i in range(k) for j in range(k))


@pytest.mark.parametrize("width,ksize", [(16, 3), (7, 3), (13, 3), (14, 3), (20, 5), (26, 5), (56, 7)])
def test_heuristics_masked_row_tile_for_a_depthwise_convolution(width, ksize):
  # a depthwise convolution reuses no operand across output channels, so the channel tile gathered its padded input
  # (lanes 56x56 floats apart: 16 GFLOPS); its lanes now run along the output row, each window position one vector load
  # whose border lanes are masked off (Renderer.masked_access), the row padded to whole vectors with masked stores
  # (7 -> 8, 14 -> 16), rows of accumulators sharing loads and the window unrolled whole (1x144x56x56: ~0.75 -> 0.14 ms).
  # Checked against the unoptimized kernel on the CPU (LLVM, and C through the C compiler) and on PYTHON (no masked access)
  import ctypes

  from plugrad.codegen.opt.heuristic import ONE_VECTOR_PAD_MAX
  rd = Device["CPU"].renderer
  w = max(1, rd.vector_width)
  if w == 1: pytest.skip("no vector lanes")
  if -width % w > width // ONE_VECTOR_PAD_MAX: pytest.skip(f"{width}-wide rows grow by more than 1/{ONE_VECTOR_PAD_MAX} to whole {w}-lane vectors")
  c, pad = 3, ksize // 2
  x, wt = RNG.standard_normal((2, c, 6, width)).astype(np.float32), RNG.standard_normal((c, 1, ksize, ksize)).astype(np.float32)
  def conv(d: str) -> tuple[UOp, dict[str, int]]: return _ast(Tensor(x, device=d).conv2d(Tensor(wt, device=d), padding=pad, groups=c))
  ast, var_vals = conv("CPU")
  applied = list(get_program(ast, rd).applied_opts)
  row = len(Scheduler(ast, rd).output_axes) - 1
  pads = [Opt(OptOps.PADTO, row, w)] if width % w else []
  vectors = -(-width // w)
  whole = [Opt(OptOps.UPCAST, row, 0)] if 1 < vectors <= 8 else []  # a short row copied whole: constant border masks
  # the window unrolled whole from its innermost axis while the lanes leave room for two rows, then the rows
  window = ksize * ksize if w * vectors * 2 * ksize * ksize <= 1024 else ksize
  rows = _divisor(6, min(8, 14 // vectors, 1024 // (w * vectors * window)))
  unrolls = [Opt(OptOps.UNROLL, 1, 0)] + ([Opt(OptOps.UNROLL, 0, 0)] if window > ksize else [])
  assert applied == [*pads, Opt(OptOps.UPCAST, row, w), *whole, *([Opt(OptOps.UPCAST, row - 1, rows)] if rows > 1 else []), *unrolls], applied
  prg = get_program(ast, rd, opts=applied)
  assert "llvm.masked.load" in prg.source and ("llvm.masked.store" in prg.source) == bool(pads), prg.source
  check_same(ast, rd, applied, var_vals)
  from plugrad_cpu.tiering import compile_c
  src, fn = compile_c(prg)
  want = _depthwise_ref(x, wt, pad)
  out = np.zeros(want.shape, np.float32)
  fn(*(a.ctypes.data_as(ctypes.c_void_p) for a in (out, x, wt)), ctypes.c_int(0), ctypes.c_int(1))
  np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
  past, pvals = conv("PYTHON")
  check_same(past, Device["PYTHON"].renderer, applied, pvals)


def _divisor(size: int, limit: int) -> int: return max(d for d in range(1, min(size, limit) + 1) if size % d == 0)
