"""What the CPU tests share: which compiler this process's CPU device uses."""
from __future__ import annotations

import pytest


def cpu_compiles_through_llvm() -> bool:
  try:
    from plugrad_cpu.plugin import llvm_mode
    return llvm_mode()
  except (ImportError, ValueError): return False


# tests of the C renderer's text or the C compiler itself: skipped where the device compiles through LLVM (the default
# with llvmlite installed); test_cpu_c_path.py reruns this directory with CPU_LLVM=0, and test_cpu_llvm.py covers LLVM
C_ONLY = pytest.mark.skipif(cpu_compiles_through_llvm(),
                            reason="checks the C renderer/compiler; the CPU device compiles through LLVM here (test_cpu_c_path.py runs it)")
