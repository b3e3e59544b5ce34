"""Tensor programs on OPENCL against numpy: matmul, reductions, softmax, the 16/64-bit dtypes, and the JIT's graph runner."""
from __future__ import annotations

import numpy as np
import pytest

from plugrad import Device, Tensor, TinyJit, Variable, dtypes
from plugrad_opencl.graph import OpenCLGraph

RNG = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray: return RNG.uniform(-2, 2, shape).astype(np.float32)


def test_matmul(opencl: str) -> None:
  a, b = rand(37, 21), rand(21, 19)
  np.testing.assert_allclose((Tensor(a, device=opencl) @ Tensor(b, device=opencl)).numpy(), a @ b, rtol=1e-5, atol=1e-5)


def test_reductions(opencl: str) -> None:
  x = rand(13, 70)
  t = Tensor(x, device=opencl)
  np.testing.assert_allclose(t.sum(axis=1).numpy(), x.sum(axis=1), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(t.max(axis=0).numpy(), x.max(axis=0))
  np.testing.assert_allclose(t.mean().numpy(), x.mean(), rtol=1e-5)


def test_softmax(opencl: str) -> None:
  x = rand(9, 33)
  e = np.exp(x - x.max(axis=-1, keepdims=True))
  np.testing.assert_allclose(Tensor(x, device=opencl).softmax(-1).numpy(), e / e.sum(axis=-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_half_and_64_bit_types(opencl: str) -> None:
  x = rand(64)
  h = Tensor(x, device=opencl).cast(dtypes.float16)
  np.testing.assert_array_equal((h * 3 + 1).numpy(), x.astype(np.float16) * np.float16(3) + np.float16(1))
  i = np.arange(-50, 50, dtype=np.int64) * 123_456_789_013
  np.testing.assert_array_equal((Tensor(i, device=opencl) // 7).numpy(), i // 7)  # floor division, as numpy
  if "float64" not in Device[opencl].renderer.capabilities: pytest.skip(f"{opencl} has no float64 (no cl_khr_fp64)")
  d = x.astype(np.float64)
  np.testing.assert_allclose(Tensor(d, device=opencl).exp().sum().numpy(), np.exp(d).sum(), rtol=1e-12)


def test_jit_replays_through_the_graph_runner(opencl: str) -> None:
  assert Device[opencl].graph is OpenCLGraph
  n = Variable("n", 1, 32)
  w = rand(32, 8)
  weights = Tensor(w, device=opencl).realize()
  f = TinyJit(lambda x, rows: ((x @ weights.shrink(((0, rows), None))).relu() + 1).sum(axis=1))
  for k in (5, 17, 32, 1, 9):
    x = rand(4, k)
    got = f(Tensor(np.pad(x, ((0, 0), (0, 32 - k))), device=opencl).shrink((None, (0, n.bind(k)))), n.bind(k))
    np.testing.assert_allclose(got.numpy(), (np.maximum(x @ w[:k], 0) + 1).sum(axis=1), rtol=1e-5, atol=1e-5)
  assert f.captured is not None and f.captured.graphs >= 1
  assert any(isinstance(s, OpenCLGraph) for s in f.captured.steps)


def test_device_to_device_copy(opencl: str) -> None:
  from plugrad.backend import Buffer
  assert Device[opencl].allocator.supports_transfer
  x = rand(100)
  np.testing.assert_array_equal(Buffer.from_numpy(opencl, x).copy_to(opencl).numpy(), x)
