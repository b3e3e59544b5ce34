"""A plugin's declared expected failures (`plugrad_conformance_xfails`) are honoured, and they are strict."""
import pytest

from plugrad.builtin.interpreter import PythonRuntime
from plugrad.device.registry import Device
from plugrad.errors import LaunchError
from plugrad.plugin import hookimpl
from plugrad.plugin.manager import PluginManager, get_manager
from tests.plugin.fakes import FakeEntryPoint, PyClone


class BrokenAddRuntime(PythonRuntime):
  """The interpreter, except that it refuses float32 additions: a backend with one known bug."""
  def load(self, program):
    if program.name == "ew_add_float32": raise LaunchError("this backend cannot add float32 yet")
    return super().load(program)


class XFailPlugin(PyClone):
  def __init__(self, xfails):
    super().__init__("XF")
    self.xfails = xfails

  @hookimpl(tryfirst=True)
  def plugrad_runtime(self, device):
    return BrokenAddRuntime(device) if device == "XF" else None

  @hookimpl
  def plugrad_conformance_xfails(self, device):
    return self.xfails if device == "XF" else None


@pytest.fixture
def xf_device():
  before = get_manager()
  def use(xfails):
    Device.reset(PluginManager(entry_points=lambda: [FakeEntryPoint("xf", XFailPlugin(xfails), dist="plugrad-xf")]))
  yield use
  Device.reset(before)


def run(pytester, *args):
  return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist", "-o", "addopts=", "--pyargs", "plugrad.testing",
                                      "--plugrad-device=XF", *args)


def test_undeclared_failure_fails(pytester, xf_device):
  xf_device({})
  res = run(pytester, "-k", "ew-add-float32 and run")
  res.assert_outcomes(failed=1)


def test_declared_failure_is_xfail(pytester, xf_device):
  xf_device({"test_kernel[ew-add-float32-run]": "float32 add is not implemented yet"})
  res = run(pytester, "-k", "ew-add-float32 and run")
  res.assert_outcomes(xfailed=1)


def test_declared_failure_that_passes_fails_the_run(pytester, xf_device):
  xf_device({"test_kernel[ew-mul-float32-*]": "claimed broken, but it works"})
  res = run(pytester, "-k", "ew-mul-float32")
  res.assert_outcomes(failed=4)
  assert "XPASS(strict)" in res.stdout.str()


def test_bad_hook_result_is_a_clear_error(pytester, xf_device):
  xf_device(["not", "a", "dict"])
  res = run(pytester, "-k", "ew-mul-float32")
  assert res.ret != 0
  assert "must return a dict of str to str" in res.stdout.str()
