# plugrad-cuda's tests run against whatever plugrad and plugrad-cuda are importable: a wheel install from a copy of this
# directory, or the editable checkout. No GPU is needed: NVRTC and nvJitLink come from NVIDIA's pip wheels, and the
# driver calls run on a GPU machine (bench/gpu/cuda_check.sh). Every compiler stage is validated in tests; set before
# plugrad is imported anywhere.
import importlib.util
import os

os.environ.setdefault("SPEC", "1")
os.environ.setdefault("PLUGRAD_STRICT_PLUGINS", "1")

import pytest

if importlib.util.find_spec("plugrad_cuda") is None:
  pytest.skip("plugrad-cuda is not installed (pip install -e 'plugins/cuda[test]')", allow_module_level=True)
