"""`GraphRunner`: the base of the device graph runners (CUDA graphs, command buffers, one native call per batch).

The JIT (plugrad.engine.jit) captures the kernels a function launches and replays them; for every batch of captured
kernels on one device it builds the device's graph runner, the class a plugin returns from `plugrad_graph(device)`:

    runner = cls(kernels, slots, var_names)    # once per batch, after capture
    runner(slots, var_vals, wait=False)        # every replay

`kernels` are the batch's launches in order (`GraphKernel`: a loaded `ProgramRunner` and its Buffers in slot order,
as they were captured). `slots` are the Buffers that change from one replay to the next (the JIT's inputs and the
outputs it allocates afresh), passed again on every call in the same order; `var_vals` holds every variable's value.
What this base precomputes, so a subclass only patches what changes:

* `slot_uses[(j, i)] = k`: kernel j's buffer slot i is `slots[k]` on every replay;
* `var_uses[j]`: kernel j's variable values in `ProgramRunner.var_names` order, as indices into `var_names`;
* `symbolic_dims`: the kernels whose launch dims depend on variables (`launch_dims(j, var_vals)` computes them);
* `deps[j]`: the earlier kernels of the batch that kernel j must wait for (it reads what they write, or writes what
  they read or write), for runners that can launch independent kernels concurrently.

For a native graph of kernel nodes with edges (CUDA graphs, hipGraph), `GraphPlan` turns these tables into each
replay's `GraphLaunch`es (dims, buffer addresses, variable values) and the node topology: a launch with an empty grid
is no node, and the ones after it inherit its dependencies, so the order survives.

A subclass builds its native graph in `__init__` (after `super().__init__`), raising `GraphError` (or any error) when
it cannot: the JIT then replays that batch kernel by kernel and says why at DEBUG>=1. It implements `__call__`.
The base lives at the device layer so a backend (and the built-in PYTHON device) can subclass it;
Backends get it from `plugrad.backend`; `plugrad.engine.jit` re-exports it too.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from plugrad.device.buffer import Buffer
from plugrad.device.compiler import Compiler
from plugrad.device.runner import ProgramRunner
from plugrad.errors import DeviceError


class GraphError(DeviceError):
  """A graph runner cannot take this batch (unsupported launch, too many arguments, ...): the JIT falls back."""


@dataclass(frozen=True, eq=False)
class GraphKernel:
  """One captured launch: the loaded runner and its Buffers in slot order (output first)."""
  runner: ProgramRunner
  bufs: tuple[Buffer, ...]


def _bases(k: GraphKernel, slots: Sequence[int]) -> set[Buffer]: return {k.bufs[i].base for i in slots}


class GraphRunner:
  """Base class: see the module docstring for the contract."""
  def __init__(self, kernels: Sequence[GraphKernel], slots: Sequence[Buffer], var_names: Sequence[str]):
    if not kernels: raise GraphError(f"{type(self).__name__} needs at least one kernel")
    self.kernels, self.var_names = list(kernels), list(var_names)
    self.device = self.kernels[0].runner.device
    if bad := [k.runner.name for k in self.kernels if k.runner.device != self.device]:
      raise GraphError(f"a graph runs on one device ({self.device}); kernels {bad} run elsewhere")
    where = {id(b): k for k, b in enumerate(slots)}
    self.slot_uses: dict[tuple[int, int], int] = {(j, i): where[id(b)] for j, k in enumerate(self.kernels) for i, b in enumerate(k.bufs)
                                                  if id(b) in where}
    vpos = {n: v for v, n in enumerate(self.var_names)}
    if missing := {n for k in self.kernels for n in k.runner.var_names} - vpos.keys():
      raise GraphError(f"kernels use variables {sorted(missing)} that the graph is given no values for")
    self.var_uses: list[tuple[int, ...]] = [tuple(vpos[n] for n in k.runner.var_names) for k in self.kernels]
    self.symbolic_dims: frozenset[int] = frozenset(j for j, k in enumerate(self.kernels) if k.runner.var_names and
                                                   not all(isinstance(x, int) for x in (*k.runner.program.global_size, *k.runner.program.local_size)))
    self.deps: list[frozenset[int]] = []
    readers: dict[Buffer, list[int]] = {}
    writer: dict[Buffer, int] = {}
    for j, k in enumerate(self.kernels):
      writes, reads = _bases(k, k.runner.program.outs), _bases(k, k.runner.program.ins)
      # read after write, write after read, and write after write (the last writer must not land after this one)
      dep = {writer[b] for b in reads | writes if b in writer} | {r for b in writes for r in readers.get(b, ()) if r != j}
      self.deps.append(frozenset(dep))
      for b in reads: readers.setdefault(b, []).append(j)
      for b in writes: writer[b], readers[b] = j, []

  def __repr__(self) -> str: return f"<{type(self).__name__} {self.device}: {len(self.kernels)} kernels>"

  @property
  def compiler(self) -> Compiler:
    """The device's compiler, for a runner that builds native code of its own (plugrad-cpu's batch entry point): its
    disk cache and toolchain are the kernels'."""
    return self.kernels[0].runner.dev.compiler

  def buffers(self, j: int, slots: Sequence[Buffer]) -> list[Buffer]:
    """Kernel j's Buffers for a replay with `slots`."""
    return [slots[k] if (k := self.slot_uses.get((j, i))) is not None else b for i, b in enumerate(self.kernels[j].bufs)]

  def vals(self, j: int, var_vals: dict[str, int]) -> tuple[int, ...]:
    """Kernel j's variable values in its `var_names` order."""
    return tuple(var_vals[self.var_names[v]] for v in self.var_uses[j])

  def launch_dims(self, j: int, var_vals: dict[str, int]) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    return self.kernels[j].runner.program.launch_dims(dict(zip(self.kernels[j].runner.var_names, self.vals(j, var_vals))))

  def __call__(self, slots: Sequence[Buffer], var_vals: dict[str, int], wait: bool = False) -> float | None:
    """Replay the batch with `slots` and `var_vals`; with `wait`, block and return the seconds it took."""
    raise NotImplementedError(f"{type(self).__name__} must implement __call__(slots, var_vals, wait)")


