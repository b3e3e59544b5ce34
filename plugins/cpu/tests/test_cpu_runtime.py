"""The runtime and the allocator: threads, timing, aligned zero-copy memory."""
import numpy as np
import pytest

from plugrad.device.buffer import Buffer
from plugrad.device.runner import ProgramRunner
from plugrad.dtype import dtypes
from plugrad.testing.kernels import LinearBuilder, Variable, linear_program
from plugrad.uop.ops import Ops, UOp

F32, I32 = dtypes.float32, dtypes.int32


def saxpy(n: int) -> list[UOp]:
  """out[i] = a[i] * 2.5 + sin(a[i]), with a symbolic element count `n` <= n."""
  k = LinearBuilder()
  out, a = k.glob(0, F32, n), k.glob(1, F32, n)
  m = k.emit(Variable("m", 1, n, I32))
  i = k.range(m, 0)
  x = k.load(a, i)
  k.store(out, i, k.alu(Ops.ADD, k.alu(Ops.MUL, x, k.const(F32, 2.5)), k.alu(Ops.SIN, x)))
  k.end(i)
  return k.linear


def launch(cpu, runtime, n: int, m: int) -> tuple[np.ndarray, object]:
  p = linear_program("saxpy_sin", saxpy(n), "CPU")
  runner = ProgramRunner(p)
  runner.lib = runtime.load(runner.program)  # the same binary, loaded by a runtime with its own thread count
  x = np.linspace(-50, 50, n, dtype=np.float32)
  out, a = Buffer("CPU", n, F32).copyin(np.zeros(n, np.float32).data), Buffer("CPU", n, F32).copyin(x.data)
  t = runner([out, a], {"m": m}, wait=True)
  assert isinstance(t, float) and t > 0
  return out.numpy(), runner.lib


def test_threads_give_identical_results_and_really_run_in_parallel(cpu):
  from plugrad_cpu.runtime import CPURuntime
  n = 1 << 22  # 4M floats: enough work to split
  one, lib1 = launch(cpu, CPURuntime("CPU", threads=1), n, n)
  two, lib2 = launch(cpu, CPURuntime("CPU", threads=2), n, n)
  assert one.tobytes() == two.tobytes()
  assert len(lib1.last_threads) == 1 and len(lib2.last_threads) == 2  # two OS threads ran shares of the loop
  small, lib3 = launch(cpu, CPURuntime("CPU", threads=2), 4096, 100)
  assert len(lib3.last_threads) == 1 and small[100] == 0 and small[99] != 0  # small launches stay on one thread; m bounds the loop
  odd, lib4 = launch(cpu, CPURuntime("CPU", threads=3), n, n - 7)  # uneven shares
  assert len(lib4.last_threads) == 3 and odd[: n - 7].tobytes() == one[: n - 7].tobytes() and not odd[n - 7:].any()


def test_THREADS_env(monkeypatch):
  from plugrad_cpu.runtime import CPURuntime, default_threads
  assert default_threads({"THREADS": "3"}) == 3 and default_threads({}) >= 1
  with pytest.raises(ValueError, match="THREADS must be a positive integer, got 'x'"): default_threads({"THREADS": "x"})
  monkeypatch.setenv("THREADS", "5")
  assert CPURuntime("CPU").threads == 5


def test_CPU_DEVICES_splits_the_threads(monkeypatch):
  from plugrad_cpu.runtime import CPURuntime, instance_threads
  assert [instance_threads(f"CPU:{i}", {"THREADS": "5", "CPU_DEVICES": "2"}) for i in range(2)] == [3, 2]
  assert [instance_threads(f"CPU:{i}", {"THREADS": "2", "CPU_DEVICES": "3"}) for i in range(3)] == [1, 1, 1]  # at least one each
  assert instance_threads("CPU", {"THREADS": "4"}) == 4  # one instance: every thread
  with pytest.raises(ValueError, match="CPU_DEVICES='0' is not valid"): instance_threads("CPU", {"CPU_DEVICES": "0"})
  monkeypatch.setenv("THREADS", "4")
  monkeypatch.setenv("CPU_DEVICES", "2")
  assert (CPURuntime("CPU").threads, CPURuntime("CPU:1").threads) == (2, 2)
  from plugrad_cpu.plugin import instances, probe
  assert instances() == 2
  monkeypatch.setenv("CPU_DEVICES", "two")
  with pytest.raises(ValueError, match="CPU_DEVICES='two'"): probe()  # a SettingsError: the device is misconfigured


def test_transfer_between_instances(cpu):
  alloc = cpu.allocator
  src = Buffer(cpu.name, 100, dtypes.int32, allocator=alloc).copyin(np.arange(100, dtype=np.int32).data.cast("B"))
  dest = Buffer(cpu.name, 100, dtypes.int32, allocator=type(alloc)("CPU:1")).copy_from(src)  # another instance's allocator
  assert alloc.supports_transfer and (dest.numpy() == np.arange(100)).all()


def test_allocations_are_aligned_and_zero_copy(cpu):
  alloc = cpu.allocator
  for nbytes in (0, 1, 3, 64, 100, 4096, 1 << 20):
    h = alloc.alloc(nbytes)
    assert h.addr % 64 == 0 and h.nbytes == nbytes
    alloc.free(h, nbytes)
  buf = Buffer("CPU", 100, F32).copyin(np.arange(100, dtype=np.float32).data)
  mv = buf.as_buffer()
  np.frombuffer(mv, np.float32)[3] = 42.0  # the memoryview is the buffer's memory
  assert buf.numpy()[3] == 42.0
  view = buf.view(10, F32, offset=40)
  assert view.handle.addr == buf.handle.addr + 40 and view.numpy()[0] == 10.0
  with pytest.raises(ValueError, match="copyin of 8 bytes into a buffer of 400"): alloc._copyin(buf.handle, memoryview(bytes(8)))


def test_launch_errors(cpu):
  from plugrad.errors import LaunchError
  p = ProgramRunner(linear_program("saxpy_sin", saxpy(16), "CPU"))
  with pytest.raises(LaunchError, match="takes 2 buffers, got 1"): p.lib(p.lib, vals=(3,))
  h = cpu.allocator.alloc(64)
  with pytest.raises(LaunchError, match="no workgroups"): p.lib(h, h, vals=(3,), local_size=(4, 1, 1))
  with pytest.raises(LaunchError, match="CPU buffer handles"): p.lib(h, np.zeros(16, np.float32), vals=(3,))


def test_the_thread_pool_works_in_a_forked_child(cpu):
  import multiprocessing as mp

  from plugrad_cpu.runtime import CPURuntime
  launch(cpu, CPURuntime("CPU", threads=2), 1 << 20, 1 << 20)  # the parent's pool has started its workers
  ctx = mp.get_context("fork")
  with ctx.Pool(1) as pool: assert pool.apply_async(_child_runs_two_threads, ()).get(timeout=120) == 2  # a stale pool would hang


def _child_runs_two_threads() -> int:
  from plugrad.device.registry import Device
  from plugrad_cpu.runtime import CPURuntime
  return len(launch(Device["CPU"], CPURuntime("CPU", threads=2), 1 << 20, 1 << 20)[1].last_threads)


def test_disassemble(cpu):
  from plugrad.device.smoke import smoke_program
  lib = cpu.compiler.compile_cached(cpu.renderer.render(smoke_program("CPU")), "smoke_add1")
  try: text = cpu.compiler.disassemble(lib)
  except Exception as e: pytest.skip(f"no disassembler here: {e}")
  assert "smoke_add1" in text
