"""The program each rank runs in tests/distributed/test_mpi.py (launched by mpirun; a case per first argument).

  collectives        every collective against numpy over dtypes, shapes and ops; the agreement check; the gradient buckets
  train OUT B        20 SGD steps of a small MLP on global batches of B: rank r takes its share; rank 0 writes OUT (.npz)
  stuck | kill | raise   rank 1 stops answering (sleeps), dies (SIGKILL) or raises at step 3 of a loop of all-reduces
  no_mpi4py          init() with mpi4py made unimportable
"""
from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

if sys.argv[1] == "no_mpi4py": sys.modules["mpi4py"] = None  # type: ignore[assignment]  # an import of it now raises ImportError

import plugrad.distributed as dist
from plugrad import Tensor, dtypes
from plugrad.nn import Linear, get_parameters
from plugrad.nn.optim import SGD

DTYPES = [dtypes.float32, dtypes.float64, dtypes.float16, dtypes.bfloat16, dtypes.int8, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.bool]
SHAPES = [(), (5,), (3, 4), (2, 3, 4), (0, 3)]


def data(r: int, dt, shape: tuple[int, ...]) -> np.ndarray:
  """Rank r's values, known to every rank; small integers (halves for floats): exact in every dtype and in products."""
  rng = np.random.default_rng(1000 * r + len(shape) * 10 + DTYPES.index(dt))
  if dt is dtypes.bool: return rng.random(shape) < 0.5
  vals = rng.integers(-3 if not dtypes.is_unsigned(dt) else 0, 4, shape)
  return (vals / 2).astype(np.float32) if dtypes.is_float(dt) else vals.astype(dtypes.to_numpy(dt))


def make(arr: np.ndarray, dt) -> Tensor: return Tensor(arr, dtype=dt)


def expect(op: str, arrs: list[np.ndarray], dt) -> np.ndarray:
  st = np.stack(arrs)
  if dt is dtypes.bool: return st.any(0) if op == "max" else st.all(0)
  wide = st.astype(np.float64) if dtypes.is_float(dt) else st
  res = {"sum": lambda: wide.sum(0), "mean": lambda: wide.mean(0), "max": lambda: wide.max(0), "min": lambda: wide.min(0),
         "prod": lambda: wide.prod(0)}[op]()
  return res.astype(st.dtype)


def check(got: Tensor, want: np.ndarray, dt, what: str) -> None:
  if got.dtype is not dt or tuple(got.shape) != want.shape: raise AssertionError(f"{what}: got {got.dtype} {got.shape}, want {dt} {want.shape}")
  tol = {dtypes.float16: 1e-3, dtypes.bfloat16: 1e-2}.get(dt, 1e-6)
  g = got.numpy()
  if dtypes.is_float(dt): np.testing.assert_allclose(g, want, rtol=tol, atol=tol, err_msg=what)
  else: np.testing.assert_array_equal(g, want, err_msg=what)


def collectives() -> None:
  r, n = dist.rank(), dist.world_size()
  checks = 0
  for dt in DTYPES:
    for shape in SHAPES:
      arrs = [data(q, dt, shape) for q in range(n)]
      t = make(arrs[r], dt)
      ops = ["max", "min"] if dt is dtypes.bool else ["sum", "max", "min", "prod"] + (["mean"] if dtypes.is_float(dt) else [])
      for op in ops:
        check(dist.all_reduce(t, op), expect(op, arrs, dt), dt, f"all_reduce {op} {dt} {shape}")
        checks += 1
      for axis in range(-len(shape), max(len(shape), 1)):
        want = np.stack(arrs) if not shape else np.concatenate(arrs, axis)
        check(dist.all_gather(t, axis), want.astype(arrs[0].dtype), dt, f"all_gather axis={axis} {dt} {shape}")
        checks += 1
      for src in range(n):
        check(dist.broadcast(t, src), arrs[src], dt, f"broadcast src={src} {dt} {shape}")
        checks += 1
  # results are new buffers, never the input's: writing the input later leaves them alone
  x = Tensor(np.ones(4, np.float32)).realize()
  y = dist.all_reduce(x)
  x.assign(Tensor(np.zeros(4, np.float32))).realize()
  assert (y.numpy() == n).all(), y.numpy()
  # a collective called with different shapes on different ranks: a DistributedError naming both, and the group still works
  try:
    dist.all_reduce(Tensor(np.zeros(3 + r, np.float32)))
    raise AssertionError("mismatched all_reduce did not raise")
  except dist.DistributedError as e:
    assert "rank 0:" in str(e) and "rank 1:" in str(e) and "shape=(3,)" in str(e) and "shape=(4,)" in str(e), e
  assert dist.all_reduce(Tensor([1.0])).item() == n
  try:  # a barrier on one rank and a broadcast on the other: the same kind of error
    dist.barrier() if r == 0 else dist.broadcast(Tensor([1.0]))
    raise AssertionError("barrier against broadcast did not raise")
  except dist.DistributedError as e:
    assert "barrier()" in str(e) and "broadcast(src=0" in str(e), e
  for bad, kind in ((lambda: dist.all_reduce(x, "avg"), ValueError), (lambda: dist.all_reduce(Tensor([1, 2]), "mean"), TypeError),
                    (lambda: dist.all_reduce(Tensor([True]), "sum"), TypeError), (lambda: dist.broadcast(x, n), ValueError),
                    (lambda: dist.all_gather(x, 1), ValueError), (lambda: dist.all_reduce(np.ones(2)), TypeError)):
    try:
      bad()
      raise AssertionError("bad input did not raise")
    except kind: pass
  # the data-parallel wrapper: rank 0's weights broadcast, gradients averaged through several buckets (one per dtype too)
  shapes = [(3, 5), (7,), (2, 2, 2), (40,)]
  params = [Tensor(np.full(s, float(r + 1), np.float32), requires_grad=True) for s in shapes]
  params.append(Tensor(np.full((6,), float(r + 1), np.float32), dtype=dtypes.float16, requires_grad=True))
  dopt = dist.DistributedOptimizer(SGD(params, lr=1.0), bucket_mb=100 / 2**20)  # 100-byte buckets: 25 float32 values
  assert all((p.numpy() == 1).all() for p in params), "rank 0's weights were not broadcast"
  grads = [[np.random.default_rng(7 + q * 31 + i).standard_normal(p.shape).astype(np.float32) for i, p in enumerate(params)] for q in range(n)]
  for p, g in zip(params, grads[r]): p.grad = Tensor(g, dtype=p.dtype)
  dopt.step()
  assert len(dopt.buckets()) == 4 and {b.dtype for b in dopt.buckets()} == {dtypes.float32}, [(b.dtype, b.numel) for b in dopt.buckets()]
  for i, p in enumerate(params):
    want = 1 - np.mean([grads[q][i].astype(np.float16 if p.dtype is dtypes.float16 else np.float32).astype(np.float32) for q in range(n)], 0)
    np.testing.assert_allclose(p.numpy().astype(np.float32), want, rtol=2e-3 if p.dtype is dtypes.float16 else 1e-6, atol=1e-3)
  dist.barrier()
  print(f"rank {r}: {checks} collective checks OK", flush=True)


