"""The PYTHON device: hand-built linear programs (docs/ir.md stage 3) rendered, compiled, loaded and run through the real
PROGRAM accessors, compared with numpy and with `exec_alu` (the constant folder's scalar semantics)."""
from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from plugrad.builtin.interpreter import PythonAllocator, PythonCompiler, PythonProgram, PythonRuntime
from plugrad.builtin.python_renderer import PythonRenderer, parse_text, render_text
from plugrad.codegen.decompose import decompose, decompose_linear
from plugrad.device.compiler import Compiler
from plugrad.dtype import AddrSpace, DType, dtypes
from plugrad.errors import CompileError, LaunchError
from plugrad.renderer.base import RendererError
from plugrad.uop.ops import AxisType, GroupOp, KernelInfo, Ops, UOp, exec_alu
from plugrad.uop.program import ProgramUOp, make_program

i32 = dtypes.int32


# ---- building and running programs

def lin(*uops: UOp) -> list[UOp]:
  """The uops in order: each argument's not-yet-listed sources (depth first), then itself."""
  out: dict[UOp, None] = {}
  for u in uops:
    for x in u.toposort: out.setdefault(x, None)
  return list(out)


def glob(slot: int, dt: DType, size: int = -1) -> UOp: return UOp(Ops.DEFINE_GLOBAL, dt.ptr(size), (), slot)
def loop(n: int | UOp, axis: int = 0) -> UOp: return UOp.range(n, axis, AxisType.LOOP, i32)
def end(r: UOp) -> UOp: return UOp(Ops.ENDRANGE, dtypes.void, (r,))
def special(name: str, n: int) -> UOp: return UOp.special(n, name, i32)
def if_(cond: UOp) -> UOp: return UOp(Ops.IF, dtypes.void, (cond,))
def endif(i: UOp) -> UOp: return UOp(Ops.ENDIF, dtypes.void, (i,))
def barrier() -> UOp: return UOp(Ops.BARRIER, dtypes.void, ())


def build(uops: Sequence[UOp], name: str = "test_kernel", emulate: str = "") -> ProgramUOp:
  """A PROGRAM at the binary stage, made by the PYTHON renderer and compiler (after the shared passes: bfloat16 is
  emulated)."""
  ren = PythonRenderer("PYTHON", emulate)
  p = make_program(UOp(Ops.SINK, dtypes.void, (), KernelInfo(name)), "PYTHON").with_linear(decompose_linear(list(uops), ren))
  p = p.with_source(ren.render(p))
  return p.with_binary(PythonCompiler().compile_cached(p.source, p.name))


def load(uops: Sequence[UOp], name: str = "test_kernel", emulate: str = "") -> PythonProgram:
  return PythonRuntime("PYTHON").load(build(uops, name, emulate))


def run(uops: Sequence[UOp], *bufs: np.ndarray, global_size: tuple[int, ...] = (1, 1, 1), local_size: tuple[int, ...] = (1, 1, 1),
        vals: tuple[int, ...] = (), emulate: str = "", name: str = "test_kernel") -> list[np.ndarray]:
  """Run on copies of `bufs` (in slot order) and return their contents afterwards."""
  lib = load(uops, name, emulate)
  alloc = PythonAllocator("PYTHON")
  handles = []
  for b in bufs:
    h = alloc.alloc(b.nbytes)
    alloc.copyin(h, memoryview(np.ascontiguousarray(b)).cast("B"))
    handles.append(h)
  lib(*handles, global_size=global_size, local_size=local_size, vals=vals)
  outs = []
  for b, h in zip(bufs, handles):
    out = np.empty_like(b)
    alloc.copyout(memoryview(out).cast("B"), h)
    outs.append(out)
  return outs


# ---- control flow and memory

def test_elementwise_over_a_range():
  out, x = glob(0, dtypes.float32, 16), glob(1, dtypes.float32, 16)
  r = loop(16)
  st = out.index(r).store(x.index(r).load() * 2.0 + 1.0)
  a = np.random.default_rng(0).standard_normal(16).astype(np.float32)
  got, _ = run(lin(out, x, r, st, end(r)), np.zeros(16, np.float32), a)
  np.testing.assert_array_equal(got, a * np.float32(2) + np.float32(1))


def test_reduction_with_a_register_accumulator():
  out, x = glob(0, dtypes.float32, 4), glob(1, dtypes.float32, 32)
  acc = UOp(Ops.DEFINE_REG, dtypes.float32.ptr(1, AddrSpace.REG), (), 0)
  zero = UOp.const(i32, 0)
  r, k = loop(4, 0), loop(8, 1)
  init = acc.index(zero).store(UOp.const(dtypes.float32, 0.0))
  upd = acc.index(zero).store(acc.index(zero).load() + x.index(r * 8 + k).load())
  # reading the accumulator after the loop is a different LOAD from the one inside: it is ordered after the ENDRANGE
  st = out.index(r).store(UOp(Ops.LOAD, dtypes.float32, (acc.index(zero), end(k))))
  a = np.arange(32, dtype=np.float32)
  # the accumulator's INDEX is one (hash-consed) uop used inside and after the inner loop, so it comes before both
  got, _ = run(lin(out, x, acc, zero, acc.index(zero), r, init, k, upd, end(k), st, end(r)), np.zeros(4, np.float32), a)
  np.testing.assert_array_equal(got, a.reshape(4, 8).sum(1))


