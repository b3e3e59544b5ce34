"""The PROGRAM UOp (plugrad.uop.program): accessors at every stage, launch sizes, estimates, stage errors and pickling."""
import pickle

import pytest

from plugrad.dtype import AddrSpace, dtypes
from plugrad.helpers import Context
from plugrad.uop import AxisType, KernelInfo, Ops, PatternMatcher, UOp, UPat, Variable, graph_rewrite
from plugrad.uop.program import Estimates, ProgramError, ProgramStageError, ProgramUOp, make_program
from plugrad.uop.spec import SpecError

f32, i32, void = dtypes.float32, dtypes.int32, dtypes.void


def glob(slot: int, size: int = 16, dt=f32) -> UOp: return UOp(Ops.DEFINE_GLOBAL, dt.ptr(size), (), slot)
def const(dt, v) -> UOp: return UOp(Ops.CONST, dt, (), v)
def endrange(r: UOp) -> UOp: return UOp(Ops.ENDRANGE, void, (r,))


def elementwise() -> tuple[UOp, tuple[UOp, ...]]:
  """c[i] = a[i] + b[i] for i < 16: the AST and its linear uops."""
  out, a, b = glob(0), glob(1), glob(2)
  r = UOp.range(16, 0, AxisType.GLOBAL)
  ast = UOp(Ops.END, void, (out.index(r).store(a.index(r).load() + b.index(r).load()), r)).sink(arg=KernelInfo("E_16", applied_opts=("UPCAST",)))
  c16 = const(i32, 16)
  lr = UOp.range(c16, 0, AxisType.LOOP, i32)
  ia, ib, io = a.index(lr), b.index(lr), out.index(lr)
  la, lb = ia.load(), ib.load()
  add = la + lb
  return ast, (out, a, b, c16, lr, ia, la, ib, lb, add, io, io.store(add), endrange(lr))


def reduction() -> tuple[UOp, tuple[UOp, ...]]:
  """out[i] = sum(a[i*8 + j] for j < 8), i < 4, with a DEFINE_REG accumulator."""
  out, a = glob(0, 4), glob(1, 32)
  r0, r1 = UOp.range(4, 0, AxisType.GLOBAL), UOp.range(8, 1, AxisType.REDUCE)
  ast = UOp(Ops.END, void, (out.index(r0).store(UOp(Ops.REDUCE, f32, (a.index(r0 * 8 + r1).load(), r1), Ops.ADD)), r0)).sink(arg=KernelInfo("r_4_8"))
  acc = UOp(Ops.DEFINE_REG, f32.ptr(1, AddrSpace.REG), (), 0)
  c0, c4, c8, zero = const(i32, 0), const(i32, 4), const(i32, 8), const(f32, 0.0)
  l0, l1 = UOp.range(c4, 0, AxisType.LOOP, i32), UOp.range(c8, 1, AxisType.REDUCE, i32)
  iacc = acc.index(c0)
  init = iacc.store(zero)
  mul = l0 * c8
  idx = mul + l1
  ia = a.index(idx)
  ld = ia.load()
  cur = iacc.load()
  s = cur + ld
  upd = iacc.store(s)
  end1 = endrange(l1)
  final = UOp(Ops.LOAD, f32, (iacc, end1))  # ordered after the loop by its END source
  io = out.index(l0)
  uops = (out, a, acc, c0, c4, c8, zero, l0, iacc, init, l1, mul, idx, ia, ld, cur, s, upd, end1, final, io, io.store(final), endrange(l0))
  return ast, uops


N = Variable("n", 1, 1024, i32)


