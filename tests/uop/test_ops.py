import gc
import math
import pickle

import pytest

from plugrad.dtype import dtypes
from plugrad.uop import ops as ops_mod
from plugrad.uop.ops import KernelInfo, Ops, UOp, UOpError, Variable, exec_alu, uop_from_python


def c(v, dt=dtypes.int32): return UOp.const(dt, v)


class TestHashConsing:
  def test_equal_uops_are_identical(self):
    a = UOp(Ops.ADD, dtypes.int32, (c(1), c(2)))
    b = UOp(Ops.ADD, dtypes.int32, (c(1), c(2)))
    assert a is b
    assert UOp(Ops.ADD, dtypes.int32, (c(2), c(1))) is not a
    assert UOp(Ops.ADD, dtypes.int64, (c(1, dtypes.int64), c(2, dtypes.int64))) is not a

  def test_args_that_compare_equal_stay_apart(self):
    assert UOp.const(dtypes.float32, 0.0) is not UOp.const(dtypes.float32, -0.0)
    assert math.copysign(1, UOp.const(dtypes.float32, -0.0).arg) == -1
    assert UOp(Ops.NOOP, arg=1) is not UOp(Ops.NOOP, arg=True)
    assert UOp(Ops.CONST, dtypes.float32, (), 1) is not UOp(Ops.CONST, dtypes.float32, (), 1.0)
    assert UOp(Ops.NOOP, arg=(1, 2.0)) is UOp(Ops.NOOP, arg=(1, 2.0))
    # an all-int tuple (a movement op's shape) is its own key: it must stay apart from the tuples that compare equal
    assert UOp(Ops.NOOP, arg=(1, 2)) is UOp(Ops.NOOP, arg=(1, 2))
    assert len({UOp(Ops.NOOP, arg=a) for a in ((1, 2), (1, 2.0), (1, True, 2), (1, 1, 2), ((1, 2), 3), ((1, 2.0), 3))}) == 6
    assert UOp.const(dtypes.float32, math.nan) is UOp.const(dtypes.float32, float("nan"))

  def test_list_src_is_accepted_as_tuple(self):
    assert UOp(Ops.ADD, dtypes.int32, [c(1), c(2)]) is UOp(Ops.ADD, dtypes.int32, (c(1), c(2)))

  def test_immutable(self):
    u = c(3)
    with pytest.raises(AttributeError, match="immutable"): u.arg = 4  # type: ignore[misc]

  def test_cache_does_not_leak(self):
    gc.collect()
    before = len(ops_mod._ucache)
    def build(seed: int) -> UOp:
      x = Variable(f"leak{seed}", 0, 100)
      for i in range(200): x = x * (i + seed) + i
      return x
    graphs = [build(s) for s in range(5)]
    assert len(ops_mod._ucache) > before + 500
    del graphs
    gc.collect()
    assert len(ops_mod._ucache) <= before + 5

  def test_pickle_roundtrip_is_identity(self):
    g = (Variable("a", 0, 10) * 3 + 1).sink(arg=KernelInfo("k"))
    assert pickle.loads(pickle.dumps(g)) is g


class TestConstructionErrors:
  def test_unknown_op(self):
    with pytest.raises(UOpError, match="unknown op"): UOp("ADD", dtypes.int32)  # type: ignore[arg-type]

  def test_bad_dtype(self):
    with pytest.raises(UOpError, match="dtype must be a DType"): UOp(Ops.ADD, "int32")  # type: ignore[arg-type]

  def test_bad_src(self):
    with pytest.raises(UOpError, match="every src must be a UOp"): UOp(Ops.ADD, dtypes.int32, (1, 2))  # type: ignore[arg-type]
    with pytest.raises(UOpError, match="src must be a tuple"): UOp(Ops.ADD, dtypes.int32, c(1))  # type: ignore[arg-type]

  def test_unhashable_arg(self):
    with pytest.raises(UOpError, match="hashable"): UOp(Ops.NOOP, arg=[1, 2])

  def test_variable_errors(self):
    with pytest.raises(UOpError, match="greater than max"): Variable("x", 5, 1)
    with pytest.raises(UOpError, match="out of the range"): Variable("x", 0, 3).bind(7)
    with pytest.raises(UOpError, match="only a Variable"): c(1).bind(1)

  def test_truth_value_is_an_error(self):
    with pytest.raises(TypeError, match="truth value"): bool(Variable("x", 0, 3) < 2)

  def test_const_errors(self):
    with pytest.raises(UOpError, match="pointer"): UOp.const(dtypes.float32.ptr(), 1)
    with pytest.raises(UOpError, match="needs 4 values"): UOp.const(dtypes.float32.vec(4), (1.0, 2.0))


