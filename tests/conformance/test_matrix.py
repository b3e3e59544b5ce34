"""The per-device conformance matrix (ARCHITECTURE §6): every device this machine has runs every tier it allows,
through the same command a backend author uses: `pytest --pyargs plugrad.testing --plugrad-device=NAME`."""
import importlib.util
import os
import subprocess
import sys

import pytest

from plugrad.device.registry import Device

# (device, EMULATE target, extra environment, test id): the CPU device both ways, C by the system compiler (CPU_LLVM=0)
# and LLVM IR compiled in-process (CPU_LLVM=1, the default where llvmlite is installed)
CASES = [("PYTHON", None, {}, "PYTHON"), ("NULL", None, {}, "NULL"), ("PYTHON", "CUDA", {}, "PYTHON-EMULATE=CUDA"),
         ("PYTHON", "METAL", {}, "PYTHON-EMULATE=METAL"), ("PYTHON", "AMD", {}, "PYTHON-EMULATE=AMD"),
         ("PYTHON", "AMD_MFMA", {}, "PYTHON-EMULATE=AMD_MFMA"), ("CPU", None, {"CPU_LLVM": "0"}, "CPU-C"),
         ("CPU", None, {"CPU_LLVM": "1"}, "CPU-LLVM"), ("WEBGPU", None, {}, "WEBGPU"),
         ("CUDA", None, {"CUDA_ARCH": "sm_80"}, "CUDA-sm_80"), ("CUDA", None, {"CUDA_ARCH": "sm_90"}, "CUDA-sm_90"),
         # METAL without a Mac: the compile tier is plugrad-metal's approximate check (clang++ against a shim header),
         # MSL 3.1 (native bfloat) and 3.0 (bfloat16 emulated by the shared pass)
         ("METAL", None, {"METAL_LANGUAGE": "3.1"}, "METAL-3.1-syntax-checked-not-Metal-compiled"),
         ("METAL", None, {"METAL_LANGUAGE": "3.0"}, "METAL-3.0-syntax-checked-not-Metal-compiled"),
         # AMD without an AMD GPU: real code objects from clang + lld; the emulate tier runs MFMA (gfx942) and WMMA (gfx1100)
         ("AMD", None, {"AMD_ARCH": "gfx942"}, "AMD-gfx942"), ("AMD", None, {"AMD_ARCH": "gfx1100"}, "AMD-gfx1100")]
# devices whose plugin needs a package that a development install may lack (.ci/run installs them all, so CI runs every case)
NEEDS = {"WEBGPU": ("plugrad_webgpu", "wgpu"), "CUDA": ("plugrad_cuda",), "METAL": ("plugrad_metal",), "AMD": ("plugrad_amd",)}
# devices checked without their hardware where it is missing: the tiers that need none (the suite opens the device with
# Device.offline when the run tier is not selected); with the hardware, every tier runs
OFFLINE_TIERS = {"CUDA": "render,compile,emulate", "METAL": "render,compile,emulate", "AMD": "render,compile,emulate"}
ENV_NEEDS = {("CPU_LLVM", "1"): "llvmlite"}  # the package an extra environment setting needs


@pytest.mark.parametrize("device, emulate, extra", [c[:3] for c in CASES], ids=[c[3] for c in CASES])
def test_conformance_suite(device, emulate, extra, tmp_path):
  for module in NEEDS.get(device, ()):
    if importlib.util.find_spec(module) is None: pytest.skip(f"{device} needs the {module} package (.ci/run installs it)")
  for (var, value), module in ENV_NEEDS.items():
    if extra.get(var) == value and importlib.util.find_spec(module) is None:
      pytest.skip(f"{var}={value} needs the {module} package (.ci/run installs it)")
  if device == "METAL":  # off macOS its compile tier needs clang (.ci/run installs clang-19)
    from plugrad_metal.syntax import find_clang
    if sys.platform != "darwin" and find_clang() is None: pytest.skip("the METAL syntax check needs clang (apt-get install clang-19)")
  if device == "AMD":  # its compile tier needs clang and lld with the AMDGPU target (.ci/run installs clang-19 lld-19)
    from plugrad_amd.toolchain import missing
    if (no_clang := missing()) is not None: pytest.skip(no_clang)
  probe = Device.spec(device).probe if device in NEEDS else None
  offline = probe is not None and (why := probe()) is not None
  if offline and device not in OFFLINE_TIERS:
    pytest.skip(f"{device} is not available here: {why} (.ci/run installs Mesa's drivers and checks every device first)")
  env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "EMULATE", "CPU_LLVM", "CUDA_ARCH", "METAL_LANGUAGE", "AMD_ARCH"))}
  env.update(SPEC="1", PLUGRAD_STRICT_PLUGINS="1", PLUGRAD_CACHE_DIR=str(tmp_path), **extra)
  cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--pyargs", "plugrad.testing",
         f"--plugrad-device={device}", "-o", "addopts="]
  if offline: cmd.append(f"--plugrad-tiers={OFFLINE_TIERS[device]}")
  if emulate:  # the emulated targets differ in kernel-level features (tensor cores, limits); tensor tests run once above
    env["EMULATE"] = emulate
    cmd += ["-k", "test_kernel"]
  res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
  summary = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
  assert res.returncode == 0, \
    f"conformance suite failed on {device} (EMULATE={emulate}, {extra}): {summary}\n{res.stdout[-6000:]}\n{res.stderr[-2000:]}"
  assert " passed" in summary, summary
