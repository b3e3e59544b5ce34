"""tools/matrix.py, the plugin matrix from wheels: that it knows every distribution, reads pytest's results right and
prints every skip with its reason. (The matrix itself runs in `.ci/run`: it builds wheels and venvs, minutes of work.)"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("plugrad_matrix_tool", REPO / "tools" / "matrix.py")
assert _spec is not None and _spec.loader is not None
matrix = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = matrix  # dataclasses look their module up while the class is built
_spec.loader.exec_module(matrix)


def test_every_distribution_has_a_cell_with_its_tests_and_extras():
  dists = {p.parent.relative_to(REPO).as_posix(): tomllib.loads(p.read_text())["project"]
           for p in [REPO / "core" / "pyproject.toml", *REPO.glob("plugins/*/pyproject.toml"), *REPO.glob("examples/*/pyproject.toml")]}
  cells = {c.source: c for c in matrix.CELLS}
  assert set(cells) == set(dists), "every distribution in the repository is a matrix cell"
  for src, cell in cells.items():
    assert cell.distribution == dists[src]["name"]
    assert set(cell.extras) <= set(dists[src].get("optional-dependencies", {})), f"{src}: an extra the matrix installs is not declared"
    if cell.tests is not None:
      tests = REPO / cell.tests
      assert tests.is_dir() and any(tests.glob("test_*.py")), f"{src}: no tests in {cell.tests}"
      assert not (tests / "__init__.py").exists(), f"{cell.tests} must not be a package: the source tree would shadow the installed wheel"
  assert "crosscheck" in dists["core"]["optional-dependencies"] and "test" in dists["core"]["optional-dependencies"]


def test_junit_counts_and_skip_reasons(tmp_path: Path):
  (tmp_path / "test_some.py").write_text(
    "import pytest\n"
    "def test_ok(): pass\n"
    "def test_bad(): assert 0\n"
    "@pytest.mark.skip(reason='needs a GPU')\ndef test_s1(): pass\n"
    "@pytest.mark.skip(reason='needs a GPU')\ndef test_s2(): pass\n"
    "@pytest.mark.xfail(reason='known', strict=True)\ndef test_x(): assert 0\n")
  xml = tmp_path / "r.xml"
  subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", f"--junitxml={xml}", str(tmp_path)],
                 cwd=tmp_path, capture_output=True, check=False)
  got = matrix.junit_counts(xml)
  assert (got["passed"], got["failed"], got["skipped"], got["xfailed"]) == (1, 1, 2, 1)
  assert got["skips"] == [{"reason": "needs a GPU", "count": 2}] and got["failures"] == ["test_some::test_bad"]
  assert matrix.junit_counts(tmp_path / "missing.xml")["failures"] == ["pytest wrote no results"]


def test_markdown_names_every_skip_and_tier_not_run():
  zero = dict.fromkeys(("passed", "failed", "skipped", "xfailed", "xpassed"), 0)
  report = {"tiers": {"render": {**zero, "passed": 5}, "compile": {**zero, "passed": 4, "skipped": 1}, "emulate": {**zero, "passed": 5},
                      "run": zero},
            "skips": [{"tier": "compile", "reason": "lacks float64", "count": 1}, {"tier": "run", "reason": "no GPU driver", "count": 0}],
            "failures": []}
  results = [{"cell": "gpu", "ok": True, "steps": [{"step": "install", "ok": True, "returncode": 0}],
              "tests": {"passed": 3, "failed": 0, "skipped": 1, "xfailed": 0, "skips": [{"reason": "no clang", "count": 1}], "failures": []},
              "configs": [{"label": "GPU sm_90", "device": "GPU", "report": report},
                          {"label": "GPU other", "device": "GPU", "skipped": "needs clang"}]}]
  md = matrix.markdown(results)
  assert "| gpu | GPU sm_90 | 5 pass | 4 pass, 1 skip | 5 pass | not run | 3 pass, 1 skip | ok |" in md
  assert "|  | GPU other | skipped | skipped | skipped | skipped |  |  |" in md
  for line in ("compile: 1 skipped: lacks float64", "run: not run: no GPU driver", "GPU other: not run: needs clang",
               "plugin tests: 1 skipped: no clang"):
    assert line in md, line


@pytest.mark.parametrize("argv", [["--cells", "nosuch"], ["--cells", "core,gpu9"]])
def test_unknown_cell_is_a_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]):
  assert matrix.main(argv) == 2
  assert "unknown cell" in capsys.readouterr().err


def test_ci_runs_the_readme_test_command_and_installs_nothing_else():
  """.ci/run takes the README's test command from README.md and runs it in a fresh venv: CI must not install anything
  with pip that a newcomer following the README would not have (issue 35: CI stayed green while the README's run was red)."""
  ci = (REPO / ".ci" / "run").read_text()
  code = [line.split("#")[0] for line in ci.splitlines()]
  assert not any("pip install" in line or "pip3 install" in line for line in code), ".ci/run installs with pip beside the README"
  assert "--system-site-packages" not in ci and "python3 -m venv build/ci-venv" in ci
  out = subprocess.run(["awk", "/<!-- test-command/ {found = 1; next} found && /^python / {print; exit}", "README.md"],
                       cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
  assert out.startswith("python -m pip install") and "python -m pytest -n 2" in out and out.endswith("python tools/matrix.py")
  for src in ["core", *(p.parent.relative_to(REPO).as_posix() for p in REPO.glob("plugins/*/pyproject.toml"))]:
    assert f"./{src}" in out, f"the README's test command does not install {src}"
  assert '"./core[dev,crosscheck]"' in out, "the tests' PyTorch cross-checks come from core's [crosscheck] extra"
