import pytest

pytest.importorskip("plugrad_webgpu", reason="plugrad-webgpu is not installed (pip install wgpu -e plugins/webgpu)")
pytest.importorskip("wgpu", reason="wgpu is not installed (pip install wgpu)")


@pytest.fixture(scope="session")
def webgpu():
  from plugrad.device.registry import Device
  from plugrad_webgpu.context import probe
  if (why := probe()) is not None: pytest.skip(f"no WebGPU adapter here: {why}")
  return Device["WEBGPU"]
