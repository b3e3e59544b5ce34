"""The differential tester (issue 21): every Tensor method with a PyTorch counterpart, on generated cases, against
PyTorch on the CPU. One test per (method, dtype); `DIFF_EXAMPLES=N` sets the examples per test (docs/testing.md)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from . import harness
from .expectations import ALLOWED, KNOWN_BUGS
from .harness import Case, Mismatch, check, examples, explain
from .ops import EXCLUDED, OPS, OPS_BY_NAME

pytestmark = pytest.mark.filterwarnings("ignore")


def _settings(n: int) -> settings:
  # no shrinking unless DIFF_SHRINK=1: every smaller shape it tries compiles new kernels
  phases = (Phase.explicit, Phase.generate) + ((Phase.shrink,) if harness.shrink() else ())
  return settings(max_examples=n, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck), phases=phases,
                  print_blob=False)


def cases(op, dt):
  @st.composite
  def strat(draw):
    args, kw = op.gen(draw, dt)
    return Case(op.name, dt, args, kw)
  return strat()


PAIRS = [(op, dt) for op in OPS for dt in op.dtypes]


@pytest.mark.parametrize("op,dt", PAIRS, ids=[f"{op.name}-{dt}" for op, dt in PAIRS])
def test_op(op, dt):
  @_settings(examples())
  @given(cases(op, dt))
  def run(case):
    check(op, case, ALLOWED, KNOWN_BUGS)
  run()


PY_PAIRS = [(op, next(d for d in ("float32", "int32", *op.dtypes) if d in op.dtypes)) for op in OPS if op.python]


@pytest.mark.parametrize("op,dt", PY_PAIRS, ids=[f"{op.name}-{dt}" for op, dt in PY_PAIRS])
def test_op_python_device(op, dt):
  """A small subset on the PYTHON reference interpreter (slow: a couple of examples each)."""
  @_settings(max(1, examples() // 2))
  @given(cases(op, dt))
  def run(case):
    check(op, case, ALLOWED, KNOWN_BUGS, device="PYTHON")
  run()


@pytest.mark.parametrize("bug", KNOWN_BUGS, ids=[b.id for b in KNOWN_BUGS])
def test_known_bug(bug, request):
  """The reproducer of a known bug, with nothing tolerated: a strict xfail, so a fix shows up as a failure."""
  request.applymarker(pytest.mark.xfail(strict=True, raises=Mismatch, reason=bug.what))
  op = OPS_BY_NAME[bug.op]
  found = explain(op, bug.repro, ALLOWED, harness.DEVICE, count=False)  # [] once some reference agrees: fixed
  assert not found or any({p for p, _ in left} <= bug.parts() for left in found), f"{bug.id} fails on more than its {bug.part}: {found}"
  if found: raise Mismatch(bug.part, f"{bug.repro!r}: " + "; ".join(m for _, m in found[0]))


def test_known_bugs_name_real_ops():
  for b in KNOWN_BUGS:
    assert b.op in OPS_BY_NAME and b.parts() <= {"value", "dtype", "grad", "raises"} and b.when(b.repro), b.id
  assert len({b.id for b in KNOWN_BUGS}) == len(KNOWN_BUGS), "duplicate KnownBug ids"
  for a in ALLOWED: assert a.op in OPS_BY_NAME and a.part in ("value", "dtype", "grad", "raises"), a


API = Path(__file__).resolve().parents[3] / "shared" / "TENSOR_API.md"


def api_names() -> set[str]:
  text = API.read_text()
  names = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)", text.split("## Names the Tensor must provide", 1)[1]))
  not_methods = {"Tensor", "dtypes", "Device", "rounding_mode", "return_indices", "reduction", "correction", "modes"}  # words in the prose
  return names - not_methods


@pytest.mark.skipif(not API.exists(), reason="../shared/TENSOR_API.md is not next to this checkout")
def test_every_api_name_is_compared_or_excluded():
  covered = {n for op in OPS for n in op.names()}
  missing = sorted(n for n in api_names() if n not in covered and n not in EXCLUDED)
  assert not missing, f"TENSOR_API.md names neither in the table (ops.py) nor in EXCLUDED: {missing}"
