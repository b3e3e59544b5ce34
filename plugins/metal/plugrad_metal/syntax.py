"""The compile tier off macOS: an APPROXIMATE syntax check, "syntax-checked, not Metal-compiled".

There is no Metal compiler outside Apple's platforms, so `SyntaxCheckCompiler.compile(src)`:

1. lints what clang cannot see in MSL terms (`lint`): every `[[buffer(n)]]` index is used once and they are 0..n-1
   (the binding ABI of renderer.py), every C-style pointer cast names its address space (`device`, `threadgroup`,
   `thread`, `constant`: clang would change address spaces silently where Metal refuses), no `long long` and no `ll`
   literal (Metal has neither);
2. compiles the MSL as C++17 with clang, syntax only, against the shim header `include/metal_stdlib` (which says
   exactly what it declares and how it maps Metal's address spaces and attributes):
   `clang++ -x c++ -std=c++17 -fsyntax-only -nostdinc -nostdinc++ -I plugrad_metal/include -D__METAL_VERSION__=310
   -Werror=unknown-attributes kernel.metal`;
3. returns the checked source, UTF-8 encoded, as the "binary" (nothing is generated: the bytes are the MSL that
   passed), so the compiler cache and the compile tier work as for any device.

What it catches: C++ syntax errors, undeclared names and Metal builtins the shim does not declare, type errors and
ambiguous overloads among the declared ones, wrong argument counts, `double`, vector types or packed types that Metal
lacks (`packed_bool4`, `bfloat` before MSL 3.1), unknown attributes, device/constant pointers used as another address
space, duplicate or missing buffer indices, pointer casts without an address space, `long long`.

What it does not catch (only Apple's compiler does): anything about Metal's real headers (overload sets, implicit
conversions and operators that differ from clang's ext_vector types, e.g. a comparison of vectors is an int vector
here and a bool vector in Metal), threadgroup vs thread address-space mistakes, which builtins exist in which MSL
version beyond `bfloat`, restrictions on kernel signatures and argument types, resource limits (31 buffers, 32 KiB of
threadgroup memory, registers), code generation and backend errors, and of course the numbers a kernel computes.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from plugrad.backend import CompileError, Compiler

LABEL = "syntax-checked, not Metal-compiled"
INCLUDE = Path(__file__).resolve().parent / "include"
SHIM = INCLUDE / "metal_stdlib"
CANDIDATES = ("clang++-19", "clang++-20", "clang++-18", "clang++-17", "clang++", "clang-19", "clang-20", "clang-18", "clang-17", "clang")
SPACES = ("device", "threadgroup", "thread", "constant")
FLAGS = ("-x", "c++", "-std=c++17", "-fsyntax-only", "-nostdinc", "-nostdinc++", "-Werror=unknown-attributes", "-ferror-limit=20",
         "-fno-color-diagnostics")
_CAST = re.compile(r"\(\(?\s*((?:const\s+)?[A-Za-z_][\w\s]*?)\s*\*\s*\)")  # `(T*)`, `(const device T*)`: a pointer cast
_BUFFER = re.compile(r"\[\[\s*buffer\s*\(\s*(\d+)\s*\)\s*\]\]")


def find_clang() -> str | None:
  """The clang to check with: METAL_SYNTAX_CLANG if set, else the first of CANDIDATES on PATH."""
  if (env := os.environ.get("METAL_SYNTAX_CLANG", "").strip()): return shutil.which(env) or env
  return next((p for c in CANDIDATES if (p := shutil.which(c))), None)


@functools.lru_cache(maxsize=8)
def clang_version(path: str) -> str:
  try: out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
  except (OSError, subprocess.SubprocessError) as e: raise CompileError(f"METAL syntax check: {path} --version failed: {e}") from None
  m = re.search(r"clang version (\d+\.\d+\.\d+)", out)
  if not m: raise CompileError(f"METAL syntax check: {path} is not clang (--version says {out.strip()[:120]!r})")
  return m.group(1)


def lint(src: str) -> list[str]:
  """What the MSL source breaks of the rules clang's C++ cannot check (see the module doc); empty when nothing."""
  problems = []
  idx = [int(m.group(1)) for m in _BUFFER.finditer(src)]
  if sorted(idx) != list(range(len(idx))): problems.append(f"buffer indices {idx} are not 0..{len(idx) - 1}, each once (the METAL binding ABI)")
  for lineno, line in enumerate(src.splitlines(), 1):
    for m in _CAST.finditer(line):
      words = m.group(1).split()
      if words and words[0] not in ("static_cast", "return") and not any(w in SPACES for w in words):
        problems.append(f"kernel.metal:{lineno}: the pointer cast ({m.group(1)}*) names no address space (device, threadgroup, thread, constant)")
    if re.search(r"\blong\s+long\b", line) or re.search(r"\b\d+[uU]?ll\b", line, re.IGNORECASE):
      problems.append(f"kernel.metal:{lineno}: `long long` / `ll` literals do not exist in Metal (long is 64 bits)")
  return problems


class SyntaxCheckCompiler(Compiler):
  """The approximate compile tier (module doc). `language`: the MSL version checked for ("3.0", "3.1", "3.2")."""
  syntax_only = True  # the binary is the checked source, not a metallib

  def __init__(self, language: str = "3.1", clang: str | None = None):
    self.language = language
    self.metal_version = int(language.replace(".", "")) * 10
    self.clang = clang or find_clang()
    shim = hashlib.sha256(SHIM.read_bytes()).hexdigest()[:12]
    self.version: str | None = None
    self.problem = "no clang found for the approximate syntax check: install clang (apt-get install clang-19) or set METAL_SYNTAX_CLANG"
    if self.clang is not None:
      try: self.version = clang_version(self.clang)
      except CompileError as e: self.problem = str(e)
    self.cache_key = f"metal {LABEL}: clang-{self.version or 'missing'} shim-{shim} MSL {language} {' '.join(FLAGS)}"

  def __repr__(self) -> str: return f"<SyntaxCheckCompiler MSL {self.language}, {LABEL}: {self.clang}>"

  def command(self, path: str) -> list[str]:
    if self.clang is None or self.version is None: raise CompileError(f"METAL ({LABEL}): {self.problem}")
    return [self.clang, *FLAGS, "-I", str(INCLUDE), f"-D__METAL_VERSION__={self.metal_version}", path]

  def compile(self, src: str) -> bytes:
    if (problems := lint(src)): raise CompileError(f"METAL ({LABEL}): the MSL breaks Metal rules:\n" + "\n".join(problems))
    with tempfile.TemporaryDirectory(prefix="plugrad-metal-") as d:
      path = os.path.join(d, "kernel.metal")
      with open(path, "w") as f: f.write(src)
      try: proc = subprocess.run(self.command(path), capture_output=True, text=True, timeout=120, cwd=d)
      except (OSError, subprocess.SubprocessError) as e: raise CompileError(f"METAL ({LABEL}): running {self.clang} failed: {e}") from None
    if proc.returncode != 0:
      log = proc.stderr.replace(path, "kernel.metal").replace(str(SHIM), "metal_stdlib(shim)")
      first = re.search(r"kernel\.metal:(\d+):(\d+):", log)
      # the core shows the source near the first line a message names: make that the kernel's line, not the shim's
      lead = f"kernel.metal:{first.group(1)}:{first.group(2)}: first error in the kernel\n" if first else ""
      raise CompileError(f"METAL ({LABEL}): clang {self.version} rejected the MSL against the shim header:\n{lead}{log.strip()}")
    return src.encode()
