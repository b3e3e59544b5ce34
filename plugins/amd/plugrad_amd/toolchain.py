"""The AMDGPU toolchain: clang (>= 17, with the AMDGPU target) and lld, from the system (Debian/Ubuntu:
`apt-get install clang-19 lld-19`; ROCm's own `/opt/rocm/llvm` works too). No ROCm headers or device libraries are
used: kernels are HIP built with `-nogpuinc -nogpulib` (clang's builtins only).

How a kernel becomes an HSA code object, three steps so that each tool's diagnostics name its stage:

1. `clang -x hip --offload-arch=ARCH --cuda-device-only -nogpuinc -nogpulib -O3 -S`: the device code as AMDGPU
   assembly (`.amdhsa_kernel` directives, the kernel descriptor and the metadata note);
2. `clang -x assembler -target amdgcn-amd-amdhsa -mcpu=ARCH -c`: a relocatable ELF object;
3. `ld.lld -shared`: the code object (an ELF shared object that `hipModuleLoadData` loads).

Bring-your-own assembly enters at step 2 (`assemble`). Finding the tools: `AMD_CLANG` (a path or a command name),
else the first of clang-19, clang-18, clang-17, clang on PATH whose version is >= 17 and which has the amdgcn
target; lld next to it (`ld.lld` in clang's own directory, `ld.lld-<major>`, then `ld.lld`), llvm-objdump likewise
(only for disassembly, DEBUG=5).
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from plugrad.backend import CompileError, DeviceUnavailableError

CANDIDATES = ("clang-19", "clang-18", "clang-17", "clang")
MIN_MAJOR = 17
TIMEOUT = 300
# IEEE semantics like the interpreter: no contraction of a*b+c (MULACC is an explicit fma), denormals kept (the
# AMDGPU default for f32 on these archs with -fno-gpu-flush-denormals-to-zero), no fast math
HIP_FLAGS = ("-x", "hip", "--cuda-device-only", "-nogpuinc", "-nogpulib", "-O3", "-ffp-contract=off", "-fno-gpu-flush-denormals-to-zero",
             "-fno-crash-diagnostics", "-std=c++17", "-w")


class ToolchainMissing(DeviceUnavailableError):
  """No usable clang/lld for AMDGPU on this machine (the message says what was tried and how to install one)."""


@dataclass(frozen=True)
class Toolchain:
  clang: str
  lld: str
  objdump: str | None
  version: tuple[int, int, int]
  version_text: str

  @property
  def cache_key(self) -> str: return f"clang-{'.'.join(map(str, self.version))} {' '.join(HIP_FLAGS)}"

  # ---- the three steps
  def run(self, args: list[str], stage: str, cwd: str | None = None) -> subprocess.CompletedProcess[bytes]:
    try: res = subprocess.run(args, capture_output=True, timeout=TIMEOUT, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired) as e: raise CompileError(f"{stage}: running {args[0]} failed: {e}") from None
    if res.returncode != 0:
      log = (res.stderr or res.stdout).decode(errors="replace").strip()
      raise CompileError(f"{stage} ({os.path.basename(args[0])}) exited with status {res.returncode}:\n{log}")
    return res

  def hip_to_asm(self, src: str, arch: str) -> str:
    """HIP source → AMDGPU assembly text for `arch` (diagnostics refer to the source as `kernel.hip:LINE:COL`)."""
    with tempfile.TemporaryDirectory(prefix="plugrad-amd-") as d:
      with open(os.path.join(d, "kernel.hip"), "w") as f: f.write(src)
      # relative paths: the diagnostics say kernel.hip:LINE:COL (the core shows the source around LINE)
      self.run([self.clang, *HIP_FLAGS, f"--offload-arch={arch}", "-S", "--no-gpu-bundle-output", "kernel.hip", "-o", "kernel.s"],
               f"clang (HIP → {arch} assembly)", cwd=d)
      with open(os.path.join(d, "kernel.s")) as f: return f.read()

  def assemble(self, asm: str, arch: str) -> bytes:
    """AMDGPU assembly → a relocatable ELF object."""
    with tempfile.TemporaryDirectory(prefix="plugrad-amd-") as d:
      with open(os.path.join(d, "kernel.s"), "w") as f: f.write(asm)
      self.run([self.clang, "-x", "assembler", "-target", "amdgcn-amd-amdhsa", f"-mcpu={arch}", "-fno-crash-diagnostics", "-c", "kernel.s",
                "-o", "kernel.o"], f"clang (assembler, {arch})", cwd=d)
      with open(os.path.join(d, "kernel.o"), "rb") as f: return f.read()

  def link(self, obj: bytes) -> bytes:
    """A relocatable object → the HSA code object (`ld.lld -shared`)."""
    with tempfile.TemporaryDirectory(prefix="plugrad-amd-") as d:
      with open(os.path.join(d, "kernel.o"), "wb") as f: f.write(obj)
      self.run([self.lld, "-shared", "--no-undefined", "kernel.o", "-o", "kernel.hsaco"], "ld.lld (link)", cwd=d)
      with open(os.path.join(d, "kernel.hsaco"), "rb") as f: return f.read()

  def code_object(self, asm: str, arch: str) -> bytes: return self.link(self.assemble(asm, arch))

  def disassemble(self, binary: bytes, arch: str) -> str:
    if self.objdump is None: raise CompileError(f"no llvm-objdump next to {self.clang} (Debian: apt-get install llvm-{self.version[0]})")
    with tempfile.NamedTemporaryFile(suffix=".hsaco") as f:
      f.write(binary)
      f.flush()
      res = self.run([self.objdump, "-d", f"--mcpu={arch}", "--no-show-raw-insn", f.name], "llvm-objdump")
      return res.stdout.decode(errors="replace")


def _version(clang: str) -> tuple[tuple[int, int, int], str] | None:
  try: res = subprocess.run([clang, "--version"], capture_output=True, text=True, timeout=60)
  except (OSError, subprocess.TimeoutExpired): return None
  first = (res.stdout or "").splitlines()[0] if res.stdout else ""
  if res.returncode != 0 or (m := re.search(r"clang version (\d+)\.(\d+)\.(\d+)", res.stdout)) is None: return None
  return (int(m.group(1)), int(m.group(2)), int(m.group(3))), first


def _has_amdgpu(clang: str) -> bool:
  try: res = subprocess.run([clang, "-print-targets"], capture_output=True, text=True, timeout=60)
  except (OSError, subprocess.TimeoutExpired): return False
  return res.returncode == 0 and re.search(r"^\s*amdgcn\b", res.stdout, re.M) is not None


def _next_to(clang: str, tool: str, major: int) -> str | None:
  """`tool` in clang's own directory (resolving the clang-19 → llvm-19/bin/clang link), else `tool-<major>`, else `tool`
  when its own version is clang's major: an older unversioned LLVM (Debian's llvm-objdump 14 beside clang-19) does not
  know the newer AMDGPU targets and aborts on them."""
  for d in dict.fromkeys((os.path.dirname(os.path.realpath(clang)), os.path.dirname(os.path.abspath(clang)))):
    if os.access(p := os.path.join(d, tool), os.X_OK): return p
  if (versioned := shutil.which(f"{tool}-{major}")) is not None: return versioned
  return plain if (plain := shutil.which(tool)) is not None and _tool_major(plain) == major else None


def _tool_major(tool: str) -> int | None:
  """The major version an LLVM tool prints (`LLVM version 19.1.7`, `LLD 19.1.7`), or None."""
  try: res = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60)
  except (OSError, subprocess.TimeoutExpired): return None
  m = re.search(r"(?:LLVM version|LLD) (\d+)\.", res.stdout)
  return int(m.group(1)) if res.returncode == 0 and m is not None else None


def find(env: dict[str, str] | None = None) -> Toolchain:
  """The toolchain to use; ToolchainMissing (a DeviceUnavailableError) saying what was tried when there is none."""
  env = dict(os.environ) if env is None else env
  return _find(env.get("AMD_CLANG", "").strip(), env.get("PATH", ""))


@functools.cache
def _find(override: str, path: str) -> Toolchain:
  names = (override,) if override else CANDIDATES
  tried = []
  for name in names:
    clang = name if os.sep in name else shutil.which(name, path=path or None)
    if clang is None or not os.access(clang, os.X_OK):
      tried.append(f"{name}: not found")
      continue
    if (v := _version(clang)) is None:
      tried.append(f"{clang}: not a clang (no 'clang version' in --version)")
      continue
    version, text = v
    if version[0] < MIN_MAJOR:
      tried.append(f"{clang}: clang {version[0]} is older than {MIN_MAJOR}")
      continue
    if not _has_amdgpu(clang):
      tried.append(f"{clang}: built without the AMDGPU (amdgcn) target")
      continue
    if (lld := _next_to(clang, "ld.lld", version[0])) is None:
      tried.append(f"{clang}: no ld.lld next to it or on PATH (install lld-{version[0]})")
      continue
    return Toolchain(clang, lld, _next_to(clang, "llvm-objdump", version[0]), version, text)
  where = "AMD_CLANG" if override else "PATH"
  raise ToolchainMissing(f"no clang >= {MIN_MAJOR} with the AMDGPU target and lld found ({where}; tried: {'; '.join(tried)}): "
                         "install them (Debian/Ubuntu: apt-get install clang-19 lld-19) or set AMD_CLANG to a clang")


def missing(env: dict[str, str] | None = None) -> str | None:
  """Why kernels cannot be compiled here (None: they can). Never raises."""
  try: find(env)
  except ToolchainMissing as e: return str(e)
  except Exception as e: return f"the AMDGPU toolchain could not be checked: {type(e).__name__}: {e}"
  return None
