"""WEBGPU on the real adapter (wgpu-native; Mesa's software rasterizer on a machine without a GPU): compile errors,
limits, folded launches, timing, dtype refusals at the Tensor call, and the devices listing."""
import os
import subprocess
import sys

import numpy as np
import pytest

from plugrad.device.buffer import Buffer
from plugrad.device.runner import ProgramRunner
from plugrad.dtype import dtypes
from plugrad.errors import CompileError, DeviceUnavailableError, UnsupportedDTypeError
from plugrad.testing.kernels import LinearBuilder, SuiteKernel
from plugrad.uop.ops import Ops, UOp

I32 = dtypes.int32


def test_invalid_wgsl_raises_compile_error_with_nagas_message_and_line(webgpu):
  src = "@compute @workgroup_size(1)\nfn k() {\n  let x = 1i;\n  let y = x + undefined_name;\n}\n"
  with pytest.raises(CompileError) as e: webgpu.compiler.compile_cached(src, "broken")
  msg = str(e.value)
  assert "kernel 'broken' failed to compile" in msg and "naga rejected the WGSL" in msg and "undefined_name" in msg
  assert "WGSL line 4" in msg and ">    4 |   let y = x + undefined_name;" in msg  # the core quotes the source around it


def test_renderer_limits_are_the_adapters(webgpu):
  from plugrad_webgpu.context import gpu
  lim = gpu().device.limits
  assert webgpu.renderer.local_max == (lim["max-compute-workgroup-size-x"], lim["max-compute-workgroup-size-y"], lim["max-compute-workgroup-size-z"])
  assert webgpu.renderer.shared_max == lim["max-compute-workgroup-storage-size"]
  assert webgpu.renderer.global_max[1] == lim["max-compute-workgroups-per-dimension"]


def test_folded_launch_past_the_per_dimension_limit(webgpu):
  n = webgpu.renderer.limits.workgroups + 123  # more workgroups than one dispatch dimension holds
  k = LinearBuilder()
  out = k.glob(0, I32, n)
  g = k.emit(UOp(Ops.SPECIAL, I32, (k.const(I32, n),), "gidx0"))
  k.store(out, g, k.alu(Ops.MUL, g, k.const(I32, 3)))
  prog = SuiteKernel("folded", k.linear, {}, {}, {0: n}, {0: I32}).program("WEBGPU", webgpu.renderer)
  buf = Buffer("WEBGPU", n, I32).copyin(np.full(n, -1, np.int32).data.cast("B"))
  ProgramRunner(prog)([buf], {}, wait=True)
  np.testing.assert_array_equal(buf.numpy(), np.arange(n, dtype=np.int32) * 3)


def test_kernel_time_with_wait(webgpu):
  from plugrad.device.smoke import smoke_input, smoke_program
  out = Buffer("WEBGPU", 16, dtypes.float32).allocate()
  inp = Buffer("WEBGPU", 16, dtypes.float32).copyin(smoke_input().data)
  t = ProgramRunner(smoke_program("WEBGPU"))([out, inp], {}, wait=True)
  assert isinstance(t, float) and 0 <= t < 10


def test_unsupported_dtypes_fail_at_the_tensor_call(webgpu):
  from plugrad import Tensor
  with pytest.raises(UnsupportedDTypeError, match=r"WEBGPU does not support float64 \(WGSL has no 64-bit floats\)"):
    Tensor([1.0, 2.0], device="WEBGPU", dtype=dtypes.float64)
  t = Tensor([1, 2, 3], device="WEBGPU")
  with pytest.raises(UnsupportedDTypeError, match=r"WEBGPU does not support int64 \(WGSL has no 64-bit integers\)"): t.cast(dtypes.int64)
  Tensor.manual_seed(3)
  ref = Tensor.rand(64, device="PYTHON").numpy()  # the core's reference device: plugrad-webgpu alone has no CPU device
  Tensor.manual_seed(3)  # without uint64 the draw runs on 32-bit words: the same numbers
  np.testing.assert_array_equal(Tensor.rand(64, device="WEBGPU").numpy(), ref)
  np.testing.assert_array_equal((t * 2).numpy(), [2, 4, 6])  # what is supported still runs
  np.testing.assert_allclose(Tensor([1.5, 2.25], device="WEBGPU").half().float().numpy(), [1.5, 2.25])


def test_packed_narrow_dtypes_round_trip_through_kernels(webgpu):
  from plugrad import Tensor
  x = np.array([-128, -1, 0, 1, 127, 5, -7], np.int8)
  np.testing.assert_array_equal((Tensor(x, device="WEBGPU") + 1).numpy(), (x + np.int8(1)).astype(np.int8))
  b = Tensor(np.array([True, False, True]), device="WEBGPU")
  np.testing.assert_array_equal((~b).numpy(), [False, True, False])


def test_one_adapter_per_process(webgpu):
  from plugrad_webgpu.context import check_device
  with pytest.raises(DeviceUnavailableError, match="one adapter per process"): check_device("WEBGPU:1")


def _devices(env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
  env = {**os.environ, "PLUGRAD_STRICT_PLUGINS": "1", **env_extra}
  return subprocess.run([sys.executable, "-m", "plugrad", "devices", "WEBGPU"], env=env, capture_output=True, text=True, timeout=120)


def test_devices_lists_webgpu_pass_with_the_adapter_name(webgpu):
  from plugrad_webgpu.context import gpu
  res = _devices({})
  line = next(ln for ln in res.stdout.splitlines() if ln.startswith("WEBGPU"))
  assert res.returncode == 0 and "PASS" in line and gpu().adapter_name in line


def test_no_adapter_reports_unavailable_with_the_reason(webgpu):
  res = _devices({"WGPU_BACKEND_TYPE": "Metal"})  # a backend wgpu-native on Linux is built without
  line = next(ln for ln in res.stdout.splitlines() if ln.startswith("WEBGPU"))
  assert res.returncode == 1 and "UNAVAILABLE" in line and "FAIL" not in line and "no WebGPU adapter" in line  # named: exit 1


@pytest.mark.parametrize("backend", ["Vulkan", "OpenGL"])
def test_nan_semantics_hold_on_every_mesa_backend(webgpu, backend):
  # llvmpipe through OpenGL assumes no nans (`nan < -1` was true: clip(nan) gave -1) and folds `nan * 0.0` to 0; the
  # renderer tests nan on the bits, so every adapter `devices` calls PASS computes what the conformance suite expects
  code = ("import numpy as np; from plugrad import Tensor\n"
          "x = Tensor(np.array([np.nan, -np.inf, np.inf, 2.0], np.float32), device='WEBGPU')\n"
          "print((x.clip(-1, 1).numpy(), (x < 0).numpy(), (x == x).numpy(), (x * 0).numpy(), x.maximum(0).numpy()))")
  env = {**os.environ, "WGPU_BACKEND_TYPE": backend}
  if _devices({"WGPU_BACKEND_TYPE": backend}).returncode != 0: pytest.skip(f"no WebGPU adapter through {backend} here")
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  assert out.stdout.split() == str((np.array([np.nan, -1, 1, 1], np.float32), np.array([False, True, False, False]),
                                    np.array([False, True, True, True]), np.array([np.nan, np.nan, np.nan, 0], np.float32),
                                    np.array([np.nan, 0, np.inf, 2], np.float32))).split(), out.stdout
