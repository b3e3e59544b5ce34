"""Convolutional networks on the CPU: plugrad next to PyTorch in one process, same threads, same weights and inputs.

  python bench/cnn.py [--threads N] [--quick] [--only sweep,models,train] [--models resnet18,resnet50,mobilenetv2]
                      [--batches 1,8] [--filter TEXT] [--rounds R] [--untuned] [--train-models resnet18,...]

* **sweep**: one line per distinct conv, pool and matmul shape of ResNet-18, ResNet-50 and MobileNetV2 (recorded from a
  lazy forward of the models below at each batch, so the list is what the models run), plus the batch-1 matmuls of a
  GPT-2-small decode step (1x768 @ 768x3072, 1x768 @ 768x50257). Each op alone: conv without bias (torchvision's
  convs before a BatchNorm have none), max pool, global average pool (the mean over H, W), Linear (x @ W.T + b,
  W (out, in)). `--untuned` adds shapes the optimizer was not tuned on (other sizes of the same families).
* **models**: eval-mode forward of the three models in torchvision's layout (names `layer1.0.conv1.weight`,
  `features.3.conv.1.0.weight`, ...), 3x224x224, random weights and BatchNorm statistics copied into PyTorch's
  modules by name; "first" is plugrad's first call (schedule and compile included; the kernel disk cache may hold
  earlier compiles: `CACHE=0` for a cold figure).
* **train**: one ResNet-18 training step at batch 8 (forward, cross-entropy, backward, SGD with momentum 0.9; BatchNorm
  in training mode), plugrad under TinyJit, PyTorch eagerly (autograd on); "first step" is plugrad's first step (its
  kernels scheduled, compiled and run), "first 3 steps" the three a TinyJit loop takes to its first replay. The
  losses of the first three steps are compared (both start from the same weights and take the same steps).
  `--train-models resnet18,mobilenetv2,resnet50` times the other models' steps too.

How it measures: plugrad runs each op or model under TinyJit (a replay from the third call), PyTorch eagerly under
inference_mode, both on the same thread count (plugrad's THREADS, torch.set_num_threads) in this one process. After a
warm-up (and plugrad-cpu's tier-up, waited for), `--rounds` rounds alternate the two, each round a block of
back-to-back runs of one framework (at least 2 runs and 0.2 s; 0.3 s for models), and each keeps its best single run
over all rounds: the machine may be shared, and best-of-N is the figure least moved by a neighbour. A short sleep
follows every block (OpenMP's and plugrad's pool threads spin for a while after a call). The first run of each row is
checked against PyTorch's result (max abs error / max abs value; "MISMATCH" above 1e-3). Each line: plugrad ms,
PyTorch ms, ratio = plugrad time / PyTorch time (above 1: plugrad is slower), plugrad's GFLOPS; the geometric mean of
the ratios closes each part. --quick runs a few rows per family at batch 1 and the models at 112x112 (a smoke test).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np


def _threads_from_argv() -> int:
  """--threads before any import of plugrad or torch: plugrad's CPU runtime reads THREADS when it starts."""
  for i, a in enumerate(sys.argv):
    if a == "--threads" and i + 1 < len(sys.argv): return int(sys.argv[i + 1])
    if a.startswith("--threads="): return int(a.split("=", 1)[1])
  return len(os.sched_getaffinity(0))


THREADS = _threads_from_argv()
os.environ["THREADS"] = str(THREADS)

import peers  # bench/peers.py (the script's folder is on sys.path)
import torch
import torch.nn.functional as TF

from plugrad import Tensor, TinyJit, nn

torch.set_num_threads(THREADS)



# ---------------------------------------------------------------- the models, once for both frameworks

class Ops:
  """What the model code needs from a framework: layers with PyTorch's constructor signatures, and the functions."""
  def __init__(self, conv: Any, bn: Any, linear: Any, relu: Callable[[Any], Any], relu6: Callable[[Any], Any],
               maxpool: Callable[[Any], Any], gap: Callable[[Any], Any], seq: Callable[[Any, list[Any]], Any]):
    self.conv, self.bn, self.linear, self.relu, self.relu6, self.maxpool, self.gap, self.seq = conv, bn, linear, relu, relu6, maxpool, gap, seq


def _torch_seq(x: Any, ll: list[Any]) -> Any:
  for f in ll: x = f(x)
  return x


