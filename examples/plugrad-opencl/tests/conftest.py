"""Every compiler stage is validated (SPEC=1) and every plugin problem is fatal (PLUGRAD_STRICT_PLUGINS=1) in these tests."""
import os

os.environ.setdefault("SPEC", "1")
os.environ.setdefault("PLUGRAD_STRICT_PLUGINS", "1")

import pytest


@pytest.fixture(scope="session")
def opencl() -> str:
  """The device under test; the tests that need a real OpenCL device skip with the probe's reason without one."""
  from plugrad_opencl.platform import probe
  if (why := probe()) is not None: pytest.skip(f"no OpenCL device here: {why}")
  return "OPENCL"
