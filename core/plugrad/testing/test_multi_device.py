"""Conformance: several instances of the device under test in one process (run tier; docs/sharding.md). A backend that
declares more than one instance (`DeviceSpec.count` > 1, or no count: a virtual device such as PYTHON) copies between
two of them (its allocator's `_transfer` when it has one, else through host memory) and runs a tensor sharded across
them: kernels on each, the copies of an all-reduce and a gather, and a TinyJit replay of all of it."""
from __future__ import annotations

import numpy as np
import pytest

from plugrad.device.buffer import Buffer
from plugrad.device.registry import Device
from plugrad.dtype import DType, dtypes
from plugrad.engine.jit import TinyJit
from plugrad.plugin.hookspecs import parse_device
from plugrad.tensor.tensor import Tensor
from plugrad.testing.kernels import dname, np_dtype

pytestmark = pytest.mark.plugrad_conformance
RNG = np.random.default_rng(11)


@pytest.fixture
def instances(run_device: str) -> tuple[str, str]:
  """The device under test and the next instance of it; skips a device that declares a single instance."""
  name, index = parse_device(run_device)
  count = Device.manager.count(name)
  if count is not None and index + 1 >= count:
    pytest.skip(f"{name} declares {count} instance{'s' if count != 1 else ''} (DeviceSpec.count): no second one to test with")
  return run_device, Device.canonicalize(f"{name}:{index + 1}")


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.int8, dtypes.uint32], ids=dname)
def test_copy_between_instances(instances: tuple[str, str], dt: DType) -> None:
  a, b = instances
  x = (np.arange(1000) % 97).astype(np_dtype(dt))
  src = Buffer(a, x.size, dt).copyin(x.data.cast("B"))
  dest = Buffer(b, x.size, dt).copy_from(src)
  np.testing.assert_array_equal(dest.numpy(), x)
  np.testing.assert_array_equal(Buffer(a, x.size, dt).copy_from(dest).numpy(), x)


def test_sharded_ops(instances: tuple[str, str]) -> None:
  x, w = RNG.uniform(-1, 1, (6, 5)).astype(np.float32), RNG.uniform(-1, 1, (5, 3)).astype(np.float32)
  xs, ws = Tensor(x).shard(instances, axis=0), Tensor(w).shard(instances, axis=0)
  assert xs.device == instances and xs.shape == (6, 5)
  np.testing.assert_allclose((xs * 2 + 1).numpy(), x * 2 + 1, rtol=1e-6)
  np.testing.assert_allclose(xs.sum(0).numpy(), x.sum(0), rtol=1e-5, atol=1e-6)  # an all-reduce
  np.testing.assert_allclose(xs.max(1).numpy(), x.max(1))
  np.testing.assert_allclose((xs @ ws).numpy(), x @ w, rtol=1e-5, atol=1e-6)  # the contraction over ws's sharded axis
  np.testing.assert_allclose(xs.to(instances[1]).numpy(), x)  # a gather


def test_sharded_jit(instances: tuple[str, str]) -> None:
  @TinyJit
  def f(a: Tensor, b: Tensor) -> Tensor: return ((a * b).sum(0) + a.sum()).realize()
  for _ in range(4):
    a, b = RNG.uniform(-1, 1, (4, 3)).astype(np.float32), RNG.uniform(-1, 1, (4, 3)).astype(np.float32)
    out = f(Tensor(a).shard(instances, axis=0), Tensor(b).shard(instances, axis=0))
    np.testing.assert_allclose(out.numpy(), (a * b).sum(0) + a.sum(), rtol=1e-5, atol=1e-6)
