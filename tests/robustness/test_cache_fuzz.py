"""Random bytes over random compile cache entries, the database file and the secret: each run in a child process
must give the right numbers: never crash, fail, or print a wrong number. Fixed seed, bounded."""
from __future__ import annotations

import random
import shutil
import sqlite3
from pathlib import Path

from tests.robustness.helpers import EXPECTED, PATHS, have_llvm, run_child

TRIALS = 8


def damage(rng: random.Random, cache: Path) -> str:
  target = rng.choice(["entry", "entry", "entry", "database", "secret"])
  if target == "entry":
    conn = sqlite3.connect(cache / "cache.db", isolation_level=None)
    rows = conn.execute("SELECT rowid, lib FROM compile_v2").fetchall()
    rowid, lib = rng.choice(rows)
    lib = bytearray(lib)
    at, n = rng.randrange(len(lib)), rng.randint(1, 256)
    lib[at:at + n] = rng.randbytes(n)
    conn.execute("UPDATE compile_v2 SET lib = ? WHERE rowid = ?", (bytes(lib), rowid))
    conn.close()
    return f"entry {rowid} at {at}+{n}"
  path = cache / ("cache.db" if target == "database" else "secret")
  data = bytearray(path.read_bytes())
  at, n = rng.randrange(len(data)), rng.randint(1, 512)
  data[at:at + n] = rng.randbytes(n)
  path.write_bytes(bytes(data))
  return f"{target} at {at}+{n}"


def test_random_damage_gives_right_numbers_or_typed_errors(tmp_path: Path):
  rng = random.Random(22)
  paths = [p for p in PATHS if p != "llvm" or have_llvm()]
  pristine: dict[str, Path] = {}
  for p in paths:
    pristine[p] = tmp_path / f"pristine-{p}"
    assert run_child(pristine[p], p).stdout.splitlines()[-1] == EXPECTED
  for i in range(TRIALS):
    p = paths[i % len(paths)]
    cache = tmp_path / f"trial-{i}"
    shutil.copytree(pristine[p], cache)
    what = damage(rng, cache)
    res = run_child(cache, p)
    # stricter than "a typed error": a damaged cache is never a reason for a run to fail, and a signal would show here
    assert res.returncode == 0, f"{p}, {what}: rc {res.returncode}\n{res.stderr[-3000:]}"
    lines = res.stdout.splitlines()
    assert EXPECTED in lines and not [ln for ln in lines if ln.startswith("RESULT") and ln != EXPECTED], f"{p}, {what}: {res.stdout}"
