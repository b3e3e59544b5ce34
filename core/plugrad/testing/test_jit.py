"""Conformance: JIT capture and replay on the device under test (run tier), and its graph runner (`graph` capability)
compared with per-kernel replay: same numbers, fresh outputs every call, variables and buffers patched per replay."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from plugrad.engine.jit import GraphRunner, TinyJit
from plugrad.helpers import Context
from plugrad.tensor.tensor import Tensor
from plugrad.uop.ops import Variable

pytestmark = pytest.mark.plugrad_conformance
RNG = np.random.default_rng(7)


def rand(*shape: int) -> np.ndarray: return RNG.uniform(-1, 1, shape).astype(np.float32)


def _chain(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
  h = (a @ b).relu().contiguous()
  h = (h * 2 + a).contiguous()
  return h.sum(axis=1), (h - 1).exp2()


def _np_chain(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  h = np.maximum(a @ b, 0) * 2 + a
  return h.sum(axis=1), np.exp2(h - 1)


@pytest.fixture
def graph_device(run_device: str, plugrad_dev: Any) -> str:
  if plugrad_dev.graph is None: pytest.skip(f"{plugrad_dev.name} has no graph runner (no plugrad_graph hook answers for it)")
  return run_device


def _replays(device: str, jit_mode: int, calls: int = 5) -> list[tuple[np.ndarray, ...]]:
  f = TinyJit(_chain)
  rng = np.random.default_rng(3)
  inputs = [tuple(rng.uniform(-1, 1, (8, 8)).astype(np.float32) for _ in range(2)) for _ in range(calls)]
  outs = []
  with Context(JIT=jit_mode):
    for a, b in inputs: outs.append(f(Tensor(a, device=device), Tensor(b, device=device)))
  for (a, b), (s, e) in zip(inputs, outs):  # read only at the end: earlier outputs must not be overwritten by later calls
    ws, we = _np_chain(a, b)
    np.testing.assert_allclose(s.numpy(), ws, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(e.numpy(), we, rtol=1e-4, atol=1e-5)
  return [(s.numpy(), e.numpy()) for s, e in outs]


def test_jit_replays_with_new_inputs(run_device):
  _replays(run_device, jit_mode=2)


def test_graph_runner_matches_per_kernel_replay(graph_device, plugrad_dev):
  assert isinstance(plugrad_dev.graph, type) and issubclass(plugrad_dev.graph, GraphRunner)
  with Context(JIT_BATCH_SIZE=2):  # several batches, so buffers cross from one graph into the next
    graphed = _replays(graph_device, jit_mode=1)
  per_kernel = _replays(graph_device, jit_mode=2)
  for g, p in zip(graphed, per_kernel):
    for x, y in zip(g, p): np.testing.assert_array_equal(x, y)


def test_graph_runner_is_used(graph_device):
  f = TinyJit(_chain)
  for _ in range(3): f(Tensor(rand(8, 8), device=graph_device), Tensor(rand(8, 8), device=graph_device))
  assert f.captured is not None and f.captured.graphs >= 1
  assert any(isinstance(s, GraphRunner) for s in f.captured.steps)


def test_graph_runner_symbolic(graph_device):
  n = Variable("n", 1, 16)
  full = rand(16, 4)
  x = Tensor(full, device=graph_device).realize()
  f = TinyJit(lambda t: (t * 3).contiguous().sum(axis=0) + 1)  # two kernels with `n` in their loops: one graph batch
  for k in (5, 9, 1, 16, 3):
    got = f(x.shrink(((0, n.bind(k)), None)))
    np.testing.assert_allclose(got.numpy(), (full[:k] * 3).sum(axis=0) + 1, rtol=1e-5, atol=1e-5)
  assert f.captured is not None and f.captured.graphs == 1 and f.captured.var_vals.keys() == {"n"}
