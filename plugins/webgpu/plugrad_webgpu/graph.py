"""The WEBGPU graph runner: a JIT batch recorded into one command encoder (one compute pass) and submitted once.

WebGPU cannot resubmit a command buffer, and compute passes have no bundles (render bundles are for render passes), so
each replay records the pass again: per kernel that is three calls (set pipeline, set bind group, dispatch) and no
allocation. What does not change is not rebuilt: every kernel of the batch has its own bind group and its own uniform
of variables, made once; a replay makes a new bind group only for a kernel whose buffers changed (the JIT's inputs and
fresh outputs), and rewrites a uniform only when its values changed. One submission per replay instead of one per
kernel; the queue orders the dispatches, and wgpu inserts the barriers between dispatches that touch the same memory.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from plugrad.backend import Buffer, GraphError, GraphKernel, GraphRunner
from plugrad_webgpu.runtime import WebGPUProgram, dispatch_dims


class WebGPUGraph(GraphRunner):
  def __init__(self, kernels: Sequence[GraphKernel], slots: Sequence[Buffer], var_names: Sequence[str]):
    super().__init__(kernels, slots, var_names)
    self.progs: list[WebGPUProgram] = []
    for k in self.kernels:
      if not isinstance(k.runner.lib, WebGPUProgram):
        raise GraphError(f"kernel {k.runner.name!r} is not a WEBGPU program ({type(k.runner.lib).__name__})")
      self.progs.append(k.runner.lib)
    rt = self.progs[0].runtime
    self.rt, self.dev, wgpu = rt, rt.dev, rt.wgpu
    # a uniform per kernel (a program launched twice in the batch with other values must not share one)
    usage = wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST
    self.uniforms = [self.dev.create_buffer(label=f"{p.name} graph args", size=p.uniform_size, usage=usage) if p.uniform_size else None
                     for p in self.progs]
    self.dims = [None if j in self.symbolic_dims else k.runner.program.launch_dims({}) for j, k in enumerate(self.kernels)]
    self._handles: list[tuple[Any, ...] | None] = [None] * len(self.kernels)
    self._groups: list[Any] = [None] * len(self.kernels)
    self._args: list[bytes | None] = [None] * len(self.kernels)

  def _bind_group(self, j: int, handles: tuple[Any, ...]) -> Any:
    if handles != self._handles[j]:
      p, u = self.progs[j], self.uniforms[j]
      entries = [{"binding": i, "resource": {"buffer": h.buf, "offset": 0, "size": h.buf.size}} for i, h in enumerate(handles)]
      if u is not None: entries.append({"binding": len(handles), "resource": {"buffer": u, "offset": 0, "size": p.uniform_size}})
      self._groups[j], self._handles[j] = self.dev.create_bind_group(label=p.name, layout=p.layout, entries=entries), handles
    return self._groups[j]

  def __call__(self, slots: Sequence[Buffer], var_vals: dict[str, int], wait: bool = False) -> float | None:
    enc = self.dev.create_command_encoder()
    timed = wait and self.rt.gpu.timestamps
    cpass = enc.begin_compute_pass(timestamp_writes=self.rt.timestamp_writes() if timed else None)
    limit = self.rt.gpu.limits.workgroups
    for j, p in enumerate(self.progs):
      handles = tuple(b.ensure_allocated().handle for b in self.buffers(j, slots))
      vals = self.vals(j, var_vals)
      gs, _ = d if (d := self.dims[j]) is not None else self.launch_dims(j, var_vals)
      dims = dispatch_dims(p.name, gs, p.folded, limit)
      if 0 in dims: continue
      if (u := self.uniforms[j]) is not None and (args := p.args_bytes(gs, vals)) != self._args[j]:
        self.dev.queue.write_buffer(u, 0, args)  # staged now, lands before this submission runs
        self._args[j] = args
      cpass.set_pipeline(p.pipeline)
      cpass.set_bind_group(0, self._bind_group(j, handles))
      cpass.dispatch_workgroups(*dims)
    cpass.end()
    if timed: self.rt.resolve_timestamps(enc)
    start = time.perf_counter()
    self.dev.queue.submit([enc.finish()])
    if not wait: return None
    if timed: return self.rt.read_timestamps()
    self.rt.synchronize()
    return time.perf_counter() - start
