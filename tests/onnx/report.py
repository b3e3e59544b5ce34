"""The ONNX node tests' summary line per device (cases passed, unsupported with a clear error, excluded), added up
over pytest-xdist's workers on the controller (registered by tests/conftest.py, like the fuzzer's)."""
from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

STATS: Counter[str] = Counter()  # "<device> <status>" -> cases, filled by test_node_tests.py
_TOTAL: Counter[str] = Counter()


def pytest_sessionfinish(session: pytest.Session) -> None:
  if not STATS: return
  workeroutput = getattr(session.config, "workeroutput", None)
  if workeroutput is not None: workeroutput["onnx"] = json.dumps(dict(STATS))
  else: _TOTAL.update(STATS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
  if raw := getattr(node, "workeroutput", {}).get("onnx"): _TOTAL.update(json.loads(raw))


def pytest_terminal_summary(terminalreporter: Any) -> None:
  if not _TOTAL: return
  terminalreporter.write_sep("-", "ONNX backend node tests (tests/onnx)")
  for dev in sorted({k.split()[0] for k in _TOTAL}):
    c = {s: _TOTAL[f"{dev} {s}"] for s in ("passed", "unsupported", "failed", "excluded")}
    n = sum(c.values())
    terminalreporter.write_line(f"{dev}: {c['passed']} of {n} cases passed ({100 * c['passed'] / max(n, 1):.1f}%; "
                                f"{100 * c['passed'] / max(n - c['excluded'], 1):.1f}% of those not excluded), {c['unsupported']} "
                                f"refused with a typed error (an unsupported op or dtype), {c['failed']} known failures, {c['excluded']} excluded")
