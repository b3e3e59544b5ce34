"""Cache integrity (docs/security.md): foreign, corrupt and truncated compile cache entries on both CPU paths, a cached
binary that fails to load, hostile cache directories and secrets, a damaged database, a hostile BEAM cache file, and
the CACHE_MB size cap. Anything that would load a damaged binary runs in a child process (tests/robustness/child.py)."""
from __future__ import annotations

import errno
import os
import sqlite3
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from plugrad import diskcache
from plugrad.device.compiler import Compiler
from plugrad.diskcache import CacheWarning
from plugrad.helpers import Context
from tests.robustness.helpers import EXPECTED, PATHS, edit_entries, foreign_library, have_llvm, result, run_child


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
  d = tmp_path / "cache"
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(d))
  with Context(CACHE=1): yield d


def cpu_path(path: str) -> str:
  if path == "llvm" and not have_llvm(): pytest.skip("llvmlite is not installed: the CPU device has only the C path")
  return path


def populated(cache: Path, path: str) -> None:
  assert result(run_child(cache, path)) == (EXPECTED, [])
  assert edit_entries(cache, lambda b: b) >= 3  # the kernels and the native pool library


def check_recovers(cache: Path, path: str, what: str) -> None:
  """The next run gives the right numbers, warning about each dropped entry; the run after it is clean again."""
  line, warns = result(run_child(cache, path))
  assert line == EXPECTED and warns and all(what in w for w in warns), warns
  assert any("native pool" in w for w in warns) and any("kernel 'r_" in w or "kernel 'E_" in w for w in warns), warns
  assert result(run_child(cache, path)) == (EXPECTED, [])  # recompiled and stored


@pytest.mark.parametrize("path", PATHS)
def test_foreign_library_never_runs(cache: Path, tmp_path: Path, path: str):
  populated(cache, cpu_path(path))
  marker = tmp_path / "constructor-ran"
  lib = foreign_library(tmp_path, marker)
  edit_entries(cache, lambda _: lib)
  check_recovers(cache, path, "failed its integrity check")
  assert not marker.exists()


