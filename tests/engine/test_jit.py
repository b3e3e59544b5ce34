"""TinyJit on the default device: capture and replay, argument checks, symbolic replay, outputs, state, the memory
planner and batching into graph runners."""
from __future__ import annotations

import numpy as np
import pytest

from plugrad import Device, Tensor, TinyJit, Variable, dtypes
from plugrad.device.buffer import Buffer
from plugrad.device.graph import GraphError, GraphKernel, GraphRunner
from plugrad.engine import jit as jit_mod
from plugrad.engine.jit import JitError, JitInputError
from plugrad.engine.memory import live_ranges, plan_memory
from plugrad.helpers import Context
from plugrad.nn import Linear
from plugrad.nn.optim import SGD
from plugrad.nn.state import get_parameters

RNG = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray: return RNG.uniform(-1, 1, shape).astype(np.float32)


def test_first_call_runs_second_captures_then_replays():
  calls = []
  @TinyJit
  def f(a: Tensor, b: Tensor) -> Tensor:
    calls.append(1)
    return (a * b + 1).sum(axis=0)
  for i in range(6):
    a, b = rand(3, 4), rand(3, 4)
    np.testing.assert_allclose(f(Tensor(a), Tensor(b)).numpy(), (a * b + 1).sum(axis=0), rtol=1e-5)
    assert f.calls == min(i + 1, 2)
  assert len(calls) == 2  # the Python body ran for the first two calls only
  assert f.captured is not None and len(f.captured.items) == 1


def test_outputs_do_not_alias_later_calls():
  f = TinyJit(lambda x: (x + 1).contiguous() * 2)
  xs = [rand(5) for _ in range(5)]
  outs = [f(Tensor(x)) for x in xs]
  for x, o in zip(xs, outs): np.testing.assert_allclose(o.numpy(), (x + 1) * 2, rtol=1e-6)


def test_returns_structures_and_non_tensors():
  f = TinyJit(lambda x: {"sum": x.sum(), "pair": (x * 2, 7), "none": None})
  for _ in range(4):
    x = rand(4)
    out = f(Tensor(x))
    assert out["pair"][1] == 7 and out["none"] is None
    np.testing.assert_allclose(out["sum"].numpy(), x.sum(), rtol=1e-5)
    np.testing.assert_allclose(out["pair"][0].numpy(), x * 2, rtol=1e-6)


def test_returned_inputs_are_this_calls_inputs():
  f = TinyJit(lambda x, y: (x, (x + y).contiguous(), y.T))
  for _ in range(4):
    a, b = rand(2, 3), rand(3, 2)
    x, s, yt = f(Tensor(a), Tensor(b.T.copy()))
    np.testing.assert_array_equal(x.numpy(), a)
    np.testing.assert_array_equal(yt.numpy(), b)
    np.testing.assert_allclose(s.numpy(), a + b.T, rtol=1e-6)


def test_lazy_and_view_inputs():
  f = TinyJit(lambda x: x.sum(axis=1))
  base = rand(4, 6)
  for k in range(4):
    x = Tensor(base + k).T  # a permuted view of a buffer: passed as that buffer, same view every call
    np.testing.assert_allclose(f(x).numpy(), (base + k).T.sum(axis=1), rtol=1e-5)


@pytest.mark.parametrize("bad, msg", [
  (lambda: (Tensor(rand(3, 5)),), r"argument 0: its shape is \(3, 5\), the captured call had \(3, 4\)"),
  (lambda: (Tensor(rand(3, 4).astype(np.float64)),), r"argument 0: its dtype is dtypes.float64, the captured call had dtypes.float32"),
  (lambda: (Tensor(rand(4, 3)).T,), r"argument 0: it is a different view of its buffer"),
  (lambda: (Tensor(rand(3, 4)), Tensor(rand(3, 4))), r"captured with 1 Tensor arguments \(argument 0\), this call passes 2"),
])
def test_replay_checks_arguments(bad, msg):
  f = TinyJit(lambda *xs: sum((x * 2 for x in xs[1:]), xs[0] + 1))
  for _ in range(3): f(Tensor(rand(3, 4)))
  with pytest.raises(JitInputError, match=msg): f(*bad())
  np.testing.assert_allclose(f(Tensor(np.ones((3, 4), np.float32))).numpy(), 2.0)  # a failed check changes nothing


