"""Conformance: kernels from outside plugrad (`plugrad.backend.new_program` / `run_program`) on the device under test.

The kernel is one the device's own renderer wrote, rebuilt from nothing but its source and signature, so the test
needs no hand-written code for the device: whatever the device's compiler and runtime accept from plugrad they must
accept from a stranger, with identical results, run eagerly and replayed by TinyJit."""
from __future__ import annotations

import numpy as np
import pytest

from plugrad.backend import ProgramUOp, new_program, run_program
from plugrad.engine.jit import TinyJit
from plugrad.tensor.tensor import Tensor
from plugrad.uop.ops import Ops

pytestmark = pytest.mark.plugrad_conformance
RNG = np.random.default_rng(11)


def _rebuilt(device: str) -> tuple[ProgramUOp, Tensor, Tensor, Tensor]:
  """(the rebuilt PROGRAM, a, b, the expression it computes) for out = sum((a * b + 1).exp2(), axis=1)."""
  a = Tensor(RNG.uniform(-1, 1, (20, 15)).astype(np.float32), device=device).realize()
  b = Tensor(RNG.uniform(-1, 1, 15).astype(np.float32), device=device).realize()
  expr = (a * b + 1).exp2().sum(axis=1)
  (item,) = expr.schedule()
  p = item.program
  q = new_program(p.name, p.device, source=p.source, buffers=p.signature, global_size=p.global_size, local_size=p.local_size, vars=p.vars)
  assert q.signature == p.signature and q.globals == p.globals and q.launch_dims() == p.launch_dims()
  by_buffer = {t.uop if t.uop.op is Ops.BUFFER else t.uop.src[0]: t for t in (a, b)}
  first, second = (by_buffer[u] for u in item.bufs[1:])
  return q, first, second, expr


def test_a_kernel_rebuilt_from_its_source_and_signature_gives_identical_results(run_device: str):
  q, x, y, expr = _rebuilt(run_device)
  out = Tensor.empty(20, device=run_device)
  run_program(q, out, x, y)
  assert out.numpy().tobytes() == expr.numpy().tobytes()


def test_a_rebuilt_kernel_replays_under_tinyjit(run_device: str):
  q, x, y, expr = _rebuilt(run_device)

  @TinyJit
  def f(first: Tensor, second: Tensor) -> Tensor:
    out = Tensor.empty(20, device=run_device)
    run_program(q, out, first, second)
    return out * 1

  got = [f(x * s, y).numpy() for s in (1.0, 1.0, 1.0, 2.0, 0.5)]  # captured on the second call, replayed after
  for s, g in zip((1.0, 1.0, 1.0, 2.0, 0.5), got):
    want = np.exp2(x.numpy() * s * y.numpy() + 1).sum(axis=1)  # the product broadcasts whichever operand is first
    np.testing.assert_allclose(g, want, rtol=1e-5)
  np.testing.assert_array_equal(got[2], expr.numpy())
