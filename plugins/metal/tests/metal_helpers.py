"""Hand-built LINEAR kernels for the METAL tests, and running one in the PYTHON interpreter under EMULATE=METAL."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from plugrad.builtin.interpreter import PythonAllocator, PythonCompiler, PythonRuntime
from plugrad.builtin.python_renderer import PythonRenderer
from plugrad.codegen.decompose import decompose_linear
from plugrad.dtype import DType, dtypes
from plugrad.uop.ops import KernelInfo, Ops, UOp
from plugrad.uop.program import make_program


def glob(slot: int, dt: DType, size: int = -1) -> UOp: return UOp(Ops.DEFINE_GLOBAL, dt.ptr(size), (), slot)
def special(name: str, n: int) -> UOp: return UOp.special(n, name, dtypes.int32)


def lin(*uops: UOp) -> list[UOp]:
  """The uops in order: each argument's not-yet-listed sources (depth first), then itself."""
  out: dict[UOp, None] = {}
  for u in uops:
    for x in u.toposort: out.setdefault(x, None)
  return list(out)


def run_emulated(uops: Sequence[UOp], *bufs: np.ndarray, local_size: tuple[int, int, int], emulate: str = "METAL") -> list[np.ndarray]:
  """Run the kernel made for `emulate` (its decompositions and limits) in the interpreter on copies of `bufs` (in slot
  order), one workgroup of `local_size`; returns their contents afterwards."""
  ren = PythonRenderer("PYTHON", emulate)
  p = make_program(UOp(Ops.SINK, dtypes.void, (), KernelInfo("emulated")), "PYTHON").with_linear(decompose_linear(list(uops), ren))
  p = p.with_source(ren.render(p))
  lib = PythonRuntime("PYTHON").load(p.with_binary(PythonCompiler().compile_cached(p.source, p.name)))
  alloc = PythonAllocator("PYTHON")
  handles = []
  for b in bufs:
    handles.append(h := alloc.alloc(b.nbytes))
    alloc.copyin(h, memoryview(np.ascontiguousarray(b)).cast("B"))
  lib(*handles, global_size=(1, 1, 1), local_size=local_size, vals=())
  outs = []
  for b, h in zip(bufs, handles):
    alloc.copyout(memoryview(out := np.empty_like(b)).cast("B"), h)
    outs.append(out)
  return outs
