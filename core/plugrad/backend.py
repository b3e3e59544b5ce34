"""The backend contract: the one module a device backend imports (docs/writing-a-backend.md).

A backend (an in-repo plugin, a third party's `plugrad-vulkan`, or the built-in PYTHON and NULL devices in
`plugrad/builtin/`) imports from here and from the user-facing `plugrad` names (`dtypes`, `Tensor`, ...), nothing
else. `API_VERSION` versions exactly this namespace with semantic versioning: a name removed or a signature changed
is a major bump, a name added a minor one. Everything else in the core is private to it and may change in any release.

What is here, by the job it does:

* registration: `hookimpl`, `for_device` (a component hook that answers only for the plugin's devices), `DeviceSpec`,
  `API_VERSION`, `device_name`, `parse_device`
* errors: `DeviceError` and its typed subclasses (`CompileError`, `LaunchError`, `DeviceUnavailableError`, ...)
* dtypes: `DType`, `PtrDType`, `AddrSpace`, `dtypes`
* the IR: `UOp`, `Ops`, `GroupOp`, `AxisType`, `KernelInfo`, `UPat`, `PatternMatcher`, `graph_rewrite`
* the PROGRAM: `ProgramUOp` (its accessors: `name`, `device`, `uops`, `source`, `binary`, `globals`, `ins`, `outs`,
  `vars`, `global_size`, `local_size`, `launch_dims`, `estimates`, `signature`, `external`), `ProgramError`, `Estimates`
* kernels written outside plugrad: `new_program` (a PROGRAM from source or binary and a declared signature),
  `run_program` (runs one on Tensors; TinyJit captures it), `ProgramArgumentError`
* rendering: `Renderer` (capability flags, `dtype_support`, `extra_matcher`, `extra_passes`), `CStyleRenderer` (the C
  family's dialect hooks) and its `Ptr` (a rendered pointer: `render_atomic_add`'s argument), `linear_parts`,
  `use_analysis`, `define_of`, `index_parts`, `and_gates` and `lane_gate` (a pointer's address parts and gates, for any
  renderer of pointers), `no_signed_wrap`, `PURE`, `c_identifier`, `float32_repr`, tensor-core tables
* compiling: `Compiler` (with the verified disk cache: `compile_cached`, `load_cached`)
* memory: `Allocator`, `StagedAllocator` (host copies through pinned staging buffers), `BufferSpec`, `Buffer`
* running: `Runtime` (loads a PROGRAM's binary into a callable program), `Dims`
* batching: `GraphRunner` (with the device's `compiler`), `GraphKernel`, `GraphError`; for graphs of kernel nodes `GraphPlan`, `GraphLaunch`,
  `GraphTopology`, `graph_topology`, and `DriverGraphRunner` (a driver graph built once, patched per replay: CUDA, HIP)
* helpers a backend reads: `DEBUG`, `getenv`, `prod`
* settings: `getenv` (typed and checked: `choices`, `minimum`, `maximum`), `parse_setting` (the same for a given
  environment mapping), `SettingsError` (a bad value, naming the variable)
"""
from __future__ import annotations

