"""plugrad-cpu's graph runner: a captured batch replayed by one native call per thread, with barriers between
dependent kernels, compared with per-kernel replay and numpy."""
from __future__ import annotations

import numpy as np

from plugrad import Tensor, TinyJit
from plugrad.helpers import Context
from plugrad_cpu.graph import CPUGraph, _source

N = 1 << 20  # big enough that each kernel is split across threads (runtime.WORK_PER_THREAD)


def _step(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
  x = (a * 2 + b).contiguous()
  y = (x * x - a).contiguous()  # depends on x: a barrier in between
  z = (b + 1).contiguous()      # independent of x and y
  return (y + z).sum(), y


def test_parallel_batch_matches_numpy_and_per_kernel():
  rng = np.random.default_rng(0)
  ins = [(rng.random(N, dtype=np.float32), rng.random(N, dtype=np.float32)) for _ in range(4)]
  def run(jit: int) -> list[tuple[np.ndarray, np.ndarray]]:
    f = TinyJit(_step)
    with Context(JIT=jit): outs = [f(Tensor(a), Tensor(b)) for a, b in ins]
    if jit == 1:
      graphs = [s for s in f.captured.steps if isinstance(s, CPUGraph)]
      assert len(graphs) == 1 and max(graphs[0].threads) >= 1
    return [(s.numpy(), y.numpy()) for s, y in outs]
  graphed, per_kernel = run(1), run(2)
  for (a, b), (s, y), (s2, y2) in zip(ins, graphed, per_kernel):
    want_y = (a * 2 + b) ** 2 - a
    np.testing.assert_allclose(y, want_y, rtol=1e-6)
    np.testing.assert_array_equal(y, y2)
    np.testing.assert_allclose(s, (want_y + b + 1).sum(dtype=np.float64), rtol=1e-4)
    np.testing.assert_array_equal(s, s2)


def test_barriers_only_between_dependent_kernels():
  f = TinyJit(_step)
  for _ in range(3): f(Tensor(np.ones(N, np.float32)), Tensor(np.ones(N, np.float32)))
  (g,) = [s for s in f.captured.steps if isinstance(s, CPUGraph)]
  # kernels in order: x, y (reads x), z (independent), y + z reduction (reads y, z)
  deps = g.deps
  src = _source(g.progs, [bool(deps[j] & set(range(j))) for j in range(len(g.progs))])
  assert src.count("plugrad_graph(") == 1 and "bar_wait(cores, &sense)" in src
  assert deps[1] == frozenset({0})
