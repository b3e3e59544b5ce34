"""The Tensor against tinygrad 0.14 (result dtypes, promotion, signatures), random reproducibility, and the
bookkeeping around realize: shared graphs, assign hazards, gradients after a realize, a light `import plugrad`."""
from __future__ import annotations

import inspect
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from plugrad import Device, Tensor, dtypes
from plugrad.dtype import DType

NAMES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64"]


# ---------------------------------------------------------------- against tinygrad 0.14

@pytest.fixture(scope="module")
def tg() -> Any:
  return pytest.importorskip("tinygrad")


def tg_name(tg: Any, dt: Any) -> str:
  """tinygrad's dtype as one of ours: its weak (Python-literal) dtypes are stored as the defaults, int32 and float32."""
  weak = {"weakint": "int32", "weakfloat": "float32"}
  return next((n for n in NAMES if getattr(tg.dtypes, n) == dt), weak.get(str(dt).removeprefix("dtypes."), str(dt)))


def our_name(dt: DType) -> str: return next(n for n in NAMES if getattr(dtypes, n) is dt)


def run_both(tg: Any, fn: Callable[..., Any], *args: Any) -> tuple[str, str]:
  """fn(make, *args) under tinygrad and under plugrad, `make(dtype_name)` building a tensor: the result dtypes (or "error")."""
  out = []
  with tg.helpers.Context(DEV="NULL"):
    for mk, name in ((lambda n: tg.Tensor.empty(2, dtype=getattr(tg.dtypes, n)), lambda d: tg_name(tg, d)),
                     (lambda n: Tensor.empty(2, dtype=getattr(dtypes, n), device="NULL"), our_name)):
      try: out.append(name(fn(mk, *args).dtype))
      except Exception: out.append("error")  # the outcome being compared is "it raised"
  return out[0], out[1]


def test_promotion_table(tg):
  """Every dtype pair under `+` promotes like tinygrad, except int64/uint64 mixes: our lattice (dtype.py) sends
  int64 + uint64 to float16, tinygrad 0.14 to its weak float (float32)."""
  diffs = {(a, b): run_both(tg, lambda mk, a, b: mk(a) + mk(b), a, b) for a in NAMES for b in NAMES}
  diffs = {k: v for k, v in diffs.items() if v[0] != v[1]}
  signed = ["int8", "int16", "int32", "int64"]
  expected = {**{(s, "uint64"): ("float32", "float16") for s in signed}, **{("uint64", s): ("float32", "float16") for s in signed}}
  assert diffs == expected


def test_scalar_promotion_table(tg):
  """A Python scalar adopts the tensor's dtype when it fits its kind, as tinygrad's weak dtypes do."""
  ops: dict[str, Callable[[Any, Any], Any]] = {"add": lambda a, s: a + s, "radd": lambda a, s: s + a, "mul": lambda a, s: a * s,
                                               "div": lambda a, s: a / s, "lt": lambda a, s: a < s, "maximum": lambda a, s: a.maximum(s),
                                               "where": lambda a, s: (a > 0).where(a, s)}
  diffs = {}
  for n in NAMES:
    for s in (True, 3, 2.5):
      for op, f in ops.items():
        if (got := run_both(tg, lambda mk, f, n, s: f(mk(n), s), f, n, s))[0] != got[1]: diffs[(n, repr(s), op)] = got
  assert diffs == {}


UNARY = ["exp", "log", "sqrt", "sin", "abs", "neg", "sign", "floor", "ceil", "trunc", "round", "sum", "prod", "max", "min", "mean", "var", "std",
         "argmax", "argmin", "any", "all", "logsumexp", "square", "reciprocal", "logical_not", "isnan", "isinf", "isfinite", "tanh", "erf", "atan",
         "float", "half", "int", "bool", "contiguous", "detach", "flatten"]
