"""Host memory for the CPU device: 64-byte aligned (a cache line; the widest vector loads), shared zero-copy with numpy.

Out of memory is an error at allocation, not a kill later. Linux hands out anonymous memory lazily: a `calloc` far
beyond the free memory succeeds, and the process is killed (by the OOM killer, or its cgroup's limit) only when a
kernel touches the pages. So a large allocation (>= `LARGE` bytes) is first checked against the memory available to
this process — MemAvailable + SwapFree from /proc/meminfo, and the headroom under every memory limit of its cgroup
(v1 or v2; reclaimable page cache counted as free) — and raises MemoryError (the base class turns it into
`OutOfMemoryError` after freeing its cache and retrying once) when it does not fit.

The large buffers this allocator handed out whose pages may still be untouched ("lazy": the system does not count
them as used yet, but the kernels that write them will commit them) count against that check too. Touched pages would
be counted twice, so when the check fails on paper, the pages still untouched are counted exactly (mincore: nothing
is committed, so an impossible computation fails at once instead of after committing its inputs); where the system
cannot say, the lazy buffers are committed (MADV_POPULATE_WRITE: no data changes) and the check runs again. Small allocations stay plain `np.zeros`
(calloc); one check covers each `CHECK_EVERY` bytes of them. `CPU_MEMCHECK=0` turns the check off (for a system
whose /proc/meminfo does not describe the memory really available).
"""
from __future__ import annotations

import ctypes
import mmap
import threading
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from plugrad.backend import Allocator, BufferSpec, getenv
from plugrad_cpu.abandoned import settle

ALIGN = 64
LARGE = 4 << 20         # from here on: check the available memory (lazy buffers counted), an mmap of its own
CHECK_EVERY = 64 << 20  # smaller allocations: one check per this many bytes of them
RESERVE = 32 << 20      # left to the rest of the process (Python objects, the compiler) after a checked allocation
_MADV_POPULATE_WRITE = 23  # Linux 5.14+; older kernels say EINVAL and the pages are touched one by one instead

def _load_mincore() -> Any:
  try: f = ctypes.CDLL(None).mincore
  except (OSError, AttributeError): return None  # not a POSIX libc
  f.argtypes, f.restype = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p), ctypes.c_int
  return f
_mincore = _load_mincore()


class CPUBuffer:
  """A handle: the address kernels get, and the numpy array that owns (a view of) the memory."""
  __slots__ = ("addr", "mem", "nbytes")

  def __init__(self, mem: np.ndarray, addr: int):
    self.mem, self.nbytes, self.addr = mem, mem.nbytes, addr  # numpy does not report the address of an empty slice: keep our own

  def __repr__(self) -> str: return f"<CPUBuffer {self.nbytes} bytes at {self.addr:#x}>"


def _bytes(mv: memoryview) -> np.ndarray:
  if not isinstance(mv, memoryview): raise TypeError(f"expected a memoryview, got {type(mv).__name__}")
  return np.frombuffer(mv if mv.format == "B" and mv.ndim == 1 and mv.c_contiguous else mv.cast("B"), np.uint8)


# ---- how much memory this process can still get

def _read(p: Path) -> str | None:
  try: return p.read_text()
  except (OSError, UnicodeDecodeError): return None


def _int(text: str | None) -> int | None:
  """A cgroup limit or counter: None for "max", a missing file or anything unreadable."""
  try: return int(text.strip()) if text is not None else None
  except ValueError: return None


def _stat(text: str | None, *keys: str) -> int:
  if text is None: return 0
  vals = dict(ln.split(None, 1) for ln in text.splitlines() if " " in ln)
  return sum(_int(vals.get(k)) or 0 for k in keys)


