"""The CPU runtime: loads a kernel's shared object with ctypes (or, when LLVM compiled it, links its relocatable object
into the process with LLVM's JIT linker) and runs it on host threads.

A kernel whose source carries `PARALLEL_MARK` is called once per thread with (core_id, core_count); each call runs
its own share of the parallel loop. ctypes releases the GIL during a foreign call, so the calls from a small pool of
Python threads run at the same time. Small launches run on the calling thread alone: waking threads costs tens of
microseconds, more than a small kernel takes.

Ctrl-C: a native call cannot be interrupted, so a long launch (>= LONG_WORK ops + bytes) runs entirely on the pool's
workers while the calling thread waits in an interruptible wait. A parallel kernel is cut into chunks (core_count up to
MAX_CHUNKS, each about CHUNK_WORK) that the workers take in turn, checking between chunks whether the launch was
cancelled. On KeyboardInterrupt the launch is cancelled, the running chunks get GRACE seconds to finish, and the
KeyboardInterrupt is raised — within about a second of the signal either way. A chunk that runs on past GRACE (a
serial loop, which cannot be cut) is abandoned, not stopped: its buffers are kept alive, and the next launch or copy
on the CPU device first waits (interruptibly) until it is done (`settle`), so nothing reads or reuses its memory
meanwhile.
"""
from __future__ import annotations

import ctypes
import itertools
import os
import queue
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

from plugrad.backend import Dims, LaunchError, Runtime, SettingsError, UOp, c_identifier, dtypes
from plugrad_cpu import native_pool, tiering
from plugrad_cpu.abandoned import ABANDONED, settle
from plugrad_cpu.allocator import CPUBuffer
from plugrad_cpu.loader import load_shared
from plugrad_cpu.renderer import PARALLEL_MARK
from plugrad_cpu.tensor_cores import AMX_MARK, request_amx
from plugrad_cpu.tiering import TIER_AFTER

WORK_PER_THREAD = 1 << 20  # ops + bytes moved per thread (about 100 us of work) before another thread pays off
LONG_WORK = 1 << 27        # ops + bytes from which a launch runs on the workers while the caller waits interruptibly (~30 ms up)
CHUNK_WORK = 1 << 24       # the work of one chunk of a long parallel launch (~5 ms): what Ctrl-C waits for at most, per thread
MAX_CHUNKS = 1024
GRACE = 0.25               # seconds a cancelled launch's running chunks get to finish before they are abandoned


def default_threads(env: dict[str, str] | None = None) -> int:
  """THREADS, else every core this process may run on. A bad THREADS is a SettingsError; more than twice the
  machine's cores (at least 8) is capped there with a warning (each thread is an OS thread, and more only time-slice)."""
  raw = (os.environ if env is None else env).get("THREADS", "").strip()
  if raw and (not raw.isdigit() or int(raw) < 1): raise SettingsError(f"THREADS must be a positive integer, got {raw!r}")
  n = int(raw or 0)
  try: cores = len(os.sched_getaffinity(0))
  except (AttributeError, OSError): cores = os.cpu_count() or 1
  if not n: return cores
  if n > (cap := max(2 * max(cores, os.cpu_count() or 1), 8)):
    warnings.warn(f"THREADS={n} is more than this machine can use ({os.cpu_count()} cores); using {cap} threads", RuntimeWarning, stacklevel=1)
    return cap
  return n