BINARY: dict[str, Callable[[Any, Any], Any]] = {
  "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b, "mod": lambda a, b: a % b,
  "floordiv": lambda a, b: a // b, "pow": lambda a, b: a ** b, "maximum": lambda a, b: a.maximum(b), "minimum": lambda a, b: a.minimum(b),
  "lt": lambda a, b: a < b, "eq": lambda a, b: a == b, "where": lambda a, b: (a > 0).where(a, b), "lerp": lambda a, b: a.lerp(b, 0.5),
  "matmul": lambda a, b: a.reshape(1, 2) @ b.reshape(2, 1), "logaddexp": lambda a, b: a.logaddexp(b), "cat": lambda a, b: a.cat(b),
}


def test_result_dtypes(tg):
  """Result dtypes of the unary ops, reductions and binary ops for every dtype (pair), against tinygrad. The
  differences are deliberate: integer round keeps its dtype (as numpy/PyTorch), bool arithmetic follows numpy
  (bool - bool raises; bool ** / % / // compute in int32), the int64/uint64 lattice difference above, and integer and
  bool sums and products give int64 on a device that has it (PyTorch's rule; tinygrad sums in int32/uint32 and
  multiplies in the input dtype)."""
  diffs = {}
  for a in NAMES:
    for op in UNARY:
      if (got := run_both(tg, lambda mk, a, op: getattr(mk(a), op)(), a, op))[0] != got[1]: diffs[(op, a)] = got
    for b in NAMES:
      for op, f in BINARY.items():
        if (got := run_both(tg, lambda mk, f, a, b: f(mk(a), mk(b)), f, a, b))[0] != got[1]: diffs[(op, a, b)] = got
  lattice = {(a, b) for a in ("int8", "int16", "int32", "int64") for b in ("uint64",)}
  lattice |= {(b, a) for a, b in lattice}
  ints = [n for n in NAMES if "int" in n]
  expected: dict[tuple, tuple[str, str]] = {("round", n): ("float32", n) for n in ints}
  expected[("floor", "bool")], expected[("ceil", "bool")], expected[("round", "bool")] = ("int32", "bool"), ("int32", "bool"), ("float32", "bool")
  expected[("sub", "bool", "bool")] = ("bool", "error")
  expected[("lerp", "bool", "bool")] = ("float32", "error")
  expected[("pow", "bool", "bool")] = ("bool", "int32")
  expected[("mod", "bool", "bool")] = expected[("floordiv", "bool", "bool")] = ("float32", "int32")
  for n in ("bool", "int8", "uint8", "int16", "uint16", "int32", "uint32"):  # the NULL device has int64
    expected[("sum", n)] = ("uint32" if n.startswith("uint") else "int32", "int64")
    expected[("prod", n)] = (n, "int64")
  for op in BINARY:
    for pair in lattice:
      if op not in ("lt", "eq"): expected[(op, *pair)] = ("float32", "float16")
  assert {k: v for k, v in diffs.items() if k not in expected} == {}
  assert {k: v for k, v in expected.items() if diffs.get(k) != v} == {}


API = ("empty zeros zeros_like ones ones_like full full_like arange linspace eye meshgrid rand randn randint uniform normal scaled_uniform "
       "glorot_uniform kaiming_uniform kaiming_normal manual_seed realize numpy tolist item to to_ contiguous clone detach cast bitcast float half "
       "int bool assign numel element_size nbytes add sub mul div mod fmod pow neg abs sign copysign exp exp2 log log2 log10 sqrt rsqrt sin cos tan "
       "asin acos atan sinh cosh tanh asinh acosh atanh erf floor ceil round trunc lerp maximum minimum clip clamp where masked_fill isnan isinf "
       "isfinite isclose logical_not bitwise_not bitwise_and bitwise_or bitwise_xor lshift rshift logaddexp sum prod max min mean var std std_mean "
       "var_mean argmax argmin any all logsumexp reshape view permute transpose expand pad flip flatten unflatten squeeze unsqueeze cat stack split "
       "chunk repeat repeat_interleave roll shrink matmul dot backward gradient square reciprocal eq ne rand_like randn_like empty_like "
       "shard shard_ __init__").split()
