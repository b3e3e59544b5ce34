import importlib.util

import pytest

# plugrad-cuda and its NVRTC/nvJitLink wheels are installed by .ci/run; a development install may lack them
if importlib.util.find_spec("plugrad_cuda") is None: pytest.skip("plugrad-cuda is not installed (.ci/run installs it)", allow_module_level=True)