Dims3 = tuple[int, int, int]
GraphTopology = tuple[tuple[int, tuple[int, ...]], ...]  # (kernel index, the kernel indices its node depends on) per node


@dataclass(frozen=True)
class GraphLaunch:
  """One kernel's launch in one replay: grid and block dims, buffer device addresses, variable values."""
  grid: Dims3
  block: Dims3
  ptrs: tuple[int, ...]
  vals: tuple[int, ...]

  @property
  def empty(self) -> bool: return 0 in self.grid


def graph_topology(deps: Sequence[frozenset[int]], launches: Sequence[GraphLaunch]) -> GraphTopology:
  """The nodes of a graph for these launches: every kernel with a non-empty grid, depending on the nodes of its
  dependencies. A dependency that does not launch passes its own dependencies on, so ordering survives its removal."""
  eff: list[frozenset[int]] = []
  nodes = []
  for j, d in enumerate(deps):
    through = frozenset(x for k in d for x in ((k,) if not launches[k].empty else eff[k]))
    eff.append(through)
    if not launches[j].empty: nodes.append((j, tuple(sorted(through))))
  return tuple(nodes)


class GraphPlan:
  """What a graph of kernel nodes holds for a GraphRunner's batch: for a replay, each kernel's `GraphLaunch`, and the
  node topology. `ptr(handle)` gives a buffer handle's device address."""
  def __init__(self, runner: GraphRunner, ptr: Any = lambda h: h.ptr):
    self.runner, self.ptr = runner, ptr
    self.static = [None if j in runner.symbolic_dims else k.runner.program.launch_dims({}) for j, k in enumerate(runner.kernels)]

  def launches(self, slots: Sequence[Buffer], var_vals: dict[str, int]) -> list[GraphLaunch]:
    r, out = self.runner, []
    for j in range(len(r.kernels)):
      g, l = d if (d := self.static[j]) is not None else r.launch_dims(j, var_vals)
      ptrs = tuple(self.ptr(b.ensure_allocated().handle) for b in r.buffers(j, slots))
      out.append(GraphLaunch(g, l, ptrs, r.vals(j, var_vals)))
    return out

  def topology(self, launches: Sequence[GraphLaunch]) -> GraphTopology: return graph_topology(self.runner.deps, launches)


