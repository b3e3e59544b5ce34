"""Masked vector loads and stores (`Renderer.masked_access`): a depthwise convolution's padded rows are read as whole
vectors whose border lanes are masked off, and a row padded to whole vectors is stored through a mask. Both CPU
renderers (this file runs under LLVM and again under the C compiler, test_cpu_c_path.py), for the dtypes whose masks
take AVX's vmaskmovps (4-byte lanes) and those the C renderer masks lane by lane (2 and 8 bytes)."""
from __future__ import annotations

import numpy as np
import pytest

from plugrad import Device, Tensor, dtypes


def _depthwise(x: np.ndarray, w: np.ndarray) -> np.ndarray:
  xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
  h, wd = x.shape[2:]
  return sum(xp[:, :, i:i + h, j:j + wd] * w[None, :, 0, i, j, None, None] for i in range(3) for j in range(3))


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16, dtypes.float64])
@pytest.mark.parametrize("width", [16, 7, 13, 28])
def test_depthwise_rows_are_masked_vector_accesses(dtype, width):
  from plugrad.codegen.opt.heuristic import ONE_VECTOR_PAD_MAX
  if (lanes := Device["CPU"].renderer.vector_width) == 1: pytest.skip("no vector lanes")
  if -width % lanes > width // ONE_VECTOR_PAD_MAX:
    pytest.skip(f"{width}-wide rows grow by more than 1/{ONE_VECTOR_PAD_MAX} to whole {lanes}-lane vectors")
  rng = np.random.default_rng(width)
  x, w = rng.standard_normal((2, 3, 5, width)).astype(np.float32), rng.standard_normal((3, 1, 3, 3)).astype(np.float32)
  t = Tensor(x).cast(dtype).realize().conv2d(Tensor(w).cast(dtype).realize(), padding=1, groups=3)
  (it,) = [i for i in t.schedule() if i.kind == "kernel"]
  src = it.program.source
  if dtype is dtypes.float32: assert "masked.load" in src or "pg_maskload" in src, src
  tol = 2e-2 if dtype is dtypes.float16 else 1e-5
  np.testing.assert_allclose(t.cast(dtypes.float32).numpy(), _depthwise(x, w), rtol=tol, atol=tol)
