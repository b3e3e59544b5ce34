"""The CPU graph runner: a batch of captured kernels replayed by one native call.

The batch is compiled into one C function that calls each kernel's function through a pointer table with its
arguments read from two tables (buffer addresses, variable values). A replay writes the pointers and values that
change into those tables and makes one foreign call, so the Python cost per kernel is gone: with several threads the
native pool (native_pool.py) runs the other threads' shares, without a GIL hand-off or a Python worker in between.
Threads: every thread runs the whole batch; a parallel kernel is shared by the first `threads[j]` of them, a serial
one runs on thread 0, and a spin barrier separates a kernel from the earlier ones it depends on (`GraphRunner.deps`).

Ctrl-C: like a long single launch (runtime.py), a batch of LONG_WORK or more runs on a pool worker while the caller
waits interruptibly, and its long parallel kernels are cut into chunks of about CHUNK_WORK. The control table's stop
flag, raised on KeyboardInterrupt, skips the chunks not yet started; every thread still passes every barrier, so none
waits for a thread that left early. An interrupted batch leaves its outputs partly written.
"""
from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from typing import Any

from plugrad.backend import Buffer, GraphError, GraphKernel, GraphRunner
from plugrad_cpu import native_pool, tiering
from plugrad_cpu.abandoned import ABANDONED, settle
from plugrad_cpu.compiler import CPUCompiler
from plugrad_cpu.loader import load_shared
from plugrad_cpu.runtime import LONG_WORK, POOL, CPUProgram, Launch
from plugrad_cpu.tiering import TIER_AFTER
from plugrad_cpu.toolchain import toolchain

_C_TYPES = {ctypes.c_void_p: "void*", ctypes.c_int32: "int", ctypes.c_int64: "long long"}

_PRELUDE = """#include <sched.h>
static int bar_count, bar_sense;
/* a sense-reversing spin barrier over `n` threads; yields after a short spin (threads may outnumber free cores) */
static void bar_wait(int n, int *sense) {
  int want = !*sense; *sense = want;
  if (__atomic_add_fetch(&bar_count, 1, __ATOMIC_ACQ_REL) == n) {
    __atomic_store_n(&bar_count, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&bar_sense, want, __ATOMIC_RELEASE);
  } else {
    unsigned spins = 0;
    while (__atomic_load_n(&bar_sense, __ATOMIC_ACQUIRE) != want) if (++spins > 512) sched_yield();
  }
}
"""


def _source(progs: list[CPUProgram], barriers: list[bool]) -> str:
  """ctl: the stop flag, then each kernel's thread count, then its chunk count (threads, or more for a long kernel)."""
  lines = [_PRELUDE]
  body = ["void plugrad_graph(void **fn, void **b, long long *v, const int *ctl, int core, int cores) {",
          f"  volatile const int *stop = ctl; const int *nt = ctl + 1, *ch = ctl + {1 + len(progs)};",
          "  int sense = __atomic_load_n(&bar_sense, __ATOMIC_ACQUIRE);"]
  bi = vi = 0
  for j, (p, bar) in enumerate(zip(progs, barriers)):
    params = [_C_TYPES[t] for t in p.fn.argtypes[:-2]]
    lines.append(f"typedef void (*k{j}_t)({', '.join(params)}, int, int);")
    args = []
    for t in params:
      if t == "void*": args.append(f"b[{bi}]"); bi += 1
      else: args.append(f"({t})v[{vi}]"); vi += 1
    if bar: body.append("  if (cores > 1) bar_wait(cores, &sense);")
    call = f"((k{j}_t)fn[{j}])({', '.join(args)}, c, ch[{j}]);  /* {p.name} */"
    body.append(f"  if (core < nt[{j}]) for (int c = core; c < ch[{j}] && !*stop; c += nt[{j}]) {call}")
  return "\n".join(lines + body + ["}", ""])


