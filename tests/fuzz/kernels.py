"""The fuzzer's kernel-level checks on the CPU device: a program's schedule is run kernel by kernel with one of the CPU
renderers (LLVM IR through llvmlite, or C through the system compiler: both in this process, whichever the device
itself uses), every kernel without actions (NOOPT: the chain whose outputs are compared with numpy) and, on the same
inputs, again under the default actions and a sample of BEAM's candidate action lists, each of which must give the
unoptimized kernel's outputs. A second chain runs every kernel with the default actions from its own buffers, so the
renderer's whole default path is compared with numpy too."""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from plugrad.codegen import get_program
from plugrad.codegen.opt import KernelOptError, Opt, Scheduler, hand_coded_optimizations
from plugrad.codegen.opt.search import candidates
from plugrad.device.buffer import Buffer
from plugrad.device.runner import ProgramRunner
from plugrad.engine.buffers import buffer_of
from plugrad.engine.schedule import ScheduleItem
from plugrad.helpers import Context
from plugrad.uop.ops import Ops, UOp
from tests.fuzz.programs import FuzzError

# what the fuzzer checked in this process (tests/fuzz/report.py adds up the workers' counts)
STATS: Counter[str] = Counter()


@dataclass(frozen=True)
class CPUBackend:
  """One way this process can compile CPU kernels: a renderer and its compiler (both of plugrad-cpu)."""
  name: str
  renderer: Any
  compiler: Any


def cpu_backend(name: str) -> CPUBackend | str:
  """The `llvm` or `c` backend, or why it is unavailable here."""
  try:
    from plugrad_cpu.toolchain import probe, toolchain
  except ImportError: return "plugrad-cpu is not installed (pip install -e 'plugins/cpu[llvm]')"
  if (why := probe()) is not None: return f"the CPU device is unavailable: {why}"
  if name == "llvm":
    try:
      import llvmlite.binding  # noqa: F401
    except ImportError: return "llvmlite is not installed (pip install 'plugrad-cpu[llvm]')"
    from plugrad_cpu.llvm_compiler import LLVMCompiler
    from plugrad_cpu.llvm_renderer import LLVMRenderer
    return CPUBackend("llvm", LLVMRenderer("CPU", vector_width=toolchain().float_lanes), LLVMCompiler())
  if name == "c":
    from plugrad_cpu.compiler import CPUCompiler
    from plugrad_cpu.renderer import c_renderer
    return CPUBackend("c", c_renderer("CPU"), CPUCompiler(toolchain()))
  raise FuzzError(f"unknown CPU backend {name!r}: expected 'llvm' or 'c'")


_runners: dict[UOp, ProgramRunner] = {}


def runner(be: CPUBackend, ast: UOp, opts: Sequence[Opt] | None) -> ProgramRunner:
  """The loaded kernel for `ast` under `opts` (None: the default actions), rendered and compiled by `be`."""
  with Context(BEAM=0, NOOPT=0):  # the default actions are the hand-coded ones, whatever the environment says
    p = get_program(ast, be.renderer, opts=None if opts is None else list(opts))
  if (r := _runners.get(p)) is None:
    r = _runners[p] = ProgramRunner(p.with_binary(be.compiler.compile_cached(p.source, p.name)))
  return r


def sample_action_lists(ast: UOp, renderer: Any, rng: np.random.Generator, n: int) -> list[tuple[Opt, ...]]:
  """Up to `n` distinct action lists BEAM could try: 1-3 steps of `search.candidates` from the hand-coded choice (where
  the search starts), now and then from no actions."""
  base = Scheduler(ast, renderer)
  seed = hand_coded_optimizations(base.copy())
  kids: dict[tuple[Opt, ...], list[Scheduler]] = {}
  out: dict[tuple[Opt, ...], None] = {}
  for _ in range(4 * n):
    if len(out) >= n: break
    cur = seed if rng.random() < 0.75 else base
    for _ in range(int(rng.integers(1, 4))):
      key = tuple(cur.applied)
      if key not in kids: kids[key] = candidates(cur)
      if not kids[key]: break
      cur = kids[key][int(rng.integers(len(kids[key])))]
    if cur.applied and tuple(cur.applied) != tuple(seed.applied): out[tuple(cur.applied)] = None
  return list(out)


