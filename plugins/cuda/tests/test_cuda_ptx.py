"""PTX as a program's source (what Triton compiles ahead of time to): it becomes a cubin through plugrad-cuda's compiler
without NVRTC, and the runtime packs the extra parameters and dynamic shared memory a PTX kernel declares. A real Triton
kernel (examples/triton_matmul.py, with triton installed) is checked from the repository: tests/test_plugin_scripts.py."""
from __future__ import annotations

import ctypes

import pytest

from plugrad import dtypes
from plugrad.backend import CompileError, LaunchError, new_program
from plugrad_cuda import nvrtc, ptx
from plugrad_cuda.compiler import CUDACompiler
from plugrad_cuda.runtime import ptx_abi

from cuda_helpers import ADD1_PTX


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
