"""plugrad.distributed on this machine: 2 MPI processes on one host (shared memory), one thread each.

  python bench/distributed.py [--quick] [--sizes 1K,64K,1M,16M,64M] [--rounds R] [--steps N] [--batch B] [--only allreduce,step]

It launches mpirun itself (Open MPI: apt-get install openmpi-bin; pip install mpi4py); nothing else may run on the cores.

* **allreduce**: the sum of a float32 buffer over 2 ranks, per size: plugrad's `all_reduce` of a realized CPU tensor
  (the agreement check, MPI reading the tensor's buffer and writing a new one, the result a Tensor) next to mpi4py's
  `Allreduce` of a numpy buffer of the same size (MPI alone), and mpi4py's `Iallreduce(...).Wait()` (the non-blocking
  collective plugrad posts; Open MPI runs it with another algorithm than the blocking one). Each line: the best time of
  each over `--rounds` alternating rounds (each round a block of back-to-back calls, at least 3 and about 0.1 s), the
  bandwidth (bytes of the buffer / time) and plugrad's overhead = plugrad time / mpi4py time - 1.
* **step**: one data-parallel training step of examples/train_digits.py's CNN (Adam, BatchNorm in training mode) at a
  global batch of `--batch`: 1 process with the whole batch, 2 processes with half each (`DistributedOptimizer.make_step`:
  the forward and backward, the gradient all-reduce, the update; both captures under TinyJit), and 2 processes with the
  whole batch each (twice the work). Median step time over `--steps` steps after 3 warm-up steps; scaling efficiency =
  throughput with 2 / (2 x throughput with 1), for the same global batch (strong) and the same per-rank batch (weak).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve()
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_btl": "self,vader",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none", "OMPI_MCA_oob_tcp_if_include": "lo", "OMPI_MCA_rmaps_base_oversubscribe": "1",
           "THREADS": "1"}


def parse_size(s: str) -> int:
  mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1].upper(), 1)
  return int(s[:-1] if mult > 1 else s) * mult


def fmt_size(n: int) -> str: return f"{n >> 20} MB" if n >= 1 << 20 else f"{n >> 10} KB" if n >= 1 << 10 else f"{n} B"


# ---------------------------------------------------------------- inside mpirun

def best_of(reps: int, fn, *args) -> float:
  """One round: `reps` back-to-back calls (the same count on every rank: a collective needs them all); the best one."""
  best = float("inf")
  for _ in range(reps):
    t0 = time.perf_counter()
    fn(*args)
    best = min(best, time.perf_counter() - t0)
  return best


def worker_allreduce(sizes: list[int], rounds: int) -> None:
  from mpi4py import MPI

  import plugrad.distributed as dist
  from plugrad import Tensor
  dist.init(min_world_size=2)
  comm, r = MPI.COMM_WORLD, dist.rank()
  for size in sizes:
    arr = np.random.default_rng(r).standard_normal(size // 4).astype(np.float32)
    out = np.empty_like(arr)
    x = Tensor(arr).realize()
    got = dist.all_reduce(x).numpy()
    comm.Allreduce(arr, out)
    assert np.array_equal(got, out), "plugrad's all_reduce differs from mpi4py's Allreduce"
    t0 = time.perf_counter()
    comm.Allreduce(arr, out)
    reps = max(3, min(1000, int(0.1 / comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))))  # about 0.1 s per block
    calls = {"plugrad": (dist.all_reduce, (x,)), "Allreduce": (comm.Allreduce, (arr, out)), "Iallreduce": (iallreduce, (comm, arr, out))}
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(rounds):
      for name, (fn, fargs) in calls.items():
        comm.Barrier()
        best[name] = min(best[name], best_of(reps, fn, *fargs))
    p, m, mi = (comm.allreduce(best[k], op=MPI.MAX) for k in ("plugrad", "Allreduce", "Iallreduce"))  # the slower rank's time is the collective's
    if r == 0:
      print(f"all_reduce {fmt_size(size):>6} f32 x2   plugrad {p * 1e3:8.3f} ms {size / p / 1e9:5.2f} GB/s | mpi4py Allreduce {m * 1e3:8.3f} ms "
            f"{size / m / 1e9:5.2f} GB/s, overhead {(p / m - 1) * 100:+7.1f}% | mpi4py Iallreduce+Wait {mi * 1e3:8.3f} ms "
            f"{size / mi / 1e9:5.2f} GB/s, overhead {(p / mi - 1) * 100:+7.1f}%", flush=True)


def iallreduce(comm, arr: np.ndarray, out: np.ndarray) -> None: comm.Iallreduce(arr, out).Wait()


def worker_step(batch: int, steps: int) -> None:
  import importlib.util

  import plugrad.distributed as dist
  from plugrad import Tensor
  from plugrad.nn import get_parameters
  from plugrad.nn.optim import Adam
  dist.init()
  spec = importlib.util.spec_from_file_location("train_digits", HERE.parents[1] / "examples" / "train_digits.py")
  assert spec is not None and spec.loader is not None
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  r, n = dist.rank(), dist.world_size()
  Tensor.manual_seed(0)
  model = mod.DigitsCNN()
  dopt = dist.DistributedOptimizer(Adam(get_parameters(model), lr=1e-3))
  step = dopt.make_step(lambda x, y: model(x).sparse_categorical_crossentropy(y))
  rng = np.random.default_rng(r)
  x, y = rng.random((batch, 1, 8, 8), dtype=np.float32), rng.integers(0, 10, batch).astype(np.int32)
  Tensor.training = True
  times = []
  for i in range(steps + 3):
    dist.barrier()
    t0 = time.perf_counter()
    step(Tensor(x), Tensor(y)).item()
    if i >= 3: times.append(time.perf_counter() - t0)
  med = float(np.median(times))
  worst = dist.all_reduce(Tensor([med]), "max").item()
  if r == 0: print(f"RESULT {n} {batch} {worst}", flush=True)


# ---------------------------------------------------------------- the launcher

def launch(np_: int, *args: str) -> str:
  mpirun = shutil.which("mpirun")
  if mpirun is None: sys.exit("bench/distributed.py needs mpirun (apt-get install openmpi-bin libopenmpi-dev) and mpi4py (pip install mpi4py)")
  cmd = [mpirun, "-np", str(np_), "--bind-to", "core", sys.executable, str(HERE), "--worker", *args]
  out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **MPI_ENV}, timeout=1200)
  if out.returncode: sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
  return out.stdout


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--sizes", default="1K,64K,1M,16M,64M")
  ap.add_argument("--rounds", type=int, default=5)
  ap.add_argument("--steps", type=int, default=30)
  ap.add_argument("--batch", type=int, default=128, help="the global batch of the step")
  ap.add_argument("--only", default="allreduce,step")
  ap.add_argument("--quick", action="store_true", help="small sizes, 2 rounds, 5 steps: a smoke test")
  ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker:
    kind, *rest = args.worker
    if kind == "allreduce": worker_allreduce([int(s) for s in rest[1:]], int(rest[0]))
    else: worker_step(int(rest[0]), int(rest[1]))
    return
  if args.quick: args.sizes, args.rounds, args.steps = "1K,1M", 2, 5
  sizes = [parse_size(s) for s in args.sizes.split(",")]
  only = set(args.only.split(","))
  print(f"plugrad.distributed on {os.cpu_count()} cores: mpirun -np 2 on this host (Open MPI, shared memory), one thread per rank")
  if "allreduce" in only:
    print(launch(2, "allreduce", str(args.rounds), *map(str, sizes)), end="", flush=True)
  if "step" in only:
    b = args.batch
    if b % 2: sys.exit(f"--batch {b} must be even (2 ranks share it)")
    res = {}
    for np_, per_rank in ((1, b), (2, b // 2), (2, b)):
      line = next(ln for ln in launch(np_, "step", str(per_rank), str(args.steps)).splitlines() if ln.startswith("RESULT"))
      res[(np_, per_rank)] = float(line.split()[3])
    t1, t2, t2w = res[(1, b)], res[(2, b // 2)], res[(2, b)]
    print(f"digits-cnn DP step  global batch {b:4d}: 1 process {t1 * 1e3:8.2f} ms ({b / t1:7.0f} samples/s)   "
          f"2 processes x {b // 2:4d} {t2 * 1e3:8.2f} ms ({b / t2:7.0f} samples/s)   strong scaling efficiency {t1 / (2 * t2):6.1%}")
    print(f"digits-cnn DP step  per-rank batch {b:4d}: 1 process {t1 * 1e3:8.2f} ms ({b / t1:7.0f} samples/s)   "
          f"2 processes x {b:4d} {t2w * 1e3:8.2f} ms ({2 * b / t2w:7.0f} samples/s)   weak scaling efficiency {t1 / t2w:6.1%}")


if __name__ == "__main__":
  main()
