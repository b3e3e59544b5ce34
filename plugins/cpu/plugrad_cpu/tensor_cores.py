"""The CPU's tensor cores (issue 39): which of the x86 matrix instructions a kernel may use, chosen from what the CPU and
the compiler have, and what a kernel that uses AMX needs from Linux before it runs.

| path | CPU flags (/proc/cpuinfo) | instructions (`plugrad.backend` descriptions) |
|---|---|---|
| AMX | amx_tile + amx_bf16 / amx_int8 | `tdpbf16ps` (bf16 x bf16 -> fp32, 16x16x32 tiles), `tdpbssd` (s8 x s8 -> s32, 16x16x64) |
| AVX512-BF16/VNNI | avx512f + avx512_bf16 / avx512_vnni | `vdpbf16ps` (bf16 pairs -> 16 fp32 lanes), `vpdpbusd` (u8 x s8 quads -> 16 s32 lanes) |

A CPU with AMX gets both rows (AMX first in the TC action's numbering; the optimizer's default takes only the
register-sized AVX-512 forms, AMX needs an explicit action: docs/optimizer.md). Each instruction is
declared only when the CPU has its flags *and* the compiler that builds the kernels targets them (the C compiler's
predefined macros with -march=native, or LLVM's host features). `CPU_TC=0` declares none; with none declared the
renderers are exactly what they were before (no kernel changes). `DEBUG>=1` prints one line naming the path, or why
there is none. The compile tier builds for another CPU by naming it (`target_renderer("sapphirerapids")`).

AMX state is off for a Linux process until it asks: `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)` (syscall 158,
0x1023, 18; Linux 5.16+). The runtime asks once, when it loads the first kernel whose source carries `AMX_MARK`.
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading

from plugrad.backend import (
  CPU_AMX_TENSOR_CORES,
  DEBUG,
  LaunchError,
  Ops,
  PatternMatcher,
  SettingsError,
  TensorCore,
  UOp,
  UPat,
)

# a kernel with AMX instructions says so in its source (the runtime requests the AMX state before loading it)
AMX_MARK = "plugrad-cpu: uses AMX tiles"
# the CPU flags (Linux's names) each instruction needs
NEEDS: dict[str, frozenset[str]] = {
  "tdpbf16ps": frozenset({"amx_tile", "amx_bf16"}), "tdpbssd": frozenset({"amx_tile", "amx_int8"}),
  "vdpbf16ps": frozenset({"avx512f", "avx512_bf16"}), "vpdpbusd": frozenset({"avx512f", "avx512_vnni"}),
}
ISA = frozenset().union(*NEEDS.values())
# the same features as the C compiler's predefined macros and as LLVM's feature names
_MACROS = {"amx_tile": "__AMX_TILE__", "amx_bf16": "__AMX_BF16__", "amx_int8": "__AMX_INT8__", "avx512f": "__AVX512F__",
           "avx512_bf16": "__AVX512BF16__", "avx512_vnni": "__AVX512VNNI__"}
_LLVM = {"amx_tile": "amx-tile", "amx_bf16": "amx-bf16", "amx_int8": "amx-int8", "avx512f": "avx512f", "avx512_bf16": "avx512bf16",
         "avx512_vnni": "avx512vnni"}


@functools.cache
def cpu_features(path: str = "/proc/cpuinfo") -> frozenset[str]:
  """The CPU's feature flags as Linux names them (`flags` of the first processor in /proc/cpuinfo); empty where the
  file is missing (not Linux) or has no flags line."""
  try:
    with open(path) as f:
      for line in f:
        key, _, val = line.partition(":")
        if key.strip() == "flags": return frozenset(val.split())
  except OSError: pass
  return frozenset()


def from_macros(macros: frozenset[str]) -> frozenset[str]:
  """The features of ISA a C compiler targets, from its predefined macros (`Toolchain.macros`)."""
  return frozenset(f for f, m in _MACROS.items() if m in macros)


def from_llvm(features: str) -> frozenset[str]:
  """The features of ISA an LLVM target has, from its feature string ("+avx512f,-amx-tile,...")."""
  on = {x[1:] for x in features.split(",") if x.startswith("+")}
  return frozenset(f for f, name in _LLVM.items() if name in on)


def enabled(env: dict[str, str] | None = None) -> bool:
  """CPU_TC: 1 (default) lets the CPU renderers use the tensor cores the CPU has, 0 turns them off."""
  raw = (os.environ if env is None else env).get("CPU_TC", "").strip()
  if raw not in ("", "0", "1"):
    raise SettingsError(f"CPU_TC must be 0 or 1 (1: use the CPU's AMX / AVX-512 BF16 / VNNI instructions where it has them), got {raw!r}")
  return raw != "0"


def choose(cpu: frozenset[str], compiler: frozenset[str], env: dict[str, str] | None = None) -> tuple[tuple[TensorCore, ...], str]:
  """(the tensor cores a renderer declares, a line saying which path and why) for a CPU with flags `cpu` whose kernels
  are built by a compiler targeting `compiler` (features of ISA). `CPU_TC=0`: none."""
  if not enabled(env): return (), "CPU tensor cores: none (CPU_TC=0)"
  tcs = tuple(tc for tc in CPU_AMX_TENSOR_CORES if NEEDS[tc.name] <= cpu & compiler)
  if not tcs:
    has = any(NEEDS[tc.name] <= cpu for tc in CPU_AMX_TENSOR_CORES)
    why = f"the compiler does not target {', '.join(sorted((ISA & cpu) - compiler))}" if has else f"this CPU lacks {', '.join(sorted(ISA - cpu))}"
    return (), f"CPU tensor cores: none ({why})"
  amx = [tc.name for tc in tcs if NEEDS[tc.name] & {"amx_tile"}]
  avx = [tc.name for tc in tcs if tc.name not in amx]
  parts = ([f"AMX ({', '.join(amx)}; explicit TC actions only)"] if amx else []) + ([f"AVX512-BF16/VNNI ({', '.join(avx)})"] if avx else [])
  return tcs, f"CPU tensor cores: {' + '.join(parts)}"


_said: set[str] = set()


def host_tensor_cores(cpu: frozenset[str], compiler: frozenset[str]) -> tuple[TensorCore, ...]:
  """`choose` for the host's renderers; at DEBUG>=1 its line is printed (once per process and line)."""
  tcs, line = choose(cpu, compiler)
  if DEBUG >= 1 and line not in _said:
    _said.add(line)
    print(line)
  return tcs


