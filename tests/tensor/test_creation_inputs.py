"""Odd data given to `Tensor(...)`: numpy masked arrays and lists nested past a tensor's dimensions are refused with
TensorDataError (before anything is uploaded); byte-swapped (big-endian) arrays are read by value, as `dtype=` says."""
from __future__ import annotations

import numpy as np
import pytest

from plugrad import Tensor, dtypes
from plugrad.tensor.creation import MAX_DIMS, TensorDataError

DEV = "PYTHON"


def nested(depth: int) -> list:
  d: list = [1.0]
  for _ in range(depth - 1): d = [d]
  return d


def test_masked_array_is_refused_with_the_remedy():
  ma = np.ma.masked_array([1.0, 2.0, 3.0], mask=[0, 1, 0])
  with pytest.raises(TensorDataError, match="masked array: the mask would be dropped; pass arr.filled\\(value\\)"): Tensor(ma, device=DEV)
  with pytest.raises(TypeError): Tensor(ma, device=DEV, dtype=dtypes.float32)  # also a TypeError (and a ValueError)
  np.testing.assert_array_equal(Tensor(ma.filled(0.0), device=DEV).numpy(), [1.0, 0.0, 3.0])  # what the remedy says works


@pytest.mark.parametrize("depth", [MAX_DIMS + 1, 5000])
def test_over_deep_nesting_is_refused(depth: int):
  with pytest.raises(TensorDataError, match=f"nested more than {MAX_DIMS} levels deep"): Tensor(nested(depth), device=DEV)


def test_over_deep_ragged_branch_is_refused():
  with pytest.raises(TensorDataError, match="nested too deeply"): Tensor([[1.0], nested(5000)], device=DEV)


def test_deepest_allowed_nesting_still_works():
  t = Tensor(nested(32), device=DEV)
  assert t.shape == (1,) * 32 and t.numpy().item() == 1.0


@pytest.mark.parametrize("src, dtype, want", [(">f4", None, dtypes.float32), (">f4", dtypes.float32, dtypes.float32),
                                              (">f8", dtypes.float32, dtypes.float32), (">i4", dtypes.float32, dtypes.float32),
                                              (">i8", dtypes.int64, dtypes.int64), (">u2", None, dtypes.uint16),
                                              (">f4", dtypes.bfloat16, dtypes.bfloat16), ("<f4", dtypes.int32, dtypes.int32)])
def test_byte_swapped_arrays_are_read_by_value(src: str, dtype, want):
  vals = np.array([1, 2, 3, 250], dtype=src)
  t = Tensor(vals, device=DEV, dtype=dtype)
  assert t.dtype is want
  np.testing.assert_array_equal(t.float().numpy(), vals.astype(np.float32))


def test_big_endian_complex_is_still_refused_by_kind():
  with pytest.raises(TypeError, match="only bool, int, uint and float arrays"): Tensor(np.array([1 + 2j], dtype=">c8"), device=DEV)
