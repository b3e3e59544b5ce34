"""Conformance: symbolic shapes on the device under test. Kernels take a bound Variable's value as an argument: a
cache row written at a Variable position (an assign through a shrink view) and attention over a Variable number of
keys, against numpy, with one program per kernel for every value."""
from __future__ import annotations

import numpy as np
import pytest

from plugrad.engine import realize as realize_mod
from plugrad.tensor.tensor import Tensor
from plugrad.uop.ops import Variable

pytestmark = pytest.mark.plugrad_conformance
RNG = np.random.default_rng(33)


def test_kv_cache_write_and_attention_over_a_variable_length(run_device):
  L, D = 16, 8
  sv = Variable("start_pos", 0, L - 1)
  cache = Tensor(np.zeros((L, D), np.float32), device=run_device).contiguous().realize()
  want = np.zeros((L, D), np.float32)
  q = RNG.standard_normal((1, D)).astype(np.float32)
  qt = Tensor(q, device=run_device).realize()
  programs = None
  for pos in (0, 5, 11, 15, 3):
    row = RNG.standard_normal((1, D)).astype(np.float32)
    sp = sv.bind(pos)
    cache[sp:sp + 1] = Tensor(row, device=run_device)
    want[pos] = row[0]
    keys = cache[:sp + 1]
    got = ((qt @ keys.T).softmax(-1) @ keys).numpy()
    s = q @ want[:pos + 1].T
    e = np.exp(s - s.max())
    np.testing.assert_allclose(got, (e / e.sum()) @ want[:pos + 1], rtol=1e-5, atol=1e-6, err_msg=f"start_pos={pos}")
    if programs is not None: assert len(realize_mod._runners) == programs, f"start_pos={pos} compiled a new program"
    programs = len(realize_mod._runners)
    del keys  # a live view of the cache would be computed (copied) before the next write overwrites what it shows
  np.testing.assert_array_equal(cache.numpy(), want)
