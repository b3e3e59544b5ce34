"""Process replay: record every kernel the codegen builds while a command runs, regenerate them later, diff the code.

    python -m plugrad replay record --db FILE -- CMD ...     run CMD with PLUGRAD_REPLAY_DB=FILE (inherited by children)
    python -m plugrad replay check --db FILE [--device NAME] [--allow-change]

Recording hooks `get_program` through plugrad/trace.py: each new (kernel AST, renderer, actions asked for, settings) is
stored once in sqlite with the source and actions it produced. `check` runs get_program again on each at the current
tree, under the recorded settings, and prints a unified diff per kernel whose applied actions or source changed; exit
1 if any did (0 with --allow-change). docs/replay.md.
"""
from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import pickle
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from plugrad.helpers import Context, ContextVar, SettingsError

SCHEMA = 1
# settings that change what the codegen builds; the others (DEBUG, caches, the JIT, scheduling flags) are left out
# of a kernel's key, so that one kernel recorded under two of them is stored once
_IGNORED = frozenset({"DEBUG", "CACHE", "PLUGRAD_LRU", "JIT", "JIT_BATCH_SIZE", "SCHEDULE_CACHE", "SPLIT_REDUCE", "RECOMPUTE_MAX", "ROW_FUSE"})
_conns: dict[str, sqlite3.Connection] = {}
_lock = threading.Lock()


class ReplayError(RuntimeError):
  """A replay database that cannot be used (missing, not one, or of a newer schema)."""


# ---- the kernel AST as bytes (plugrad/uop/serial.py)

def dumps_ast(ast: Any) -> bytes:
  from plugrad.uop.serial import dumps_uop
  return dumps_uop(ast)


def loads_ast(blob: bytes) -> Any:
  from plugrad.uop.serial import loads_uop
  return loads_uop(blob)


# ---- the database

def connect(path: str, create: bool = False) -> sqlite3.Connection:
  if not create and not os.path.exists(path):
    raise ReplayError(f"no replay database at {path!r}: record one with python -m plugrad replay record --db {path} -- CMD")
  con = sqlite3.connect(path, timeout=60)
  try:
    con.execute("PRAGMA journal_mode=WAL")  # many test workers write at once
    con.execute("CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v TEXT)")
    con.execute("CREATE TABLE IF NOT EXISTS kernels (key TEXT PRIMARY KEY, name TEXT, device TEXT, renderer TEXT, emulate TEXT, ast BLOB, "
                "opts BLOB, settings TEXT, source TEXT, applied TEXT, created REAL, applied_opts BLOB)")
    con.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA),))
    con.commit()
  except sqlite3.DatabaseError as e:
    con.close()
    raise ReplayError(f"{path!r} is not a replay database: {e}") from None
  if (row := con.execute("SELECT v FROM meta WHERE k='schema'").fetchone()) is None or int(row[0]) > SCHEMA:
    raise ReplayError(f"{path!r} has replay schema {row and row[0]}; this plugrad reads up to {SCHEMA}: upgrade plugrad")
  return con


def _settings(rec_settings: dict[str, Any]) -> dict[str, Any]:
  return {k: v for k, v in sorted(rec_settings.items()) if k not in _IGNORED and isinstance(v, (int, float, str))}


def record_kernel(path: str, rec: Any) -> None:
  """Store one get_program (a trace.KernelRecord) in the database at `path` (the hook PLUGRAD_REPLAY_DB installs)."""
  from plugrad.trace import renderer_id
  p, r = rec.program, rec.renderer
  ast, opts = dumps_ast(rec.ast), pickle.dumps(rec.opts, protocol=4)
  settings = json.dumps(_settings(rec.settings))
  emulate = getattr(r, "emulate", None)
  key = hashlib.sha256(b"\0".join([ast, opts, settings.encode(), renderer_id(r).encode(), r.device.encode(), str(emulate).encode()])).hexdigest()
  with _lock:
    if (con := _conns.get(path)) is None: con = _conns[path] = connect(path, create=True)
    con.execute("INSERT OR IGNORE INTO kernels VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", (key, p.name, r.device, renderer_id(r), emulate, ast, opts,
                settings, p.source, _actions(p.applied_opts), time.time(), pickle.dumps(tuple(p.applied_opts), protocol=4)))
    con.commit()


def _actions(opts: Sequence[Any]) -> str: return "[" + ", ".join(repr(o) for o in opts) + "]"


# ---- regenerating

def _renderer(device: str, renderer: str, emulate: str | None, cache: dict[tuple[str, str | None], Any]) -> tuple[Any, str | None]:
  """The renderer to regenerate with, or None and why not."""
  from plugrad.device.registry import Device
  from plugrad.trace import renderer_id
  if (device, emulate) not in cache:
    try:
      r = Device.offline(device).renderer
      if getattr(r, "emulate", None) != emulate: r = type(r)(r.device, emulate=emulate)  # e.g. PYTHON emulating CUDA
      cache[(device, emulate)] = r
    except Exception as e: cache[(device, emulate)] = f"{type(e).__name__}: {e}"
  r = cache[(device, emulate)]
  if isinstance(r, str): return None, f"no renderer for {device}: {r}"
  if renderer_id(r) != renderer: return None, f"{device} renders with {renderer_id(r)} here, the kernel was recorded with {renderer}"
  return r, None


