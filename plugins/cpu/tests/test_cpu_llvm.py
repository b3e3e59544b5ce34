"""The in-process LLVM path of the CPU device (the default with llvmlite installed; CPU_LLVM=1 requires it):
LLVMRenderer + LLVMCompiler, loaded by the CPU runtime.

These tests use the LLVM components directly, so they run in either mode; every other CPU test runs through the
device's own mode, and test_cpu_c_path.py reruns these tests with CPU_LLVM=0 (tests/conformance runs the whole suite both ways)."""
import ctypes
import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from plugrad.dtype import dtypes
from plugrad.errors import CompileError, DeviceUnavailableError
from plugrad.renderer.base import RendererError
from plugrad.testing.harness import run_and_compare
from plugrad.testing.kernels import SuiteKernel, linear_program, op_kernel, run_linear, suite
from plugrad.uop.ops import Ops

pytest.importorskip("llvmlite", reason="the CPU_LLVM=1 path needs llvmlite (pip install -e 'plugins/cpu[llvm]')")

F32 = dtypes.float32


@pytest.fixture(scope="module")
def llvm():
  from plugrad_cpu.llvm_compiler import LLVMCompiler
  from plugrad_cpu.llvm_renderer import LLVMRenderer
  return LLVMRenderer("CPU"), LLVMCompiler()


def compiled(llvm, p):
  r, c = llvm
  src = r.render(p)
  return p.with_source(src).with_binary(c.compile(src))


@pytest.mark.parametrize("name", sorted(suite()))
def test_suite_kernels_render_compile_and_match(cpu, llvm, name):
  from plugrad_cpu.renderer import CPURenderer
  kernel: SuiteKernel = suite()[name](llvm[0])
  if kernel.needs - llvm[0].capabilities: pytest.skip(f"needs {sorted(kernel.needs - llvm[0].capabilities)}")
  p = kernel.program("CPU", llvm[0])
  try: CPURenderer("CPU").render(p)
  except RendererError:
    with pytest.raises(RendererError): llvm[0].render(p)  # what C cannot render, LLVM refuses too
    return
  run_and_compare(cpu, compiled(llvm, p), kernel)


def test_signature_and_attributes(llvm):
  from plugrad_cpu.llvm_compiler import host
  src = llvm[0].render(suite()["symbolic_size"](llvm[0]).program("CPU", llvm[0]))
  assert "define void @symbolic_size(ptr %data0, ptr %data1, i32 %var_n, i32 %core_id, i32 %core_count) #0 {" in src
  cpu_name, features = host()
  assert f'"target-cpu"="{cpu_name}"' in src and f'"target-features"="{features}"' in src and "nounwind" in src
  assert not any(flag in src for flag in (" fast ", " contract ", " reassoc ")), "float ops must not be contracted"


def test_broken_ir_is_a_compile_error_with_llvms_message(llvm):
  src = "define void @broken_kernel(ptr %data0, i32 %core_id, i32 %core_count) {\nentry:\n  store float %nothing, ptr %data0\n  ret void\n}\n"
  with pytest.raises(CompileError, match="LLVM rejected the IR") as e: llvm[1].compile(src)
  assert "%nothing" in str(e.value) and "error" in str(e.value)
  with pytest.raises(CompileError) as e2: llvm[1].compile_cached(src, "broken_kernel")
  msg = str(e2.value)
  assert "kernel 'broken_kernel' failed to compile (LLVMCompiler)" in msg and "> " in msg and "store float %nothing" in msg


def test_cache_key_names_llvm_and_the_host(llvm):
  import llvmlite
  import llvmlite.binding
  key = llvm[1].cache_key
  assert f"llvmlite {llvmlite.__version__}" in key and f"LLVM {llvmlite.binding.llvm_version_info[0]}." in key
  assert f"cpu={llvmlite.binding.get_host_cpu_name()}" in key and "features=" in key and "O2" in key


def test_unknown_cpu_llvm_value_is_a_value_error(monkeypatch):
  from plugrad_cpu import plugin
  monkeypatch.setenv("CPU_LLVM", "2")
  for hook in (plugin.plugrad_renderer, plugin.plugrad_compiler):
    with pytest.raises(ValueError, match="CPU_LLVM must be 0 or 1"): hook("CPU")


