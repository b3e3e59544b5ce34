"""`Compiler`: the base of every backend's compiler, and the persistent compile cache in front of it.

Compiling is the slowest step of running a new kernel (a C compiler takes tens of milliseconds, NVRTC more), and the
same kernels come back in every run of a program, so binaries are kept in a sqlite file shared by all processes.
The cache is an optimization only and never fails a compile. Its binaries are native code this process will run, so
(docs/security.md, plugrad/diskcache.py) the directory must be private to the user, each entry carries an HMAC of its
bytes checked before they are returned, an entry that fails the check or fails to load is dropped and compiled again
(with a CacheWarning naming the kernel), a damaged database file is moved aside and rebuilt, and the binaries are
kept under CACHE_MB by evicting the least recently used. A database locked past the timeout or not writable turns
caching off for the process with a DEBUG message.
"""
from __future__ import annotations

import errno
import hashlib
import os
import re
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import plugrad.diskcache as diskcache
from plugrad.errors import CompileError, PluginHookError
from plugrad.helpers import CACHE, DEBUG, cache_dir

_TABLE = "compile_v2"  # bump the suffix when the stored format changes (v2: HMAC, size, last use)
_OLD_TABLES = ("compile_v1",)  # unsigned entries: dropped, never read
T = TypeVar("T")


# one thread compiles ahead for every concurrent compiler: the engine's own thread renders the next kernels meanwhile
def _ahead_pool() -> ThreadPoolExecutor:
  return ThreadPoolExecutor(max_workers=1, thread_name_prefix="plugrad-compile")


_AHEAD = _ahead_pool()


def _after_fork() -> None:
  global _AHEAD, _lock
  _AHEAD = _ahead_pool()  # the parent's thread does not exist in a forked child (its jobs there are ignored: _take_ahead)
  _lock = threading.RLock()  # the compile thread may have held it at the fork


if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=_after_fork)
AHEAD_MAX = 4096  # binaries compiled ahead and not yet loaded that a compiler keeps (a schedule that failed leaves some)


