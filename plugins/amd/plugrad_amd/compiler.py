"""The AMD compiler: the HIP source to an HSA code object for one arch by clang and lld (toolchain.py), through the
core's compile cache. The binary is the code object (`hipModuleLoadData` loads it as it is); `cache_key` names the
clang version, the flags and the arch. `disassemble` is llvm-objdump's (DEBUG=5 prints it when a kernel is loaded).
"""
from __future__ import annotations

from plugrad.backend import Compiler
from plugrad_amd.targets import ARCHS
from plugrad_amd.toolchain import Toolchain, find


class AMDCompiler(Compiler):
  def __init__(self, arch: str, toolchain: Toolchain | None = None):
    if arch not in ARCHS: raise ValueError(f"AMD: unsupported arch {arch!r}; supported: {', '.join(ARCHS)}")
    self.arch = arch
    self.toolchain = toolchain or find()
    self.cache_key = f"amd {self.toolchain.cache_key} {arch}"

  def __repr__(self) -> str: return f"<AMDCompiler {self.arch} {self.toolchain.clang} {'.'.join(map(str, self.toolchain.version))}>"

  def to_asm(self, src: str) -> str:
    """The AMDGPU assembly clang makes of `src` (the kernel descriptor and metadata as `.amdhsa_*` directives)."""
    return self.toolchain.hip_to_asm(src, self.arch)

  def compile(self, src: str) -> bytes: return self.toolchain.code_object(self.to_asm(src), self.arch)
  def disassemble(self, lib: bytes) -> str: return self.toolchain.disassemble(lib, self.arch)
