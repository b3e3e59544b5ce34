"""The AMD runtime: a program's code object loaded with `hipModuleLoadData`, launched with `hipModuleLaunchKernel` on
the device's stream with a packed kernarg buffer (`HIP_LAUNCH_PARAM_BUFFER_POINTER`); with `wait`, timed by a pair
of events (the GPU time of the kernel alone). DEBUG=5 prints the code object's disassembly when it is loaded.

The kernel ABI (also in the README and docs/writing-a-backend.md): `extern "C" __global__ void NAME(T0* buf0, ...,
int/long long var_a, ...)` — one 64-bit device pointer per buffer in slot order, then the variables in name order
(int64 for an int64 variable, else int32), each at its natural alignment in the kernarg segment; the grid is
`global_size` (workgroups per dimension), the workgroup `local_size`; no dynamic LDS. `Kernargs` is the one place
that packs these arguments, shared with the graph runner; before a kernel is loaded its layout is checked against the
code object's own metadata (`check_code_object`), so a kernel built for another arch or another signature fails with
a clear LaunchError instead of reading garbage.

UNVERIFIED (no AMD GPU on this project's machines): `load` and launches have never run against HIP. The argument
packing and the code-object checks are tested against real code objects from clang, and the calls against a stand-in
library that records them (plugins/amd/tests/amd_fake_hip.py).
"""
from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import Any

from plugrad.backend import DEBUG, Dims, LaunchError, Runtime, UOp, c_identifier, dtypes
from plugrad_amd.elf import CodeObject, ELFError
from plugrad_amd.hip import check, context
from plugrad_amd.targets import base_arch

HIP_LAUNCH_PARAM_BUFFER_POINTER, HIP_LAUNCH_PARAM_BUFFER_SIZE, HIP_LAUNCH_PARAM_END = 1, 2, 3