def emulate_target(tcs: tuple[TensorCore, ...]) -> str | None:
  """The PYTHON interpreter's target that describes a CPU with these tensor cores (the emulate tier), or None."""
  if not tcs: return None
  return "CPU_AMX" if any(NEEDS[tc.name] & {"amx_tile"} for tc in tcs) else "CPU_AVX512"


def uses_amx(tcs: tuple[TensorCore, ...]) -> bool: return any("amx_tile" in NEEDS[tc.name] for tc in tcs)


# ---- the accumulation into the instruction: acc + WMMA(a, b, 0) -> WMMA(a, b, acc)

def _zero(u: UOp) -> bool:
  if u.op is Ops.CONST: return u.arg == 0
  if u.op is Ops.VCONST: return all(x == 0 for x in u.arg)
  return u.op is Ops.VECTORIZE and all(_zero(s) for s in u.src)


def _into_wmma(x: UOp, w: UOp, acc: UOp) -> UOp | None:
  # the TC action accumulates each instruction's product into the reduction's register; the x86 instructions add into
  # their destination themselves, so the add is theirs (one instruction instead of two, and no zeroed register)
  if not _zero(w.src[2]) or acc.dtype is not w.dtype or x.dtype is not w.dtype: return None
  return w.replace(src=(w.src[0], w.src[1], acc))


FUSE_ACCUMULATE = PatternMatcher([(UPat(Ops.ADD, src=[UPat(Ops.WMMA, name="w"), UPat(name="acc")], name="x"), _into_wmma)])


# ---- the AMX state of this process

ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA, SYS_ARCH_PRCTL = 0x1023, 18, 158
_amx_lock = threading.Lock()
_amx: str | None = None  # "ok", or why AMX cannot run


def request_amx() -> None:
  """Ask Linux for the AMX tile state (once per process); LaunchError with the reason when it is refused."""
  global _amx
  with _amx_lock:
    if _amx is None:
      if not {"amx_tile"} <= cpu_features(): _amx = "this CPU lacks amx_tile"
      else:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0: _amx = "ok"
        else: _amx = f"arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) failed: {os.strerror(ctypes.get_errno())} (Linux 5.16+ needed)"
  if _amx != "ok": raise LaunchError(f"this kernel uses AMX tiles, but {_amx}; set CPU_TC=0 to build kernels without them")
