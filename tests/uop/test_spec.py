"""The spec (plugrad.uop.spec): one accepted and several rejected graphs per stage; every rejection names its rule."""
import pickle

import pytest

from plugrad.dtype import AddrSpace, dtypes
from plugrad.helpers import Context
from plugrad.uop import AxisType, KernelInfo, Ops, UOp, Variable
from plugrad.uop.spec import STAGES, SpecError, check, maybe_check, short

f32, i32, void = dtypes.float32, dtypes.int32, dtypes.void


def glob(slot: int, dt=f32, size: int = 16) -> UOp: return UOp(Ops.DEFINE_GLOBAL, dt.ptr(size), (), slot)
def const(dt, v) -> UOp: return UOp(Ops.CONST, dt, (), v)


def elementwise_ast() -> UOp:
  out, a, b = glob(0), glob(1), glob(2)
  r = UOp.range(16, 0, AxisType.GLOBAL)
  st = out.index(r).store(a.index(r).load() + b.index(r).load())
  return UOp(Ops.END, void, (st, r)).sink(arg=KernelInfo("E_16"))


def reduce_ast() -> UOp:
  out, a = glob(0, size=4), glob(1, size=32)
  r0, r1 = UOp.range(4, 0, AxisType.GLOBAL), UOp.range(8, 1, AxisType.REDUCE)
  red = UOp(Ops.REDUCE, f32, (a.index(r0 * 8 + r1).load(), r1), Ops.ADD)
  return UOp(Ops.END, void, (out.index(r0).store(red), r0)).sink()


def elementwise_linear() -> tuple[UOp, ...]:
  out, a, b = glob(0), glob(1), glob(2)
  c16 = const(i32, 16)
  r = UOp.range(c16, 0, AxisType.LOOP, i32)
  ia, ib, io = a.index(r), b.index(r), out.index(r)
  la, lb = ia.load(), ib.load()
  add = la + lb
  st = io.store(add)
  return (out, a, b, c16, r, ia, la, ib, lb, add, io, st, UOp(Ops.ENDRANGE, void, (r,)))


def gated_special_linear() -> tuple[UOp, ...]:
  out, a = glob(0, size=-1), glob(1, size=-1)
  n = Variable("n", 1, 1024, i32)
  gsz = (n + 31) // 32
  g, l = UOp.special(gsz, "gidx0", i32), UOp.special(32, "lidx0", i32)
  i = g * 32 + l
  valid = i < n
  ld = a.index(i, valid).load()
  st = out.index(i, valid).store(ld * 2.0)
  body = st.sink()
  return tuple(u for u in body.toposort if u is not body)


def linear(uops) -> UOp: return UOp(Ops.LINEAR, void, tuple(uops))


def rejects(stage: str, root: UOp, *needles: str) -> SpecError:
  with pytest.raises(SpecError) as e: check(stage, root)
  msg = str(e.value)
  assert msg.startswith(f"{stage} spec: ")
  for n in needles: assert n in msg, f"{n!r} not in {msg!r}"
  return e.value


def kernel_with(u: UOp) -> UOp:
  """A kernel that also holds `u`: its nodes are checked before the SINK (sources first), so `u` is the first violation."""
  return glob(0, size=1).index(const(dtypes.index, 0)).store(const(f32, 0.0)).sink(u)


# ---- the tensor graph

def test_tensor_graph_accepted():
  buf = UOp(Ops.BUFFER, f32, (UOp(Ops.UNIQUE, void, (), 0), UOp(Ops.DEVICE, void, (), "CPU")), 12)
  x = UOp(Ops.RESHAPE, f32, (buf,), (3, 4))
  y = UOp(Ops.PERMUTE, f32, (x,), (1, 0))
  z = UOp(Ops.PAD, f32, (y,), ((0, 1), (1, 1)))
  w = UOp(Ops.SHRINK, f32, (z,), ((0, 4), (1, 3)))
  s = UOp(Ops.REDUCE_AXIS, f32, (UOp(Ops.FLIP, f32, (w,), (True, False)),), (Ops.ADD, (1,)))
  e = UOp(Ops.EXPAND, f32, (s,), (4, Variable("n", 1, 8)))
  out = (e + UOp(Ops.CONST, f32, (UOp(Ops.DEVICE, void, (), "CPU"),), 1.0)).cast(dtypes.float16)
  check("tensor", UOp(Ops.CONTIGUOUS, dtypes.float16, (out,)).sink())


