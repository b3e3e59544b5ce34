"""Tiered compilation: a kernel compiled by LLVM in-process (milliseconds) that keeps being launched is recompiled in
the background by the system C compiler, and its function pointer is swapped once the shared object is loaded.

LLVM gets a new kernel to its first result quickly; for the loop that follows, the faster of the two compilers' code
is kept: both versions are timed on scratch buffers and the C code replaces the LLVM code unless that is more than 5%
faster (neither wins everywhere: gcc's on the MLP's matmuls, by ~10% and 1.6x on its 10-wide output layer; LLVM's on
most of the digits CNN's kernels). Both compute the interpreter's results bit for bit (the conformance suite runs each
path), so a swap changes no number, only the speed. A kernel is queued at its
TIER_AFTER-th launch; a graph runner queues its kernels at its TIER_AFTER-th replay and re-reads their pointers when
`generation` moves. A recompile that fails keeps the LLVM code
and says why in a warning. CPU_TIER=0 turns tiering off.
"""
from __future__ import annotations

import os
import queue
import threading
import warnings
import weakref
from typing import Any

from plugrad.backend import DEBUG, SettingsError

# launches (or graph replays) before a kernel is recompiled: the background compile competes with the loop for the
# cores, and the digits CNN's 110 training steps ran 20% longer when every kernel tiered up after 4 (2 cores)
TIER_AFTER = 256
generation = 0  # swaps so far
_programs: weakref.WeakSet = weakref.WeakSet()  # every program loaded with LLVM code


def settle() -> None:
  """Recompile every LLVM kernel loaded so far with the C compiler now, and wait until all are swapped in (or failed).
  A kernel does this by itself after TIER_AFTER launches; benchmarks call it after their warm-up to time the code a
  loop runs from then on."""
  progs = list(_programs)
  for p in progs: p.tier_up()
  for p in progs: p.tier_up(wait=True)


def enabled(env: dict[str, str] | None = None) -> bool:
  raw = (os.environ if env is None else env).get("CPU_TIER", "").strip()
  if raw not in ("", "0", "1"):
    raise SettingsError(f"CPU_TIER must be 0 or 1 (1: recompile reused LLVM kernels with the C compiler), got {raw!r}")
  return raw != "0"


def compile_c(program: Any) -> tuple[Any, Any]:
  """(the loaded shared object, its kernel function) of `program` (a PROGRAM UOp) rendered to C and compiled by the
  system compiler through the compile cache (a later process finds it there)."""
  from plugrad.backend import c_identifier
  from plugrad_cpu.compiler import CPUCompiler
  from plugrad_cpu.loader import load_shared
  from plugrad_cpu.renderer import c_renderer
  from plugrad_cpu.toolchain import toolchain
  src = c_renderer(program.device).render(program)
  def load(binary: bytes) -> tuple[Any, Any]:
    lib = load_shared(binary)
    return lib, getattr(lib, c_identifier(program.name))
  return CPUCompiler(toolchain()).load_cached(src, program.name, load)


# the C code replaces the LLVM code unless the LLVM code is more than 5% faster: ties go to C, because the isolated
# single-thread timing understated its lead in sequence (the MLP's first layer: 1.25 vs 1.30 ms alone, 0.77 vs 0.87
# between its neighbours on 2 threads)
KEEP_MARGIN = 1.05
TIMING_RUNS = 5     # alternated runs of each version; the best of each is compared


def _scratch(program: Any) -> list[Any] | None:
  """Zeroed, 64-byte aligned scratch arrays for the kernel's buffers (zeros keep any loaded index in bounds), or None
  when a size is not known (a symbolic buffer)."""
  import numpy as np
  out = []
  for g in program.buffers:
    nbytes = getattr(g.dtype, "size", -1) * g.dtype.base.itemsize
    if nbytes < 0: return None
    raw = np.zeros(nbytes + 64, np.uint8)
    out.append(raw[-raw.ctypes.data % 64:][:nbytes])
  return out


def c_is_faster(prog: Any, fn: Any) -> tuple[bool, float, float]:
  """(whether `fn`, the C compiler's code of `prog`, should replace its LLVM code (KEEP_MARGIN), LLVM's best time, C's best),
  timed alternately on one thread over scratch buffers. Neither compiler wins everywhere (on the digits CNN's kernels
  LLVM's code was faster overall, on the MLP's matmuls gcc's), so each kernel keeps its faster version."""
  import time
  bufs = _scratch(prog.program)
  if bufs is None or prog.var_names: return False, 0.0, 0.0  # symbolic: no single size to time it at; keep what runs
  args = [b.ctypes.data for b in bufs]
  best = {id(prog.fn): float("inf"), id(fn): float("inf")}
  for _ in range(TIMING_RUNS):
    for f in (prog.fn, fn):
      t0 = time.perf_counter()
      f(*args, 0, 1)
      best[id(f)] = min(best[id(f)], time.perf_counter() - t0)
  t_llvm, t_c = best[id(prog.fn)], best[id(fn)]
  return t_c <= KEEP_MARGIN * t_llvm, t_llvm, t_c


class _Worker:
  """One background thread that recompiles queued programs in order (made anew in a forked child)."""
  def __init__(self) -> None: self.reset()

  def reset(self) -> None:
    self.q: queue.SimpleQueue = queue.SimpleQueue()
    self.thread: threading.Thread | None = None
    self.lock = threading.Lock()

  def submit(self, prog: Any) -> None:
    with self.lock:
      if self.thread is None:
        self.thread = threading.Thread(target=self._run, name="plugrad-cpu-tier", daemon=True)
        self.thread.start()
    self.q.put(prog)

  def _run(self) -> None:
    global generation
    while True:
      prog = self.q.get()
      try:
        lib, fn = compile_c(prog.program)
        fn.argtypes, fn.restype = prog.fn.argtypes, None
        faster, t_llvm, t_c = c_is_faster(prog, fn)
        prog.timings = (t_llvm, t_c)
        if faster:
          prog.install(lib, fn)
          generation += 1
        else: prog.tier = "llvm (kept: the C code was not faster)"
        if DEBUG >= 2: print(f"tier-up {prog.name}: LLVM {t_llvm * 1e6:.1f} us, C {t_c * 1e6:.1f} us -> {prog.tier}")
      except Exception as e:
        prog.tier = f"llvm (the C recompile failed: {type(e).__name__})"
        warnings.warn(f"plugrad-cpu: kernel {prog.name!r} keeps its LLVM code; recompiling it with the C compiler failed: {e}", stacklevel=1)
      finally: prog.tiered.set()


WORKER = _Worker()
if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=WORKER.reset)