def test_gidx_lidx_launch_with_a_gated_tail():
  out, x = glob(0, dtypes.int32, 50), glob(1, dtypes.int32, 50)
  g, l = special("gidx0", 4), special("lidx0", 16)
  i = g * 16 + l
  valid = i < 50
  st = out.index(i, valid).store(x.index(i, valid).load() * 3)
  a = np.arange(50, dtype=np.int32)
  got, _ = run(lin(out, x, st), np.full(50, -1, np.int32), a, global_size=(4, 1, 1), local_size=(16, 1, 1))
  np.testing.assert_array_equal(got, a * 3)


def test_gated_load_takes_the_alternative():
  out, x = glob(0, dtypes.float32, 8), glob(1, dtypes.float32, 4)
  r = loop(8)
  ld = UOp(Ops.LOAD, dtypes.float32, (x.index(r, r < 4), UOp.const(dtypes.float32, -5.0)))
  st = out.index(r).store(ld)
  got, _ = run(lin(out, x, r, st, end(r)), np.zeros(8, np.float32), np.arange(4, dtype=np.float32))
  np.testing.assert_array_equal(got, [0, 1, 2, 3, -5, -5, -5, -5])


def workgroup_sum(with_barrier: bool = True) -> list[UOp]:
  """out[g] = sum of x[16g : 16g+16]: each thread stores to local memory, thread 0 adds them up."""
  out, x = glob(0, dtypes.float32, 4), glob(1, dtypes.float32, 64)
  tmp = UOp(Ops.DEFINE_LOCAL, dtypes.float32.ptr(16, AddrSpace.LOCAL), (), "tmp")
  acc = UOp(Ops.DEFINE_REG, dtypes.float32.ptr(1, AddrSpace.REG), (), 0)
  zero = UOp.const(i32, 0)
  g, l = special("gidx0", 4), special("lidx0", 16)
  st_local = tmp.index(l).store(x.index(g * 16 + l).load())
  first = if_(l.eq(0))
  k = loop(16)
  init = acc.index(zero).store(UOp.const(dtypes.float32, 0.0))
  upd = acc.index(zero).store(acc.index(zero).load() + tmp.index(k).load())
  st = out.index(g).store(UOp(Ops.LOAD, dtypes.float32, (acc.index(zero), end(k))))
  return lin(out, x, tmp, acc, zero, acc.index(zero), g, l, st_local, *([barrier()] if with_barrier else []), first, init, k, upd, end(k), st,
             endif(first))


def test_local_memory_workgroup_reduction_with_barrier():
  a = np.random.default_rng(1).integers(-8, 8, 64).astype(np.float32)
  got, _ = run(workgroup_sum(), np.zeros(4, np.float32), a, global_size=(4, 1, 1), local_size=(16, 1, 1))
  np.testing.assert_array_equal(got, a.reshape(4, 16).sum(1))


def test_missing_barrier_is_a_race():
  with pytest.raises(LaunchError, match=r"race on local buffer 'tmp'.*written since the last BARRIER"):
    run(workgroup_sum(with_barrier=False), np.zeros(4, np.float32), np.ones(64, np.float32), global_size=(4, 1, 1), local_size=(16, 1, 1))


def test_write_after_read_without_barrier_is_a_race():
  # every thread reads its right neighbour's slot, then overwrites its own: a GPU may run the write first
  out = glob(0, dtypes.float32, 8)
  tmp = UOp(Ops.DEFINE_LOCAL, dtypes.float32.ptr(8, AddrSpace.LOCAL), (), "tmp")
  l = special("lidx0", 8)
  fill = tmp.index(l).store(l.cast(dtypes.float32))
  nxt = tmp.index((l + 1) % 8).load()
  again = tmp.index(l).store(nxt)
  with pytest.raises(LaunchError, match="race on local buffer 'tmp'.*read since the last BARRIER"):
    run(lin(out, tmp, l, fill, barrier(), nxt, again, out.index(l).store(nxt)), np.zeros(8, np.float32), local_size=(8, 1, 1))


def test_reading_uninitialized_local_memory_raises():
  out = glob(0, dtypes.float32, 8)
  tmp = UOp(Ops.DEFINE_LOCAL, dtypes.float32.ptr(8, AddrSpace.LOCAL), (), "tmp")
  l = special("lidx0", 8)
  with pytest.raises(LaunchError, match="reads memory no thread has written"):
    run(lin(out, tmp, l, out.index(l).store(tmp.index(l).load())), np.zeros(8, np.float32), local_size=(8, 1, 1))


def test_barrier_in_divergent_code_raises():
  out = glob(0, dtypes.float32, 8)
  l = special("lidx0", 8)
  half = if_(l < 4)
  with pytest.raises(LaunchError, match="BARRIER in divergent code"):
    run(lin(out, l, half, barrier(), out.index(l).store(UOp.const(dtypes.float32, 1.0)), endif(half)), np.zeros(8, np.float32),
        local_size=(8, 1, 1))


def test_if_endif_masks_stores():
  out, x = glob(0, dtypes.float32, 16), glob(1, dtypes.float32, 16)
  r = loop(16)
  v = x.index(r).load()
  pos = if_(v > 0.0)
  st = out.index(r).store(v * 10.0)
  a = np.linspace(-3, 3, 16).astype(np.float32)
  got, _ = run(lin(out, x, r, v, pos, st, endif(pos), end(r)), np.full(16, 7, np.float32), a)
  np.testing.assert_array_equal(got, np.where(a > 0, a * np.float32(10), np.float32(7)))