TORCH = Ops(lambda *a, **k: torch.nn.Conv2d(*a, **k), torch.nn.BatchNorm2d, torch.nn.Linear, torch.relu, TF.relu6,
            lambda x: TF.max_pool2d(x, 3, 2, 1), lambda x: x.mean((2, 3)), _torch_seq)


def plugrad_ops(record: list[tuple[Any, ...]] | None = None) -> Ops:
  """plugrad's layers; with `record`, every conv, pool and Linear call appends its shape (the sweep's source)."""
  rec = record if record is not None else []

  class Conv(nn.Conv2d):
    def __call__(self, x: Tensor) -> Tensor:
      rec.append(("conv", tuple(x.shape), tuple(self.weight.shape), self.stride, self.padding, self.groups))
      return super().__call__(x)

  class Lin(nn.Linear):
    def __call__(self, x: Tensor) -> Tensor:
      rec.append(("linear", tuple(x.shape), tuple(self.weight.shape)))
      return super().__call__(x)

  def maxpool(x: Tensor) -> Tensor:
    rec.append(("maxpool", tuple(x.shape)))
    return x.max_pool2d(3, 2, padding=1)  # type: ignore[return-value]

  def gap(x: Tensor) -> Tensor:
    rec.append(("gap", tuple(x.shape)))
    return x.mean((2, 3))
  return Ops(Conv, nn.BatchNorm2d, Lin, Tensor.relu, Tensor.relu6, maxpool, gap, lambda x, ll: x.sequential(ll))


class BasicBlock:
  expansion = 1

  def __init__(self, o: Ops, cin: int, planes: int, stride: int):
    self.o = o
    self.conv1, self.bn1 = o.conv(cin, planes, 3, stride=stride, padding=1, bias=False), o.bn(planes)
    self.conv2, self.bn2 = o.conv(planes, planes, 3, padding=1, bias=False), o.bn(planes)
    self.downsample = [o.conv(cin, planes, 1, stride=stride, bias=False), o.bn(planes)] if stride != 1 or cin != planes else []

  def __call__(self, x: Any) -> Any:
    y = self.bn2(self.conv2(self.o.relu(self.bn1(self.conv1(x)))))
    return self.o.relu(y + self.o.seq(x, self.downsample))


class Bottleneck:
  expansion = 4

  def __init__(self, o: Ops, cin: int, planes: int, stride: int):
    self.o, out = o, planes * 4
    self.conv1, self.bn1 = o.conv(cin, planes, 1, bias=False), o.bn(planes)
    self.conv2, self.bn2 = o.conv(planes, planes, 3, stride=stride, padding=1, bias=False), o.bn(planes)  # torchvision's v1.5
    self.conv3, self.bn3 = o.conv(planes, out, 1, bias=False), o.bn(out)
    self.downsample = [o.conv(cin, out, 1, stride=stride, bias=False), o.bn(out)] if stride != 1 or cin != out else []

  def __call__(self, x: Any) -> Any:
    r = self.o.relu
    y = self.bn3(self.conv3(r(self.bn2(self.conv2(r(self.bn1(self.conv1(x))))))))
    return r(y + self.o.seq(x, self.downsample))


class ResNet:
  def __init__(self, o: Ops, block: Any, layers: list[int], classes: int = 1000):
    self.o = o
    self.conv1, self.bn1 = o.conv(3, 64, 7, stride=2, padding=3, bias=False), o.bn(64)
    cin = 64
    for i, (planes, n) in enumerate(zip((64, 128, 256, 512), layers)):
      blocks = []
      for j in range(n):
        blocks.append(block(o, cin, planes, 2 if j == 0 and i > 0 else 1))
        cin = planes * block.expansion
      setattr(self, f"layer{i + 1}", blocks)
    self.fc = o.linear(cin, classes)

  def __call__(self, x: Any) -> Any:
    x = self.o.maxpool(self.o.relu(self.bn1(self.conv1(x))))
    for i in range(1, 5): x = self.o.seq(x, getattr(self, f"layer{i}"))
    return self.fc(self.o.gap(x))


class InvertedResidual:
  def __init__(self, o: Ops, cin: int, cout: int, stride: int, t: int):
    hidden, self.res = cin * t, stride == 1 and cin == cout
    self.o = o
    layers: list[Any] = [[o.conv(cin, hidden, 1, bias=False), o.bn(hidden), o.relu6]] if t != 1 else []
    layers += [[o.conv(hidden, hidden, 3, stride=stride, padding=1, groups=hidden, bias=False), o.bn(hidden), o.relu6],
               o.conv(hidden, cout, 1, bias=False), o.bn(cout)]
    self.conv = layers

  def __call__(self, x: Any) -> Any:
    y = x
    for f in self.conv: y = self.o.seq(y, f) if isinstance(f, list) else f(y)
    return x + y if self.res else y


