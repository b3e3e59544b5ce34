"""Gathers and scatter-adds side by side with numpy and PyTorch (CPU, same threads): an embedding lookup, its gradient
(a scatter-add into the table), and a 1-d `index_add` into few bins. plugrad's scatter-add runs in both of its forms
(`SCATTER_ATOMIC`, docs/env-vars.md): the serial loop along the indexed axis (the CPU default) and one parallel loop
of atomic adds (the default on devices with workgroups).

  python bench/gather.py [--device CPU] [--threads 2] [--reps 10]
"""
from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import numpy as np


def best(fn: Callable[[], object], reps: int) -> float:
  for _ in range(2): fn()
  ts = []
  for _ in range(reps):
    t0 = time.perf_counter()
    fn()
    ts.append(time.perf_counter() - t0)
  return min(ts) * 1e3


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--device", default="CPU")
  ap.add_argument("--threads", type=int, default=2)
  ap.add_argument("--reps", type=int, default=10)
  args = ap.parse_args()
  os.environ.setdefault("THREADS", str(args.threads))
  from plugrad import Tensor, TinyJit
  from plugrad.helpers import Context
  rng = np.random.default_rng(0)
  V, D, B, T, N, BINS = 30522, 384, 32, 128, 4_000_000, 1000
  w, ids, g = rng.standard_normal((V, D), np.float32), rng.integers(0, V, (B, T)).astype(np.int32), rng.standard_normal((B, T, D), np.float32)
  idx, src = rng.integers(0, BINS, N).astype(np.int32), rng.standard_normal(N, np.float32)
  rows: dict[str, dict[str, float]] = {}

  W, I, G = (Tensor(x, device=args.device).realize() for x in (w, ids, g))
  Ix, S = Tensor(idx, device=args.device).realize(), Tensor(src, device=args.device).realize()
  lookup = TinyJit(lambda i: W[i].realize())
  rows.setdefault("embedding lookup 30522x384[32x128]", {})["plugrad"] = best(lambda: lookup(I), args.reps)
  def scatter_adds(label: str) -> None:
    Wg = Tensor(w, device=args.device, requires_grad=True).realize()
    grad = TinyJit(lambda i, gg: (Wg[i] * gg).sum().gradient(Wg)[0].realize())
    rows.setdefault("embedding grad (scatter-add)", {})[f"plugrad {label}"] = best(lambda: grad(I, G), args.reps)
    add = TinyJit(lambda i, s: Tensor.zeros(BINS, device=args.device).contiguous().scatter_reduce(0, i, s, "sum").realize())
    rows.setdefault(f"index_add 4M -> {BINS} bins", {})[f"plugrad {label}"] = best(lambda: add(Ix, S), args.reps)
  for mode, label in ((0, "serial"), (2, "atomic")):
    with Context(SCATTER_ATOMIC=mode): scatter_adds(label)

  rows["embedding lookup 30522x384[32x128]"]["numpy"] = best(lambda: w[ids], args.reps)
  def np_grad() -> None:
    out = np.zeros_like(w)
    np.add.at(out, ids.reshape(-1), g.reshape(-1, D))
  rows["embedding grad (scatter-add)"]["numpy"] = best(np_grad, max(2, args.reps // 5))
  rows[f"index_add 4M -> {BINS} bins"]["numpy"] = best(lambda: np.bincount(idx, src, BINS), args.reps)
  try:
    import torch
    torch.set_num_threads(args.threads)
    tw, tids, tg, tidx, tsrc = (torch.from_numpy(x) for x in (w, ids, g, idx.astype(np.int64), src))
    rows["embedding lookup 30522x384[32x128]"]["torch"] = best(lambda: torch.nn.functional.embedding(tids, tw), args.reps)
    flat_ids, flat_g = tids.reshape(-1).long(), tg.reshape(-1, D)
    rows["embedding grad (scatter-add)"]["torch"] = best(lambda: torch.zeros_like(tw).index_add_(0, flat_ids, flat_g), args.reps)
    rows[f"index_add 4M -> {BINS} bins"]["torch"] = best(lambda: torch.zeros(BINS).index_add_(0, tidx, tsrc), args.reps)
  except ImportError: print("torch not installed: its column is missing")
  print(f"gather / scatter-add (ms, best of {args.reps}, {args.threads} threads, device {args.device})")
  for name, cells in rows.items(): print(f"  {name:<36}" + "".join(f"  {k} {v:8.2f}" for k, v in cells.items()))


if __name__ == "__main__":
  main()
