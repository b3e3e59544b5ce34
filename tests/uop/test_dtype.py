import pickle

import numpy as np
import pytest

from plugrad.dtype import AddrSpace, PtrDType, dtypes, least_upper_dtype, sum_acc_dtype, to_dtype


def test_namespace_has_every_dtype():
  names = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "bfloat16", "float32", "float64",
           "default_float", "default_int"]
  for n in names: assert getattr(dtypes, n).itemsize > 0
  assert dtypes.default_float is dtypes.float32 and dtypes.default_int is dtypes.int32
  assert dtypes.half is dtypes.float16 and dtypes.double is dtypes.float64


def test_interned_and_picklable():
  assert dtypes.float32.vec(4) is dtypes.float32.vec(4)
  assert dtypes.float32.ptr(16, AddrSpace.LOCAL) is dtypes.float32.ptr(16, AddrSpace.LOCAL)
  for dt in (dtypes.float32, dtypes.int8.vec(3), dtypes.half.ptr(8), dtypes.float32.ptr(-1, AddrSpace.REG).vec(4)):
    assert pickle.loads(pickle.dumps(dt)) is dt


def test_vector_and_pointer():
  v = dtypes.float32.vec(8)
  assert (v.count, v.itemsize, v.scalar()) == (8, 32, dtypes.float32)
  p = dtypes.float32.ptr(10)
  assert isinstance(p, PtrDType) and p.base is dtypes.float32 and p.size == 10 and p.addrspace is AddrSpace.GLOBAL
  with pytest.raises(TypeError, match="already a vector"): v.vec(2)
  with pytest.raises(TypeError, match="pointer to pointer"): p.ptr()
  with pytest.raises(ValueError, match="positive"): dtypes.float32.vec(0)


@pytest.mark.parametrize("a, b, want", [
  (dtypes.int8, dtypes.uint8, dtypes.int16), (dtypes.int64, dtypes.float16, dtypes.float16), (dtypes.bool, dtypes.float32, dtypes.float32),
  (dtypes.float16, dtypes.bfloat16, dtypes.float32), (dtypes.int32, dtypes.float32, dtypes.float32), (dtypes.uint32, dtypes.int32, dtypes.int64),
  (dtypes.uint64, dtypes.int64, dtypes.float16), (dtypes.bool, dtypes.bool, dtypes.bool), (dtypes.float32, dtypes.float64, dtypes.float64),
])
def test_promotion_lattice(a, b, want):
  assert least_upper_dtype(a, b) is want and least_upper_dtype(b, a) is want


def test_promotion_errors_and_sum_acc():
  with pytest.raises(ValueError): least_upper_dtype()
  with pytest.raises(TypeError, match="promotion"): least_upper_dtype(dtypes.void, dtypes.int8)
  assert sum_acc_dtype(dtypes.int8) is dtypes.int32 and sum_acc_dtype(dtypes.uint8) is dtypes.uint32
  assert sum_acc_dtype(dtypes.float16) is dtypes.float32 and sum_acc_dtype(dtypes.bool) is dtypes.int32


def test_numpy_conversion():
  for dt in dtypes.all:
    if dt is dtypes.bfloat16:
      with pytest.raises(TypeError, match="bfloat16"): dtypes.to_numpy(dt)
      continue
    assert dtypes.from_numpy(dtypes.to_numpy(dt)) is dt
    assert np.dtype(dtypes.to_numpy(dt)).itemsize == dt.itemsize
  with pytest.raises(TypeError, match="has no plugrad dtype"): dtypes.from_numpy(np.complex64)
  assert to_dtype("float16") is dtypes.float16 and to_dtype(np.int32) is dtypes.int32
  with pytest.raises(ValueError, match="unknown dtype"): to_dtype("float7")


def test_const_conversion_and_limits():
  assert dtypes.as_const(300, dtypes.int8) == 44 and dtypes.as_const(-1, dtypes.uint16) == 65535
  assert dtypes.as_const(3.9, dtypes.int32) == 3 and dtypes.as_const(2, dtypes.float32) == 2.0 and dtypes.as_const(2, dtypes.bool) is True
  assert (dtypes.min(dtypes.int8), dtypes.max(dtypes.int8), dtypes.max(dtypes.uint32)) == (-128, 127, 2**32 - 1)
  assert dtypes.from_py(1.0) is dtypes.float32 and dtypes.from_py(True) is dtypes.bool and dtypes.from_py([1, 2.0]) is dtypes.float32
  assert dtypes.finfo(dtypes.bfloat16) == (8, 7)
  with pytest.raises(ValueError, match="cannot convert"): dtypes.as_const(float("inf"), dtypes.int32)
