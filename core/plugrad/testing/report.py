"""`python -m plugrad conformance DEVICE`: the conformance suite for one device in a child pytest, summed up per tier
as a Markdown report a backend author can paste into a README and as JSON (`tools/matrix.py` reads it).

The child is `python -m pytest --pyargs plugrad.testing --plugrad-device=DEVICE` with `SPEC=1` and the caller's
environment otherwise (EMULATE, CUDA_ARCH, ... work as usual); its per-test outcomes come back through the pytest
plugin's `--plugrad-results` file. A device unavailable here is checked at the tiers that need no hardware, and its
run tier is reported as skipped with the probe's reason, unless the run tier was asked for by name: then it fails.
"""
from __future__ import annotations

import collections
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import Any, TextIO

from plugrad.device.registry import Device
from plugrad.errors import DeviceError, InvalidDeviceStringError, UnknownDeviceError
from plugrad.helpers import SettingsError
from plugrad.plugin.hookspecs import API_VERSION, parse_device
from plugrad.plugin.manager import core_version
from plugrad.testing.pytest_plugin import TIER_NAMES, declared_pattern

OUTCOMES = ("passed", "failed", "skipped", "xfailed", "xpassed")
MESSAGE_LINES = 6  # of a failure's message, in the report


class ConformanceArgumentError(ValueError):
  """A device name no plugin declares or a tier that does not exist (the CLI's exit status 2)."""


def parse_tiers(raw: str | None) -> tuple[tuple[str, ...], bool]:
  """The tiers to check and whether they were named (None: all of them, not named)."""
  if raw is None: return TIER_NAMES, False
  tiers = tuple(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
  if not tiers: raise ConformanceArgumentError(f"--tiers names no tier; the tiers are {', '.join(TIER_NAMES)}")
  if bad := [t for t in tiers if t not in TIER_NAMES]:
    raise ConformanceArgumentError(f"unknown tier(s) {', '.join(bad)}; the tiers are {', '.join(TIER_NAMES)}")
  return tuple(t for t in TIER_NAMES if t in tiers), True


def canonical_device(name: str) -> str:
  try: return Device.canonicalize(name)
  except (UnknownDeviceError, InvalidDeviceStringError) as e: raise ConformanceArgumentError(str(e)) from e
  except DeviceError: return name.upper()  # declared but unusable (a failed or conflicting plugin): reported as a failure


def _describe(canon: str) -> dict[str, Any]:
  """What the report says about the device: its plugin, capabilities and tensor cores. Raises DeviceError or
  SettingsError when the device cannot even be opened for rendering."""
  mgr, base = Device.manager, parse_device(canon)[0]
  entry = mgr.entry(base)
  probe = mgr.probe(base)
  dev = Device.offline(canon)  # the device itself where it is available
  caps = set(dev.renderer.capabilities) | (set(dev.runtime.capabilities) if probe is None else set())
  return {"distribution": entry.plugin.distribution, "version": entry.plugin.version, "plugin_api": entry.spec.api_str, "probe": probe,
          "capabilities": sorted(caps), "tensor_cores": len(dev.renderer.tensor_cores), "declared": mgr.conformance_xfails(canon)}


def _run_pytest(canon: str, tiers: Sequence[str], extra: Sequence[str], echo: TextIO) -> tuple[dict[str, Any] | None, int, list[str], str]:
  """Runs the suite in a child pytest: (its results file, or None when it wrote none; exit status; command; last lines)."""
  with tempfile.TemporaryDirectory(prefix="plugrad-conformance-") as tmp:
    results = os.path.join(tmp, "results.json")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "--pyargs", "plugrad.testing",
           f"--plugrad-device={canon}", f"--plugrad-results={results}"]
    if tuple(tiers) != TIER_NAMES: cmd.append(f"--plugrad-tiers={','.join(tiers)}")
    cmd += extra
    tail: collections.deque[str] = collections.deque(maxlen=30)
    # the child's output goes to `echo` (stderr) as it comes, so that stdout holds only the report
    env = {**os.environ, "SPEC": "1"}
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace") as proc:
      assert proc.stdout is not None
      for line in proc.stdout:
        echo.write(line)
        tail.append(line)
    data = None
    if os.path.exists(results):
      with open(results) as f: data = json.load(f)
  return data, proc.returncode, ["python", *cmd[1:]], "".join(tail)


