"""plugrad: a small tensor compiler whose device backends are separately installed plugins.

Importing plugrad loads no plugin: devices are discovered on first use (e.g. the first Tensor made).
"""
from typing import TYPE_CHECKING

from plugrad.device.registry import Device
from plugrad.dtype import dtypes
from plugrad.helpers import Context
from plugrad.tensor import Tensor
from plugrad.uop.ops import Variable

if TYPE_CHECKING:
  from plugrad.engine.jit import TinyJit


def __getattr__(name: str) -> object:
  if name == "TinyJit":  # imported on first use: the JIT pulls in the engine and codegen, which `import plugrad` does not load
    from plugrad.engine.jit import TinyJit
    return TinyJit
  raise AttributeError(f"module 'plugrad' has no attribute {name!r}")


__all__ = ["Context", "Device", "Tensor", "TinyJit", "Variable", "dtypes"]
