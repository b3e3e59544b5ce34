"""The per-device conformance matrix (ARCHITECTURE §6): every device this machine has runs every tier it allows,
through the same command a backend author uses: `pytest --pyargs plugrad.testing --plugrad-device=NAME`."""
import importlib.util
import os
import subprocess
import sys

import pytest

from plugrad.device.registry import Device

CASES = [("PYTHON", None), ("NULL", None), ("PYTHON", "CUDA"), ("PYTHON", "METAL"), ("PYTHON", "AMD"), ("CPU", None), ("WEBGPU", None)]
# devices whose plugin needs a package that a development install may lack (.ci/run installs them all, so CI runs every case)
NEEDS = {"WEBGPU": ("plugrad_webgpu", "wgpu")}


@pytest.mark.parametrize("device, emulate", CASES, ids=[d + (f"-EMULATE={e}" if e else "") for d, e in CASES])
def test_conformance_suite(device, emulate, tmp_path):
  for module in NEEDS.get(device, ()):
    if importlib.util.find_spec(module) is None: pytest.skip(f"{device} needs the {module} package (.ci/run installs it)")
  probe = Device.spec(device).probe if device in NEEDS else None
  if probe is not None and (why := probe()) is not None:
    pytest.skip(f"{device} is not available here: {why} (.ci/run installs Mesa's drivers and checks every device first)")
  env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "EMULATE"))}
  env.update(SPEC="1", PLUGRAD_STRICT_PLUGINS="1", PLUGRAD_CACHE_DIR=str(tmp_path))
  cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--pyargs", "plugrad.testing",
         f"--plugrad-device={device}", "-o", "addopts="]
  if emulate:  # the emulated targets differ in kernel-level features (tensor cores, limits); tensor tests run once above
    env["EMULATE"] = emulate
    cmd += ["-k", "test_kernel"]
  res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
  summary = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
  assert res.returncode == 0, f"conformance suite failed on {device} (EMULATE={emulate}): {summary}\n{res.stdout[-6000:]}\n{res.stderr[-2000:]}"
  assert " passed" in summary, summary
