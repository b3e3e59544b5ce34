"""Registration: the device listing, its priority below CPU's, and the probe's reasons where OpenCL is missing."""
from __future__ import annotations

import os
import subprocess
import sys

from plugrad import Device

PROBE = "from plugrad_opencl.platform import probe; print(probe())"


def test_registered_below_cpu() -> None:
  spec = Device.spec("OPENCL")
  assert 0 <= spec.priority < 100  # the CPU plugin's is 100 (docs/writing-a-backend.md): OPENCL never becomes the default over it
  assert Device.canonicalize("cl:0") == "OPENCL"


def test_probe_names_a_broken_icd_setting() -> None:
  env = {**os.environ, "OCL_ICD_VENDORS": "/nonexistent/vendors"}
  out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True).stdout
  assert "no OpenCL platform found" in out and "OCL_ICD_VENDORS='/nonexistent/vendors'" in out and "pip install pyopencl" in out


def test_probe_without_pyopencl() -> None:
  hide = "import sys; sys.modules['pyopencl'] = None; "  # Python's own way to make a module unimportable
  out = subprocess.run([sys.executable, "-c", hide + PROBE], capture_output=True, text=True, check=True).stdout
  assert out.startswith("pyopencl is not installed: pip install pyopencl")


def test_smoke(opencl: str) -> None:
  res = subprocess.run([sys.executable, "-m", "plugrad", "devices", opencl], capture_output=True, text=True)
  assert res.returncode == 0, res.stdout + res.stderr
  assert "PASS" in res.stdout and "computed correctly" in res.stdout


def test_probe_leaves_out_a_device_that_cannot_build() -> None:
  """A driver that fails every build (PoCL's LLVM on a CPU it does not know) makes its device unavailable, with the
  driver's own first line of the error, not a device whose every kernel then fails."""
  from plugrad_opencl.platform import _build_fails
  class Program:
    def __init__(self, ctx: object, src: str) -> None: self.src = src
    def build(self) -> None:
      raise RuntimeError("clBuildProgram failed: BUILD_PROGRAM_FAILURE\n\nBuild on <pyopencl.Device>:\n\nerror: unknown target CPU 'generic'\n")
  class Fake:
    Context = staticmethod(lambda devices: devices)
  Fake.Program = Program  # type: ignore[attr-defined]
  assert _build_fails(Fake, object()) == "error: unknown target CPU 'generic'"
  class Builds(Program):
    def build(self) -> None: pass
  Fake.Program = Builds  # type: ignore[attr-defined]
  assert _build_fails(Fake, object()) is None
