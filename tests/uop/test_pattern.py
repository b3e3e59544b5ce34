import pytest

from plugrad.dtype import dtypes
from plugrad.helpers import Context
from plugrad.uop.ops import Ops, UOp, Variable
from plugrad.uop.pattern import PatternMatcher, UPat, UPatError
from plugrad.uop.rewrite import RewriteNotConverging, graph_rewrite

a, b = Variable("a", 0, 10), Variable("b", -5, 5)
one, two = UOp.const(dtypes.index, 1), UOp.const(dtypes.index, 2)


def both(patterns):
  """The same rules compiled and interpreted: every test checks that they agree."""
  return PatternMatcher(patterns, compiled=True), PatternMatcher(patterns, compiled=False)


def rewrite_both(patterns, u, ctx=None):
  pc, pi = both(patterns)
  rc, ri = pc.rewrite(u, ctx), pi.rewrite(u, ctx)
  assert rc is ri
  return rc


class TestMatching:
  def test_op_dtype_arg(self):
    pats = [(UPat(Ops.CONST, dtypes.index, arg=2, name="x"), lambda x: x * 10)]
    assert rewrite_both(pats, two) is two * 10
    assert rewrite_both(pats, one) is None
    assert rewrite_both(pats, UOp.const(dtypes.int32, 2)) is None
    pats = [(UPat((Ops.ADD, Ops.MUL), name="x"), lambda x: x.src[0])]
    assert rewrite_both(pats, a + b) is a and rewrite_both(pats, a * b) is a and rewrite_both(pats, a // b) is None

  def test_dtype_matches_vector_scalar(self):
    v = UOp(Ops.VECTORIZE, dtypes.float32.vec(2), (UOp.const(dtypes.float32, 1.0),) * 2)
    pats = [(UPat(Ops.VECTORIZE, dtypes.float32, name="x"), lambda x: x.src[0])]
    assert rewrite_both(pats, v) is v.src[0]

  def test_tuple_src_in_order(self):
    pats = [(UPat(Ops.ADD, src=(UPat(Ops.DEFINE_VAR, name="v"), UPat(Ops.CONST, name="c"))), lambda v, c: v)]
    assert rewrite_both(pats, a + 1) is a
    assert rewrite_both(pats, UOp(Ops.ADD, dtypes.index, (one, a))) is None

  def test_list_src_any_permutation(self):
    pats = [(UPat(Ops.ADD, src=[UPat(Ops.DEFINE_VAR, name="v"), UPat(Ops.CONST, name="c")]), lambda v, c: c)]
    assert rewrite_both(pats, a + 1) is one
    assert rewrite_both(pats, UOp(Ops.ADD, dtypes.index, (one, a))) is one
    three = UOp(Ops.CUSTOM, dtypes.index, (a, one, b))
    pats3 = [(UPat(Ops.CUSTOM, src=[UPat(Ops.CONST, name="c"), UPat(name="x", arg=("b", -5, 5)), UPat(name="y")]), lambda c, x, y: y)]
    assert rewrite_both(pats3, three) is a

  def test_single_upat_repeats(self):
    pats = [(UPat(Ops.CUSTOM, src=UPat(Ops.CONST), name="x"), lambda x: x.src[0])]
    assert rewrite_both(pats, UOp(Ops.CUSTOM, dtypes.index, (one, two, one))) is one
    assert rewrite_both(pats, UOp(Ops.CUSTOM, dtypes.index, (one, a))) is None
    assert rewrite_both([(UPat(Ops.CUSTOM, src=UPat(Ops.CONST), name="x"), lambda x: x)], UOp(Ops.CUSTOM, dtypes.index, ())) is not None

  def test_allow_any_len(self):
    pats = [(UPat(Ops.CUSTOM, src=(UPat(Ops.DEFINE_VAR, name="v"),), allow_any_len=True), lambda v: v)]
    assert rewrite_both(pats, UOp(Ops.CUSTOM, dtypes.index, (a, one, two))) is a
    assert rewrite_both(pats, UOp(Ops.CUSTOM, dtypes.index, (one, a))) is None
    strict = [(UPat(Ops.CUSTOM, src=(UPat(Ops.DEFINE_VAR, name="v"),)), lambda v: v)]
    assert rewrite_both(strict, UOp(Ops.CUSTOM, dtypes.index, (a, one))) is None

  def test_repeated_name_must_bind_the_same_uop(self):
    x = UPat.var("x")
    pats = [(x + x, lambda x: x * 2)]
    assert rewrite_both(pats, a + a) is a * 2
    assert rewrite_both(pats, a + b) is None

  def test_every_binding_is_tried_until_one_returns(self):
    # the rule refuses the first permutation; the matcher must go on to the second
    pats = [(UPat(Ops.ADD, src=[UPat.var("x"), UPat.var("y")]), lambda x, y: x if x is b else None)]
    assert rewrite_both(pats, a + b) is b
    assert rewrite_both(pats, b + a) is b

  def test_any_alternatives(self):
    pats = [(UPat.any(UPat(Ops.ADD, name="x"), UPat(Ops.MUL, name="x")), lambda x: x.src[1])]
    assert rewrite_both(pats, a + b) is b and rewrite_both(pats, a * b) is b and rewrite_both(pats, a // b) is None
    nested = [(UPat(Ops.ADD, src=(UPat.any(UPat(Ops.CONST), UPat(Ops.DEFINE_VAR)), UPat(name="y"))), lambda y: y)]
    assert rewrite_both(nested, a + b) is b and rewrite_both(nested, UOp(Ops.ADD, dtypes.index, (one, b))) is b
    assert rewrite_both(nested, UOp(Ops.ADD, dtypes.index, (a * 2, b))) is None

  def test_ctx_is_passed_when_declared(self):
    seen = []
    pats = [(UPat(Ops.DEFINE_VAR, name="v"), lambda ctx, v: seen.append((ctx, v)) or None)]
    rewrite_both(pats, a, ctx="C")
    assert seen == [("C", a), ("C", a)]

  def test_function_gets_only_the_names_it_declares(self):
    pats = [(UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("c"))), lambda x: x)]
    assert rewrite_both(pats, a + 3) is a

  def test_operator_built_patterns(self):
    x, cst = UPat.var("x"), UPat.cvar("c")
    assert rewrite_both([(x * cst + cst, lambda x, c: x)], a * 3 + 3) is a
    assert rewrite_both([((x // cst) % cst, lambda x, c: x)], (a // 2) % 2) is a
    assert rewrite_both([(x + 0, lambda x: x)], a + 0) is a
    assert rewrite_both([(x.where(UPat.var("t"), UPat.var("f")), lambda x, t, f: t)], (a < 3).where(a, b)) is a


class TestComposition:
  def test_plus_keeps_order(self):
    first = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="v"), lambda v: one)])
    second = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="v"), lambda v: two)])
    assert (first + second).rewrite(a) is one
    assert (second + first).rewrite(a) is two
    assert len(first + second) == 2

  def test_bad_rules_are_caught_when_built(self):
    with pytest.raises(UPatError, match="never names"): PatternMatcher([(UPat(Ops.ADD, name="x"), lambda y: y)])
    with pytest.raises(UPatError, match="callable"): PatternMatcher([(UPat(Ops.ADD), 3)])
    with pytest.raises(UPatError, match="start with a UPat"): PatternMatcher([(Ops.ADD, lambda: None)])
    with pytest.raises(UPatError, match="must be Ops"): UPat("ADD")  # type: ignore[arg-type]