def test_if_guards_threads_past_the_end():
  # inactive threads may compute addresses out of bounds: only accesses that happen are checked
  out, x = glob(0, dtypes.float32, 50), glob(1, dtypes.float32, 50)
  g, l = special("gidx0", 4), special("lidx0", 16)
  i = g * 16 + l
  guard = if_(i < 50)
  st = out.index(i).store(x.index(i).load() + 1.0)
  a = np.arange(50, dtype=np.float32)
  got, _ = run(lin(out, x, g, l, i, guard, st, endif(guard)), np.zeros(50, np.float32), a, global_size=(4, 1, 1), local_size=(16, 1, 1))
  np.testing.assert_array_equal(got, a + 1)


def test_if_across_threads_and_nested_loops():
  # threads with lidx odd sum their row, the others do nothing
  out, x = glob(0, dtypes.int32, 8), glob(1, dtypes.int32, 64)
  acc = UOp(Ops.DEFINE_REG, i32.ptr(1, AddrSpace.REG), (), 0)
  zero = UOp.const(i32, 0)
  l = special("lidx0", 8)
  odd = if_((l % 2).eq(1))
  k = loop(8)
  init = acc.index(zero).store(zero)
  upd = acc.index(zero).store(acc.index(zero).load() + x.index(l * 8 + k).load())
  st = out.index(l).store(UOp(Ops.LOAD, i32, (acc.index(zero), end(k))))
  a = np.arange(64, dtype=np.int32)
  got, _ = run(lin(out, x, acc, zero, l, odd, init, k, upd, end(k), st, endif(odd)), np.full(8, -1, np.int32), a, local_size=(8, 1, 1))
  np.testing.assert_array_equal(got, np.where(np.arange(8) % 2 == 1, a.reshape(8, 8).sum(1), -1))


def test_symbolic_sizes_through_define_var():
  n = UOp.variable("n", 1, 64, i32)
  m = UOp.variable("a_scale", 1, 10, i32)  # sorts before "n": vals come in name order
  out, x = glob(0, dtypes.int32, 64), glob(1, dtypes.int32, 64)
  r = loop(n)
  st = out.index(r).store(x.index(r).load() * m)
  prog = lin(out, x, n, m, r, st, end(r))
  p = build(prog)
  assert [v.arg[0] for v in p.vars] == ["a_scale", "n"]
  a = np.arange(64, dtype=np.int32)
  got, _ = run(prog, np.zeros(64, np.int32), a, vals=(3, 37))
  np.testing.assert_array_equal(got, np.where(np.arange(64) < 37, a * 3, 0))
  with pytest.raises(LaunchError, match=r"variable 'n' = 65 is not an int in \[1, 64\]"):
    run(prog, np.zeros(64, np.int32), a, vals=(3, 65))
  with pytest.raises(LaunchError, match="takes 2 variable values"):
    run(prog, np.zeros(64, np.int32), a, vals=(3,))


def test_symbolic_launch_size():
  n = UOp.variable("n", 1, 8, i32)
  out = glob(0, dtypes.int32, 8)
  g = UOp.special(n, "gidx0", i32)
  p = build(lin(out, n, g, out.index(g).store(g * 2)))
  gs, ls = p.launch_dims({"n": 5})
  assert gs == (5, 1, 1) and ls == (1, 1, 1)
  alloc = PythonAllocator("PYTHON")
  h = alloc.alloc(32)
  PythonRuntime("PYTHON").load(p)(h, global_size=gs, local_size=ls, vals=(5,))
  np.testing.assert_array_equal(h.view(np.int32), [0, 2, 4, 6, 8, 0, 0, 0])
  with pytest.raises(LaunchError, match="SPECIAL gidx0 has size 5, but the launch gives 6"):
    PythonRuntime("PYTHON").load(p)(h, global_size=(6, 1, 1), vals=(5,))


def test_loop_bounds_must_be_uniform():
  out = glob(0, dtypes.int32, 4)
  l = special("lidx0", 4)
  r = loop(l + 1)
  with pytest.raises(LaunchError, match=r"loop bound differs between threads \(1 to 4\)"):
    run(lin(out, l, r, out.index(l).store(r), end(r)), np.zeros(4, np.int32), local_size=(4, 1, 1))


def test_zero_trip_loop_skips_its_body():
  out = glob(0, dtypes.int32, 4)
  n = UOp.variable("n", 0, 4, i32)
  r = loop(n)
  got, = run(lin(out, n, r, out.index(r).store(r + 10), end(r)), np.full(4, -1, np.int32), vals=(0,))
  np.testing.assert_array_equal(got, [-1] * 4)


# ---- out of bounds and bad launches

def test_out_of_bounds_load_names_kernel_slot_and_index():
  out, x = glob(0, dtypes.float32, 8), glob(1, dtypes.float32, 4)
  r = loop(8)
  prog = lin(out, x, r, out.index(r).store(x.index(r).load()), end(r))
  with pytest.raises(LaunchError, match=r"kernel 'oob_kernel'.*out-of-bounds LOAD of buffer slot 1 \(4 elements of dtypes.float32\): index 4"):
    run(prog, np.zeros(8, np.float32), np.zeros(4, np.float32), name="oob_kernel")