class Compiler:
  """Subclasses set `cache_key` (compiler identity and flags, e.g. "gcc-12.2 -O2 -march=native"; None = never cache)
  and implement `compile(src) -> bytes`, raising `CompileError` with the compiler's own output on failure.
  `concurrent = True` declares that `compile` may run on another thread while the caller goes on, and lets go of the
  GIL while it works (a C library through ctypes, a subprocess): the engine then compiles a schedule's kernels
  ahead (`compile_ahead`) while it renders the next ones."""
  cache_key: str | None = None
  concurrent: bool = False

  def compile_ahead(self, src: str, name: str = "kernel") -> Future[bytes | None] | None:
    """Start compiling `src` on the compile thread (a concurrent compiler whose cache lacks it); the next
    `load_cached`/`compile_cached` of `src` takes the result, or the CompileError, from there. Returns the job to
    wait for (None when nothing was started)."""
    if not self.concurrent or not isinstance(src, str): return None
    ahead = self._ahead_jobs()
    if (fut := ahead.get(src)) is not None: return fut
    while len(ahead) >= AHEAD_MAX: ahead.pop(next(iter(ahead)))
    key = self.cache_key if CACHE else None
    def work() -> bytes | None: return None if key is not None and _cache_has(key, src) else self._fresh(src, name)
    fut = ahead[src] = _AHEAD.submit(work)
    return fut

  def _ahead_jobs(self) -> dict[str, Future[bytes | None]]:
    """This process's jobs by source (a forked child starts with none: the parent's thread never finishes them here)."""
    pid, jobs = self.__dict__.get("_ahead", (None, {}))
    if pid != os.getpid(): self.__dict__["_ahead"] = (pid := os.getpid(), jobs := {})
    return jobs

  def _take_ahead(self, src: str) -> Future[bytes | None] | None:
    return self._ahead_jobs().pop(src, None) if self.concurrent else None

  def _compiled(self, src: str, name: str, ahead: Future[bytes | None] | None) -> bytes:
    """The fresh binary of `src`: the one compiled ahead (its CompileError raised here), else compiled now."""
    if ahead is not None and (lib := ahead.result()) is not None: return lib
    return self._fresh(src, name)

  def compile(self, src: str) -> bytes:
    raise NotImplementedError(f"{type(self).__name__} must implement compile(src) -> bytes")

  def disassemble(self, lib: bytes) -> str:
    raise NotImplementedError(f"{type(self).__name__} has no disassembler (override Compiler.disassemble to add one)")

  def compile_cached(self, src: str, name: str = "kernel") -> bytes:
    """`compile(src)` through the on-disk cache (CACHE=0 bypasses it). A failure raises CompileError naming the kernel."""
    if not isinstance(src, str): raise TypeError(f"compile_cached needs the source as a str, got {type(src).__name__}")
    key, ahead = self.cache_key if CACHE else None, self._take_ahead(src)
    if key is not None and (lib := _cache_get(key, src, name)) is not None: return lib
    lib = self._compiled(src, name, ahead)
    if key is not None: _cache_put(key, src, lib)
    return lib

  def load_cached(self, src: str, name: str, load: Callable[[bytes], T]) -> T:
    """`load(compile_cached(src, name))`, where `load` turns the binary into something runnable (dlopen, link) and
    raises when it cannot. A cached binary that fails to load is compiled once more (a CacheWarning names the kernel)
    and replaced by the fresh binary only once that one loaded: when the fresh one fails too, the fault was not the
    cached binary's (the process is out of memory maps, memory or files) and the entry is kept. A failure that says
    so itself (MemoryError, ENOMEM, EMFILE, "failed to map segment") is raised at once, without recompiling. Only a
    fresh binary's failure propagates; a fresh binary is stored once it loaded."""
    if not isinstance(src, str): raise TypeError(f"load_cached needs the source as a str, got {type(src).__name__}")
    key, ahead = self.cache_key if CACHE else None, self._take_ahead(src)
    if key is not None and (cached := _cache_get(key, src, name)) is not None:
      try: return load(cached)
      except Exception as e:
        if exhausted(e): raise
        diskcache.warn(f"plugrad: the cached binary of kernel {name!r} failed to load ({type(e).__name__}: {e}); compiling it again "
                       "(the entry is replaced once the fresh binary loads)")
    lib = self._compiled(src, name, ahead)
    out = load(lib)
    if key is not None: _cache_put(key, src, lib)
    return out

  def _fresh(self, src: str, name: str) -> bytes:
    try: lib = self.compile(src)
    except CompileError as e: raise _kernel_error(type(self).__name__, name, str(e), src) from e
    if not isinstance(lib, bytes):
      raise PluginHookError(f"{type(self).__name__}.compile must return bytes, got {type(lib).__name__} (kernel {name!r})")
    return lib


# ---- error messages with the source near the reported line

# gcc/clang/metal "file:12:5:", nvrtc "kernel.cu(12):", Python and others "line 12"
_LINE_RE = re.compile(r":(\d+):\d+:|\((\d+)\):|\bline (\d+)\b")


_EXHAUSTED = (errno.ENOMEM, errno.EMFILE, errno.ENFILE)
_EXHAUSTED_TEXT = ("cannot allocate memory", "failed to map segment", "too many open files", "out of memory")


def exhausted(e: BaseException) -> bool:
  """Whether a load failure is the process running out of a resource (memory, memory maps: vm.max_map_count, file
  descriptors) rather than a fault of the binary: dlopen reports these only as text, so the message is read too."""
  for x in (e, e.__cause__, e.__context__):
    if isinstance(x, MemoryError) or (isinstance(x, OSError) and x.errno in _EXHAUSTED): return True
    if x is not None and any(t in str(x).lower() for t in _EXHAUSTED_TEXT): return True
  return False


def error_line(message: str, src: str) -> int | None:
  """The first source line number (1-based) a compiler message points at, if it names one inside `src`."""
  nlines = src.count("\n") + 1
  for m in _LINE_RE.finditer(message):
    n = int(next(g for g in m.groups() if g is not None))
    if 1 <= n <= nlines: return n
  return None


def _kernel_error(compiler: str, name: str, message: str, src: str, context: int = 2) -> CompileError:
  text = f"kernel {name!r} failed to compile ({compiler}):\n{message.rstrip()}"
  if (line := error_line(message, src)) is not None:
    lines = src.splitlines()
    near = range(max(1, line - context), min(len(lines), line + context) + 1)
    text += f"\nsource near line {line}:\n" + "\n".join(f"{'>' if i == line else ' '} {i:4d} | {lines[i - 1]}" for i in near)
  err = CompileError(text)
  err.kernel, err.compiler_output, err.source = name, message, src  # type: ignore[attr-defined]
  return err


