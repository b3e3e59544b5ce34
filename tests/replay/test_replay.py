"""Process replay (plugrad/replay.py): record every get_program of a command, regenerate at the current tree, diff."""
import os
import sqlite3
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from plugrad import Tensor
from plugrad.engine.schedule import create_schedule
from plugrad.replay import ReplayError, check, connect, dumps_ast, loads_ast

PROGRAM = "from plugrad import Tensor\na = Tensor.arange(48).reshape(6, 8).float()\nprint(((a * 2 + 1).sum(1) + a.max()).numpy())\n"
# a deliberate renderer change, planted the way a code change would land: the PYTHON renderer writes MUL as MULX
PLANT = textwrap.dedent("""
  import sys
  from plugrad.builtin.python_renderer import PythonRenderer
  render = PythonRenderer.render
  PythonRenderer.render = lambda self, p: render(self, p).replace(" MUL ", " MULX", 1)
  from plugrad.__main__ import main
  sys.exit(main(sys.argv[1:]))
""")


def _env(**kw):
  env = {k: v for k, v in os.environ.items() if k not in ("VIZ", "DEBUG", "PLUGRAD_REPLAY_DB")}
  return {**env, "DEV": "PYTHON", "SPEC": "1", **kw}


def _cli(*args, plant=False, env=None):
  cmd = [sys.executable, "-c", PLANT, *args] if plant else [sys.executable, "-m", "plugrad", *args]
  return subprocess.run(cmd, env=env or _env(), capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def db(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("replay") / "kernels.db")
  # the command runs two Python children: both record (the database path is inherited through the environment)
  out = _cli("replay", "record", "--db", path, "--", "sh", "-c", f'{sys.executable} -c "$0" && {sys.executable} -c "$1"', PROGRAM,
             PROGRAM.replace("reshape(6, 8)", "reshape(4, 12)"))
  assert out.returncode == 0, out.stderr
  assert "new kernels into" in out.stdout
  return path


def test_record_stores_every_kernel_of_every_child(db):
  con = connect(db)
  rows = con.execute("SELECT name, device, source, applied FROM kernels").fetchall()
  con.close()
  assert {r[1] for r in rows} == {"PYTHON"} and all(r[2] for r in rows)
  names = {r[0] for r in rows}
  assert {"r_6", "r_4"} <= names, names  # the row sums of both children (6x8 and 4x12)


def test_unchanged_tree_gives_zero_diffs(db):
  out = _cli("replay", "check", "--db", db)
  assert out.returncode == 0, out.stdout + out.stderr
  n = len(sqlite3.connect(db).execute("SELECT key FROM kernels").fetchall())
  assert f"replay: {n} kernels compared, 0 changed, 0 skipped" in out.stdout
  assert "---" not in out.stdout


def test_a_planted_renderer_change_is_detected_and_shown(db):
  out = _cli("replay", "check", "--db", db, plant=True)
  assert out.returncode == 1, out.stdout + out.stderr
  assert "changed" in out.stdout and "(recorded)" in out.stdout and "(now)" in out.stdout
  minus = [ln for ln in out.stdout.splitlines() if ln.startswith("-") and " MUL " in ln]
  plus = [ln for ln in out.stdout.splitlines() if ln.startswith("+") and " MULX" in ln]
  assert minus and plus  # the unified diff shows the old and the new line
  changed = int(out.stdout.split(" changed,")[0].rsplit(", ", 1)[1])
  assert changed >= 1
  allowed = _cli("replay", "check", "--db", db, "--allow-change", plant=True)
  assert allowed.returncode == 0 and f"{changed} changed" in allowed.stdout


def test_device_filter_and_skips(db, tmp_path):
  out = _cli("replay", "check", "--db", db, "--device", "CPU")
  assert out.returncode == 0 and "replay: 0 kernels compared, 0 changed, 0 skipped" in out.stdout
  # a kernel recorded with a renderer this tree does not have is skipped with the reason, and a check that compared
  # nothing is not a pass
  other = str(tmp_path / "other.db")
  con = sqlite3.connect(db)
  rows = con.execute("SELECT * FROM kernels").fetchall()
  con.close()
  dst = connect(other, create=True)
  dst.executemany("INSERT INTO kernels VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", [(r[0], r[1], r[2], "somewhere.OtherRenderer", *r[4:]) for r in rows])
  dst.commit()
  dst.close()
  out = _cli("replay", "check", "--db", other)
  assert out.returncode == 2 and "skipped: PYTHON renders with" in out.stdout and "OtherRenderer" in out.stdout


def test_bad_databases(tmp_path):
  out = _cli("replay", "check", "--db", str(tmp_path / "missing.db"))
  assert out.returncode == 2 and "no replay database" in out.stderr
  (tmp_path / "junk.db").write_bytes(b"this is not sqlite at all" * 100)
  out = _cli("replay", "check", "--db", str(tmp_path / "junk.db"))
  assert out.returncode == 2 and "is not a replay database" in out.stderr
  with pytest.raises(ReplayError): check(str(tmp_path / "missing.db"))
  out = _cli("replay", "record", "--db", str(tmp_path / "x.db"))
  assert out.returncode == 2 and "give the command" in out.stderr


def test_record_returns_the_commands_exit_status(tmp_path):
  out = _cli("replay", "record", "--db", str(tmp_path / "x.db"), "--", sys.executable, "-c", "raise SystemExit(3)")
  assert out.returncode == 3 and "recorded 0 new kernels" in out.stdout


def test_ast_round_trip_is_the_same_uop():
  t = Tensor(np.ones((5, 7), np.float32)).contiguous().sum(1) * 2
  for it in create_schedule(t.uop)[0]:
    if it.kind == "kernel": assert loads_ast(dumps_ast(it.ast)) is it.ast  # hash-consed: rebuilt, it is the same object
