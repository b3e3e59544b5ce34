"""DEBUG=2 profiling, the tracing hook (plugrad/trace.py) and the VIZ server's endpoints, without a browser."""
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

from plugrad import Context, Tensor, TinyJit, codegen, trace
from plugrad.codegen import get_program
from plugrad.codegen.passes import PASS_NAMES
from plugrad.device.registry import Device
from plugrad.uop.rewrite import graph_rewrite
from plugrad.viz.server import TraceFileError, kernel_list, load_trace, serve_in_thread

RUN_LINE = re.compile(r"^(\S+)\s+(\S+)\s+global \((.*?)\)\s+local \((.*?)\)\s+([\d.]+) us\s+([\d.]+) GFLOPS\s+([\d.]+) GB/s$")
SCRIPT = "from plugrad import Tensor\na = Tensor.arange(64).reshape(8, 8).float()\nprint(((a @ a) + 1).sum().numpy())\n"


def _env(**kw):
  env = {k: v for k, v in os.environ.items() if k not in ("VIZ", "DEBUG", "PLUGRAD_REPLAY_DB", "VIZ_FILE")}
  return {**env, "DEV": "PYTHON", "SPEC": "1", **kw}


@pytest.fixture
def tracing():
  assert not trace.TRACING, "a test left tracing on"
  # a kernel compiled earlier in this worker is a cache hit, which records no codegen stages: start from an empty cache
  codegen._cache.clear()
  t = trace.enable()
  try: yield t
  finally: trace.disable()


