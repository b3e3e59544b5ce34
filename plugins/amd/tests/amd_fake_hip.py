"""A stand-in for `libamdhip64.so`, so that plugrad-amd's runtime, allocator and hipGraph runner can be driven
through the real plugrad stack (Device["AMD"], Tensors, TinyJit) on a machine without ROCm.

It implements the HIP calls plugrad-amd makes, with the argument conventions of the real library as ctypes passes
them (pointers by `byref`, handles as `c_void_p`, sizes as `c_size_t`), and records what it is asked to do: device
memory is Python bytearrays at fake addresses, copies move real bytes, a module load parses the code object, and a
kernel launch or graph node records its grid, block and the kernarg bytes read through the `extra` array. It does NOT
execute kernels: what it checks is what plugrad hands to HIP, not what a GPU would compute. Passing tests against it
say nothing about the real runtime beyond that.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

from plugrad_amd.elf import CodeObject


def val(x: Any) -> Any:
  return x.value if hasattr(x, "value") else x


def out(ref: Any, value: Any) -> int:
  """Write through a `byref(...)` out-parameter."""
  ref._obj.value = value
  return 0


@dataclass
class Launch:
  fn: int
  grid: tuple[int, int, int]
  block: tuple[int, int, int]
  kernargs: bytes


@dataclass
class Node:
  handle: int
  deps: tuple[int, ...]
  launch: Launch


@dataclass
class Graph:
  handle: int
  nodes: list[Node] = field(default_factory=list)


class FakeHIP:
  DEVICE_BASE = 0x7F00_0000_0000

  def __init__(self, target: str = "gfx1100", count: int = 1):
    self.target, self.count = target.encode(), count
    self.memory: dict[int, bytearray] = {}
    self.host: dict[int, Any] = {}
    self.modules: dict[int, set[str]] = {}
    self.functions: dict[int, str] = {}
    self.launches: list[Launch] = []
    self.graphs: dict[int, Graph] = {}
    self.execs: dict[int, Graph] = {}
    self.graph_launches: list[list[Launch]] = []
    self.set_params: list[int] = []
    self.calls: list[str] = []
    self._next = 0x1000
    self._dev = self.DEVICE_BASE

  def _handle(self) -> int:
    self._next += 0x10
    return self._next

  def __getattr__(self, name: str) -> Any:
    if name.startswith("hip"): raise AttributeError(f"FakeHIP has no {name}: plugrad-amd calls a HIP function the stand-in does not know")
    raise AttributeError(name)

  # ---- device and errors
  def hipInit(self, flags): return 0
  def hipGetDeviceCount(self, n): return out(n, self.count)
  def hipSetDevice(self, index): return 0 if 0 <= index < self.count else 101
  def hipRuntimeGetVersion(self, v): return out(v, 60_200_000)
  def hipGetDevicePropertiesR0600(self, props, index):
    props[:20] = b"Stand-in Radeon GPU\0"
    props[1160:1160 + len(self.target)] = self.target
    return 0
  def hipGetErrorName(self, code): return b"hipErrorUnknown"
  def hipGetErrorString(self, code): return b""

  # ---- streams and events
  def hipStreamCreateWithFlags(self, s, flags): return out(s, self._handle())
  def hipStreamSynchronize(self, s): return 0
  def hipEventCreate(self, e): return out(e, self._handle())
  def hipEventRecord(self, e, s): return 0
  def hipEventSynchronize(self, e): return 0
  def hipEventElapsedTime(self, ms, start, end): return out(ms, 0.25)

  # ---- memory
  def hipMalloc(self, ptr, size):
    base, self._dev = self._dev, self._dev + ((val(size) + 255) // 256 * 256) + 256
    self.memory[base] = bytearray(val(size))
    return out(ptr, base)
  def hipFree(self, ptr):
    del self.memory[val(ptr)]
    return 0
  def hipHostMalloc(self, ptr, size, flags):
    buf = (ctypes.c_ubyte * val(size))()
    self.host[ctypes.addressof(buf)] = buf
    return out(ptr, ctypes.addressof(buf))
  def _find(self, addr: int, n: int) -> tuple[bytearray, int]:
    for base, mem in self.memory.items():
      if base <= addr and addr + n <= base + len(mem): return mem, addr - base
    raise AssertionError(f"0x{addr:x}+{n} is in no device allocation")
  def hipMemcpyAsync(self, dst, src, size, kind, stream):
    n = val(size)
    if kind == 1:  # host to device
      mem, off = self._find(val(dst), n)
      mem[off:off + n] = ctypes.string_at(val(src), n)
    elif kind == 2:  # device to host
      mem, off = self._find(val(src), n)
      ctypes.memmove(val(dst), bytes(mem[off:off + n]), n)
    else: raise AssertionError(f"unexpected hipMemcpyKind {kind}")
    return 0

  # ---- modules and launches
  def hipModuleLoadData(self, module, image):
    h = self._handle()
    self.modules[h] = set(CodeObject(bytes(image)).kernels())
    return out(module, h)
  def hipModuleGetFunction(self, fn, module, name):
    if name.decode() not in self.modules[val(module)]: return 500  # hipErrorNotFound
    h = self._handle()
    self.functions[h] = name.decode()
    return out(fn, h)
  def hipModuleUnload(self, module): return 0

  @staticmethod
  def _kernargs(extra_addr: int) -> bytes:
    extra = (ctypes.c_void_p * 5).from_address(extra_addr)
    assert (extra[0], extra[2], extra[4]) == (1, 2, 3), "extra must be BUFFER_POINTER, buf, BUFFER_SIZE, &size, END"
    return ctypes.string_at(extra[1], ctypes.c_size_t.from_address(extra[3]).value)

  def hipModuleLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
    assert params is None and val(shared) == 0
    self.launches.append(Launch(val(fn), (val(gx), val(gy), val(gz)), (val(bx), val(by), val(bz)), self._kernargs(ctypes.addressof(extra))))
    return 0

  # ---- graphs
  def hipGraphCreate(self, g, flags):
    h = self._handle()
    self.graphs[h] = Graph(h)
    return out(g, h)
  def _node_launch(self, p: Any) -> Launch:
    assert p.kernelParams is None and p.sharedMemBytes == 0
    return Launch(p.func, (p.gridDim.x, p.gridDim.y, p.gridDim.z), (p.blockDim.x, p.blockDim.y, p.blockDim.z), self._kernargs(p.extra))
  def hipGraphAddKernelNode(self, node, graph, deps, ndeps, params):
    g = self.graphs[val(graph)]
    dep = tuple(deps[i] for i in range(val(ndeps))) if deps is not None else ()
    assert all(d in {n.handle for n in g.nodes} for d in dep), "a dependency must be a node added before"
    h = self._handle()
    g.nodes.append(Node(h, dep, self._node_launch(params._obj)))
    return out(node, h)
  def hipGraphInstantiateWithFlags(self, exec_, graph, flags):
    h = self._handle()
    g = self.graphs[val(graph)]
    self.execs[h] = Graph(h, [Node(n.handle, n.deps, n.launch) for n in g.nodes])  # a copy: later changes go through SetParams
    return out(exec_, h)
  def hipGraphExecKernelNodeSetParams(self, exec_, node, params):
    for n in self.execs[val(exec_)].nodes:
      if n.handle == val(node):
        n.launch = self._node_launch(params._obj)
        self.set_params.append(n.handle)
        return 0
    return 400  # hipErrorInvalidHandle
  def hipGraphLaunch(self, exec_, stream):
    self.graph_launches.append([n.launch for n in self.execs[val(exec_)].nodes])
    return 0
  def hipGraphExecDestroy(self, exec_):
    self.execs.pop(val(exec_), None)
    return 0
  def hipGraphDestroy(self, graph):
    self.graphs.pop(val(graph), None)
    return 0
