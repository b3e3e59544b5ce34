# plugrad-amd's tests run against whatever plugrad and plugrad-amd are importable: a wheel install from a copy of this
# directory, or the editable checkout. Every compiler stage is validated in tests; set before plugrad is imported anywhere.
# The compiler tests also need clang and lld (they skip without); the runtime is driven through a stand-in HIP.
import importlib.util
import os

os.environ.setdefault("SPEC", "1")
os.environ.setdefault("PLUGRAD_STRICT_PLUGINS", "1")

import pytest

if importlib.util.find_spec("plugrad_amd") is None:
  pytest.skip("plugrad-amd is not installed (pip install -e 'plugins/amd[test]')", allow_module_level=True)
