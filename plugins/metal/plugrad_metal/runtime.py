"""The METAL runtime: a program's metallib (or MSL source) loaded into an MTLLibrary, its kernel function into a
compute pipeline state (cached per binary and symbol, made with `supportIndirectCommandBuffers` so the graph runner
can encode it), launched in a command buffer of its own on the device's queue.

A launch binds the buffers and variables by the ABI of abi.py (buffer i at index i, variable k by `setBytes` at
index nbufs + k) and calls `dispatchThreadgroups(global_size) threadsPerThreadgroup(local_size)`. With `wait`, it
waits for the command buffer and returns its GPU time (`GPUEndTime - GPUStartTime`: what DEBUG=2 prints).

UNVERIFIED: written against Apple's documented Metal API through pyobjc; no Mac is available to this project.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from typing import Any

from plugrad.backend import CompileError, Dims, LaunchError, Runtime, UOp, c_identifier, prod
from plugrad_metal.abi import Signature, signature
from plugrad_metal.compiler import is_metallib, library_from_source
from plugrad_metal.context import MetalContext, command_error, context, metal
from plugrad_metal.language import language


def size(dims: Dims) -> Any:
  d = (*tuple(dims), 1, 1)
  return metal().MTLSizeMake(d[0], d[1], d[2])


class MetalProgram:
  def __init__(self, runtime: MetalRuntime, program: UOp):
    self.runtime, self.ctx = runtime, runtime.ctx
    self.name: str = program.name  # type: ignore[attr-defined]
    self.symbol = c_identifier(self.name)
    self.sig: Signature = signature(program)
    self.pso = runtime.pipeline(program.binary, self.symbol)  # type: ignore[attr-defined]
    self.max_threads = int(self.pso.maxTotalThreadsPerThreadgroup())

  def __call__(self, *handles: Any, global_size: Dims = (1, 1, 1), local_size: Dims = (1, 1, 1), vals: tuple[int, ...] = (),
               wait: bool = False) -> float | None:
    if 0 in tuple(global_size): return 0.0 if wait else None
    if prod(tuple(local_size)) > self.max_threads:
      raise LaunchError(f"METAL kernel {self.name!r}: {prod(tuple(local_size))} threads per threadgroup, the pipeline allows {self.max_threads}")
    if len(handles) != self.sig.nbufs: raise LaunchError(f"METAL kernel {self.name!r} takes {self.sig.nbufs} buffers, got {len(handles)}")
    cb = self.ctx.queue.commandBuffer()
    enc = cb.computeCommandEncoder()
    enc.setComputePipelineState_(self.pso)
    for i, h in zip(self.sig.buffer_indices, handles): enc.setBuffer_offset_atIndex_(h.buf, h.offset, i)
    for i, data in self.sig.pack(vals): enc.setBytes_length_atIndex_(data, len(data), i)
    enc.dispatchThreadgroups_threadsPerThreadgroup_(size(global_size), size(local_size))
    enc.endEncoding()
    cb.commit()
    if not wait:
      self.ctx.track(cb)
      return None
    return self.runtime.elapsed(cb)


class MetalRuntime(Runtime):
  capabilities = frozenset({"run", "timing", "graph"})

  def __init__(self, device: str, index: int):
    super().__init__(device)
    self.ctx: MetalContext = context(index)
    self._pipelines: dict[tuple[str, str], Any] = {}  # (sha256 of the binary, symbol) → MTLComputePipelineState
    self._libraries: dict[str, Any] = {}
    self._lock = threading.Lock()

  def load(self, program: UOp) -> MetalProgram: return MetalProgram(self, program)

  def library(self, binary: bytes) -> Any:
    key = hashlib.sha256(binary).hexdigest()
    if (lib := self._libraries.get(key)) is not None: return lib
    if is_metallib(binary):
      from Foundation import NSURL  # type: ignore[import-not-found]  # pyobjc-framework-Cocoa, a dependency of pyobjc-framework-Metal
      with tempfile.NamedTemporaryFile(suffix=".metallib", delete=False) as f: f.write(binary)
      try: lib, err = self.ctx.device.newLibraryWithURL_error_(NSURL.fileURLWithPath_(f.name), None)
      finally: os.unlink(f.name)
      if lib is None: raise CompileError(f"METAL could not load the metallib: {err.localizedDescription() if err is not None else 'unknown error'}")
    else:
      lib = library_from_source(self.ctx.device, binary.decode(), language())  # MSL source (newLibraryWithSource path, or a syntax-checked binary)
    self._libraries[key] = lib
    return lib

  def pipeline(self, binary: bytes, symbol: str) -> Any:
    key = (hashlib.sha256(binary).hexdigest(), symbol)
    with self._lock:
      if (pso := self._pipelines.get(key)) is not None: return pso
      m = metal()
      fn = self.library(binary).newFunctionWithName_(symbol)
      if fn is None: raise CompileError(f"METAL: the library has no kernel function {symbol!r}")
      desc = m.MTLComputePipelineDescriptor.new()
      desc.setComputeFunction_(fn)
      desc.setSupportIndirectCommandBuffers_(True)  # the graph runner encodes it into indirect command buffers
      pso, err = self.ctx.device.newComputePipelineStateWithDescriptor_options_reflection_error_(desc, m.MTLPipelineOptionNone, None, None)
      if pso is None:
        raise CompileError(f"METAL pipeline state for {symbol!r} failed: {err.localizedDescription() if err is not None else 'unknown error'}")
      self._pipelines[key] = pso
      return pso

  def elapsed(self, cb: Any) -> float:
    """Wait for command buffer `cb`; its GPU time in seconds."""
    cb.waitUntilCompleted()
    if (why := command_error(cb)) is not None: raise LaunchError(f"METAL command buffer failed: {why}")
    return float(cb.GPUEndTime() - cb.GPUStartTime())

  def describe(self) -> str: return self.ctx.name
  def synchronize(self) -> None: self.ctx.synchronize()
