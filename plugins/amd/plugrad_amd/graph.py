"""The hipGraph runner (the command-queue role): a TinyJit batch recorded once as one hipGraph (`hipGraphCreate`, one
kernel node per launch with `hipGraphAddKernelNode` and its dependencies, `hipGraphInstantiateWithFlags` once); each
replay is one `hipGraphLaunch` on the device's stream.

A replay with other buffers or other values of the symbolic variables patches only the kernel nodes whose arguments
or launch dims changed, in place in the instantiated graph (`hipGraphExecKernelNodeSetParams`). The graph is built
and instantiated again only when its topology changes: a symbolic launch size of 0 removes that launch (a grid of 0
cannot launch), so the set of nodes differs.

Each node carries its arguments as a packed kernarg buffer (`extra` = HIP_LAUNCH_PARAM_BUFFER_POINTER ..., the same
`Kernargs` the direct launch uses), one per node, kept alive by the runner and updated in place.

Building once and patching per replay is the core's `DriverGraphRunner` (with `GraphPlan`, `GraphLaunch`,
`graph_topology`); `HIPGraph` makes the HIP calls, so the logic is tested without a driver (plugins/amd/tests).
Edges: the GraphRunner base's `deps` (read after write, write after read, write after write).

UNVERIFIED (no AMD GPU on this project's machines): the HIP half has never run against HIP; plugins/amd/tests drives
it through a stand-in library that records the nodes, dependencies and patches (amd_fake_hip.py there).
"""
from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from plugrad.backend import Buffer, DriverGraphRunner, GraphKernel, GraphLaunch
from plugrad_amd.hip import check
from plugrad_amd.runtime import AMDProgram, Kernargs

Dims3 = tuple[int, int, int]


class Dim3(ctypes.Structure):
  _fields_ = [("x", ctypes.c_uint32), ("y", ctypes.c_uint32), ("z", ctypes.c_uint32)]


class KernelNodeParams(ctypes.Structure):
  """hipKernelNodeParams (hip_runtime_api.h): blockDim, extra, func, gridDim, kernelParams, sharedMemBytes, in this order."""
  _fields_ = [("blockDim", Dim3), ("extra", ctypes.c_void_p), ("func", ctypes.c_void_p), ("gridDim", Dim3), ("kernelParams", ctypes.c_void_p),
              ("sharedMemBytes", ctypes.c_uint)]


def node_params(fn: Any, launch: GraphLaunch, args: Kernargs) -> KernelNodeParams:
  """The node description of `launch`: its arguments are written into `args`, whose `extra` array it points at."""
  args.set(launch.ptrs, launch.vals)
  return KernelNodeParams(Dim3(*launch.block), ctypes.cast(args.extra, ctypes.c_void_p).value, fn.value if isinstance(fn, ctypes.c_void_p) else fn,
                          Dim3(*launch.grid), None, 0)


class HIPGraph(DriverGraphRunner):
  program_type, backend = AMDProgram, "AMD"

  def __init__(self, kernels: Sequence[GraphKernel], slots: Sequence[Buffer], var_names: Sequence[str]):
    super().__init__(kernels, slots, var_names)
    self.rt = self.progs[0].runtime
    self.ctx, self.lib = self.rt.ctx, self.rt.ctx.lib
    self.args = [Kernargs(p.nbufs, p.var_sizes) for p in self.progs]  # one per node: a node keeps pointing at its buffer
    self.graph, self.exec = ctypes.c_void_p(), ctypes.c_void_p()

  def _activate(self) -> None: self.ctx.activate()
  def _create(self) -> None: check(self.lib, self.lib.hipGraphCreate(ctypes.byref(self.graph), 0), "hipGraphCreate")

  def _add_node(self, j: int, deps: list[Any], launch: GraphLaunch) -> Any:
    node, dep_arr = ctypes.c_void_p(), (ctypes.c_void_p * max(len(deps), 1))(*deps)
    p = node_params(self.progs[j].fn, launch, self.args[j])
    check(self.lib, self.lib.hipGraphAddKernelNode(ctypes.byref(node), self.graph, dep_arr if deps else None, ctypes.c_size_t(len(deps)),
                                                   ctypes.byref(p)), f"hipGraphAddKernelNode({self.progs[j].name!r})")
    return node

  def _instantiate(self) -> None:
    check(self.lib, self.lib.hipGraphInstantiateWithFlags(ctypes.byref(self.exec), self.graph, ctypes.c_ulonglong(0)), "hipGraphInstantiateWithFlags")

  def _set_node(self, j: int, node: Any, launch: GraphLaunch) -> None:
    p = node_params(self.progs[j].fn, launch, self.args[j])
    check(self.lib, self.lib.hipGraphExecKernelNodeSetParams(self.exec, node, ctypes.byref(p)),
          f"hipGraphExecKernelNodeSetParams({self.progs[j].name!r})")

  def _launch(self, wait: bool) -> float | None:
    if wait: check(self.lib, self.lib.hipEventRecord(self.rt.events[0], self.ctx.stream), "hipEventRecord")
    check(self.lib, self.lib.hipGraphLaunch(self.exec, self.ctx.stream), "hipGraphLaunch")
    return self.rt.elapsed() if wait else None

  def _destroy(self) -> None:
    if getattr(self, "exec", None) and self.exec.value: self.lib.hipGraphExecDestroy(self.exec)
    if getattr(self, "graph", None) and self.graph.value: self.lib.hipGraphDestroy(self.graph)
    self.graph, self.exec = ctypes.c_void_p(), ctypes.c_void_p()
