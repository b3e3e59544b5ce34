"""plugrad-cuda without a GPU: the probe's reasons, the CLI, real Tensor programs rendered and compiled to cubins by
NVRTC + nvJitLink, and the CUDA-graph plan (nodes, edges, argument packing) built from a TinyJit capture on PYTHON.
The driver calls themselves (launches, copies, graphs) run only on a GPU machine: bench/gpu/cuda_check.sh."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

from plugrad import Tensor
from plugrad.backend import GraphLaunch as Launch
from plugrad.codegen import get_program
from plugrad.codegen.opt import Opt, OptOps
from plugrad.device.registry import Device, OfflineDevice
from plugrad.dtype import dtypes
from plugrad.engine.schedule import create_schedule
from plugrad.errors import CompileError, DeviceUnavailableError
from plugrad.testing.kernels import matmul_ast
from plugrad_cuda import driver, nvrtc
from plugrad_cuda.compiler import CUDACompiler
from plugrad_cuda.graph import KernelNodeParams, node_params
from plugrad_cuda.renderer import CUDARenderer
from plugrad_cuda.runtime import Params

ARCHS = ("sm_80", "sm_90")
HAS_DRIVER = driver.probe() is None


# ---- the probe

class FakeLib:
  """A libcuda stand-in: cuInit and cuDeviceGetCount return what the test says; error names as the driver gives them."""
  def __init__(self, init: int = 0, count: int = 1):
    self.init, self.count = init, count
  def cuInit(self, flags): return self.init
  def cuDeviceGetCount(self, n):
    n._obj.value = self.count
    return 0
  def cuGetErrorName(self, code, out):
    out._obj.value = {100: b"CUDA_ERROR_NO_DEVICE", 35: b"CUDA_ERROR_INSUFFICIENT_DRIVER"}.get(code, b"CUDA_ERROR_UNKNOWN")
    return 0
  def cuGetErrorString(self, code, out):
    out._obj.value = {100: b"no CUDA-capable device is detected", 35: b"CUDA driver version is insufficient for CUDA runtime version"}.get(code, b"")
    return 0


def _no_lib():
  raise OSError("libcuda.so.1: cannot open shared object file: No such file or directory")


def test_probe_reasons():
  assert driver.probe_with(_no_lib).startswith("no NVIDIA driver (libcuda.so.1 not found)")
  assert "cuInit returned CUDA_ERROR_NO_DEVICE (no CUDA-capable device is detected)" in driver.probe_with(lambda: FakeLib(init=100))
  assert "CUDA_ERROR_INSUFFICIENT_DRIVER" in driver.probe_with(lambda: FakeLib(init=35))
  assert "reports no CUDA devices" in driver.probe_with(lambda: FakeLib(count=0))
  assert driver.probe_with(lambda: FakeLib()) is None
  def broken(): raise RuntimeError("boom")
  assert driver.probe_with(lambda: type("L", (), {"cuInit": lambda self, f: broken()})()).startswith("the NVIDIA driver could not be queried")


def test_check_raises_typed_errors_with_the_driver_names():
  with pytest.raises(driver.CUDAOutOfMemory, match="cuMemAlloc failed: CUDA_ERROR_UNKNOWN"): driver.check(FakeLib(), 2, "cuMemAlloc")
  with pytest.raises(driver.CUDAError, match="CUDA_ERROR_NO_DEVICE"): driver.check(FakeLib(), 100, "cuInit")


@pytest.mark.skipif(HAS_DRIVER, reason="this machine has an NVIDIA driver")
def test_cli_lists_the_plugin_and_says_why_cuda_is_unavailable():
  env = {**os.environ, "PLUGRAD_STRICT_PLUGINS": "1"}
  out = subprocess.run([sys.executable, "-m", "plugrad", "plugins"], capture_output=True, text=True, env=env, timeout=120)
  row = next(ln for ln in out.stdout.splitlines() if ln.split()[:2] == ["cuda", "plugrad-cuda"])
  assert out.returncode == 0 and "unavailable here: no NVIDIA driver (libcuda.so.1 not found)" in row, out.stdout  # loaded, not failed
  dev = subprocess.run([sys.executable, "-m", "plugrad", "devices", "CUDA"], capture_output=True, text=True, env=env, timeout=120)
  assert "no NVIDIA driver (libcuda.so.1 not found)" in dev.stdout, dev.stdout
  assert dev.returncode == 1  # a named device that fails (docs/writing-a-backend.md); `devices` without names exits 0 here
  with pytest.raises(DeviceUnavailableError, match="libcuda.so.1 not found"): _ = Device["CUDA"]


# ---- rendering and compiling (no GPU needed)

@pytest.mark.skipif(HAS_DRIVER, reason="this machine has an NVIDIA driver: Device.offline gives the real device")
def test_offline_device_renders_and_compiles_only(monkeypatch):
  monkeypatch.setenv("CUDA_ARCH", "sm_90")
  dev = Device.offline("CUDA")
  assert isinstance(dev, OfflineDevice) and dev.renderer.arch == "sm_90" and "sm_90" in dev.compiler.cache_key
  with pytest.raises(DeviceUnavailableError, match="libcuda.so.1 not found"): _ = dev.runtime
  with pytest.raises(DeviceUnavailableError, match="renderer and compiler only"): _ = dev.allocator


def test_arch_from_the_environment(monkeypatch):
  from plugrad_cuda.plugin import arch
  monkeypatch.setenv("CUDA_ARCH", "sm_86")
  assert arch("CUDA") == "sm_86"
  monkeypatch.setenv("CUDA_ARCH", "ampere")
  with pytest.raises(ValueError, match="CUDA_ARCH must look like sm_80"): arch("CUDA")
  assert nvrtc.parse_arch("sm_100a") == (10, 0) and nvrtc.parse_arch("sm_90") == (9, 0)


def _kernels(t: Tensor) -> list:
  items, _ = create_schedule(t.uop)
  return [it.ast for it in items if it.kind == "kernel"]


def _compile(arch: str, ast, opts=None) -> tuple[str, bytes]:
  r = CUDARenderer("CUDA", arch)
  p = get_program(ast, r, opts=opts)
  src = r.render(p)
  return src, CUDACompiler(arch).compile(src)


@pytest.mark.parametrize("arch", ARCHS)
def test_tensor_programs_compile_to_cubins(arch):
  rng = np.random.default_rng(0)
  def T(*shape): return Tensor(rng.standard_normal(shape).astype(np.float32), device="PYTHON")
  progs = {"sum": T(1 << 14).sum(), "rowsum": T(64, 512).sum(1), "half": (T(256).half() * 3).exp2().half(),
           "bf16": (T(256).cast(dtypes.bfloat16) + T(256).cast(dtypes.bfloat16)).relu(), "matmul": T(64, 96) @ T(96, 32),
           "softmax": T(8, 128).softmax(-1)}
  srcs = {}
  for name, t in progs.items():
    for ast in _kernels(t):
      src, cubin = _compile(arch, ast)
      assert cubin[:4] == b"\x7fELF", name
      srcs.setdefault(name, []).append(src)
  assert any("__shared__" in s and "__syncthreads();" in s for s in srcs["sum"]), "the long reduction uses shared memory"
  assert any("pg_f2h" in s for s in srcs["half"]) and all('extern "C" __global__ void __launch_bounds__(' in s for v in srcs.values() for s in v)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("din", [dtypes.float16, dtypes.bfloat16], ids=["f16", "bf16"])
def test_tensor_core_matmul_compiles(arch, din):
  src, cubin = _compile(arch, matmul_ast(64, 32, 64, din, dtypes.float32), opts=[Opt(OptOps.TC, 0)])
  kind = "f16" if din is dtypes.float16 else "bf16"
  assert f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32" in src and cubin[:4] == b"\x7fELF"
  # the heuristics pick the tensor core by themselves for a matmul of matching shape and dtypes
  assert "mma.sync" in _compile(arch, matmul_ast(64, 32, 64, din, dtypes.float32))[0]


def test_compile_error_carries_the_nvrtc_log():
  with pytest.raises(CompileError, match=r"(?s)NVRTC .* for sm_80.*kernel.cu\(2\): error.*undefined"):
    CUDACompiler("sm_80").compile('extern "C" __global__ void k(float* a) {\n  a[0] = nope;\n}\n')
  with pytest.raises(CompileError, match="failed to compile"):  # through the core's cache: named kernel and source lines
    CUDACompiler("sm_80").compile_cached('extern "C" __global__ void k(float* a) {\n  a[0] = nope;\n}\n', "k")


def test_cache_key_names_the_toolchain_and_arch():
  c80, c90 = CUDACompiler("sm_80"), CUDACompiler("sm_90")
  v = nvrtc.libs().version
  assert c80.cache_key != c90.cache_key and f"nvrtc-{v[0]}.{v[1]}" in c80.cache_key and "--fmad=false" in c80.cache_key


def test_no_tensor_cores_before_sm_80():
  assert CUDARenderer("CUDA", "sm_75").tensor_cores == () and "tensor_cores" not in CUDARenderer("CUDA", "sm_75").capabilities
  assert len(CUDARenderer("CUDA", "sm_90").tensor_cores) == 2


# ---- the CUDA-graph nodes (pure Python; the plan itself: tests/device/test_graph_plan.py)

def test_params_pack_buffers_then_vars_in_place():
  p = Params(2, [ctypes.c_int32, ctypes.c_int64])
  addrs = [p.array[i] for i in range(4)]
  p.set([0x1000, 0x2000], [7, 1 << 40])
  assert p.as_tuple() == (0x1000, 0x2000, 7, 1 << 40) and [p.array[i] for i in range(4)] == addrs  # addresses stable
  assert ctypes.sizeof(p.values[0]) == 8 and ctypes.sizeof(p.values[2]) == 4 and ctypes.sizeof(p.values[3]) == 8
  n = node_params(ctypes.c_void_p(0x55), Launch((3, 2, 1), (128, 1, 1), (0x3000, 0x4000), (9, 10)), p)
  assert (n.func, n.gridDimX, n.gridDimY, n.blockDimX, n.sharedMemBytes) == (0x55, 3, 2, 128, 0) and p.as_tuple() == (0x3000, 0x4000, 9, 10)
  assert n.kernelParams == ctypes.cast(p.array, ctypes.c_void_p).value
  assert ctypes.sizeof(KernelNodeParams) == 8 + 7 * 4 + 4 + 8 * 4  # CUDA_KERNEL_NODE_PARAMS_v2 on x86-64 (padding after sharedMemBytes)
  with pytest.raises(Exception, match="takes 2 buffers and 2 variables"): p.set([1], [2, 3])
