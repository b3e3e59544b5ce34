"""The main job: train a small CNN on scikit-learn's handwritten digits (1,797 real 8x8 images, bundled with the
package) on the default device, report the held-out test accuracy, save the weights as safetensors, reload them into a
fresh model and check it predicts the same.

  python examples/train_digits.py                 # DEV=PYTHON / DEV=CPU / ... to pick the device
  python examples/train_digits.py --smoke         # a few batches: checks the whole path in seconds (no accuracy target)
  mpirun -np 2 python examples/train_digits.py --distributed   # data-parallel over 2 processes (docs/distributed.md)

Exits with status 1 if the accuracy misses --target or the reloaded model disagrees.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
from sklearn.datasets import load_digits
from tqdm import tqdm

import plugrad.distributed as dist
from plugrad import Device, Tensor, TinyJit
from plugrad.nn import BatchNorm2d, Conv2d, Linear, get_parameters, get_state_dict, load_state_dict
from plugrad.nn.optim import Adam, CosineAnnealingLR
from plugrad.nn.state import safe_load, safe_save


class DigitsCNN:
  """conv 3x3 (16) → BN → ReLU → max-pool 2 → conv 3x3 (32) → BN → ReLU → linear (512 → 10): 10k parameters. The
  convolutions have no bias: the BatchNorm after each removes it anyway."""
  def __init__(self) -> None:
    self.conv1, self.bn1 = Conv2d(1, 16, 3, padding=1, bias=False), BatchNorm2d(16)
    self.conv2, self.bn2 = Conv2d(16, 32, 3, padding=1, bias=False), BatchNorm2d(32)
    self.fc = Linear(32 * 4 * 4, 10)

  def __call__(self, x: Tensor) -> Tensor:
    x = self.bn1(self.conv1(x)).relu().max_pool2d(2)
    x = self.bn2(self.conv2(x)).relu()
    return self.fc(x.flatten(1))


def load_data(seed: int = 0, test_fraction: float = 0.2) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(train images, test images, train labels, test labels); the test split holds `test_fraction` of each digit."""
  digits = load_digits()
  x, y = (digits.images / 16.0).astype(np.float32)[:, None], digits.target.astype(np.int32)  # (N, 1, 8, 8) in [0, 1]
  rng = np.random.default_rng(seed)
  test = np.zeros(len(y), bool)
  for c in range(10):
    of_c = rng.permutation(np.flatnonzero(y == c))
    test[of_c[:round(test_fraction * len(of_c))]] = True
  return x[~test], x[test], y[~test], y[test]


def predict(model: DigitsCNN, x: np.ndarray) -> np.ndarray:
  Tensor.training = False
  return model(Tensor(x)).argmax(-1).numpy()


