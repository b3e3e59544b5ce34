"""Shared by the cache robustness tests: run the child in a fresh process, edit cache entries behind plugrad's back."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXPECTED = "RESULT 56.0 4194304.0"
PATHS = ["llvm", "c"]  # CPU_LLVM=1 (the default: ELF objects linked by ORC) and CPU_LLVM=0 (shared objects via dlopen)


def have_llvm() -> bool:
  import importlib.util
  return importlib.util.find_spec("llvmlite") is not None


def run_child(cache: Path, path: str, timeout: float = 120) -> subprocess.CompletedProcess:
  env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
  env.update(PLUGRAD_CACHE_DIR=str(cache), CACHE="1", CPU_LLVM="1" if path == "llvm" else "0", THREADS="2", DEV="CPU", CPU_TIER="0")
  return subprocess.run([sys.executable, "-m", "tests.robustness.child"], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def result(res: subprocess.CompletedProcess) -> tuple[str, list[str]]:
  """(the RESULT line, the warnings) of a child that must have exited normally."""
  assert res.returncode == 0, f"child exited with {res.returncode}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
  lines = res.stdout.splitlines()
  return next((ln for ln in lines if ln.startswith("RESULT")), ""), [ln for ln in lines if ln.startswith("WARNING")]


def edit_entries(cache: Path, change: Callable[[bytes], bytes]) -> int:
  """Replace every compile cache entry's binary by `change(binary)`, leaving its HMAC alone; the count changed."""
  conn = sqlite3.connect(cache / "cache.db", isolation_level=None)
  try:
    rows = conn.execute("SELECT rowid, lib FROM compile_v2").fetchall()
    for rowid, lib in rows: conn.execute("UPDATE compile_v2 SET lib = ? WHERE rowid = ?", (change(bytes(lib)), rowid))
  finally: conn.close()
  return len(rows)


FOREIGN_C = r"""
#include <stdio.h>
__attribute__((constructor)) static void plugrad_test_foreign(void) { FILE *f = fopen("MARKER", "w"); if (f) { fputs("ran", f); fclose(f); } }
void not_a_kernel(void) {}
"""


def foreign_library(tmp: Path, marker: Path) -> bytes:
  """A valid shared library whose constructor writes `marker`: it must never be loaded."""
  src = tmp / "foreign.c"
  src.write_text(FOREIGN_C.replace("MARKER", str(marker)))
  cc = os.environ.get("CC", "cc")
  subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp / "foreign.so"), str(src)], check=True, capture_output=True)
  return (tmp / "foreign.so").read_bytes()
