"""A pool of native threads that runs a graph batch (`plugrad_graph(fn, b, v, nt, core, cores)`) on several cores with
one foreign call and no Python in between.

Handing a share to a Python worker thread costs two GIL hand-offs and two thread wake-ups: ~60-85 us per parallel
launch on this 2-vCPU VM, as much as a small kernel computes. Here the caller bumps a generation counter, the workers
(pthreads, spinning SPIN_NS after each job before they block on a condition variable) run their share, the caller runs
share 0 and waits for a done counter, all in C. One run at a time (a mutex): graphs replayed from two Python threads
take turns. After a fork the child starts with no workers (they do not survive a fork).
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

SPIN_NS = 250_000  # a replay loop calls again within this, so the workers are still awake

_SRC = """#include <pthread.h>
#include <sched.h>
#include <time.h>
typedef void (*graph_fn)(void **, void **, long long *, const int *, int, int);
static long long spin_ns = SPIN_NS_VALUE;
static pthread_mutex_t run_mu = PTHREAD_MUTEX_INITIALIZER, mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static graph_fn job_fn; static void **job_f, **job_b; static long long *job_v; static const int *job_nt; static int job_cores;
static int gen, done, started, created_gen;  /* created_gen: the generation a new worker starts from */

static long long now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000LL + t.tv_nsec; }
static void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static void *worker(void *arg) {
  int core = (int)(long)arg, seen = __atomic_load_n(&created_gen, __ATOMIC_ACQUIRE);
  for (;;) {
    long long end = now() + spin_ns; unsigned i = 0;
    while (__atomic_load_n(&gen, __ATOMIC_ACQUIRE) == seen) {
      if ((++i & 63) == 0 && now() > end) {
        pthread_mutex_lock(&mu);
        while (__atomic_load_n(&gen, __ATOMIC_ACQUIRE) == seen) pthread_cond_wait(&cv, &mu);
        pthread_mutex_unlock(&mu);
        break;
      }
      relax();
    }
    seen = __atomic_load_n(&gen, __ATOMIC_ACQUIRE);
    if (core < job_cores) job_fn(job_f, job_b, job_v, job_nt, core, job_cores);
    __atomic_add_fetch(&done, 1, __ATOMIC_ACQ_REL);
  }
  return 0;
}

/* fn's shares 0..cores-1 on this thread and cores-1 workers; returns 0, or -1 when a worker thread cannot start */
int plugrad_pool_run(graph_fn fn, void **f, void **b, long long *v, const int *nt, int cores) {
  pthread_mutex_lock(&run_mu);
  __atomic_store_n(&created_gen, __atomic_load_n(&gen, __ATOMIC_ACQUIRE), __ATOMIC_RELEASE);  /* before this job's bump */
  while (started < cores - 1) {
    pthread_t t;
    if (pthread_create(&t, 0, worker, (void *)(long)(started + 1)) != 0) { pthread_mutex_unlock(&run_mu); return -1; }
    pthread_detach(t);
    started++;
  }
  job_fn = fn; job_f = f; job_b = b; job_v = v; job_nt = nt; job_cores = cores;
  __atomic_store_n(&done, 0, __ATOMIC_RELEASE);
  pthread_mutex_lock(&mu);
  __atomic_add_fetch(&gen, 1, __ATOMIC_ACQ_REL);
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);
  fn(f, b, v, nt, 0, cores);
  unsigned i = 0;
  while (__atomic_load_n(&done, __ATOMIC_ACQUIRE) < started) if (++i > 4096) sched_yield(); else relax();
  pthread_mutex_unlock(&run_mu);
  return 0;
}

/* 1 when *p >= want, 0 when `ns` nanoseconds passed first (the Python worker pool of single launches waits with it) */
int plugrad_wait(volatile int *p, int want, long long ns) {
  long long end = now() + ns; unsigned i = 0;
  while (__atomic_load_n(p, __ATOMIC_ACQUIRE) < want) {
    if ((++i & 63) == 0 && now() > end) return 0;
    relax();
  }
  return 1;
}

/* in a forked child: the workers are gone, and a lock may have been held by a thread that no longer exists */
void plugrad_pool_after_fork(void) {
  pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER; pthread_cond_t c = PTHREAD_COND_INITIALIZER;
  run_mu = m; mu = m; cv = c; started = 0; done = 0;
}
""".replace("SPIN_NS_VALUE", str(SPIN_NS))

_lock = threading.Lock()
_lib: Any = None


def _load() -> Any:
  global _lib
  with _lock:
    if _lib is None:
      from plugrad_cpu.compiler import CPUCompiler
      from plugrad_cpu.loader import load_shared
      from plugrad_cpu.toolchain import toolchain
      def load(binary: bytes) -> Any:  # a cached library lacking a function is dropped and compiled again (load_cached)
        lib = load_shared(binary)
        lib.plugrad_pool_run.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int]
        lib.plugrad_pool_run.restype = ctypes.c_int
        lib.plugrad_pool_after_fork.argtypes, lib.plugrad_pool_after_fork.restype = [], None
        lib.plugrad_wait.argtypes, lib.plugrad_wait.restype = [ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong], ctypes.c_int
        return lib
      _lib = CPUCompiler(toolchain()).load_cached(_SRC, "plugrad native pool", load)
    return _lib


def run(graph_fn: Any, args: list[int], cores: int) -> None:
  """Run `graph_fn` (a loaded `plugrad_graph`) with its four table addresses on `cores` threads; blocks until done."""
  if _load().plugrad_pool_run(ctypes.cast(graph_fn, ctypes.c_void_p), *args, cores) != 0:
    raise RuntimeError(f"plugrad-cpu: could not start {cores - 1} native worker threads (pthread_create failed)")


def wait(flag: ctypes.c_int, want: int, ns: int = SPIN_NS) -> bool:
  """Spin (GIL released) until `flag` >= want or `ns` nanoseconds pass; True when it got there."""
  return bool(_load().plugrad_wait(ctypes.addressof(flag), want, ns))


def _after_fork() -> None:
  if _lib is not None: _lib.plugrad_pool_after_fork()


if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=_after_fork)
