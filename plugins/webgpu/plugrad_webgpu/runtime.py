"""The WEBGPU runtime: compute pipelines from validated WGSL, launched with the PROGRAM's launch dims.

A launch records one compute pass (pipeline, one bind group with the storage buffers and the uniform of variables,
dispatch) into a command encoder and submits it; nothing waits unless asked. With `wait=True` the kernel's time comes
from timestamp queries written at the start and end of the pass when the adapter has `timestamp-query`, else from the
wall clock around the submission and the wait for it.
"""
from __future__ import annotations

import math
import re
import struct
import time
from collections import OrderedDict
from typing import Any

from plugrad.backend import Dims, LaunchError, Runtime, UOp
from plugrad_webgpu.allocator import WGPUBuffer
from plugrad_webgpu.renderer import FOLD_MARK
from plugrad_webgpu.wgsl import identifier

_WG_RE = re.compile(r"@workgroup_size\((\d+), (\d+), (\d+)\)")
BIND_GROUP_CACHE = 32  # bind groups kept per program (a JIT replay passes the same buffers every time)


def dispatch_dims(name: str, global_size: Dims, folded: bool, limit: int) -> tuple[int, int, int]:
  """The workgroup counts to dispatch for a launch of `global_size` workgroups (see renderer.py for folding)."""
  if not folded:
    if any(g > limit for g in global_size):
      raise LaunchError(f"kernel {name!r}: {tuple(global_size)} workgroups exceed the adapter's {limit} per dimension")
    return global_size[0], global_size[1], global_size[2]
  total = math.prod(global_size)
  x = min(total, limit)
  y = math.ceil(total / x) if x else 0
  if y > limit: raise LaunchError(f"kernel {name!r}: {total} workgroups exceed what two dispatch dimensions hold ({limit} x {limit})")
  return x, y, 1


class WebGPUProgram:
  """One kernel: its pipeline, its bind group layout and its uniform buffer."""
  def __init__(self, runtime: WebGPURuntime, program: UOp):
    p: Any = program
    self.runtime, self.name = runtime, p.name
    self.src = p.binary.decode()
    self.folded = FOLD_MARK in self.src
    if (m := _WG_RE.search(self.src)) is None:
      raise LaunchError(f"kernel {self.name!r}: the WGSL has no @workgroup_size (not rendered by plugrad-webgpu?)")
    self.workgroup = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
    self.nbufs, self.nvars = len(p.globals), len(p.vars)
    words = (3 if self.folded else 0) + self.nvars  # the folded size is a vec3<u32> at byte 0: the first variable sits at byte 12
    self.uniform_size = 0 if words == 0 else (4 * words + 15) // 16 * 16
    self.pipeline, self.layout = runtime.pipeline(self.src, identifier(self.name), self.nbufs, self.uniform_size > 0)
    wgpu, dev = runtime.wgpu, runtime.dev
    self.uniform = dev.create_buffer(label=f"{self.name} args", size=self.uniform_size,
                                     usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST) if self.uniform_size else None
    self._groups: OrderedDict[tuple[WGPUBuffer, ...], Any] = OrderedDict()

  def __repr__(self) -> str: return f"<WebGPUProgram {self.name!r} workgroup {self.workgroup}{' folded' if self.folded else ''}>"

  def bind_group(self, handles: tuple[WGPUBuffer, ...]) -> Any:
    if (bg := self._groups.get(handles)) is not None:
      self._groups.move_to_end(handles)
      return bg
    entries = [{"binding": i, "resource": {"buffer": h.buf, "offset": 0, "size": h.buf.size}} for i, h in enumerate(handles)]
    if self.uniform is not None:
      entries.append({"binding": len(handles), "resource": {"buffer": self.uniform, "offset": 0, "size": self.uniform_size}})
    bg = self._groups[handles] = self.runtime.dev.create_bind_group(label=self.name, layout=self.layout, entries=entries)
    if len(self._groups) > BIND_GROUP_CACHE: self._groups.popitem(last=False)
    return bg

  def args_bytes(self, global_size: Dims, vals: tuple[int, ...]) -> bytes:
    """The uniform's contents: the launch size when folded (vec3<u32> padded to 12 bytes), then the variables."""
    head = struct.pack("<3I", *global_size) if self.folded else b""
    data = head + struct.pack(f"<{len(vals)}i", *vals)
    return data + b"\0" * (self.uniform_size - len(data))

  def check(self, handles: tuple[Any, ...], local_size: Dims, vals: tuple[int, ...]) -> None:
    if len(handles) != self.nbufs: raise LaunchError(f"kernel {self.name!r} takes {self.nbufs} buffers, got {len(handles)}")
    if len(vals) != self.nvars: raise LaunchError(f"kernel {self.name!r} takes {self.nvars} variable values, got {len(vals)}")
    if not all(isinstance(h, WGPUBuffer) for h in handles):
      raise LaunchError(f"kernel {self.name!r}: buffers must be WEBGPU buffer handles, got {[type(h).__name__ for h in handles]}")
    if tuple(local_size) != self.workgroup:
      raise LaunchError(f"kernel {self.name!r} was compiled for workgroups of {self.workgroup}, launched with local_size {tuple(local_size)}")

  def encode(self, cpass: Any, handles: tuple[WGPUBuffer, ...], global_size: Dims, vals: tuple[int, ...]) -> bool:
    """Record this kernel into compute pass `cpass` (the uniform is written now, so submit before the next launch of this
    program changes it). False when there is nothing to dispatch."""
    dims = dispatch_dims(self.name, global_size, self.folded, self.runtime.gpu.limits.workgroups)
    if 0 in dims: return False
    if self.uniform is not None: self.runtime.dev.queue.write_buffer(self.uniform, 0, self.args_bytes(global_size, vals))
    cpass.set_pipeline(self.pipeline)
    cpass.set_bind_group(0, self.bind_group(handles))
    cpass.dispatch_workgroups(*dims)
    return True

  def __call__(self, *handles: Any, global_size: Dims = (1, 1, 1), local_size: Dims = (1, 1, 1), vals: tuple[int, ...] = (),
               wait: bool = False) -> float | None:
    self.check(handles, local_size, vals)
    rt = self.runtime
    enc = rt.dev.create_command_encoder()
    timed = wait and rt.gpu.timestamps
    cpass = enc.begin_compute_pass(timestamp_writes=rt.timestamp_writes() if timed else None)
    ran = self.encode(cpass, handles, global_size, vals)
    cpass.end()
    if timed: rt.resolve_timestamps(enc)
    start = time.perf_counter()
    rt.dev.queue.submit([enc.finish()])
    if not wait: return None
    if timed and ran: return rt.read_timestamps()
    rt.synchronize()
    return time.perf_counter() - start


