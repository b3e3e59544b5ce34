"""The CUDA graph runner: a TinyJit batch becomes one CUDA graph (`cuGraphCreate`, one kernel node per launch with
`cuGraphAddKernelNode`, instantiated once with `cuGraphInstantiateWithFlags`) and each replay is one `cuGraphLaunch`.

A replay with other buffers or other values of the symbolic variables patches only the kernel nodes whose arguments
or launch dims changed (`cuGraphExecKernelNodeSetParams`) in the instantiated graph. The graph is built and
instantiated again only when its topology changes: a symbolic launch size of 0 removes that launch (CUDA cannot
launch an empty grid), so the set of nodes differs.

Building once and patching per replay is the core's `DriverGraphRunner` (with `GraphPlan`, `GraphLaunch`,
`graph_topology`); `CUDAGraph` makes the driver calls, so the logic is unit-tested without a GPU. Edges: the
GraphRunner base's `deps` (read after write, write after read, write after write).

UNVERIFIED HERE (no GPU on the development machine): the driver half runs only on a GPU machine
(bench/gpu/cuda_check.sh runs the conformance suite's graph tests and times replays).
"""
from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from plugrad.backend import Buffer, DriverGraphRunner, GraphKernel, GraphLaunch
from plugrad_cuda.driver import check
from plugrad_cuda.runtime import CUDAProgram, Params

Dims3 = tuple[int, int, int]


class KernelNodeParams(ctypes.Structure):
  """CUDA_KERNEL_NODE_PARAMS_v2 (cuda.h, CUDA 12+): the function, the launch dims, the argument array; kern/ctx unused."""
  _fields_ = [("func", ctypes.c_void_p), ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
              ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint), ("sharedMemBytes", ctypes.c_uint),
              ("kernelParams", ctypes.c_void_p), ("extra", ctypes.c_void_p), ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


def node_params(fn: Any, launch: GraphLaunch, params: Params, shared: int = 0) -> KernelNodeParams:
  """The node description of `launch` (the argument values are written into `params`, whose array it points at;
  `shared`: the dynamic shared memory of a PTX program)."""
  params.set(launch.ptrs, launch.vals)
  return KernelNodeParams(fn.value if isinstance(fn, ctypes.c_void_p) else fn, *launch.grid, *launch.block, shared,
                          ctypes.cast(params.array, ctypes.c_void_p).value, None, None, None)


class CUDAGraph(DriverGraphRunner):
  program_type, backend = CUDAProgram, "CUDA"

  def __init__(self, kernels: Sequence[GraphKernel], slots: Sequence[Buffer], var_names: Sequence[str]):
    super().__init__(kernels, slots, var_names)
    self.rt = self.progs[0].runtime
    self.ctx, self.lib = self.rt.ctx, self.rt.ctx.lib
    self.params = [p.new_params() for p in self.progs]
    self.graph, self.exec = ctypes.c_void_p(), ctypes.c_void_p()

  def _activate(self) -> None: self.ctx.activate()
  def _create(self) -> None: check(self.lib, self.lib.cuGraphCreate(ctypes.byref(self.graph), 0), "cuGraphCreate")

  def _add_node(self, j: int, deps: list[Any], launch: GraphLaunch) -> Any:
    node, dep_arr = ctypes.c_void_p(), (ctypes.c_void_p * max(len(deps), 1))(*deps)
    p = node_params(self.progs[j].fn, launch, self.params[j], self.progs[j].shared)
    check(self.lib, self.lib.cuGraphAddKernelNode_v2(ctypes.byref(node), self.graph, dep_arr if deps else None, ctypes.c_size_t(len(deps)),
                                                     ctypes.byref(p)), f"cuGraphAddKernelNode({self.progs[j].name!r})")
    return node

  def _instantiate(self) -> None:
    check(self.lib, self.lib.cuGraphInstantiateWithFlags(ctypes.byref(self.exec), self.graph, ctypes.c_ulonglong(0)), "cuGraphInstantiateWithFlags")

  def _set_node(self, j: int, node: Any, launch: GraphLaunch) -> None:
    p = node_params(self.progs[j].fn, launch, self.params[j], self.progs[j].shared)
    check(self.lib, self.lib.cuGraphExecKernelNodeSetParams_v2(self.exec, node, ctypes.byref(p)),
          f"cuGraphExecKernelNodeSetParams({self.progs[j].name!r})")

  def _launch(self, wait: bool) -> float | None:
    if wait: check(self.lib, self.lib.cuEventRecord(self.rt.events[0], self.ctx.stream), "cuEventRecord")
    check(self.lib, self.lib.cuGraphLaunch(self.exec, self.ctx.stream), "cuGraphLaunch")
    return self.rt.elapsed() if wait else None

  def _destroy(self) -> None:
    if getattr(self, "exec", None) and self.exec.value: self.lib.cuGraphExecDestroy(self.exec)
    if getattr(self, "graph", None) and self.graph.value: self.lib.cuGraphDestroy(self.graph)
    self.graph, self.exec = ctypes.c_void_p(), ctypes.c_void_p()
