"""plugrad: a small tensor compiler whose device backends are separately installed plugins.

Importing plugrad loads no plugin: devices are discovered on first use (e.g. the first Tensor made).
"""
from plugrad.device.registry import Device
from plugrad.dtype import dtypes
from plugrad.helpers import Context
from plugrad.tensor import Tensor
from plugrad.uop.ops import Variable

__all__ = ["Context", "Device", "Tensor", "Variable", "dtypes"]