def gated_gpu() -> tuple[UOp, tuple[UOp, ...]]:
  """out[i] = 2*a[i] for i = gidx0*32 + lidx0 < n, through a 32-float local buffer (symbolic size n)."""
  out, a = glob(0, -1), glob(1, -1)
  g, l = UOp.special((N + 31) // 32, "gidx0", i32), UOp.special(32, "lidx0", i32)
  i = g * 32 + l
  valid = i < N
  smem = UOp(Ops.DEFINE_LOCAL, f32.ptr(32, AddrSpace.LOCAL), (), "temp0")
  ld = a.index(i, valid).load()
  st_local = smem.index(l).store(ld)
  bar = UOp(Ops.BARRIER, void, (st_local,))
  ld_local = UOp(Ops.LOAD, f32, (smem.index(l), bar))
  st = out.index(i, valid).store(ld_local * 2.0)
  body = st.sink()
  uops = tuple(u for u in body.toposort if u is not body)
  ast = st.sink(arg=KernelInfo("E_n"))
  return ast, uops


def full(ast, uops, device="CPU") -> ProgramUOp:
  return make_program(ast, device).with_linear(uops).with_source("void E_16(float* c) {}").with_binary(b"\x7fELF\x00")


# ---- stages

def test_stages_and_parts():
  ast, uops = elementwise()
  p = make_program(ast, "CPU")
  assert isinstance(p, ProgramUOp) and p.op is Ops.PROGRAM
  assert (p.stage, p.name, p.device, p.ast, p.applied_opts) == ("ast", "E_16", "CPU", ast, ("UPCAST",))
  p1 = p.with_linear(uops)
  assert p1.stage == "linear" and p1.uops == uops and p1.ast is ast
  p2 = p1.with_source("void E_16() {}")
  assert p2.stage == "source" and p2.source == "void E_16() {}" and p2.uops == uops
  p3 = p2.with_binary(bytearray(b"\x00\x01"))
  assert p3.stage == "binary" and p3.binary == b"\x00\x01" and p3.source == "void E_16() {}" and p3.device == "CPU"
  assert full(ast, uops) is full(ast, uops)  # hash-consed: the same program is the same object


def test_stage_errors_name_the_stage():
  ast, uops = elementwise()
  p = make_program(ast, "CPU")
  with pytest.raises(ProgramStageError, match="program 'E_16' is at the 'ast' stage; source needs the 'source' stage"): _ = p.source
  with pytest.raises(ProgramStageError, match="at the 'ast' stage; uops needs the 'linear' stage"): _ = p.uops
  with pytest.raises(ProgramStageError, match="at the 'ast' stage; estimates needs the 'linear' stage"): _ = p.estimates
  with pytest.raises(ProgramStageError, match="at the 'ast' stage; adding SOURCE \\(the 'source' stage\\) needs the 'linear' stage"):
    p.with_source("x")
  with pytest.raises(ProgramStageError, match="at the 'ast' stage; adding BINARY"): p.with_binary(b"x")
  p1 = p.with_linear(uops)
  with pytest.raises(ProgramStageError, match="is at the 'linear' stage; binary needs the 'binary' stage"): _ = p1.binary
  with pytest.raises(ProgramStageError, match="at the 'linear' stage; adding LINEAR"): p1.with_linear(uops)
  with pytest.raises(ProgramStageError, match="at the 'binary' stage; adding SOURCE"): full(ast, uops).with_source("y")
  assert issubclass(ProgramStageError, ProgramError) and issubclass(ProgramError, ValueError)


def test_bad_input():
  ast, uops = elementwise()
  with pytest.raises(ProgramError, match="needs a kernel AST rooted at a SINK, got STORE"): make_program(ast.src[0].src[0], "CPU")
  with pytest.raises(ProgramError, match="needs a kernel AST rooted at a SINK, got str"): make_program("SINK", "CPU")  # type: ignore[arg-type]
  with pytest.raises(ProgramError, match="needs a KernelInfo arg, got 'E'"): make_program(ast.replace(arg="E"), "CPU")
  with pytest.raises(ProgramError, match="canonical device string like 'CPU' or 'CUDA:1', got 'cuda:1'"): make_program(ast, "cuda:1")
  with pytest.raises(ProgramError, match="got None"): make_program(ast, None)  # type: ignore[arg-type]
  p = make_program(ast, "CPU")
  with pytest.raises(TypeError, match="with_linear needs a sequence of UOps, got UOp"): p.with_linear(uops[0])  # type: ignore[arg-type]
  with pytest.raises(TypeError, match="with_source needs a str, got bytes"): p.with_linear(uops).with_source(b"x")  # type: ignore[arg-type]
  with pytest.raises(TypeError, match="with_binary needs bytes, got str"): p.with_linear(uops).with_source("x").with_binary("x")  # type: ignore
  # with SPEC on, an invalid stage is refused when it is built
  with Context(SPEC=1):
    with pytest.raises(SpecError, match="linear spec: RANGE #4 is never closed"): p.with_linear(uops[:-1])
    with pytest.raises(SpecError, match="kernel spec: a kernel SINK takes effects"): make_program(const(f32, 1.0).sink(), "CPU")


def test_sink_without_arg_gets_kernel_info():
  ast, _ = reduction()
  p = make_program(ast.replace(arg=None), "CPU")
  assert p.ast.arg == KernelInfo() and p.name == "kernel" and p.applied_opts == ()


def test_malformed_program_is_reported():
  ast, _ = elementwise()
  bad = UOp(Ops.PROGRAM, void, (ast, UOp(Ops.SOURCE, void, (), "x")))  # built by hand, not through the builders
  assert isinstance(bad, ProgramUOp)
  with pytest.raises(ProgramError, match=r"malformed PROGRAM: its sources are \(SINK, SOURCE\)"): _ = bad.stage
  with pytest.raises(ProgramError, match="malformed PROGRAM"): _ = bad.device


def test_with_device():
  ast, uops = elementwise()
  p = full(ast, uops)
  q = p.with_device("CUDA:1")
  assert isinstance(q, ProgramUOp) and q.device == "CUDA:1" and q.stage == "binary"
  assert (q.ast, q.uops, q.source, q.binary) == (p.ast, p.uops, p.source, p.binary) and p.device == "CPU"
  assert q.with_device("CPU") is p
  assert make_program(ast, "CPU").with_device("AMD").stage == "ast"
  with pytest.raises(ProgramError, match="got 'CUDA 1'"): p.with_device("CUDA 1")


# ---- derived values

def test_buffers_ins_outs_vars():
  ast, uops = elementwise()
  for p in (make_program(ast, "CPU"), make_program(ast, "CPU").with_linear(uops)):  # from the AST, then from the uops
    assert p.globals == (0, 1, 2) and p.ins == (1, 2) and p.outs == (0,) and p.vars == ()
    assert [b.arg for b in p.buffers] == [0, 1, 2] and all(b.op is Ops.DEFINE_GLOBAL for b in p.buffers)
    assert p.global_size == (1, 1, 1) and p.local_size == (1, 1, 1) and p.launch_dims() == ((1, 1, 1), (1, 1, 1))
  r_ast, r_uops = reduction()
  rp = make_program(r_ast, "CPU").with_linear(r_uops)
  assert rp.globals == (0, 1) and rp.ins == (1,) and rp.outs == (0,)  # the register accumulator is not a global
  # slots come sorted however the buffers are ordered in the program
  b2, b0 = glob(2), glob(0)
  i = const(i32, 0)
  st = b0.index(i).store(b2.index(i).load())
  p = make_program(st.sink(), "CPU").with_linear((b2, b0, i, b2.index(i), b2.index(i).load(), b0.index(i), st))
  assert p.globals == (0, 2) and p.ins == (2,) and p.outs == (0,)


def test_symbolic_launch_sizes():
  ast, uops = gated_gpu()
  p = make_program(ast, "CUDA").with_linear(uops)
  assert p.vars == (N,) and p.globals == (0, 1) and p.ins == (1,) and p.outs == (0,)
  n = Variable("n", 1, 1024)  # sizes are in the index domain, built like a user's shape expression
  assert p.global_size[0] is (n + 31) // 32 and p.global_size[1:] == (1, 1)
  assert p.local_size == (32, 1, 1)
  assert p.launch_dims({"n": 37}) == ((2, 1, 1), (32, 1, 1))
  assert p.launch_dims({N: 1024}) == ((32, 1, 1), (32, 1, 1))
  assert p.launch_dims({n: 1, "unused": 3}) == ((1, 1, 1), (32, 1, 1))
  with pytest.raises(ProgramError, match=r"the global size of 'E_n' needs a value for variable 'n' \(in \[1, 1024\]\)"): p.launch_dims()
  with pytest.raises(ProgramError, match="the value 2000 of variable 'n' is outside its range"): p.launch_dims({"n": 2000})
  with pytest.raises(TypeError, match="the value of variable 'n' must be an int"): p.launch_dims({"n": 3.0})  # type: ignore[dict-item]
  with pytest.raises(TypeError, match="var_vals keys must be variable names"): p.launch_dims({3: 1})  # type: ignore[dict-item]


def test_vars_sorted_by_name():
  b, m = Variable("b", 1, 8, i32), Variable("a", 1, 8, i32)
  g = UOp.special(b, "gidx0", i32)
  l = UOp.special(m, "lidx1", i32)
  st = glob(0, -1).index(g * 8 + l).store(const(f32, 1.0))
  uops = tuple(u for u in st.sink().toposort if u.op is not Ops.SINK)
  p = make_program(st.sink(), "CUDA").with_linear(uops)
  assert [v.arg[0] for v in p.vars] == ["a", "b"]
  assert p.launch_dims({"a": 3, "b": 5}) == ((5, 1, 1), (1, 3, 1))


# ---- estimates

def test_estimates_known_kernels():
  ast, uops = elementwise()
  # one ADD per element; three float buffers of 16 move 12 bytes per element
  assert make_program(ast, "CPU").with_linear(uops).estimates == Estimates(ops=16, lds=192, mem=192, local_bytes=0)
  r_ast, r_uops = reduction()
  # 32 ADDs on the data path (the address arithmetic l0*8 + l1 is not counted); 32 loads and 4 stores of 4 bytes
  assert make_program(r_ast, "CPU").with_linear(r_uops).estimates == Estimates(ops=32, lds=144, mem=144, local_bytes=0)


def test_estimates_symbolic():
  ast, uops = gated_gpu()
  est = make_program(ast, "CUDA").with_linear(uops).estimates
  assert isinstance(est.ops, UOp) and est.local_bytes == 128
  # n=37: 2 workgroups of 32 threads; one MUL each, 4+4 global bytes each, sizes unknown so mem is the traffic
  assert est.at({"n": 37}) == Estimates(ops=64, lds=512, mem=512, local_bytes=128)
  assert est.at({"n": 1024}) == Estimates(ops=1024, lds=8192, mem=8192, local_bytes=128)
  with pytest.raises(ProgramError, match="ops needs a value for variable 'n'"): est.at({})


def test_estimates_vectors_mulacc_wmma():
  a, out = glob(1, 8), glob(0, 4)
  c0 = const(i32, 0)
  v4 = f32.vec(4)
  ia = UOp(Ops.CAST, v4.ptr(2), (a.index(c0),))
  ld = ia.load()
  mac = UOp(Ops.MULACC, v4, (ld, ld, ld))
  w = UOp(Ops.WMMA, v4, (ld, ld, mac), ("WMMA_8_16_16_float_float", (8, 16, 16), "CUDA"))
  io = UOp(Ops.CAST, v4.ptr(1), (out.index(c0),))
  uops = (out, a, c0, a.index(c0), ia, ld, mac, w, out.index(c0), io, io.store(w))
  est = Estimates.from_uops(uops)
  # MULACC: 2 per lane × 4; WMMA 2*K per element of its 4-wide result in this thread (the warp's 32 threads share
  # the 2*8*16*16); a float4 load and a float4 store of 16 bytes; buffers of 8 and 4 floats
  assert est == Estimates(ops=8 + 2 * 16 * 4, lds=32, mem=48, local_bytes=0)
  assert make_program(io.store(w).sink(), "CUDA").with_linear(uops).estimates == est


def test_estimates_add():
  a, b = Estimates(1, 2, 3, 4), Estimates(10, 20, 30, 40)
  assert a + b == Estimates(11, 22, 33, 44) and a + Estimates() == a
  n = Variable("n", 1, 10)
  s = Estimates(n, 0, 1) + Estimates(3, n, 1)
  assert s.at({"n": 4}) == Estimates(7, 4, 2, 0)


def test_estimates_are_cached():
  ast, uops = elementwise()
  p = make_program(ast, "CPU").with_linear(uops)
  assert p.estimates is p.estimates and p.buffers is p.buffers


# ---- every PROGRAM is a ProgramUOp: built anywhere, rebuilt, unpickled

def test_pickle_round_trip():
  ast, uops = gated_gpu()
  p = make_program(ast, "CUDA:1").with_linear(uops).with_source("src")
  q = pickle.loads(pickle.dumps(p))
  assert q is p
  assert (q.stage, q.name, q.device, q.source, q.vars, q.launch_dims({"n": 64})) == ("source", "E_n", "CUDA:1", "src", (N,), ((2, 1, 1), (32, 1, 1)))


def test_rebuilt_by_graph_rewrite():
  ast, uops = elementwise()
  p = make_program(ast, "CPU").with_linear(uops)
  to_cuda = PatternMatcher([(UPat(Ops.DEVICE, name="d"), lambda d: d.replace(arg="CUDA") if d.arg == "CPU" else None)])
  q = graph_rewrite(p, to_cuda)
  assert isinstance(q, ProgramUOp) and q is not p and q.device == "CUDA" and q.uops == p.uops
  assert q is p.with_device("CUDA")
