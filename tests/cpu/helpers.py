"""Small kernels for the CPU tests, and running one on a device with a chosen renderer."""
from __future__ import annotations

import numpy as np
import pytest

from plugrad.device.buffer import Buffer
from plugrad.device.runner import ProgramRunner
from plugrad.dtype import DType, dtypes
from plugrad.renderer.base import Renderer
from plugrad.testing.kernels import LinearBuilder
from plugrad.uop.ops import KernelInfo, Ops, UOp
from plugrad.uop.program import ProgramUOp, make_program


def cpu_compiles_through_llvm() -> bool:
  try:
    from plugrad_cpu.plugin import llvm_mode
    return llvm_mode()
  except (ImportError, ValueError): return False


# tests of the C renderer's text or the C compiler itself: skipped where the device compiles through LLVM (the default
# with llvmlite installed); tests/cpu/test_c_path.py reruns tests/cpu with CPU_LLVM=0, and test_llvm.py covers LLVM
C_ONLY = pytest.mark.skipif(cpu_compiles_through_llvm(),
                            reason="checks the C renderer/compiler; the CPU device compiles through LLVM here (test_c_path.py runs it)")


def program(name: str, uops: list[UOp], device: str = "CPU") -> ProgramUOp:
  """The hand-built `uops` as `device`'s codegen would hand them over: with the shared decompositions its renderer asks for."""
  from plugrad.codegen.decompose import decompose_linear
  from plugrad.device.registry import Device
  return make_program(UOp(Ops.SINK, dtypes.void, (), KernelInfo(name)), device).with_linear(decompose_linear(uops, Device[device].renderer))


def op_kernel(op: Ops, src: tuple[DType, ...], out: DType, n: int) -> list[UOp]:
  """out[i] = op(a[i], b[i], ...) for ALU ops; for CAST and BITCAST, out[i] = op(a[i])."""
  k = LinearBuilder()
  o = k.glob(0, out, n)
  ins = [k.glob(j + 1, dt, n) for j, dt in enumerate(src)]
  i = k.range(n, 0)
  vals = [k.load(b, i) for b in ins]
  k.store(o, i, k.emit(UOp(op, out, tuple(vals))))
  k.end(i)
  return k.linear


def raw(x: np.ndarray, dt: DType) -> np.ndarray:
  """Inputs as memory holds them (bfloat16 given as float32 whose low half is dropped)."""
  if dt is dtypes.bfloat16: return (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)
  return np.ascontiguousarray(x, dtypes.to_numpy(dt))


def run(p: ProgramUOp, dtypes_: list[DType], inputs: list[np.ndarray], renderer: Renderer | None = None, var_vals: dict | None = None,
        out_size: int | None = None) -> list[bytes]:
  """Run `p` on its device (rendered by `renderer` when given): slot 0 is a zeroed output of `out_size` elements (default:
  the size of the first input), `inputs` fill slots 1, 2, ... Returns the bytes of every buffer afterwards."""
  if renderer is not None: p = p.with_source(renderer.render(p))
  n = out_size if out_size is not None else len(inputs[0])
  bufs = [Buffer(p.device, n, dtypes_[0]).copyin(np.zeros(n * dtypes_[0].itemsize, np.uint8).data)]
  bufs += [Buffer(p.device, len(x), dt).copyin(raw(x, dt).data.cast("B")) for x, dt in zip(inputs, dtypes_[1:])]
  ProgramRunner(p)(bufs, var_vals or {}, wait=True)
  return [bytes(b.as_buffer()) for b in bufs]
