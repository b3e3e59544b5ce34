"""The core's plan for graphs of kernel nodes (`GraphPlan`, `graph_topology`, GraphRunner.deps), which the CUDA-graph
and hipGraph runners build on (their native halves cannot run here: no GPU): computed from a real TinyJit capture on
PYTHON, whose graph runner gets the same base tables."""
import numpy as np

from plugrad import Tensor, TinyJit, Variable
from plugrad.backend import GraphLaunch, GraphPlan, graph_topology
from plugrad.helpers import Context


def test_topology_drops_empty_launches_and_keeps_the_order():
  full, empty = GraphLaunch((4, 1, 1), (32, 1, 1), (1,), ()), GraphLaunch((0, 1, 1), (32, 1, 1), (1,), ())
  deps = [frozenset(), frozenset({0}), frozenset({1}), frozenset()]
  assert graph_topology(deps, [full] * 4) == ((0, ()), (1, (0,)), (2, (1,)), (3, ()))
  # kernel 1 launches nothing: kernel 2 still waits for kernel 0
  assert graph_topology(deps, [full, empty, full, full]) == ((0, ()), (2, (0,)), (3, ()))


def _captured_plans(monkeypatch, step, calls):
  from plugrad.builtin.interpreter_graph import PythonGraph
  seen: list = []
  orig = PythonGraph.__call__
  def spy(self, slots, var_vals, wait=False):
    self._plan = getattr(self, "_plan", None) or GraphPlan(self, ptr=id)  # handles addressed by id(), not device pointers
    seen.append((self._plan, self._plan.launches(slots, var_vals)))
    return orig(self, slots, var_vals, wait)
  monkeypatch.setattr(PythonGraph, "__call__", spy)
  f = TinyJit(step)
  with Context(JIT=1): outs = [f(*c).numpy() for c in calls]
  return seen, outs


def test_graph_plan_from_a_tinyjit_capture(monkeypatch):
  n = Variable("n", 1, 64)
  def step(a, b, n):
    x = (a * 2 + b).contiguous()
    y = (x * x - a).contiguous()
    z = (b + 1).contiguous()
    return (y + z).shrink(((0, n),)).sum().realize()
  vals = (10, 20, 30, 40)
  calls = [tuple(Tensor(np.full(64, v, np.float32), device="PYTHON") for _ in range(2)) + (n.bind(v),) for v in vals]
  seen, outs = _captured_plans(monkeypatch, step, calls)
  assert len(seen) >= 2
  plan = seen[-1][0]
  assert all(p is plan for p, _ in seen), "one plan per captured batch"
  assert plan.runner.deps[1] >= {0}, "y reads x"
  l1, l2 = seen[-2][1], seen[-1][1]
  assert plan.topology(l1) == plan.topology(l2), "same topology: a replay only patches node parameters"
  changed = [j for j in range(len(l1)) if l1[j] != l2[j]]
  assert changed and any(l1[j].vals != l2[j].vals for j in changed), "new inputs and a new n patch the kernels that use them"
  for v, got in zip(vals, outs):
    np.testing.assert_allclose(got, (((v * 2.0 + v) ** 2 - v) + (v + 1.0)) * v, rtol=1e-5)


def test_deps_order_writes_after_writes(monkeypatch):
  # two kernels write the same buffer with no read between: a graph that runs independent nodes concurrently must
  # still order them (the last write wins), as a sequential replay does
  def step(a):
    out = Tensor.zeros(16, device="PYTHON").contiguous().realize()
    out.assign(a * 2).realize()
    out.assign(a + 1).realize()
    return out
  calls = [(Tensor(np.full(16, v, np.float32), device="PYTHON"),) for v in (1, 2, 3)]
  seen, outs = _captured_plans(monkeypatch, step, calls)
  assert seen
  deps = seen[-1][0].runner.deps
  writers = [j for j, k in enumerate(seen[-1][0].runner.kernels) if k.runner.program.outs]
  assert all(deps[b] >= {a} for a, b in zip(writers, writers[1:])), deps
  for v, got in zip((1, 2, 3), outs): np.testing.assert_array_equal(got, np.full(16, v + 1.0))
