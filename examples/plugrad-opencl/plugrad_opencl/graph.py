"""A JIT batch replayed as one burst of enqueues on the device's in-order queue, waited for once.

Every launch of the batch gets its own cl.Kernel with its fixed buffers set once at capture; a replay sets only the
arguments that change (the JIT's slots and the variable values) and enqueues. The in-order queue keeps the captured
order, so `deps` needs no events.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from plugrad.backend import Buffer, GraphError, GraphKernel, GraphRunner
from plugrad_opencl.runtime import OpenCLProgram, elapsed


class OpenCLGraph(GraphRunner):
  def __init__(self, kernels: Sequence[GraphKernel], slots: Sequence[Buffer], var_names: Sequence[str]):
    super().__init__(kernels, slots, var_names)
    self.nodes: list[tuple[OpenCLProgram, Any]] = []
    for j, k in enumerate(self.kernels):
      lib = k.runner.lib
      if not isinstance(lib, OpenCLProgram): raise GraphError(f"kernel {k.runner.name!r} was not loaded by plugrad-opencl ({type(lib).__name__})")
      kernel = lib.new_kernel()
      for i, b in enumerate(k.bufs):  # fixed buffers: set once here; the slots are set per replay
        if (j, i) not in self.slot_uses: kernel.set_arg(i, b.ensure_allocated().handle)
      self.nodes.append((lib, kernel))
    self.static = {j: k.runner.program.launch_dims({}) for j, k in enumerate(self.kernels) if j not in self.symbolic_dims}
    self.h = self.nodes[0][0].h

  def __call__(self, slots: Sequence[Buffer], var_vals: dict[str, int], wait: bool = False) -> float | None:
    events, st = [], time.perf_counter()
    for j, (lib, kernel) in enumerate(self.nodes):
      nbufs = len(self.kernels[j].bufs)
      for i in range(nbufs):
        if (k := self.slot_uses.get((j, i))) is not None: kernel.set_arg(i, slots[k].ensure_allocated().handle)
      for n, (t, v) in enumerate(zip(lib.val_types, self.vals(j, var_vals))): kernel.set_arg(nbufs + n, t(v))
      gs, ls = self.static[j] if j in self.static else self.launch_dims(j, var_vals)
      if (ev := lib.enqueue(kernel, gs, ls)) is not None: events.append(ev)
    return elapsed(self.h, events, st) if wait else None
