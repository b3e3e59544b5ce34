"""The Metal compiler on macOS: MSL → metallib with `xcrun metal` + `xcrun metallib` when the Xcode command-line
tools have the Metal toolchain, else a check with `MTLDevice.newLibraryWithSource:options:error:` (the Metal framework
compiles the source; the binary is then the source, compiled again by the runtime when it loads it).

Either way fast math is off (`-fno-fast-math`, `MTLCompileOptions.fastMathEnabled = NO`) and the language version is
METAL_LANGUAGE's. Errors are `CompileError`s with the Metal compiler's messages. Off macOS the compile tier is the
approximate syntax check of syntax.py instead.

The binary is either a metallib (its bytes start with `MTLB`) or MSL source text (`is_metallib` tells them apart);
the runtime loads both.

UNVERIFIED: no Mac is available to this project; this is written against the documented `xcrun metal` options and
the Metal API through pyobjc, and has never run.
"""
from __future__ import annotations

import os
import platform
import shutil
import subprocess
import tempfile
from typing import Any

from plugrad.backend import CompileError, Compiler

METALLIB_MAGIC = b"MTLB"


def is_metallib(binary: bytes) -> bool: return binary[:4] == METALLIB_MAGIC


def xcrun_metal() -> str | None:
  """`xcrun`, when it finds the Metal compiler (`xcrun -sdk macosx -f metal`), else None."""
  if (xcrun := shutil.which("xcrun")) is None: return None
  try: ok = subprocess.run([xcrun, "-sdk", "macosx", "-f", "metal"], capture_output=True, timeout=60).returncode == 0
  except (OSError, subprocess.SubprocessError): return None
  return xcrun if ok else None


def compile_options(language: str) -> Any:
  """MTLCompileOptions: the language version and fast math off."""
  from plugrad_metal.context import metal
  m = metal()
  opts = m.MTLCompileOptions.new()
  major, minor = (int(x) for x in language.split("."))
  opts.setLanguageVersion_((major << 16) + minor)  # MTLLanguageVersion3_1 == (3 << 16) + 1
  opts.setFastMathEnabled_(False)
  return opts


def library_from_source(device: Any, src: str, language: str) -> Any:
  lib, err = device.newLibraryWithSource_options_error_(src, compile_options(language), None)
  if lib is None: raise CompileError(f"METAL newLibraryWithSource failed:\n{err.localizedDescription() if err is not None else 'unknown error'}")
  return lib


class MetalCompiler(Compiler):
  def __init__(self, language: str):
    self.language = language
    self.xcrun = xcrun_metal()
    tool = "xcrun-metal" if self.xcrun else "newLibraryWithSource"
    self.cache_key = f"metal {tool} macOS-{platform.mac_ver()[0]} -std=metal{language} -fno-fast-math"

  def __repr__(self) -> str: return f"<MetalCompiler {self.cache_key}>"

  def compile(self, src: str) -> bytes:
    if self.xcrun is None:
      from plugrad_metal.context import context
      library_from_source(context(0).device, src, self.language)  # errors surface here, not at the first launch
      return src.encode()
    with tempfile.TemporaryDirectory(prefix="plugrad-metal-") as d:
      msl, air, lib = (os.path.join(d, f) for f in ("kernel.metal", "kernel.air", "kernel.metallib"))
      with open(msl, "w") as f: f.write(src)
      for cmd in ([self.xcrun, "-sdk", "macosx", "metal", "-x", "metal", f"-std=metal{self.language}", "-fno-fast-math", "-c", msl, "-o", air],
                  [self.xcrun, "-sdk", "macosx", "metallib", air, "-o", lib]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if proc.returncode != 0: raise CompileError(f"METAL {cmd[3]} failed:\n{proc.stderr.strip()}")
      with open(lib, "rb") as out: return out.read()
