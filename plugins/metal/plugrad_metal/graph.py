"""The METAL graph runner: a TinyJit batch encoded once into an MTLIndirectCommandBuffer (the plan in icb.py), and
every replay one command buffer whose compute encoder declares the resources and executes the whole ICB.

A replay first waits for the previous replay of this batch (the ICB and the variables buffer are rewritten in
place), then applies `IcbPlan.updates` (rebinding changed buffers, new dispatch dims, reset/re-encoded commands),
writes the variables buffer, and commits.

UNVERIFIED: written against Apple's documented API (MTLIndirectCommandBufferDescriptor, MTLIndirectComputeCommand,
executeCommandsInBuffer:withRange:) through pyobjc; no Mac is available to this project. The plan is tested here.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from plugrad.backend import Buffer, GraphError, GraphKernel, GraphRunner, LaunchError
from plugrad_metal.abi import MAX_BINDINGS
from plugrad_metal.context import command_error, metal
from plugrad_metal.icb import Command, IcbPlan, Update
from plugrad_metal.runtime import MetalProgram, size


class MetalGraph(GraphRunner):
  def __init__(self, kernels: Sequence[GraphKernel], slots: Sequence[Buffer], var_names: Sequence[str]):
    super().__init__(kernels, slots, var_names)
    self.progs: list[MetalProgram] = []
    for k in self.kernels:
      if not isinstance(k.runner.lib, MetalProgram):
        raise GraphError(f"kernel {k.runner.name!r} is not a METAL program ({type(k.runner.lib).__name__})")
      self.progs.append(k.runner.lib)
    self.ctx = self.progs[0].ctx
    m = metal()
    self.plan = IcbPlan(self, resource=lambda h: h.buf)
    desc = m.MTLIndirectCommandBufferDescriptor.new()
    desc.setCommandTypes_(m.MTLIndirectCommandTypeConcurrentDispatch)
    desc.setInheritBuffers_(False)
    desc.setInheritPipelineState_(False)
    desc.setMaxKernelBufferBindCount_(MAX_BINDINGS)
    self.icb = self.ctx.device.newIndirectCommandBufferWithDescriptor_maxCommandCount_options_(desc, len(self.kernels),
                                                                                                 m.MTLResourceCPUCacheModeDefaultCache)
    if self.icb is None: raise GraphError("METAL: newIndirectCommandBufferWithDescriptor returned nil")
    self.varbuf = self.ctx.device.newBufferWithLength_options_(self.plan.var_nbytes, m.MTLResourceStorageModeShared)
    self.last: list[Command] | None = None
    self.cb: Any = None

  def _apply(self, u: Update, c: Command) -> None:
    cmd = self.icb.indirectComputeCommandAtIndex_(u.kernel)
    if u.reset:
      cmd.reset()
      return
    if u.full:
      cmd.setComputePipelineState_(self.progs[u.kernel].pso)
      for i, h in c.buffer_bindings(): cmd.setKernelBuffer_offset_atIndex_(h.buf, h.offset, i)
      for i, off in c.var_bindings(): cmd.setKernelBuffer_offset_atIndex_(self.varbuf, off, i)
      if c.barrier: cmd.setBarrier()
    for i, h in u.buffers: cmd.setKernelBuffer_offset_atIndex_(h.buf, h.offset, i)
    if u.full or u.dims: cmd.concurrentDispatchThreadgroups_threadsPerThreadgroup_(size(c.grid), size(c.block))

  def __call__(self, slots: Sequence[Buffer], var_vals: dict[str, int], wait: bool = False) -> float | None:
    m = metal()
    if self.cb is not None:  # the previous replay still reads the ICB and the variables buffer we are about to rewrite
      self.cb.waitUntilCompleted()
      if (why := command_error(self.cb)) is not None: raise LaunchError(f"METAL graph replay failed: {why}")
    cmds = self.plan.commands(slots, var_vals)
    for u in self.plan.updates(self.last, cmds): self._apply(u, cmds[u.kernel])
    self.last = cmds
    data = self.plan.var_bytes(var_vals)
    self.varbuf.contents().as_buffer(len(data))[:] = data
    cb = self.ctx.queue.commandBuffer()
    enc = cb.computeCommandEncoder()
    for res, rd, wr in self.plan.resources(cmds):
      enc.useResource_usage_(res, (m.MTLResourceUsageRead if rd or not wr else 0) | (m.MTLResourceUsageWrite if wr else 0))
    enc.useResource_usage_(self.varbuf, m.MTLResourceUsageRead)
    enc.executeCommandsInBuffer_withRange_(self.icb, (0, len(cmds)))
    enc.endEncoding()
    cb.commit()
    self.cb = cb
    if not wait:
      self.ctx.track(cb)
      return None
    return self.progs[0].runtime.elapsed(cb)
