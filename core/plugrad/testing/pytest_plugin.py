"""The pytest plugin of the conformance suite (entry point `pytest11: plugrad`).

    pytest --pyargs plugrad.testing --plugrad-device=NAME [--plugrad-tiers=render,compile] [--plugrad-results=FILE.json]

It is loaded by every pytest run where plugrad is installed, so it does nothing until a test asks for one of its
fixtures. Expected failures come from the device's plugin (`plugrad_conformance_xfails`) and are strict: a test
declared to fail that passes is reported as a failure, so the list stays honest. Tests without a `tier` parameter
(tensor-level, memory, JIT) compute on the device, so they belong to the run tier and are deselected without it.
`--plugrad-results` writes each test's outcome, tier and reason as JSON (what `python -m plugrad conformance` reads).
"""
from __future__ import annotations

import json
import re
from typing import Any

import pytest

TIER_NAMES = ("render", "compile", "emulate", "run")


def pytest_addoption(parser: pytest.Parser) -> None:
  group = parser.getgroup("plugrad", "plugrad conformance suite")
  group.addoption("--plugrad-device", default=None, help="device to test (default: DEV, else the highest-priority available device)")
  group.addoption("--plugrad-tiers", default=None, help=f"comma-separated tiers to run (default: all of {','.join(TIER_NAMES)})")
  group.addoption("--plugrad-results", default=None, metavar="FILE", help="write every test's outcome, tier and reason to FILE as JSON")


def pytest_configure(config: pytest.Config) -> None:
  config.addinivalue_line("markers", "plugrad_conformance: a test of the plugrad conformance suite")
  if path := config.getoption("--plugrad-results", None): config.pluginmanager.register(Results(path), "plugrad-results")


def _device_name(config: pytest.Config) -> str:
  from plugrad.device.registry import Device
  return Device.canonicalize(config.getoption("--plugrad-device") or Device.DEFAULT)


def _tiers(config: pytest.Config) -> tuple[str, ...]:
  raw = config.getoption("--plugrad-tiers")
  if not raw: return TIER_NAMES
  tiers = tuple(t.strip() for t in raw.split(",") if t.strip())
  if bad := [t for t in tiers if t not in TIER_NAMES]: raise pytest.UsageError(f"--plugrad-tiers: unknown tier(s) {bad}; the tiers are {TIER_NAMES}")
  return tiers


def _device(config: pytest.Config) -> Any:
  """The device under test. Without the run tier nothing is launched, so a device that is unavailable here (a GPU
  backend on a machine without the GPU) is opened with `Device.offline`: rendered and compiled, never run."""
  from plugrad.device.registry import Device
  name = _device_name(config)
  return Device[name] if "run" in _tiers(config) else Device.offline(name)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
  if "conformance_kernel" in metafunc.fixturenames:
    from plugrad.testing.kernels import device_kernels, suite
    names = sorted(suite()) + sorted(device_kernels(_device(metafunc.config).renderer))
    metafunc.parametrize("conformance_kernel", names)
  if "tier" in metafunc.fixturenames: metafunc.parametrize("tier", _tiers(metafunc.config))


def tier_of(item: pytest.Item) -> str:
  """The tier a test checks: its `tier` parameter, else run (a test without one computes on the device)."""
  callspec = getattr(item, "callspec", None)
  return str(callspec.params["tier"]) if callspec is not None and "tier" in callspec.params else "run"


def declared_pattern(pattern: str) -> re.Pattern[str]:
  """A `plugrad_conformance_xfails` key as a regex over test names: only * and ? are wildcards (test ids contain
  brackets, which fnmatch would read as character classes)."""
  return re.compile(re.escape(pattern).replace(r"\*", ".*").replace(r"\?", "."))


