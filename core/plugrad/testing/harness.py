"""How the suite checks one kernel at one tier (ARCHITECTURE §5):

| tier    | needs                 | checks |
|---------|-----------------------|--------|
| render  | the device's renderer | the kernel renders to non-empty text that names the kernel |
| compile | the device's compiler | the rendered text compiles with the device's real toolchain |
| emulate | the PYTHON device     | the kernel, made for this device (its tensor cores, limits), computes the right numbers in the interpreter |
| run     | the device itself     | the kernel computes the right numbers on the device |

Tests are gated by capabilities the device declares (`renderer.capabilities`, `runtime.capabilities`), never by name.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from plugrad.builtin.python_renderer import TARGETS, PythonRenderer
from plugrad.device.buffer import Buffer
from plugrad.device.registry import CompiledDevice, Device, OfflineDevice
from plugrad.device.runner import ProgramRunner
from plugrad.dtype import DType, dtypes
from plugrad.plugin.hookspecs import device_name
from plugrad.renderer.base import Renderer
from plugrad.testing.kernels import SuiteKernel, as_dtype, np_dtype
from plugrad.uop.program import ProgramUOp

TIERS = ("render", "compile", "emulate", "run")


def runtime_capabilities(dev: CompiledDevice) -> frozenset[str]:
  """The runtime's capabilities; none for a device opened with `Device.offline` (unavailable here: nothing runs)."""
  return frozenset() if isinstance(dev, OfflineDevice) else frozenset(dev.runtime.capabilities)


def capabilities(dev: CompiledDevice) -> frozenset[str]:
  return frozenset(dev.renderer.capabilities) | runtime_capabilities(dev)


def require_run(dev: CompiledDevice) -> None:
  """Skip (with the reason) a test that runs kernels on a device that cannot."""
  if isinstance(dev, OfflineDevice): pytest.skip(f"{dev.name} is unavailable here ({dev.reason}): only rendered and compiled")
  if "run" not in dev.runtime.capabilities: pytest.skip(f"{dev.name} does not run kernels (its runtime lacks the 'run' capability)")


def require(dev: CompiledDevice, needs: frozenset[str], tier: str) -> None:
  """Skip (with the reason) when the device lacks a capability the kernel or tier needs."""
  if tier == "run": require_run(dev)
  if tier != "emulate" and (missing := needs - capabilities(dev)):
    pytest.skip(f"{dev.name} lacks {', '.join(sorted(missing))}")
  if tier == "emulate" and (missing := needs - frozenset(emulating_renderer(dev).capabilities)):
    pytest.skip(f"the PYTHON emulation of {dev.name} lacks {', '.join(sorted(missing))}")


def emulating_renderer(dev: CompiledDevice) -> Renderer:
  """The PYTHON renderer that emulates `dev`: its limits and tensor cores when the interpreter knows the device (the
  target its renderer names in `emulate_target`, else the one named like the device)."""
  name = device_name(dev.name)
  if name == "PYTHON": return dev.renderer  # already the interpreter (possibly under EMULATE=...)
  target = getattr(dev.renderer, "emulate_target", None) or name
  return PythonRenderer("PYTHON", emulate=target if target in TARGETS else None)


def check_kernel(dev: CompiledDevice, build: Callable[[Renderer], SuiteKernel], tier: str) -> None:
  kernel = build(dev.renderer)
  require(dev, kernel.needs, tier)
  if tier == "render":
    src = dev.renderer.render(kernel.program(dev.name, dev.renderer))
    assert isinstance(src, str) and src.strip(), f"{dev.name} rendered {kernel.name} to {src!r}"
    assert kernel.name in src, f"the source {dev.name} rendered for {kernel.name} does not name the kernel"
  elif tier == "compile":
    lib = dev.compiler.compile_cached(dev.renderer.render(kernel.program(dev.name, dev.renderer)), kernel.name)
    assert isinstance(lib, bytes), f"{dev.name} compiled {kernel.name} to a {type(lib).__name__}, expected bytes"
  elif tier == "emulate":
    p = kernel.program("PYTHON", emu := emulating_renderer(dev))
    run_and_compare(Device["PYTHON"], p.with_source(emu.render(p)), kernel)
  elif tier == "run": run_and_compare(dev, kernel.program(dev.name, dev.renderer), kernel)
  else: raise ValueError(f"unknown conformance tier {tier!r}; the tiers are {TIERS}")


def _buffer(dev: CompiledDevice, size: int, dt: DType, data: np.ndarray | None) -> Buffer:
  buf = Buffer(dev.name, size, dt)
  if data is None: data = np.zeros(size, np_dtype(dt))
  raw = (np.asarray(data, np.float32).view(np.uint32) >> 16).astype(np.uint16) if dt is dtypes.bfloat16 else np.ascontiguousarray(data, np_dtype(dt))
  return buf.copyin(raw.data.cast("B"))


def run_and_compare(dev: CompiledDevice, program: ProgramUOp, kernel: SuiteKernel) -> None:
  bufs = [_buffer(dev, kernel.sizes[s], kernel.dtypes[s], kernel.inputs.get(s)) for s in sorted(kernel.sizes)]
  ProgramRunner(program)(bufs, kernel.var_vals, wait=True)
  dev.synchronize()
  for slot, want in kernel.expected.items():
    got = bufs[slot].numpy()
    assert_close(got, as_dtype(want, kernel.dtypes[slot]) if kernel.dtypes[slot] is not dtypes.bool else want, kernel, slot)


def assert_close(got: np.ndarray, want: np.ndarray, kernel: SuiteKernel, slot: int) -> None:
  what = f"kernel {kernel.name}, output slot {slot}"
  if kernel.rtol or kernel.atol:
    np.testing.assert_allclose(got.astype(np.float64), np.asarray(want).astype(np.float64), rtol=kernel.rtol, atol=kernel.atol, err_msg=what)
  else: np.testing.assert_array_equal(got, want, err_msg=what)


def describe(dev: Any) -> str:
  r = dev.renderer
  return f"{dev.name} ({dev.distribution} {dev.plugin_version}): capabilities {sorted(capabilities(dev))}, tensor cores {len(r.tensor_cores)}"