@pytest.mark.parametrize("path", PATHS)
def test_corrupt_entries_are_dropped(cache: Path, path: str):
  populated(cache, cpu_path(path))
  flip = lambda b: b[:len(b) // 2] + bytes(x ^ 0xFF for x in b[len(b) // 2:len(b) // 2 + 64]) + b[len(b) // 2 + 64:]
  edit_entries(cache, flip)
  check_recovers(cache, path, "failed its integrity check")


@pytest.mark.parametrize("path", PATHS)
def test_truncated_entries_are_dropped(cache: Path, path: str):
  populated(cache, cpu_path(path))
  edit_entries(cache, lambda b: b[:len(b) // 3])
  check_recovers(cache, path, "failed its integrity check")


@pytest.mark.parametrize("path", PATHS)
def test_signed_binary_that_fails_to_load_is_recompiled(cache: Path, tmp_path: Path, path: str):
  # a binary with a valid HMAC that cannot be used (here: a library without the kernel's function) is dropped too
  populated(cache, cpu_path(path))
  key = (cache / "secret").read_bytes()
  lib = foreign_library(tmp_path, tmp_path / "constructor-ran")
  conn = sqlite3.connect(cache / "cache.db", isolation_level=None)
  for rowid, compiler, sha in conn.execute("SELECT rowid, compiler, src_sha256 FROM compile_v2").fetchall():
    conn.execute("UPDATE compile_v2 SET lib = ?, mac = ? WHERE rowid = ?", (lib, diskcache.digest(key, compiler.encode(), sha.encode(), lib), rowid))
  conn.close()
  check_recovers(cache, path, "failed to load")


@pytest.mark.parametrize("path", PATHS)
def test_damaged_database_is_rebuilt(cache: Path, path: str):
  populated(cache, cpu_path(path))
  db = cache / "cache.db"
  for suffix in ("-wal", "-shm"): Path(f"{db}{suffix}").unlink(missing_ok=True)
  db.write_bytes(db.read_bytes()[:100] + os.urandom(4000))  # the header survives, the pages do not
  line, warns = result(run_child(cache, path))
  assert line == EXPECTED
  assert (cache / "cache.db.broken").is_file() and any("was damaged" in w for w in warns), warns
  assert result(run_child(cache, path)) == (EXPECTED, [])


class Counting(Compiler):
  cache_key = "robustness-test v1"
  calls = 0

  def compile(self, src: str) -> bytes:
    Counting.calls += 1
    return f"{src}#{Counting.calls}".encode()


def test_load_failure_of_a_cached_binary_recompiles_once(cache: Path):
  Counting.calls = 0
  assert Counting().compile_cached("k", "kern") == b"k#1"
  def load(b: bytes) -> bytes:
    if b == b"k#1": raise OSError("cannot load")
    return b
  with pytest.warns(CacheWarning, match=r"cached binary of kernel 'kern' failed to load \(OSError: cannot load\)"):
    assert Counting().load_cached("k", "kern", load) == b"k#2"
  assert Counting().compile_cached("k", "kern") == b"k#2" and Counting.calls == 2  # the good one replaced it
  def broken(b: bytes) -> bytes: raise OSError("never loads")
  with pytest.raises(OSError, match="never loads"): Counting().load_cached("fresh", "kern", broken)  # a fresh failure is an error
  assert Counting().compile_cached("fresh", "kern") == b"fresh#4"  # and it was not stored


def cached_lib(key: str, src: str) -> bytes | None:
  from plugrad.device.compiler import _cache_get
  return _cache_get(key, src)


@pytest.mark.parametrize("failure", [OSError("libx.so: failed to map segment from shared object"), MemoryError("no room"),
                                     OSError(errno.EMFILE, "Too many open files"), OSError(errno.ENOMEM, "Cannot allocate memory")])
def test_load_failure_from_resource_exhaustion_keeps_the_cached_binary(cache: Path, failure: Exception):
  # what a process at vm.max_map_count sees: every load fails, the binaries are fine
  Counting.calls = 0
  assert Counting().compile_cached("k", "kern") == b"k#1"
  def load(b: bytes) -> bytes: raise failure
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # no "dropped" warning, no recompile
    with pytest.raises(type(failure)): Counting().load_cached("k", "kern", load)
  assert Counting.calls == 1 and cached_lib(Counting.cache_key, "k") == b"k#1"
  assert Counting().load_cached("k", "kern", lambda b: b) == b"k#1"  # once the process has room again, the entry is used


def test_cached_binary_is_kept_when_the_fresh_one_fails_to_load_too(cache: Path):
  # a failure that does not say why: the recompile decides whether the cached binary was at fault
  Counting.calls = 0
  assert Counting().compile_cached("k", "kern") == b"k#1"
  def never(b: bytes) -> bytes: raise OSError("cannot load")
  with pytest.warns(CacheWarning, match="failed to load .*the entry is replaced once the fresh binary loads"):
    with pytest.raises(OSError, match="cannot load"): Counting().load_cached("k", "kern", never)
  assert Counting.calls == 2 and cached_lib(Counting.cache_key, "k") == b"k#1"


def test_new_cache_dir_is_private(cache: Path):
  Counting().compile_cached("x")
  assert (cache.stat().st_mode & 0o777) == 0o700 and ((cache / "secret").stat().st_mode & 0o777) == 0o600


def test_old_cache_dir_is_tightened(cache: Path):
  cache.mkdir(mode=0o755)
  os.chmod(cache, 0o755)
  Counting().compile_cached("x")
  assert (cache.stat().st_mode & 0o777) == 0o700


def refused(cache: Path, why: str) -> None:
  Counting.calls = 0
  with pytest.warns(CacheWarning, match=why):
    Counting().compile_cached("refused")
  Counting().compile_cached("refused")
  assert Counting.calls == 2 and not (cache / "cache.db").exists()  # compiled, never cached


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o722])
def test_writable_cache_dir_is_refused(cache: Path, mode: int):
  cache.mkdir()
  os.chmod(cache, mode)
  refused(cache, "group- or world-writable")


def test_foreign_owned_cache_dir_is_refused(cache: Path, monkeypatch: pytest.MonkeyPatch):
  cache.mkdir(mode=0o700)
  if os.getuid() == 0: os.chown(cache, 12345, 12345)
  else: monkeypatch.setattr(os, "getuid", lambda: 12345)  # this user is not the owner as far as the check can tell
  refused(cache, "belongs to uid")


def test_cache_dir_that_is_a_file_is_refused(cache: Path):
  cache.write_text("not a directory")
  Counting.calls = 0
  with pytest.warns(CacheWarning, match="caching is off"): Counting().compile_cached("file")


@pytest.mark.parametrize("damage", ["public", "short"])
def test_unsafe_secret_is_refused(cache: Path, damage: str):
  cache.mkdir(mode=0o700)
  (cache / "secret").write_bytes(os.urandom(32 if damage == "public" else 5))
  os.chmod(cache / "secret", 0o644 if damage == "public" else 0o600)
  refused(cache, "not a private 32-byte file")


class Sized(Compiler):
  cache_key = "robustness-test sized"
  calls = 0

  def compile(self, src: str) -> bytes:
    Sized.calls += 1
    return src.encode() * (100_000 // len(src))


def test_size_cap_evicts_least_recently_used(cache: Path, monkeypatch: pytest.MonkeyPatch):
  monkeypatch.setenv("CACHE_MB", str(350_000 / (1 << 20)))  # three 100 kB entries fit, four do not
  Sized.calls = 0
  for src in ("aaaa", "bbbb", "cccc"):
    Sized().compile_cached(src)
    time.sleep(0.01)
  Sized().compile_cached("aaaa")  # a hit: now the most recently used
  time.sleep(0.01)
  Sized().compile_cached("dddd")  # evicts bbbb, the least recently used
  assert Sized.calls == 4
  for src in ("aaaa", "cccc", "dddd"): Sized().compile_cached(src)
  assert Sized.calls == 4
  Sized().compile_cached("bbbb")
  assert Sized.calls == 5


@pytest.mark.parametrize("raw", ["x", "0", "-1"])
def test_bad_cache_mb_names_the_variable(monkeypatch: pytest.MonkeyPatch, raw: str):
  monkeypatch.setenv("CACHE_MB", raw)
  with pytest.raises(ValueError, match="CACHE_MB"): diskcache.cap_bytes()
