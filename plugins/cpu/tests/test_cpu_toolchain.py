"""The compiler: finding it, compile errors, the no-compiler path, and the on-disk compile cache across processes."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from plugrad.errors import CompileError, DeviceUnavailableError

from cpu_helpers import C_ONLY


def test_find_cc_honours_CC_and_falls_back(tmp_path):
  from plugrad_cpu.toolchain import NO_COMPILER, find_cc, probe
  assert find_cc({"CC": "/nonexistent"}) is None and find_cc({"CC": "'unterminated"}) is None
  assert find_cc({"CC": "", "PATH": str(tmp_path)}) is None  # nothing on PATH
  real = find_cc({})
  assert real is not None and os.path.isabs(real[0])
  assert find_cc({"CC": f"{real[0]} -m64"}) == [real[0], "-m64"]
  assert probe() is None and NO_COMPILER == "no C compiler found (install clang or gcc, or set CC)"


def test_find_cc_prefers_clang_versioned_or_not(tmp_path):
  """Clang before gcc, a versioned clang-NN (all Debian installs) too, the newest first; gcc when there is no clang."""
  from plugrad_cpu.toolchain import find_cc
  def tool(name: str) -> str:
    (p := tmp_path / name).write_text("#!/bin/sh\n")
    p.chmod(0o755)
    return str(p)
  env = {"CC": "", "PATH": str(tmp_path)}
  gcc = tool("gcc")
  assert find_cc(env) == [gcc]
  tool("clang-17")
  clang19 = tool("clang-19")
  assert find_cc(env) == [clang19]
  clang = tool("clang")
  assert find_cc(env) == [clang]


@C_ONLY
def test_toolchain_identity(cpu):
  from plugrad_cpu.toolchain import toolchain
  tc = toolchain()
  key = cpu.compiler.cache_key
  assert tc.cc[0] in key and tc.version in key and "-O2" in key and "-fwrapv" in key and "target=" in key
  assert "-ffast-math" not in tc.flags  # it would break nan/inf (see README)
  assert cpu.renderer.vector_width == (16 if "__AVX512F__" in tc.macros else 8 if tc.avx2 else 4) and cpu.renderer.native_float16 == tc.float16


@C_ONLY
def test_compile_error_names_the_kernel_and_shows_the_compiler_output(cpu):
  src = "void broken_kernel(float* data0, int core_id, int core_count) {\n  data0[0] = undefined_thing;\n}\n"
  with pytest.raises(CompileError) as e: cpu.compiler.compile_cached(src, "broken_kernel")
  msg = str(e.value)
  assert "kernel 'broken_kernel' failed to compile (CPUCompiler)" in msg
  assert "undefined_thing" in msg and "error" in msg and "<stdin>:2:" in msg  # the compiler's own message, with the line
  assert "> " in msg and "data0[0] = undefined_thing;" in msg               # the core adds the source near the line


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
  full = {k: v for k, v in os.environ.items() if k not in ("DEV", "CC")}
  full.update(env)
  return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full, timeout=300)


def test_without_a_compiler_the_device_says_why(tmp_path):
  no_cc = {**{k: v for k, v in os.environ.items() if k != "CC"}, "PATH": str(tmp_path)}  # no compiler on PATH (a bad CC is a SettingsError)
  res = _python("""
    from plugrad_cpu.plugin import probe
    from plugrad.device.registry import Device
    print(repr(probe()))
    print(Device.available())
    try: Device.DEFAULT
    except Exception as e: print(type(e).__name__, e)
  """, PATH=str(tmp_path), DEV="CPU")
  out = res.stdout.splitlines()
  assert res.returncode == 0, res.stderr
  assert out[0] == "'no C compiler found (install clang or gcc, or set CC)'" and "CPU" not in out[1]
  assert out[2].startswith("DeviceUnavailableError") and "no C compiler found (install clang or gcc, or set CC)" in out[2]
  cli = subprocess.run([sys.executable, "-m", "plugrad", "devices", "--json", "CPU"], capture_output=True, text=True, timeout=300,
                       env=no_cc)
  dev = json.loads(cli.stdout)["devices"][0]
  assert cli.returncode == 1 and dev["smoke"] == "UNAVAILABLE" and dev["probe"] == "no C compiler found (install clang or gcc, or set CC)"
  table = subprocess.run([sys.executable, "-m", "plugrad", "devices"], capture_output=True, text=True, timeout=300,
                         env=no_cc)
  assert any(line.startswith("CPU") and "UNAVAILABLE" in line and "no C compiler found" in line for line in table.stdout.splitlines()), table.stdout


def test_toolchain_raises_typed_error_without_compiler(monkeypatch):
  from plugrad_cpu.toolchain import toolchain
  monkeypatch.setenv("CC", "/nonexistent")
  with pytest.raises(DeviceUnavailableError, match="no C compiler found"): toolchain()


CACHE_CHILD = """
  import sys
  from plugrad.device.registry import Device
  from plugrad_cpu.compiler import CPUCompiler
  from plugrad.device.smoke import smoke_program
  dev = Device["CPU"]
  src = dev.renderer.render(smoke_program("CPU"))
  calls = []
  real = CPUCompiler.compile
  CPUCompiler.compile = lambda self, s: calls.append(1) or real(self, s)
  lib = dev.compiler.compile_cached(src, "smoke_add1")
  print(len(calls), len(lib))
"""


@C_ONLY
def test_compile_cache_hits_in_a_second_process(tmp_path):
  first = _python(CACHE_CHILD, PLUGRAD_CACHE_DIR=str(tmp_path))
  second = _python(CACHE_CHILD, PLUGRAD_CACHE_DIR=str(tmp_path))
  assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
  (n1, size1), (n2, size2) = first.stdout.split(), second.stdout.split()
  assert (n1, n2) == ("1", "0") and size1 == size2 and int(size1) > 0  # compiled once, then read from the cache


def test_native_bfloat16_only_where_it_rounds_as_the_reference():
  # AVX512-BF16's vcvtneps2bf16 flushes subnormals: there __bf16 stays emulated, so the C path computes what PYTHON does
  import plugrad_cpu.toolchain as tc
  from plugrad_cpu.tensor_cores import cpu_features
  try: t = tc.toolchain()
  except DeviceUnavailableError as e: pytest.skip(str(e))
  if (exact := tc._bf16_rounds_exactly(list(t.cc), t.flags)) is None: pytest.skip("this compiler's __bf16 conversions do not link here")
  flushes = "avx512_bf16" in cpu_features() and "__AVX512BF16__" in t.macros
  assert exact is not flushes
  if flushes: assert not t.bfloat16
