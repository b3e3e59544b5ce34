"""Compiling ahead (Compiler.concurrent, Compiler.compile_ahead): a schedule's new kernels are compiled on the compile
thread while the engine renders the next ones; results, errors and the cache are as when compiled on the spot."""
from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from plugrad.device.compiler import Compiler
from plugrad.device.registry import Device
from plugrad.errors import CompileError
from plugrad.helpers import Context
from plugrad.tensor.tensor import Tensor


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(tmp_path / "cache"))
  with Context(CACHE=1): yield tmp_path / "cache"


class Recording(Compiler):
  """Upper-cases its source; records the thread of every compile; sources starting with "bad" fail."""
  concurrent = True
  cache_key = "recording v1"

  def __init__(self) -> None: self.threads: list[str] = []

  def compile(self, src: str) -> bytes:
    self.threads.append(threading.current_thread().name)
    if src.startswith("bad"): raise CompileError(f"line 1: cannot compile {src!r}")
    return src.upper().encode()


@pytest.mark.parametrize("caching", [0, 1])
def test_a_job_compiled_ahead_is_taken_once(cache: Path, caching: int):
  c = Recording()
  with Context(CACHE=caching):
    job = c.compile_ahead("abc", "k")
    assert job is not None and job.result() == b"ABC"
    assert c.compile_ahead("abc", "k") is job  # asked twice: one job
    assert c.load_cached("abc", "k", lambda lib: lib) == b"ABC"
    assert len(c.threads) == 1 and c.threads[0].startswith("plugrad-compile")
    assert c.compile_cached("abc", "k") == b"ABC"  # taken: from the cache now, or compiled again here without one
  assert c.threads[1:] == ([] if caching else [threading.current_thread().name])


def test_a_cached_source_is_not_compiled_ahead(cache: Path):
  c = Recording()
  assert c.compile_cached("xyz", "k") == b"XYZ"
  job = c.compile_ahead("xyz", "k")
  assert job is not None and job.result() is None  # the cache has it: nothing compiled
  assert c.load_cached("xyz", "k", lambda lib: lib) == b"XYZ"
  assert len(c.threads) == 1


def test_a_compile_error_ahead_is_raised_where_the_kernel_loads(cache: Path):
  c = Recording()
  c.compile_ahead("bad source", "r_broken")
  with pytest.raises(CompileError, match="r_broken"): c.load_cached("bad source", "r_broken", lambda lib: lib)


def test_a_compiler_that_is_not_concurrent_compiles_on_the_spot(cache: Path):
  class Plain(Recording): concurrent = False
  c = Plain()
  assert c.compile_ahead("abc", "k") is None
  assert c.compile_cached("abc", "k") == b"ABC" and c.threads == [threading.current_thread().name]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_ignores_the_parents_jobs(cache: Path):
  c = Recording()
  c.compile_ahead("abc", "k").result()  # type: ignore[union-attr]
  r, w = os.pipe()
  if (pid := os.fork()) == 0:  # the child compiles on its own: the parent's job (and thread) are not its
    try: os.write(w, c.load_cached("abc", "k", lambda lib: lib) + b"|" + ",".join(c.threads).encode())
    finally: os._exit(0)
  os.waitpid(pid, 0)
  got = os.read(r, 1000).split(b"|")
  assert got[0] == b"ABC" and got[1].count(b"plugrad-compile") == 1  # the parent's one; the child's own on its thread


def test_a_schedule_compiles_its_new_kernels_ahead(monkeypatch: pytest.MonkeyPatch):
  compiler = Device["CPU"].compiler
  if not compiler.concurrent: pytest.skip(f"{type(compiler).__name__} is not concurrent")
  threads: list[str] = []
  real = type(compiler).compile
  def spy(self: Compiler, src: str) -> bytes:
    threads.append(threading.current_thread().name)
    return real(self, src)
  monkeypatch.setattr(type(compiler), "compile", spy)
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal((13, 17)).astype(np.float32), rng.standard_normal((17, 11)).astype(np.float32)
  with Context(CACHE=0):
    x, y = Tensor(a), Tensor(b)
    out = ((x @ y).relu().sum(0) + (x.exp().sum(1) @ x)[:11]).numpy()  # several new kernels in one schedule
  np.testing.assert_allclose(out, np.maximum(a @ b, 0).sum(0) + (np.exp(a).sum(1) @ a)[:11], rtol=1e-4, atol=1e-4)
  assert len(threads) >= 2 and all(t.startswith("plugrad-compile") for t in threads), threads