@pytest.mark.parametrize("arg, rule", [((0, 0), "PERMUTE arg must be a permutation"), ((0, 2), "PERMUTE arg must be a permutation"),
                                       (5, "PERMUTE arg must be a tuple")])
def test_tensor_bad_permute(arg, rule):
  buf = UOp(Ops.BUFFER, f32, (UOp(Ops.UNIQUE, void, (), 0), UOp(Ops.DEVICE, void, (), "CPU")), 4)
  rejects("tensor", UOp(Ops.PERMUTE, f32, (UOp(Ops.RESHAPE, f32, (buf,), (2, 2)),), arg).sink(), rule)


@pytest.mark.parametrize("op, arg, rule", [
  (Ops.RESHAPE, (2, -1), "RESHAPE arg must be a tuple of sizes"),
  (Ops.EXPAND, (2, 1.5), "EXPAND arg must be a tuple of sizes"),
  (Ops.PAD, ((0, -1),), "PAD arg must be a tuple of (before, after) pairs"),
  (Ops.SHRINK, ((3, 1),), "SHRINK arg must be a tuple of (start, end) pairs"),
  (Ops.FLIP, (1, 0), "FLIP arg must be a tuple of bools"),
  (Ops.REDUCE_AXIS, (Ops.SUB, (0,)), "REDUCE_AXIS arg must be (Ops.ADD|MUL|MAX, tuple of axis ints)"),
  (Ops.REDUCE_AXIS, (Ops.ADD, 0), "REDUCE_AXIS arg must be"),
])
def test_tensor_bad_args(op, arg, rule):
  buf = UOp(Ops.BUFFER, f32, (UOp(Ops.UNIQUE, void, (), 0), UOp(Ops.DEVICE, void, (), "CPU")), 4)
  rejects("tensor", UOp(op, f32, (buf,), arg).sink(), rule, op.name)


def test_tensor_rejects_kernel_ops_and_bad_buffers():
  dev = UOp(Ops.DEVICE, void, (), "CPU")
  rejects("tensor", glob(0).index(const(dtypes.index, 0)).load().sink(), "is not allowed at the tensor stage")
  rejects("tensor", UOp(Ops.BUFFER, f32, (dev,), 4).sink(), "BUFFER needs sources (UNIQUE, DEVICE)")
  rejects("tensor", UOp(Ops.BUFFER, f32, (UOp(Ops.UNIQUE, void, (), 0), dev), "4").sink(), "element count")
  rejects("tensor", UOp(Ops.DEVICE, void, (), 3).sink(), "DEVICE arg must be a device name")
  rejects("tensor", UOp(Ops.COPY, f32, (const(f32, 1.0),), None).sink(), "COPY needs sources (value, DEVICE)")


# ---- kernel ASTs

def test_kernel_accepted():
  check("kernel", elementwise_ast())
  check("kernel", reduce_ast())


