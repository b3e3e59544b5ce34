"""The CUDA compiler: NVRTC (CUDA C → PTX for `compute_XX`) then nvJitLink (PTX → cubin for `sm_XX`), both from
NVIDIA's pip wheels (nvrtc.py). The binary is the cubin: the driver loads it as it is, and any ptxas error has
surfaced here already. `cache_key` names both libraries' versions, the arch and the flags.

A source that is PTX already (`.version` and `.target` lines: a Triton kernel compiled ahead of time, see ptx.py and
examples/triton_matmul.py) skips NVRTC and goes to nvJitLink as it is, for its own arch-specific target (`sm_90a`) or
the device's arch."""
from __future__ import annotations

from plugrad.backend import CompileError, Compiler
from plugrad_cuda import nvrtc, ptx

# IEEE semantics like the CPU and the interpreter: no contraction of a*b+c (MULACC is an explicit fma), precise
# division and square root, no flush to zero (NVRTC's defaults, stated so the key says so); -w: warnings (unused
# values of the generated code) would only bury the errors in the log
FLAGS = ("--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false", "--std=c++17", "-w")


class CUDACompiler(Compiler):
  def __init__(self, arch: str):
    nvrtc.parse_arch(arch)
    self.arch = arch
    libs = nvrtc.libs()
    self.cache_key = (f"cuda nvrtc-{libs.version[0]}.{libs.version[1]} nvjitlink-{libs.jitlink_version[0]}.{libs.jitlink_version[1]} "
                      f"{arch} {' '.join(FLAGS)}")

  def __repr__(self) -> str: return f"<CUDACompiler {self.cache_key}>"

  def compile(self, src: str) -> bytes:
    if ptx.is_ptx(src):
      try: arch = ptx.link_arch(src, self.arch)
      except ValueError as e: raise CompileError(f"PTX program: {e}") from None
      return nvrtc.to_cubin(src, arch)
    return nvrtc.to_cubin(self.to_ptx(src), self.arch)

  def to_ptx(self, src: str) -> str: return src if ptx.is_ptx(src) else nvrtc.to_ptx(src, self.arch, FLAGS)