def instance_threads(device: str, env: dict[str, str] | None = None) -> int:
  """The threads of CPU instance `device` when CPU_DEVICES=N splits the host: THREADS (default: every core) divided
  among the N instances, the first ones taking the remainder, at least 1 each. One instance: all of them."""
  from plugrad.backend import parse_device, parse_setting
  total = default_threads(env)
  n = parse_setting("CPU_DEVICES", (os.environ if env is None else env).get("CPU_DEVICES", ""), 1, minimum=1, maximum=1024)
  index = parse_device(device)[1]
  return max(1, total // n + (1 if index < total % n else 0))


class _Pool:
  """Worker threads shared by every CPU kernel of the process, each with its own queue, so share k of a launch always
  runs on worker k (n shares really run on n threads, and a worker keeps touching the same part of the data). A launch
  raises each worker's `ready` flag after queueing its share and counts finished shares in `finished`; both sides wait
  for the other in native code (`native_pool.wait`, GIL released, up to `native_pool.SPIN_NS`) before blocking on the queues:
  waking a blocked thread cost ~85 us per parallel launch on this 2-vCPU VM, the spin brings it to ~60 (the rest is
  the GIL; JIT graph replays avoid both through native_pool.run). Made anew in a forked child: threads do not survive
  a fork."""
  def __init__(self) -> None: self.reset()

  def reset(self) -> None:
    self._queues: list[tuple[queue.SimpleQueue, ctypes.c_int]] = []
    self._lock = threading.Lock()

  def run(self, fn: Callable[..., Any], args: list[int], n: int) -> frozenset[int]:
    """Run shares 1..n-1 on workers and share 0 here; returns the native ids of the threads that ran them."""
    with self._lock:
      while len(self._queues) < n - 1:
        q: queue.SimpleQueue = queue.SimpleQueue()
        ready = ctypes.c_int(0)
        self._queues.append((q, ready))
        threading.Thread(target=_worker, args=(q, ready), name=f"plugrad-cpu-{len(self._queues)}", daemon=True).start()
      workers = self._queues[:n - 1]
    done: queue.SimpleQueue = queue.SimpleQueue()
    finished = ctypes.c_int(0)
    for k, (q, ready) in enumerate(workers, 1):
      q.put((fn, args, k, n, done, finished))
      ready.value = 1
    results: list[tuple[bool, Any]] = []
    try: results.append((True, _share(fn, args, 0, n)))
    except Exception as e: results.append((False, e))
    native_pool.wait(finished, len(workers))
    results += [done.get() for _ in workers]  # every share finishes before the launch returns, even when one failed
    if (err := next((v for ok, v in results if not ok), None)) is not None: raise err
    return frozenset(v for _, v in results)

  def run_waiting(self, launch: Launch, n: int) -> frozenset[int]:
    """Run `launch` on workers 1..n (share k-1 on worker k) while this thread waits, interruptibly (see the module doc)."""
    with self._lock:
      while len(self._queues) < n:
        q: queue.SimpleQueue = queue.SimpleQueue()
        ready = ctypes.c_int(0)
        self._queues.append((q, ready))
        threading.Thread(target=_worker, args=(q, ready), name=f"plugrad-cpu-{len(self._queues)}", daemon=True).start()
      workers = self._queues[:n]
    got: list[tuple[bool, Any]] = []
    try:
      for k, (q, ready) in enumerate(workers):
        launch.queued = k + 1  # counted before the put: a signal's exception comes out after a call, never between these two
        q.put((launch.share, [], k, n, launch.results, launch.finished))
        ready.value = 1
      while len(got) < n: got.append(launch.results.get())  # a lock wait: a signal's handler runs, and KeyboardInterrupt comes out
    except BaseException:  # KeyboardInterrupt, or whatever a signal handler raised
      launch.cancel()  # the shares stop at their next chunk
      ABANDONED.append(launch)  # listed before anything else can be interrupted; `settle` drops it once its shares are done
      launch.finish(GRACE)
      raise
    if (err := next((v for ok, v in got if not ok), None)) is not None: raise err
    return frozenset(v for _, v in got)


class Launch:
  """A long launch: `fn` called with core_id 0..chunks-1 of `chunks`, each chunk taken by the next free worker.
  `on_cancel` tells native code that checks a flag of its own (a graph batch) to stop too."""
  def __init__(self, fn: Callable[..., Any], args: list[Any], chunks: int, handles: tuple[Any, ...],
               on_cancel: Callable[[], None] | None = None):
    self.fn, self.args, self.chunks, self.on_cancel = fn, args, chunks, on_cancel
    self.handles = handles  # the buffers: alive while an abandoned launch may still write them
    self._next = itertools.count()  # next() on it is atomic under the GIL
    self.cancelled = False
    self.results: queue.SimpleQueue = queue.SimpleQueue()
    self.queued, self.finished = 0, ctypes.c_int(0)  # shares handed to workers; shares done (each worker counts its own)

  def share(self, k: int, n: int) -> None:
    fn, args, chunks = self.fn, self.args, self.chunks
    while not self.cancelled and (i := next(self._next)) < chunks: fn(*args, i, chunks)

  def cancel(self) -> None:
    self.cancelled = True
    if self.on_cancel is not None: self.on_cancel()

  def finish(self, timeout: float | None) -> bool:
    """Wait until every share handed out has finished (at most `timeout` seconds; None: until then, interruptibly).
    Whether they have."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while self.finished.value < self.queued:
      left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
      if left <= 0: return False
      try: self.results.get(timeout=left)  # wakes when a share ends (its count follows right after)
      except queue.Empty: pass
      except KeyboardInterrupt:
        if deadline is None: raise
        return False  # a second Ctrl-C during the grace period: stop waiting, leave it abandoned
    return True


def _share(fn: Callable[..., Any], args: list[int], k: int, n: int) -> int:
  fn(*args, k, n)
  return threading.get_native_id()


def _worker(q: queue.SimpleQueue, ready: ctypes.c_int) -> None:
  while True:
    if q.empty(): native_pool.wait(ready, 1)  # the next share usually comes within the spin
    fn, args, k, n, done, finished = q.get()
    ready.value = 0  # a share queued meanwhile is already in q: clearing can only cost a spin, never a share
    try: done.put((True, _share(fn, args, k, n)))
    except Exception as e: done.put((False, e))
    finally: finished.value += 1  # under the GIL: the workers' increments do not race


POOL = _Pool()
if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=POOL.reset)


def is_object(binary: bytes) -> bool:
  """Whether `binary` is an ELF relocatable object (e_type 1, what LLVMCompiler emits), not a shared object (3)."""
  return binary[:4] == b"\x7fELF" and len(binary) > 17 and int.from_bytes(binary[16:18], "little") == 1


class CPUProgram:
  """A loaded kernel: call it with CPUBuffer handles in slot order and the variables' values. `last_threads` holds the
  native ids of the threads that ran the last launch."""
  def __init__(self, runtime: CPURuntime, program: Any):
    self.runtime, self.name = runtime, program.name
    self.nbufs, self.var_names = len(program.globals), [v.arg[0] for v in program.vars]
    argtypes = [ctypes.c_void_p] * self.nbufs + [ctypes.c_int64 if v.dtype is dtypes.int64 else ctypes.c_int32 for v in program.vars] + \
      [ctypes.c_int, ctypes.c_int]
    symbol = c_identifier(self.name)
    self.lib: Any
    self.program, self.launches, self.tiered = program, 0, threading.Event()
    # "llvm" (tiering may recompile it with the C compiler: tiering.py), "queued", or "c" (a shared object from the start)
    self.tier = "c"
    self._retired: list[Any] = []  # code replaced by a tier-up, kept mapped: a launch in flight may still run it
    self.timings: tuple[float, float] | None = None  # (LLVM, C) best seconds when tiering compared them
    if AMX_MARK in program.source: request_amx()  # AMX state is off for a Linux process until it asks (tensor_cores.py)
    if is_object(program.binary):  # LLVM: an ELF relocatable object, linked in-process (no file, no dlopen)
      from plugrad_cpu.llvm_compiler import load_object
      try: self.lib, addr = load_object(program.binary, symbol)
      except LaunchError as e: raise LaunchError(f"kernel {self.name!r}: {e}") from None
      self.fn = ctypes.CFUNCTYPE(None, *argtypes)(addr)
      if program.external: self.tier = "llvm (external: no C recompile)"  # its LINEAR is a signature, not the kernel
      else:
        self.tier = "llvm"
        tiering._programs.add(self)
    else:
      self.lib = load_shared(program.binary)
      try: self.fn = getattr(self.lib, symbol)
      except AttributeError: raise LaunchError(f"kernel {self.name!r}: the shared object has no function {symbol!r}") from None
      self.fn.restype = None
    self.fn.argtypes = argtypes
    self.parallel = PARALLEL_MARK in program.source
    est = program.estimates
    self._est, self._work = est, est.ops + est.lds if isinstance(est.ops, int) and isinstance(est.lds, int) else None
    self.last_threads: frozenset[int] = frozenset()
    self._by_vals: dict[tuple[int, ...], int] = {}  # work of symbolic launches (evaluating estimates takes ~10 us)

  def __repr__(self) -> str: return f"<CPUProgram {self.name!r}{' parallel' if self.parallel else ''} ({self.tier})>"

  def tier_up(self, wait: bool = False) -> None:
    """Queue LLVM code for its C recompile (tiering.py); `wait` blocks until it is swapped in (or has failed)."""
    if self.tier == "llvm" and tiering.enabled():
      self.tier = "queued"
      tiering.WORKER.submit(self)
    if wait and self.tier == "queued": self.tiered.wait()

  def install(self, lib: Any, fn: Any) -> None:
    """Swap in the C compiler's code for this kernel (the tiering worker calls it; the results are the same)."""
    self._retired.append((self.lib, self.fn))
    self.lib, self.fn, self.tier = lib, fn, "c"

  def work_at(self, vals: tuple[int, ...]) -> int:
    """Ops + bytes moved by a launch with these variable values (the estimates, evaluated once per values)."""
    if self._work is not None: return self._work
    if (w := self._by_vals.get(vals)) is None:
      if len(self._by_vals) >= 1024: self._by_vals.clear()
      e = self._est.at(dict(zip(self.var_names, vals)))
      w = self._by_vals[vals] = int(e.ops) + int(e.lds)
    return w

  def threads_for(self, vals: tuple[int, ...]) -> int:
    if not self.parallel or self.runtime.threads == 1: return 1
    return max(1, min(self.runtime.threads, self.work_at(vals) // WORK_PER_THREAD))

  def chunks_for(self, work: int, n: int) -> int:
    """The pieces a launch of `work` on `n` threads is cut into: n, or for a long parallel one pieces of about
    CHUNK_WORK (up to MAX_CHUNKS), so that Ctrl-C waits for one piece at most."""
    if work < LONG_WORK or not self.parallel: return n
    return max(n, min(MAX_CHUNKS, work // CHUNK_WORK))

  def __call__(self, *handles: Any, global_size: Dims = (1, 1, 1), local_size: Dims = (1, 1, 1), vals: tuple[int, ...] = (),
               wait: bool = False) -> float | None:
    if len(handles) != self.nbufs: raise LaunchError(f"kernel {self.name!r} takes {self.nbufs} buffers, got {len(handles)}")
    if len(vals) != len(self.var_names): raise LaunchError(f"kernel {self.name!r} takes values for {self.var_names}, got {len(vals)} values")
    if tuple(local_size) != (1, 1, 1): raise LaunchError(f"kernel {self.name!r}: the CPU has no workgroups, got local_size {local_size}")
    if not all(isinstance(h, CPUBuffer) for h in handles):
      raise LaunchError(f"kernel {self.name!r}: buffers must be CPU buffer handles, got {[type(h).__name__ for h in handles]}")
    args = [h.addr for h in handles] + list(vals)
    self.launches += 1
    if self.tier == "llvm" and self.launches >= TIER_AFTER: self.tier_up()
    n = self.threads_for(tuple(vals))
    if ABANDONED: settle()  # an interrupted launch still runs: wait for it before touching memory again
    st = time.perf_counter()
    if (work := self.work_at(tuple(vals))) >= LONG_WORK:
      self.last_threads = POOL.run_waiting(Launch(self.fn, args, self.chunks_for(work, n), handles), n)
    elif n == 1:
      self.fn(*args, 0, 1)
      self.last_threads = frozenset({threading.get_native_id()})
    else: self.last_threads = POOL.run(self.fn, args, n)
    return time.perf_counter() - st if wait else None


class CPURuntime(Runtime):
  """Runs kernels synchronously on `threads` host threads (THREADS, default all cores; with CPU_DEVICES=N, this
  instance's share of them)."""
  capabilities = frozenset({"run", "timing"})

  def __init__(self, device: str, threads: int | None = None):
    super().__init__(device)
    self.threads = instance_threads(device) if threads is None else threads
    if not isinstance(self.threads, int) or self.threads < 1: raise ValueError(f"threads must be a positive int, got {self.threads!r}")

  def __repr__(self) -> str: return f"<CPURuntime {self.device}: {self.threads} threads>"

  def load(self, program: UOp) -> CPUProgram: return CPUProgram(self, program)

  def synchronize(self) -> None:
    """Kernels run synchronously; only a launch abandoned by Ctrl-C can still be running: wait for it."""
    if ABANDONED: settle()