def _first_lines(text: str | None) -> str:
  lines = (text or "").strip().splitlines()
  return "\n".join(lines[:MESSAGE_LINES]) + (f"\n... ({len(lines) - MESSAGE_LINES} more lines)" if len(lines) > MESSAGE_LINES else "")


def run_conformance(device: str, tiers: str | None = None, extra: Sequence[str] = (), echo: TextIO | None = None) -> dict[str, Any]:
  """The report of one conformance run (the JSON shape of `python -m plugrad conformance --json`). Raises
  ConformanceArgumentError for an unknown device or tier; everything else that goes wrong is a failure in the report."""
  selected, named = parse_tiers(tiers)
  canon = canonical_device(device)
  machine = f"{platform.platform()}, {platform.python_implementation()} {platform.python_version()}"
  report: dict[str, Any] = {"device": canon, "distribution": "", "version": "", "plugin_api": "",
                            "plugrad": core_version(), "api": f"{API_VERSION[0]}.{API_VERSION[1]}", "machine": machine,
                            "capabilities": [], "tensor_cores": 0, "selected": [], "command": [],
                            "tiers": {t: dict.fromkeys(OUTCOMES, 0) for t in TIER_NAMES}, "skips": [], "xfails": [], "failures": []}
  skips: collections.Counter[tuple[str, str]] = collections.Counter()
  failures: list[dict[str, str]] = report["failures"]
  try: info = _describe(canon)
  except (DeviceError, SettingsError) as e:
    failures.append({"test": "device", "tier": "render", "message": f"{canon} cannot be opened: {type(e).__name__}: {e}"})
    return _finish(report, skips)
  declared: dict[str, str] = info.pop("declared")
  probe = info.pop("probe")
  report.update(info)
  for t in TIER_NAMES:
    if t not in selected: skips[(t, f"not selected (--tiers {','.join(selected)})")] = 0
  if probe is not None and "run" in selected:
    selected = tuple(t for t in selected if t != "run")
    if named: failures.append({"test": "run tier", "tier": "run", "message": f"{canon} is unavailable here: {probe}"})
    else: skips[("run", f"{canon} is unavailable here: {probe}")] = 0
  report["selected"] = list(selected)
  tests: list[dict[str, Any]] = []
  if selected:
    data, rc, report["command"], tail = _run_pytest(canon, selected, extra, echo or sys.stderr)
    tests = data["tests"] if data is not None else []
    for rec in tests:
      if rec["tier"] in report["tiers"]: report["tiers"][rec["tier"]][rec["outcome"]] += 1
      if rec["outcome"] == "skipped": skips[(rec["tier"], rec["reason"] or "")] += 1
      if rec["declared"] is not None: report["xfails"].append({"test": rec["name"], "reason": rec["declared"], "outcome": rec["outcome"]})
      if rec["fails"]:
        message = f"declared to fail ({rec['declared']}) but passed" if rec["outcome"] == "xpassed" else _first_lines(rec["message"])
        failures.append({"test": rec["name"], "tier": rec["tier"], "message": message})
    if rc == 5: failures.append({"test": "pytest", "tier": "collect", "message": "pytest collected no tests: check the -k expression and --tiers"})
    elif rc != 0 and not any(rec["fails"] for rec in tests):  # a usage error, an internal error, an interrupt
      failures.append({"test": "pytest", "tier": "collect", "message": f"pytest exited with status {rc}:\n{_first_lines(tail[-2000:])}"})
  ran = {rec["name"] for rec in tests}
  for pattern, reason in declared.items():  # declared failures that no test of this run matched
    if not any(declared_pattern(pattern).fullmatch(n) for n in ran):
      report["xfails"].append({"test": pattern, "reason": reason, "outcome": "not run"})
  return _finish(report, skips)


