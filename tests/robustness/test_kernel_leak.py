"""A long run with ever new shapes: the loaded kernels are bounded (MAX_LOADED_KERNELS, least recently used dropped),
a dropped kernel's code is unloaded once nothing holds it (the CPU's shared objects are dlclosed), and one still held
(as a TinyJit holds its runners) keeps working. Memory maps are counted from /proc/self/maps."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import plugrad.codegen as codegen
import plugrad.engine.realize as realize
from plugrad import Tensor
from plugrad.helpers import MAX_LOADED_KERNELS, Context, LRUCache, SettingsError

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="counts memory maps in /proc/self/maps (Linux)")


def maps() -> int:
  with open("/proc/self/maps") as f: return sum(1 for _ in f)


def kernel(n: int) -> float: return (Tensor(np.ones(n, np.float32), device="CPU") * 3).sum().item()


def test_lru_cache_keeps_the_most_recently_used():
  with Context(MAX_LOADED_KERNELS=3):
    c: LRUCache[str, int] = LRUCache(MAX_LOADED_KERNELS)
    for k in "abc": c[k] = ord(k)
    assert c.get("a") == 97  # a use: "b" is now the least recent
    c["d"] = 100
    assert list(c) == ["c", "a", "d"] and c["a"] == 97 and c.get("b") is None
    with pytest.raises(KeyError): c["b"]


def test_distinct_kernels_keep_memory_maps_flat():
  with Context(MAX_LOADED_KERNELS=16):
    for n in range(1, 40): assert kernel(n) == 3.0 * n  # the caches fill up
    gc.collect()
    before = maps()
    for n in range(100, 220): assert kernel(n) == 3.0 * n
    gc.collect()
    grown = maps() - before
    assert len(realize._runners) <= 16 and len(codegen._cache) <= 16
  # unbounded, each new kernel kept 2 (LLVM object) to 5 (shared object) maps: 240 to 600 here
  assert grown < 30, f"{grown} new memory maps for 120 new kernels"


CHILD = """
import gc, numpy as np
from plugrad import Tensor
from plugrad.helpers import Context
def maps():
  with open("/proc/self/maps") as f: return sum(1 for _ in f)
with Context(MAX_LOADED_KERNELS=16):
  for n in range(1, 40): assert (Tensor(np.ones(n, np.float32)) * 3).sum().item() == 3.0 * n
  gc.collect(); before = maps()
  for n in range(100, 220): assert (Tensor(np.ones(n, np.float32)) * 3).sum().item() == 3.0 * n
  gc.collect(); print(maps() - before)
"""


def test_c_path_shared_objects_are_unloaded(tmp_path):
  # the C compiler's shared objects (dlopen): without dlclose each kept ~5 maps
  env = {**os.environ, "CPU_LLVM": "0", "DEV": "CPU", "PLUGRAD_CACHE_DIR": str(tmp_path / "cache")}
  proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert int(proc.stdout.split()[-1]) < 30, proc.stdout


def test_a_held_runner_outlives_its_eviction():
  t = Tensor(np.arange(7, dtype=np.float32), device="CPU") * 5
  t.realize()
  held = list(realize._runners.values())[-1]  # what a TinyJit's captured ExecItem holds
  with Context(MAX_LOADED_KERNELS=2):
    for n in range(300, 310): kernel(n)
    assert held not in realize._runners.values()
  from plugrad.device.buffer import Buffer
  from plugrad.dtype import dtypes
  bufs = [Buffer("CPU", 7, dtypes.float32) for _ in range(len(held.program.globals))]
  bufs[1].copyin(np.arange(7, dtype=np.float32).data)
  held(bufs, {}, wait=True)
  np.testing.assert_array_equal(bufs[0].numpy(), np.arange(7, dtype=np.float32) * 5)


def test_bad_setting_is_a_settings_error():
  proc = subprocess.run([sys.executable, "-c", textwrap.dedent("""
    import plugrad.helpers
    try: plugrad.helpers.MAX_LOADED_KERNELS.value
    except Exception as e: print(type(e).__name__, e)
  """)], capture_output=True, text=True, env={**os.environ, "MAX_LOADED_KERNELS": "0"}, timeout=120)
  assert "MAX_LOADED_KERNELS" in proc.stdout + proc.stderr and SettingsError.__name__ in proc.stdout + proc.stderr, proc.stdout + proc.stderr