class CPUGraph(GraphRunner):
  """One native call per thread replays the whole batch (see the module docstring)."""
  def __init__(self, kernels: Sequence[GraphKernel], slots: Sequence[Buffer], var_names: Sequence[str]):
    super().__init__(kernels, slots, var_names)
    progs = [k.runner.lib for k in self.kernels]
    if not all(isinstance(p, CPUProgram) for p in progs): raise GraphError("CPUGraph replays only kernels loaded by the CPU runtime")
    self.progs: list[CPUProgram] = progs  # type: ignore[assignment]
    self.runtime = progs[0].runtime
    # a barrier before kernel j when it depends on a kernel run since the last barrier
    barriers: list[bool] = []
    since: set[int] = set()
    for j in range(len(progs)):
      barriers.append(bool(self.deps[j] & since))
      since = {j} if barriers[-1] else since | {j}
    compiler = self.compiler
    if not isinstance(compiler, CPUCompiler): compiler = CPUCompiler(toolchain())  # CPU_LLVM=1: the wrapper is C all the same
    def load(binary: bytes) -> tuple[Any, Any]:
      lib = load_shared(binary)
      return lib, lib.plugrad_graph
    self.lib, self.fn = compiler.load_cached(_source(self.progs, barriers), f"graph of {len(progs)} kernels", load)
    self.fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int, ctypes.c_int]
    self.fn.restype = None
    nbufs = [len(k.bufs) for k in self.kernels]
    self.fns = (ctypes.c_void_p * len(progs))(*[ctypes.cast(p.fn, ctypes.c_void_p).value for p in self.progs])
    self.buf_table = (ctypes.c_void_p * max(1, sum(nbufs)))(*[b.ensure_allocated().handle.addr for k in self.kernels for b in k.bufs])
    self.val_table = (ctypes.c_longlong * max(1, sum(len(u) for u in self.var_uses)))()
    self.ctl = (ctypes.c_int * (1 + 2 * len(progs)))()
    starts = [sum(nbufs[:j]) for j in range(len(progs))]
    self.slot_pos: dict[int, list[int]] = {}
    for (j, i), k in self.slot_uses.items(): self.slot_pos.setdefault(k, []).append(starts[j] + i)
    self.val_pos = [(pos, v) for pos, v in enumerate(v for u in self.var_uses for v in u)]
    self.var_kernels = [j for j, u in enumerate(self.var_uses) if u]
    self.work = [0] * len(progs)
    for j in range(len(progs)):
      if not self.var_uses[j]: self._plan(j, ())
    self.args = [ctypes.addressof(a) for a in (self.fns, self.buf_table, self.val_table, self.ctl)]
    self._sized()
    self.replays, self.generation = 0, tiering.generation

  def _refresh(self) -> None:
    """Re-read the kernels' function pointers after tier-ups (tiering.py swapped some in)."""
    self.generation = tiering.generation
    for j, p in enumerate(self.progs): self.fns[j] = ctypes.cast(p.fn, ctypes.c_void_p).value

  def _plan(self, j: int, vals: tuple[int, ...]) -> None:
    """Kernel j's threads and chunks at these variable values."""
    p, k = self.progs[j], len(self.progs)
    self.work[j], self.ctl[1 + j] = p.work_at(vals), p.threads_for(vals)
    self.ctl[1 + k + j] = p.chunks_for(self.work[j], self.ctl[1 + j])

  def _sized(self) -> None:
    self.cores = max(self.threads)
    self.long = sum(self.work) >= LONG_WORK

  def _replay(self, _chunk: int = 0, _chunks: int = 1) -> None:
    if self.cores == 1: self.fn(*self.args, 0, 1)
    else: native_pool.run(self.fn, self.args, self.cores)

  def _stop(self) -> None: self.ctl[0] = 1

  @property
  def threads(self) -> list[int]:
    """Each kernel's thread count at the last replay's variable values."""
    return self.ctl[1:1 + len(self.progs)]

  def __call__(self, slots: Sequence[Buffer], var_vals: dict[str, int], wait: bool = False) -> float | None:
    for k, positions in self.slot_pos.items():
      addr = slots[k].handle.addr
      for pos in positions: self.buf_table[pos] = addr
    if self.val_pos:
      vals = [var_vals[n] for n in self.var_names]
      for pos, v in self.val_pos: self.val_table[pos] = vals[v]
      for j in self.var_kernels: self._plan(j, self.vals_of(j, vals))
      self._sized()
    self.replays += 1
    if self.replays == TIER_AFTER:
      for p in self.progs: p.tier_up()
    if self.generation != tiering.generation: self._refresh()
    if ABANDONED: settle()  # an interrupted batch or launch still runs: wait for it before touching memory again
    self.ctl[0] = 0
    st = time.perf_counter()
    if self.long: POOL.run_waiting(Launch(self._replay, [], 1, tuple(slots), on_cancel=self._stop), 1)
    else: self._replay()
    return time.perf_counter() - st if wait else None

  def vals_of(self, j: int, vals: list[int]) -> tuple[int, ...]: return tuple(vals[v] for v in self.var_uses[j])

  def __repr__(self) -> str: return f"<CPUGraph {len(self.progs)} kernels, threads {self.threads}>"
