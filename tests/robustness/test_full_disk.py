"""Full and read-only disks: the cache secret and the BEAM cache leave no temporary file behind whatever write fails,
a secret that could not be made is not retried on every lookup, and the C compiler's own message ("No space left on
device") reaches the error. Failures are injected where a real write would fail (the write, the link, the rename), and
a real full filesystem (a 64 KiB tmpfs) is used where this process may mount one."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plugrad import Tensor, diskcache
from plugrad.codegen.opt import Opt, OptOps, Scheduler, search
from plugrad.device.registry import Device
from plugrad.engine.schedule import create_schedule


def enospc(*_: Any, **__: Any) -> Any: raise OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
  d = tmp_path / "cache"
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(d))
  monkeypatch.setattr(diskcache, "_secrets", {})
  monkeypatch.setattr(diskcache, "_no_secret", set())
  monkeypatch.setattr(diskcache, "_warned", set())
  yield d


def litter(d: Path) -> list[str]: return sorted(p.name for p in d.rglob("*.tmp"))


@pytest.mark.parametrize("fail", ["write", "short_write", "link"])
def test_failed_secret_write_leaves_nothing_and_is_remembered(cache: Path, monkeypatch: pytest.MonkeyPatch, fail: str):
  d = diskcache.secure_dir()
  assert d is not None
  opens: list[str] = []
  real_open = os.open
  def counting_open(path: Any, *a: Any, **kw: Any) -> int:
    opens.append(str(path))
    return real_open(path, *a, **kw)
  monkeypatch.setattr(diskcache.os, "open", counting_open)
  if fail == "write": monkeypatch.setattr(diskcache.os, "write", enospc)
  if fail == "short_write": monkeypatch.setattr(diskcache.os, "write", lambda fd, data: 0)
  if fail == "link": monkeypatch.setattr(diskcache.os, "link", enospc)
  with pytest.warns(diskcache.CacheWarning, match="has no usable secret .*(No space left on device|is the disk full)"):
    assert diskcache.secret(d) is None
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    for _ in range(5): assert diskcache.secret(d) is None  # remembered: no new attempt, no new warning
  assert len(opens) == 1 and litter(d) == [] and not (d / diskcache.SECRET_NAME).exists()


def test_secret_is_made_once_the_disk_is_fine(cache: Path):
  d = diskcache.secure_dir()
  assert d is not None and (key := diskcache.secret(d)) is not None and len(key) == diskcache.SECRET_BYTES
  assert litter(d) == [] and diskcache.secret(d) == key


@pytest.fixture
def kernel(cache: Path) -> Scheduler:
  t = (Tensor.arange(64).float().reshape(8, 8) * 3).sum(axis=1)
  items, _ = create_schedule(t.uop)
  return Scheduler([it for it in items if it.kind == "kernel"][-1].ast, Device["CPU"].renderer)


@pytest.mark.parametrize("fail", ["write_bytes", "replace"])
def test_failed_beam_store_leaves_no_tmp(kernel: Scheduler, cache: Path, monkeypatch: pytest.MonkeyPatch, fail: str):
  real = Path.write_bytes
  def full_write(self: Path, data: bytes) -> int:  # what a full disk does: the file is created, its bytes are not written
    real(self, b"")
    return enospc()
  monkeypatch.setattr(Path, fail, full_write if fail == "write_bytes" else enospc)
  search._store(kernel, 2, [Opt(OptOps.UPCAST, 0, 2)])
  monkeypatch.undo()
  assert litter(cache) == [] and search.cached_actions(kernel, 2) is None


def test_eviction_removes_stale_tmp_files_of_dead_writers(tmp_path: Path):
  d = tmp_path / "beam"
  d.mkdir()
  (d / "a.json").write_bytes(b"x")
  for name, age in (("old.1.tmp", search._STALE_TMP_S + 60), ("fresh.2.tmp", 1)):
    (d / name).write_bytes(b"")
    os.utime(d / name, (os.path.getmtime(d / name) - age,) * 2)
  search._evict(d, 1 << 20)
  assert sorted(p.name for p in d.iterdir()) == ["a.json", "fresh.2.tmp"]  # a writer may still rename the fresh one


@pytest.fixture
def full_fs(tmp_path: Path) -> Iterator[Path]:
  """A mounted 64 KiB tmpfs holding an empty directory `cache`, then filled to the last byte; skipped where this process
  may not mount one."""
  mnt = tmp_path / "full"
  mnt.mkdir()
  if shutil.which("mount") is None or (hasattr(os, "geteuid") and os.geteuid() != 0):
    pytest.skip("mounting a small tmpfs needs root and mount(8); the injected-failure tests cover the same paths")
  res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(mnt)], capture_output=True, text=True)
  if res.returncode != 0: pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
  try:
    (mnt / "cache").mkdir(mode=0o700)
    with open(mnt / "fill", "wb", buffering=0) as f:
      try:
        while f.write(b"\0" * 512): pass
      except OSError: pass
    yield mnt
  finally: subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_real_full_cache_disk(full_fs: Path, monkeypatch: pytest.MonkeyPatch):
  d = full_fs / "cache"
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(d))
  monkeypatch.setattr(diskcache, "_secrets", {})
  monkeypatch.setattr(diskcache, "_no_secret", set())
  monkeypatch.setattr(diskcache, "_warned", set())
  with pytest.warns(diskcache.CacheWarning, match="No space left on device"): assert diskcache.secret(d) is None
  assert diskcache.secret(d) is None and litter(full_fs) == []


def test_compiler_message_survives_a_full_tmpdir(full_fs: Path, monkeypatch: pytest.MonkeyPatch):
  toolchain = pytest.importorskip("plugrad_cpu.toolchain")
  cc = toolchain.find_cc()
  if cc is None: pytest.skip("no C compiler")
  import tempfile
  tempfile.gettempdir()  # Python's own temporary files stay where they were; the compiler's go to the full TMPDIR
  monkeypatch.setenv("TMPDIR", str(full_fs))
  why = toolchain._build_error(list(cc), toolchain.BASE_FLAGS, "int f(void) { return 0; }\n")
  assert why is not None and "No space left on device" in why, why
  from plugrad.errors import DeviceUnavailableError
  with pytest.raises(DeviceUnavailableError, match="cannot build a shared object with .*: .*No space left on device"):
    toolchain._detect.__wrapped__(tuple(cc))