class MobileNetV2:
  SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))

  def __init__(self, o: Ops, classes: int = 1000):
    self.o = o
    feats: list[Any] = [[o.conv(3, 32, 3, stride=2, padding=1, bias=False), o.bn(32), o.relu6]]
    cin = 32
    for t, c, n, s in self.SETTINGS:
      for i in range(n):
        feats.append(InvertedResidual(o, cin, c, s if i == 0 else 1, t))
        cin = c
    feats.append([o.conv(cin, 1280, 1, bias=False), o.bn(1280), o.relu6])
    self.features = feats
    self.classifier = [lambda x: x, o.linear(1280, classes)]  # torchvision's Dropout (identity in eval), Linear

  def __call__(self, x: Any) -> Any:
    for f in self.features: x = self.o.seq(x, f) if isinstance(f, list) else f(x)
    return self.o.seq(self.o.gap(x), self.classifier)


MODELS: dict[str, Callable[[Ops], Any]] = {
  "resnet18": lambda o: ResNet(o, BasicBlock, [2, 2, 2, 2]), "resnet50": lambda o: ResNet(o, Bottleneck, [3, 4, 6, 3]),
  "mobilenetv2": lambda o: MobileNetV2(o)}


def _parent(obj: Any, path: list[str]) -> Any:
  for p in path: obj = obj[int(p)] if isinstance(obj, list) else getattr(obj, p)
  return obj


def copy_random_weights(pg: Any, th: Any, seed: int = 0) -> None:
  """Random weights into both models by state-dict name: convs and Linears at their default scale, BatchNorm's
  affine parameters and running statistics randomized (so eval mode does real work)."""
  rng = np.random.default_rng(seed)
  for name, t in sorted(nn.get_state_dict(pg).items()):
    *path, leaf = name.split(".")
    if leaf == "num_batches_tracked": continue
    shape = tuple(d for d in t.shape if isinstance(d, int))  # the models have constant shapes
    fan_in = max(1, math.prod(shape[1:]))
    if leaf == "running_var" or (leaf == "weight" and len(shape) == 1): a = rng.uniform(0.5, 1.5, shape)
    elif leaf in ("running_mean", "bias"): a = rng.normal(0, 0.1, shape)
    else: a = rng.uniform(-1, 1, shape) * math.sqrt(3 / fan_in)
    a = a.astype(np.float32)
    setattr(_parent(pg, path), leaf, Tensor(a, requires_grad=t.requires_grad).realize())
    with torch.no_grad(): getattr(_parent(th, path), leaf).copy_(torch.from_numpy(a))


# ---------------------------------------------------------------- timing

def best_pair(pg: Callable[[], Any], th: Callable[[], Any], rounds: int, block_s: float = 0.2) -> tuple[float, float]:
  """Best single-run seconds of each, over `rounds` alternating blocks (see the module docstring). A block runs at least
  twice and until `block_s` has passed: on a busy machine a framework's first calls after the other's can take tens of
  ms (its threads were descheduled), so a block's length is counted in time, not in runs."""
  best = {"pg": math.inf, "th": math.inf}
  for r in range(rounds):
    for key, f in (("pg", pg), ("th", th)) if r % 2 == 0 else (("th", th), ("pg", pg)):
      start, n = time.perf_counter(), 0
      while n < 2 or (time.perf_counter() - start < block_s and n < 200):
        t = time.perf_counter()
        f()
        best[key], n = min(best[key], time.perf_counter() - t), n + 1
      time.sleep(0.1 if key == "th" else 0.01)  # OpenMP's and plugrad's pool threads spin a while after a call
  return best["pg"], best["th"]


def rel_err(a: np.ndarray, b: np.ndarray) -> float: return float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1e-30))


@dataclass
class Row:
  label: str
  pg_s: float
  th_s: float
  flops: float
  err: float
  note: str = ""

  @property
  def ratio(self) -> float: return self.pg_s / self.th_s

  def line(self) -> str:
    gf = f"{self.flops / self.pg_s / 1e9:7.1f} GFLOPS" if self.flops else " " * 14
    bad = "  MISMATCH" if self.err > 1e-3 else ""
    return f"  {self.label:<44} {self.pg_s * 1e3:9.3f} ms  torch {self.th_s * 1e3:9.3f} ms  x{self.ratio:6.2f}  {gf}{bad}{self.note}"


