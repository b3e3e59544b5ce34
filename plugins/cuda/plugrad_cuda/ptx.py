"""PTX as a program's source: kernels compiled elsewhere (Triton, hand-written PTX, `nvcc -ptx`) run through plugrad.

A program whose source is PTX — it has a `.version` and a `.target` directive line, which CUDA C never has — skips
NVRTC: nvJitLink turns it into a cubin directly (compiler.py). The target is the PTX's own when it is arch-specific
(`.target sm_90a`: Triton's Hopper kernels use wgmma/TMA, which only exist for sm_90a, and such PTX links for sm_90a
alone), else the device's arch (PTX for an older target is compiled forward).

The kernel ABI for PTX (runtime.py) extends the one for CUDA C:

* the entry named like the program takes the buffers (device pointers, in slot order) and then the variables (in name
  order, 32-bit or 64-bit like the variable), as for CUDA C;
* parameters the PTX declares after those get zeros of their declared size — Triton appends a `global_scratch` and a
  `profile_scratch` pointer that are unused (null) when its metadata says their sizes are 0;
* dynamic shared memory (Triton's `.extern .shared .b8 global_smem[]`) is declared by a comment line in the PTX,
  `// plugrad.shared_bytes = N` (Triton's `metadata.shared`): the launch passes N bytes (above 48 KiB the runtime opts the
  function in with `cuFuncSetAttribute`). Without the line a kernel gets none.
"""
from __future__ import annotations

import ctypes
import re
from typing import Any

_VERSION = re.compile(r"^\s*\.version\s+\d+\.\d+\s*$", re.M)
_TARGET = re.compile(r"^\s*\.target\s+(sm_\d+[a-z]?)", re.M)
_SHARED = re.compile(r"^\s*//\s*plugrad\.shared_bytes\s*=\s*(\d+)\s*$", re.M)
_PARAM = re.compile(r"\.param\s+(?:\.align\s+\d+\s+)?\.([usbf])(8|16|32|64)\b"          # .param [.align N] .u64
                    r"(?:\s+\.ptr(?:\s+\.\w+)*(?:\s+\.align\s+\d+)?)?\s+([\w$]+)\s*(?:\[(\d+)\])?")  # [.ptr .global .align N] name[count]


def is_ptx(src: str) -> bool:
  """Whether `src` is PTX: a `.version X.Y` line and a `.target sm_XX` line."""
  return bool(_VERSION.search(src)) and bool(_TARGET.search(src))


def target(src: str) -> str | None:
  """The PTX's `.target` (`sm_90a`), or None."""
  m = _TARGET.search(src)
  return m.group(1) if m else None


def shared_bytes(src: str) -> int:
  """The dynamic shared memory the PTX declares with `// plugrad.shared_bytes = N` (0 without the line)."""
  m = _SHARED.search(src)
  return int(m.group(1)) if m else 0


def entry_params(src: str, name: str) -> list[tuple[str, int, int]] | None:
  """The parameters of `.entry name(...)` as (kind u/s/b/f, bits, array length or 0), or None when there is no such entry."""
  m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\(([^)]*)\)", src)
  if m is None: return None
  return [(k, int(bits), int(n or 0)) for k, bits, _, n in _PARAM.findall(m.group(1))]


def zero_param(kind: str, bits: int, count: int) -> Any:
  """A ctypes zero of a PTX parameter's declared type (an array parameter: that many zero elements)."""
  if count: return (ctypes.c_ubyte * (count * bits // 8))()
  if kind == "f": return ctypes.c_float(0) if bits == 32 else ctypes.c_double(0) if bits == 64 else ctypes.c_uint16(0)
  return {8: ctypes.c_uint8, 16: ctypes.c_uint16, 32: ctypes.c_uint32, 64: ctypes.c_uint64}[bits](0)


def link_arch(src: str, arch: str) -> str:
  """The architecture nvJitLink builds PTX `src` for on a device of `arch`: the PTX's own target when it is an
  arch-specific one (`sm_90a`) of the same compute capability, else `arch`. Raises ValueError when it cannot run there."""
  from plugrad_cuda.nvrtc import parse_arch
  t = target(src)
  if t is None: return arch
  want, have = parse_arch(t), parse_arch(arch)
  if t.endswith("a"):
    if want != have: raise ValueError(f"the PTX targets {t}, which only runs on compute capability {want[0]}.{want[1]}; the device is {arch}")
    return t
  if want > have: raise ValueError(f"the PTX targets {t}, newer than the device's {arch}")
  return arch