class WebGPURuntime(Runtime):
  """Kernels on the process's WebGPU device. Pipelines are kept per WGSL source (a program loaded twice reuses them)."""
  capabilities = frozenset({"run", "timing", "transfer", "graph"})

  def __init__(self, device: str, gpu: Any):
    super().__init__(device)
    import wgpu
    self.gpu, self.dev, self.wgpu = gpu, gpu.device, wgpu
    self._pipelines: dict[tuple[str, str, int, bool], tuple[Any, Any]] = {}
    self._query: Any = None
    self._fence: Any = None

  def __repr__(self) -> str: return f"<WebGPURuntime {self.device}: {self.gpu.describe()}>"

  def describe(self) -> str: return self.gpu.describe()

  def load(self, program: UOp) -> WebGPUProgram: return WebGPUProgram(self, program)

  def synchronize(self) -> None:
    """Wait for everything submitted so far: map a word that a copy submitted after it writes (the queue runs in order).
    (`queue.on_submitted_work_done_sync` would say this directly, but it fails in wgpu-py 0.32 with a cffi callback type error.)"""
    if self._fence is None:
      mu = self.wgpu.BufferUsage
      self._fence = (self.dev.create_buffer(size=4, usage=mu.COPY_SRC), self.dev.create_buffer(size=4, usage=mu.COPY_DST | mu.MAP_READ))
    enc = self.dev.create_command_encoder()
    enc.copy_buffer_to_buffer(self._fence[0], 0, self._fence[1], 0, 4)
    self.dev.queue.submit([enc.finish()])
    self._fence[1].map_sync(self.wgpu.MapMode.READ)
    self._fence[1].unmap()

  def pipeline(self, src: str, entry: str, nbufs: int, uniform: bool) -> tuple[Any, Any]:
    """(compute pipeline, bind group layout) for a shader: storage buffers at bindings 0..nbufs-1 and the uniform after them.
    The layout is explicit (not "auto"), so a buffer the kernel never touches still has its binding."""
    key = (src, entry, nbufs, uniform)
    if (hit := self._pipelines.get(key)) is not None: return hit
    wgpu, dev = self.wgpu, self.dev
    entries: list[dict[str, Any]] = [{"binding": i, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": wgpu.BufferBindingType.storage}}
                                     for i in range(nbufs)]
    if uniform: entries.append({"binding": nbufs, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": wgpu.BufferBindingType.uniform}})
    layout = dev.create_bind_group_layout(entries=entries)
    module = dev.create_shader_module(label=entry, code=src)
    pipe = dev.create_compute_pipeline(label=entry, layout=dev.create_pipeline_layout(bind_group_layouts=[layout]),
                                       compute={"module": module, "entry_point": entry})
    self._pipelines[key] = (pipe, layout)
    return pipe, layout

  # ---- timestamp queries (two per timed pass: its start and its end)
  def timestamp_writes(self) -> dict[str, Any]:
    if self._query is None:
      mu = self.wgpu.BufferUsage
      self._query = (self.dev.create_query_set(type=self.wgpu.QueryType.timestamp, count=2),
                     self.dev.create_buffer(size=16, usage=mu.QUERY_RESOLVE | mu.COPY_SRC),
                     self.dev.create_buffer(size=16, usage=mu.COPY_DST | mu.MAP_READ))
    return {"query_set": self._query[0], "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1}

  def resolve_timestamps(self, enc: Any) -> None:
    qs, resolved, readback = self._query
    enc.resolve_query_set(qs, 0, 2, resolved, 0)
    enc.copy_buffer_to_buffer(resolved, 0, readback, 0, 16)

  def read_timestamps(self) -> float:
    """Seconds between the two timestamps of the last timed pass (waits for it: mapping waits for the copy)."""
    readback = self._query[2]
    readback.map_sync(self.wgpu.MapMode.READ)
    try: t0, t1 = struct.unpack("<2Q", bytes(readback.read_mapped(0, 16)))
    finally: readback.unmap()
    return max(t1 - t0, 0) * 1e-9  # WebGPU timestamps count nanoseconds
