"""plugrad-cuda's driver declarations checked against the real cuda.h, and its allocator, runtime and CUDA-graph runner
driven through a C stand-in for libcuda compiled against that header (cuda_standin.c; standin.py has the check).

No GPU is needed; cuda.h comes from NVIDIA's `nvidia-cuda-runtime` wheel (in plugrad-cuda's `test` extra; without it
these tests skip, saying so), and gcc compiles the check and the stand-in into a temporary directory. What the
stand-in cannot show (real kernels, real timing, the hardware) is bench/gpu/cuda_check.sh's on a GPU machine."""
from __future__ import annotations

import ctypes
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import standin

import plugrad_cuda
from plugrad.backend import DeviceError, new_program
from plugrad.dtype import dtypes
from plugrad_cuda import driver
from plugrad_cuda.graph import KernelNodeParams

INCLUDE = standin.find_cuda_h()
pytestmark = [
  pytest.mark.skipif(INCLUDE is None, reason="no cuda.h: pip install nvidia-cuda-runtime (NVIDIA's wheel ships the header; no GPU needed)"),
  pytest.mark.skipif(standin.compiler() is None, reason="no C compiler (gcc) to build the header check and the libcuda stand-in"),
]
STRUCTS = {"CUDA_KERNEL_NODE_PARAMS": KernelNodeParams}
F32 = dtypes.float32
ADD_SRC = ('extern "C" __global__ void pg_add(float* out, const float* a, const float* b) {\n'
           "  int i = blockIdx.x * blockDim.x + threadIdx.x; out[i] = a[i] + b[i];\n}\n")
FAKE_CUBIN = b"\x7fELF the stand-in runs its own pg_add"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
  assert INCLUDE is not None
  return standin.build_standin(INCLUDE, tmp_path_factory.mktemp("standin"))


@pytest.fixture
def lib(built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
  """A fresh copy of the stand-in (its own state) as plugrad_cuda's libcuda for this test."""
  so = tmp_path / "libcuda.so.1"
  shutil.copy(built, so)
  monkeypatch.setattr(driver, "LIBCUDA", str(so))
  driver.cuda.cache_clear()
  driver.context.cache_clear()
  raw = ctypes.CDLL(str(so))
  raw.standin_log.restype = ctypes.c_char_p
  raw.standin_last_alloc_size.restype = ctypes.c_size_t
  yield raw
  driver.cuda.cache_clear()
  driver.context.cache_clear()


def _log(raw: ctypes.CDLL) -> list[str]: return (raw.standin_log() or b"").decode().splitlines()


# ---- the declarations against the header

def test_prototypes_constants_and_structs_match_cuda_h(tmp_path: Path):
  assert INCLUDE is not None
  assert standin.header_problems(INCLUDE, tmp_path, driver.PROTOTYPES, driver.CONSTANTS, STRUCTS) == []


def test_every_driver_call_in_the_plugin_has_a_prototype():
  called = standin.called_functions(Path(plugrad_cuda.__file__).parent)
  assert called and not called - driver.PROTOTYPES.keys(), f"called without a prototype: {sorted(called - driver.PROTOTYPES.keys())}"
  assert not driver.PROTOTYPES.keys() - called, f"declared but never called: {sorted(driver.PROTOTYPES.keys() - called)}"


def test_planted_wrong_declarations_are_caught(tmp_path: Path):
  assert INCLUDE is not None
  P, u32 = ctypes.POINTER, ctypes.c_uint32
  def problems(protos=None, consts=None, structs=None) -> str:
    return "\n".join(standin.header_problems(INCLUDE, tmp_path, protos or {}, consts or {}, structs or {}))
  # a 32-bit cuMemAlloc: a 4-byte CUdeviceptr out-parameter and a 4-byte size
  got = problems({"cuMemAlloc_v2": (("CUdeviceptr *", P(u32)), ("size_t", u32))})
  assert "cuMemAlloc_v2 parameter 0 (CUdeviceptr *): points to 8 bytes in cuda.h, LP_c_uint to 4" in got, got
  assert "cuMemAlloc_v2 parameter 1 (size_t): 8 bytes in cuda.h, 4 as c_uint" in got, got
  # the C type written down wrong: the compiler rejects the prototype
  got = problems({"cuMemAlloc_v2": (("CUdeviceptr *", P(ctypes.c_uint64)), ("unsigned int", u32))})
  assert got.startswith("cuMemAlloc_v2: the C types ['CUdeviceptr *', 'unsigned int'] do not match cuda.h's prototype"), got
  # signedness, a pointer passed where cuda.h has an integer, and the legacy names the header maps to _v2
  assert "cuInit parameter 0 (unsigned int): unsigned in cuda.h, c_int is not" in problems({"cuInit": (("unsigned int", ctypes.c_int),)})
  assert "cuMemFree_v2 parameter 0 (CUdeviceptr): cuda.h has a integer, ctypes passes c_void_p" in problems(
    {"cuMemFree_v2": (("CUdeviceptr", ctypes.c_void_p),)})
  legacy = dict(driver.PROTOTYPES)
  legacy["cuEventElapsedTime"] = legacy.pop("cuEventElapsedTime_v2")
  legacy["cuMemAlloc"] = legacy.pop("cuMemAlloc_v2")
  got = problems(legacy)
  assert "cuMemAlloc: cuda.h maps this name to cuMemAlloc_v2" in got, got
  if standin.cuda_version(INCLUDE) >= 13000:  # CUDA 12.9's header declares the _v2 but leaves the old name as it was
    assert "cuEventElapsedTime: cuda.h maps this name to cuEventElapsedTime_v2" in got and got.count("\n") == 1, got
  # a wrong enum value, and structs laid out wrong: a 64-bit sharedMemBytes, a field left out (every later one moves)
  assert "CU_STREAM_NON_BLOCKING is 1 in cuda.h, 2 in plugrad_cuda" in problems(consts={"CU_STREAM_NON_BLOCKING": 2})
  class Wide(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64 if n == "sharedMemBytes" else t) for n, t in KernelNodeParams._fields_]
  got = problems(structs={"CUDA_KERNEL_NODE_PARAMS": Wide})
  assert got == "CUDA_KERNEL_NODE_PARAMS.sharedMemBytes: offset 32 size 4 in cuda.h, offset 32 size 8 in ctypes", got
  class Short(ctypes.Structure):
    _fields_ = [(n, t) for n, t in KernelNodeParams._fields_ if n != "gridDimZ"]
  got = problems(structs={"CUDA_KERNEL_NODE_PARAMS": Short})
  assert "struct CUDA_KERNEL_NODE_PARAMS: 72 bytes in cuda.h, 64 as Short" in got, got
  assert "CUDA_KERNEL_NODE_PARAMS.blockDimX: offset 20 size 4 in cuda.h, offset 16 size 4 in ctypes" in got, got


