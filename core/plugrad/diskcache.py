"""Integrity of the on-disk caches (the compile cache `cache.db`, the BEAM cache `beam/`): docs/security.md.

A cache entry is code or a decision this process will act on, so a cache directory anyone else can write to is
refused, and every entry carries an HMAC-SHA256 of its bytes under a per-user secret (`secret`, mode 0600, made on
first use) that is checked before the bytes are used: an entry written or damaged by anything but plugrad under this
user's secret is a miss. Refusals never fail a compile: they warn (`CacheWarning`) and run without the cache.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import os
import stat
import threading
import time
import warnings
from pathlib import Path

from plugrad.helpers import cache_dir

SECRET_NAME, SECRET_BYTES = "secret", 32
DEFAULT_CACHE_MB = 1024


class CacheWarning(UserWarning):
  """An on-disk cache was refused, or one of its entries was dropped (damaged, foreign, or failed to load)."""


_warned: set[str] = set()
_secrets: dict[tuple[int, Path], bytes] = {}
_no_secret: set[tuple[int, Path]] = set()  # directories whose secret could not be made or read: not retried per lookup
_lock = threading.Lock()


def warn_once(msg: str) -> None:
  with _lock:
    if msg in _warned: return
    _warned.add(msg)
  warnings.warn(msg, CacheWarning, stacklevel=3)


def warn(msg: str) -> None: warnings.warn(msg, CacheWarning, stacklevel=3)


def _refuse(d: Path, why: str) -> None:
  warn_once(f"plugrad: cache directory {d} {why}; caching is off for this process (fix it, or set PLUGRAD_CACHE_DIR)")


def secure_dir() -> Path | None:
  """`cache_dir()`, made mode 0700 when missing; None (with a CacheWarning, once) when it cannot be made, is not a
  directory, belongs to another user, or is group/world-writable: another user could plant entries in it."""
  d = cache_dir()
  try:
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.stat(d)
  except OSError as e:
    _refuse(d, f"cannot be used ({type(e).__name__}: {e})")
    return None
  if not stat.S_ISDIR(st.st_mode):
    _refuse(d, "is not a directory")
    return None
  if hasattr(os, "getuid") and st.st_uid != os.getuid():
    _refuse(d, f"belongs to uid {st.st_uid}, not to this user (uid {os.getuid()})")
    return None
  if st.st_mode & 0o022:
    _refuse(d, f"is group- or world-writable (mode {stat.S_IMODE(st.st_mode):o})")
    return None
  if st.st_mode & 0o077:  # made before this check with the umask's 0755: nothing foreign can be in it, tighten it
    try: os.chmod(d, 0o700)
    except OSError: pass
  return d


def _read_secret(p: Path) -> bytes | None:
  fd = os.open(p, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
  try:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077 or (hasattr(os, "getuid") and st.st_uid != os.getuid()) or st.st_size != SECRET_BYTES:
      return None
    data = os.read(fd, SECRET_BYTES + 1)
  finally: os.close(fd)
  return data if len(data) == SECRET_BYTES else None


def secret(d: Path) -> bytes | None:
  """The per-user HMAC key kept in cache directory `d` (made on first use); None (warned) when it is not private or
  cannot be made (a full or read-only disk). A failure is remembered for this process, so each cache lookup does not
  try again (and leave another file behind)."""
  k = (os.getpid(), d)
  if (s := _secrets.get(k)) is not None: return s
  if k in _no_secret: return None
  p = d / SECRET_NAME
  try:
    if not os.path.lexists(p): _write_secret(d, p)
    s = _read_secret(p)
  except OSError as e:
    _no_secret.add(k)
    _refuse(d, f"has no usable secret {p} ({type(e).__name__}: {e})")
    return None
  if s is None:
    _no_secret.add(k)
    _refuse(d, f"has a secret {p} that is not a private {SECRET_BYTES}-byte file of this user (delete it to make a new one)")
    return None
  _secrets[k] = s
  return s


def _write_secret(d: Path, p: Path) -> None:
  """Make the secret: written aside and linked into place, so a concurrent process sees either no secret or all of
  it; the file aside is removed whatever fails (a full disk fails the write, the link or even the close)."""
  tmp = d / f"{SECRET_NAME}.{os.getpid()}.{time.monotonic_ns()}.tmp"
  fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
  try:
    try:
      data = os.urandom(SECRET_BYTES)
      if (n := os.write(fd, data)) != len(data): raise OSError(errno.ENOSPC, f"wrote {n} of the secret's {len(data)} bytes (is the disk full?)")
    finally: os.close(fd)
    try: os.link(tmp, p)
    except FileExistsError: pass  # another process made it first: theirs is used
  finally:
    with contextlib.suppress(OSError): os.unlink(tmp)


def digest(key: bytes, *parts: bytes) -> bytes:
  """HMAC-SHA256 of `parts` (each length-prefixed, so no two different part lists sign the same bytes)."""
  h = hmac.new(key, digestmod=hashlib.sha256)
  for part in parts: h.update(len(part).to_bytes(8, "little") + part)
  return h.digest()


def valid(key: bytes, mac: bytes, *parts: bytes) -> bool: return hmac.compare_digest(digest(key, *parts), mac)


def cap_bytes() -> int:
  """CACHE_MB (default 1024) in bytes: each cache (compile, BEAM) evicts its least recently used entries past it."""
  raw = os.environ.get("CACHE_MB", "").strip()
  try: mb = float(raw) if raw else DEFAULT_CACHE_MB
  except ValueError: raise ValueError(f"CACHE_MB must be a number of megabytes (default {DEFAULT_CACHE_MB}), got {raw!r}") from None
  if not mb > 0: raise ValueError(f"CACHE_MB must be a positive number of megabytes (default {DEFAULT_CACHE_MB}), got {raw!r}")
  return int(mb * (1 << 20))
