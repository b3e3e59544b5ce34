"""Rewrite throughput: the symbolic simplifier on the index expressions of NCHW convolutions, plugrad vs tinygrad 0.14.

Each "kernel" is a SINK of the index expressions one conv kernel needs (the gated input index with its padding mask, the
weight index, and the output index rebuilt from its decomposition) for every kernel tap, built identically on both sides
from the same Python operators. Every repetition uses other shapes, so no UOp (or cache on one) survives from the last.
Printed: input UOps rewritten per second (nodes of the input graphs / seconds in graph_rewrite) and the node count after.

  python bench/rewrite.py [--reps N]        (peer: pip install tinygrad==0.14.0)
"""
from __future__ import annotations

import argparse
import gc
import itertools
import random
import statistics
import time
from collections.abc import Callable
from typing import Any


def conv_kernels(var: Callable[[str, int, int], Any], rep: int) -> list[list[Any]]:
  """The index expressions of one conv kernel per shape configuration (the shapes shift with `rep`)."""
  kernels = []
  for hw, cin, k, stride, dil in itertools.product((14, 28, 56), (3, 16, 64), (1, 3, 5), (1, 2), (1, 2)):
    if k == 1 and dil == 2: continue
    n, cout, h, w, pad = 2, 32 + rep, hw + rep, hw + 2 * rep + 1, (k // 2) * dil
    oh, ow = (h + 2 * pad - dil * (k - 1) - 1) // stride + 1, (w + 2 * pad - dil * (k - 1) - 1) // stride + 1
    total = n * cout * oh * ow
    g, lx, ci = var("gidx0", 0, (total + 255) // 256 - 1), var("lidx0", 0, 255), var("ci", 0, cin - 1)
    o = g * 256 + lx
    x_ow, x_oh, x_co, x_n = o % ow, (o // ow) % oh, (o // (ow * oh)) % cout, o // (ow * oh * cout)
    exprs = [((x_n * cout + x_co) * oh + x_oh) * ow + x_ow]  # the output index: back to o
    for ky, kx in itertools.product(range(k), range(k)):
      iy, ix = x_oh * stride + ky * dil - pad, x_ow * stride + kx * dil - pad
      valid = (iy < 0).logical_not() & (iy < h) & (ix < 0).logical_not() & (ix < w)
      exprs.append(valid.where(((x_n * cin + ci) * h + iy) * w + ix, 0))
      exprs.append(((x_co * cin + ci) * k + ky) * k + kx)
    kernels.append(exprs)
  return kernels


class Side:
  def __init__(self, name: str, var: Callable[..., Any], sink: Callable[[list[Any]], Any], rewrite: Callable[[Any], Any],
               count: Callable[[Any], int]):
    self.name, self.var, self.sink, self.rewrite, self.count = name, var, sink, rewrite, count
    self.nodes_in = self.nodes_out = 0
    self.seconds = 0.0
    self.rates: list[float] = []

  def run(self, rep: int, timed: bool) -> list[Any]:
    sinks = [self.sink(exprs) for exprs in conv_kernels(self.var, rep)]
    nodes = sum(self.count(s) for s in sinks)
    gc.collect()
    t0 = time.perf_counter()
    out = [self.rewrite(s) for s in sinks]
    dt = time.perf_counter() - t0
    if timed:
      self.nodes_in += nodes
      self.nodes_out += sum(self.count(s) for s in out)
      self.seconds += dt
      self.rates.append(nodes / dt)
    return out


def plugrad_side() -> Side:
  from plugrad.uop.ops import UOp, Variable
  from plugrad.uop.rewrite import graph_rewrite
  from plugrad.uop.symbolic import symbolic
  return Side("plugrad", Variable, lambda xs: UOp.sink(*xs), lambda s: graph_rewrite(s, symbolic), lambda s: len(s.toposort))


def tinygrad_side() -> Side | None:
  try:
    import tinygrad
    from tinygrad.uop.ops import UOp as TUOp
    from tinygrad.uop.ops import graph_rewrite as tg_rewrite
    from tinygrad.uop.symbolic import symbolic as tg_symbolic
  except ImportError:
    return None
  version = getattr(tinygrad, "__version__", None)
  if version is None:
    from importlib.metadata import version as dist_version
    version = dist_version("tinygrad")
  return Side(f"tinygrad {'.'.join(version.split('.')[:2])}", TUOp.variable, lambda xs: TUOp.sink(*xs),
              lambda s: tg_rewrite(s, tg_symbolic), lambda s: len(s.toposort()))


def check_plugrad(reps: int) -> None:
  """The speed is only worth something if the answers are right: spot-check simplified against original expressions."""
  from plugrad.uop.symbolic import sym_infer
  rnd = random.Random(0)
  for exprs in conv_kernels(__import__("plugrad.uop.ops", fromlist=["Variable"]).Variable, reps)[::7]:
    for e in exprs[:5]:
      s = e.simplify()
      for _ in range(20):
        env = {v: rnd.randint(v.arg[1], v.arg[2]) for v in e.variables()}
        if sym_infer(s, env) != sym_infer(e, env): raise SystemExit(f"plugrad simplified {e.render(False)} wrongly to {s.render(False)}")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--reps", type=int, default=5, help="timed repetitions (after one warm-up), each on fresh shapes")
  args = ap.parse_args()
  sides = [s for s in (plugrad_side(), tinygrad_side()) if s is not None]
  for rep in range(args.reps + 1):
    for side in sides: side.run(rep, timed=rep > 0)  # rep 0 warms up both (pattern compilation, caches of the code)
  check_plugrad(args.reps)
  p = sides[0]
  line = f"rewrite: plugrad {p.nodes_in / p.seconds:,.0f} uops/s"
  if len(sides) > 1:
    t = sides[1]
    line += f"  {t.name} {t.nodes_in / t.seconds:,.0f} uops/s  ratio {(p.nodes_in / p.seconds) / (t.nodes_in / t.seconds):.2f}x"
  print(line)
  for side in sides:
    print(f"  {side.name}: {side.nodes_in:,} uops in, {side.nodes_out:,} after simplification, {side.seconds:.2f}s in graph_rewrite, "
          f"median rep {statistics.median(side.rates):,.0f} uops/s")
  if len(sides) == 1: print("  tinygrad is not installed: pip install tinygrad==0.14.0 to compare")


if __name__ == "__main__":
  main()
