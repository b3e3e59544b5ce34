"""The PYTHON device's graph runner: the reference implementation of the `GraphRunner` contract.

Everything a native runner would bake into its graph is computed once here (each launch's program, handles and
launch dims); a replay only patches the handles of the changing buffers, the variable values and the symbolic
launch dims from the base's `slot_uses`, `var_uses` and `symbolic_dims`, then runs the launches in order. The
conformance suite compares it with per-kernel replay, so the base is exercised on every machine.
"""
from __future__ import annotations

import time
from collections.abc import Sequence

from plugrad.backend import Buffer, GraphError, GraphKernel, GraphRunner

from .interpreter import PythonProgram


class PythonGraph(GraphRunner):
  def __init__(self, kernels: Sequence[GraphKernel], slots: Sequence[Buffer], var_names: Sequence[str]):
    super().__init__(kernels, slots, var_names)
    self.libs = [k.runner.lib for k in self.kernels]
    if not all(isinstance(p, PythonProgram) for p in self.libs): raise GraphError("PythonGraph replays only PYTHON kernels")
    self.handles = [[b.ensure_allocated().handle for b in k.bufs] for k in self.kernels]
    self.patches: list[list[tuple[int, int]]] = [[] for _ in self.kernels]
    for (j, i), k in self.slot_uses.items(): self.patches[j].append((i, k))
    self.dims = [None if j in self.symbolic_dims else k.runner.program.launch_dims({})
                 for j, k in enumerate(self.kernels)]

  def __call__(self, slots: Sequence[Buffer], var_vals: dict[str, int], wait: bool = False) -> float | None:
    st = time.perf_counter()
    for j, lib in enumerate(self.libs):
      handles = self.handles[j]
      for i, k in self.patches[j]: handles[i] = slots[k].handle
      gs, ls = d if (d := self.dims[j]) is not None else self.launch_dims(j, var_vals)
      lib(*handles, global_size=gs, local_size=ls, vals=self.vals(j, var_vals))
    return time.perf_counter() - st if wait else None
