"""plugrad: a small tensor compiler whose device backends are separately installed plugins.

Importing plugrad loads no plugin: devices are discovered on first use (e.g. the first Tensor made).
"""
import functools
from typing import TYPE_CHECKING

import plugrad.trace as trace
from plugrad.device.registry import Device
from plugrad.dtype import dtypes
from plugrad.helpers import Context
from plugrad.plugin.manager import set_builtin_plugin
from plugrad.tensor import Tensor
from plugrad.uop.ops import Variable


# the built-in devices (PYTHON, NULL) are a plugin above the device floor, handed to the plugin manager from here
def _builtin_plugin() -> object:
  import plugrad.builtin.plugin as builtin
  return builtin


set_builtin_plugin(_builtin_plugin)

# the tools above the core's floors hook into the tracing at its floor: VIZ's server and process replay's recorder
if trace.VIZ == 1:
  from plugrad.viz.server import serve
  trace.serve_trace = serve
if trace.REPLAY_DB:
  from plugrad.replay import record_kernel
  trace.set_replay_recorder(functools.partial(record_kernel, trace.REPLAY_DB))

if TYPE_CHECKING:
  from plugrad.engine.jit import TinyJit


def __getattr__(name: str) -> object:
  if name == "TinyJit":  # imported on first use: the JIT pulls in the engine and codegen, which `import plugrad` does not load
    from plugrad.engine.jit import TinyJit
    return TinyJit
  raise AttributeError(f"module 'plugrad' has no attribute {name!r}")


__all__ = ["Context", "Device", "Tensor", "TinyJit", "Variable", "dtypes"]