# The parameters we add (device=, requires_grad=) are keyword parameters with defaults after tinygrad's, so tinygrad calls still work.
ADDED = {"empty": ["requires_grad"], "full": ["requires_grad"], "full_like": ["requires_grad"], "arange": ["device", "requires_grad"],
         "linspace": ["device", "requires_grad"], "eye": ["device", "requires_grad"], "rand": ["requires_grad"], "randn": ["requires_grad"],
         "randint": ["device", "requires_grad"], "uniform": ["requires_grad"], "normal": ["requires_grad"], "scaled_uniform": ["requires_grad"],
         "empty_like": ["requires_grad"], "__init__": ["requires_grad"]}
# Parameters of tinygrad we do not take, on purpose.
DROPPED = {"realize": ["do_update_stats"],  # no scheduler statistics to skip
           "contiguous": ["kwargs"],  # tinygrad forwards UOp options (tags) we do not have
           "randint": ["kwargs"]}  # spelled out: device=, requires_grad=


def _default(tg: Any, p: inspect.Parameter) -> str:
  if p.default is p.empty: return "-"
  if isinstance(p.default, DType): return our_name(p.default)
  if type(p.default).__module__.startswith("tinygrad"): return tg_name(tg, p.default)
  return repr(p.default)


def test_signatures_match_tinygrad(tg):
  """Every name exists in both; each tinygrad parameter is ours too, with the same kind and default, in the same order;
  what we add or drop is listed above."""
  problems = []
  for name in API:
    po = list(inspect.signature(getattr(Tensor, name)).parameters.values())
    pt = [p for p in inspect.signature(getattr(tg.Tensor, name)).parameters.values() if p.name not in DROPPED.get(name, [])]
    ours = [p for p in po if p.name not in ADDED.get(name, [])]
    if [p.name for p in ours] != [p.name for p in pt]: problems.append(f"{name}: {[p.name for p in ours]} vs tinygrad {[p.name for p in pt]}")
    problems += [f"{name}({a.name}): {a.kind.name} {_default(tg, a)} vs tinygrad {b.kind.name} {_default(tg, b)}"
                 for a, b in zip(ours, pt) if (a.kind, _default(tg, a)) != (b.kind, _default(tg, b))]
    for p in po:  # what we add never changes how a tinygrad call binds
      if p.name in ADDED.get(name, []) and (p.default is p.empty or p.kind not in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)):
        problems.append(f"{name}({p.name}) is added without a default")
  assert problems == []


def test_pytorch_requires_grad_spellings():
  t = Tensor.full((1,), 1.0, device="NULL")
  assert t.requires_grad is None and t.requires_grad_() is t and t.requires_grad is True
  assert t.requires_grad_(False).requires_grad is False
  assert Tensor([1.0], device="NULL", requires_grad=True).requires_grad is True
  assert Tensor.zeros(2, device="NULL", requires_grad=True).requires_grad is True
  assert Tensor.rand(2, device="NULL", requires_grad=False).requires_grad is False


# ---------------------------------------------------------------- random reproducibility

def test_manual_seed_reproducible():
  Tensor.manual_seed(7)
  a = [Tensor.rand(5).numpy(), Tensor.randn(4).numpy(), Tensor.randint(6, high=100).numpy(), Tensor.uniform(3, low=-1).numpy()]
  Tensor.manual_seed(7)
  b = [Tensor.rand(5).numpy(), Tensor.randn(4).numpy(), Tensor.randint(6, high=100).numpy(), Tensor.uniform(3, low=-1).numpy()]
  for x, y in zip(a, b): np.testing.assert_array_equal(x, y)
  Tensor.manual_seed(8)
  assert not np.array_equal(Tensor.rand(5).numpy(), a[0])


def test_stream_advances_and_is_per_device():
  Tensor.manual_seed(3)
  first, second = Tensor.rand(4).numpy(), Tensor.rand(4).numpy()
  assert not np.array_equal(first, second)
  Tensor.manual_seed(3)
  both = Tensor.rand(8).numpy()
  np.testing.assert_array_equal(both, np.concatenate([first, second]))  # counter = offset + element index
  Tensor.manual_seed(3)
  other = "NULL" if Device.DEFAULT != "NULL" else "PYTHON"
  Tensor.rand(100, device=other)  # drawing on another device does not move this device's stream
  np.testing.assert_array_equal(Tensor.rand(4).numpy(), first)


