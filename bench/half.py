"""Half-precision matmul on the default device (CPU): plugrad next to PyTorch, GFLOPS, median of R runs.

  python bench/half.py [--reps R] [--sizes 256,512,1024] [--dtypes float16,bfloat16]

plugrad forms each product of float16/bfloat16 factors in float32 and accumulates in float32 (docs/tensor.md,
"Half precision"), as PyTorch's CPU kernels do; this script is how a change to that is checked for speed. Each
measurement realizes a fresh expression on the same input buffers (one warm-up run with the compile first, excluded)
and checks the result against float64 numpy (max abs error / max abs reference).
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import statistics
import time
from collections.abc import Callable

import numpy as np


def _median_s(fn: Callable[[], object], reps: int) -> float:
  fn()
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return statistics.median(times)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument("--sizes", default="256,512,1024")
  ap.add_argument("--dtypes", default="float16,bfloat16")
  args = ap.parse_args()
  from plugrad import Tensor, dtypes
  torch = importlib.import_module("torch") if importlib.util.find_spec("torch") else None
  rng = np.random.default_rng(0)
  for dt in args.dtypes.split(","):
    for n in (int(s) for s in args.sizes.split(",")):
      a, b = rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)
      pa, pb = Tensor(a).cast(getattr(dtypes, dt)).realize(), Tensor(b).cast(getattr(dtypes, dt)).realize()
      ref = pa.float().numpy().astype(np.float64) @ pb.float().numpy().astype(np.float64)
      got = (pa @ pb).float().numpy()
      err = float(np.abs(got - ref).max() / np.abs(ref).max())
      flops = 2.0 * n ** 3
      pg = flops / _median_s(functools.partial(lambda x, y: (x @ y).realize(), pa, pb), args.reps) / 1e9
      line = f"matmul {dt} N={n:5d}  GFLOPS  plugrad {pg:8.2f}"
      if torch is not None:
        ta, tb = (torch.from_numpy(x).to(getattr(torch, dt)) for x in (a, b))
        tg = flops / _median_s(functools.partial(lambda x, y: x @ y, ta, tb), args.reps) / 1e9
        line += f"  torch {tg:8.2f}  ratio {pg / tg:5.2f}"
      print(f"{line}  rel err {err:.1e}", flush=True)


if __name__ == "__main__":
  main()
