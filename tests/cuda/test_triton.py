"""PTX as a program's source: a Triton matmul compiled ahead of time for sm_90 (examples/triton_matmul.py) becomes a
cubin through plugrad-cuda's compiler without NVRTC, and the runtime packs Triton's extra parameters and dynamic shared
memory. Triton is an optional extra (not installed by .ci/run): the Triton tests skip without it, the PTX ones do not."""
from __future__ import annotations

import ctypes
import importlib.util
import pathlib
import sys

import pytest

from plugrad import dtypes
from plugrad.backend import CompileError, LaunchError, new_program
from plugrad_cuda import nvrtc, ptx
from plugrad_cuda.compiler import CUDACompiler
from plugrad_cuda.runtime import ptx_abi

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
HAS_TRITON = importlib.util.find_spec("triton") is not None
needs_triton = pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed (an optional extra: pip install triton)")

# a hand-written PTX kernel: out[tid] = in[tid] + 1 for one block, with one trailing parameter plugrad does not pass
ADD1_PTX = """// plugrad.shared_bytes = 1024
.version 8.0
.target sm_80
.address_size 64
.visible .entry add1(
	.param .u64 .ptr .global .align 1 add1_param_0,
	.param .u64 add1_param_1,
	.param .u32 add1_param_2,
	.param .u64 .ptr .global .align 1 add1_param_3
)
{
	.reg .b32 %r<3>;
	.reg .f32 %f<3>;
	.reg .b64 %rd<6>;
	ld.param.u64 %rd1, [add1_param_0];
	ld.param.u64 %rd2, [add1_param_1];
	mov.u32 %r1, %tid.x;
	mul.wide.u32 %rd3, %r1, 4;
	add.s64 %rd4, %rd2, %rd3;
	ld.global.f32 %f1, [%rd4];
	add.f32 %f2, %f1, 0f3F800000;
	add.s64 %rd5, %rd1, %rd3;
	st.global.f32 [%rd5], %f2;
	ret;
}
"""


def _example():
  sys.path.insert(0, str(EXAMPLES))
  try:
    import triton_matmul
    return triton_matmul
  finally: sys.path.remove(str(EXAMPLES))


def test_ptx_is_recognized_and_parsed():
  assert ptx.is_ptx(ADD1_PTX) and not ptx.is_ptx('extern "C" __global__ void k(float* a) { a[0] = 1; }\n')
  assert ptx.target(ADD1_PTX) == "sm_80" and ptx.shared_bytes(ADD1_PTX) == 1024 and ptx.shared_bytes(".version 8.0\n.target sm_80\n") == 0
  assert ptx.entry_params(ADD1_PTX, "add1") == [("u", 64, 0), ("u", 64, 0), ("u", 32, 0), ("u", 64, 0)]
  assert ptx.entry_params(ADD1_PTX, "nope") is None
  assert ptx.link_arch(ADD1_PTX, "sm_90") == "sm_90"  # generic PTX is compiled forward for the device
  arch_specific = ADD1_PTX.replace(".target sm_80", ".target sm_90a")
  assert ptx.link_arch(arch_specific, "sm_90") == "sm_90a"
  with pytest.raises(ValueError, match="only runs on compute capability 9.0"): ptx.link_arch(arch_specific, "sm_80")
  with pytest.raises(ValueError, match="newer than"): ptx.link_arch(ADD1_PTX.replace("sm_80", "sm_90"), "sm_80")


def test_ptx_source_skips_nvrtc(monkeypatch):
  def no_nvrtc(*a, **k): raise AssertionError("NVRTC must not see PTX")
  monkeypatch.setattr(nvrtc, "to_ptx", no_nvrtc)
  comp = CUDACompiler("sm_90")
  cubin = comp.compile(ADD1_PTX)
  assert cubin[:4] == b"\x7fELF" and comp.to_ptx(ADD1_PTX) is ADD1_PTX
  with pytest.raises(CompileError, match="PTX program: the PTX targets sm_90a"):
    CUDACompiler("sm_80").compile(ADD1_PTX.replace(".target sm_80", ".target sm_90a"))
  with pytest.raises(CompileError, match="nvJitLink"): comp.compile(ADD1_PTX.replace("add.f32", "bogus.f32"))


def test_ptx_program_abi_extra_params_and_shared_memory():
  f32 = dtypes.float32
  p = new_program("add1", "CUDA", source=ADD1_PTX, buffers=[(f32, "out"), (f32, "in")], global_size=(1,), local_size=(32,),
                  vars=[("n", 0, 1 << 20)])
  extra, shared = ptx_abi(p, "add1", 3)  # two buffers and a variable: the fourth parameter gets a zero
  assert len(extra) == 1 and ctypes.sizeof(extra[0]) == 8 and extra[0].value == 0 and shared == 1024
  with pytest.raises(LaunchError, match="takes 4 parameters, plugrad passes 5"): ptx_abi(p, "add1", 5)
  with pytest.raises(LaunchError, match="no `.entry other"): ptx_abi(p, "other", 3)
  c = new_program("k", "CUDA", source='extern "C" __global__ void k(float* a) { a[0] = 1; }\n', buffers=[(f32, "out")], global_size=(1,))
  assert ptx_abi(c, "k", 1) == ([], 0)  # CUDA C: plugrad's ABI as it is


@needs_triton
def test_triton_matmul_ptx_compiles_to_a_cubin_for_sm_90(tmp_path, monkeypatch):
  monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
  tm = _example()
  src, meta = tm.compile_ptx(256, 256, 256, arch=90, block=(64, 64, 32), num_warps=4, num_stages=2)
  assert ptx.is_ptx(src) and ptx.target(src) == "sm_90a" and "wgmma" in src, "Hopper PTX with warpgroup MMA"
  assert meta["threads"] == 128 and meta["grid"] == (4, 4, 1) and ptx.shared_bytes(src) == meta["shared"] > 0
  cubin = CUDACompiler("sm_90").compile(src)
  assert cubin[:4] == b"\x7fELF"
  prog = tm.make_program(src, meta)
  assert prog.signature == ((dtypes.float16, "out"), (dtypes.float16, "in"), (dtypes.float16, "in"))
  assert prog.launch_dims({}) == ((4, 4, 1), (128, 1, 1))
  extra, shared = ptx_abi(prog, meta["name"], 3)
  assert len(extra) == 2 and all(v.value == 0 for v in extra) and shared == meta["shared"]  # Triton's scratch pointers: null


@needs_triton
def test_triton_example_without_a_gpu(capsys, monkeypatch, tmp_path):
  tm = _example()
  if tm.gpu_reason() is None: pytest.skip("this machine has a GPU: the example runs the kernel (bench/gpu/cuda_check.sh)")
  monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
  assert tm.main(["--size", "256"]) == 0
  out = capsys.readouterr().out
  assert "PTX for sm_90a" in out and "no GPU here" in out and "cubin for sm_90a" in out