class Kernargs:
  """The explicit kernel arguments of one launch as one packed buffer: buffers as 64-bit pointers, then variables
  as int32/int64 (`var_sizes`: 4 or 8 bytes each), each at an offset aligned to its size (the layout clang gives a
  kernel's parameters: the metadata's `.args[].offset`). `extra` is the `void*[5]` that hipModuleLaunchKernel and a
  graph kernel node take: BUFFER_POINTER, the buffer, BUFFER_SIZE, &size, END. Values are updated in place, so the
  addresses stay valid for a graph node built from them."""
  def __init__(self, nbufs: int, var_sizes: Sequence[int]):
    self.nbufs = nbufs
    self.layout: list[tuple[int, int]] = []  # (offset, size) per argument
    off = 0
    for size in [8] * nbufs + list(var_sizes):
      if size not in (4, 8): raise LaunchError(f"a kernel argument is 4 or 8 bytes, got {size}")
      off = (off + size - 1) // size * size
      self.layout.append((off, size))
      off += size
    self.size = off  # the kernarg segment size clang reports (not rounded up)
    self.buf = (ctypes.c_ubyte * max((off + 7) // 8 * 8, 8))()
    self.nbytes = ctypes.c_size_t(off)
    self.extra = (ctypes.c_void_p * 5)(HIP_LAUNCH_PARAM_BUFFER_POINTER, ctypes.addressof(self.buf), HIP_LAUNCH_PARAM_BUFFER_SIZE,
                                       ctypes.addressof(self.nbytes), HIP_LAUNCH_PARAM_END)

  def set(self, ptrs: Sequence[int], vals: Sequence[int]) -> Kernargs:
    if len(ptrs) != self.nbufs or len(vals) != len(self.layout) - self.nbufs:
      raise LaunchError(f"kernel takes {self.nbufs} buffers and {len(self.layout) - self.nbufs} variables, got {len(ptrs)} and {len(vals)}")
    for k, ((off, _), x) in enumerate(zip(self.layout, (*ptrs, *vals))): struct.pack_into(self._format(k), self.buf, off, x)
    return self

  def _format(self, k: int) -> str: return "<Q" if k < self.nbufs else "<q" if self.layout[k][1] == 8 else "<i"

  def values(self) -> tuple[int, ...]:
    return tuple(struct.unpack_from(self._format(k), self.buf, off)[0] for k, (off, _) in enumerate(self.layout))


def var_sizes(program: UOp) -> list[int]:
  return [8 if v.dtype in (dtypes.int64, dtypes.uint64) else 4 for v in program.vars]  # type: ignore[attr-defined]


def check_code_object(binary: bytes, symbol: str, args: Kernargs, arch: str | None = None) -> CodeObject:
  """The code object parsed and checked before loading: an AMDGPU ELF for `arch` (when given), holding kernel
  `symbol` whose explicit arguments are where `args` puts them. LaunchError naming the difference otherwise."""
  try: co = CodeObject(binary)
  except (ELFError, struct.error, IndexError, ValueError) as e: raise LaunchError(f"kernel {symbol!r}: not an AMDGPU code object ({e})") from None
  if arch is not None and co.arch != arch:
    raise LaunchError(f"kernel {symbol!r}: the code object is for {co.arch or 'an unknown arch'}, the device is {arch} "
                      "(AMD_ARCH builds for another GPU?)")
  kernels = co.kernels()
  if symbol not in kernels: raise LaunchError(f"kernel {symbol!r}: the code object holds {sorted(kernels)}, not {symbol!r}")
  explicit = [(a[".offset"], a[".size"]) for a in kernels[symbol].get(".args", []) if not str(a.get(".value_kind", "")).startswith("hidden_")]
  if explicit != args.layout:
    raise LaunchError(f"kernel {symbol!r}: its explicit arguments are at (offset, size) {explicit}, plugrad packs {args.layout} "
                      f"({args.nbufs} buffers, then the variables in name order)")
  return co


class AMDProgram:
  def __init__(self, runtime: AMDRuntime, program: UOp):
    self.runtime, self.ctx, self.lib = runtime, runtime.ctx, runtime.ctx.lib
    self.name: str = program.name  # type: ignore[attr-defined]
    self.symbol = c_identifier(self.name)
    self.nbufs, self.var_sizes = len(program.globals), var_sizes(program)  # type: ignore[attr-defined]
    self.args = Kernargs(self.nbufs, self.var_sizes)
    binary: bytes = program.binary  # type: ignore[attr-defined]
    check_code_object(binary, self.symbol, self.args, runtime.arch)
    if DEBUG >= 5:
      from plugrad_amd.toolchain import find
      print(find().disassemble(binary, runtime.arch))
    self.ctx.activate()
    self.module, self.fn = ctypes.c_void_p(), ctypes.c_void_p()
    self._image = ctypes.create_string_buffer(binary, len(binary))
    check(self.lib, self.lib.hipModuleLoadData(ctypes.byref(self.module), self._image), f"hipModuleLoadData({self.name!r})")
    check(self.lib, self.lib.hipModuleGetFunction(ctypes.byref(self.fn), self.module, self.symbol.encode()), f"hipModuleGetFunction({self.symbol!r})")

  def __call__(self, *handles: Any, global_size: Dims = (1, 1, 1), local_size: Dims = (1, 1, 1), vals: tuple[int, ...] = (),
               wait: bool = False) -> float | None:
    g, l = tuple(global_size) + (1,) * (3 - len(global_size)), tuple(local_size) + (1,) * (3 - len(local_size))
    if 0 in g: return 0.0 if wait else None
    a = self.args.set([h.ptr for h in handles], vals)
    self.ctx.activate()
    lib, stream = self.lib, self.ctx.stream
    if wait: check(lib, lib.hipEventRecord(self.runtime.events[0], stream), "hipEventRecord")
    check(lib, lib.hipModuleLaunchKernel(self.fn, *(ctypes.c_uint(x) for x in g), *(ctypes.c_uint(x) for x in l), ctypes.c_uint(0), stream,
                                         None, a.extra), f"hipModuleLaunchKernel({self.name!r}, grid {g}, block {l})")
    return self.runtime.elapsed() if wait else None

  def __del__(self) -> None:
    try:
      if self.module.value: self.lib.hipModuleUnload(self.module)
    except Exception: pass  # interpreter shutdown: the runtime may be gone


class AMDRuntime(Runtime):
  capabilities = frozenset({"run", "timing", "transfer", "graph"})

  def __init__(self, device: str, index: int):
    super().__init__(device)
    self.ctx = context(index)
    self.arch = base_arch(self.ctx.target)
    self.events = [ctypes.c_void_p(), ctypes.c_void_p()]
    self.ctx.activate()
    for e in self.events: check(self.ctx.lib, self.ctx.lib.hipEventCreate(ctypes.byref(e)), "hipEventCreate")

  def load(self, program: UOp) -> AMDProgram: return AMDProgram(self, program)

  def elapsed(self) -> float:
    """Seconds between events[0] (recorded before the work) and now on the stream; waits for the work."""
    lib, (start, end) = self.ctx.lib, self.events
    check(lib, lib.hipEventRecord(end, self.ctx.stream), "hipEventRecord")
    check(lib, lib.hipEventSynchronize(end), "hipEventSynchronize")
    ms = ctypes.c_float()
    check(lib, lib.hipEventElapsedTime(ctypes.byref(ms), start, end), "hipEventElapsedTime")
    return ms.value / 1e3

  def describe(self) -> str:
    v = self.ctx.runtime_version
    return f"{self.ctx.name} ({self.ctx.target}), HIP {v // 10000000}.{v // 100000 % 100}"

  def synchronize(self) -> None: self.ctx.synchronize()
