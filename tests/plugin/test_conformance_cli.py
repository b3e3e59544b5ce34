"""`python -m plugrad conformance DEVICE`: the suite in a child pytest, summed up per tier.

The devices other than PYTHON come from `plugrad-fakeconf`, a distribution made visible to the command by putting its
package and `.dist-info` (with the `plugrad` entry point) on PYTHONPATH: FAKECONF runs on the PYTHON interpreter's
components except that its runtime refuses float32 additions, GONECONF's probe says it is unavailable here.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

from plugrad.__main__ import main

PLUGIN = '''
import json, os
from plugrad.backend import DeviceSpec, LaunchError, device_name, hookimpl
from plugrad.builtin.interpreter import PythonAllocator, PythonCompiler, PythonRuntime
from plugrad.builtin.python_renderer import PythonRenderer

GONE = "no GONECONF driver here (install gone-driver)"

class NoAddRuntime(PythonRuntime):
  def load(self, program):
    if program.name == "ew_add_float32": raise LaunchError("this backend cannot add float32 yet")
    return super().load(program)

@hookimpl
def plugrad_devices():
  return [DeviceSpec("FAKECONF", api=(2, 1), priority=-5), DeviceSpec("GONECONF", api=(2, 1), priority=-5, probe=lambda: GONE)]

@hookimpl
def plugrad_renderer(device):
  return PythonRenderer(device) if device_name(device) in ("FAKECONF", "GONECONF") else None

@hookimpl
def plugrad_compiler(device):
  return PythonCompiler() if device_name(device) in ("FAKECONF", "GONECONF") else None

@hookimpl
def plugrad_allocator(device):
  return PythonAllocator(device) if device_name(device) in ("FAKECONF", "GONECONF") else None

@hookimpl
def plugrad_runtime(device):
  return NoAddRuntime(device) if device_name(device) in ("FAKECONF", "GONECONF") else None

@hookimpl
def plugrad_conformance_xfails(device):
  return json.loads(os.environ.get("FAKECONF_XFAILS", "{}")) if device_name(device) == "FAKECONF" else None
'''
GONE = "no GONECONF driver here (install gone-driver)"  # the probe's reason in PLUGIN
KEYS = {"device", "distribution", "version", "plugrad", "api", "machine", "capabilities", "tensor_cores", "tiers", "skips", "xfails", "failures",
        "returncode", "ok"}
TABLE = "| tier | passed | failed | skipped | xfailed | xpassed |"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
  root = tmp_path_factory.mktemp("site")
  (root / "plugrad_fakeconf").mkdir()
  (root / "plugrad_fakeconf" / "__init__.py").write_text(textwrap.dedent(PLUGIN))
  info = root / "plugrad_fakeconf-0.3.dist-info"
  info.mkdir()
  (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plugrad-fakeconf\nVersion: 0.3\n")
  (info / "entry_points.txt").write_text("[plugrad]\nfakeconf = plugrad_fakeconf\n")
  return root


def conformance(site: pathlib.Path, tmp_path: pathlib.Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], dict]:
  out = tmp_path / "report.json"
  drop = ("DEV", "PLUGRAD_PLUGINS", "PLUGRAD_NO_PLUGINS", "PYTEST_", "EMULATE")
  clean = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
  path = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
  clean.update(PYTHONPATH=path, PLUGRAD_CACHE_DIR=str(tmp_path / "cache"), **env)
  proc = subprocess.run([sys.executable, "-m", "plugrad", "conformance", *args[:1], "--json", str(out), *args[1:]], capture_output=True, text=True,
                        env=clean, cwd=tmp_path, timeout=600)
  return proc, (json.loads(out.read_text()) if out.exists() else {})


def pytest_summary(stderr: str) -> dict[str, int]:
  """pytest's own counts, from the summary line the command forwards to stderr."""
  line = [ln for ln in stderr.splitlines() if re.search(r"\d+ (passed|failed|skipped|xfailed|deselected)", ln)][-1]
  return {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|xfailed|xpassed)", line)}


def totals(report: dict) -> dict[str, int]:
  return {k: n for k in ("passed", "failed", "skipped", "xfailed", "xpassed") if (n := sum(t[k] for t in report["tiers"].values()))}


def test_python_render_tier(site, tmp_path):
  md = tmp_path / "CONFORMANCE.md"
  proc, rep = conformance(site, tmp_path, "python", "--tiers", "render", "--report", str(md))
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  assert KEYS <= set(rep) and set(rep["tiers"]) == {"render", "compile", "emulate", "run"}
  assert rep["device"] == "PYTHON" and rep["ok"] is True and rep["returncode"] == 0 and rep["distribution"] == "plugrad"
  assert totals(rep) == pytest_summary(proc.stderr) and rep["tiers"]["render"]["passed"] > 100
  assert rep["tiers"]["run"] == dict.fromkeys(("passed", "failed", "skipped", "xfailed", "xpassed"), 0)
  assert {(s["tier"], s["count"]) for s in rep["skips"]} == {("compile", 0), ("emulate", 0), ("run", 0)}
  assert all(s["reason"] == "not selected (--tiers render)" for s in rep["skips"])
  assert "float64" in rep["capabilities"] and "run" in rep["capabilities"]
  assert TABLE in proc.stdout and f"| render | {rep['tiers']['render']['passed']} | 0 | 0 | 0 | 0 |" in proc.stdout
  assert proc.stdout.count("PASS: PYTHON conforms at render") == 1 and md.read_text() == proc.stdout


