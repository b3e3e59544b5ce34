"""The fuzzer's summary line: programs, kernels and action lists checked, added up over pytest-xdist's workers on the
controller (a plugin that tests/conftest.py registers, like the differential tester's); nothing when no fuzz test ran."""
from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

import pytest

_TOTAL: Counter[str] = Counter()


def _mine() -> dict[str, int] | None:
  kernels = sys.modules.get("tests.fuzz.kernels")  # imported only where a fuzz test ran
  return dict(kernels.STATS) if kernels is not None and kernels.STATS else None


def pytest_sessionfinish(session: pytest.Session) -> None:
  if (mine := _mine()) is None: return
  workeroutput = getattr(session.config, "workeroutput", None)
  if workeroutput is not None: workeroutput["fuzz"] = json.dumps(mine)  # an xdist worker: the controller adds it up
  else: _TOTAL.update(mine)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
  if raw := getattr(node, "workeroutput", {}).get("fuzz"): _TOTAL.update(json.loads(raw))


def pytest_terminal_summary(terminalreporter: Any) -> None:
  if not _TOTAL: return
  t = _TOTAL
  terminalreporter.write_sep("-", "composition fuzzer (tests/fuzz)")
  runs = ", ".join(f"{t[k]} on {k[len('programs on '):]}" for k in sorted(t) if k.startswith("programs on "))
  terminalreporter.write_line(f"{t['programs']} programs ({runs}) compared with float64 numpy; {t['kernels']} kernels each run "
                              f"without actions and under {t['action lists']} action lists (default actions and sampled BEAM "
                              f"candidates) against the unoptimized kernel; {t['mismatches']} mismatches, {t['known-bug mismatches']} in "
                              "known-bug cases (strict xfails)")