# ---- the sqlite cache: one connection per (process, file); a fork gets its own, as sqlite requires

_conns: dict[tuple[int, Path], sqlite3.Connection | None] = {}
# the binaries' total size as this process knows it: read once per connection, then kept up to date by its own puts
# (summing the table at every put scanned the whole file: 15 ms per kernel with 12k kernels cached, more as it grows);
# other processes' puts are seen when this total passes the cap and the table is summed again before evicting
_sizes: dict[tuple[int, Path], int] = {}
EVICT_TO = 0.9  # an eviction frees down to this fraction of the cap, so the next puts do not each sum the table again
_warned: set[Path] = set()
_rebuilt: set[tuple[int, Path]] = set()
_lock = threading.RLock()


def cache_path() -> Path: return cache_dir() / "cache.db"


def _disable(path: Path, why: BaseException) -> None:
  if path not in _warned and DEBUG >= 1:
    print(f"plugrad: compile cache {path} not used ({type(why).__name__}: {why}); compiling without it", file=sys.stderr)
  _warned.add(path)


def _is_damaged(e: BaseException) -> bool:
  # OperationalError is "locked", "read-only", "disk I/O": conditions that pass; its parent DatabaseError is
  # "file is not a database" / "database disk image is malformed": the file itself is bad
  return isinstance(e, sqlite3.DatabaseError) and not isinstance(e, sqlite3.OperationalError)


def _rebuild(path: Path, why: BaseException) -> bool:
  """Move a damaged database aside (to cache.db.broken, replacing an older one: kept for a bug report, bounded) so
  the next connection starts a new one; once per process, so a file that keeps breaking cannot loop."""
  k = (os.getpid(), path)
  if k in _rebuilt: return False
  _rebuilt.add(k)
  _sizes.pop(k, None)
  if (conn := _conns.pop(k, None)) is not None: conn.close()
  aside = path.with_name(f"{path.name}.broken")
  try:
    path.replace(aside)
    for suffix in ("-wal", "-shm"): path.with_name(path.name + suffix).unlink(missing_ok=True)
  except OSError: return False
  diskcache.warn(f"plugrad: compile cache {path} was damaged ({type(why).__name__}: {why}); moved it to {aside.name} and started a new one")
  return True


def _open(path: Path) -> sqlite3.Connection:
  # the timeout makes a writer wait for another process's write; WAL lets readers run during it
  conn = sqlite3.connect(path, timeout=30, check_same_thread=False, isolation_level=None)
  try:
    conn.execute("PRAGMA journal_mode=WAL")
    # WAL + NORMAL syncs at checkpoints, not at every commit (a hit's `used` update was an fsync): still never corrupt;
    # a power cut may lose the last entries, which a cache can afford
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(f"CREATE TABLE IF NOT EXISTS {_TABLE} (compiler TEXT NOT NULL, src_sha256 TEXT NOT NULL, lib BLOB NOT NULL, "
                 "mac BLOB NOT NULL, size INTEGER NOT NULL, used REAL NOT NULL, PRIMARY KEY (compiler, src_sha256))")
    for old in _OLD_TABLES: conn.execute(f"DROP TABLE IF EXISTS {old}")
  except BaseException:
    conn.close()
    raise
  return conn


def _connect() -> tuple[sqlite3.Connection, bytes, Path] | None:
  """(connection, HMAC key, database path), or None when the cache cannot be used in this process now."""
  if (d := diskcache.secure_dir()) is None or (key := diskcache.secret(d)) is None: return None
  path = d / "cache.db"
  if (k := (os.getpid(), path)) in _conns:
    return None if (c := _conns[k]) is None else (c, key, path)
  conn: sqlite3.Connection | None = None
  try: conn = _open(path)
  except (sqlite3.Error, OSError) as e:
    if _is_damaged(e) and _rebuild(path, e):
      try: conn = _open(path)
      except (sqlite3.Error, OSError) as e2: _disable(path, e2)
    else: _disable(path, e)
  _conns[k] = conn
  return None if conn is None else (conn, key, path)


def _failed(path: Path, e: sqlite3.Error) -> None:
  """A query failed: rebuild a damaged file (the next query opens the new one), else stop using the cache."""
  if not (_is_damaged(e) and _rebuild(path, e)):
    _conns[(os.getpid(), path)] = None
    _disable(path, e)


