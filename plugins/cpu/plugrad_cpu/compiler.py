"""The CPU compiler: the system C compiler turns a kernel into a shared object (its bytes are the binary)."""
from __future__ import annotations

import os
import subprocess
import tempfile

from plugrad.backend import CompileError, Compiler
from plugrad_cpu.toolchain import Toolchain


class CPUCompiler(Compiler):
  """`cache_key` names the compiler, its version, the flags and the target they chose. Concurrent: each compile is a
  subprocess of its own."""
  concurrent = True
  def __init__(self, tc: Toolchain):
    self.toolchain, self.cache_key = tc, tc.cache_key

  def __repr__(self) -> str: return f"<CPUCompiler {self.toolchain.cc[0]} ({self.toolchain.version})>"

  def compile(self, src: str) -> bytes:
    try: tmp = tempfile.TemporaryDirectory(prefix="plugrad-cpu-")
    except OSError as e: raise CompileError(f"no temporary directory for {self.toolchain.cc[0]}'s output ({e}); TMPDIR full or read-only?") from None
    with tmp as d:
      out = os.path.join(d, "kernel.so")
      try: res = self.toolchain.run(src, out)
      except (OSError, subprocess.TimeoutExpired) as e: raise CompileError(f"running {self.toolchain.cc[0]} failed: {e}") from None
      if res.returncode != 0:
        raise CompileError(f"{' '.join(self.toolchain.cc)} exited with status {res.returncode}:\n{(res.stderr or res.stdout).strip()}")
      with open(out, "rb") as f: return f.read()

  def disassemble(self, lib: bytes) -> str: return objdump(lib, ".so")


def objdump(lib: bytes, suffix: str) -> str:
  """The disassembly of a shared object or relocatable object, by binutils' objdump."""
  with tempfile.NamedTemporaryFile(suffix=suffix) as f:
    f.write(lib)
    f.flush()
    try: res = subprocess.run(["objdump", "-d", "--no-show-raw-insn", f.name], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e: raise CompileError(f"disassembling needs objdump (binutils): {e}") from None
    if res.returncode != 0: raise CompileError(f"objdump failed: {res.stderr.strip()}")
    return res.stdout