class TestGraph:
  def test_toposort_order_and_deep_graph(self):
    x = Variable("x", 0, 10)
    y = x
    for i in range(20000): y = y + i  # deep chain: no recursion limit
    order = list(y.toposort)
    assert order[-1] is y
    pos = {u: i for i, u in enumerate(order)}
    assert all(pos[s] < pos[u] for u in order for s in u.src)

  def test_toposort_reuses_cached_orders_exactly(self):
    # a source's cached order is spliced in, not walked: the order must be the depth-first one all the same
    def dfs(root: UOp) -> list[UOp]:
      out: dict[UOp, None] = {}
      def visit(u: UOp) -> None:
        if u in out: return
        for s in u.src: visit(s)
        out[u] = None
      visit(root)
      return list(out)
    import random
    rng = random.Random(0)
    for trial in range(30):
      nodes = [Variable(f"t{trial}_{i}", 0, 10) for i in range(4)]
      for _ in range(60):
        a, b = rng.choice(nodes), rng.choice(nodes[-8:])
        nodes.append(UOp(rng.choice((Ops.ADD, Ops.MUL, Ops.MAX)), dtypes.index, (a, b) if rng.random() < 0.5 else (b, a)))
      cached = [u.toposort for u in rng.sample(nodes, 10)]  # some sub-orders cached, in random order
      root = UOp(Ops.SINK, dtypes.void, tuple(rng.sample(nodes[-20:], 5)))
      assert list(root.toposort) == dfs(root) and all(list(t) == dfs(next(reversed(t))) for t in cached)

  def test_replace_and_substitute(self):
    a, b = Variable("a", 0, 10), Variable("b", 0, 10)
    e = a * 2 + a
    assert e.replace(op=Ops.MUL).op is Ops.MUL
    assert e.replace() is e
    with pytest.raises(TypeError, match="unknown field"): e.replace(name="x")
    s = e.substitute({a: b})
    assert s is b * 2 + b
    assert e.substitute({}) is e

  def test_python_rendering_rebuilds_the_graph(self):
    a = Variable("a", 0, 10)
    g = UOp(Ops.SINK, dtypes.void, ((a * 4 + 1) % 3, UOp.const(dtypes.float32, math.inf), UOp.const(dtypes.float32, -0.0)),
            KernelInfo("k", ()))
    assert uop_from_python(g.to_python()) is g

  def test_repr_is_readable_and_shares(self):
    a = Variable("a", 0, 10)
    t = a * 3
    r = repr(t + t)
    assert "Ops.ADD" in r and "<x0>" in r and r.count("DEFINE_VAR") == 1

  def test_variables_and_bind(self):
    a, b = Variable("a", 0, 10), Variable("b", 1, 5)
    e = a.bind(3) + b
    assert e.variables() == [a, b]
    assert a.bind(3).unbind() == (a, 3)
    assert a.expr == "a"


class TestBoundsAndAlu:
  def test_bounds(self):
    a, b = Variable("a", 0, 10), Variable("b", -3, 3)
    assert ((a * 4 + b).vmin, (a * 4 + b).vmax) == (-3, 43)
    assert ((a % 4).vmin, (a % 4).vmax) == (0, 3)
    assert ((b // 2).vmin, (b // 2).vmax) == (-1, 1)  # truncation toward zero
    assert ((a < 11).vmin, (a < 11).vmax) == (True, True)
    assert ((a.maximum(5)).vmin, (a.maximum(5)).vmax) == (5, 10)
    assert UOp.range(16, 0).vmax == 15

  def test_exec_alu_c_semantics(self):
    assert exec_alu(Ops.IDIV, dtypes.int32, (-7, 2)) == -3
    assert exec_alu(Ops.MOD, dtypes.int32, (-7, 2)) == -1
    assert exec_alu(Ops.ADD, dtypes.int8, (127, 1)) == -128
    assert exec_alu(Ops.MUL, dtypes.uint8, (16, 17)) == 16
    assert exec_alu(Ops.ADD, dtypes.float32, (0.1, 0.2)) == pytest.approx(0.3, rel=1e-7)
    assert exec_alu(Ops.FDIV, dtypes.float32, (1.0, 0.0)) == math.inf
    assert math.isnan(exec_alu(Ops.SQRT, dtypes.float32, (-1.0,)))
    assert exec_alu(Ops.CMPLT, dtypes.bool, (1, 2)) is True
    assert exec_alu(Ops.ADD, dtypes.int32.vec(2), ((1, 2), (3, 4))) == (4, 6)
    assert exec_alu(Ops.MUL, dtypes.float16, (300.0, 300.0)) == math.inf
