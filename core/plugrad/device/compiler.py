"""`Compiler`: the base of every backend's compiler, and the persistent compile cache in front of it.

Compiling is the slowest step of running a new kernel (a C compiler takes tens of milliseconds, NVRTC more), and the
same kernels come back in every run of a program, so binaries are kept in a sqlite file shared by all processes.
The cache is an optimization only: any problem with it (corrupt, locked past the timeout, read-only) turns caching
off with a DEBUG message and never fails a compile.
"""
from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import sys
import threading
from pathlib import Path

from plugrad.errors import CompileError, PluginHookError
from plugrad.helpers import CACHE, DEBUG, cache_dir

_TABLE = "compile_v1"  # bump the suffix when the stored format changes


class Compiler:
  """Subclasses set `cache_key` (compiler identity and flags, e.g. "gcc-12.2 -O2 -march=native"; None = never cache)
  and implement `compile(src) -> bytes`, raising `CompileError` with the compiler's own output on failure."""
  cache_key: str | None = None

  def compile(self, src: str) -> bytes:
    raise NotImplementedError(f"{type(self).__name__} must implement compile(src) -> bytes")

  def disassemble(self, lib: bytes) -> str:
    raise NotImplementedError(f"{type(self).__name__} has no disassembler (override Compiler.disassemble to add one)")

  def compile_cached(self, src: str, name: str = "kernel") -> bytes:
    """`compile(src)` through the on-disk cache (CACHE=0 bypasses it). A failure raises CompileError naming the kernel."""
    if not isinstance(src, str): raise TypeError(f"compile_cached needs the source as a str, got {type(src).__name__}")
    key = self.cache_key if CACHE else None
    if key is not None and (lib := _cache_get(key, src)) is not None: return lib
    try: lib = self.compile(src)
    except CompileError as e: raise _kernel_error(type(self).__name__, name, str(e), src) from e
    if not isinstance(lib, bytes):
      raise PluginHookError(f"{type(self).__name__}.compile must return bytes, got {type(lib).__name__} (kernel {name!r})")
    if key is not None: _cache_put(key, src, lib)
    return lib


# ---- error messages with the source near the reported line

# gcc/clang/metal "file:12:5:", nvrtc "kernel.cu(12):", Python and others "line 12"
_LINE_RE = re.compile(r":(\d+):\d+:|\((\d+)\):|\bline (\d+)\b")


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
_warned: set[Path] = set()
_lock = threading.Lock()


def cache_path() -> Path: return cache_dir() / "cache.db"


def _disable(path: Path, why: BaseException) -> None:
  if path not in _warned and DEBUG >= 1:
    print(f"plugrad: compile cache {path} not used ({type(why).__name__}: {why}); compiling without it (delete the file to rebuild it)",
          file=sys.stderr)
  _warned.add(path)


def _connect(path: Path) -> sqlite3.Connection | None:
  if (k := (os.getpid(), path)) in _conns: return _conns[k]
  conn: sqlite3.Connection | None = None
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    # the timeout makes a writer wait for another process's write; WAL lets readers run during it
    conn = sqlite3.connect(path, timeout=30, check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"CREATE TABLE IF NOT EXISTS {_TABLE} (compiler TEXT NOT NULL, src_sha256 TEXT NOT NULL, lib BLOB NOT NULL, "
                 "PRIMARY KEY (compiler, src_sha256))")
  except (sqlite3.Error, OSError) as e:
    _disable(path, e)
    if conn is not None: conn.close()
    conn = None
  _conns[k] = conn
  return conn


def _digest(src: str) -> str: return hashlib.sha256(src.encode()).hexdigest()


def _cache_get(key: str, src: str) -> bytes | None:
  path = cache_path()
  with _lock:
    if (conn := _connect(path)) is None: return None
    try: row = conn.execute(f"SELECT lib FROM {_TABLE} WHERE compiler = ? AND src_sha256 = ?", (key, _digest(src))).fetchone()
    except sqlite3.Error as e:
      _disable(path, e)
      return None
  return bytes(row[0]) if row is not None else None


def _cache_put(key: str, src: str, lib: bytes) -> None:
  path = cache_path()
  with _lock:
    if (conn := _connect(path)) is None: return
    try: conn.execute(f"INSERT OR REPLACE INTO {_TABLE} (compiler, src_sha256, lib) VALUES (?, ?, ?)", (key, _digest(src), lib))
    except sqlite3.Error as e: _disable(path, e)
