"""plugrad.distributed's NCCL path on real GPUs: one rank per GPU, an all-reduce / all-gather / broadcast checked against
numpy, then the all-reduce's time per size (docs/distributed.md, "NCCL").

  mpirun -np 2 python bench/gpu/nccl_allreduce.py          # rank r uses CUDA:r; needs 2 GPUs (and mpi4py)
  python bench/gpu/nccl_allreduce.py                       # launches that mpirun itself; with fewer than 2 GPUs it says so and exits 0

Prints `PASS name` / `FAIL name: error` per check (exit status 1 on any FAIL) and, on rank 0, one line per size:
milliseconds per all-reduce (host wall time around the call, which waits for the stream) and the bus bandwidth
(2 (n - 1) / n x bytes / time, NCCL's convention). UNRUN so far: no machine with 2 GPUs has run it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import numpy as np

LAUNCHED = any(os.environ.get(k) for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"))


def gpu_count() -> int:
  try:
    from plugrad_cuda import driver
    return driver.device_count() if driver.probe() is None else 0
  except Exception as e:  # no plugin, no driver: the message says why
    print(f"no CUDA devices: {e}")
    return 0


def launch() -> int:
  if (n := gpu_count()) < 2:
    print(f"SKIP nccl_allreduce: needs 2 GPUs, this machine has {n}")
    return 0
  if shutil.which("mpirun") is None:
    print("SKIP nccl_allreduce: needs mpirun (Open MPI) and mpi4py")
    return 0
  env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "PLUGRAD_DIST_BACKEND": "nccl"}
  return subprocess.run(["mpirun", "-np", "2", "--oversubscribe", sys.executable, __file__], env=env, timeout=300).returncode


def check(name: str, fn, failures: list[str]) -> None:  # type: ignore[no-untyped-def]
  try:
    fn()
    print(f"PASS {name}", flush=True)
  except Exception as e:
    failures.append(name)
    print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)


def worker() -> int:
  import plugrad.distributed as dist
  from plugrad import Tensor
  dist.init(min_world_size=2)
  r, n = dist.rank(), dist.world_size()
  dev = f"CUDA:{r}"
  x = np.arange(12, dtype=np.float32).reshape(3, 4) + r
  failures: list[str] = []
  def all_reduce() -> None:
    got = dist.all_reduce(Tensor(x, device=dev)).numpy()
    np.testing.assert_allclose(got, sum(np.arange(12, dtype=np.float32).reshape(3, 4) + k for k in range(n)))
  def all_gather() -> None:
    np.testing.assert_array_equal(dist.all_gather(Tensor(x, device=dev)).numpy(),
                                  np.concatenate([np.arange(12, dtype=np.float32).reshape(3, 4) + k for k in range(n)]))
  def broadcast() -> None: np.testing.assert_array_equal(dist.broadcast(Tensor(x, device=dev), src=1).numpy(), x - r + 1)
  def mean_bf16() -> None:
    from plugrad import dtypes
    got = dist.all_reduce(Tensor(x, device=dev).cast(dtypes.bfloat16), "mean").float().numpy()
    np.testing.assert_allclose(got, np.arange(12, dtype=np.float32).reshape(3, 4) + (n - 1) / 2, rtol=1e-2)
  for name, fn in (("all_reduce", all_reduce), ("all_gather", all_gather), ("broadcast", broadcast), ("all_reduce_mean_bf16", mean_bf16)):
    check(f"rank{r}_{name}", fn, failures)
  for mb in (1, 16, 256):
    t = Tensor(np.ones(mb * 2**18, np.float32), device=dev).realize()
    for _ in range(3): dist.all_reduce(t)
    reps = 10
    t0 = time.perf_counter()
    for _ in range(reps): dist.all_reduce(t)
    ms = (time.perf_counter() - t0) / reps * 1e3
    if r == 0: print(f"nccl all_reduce {mb:4d} MB f32 x{n}: {ms:8.3f} ms  bus {2 * (n - 1) / n * mb * 2**20 / ms / 1e6:7.2f} GB/s", flush=True)
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(worker() if LAUNCHED else launch())