from plugrad.device.allocator import Allocator, BufferSpec, StagedAllocator
from plugrad.device.buffer import Buffer
from plugrad.device.compiler import Compiler
from plugrad.device.custom import new_program, run_program
from plugrad.device.graph import DriverGraphRunner, GraphError, GraphKernel, GraphLaunch, GraphPlan, GraphRunner, GraphTopology, graph_topology
from plugrad.device.runtime import Dims, Runtime
from plugrad.dtype import AddrSpace, DType, PtrDType, dtypes
from plugrad.errors import (
  CompileError,
  DeviceError,
  DeviceUnavailableError,
  LaunchError,
  OutOfMemoryError,
  PluginHookError,
  UnsupportedDTypeError,
)
from plugrad.helpers import DEBUG, SettingsError, getenv, parse_setting, prod
from plugrad.plugin.hookspecs import API_VERSION, DeviceSpec, device_name, for_device, hookimpl, parse_device
from plugrad.renderer.base import (
  CAPABILITIES,
  PURE,
  Dims3,
  Renderer,
  RendererError,
  and_gates,
  define_of,
  index_parts,
  linear_parts,
  no_signed_wrap,
  use_analysis,
  workgroup_threads,
)
from plugrad.renderer.cstyle import CStyleRenderer, Ptr, c_identifier, float32_repr
from plugrad.renderer.tensor_cores import (
  AMD_MFMA_TENSOR_CORES,
  AMD_TENSOR_CORES,
  CPU_AMX_TENSOR_CORES,
  CPU_AVX512_TENSOR_CORES,
  CUDA_TENSOR_CORES,
  METAL_TENSOR_CORES,
  TensorCore,
  UnknownTensorCoreError,
  find_tensor_core,
)
from plugrad.uop.ops import AxisType, GroupOp, KernelInfo, Ops, UOp, lane_gate
from plugrad.uop.pattern import PatternMatcher, UPat
from plugrad.uop.program import Estimates, ProgramArgumentError, ProgramError, ProgramStageError, ProgramUOp
from plugrad.uop.rewrite import graph_rewrite

__all__ = [
  # registration
  "API_VERSION", "DeviceSpec", "device_name", "for_device", "hookimpl", "parse_device",
  # errors
  "CompileError", "DeviceError", "DeviceUnavailableError", "GraphError", "LaunchError", "OutOfMemoryError", "PluginHookError",
  "ProgramArgumentError", "ProgramError", "ProgramStageError", "RendererError", "UnknownTensorCoreError", "UnsupportedDTypeError",
  # dtypes and the IR
  "AddrSpace", "DType", "PtrDType", "dtypes", "AxisType", "GroupOp", "KernelInfo", "Ops", "UOp", "PatternMatcher", "UPat", "graph_rewrite",
  # the PROGRAM
  "Estimates", "ProgramUOp", "new_program", "run_program",
  # rendering
  "CAPABILITIES", "PURE", "Dims3", "Renderer", "CStyleRenderer", "Ptr", "c_identifier", "float32_repr", "define_of", "linear_parts", "use_analysis",
  "index_parts", "and_gates", "lane_gate", "workgroup_threads",
  "no_signed_wrap",
  "AMD_MFMA_TENSOR_CORES", "AMD_TENSOR_CORES", "CUDA_TENSOR_CORES", "METAL_TENSOR_CORES", "TensorCore", "find_tensor_core",
  "CPU_AMX_TENSOR_CORES", "CPU_AVX512_TENSOR_CORES",
  # compiling, memory, running, batching
  "Compiler", "Allocator", "StagedAllocator", "BufferSpec", "Buffer", "Dims", "Runtime",
  "GraphKernel", "GraphRunner", "DriverGraphRunner", "GraphPlan", "GraphLaunch", "GraphTopology",
  "graph_topology",
  # helpers
  "DEBUG", "getenv", "prod",
  # settings
  "SettingsError", "parse_setting",
]

# Names that left the contract, kept importable until the next major version. `Device` is the user-level registry (a
# backend that needs it imports `plugrad.Device`, as user code does; a graph runner reads its `compiler`).
_DEPRECATED = {"Device": ("plugrad.device.registry", "API 2.7: import Device from plugrad (or use GraphRunner.compiler); "
                          "plugrad.backend.Device goes in 3.0")}


def __getattr__(name: str) -> object:
  if (old := _DEPRECATED.get(name)) is None: raise AttributeError(f"module 'plugrad.backend' has no attribute {name!r}")
  import importlib
  import warnings
  warnings.warn(f"plugrad.backend.{name} is deprecated ({old[1]})", DeprecationWarning, stacklevel=2)
  return getattr(importlib.import_module(old[0]), name)