def test_same_seed_same_numbers_on_every_device():
  Tensor.manual_seed(11)
  here = Tensor.rand(6).numpy()
  Tensor.manual_seed(11)
  np.testing.assert_array_equal(Tensor.rand(6, device="PYTHON").numpy(), here)


# ---------------------------------------------------------------- realize bookkeeping

def test_realize_shares_results_and_schedule_runs_nothing():
  a = Tensor([1.0, 2.0, 3.0])
  b = a * 2
  c, d = b + 1, b * b
  assert len(b.schedule()) == 1 and b.uop.op.name == "MUL"
  b.realize()
  for t in (c, d):
    assert any(u.op.name == "BUFFER" and u in b.uop.toposort for u in t.uop.toposort)
  np.testing.assert_allclose(d.numpy(), [4, 16, 36])
  assert len(c.schedule()) == 1  # only c's own kernel is left


def test_reads_before_an_assign_see_the_old_values():
  w = Tensor([1.0, 2.0])
  w.realize()
  old = w * 10  # built before the update: keeps the old contents even though it is computed later
  snapshot = w.clone()
  w += 5
  w.realize()
  np.testing.assert_allclose(w.numpy(), [6, 7])
  np.testing.assert_allclose(old.numpy(), [10, 20])
  np.testing.assert_allclose(snapshot.numpy(), [1, 2])


def test_backward_after_realizing_the_loss():
  Tensor.manual_seed(0)
  w = Tensor.randn(3, requires_grad=True)
  x = Tensor([1.0, 2.0, 3.0])
  h = (w * x).contiguous()
  loss = (h * h).sum()
  value = loss.item()  # realizes the loss (and w) first, as in `print(loss.item()); loss.backward()`
  loss.backward()
  wv = w.numpy()
  assert value == pytest.approx(float(((wv * [1, 2, 3]) ** 2).sum()), rel=1e-5)
  np.testing.assert_allclose(w.grad.numpy(), 2 * wv * np.array([1, 4, 9]), rtol=1e-5)


def test_repr_hash_and_bool():
  t = Tensor([[1, 2]], device="NULL")
  assert repr(t) == "<Tensor (1, 2) dtypes.int32 on NULL, realized>"
  assert "lazy ADD" in repr(t + 1) and "requires_grad=True" in repr(t.float().requires_grad_())
  assert len({t, t, Tensor([1], device="NULL")}) == 2 and {t: 1}[t] == 1  # hashable by identity while == builds a Tensor
  assert isinstance(t == 1, Tensor)
  with pytest.raises(TypeError): bool(t == 1)


def test_import_is_light():
  code = ("import sys, plugrad; from plugrad.plugin import manager as m; "
          "print(m._manager is None or not m._manager.loaded, 'plugrad.engine.schedule' in sys.modules, 'plugrad.codegen' in sys.modules)")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
  assert out == ["True", "False", "False"], out


def test_random_words_are_threefry_of_the_counter():
  """Every device draws with 32-bit ops: both words of Threefry-2x32 of offset + i, the carry into the counter's high
  word included, against the independent numpy oracle."""
  from plugrad.tensor import random as rnd
  from plugrad.testing.kernels import _np_threefry
  Tensor.manual_seed(123456789012345)
  for offset in (0, 2**32 - 5):  # the second crosses into the counter's high word
    rnd._RNG.offsets["CPU"] = offset
    got = Tensor._wrap(rnd.random_bits(10, "CPU", 64)).numpy()
    want = _np_threefry(np.arange(offset, offset + 10, dtype=np.uint64), rnd._RNG.seed)
    assert got.dtype == np.uint64 and got.tolist() == want.tolist()
    rnd._RNG.offsets["CPU"] = offset
    assert Tensor._wrap(rnd.random_bits(10, "CPU")).numpy().tolist() == (want >> np.uint64(32)).tolist()