def test_out_of_bounds_store_by_a_thread():
  out = glob(0, dtypes.int32, 10)
  l = special("lidx0", 16)
  with pytest.raises(LaunchError, match=r"out-of-bounds STORE of buffer slot 0 .*index 10 by thread gidx=\(0, 0, 0\) lidx=\(10, 0, 0\) and 5 more"):
    run(lin(out, l, out.index(l).store(l)), np.zeros(10, np.int32), local_size=(16, 1, 1))


def test_out_of_bounds_local_and_negative_indices():
  out = glob(0, dtypes.int32, 4)
  tmp = UOp(Ops.DEFINE_LOCAL, i32.ptr(4, AddrSpace.LOCAL), (), "tmp")
  l = special("lidx0", 4)
  with pytest.raises(LaunchError, match=r"out-of-bounds STORE of local buffer 'tmp'.*index -1"):
    run(lin(out, tmp, l, tmp.index(l + -1).store(l)), np.zeros(4, np.int32), local_size=(4, 1, 1))


def test_launch_checks():
  out = glob(0, dtypes.int32, 4)
  l = special("lidx0", 4)
  lib = load(lin(out, l, out.index(l).store(l)))
  h = PythonAllocator("PYTHON").alloc(16)
  with pytest.raises(LaunchError, match="takes 1 buffers"): lib(local_size=(4, 1, 1))
  with pytest.raises(LaunchError, match="has no SPECIAL gidx0"): lib(h, global_size=(2, 1, 1), local_size=(4, 1, 1))
  with pytest.raises(LaunchError, match="local_size must be 1 to 3 positive ints"): lib(h, local_size=(0, 1, 1))
  with pytest.raises(LaunchError, match="exceeds the limits of PYTHON"): lib(h, local_size=(4, 2048, 1))
  with pytest.raises(LaunchError, match="expected a PYTHON buffer handle"): lib(bytearray(16), local_size=(4, 1, 1))
  small = PythonAllocator("PYTHON").alloc(8)
  with pytest.raises(LaunchError, match="buffer slot 0 holds 2 elements of dtypes.int32, the kernel declares 4"): lib(small, local_size=(4, 1, 1))
  assert isinstance(lib(h, local_size=(4, 1, 1), wait=True), float)
  np.testing.assert_array_equal(h.view(np.int32), [0, 1, 2, 3])


# ---- ALU semantics, per dtype group, against exec_alu

def _values(dt: DType, n: int, rng: np.random.Generator) -> list[Any]:
  if dt is dtypes.bool: return [bool(v) for v in rng.integers(0, 2, n)]
  if dtypes.is_int(dt):
    lo, hi = dtypes.min(dt), dtypes.max(dt)
    edge = [0, 1, 2, 3, 7, lo, hi, lo + 1, hi - 1] + ([-1, -2, -7] if lo < 0 else [])
    return edge + [int(v) for v in rng.integers(lo, hi, n - len(edge), dtype=np.int64 if dt is not dtypes.uint64 else np.uint64, endpoint=True)]
  edge = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, math.inf, -math.inf, math.nan, 3.0, 1e30 if dt is not dtypes.float16 else 6e4]
  return edge + [float(v) for v in rng.standard_normal(n - len(edge)) * 4]


def _to_np(vals: list[Any], dt: DType) -> np.ndarray:
  with np.errstate(over="ignore"):
    if dt is dtypes.bfloat16: return (np.array(vals, np.float32).view(np.uint32) >> 16).astype(np.uint16)  # inputs are truncated to bf16
    return np.array(vals, dtypes.to_numpy(dt))


def _from_np(a: np.ndarray, dt: DType) -> list[Any]:
  if dt is dtypes.bfloat16: return [float(v) for v in (a.astype(np.uint32) << 16).view(np.float32)]
  return [v.item() for v in a]


def _same(a: Any, b: Any, rel: float = 0.0) -> bool:
  if isinstance(a, float) and isinstance(b, float):
    if math.isnan(a) or math.isnan(b): return math.isnan(a) and math.isnan(b)
    return a == b or abs(a - b) <= rel * abs(b)
  return a == b and type(a) is type(b)


_ALL_DTYPES = [dtypes.bool, *dtypes.ints, dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]
_INT_ONLY, _FLOAT_ONLY = {Ops.IDIV, Ops.MOD, Ops.SHL, Ops.SHR}, {Ops.FDIV, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.TRUNC}


def _ops_for(dt: DType) -> list[Ops]:
  ops = sorted(GroupOp.ALU - {Ops.THREEFRY, Ops.WHERE}, key=lambda o: o.value)
  if dt is dtypes.bool: return [o for o in ops if o not in _INT_ONLY | _FLOAT_ONLY]
  if dtypes.is_int(dt): return [o for o in ops if o not in _FLOAT_ONLY]
  return [o for o in ops if o not in _INT_ONLY | {Ops.AND, Ops.OR, Ops.XOR}]


def _alu_cases(dt: DType) -> list[tuple[Ops, tuple[str, ...]]]:
  cases: list[tuple[Ops, tuple[str, ...]]] = []
  for op in _ops_for(dt):
    if op in (Ops.SHL, Ops.SHR): keys: tuple[str, ...] = ("a", "shift")
    elif op is Ops.POW and dtypes.is_float(dt): keys = ("base", "b")  # 0 ** negative is inf in C, nan in exec_alu: not compared
    elif op is Ops.POW and dtypes.is_int(dt): keys = ("a", "exp")
    else: keys = ("a", "b", "c")[:1 if op in GroupOp.Unary else 3 if op is Ops.MULACC else 2]
    cases.append((op, keys))
  return cases + [(Ops.WHERE, ("a", "b", "c"))]  # WHERE(a != b, b, c)