DECLARED = pytest.StashKey[str]()  # the reason of the plugin's declared expected failure, on the items it matches


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
  ours = [it for it in items if it.get_closest_marker("plugrad_conformance") is not None]
  if not ours: return
  if "run" not in _tiers(config):
    if dropped := {it for it in ours if tier_of(it) == "run"}:
      config.hook.pytest_deselected(items=list(dropped))
      items[:] = [it for it in items if it not in dropped]
      ours = [it for it in ours if it not in dropped]
  from plugrad.plugin.manager import get_manager
  declared = get_manager().conformance_xfails(_device_name(config))
  globs = {declared_pattern(p): r for p, r in declared.items()}
  for item in ours:
    for pattern, reason in globs.items():
      if pattern.fullmatch(item.name) or pattern.fullmatch(item.nodeid.rsplit("::", 1)[-1]):
        item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
        item.stash[DECLARED] = reason
        break


class Results:
  """Records the final outcome of every test (passed, failed, skipped, xfailed, xpassed) with its tier, the skip or
  xfail reason and the failure's message, and writes them to `path` at the end of the session."""
  def __init__(self, path: str):
    self.path = path
    self.items: dict[str, tuple[str, str, str | None]] = {}  # nodeid -> (name, tier, declared xfail reason)
    self.tests: dict[str, dict[str, Any]] = {}

  @pytest.hookimpl(trylast=True)  # after the conformance plugin marked the declared failures and -k deselected
  def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
    self.items = {it.nodeid: (it.name, tier_of(it), it.stash.get(DECLARED, None)) for it in items}

  def pytest_collectreport(self, report: pytest.CollectReport) -> None:
    if report.failed:
      self.tests[report.nodeid] = {"nodeid": report.nodeid, "name": report.nodeid, "tier": "collect", "outcome": "failed", "fails": True,
                                   "reason": None, "declared": None, "message": str(report.longrepr)}

  def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
    if report.when != "call" and report.passed: return
    name, tier, declared = self.items.get(report.nodeid, (report.nodeid.rsplit("::", 1)[-1], "run", None))
    rec = self.tests.setdefault(report.nodeid, {"nodeid": report.nodeid, "name": name, "tier": tier, "declared": declared})
    if rec.get("fails"): return  # a teardown error after a failure: the first failure is the one to report
    outcome, reason, message = "passed", None, None
    if hasattr(report, "wasxfail"): outcome, reason = ("xfailed" if report.skipped else "xpassed"), report.wasxfail
    elif report.skipped:
      raw = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
      outcome, reason = "skipped", raw.removeprefix("Skipped: ")
    elif report.failed:
      text = str(report.longrepr)
      # a strict xfail that passed is reported by pytest as a failure whose text starts with [XPASS(strict)]
      outcome = "xpassed" if declared is not None and text.startswith("[XPASS(strict)]") else "failed"
      crash = getattr(report.longrepr, "reprcrash", None)
      message = crash.message if crash is not None else text
      if report.when != "call": message = f"error in {report.when}: {message}"
    rec.update(outcome=outcome, fails=report.failed, reason=reason, message=message)

  def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
    with open(self.path, "w") as f: json.dump({"exitstatus": int(exitstatus), "tests": list(self.tests.values())}, f, indent=1)


@pytest.fixture(scope="session")
def plugrad_device(request: pytest.FixtureRequest) -> str:
  """The canonical name of the device under test."""
  return _device_name(request.config)


@pytest.fixture(scope="session")
def plugrad_dev(request: pytest.FixtureRequest) -> Any:
  """The device under test (a `CompiledDevice`); fails the session early with the reason when it is unusable (and the
  run tier is selected: see `_device`)."""
  return _device(request.config)


@pytest.fixture
def conformance_builder(conformance_kernel: str, plugrad_dev: Any) -> Any:
  from plugrad.testing.kernels import device_kernels, suite
  return {**suite(), **device_kernels(plugrad_dev.renderer)}[conformance_kernel]


@pytest.fixture
def run_device(plugrad_dev: Any) -> str:
  """The device under test for tests that compute (tensor-level tests); skips on devices that do not run kernels."""
  from plugrad.testing.harness import require_run
  require_run(plugrad_dev)
  return plugrad_dev.name