def test_python_values_must_not_change():
  f = TinyJit(lambda x, scale: x * scale)
  for _ in range(3): f(Tensor(rand(4)), scale=2.0)
  with pytest.raises(JitInputError, match=r"argument 'scale' is 3.0, the captured call had 2.0.*Tensors or bound Variables"):
    f(Tensor(rand(4)), scale=3.0)


def test_device_mismatch_names_argument():
  f = TinyJit(lambda x: x + 1)
  for _ in range(3): f(Tensor(rand(4)))
  with pytest.raises(JitInputError, match=r"argument 0: its device is PYTHON, the captured call had CPU"):
    f(Tensor(rand(4), device="PYTHON"))


def test_random_inside_is_refused():
  f = TinyJit(lambda x: x + Tensor.rand(3))
  f(Tensor(rand(3)))
  with pytest.raises(JitError, match=r"draw random numbers .* pass them in as Tensor arguments"): f(Tensor(rand(3)))
  g = TinyJit(lambda x, noise: x + noise)  # the remedy
  for _ in range(3): g(Tensor(rand(3)), Tensor.rand(3))


def test_nothing_to_capture():
  f = TinyJit(lambda x: x)
  f(Tensor(rand(3)))
  with pytest.raises(JitError, match="launched no kernels"): f(Tensor(rand(3)))


def test_symbolic_replay_one_capture_for_every_value():
  n = Variable("n", 1, 32)
  full = rand(32, 3)
  x = Tensor(full).realize()
  f = TinyJit(lambda t, w: ((t * w).contiguous() + 1).sum(axis=0))
  w = Tensor(rand(1, 3))
  for k in (4, 17, 1, 32, 9, 9, 2):
    got = f(x.shrink(((0, n.bind(k)), None)), w)
    np.testing.assert_allclose(got.numpy(), ((full[:k] * w.numpy()) + 1).sum(axis=0), rtol=1e-5, atol=1e-5)
  assert f.captured is not None and set(f.captured.var_vals) == {"n"}


def test_symbolic_output_shape_follows_the_variable():
  n = Variable("n", 1, 16)
  x = Tensor(rand(16)).realize()
  f = TinyJit(lambda t: (t * 2).contiguous())
  for k in (3, 5, 8):
    out = f(x.shrink(((0, n.bind(k)),)))
    assert out.shape[0].render() == "n" and out.shape[0].unbind()[1] == k  # type: ignore[union-attr]


def test_state_updates_match_eager_training():
  def make():
    Tensor.manual_seed(3)
    model = Linear(4, 2)
    return model, SGD(get_parameters(model), lr=0.1)
  xs, ys = [rand(8, 4) for _ in range(6)], [rand(8, 2) for _ in range(6)]
  def step(model, opt, x, y):
    Tensor.training = True
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    return loss
  m1, o1 = make()
  eager = [step(m1, o1, Tensor(x), Tensor(y)).item() for x, y in zip(xs, ys)]
  m2, o2 = make()
  jstep = TinyJit(lambda x, y: step(m2, o2, x, y))
  jitted = [jstep(Tensor(x), Tensor(y)).item() for x, y in zip(xs, ys)]
  np.testing.assert_allclose(jitted, eager, rtol=1e-5)
  np.testing.assert_allclose(m2.weight.numpy(), m1.weight.numpy(), rtol=1e-5)


def test_method_decorator_is_per_instance():
  class Model:
    def __init__(self, k: float): self.k = Tensor([k])
    @TinyJit
    def __call__(self, x: Tensor) -> Tensor: return x * self.k
  a, b = Model(2.0), Model(3.0)
  for _ in range(4):
    x = rand(1)
    np.testing.assert_allclose(a(Tensor(x)).numpy(), x * 2, rtol=1e-6)
    np.testing.assert_allclose(b(Tensor(x)).numpy(), x * 3, rtol=1e-6)


def test_jit_off_just_calls():
  with Context(JIT=0):
    f = TinyJit(lambda x: x + 1)
    for _ in range(3): f(Tensor(rand(2)))
    assert f.captured is None


# ---- memory planner

