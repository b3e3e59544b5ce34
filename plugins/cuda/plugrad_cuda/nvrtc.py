"""NVRTC and nvJitLink through ctypes: CUDA C → PTX → cubin, with no CUDA toolkit installed.

The libraries come from NVIDIA's pip wheels: `nvidia-cuda-nvrtc` / `nvidia-nvjitlink` (CUDA 13, `nvidia/cu13/lib`),
or the older `-cu12` wheels (`nvidia/cuda_nvrtc/lib`, `nvidia/nvjitlink/lib`), else a system toolkit (`$CUDA_HOME`,
`/usr/local/cuda`). NVRTC loads its builtins library by name at run time, which a wheel's directory is not on the
search path for, so it is preloaded (RTLD_GLOBAL) from the same directory first.

nvJitLink finalizes the PTX into a cubin for the exact `sm_XX`, so ptxas errors (register limits, unknown
instructions for the arch) surface at compile time here, not at module load on the GPU.
"""
from __future__ import annotations

import ctypes
import functools
import glob
import importlib.util
import os
import re
from dataclasses import dataclass

from plugrad.backend import CompileError

ARCH_RE = re.compile(r"^sm_(\d)(\d+)a?$")


class ToolchainError(CompileError):
  """NVRTC or nvJitLink cannot be found or loaded."""


def parse_arch(arch: str) -> tuple[int, int]:
  """`sm_90` → (9, 0); `sm_100a` → (10, 0). Raises ValueError for anything else."""
  m = ARCH_RE.match(arch.strip())
  if m is None: raise ValueError(f"CUDA_ARCH must look like sm_80 or sm_90 (sm_ + the compute capability), got {arch!r}")
  digits = m.group(1) + m.group(2)
  return (int(digits[:-1]), int(digits[-1]))


def _wheel_dirs() -> list[str]:
  # cu13 first: its NVRTC is the one the declared dependencies install; cu12 wheels (often brought in by PyTorch) next
  out = []
  for pkg in ("nvidia.cu13", "nvidia.cuda_nvrtc", "nvidia.nvjitlink"):
    try: spec = importlib.util.find_spec(pkg)
    except (ImportError, ValueError): spec = None
    for root in (spec.submodule_search_locations or []) if spec is not None else []: out.append(os.path.join(root, "lib"))
  home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
  return out + [os.path.join(d, sub) for d in ([home] if home else []) + ["/usr/local/cuda"] for sub in ("lib64", "lib")]


def _find(pattern: str) -> str | None:
  for d in _wheel_dirs():
    hits = sorted(glob.glob(os.path.join(d, pattern)), key=lambda p: (".alt." in p, -len(p)))
    if hits: return hits[0]
  return None


@dataclass(frozen=True)
class Libs:
  nvrtc: ctypes.CDLL
  jitlink: ctypes.CDLL
  nvrtc_path: str
  jitlink_path: str
  version: tuple[int, int]          # NVRTC's
  jitlink_version: tuple[int, int]


@functools.cache
def libs() -> Libs:
  """The loaded NVRTC and nvJitLink (once per process); ToolchainError says what to install."""
  nv = _find("libnvrtc.so.*")
  jl = _find("libnvJitLink.so.*")
  if nv is None or jl is None:
    missing = " and ".join(n for n, p in (("NVRTC", nv), ("nvJitLink", jl)) if p is None)
    raise ToolchainError(f"{missing} not found: pip install nvidia-cuda-nvrtc nvidia-nvjitlink (CUDA 13 wheels; the -cu12 wheels work too), "
                         "or set CUDA_HOME to a CUDA toolkit")
  try:
    for b in sorted(glob.glob(os.path.join(os.path.dirname(nv), "libnvrtc-builtins.so*")), key=lambda p: ".alt." in p)[:1]:
      ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
    nvrtc, jitlink = ctypes.CDLL(nv), ctypes.CDLL(jl)
  except OSError as e: raise ToolchainError(f"loading NVRTC/nvJitLink failed: {e}") from None
  nvrtc.nvrtcGetErrorString.restype = ctypes.c_char_p
  for fn in ("nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcGetPTX", "nvrtcGetPTXSize", "nvrtcGetProgramLog", "nvrtcGetProgramLogSize",
             "nvrtcDestroyProgram", "nvrtcVersion"):
    getattr(nvrtc, fn).restype = ctypes.c_int
  maj, mi = ctypes.c_int(), ctypes.c_int()
  nvrtc.nvrtcVersion(ctypes.byref(maj), ctypes.byref(mi))
  jmaj, jmin = ctypes.c_uint(), ctypes.c_uint()
  jver = (jmaj.value, jmin.value) if jitlink.nvJitLinkVersion(ctypes.byref(jmaj), ctypes.byref(jmin)) == 0 else (0, 0)
  return Libs(nvrtc, jitlink, nv, jl, (maj.value, mi.value), jver)