# a small algebra used to compare the compiled and interpreted matchers on whole graphs
x, y, cv = UPat.var("x"), UPat.var("y"), UPat.cvar("c")
ALGEBRA = [
  (x + 0, lambda x: x), (x * 1, lambda x: x), (x * 0, lambda x: x.const_like(0)),
  (UPat.cvar("c1") + UPat.cvar("c2"), lambda c1, c2: c1.const_like(c1.arg + c2.arg)),
  (UPat.cvar("c1") * UPat.cvar("c2"), lambda c1, c2: c1.const_like(c1.arg * c2.arg)),
  ((x + UPat.cvar("c1")) + UPat.cvar("c2"), lambda x, c1, c2: x + (c1.arg + c2.arg)),
  ((x * UPat.cvar("c1")) * UPat.cvar("c2"), lambda x, c1, c2: x * (c1.arg * c2.arg)),
  (x + x, lambda x: x * 2),
  (UPat(Ops.ADD, src=(UPat.cvar("c"), UPat.var("x"))), lambda c, x: x + c),
]


def corpus():
  vs = [Variable(n, lo, hi) for n, lo, hi in (("p", 0, 7), ("q", -4, 4), ("r", 1, 100))]
  out = []
  for i in range(60):
    e = vs[i % 3]
    for j in range(8):
      k = (i * 7 + j * 3) % 5
      e = (e + j) if k == 0 else (e * (j % 3)) if k == 1 else (e + e) if k == 2 else (e + vs[j % 3]) if k == 3 else (e * 1 + 0)
    out.append(e)
  return out