def _digest(src: str) -> str: return hashlib.sha256(src.encode()).hexdigest()


def _cache_get(key: str, src: str, name: str = "kernel") -> bytes | None:
  """The cached binary when its HMAC checks out; an entry that does not is deleted (with a CacheWarning) and missed."""
  with _lock:
    if (c := _connect()) is None: return None
    conn, secret, path = c
    sha = _digest(src)
    try:
      row = conn.execute(f"SELECT lib, mac FROM {_TABLE} WHERE compiler = ? AND src_sha256 = ?", (key, sha)).fetchone()
      if row is None: return None
      lib, mac = row
      if not (isinstance(lib, bytes) and isinstance(mac, bytes) and diskcache.valid(secret, mac, key.encode(), sha.encode(), lib)):
        conn.execute(f"DELETE FROM {_TABLE} WHERE compiler = ? AND src_sha256 = ?", (key, sha))
        diskcache.warn(f"plugrad: the cached binary of kernel {name!r} in {path} failed its integrity check (damaged or not written by "
                       "plugrad); dropped it, compiling again")
        return None
      conn.execute(f"UPDATE {_TABLE} SET used = ? WHERE compiler = ? AND src_sha256 = ?", (time.time(), key, sha))
    except sqlite3.Error as e:
      _failed(path, e)
      return None
  return lib


class ProgramCache:
  """The codegen's ProgramStore (plugrad.codegen.get_program) in the compile cache's file: rendered PROGRAMs by key,
  HMAC-checked and size-capped like the binaries (CACHE=0 bypasses it). A warm process then skips lowering and
  rendering, not only compiling (ResNet-18's first training step with warm caches: 15.0 -> 6.9-8.6 s on 2 cores)."""
  KIND = "plugrad program v1"

  def get(self, key: str) -> bytes | None: return _cache_get(self.KIND, key, "program") if CACHE else None
  def put(self, key: str, blob: bytes) -> None:
    if CACHE: _cache_put(self.KIND, key, blob)


PROGRAMS = ProgramCache()


def _cache_has(key: str, src: str) -> bool:
  """Whether the cache holds an entry for `src` (unchecked: `_cache_get` checks it when it is read)."""
  with _lock:
    if (c := _connect()) is None: return False
    conn, _, path = c
    try: return conn.execute(f"SELECT 1 FROM {_TABLE} WHERE compiler = ? AND src_sha256 = ?", (key, _digest(src))).fetchone() is not None
    except sqlite3.Error as e:
      _failed(path, e)
      return False


def _cache_put(key: str, src: str, lib: bytes) -> None:
  with _lock:
    if (c := _connect()) is None: return
    conn, secret, path = c
    sha = _digest(src)
    try:
      cap = diskcache.cap_bytes()
      if len(lib) > cap: return  # would evict everything else and itself
      k = (os.getpid(), path)
      if (total := _sizes.get(k)) is None: total = _total(conn)
      conn.execute(f"INSERT OR REPLACE INTO {_TABLE} (compiler, src_sha256, lib, mac, size, used) VALUES (?, ?, ?, ?, ?, ?)",
                   (key, sha, lib, diskcache.digest(secret, key.encode(), sha.encode(), lib), len(lib), time.time()))
      total += len(lib)
      _sizes[k] = _evict(conn, cap) if total > cap else total
    except sqlite3.Error as e: _failed(path, e)


def _total(conn: sqlite3.Connection) -> int: return int(conn.execute(f"SELECT COALESCE(SUM(size), 0) FROM {_TABLE}").fetchone()[0] or 0)


def _evict(conn: sqlite3.Connection, cap: int) -> int:
  """Delete the least recently used entries until the binaries fit in EVICT_TO of `cap` bytes; their total after."""
  total = _total(conn)
  excess = total - int(cap * EVICT_TO) if total > cap else 0
  if excess <= 0: return total
  drop: list[int] = []
  for rowid, size in conn.execute(f"SELECT rowid, size FROM {_TABLE} ORDER BY used ASC"):
    if excess <= 0: break
    drop.append(rowid)
    excess -= size
    total -= size
  conn.executemany(f"DELETE FROM {_TABLE} WHERE rowid = ?", [(r,) for r in drop])
  return total