def test_missing_llvmlite_makes_the_device_unavailable(monkeypatch):
  from plugrad_cpu import plugin
  monkeypatch.setenv("CPU_LLVM", "1")
  monkeypatch.setitem(sys.modules, "llvmlite", None)  # the import fails, as when it is not installed
  monkeypatch.setitem(sys.modules, "llvmlite.binding", None)
  assert plugin.probe() == plugin.NO_LLVMLITE
  for hook in (plugin.plugrad_renderer, plugin.plugrad_compiler):
    with pytest.raises(DeviceUnavailableError, match=r"CPU_LLVM=1 needs llvmlite \(pip install llvmlite, or pip install plugrad-cpu\[llvm\]\)"):
      hook("CPU")


def test_the_default_is_llvm_when_llvmlite_is_installed(monkeypatch):
  from plugrad_cpu import plugin
  from plugrad_cpu.compiler import CPUCompiler
  from plugrad_cpu.llvm_compiler import LLVMCompiler
  monkeypatch.delenv("CPU_LLVM", raising=False)
  assert plugin.llvm_mode() and isinstance(plugin.plugrad_compiler("CPU"), LLVMCompiler)
  monkeypatch.setenv("CPU_LLVM", "0")
  assert not plugin.llvm_mode() and isinstance(plugin.plugrad_compiler("CPU"), CPUCompiler)
  monkeypatch.delenv("CPU_LLVM")
  monkeypatch.setitem(sys.modules, "llvmlite", None)  # not installed: C, and the device stays available
  assert not plugin.llvm_mode() and plugin.probe() is None and isinstance(plugin.plugrad_compiler("CPU"), CPUCompiler)


def test_small_kernels_get_the_quick_pipeline(llvm):
  # a kernel whose work is small is marked for the quick pipeline (its compile time would dominate); a big one is not
  from plugrad_cpu.llvm_compiler import QUICK_MARK
  small = llvm[0].render(suite()["reduce_rows"](llvm[0]).program("CPU", llvm[0]))
  assert small.startswith(QUICK_MARK + "\n")
  from plugrad.codegen import get_program
  from plugrad.engine.schedule import create_schedule
  from plugrad.tensor.tensor import Tensor
  a = Tensor(np.ones((512, 512), np.float32), device="CPU")
  items, _ = create_schedule((a @ a).uop)
  big = get_program(items[0].ast, llvm[0])
  assert not big.source.startswith(QUICK_MARK) and llvm[1].compile(big.source)[:4] == b"\x7fELF"


def test_missing_llvmlite_through_the_device_registry():
  code = textwrap.dedent("""
    import sys
    sys.modules["llvmlite"] = None
    from plugrad.device.registry import Device
    try: Device["CPU"]
    except Exception as e: print(type(e).__name__, e)
  """)
  env = {**os.environ, "CPU_LLVM": "1"}
  res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
  assert res.returncode == 0, res.stderr
  assert res.stdout.startswith("DeviceUnavailableError") and "CPU_LLVM=1 needs llvmlite" in res.stdout