@pytest.mark.parametrize("make, rule", [
  # arity
  (lambda: UOp(Ops.ADD, f32, (const(f32, 1.0), const(f32, 2.0), const(f32, 3.0))), "ADD needs 2 sources, got 3"),
  (lambda: UOp(Ops.SQRT, f32, ()), "SQRT needs 1 source, got 0"),
  (lambda: UOp(Ops.WHERE, f32, (const(dtypes.bool, True), const(f32, 1.0))), "WHERE needs 3 sources, got 2"),
  (lambda: UOp(Ops.CAST, f32, (const(i32, 1), const(i32, 2))), "CAST needs 1 value source"),
  # dtypes
  (lambda: UOp(Ops.ADD, f32, (const(f32, 1.0), const(i32, 2))), "ADD needs 2 sources of the result dtype"),
  (lambda: UOp(Ops.MULACC, f32, (const(f32, 1.0), const(f32, 2.0), const(dtypes.float16, 1.0))), "MULACC needs 3 sources of the result dtype"),
  (lambda: UOp(Ops.CMPLT, f32, (const(f32, 1.0), const(f32, 2.0))), "CMPLT needs 2 sources of one dtype and a bool result"),
  (lambda: UOp(Ops.CMPNE, dtypes.bool, (const(f32, 1.0), const(i32, 2))), "CMPNE needs 2 sources of one dtype"),
  (lambda: UOp(Ops.WHERE, f32, (const(f32, 1.0), const(f32, 1.0), const(f32, 2.0))), "WHERE needs a bool condition"),
  (lambda: UOp(Ops.WHERE, f32, (const(dtypes.bool, True), const(i32, 1), const(f32, 2.0))), "WHERE needs two values of the result dtype"),
  (lambda: UOp(Ops.SHL, f32, (const(f32, 1.0), const(i32, 2))), "SHL needs an integer value of the result dtype"),
  (lambda: UOp(Ops.SHR, i32, (const(i32, 1), const(f32, 2.0))), "integer shift"),
  (lambda: UOp(Ops.IDIV, f32, (const(f32, 1.0), const(f32, 2.0))), "IDIV needs an integer dtype"),
  (lambda: UOp(Ops.FDIV, i32, (const(i32, 1), const(i32, 2))), "FDIV needs a float dtype"),
  (lambda: UOp(Ops.XOR, f32, (const(f32, 1.0), const(f32, 2.0))), "XOR needs an integer or bool dtype"),
  (lambda: UOp(Ops.THREEFRY, i32, (const(i32, 1), const(i32, 2))), "THREEFRY needs uint32"),
  (lambda: UOp(Ops.BITCAST, dtypes.float64, (const(f32, 1.0),)), "BITCAST needs a source of the same byte size (4 bytes → 8)"),
  (lambda: UOp(Ops.BITCAST, dtypes.int8, (const(dtypes.bool, True),)), "BITCAST cannot involve bool"),
  (lambda: UOp(Ops.CAST, f32.vec(2), (const(i32, 1),)), "same vector width"),
  # arg types
  (lambda: const(i32, 1.5), "CONST arg must be a Python int that fits dtypes.int32, got float 1.5"),
  (lambda: const(i32, True), "CONST arg must be a Python int"),
  (lambda: const(dtypes.int8, 300), "that fits dtypes.int8"),
  # an odd value: the hash-cons key of 1 equals that of 1.0, so a live CONST 1.0 would be returned instead
  (lambda: const(f32, 987654321), "CONST arg must be a Python float"),
  (lambda: const(dtypes.bool, 1), "CONST arg must be a Python bool"),
  (lambda: UOp(Ops.RANGE, dtypes.index, (const(dtypes.index, 4),), (0, "loop")), "RANGE arg must be (axis_id: int, AxisType)"),
  (lambda: UOp(Ops.RANGE, dtypes.index, (const(i32, 4),), (0, AxisType.LOOP)), "RANGE needs a scalar integer dtype and 1 bound of that dtype"),
  (lambda: UOp(Ops.DEFINE_VAR, dtypes.index, (), ("n", 5, 1)), "DEFINE_VAR arg must be (name: str, min: int, max: int)"),
  (lambda: UOp(Ops.DEFINE_VAR, f32, (), ("n", 1, 5)), "DEFINE_VAR needs a scalar integer dtype"),
  (lambda: UOp(Ops.SPECIAL, dtypes.index, (const(dtypes.index, 4),), "gidx3"), "SPECIAL arg must be 'gidxN' or 'lidxN'"),
  (lambda: UOp(Ops.SPECIAL, dtypes.index, (const(dtypes.index, 4),), 0), "SPECIAL arg must be"),
  (lambda: UOp(Ops.GEP, f32, (UOp.const(f32.vec(2), (1.0, 2.0)),), (2,)), "GEP arg must be a non-empty tuple of lane indices below 2"),
  (lambda: UOp(Ops.VECTORIZE, f32.vec(3), (const(f32, 1.0), const(f32, 2.0))), "VECTORIZE of dtypes.float32.vec(3) needs 3 sources"),
  (lambda: UOp(Ops.REDUCE, f32, (const(f32, 1.0), UOp.range(4, 0, AxisType.REDUCE)), Ops.SUB), "REDUCE arg must be Ops.ADD, Ops.MUL or Ops.MAX"),
  (lambda: UOp(Ops.REDUCE, f32, (const(f32, 1.0), const(dtypes.index, 4)), Ops.ADD), "REDUCE sources after the value must be RANGEs"),
  # not allowed at the kernel stage
  (lambda: UOp(Ops.RESHAPE, f32, (const(f32, 1.0),), (1,)), "RESHAPE is not allowed at the kernel stage"),
  (lambda: UOp(Ops.REDUCE_AXIS, f32, (const(f32, 1.0),), (Ops.ADD, (0,))), "REDUCE_AXIS is not allowed at the kernel stage"),
])
def test_kernel_rejects(make, rule):
  err = rejects("kernel", kernel_with(make()), rule)
  assert isinstance(err, ValueError) and not isinstance(err, AssertionError)
  assert err.stage == "kernel" and err.rule in str(err)


