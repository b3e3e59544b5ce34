"""A per-test time limit for the GPU checks' pytest runs (`-p pytest_deadline --deadline SECONDS`, with bench/gpu on
PYTHONPATH): a test still running after SECONDS fails with DeadlineExceeded, and the run goes on. The GPU machine has
no pytest-timeout; this needs nothing but the standard library (SIGALRM, so a test blocked inside one C call fails
when that call returns; the step's own `timeout -s INT` is the limit for a hang)."""
from __future__ import annotations

import signal
from collections.abc import Generator
from typing import Any

import pytest


class DeadlineExceeded(Exception):
  """The test ran past --deadline."""


def pytest_addoption(parser: pytest.Parser) -> None:
  parser.addoption("--deadline", type=float, default=0.0, metavar="SECONDS", help="fail a test that runs longer than this (0: no limit)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, None]:
  limit = float(item.config.getoption("deadline"))
  if limit <= 0 or not hasattr(signal, "setitimer"):
    yield
    return
  def fire(signum: int, frame: Any) -> None: raise DeadlineExceeded(f"{item.nodeid} ran past --deadline {limit:g} s")
  old = signal.signal(signal.SIGALRM, fire)
  signal.setitimer(signal.ITIMER_REAL, limit)
  try: yield
  finally:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)
