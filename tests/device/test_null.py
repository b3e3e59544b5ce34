"""The NULL device: real components that do no work."""
from __future__ import annotations

import numpy as np
import pytest

from plugrad.builtin.null import NullAllocator, NullCompiler, NullHandle, NullProgram, NullRenderer, NullRuntime
from plugrad.device.allocator import Allocator
from plugrad.device.compiler import Compiler
from plugrad.device.runtime import Runtime
from plugrad.dtype import dtypes
from plugrad.renderer.base import Renderer, RendererError
from plugrad.uop.ops import AxisType, KernelInfo, Ops, UOp
from plugrad.uop.program import ProgramStageError, ProgramUOp, make_program


def program(device: str = "NULL") -> ProgramUOp:
  """out[i] = float(i) for i < 8, at the linear stage."""
  out = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(8), (), 0)
  r = UOp.range(8, 0, AxisType.LOOP, dtypes.int32)
  idx, val = out.index(r), r.cast(dtypes.float32)
  uops = [out, r.src[0], r, idx, val, idx.store(val), UOp(Ops.ENDRANGE, dtypes.void, (r,))]
  return make_program(UOp(Ops.SINK, dtypes.void, (), KernelInfo("E_8")), device).with_linear(uops)


def test_renderer_describes_a_capable_device_and_renders_one_line():
  r = NullRenderer("NULL")
  assert isinstance(r, Renderer) and r.has_local and r.has_shared and r.supports_float4 and r.tensor_cores == ()
  assert r.capabilities == {"float16", "bfloat16", "float64", "int64", "locals", "shared"}
  text = r.render(program())
  assert text.count("\n") == 1 and "'E_8'" in text and "7 uops" in text
  with pytest.raises(RendererError, match="needs a PROGRAM UOp"): r.render(UOp.const(dtypes.int32, 1))


def test_compiler_returns_empty_bytes():
  c = NullCompiler()
  assert isinstance(c, Compiler) and c.cache_key is None
  assert c.compile("anything at all") == b"" and c.compile_cached("int main() {}", "k") == b""
  with pytest.raises(TypeError, match="needs a str"): c.compile(b"bytes")  # type: ignore[arg-type]


def test_allocator_hands_out_memoryless_handles():
  a = NullAllocator("NULL")
  assert isinstance(a, Allocator) and a.supports_views and not a.supports_memoryview
  h = a.alloc(64)
  assert isinstance(h, NullHandle) and h.nbytes == 64 and a.mem_used == 64
  a.copyin(h, memoryview(np.arange(16, dtype=np.float32)).cast("B"))
  out = np.full(16, 7, np.float32)
  a.copyout(memoryview(out).cast("B"), h)
  np.testing.assert_array_equal(out, 0)  # nothing was stored: reads give zeros
  assert a.offset(h, 16, 32).nbytes == 32
  with pytest.raises(ValueError, match="does not fit a buffer of 64 bytes"): a.offset(h, 48, 32)
  a.free(h, 64)
  assert a.mem_used == 0 and a.alloc(64) is h


def test_runtime_loads_and_returns_at_once():
  rt = NullRuntime("NULL")
  assert isinstance(rt, Runtime) and rt.capabilities == frozenset()
  p = program()
  with pytest.raises(ProgramStageError): rt.load(p)  # needs the binary stage
  src = NullRenderer("NULL").render(p)
  lib = rt.load(p.with_source(src).with_binary(NullCompiler().compile(src)))
  assert isinstance(lib, NullProgram) and lib.name == "E_8"
  h = NullAllocator("NULL").alloc(32)
  assert lib(h, global_size=(4, 1, 1), local_size=(8, 1, 1)) is None and lib(h, wait=True) == 0.0


def test_null_through_the_registry():
  from plugrad.device.buffer import Buffer
  from plugrad.device.registry import Device
  from plugrad.device.runner import ProgramRunner
  dev = Device["NULL"]
  assert isinstance(dev.renderer, NullRenderer) and isinstance(dev.allocator, NullAllocator) and isinstance(dev.runtime, NullRuntime)
  out = Buffer(dev.name, 8, dtypes.float32).copyin(np.ones(8, np.float32).data)
  assert ProgramRunner(program(dev.name))([out], {}, wait=True) == 0.0
  np.testing.assert_array_equal(out.numpy(), np.zeros(8, np.float32))


def test_renderer_validation_catches_inconsistent_attributes():
  class Bad(NullRenderer):
    capabilities = frozenset({"float16", "warp_drive"})
  with pytest.raises(RendererError, match="capabilities must be a frozenset of"): Bad("NULL")
  class NoLocals(NullRenderer):
    has_local = False
  with pytest.raises(RendererError, match="capability 'locals' must be claimed exactly when the device has it"): NoLocals("NULL")
  class BadAtomics(NullRenderer):
    atomic_add = frozenset({dtypes.float32.vec(4)})
  with pytest.raises(RendererError, match="atomic_add must be a frozenset of scalar non-bool dtypes"): BadAtomics("NULL")


def test_a_renderer_without_atomics_refuses_an_atomic_store():
  """A CStyleRenderer that declares no atomic adds raises for a STORE with arg Ops.ADD instead of writing a plain store."""
  from plugrad.backend import CStyleRenderer
  from plugrad.testing.kernels import atomic_add
  class Plain(CStyleRenderer):
    def __init__(self) -> None:
      super().__init__("PLAIN")
      self.validate()
  r = Plain()
  with pytest.raises(RendererError, match="no atomic add of dtypes.float"):
    r.render(atomic_add(dtypes.float32)(r).program("PLAIN", r))