@pytest.mark.parametrize("dt", _ALL_DTYPES, ids=lambda d: repr(d).split(".")[1])
def test_every_alu_op_matches_exec_alu(dt: DType):
  n, rng = 48, np.random.default_rng(7)
  a, b, c = (_values(dt, n, rng) for _ in range(3))
  inputs: dict[str, list[Any]] = {"a": a, "b": b[3:] + b[:3], "c": c}  # rotate b so edge values meet other edge values
  if dtypes.is_int(dt):
    inputs["shift"] = [int(v) for v in rng.integers(0, 8 * dt.itemsize, n)]
    inputs["exp"] = [int(v) for v in rng.integers(-3 if dt in dtypes.sints else 0, 12, n)]
  if dtypes.is_float(dt): inputs["base"] = [float(v) for v in rng.uniform(0.1, 4, n)]
  names, cases = list(inputs), _alu_cases(dt)
  bufs = {k: glob(i, dt, n) for i, k in enumerate(names)}
  r = loop(n)
  ld = {k: bufs[k].index(r).load() for k in names}
  out_globals, effects = [], []
  for j, (op, keys) in enumerate(cases):
    srcs = tuple(ld[k] for k in keys)
    if op is Ops.WHERE: srcs = (ld["a"].ne(ld["b"]), ld["b"], ld["c"])
    # with the guards the codegen writes for the interpreter (division by 0 or -1, out-of-range shifts)
    res = decompose(UOp(op, dtypes.bool if op in GroupOp.Comparison else dt, srcs), PythonRenderer("PYTHON"))
    out_globals.append(glob(len(names) + j, dtypes.bool if op in GroupOp.Comparison else dt, n))
    effects.append(out_globals[-1].index(r).store(res))
  host = [_to_np(inputs[k], dt) for k in names]
  outs = [np.zeros(n, np.bool_) if op in GroupOp.Comparison else np.zeros_like(host[0]) for op, _ in cases]
  got = run(lin(*bufs.values(), *out_globals, r, *effects, end(r)), *host, *outs, name="alu")[len(names):]
  vals = {k: _from_np(h, dt) for k, h in zip(names, host)}
  # float64 transcendentals may differ from libm in the last bit
  rel = 1e-15 if dt is dtypes.float64 else 0.0
  for (op, keys), buf in zip(cases, got):
    res_dt = dtypes.bool if op in GroupOp.Comparison else dt
    for i, g in enumerate(_from_np(buf, res_dt)):
      args = tuple(vals[k][i] for k in keys)
      if op is Ops.WHERE: args = (args[0] != args[1], args[1], args[2])
      want = exec_alu(op, res_dt, args)
      assert _same(g, want, rel), f"{op.name} {dt!r} on {args}: interpreter {g!r}, exec_alu {want!r}"


def test_threefry_is_lowered_and_matches_the_scalar_reference():
  """THREEFRY reaches the interpreter only as 32-bit integer ops (codegen/decompose.py); both words, against the
  constant folder's evaluation of the same definition."""
  n, rng = 32, np.random.default_rng(3)
  xs = np.concatenate([np.array([0, 2**32 - 1], np.uint32), rng.integers(0, 2**32 - 1, n - 2, dtype=np.uint32, endpoint=True)])
  key = 0x0123_4567_89AB_CDEF
  hi, lo, x = glob(0, dtypes.uint32, n), glob(1, dtypes.uint32, n), glob(2, dtypes.uint32, n)
  r = loop(n)
  xv = x.index(r).load()
  words = [decompose(UOp(Ops.THREEFRY, dtypes.uint32, (xv, xv), (key, w)), PythonRenderer("PYTHON")) for w in (1, 0)]
  assert not any(u.op is Ops.THREEFRY for w in words for u in w.toposort)
  got_hi, got_lo, _ = run(lin(hi, lo, x, r, hi.index(r).store(words[0]), lo.index(r).store(words[1]), end(r)),
                          np.zeros(n, np.uint32), np.zeros(n, np.uint32), xs)
  for w, got in ((1, got_hi), (0, got_lo)):
    assert [int(v) for v in got] == [exec_alu(Ops.THREEFRY, dtypes.uint32, (int(a), int(a)), (key, w)) for a in xs]


# ---- conversions

def _bf16_ref(v: float) -> float:
  """Round to bfloat16 the long way: through the float32 bits, to nearest even (independent of the interpreter's code)."""
  if math.isnan(v) or math.isinf(v): return v
  with np.errstate(over="ignore"): f = float(np.float32(v))
  if math.isinf(f): return f
  bits = struct.unpack("<I", struct.pack("<f", f))[0]
  low, top = bits & 0xFFFF, bits >> 16
  if low > 0x8000 or (low == 0x8000 and top & 1): top += 1
  return struct.unpack("<f", struct.pack("<I", (top << 16) & 0xFFFFFFFF))[0]


def _ref_cast(x: Any, s: DType, d: DType) -> Any:
  if d is dtypes.bool: return x != 0
  if dtypes.is_float(d):
    v = float(x)
    with np.errstate(over="ignore"):
      if d is dtypes.float64: return v
      return float(np.float32(v)) if d is dtypes.float32 else float(np.float16(v)) if d is dtypes.float16 else _bf16_ref(v)
  if dtypes.is_float(s): return 0 if not math.isfinite(x) else dtypes.as_const(math.trunc(x), d)
  return dtypes.as_const(int(x), d)