def test_kernel_rejects_bad_memory_ops():
  idx = const(dtypes.index, 0)
  rejects("kernel", UOp(Ops.INDEX, f32.ptr(), (const(f32, 1.0), idx)).store(const(f32, 1.0)).sink(), "INDEX needs sources (pointer, index")
  rejects("kernel", UOp(Ops.DEFINE_GLOBAL, f32, (), 0).sink(), "DEFINE_GLOBAL needs a GLOBAL pointer dtype")
  rejects("kernel", glob(0).index(idx).store(const(f32, 1.0)).sink(UOp(Ops.DEFINE_GLOBAL, f32.ptr(), (), "1")),
          "DEFINE_GLOBAL arg must be its buffer slot")
  rejects("kernel", UOp(Ops.DEFINE_GLOBAL, f32.ptr(4, AddrSpace.LOCAL), (), 0).index(idx).store(const(f32, 1.0)).sink(),
          "DEFINE_GLOBAL needs a GLOBAL pointer dtype")
  rejects("kernel", glob(0).index(idx).store(const(i32, 1)).sink(), "STORE value must have the pointer's element dtype")
  rejects("kernel", glob(0).index(const(f32, 0.0)).store(const(f32, 1.0)).sink(), "INDEX needs an integer index")
  rejects("kernel", glob(0).index(idx, const(i32, 1)).store(const(f32, 1.0)).sink(), "INDEX gate must be bool")
  rejects("kernel", glob(0).index(idx).store(UOp(Ops.LOAD, i32, (glob(1).index(idx),))).sink(), "LOAD must have the pointer's element dtype")
  two = glob(0).index(idx).store(const(f32, 1.0)).sink(glob(0, dtypes.int32).index(idx).store(const(i32, 1)))
  rejects("kernel", two, "two DEFINE_GLOBALs share slot 0")
  # an atomic add (STORE arg Ops.ADD) is one non-bool scalar into global or local memory
  add = glob(0).index(idx)
  check("kernel", UOp(Ops.STORE, void, (add, const(f32, 1.0)), Ops.ADD).sink())
  rejects("kernel", UOp(Ops.STORE, void, (add, const(f32, 1.0)), Ops.MUL).sink(), "STORE arg must be None or Ops.ADD")
  rejects("kernel", UOp(Ops.STORE, void, (add.cast(f32.vec(2).ptr(16)), UOp.const(f32.vec(2), (1.0, 2.0))), Ops.ADD).sink(),
          "an atomic STORE (arg Ops.ADD) adds one non-bool scalar")
  reg = UOp(Ops.DEFINE_REG, f32.ptr(1, AddrSpace.REG), (), 0).index(idx)
  rejects("kernel", UOp(Ops.STORE, void, (reg, const(f32, 1.0)), Ops.ADD).sink(), "into global or local memory")
  r = UOp.range(4, 0)
  rejects("kernel", UOp(Ops.END, void, (glob(0).index(r).store(const(f32, 1.0)), const(dtypes.index, 1))).sink(),
          "END sources after the effect must be RANGEs")


