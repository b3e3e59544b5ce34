# plugrad-metal's tests run against whatever plugrad and plugrad-metal are importable: a wheel install from a copy of
# this directory, or the editable checkout. Off macOS they check the renderer, the approximate syntax tier (clang++
# against the shim header; skipped without clang) and the ICB plan. Every compiler stage is validated in tests; set
# before plugrad is imported anywhere.
import importlib.util
import os

os.environ.setdefault("SPEC", "1")
os.environ.setdefault("PLUGRAD_STRICT_PLUGINS", "1")

import pytest

if importlib.util.find_spec("plugrad_metal") is None:
  pytest.skip("plugrad-metal is not installed (pip install -e 'plugins/metal[test]')", allow_module_level=True)
