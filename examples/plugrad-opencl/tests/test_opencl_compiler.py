"""Building with the platform's compiler: binaries through the core's compile cache, build logs in CompileError."""
from __future__ import annotations

import pytest

from plugrad import Device
from plugrad.backend import CompileError
from plugrad_opencl.platform import device_info

GOOD = "__kernel void add_one(__global float* a) { a[get_global_id(0)] += 1.0f; }\n"
BAD = "__kernel void broken(__global float* a) {\n  a[get_global_id(0)] = 1.0f + missing_name;\n}\n"


def test_build_errors_carry_the_build_log(opencl: str) -> None:
  with pytest.raises(CompileError) as e: Device[opencl].compiler.compile_cached(BAD, "broken")
  msg = str(e.value)
  assert "kernel 'broken' failed to compile (OpenCLCompiler)" in msg
  assert "missing_name" in msg  # the driver's own diagnostic, from the build log
  assert "> " in msg and "missing_name;" in msg.split("source near line", 1)[-1]  # the core quotes the line the log points at


def test_binaries_come_through_the_compile_cache(opencl: str) -> None:
  compiler = Device[opencl].compiler
  info = device_info(opencl)
  assert info.name in compiler.cache_key and info.driver in compiler.cache_key and info.platform in compiler.cache_key
  lib = compiler.compile_cached(GOOD, "add_one")
  assert isinstance(lib, bytes) and lib and compiler.compile_cached(GOOD, "add_one") == lib