def train(model: DigitsCNN, x: np.ndarray, y: np.ndarray, epochs: int, batch_size: int, lr: float, max_batches: int | None, seed: int,
          label_smoothing: float = 0.1, distributed: bool = False) -> None:
  """With `distributed` and several processes, each rank trains on its share of every batch (the same batches on every
  rank: one seed) and the gradients are averaged over the ranks before each update."""
  rank, world = (dist.rank(), dist.world_size()) if distributed else (0, 1)
  opt = Adam(get_parameters(model), lr=lr)
  batches = min(len(x) // batch_size, max_batches or len(x))  # full batches only: every step has the same shapes, so the same kernels
  sched = CosineAnnealingLR(opt, T_max=epochs * batches)
  rng = np.random.default_rng(seed)

  def loss_of(xb: Tensor, yb: Tensor) -> Tensor: return model(xb).sparse_categorical_crossentropy(yb, label_smoothing=label_smoothing)

  @TinyJit  # from the third step on, the step's ~60 kernels are replayed without building or scheduling any graph
  def step(xb: Tensor, yb: Tensor) -> Tensor:
    opt.zero_grad()
    loss = loss_of(xb, yb)
    loss.backward()
    return loss.realize(*opt.schedule_step())  # the loss and the update in one run, the loss from the weights before it

  dopt = dist.DistributedOptimizer(opt) if world > 1 else None  # (rank 0's initial weights broadcast to every rank)
  if dopt is not None: step = dopt.make_step(loss_of)  # type: ignore[assignment]  # two captures around the gradient all-reduce
  share = slice(rank * batch_size // world, (rank + 1) * batch_size // world)

  for epoch in range(epochs):
    Tensor.training = True
    order = rng.permutation(len(x))
    with tqdm(total=batches * batch_size, desc=f"epoch {epoch + 1}/{epochs}", unit="sample", file=sys.stdout, leave=True, disable=rank != 0) as bar:
      start = time.perf_counter()
      for b in range(batches):
        idx = order[b * batch_size:(b + 1) * batch_size][share]
        loss = step(Tensor(x[idx]), Tensor(y[idx]))
        sched.step()
        if dopt is not None: loss = dist.all_reduce(loss, "mean")  # the whole batch's loss, for the bar
        bar.update(batch_size)
        bar.set_postfix(loss=f"{loss.item():.3f}", rate=f"{(b + 1) * batch_size / (time.perf_counter() - start):.0f} samples/s")
  if dopt is not None: dopt.sync_buffers()  # BatchNorm's running statistics: each rank saw only its share of the batches


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--epochs", type=int, default=10)
  ap.add_argument("--batch-size", type=int, default=128)
  ap.add_argument("--lr", type=float, default=1e-2)
  ap.add_argument("--seed", type=int, default=0, help="initialization and batch order (the train/test split is fixed)")
  ap.add_argument("--target", type=float, default=0.97, help="the test accuracy to reach (ignored with --smoke)")
  ap.add_argument("--weights", default=os.path.join(tempfile.gettempdir(), "plugrad_digits_cnn.safetensors"), help="where to save the weights")
  ap.add_argument("--smoke", action="store_true", help="2 batches of 8 and 16 test images: checks the path, not the accuracy")
  ap.add_argument("--distributed", action="store_true",
                  help="data-parallel over the processes of an MPI launch (mpirun -np N ...): each trains on 1/N of every batch; rank 0 "
                  "reports and saves")
  args = ap.parse_args()

  t0 = time.perf_counter()
  x_tr, x_te, y_tr, y_te = load_data()  # one fixed split: --seed varies the initialization and the batch order only
  if args.smoke: args.epochs, args.batch_size, x_te, y_te = 1, 8, x_te[:16], y_te[:16]
  rank, world = 0, 1
  if args.distributed:
    dist.init()
    rank, world = dist.rank(), dist.world_size()
    if args.batch_size % world: ap.error(f"--batch-size {args.batch_size} must be divisible by the {world} processes")
  if rank == 0:
    print(f"device {Device.DEFAULT}: {len(x_tr)} training and {len(x_te)} test images of 8x8" +
          (f"; {world} processes, {args.batch_size // world} images of each batch per process" if world > 1 else ""))
  Tensor.manual_seed(args.seed)
  model = DigitsCNN()
  try:
    train(model, x_tr, y_tr, args.epochs, args.batch_size, args.lr, 2 if args.smoke else None, args.seed, distributed=args.distributed)
    if world > 1:
      dist.save_on_rank0(model, args.weights)  # every rank waits until the file is written
      if rank != 0: return 0
    pred = predict(model, x_te)
    acc = float((pred == y_te).mean())
    print(f"test accuracy {acc:.2%} ({int((pred == y_te).sum())}/{len(y_te)}) after {time.perf_counter() - t0:.1f} s")

    if world == 1: safe_save(get_state_dict(model), args.weights)
    fresh = DigitsCNN()
    load_state_dict(fresh, safe_load(args.weights))
    pred2 = predict(fresh, x_te)
    acc2 = float((pred2 == y_te).mean())
    same = bool((pred2 == pred).all())
    print(f"saved {args.weights}; reloaded into a fresh model: test accuracy {acc2:.2%} ({'same predictions' if same else 'DIFFERENT predictions'})")
  finally:
    Tensor.training = False
  print(f"total {time.perf_counter() - t0:.1f} s")
  if not same: return 1
  if not args.smoke and acc < args.target:
    print(f"below the target accuracy {args.target:.0%}")
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