def test_kernel_root_and_sink():
  rejects("kernel", const(f32, 1.0), "a kernel AST must be rooted at a SINK")
  rejects("kernel", elementwise_ast().replace(arg="E_16"), "a kernel SINK arg must be a KernelInfo")
  rejects("kernel", const(f32, 1.0).sink(), "a kernel SINK takes effects")


# ---- linear programs

def test_linear_accepted():
  check("linear", linear(elementwise_linear()))
  check("linear", linear(gated_special_linear()))


def test_linear_order():
  uops = elementwise_linear()
  e = rejects("linear", linear((uops[1], uops[0]) + uops[2:5] + (uops[6], uops[5]) + uops[7:]), "uses #6 (INDEX), which comes after it")
  assert e.uop.op is Ops.LOAD
  rejects("linear", linear(uops[:5] + uops[6:]), "uses a source (INDEX) that is not in the program")
  rejects("linear", linear(uops + (uops[3],)), "appears twice")


def test_linear_nesting():
  uops = elementwise_linear()
  rejects("linear", linear(uops[:-1]), "RANGE #4 is never closed")
  r2 = UOp.range(const(i32, 16), 1, AxisType.LOOP, i32)
  # RANGE r, RANGE r2, ENDRANGE r (crossing), ENDRANGE r2
  crossed = uops[:5] + (r2,) + uops[5:] + (UOp(Ops.ENDRANGE, void, (r2,)),)
  rejects("linear", linear(crossed), "ENDRANGE #13 does not close the innermost open block (the innermost open block is RANGE #5)")
  late = uops + (UOp(Ops.ADD, i32, (uops[4], uops[3])),)
  rejects("linear", linear(late), "uses RANGE #4 after its ENDRANGE")
  cond = const(dtypes.bool, True)
  iff = UOp(Ops.IF, void, (cond,))
  rejects("linear", linear(uops[:5] + (cond, iff) + uops[5:]), "ENDRANGE #14 does not close the innermost open block")
  check("linear", linear(uops[:5] + (cond, iff) + uops[5:-1] + (UOp(Ops.ENDIF, void, (iff,)), uops[-1])))
  rejects("linear", linear((cond, UOp(Ops.ENDIF, void, (iff,)))), "not in the program")


def test_linear_rejects_index_and_kernel_ops():
  r = UOp.range(16, 0)  # dtype index: must be lowered before linearizing
  rejects("linear", linear((r.src[0], r, UOp(Ops.ENDRANGE, void, (r,)))), "has dtype index")
  v = const(f32, 1.0)
  rejects("linear", linear((v, UOp(Ops.REDUCE, f32, (v,), Ops.ADD))), "REDUCE is not allowed at the linear stage")
  rejects("linear", linear((glob(0),)).sink(), "a linear program is a LINEAR")
  rejects("linear", linear((v, UOp(Ops.SIN, f32, (v, v)))), "SIN needs 1 source, got 2")


# ---- PROGRAM

def program(*parts: UOp) -> UOp: return UOp(Ops.PROGRAM, void, parts)


def test_program_stages_accepted():
  ast, dev = elementwise_ast(), UOp(Ops.DEVICE, void, (), "CUDA:1")
  lin = linear(elementwise_linear())
  for parts in [(ast, dev), (ast, dev, lin), (ast, dev, lin, UOp(Ops.SOURCE, void, (), "void k() {}")),
                (ast, dev, lin, UOp(Ops.SOURCE, void, (), "void k() {}"), UOp(Ops.BINARY, void, (), b"\x7fELF"))]:
    check("program", program(*parts))


