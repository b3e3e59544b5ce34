"""The native thread pool of the CPU graph runner (plugrad_cpu/native_pool.py): shares really run on other threads,
runs from two Python threads take turns, and a forked child starts its own workers."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np

from plugrad_cpu import native_pool
from plugrad_cpu.compiler import CPUCompiler
from plugrad_cpu.loader import load_shared
from plugrad_cpu.toolchain import toolchain

# a graph-shaped function: share `core` writes its thread id and adds 1 to every element of its part of b[1]
_SRC = """#define _GNU_SOURCE
#include <unistd.h>
#include <sys/syscall.h>
void tids(void **f, void **b, long long *v, const int *nt, int core, int cores) {
  long long *out = (long long *)b[0]; float *x = (float *)b[1]; long long n = v[0];
  out[core] = syscall(SYS_gettid);
  for (long long i = core * n / cores; i < (core + 1) * n / cores; i++) x[i] += 1.0f;
}
"""


def _fn():
  lib = load_shared(CPUCompiler(toolchain()).compile_cached(_SRC, "pool test"))
  return lib, lib.tids


_keep: list = []


def _tables(n: int, cores: int):
  out, x = np.zeros(cores, np.int64), np.zeros(n, np.float32)
  b = (ctypes.c_void_p * 2)(out.ctypes.data, x.ctypes.data)
  v = (ctypes.c_longlong * 1)(n)
  nt = (ctypes.c_int * 1)(cores)
  f = (ctypes.c_void_p * 1)()
  _keep.append((b, v, nt, f))  # the pool reads the tables through their addresses: they must stay alive
  return out, x, [ctypes.addressof(t) for t in (f, b, v, nt)]


def test_shares_run_on_distinct_native_threads():
  lib, fn = _fn()
  out, x, args = _tables(1000, 2)
  native_pool.run(fn, args, 2)
  assert out[0] == threading.get_native_id() and out[1] not in (0, out[0])  # share 1 ran on a worker thread
  np.testing.assert_array_equal(x, 1.0)  # each element exactly once
  for _ in range(200): native_pool.run(fn, args, 2)  # replays back to back, workers awake or woken
  np.testing.assert_array_equal(x, 201.0)


def test_runs_from_two_python_threads_take_turns():
  lib, fn = _fn()
  tabs = [_tables(4096, 2) for _ in range(2)]
  def loop(args): [native_pool.run(fn, args, 2) for _ in range(300)]
  ts = [threading.Thread(target=loop, args=(t[2],)) for t in tabs]
  for t in ts: t.start()
  for t in ts: t.join()
  for _, x, _ in tabs: np.testing.assert_array_equal(x, 300.0)


def test_a_forked_child_starts_its_own_workers():
  lib, fn = _fn()
  native_pool.run(fn, _tables(64, 2)[2], 2)  # the parent's workers exist now
  code = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, os.getcwd())
    from test_cpu_native_pool import _fn, _tables
    from plugrad_cpu import native_pool
    lib, fn = _fn()
    native_pool.run(fn, _tables(64, 2)[2], 2)
    pid = os.fork()
    if pid == 0:
      out, x, args = _tables(64, 2)
      native_pool.run(fn, args, 2)
      os._exit(0 if (x == 1.0).all() and out[1] not in (0, out[0]) else 3)
    _, status = os.waitpid(pid, 0)
    print("child", os.waitstatus_to_exitcode(status))
  """)
  here = os.path.dirname(os.path.abspath(__file__))  # the child imports this module from its directory
  res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=here)
  assert res.returncode == 0 and "child 0" in res.stdout, res.stdout + res.stderr
