# plugrad-webgpu's tests run against whatever plugrad and plugrad-webgpu are importable: a wheel install from a copy of
# this directory, or the editable checkout. Without a GPU the adapter is Mesa's software rasterizer (lavapipe or
# llvmpipe); with no adapter at all the tests that need one skip with the probe's reason. Every compiler stage is
# validated in tests; set before plugrad is imported anywhere.
import os

os.environ.setdefault("SPEC", "1")
os.environ.setdefault("PLUGRAD_STRICT_PLUGINS", "1")

import pytest

pytest.importorskip("plugrad_webgpu", reason="plugrad-webgpu is not installed (pip install -e 'plugins/webgpu[test]')")
pytest.importorskip("wgpu", reason="wgpu is not installed (pip install wgpu)")


@pytest.fixture(scope="session")
def webgpu():
  from plugrad.device.registry import Device
  from plugrad_webgpu.context import probe
  if (why := probe()) is not None: pytest.skip(f"no WebGPU adapter here: {why}")
  return Device["WEBGPU"]
