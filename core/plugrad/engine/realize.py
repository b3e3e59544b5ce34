"""Running a schedule: kernels through `ProgramRunner` (compiled once per program), copies through host memory.

Every launch goes through an `ExecItem`, the unit the JIT records: while `capture()` is active, each item run is
also appended to the capture list, with weak references to the BUFFERs it freshly created (so the JIT can tell
intermediates, which nobody holds after the call, from results the caller keeps).

Threads (docs/security.md, "Threads"): captures are per thread (a stack per thread, so only the innermost capture of
the thread that launches records), and `ENGINE_LOCK` serializes scheduling and running: one realize or JIT replay at a
time in the process, which also guards the schedule, codegen and runner caches.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import plugrad.trace as trace
from plugrad.device.buffer import Buffer
from plugrad.device.registry import Device
from plugrad.device.runner import ProgramRunner
from plugrad.engine.buffers import buffer_of
from plugrad.engine.schedule import ScheduleItem, create_schedule
from plugrad.helpers import DEBUG, MAX_LOADED_KERNELS, LRUCache
from plugrad.uop.ops import Ops, UOp

_runners: LRUCache[UOp, ProgramRunner] = LRUCache(MAX_LOADED_KERNELS)  # bounded: each holds loaded code (memory maps)
# reentrant: Tensor.realize holds it around realize() and its own bookkeeping, and a JIT capture realizes inside a call
ENGINE_LOCK = threading.RLock()


class _Captures(threading.local):
  # each thread's stack of active captures: another thread's eager kernels must not land in a TinyJit being recorded
  def __init__(self) -> None: self.stack: list[list[ExecItem]] = []


_captures = _Captures()


@dataclass(eq=False)
class ExecItem:
  """One launch: a kernel's `runner` with its Buffers in slot order (output first) and variable values, or a copy
  (`runner` None) from bufs[1] into bufs[0]. `fresh` weakly names, by slot, the BUFFER UOps whose contents this launch
  creates: a kernel's new output; a precompiled kernel's write-only outputs that were never allocated before (empty()
  tensors made for it). An assign, which writes an existing buffer, has none."""
  runner: ProgramRunner | None
  bufs: list[Buffer]
  var_vals: dict[str, int] = field(default_factory=dict)
  fresh: tuple[tuple[int, weakref.ref[UOp]], ...] = ()

  @property
  def device(self) -> str: return self.bufs[0].device
  @property
  def name(self) -> str: return self.runner.name if self.runner is not None else f"copy {self.bufs[1].device} -> {self.bufs[0].device}"

  def run(self, var_vals: dict[str, int] | None = None, wait: bool = False) -> float | None:
    if self.runner is None:
      if (timed := DEBUG >= 2 or trace.TIMELINE): st = time.perf_counter()
      self.bufs[0].copy_from(self.bufs[1])
      if timed: _copy_timed(self, st)
      return None
    return self.runner(self.bufs, self.var_vals if var_vals is None else var_vals, wait=wait)


def _copy_timed(ei: ExecItem, st: float) -> None:
  Device[ei.device].synchronize()
  t, nbytes = time.perf_counter() - st, ei.bufs[0].nbytes
  trace.launched(ei.name, ei.device, st, t, mem=nbytes, kind="copy")
  if DEBUG >= 2: print(f"{ei.name:<28} {nbytes:>10} bytes {t * 1e6:10.2f} us {nbytes / t * 1e-9 if t > 0 else 0:8.2f} GB/s")


def runner_for(program: Any) -> ProgramRunner:
  """The loaded runner of a PROGRAM (compiled and loaded once per process while it is among the MAX_LOADED_KERNELS
  most recently used; a dropped one is unloaded when nothing else holds it, and loaded again from the compile cache)."""
  if (runner := _runners.get(program)) is None: runner = _runners[program] = ProgramRunner(program)
  return runner


def exec_item(it: ScheduleItem) -> ExecItem:
  bufs = [buffer_of(b) for b in it.bufs]
  if not it.in_place: fresh: tuple[tuple[int, weakref.ref[UOp]], ...] = ((0, weakref.ref(it.bufs[0])),)
  elif it.ast.op is Ops.PROGRAM:
    reads = set(it.program.ins)
    fresh = tuple((i, weakref.ref(it.bufs[i])) for i in it.outs if i not in reads and not bufs[i].is_allocated())
  else: fresh = ()
  return ExecItem(None if it.kind == "copy" else runner_for(it.program), bufs, it.var_vals, fresh)


@contextlib.contextmanager
def capture() -> Iterator[list[ExecItem]]:
  """Record every ExecItem run inside the block (they still run) into the yielded list."""
  items: list[ExecItem] = []
  stack = _captures.stack
  stack.append(items)
  try: yield items
  finally: stack.pop()


def _compile_ahead(items: list[ScheduleItem]) -> None:
  """Render the kernels not loaded yet and hand them to their compilers' compile thread, so that a concurrent compiler
  (Compiler.concurrent) compiles one while this thread renders the next (ResNet-18's first training step: LLVM's 13 s
  beside 15 s of rendering). A kernel that fails to render stops this: the run below meets the error at its place.
  The compiles are waited for before the first launch: loading a kernel while the compile thread still works would
  wait for the compiler's lock once per kernel (LLVM links and compiles under one lock)."""
  jobs = []
  for it in items:
    if it.kind == "copy": continue
    try: prg = it.program
    except Exception: break
    if prg.stage == "source" and prg not in _runners and (job := Device[prg.device].compiler.compile_ahead(prg.source, prg.name)) is not None:
      jobs.append(job)
  concurrent.futures.wait(jobs)


def run_schedule(items: list[ScheduleItem], wait: bool = False) -> None:
  stack = _captures.stack
  with ENGINE_LOCK:
    _compile_ahead(items)
    for it in items:
      ei = exec_item(it)
      ei.run(wait=wait)
      if stack: stack[-1].append(ei)
    for dev in {it.device for it in items}: Device[dev].synchronize()


def realize(*uops: UOp) -> dict[UOp, UOp]:
  """Compute the given tensor-graph UOps; returns each realized node's replacement (its buffer, reshaped)."""
  with ENGINE_LOCK:
    items, becomes = create_schedule(*uops)
    run_schedule(items)
  # a precompiled kernel wrote all its outputs: the ones not asked for are realized too (a graph that reads one of them
  # later must not launch the kernel again)
  for u in [u for u in becomes if u.op is Ops.AFTER and u.src[1].op is Ops.KERNEL]:
    k = u.src[1]
    for slot in k.arg.outs: becomes.setdefault(UOp(Ops.AFTER, k.src[slot].dtype, (k.src[slot], k)), k.src[slot])
  return becomes