def _limited_cgroups(proc: Path, mounts: dict[str, Path]) -> list[tuple[Path, bool, str]]:
  """The directories of this process's memory cgroup and its ancestors that set a memory limit, as (directory, is v2,
  name). `mounts` maps a controller ("" for cgroup v2, "memory" for v1) to where it is mounted."""
  out: list[tuple[Path, bool, str]] = []
  for line in (_read(proc / "self" / "cgroup") or "").splitlines():
    hid, ctrls, path = (line.split(":", 2) + ["", ""])[:3]
    v2 = hid == "0" and ctrls == ""
    if not v2 and "memory" not in ctrls.split(","): continue
    if (root := mounts.get("" if v2 else "memory")) is None: continue
    parts = [p for p in path.strip().split("/") if p]
    for depth in range(len(parts), -1, -1):  # the cgroup's own directory, then each ancestor (in a container: often only the mount)
      d = root.joinpath(*parts[:depth])
      if _limit(d, v2) is not None: out.append((d, v2, "/" + "/".join(parts[:depth])))
  return out


def _limit(d: Path, v2: bool) -> int | None:
  limit = _int(_read(d / ("memory.max" if v2 else "memory.limit_in_bytes")))
  return None if limit is None or limit >= 1 << 60 else limit  # "max", v1's huge "unlimited", or no such file


def _cgroup_headroom(cgroups: list[tuple[Path, bool, str]]) -> tuple[int, str] | None:
  """The least headroom (limit - usage + reclaimable file cache) over these cgroups, or None without a limit."""
  best: tuple[int, str] | None = None
  for d, v2, name in cgroups:
    limit, usage = _limit(d, v2), _int(_read(d / ("memory.current" if v2 else "memory.usage_in_bytes")))
    if limit is None or usage is None: continue
    stat = _read(d / "memory.stat")
    cache = _stat(stat, "active_file", "inactive_file") if v2 else _stat(stat, "total_active_file", "total_inactive_file")
    room = max(0, limit - usage + cache)
    if best is None or room < best[0]: best = (room, f"the memory limit of cgroup {name} ({limit} bytes)")
  return best


def _mounts() -> dict[str, Path]:
  out: dict[str, Path] = {}
  for line in (_read(Path("/proc/self/mountinfo")) or "").splitlines():
    pre, _, post = line.partition(" - ")
    fields, kind = pre.split(), post.split()
    if len(fields) < 5 or not kind: continue
    if kind[0] == "cgroup2": out.setdefault("", Path(fields[4]))
    elif kind[0] == "cgroup" and "memory" in (kind[2].split(",") if len(kind) > 2 else []): out.setdefault("memory", Path(fields[4]))
  return out


def _meminfo(proc: Path) -> tuple[int, str] | None:
  info = _read(proc / "meminfo")
  if info is None: return None
  vals = {k.strip(): v for k, _, v in (ln.partition(":") for ln in info.splitlines())}
  def kb(key: str) -> int | None:
    try: return int(vals[key].split()[0]) * 1024
    except (KeyError, ValueError, IndexError): return None
  if (avail := kb("MemAvailable")) is None: return None
  return avail + (kb("SwapFree") or 0), "MemAvailable + SwapFree in /proc/meminfo"


def _least(proc: Path, cgroups: list[tuple[Path, bool, str]]) -> tuple[int, str] | None:
  if (best := _meminfo(proc)) is None: return None
  if (cg := _cgroup_headroom(cgroups)) is not None and cg[0] < best[0]: best = cg
  return best


def available_memory_from(proc: Path, mounts: dict[str, Path]) -> tuple[int, str] | None:
  """(bytes this process can still allocate, where that number comes from), or None when it cannot be told."""
  return _least(proc, _limited_cgroups(proc, mounts))


_CGROUPS: list[tuple[Path, bool, str]] | None = None  # found once per process (a limit set later on a parent is not seen)


def available_memory() -> tuple[int, str] | None:
  """`available_memory_from` for this process: /proc/meminfo and the limited cgroups (found on the first call)."""
  global _CGROUPS
  if _CGROUPS is None: _CGROUPS = _limited_cgroups(Path("/proc"), _mounts())
  return _least(Path("/proc"), _CGROUPS)