class DriverGraphRunner(GraphRunner):
  """A batch replayed as one driver graph of kernel nodes (CUDA graphs, HIP graphs): built from the plan's topology and
  instantiated once; a replay with other buffers or variable values patches only the nodes whose launch changed, and
  the graph is built again only when its topology changes (a symbolic launch of size 0 drops its node). A backend sets
  `program_type` (what each kernel's runner must hold) and implements the driver's calls below; `self.progs` holds the
  kernels' programs, `self.nodes` the node handles by kernel index."""
  program_type: type = object
  backend: str = "a driver graph"

  def __init__(self, kernels: Sequence[GraphKernel], slots: Sequence[Buffer], var_names: Sequence[str]):
    super().__init__(kernels, slots, var_names)
    self.progs: list[Any] = []
    for k in self.kernels:
      if not isinstance(k.runner.lib, self.program_type):
        raise GraphError(f"kernel {k.runner.name!r} is not a {self.backend} program ({type(k.runner.lib).__name__})")
      self.progs.append(k.runner.lib)
    self.plan = GraphPlan(self)
    self.nodes: dict[int, Any] = {}
    self.topo: GraphTopology | None = None
    self.last: list[GraphLaunch] = []
    self.rebuilds = 0  # how often the graph was instantiated (1 unless the topology changed)

  # ---- the driver's calls
  def _activate(self) -> None:
    """Make the device's context current (default: nothing to do)."""
  def _create(self) -> None: raise NotImplementedError(f"{type(self).__name__} must implement _create() (an empty graph)")
  def _add_node(self, j: int, deps: list[Any], launch: GraphLaunch) -> Any:
    """Add kernel j's node, depending on the nodes `deps`, launched as `launch`; returns its handle."""
    raise NotImplementedError(f"{type(self).__name__} must implement _add_node(j, deps, launch)")
  def _instantiate(self) -> None: raise NotImplementedError(f"{type(self).__name__} must implement _instantiate()")
  def _set_node(self, j: int, node: Any, launch: GraphLaunch) -> None:
    """Patch the instantiated graph's node of kernel j to launch as `launch`."""
    raise NotImplementedError(f"{type(self).__name__} must implement _set_node(j, node, launch)")
  def _launch(self, wait: bool) -> float | None:
    """Launch the instantiated graph; with `wait`, wait for it and return its device time in seconds."""
    raise NotImplementedError(f"{type(self).__name__} must implement _launch(wait)")
  def _destroy(self) -> None:
    """Destroy the graph and its instance, if any (also called before the first build)."""

  # ---- built once, patched per replay
  def _build(self, topo: GraphTopology, launches: Sequence[GraphLaunch]) -> None:
    self._destroy()
    self._create()
    self.nodes = {}
    for j, deps in topo: self.nodes[j] = self._add_node(j, [self.nodes[d] for d in deps], launches[j])
    self._instantiate()
    self.topo, self.rebuilds = topo, self.rebuilds + 1

  def __del__(self) -> None:
    try: self._destroy()
    except Exception: pass  # interpreter shutdown: the driver may be gone

  def __call__(self, slots: Sequence[Buffer], var_vals: dict[str, int], wait: bool = False) -> float | None:
    launches = self.plan.launches(slots, var_vals)
    topo = self.plan.topology(launches)
    self._activate()
    if topo != self.topo: self._build(topo, launches)
    else:
      for j, _ in topo:
        if launches[j] != self.last[j]: self._set_node(j, self.nodes[j], launches[j])
    self.last = launches
    return self._launch(wait)


def check_graph_class(cls: Any, device: str) -> type[GraphRunner]:
  """`cls` if it is a GraphRunner subclass, else a PluginHookError naming it."""
  from plugrad.errors import PluginHookError
  if not (isinstance(cls, type) and issubclass(cls, GraphRunner)):
    raise PluginHookError(f"plugrad_graph({device!r}) returned {cls!r}, which is not a subclass of plugrad.backend.GraphRunner")
  return cls