def test_unavailable_device_runs_the_other_tiers_and_reports_run_skipped(site, tmp_path):
  proc, rep = conformance(site, tmp_path, "GONECONF", "--", "-k", "ew-add-float32 or ew-mul-int32")
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  assert rep["distribution"] == "plugrad-fakeconf" and rep["version"] == "0.3" and "run" not in rep["capabilities"]
  assert {t: c["passed"] for t, c in rep["tiers"].items()} == {"render": 2, "compile": 2, "emulate": 2, "run": 0}
  assert totals(rep) == pytest_summary(proc.stderr)
  assert rep["skips"] == [{"tier": "run", "reason": f"GONECONF is unavailable here: {GONE}", "count": 0}]
  assert "not checked: run (GONECONF is unavailable here: no GONECONF driver here" in proc.stdout


def test_unavailable_device_with_the_run_tier_named_fails_with_the_reason(site, tmp_path):
  proc, rep = conformance(site, tmp_path, "GONECONF", "--tiers", "render,run", "--", "-k", "ew-add-float32")
  assert proc.returncode == 1 and rep["ok"] is False and rep["returncode"] == 1
  assert rep["failures"] == [{"test": "run tier", "tier": "run", "message": f"GONECONF is unavailable here: {GONE}"}]
  assert rep["tiers"]["render"]["passed"] == 1  # the other tiers named still ran
  assert "FAIL: 1 failure(s) on GONECONF (run: 1)" in proc.stdout and "install gone-driver" in proc.stdout


def test_declared_failures_are_reported_with_their_reason(site, tmp_path):
  xfails = {"test_kernel[ew-add-float32-run]": "float32 add is not implemented yet", "test_kernel[where-*]": "not in this run"}
  select = ["-k", "ew-add-float32 or ew-mul-float32"]
  proc, rep = conformance(site, tmp_path, "FAKECONF", "--", *select, FAKECONF_XFAILS=json.dumps(xfails))
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
  assert rep["xfails"] == [{"test": "test_kernel[ew-add-float32-run]", "reason": "float32 add is not implemented yet", "outcome": "xfailed"},
                           {"test": "test_kernel[where-*]", "reason": "not in this run", "outcome": "not run"}]
  assert rep["tiers"]["run"]["xfailed"] == 1 and rep["tiers"]["run"]["passed"] == 1 and totals(rep) == pytest_summary(proc.stderr)
  assert "| `test_kernel[ew-add-float32-run]` | float32 add is not implemented yet | xfailed (as declared) |" in proc.stdout


def test_undeclared_failure_and_a_declared_failure_that_passes_fail_the_run(site, tmp_path):
  xfails = {"test_kernel[ew-mul-float32-run]": "claimed broken, but it works"}
  select = ["-k", "ew-add-float32 or ew-mul-float32"]
  proc, rep = conformance(site, tmp_path, "FAKECONF", "--tiers", "run", "--", *select, FAKECONF_XFAILS=json.dumps(xfails))
  assert proc.returncode == 1 and rep["ok"] is False
  by = {f["test"]: f for f in rep["failures"]}
  assert set(by) == {"test_kernel[ew-add-float32-run]", "test_kernel[ew-mul-float32-run]"} and {f["tier"] for f in by.values()} == {"run"}
  assert "this backend cannot add float32 yet" in by["test_kernel[ew-add-float32-run]"]["message"]
  assert by["test_kernel[ew-mul-float32-run]"]["message"] == "declared to fail (claimed broken, but it works) but passed"
  assert rep["tiers"]["run"] == {"passed": 0, "failed": 1, "skipped": 0, "xfailed": 0, "xpassed": 1}
  assert "### Failures" in proc.stdout and "cannot add float32 yet" in proc.stdout


def test_a_selection_that_matches_nothing_fails(site, tmp_path):
  proc, rep = conformance(site, tmp_path, "PYTHON", "--tiers", "render", "--", "-k", "no_such_test")
  assert proc.returncode == 1 and "pytest collected no tests" in rep["failures"][0]["message"]


@pytest.mark.parametrize("argv, message", [
  (["conformance", "NOSUCHDEV"], "unknown device 'NOSUCHDEV'"),
  (["conformance", "PYTHON", "--tiers", "render,bogus"], "unknown tier(s) bogus; the tiers are render, compile, emulate, run"),
  (["conformance", "PYTHON", "--tiers", ","], "--tiers names no tier"),
  (["conformance", "PYTHON", "--json", "/no/such/dir/r.json"], "cannot write /no/such/dir/r.json: no such directory"),
], ids=["device", "tier", "no-tier", "json-dir"])
def test_bad_arguments_exit_2(argv, message, capsys):
  assert main(argv) == 2
  err = capsys.readouterr().err
  assert message in err
  if "device" in message: assert "Known devices:" in err and "PYTHON" in err