def geomean(rows: list[Row]) -> float: return math.exp(sum(math.log(r.ratio) for r in rows) / len(rows)) if rows else float("nan")


# ---------------------------------------------------------------- the sweep

def conv_label(x: tuple[int, ...], w: tuple[int, ...], stride: Any, padding: Any, groups: int) -> str:
  kind = "dw" if groups == x[1] and groups > 1 else "conv"
  return f"{kind} {x[0]}x{x[1]}x{x[2]}x{x[3]} {w[2]}x{w[3]}/{stride} p{padding} ->{w[0]}"


def op_label(op: tuple[Any, ...]) -> str:
  if op[0] == "conv": return conv_label(*op[1:])
  if op[0] == "linear": return f"linear {op[1][0]}x{op[1][1]} @ {op[2][1]}x{op[2][0]}{'' if len(op) < 4 or op[3] else ' (no bias)'}"
  if op[0] == "maxpool": return f"maxpool {'x'.join(map(str, op[1]))} 3x3/2 p1"
  return f"global avg pool {'x'.join(map(str, op[1]))}"


def sweep_op(op: tuple[Any, ...], rounds: int) -> Row:
  rng = np.random.default_rng(hash(op) % 2**32)
  f32 = lambda *s: rng.standard_normal(s, dtype=np.float32)
  kind = op[0]
  if kind == "conv":
    _, xs, ws, stride, padding, groups = op
    x, w = f32(*xs), f32(*ws) * np.float32(1 / math.sqrt(math.prod(ws[1:])))
    px, pw, tx, tw = Tensor(x).realize(), Tensor(w).realize(), torch.from_numpy(x), torch.from_numpy(w)
    pfn = TinyJit(lambda a, b: a.conv2d(b, stride=stride, padding=padding, groups=groups).realize())
    run_pg, run_th = (lambda: pfn(px, pw)), (lambda: TF.conv2d(tx, tw, stride=stride, padding=padding, groups=groups))
    oh = (xs[2] + 2 * padding - ws[2]) // stride + 1
    ow = (xs[3] + 2 * padding - ws[3]) // stride + 1
    flops = 2.0 * xs[0] * ws[0] * oh * ow * math.prod(ws[1:])
  elif kind == "linear":
    xs, ws, bias = op[1], op[2], len(op) < 4 or op[3]
    x, w, b = f32(*xs), f32(*ws) * np.float32(1 / math.sqrt(ws[1])), f32(ws[0])
    px, pw, pb = (Tensor(a).realize() for a in (x, w, b))
    tx, tw, tb = (torch.from_numpy(a) for a in (x, w, b))
    pfn = TinyJit((lambda a, m, c: (a @ m.T + c).realize()) if bias else (lambda a, m, c: (a @ m.T).realize()))
    run_pg, run_th = (lambda: pfn(px, pw, pb)), (lambda: TF.linear(tx, tw, tb if bias else None))
    flops = 2.0 * xs[0] * ws[0] * ws[1]
  elif kind in ("maxpool", "gap"):
    xs = op[1]
    x = f32(*xs)
    px, tx = Tensor(x).realize(), torch.from_numpy(x)
    if kind == "maxpool":
      pfn = TinyJit(lambda a: a.max_pool2d(3, 2, padding=1).realize())
      run_th = lambda: TF.max_pool2d(tx, 3, 2, 1)
    else:
      pfn = TinyJit(lambda a: a.mean((2, 3)).realize())
      run_th = lambda: tx.mean((2, 3))
    run_pg, flops = (lambda: pfn(px)), 0.0
  else: raise ValueError(f"unknown op {kind!r}")
  with torch.inference_mode():
    got, want = run_pg().numpy(), run_th().numpy()
    for _ in range(2): run_pg()  # TinyJit captures on the second call
    peers.settle_tiers()
    pg_s, th_s = best_pair(run_pg, run_th, rounds)
  return Row(op_label(op), pg_s, th_s, flops, rel_err(got, want))