def same(got: np.ndarray, want: np.ndarray) -> bool:
  """Equal for integers; floats within float32 reassociation error (sums in another order) of the reference."""
  if want.dtype.kind != "f": return bool(np.array_equal(got, want))
  w, g = want.astype(np.float64), got.astype(np.float64)
  scale = max(1.0, float(np.mean(np.abs(w[np.isfinite(w)])))) if np.isfinite(w).any() else 1.0
  ok = (np.abs(g - w) <= 1e-4 * (np.abs(w) + scale)) | (np.isnan(g) & np.isnan(w)) | (g == w)
  return bool(ok.all())


@dataclass
class ScheduleRun:
  """A schedule executed by one backend: the NOOPT chain's and the default chain's buffers, and what disagreed."""
  noopt: dict[UOp, Buffer] = field(default_factory=dict)
  default: dict[UOp, Buffer] = field(default_factory=dict)
  mismatches: list[str] = field(default_factory=list)

  def output(self, chain: str, becomes: dict[UOp, UOp], u: UOp, shape: tuple[int, ...]) -> np.ndarray:
    """The value of output `u` (a scheduled tensor-graph node) as computed by `chain` ("noopt" or "default")."""
    b = becomes.get(u, u)
    while b.op is Ops.RESHAPE: b = b.src[0]
    if b.op is not Ops.BUFFER: raise FuzzError(f"an output became a {b.op!r}, not a buffer: the fuzzer cannot read it")
    bufs = self.noopt if chain == "noopt" else self.default
    return (bufs[b] if b in bufs else buffer_of(b)).numpy().reshape(shape)


def run_schedule(items: list[ScheduleItem], be: CPUBackend, samples: int, rng: np.random.Generator,
                 label: Callable[[ScheduleItem], str] = lambda it: str(it.ast.arg.name)) -> ScheduleRun:
  """Run `items` in order with `be`: each kernel once without actions, then on those inputs under its default actions
  and up to `samples` sampled BEAM action lists (compared with the unoptimized outputs); and the default chain."""
  res = ScheduleRun()
  _runners.clear()  # loaded kernels are kept for one schedule (both chains and the checks share them), not a whole run
  written = {b for it in items for b in it.writes}
  for it in items:
    if it.kind != "kernel" or it.ast.op is not Ops.SINK:
      raise FuzzError(f"the fuzzer runs one device's kernels only, got {it!r}")
    for chain in (res.noopt, res.default):
      for b in it.bufs:
        if b not in chain: chain[b] = Buffer("CPU", b.arg, b.dtype).allocate() if b in written else buffer_of(b).ensure_allocated()
    args = [res.noopt[b] for b in it.bufs]
    if set(it.outs) & set(runner(be, it.ast, []).program.ins): raise FuzzError(f"{label(it)} updates a buffer in place")
    runner(be, it.ast, [])(args, it.var_vals)
    runner(be, it.ast, None)([res.default[b] for b in it.bufs], it.var_vals)
    STATS["kernels"] += 1
    want = [args[s].numpy() for s in it.outs]
    lists: list[tuple[Opt, ...] | None] = [None, *sample_action_lists(it.ast, be.renderer, rng, samples)]
    for opts in lists:
      name = "default actions" if opts is None else f"actions {list(opts)}"
      try: r = runner(be, it.ast, opts)
      except KernelOptError: continue  # not a list BEAM would try (the enumeration applied each action): not counted
      except Exception as e:  # an action list the optimizer accepts must lower, render and compile
        res.mismatches.append(f"kernel {label(it)} ({be.name}) under {name} fails to build: {type(e).__name__}: {e}")
        continue
      scratch = list(args)
      for s in it.outs:  # outputs start as a sentinel: an element the kernel forgets to write shows
        scratch[s] = Buffer.from_numpy("CPU", np.full(args[s].size, 7777, dtype=want[it.outs.index(s)].dtype))
      r(scratch, it.var_vals)
      STATS["action lists"] += 1
      for s, w in zip(it.outs, want):
        if not same(got := scratch[s].numpy(), w):
          bad = int(np.argmax(~np.isclose(got, w, rtol=1e-4, atol=1e-4, equal_nan=True))) if w.dtype.kind == "f" else int(np.argmax(got != w))
          res.mismatches.append(f"kernel {label(it)} ({be.name}) under {name} [{list(r.program.applied_opts)}]: output slot {s} "
                                f"differs from the unoptimized kernel's, first at flat index {bad}: got {got[bad]!r}, expected {w[bad]!r}")
  return res
