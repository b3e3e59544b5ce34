"""The ONNX frontend: `OnnxModel(path)` runs an ONNX model on any plugrad device, its operators mapped onto the Tensor
API (docs/onnx.md). Needs the `onnx` package (`pip install 'plugrad[onnx]'`) to parse models."""
from plugrad.onnx.errors import OnnxError, UnsupportedOnnxOpError
from plugrad.onnx.model import InputSpec, OnnxModel, run_onnx
from plugrad.onnx.ops import OPS

SUPPORTED_OPS: frozenset[str] = frozenset([*OPS, "Constant"])

__all__ = ["SUPPORTED_OPS", "InputSpec", "OnnxError", "OnnxModel", "UnsupportedOnnxOpError", "run_onnx"]
