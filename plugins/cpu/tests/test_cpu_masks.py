"""Vector comparisons that only feed WHEREs render as GNU C lane masks and bit selection (no bool vectors, which gcc
compiles lane by lane and slowly), with the scalar semantics (NaN compares false)."""
from __future__ import annotations

import numpy as np

from plugrad import Tensor


def test_vector_relu_uses_lane_masks_and_keeps_semantics():
  x = np.linspace(-3, 3, 4096, dtype=np.float32).reshape(64, 64)
  x[3, 5], x[7, 9] = np.nan, -np.inf
  t = (Tensor(x) * 2 + 1).relu().sum(1)
  (it,) = [i for i in t.schedule() if i.kind == "kernel"]
  src = it.program.source
  if "vector_size" in src:  # vectorized on this machine: the WHERE chooses by a mask, not a struct of _Bool
    assert "_Bool v[" not in src and "&(" in src and "~" in src
  want = np.maximum(x * 2 + 1, 0)
  want[3, 5] = 0.0  # (0 < nan) is false: relu(nan) picks 0, as the scalar C and the interpreter do
  np.testing.assert_allclose(t.numpy(), want.sum(1), rtol=1e-5)