def test_parallel_loop_is_split(cpu, llvm):
  from plugrad_cpu.renderer import PARALLEL_MARK
  from plugrad_cpu.runtime import POOL, CPURuntime
  kernel = suite()["reduce_rows"](llvm[0])
  p = compiled(llvm, kernel.program("CPU", llvm[0]))
  assert f"; {PARALLEL_MARK}" in p.source
  prog = CPURuntime("CPU", threads=2).load(p)
  assert prog.parallel
  rows = kernel.sizes[0]
  x = np.ascontiguousarray(kernel.inputs[1], np.float32)
  want = kernel.expected[0]
  for n in (1, 2, 3, rows + 2):  # more shares than rows: some run no iteration
    out = np.zeros(rows, np.float32)
    for k in range(n):
      before = out.copy()
      prog.fn(out.ctypes.data, x.ctypes.data, k, n)
      share = np.nonzero(out != before)[0]
      assert n == 1 or len(share) <= -(-rows // n)  # each share computes only its own rows
    np.testing.assert_allclose(out, want, rtol=kernel.rtol, atol=kernel.atol)
  out = np.zeros(rows, np.float32)
  tids = POOL.run(prog.fn, [out.ctypes.data, x.ctypes.data], 2)  # two threads at once
  assert len(tids) == 2
  np.testing.assert_allclose(out, want, rtol=kernel.rtol, atol=kernel.atol)


@pytest.mark.parametrize("op", [Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.POW])
def test_math_functions_link_and_run(cpu, llvm, op):
  """exp2/log2/sin/pow become calls into libm, which the JIT linker resolves from the process."""
  nargs = 2 if op is Ops.POW else 1
  a = np.linspace(0.1, 8.0, 29, dtype=np.float32)
  b = np.linspace(-2.0, 3.0, 29, dtype=np.float32)
  uops = op_kernel(op, (F32,) * nargs, F32, len(a))
  p = compiled(llvm, linear_program(f"math_{op.name.lower()}", uops, "CPU"))
  got = np.frombuffer(run_linear(p, [F32] * (nargs + 1), [a, b][:nargs])[0], np.float32)
  ref = {Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin, Ops.SQRT: np.sqrt, Ops.POW: np.power}[op](*[a, b][:nargs])
  np.testing.assert_allclose(got, ref, rtol=2e-6)


def test_objects_load_in_process_and_keep_their_symbols_apart(cpu, llvm):
  """Two kernels with the same symbol (different code) load side by side: each object is linked on its own."""
  from plugrad_cpu.runtime import CPURuntime, is_object
  a = np.arange(8, dtype=np.float32)
  progs = []
  for op in (Ops.NEG, Ops.SQRT):
    p = compiled(llvm, linear_program("same_name", op_kernel(op, (F32,), F32, 8), "CPU"))
    assert is_object(p.binary) and not is_object(b"\x7fELF" + bytes(12) + b"\x03\x00")
    progs.append(CPURuntime("CPU").load(p))
  outs = []
  for prog in progs:
    out = np.zeros(8, np.float32)
    assert isinstance(ctypes.cast(prog.fn, ctypes.c_void_p).value, int) and prog.fn.argtypes[-2:] == [ctypes.c_int, ctypes.c_int]
    prog.fn(out.ctypes.data, a.ctypes.data, 0, 1)
    outs.append(out)
  np.testing.assert_array_equal(outs[0], -a)
  np.testing.assert_array_equal(outs[1], np.sqrt(a))


def test_no_workgroups_or_c_text(llvm):
  kernel = suite()["workgroup"](llvm[0])
  with pytest.raises(RendererError, match="no workgroups"): llvm[0].render(kernel.program("CPU", llvm[0]))


def test_disassemble(llvm):
  p = compiled(llvm, linear_program("dis", op_kernel(Ops.ADD, (F32, F32), F32, 64), "CPU"))
  try: text = llvm[1].disassemble(p.binary)
  except CompileError as e: pytest.skip(str(e))  # no objdump
  assert "<dis>:" in text and "ret" in text


def test_float_to_int_wraps_like_the_interpreter(cpu, llvm):
  vals = [math.nan, math.inf, -math.inf, 3.7, -3.7, 2.0**40, -(2.0**63), 2.0**64 + 2.0**12, -(2.0**70), 1e300]
  for dst in (dtypes.int32, dtypes.uint8, dtypes.int64, dtypes.uint64):
    uops = op_kernel(Ops.CAST, (dtypes.float64,), dst, len(vals))
    want = run_linear(linear_program("f2i", uops, "PYTHON"), [dst, dtypes.float64], [np.array(vals)])[0]
    got = run_linear(compiled(llvm, linear_program("f2i", uops, "CPU")), [dst, dtypes.float64], [np.array(vals)])[0]
    assert got == want, dst


def test_index_arithmetic_is_nsw_and_loaded_ints_still_wrap(cpu, llvm):
  # index math is bounded by its loops, so it is marked nsw (LLVM widens it once: a large kernel's IndVarSimplify took
  # seconds without); arithmetic on loaded int32 values keeps C's -fwrapv semantics
  from plugrad.codegen import get_program
  from plugrad.engine.schedule import create_schedule
  from plugrad.tensor.tensor import Tensor
  a = Tensor(np.arange(64 * 48, dtype=np.int32).reshape(64, 48), device="CPU").realize()
  out = a.permute(1, 0) + (2**31 - 1)
  (item,), _ = create_schedule(out.uop)
  lines = get_program(item.ast, llvm[0]).source.splitlines()
  assert any("= mul nsw i32 %i" in ln for ln in lines), "the transposed index (i * 64 + j) is nsw"
  assert any(" add <" in ln and "nsw" not in ln and "2147483647" in ln for ln in lines), "the add of loaded values must wrap"
  want = (np.arange(64 * 48, dtype=np.int64).reshape(64, 48).T + 2**31 - 1).astype(np.int32)
  assert (out.numpy() == want).all()