DECODE = [("linear", (1, 768), (3072, 768)), ("linear", (1, 768), (50257, 768), False)]  # GPT-2 small: up-projection, LM head
UNTUNED = [("conv", (4, 256, 13, 13), (256, 256, 3, 3), 1, 1, 1), ("conv", (2, 96, 35, 35), (96, 96, 3, 3), 1, 1, 1),
           ("conv", (4, 384, 17, 17), (192, 384, 1, 1), 1, 0, 1), ("conv", (1, 720, 9, 9), (720, 1, 3, 3), 1, 1, 720),
           ("conv", (3, 200, 10, 10), (400, 200, 3, 3), 2, 1, 1), ("linear", (1, 1024), (4096, 1024)),
           ("linear", (5, 640), (1000, 640)), ("linear", (2, 2048), (1000, 2048)), ("gap", (3, 1000, 9, 9)),
           ("maxpool", (2, 96, 75, 75))]
# --quick: one row per family the issue names (batch 1 where the models give both)
QUICK = [("conv", (1, 512, 7, 7), (512, 512, 3, 3), 1, 1, 1), ("conv", (1, 64, 56, 56), (64, 64, 3, 3), 1, 1, 1),
         ("conv", (1, 512, 7, 7), (2048, 512, 1, 1), 1, 0, 1), ("conv", (1, 960, 7, 7), (960, 1, 3, 3), 1, 1, 960),
         ("linear", (8, 512), (1000, 512)), ("gap", (8, 512, 7, 7)), ("maxpool", (1, 64, 112, 112)), *DECODE]


def sweep_ops(models: list[str], batches: list[int]) -> list[tuple[Any, ...]]:
  """The distinct ops of the models' lazy forwards (no kernel runs), in first-seen order."""
  seen: dict[tuple[Any, ...], None] = {}
  for b in batches:
    for m in models:
      rec: list[tuple[Any, ...]] = []
      MODELS[m](plugrad_ops(rec))(Tensor.empty(b, 3, 224, 224))
      for op in rec: seen.setdefault(op, None)
  return list(seen)


# ---------------------------------------------------------------- whole models

def model_row(name: str, batch: int, rounds: int, size: int) -> Row:
  pg, th = MODELS[name](plugrad_ops()), MODELS[name](TORCH)
  copy_random_weights(pg, th)
  x = np.random.default_rng(1).standard_normal((batch, 3, size, size), dtype=np.float32)
  px, tx = Tensor(x).realize(), torch.from_numpy(x)
  fwd = TinyJit(lambda a: pg(a).realize())
  t0 = time.perf_counter()
  got = fwd(px).numpy()
  first = time.perf_counter() - t0
  with torch.inference_mode():
    for mod in _torch_modules(th): mod.eval()  # BatchNorm with the running statistics
    want = th(tx).numpy()
    fwd(px)
    peers.settle_tiers()
    pg_s, th_s = best_pair(lambda: fwd(px), lambda: th(tx), rounds, block_s=0.3)
  rec: list[tuple[Any, ...]] = []
  MODELS[name](plugrad_ops(rec))(Tensor.empty(batch, 3, size, size))
  return Row(f"{name} fwd b{batch} {size}x{size}", pg_s, th_s, sum(_op_flops(op) for op in rec), rel_err(got, want),
             f"  [first {first:.1f} s]")


def train_row(name: str, batch: int, rounds: int, size: int) -> Row:
  """One SGD step (momentum 0.9, BatchNorm in training mode: batch statistics, running statistics updated) on a
  cross-entropy loss; "first step" is plugrad's first step (schedule and compile included: the issue's figure), "first 3
  steps" the three before the JIT replays (the second captures, the third builds the graph runners)."""
  pg, th = MODELS[name](plugrad_ops()), MODELS[name](TORCH)
  copy_random_weights(pg, th)
  rng = np.random.default_rng(2)
  x, y = rng.standard_normal((batch, 3, size, size), dtype=np.float32), rng.integers(0, 1000, batch).astype(np.int32)
  px, py, tx, ty = Tensor(x).realize(), Tensor(y).realize(), torch.from_numpy(x), torch.from_numpy(y).long()
  params = nn.get_parameters(pg)
  opt = nn.optim.SGD(params, lr=0.01, momentum=0.9)
  t_params = [p for m in _torch_modules(th) for p in m.parameters()]
  t_opt = torch.optim.SGD(t_params, lr=0.01, momentum=0.9)

  @TinyJit
  def step(a: Tensor, b: Tensor) -> Tensor:
    opt.zero_grad()
    loss = pg(a).sparse_categorical_crossentropy(b)
    loss.backward()
    return loss.realize(*opt.schedule_step())

  def t_step() -> torch.Tensor:
    t_opt.zero_grad()
    loss = TF.cross_entropy(th(tx), ty)
    loss.backward()
    t_opt.step()
    return loss

  for mod in _torch_modules(th): mod.train()
  Tensor.training = True
  try:
    t0 = time.perf_counter()
    got = [step(px, py).item()]
    first_step = time.perf_counter() - t0
    got += [step(px, py).item() for _ in range(2)]
    first = time.perf_counter() - t0
    want = [t_step().item() for _ in range(3)]
    peers.settle_tiers()
    pg_s, th_s = best_pair(lambda: step(px, py).item(), lambda: t_step().item(), rounds, block_s=0.5)
  finally: Tensor.training = False
  return Row(f"{name} train step b{batch} {size}x{size}", pg_s, th_s, 0.0, rel_err(np.array(got), np.array(want)),
             f"  [first step {first_step:.1f} s, first 3 steps {first:.1f} s]")


