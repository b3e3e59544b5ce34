"""The pytest plugin of the conformance suite (entry point `pytest11: plugrad`).

    pytest --pyargs plugrad.testing --plugrad-device=NAME [--plugrad-tiers=render,compile]

It is loaded by every pytest run where plugrad is installed, so it does nothing until a test asks for one of its
fixtures. Expected failures come from the device's plugin (`plugrad_conformance_xfails`) and are strict: a test
declared to fail that passes is reported as a failure, so the list stays honest.
"""
from __future__ import annotations

import re
from typing import Any

import pytest

TIER_NAMES = ("render", "compile", "emulate", "run")


def pytest_addoption(parser: pytest.Parser) -> None:
  group = parser.getgroup("plugrad", "plugrad conformance suite")
  group.addoption("--plugrad-device", default=None, help="device to test (default: DEV, else the highest-priority available device)")
  group.addoption("--plugrad-tiers", default=None, help=f"comma-separated tiers to run (default: all of {','.join(TIER_NAMES)})")


def pytest_configure(config: pytest.Config) -> None:
  config.addinivalue_line("markers", "plugrad_conformance: a test of the plugrad conformance suite")


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
  ours = [it for it in items if it.get_closest_marker("plugrad_conformance") is not None]
  if not ours: return
  from plugrad.plugin.manager import get_manager
  declared = get_manager().conformance_xfails(_device_name(config))
  # only * and ? are wildcards: test ids contain brackets, which fnmatch would read as character classes
  globs = {re.compile(re.escape(p).replace(r"\*", ".*").replace(r"\?", ".")): r for p, r in declared.items()}
  for item in ours:
    for pattern, reason in globs.items():
      if pattern.fullmatch(item.name) or pattern.fullmatch(item.nodeid.rsplit("::", 1)[-1]):
        item.add_marker(pytest.mark.xfail(reason=reason, strict=True))
        break


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
