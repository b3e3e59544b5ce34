"""Training-step time: plugrad on its default device next to PyTorch (CPU) and tinygrad 0.14 (DEV=CPU), same models,
batches and thread count, one line per workload with the ratio of the times.

  digits-cnn train b128   the model of examples/train_digits.py: forward, loss, backward, Adam step (BatchNorm training)
  mlp-784-512-512-10 b256 inference (forward only) and an SGD step

  python bench/train.py [--threads N] [--reps N] [--warmup N] [--only plugrad,torch,tinygrad]

Each framework runs in its own subprocess (its thread setting is read at start-up). plugrad and tinygrad are timed with
TinyJit, their normal training path (from the third call a step replays its captured kernels); PyTorch eagerly.
After plugrad's warm-up, `plugrad_cpu.tiering.settle()` swaps in the C compiler's code for its LLVM-compiled kernels,
which a training loop gets by itself within its first steps (plugins/cpu/README.md), so the timed steps run that.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import peers  # bench/peers.py (the script's folder is on sys.path)

WORKLOADS = ["digits-cnn train b128", "mlp infer b256", "mlp sgd b256"]


def data(seed: int = 0) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  return {"img": rng.random((128, 1, 8, 8), dtype=np.float32), "img_y": rng.integers(0, 10, 128).astype(np.int32),
          "vec": rng.standard_normal((256, 784), dtype=np.float32), "vec_y": rng.integers(0, 10, 256).astype(np.int32)}


def median_ms(fn: Callable[[], Any], warmup: int, reps: int, settle: Callable[[], None] | None = None) -> float:
  for _ in range(warmup): fn()
  if settle is not None:  # then warm up again: the swapped-in code's first runs, and the garbage the recompiles left
    settle()
    gc.collect()
    for _ in range(warmup): fn()
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    fn()
    times.append((time.perf_counter() - t) * 1e3)
  return statistics.median(times)


# ---------------------------------------------------------------- the three frameworks (each in its own process)

def models(Conv2d: Any, BatchNorm2d: Any, Linear: Any) -> tuple[type, type]:
  """The digits CNN and the MLP, built from one framework's layers (plugrad and tinygrad share the API)."""
  class DigitsCNN:
    def __init__(self) -> None:
      self.conv1, self.bn1 = Conv2d(1, 16, 3, padding=1, bias=False), BatchNorm2d(16)
      self.conv2, self.bn2 = Conv2d(16, 32, 3, padding=1, bias=False), BatchNorm2d(32)
      self.fc = Linear(512, 10)
    def __call__(self, x: Any) -> Any: return self.fc(self.bn2(self.conv2(self.bn1(self.conv1(x)).relu().max_pool2d(2))).relu().flatten(1))

  class MLP:
    def __init__(self) -> None: self.l1, self.l2, self.l3 = Linear(784, 512), Linear(512, 512), Linear(512, 10)
    def __call__(self, x: Any) -> Any: return self.l3(self.l2(self.l1(x).relu()).relu())
  return DigitsCNN, MLP


def bench_plugrad(d: dict[str, np.ndarray], warmup: int, reps: int) -> dict[str, float]:
  from plugrad import Tensor, TinyJit
  from plugrad.nn import BatchNorm2d, Conv2d, Linear, get_parameters
  from plugrad.nn.optim import SGD, Adam

  DigitsCNN, MLP = models(Conv2d, BatchNorm2d, Linear)  # the same code for both: their nn APIs match

  def train_step(model: Any, opt: Any, x: Tensor, y: Tensor, **loss_kw: Any) -> Callable[[], None]:
    @TinyJit
    def step() -> Tensor:
      opt.zero_grad()
      loss = model(x).sparse_categorical_crossentropy(y, **loss_kw)
      loss.backward()
      return loss.realize(*opt.schedule_step())
    return lambda: step().numpy()

  Tensor.training = True
  cnn, mlp = DigitsCNN(), MLP()
  img, img_y, vec, vec_y = (Tensor(d[k]).realize() for k in ("img", "img_y", "vec", "vec_y"))
  warmup = max(warmup, 3)  # TinyJit captures on its second call
  cnn_step = train_step(cnn, Adam(get_parameters(cnn), lr=1e-2), img, img_y, label_smoothing=0.1)
  out = {"digits-cnn train b128": median_ms(cnn_step, warmup, reps, peers.settle_tiers)}
  Tensor.training = False
  infer = TinyJit(lambda: mlp(vec).realize())
  out["mlp infer b256"] = median_ms(lambda: infer().numpy(), warmup, reps, peers.settle_tiers)
  Tensor.training = True
  out["mlp sgd b256"] = median_ms(train_step(mlp, SGD(get_parameters(mlp), lr=0.01), vec, vec_y), warmup, reps, peers.settle_tiers)
  return out


