"""Every environment setting is parsed by one typed parser: a bad value is a SettingsError (a ValueError) naming the
variable, the value and what is allowed, raised where the setting is first read, never a bare int() failure or a
plugin bug."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

from plugrad.backend import SettingsError, getenv, parse_setting
from plugrad.helpers import Context, ContextVar

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# imports plugrad, then uses the CPU device (kernels, a TinyJit) so that every setting gets read
SCRIPT = """
import plugrad
from plugrad import Tensor, TinyJit
f = TinyJit(lambda x: (x + 1).contiguous())
for _ in range(3): out = f(Tensor([1.0, 2.0]).realize())
print("RESULT", out.numpy().tolist())
"""
BAD = [("DEBUG", "abc"), ("BEAM", "x"), ("CACHE", "no"), ("SPEC", "2x"), ("JIT", "5"), ("REWRITE_STEPS", "-1"), ("NOOPT", "yes"),
       ("SCHEDULE_CACHE", "on"), ("PLUGRAD_LRU", "2"), ("JIT_BATCH_SIZE", "0"), ("CPU_TIER", "yes"), ("CPU_LLVM", "2"), ("THREADS", "0"),
       ("THREADS", "lots"), ("THREADS", "-3"), ("PLUGRAD_STRICT_PLUGINS", "x"), ("PACK_BUDGET", "1k")]


def _run(**env: str) -> subprocess.CompletedProcess:
  full = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")} | {"DEV": "CPU"} | env
  return subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=full, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("key,value", BAD, ids=[f"{k}={v}" for k, v in BAD])
def test_a_bad_setting_is_a_settings_error_naming_it(key: str, value: str) -> None:
  res = _run(**{key: value})
  assert res.returncode != 0, res.stdout
  last = res.stderr.strip().splitlines()[-1]
  assert last.startswith("plugrad.helpers.SettingsError: "), res.stderr[-2000:]
  assert key in last and repr(value) in last and ("expected" in last or "must be" in last), last


def test_good_settings_run() -> None:
  res = _run(DEBUG="0", BEAM="0", CACHE="1", SPEC="1", THREADS="2", CPU_TIER="0", JIT=" 1 ")
  assert res.returncode == 0 and "RESULT [2.0, 3.0]" in res.stdout, res.stderr[-2000:]


def test_too_many_threads_are_capped_with_a_warning() -> None:
  from plugrad_cpu.runtime import default_threads
  cores = os.cpu_count() or 1
  with pytest.warns(RuntimeWarning, match="THREADS=100000"): n = default_threads({"THREADS": "100000"})
  assert n == max(2 * cores, 8)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    assert default_threads({"THREADS": "1"}) == 1


def test_parser() -> None:
  assert parse_setting("X", None, 3) == 3 and parse_setting("X", "  ", 3) == 3 and parse_setting("X", " 7 ", 3) == 7
  assert parse_setting("X", "2.5", 1.0, minimum=0) == 2.5 and parse_setting("X", "a", "", choices=("a", "b")) == "a"
  for raw, kw in [("x", {}), ("5", {"choices": (0, 1)}), ("-1", {"minimum": 0}), ("9", {"maximum": 8})]:
    with pytest.raises(SettingsError, match=f"X={raw!r} is not valid: expected"): parse_setting("X", raw, 0, **kw)
  assert issubclass(SettingsError, ValueError)


def test_getenv_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("PLUGRAD_TEST_SETTING", "many")
  with pytest.raises(SettingsError, match="PLUGRAD_TEST_SETTING='many'.*an integer >= 1"): getenv("PLUGRAD_TEST_SETTING", 1, minimum=1)
  monkeypatch.setenv("PLUGRAD_TEST_SETTING", "4")
  assert getenv("PLUGRAD_TEST_SETTING", 1, minimum=1) == 4


def test_a_bad_flag_fails_when_read_and_can_be_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
  monkeypatch.setenv("PLUGRAD_TEST_FLAG", "maybe")
  flag = ContextVar("PLUGRAD_TEST_FLAG", 0, (0, 1))
  try:
    with pytest.raises(SettingsError, match="PLUGRAD_TEST_FLAG='maybe'"): bool(flag)
    with Context(PLUGRAD_TEST_FLAG=1):
      assert flag.value == 1
      with Context(PLUGRAD_TEST_FLAG=0): assert flag.value == 0
      assert flag.value == 1
    with pytest.raises(SettingsError): flag.value  # noqa: B018
  finally: del ContextVar._registry["PLUGRAD_TEST_FLAG"]
