"""Conformance: buffers and the allocator on the device under test (run tier)."""
import numpy as np
import pytest

from plugrad.device.buffer import Buffer
from plugrad.device.registry import OfflineDevice
from plugrad.device.smoke import run_smoke
from plugrad.dtype import dtypes
from plugrad.testing.harness import require_run
from plugrad.testing.kernels import dname, np_dtype

pytestmark = pytest.mark.plugrad_conformance


@pytest.fixture
def runs(plugrad_dev):
  require_run(plugrad_dev)
  return plugrad_dev


def test_smoke(plugrad_dev):
  if isinstance(plugrad_dev, OfflineDevice): pytest.skip(f"{plugrad_dev.name} is unavailable here ({plugrad_dev.reason})")
  res = run_smoke(plugrad_dev.name)
  assert res.passed, res.error or res.detail


@pytest.mark.parametrize("dt", [d for d in dtypes.all if d is not dtypes.bfloat16], ids=dname)
def test_copy_roundtrip(runs, dt):
  x = (np.arange(257) % 7).astype(np_dtype(dt))
  buf = Buffer(runs.name, x.size, dt).copyin(x.data.cast("B"))
  np.testing.assert_array_equal(buf.numpy(), x)


def test_views_share_memory(runs):
  base = Buffer(runs.name, 64, dtypes.float32).copyin(np.zeros(64, np.float32).data.cast("B"))
  if not runs.allocator.supports_views: pytest.skip(f"{runs.name}'s allocator has no views")
  view = base.view(16, dtypes.float32, offset=32 * 4)
  view.copyin(np.arange(16, dtype=np.float32).data.cast("B"))
  want = np.zeros(64, np.float32)
  want[32:48] = np.arange(16)
  np.testing.assert_array_equal(base.numpy(), want)


def test_allocator_reuses_freed_buffers(runs):
  alloc = runs.allocator
  alloc.free_cache()
  b = Buffer(runs.name, 1000, dtypes.float32).copyin(np.ones(1000, np.float32).data.cast("B"))
  handle = b.handle
  del b
  assert alloc.cached_bytes >= 4000
  again = Buffer(runs.name, 1000, dtypes.float32)
  again.allocate()
  assert again.handle is handle