def test_debug2_times_every_launch_and_prints_a_summary():
  out = subprocess.run([sys.executable, "-c", SCRIPT], env=_env(DEBUG="2"), capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr
  lines = out.stdout.splitlines()
  runs = [m for ln in lines if (m := RUN_LINE.match(ln))]
  codegen = [ln for ln in lines if ln.startswith("codegen ")]
  assert len(runs) >= len(codegen) >= 2  # every kernel compiled ran at least once, each run on its own timed line
  assert all(float(m[5]) > 0 and m[2] == "PYTHON" for m in runs)
  head = lines.index(next(ln for ln in lines if ln.startswith("plugrad kernel time summary")))
  assert f"{len(runs)} launches" in lines[head]
  rows = lines[head + 2:]
  totals = [float(r.split()[0]) for r in rows]
  assert totals == sorted(totals, reverse=True) and len(rows) == len({(m[1], m[2]) for m in runs})
  assert sum(int(r.split()[2]) for r in rows) == len(runs)  # the summary counts every launch


def test_debug2_times_jit_replays(capsys):
  x = Tensor(np.arange(16, dtype=np.float32)).realize()
  for jit_mode in (2, 1):
    with Context(JIT=jit_mode):
      @TinyJit
      def f(a: Tensor) -> Tensor: return ((a * 2 + 1).sum() + a.max()).realize()
      for _ in range(2): f(x)
      capsys.readouterr()
      with Context(DEBUG=2): got = f(x)
      out = capsys.readouterr().out.splitlines()
      trace._stats.clear()  # the exit summary is this process's: not for the test run
    assert got.item() == pytest.approx(float((np.arange(16) * 2 + 1).sum() + 15))
    kernels = len([ei for ei in f.captured.items if ei.runner is not None])
    if jit_mode == 2: assert len([ln for ln in out if RUN_LINE.match(ln)]) == kernels  # kernel by kernel: one timed line each
    else:
      batched = len(f.captured.steps) < kernels  # the device's graph runner took the batch: one timed line for it
      assert len(out) == len(f.captured.steps) and (not batched or any(" kernels " in ln and " us " in ln for ln in out)), out


def test_trace_records_stages_passes_and_fired_rules(tracing):
  a = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
  got = ((a + 1) * 2).sum(axis=1).numpy()
  assert np.allclose(got, ((np.arange(12).reshape(3, 4) + 1) * 2).sum(1))
  assert tracing.kernels, "no kernel was recorded"
  k = tracing.kernels[-1]
  names = [n for n, _ in k.stages]
  assert names[:2] == ["ast", "optimized"] and names[-1] == "linear" and k.program is not None
  # then the codegen passes that changed the graph, in the pipeline's order
  assert names[2:-1] and names[2:-1] == [p for p in PASS_NAMES if p in names[2:-1]], names
  steps = [s for kk in tracing.kernels for p in kk.passes for s in p.steps]
  assert steps, "no rewrite step was recorded"
  for rule, before, after in steps:
    assert rule.pat.match(before, {}), f"rule {rule} recorded on a node it does not match"  # the rule that fired matches its node
    assert after is not before
  assert all(p.steps for kk in tracing.kernels for p in kk.passes)  # passes where nothing fired are not kept
  launches = [ln for ln in tracing.launches if ln.kind == "kernel"]
  assert launches and all(ln.seconds > 0 and ln.kernel is not None for ln in launches)


def test_trace_json_round_trip(tracing, tmp_path):
  Tensor(np.ones((4, 4), np.float32)).sum().numpy()
  path = trace.save(str(tmp_path / "t.json"), tracing)
  data = load_trace(path)
  assert [k["name"] for k in data["kernels"]] == [k.program.name for k in tracing.kernels]
  for k in data["kernels"]:
    n = len(k["nodes"])
    assert all(0 <= s < n for row in k["nodes"] for s in row[3])  # sources point into the table, before their users
    assert all(all(s < i for s in row[3]) for i, row in enumerate(k["nodes"]))
    assert k["source"] and k["linear"] and {s["name"] for s in k["stages"]} >= {"ast", "optimized", "expand"}
  lst = kernel_list(data)
  assert sum(k["launches"] for k in lst) == len([ln for ln in data["launches"] if ln["kernel"] is not None])


def test_hooks_cost_nothing_when_off(monkeypatch):
  """With tracing off the hooks are never entered: codegen and rewrites run with every trace entry point raising."""
  def boom(*a, **k): raise AssertionError("a trace hook ran while tracing was off")
  for fn in ("kernel_begin", "rewrite_begin", "stage", "launched", "kernel_end"): monkeypatch.setattr(trace, fn, boom)
  assert not trace.TRACING
  from plugrad.uop.ops import UOp
  from plugrad.uop.symbolic import symbolic
  x = UOp.variable("x", 0, 10)
  graph_rewrite((x + 0) * 1, symbolic)
  assert Tensor(np.full(5, 2, np.float32)).exp2().sum().item() == pytest.approx(20.0)


def test_replay_recorder_alone_keeps_no_graphs():
  got = []
  trace.set_replay_recorder(got.append)
  try:
    a = Tensor(np.arange(6, dtype=np.float32))
    (a * 3).numpy()
    t = trace.current()
    assert t is not None and not t.graphs and not trace.TIMELINE and not t.kernels and not t.launches
  finally: trace.disable()
  assert got and got[-1].program is not None and got[-1].passes == []


def test_server_endpoints(tracing, tmp_path):
  Tensor(np.ones((3, 3), np.float32)).sum().numpy()
  path = trace.save(str(tmp_path / "t.json"), tracing)
  server, _ = serve_in_thread(path)
  base = f"http://127.0.0.1:{server.server_port}"
  try:
    def get(u): return urllib.request.urlopen(base + u, timeout=10).read()
    assert b"<script src=\"viz.js\">" in get("/")
    assert b"function drawGraph" in get("/viz.js")
    kernels = json.loads(get("/api/kernels"))
    assert [k["name"] for k in kernels] == [k.program.name for k in tracing.kernels]
    k0 = json.loads(get("/api/kernel/0"))
    assert k0["name"] == kernels[0]["name"] and k0["source"]
    assert len(json.loads(get("/api/timeline"))) == len(tracing.launches)
    assert json.loads(get("/api/trace"))["format"] == trace.FORMAT
    for bad in ("/api/kernel/999", "/api/kernel/x", "/../setup.py", "/nothing.js"):
      with pytest.raises(urllib.error.HTTPError) as e: get(bad)
      assert e.value.code == 404
  finally: server.shutdown()


def test_bad_trace_files(tmp_path):
  with pytest.raises(TraceFileError, match="no trace file"): load_trace(str(tmp_path / "missing.json"))
  (tmp_path / "x.json").write_text("{not json")
  with pytest.raises(TraceFileError, match="not JSON"): load_trace(str(tmp_path / "x.json"))
  (tmp_path / "y.json").write_text(json.dumps({"format": 99, "kernels": []}))
  with pytest.raises(TraceFileError, match="upgrade plugrad"): load_trace(str(tmp_path / "y.json"))
  out = subprocess.run([sys.executable, "-m", "plugrad", "viz", str(tmp_path / "missing.json")], capture_output=True, text=True, timeout=60)
  assert out.returncode == 2 and "no trace file" in out.stderr


def test_bad_viz_setting_fails_at_the_first_kernel():
  out = subprocess.run([sys.executable, "-c", SCRIPT], env=_env(VIZ="7"), capture_output=True, text=True, timeout=120)
  assert out.returncode != 0 and "VIZ='7' is not valid" in out.stderr


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_viz1_serves_the_run_at_exit(tmp_path):
  port = _free_port()
  env = _env(VIZ="1", VIZ_PORT=str(port), VIZ_FILE=str(tmp_path / "run.json"))
  proc = subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    deadline, kernels = time.time() + 240, None
    while time.time() < deadline and proc.poll() is None:
      try:
        kernels = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/kernels", timeout=5).read())
        break
      except (urllib.error.URLError, ConnectionError): time.sleep(0.5)
    assert kernels, f"VIZ=1 did not serve (exit {proc.poll()})"
    assert [k["name"] for k in kernels] == [k["name"] for k in load_trace(str(tmp_path / "run.json"))["kernels"]]
  finally:
    proc.terminate()
    out = proc.communicate(timeout=30)[0]
  assert f"http://127.0.0.1:{port}/" in out


def test_get_program_hook_sees_each_new_kernel_once(tracing):
  from plugrad.engine.schedule import create_schedule
  t = (Tensor(np.ones((7, 13), np.float32)).contiguous() * 3.25 + 0.5)
  items, _ = create_schedule(t.uop)
  ast = next(it.ast for it in items if it.kind == "kernel")
  r = Device["PYTHON"].renderer
  n = len(tracing.kernels)
  p1 = get_program(ast, r)
  assert get_program(ast, r) is p1  # cached: no second record
  assert len(tracing.kernels) == n + 1 and tracing.kernels[-1].program is p1 and tracing.kernels[-1].ast is ast
