import pytest

pytest.importorskip("plugrad_cpu", reason="plugrad-cpu is not installed (pip install -e plugins/cpu)")


@pytest.fixture
def cpu():
  from plugrad.device.registry import Device
  try: return Device["CPU"]
  except Exception as e: pytest.skip(f"the CPU device is unavailable here: {e}")
