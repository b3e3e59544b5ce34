"""Codegen time per kernel: each kernel of a GPT training step (bench/models.py's Decoder, GPT-2-small shapes: hidden
768, 12 heads, FFN 3072, vocab 50257, seq 256, batch 4, AdamW; 2 layers by default) built once on the default device.

"Codegen" is `get_program` (optimize → the codegen passes → linearize → render), which the fused attention kernels go
through too; the C/LLVM compile is not counted. It is wrapped here and timed on its cache misses.
Every kernel is built afresh in a new process: the children run with CACHE=0, past the persistent program cache.
The garbage collector is off while the step runs (--gc keeps it on). Each of --reps runs is a fresh process; a kernel's
time is its fastest (the machine's noise only adds). Printed: the slowest kernels, the median, max and total.

  python bench/codegen.py [--layers N] [--reps N] [--top N] [--dump DIR] [--profile NAME [--sort KEY] [--callers RE]] [--gc]

--dump DIR writes each kernel's rendered source to DIR/<name> (diff two dumps to check that a change keeps the code);
--profile NAME runs cProfile over the codegen of the kernels whose name contains NAME ("" for all) and prints the top
functions (one run).
"""
from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import plugrad.codegen as codegen

HERE = Path(__file__).resolve().parent
times: dict[str, float] = {}  # kernel name (#k: the k-th other kernel of that name) → ms of its build
sources: dict[str, str] = {}
profile_match: str | None = None  # --profile: profile each build, keep those whose kernel name contains this
profiles: list[cProfile.Profile] = []


def timed(fn: Any) -> Any:
  """`fn` (get_program), timing each call that built a kernel: a cache hit adds nothing to
  codegen_seconds."""
  def wrapper(*args: Any, **kw: Any) -> Any:
    before, t0 = codegen.codegen_seconds[0], time.perf_counter()
    prof = cProfile.Profile() if profile_match is not None else None
    if prof is not None: prof.enable()
    try: prg = fn(*args, **kw)
    finally:
      if prof is not None: prof.disable()
    if codegen.codegen_seconds[0] != before:
      ms, name = (time.perf_counter() - t0) * 1e3, prg.name
      if name in times: name = f"{name}#{sum(n.split('#')[0] == prg.name for n in times)}"
      times[name], sources[name] = ms, prg.source
      if prof is not None and profile_match is not None and profile_match in name: profiles.append(prof)
    return prg
  return wrapper


def step(layers: int) -> None:
  """One training step of the decoder (forward, cross-entropy, backward, AdamW), run to completion."""
  sys.path.insert(0, str(HERE))
  from models import Decoder

  from plugrad import Tensor
  from plugrad.nn import optim, state
  Tensor.training = True
  model = Decoder(hidden=768, heads=12, ffn=3072, layers=layers, vocab=50257, max_seq=1024)
  params = state.get_parameters(model)
  Tensor.realize(*params)
  opt = optim.AdamW(params, lr=1e-4, weight_decay=0.01)
  ids, targets = Tensor.randint(4, 256, low=0, high=50257).realize(), Tensor.randint(4, 256, low=0, high=50257).realize()
  times.clear(), sources.clear(), profiles.clear()  # the setup's kernels (initializers, randint) are not the step's
  opt.zero_grad()
  loss = model(ids).sparse_categorical_crossentropy(targets)
  loss.backward()
  loss.realize(*opt.schedule_step()).numpy()


def measure(args: argparse.Namespace) -> dict[str, float]:
  """One run in this process: the step's kernels' codegen ms."""
  global profile_match
  profile_match = args.profile
  codegen.get_program = timed(codegen.get_program)  # type: ignore[method-assign]
  if not args.gc: gc.disable()
  step(args.layers)
  gc.enable()
  if args.dump:
    args.dump.mkdir(parents=True, exist_ok=True)
    for name, src in sources.items(): (args.dump / name).write_text(src)
  if profiles:
    stats = pstats.Stats(profiles[0])
    for p in profiles[1:]: stats.add(p)
    stats.sort_stats(args.sort).print_stats(args.lines)
    if args.callers: stats.print_callers(args.callers)
  return dict(times)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--layers", type=int, default=2)
  ap.add_argument("--reps", type=int, default=1, help="fresh processes; each kernel's fastest build is reported")
  ap.add_argument("--top", type=int, default=15, help="kernels printed (0: all)")
  ap.add_argument("--dump", type=Path, help="write each kernel's source to this folder (first run)")
  ap.add_argument("--profile", help="cProfile the codegen of the kernels whose name contains this (one run in this process)")
  ap.add_argument("--sort", default="cumulative", help="the profile's order (a pstats key: cumulative, tottime, ...)")
  ap.add_argument("--lines", type=int, default=40, help="the profile's functions printed")
  ap.add_argument("--callers", help="also print the callers of the profiled functions matching this")
  ap.add_argument("--gc", action="store_true", help="keep the garbage collector on")
  ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # internal: one run, its times as JSON
  args = ap.parse_args()
  if args.child or args.profile is not None:
    got = [measure(args)]
    if args.child:
      print(json.dumps(got[0]))
      return
  else:
    got = []
    for i in range(args.reps):
      cmd = [sys.executable, __file__, "--child", "--layers", str(args.layers), *(["--gc"] if args.gc else []),
             *(["--dump", str(args.dump)] if args.dump and i == 0 else [])]
      # CACHE=0: the persistent program cache would hand a warm process its rendered kernels, and nothing would be timed
      env = {**os.environ, "CACHE": "0"}
      got.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout.splitlines()[-1]))
  best = {k: min(g[k] for g in got if k in g) for k in got[0]}
  ms = sorted(best.items(), key=lambda kv: -kv[1])
  for name, t in ms[:args.top or None]: print(f"{t:9.1f} ms  {name}")
  vals = [t for _, t in ms]
  print(f"{len(vals)} kernels ({args.layers}-layer GPT training step, best of {len(got)} runs): median {statistics.median(vals):.1f} ms, "
        f"max {max(vals):.1f} ms, total {sum(vals):.0f} ms")


if __name__ == "__main__":
  main()
