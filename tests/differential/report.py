"""The differential tester's summary: Tensor methods, table rows, examples and gradient checks run, reported at the end
of the session (with pytest-xdist the workers' counts are added up on the controller) and written to `DIFF_REPORT` (a
JSON path) when set. A plugin registered by tests/conftest.py, so that the controller of `pytest -n 2` has it too; it
reports nothing when no differential test ran."""
from __future__ import annotations

import json
import os
import sys
from collections import Counter
from typing import Any

import pytest

_TOTAL: dict[str, Any] = {"stats": Counter(), "per_op": Counter(), "methods": set()}


def _mine() -> dict[str, Any] | None:
  harness = sys.modules.get("tests.differential.harness")  # imported only where the tester ran (it needs torch)
  if harness is None or not harness.STATS: return None
  return {"stats": dict(harness.STATS), "per_op": dict(harness.PER_OP), "methods": sorted(harness.METHODS)}


def _add(d: dict[str, Any]) -> None:
  _TOTAL["stats"].update(d["stats"]); _TOTAL["per_op"].update(d["per_op"]); _TOTAL["methods"].update(d["methods"])


def pytest_sessionfinish(session: pytest.Session) -> None:
  mine = _mine()
  if mine is None: return
  workeroutput = getattr(session.config, "workeroutput", None)
  if workeroutput is not None: workeroutput["differential"] = json.dumps(mine)  # an xdist worker: the controller adds it up
  else: _add(mine)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
  raw = getattr(node, "workeroutput", {}).get("differential")
  if raw: _add(json.loads(raw))


def pytest_terminal_summary(terminalreporter: Any) -> None:
  s = _TOTAL["stats"]
  if not s.get("examples"): return
  summary = {"methods": len(_TOTAL["methods"]), "table_rows": len(_TOTAL["per_op"]), "examples": s["examples"],
             "gradient_checks": s.get("gradient checks", 0), "allowed_differences": s.get("allowed differences", 0),
             "known_bug_cases": s.get("known-bug cases", 0),
             "cases_matching_torch_in_wider_dtype": s.get("cases matching PyTorch in a wider dtype", 0)}
  terminalreporter.write_sep("-", "differential tester (tests/differential)")
  terminalreporter.write_line(f"{summary['methods']} Tensor methods in {summary['table_rows']} table rows, {summary['examples']} examples compared "
                              f"with PyTorch ({summary['gradient_checks']} with gradients); {summary['allowed_differences']} matched an allowed "
                              f"difference, {summary['known_bug_cases']} a known bug, {summary['cases_matching_torch_in_wider_dtype']} "
                              "matched PyTorch computing in a wider dtype")
  if path := os.environ.get("DIFF_REPORT"):
    with open(path, "w") as f: json.dump({**summary, "method_names": sorted(_TOTAL["methods"]), "per_row": dict(_TOTAL["per_op"])}, f, indent=1)
