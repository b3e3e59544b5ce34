"""The symbolic simplifier: exact results on classic index expressions, and properties on random expression trees
(value preserved under C semantics, bounds hold, tree size never grows, idempotent, compiled == interpreted)."""
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from plugrad.dtype import dtypes
from plugrad.uop.ops import Ops, UOp, Variable
from plugrad.uop.rewrite import graph_rewrite
from plugrad.uop.symbolic import SymbolicError, resolve, smax, smin, ssimplify, sym_infer, symbolic, symbolic_simple

IDX = dtypes.index
a, b, c = Variable("a", 0, 10), Variable("b", 0, 3), Variable("c", 0, 7)
g, l = Variable("g", 0, 1000), Variable("l", 0, 255)
x, n = Variable("x", 0, 100), Variable("n", -20, 20)
interpreted = symbolic.interpreted()


def ci(v: int) -> UOp: return UOp.const(IDX, v)


# ---- an evaluator written independently of plugrad's exec_alu (C semantics: truncating division, remainder keeps the dividend's sign)

def c_div(p: int, q: int) -> int:
  t = abs(p) // abs(q)
  return t if (p >= 0) == (q > 0) else -t


def wrap(v: int | bool, dt) -> int | bool:
  """Two's complement wrap-around of a fixed-width int (index is unbounded)."""
  if dt is IDX or dt is dtypes.bool: return v
  bits = 8 * dt.itemsize
  v &= (1 << bits) - 1
  return v - (1 << bits) if dt in dtypes.sints and v >> (bits - 1) else v


def evaluate(u: UOp, env: dict[UOp, int]) -> int | bool:
  vals: dict[UOp, int | bool] = {}
  for node in u.toposort:
    s = [vals[y] for y in node.src]
    op = node.op
    if op is Ops.CONST: v = node.arg
    elif op is Ops.DEFINE_VAR: v = env[node]
    elif op is Ops.ADD: v = s[0] + s[1]
    elif op is Ops.MUL: v = s[0] * s[1]
    elif op is Ops.IDIV: v = c_div(s[0], s[1])
    elif op is Ops.MOD: v = s[0] - s[1] * c_div(s[0], s[1])
    elif op is Ops.MAX: v = max(s[0], s[1])
    elif op is Ops.CMPLT: v = s[0] < s[1]
    elif op is Ops.CMPNE: v = s[0] != s[1]
    elif op is Ops.CMPEQ: v = s[0] == s[1]
    elif op is Ops.AND: v = s[0] and s[1]
    elif op is Ops.OR: v = s[0] or s[1]
    elif op is Ops.WHERE: v = s[1] if s[0] else s[2]
    else: raise AssertionError(f"the test evaluator does not know {op}")
    vals[node] = wrap(v, node.dtype)
  return vals[u]


def tree_size(u: UOp, memo: dict[UOp, int] | None = None) -> int:
  memo = {} if memo is None else memo
  for node in u.toposort: memo[node] = 1 + sum(memo[y] for y in node.src)
  return memo[u]


# ---- classic cases: exact results