def _nvrtc_check(lib: ctypes.CDLL, status: int, what: str) -> None:
  if status != 0: raise CompileError(f"{what} failed: {lib.nvrtcGetErrorString(status).decode()} ({status})")


def to_ptx(src: str, arch: str, flags: tuple[str, ...], name: str = "kernel.cu") -> str:
  """PTX of CUDA C `src` for `arch` (sm_XX; NVRTC is given compute_XX). Errors: CompileError with NVRTC's log."""
  lib = libs().nvrtc
  prog = ctypes.c_void_p()
  _nvrtc_check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), name.encode(), 0, None, None), "nvrtcCreateProgram")
  try:
    opts = [f"--gpu-architecture={arch.replace('sm_', 'compute_')}".encode(), *(f.encode() for f in flags)]
    status = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    if status != 0:
      size = ctypes.c_size_t()
      lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
      log = ctypes.create_string_buffer(size.value + 1)
      lib.nvrtcGetProgramLog(prog, log)
      raise CompileError(f"NVRTC {'.'.join(map(str, libs().version))} for {arch}: {lib.nvrtcGetErrorString(status).decode()}\n"
                         f"{log.value.decode(errors='replace').strip()}")
    size = ctypes.c_size_t()
    _nvrtc_check(lib, lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
    buf = ctypes.create_string_buffer(size.value)
    _nvrtc_check(lib, lib.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
    return buf.value.decode()
  finally: lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _jitlink_log(lib: ctypes.CDLL, handle: ctypes.c_void_p) -> str:
  size = ctypes.c_size_t()
  if lib.nvJitLinkGetErrorLogSize(handle, ctypes.byref(size)) != 0 or size.value == 0: return ""
  buf = ctypes.create_string_buffer(size.value + 1)
  lib.nvJitLinkGetErrorLog(handle, buf)
  return buf.value.decode(errors="replace").strip()


NVJITLINK_INPUT_PTX = 2


def to_cubin(ptx: str, arch: str) -> bytes:
  """The cubin of `ptx` for `arch`, linked by nvJitLink (ptxas runs inside it). Errors: CompileError with its log."""
  lib = libs().jitlink
  handle = ctypes.c_void_p()
  opts = [f"-arch={arch}".encode()]
  if (st := lib.nvJitLinkCreate(ctypes.byref(handle), len(opts), (ctypes.c_char_p * len(opts))(*opts))) != 0:
    raise CompileError(f"nvJitLinkCreate(-arch={arch}) failed with status {st} (an arch this nvJitLink does not know?)")
  try:
    data = ptx.encode()
    for what, st in (("nvJitLinkAddData", lib.nvJitLinkAddData(handle, NVJITLINK_INPUT_PTX, data, ctypes.c_size_t(len(data)), b"kernel.ptx")),
                     ("nvJitLinkComplete", lib.nvJitLinkComplete(handle))):
      if st != 0: raise CompileError(f"nvJitLink for {arch}: {what} failed with status {st}\n{_jitlink_log(lib, handle)}")
    size = ctypes.c_size_t()
    if (st := lib.nvJitLinkGetLinkedCubinSize(handle, ctypes.byref(size))) != 0: raise CompileError(f"nvJitLinkGetLinkedCubinSize: status {st}")
    buf = ctypes.create_string_buffer(size.value)
    if (st := lib.nvJitLinkGetLinkedCubin(handle, buf)) != 0: raise CompileError(f"nvJitLinkGetLinkedCubin: status {st}")
    return buf.raw
  finally: lib.nvJitLinkDestroy(ctypes.byref(handle))
