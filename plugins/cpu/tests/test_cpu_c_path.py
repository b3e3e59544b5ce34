"""The CPU device's C path (CPU_LLVM=0) when this process compiles through LLVM (the default with llvmlite installed):
the CPU tests run again in a child process with the system C compiler, so both paths are tested by one pytest run."""
import os
import pathlib
import subprocess
import sys

import pytest

from cpu_helpers import cpu_compiles_through_llvm

HERE = pathlib.Path(__file__).resolve().parent


@pytest.mark.skipif(not cpu_compiles_through_llvm(), reason="this process already runs the CPU tests through the C compiler")
def test_cpu_tests_pass_with_the_c_compiler(tmp_path):
  env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
  env.update(CPU_LLVM="0", SPEC="1", PLUGRAD_CACHE_DIR=str(tmp_path))
  # this directory wherever it is (the repository, or a copy beside an installed wheel); run from inside it
  cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:xdist", "-o", "addopts=", str(HERE),
         "--deselect", f"{HERE}/{pathlib.Path(__file__).name}::test_cpu_tests_pass_with_the_c_compiler"]
  res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=HERE)
  summary = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
  assert res.returncode == 0 and " passed" in summary, f"CPU tests under CPU_LLVM=0: {summary}\n{res.stdout[-6000:]}\n{res.stderr[-2000:]}"
  assert "compiles through LLVM" not in res.stdout  # the C-only tests ran (-rs lists every skip with its reason)