class TestCompiledVsInterpreted:
  def test_identical_results_on_corpus(self):
    pc, pi = both(ALGEBRA)
    for e in corpus():
      for top_down in (False, True):
        assert graph_rewrite(e, pc, top_down=top_down) is graph_rewrite(e, pi, top_down=top_down)

  def test_flag_selects_the_default(self):
    with Context(UPAT_COMPILE=0): assert PatternMatcher(ALGEBRA).compiled is False
    assert PatternMatcher(ALGEBRA).compiled is True


class TestGraphRewrite:
  pm = PatternMatcher(ALGEBRA)

  def test_fixed_point_both_orders(self):
    e = ((a + 0) * 1 + 2) + 3
    assert graph_rewrite(e, self.pm) is a + 5
    assert graph_rewrite(e, self.pm, top_down=True) is a + 5

  def test_top_down_sees_the_whole_subtree_first(self):
    order = []
    pm = PatternMatcher([(UPat((Ops.ADD, Ops.MUL), name="u"), lambda u: order.append(u.op) or None)])
    graph_rewrite((a * 2) + 1, pm, top_down=True)
    assert order == [Ops.ADD, Ops.MUL]
    order.clear()
    graph_rewrite((a * 2) + 1, pm)
    assert order == [Ops.MUL, Ops.ADD]

  def test_shared_nodes_are_rewritten_once(self):
    calls = []
    pm = PatternMatcher([(UPat(Ops.MUL, name="u"), lambda u: calls.append(u) or None)])
    t = a * 3
    graph_rewrite((t + t) + (t + 1), pm)
    assert calls == [t]

  def test_ctx(self):
    pm = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="v"), lambda ctx, v: ctx.get(v.arg[0]))])
    assert graph_rewrite(a + b, pm, {"a": one}) is one + b

  def test_deep_graph(self):
    e = a
    for i in range(5000): e = e + 0 if i % 2 else e * 1
    assert graph_rewrite(e, self.pm) is a

  def test_cycle_names_the_rule(self):
    pm = PatternMatcher([(x + 1, lambda x: x + 2), (x + 2, lambda x: x + 1)])
    for top_down in (False, True):
      with pytest.raises(RewriteNotConverging, match="test_pattern.py"): graph_rewrite(a + 1, pm, top_down=top_down)

  def test_growth_hits_the_budget(self):
    pm = PatternMatcher([(UPat(Ops.MUL, name="m"), lambda m: (m.src[0] + 0) * (m.src[1].arg + 1))])
    with Context(REWRITE_STEPS=50), pytest.raises(RewriteNotConverging, match="rule"): graph_rewrite(a * 1, pm)


def test_a_matchers_repr_is_its_rules_not_its_address():
  # a renderer's extra_matcher is part of the program store's key, which must be the same in every process
  def fold(x): return x.src[0]
  pm = PatternMatcher([(UPat(Ops.NEG, src=(UPat(Ops.NEG, name="y"),), name="x"), fold)])
  r = repr(pm)
  assert " at 0x" not in r and r.startswith("PatternMatcher([<rule UPat(Ops.NEG") and "test_pattern.py:" in r, r
  assert repr(pm + pm).count("<rule ") == 2