def test_program_rejects():
  ast, dev, lin = elementwise_ast(), UOp(Ops.DEVICE, void, (), "CPU"), linear(elementwise_linear())
  src = UOp(Ops.SOURCE, void, (), "void k() {}")
  rejects("program", program(ast, dev, src), "needs sources SINK, DEVICE[, LINEAR[, SOURCE[, BINARY]]] in this order")
  rejects("program", program(ast), "in this order")
  rejects("program", program(ast, UOp(Ops.DEVICE, void, (), "cuda")), "canonical device string like 'CPU' or 'CUDA:1', got 'cuda'")
  rejects("program", program(ast, UOp(Ops.DEVICE, void, (), 0)), "DEVICE needs a str arg")
  rejects("program", program(ast, dev, lin, UOp(Ops.SOURCE, void, (), b"code")), "SOURCE needs a str arg")
  rejects("program", program(ast, dev, lin, src, UOp(Ops.BINARY, void, (), "code")), "BINARY needs a bytes arg")
  rejects("program", program(ast.replace(arg=None), dev), "the SINK of a PROGRAM needs a KernelInfo arg")
  # the parts are checked with their own stage's rules
  bad_lin = linear(elementwise_linear()[:-1])
  with pytest.raises(SpecError, match="never closed") as e: check("program", program(ast, dev, bad_lin))
  assert e.value.stage == "linear"
  bad_ast = UOp(Ops.END, void, (glob(0).index(UOp.range(4, 0)).store(const(i32, 1)), UOp.range(4, 0))).sink(arg=KernelInfo())
  with pytest.raises(SpecError, match="STORE value") as e: check("program", program(bad_ast, dev))
  assert e.value.stage == "kernel"


# ---- the API

def test_error_form_and_pickle():
  bad = UOp(Ops.ADD, f32, (const(f32, 1.0), const(i32, 2)))
  e = rejects("kernel", kernel_with(bad), "ADD dtypes.float32 arg=None src=(CONST, CONST)")
  assert e.uop is bad and "result dtype" in e.rule
  assert short(bad) == "ADD dtypes.float32 arg=None src=(CONST, CONST)"
  e2 = pickle.loads(pickle.dumps(e))
  assert isinstance(e2, SpecError) and str(e2) == str(e) and e2.uop is bad


def test_maybe_check_follows_the_flag():
  bad = kernel_with(UOp(Ops.ADD, f32, (const(f32, 1.0),)))
  with Context(SPEC=0): maybe_check("kernel", bad)
  with Context(SPEC=1), pytest.raises(SpecError, match="ADD needs 2 sources, got 1"): maybe_check("kernel", bad)


def test_check_api_errors():
  assert STAGES == ("tensor", "kernel", "linear", "program")
  with pytest.raises(ValueError, match="unknown spec stage 'lowered'"): check("lowered", elementwise_ast())
  with pytest.raises(TypeError, match="needs a UOp"): check("kernel", "SINK")  # type: ignore[arg-type]


def test_check_is_linear_on_a_long_program():
  # a long chain of ALU ops and a deep kernel: the check walks each once (and must not recurse)
  x = const(f32, 1.0)
  chain = [x]
  for _ in range(20000): chain.append(chain[-1] + x)
  st = glob(0, size=1).index(const(dtypes.index, 0)).store(chain[-1])
  check("kernel", st.sink())
  i0 = const(i32, 0)
  check("linear", linear((glob(0, size=1), i0, *chain, glob(0, size=1).index(i0), glob(0, size=1).index(i0).store(chain[-1]))))


def test_iota_in_the_tensor_graph():
  dev = UOp(Ops.DEVICE, dtypes.void, (), "PYTHON")
  check("tensor", UOp(Ops.IOTA, dtypes.int32, (dev,), 5))
  with pytest.raises(SpecError, match="IOTA needs an integer dtype"): check("tensor", UOp(Ops.IOTA, dtypes.float32, (dev,), 5))
  with pytest.raises(SpecError, match="IOTA needs one DEVICE"): check("tensor", UOp(Ops.IOTA, dtypes.int32, (), 5))
