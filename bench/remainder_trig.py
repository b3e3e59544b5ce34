"""The price of exact float remainders and range-reduced cos/tan (issue 32): fmod, % and cos/tan of 2^20 float32 values
against the formulas they replaced (a - trunc(a/b)·b, sin(π/2 - x)) and PyTorch. `python bench/remainder_trig.py [N]`."""
from __future__ import annotations

import math
import sys
import time

import numpy as np
import torch

from plugrad import Tensor


def best(fn, reps: int = 7) -> float:
  ts = []
  for _ in range(reps):
    t = time.perf_counter()
    fn()
    ts.append(time.perf_counter() - t)
  return min(ts[2:]) * 1e3


def main() -> None:
  n = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 20
  rng = np.random.default_rng(0)
  a = (rng.standard_normal(n) * 1e3).astype(np.float32)
  b = (rng.standard_normal(n) * 10).astype(np.float32)
  x, y = Tensor(a).realize(), Tensor(b).realize()
  ta, tb = torch.from_numpy(a), torch.from_numpy(b)
  rows = [
    ("fmod (exact)", lambda: x.fmod(y).realize(), lambda: torch.fmod(ta, tb)),
    ("fmod (old: a - trunc(a/b)·b)", lambda: (x - (x / y).trunc() * y).realize(), None),
    ("% (exact)", lambda: (x % y).realize(), lambda: torch.remainder(ta, tb)),
    ("cos (reduced)", lambda: x.cos().realize(), lambda: torch.cos(ta)),
    ("cos (old: sin(π/2 - x))", lambda: (math.pi / 2 - x).sin().realize(), None),
    ("tan (reduced)", lambda: x.tan().realize(), lambda: torch.tan(ta)),
  ]
  print(f"{n} float32 values, best of 5 (ms)")
  for name, pg, pt in rows:
    t_pg = best(pg)
    line = f"  {name:30s} plugrad {t_pg:8.2f}"
    if pt is not None: line += f"   torch {best(pt):8.2f}"
    print(line)


if __name__ == "__main__":
  main()
