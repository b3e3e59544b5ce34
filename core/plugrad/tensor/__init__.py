"""The Tensor front end (docs/tensor.md)."""
from plugrad.tensor.tensor import Tensor

__all__ = ["Tensor"]
