"""JIT replay overhead: microseconds per kernel when a captured function is replayed, plugrad next to tinygrad 0.14's
TinyJit and PyTorch eager (CPU) on the same work, sizes so small that the time is all overhead.

  chain10      ten dependent tiny elementwise kernels (16 floats): x = x * 1.0001 + 1, ten times
  mlp-step     an MLP training step (12 linear layers of 32, batch 8, ReLU, MSE loss, backward, SGD with momentum):
               about 100 kernels

  python bench/jit.py [--threads N] [--reps N] [--only plugrad,tinygrad,torch]

plugrad is timed three ways: TinyJit with the device's graph runner (JIT=1, the default), TinyJit replaying kernel by
kernel (JIT=2), and without the JIT (scheduling every call). The per-kernel figure divides the median call time by
the kernels one call launches (counted from the capture); for PyTorch by the aten ops one call dispatches (counted
with a dispatch mode). Each framework runs in its own subprocess.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import peers  # bench/peers.py (the script's folder is on sys.path)

WORKLOADS = ("chain10", "mlp-step")
WIDTH, BATCH, LAYERS = 32, 8, 12


def median_s(fn: Callable[[], Any], reps: int) -> float:
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def data() -> dict[str, np.ndarray]:
  rng = np.random.default_rng(0)
  return {"x16": rng.random(16, dtype=np.float32), "x": rng.standard_normal((BATCH, WIDTH), dtype=np.float32),
          "y": rng.standard_normal((BATCH, WIDTH), dtype=np.float32)}


def chain(x: Any) -> Any:
  for _ in range(10): x = (x * 1.0001 + 1).contiguous()
  return x


def tg_chain(x: Any) -> Any:  # tinygrad: contiguous() forces a kernel each step too
  for _ in range(10): x = (x * 1.0001 + 1).contiguous()
  return x.realize()


def mlp_step(layers: list[Any], opt: Any, x: Any, y: Any) -> Any:
  opt.zero_grad()
  h = x
  for i, layer in enumerate(layers): h = layer(h).relu() if i < len(layers) - 1 else layer(h)
  loss = ((h - y) ** 2).mean()
  loss.backward()
  opt.step()
  return loss


# ---------------------------------------------------------------- one framework per process

def bench_plugrad(d: dict[str, np.ndarray], reps: int) -> dict[str, Any]:
  from plugrad import Tensor, TinyJit
  from plugrad.helpers import Context
  from plugrad.nn import Linear
  from plugrad.nn.optim import SGD
  from plugrad.nn.state import get_parameters

  out: dict[str, Any] = {}
  def run(name: str, make: Callable[[], Callable[[], Any]]) -> None:
    res: dict[str, Any] = {}
    for mode, jit in (("graph", 1), ("per-kernel", 2), ("no JIT", 0)):
      with Context(JIT=jit):
        fn = make()
        jitted = getattr(fn, "jit", None)
        for _ in range(3): fn()  # capture on the second call
        peers.settle_tiers()  # the tiered code a long loop gets, and no recompile running while timed
        n = reps if jit else max(5, reps // 20)
        res[mode] = median_s(fn, n)
        if jitted is not None and jitted.captured is not None: res["kernels"] = sum(ei.runner is not None for ei in jitted.captured.items)
    out[name] = res

  x16 = Tensor(d["x16"]).realize()
  def make_chain() -> Callable[[], Any]:
    f = TinyJit(chain)
    def call() -> Any: return f(x16)
    call.jit = f  # type: ignore[attr-defined]
    return call
  run("chain10", make_chain)

  x, y = Tensor(d["x"]).realize(), Tensor(d["y"]).realize()
  def make_mlp() -> Callable[[], Any]:
    Tensor.manual_seed(0)
    layers = [Linear(WIDTH, WIDTH) for _ in range(LAYERS)]
    opt = SGD([p for layer in layers for p in get_parameters(layer)], lr=1e-3, momentum=0.9)
    f = TinyJit(lambda x, y: mlp_step(layers, opt, x, y))
    def call() -> Any:
      Tensor.training = True
      return f(x, y)
    call.jit = f  # type: ignore[attr-defined]
    return call
  run("mlp-step", make_mlp)
  return out


def bench_tinygrad(d: dict[str, np.ndarray], reps: int) -> dict[str, Any]:
  from tinygrad import Context, Tensor, TinyJit
  from tinygrad.helpers import GlobalCounters
  from tinygrad.nn import Linear
  from tinygrad.nn.optim import SGD
  from tinygrad.nn.state import get_parameters

  def kernels(fn: Callable[[], Any]) -> int:  # launched by one un-jitted call (its compiles are done by then)
    fn()
    GlobalCounters.reset()
    fn()
    return GlobalCounters.kernel_count

  out: dict[str, Any] = {}
  x16 = Tensor(d["x16"]).realize()
  f = TinyJit(tg_chain)
  for _ in range(3): f(x16)
  out["chain10"] = {"graph": median_s(lambda: f(x16), reps), "kernels": kernels(lambda: tg_chain(x16))}

  x, y = Tensor(d["x"]).realize(), Tensor(d["y"]).realize()
  Tensor.manual_seed(0)
  layers = [Linear(WIDTH, WIDTH) for _ in range(LAYERS)]
  opt = SGD([p for layer in layers for p in get_parameters(layer)], lr=1e-3, momentum=0.9)
  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    h = x
    for i, layer in enumerate(layers): h = layer(h).relu() if i < len(layers) - 1 else layer(h)
    loss = ((h - y) ** 2).mean().backward()
    return loss.realize(*opt.schedule_step())
  with Context(TRAINING=1):
    for _ in range(3): step(x, y)
    out["mlp-step"] = {"graph": median_s(lambda: step(x, y), reps), "kernels": kernels(lambda: step.fxn(x, y))}
  return out


def bench_torch(d: dict[str, np.ndarray], reps: int, threads: int) -> dict[str, Any]:
  import torch
  from torch.utils._python_dispatch import TorchDispatchMode
  torch.set_num_threads(threads)

  class Count(TorchDispatchMode):
    def __init__(self) -> None:
      super().__init__()
      self.ops = 0
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
      self.ops += 1
      return func(*args, **(kwargs or {}))

  def ops_of(fn: Callable[[], Any]) -> int:
    with Count() as c: fn()
    return c.ops

  out: dict[str, Any] = {}
  x16 = torch.from_numpy(d["x16"])
  def ch() -> Any:
    x = x16
    for _ in range(10): x = x * 1.0001 + 1
    return x
  for _ in range(3): ch()
  out["chain10"] = {"eager": median_s(ch, reps), "kernels": ops_of(ch)}

  torch.manual_seed(0)
  layers = [torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)]
  opt = torch.optim.SGD([p for layer in layers for p in layer.parameters()], lr=1e-3, momentum=0.9, foreach=False)
  x, y = torch.from_numpy(d["x"]), torch.from_numpy(d["y"])
  def step() -> Any:
    opt.zero_grad()
    h = x
    for i, layer in enumerate(layers): h = torch.relu(layer(h)) if i < len(layers) - 1 else layer(h)
    loss = ((h - y) ** 2).mean()
    loss.backward()
    opt.step()
    return loss
  for _ in range(3): step()
  out["mlp-step"] = {"eager": median_s(step, reps), "kernels": ops_of(step)}
  return out


# ---------------------------------------------------------------- the driver

def run_peer(name: str, args: argparse.Namespace) -> dict[str, Any] | str:
  return peers.run_peer(__file__, name, args.threads, "--reps", str(args.reps))


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
  ap.add_argument("--reps", type=int, default=2000)
  ap.add_argument("--only", default="plugrad,tinygrad,torch")
  ap.add_argument("--peer", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.peer:
    d = data()
    res = {"plugrad": lambda: bench_plugrad(d, args.reps), "tinygrad": lambda: bench_tinygrad(d, max(50, args.reps // 10)),
           "torch": lambda: bench_torch(d, args.reps, args.threads)}[args.peer]()
    print(json.dumps(res))
    return
  names = [n for n in ("plugrad", "tinygrad", "torch") if n in args.only.split(",")]
  results = {n: run_peer(n, args) for n in names}
  print(f"replay overhead, {args.threads} thread(s), median call time / kernels per call (microseconds per kernel)")
  for n, r in results.items():
    if isinstance(r, str): print(f"  {n}: {r}")
  for w in WORKLOADS:
    cells = []
    for n, r in results.items():
      if not isinstance(r, dict): continue
      res = r[w]
      for mode in ("graph", "per-kernel", "no JIT", "eager"):
        if mode in res:
          label = {"plugrad": "plugrad", "tinygrad": "tinygrad TinyJit", "torch": "torch"}[n] + ("" if n != "plugrad" else f" {mode}")
          cells.append(f"{label} {res[mode] / res['kernels'] * 1e6:7.2f}")
    kernels = ", ".join(f"{n} {r[w]['kernels']}" for n, r in results.items() if isinstance(r, dict))
    print(f"{w:9s} [{kernels} kernels/ops]  " + " | ".join(cells))


if __name__ == "__main__":
  main()