def _chain(x: Tensor) -> Tensor:
  for i in range(6): x = (x * 1.5 + i).contiguous()
  return x.sum()


def test_memory_planner_shrinks_peak_and_keeps_results(capsys):
  x = rand(1000)
  want = _chain(Tensor(x)).numpy()
  f = TinyJit(_chain)
  with Context(DEBUG=2):
    for _ in range(3): got = f(Tensor(x))
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
  assert f.captured is not None
  plan = f.captured.memory
  assert plan.bytes_before == 6 * 4000 and plan.bytes_after <= 2 * 4096  # six intermediates, two live at a time
  assert "memory planner: 6 intermediate buffers, 24,000 ->" in capsys.readouterr().out


def test_intermediates_of_a_model_with_trainable_weights_are_planned():
  # the result's autograd graph (weights with requires_grad) must not keep the call's intermediates alive
  w, x = Tensor(rand(1000), requires_grad=True), rand(1000)
  f = TinyJit(lambda x: _chain(x * w))
  want = _chain(Tensor(x) * w).numpy()
  for _ in range(3): got = f(Tensor(x))
  np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
  assert f.captured is not None and len(f.captured.memory.replace) >= 6


def test_plan_memory_by_liveness():
  bufs = [Buffer("PYTHON", n, dtypes.float32) for n in (100, 50, 100, 10)]
  a, b, c, d = bufs
  launches = [[a], [b, a], [c, b], [d, c]]  # a dies after launch 1, b after 2
  assert live_ranges(launches, bufs) == {a: (0, 1), b: (1, 2), c: (2, 3), d: (3, 3)}
  plan = plan_memory(launches, bufs)
  assert plan.bytes_before == 1040
  view = plan.replace
  assert view[a].offset == view[c].offset  # a and c never live together: same bytes
  assert view[b].offset + b.nbytes <= view[a].offset or view[a].offset + a.nbytes <= view[b].offset
  assert plan.bytes_after < plan.bytes_before


# ---- batching and graph runners

def test_batches_double():
  assert list(jit_mod._batches(10, 2)) == [(0, 2), (2, 6), (6, 10)]
  assert list(jit_mod._batches(3, 32)) == [(0, 3)]


def _ten(x: Tensor) -> Tensor:
  for _ in range(10): x = (x + 1).contiguous()
  return x


def test_graph_batches_follow_jit_batch_size():
  with Context(JIT_BATCH_SIZE=2):
    f = TinyJit(_ten)
    for _ in range(3): out = f(Tensor(np.zeros(4, np.float32)))
  np.testing.assert_array_equal(out.numpy(), 10)
  assert f.captured is not None and f.captured.graphs == 3


def test_graph_runner_that_declines_falls_back(monkeypatch, capsys):
  class Declines(GraphRunner):
    def __init__(self, *args):
      super().__init__(*args)
      raise GraphError("no room for these kernels")
  monkeypatch.setattr(jit_mod, "_graph_class", lambda device: Declines)
  f = TinyJit(_ten)
  with Context(DEBUG=1):
    for _ in range(3): out = f(Tensor(np.zeros(4, np.float32)))
  np.testing.assert_array_equal(out.numpy(), 10)
  assert f.captured is not None and f.captured.graphs == 0
  assert "Declines declined 10 kernels on CPU, replaying them one by one: no room for these kernels" in capsys.readouterr().out


def test_graph_runner_base_precomputes_dependencies():
  f = TinyJit(lambda a, b: ((a + 1).contiguous() * b).contiguous() + a)
  for _ in range(3): f(Tensor(rand(4)), Tensor(rand(4)))
  assert f.captured is not None
  items = f.captured.items
  slots = [items[0].bufs[1]]  # the input `a`: the one buffer that changes
  g = GraphRunner([GraphKernel(ei.runner, tuple(ei.bufs)) for ei in items if ei.runner is not None], slots, [])
  assert g.deps == [frozenset(), frozenset({0}), frozenset({1})]
  assert (0, 1) in g.slot_uses and g.slot_uses[(0, 1)] == 0
  assert g.compiler is Device[g.device].compiler  # for a runner that compiles code of its own (API 2.7)
  with pytest.raises(NotImplementedError, match="must implement __call__"): g(slots, {})