@pytest.mark.parametrize("src", _ALL_DTYPES, ids=lambda d: repr(d).split(".")[1])
def test_cast_to_every_dtype(src: DType):
  n = 40
  vals = _values(src, n, np.random.default_rng(5))
  if dtypes.is_float(src): vals[-6:] = [2.7, -2.7, 1e10, -1e10, 3e19, -0.9]  # truncation, wrap-around, the uint64 range
  host = _to_np(vals, src)
  vals = _from_np(host, src)
  x = glob(0, src, n)
  r = loop(n)
  v = x.index(r).load()
  dsts = [d for d in _ALL_DTYPES if d is not src]
  outs = [glob(1 + j, d, n) for j, d in enumerate(dsts)]
  effects = [o.index(r).store(v.cast(d)) for o, d in zip(outs, dsts)]
  got = run(lin(x, *outs, r, *effects, end(r)), host, *(_to_np([False] * n if d is dtypes.bool else [0] * n, d) for d in dsts), name="casts")
  for d, buf in zip(dsts, got[1:]):
    for i, g in enumerate(_from_np(buf, d)):
      want = _ref_cast(vals[i], src, d)
      assert _same(g, want), f"CAST {src!r} -> {d!r} of {vals[i]!r}: interpreter {g!r}, expected {want!r}"


@pytest.mark.parametrize("src, dst", [
  (dtypes.float32, dtypes.int32), (dtypes.int32, dtypes.float32), (dtypes.float32, dtypes.uint32), (dtypes.float16, dtypes.int16),
  (dtypes.bfloat16, dtypes.uint16), (dtypes.uint16, dtypes.bfloat16), (dtypes.float16, dtypes.bfloat16), (dtypes.float64, dtypes.int64),
  (dtypes.int64, dtypes.float64), (dtypes.float32.vec(2), dtypes.int64), (dtypes.float16.vec(2), dtypes.uint32),
  (dtypes.float64, dtypes.uint32.vec(2)), (dtypes.uint8.vec(4), dtypes.float32)], ids=repr)
def test_bitcast(src: DType, dst: DType):
  n = 8  # elements of `src`
  raw = np.random.default_rng(11).integers(0, 256, n * src.itemsize, dtype=np.uint8)
  x, out = glob(0, src.scalar(), n * src.count), glob(1, dst.scalar(), n * dst.count)
  r = loop(n)
  v = UOp(Ops.LOAD, src, (x.index(r * src.count),))  # a vector dtype loads consecutive elements
  st = out.index(r * dst.count).store(v.bitcast(dst))
  _, got = run(lin(x, out, r, st, end(r)), raw, np.zeros(n * dst.itemsize, np.uint8))
  np.testing.assert_array_equal(got, raw)  # a bitcast keeps every bit


# ---- vectors

def test_vectorize_gep_and_vector_alu():
  x, out, lane2 = glob(0, dtypes.float32, 16), glob(1, dtypes.float32, 16), glob(2, dtypes.float32, 4)
  r = loop(4)
  loads = [x.index(r * 4 + (3 - j)).load() for j in range(4)]
  vec = loads[0].vectorize(*loads[1:])                          # reversed groups of four
  scaled = vec * UOp.const(dtypes.float32.vec(4), 10.0) + vec   # a vector constant is a VECTORIZE of a CONST
  st = out.index(r * 4).store(scaled)                           # a vector store writes consecutive elements
  st2 = lane2.index(r).store(scaled.gep(2) + scaled.gep((0, 3)).gep(1))
  a = np.arange(16, dtype=np.float32)
  _, got, got2 = run(lin(x, out, lane2, r, st, st2, end(r)), a, np.zeros(16, np.float32), np.zeros(4, np.float32))
  want = a.reshape(4, 4)[:, ::-1] * 11
  np.testing.assert_array_equal(got, want.reshape(-1))
  np.testing.assert_array_equal(got2, want[:, 2] + want[:, 3])


def test_vector_loads_direct_cast_and_gathered():
  x, out = glob(0, dtypes.float32, 16), glob(1, dtypes.float32, 48)
  f4 = dtypes.float32.vec(4)
  r = loop(4)
  direct = UOp(Ops.LOAD, f4, (x.index(r * 4),))
  via_cast = UOp(Ops.LOAD, f4, (UOp(Ops.CAST, f4.ptr(4), (x.index(r * 4),)),))  # (float4*)(x + 4r)
  ptrs = [x.index(r + 4 * j) for j in range(4)]
  gathered = UOp(Ops.LOAD, f4, (UOp(Ops.VECTORIZE, dtypes.float32.ptr(16).vec(4), tuple(ptrs)),))  # x[r], x[r+4], x[r+8], x[r+12]
  effects = [out.index(r * 4 + 16 * j).store(v) for j, v in enumerate((direct, via_cast, gathered))]
  a = np.arange(16, dtype=np.float32) * 3
  _, got = run(lin(x, out, r, *effects, end(r)), a, np.zeros(48, np.float32))
  np.testing.assert_array_equal(got[:16], a)
  np.testing.assert_array_equal(got[16:32], a)
  np.testing.assert_array_equal(got[32:], a.reshape(4, 4).T.reshape(-1))