def _torch_modules(obj: Any) -> list[Any]:
  """The torch modules of a model built by the classes above (plain objects and lists around them)."""
  if isinstance(obj, torch.nn.Module): return [obj]
  if isinstance(obj, list): return [m for v in obj for m in _torch_modules(v)]
  if isinstance(obj, (ResNet, BasicBlock, Bottleneck, InvertedResidual, MobileNetV2)):
    return [m for k, v in vars(obj).items() if k != "o" for m in _torch_modules(v)]
  return []


def _op_flops(op: tuple[Any, ...]) -> float:
  if op[0] == "conv":
    _, xs, ws, stride, padding, _ = op
    return 2.0 * xs[0] * ws[0] * ((xs[2] + 2 * padding - ws[2]) // stride + 1) * ((xs[3] + 2 * padding - ws[3]) // stride + 1) * math.prod(ws[1:])
  return 2.0 * op[1][0] * op[2][0] * op[2][1] if op[0] == "linear" else 0.0


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--threads", type=int, default=THREADS)
  ap.add_argument("--quick", action="store_true", help="a few rows per family at batch 1 (a smoke test)")
  ap.add_argument("--only", default="sweep,models,train")
  ap.add_argument("--models", default="resnet18,resnet50,mobilenetv2")
  ap.add_argument("--batches", default="1,8")
  ap.add_argument("--filter", default="", help="sweep rows whose label contains this text")
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--untuned", action="store_true", help="add shapes the optimizer was not tuned on")
  ap.add_argument("--train-models", default="resnet18", help="models whose training step is timed (the issue's is resnet18)")
  args = ap.parse_args()
  models, batches = [m for m in args.models.split(",") if m], [int(b) for b in args.batches.split(",") if b]
  if bad := [m for m in models if m not in MODELS]: raise SystemExit(f"unknown model(s) {bad}; known: {', '.join(MODELS)}")
  print(f"plugrad vs PyTorch {torch.__version__}, {THREADS} threads, best of {args.rounds} alternating rounds")
  if "sweep" in args.only:
    ops = QUICK if args.quick else sweep_ops(models, batches) + DECODE + (UNTUNED if args.untuned else [])
    rows: list[Row] = []
    print(f"sweep ({len(ops)} ops):")
    for op in [o for o in ops if args.filter in op_label(o)]:
      rows.append(row := sweep_op(op, args.rounds))
      print(row.line(), flush=True)
    print(f"  sweep geometric mean x{geomean(rows):.2f} over {len(rows)} rows; worst: "
          + ", ".join(f"{r.label} x{r.ratio:.1f}" for r in sorted(rows, key=lambda r: -r.ratio)[:3]))
  if "models" in args.only:
    mrows = []
    print("models (eval forward):")
    for m in (["resnet18", "mobilenetv2"] if args.quick else models):
      for b in ([1] if args.quick else batches):
        mrows.append(model_row(m, b, 1 if args.quick else args.rounds, 112 if args.quick else 224))
        print(mrows[-1].line(), flush=True)
    print(f"  models geometric mean x{geomean(mrows):.2f}")
  if "train" in args.only:
    print("training (one SGD step):")
    for m in [m for m in args.train_models.split(",") if m]:
      if m not in MODELS: raise SystemExit(f"unknown model {m!r}; known: {', '.join(MODELS)}")
      print(train_row(m, 2 if args.quick else 8, 1 if args.quick else args.rounds, 112 if args.quick else 224).line(), flush=True)


if __name__ == "__main__":
  main()
