"""ONNX's element types (TensorProto.DataType numbers) as plugrad dtypes."""
from __future__ import annotations

from plugrad.dtype import DType, dtypes
from plugrad.onnx.errors import UnsupportedOnnxOpError

_BY_NUMBER: dict[int, DType] = {1: dtypes.float32, 2: dtypes.uint8, 3: dtypes.int8, 4: dtypes.uint16, 5: dtypes.int16,
                                6: dtypes.int32, 7: dtypes.int64, 9: dtypes.bool, 10: dtypes.float16, 11: dtypes.float64,
                                12: dtypes.uint32, 13: dtypes.uint64, 16: dtypes.bfloat16}
_UNSUPPORTED = {8: "STRING", 14: "COMPLEX64", 15: "COMPLEX128", 17: "FLOAT8E4M3FN", 18: "FLOAT8E4M3FNUZ", 19: "FLOAT8E5M2",
                20: "FLOAT8E5M2FNUZ", 21: "UINT4", 22: "INT4", 23: "FLOAT4E2M1", 24: "FLOAT8E8M0", 25: "UINT2", 26: "INT2"}


def dtype_of(number: int, where: str) -> DType:
  """The plugrad dtype of an ONNX element type; UnsupportedOnnxOpError naming it (and `where`) for one plugrad lacks."""
  if (dt := _BY_NUMBER.get(number)) is not None: return dt
  raise UnsupportedOnnxOpError(f"{where}: ONNX element type {_UNSUPPORTED.get(number, number)} has no plugrad dtype")
