"""The persistent program cache (get_program's `store`, the compile cache's ProgramCache): a warm process takes the
rendered PROGRAM instead of lowering the kernel again, and anything that could make another program misses."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import plugrad.codegen as codegen
from plugrad.codegen import get_program, store_key
from plugrad.codegen.opt import Opt, OptOps
from plugrad.device.compiler import PROGRAMS
from plugrad.device.registry import Device
from plugrad.engine.schedule import create_schedule
from plugrad.helpers import Context
from plugrad.tensor.tensor import Tensor


class DictStore:
  def __init__(self) -> None: self.d: dict[str, bytes] = {}
  def get(self, key: str) -> bytes | None: return self.d.get(key)
  def put(self, key: str, blob: bytes) -> None: self.d[key] = blob


def _ast():
  rng = np.random.default_rng(0)
  a, b = (Tensor(rng.standard_normal(s).astype(np.float32)) for s in ((8, 12), (12, 5)))
  items, _ = create_schedule((a @ b).relu().uop)
  return [it for it in items if it.kind == "kernel"][-1].ast


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
  monkeypatch.setattr(codegen, "_cache", {})  # as in a new process: nothing rendered in memory
  yield


def test_a_stored_program_is_taken_without_lowering(fresh: None, monkeypatch: pytest.MonkeyPatch):
  store, ast, r = DictStore(), _ast(), Device["CPU"].renderer
  made = get_program(ast, r, store=store)
  assert len(store.d) == 1
  monkeypatch.setattr(codegen, "_cache", {})
  def refuse(*a: object) -> None: raise AssertionError("lowered again")
  monkeypatch.setattr(codegen, "lower", refuse)
  got = get_program(ast, r, store=store)
  assert got is made  # hash-consed: rebuilt from the bytes, the same UOp
  assert got.source == made.source and got.applied_opts == made.applied_opts


def test_anything_that_makes_another_program_misses(fresh: None, monkeypatch: pytest.MonkeyPatch):
  ast, r = _ast(), Device["CPU"].renderer
  base = store_key(ast, r, None)
  assert store_key(ast, r, None) == base
  assert store_key(ast, r, [Opt(OptOps.UPCAST, 1, 4)]) != base
  with Context(NOOPT=1): assert store_key(ast, r, None) != base
  monkeypatch.setattr(r, "vector_width", r.vector_width * 2)  # another CPU
  assert store_key(ast, r, None) != base
  monkeypatch.undo()
  from plugrad.codegen.opt import heuristic
  monkeypatch.setattr(heuristic, "PACK_BUDGET", heuristic.PACK_BUDGET + 1)
  assert store_key(ast, r, None) != base
  monkeypatch.undo()
  monkeypatch.setattr(codegen, "_code_digests", {"plugrad": "other code", "plugrad_cpu": "x", "plugrad_llvm": "x"})
  assert store_key(ast, r, None) != base
  assert store_key(ast, Device["PYTHON"].renderer, None) != base


def test_bad_bytes_and_printing_or_tracing_bypass_the_store(fresh: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
  store, ast, r = DictStore(), _ast(), Device["CPU"].renderer
  key = store_key(ast, r, None)
  store.d[key] = b"not a pickle"
  prg = get_program(ast, r, store=store)  # made again, and stored
  assert prg.op.name == "PROGRAM" and store.d[key] != b"not a pickle"
  monkeypatch.setattr(codegen, "_cache", {})
  with Context(DEBUG=2): get_program(ast, r, store=store)
  assert "codegen " in capsys.readouterr().out  # DEBUG=2 still shows the kernel's actions: made, not taken


def test_the_engine_keeps_programs_in_the_compile_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh: None):
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(tmp_path / "cache"))
  ast, r = _ast(), Device["CPU"].renderer
  with Context(CACHE=1):
    made = get_program(ast, r, store=PROGRAMS)
    assert PROGRAMS.get(store_key(ast, r, None)) is not None
    monkeypatch.setattr(codegen, "_cache", {})
    assert get_program(ast, r, store=PROGRAMS) is made
  with Context(CACHE=0): assert PROGRAMS.get(store_key(ast, r, None)) is None


def test_a_warm_realize_gives_the_same_numbers(fresh: None, monkeypatch: pytest.MonkeyPatch):
  import plugrad.engine.schedule as schedule
  rng = np.random.default_rng(3)
  a, b = rng.standard_normal((9, 7)).astype(np.float32), rng.standard_normal((7, 6)).astype(np.float32)
  want = np.maximum(a @ b, 0).sum(0)
  first = (Tensor(a) @ Tensor(b)).relu().sum(0).numpy()
  monkeypatch.setattr(codegen, "_cache", {})
  monkeypatch.setattr(schedule, "_cache", type(schedule._cache)())
  again = (Tensor(a) @ Tensor(b)).relu().sum(0).numpy()
  np.testing.assert_allclose(first, want, rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(again, first)


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_the_key_is_the_same_in_another_process(device: str):
  """Nothing per-process in the key: a renderer's sets (capabilities, dtypes) iterate in the per-process string-hash
  order, and a repr with an address would never match again."""
  import os
  import subprocess
  import sys
  code = ("import numpy as np; from plugrad.tensor.tensor import Tensor; from plugrad.engine.schedule import create_schedule; "
          "from plugrad.device.registry import Device; from plugrad.codegen import store_key; "
          "t = (Tensor(np.ones((8, 12), np.float32), device=DEV) @ Tensor(np.ones((12, 5), np.float32), device=DEV)).relu(); "
          "ast = [i for i in create_schedule(t.uop)[0] if i.kind == 'kernel'][-1].ast; print(store_key(ast, Device[DEV].renderer, None))")
  keys = {subprocess.run([sys.executable, "-c", "DEV = " + repr(device) + "; " + code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": seed}).stdout.strip() for seed in ("1", "2")}
  assert len(keys) == 1 and len(next(iter(keys))) == 64, keys