class MLP:
  def __init__(self) -> None: self.l1, self.l2 = Linear(16, 32), Linear(32, 4)
  def __call__(self, x: Tensor) -> Tensor: return self.l2(self.l1(x).tanh())


def train(out: str, batch: int) -> None:
  """20 SGD steps (momentum 0.9, lr 0.1) on global batches of `batch`. With several ranks, two models: one stepped with
  DistributedOptimizer.step(), one with make_step (two TinyJit captures around the all-reduce); alone, a plain SGD."""
  r, n = dist.rank(), dist.world_size()
  if batch % n: raise ValueError(f"batch {batch} is not divisible by the {n} ranks")
  rng = np.random.default_rng(0)
  xs, ys = rng.standard_normal((20, batch, 16)).astype(np.float32), rng.integers(0, 4, (20, batch)).astype(np.int32)
  share = slice(r * batch // n, (r + 1) * batch // n)
  def loss_fn(model: MLP) -> object: return lambda x, y: model(x).sparse_categorical_crossentropy(y)
  results = {}
  for mode in (["step", "jit"] if n > 1 else ["plain"]):
    Tensor.manual_seed(0)
    model = MLP()
    opt = SGD(get_parameters(model), lr=0.1, momentum=0.9)
    fn = loss_fn(model)
    if mode == "plain":
      for i in range(20):
        opt.zero_grad()
        fn(Tensor(xs[i]), Tensor(ys[i])).backward()
        opt.step()
    else:
      dopt = dist.DistributedOptimizer(opt, bucket_mb=0.001)  # ~260 float32 values: the 676 parameters go in several buckets
      step = dopt.make_step(fn) if mode == "jit" else None
      for i in range(20):
        x, y = Tensor(xs[i][share]), Tensor(ys[i][share])
        if step is not None: step(x, y)
        else:
          dopt.zero_grad()
          fn(x, y).backward()
          dopt.step()
    for k, p in (("l1.weight", model.l1.weight), ("l1.bias", model.l1.bias), ("l2.weight", model.l2.weight), ("l2.bias", model.l2.bias)):
      assert p is not None
      results[f"{mode}.{k}"] = p.numpy()
  if n > 1:  # every rank holds the same weights
    for k, v in results.items():
      assert (dist.all_gather(Tensor(v)[None]).numpy() == v).all(), f"{k} differs between the ranks"
  if r == 0: np.savez(out, **results)
  print(f"rank {r}: trained ({', '.join(sorted({k.split('.')[0] for k in results}))})", flush=True)


def failing(case: str) -> None:
  r = dist.rank()
  t0 = time.monotonic()
  x = Tensor(np.ones(1000, np.float32))
  try:
    for i in range(10):
      if r == 1 and i == 3:
        if case == "stuck": time.sleep(600)
        if case == "kill": os.kill(os.getpid(), signal.SIGKILL)
        if case == "raise": raise ValueError("rank 1 fails on purpose")
      x = dist.all_reduce(x, "mean")
  except dist.DistributedTimeoutError as e:
    print(f"rank {r} raised DistributedTimeoutError after {time.monotonic() - t0:.1f} s: {e}", flush=True)
    if case == "stuck": raise  # uncaught: the excepthook aborts the job; "kill" returns normally: the exit hook does


def main() -> None:
  case = sys.argv[1]
  if case == "no_mpi4py":
    try: dist.init()
    except dist.DistributedError as e: print(f"DistributedError: {e}", flush=True)
    return
  dist.init()
  if case == "collectives": collectives()
  elif case == "train": train(sys.argv[2], int(sys.argv[3]))
  else: failing(case)


if __name__ == "__main__":
  main()