def regenerate(row: sqlite3.Row | tuple, renderer: Any) -> tuple[str, str]:
  """(applied actions, source) of a recorded kernel built again at the current tree, under its recorded settings."""
  from plugrad.codegen import get_program
  settings = json.loads(row[7])
  opts = pickle.loads(row[6])
  if settings.get("BEAM", 0) >= 1:  # BEAM's choice is timing-dependent: replay the actions it chose, not the search
    if opts is None: opts = pickle.loads(row[11])
    settings["BEAM"] = 0
  known = {k: v for k, v in settings.items() if k in ContextVar._registry}
  with Context(**known):
    p = get_program(loads_ast(row[5]), renderer, opts)
  return _actions(p.applied_opts), p.source


def check(path: str, device: str | None = None, max_diffs: int = 50, out: Any = None) -> tuple[int, int, int, list[str]]:
  """Regenerate every kernel in the database (only those recorded for `device`, when given); print a unified diff per
  changed one to `out`. Returns (compared, changed, skipped, skip reasons)."""
  out = out or sys.stdout
  con = connect(path)
  q = "SELECT * FROM kernels" + (" WHERE device = ?" if device else "") + " ORDER BY created, key"
  rows = con.execute(q, (device.upper(),) if device else ()).fetchall()
  con.close()
  cache: dict[tuple[str, str | None], Any] = {}
  compared = changed = skipped = 0
  reasons: dict[str, int] = {}
  for row in rows:
    renderer, why = _renderer(row[2], row[3], row[4], cache)
    if renderer is None:
      skipped += 1
      reasons[why or ""] = reasons.get(why or "", 0) + 1
      continue
    compared += 1
    try: actions, source = regenerate(row, renderer)
    except Exception as e: actions, source = "", f"get_program raised {type(e).__name__}: {e}"
    if actions == row[9] and source == row[8]: continue
    changed += 1
    if changed <= max_diffs:
      before = [f"// actions: {row[9]}", *row[8].splitlines()]
      after = [f"// actions: {actions}", *source.splitlines()]
      print(f"=== kernel {row[1]} on {row[2]} changed (key {row[0][:12]})", file=out)
      for line in difflib.unified_diff(before, after, f"{row[1]} (recorded)", f"{row[1]} (now)", lineterm=""): print(line, file=out)
  if changed > max_diffs: print(f"... and {changed - max_diffs} more changed kernels (--max-diffs)", file=out)
  return compared, changed, skipped, [f"{n} skipped: {w}" for w, n in reasons.items()]


# ---- the CLI (python -m plugrad replay ...)

def add_parser(sub: Any) -> None:
  rp = sub.add_parser("replay", help="process replay: record every kernel a command builds, regenerate them now and diff (docs/replay.md)")
  rs = rp.add_subparsers(dest="replay_command", required=True)
  r = rs.add_parser("record", help="run CMD recording every get_program input to the database (child processes too)")
  r.add_argument("--db", required=True, help="the sqlite file to record into (created if missing; kernels already in it are kept)")
  r.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command to run, after --")
  c = rs.add_parser("check", help="regenerate every recorded kernel at the current tree; a unified diff per changed one; exit 1 if any")
  c.add_argument("--db", required=True, help="a database written by `replay record`")
  c.add_argument("--device", default=None, help="only the kernels recorded for this device (e.g. CPU, PYTHON)")
  c.add_argument("--allow-change", action="store_true", help="exit 0 even when kernels changed (the diffs are still printed)")
  c.add_argument("--max-diffs", type=int, default=50, help="print at most this many diffs (default 50)")


def _count(path: str) -> int:
  if not os.path.exists(path): return 0
  con = connect(path)
  try: return int(con.execute("SELECT COUNT(*) FROM kernels").fetchone()[0])
  finally: con.close()


def run_cli(args: argparse.Namespace) -> int:
  try:
    if args.replay_command == "record":
      cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
      if not cmd:
        print("plugrad replay record: give the command to run after --, e.g. replay record --db k.db -- python -m pytest tests/x", file=sys.stderr)
        return 2
      db = os.path.abspath(args.db)
      connect(db, create=True).close()
      before = _count(db)
      rc = subprocess.call(cmd, env={**os.environ, "PLUGRAD_REPLAY_DB": db})
      print(f"replay: recorded {_count(db) - before} new kernels into {db} ({_count(db)} in all); the command exited {rc}")
      return rc
    compared, changed, skipped, reasons = check(args.db, args.device, args.max_diffs)
    print(f"replay: {compared} kernels compared, {changed} changed, {skipped} skipped" + "".join(f"\n  {r}" for r in reasons))
    if compared == 0 and skipped: return 2  # nothing could be checked: not a pass
    return 1 if changed and not args.allow_change else 0
  except (ReplayError, SettingsError) as e:
    print(f"plugrad replay: {e}", file=sys.stderr)
    return 2
