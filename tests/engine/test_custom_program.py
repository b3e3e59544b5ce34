"""Bring your own kernel: `plugrad.backend.new_program` / `run_program` with kernels written by hand (C and LLVM IR on
CPU, WGSL on WEBGPU), rebuilt from another program's source and signature, their typed errors, and TinyJit replay."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from plugrad import Tensor, TinyJit, Variable, dtypes
from plugrad.backend import ProgramArgumentError, ProgramError, ProgramUOp, new_program, run_program
from plugrad.uop import spec
from plugrad.uop.ops import Ops


def cpu_compiles_through_llvm() -> bool:
  try:
    from plugrad_cpu.plugin import llvm_mode
    return llvm_mode()
  except (ImportError, ValueError): return False


# out[i] = 2 * x[i] + y[i] for i < n: buffers, then variables in name order, then core_id, core_count (the CPU ABI)
SAXPY_C = """#include <stdint.h>
void saxpy(float *restrict out, const float *restrict x, const float *restrict y, int32_t n, int core_id, int core_count) {
  for (int32_t i = 0; i < n; i++) out[i] = 2.0f * x[i] + y[i];
}
"""
SAXPY_LL = """define void @saxpy(ptr %out, ptr %x, ptr %y, i32 %n, i32 %core_id, i32 %core_count) {
entry:
  br label %loop
loop:
  %i = phi i32 [0, %entry], [%next, %body]
  %more = icmp slt i32 %i, %n
  br i1 %more, label %body, label %done
body:
  %px = getelementptr float, ptr %x, i32 %i
  %py = getelementptr float, ptr %y, i32 %i
  %po = getelementptr float, ptr %out, i32 %i
  %a = load float, ptr %px
  %b = load float, ptr %py
  %m = fmul float %a, 2.0
  %s = fadd float %m, %b
  store float %s, ptr %po
  %next = add i32 %i, 1
  br label %loop
done:
  ret void
}
"""
SAXPY_SIG = [(dtypes.float32, "out"), (dtypes.float32, "in"), (dtypes.float32, "in")]
NVAR = ("n", 0, 1 << 20)
RNG = np.random.default_rng(0)


def rand(n: int) -> np.ndarray: return RNG.uniform(-1, 1, n).astype(np.float32)


def saxpy(source: str | None = None, binary: bytes | None = None) -> ProgramUOp:
  return new_program("saxpy", "CPU", source=source, binary=binary, buffers=SAXPY_SIG, global_size=(1, 1, 1), vars=[NVAR])


def check_saxpy(p: ProgramUOp) -> None:
  x, y = rand(37), rand(37)
  out = Tensor.empty(37, device="CPU")
  run_program(p, out, Tensor(x, device="CPU"), Tensor(y, device="CPU"), n=37)
  np.testing.assert_allclose(out.numpy(), 2 * x + y, rtol=1e-6)


# ---- the PROGRAM itself

def test_accessors_come_from_the_declared_signature():
  n = Variable("n", 1, 4096)
  p = new_program("k", "PYTHON", source="text", buffers=[(dtypes.float32, "out"), (dtypes.int32, "in"), (dtypes.float16, "inout")],
                  global_size=((n + 63) // 64, 2), local_size=(64,), vars=[n])
  spec.check("program", p)
  assert p.stage == "source" and p.external and p.name == "k" and p.device == "PYTHON" and p.source == "text"
  assert p.globals == (0, 1, 2) and p.ins == (1, 2) and p.outs == (0, 2)
  assert p.signature == ((dtypes.float32, "out"), (dtypes.int32, "in"), (dtypes.float16, "inout"))
  assert [v.arg for v in p.vars] == [("n", 1, 4096)]
  assert p.launch_dims({"n": 100}) == ((2, 2, 1), (64, 1, 1)) and p.launch_dims({n: 64}) == ((1, 2, 1), (64, 1, 1))
  assert p.local_size == (64, 1, 1)
  with pytest.raises(ProgramError, match="'n'"): p.launch_dims({})
  b = new_program("k", "cpu", binary=b"\x7fELF", buffers=[(dtypes.uint8, "out")], global_size=(1,))
  assert b.stage == "binary" and b.binary == b"\x7fELF" and b.device == "CPU" and b.vars == ()


@pytest.mark.parametrize("kwargs, match", [
  (dict(buffers=[(dtypes.float32, "in")]), "writes no buffer"),
  (dict(buffers=[(dtypes.float32, "output")]), "mode must be one of"),
  (dict(buffers=[(dtypes.float32.ptr(), "out")]), "scalar element dtype"),
  (dict(vars=[("n", 0, 9), ("a", 0, 9)]), "sorted by name"),
  (dict(global_size=(Variable("m", 1, 9),)), "'m', which is not among the declared vars"),
  (dict(global_size=(0,)), ">= 1"),
  (dict(source=None), "source .* or its binary"),
])
def test_a_malformed_signature_is_a_program_error_naming_the_kernel(kwargs, match):
  args = dict(source="x", buffers=[(dtypes.float32, "out")], global_size=(1,), vars=[]) | kwargs
  with pytest.raises(ProgramError, match=f"new_program 'bad': .*{match}"): new_program("bad", "CPU", **args)


# ---- hand-written kernels

@pytest.mark.skipif(not cpu_compiles_through_llvm(), reason="the CPU device compiles C here; the LLVM IR kernel needs CPU_LLVM=1")
def test_llvm_ir_kernel_on_cpu():
  check_saxpy(saxpy(source=SAXPY_LL))


@pytest.mark.skipif(cpu_compiles_through_llvm(), reason="the CPU device compiles LLVM IR here (test_c_path_reruns_these reruns with CPU_LLVM=0)")
def test_c_kernel_on_cpu():
  check_saxpy(saxpy(source=SAXPY_C))


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_c_kernel_as_a_prebuilt_shared_object(tmp_path):
  (tmp_path / "k.c").write_text(SAXPY_C)
  subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(tmp_path / "k.so"), str(tmp_path / "k.c")], check=True)
  check_saxpy(saxpy(binary=(tmp_path / "k.so").read_bytes()))  # loaded as is, whichever compiler the device uses


@pytest.mark.skipif(not cpu_compiles_through_llvm() or os.environ.get("CPU_LLVM") == "0", reason="this process already compiles C")
def test_c_path_reruns_these(tmp_path):
  env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
  env.update(CPU_LLVM="0", SPEC="1", PLUGRAD_CACHE_DIR=str(tmp_path))
  here = os.path.abspath(__file__)
  cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:xdist", "-o", "addopts=", here,
         "-k", "cpu or jit or rebuilt or order or wrong"]
  res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=os.path.dirname(os.path.dirname(os.path.dirname(here))))
  assert res.returncode == 0 and "test_c_kernel_on_cpu" not in res.stdout.split("short test summary")[-1], res.stdout[-4000:] + res.stderr[-2000:]


WGSL = """@group(0) @binding(0) var<storage, read_write> data0: array<f32>;
@group(0) @binding(1) var<storage, read_write> data1: array<f32>;
struct Args { n: i32 }
@group(0) @binding(2) var<uniform> args: Args;
@compute @workgroup_size(4, 1, 1)
fn scale_add(@builtin(global_invocation_id) gid: vec3<u32>) {
  let i = i32(gid.x);
  if (i < args.n) { data0[i] = data0[i] * 0.5 + data1[i]; }
}
"""


def test_wgsl_kernel_on_webgpu():
  pytest.importorskip("plugrad_webgpu", reason="plugrad-webgpu is not installed")
  pytest.importorskip("wgpu", reason="wgpu is not installed")
  from plugrad_webgpu.context import probe
  if (why := probe()) is not None: pytest.skip(f"no WebGPU adapter here: {why}")
  n = Variable("n", 1, 1024)
  p = new_program("scale_add", "WEBGPU", source=WGSL, buffers=[(dtypes.float32, "inout"), (dtypes.float32, "in")],
                  global_size=((n + 3) // 4,), local_size=(4,), vars=[n])
  a, b = rand(10), rand(10)
  acc = Tensor(a, device="WEBGPU").contiguous().realize()
  run_program(p, acc, Tensor(b, device="WEBGPU"), n=10)
  np.testing.assert_allclose(acc.numpy(), a * 0.5 + b, rtol=1e-6)
  run_program(p, acc, Tensor(b, device="WEBGPU"), n=n.bind(3))  # a bound Variable works like an int
  np.testing.assert_allclose(acc.numpy()[:3], ((a * 0.5 + b) * 0.5 + b)[:3], rtol=1e-6)
  np.testing.assert_allclose(acc.numpy()[3:], a[3:] * 0.5 + b[3:], rtol=1e-6)

  @TinyJit
  def f(x: Tensor, y: Tensor) -> Tensor:
    acc = (x + 1).contiguous().realize()
    run_program(p, acc, y, n=10)
    return acc * 2
  for _ in range(4):
    a, b = rand(10), rand(10)
    np.testing.assert_allclose(f(Tensor(a, device="WEBGPU"), Tensor(b, device="WEBGPU")).numpy(), ((a + 1) * 0.5 + b) * 2, rtol=1e-5)


PYTHON_TEXT = """# kernel 'double'
# target PYTHON
   0 DEFINE_GLOBAL  float32.ptr(-1)  ()     0
   1 DEFINE_GLOBAL  float32.ptr(-1)  ()     1
   2 DEFINE_VAR     int32            ()     ('n', 1, 1024)
   3 SPECIAL        int32            (2,)   'gidx0'
   4 INDEX          float32.ptr(-1)  (1,3)
   5 LOAD           float32          (4,)
   6 CONST          float32          ()     2.0
   7 MUL            float32          (5,6)
   8 INDEX          float32.ptr(-1)  (0,3)
   9 STORE          void             (8,7)
