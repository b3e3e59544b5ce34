"""The ONNX backend node tests through plugrad.onnx (tests/onnx/node_tests.py grades them): every base case on CPU, a
sample on PYTHON and WEBGPU. A case passes when it matches the reference outputs, or when its operator is one
plugrad.onnx does not support and it is refused with UnsupportedOnnxOpError naming the node; KNOWN_FAILURES are
strict xfails; excluded cases (random ops, strings, types plugrad has no dtype for) skip with the reason."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("onnx", reason="the ONNX frontend parses models with the onnx package (pip install onnx)")

from tests.onnx import node_tests
from tests.onnx.report import STATS

CASES = node_tests.cases()
# a deterministic sample for the other devices: every 8th case (~165). WEBGPU refuses the cases that need 64-bit types
# (most: ONNX's shapes and indices are int64) with UnsupportedDTypeError naming the dtype, counted as refused
SAMPLE = CASES[::8]


# cases a device computes differently, with why (strict xfails on that device)
DEVICE_FAILURES = {"WEBGPU": {"test_mish": "tanh near 0 on WEBGPU (lavapipe) loses ~1e-3 of relative precision: mish(-7.7)"}}


def _check(case: Path, device: str) -> None:
  r = node_tests.run_case(case, device)
  STATS[f"{device} {r.status}"] += 1
  if r.status == "excluded": pytest.skip(r.why)
  if (why := node_tests.KNOWN_FAILURES.get(case.name) or DEVICE_FAILURES.get(device, {}).get(case.name)) is not None:
    assert r.status == "failed", f"a known failure now {r.status}: remove it from the known failures"
    pytest.xfail(why)
  if r.status == "unsupported": return  # refused with a typed error that names the node and op: what we promise
  assert r.status == "passed", r.why


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_cpu(case: Path) -> None: _check(case, "CPU")


@pytest.mark.parametrize("case", SAMPLE, ids=lambda c: c.name)
def test_python(case: Path) -> None: _check(case, "PYTHON")


@pytest.mark.parametrize("case", SAMPLE, ids=lambda c: c.name)
def test_webgpu(case: Path) -> None:
  pytest.importorskip("plugrad_webgpu", reason="plugrad-webgpu is not installed (pip install -e plugins/webgpu)")
  from plugrad_webgpu.context import probe
  if (why := probe()) is not None: pytest.skip(f"no WebGPU adapter here: {why}")
  _check(case, "WEBGPU")
