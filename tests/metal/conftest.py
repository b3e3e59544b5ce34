import importlib.util

import pytest

# plugrad-metal is installed by .ci/run; a development install may lack it
if importlib.util.find_spec("plugrad_metal") is None: pytest.skip("plugrad-metal is not installed (.ci/run installs it)", allow_module_level=True)