def test_an_undeclared_function_is_refused_not_called_untyped(lib):
  # untyped, ctypes passes a Python int as a 32-bit C int: a 5 GiB size silently arrives as 1 GiB
  ptr = ctypes.c_uint64()
  assert lib.cuInit(0) == 0 and lib.cuMemAlloc_v2(ctypes.byref(ptr), 5 << 30) == 0
  assert lib.standin_last_alloc_size() == 1 << 30
  protos = {k: v for k, v in driver.PROTOTYPES.items() if k != "cuMemAlloc_v2"}
  d = driver.Driver(ctypes.CDLL(driver.LIBCUDA), protos)
  with pytest.raises(driver.DriverSignatureError, match="cuMemAlloc_v2 is not declared in plugrad_cuda.driver.PROTOTYPES"):
    d.cuMemAlloc_v2(ctypes.byref(ptr), 5 << 30)
  # through the prototypes a size above 4 GiB arrives whole (the stand-in reserves it lazily)
  from plugrad_cuda.allocator import CUDAAllocator
  a = CUDAAllocator("CUDA", 0)
  h = a._alloc(5 << 30, None)
  assert lib.standin_last_alloc_size() == 5 << 30 and h.nbytes == 5 << 30
  a._free(h, h.nbytes, None)
  with pytest.raises(driver.DriverSignatureError, match="has no cuNoSuchCall"): driver.Driver(ctypes.CDLL(driver.LIBCUDA), {"cuNoSuchCall": ()})


# ---- the allocator, runtime and graph runner through the stand-in

def test_context_and_probe_through_the_standin(lib):
  assert driver.probe() is None
  ctx = driver.context(0)
  assert ctx.name == "plugrad CUDA stand-in (no GPU)" and ctx.cc == (9, 0) and ctx.driver_version[0] >= 12
  with pytest.raises(DeviceError, match="CUDA:1 does not exist: the driver reports 1 device"): driver.Context(1)


