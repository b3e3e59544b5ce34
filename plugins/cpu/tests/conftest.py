# plugrad-cpu's tests run against whatever plugrad and plugrad-cpu are importable: a wheel install from a copy of this
# directory, or the editable checkout. Every compiler stage is validated in tests; set before plugrad is imported anywhere.
import os

os.environ.setdefault("SPEC", "1")
os.environ.setdefault("PLUGRAD_STRICT_PLUGINS", "1")

import pytest

pytest.importorskip("plugrad_cpu", reason="plugrad-cpu is not installed (pip install -e 'plugins/cpu[llvm,test]')")


@pytest.fixture
def cpu():
  from plugrad.device.registry import Device
  try: return Device["CPU"]
  except Exception as e: pytest.skip(f"the CPU device is unavailable here: {e}")