def _finish(report: dict[str, Any], skips: collections.Counter[tuple[str, str]]) -> dict[str, Any]:
  order = {t: i for i, t in enumerate(TIER_NAMES)}
  ordered = sorted(skips.items(), key=lambda kv: (order[kv[0][0]], -kv[1], kv[0][1]))
  report["skips"] = [{"tier": t, "reason": r, "count": n} for (t, r), n in ordered]
  report["returncode"] = 1 if report["failures"] else 0
  report["ok"] = not report["failures"]
  report["verdict"] = verdict(report)
  return report


def verdict(report: dict[str, Any]) -> str:
  total = {o: sum(c[o] for c in report["tiers"].values()) for o in OUTCOMES}
  if report["failures"]:
    by_tier = collections.Counter(f["tier"] for f in report["failures"])
    return f"FAIL: {len(report['failures'])} failure(s) on {report['device']} ({', '.join(f'{t}: {n}' for t, n in by_tier.items())})"
  not_run: dict[str, list[str]] = {}  # reason -> the tiers that did not run for it
  for s in report["skips"]:
    if s["count"] == 0: not_run.setdefault(s["reason"], []).append(s["tier"])
  return (f"PASS: {report['device']} conforms at {', '.join(report['selected'])} ({total['passed']} passed, {total['skipped']} skipped, "
          f"{total['xfailed']} declared failures)" + "".join(f"; not checked: {', '.join(t)} ({r})" for r, t in not_run.items()))


def _cell(text: Any) -> str:
  return str(text).replace("|", "\\|").replace("\n", " ").strip() or "-"


def markdown(report: dict[str, Any]) -> str:
  """The report as Markdown: what was tested where, a tier table, the skip reasons, the declared failures, the failures."""
  r = report
  plugin = f"{r['distribution']} {r['version']} (built for plugin API {r['plugin_api']})" if r["distribution"] else "-"
  out = [f"## plugrad conformance: {r['device']}", "", f"**{r['verdict']}**", "", "| | |", "|---|---|", f"| device | {r['device']} |",
         f"| plugin | {_cell(plugin)} |", f"| plugrad | {r['plugrad']} (plugin API {r['api']}) |", f"| machine | {_cell(r['machine'])} |",
         f"| capabilities | {_cell(', '.join(r['capabilities']))} |", f"| tensor cores | {r['tensor_cores']} |"]
  if r["command"]: out.append(f"| command | `SPEC=1 {_cell(shlex.join(a for a in r['command'] if not a.startswith('--plugrad-results')))}` |")
  out += ["", "| tier | " + " | ".join(OUTCOMES) + " |", "|---|" + "---:|" * len(OUTCOMES)]
  out += [f"| {t} | " + " | ".join(str(c[o]) for o in OUTCOMES) + " |" for t, c in r["tiers"].items()]
  if r["skips"]:
    out += ["", "### Skipped", "", "| tier | reason | tests |", "|---|---|---:|"]
    out += [f"| {s['tier']} | {_cell(s['reason'])} | {s['count'] or 'tier not run'} |" for s in r["skips"]]
  if r["xfails"]:
    out += ["", "### Declared expected failures (`plugrad_conformance_xfails`)", "", "| test | reason | outcome |", "|---|---|---|"]
    out += [f"| `{_cell(x['test'])}` | {_cell(x['reason'])} | {x['outcome'] + (' (as declared)' if x['outcome'] == 'xfailed' else '')} |"
            for x in r["xfails"]]
  if r["failures"]:
    out += ["", "### Failures", ""]
    for f in r["failures"]:
      out += [f"* `{f['test']}` ({f['tier']}):", "", "  ```", *("  " + line for line in f["message"].splitlines()), "  ```"]
  return "\n".join(out) + "\n"