def test_vconst_and_vector_registers_from_text():
  # VCONST is not emitted at the linear stage today (the spec has no rule for it), but the interpreter runs it
  text = """# kernel 'vconst'
# target PYTHON
0 DEFINE_GLOBAL int32.ptr(8) () 0
1 DEFINE_REG int32.vec(4).ptr(2,AddrSpace.REG) () 0
2 CONST int32 () 1
3 VCONST int32.vec(4) () (5, -6, 7, -8)
4 INDEX int32.vec(4).ptr(2,AddrSpace.REG) (1,2)
5 STORE void (4,3)
6 LOAD int32.vec(4) (4,5)
7 CONST int32 () 0
8 INDEX int32.ptr(8) (0,7)
9 STORE void (8,6)
10 CONST int32 () 4
11 INDEX int32.ptr(8) (0,10)
12 ADD int32.vec(4) (6,3)
13 STORE void (11,12)
"""
  from plugrad.builtin.interpreter import check_program
  h = PythonAllocator("PYTHON").alloc(32)
  PythonProgram(check_program(text))(h)
  np.testing.assert_array_equal(h.view(np.int32), [5, -6, 7, -8, 10, -12, 14, -16])


# ---- the compiler: what it rejects

def _compile(text: str) -> bytes: return PythonCompiler().compile_cached(text, "bad")


_HEAD = "# kernel 'bad'\n# target PYTHON\n"


@pytest.mark.parametrize("body, match", [
  ("0 FOO int32 () 1\n", r"line 3: unknown op 'FOO'"),
  ("0 CONST int33 () 1\n", r"line 3: unknown name 'int33'"),
  ("0 CONST int32 (1,) 1\n", r"line 3: sources must be a tuple of indices of earlier uops"),
  ("1 CONST int32 () 1\n", r"line 3: expected uop index 0"),
  ("0 CONST int32 () __import__('os')\n", r"line 3: unexpected"),
  ("0 CONST int32 () 1.5\n", r"line 3: CONST 1.5 does not fit dtypes.int32"),
  ("0 CONST int32 () 16\n1 RANGE int32 (0,) (0, AxisType.LOOP)\n", r"line 4: this block is never closed"),
  ("0 CONST bool () True\n1 IF void (0,)\n2 CONST int32 () 4\n3 RANGE int32 (2,) (0, AxisType.LOOP)\n4 ENDIF void (1,)\n",
   r"line 7: ENDIF must close the innermost open block"),
  ("0 CONST int32 () 4\n1 RANGE int32 (0,) (0, AxisType.LOOP)\n2 ADD int32 (1,1)\n3 ENDRANGE void (1,)\n4 MUL int32 (2,2)\n",
   r"line 7: uses uop #2, which was defined inside a RANGE block that has been closed"),
  ("0 CUSTOM int32 () 'foo()'\n", r"CUSTOM holds device code \('foo\(\)'\) that the interpreter cannot run"),
  ("0 DEFINE_LOCAL float32.ptr(20000,AddrSpace.LOCAL) () 'big'\n", r"80000 bytes of local memory exceed the 49152 of PYTHON"),
  ("0 CONST float32 () 1.0\n1 ADD float32 (0,0)\n2 IDIV float32 (1,1)\n", r"line 5: IDIV needs an integer dtype"),
  ("0 DEFINE_GLOBAL float32.ptr(4) () 0\n1 DEFINE_GLOBAL float32.ptr(4) () 0\n", r"two DEFINE_GLOBALs use slot 0"),
])
def test_compile_errors_name_the_line(body: str, match: str):
  with pytest.raises(CompileError, match=match) as e: _compile(_HEAD + body)
  assert "kernel 'bad' failed to compile (PythonCompiler)" in str(e.value) and "source near line" in str(e.value)


def test_missing_header_and_target_capabilities():
  with pytest.raises(CompileError, match="missing the '# kernel <name>' header"): _compile("0 CONST int32 () 1\n")
  with pytest.raises(CompileError, match="unknown target 'VULKAN'"): _compile("# kernel 'k'\n# target VULKAN\n")
  with pytest.raises(CompileError, match="target METAL has no dtypes.float64"): _compile("# kernel 'k'\n# target METAL\n0 CONST float64 () 1.0\n")
  assert _compile("# kernel 'k'\n# target METAL\n0 CONST float16 () 1.0\n")


def test_compiler_is_a_real_compiler():
  assert isinstance(PythonCompiler(), Compiler) and PythonCompiler.cache_key
  text = _HEAD + "0 CONST int32 () 1\n"
  assert PythonCompiler().compile(text) == text.encode()


# ---- the renderer

def test_render_round_trips_every_kind_of_arg():
  buf = glob(0, dtypes.float32, -1)
  loc = UOp(Ops.DEFINE_LOCAL, dtypes.half.ptr(8, AddrSpace.LOCAL), (), "it's a b")
  var = UOp.variable("n'x", -3, 9, dtypes.int64)
  consts = [UOp.const(dtypes.float32, v) for v in (math.inf, -math.inf, math.nan, -0.0, 1e-300 * 0 + 5e-324 * 0 + 0.1)] + \
           [UOp.const(dtypes.int64, -2**63), UOp.const(dtypes.bool, True), UOp.const(dtypes.uint64, 2**64 - 1)]
  r = UOp.range(UOp.const(dtypes.int64, 4), 3, AxisType.REDUCE, dtypes.int64)
  vec = consts[0].vectorize(consts[1], consts[2])
  uops = lin(buf, loc, var, *consts, r, vec, vec.gep((2, 0)), UOp(Ops.CUSTOM, dtypes.int32, (), "x {0} | 'y'"), end(r))
  text = render_text("k 'q'", "PYTHON", tuple(uops))
  parsed = parse_text(text)
  assert parsed.name == "k 'q'" and parsed.target == "PYTHON" and len(parsed.lines) == len(uops)
  index = {u: i for i, u in enumerate(uops)}
  for u, l in zip(uops, parsed.lines):
    assert (l.op, l.dtype, l.src) == (u.op, u.dtype, tuple(index[s] for s in u.src))
    assert _same(l.arg, u.arg) or (isinstance(u.arg, tuple) and all(_same(a, b) for a, b in zip(l.arg, u.arg))), (l, u)
  assert math.copysign(1, parsed.lines[uops.index(consts[3])].arg) == -1  # -0.0 survives


