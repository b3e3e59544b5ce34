"""Tiered compilation on the CPU (plugrad_cpu/tiering.py): reused LLVM kernels are recompiled by the C compiler in the
background, the faster version is kept, and a swap changes no result (launched alone or inside a graph runner)."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from plugrad import Tensor, TinyJit
from plugrad.device.registry import Device
from plugrad.errors import CompileError
from plugrad.testing.kernels import suite

from cpu_helpers import cpu_compiles_through_llvm

pytest.importorskip("llvmlite", reason="tiering starts from LLVM code (pip install -e 'plugins/cpu[llvm]')")


def llvm_program(name: str):
  """A CPUProgram of conformance kernel `name`, compiled by LLVM whatever the device's mode, and its suite kernel."""
  from plugrad_cpu.llvm_compiler import LLVMCompiler
  from plugrad_cpu.llvm_renderer import LLVMRenderer
  r = LLVMRenderer("CPU")
  kernel = suite()[name](r)
  p = kernel.program("CPU", r)
  src = r.render(p)
  return Device["CPU"].runtime.load(p.with_source(src).with_binary(LLVMCompiler().compile(src)))


def launch(prog, n: int = 64) -> list[np.ndarray]:
  from plugrad_cpu.allocator import CPUAllocator
  alloc = CPUAllocator("CPU")
  rng = np.random.default_rng(0)
  bufs, arrays = [], []
  for g in prog.program.buffers:
    a = rng.standard_normal(g.dtype.size).astype(np.float32)
    h = alloc._alloc(a.nbytes, None)
    ctypes.memmove(h.addr, a.ctypes.data, a.nbytes)
    bufs.append(h)
    arrays.append(h.mem)
  prog(*bufs)
  return [np.frombuffer(m, np.float32).copy() for m in arrays]


@pytest.mark.parametrize("margin, want", [(100.0, "c"), (0.0, "llvm (kept")])
def test_a_reused_kernel_is_recompiled_and_the_faster_code_kept(monkeypatch, margin, want):
  from plugrad_cpu import tiering
  monkeypatch.setattr(tiering, "KEEP_MARGIN", margin)  # 100: C always counts as faster; 0: never
  monkeypatch.delenv("CPU_TIER", raising=False)
  prog = llvm_program("reduce_rows")
  before = launch(prog)
  assert prog.tier == "llvm"
  for _ in range(tiering.TIER_AFTER - 1): launch(prog)
  assert prog.tier in ("queued", "c") or prog.tier.startswith("llvm (")  # queued at the TIER_AFTER-th launch
  prog.tier_up(wait=True)
  assert prog.tier.startswith(want) and prog.timings is not None and all(t > 0 for t in prog.timings)
  for a, b in zip(before, launch(prog)): np.testing.assert_array_equal(a, b)  # the same numbers, bit for bit


def test_cpu_tier_0_keeps_the_llvm_code(monkeypatch):
  monkeypatch.setenv("CPU_TIER", "0")
  prog = llvm_program("reduce_rows")
  for _ in range(8): launch(prog)
  prog.tier_up(wait=True)
  assert prog.tier == "llvm"
  monkeypatch.setenv("CPU_TIER", "2")
  with pytest.raises(ValueError, match="CPU_TIER must be 0 or 1"): prog.tier_up()


def test_a_failed_recompile_warns_and_keeps_running(monkeypatch):
  from plugrad_cpu import tiering
  def broken(program): raise CompileError("gcc: internal compiler error (simulated)")
  monkeypatch.setattr(tiering, "compile_c", broken)
  monkeypatch.delenv("CPU_TIER", raising=False)
  prog = llvm_program("reduce_rows")
  before = launch(prog)
  with pytest.warns(UserWarning, match="keeps its LLVM code.*internal compiler error"):
    prog.tier_up(wait=True)
  assert prog.tier.startswith("llvm (the C recompile failed")
  for a, b in zip(before, launch(prog)): np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(not cpu_compiles_through_llvm(), reason="the graph runner's kernels are C from the start here")
def test_graph_replays_tier_up_and_pick_up_the_new_code(monkeypatch):
  from plugrad_cpu import tiering
  from plugrad_cpu.graph import CPUGraph
  monkeypatch.setattr(tiering, "KEEP_MARGIN", 100.0)
  monkeypatch.delenv("CPU_TIER", raising=False)
  rng = np.random.default_rng(1)
  a, b = rng.random(4083, dtype=np.float32), rng.random(4083, dtype=np.float32)  # a size no other test uses: fresh kernels
  f = TinyJit(lambda x, y: ((x * 3 + y).contiguous() * y).sum().realize())
  outs = [f(Tensor(a), Tensor(b)).numpy() for _ in range(2 + tiering.TIER_AFTER)]
  (g,) = [s for s in f.captured.steps if isinstance(s, CPUGraph)]
  for p in g.progs: p.tier_up(wait=True)
  assert all(p.tier == "c" for p in g.progs)
  outs.append(f(Tensor(a), Tensor(b)).numpy())  # this replay re-reads the swapped pointers
  assert [g.fns[j] for j in range(len(g.progs))] == [ctypes.cast(p.fn, ctypes.c_void_p).value for p in g.progs]
  for o in outs[1:]: np.testing.assert_array_equal(o, outs[0])
  np.testing.assert_allclose(outs[0], ((a * 3 + b) * b).sum(dtype=np.float64), rtol=1e-4)