def _fmt(n: int) -> str: return f"{n} bytes ({n / (1 << 30):.2f} GiB)"


def _resident(m: mmap.mmap) -> int | None:
  """Bytes of `m` whose pages are in memory (mincore), None where the system cannot say."""
  if _mincore is None: return None
  n = len(m)
  vec = np.zeros(-(-n // mmap.PAGESIZE), np.uint8)
  addr = np.frombuffer(m, np.uint8).ctypes.data
  if _mincore(ctypes.c_void_p(addr), ctypes.c_size_t(n), vec.ctypes.data_as(ctypes.c_void_p)) != 0: return None
  return min(n, int(np.count_nonzero(vec & 1)) * mmap.PAGESIZE)


def _populate(m: mmap.mmap) -> None:
  """Commit every page of a mapping now, keeping its contents (one system call where the kernel has MADV_POPULATE_WRITE)."""
  try:
    m.madvise(_MADV_POPULATE_WRITE)
    return
  except OSError: pass  # an older kernel (EINVAL): write each page's first byte back to it
  raw = np.frombuffer(m, np.uint8)
  raw[::mmap.PAGESIZE] = raw[::mmap.PAGESIZE].copy()


class CPUAllocator(Allocator[CPUBuffer]):
  """Zero-initialized, 64-byte aligned numpy memory; views share it; `_as_memoryview` is the memory itself."""
  def __init__(self, device: str):
    super().__init__(device)
    self.check = bool(getenv("CPU_MEMCHECK", 1, choices=(0, 1)))  # a bad value fails at the device's first use
    self._unchecked = 0  # bytes of small allocations since the last check
    self._lazy: dict[int, tuple[weakref.ref[mmap.mmap], int]] = {}  # live large buffers not committed yet: id -> (mapping, bytes)
    self.lazy_bytes = 0
    self._lazy_lock = threading.Lock()  # the finalizers that drop entries run in whichever thread frees the buffer

  def _fits(self, nbytes: int) -> None:
    """Raise MemoryError when `nbytes` more cannot be backed by memory now, counting the lazy buffers as used."""
    if (got := available_memory()) is None: return  # not Linux, or no /proc: nothing to check against
    if nbytes + self.lazy_bytes + RESERVE <= got[0]: return
    if self.lazy_bytes:  # maybe only because touched pages of lazy buffers count twice: count the untouched ones
      if (untouched := self.untouched_bytes()) is not None:
        if nbytes + untouched + RESERVE <= got[0]: return
      else:  # no mincore: commit them, and look again
        self.commit_lazy()
        if (got := available_memory()) is None or nbytes + RESERVE <= got[0]: return
    have, where = got
    raise MemoryError(f"{_fmt(nbytes)} requested but only {_fmt(have)} available ({where}), keeping {RESERVE >> 20} MiB for the "
                      "rest of the process; set CPU_MEMCHECK=0 if this number is wrong here")

  def untouched_bytes(self) -> int | None:
    """Bytes of the live lazy buffers whose pages are not in memory yet (None: the system cannot say); buffers now
    wholly in memory leave the lazy set, since the system counts them."""
    with self._lazy_lock: lazy = list(self._lazy.items())
    total = 0
    for key, (ref, nbytes) in lazy:
      if (m := ref()) is None: continue
      if (res := _resident(m)) is None: return None
      if res >= nbytes: self._forget(key, nbytes)
      else: total += nbytes - res
    return total

  def commit_lazy(self) -> None:
    """Commit the pages of every live large buffer that may still be untouched (their data stays as it is)."""
    settle()  # an interrupted launch may still write them
    with self._lazy_lock:
      lazy, self._lazy, self.lazy_bytes = self._lazy, {}, 0
    for ref, _ in lazy.values():
      if (m := ref()) is not None: _populate(m)

  def _forget(self, key: int, nbytes: int) -> None:
    with self._lazy_lock:
      if self._lazy.pop(key, None) is not None: self.lazy_bytes -= nbytes

  def _alloc(self, nbytes: int, options: BufferSpec | None) -> CPUBuffer:
    if nbytes >= LARGE and self.check:
      self._fits(nbytes)
      try: m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # page-aligned and zeroed
      except OSError as e:  # ENOMEM: an address-space (RLIMIT_AS) or data limit
        raise MemoryError(f"mmap of {_fmt(nbytes)} failed: {e}") from None
      if hasattr(mmap, "MADV_HUGEPAGE"):
        try: m.madvise(mmap.MADV_HUGEPAGE)  # what numpy does for its large arrays: fewer TLB misses
        except OSError: pass
      with self._lazy_lock:
        self._lazy[key := id(m)] = (weakref.ref(m), nbytes)
        self.lazy_bytes += nbytes
      weakref.finalize(m, self._forget, key, nbytes)
      raw = np.frombuffer(m, np.uint8)
      return CPUBuffer(raw, raw.ctypes.data)
    if self.check and (u := self._unchecked + nbytes) >= CHECK_EVERY:
      self._unchecked = 0
      self._fits(u)
    elif self.check: self._unchecked = u
    raw = np.zeros(nbytes + ALIGN, np.uint8)  # calloc: large buffers are zero pages until written
    addr = ctypes.addressof(ctypes.c_char.from_buffer(raw))  # type: ignore[arg-type]  # a third of the time of raw.ctypes.data
    start = -addr % ALIGN
    return CPUBuffer(raw[start:start + nbytes], addr + start)

  def _free(self, handle: CPUBuffer, nbytes: int, options: BufferSpec | None) -> None: pass  # numpy frees it with the last view

  def _copyin(self, handle: CPUBuffer, src: memoryview) -> None:
    data = _bytes(src)
    if data.size != handle.nbytes: raise ValueError(f"{self.device}: copyin of {data.size} bytes into a buffer of {handle.nbytes}")
    settle()
    ctypes.memmove(handle.addr, data.ctypes.data, data.size)

  def _copyout(self, dest: memoryview, handle: CPUBuffer) -> None:
    out = _bytes(dest)
    if out.size != handle.nbytes: raise ValueError(f"{self.device}: copyout of a buffer of {handle.nbytes} bytes into {out.size}")
    if out.size and not out.flags.writeable: raise ValueError(f"{self.device}: copyout into a read-only memoryview")
    settle()
    ctypes.memmove(out.ctypes.data, handle.addr, out.size)

  def _transfer(self, dest: CPUBuffer, src: CPUBuffer, nbytes: int, src_dev: Allocator, dest_dev: Allocator) -> None:
    # between CPU instances (CPU_DEVICES): they share the host's memory, so a copy is one memmove
    if nbytes > min(dest.nbytes, src.nbytes):
      raise ValueError(f"{self.device}: a transfer of {nbytes} bytes between buffers of {src.nbytes} and {dest.nbytes} bytes")
    settle()
    ctypes.memmove(dest.addr, src.addr, nbytes)

  def _offset(self, handle: CPUBuffer, offset: int, nbytes: int) -> CPUBuffer:
    if offset < 0 or nbytes < 0 or offset + nbytes > handle.nbytes:
      raise ValueError(f"{self.device}: a view of {nbytes} bytes at offset {offset} does not fit a buffer of {handle.nbytes} bytes")
    return CPUBuffer(handle.mem[offset:offset + nbytes], handle.addr + offset)

  def _as_memoryview(self, handle: CPUBuffer, nbytes: int) -> memoryview:
    if nbytes != handle.nbytes: raise ValueError(f"{self.device}: asked for {nbytes} bytes of a buffer of {handle.nbytes}")
    settle()
    return handle.mem.data  # kernels run synchronously: nothing is pending (an interrupted launch is waited for first)


