"""The system C compiler: which one, its flags, and what it supports on this machine (found once per process).

`CC` chooses the compiler (a name on PATH or a path, optionally with arguments); otherwise clang (unversioned, then the
newest of clang-21 .. clang-14: Debian and Ubuntu install only `clang-19`), then gcc, then cc. Clang comes first for
speed: the register tiles' code it makes ran 1.2-1.9x faster than gcc 12's (1x1 convolutions at 7x7 and 14x14).
Finding it (`find_cc`) only searches PATH, so the device's probe stays cheap; running it to learn its version and
features (`toolchain`) happens when the device is first used.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from plugrad.backend import DeviceUnavailableError

NO_COMPILER = "no C compiler found (install clang or gcc, or set CC)"

# -O2 -march=native: the machine's vector units. -fwrapv: signed integers wrap (the IR's semantics). -ffp-contract=off:
# every float op rounds once, like the interpreter (MULACC is rendered as fma). -fno-math-errno: sqrt and friends may
# be inlined (errno is never read). -fno-strict-aliasing: vector loads through re-typed pointers stay correct.
# No -ffast-math: it assumes no nan/inf (breaking MAX's nan propagation and nan checks) and reorders float math.
BASE_FLAGS = ("-O2", "-fPIC", "-shared", "-fwrapv", "-ffp-contract=off", "-fno-math-errno", "-fno-strict-aliasing", "-pipe")


CC_SEARCH = ("clang", *(f"clang-{v}" for v in range(21, 13, -1)), "gcc", "cc")


def find_cc(env: dict[str, str] | None = None) -> list[str] | None:
  """The compiler command (argv prefix), or None when there is none. Never raises."""
  env = dict(os.environ) if env is None else env
  search = env.get("PATH", os.defpath)
  if (cc := env.get("CC", "").strip()):
    try: argv = shlex.split(cc)
    except ValueError: return None
    path = shutil.which(argv[0], path=search) if argv else None
    return [path, *argv[1:]] if path else None
  for name in CC_SEARCH:
    if (path := shutil.which(name, path=search)): return [path]
  return None


def probe() -> str | None:
  """None when a C compiler exists, else why not (the CPU device's probe)."""
  return None if find_cc() is not None else NO_COMPILER


@dataclass(frozen=True)
class Toolchain:
  cc: tuple[str, ...]        # the compiler command
  version: str               # the first line of `cc --version`
  flags: tuple[str, ...]     # every flag passed when compiling a kernel
  macros: frozenset[str]     # the predefined macros with these flags (what -march=native turned on)
  float16: bool              # _Float16 arithmetic and conversions compile and load
  bfloat16: bool             # __bf16 conversions compile and load

  @property
  def avx2(self) -> bool: return "__AVX2__" in self.macros

  @property
  def float_lanes(self) -> int:
    """The float vector width the optimizer uses (AVX-512: 16, AVX2: 8, SSE/NEON: 4). With a packed B panel and an 8x32
    register tile (16 of the 32 zmm registers), 16-wide vectors run a 1024 matmul about 1.7x faster than the 8-wide 4x16
    tile (docs/optimizer.md); without packing they were slower, which is why they were off before."""
    return 16 if "__AVX512F__" in self.macros else 8 if self.avx2 else 4

  @property
  def cache_key(self) -> str:
    """Compiler identity, flags and the target the flags chose (so a cache shared by two machines stays correct)."""
    target = hashlib.sha256("\n".join(sorted(self.macros)).encode()).hexdigest()[:16]
    return f"plugrad-cpu {' '.join(self.cc)} [{self.version}] {' '.join(self.flags)} target={target}"

  def run(self, src: str, out: str, extra: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """Compile C source `src` to the shared object `out`."""
    return subprocess.run([*self.cc, *self.flags, *extra, "-x", "c", "-", "-o", out, "-lm"], input=src, capture_output=True, text=True, timeout=300)


def _build_error(cc: list[str], flags: tuple[str, ...], src: str, load: bool = False) -> str | None:
  """None when `src` builds into a shared object (and, with `load`, that object loads: every symbol resolves), else
  what went wrong in the compiler's own words (its last lines: "No space left on device" from a full TMPDIR is the
  cause, not the flags)."""
  try:
    with tempfile.TemporaryDirectory(prefix="plugrad-cpu-") as d:
      so = os.path.join(d, "t.so")
      res = subprocess.run([*cc, *flags, "-x", "c", "-", "-o", so], input=src, capture_output=True, text=True, timeout=120)
      if res.returncode == 0 and load: ctypes.CDLL(so, mode=os.RTLD_NOW)
  except (OSError, subprocess.TimeoutExpired) as e: return f"{type(e).__name__}: {e}"
  if res.returncode == 0: return None
  lines = [ln.strip() for ln in (res.stderr or res.stdout).strip().splitlines() if ln.strip()]
  return " / ".join(lines[-4:]) or f"exit status {res.returncode}"


def _compiles(cc: list[str], flags: tuple[str, ...], src: str, load: bool = False) -> bool: return _build_error(cc, flags, src, load) is None


_F16 = "_Float16 f(float x, _Float16 y) { return (_Float16)x * y; } float g(_Float16 x) { return (float)x; }\n"
_BF16 = "__bf16 f(float x) { return (__bf16)x; } __bf16 h(double x) { return (__bf16)x; } float g(__bf16 x) { return (float)x; }\n"
_BF16_BITS = "unsigned short pg_bits(float x) { __bf16 b = (__bf16)x; unsigned short u; __builtin_memcpy(&u, &b, 2); return u; }\n"


def _bf16_rounds_exactly(cc: list[str], flags: tuple[str, ...]) -> bool | None:
  """Whether the compiler's float -> __bf16 conversion rounds as the reference does (to nearest even, subnormals kept);
  None where it does not build and load. AVX512-BF16's vcvtneps2bf16 flushes a subnormal to zero (1e-40: 0x0000, the
  emulation gives 0x0001)."""
  if not _compiles(cc, flags, _BF16_BITS, load=True): return None
  with tempfile.TemporaryDirectory(prefix="plugrad-cpu-") as d:
    so = os.path.join(d, "t.so")
    subprocess.run([*cc, *flags, "-x", "c", "-", "-o", so], input=_BF16_BITS, capture_output=True, text=True, timeout=120, check=True)
    fn = ctypes.CDLL(so, mode=os.RTLD_NOW).pg_bits
    fn.argtypes, fn.restype = [ctypes.c_float], ctypes.c_ushort
    return bool(fn(1e-40) == 0x0001 and fn(3.0) == 0x4040)


def _bf16_exact(cc: list[str], flags: tuple[str, ...]) -> bool:
  """Native __bf16 for the C path: its conversions build and load, and round as the codegen's emulation does."""
  return _compiles(cc, flags, _BF16, load=True) and _bf16_rounds_exactly(cc, flags) is True


@functools.cache
def _detect(cc: tuple[str, ...], march: str = "native") -> Toolchain:
  try: ver = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=60)
  except OSError as e: raise DeviceUnavailableError(f"{NO_COMPILER}: running {cc[0]} failed: {e}") from None
  if ver.returncode != 0: raise DeviceUnavailableError(f"{NO_COMPILER}: `{cc[0]} --version` failed: {ver.stderr.strip()[:300]}")
  flags: tuple[str, ...] = BASE_FLAGS + (f"-march={march}",)
  # a compiler/target without -march=native builds for its default; another CPU named explicitly must be known
  if march == "native" and not _compiles(list(cc), flags, "int f(void) { return 0; }\n"): flags = BASE_FLAGS
  if (why := _build_error(list(cc), flags, "int f(void) { return 0; }\n")) is not None:
    raise DeviceUnavailableError(f"{cc[0]} cannot build a shared object with {' '.join(flags)}: {why}")
  dm = subprocess.run([*cc, *[f for f in flags if f.startswith(("-m", "-O"))], "-dM", "-E", "-x", "c", "-"], input="", capture_output=True,
                      text=True, timeout=60)
  macros = frozenset(line.split()[1] for line in dm.stdout.splitlines() if line.startswith("#define "))
  return Toolchain(cc, ver.stdout.strip().splitlines()[0] if ver.stdout.strip() else "unknown", flags, macros,
                   # loaded too: clang 19 compiles __bf16 conversions into calls of compiler-rt's __truncsfbf2 (and,
                   # with AVX512-BF16, double's into __truncdfbf2), which gcc 12's libgcc cannot resolve
                   _compiles(list(cc), flags, _F16, load=True), _bf16_exact(list(cc), flags))


def toolchain() -> Toolchain:
  """The compiler found now (CC is read on every call; the probing runs once per compiler). Raises
  DeviceUnavailableError when there is none."""
  cc = find_cc()
  if cc is None: raise DeviceUnavailableError(NO_COMPILER)
  return _detect(tuple(cc))


def toolchain_for(march: str) -> Toolchain:
  """The compiler found now, building for the x86 CPU `march` (a -march name: "sapphirerapids", "znver4") instead of
  this machine: the compile tier's shared objects, which are never loaded here. DeviceUnavailableError when there is
  no compiler or it does not know `march`."""
  if not isinstance(march, str) or not march or march.startswith("-") or any(c.isspace() for c in march):
    raise ValueError(f"march must be a CPU name such as 'sapphirerapids', got {march!r}")
  cc = find_cc()
  if cc is None: raise DeviceUnavailableError(NO_COMPILER)
  return _detect(tuple(cc), march)