CLASSIC = [
  ((a * 4 + b) // 4, a),
  ((a * 4 + b) % 4, b),
  ((b + a * 4) // 4, a),
  (a + a, a * 2),
  (a * 2 + a * 3, a * 5),
  (a + 0, a),
  (a * 1, a),
  (a * 0, ci(0)),
  (a // 1, a),
  (a % 1, ci(0)),
  (a - a, ci(0)),
  ((a * -1) * -1, a),
  ((a + 2) + 3, a + 5),
  ((a * 3) * 4, a * 12),
  (3 + a, a + 3),
  (2 * a, a * 2),
  ((a + 1) * 2, a * 2 + 2),
  ((a + b) * 2 - a * 2, b * 2),
  (a + b - b, a),
  (c // 8, ci(0)),
  (c % 8, c),
  ((x % 12) % 4, x % 4),
  ((x // 2) // 3, x // 6),
  ((n // 2) // 3, n // 6),
  ((a * 6 + b * 4) // 2, a * 3 + b * 2),
  ((a * 6 + b * 4 + 2) % 2, ci(0)),
  ((a * 4 + 3) // 8, a // 2),
  ((g * 256 + l) // 1024, g // 4),
  ((g * 256 + l) // 256, g),
  ((g * 256 + l) % 256, l),
  ((g * 256 + l) % 1024, (g % 4) * 256 + l),
  ((x // 4) * 4 + x % 4, x),
  (((x // 4) % 3) * 4 + x % 4, x % 12),
  (((x // 4) % 3) + (x // 12) * 3, x // 4),
  ((n // 4) * 4 + n % 4, n),
  (a * 4 + b < 8, a < 2),
  (a * 3 < 10, a < 4),
  (a * 3 + 2 < 11, a < 3),
  (a + 5 < 8, a < 3),
  (a * -1 < -3, ci(3) < a),
  (a < 11, UOp.const(dtypes.bool, True)),
  (a < 0, UOp.const(dtypes.bool, False)),
  (b * 4 < a * 4 + 4, b < a + 1),
  ((a < 5).logical_not(), ci(4) < a),
  ((a * 2 + 1).ne(4), UOp.const(dtypes.bool, True)),
  ((a * 2 + 2).ne(4), a.ne(1)),
  ((a < 3).where(b, b), b),
  (UOp.const(dtypes.bool, True).where(a, b), a),
  ((a < 3).logical_not().where(a, b), (ci(2) < a).where(a, b)),
  ((a < b).logical_not().where(a, b), (a < b).where(b, a)),
  (a + c < a + 5, c < 5),
  (a * 3 < a * 2 + b, a < b),
  (a * 2 + 1 < b * 4, a < b * 2),
  (a.maximum(b + 10), b + 10),
  (a.maximum(a), a),
  (a.maximum(-1), a),
  (x < x, UOp.const(dtypes.bool, False)),
  (a.ne(a), UOp.const(dtypes.bool, False)),
  ((a < 3) & (a < 3), a < 3),
  (((a < 3).logical_not()).logical_not(), a < 3),
  ((a < b) & UOp.const(dtypes.bool, True), a < b),
  ((a < b) & UOp.const(dtypes.bool, False), UOp.const(dtypes.bool, False)),
  ((a < b) | UOp.const(dtypes.bool, False), a < b),
  ((a < b) | UOp.const(dtypes.bool, True), UOp.const(dtypes.bool, True)),
  (UOp.const(IDX, 7) // 2 + UOp.const(IDX, -7) % 2, ci(2)),
  (a.cast(IDX), a),
]


@pytest.mark.parametrize("expr,expected", CLASSIC, ids=[e.render(False) for e, _ in CLASSIC])
def test_classic(expr: UOp, expected: UOp):
  got = expr.simplify()
  assert got is expected.simplify(), f"{expr.render(False)} -> {got.render(False)}, expected {expected.render(False)}"
  assert tree_size(expected.simplify()) == tree_size(expected), "an expected result is already simplified (up to order)"


def test_equal_expressions_become_identical():
  assert (a + b + c).simplify() is (c + (b + a)).simplify()
  assert (a * 2 + b * 3 + 1).simplify() is (1 + b * 3 + a * 2).simplify()
  assert (a * b * 3).simplify() is (b * (3 * a)).simplify()
  assert ((a + 1) * 4 + b).simplify() is (b + 4 + a * 4).simplify()
  assert (a * 4 + b).render() == "((a*4)+b)"


def test_negative_ranges_are_not_folded_wrongly():
  m = Variable("m", -3, 3)
  for e in ((m * 4 + b) // 4, (m * 4 + b) % 4, (m * 4 - b) // 4, (m * 8 + 3) // 4):
    s = e.simplify()
    for mv in range(-3, 4):
      for bv in range(0, 4):
        env = {m: mv, b: bv}
        assert evaluate(s, env) == evaluate(e, env), (e.render(False), s.render(False), env)
  assert ((m * 4 + b) // 4).simplify() is not m  # -4+1 truncates to 0, not -1


def test_fixed_width_ints_do_not_fold_what_may_wrap():
  i32 = Variable("i", -(2**31), 2**31 - 1, dtypes.int32)
  small = Variable("s", 0, 1000, dtypes.int32)
  assert (i32 * 2 // 2).simplify() is not i32  # i*2 may wrap
  assert (small * 2 // 2).simplify() is small
  assert ((i32 + 1) < 5).simplify().op is Ops.CMPLT
  assert ((small + 1) < 5).simplify() is (small < 4)
  assert (i32 + i32 * -1).simplify() is UOp.const(dtypes.int32, 0)  # ring rules hold modulo 2**32


def test_simple_float_rules_keep_ieee_semantics():
  f = UOp(Ops.DEFINE_VAR, dtypes.float32, (), ("f", 0, 1))  # a float leaf (bounds are not used for floats)
  assert (f * 0.0).simplify().op is Ops.MUL  # nan*0 is nan
  assert (f + 0.0).simplify().op is Ops.ADD  # -0.0 + 0.0 is 0.0
  assert (f + -0.0).simplify() is f
  assert (f * 1.0).simplify() is f
  assert (f - f).simplify().op is Ops.SUB  # inf - inf is nan
  assert f.ne(f).simplify().op is Ops.CMPNE  # nan != nan
  assert graph_rewrite(UOp.const(dtypes.float32, 1.5) * 2.0, symbolic_simple) is UOp.const(dtypes.float32, 3.0)
  assert graph_rewrite(UOp.const(dtypes.float32, 0.1).cast(dtypes.float16), symbolic_simple).arg == 0.0999755859375
  assert graph_rewrite(UOp.const(dtypes.float32, 3.7).cast(dtypes.int32), symbolic_simple) is UOp.const(dtypes.int32, 3)
  assert graph_rewrite(UOp.const(dtypes.int32, 300).cast(dtypes.uint8), symbolic_simple) is UOp.const(dtypes.uint8, 44)
  assert graph_rewrite(UOp.const(dtypes.float32, math.inf).cast(dtypes.int32), symbolic_simple).op is Ops.CAST


def test_conv_index_is_simplified():
  o = g * 256 + l
  ow, oh = o % 30, (o // 30) % 30
  iy, ix = oh * 2 + 1 - 1, ow * 2 + 2 - 1
  valid = (iy >= 0) & (iy < 60) & (ix >= 0) & (ix < 60)
  e = valid.where(((o // 57600) * 3 * 60 + iy) * 60 + ix, 0)
  s = e.simplify()
  assert tree_size(s) < tree_size(e) and len(s.toposort) < len(e.toposort)
  rnd = random.Random(0)
  for _ in range(200):
    env = {g: rnd.randint(0, 1000), l: rnd.randint(0, 255)}
    assert evaluate(s, env) == evaluate(e, env)


# ---- sint helpers

def test_ssimplify():
  assert ssimplify(5) == 5
  assert ssimplify(a * 0 + 3) == 3 and isinstance(ssimplify(a * 0 + 3), int)
  assert ssimplify(a + a) is a * 2
  with pytest.raises(TypeError, match="ssimplify"): ssimplify("3")  # type: ignore[arg-type]


def test_sym_infer():
  e = (a * 4 + b) // 3
  assert sym_infer(e, {a: 5, b: 2}) == 7
  assert sym_infer(e, {"a": 5, "b": 2}) == 7
  assert sym_infer(7, {}) == 7
  assert sym_infer(n // 3 + n % 3, {n: -7}) == -3  # C semantics: -2 + -1
  assert sym_infer(a.bind(3) * 2, {}) == 6
  assert sym_infer(a.bind(3) * 2, {a: 4}) == 8
  assert sym_infer(a < 4, {"a": 3}) is True
  with pytest.raises(SymbolicError, match="'b'"): sym_infer(e, {a: 1})
  with pytest.raises(SymbolicError, match="out of the range"): sym_infer(e, {a: 11, b: 0})
  with pytest.raises(SymbolicError, match="must be an int"): sym_infer(e, {a: 1.5, b: 0})  # type: ignore[dict-item]
  with pytest.raises(SymbolicError, match="keys must be"): sym_infer(e, {ci(1): 1})
  with pytest.raises(TypeError, match="sym_infer"): sym_infer("a", {})  # type: ignore[arg-type]


def test_resolve():
  assert resolve(True) is True and resolve(False, True) is False
  assert resolve(a < 11) is True
  assert resolve(a < 0) is False
  assert resolve(a < 5) is True and resolve(a < 5, False) is False
  assert resolve((a * 4 + b) // 4 < 11) is True  # needs simplification: the bounds of the division alone are wider
  with pytest.raises(TypeError, match="bool UOp"): resolve(a)
  with pytest.raises(TypeError, match="resolve"): resolve(1)  # type: ignore[arg-type]


def test_smax_smin():
  assert smax(3, 5, 1) == 5 and smin([3, 5, 1]) == 1
  assert smax(a, 11) == 11
  assert smax(a, -1) is a
  assert smin(a, 20) is a
  assert smin(a, -1) == -1
  assert smax(a, b + 11) is b + 11
  m = smax(a, b)
  assert isinstance(m, UOp) and m.op is Ops.MAX
  for av, bv in ((0, 3), (7, 2)):
    assert sym_infer(smin(a, b), {a: av, b: bv}) == min(av, bv)
  with pytest.raises(ValueError, match="at least one"): smax()
  with pytest.raises(TypeError, match="smin"): smin(a, 1.5)  # type: ignore[arg-type]


# ---- random expression trees (shared by hypothesis and the seeded corpus)

def gen_affine(r, vs: list[UOp]) -> UOp:
  """An index-like sum: a few variables with coefficients, a constant, then maybe a division or modulo by a bigger constant."""
  e = vs[0].const_like(r(-40, 40))
  for _ in range(r(1, 4)): e = vs[r(0, len(vs) - 1)] * r(-70, 70) + e
  k = r(0, 3)
  return e // r(1, 70) if k == 0 else e % r(1, 70) if k == 1 else e


def gen_int(r, vs: list[UOp], depth: int) -> UOp:
  k = r(0, 11) if depth > 0 else r(0, 2)
  if k <= 1: return vs[r(0, len(vs) - 1)]
  if k == 2: return vs[0].const_like(r(-8, 8))
  if k == 11: return gen_affine(r, vs)
  e = gen_int(r, vs, depth - 1)
  if k == 3: return e + gen_int(r, vs, depth - 1)
  if k == 4: return e * r(-6, 6)
  if k == 5: return e * vs[r(0, len(vs) - 1)]
  if k == 6: return e // r(1, 12)
  if k == 7: return e % r(1, 12)
  if k == 8: return e.maximum(gen_int(r, vs, depth - 1))
  if k == 9: return gen_bool(r, vs, depth - 1).where(e, gen_int(r, vs, depth - 1))
  return e - gen_int(r, vs, depth - 1)


def gen_bool(r, vs: list[UOp], depth: int) -> UOp:
  k = r(0, 4)
  e = gen_int(r, vs, depth)
  if k == 0: return e < gen_int(r, vs, depth)
  if k == 1: return e.ne(gen_int(r, vs, depth))
  if k == 2: return e < r(-10, 30)
  if k == 3: return (e < r(-10, 30)).logical_not()
  return (e < gen_int(r, vs, depth)) & (gen_int(r, vs, depth) < r(-10, 30))


def gen_vars(r, dt=IDX) -> list[UOp]:
  out = []
  for i in range(r(1, 4)):
    lo = r(0 if dt in dtypes.uints else -10, 10)
    out.append(Variable(f"v{i}", lo, lo + r(0, 20), dt))
  return out


def gen_expr(r, dt=IDX) -> UOp:
  vs = gen_vars(r, dt)
  return gen_bool(r, vs, r(0, 3)) if r(0, 4) == 0 else gen_int(r, vs, r(1, 4))


def check_expr(e: UOp, envs: list[dict[UOp, int]]) -> None:
  # (c) is about the tree size, not len(toposort): `a + a` (2 DAG nodes) → `a*2` (3) is a wanted rule, and combining like terms
  # of a shared subexpression, as in `(a+b) + ((a+b)+c)` → `a*2 + b*2 + c`, must add nodes to the DAG
  s = e.simplify()
  assert tree_size(s) <= tree_size(e), f"grew: {e.render(False)} -> {s.render(False)}"
  assert s.simplify() is s, f"not idempotent: {s.render(False)} -> {s.simplify().render(False)}"
  for env in envs:
    want, got = evaluate(e, env), evaluate(s, env)
    assert got == want, f"{e.render(False)} -> {s.render(False)} at {({k.arg[0]: v for k, v in env.items()})}: {want} != {got}"
    for u, v in ((e, want), (s, got)):
      assert u.vmin <= v <= u.vmax, f"bounds [{u.vmin}, {u.vmax}] of {u.render(False)} miss {v} at {env}"
    assert sym_infer(s, env) == want


def envs_for(e: UOp, r) -> list[dict[UOp, int]]:
  vs = e.variables()
  corners = [{v: v.arg[1 + ((i >> j) & 1)] for j, v in enumerate(vs)} for i in range(2 ** len(vs))]
  return corners + [{v: r(v.arg[1], v.arg[2]) for v in vs} for _ in range(12)]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_expressions(data):
  def r(lo: int, hi: int) -> int: return data.draw(st.integers(lo, hi))
  e = gen_expr(r)
  check_expr(e, envs_for(e, r))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.sampled_from([dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32]))
def test_random_fixed_width_expressions(data, dt):
  # small widths wrap around all the time: the ring rules must still hold, the others must notice the wrap and stay away
  def r(lo: int, hi: int) -> int: return data.draw(st.integers(lo, hi))
  e = gen_expr(r, dt)
  check_expr(e, envs_for(e, r))


def corpus() -> list[UOp]:
  rnd = random.Random(1234)
  return [e for e, _ in CLASSIC] + [gen_expr(rnd.randint) for _ in range(400)]


def test_seeded_corpus():
  rnd = random.Random(99)
  for e in corpus(): check_expr(e, envs_for(e, rnd.randint))


def test_compiled_matches_interpreted():
  assert symbolic.compiled and not interpreted.compiled
  for e in corpus():
    assert graph_rewrite(e, symbolic) is graph_rewrite(e, interpreted), e.render(False)


def test_top_down_rewrite_is_also_correct():
  # top-down, rules see sums before they are in normal form
  rnd = random.Random(5)
  for e in corpus():
    t = graph_rewrite(e, symbolic, top_down=True)
    assert tree_size(t) <= tree_size(e), f"grew: {e.render(False)} -> {t.render(False)}"
    for env in envs_for(e, rnd.randint): assert evaluate(t, env) == evaluate(e, env), (e.render(False), t.render(False), env)


def test_no_signed_wrap_follows_the_operands_bounds():
  # what a renderer may mark nsw: int32 arithmetic whose exact result over its operands' bounds fits int32
  from plugrad.backend import no_signed_wrap
  i32 = dtypes.int32
  r = UOp.range(UOp.const(i32, 1000), 0, dtype=i32)
  idx = r * UOp.const(i32, 3000) + UOp.const(i32, 7)
  assert no_signed_wrap(idx) and no_signed_wrap(idx.src[0])
  big = Variable("n", 0, 2**31 - 1, i32)
  assert not no_signed_wrap(big + UOp.const(i32, 1)) and no_signed_wrap(big - UOp.const(i32, 1))
  assert not no_signed_wrap(r * UOp.const(i32, 3_000_000))  # 999 * 3e6 > 2**31 - 1: may wrap
  loaded = UOp(Ops.LOAD, i32, (UOp(Ops.DEFINE_GLOBAL, i32.ptr(), (), 0).index(r),))
  assert not no_signed_wrap(loaded + UOp.const(i32, 1))  # a value from memory has int32's whole range
  assert not no_signed_wrap(UOp.range(UOp.const(dtypes.uint32, 4), 1, dtype=dtypes.uint32) + UOp.const(dtypes.uint32, 1))  # signed only
  assert not no_signed_wrap(big & UOp.const(i32, 3))


def test_simplify_remembers_its_results_within_a_bound(monkeypatch):
  # the scheduler simplifies the same index expressions for every kernel of every training step: a repeat is a lookup
  import plugrad.uop.ops as ops
  import plugrad.uop.rewrite as rewrite
  monkeypatch.setattr(ops, "_SIMPLIFIED", {})
  x = Variable("x", 0, 100)
  e = ((x * 4 + 8) // 4) % 1000
  first = e.simplify()
  assert first.render(simplify=False) == "(x+2)"
  calls = []
  monkeypatch.setattr(rewrite, "_bottom_up", lambda *a, **k: calls.append(a) or a[0])
  assert e.simplify() is first and not calls  # no rewrite the second time
  monkeypatch.undo()
  monkeypatch.setattr(ops, "_SIMPLIFIED", {})
  monkeypatch.setattr(ops, "SIMPLIFY_MEMO_MAX", 8)
  for i in range(50): (x + i * 2 - i).simplify()
  assert len(ops._SIMPLIFIED) <= 8 + 16  # cleared when full: at most one graph's nodes past the bound
  assert (x + 3 - 3).simplify() is x