@pytest.mark.parametrize("nbytes", [1000, 4 << 20, (4 << 20) + 12345, 9 << 20])
def test_allocator_round_trips_above_and_below_the_staging_size(lib, nbytes: int):
  from plugrad_cuda.allocator import CUDAAllocator
  a = CUDAAllocator("CUDA", 0)
  h = a._alloc(nbytes, None)
  data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
  lib.standin_log_clear()
  a._copyin(h, data.data)
  back = np.zeros_like(data)
  a._copyout(back.data, h)
  assert np.array_equal(back, data)
  chunks = -(-nbytes // CUDAAllocator.STAGING)
  log = _log(lib)
  assert sum(x.startswith("cuMemcpyHtoDAsync_v2") for x in log) == chunks == sum(x.startswith("cuMemcpyDtoHAsync_v2") for x in log)
  a._free(h, nbytes, None)
  assert _log(lib)[-1] == f"cuMemFree_v2 {h.ptr}"
  with pytest.raises(driver.CUDAError, match="cuMemFree failed: CUDA_ERROR_INVALID_VALUE"): a._free(h, nbytes, None)  # twice


def test_allocator_out_of_memory_is_typed(lib):
  from plugrad_cuda.allocator import CUDAAllocator
  with pytest.raises(driver.CUDAOutOfMemory, match="CUDA_ERROR_OUT_OF_MEMORY"): CUDAAllocator("CUDA", 0)._alloc(1 << 50, None)


def _buffers(a, *arrays: np.ndarray):
  hs = []
  for x in arrays:
    h = a._alloc(x.nbytes, None)
    a._copyin(h, x.data)
    hs.append(h)
  return hs


def _read(a, h, n: int) -> np.ndarray:
  out = np.zeros(n, np.float32)
  a._copyout(out.data, h)
  return out


def test_runtime_launches_and_times_by_events(lib):
  from plugrad_cuda.allocator import CUDAAllocator
  from plugrad_cuda.runtime import CUDARuntime
  a, rt = CUDAAllocator("CUDA", 0), CUDARuntime("CUDA", 0)
  x, y = np.arange(1024, dtype=np.float32), np.full(1024, 0.5, np.float32)
  out, hx, hy = _buffers(a, np.zeros(1024, np.float32), x, y)
  prog = rt.load(new_program("pg_add", "CUDA", source=ADD_SRC, binary=FAKE_CUBIN, buffers=[(F32, "out"), (F32, "in"), (F32, "in")],
                             global_size=(4,), local_size=(256,)))
  lib.standin_log_clear()
  assert prog(out, hx, hy, global_size=(4, 1, 1), local_size=(256, 1, 1)) is None
  assert _log(lib) == ["cuLaunchKernel pg_add 4 1 1 256 1 1 0"]
  np.testing.assert_array_equal(_read(a, out, 1024), x + y)
  lib.standin_log_clear()
  secs = prog(out, hy, hy, global_size=(4, 1, 1), local_size=(256, 1, 1), wait=True)
  assert isinstance(secs, float) and 0 <= secs < 1.0
  names = [x.split()[0] for x in _log(lib)]
  assert names == ["cuEventRecord", "cuLaunchKernel", "cuEventRecord", "cuEventSynchronize", "cuEventElapsedTime_v2"], names
  np.testing.assert_array_equal(_read(a, out, 1024), y + y)
  # the driver's error names reach the user: a block of 2048 threads, and a kernel the stand-in cannot run
  with pytest.raises(driver.CUDAError, match=r"cuLaunchKernel\('pg_add', grid \(1, 1, 1\), block \(2048, 1, 1\)\) failed: CUDA_ERROR_INVALID_V"):
    prog(out, hx, hy, global_size=(1, 1, 1), local_size=(2048, 1, 1))
  other = rt.load(new_program("E_4", "CUDA", binary=FAKE_CUBIN, buffers=[(F32, "out")], global_size=(1,)))
  with pytest.raises(driver.CUDAError, match="CUDA_ERROR_NOT_SUPPORTED"): other(out)
  with pytest.raises(driver.CUDAError, match="cuModuleLoadData.*CUDA_ERROR_INVALID_IMAGE"):
    rt.load(new_program("pg_add", "CUDA", binary=b"not a cubin", buffers=[(F32, "out")], global_size=(1,)))


def test_ptx_program_with_more_than_48k_dynamic_shared_memory_is_opted_in(lib):
  from plugrad_cuda.allocator import CUDAAllocator
  from plugrad_cuda.runtime import CUDARuntime
  ptx_src = textwrap.dedent("""\
    // plugrad.shared_bytes = 100000
    .version 8.0
    .target sm_90
    .address_size 64
    .visible .entry pg_add(.param .u64 p0, .param .u64 p1, .param .u64 p2)
    { ret; }
    """)
  a, rt = CUDAAllocator("CUDA", 0), CUDARuntime("CUDA", 0)
  out, hx = _buffers(a, np.zeros(64, np.float32), np.ones(64, np.float32))
  prog = rt.load(new_program("pg_add", "CUDA", source=ptx_src, binary=ptx_src.encode() + b"\0",
                             buffers=[(F32, "out"), (F32, "in"), (F32, "in")], global_size=(1,), local_size=(64,)))
  assert prog.shared == 100000 and "cuFuncSetAttribute 8 100000" in _log(lib)
  prog(out, hx, hx, global_size=(1, 1, 1), local_size=(64, 1, 1))  # the stand-in refuses > 48 KiB without the opt-in
  np.testing.assert_array_equal(_read(a, out, 64), np.full(64, 2, np.float32))


GRAPH_SCRIPT = """
import ctypes, json, sys
import numpy as np
from plugrad_cuda import driver
driver.LIBCUDA = sys.argv[1]
from plugrad import Device, Tensor, TinyJit, Variable
from plugrad.backend import new_program, run_program
from plugrad.dtype import dtypes
F32, n = dtypes.float32, Variable("n", 0, 1024)
sig = [(F32, "out"), (F32, "in"), (F32, "in")]
add = new_program("pg_add", "CUDA", source=sys.argv[2], binary=sys.argv[3].encode(), buffers=sig, global_size=(4,), local_size=(256,))
# out[i] = a[i] + b[i] for i < n: its grid is ceil(n / 256) blocks, none for n = 0 (the graph drops that node)
add_n = new_program("pg_add_n", "CUDA", binary=sys.argv[3].encode(), buffers=sig, global_size=((n + 255) // 256,), local_size=(256,), vars=[n])

@TinyJit
def step(x, y, k):
  mid = Tensor.empty(1024, device="CUDA")
  run_program(add, mid, x, y)
  out = Tensor.empty(1024, device="CUDA")
  run_program(add_n, out, mid, x, n=k)
  return out

rng = np.random.default_rng(0)
for k in (1024, 1024, 1024, 1024, 300, 0, 700):
  xs, ys = rng.random(1024, dtype=np.float32), rng.random(1024, dtype=np.float32)
  got = step(Tensor(xs, device="CUDA"), Tensor(ys, device="CUDA"), n.bind(k)).numpy()  # new input buffers every call
  np.testing.assert_allclose(got[:k], (2 * xs + ys)[:k], rtol=1e-6)
  graphs = [s for s in step.captured.steps if hasattr(s, "rebuilds")] if step.captured is not None else []
  print("n", k, "graphs", [(len(g.nodes), g.rebuilds) for g in graphs])
lib = ctypes.CDLL(sys.argv[1])
lib.standin_log.restype = ctypes.c_char_p
calls = [ln.split()[0] for ln in lib.standin_log().decode().splitlines()]
print("calls", json.dumps({c: calls.count(c) for c in ("cuGraphCreate", "cuGraphLaunch", "cuGraphExecKernelNodeSetParams_v2", "cuGraphExecDestroy")}))
print("device", Device["CUDA"].runtime.describe())
"""


def test_tinyjit_replays_as_a_cuda_graph_through_the_standin(lib, tmp_path: Path):
  res = subprocess.run([sys.executable, "-c", GRAPH_SCRIPT, driver.LIBCUDA, ADD_SRC, FAKE_CUBIN.decode()], capture_output=True, text=True,
                       timeout=300)
  assert res.returncode == 0, res.stdout + res.stderr
  lines = res.stdout.splitlines()
  # captured on the second call, one graph of both kernels; n = 300 patches the second node, n = 0 drops it (a new
  # topology: built again), n = 700 brings it back (again)
  assert lines[2:7] == ["n 1024 graphs [(2, 1)]", "n 1024 graphs [(2, 1)]", "n 300 graphs [(2, 1)]", "n 0 graphs [(1, 2)]",
                        "n 700 graphs [(2, 3)]"], res.stdout
  calls = json.loads(lines[7].removeprefix("calls "))
  assert calls["cuGraphCreate"] == 3 and calls["cuGraphLaunch"] == 5 and calls["cuGraphExecDestroy"] == 2, calls
  assert calls["cuGraphExecKernelNodeSetParams_v2"] >= 4, calls  # new buffers every replay, and n = 300
  assert "device plugrad CUDA stand-in (no GPU) (sm_90)" in res.stdout, res.stdout
