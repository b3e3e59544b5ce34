"""Thread safety (docs/security.md, "Threads"): JIT capture is per thread, realize and the live-tensor registry may be
used from several threads at once, and every result equals the single-threaded one."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from plugrad import Tensor, TinyJit
from plugrad.engine.realize import capture


def _in_threads(fns: list[Callable[[], Any]], timeout: float = 120.0) -> list[Any]:
  """Run each fn in its own thread, started together; returns their results and re-raises the first exception."""
  out: list[Any] = [None] * len(fns)
  errors: list[BaseException] = []
  start = threading.Barrier(len(fns))
  def body(i: int) -> None:
    try:
      start.wait()
      out[i] = fns[i]()
    except BaseException as e: errors.append(e)
  threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(len(fns))]
  for t in threads: t.start()
  for t in threads: t.join(timeout)
  assert not any(t.is_alive() for t in threads), "a thread hung"
  if errors: raise errors[0]
  return out


def _eager(seed: int, n: int) -> list[np.ndarray]:
  rng = np.random.default_rng(seed)
  res = []
  for _ in range(n):
    a, b = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((8, 3)).astype(np.float32)
    res.append(((Tensor(a) @ Tensor(b)).relu() + 1).sum(axis=0).numpy())
  return res


def _step(x: Tensor, w: Tensor) -> Tensor: return ((x @ w).tanh() * 2 - 1).contiguous()


def _jitted(seed: int, n: int) -> list[np.ndarray]:
  rng = np.random.default_rng(seed)
  w = Tensor(rng.standard_normal((8, 8)).astype(np.float32)).realize()
  jit = TinyJit(_step)
  return [jit(Tensor(rng.standard_normal((2, 8)).astype(np.float32)).realize(), w).numpy() for _ in range(n)]


def _create(seed: int, n: int) -> list[np.ndarray]:
  rng = np.random.default_rng(seed)
  keep = [Tensor(rng.standard_normal(5).astype(np.float32)) * 3 for _ in range(n)]  # lazy: live tensors, added concurrently
  return [keep[0].numpy(), keep[-1].numpy()]


def _assert_same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
  assert len(a) == len(b)
  for x, y in zip(a, b): np.testing.assert_array_equal(x, y)


def test_parallel_eager_jit_and_creation_match_a_single_thread() -> None:
  work = [lambda: _eager(1, 40), lambda: _jitted(2, 40), lambda: _create(3, 300), lambda: _eager(4, 40), lambda: _jitted(5, 40)]
  single = [f() for f in work]
  for _ in range(2):
    for got, want in zip(_in_threads(work), single): _assert_same(got, want)


def test_creating_tensors_while_another_thread_realizes() -> None:
  # the race: `_apply_mapping` iterated the live-tensor WeakSet while another thread added to it
  want = _eager(7, 20)  # single-threaded first (this also compiles the kernels)
  stop = threading.Event()
  held = [Tensor([1.0]) + i for i in range(3000)]  # a long registry to iterate
  def create() -> int:
    n = 0
    while not stop.is_set():  # new tensors replace old ones: the registry keeps changing, its size stays bounded
      for i in range(50): held[(n * 50 + i) % len(held)] = Tensor([1.0, 2.0]) + i
      n += 1
      # hand the GIL over between batches: without it this loop could starve the realizing thread (its 200 realizes
      # took 60-250 s depending on the interpreter's switching, past the hang timeout); the registry still changes
      # under every realize
      time.sleep(0)
    return n
  def realize() -> list[np.ndarray]:
    try: return [(Tensor([float(i)]) * 2).numpy() for i in range(200)] + _eager(7, 20)
    finally: stop.set()
  made, got = _in_threads([create, realize])
  assert made > 0
  _assert_same(got, [np.array([2.0 * i], np.float32) for i in range(200)] + want)


def test_recordings_capture_no_foreign_kernel() -> None:
  # 30 recordings while another thread runs eager kernels: each captures only its own thread's launches
  stop = threading.Event()
  other = Tensor(np.arange(16, dtype=np.float32)).realize()
  def eager() -> int:
    n = 0
    while not stop.is_set():
      (other * 0 + 7).realize()  # a foreign kernel: in a capture it would be a "mul"/"add" on 16 elements
      n += 1
      time.sleep(0)  # hand the GIL over (as in test_creating_tensors_while_another_thread_realizes)
    return n
  def record() -> list[int]:
    try:
      counts = []
      for i in range(30):
        with capture() as items: (Tensor(np.full(4, float(i), np.float32)).contiguous() + 1).realize()
        counts.append(len(items))
        assert all(ei.bufs[0].size == 4 for ei in items), [ei.name for ei in items]
      return counts
    finally: stop.set()
  _, counts = _in_threads([eager, record])
  assert len(set(counts)) == 1, counts


def test_replays_never_touch_the_other_threads_buffers() -> None:
  stop = threading.Event()
  x = Tensor(np.arange(8, dtype=np.float32)).realize()
  @TinyJit
  def f(a: Tensor) -> Tensor: return (a * 2 + 1).contiguous()
  mine = Tensor(np.zeros(8, np.float32)).realize()
  def eager() -> None:
    while not stop.is_set():
      mine.assign(mine + 1).realize()
      time.sleep(0)  # hand the GIL over (as in test_creating_tensors_while_another_thread_realizes)
  def jitted() -> list[np.ndarray]:
    try: return [f(Tensor(np.full(8, float(i), np.float32)).realize()).numpy() for i in range(30)]
    finally: stop.set()
  _, outs = _in_threads([eager, jitted])
  for i, o in enumerate(outs): np.testing.assert_array_equal(o, np.full(8, 2.0 * i + 1, np.float32))
  # after the other thread stopped, replays leave its tensor alone
  before = mine.numpy().copy()
  for _ in range(5): f(x).realize()
  np.testing.assert_array_equal(mine.numpy(), before)
  assert f.captured is not None and all(ei.bufs[0].size == 8 for ei in f.captured.items)