def test_render_is_readable_and_checks_its_input():
  out = glob(0, dtypes.float32, 4)
  r = loop(4)
  p = make_program(UOp(Ops.SINK, dtypes.void, (), KernelInfo("E_4")), "PYTHON").with_linear(lin(out, r, out.index(r).store(r.cast(dtypes.float32)),
                                                                                            end(r)))
  text = PythonRenderer("PYTHON", "").render(p)
  assert text.splitlines()[:2] == ["# kernel 'E_4'", "# target PYTHON"]
  assert "RANGE          int32" in text and "(0, AxisType.LOOP)" in text and "CAST           float32" in text
  with pytest.raises(RendererError, match="render needs a PROGRAM UOp at the linear stage, got a SINK UOp"):
    PythonRenderer("PYTHON", "").render(p.ast)
  with pytest.raises(RendererError, match="cannot write an arg of type KernelInfo"):
    render_text("k", "PYTHON", (UOp(Ops.CONST, i32, (), KernelInfo()),))


def test_emulate_describes_the_emulated_device(monkeypatch: pytest.MonkeyPatch):
  plain = PythonRenderer("PYTHON", "")
  assert plain.emulate is None and plain.tensor_cores == () and plain.has_local and plain.has_shared
  assert plain.capabilities == {"float16", "bfloat16", "float64", "int64", "locals", "shared"}
  monkeypatch.setenv("EMULATE", "METAL")
  metal = PythonRenderer("PYTHON")
  assert metal.emulate == "METAL" and metal.shared_max == 32768 and "float64" not in metal.capabilities and "tensor_cores" in metal.capabilities
  assert {tc.device for tc in metal.tensor_cores} == {"METAL"} and metal.local_max == (1024, 1024, 1024)
  monkeypatch.setenv("EMULATE", "cuda")
  assert PythonRenderer("PYTHON").emulate == "CUDA"
  monkeypatch.setenv("EMULATE", "TPU")
  with pytest.raises(RendererError, match="EMULATE='TPU' is not an emulated device; choose one of"): PythonRenderer("PYTHON")


def test_the_emulated_targets_limits_are_enforced():
  out = glob(0, dtypes.int32, 1)
  l = special("lidx0", 1)
  lib = load(lin(out, l, out.index(l).store(l)), emulate="AMD")
  h = PythonAllocator("PYTHON").alloc(4)
  with pytest.raises(LaunchError, match=r"exceeds the limits of AMD"): lib(h, local_size=(1, 1, 1025))
  lib(h)


# ---- the allocator

def test_allocator_host_memory_views_and_zero_copy():
  alloc = PythonAllocator("PYTHON")
  assert alloc.supports_views and alloc.supports_memoryview
  h = alloc.alloc(16)
  alloc.copyin(h, memoryview(np.arange(4, dtype=np.int32)).cast("B"))
  view = alloc.offset(h, 4, 8)
  mv = alloc.as_memoryview(view, 8)
  np.frombuffer(mv, np.int32)[:] = [10, 20]  # writes through the view land in the buffer
  out = np.zeros(4, np.int32)
  alloc.copyout(memoryview(out).cast("B"), h)
  np.testing.assert_array_equal(out, [0, 10, 20, 3])
  with pytest.raises(ValueError, match="does not fit a buffer of 16 bytes"): alloc.offset(h, 12, 8)
  with pytest.raises(ValueError, match="copyin of 4 bytes into a buffer of 16"): alloc.copyin(h, memoryview(b"abcd"))
  alloc.free(h, 16)
  assert alloc.alloc(16) is h  # the base class keeps freed buffers for reuse


# ---- through the device registry

def test_runs_through_device_python():
  from plugrad.device.buffer import Buffer
  from plugrad.device.registry import Device
  from plugrad.device.runner import ProgramRunner
  dev = Device["PYTHON"]
  assert isinstance(dev.renderer, PythonRenderer) and isinstance(dev.compiler, PythonCompiler) and isinstance(dev.runtime, PythonRuntime)
  assert isinstance(dev.allocator, PythonAllocator) and dev.runtime.capabilities == {"run", "timing"}
  p = make_program(UOp(Ops.SINK, dtypes.void, (), KernelInfo("wg_sum")), dev.name).with_linear(workgroup_sum())
  runner = ProgramRunner(p)  # renders with the device's renderer, compiles through the cache, loads
  a = np.arange(64, dtype=np.float32)
  out, x = Buffer(dev.name, 4, dtypes.float32), Buffer(dev.name, 64, dtypes.float32).copyin(a.data)
  assert isinstance(runner([out, x], {}, wait=True), float)
  np.testing.assert_array_equal(out.numpy(), a.reshape(4, 16).sum(1))
