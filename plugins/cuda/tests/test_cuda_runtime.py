"""The CUDA runtime's launch and timing paths against a recording stand-in for libcuda (no GPU needed): a timed launch
is `cuEventRecord(start)`, `cuLaunchKernel`, `cuEventRecord(end)`, `cuEventSynchronize(end)`, `cuEventElapsedTime_v2`
on the context's stream (GPU time by events, never the host clock), and a PTX program's extra parameters and dynamic
shared memory reach cuLaunchKernel. The real driver runs these on a GPU machine (bench/gpu/cuda_check.sh)."""
from __future__ import annotations

import ctypes

import pytest

from plugrad import dtypes
from plugrad.backend import new_program
from plugrad_cuda import runtime as rt

from cuda_helpers import ADD1_PTX


class Recorder:
  """A libcuda stand-in: every call is recorded by name (with the stream/event/sharedMem arguments that matter)."""
  def __init__(self, elapsed_ms: float = 2.5):
    self.calls: list[tuple] = []
    self.elapsed_ms = elapsed_ms

  def __getattr__(self, name: str):
    def call(*args):
      self.calls.append((name, *args))
      if name == "cuEventElapsedTime_v2": args[0]._obj.value = self.elapsed_ms
      return 0
    return call


class FakeCtx:
  def __init__(self):
    self.lib, self.stream = Recorder(), ctypes.c_void_p(0x5EED)
  def activate(self) -> None: pass
  def synchronize(self) -> None: pass


@pytest.fixture
def runtime(monkeypatch):
  ctx = FakeCtx()
  monkeypatch.setattr(rt, "context", lambda index: ctx)
  r = rt.CUDARuntime("CUDA", 0)
  for n, e in enumerate(r.events): e.value = 0xE0 + n  # stand-in handles (cuEventCreate wrote nothing)
  return r


class H:
  def __init__(self, ptr: int): self.ptr = ptr


def _names(calls) -> list[str]: return [c[0] for c in calls]


def _program(source: str, name: str, nvars: int = 0):
  f32 = dtypes.float32
  p = new_program(name, "CUDA", source=source, buffers=[(f32, "out"), (f32, "in")], global_size=(1,), local_size=(32,),
                  vars=[("n", 0, 1 << 20)][:nvars])
  return p.with_binary(b"\x7fELF fake cubin")


def test_timed_launch_is_bracketed_by_events_on_the_stream(runtime):
  prog = runtime.load(_program('extern "C" __global__ void k(float* a, const float* b) { a[0] = b[0]; }\n', "k"))
  lib = runtime.ctx.lib
  lib.calls.clear()
  assert prog(H(0x1000), H(0x2000), global_size=(4, 1, 1), local_size=(32, 1, 1), wait=True) == pytest.approx(2.5e-3)
  names = _names(lib.calls)
  seq = [n for n in names if n in ("cuEventRecord", "cuLaunchKernel", "cuEventSynchronize", "cuEventElapsedTime_v2")]
  assert seq == ["cuEventRecord", "cuLaunchKernel", "cuEventRecord", "cuEventSynchronize", "cuEventElapsedTime_v2"], names
  start, launch, end = (c for c in lib.calls if c[0] in ("cuEventRecord", "cuLaunchKernel"))
  assert start[1] is runtime.events[0] and end[1] is runtime.events[1], "start event, then end event"
  assert start[2] is runtime.ctx.stream and end[2] is runtime.ctx.stream and launch[9] is runtime.ctx.stream, "all on the context's stream"
  assert [a.value for a in launch[2:8]] == [4, 1, 1, 32, 1, 1] and launch[8].value == 0, "grid, block, no dynamic shared memory"
  lib.calls.clear()
  assert prog(H(0x1000), H(0x2000), global_size=(4, 1, 1), local_size=(32, 1, 1)) is None
  assert _names(lib.calls) == ["cuLaunchKernel"], "an untimed launch records no events and does not wait"


def test_ptx_program_launch_passes_extra_params_and_shared_memory(runtime):
  prog = runtime.load(_program(ADD1_PTX, "add1", nvars=1))
  assert prog.shared == 1024 and len(prog.extra) == 1
  lib = runtime.ctx.lib
  lib.calls.clear()
  prog(H(0x1000), H(0x2000), global_size=(1, 1, 1), local_size=(32, 1, 1), vals=(7,))
  (launch,) = [c for c in lib.calls if c[0] == "cuLaunchKernel"]
  assert launch[8].value == 1024, "the PTX's dynamic shared memory"
  arr = launch[10]
  types = (ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int32, ctypes.c_uint64)
  vals = [ctypes.cast(arr[i], ctypes.POINTER(t)).contents.value for i, t in enumerate(types)]
  assert vals == [0x1000, 0x2000, 7, 0], "buffers, the variable, then the trailing parameter as 0"
  assert not [c for c in lib.calls if c[0] == "cuFuncSetAttribute"], "48 KiB or less needs no opt-in"


def test_large_dynamic_shared_memory_opts_the_function_in(runtime):
  prog = runtime.load(_program(ADD1_PTX.replace("shared_bytes = 1024", "shared_bytes = 100000"), "add1", nvars=1))
  (attr,) = [c for c in runtime.ctx.lib.calls if c[0] == "cuFuncSetAttribute"]
  assert attr[2] == rt.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES and attr[3].value == 100000 and prog.shared == 100000