def bench_torch(d: dict[str, np.ndarray], warmup: int, reps: int, threads: int) -> dict[str, float]:
  import torch
  from torch import nn
  torch.set_num_threads(threads)
  torch.manual_seed(0)
  cnn = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(), nn.Flatten(), nn.Linear(512, 10))
  mlp = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
  img, vec = torch.from_numpy(d["img"]), torch.from_numpy(d["vec"])
  img_y, vec_y = torch.from_numpy(d["img_y"]).long(), torch.from_numpy(d["vec_y"]).long()

  def train_step(model: Any, opt: Any, x: Any, y: Any, **loss_kw: Any) -> Callable[[], None]:
    def step() -> None:
      opt.zero_grad()
      nn.functional.cross_entropy(model(x), y, **loss_kw).backward()
      opt.step()
    return step

  def infer() -> None:
    with torch.no_grad(): mlp(vec)

  adam = torch.optim.Adam(cnn.parameters(), lr=1e-2)
  out = {"digits-cnn train b128": median_ms(train_step(cnn, adam, img, img_y, label_smoothing=0.1), warmup, reps)}
  out["mlp infer b256"] = median_ms(infer, warmup, reps)
  out["mlp sgd b256"] = median_ms(train_step(mlp, torch.optim.SGD(mlp.parameters(), lr=0.01), vec, vec_y), warmup, reps)
  return out


def bench_tinygrad(d: dict[str, np.ndarray], warmup: int, reps: int) -> dict[str, float]:
  from tinygrad import Context, Tensor, TinyJit
  from tinygrad.nn import BatchNorm2d, Conv2d, Linear
  from tinygrad.nn.optim import SGD, Adam
  from tinygrad.nn.state import get_parameters

  DigitsCNN, MLP = models(Conv2d, BatchNorm2d, Linear)  # the same code for both: their nn APIs match

  def train_step(model: Any, opt: Any, x: Tensor, y: Tensor, **loss_kw: Any) -> Callable[[], None]:
    @TinyJit
    def step() -> Tensor:
      opt.zero_grad()
      loss = model(x).sparse_categorical_crossentropy(y, **loss_kw).backward()
      return loss.realize(*opt.schedule_step())
    return lambda: step().numpy()

  cnn, mlp = DigitsCNN(), MLP()
  img, img_y, vec, vec_y = (Tensor(d[k]).realize() for k in ("img", "img_y", "vec", "vec_y"))
  infer = TinyJit(lambda: mlp(vec).realize())
  warmup = max(warmup, 3)  # TinyJit captures on its second call
  with Context(TRAINING=1):
    out = {"digits-cnn train b128": median_ms(train_step(cnn, Adam(get_parameters(cnn), lr=1e-2), img, img_y, label_smoothing=0.1), warmup, reps)}
  with Context(TRAINING=0): out["mlp infer b256"] = median_ms(lambda: infer().numpy(), warmup, reps)
  with Context(TRAINING=1): out["mlp sgd b256"] = median_ms(train_step(mlp, SGD(get_parameters(mlp), lr=0.01), vec, vec_y), warmup, reps)
  return out


# ---------------------------------------------------------------- the driver

def run_peer(name: str, args: argparse.Namespace) -> dict[str, Any] | str:
  return peers.run_peer(__file__, name, args.threads, "--reps", str(args.reps), "--warmup", str(args.warmup))


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
  ap.add_argument("--reps", type=int, default=10)
  ap.add_argument("--warmup", type=int, default=2)
  ap.add_argument("--only", default="plugrad,torch,tinygrad")
  ap.add_argument("--peer", help=argparse.SUPPRESS)  # internal: run one framework and print its JSON
  args = ap.parse_args()
  if args.peer:
    d = data()
    res = {"plugrad": lambda: bench_plugrad(d, args.warmup, args.reps), "torch": lambda: bench_torch(d, args.warmup, args.reps, args.threads),
           "tinygrad": lambda: bench_tinygrad(d, args.warmup, args.reps)}[args.peer]()
    print(json.dumps(res))
    return

  names = [n for n in ("plugrad", "torch", "tinygrad") if n in args.only.split(",")]
  results = {n: run_peer(n, args) for n in names}
  if "plugrad" in results and isinstance(results["plugrad"], dict):
    dev = subprocess.run([sys.executable, "-c", "from plugrad import Device; print(Device.DEFAULT)"], capture_output=True, text=True).stdout.strip()
    print(f"plugrad on {dev or '?'}, torch CPU, tinygrad DEV=CPU; {args.threads} thread(s); median of {args.reps} steps, ms per step")
  for n, r in results.items():
    if isinstance(r, str): print(f"  {n}: {r}")
  base = results.get("plugrad")
  for w in WORKLOADS:
    cells = []
    for n, r in results.items():
      if not isinstance(r, dict): continue
      cells.append(f"{n} {r[w]:8.2f} ms")
      if isinstance(base, dict) and n != "plugrad":
        cells[-1] += f" (plugrad {base[w] / r[w]:.2f}x slower)" if base[w] >= r[w] else f" (plugrad {r[w] / base[w]:.2f}x faster)"
    print(f"{w:24s} " + "   ".join(cells))

if __name__ == "__main__":
  main()
