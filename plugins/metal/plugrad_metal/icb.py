"""What the METAL graph runner encodes into an MTLIndirectCommandBuffer, as pure Python (tested without a Mac).

A TinyJit batch becomes one indirect command buffer (ICB) of concurrent-dispatch commands, one per kernel:

* command j binds kernel j's pipeline, buffer i of the kernel at index i (the ABI of abi.py), and variable k at index
  nbufs + k as a slice of ONE shared "variables buffer": variable v of the batch (`var_names[v]`) lives at byte
  offset `v * VAR_STRIDE`, written as an 8-byte little-endian integer (an `int` parameter reads its low 4 bytes, a
  `long` all 8). Indirect compute commands cannot `setBytes`, so values go through memory, and a replay with other
  values rewrites that buffer only. VAR_STRIDE is 256 bytes because macOS requires constant-address-space buffer
  offsets aligned to 256;
* the dispatch is `concurrentDispatchThreadgroups(grid) threadsPerThreadgroup(block)`, the program's launch dims
  (evaluated per replay for symbolic ones); a launch whose grid is empty is `reset()` (an empty command);
* `setBarrier()` on command j when it depends on an earlier one (the GraphRunner base's `deps`: it reads what they
  write or overwrites what they read, plus write after write): a barrier waits for every earlier command;
* the encoder that executes the ICB must declare every buffer the commands use (`useResource:usage:`), read and/or
  written, since indirect commands do not make resources resident themselves: `resources` lists them.

A replay computes each command (`commands`) and the difference to the last replay (`updates`): rebind only the buffer
indices whose handle changed, set the dispatch again when the dims changed, re-encode a command fully when it comes
back from being empty, reset it when it becomes empty.
"""
from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from plugrad.backend import Buffer, GraphRunner

Dims3 = tuple[int, int, int]
VAR_STRIDE = 256


@dataclass(frozen=True, eq=False)
class Command:
  """One ICB command in one replay: kernel j's buffer handles (index order), its variables' offsets in the variables
  buffer, the dispatch dims and whether it waits for the earlier commands."""
  kernel: int
  buffers: tuple[Any, ...]
  var_offsets: tuple[int, ...]
  grid: Dims3
  block: Dims3
  barrier: bool

  @property
  def empty(self) -> bool: return 0 in self.grid
  def buffer_bindings(self) -> list[tuple[int, Any]]: return list(enumerate(self.buffers))
  def var_bindings(self) -> list[tuple[int, int]]: return [(len(self.buffers) + k, off) for k, off in enumerate(self.var_offsets)]


@dataclass(frozen=True)
class Update:
  """What to change in command `kernel` of the ICB for a replay."""
  kernel: int
  full: bool = False                              # encode the whole command (first replay, or it was empty)
  reset: bool = False                             # it is empty now: reset it
  buffers: tuple[tuple[int, Any], ...] = ()       # (index, handle) to rebind
  dims: bool = False                              # dispatch again with the new grid/block


class IcbPlan:
  """The ICB of a GraphRunner's batch. `handle(buffer)` gives a Buffer's device handle (default: its allocated
  handle); `resource(handle)` the object to declare to the encoder (the MTLBuffer of a METAL handle)."""
  def __init__(self, runner: GraphRunner, handle: Callable[[Buffer], Any] = lambda b: b.ensure_allocated().handle,
               resource: Callable[[Any], Any] = lambda h: h):
    self.runner, self.handle, self.resource = runner, handle, resource
    progs = [k.runner.program for k in runner.kernels]
    self.edges = runner.deps  # read after write, write after read, write after write
    self.barriers = [bool(e) for e in self.edges]
    self.outs = [frozenset(p.outs) for p in progs]
    self.ins = [frozenset(p.ins) for p in progs]
    self.static = [None if j in runner.symbolic_dims else p.launch_dims({}) for j, p in enumerate(progs)]
    self.var_offsets = [tuple(v * VAR_STRIDE for v in runner.var_uses[j]) for j in range(len(progs))]

  @property
  def var_nbytes(self) -> int: return max(1, len(self.runner.var_names)) * VAR_STRIDE

  def var_bytes(self, var_vals: dict[str, int]) -> bytes:
    """The variables buffer's contents for `var_vals`."""
    out = bytearray(self.var_nbytes)
    for v, name in enumerate(self.runner.var_names): struct.pack_into("<q", out, v * VAR_STRIDE, var_vals[name])
    return bytes(out)

  def commands(self, slots: Sequence[Buffer], var_vals: dict[str, int]) -> list[Command]:
    r, out = self.runner, []
    for j in range(len(r.kernels)):
      g, l = d if (d := self.static[j]) is not None else r.launch_dims(j, var_vals)
      out.append(Command(j, tuple(self.handle(b) for b in r.buffers(j, slots)), self.var_offsets[j], g, l, self.barriers[j]))
    return out

  def updates(self, old: Sequence[Command] | None, new: Sequence[Command]) -> list[Update]:
    """The changes from the ICB as encoded for `old` (None: nothing encoded yet) to `new`."""
    out = []
    for j, c in enumerate(new):
      o = None if old is None else old[j]
      if c.empty:
        if o is None or not o.empty: out.append(Update(j, reset=True))
      elif o is None or o.empty: out.append(Update(j, full=True))
      else:
        rebind = tuple((i, h) for i, (h, was) in enumerate(zip(c.buffers, o.buffers)) if h is not was)
        dims = (c.grid, c.block) != (o.grid, o.block)
        if rebind or dims: out.append(Update(j, buffers=rebind, dims=dims))
    return out

  def resources(self, commands: Sequence[Command]) -> list[tuple[Any, bool, bool]]:
    """(resource, read, written) for every buffer the non-empty commands use, each resource once."""
    seen: dict[int, list[Any]] = {}
    for c in commands:
      if c.empty: continue
      for i, h in enumerate(c.buffers):
        res = self.resource(h)
        e = seen.setdefault(id(res), [res, False, False])
        e[1] |= i in self.ins[c.kernel]
        e[2] |= i in self.outs[c.kernel]
    return [(res, rd, wr) for res, rd, wr in seen.values()]