"""


def test_interpreter_text_kernel_on_python():  # the example of docs/writing-a-backend.md
  n = Variable("n", 1, 1024)
  p = new_program("double", "PYTHON", source=PYTHON_TEXT, buffers=[(dtypes.float32, "out"), (dtypes.float32, "in")], global_size=(n,), vars=[n])
  x, out = rand(7), Tensor.empty(7, device="PYTHON")
  run_program(p, out, Tensor(x, device="PYTHON"), n=7)
  np.testing.assert_allclose(out.numpy(), 2 * x)


# ---- a kernel rebuilt from another program's source and signature

@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_a_program_rebuilt_from_source_and_signature_alone_gives_identical_results(device):
  a, b = Tensor(rand(300).reshape(20, 15), device=device), Tensor(rand(15), device=device)
  a.realize(), b.realize()
  expr = (a * b + 1).exp2().sum(axis=1)
  (item,) = expr.schedule()
  p = item.program
  q = new_program(p.name, p.device, source=p.source, buffers=p.signature, global_size=p.global_size, local_size=p.local_size, vars=p.vars)
  assert q.external and q.signature == p.signature and q.globals == p.globals and q.launch_dims() == p.launch_dims()
  by_buffer = {t.uop.src[0] if t.uop.op is not Ops.BUFFER else t.uop: t for t in (a, b)}
  out = Tensor.empty(20, device=device)
  run_program(q, out, *(by_buffer[u] for u in item.bufs[1:]))
  assert out.numpy().tobytes() == expr.numpy().tobytes()


# ---- ordering with lazy tensors

def test_inputs_are_realized_first_and_old_readers_run_before_the_write():
  x = Tensor(np.arange(6, dtype=np.float32), device="CPU")
  out = Tensor(np.ones(6, np.float32), device="CPU").contiguous().realize()
  before = out * 10  # lazy: built from the old contents
  run_program(saxpy(source=SAXPY_LL if cpu_compiles_through_llvm() else SAXPY_C), out, x.reshape(2, 3).permute(1, 0).reshape(6), x + 1, n=6)
  xt = np.arange(6, dtype=np.float32).reshape(2, 3).T.reshape(6)
  np.testing.assert_allclose(out.numpy(), 2 * xt + np.arange(6) + 1)
  np.testing.assert_allclose(before.numpy(), np.full(6, 10.0))
  np.testing.assert_allclose((out + 1).numpy(), 2 * xt + np.arange(6) + 2)


# ---- typed errors

def test_wrong_arguments_raise_a_typed_error_naming_the_kernel():
  p = saxpy(source=SAXPY_C)
  out, x = Tensor.empty(4, device="CPU"), Tensor(rand(4), device="CPU")
  with pytest.raises(ProgramArgumentError, match=r"kernel 'saxpy': it takes 3 buffers \(out dtypes.float32, in .*\), got 2 tensors"):
    run_program(p, out, x, n=4)
  with pytest.raises(ProgramArgumentError, match="kernel 'saxpy': buffer 2 \\(in\\) holds dtypes.float32 elements, got a dtypes.int32 tensor"):
    run_program(p, out, x, x.cast(dtypes.int32), n=4)
  with pytest.raises(ProgramArgumentError, match="kernel 'saxpy': buffer 1 \\(in\\): the kernel runs on CPU, the tensor is on PYTHON"):
    run_program(p, out, x.to("PYTHON"), x, n=4)
  with pytest.raises(ProgramArgumentError, match="kernel 'saxpy': buffer 0 \\(out\\) is written in place, so it needs a realized"):
    run_program(p, x + 1, x, x, n=4)
  with pytest.raises(ProgramArgumentError, match="kernel 'saxpy': it needs a value for variable 'n'"):
    run_program(p, out, x, x)
  with pytest.raises(ProgramArgumentError, match="kernel 'saxpy': it has no variable 'm'"):
    run_program(p, out, x, x, n=4, m=1)
  with pytest.raises(ProgramArgumentError, match="kernel 'saxpy': variable 'n' = -1 is outside"):
    run_program(p, out, x, x, n=-1)
  with pytest.raises(ProgramArgumentError, match="kernel 'saxpy', buffer 0: expected a plugrad Tensor"):
    run_program(p, np.zeros(4, np.float32), x, x, n=4)
  assert issubclass(ProgramArgumentError, ProgramError)


# ---- TinyJit

def test_custom_kernel_inside_tinyjit_replays_with_changing_inputs():
  p = saxpy(source=SAXPY_LL if cpu_compiles_through_llvm() else SAXPY_C)
  y = Tensor(rand(8), device="CPU").realize()  # state the function reads

  @TinyJit
  def f(x: Tensor, n: object) -> tuple[Tensor, Tensor]:
    out = Tensor.empty(8, device="CPU")
    run_program(p, out, x, y, n=n)
    return out, out.sum()

  results = []
  for i in range(6):
    x = rand(8)
    k = 3 + i % 5
    out, total = f(Tensor(x, device="CPU"), Variable("n", 0, 1 << 20).bind(k))
    results.append((out, x, k))
    np.testing.assert_allclose(out.numpy()[:k], 2 * x[:k] + y.numpy()[:k], rtol=1e-6)
    if k == 8: np.testing.assert_allclose(total.item(), (2 * x + y.numpy()).sum(), rtol=1e-5)
  assert f.captured is not None and any(ei.runner is not None and ei.runner.program.external for ei in f.captured.items)
  for out, x, k in results:  # each call returned its own buffer: later replays did not overwrite earlier results
    np.testing.assert_allclose(out.numpy()[:k], 2 * x[:k] + y.numpy()[:k], rtol=1e-6)
