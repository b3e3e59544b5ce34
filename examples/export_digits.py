"""Export the digits CNN (examples/train_digits.py) as a standalone C library and as a WebGPU page (docs/export.md).

It loads the weights train_digits.py saved (or trains briefly when there are none), checks the model on the held-out
digits, exports it for both targets with `plugrad.export.export_model` with held-out digits the model classifies
correctly as the sample input (a misclassified one only when too few are right, and then it says so), and prints how to
build and run each; the built `model_main` prints its prediction for them.

  python examples/export_digits.py                      # weights from train_digits.py's default path, else a short training
  python examples/export_digits.py --train-steps 60     # always train (briefly) first
  python examples/export_digits.py --out /tmp/digits    # where the two exports go (c/ and webgpu/)

The WebGPU export needs the WEBGPU device (pip install wgpu, and a GPU or Mesa's lavapipe); without it only C is written.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_digits import DigitsCNN, load_data, train

from plugrad import Device, Tensor
from plugrad.export import export_model
from plugrad.nn import get_state_dict, load_state_dict
from plugrad.nn.state import safe_load

__all__ = ["DigitsCNN", "to_device"]


def to_device(model: Any, device: str) -> Any:
  """Move the model's tensors to `device` in place. 64-bit integer tensors (BatchNorm's batch counter) stay: WGSL has
  no 64-bit integers, and inference never reads them."""
  for name, t in get_state_dict(model).items():
    if t.device == device or t.dtype.itemsize == 8 and not t.dtype.name.startswith("float"): continue
    *path, last = name.split(".")
    obj = model
    for p in path: obj = obj[int(p)] if isinstance(obj, (list, tuple)) else obj[p] if isinstance(obj, dict) else getattr(obj, p)
    moved = t.to(device).realize()
    if isinstance(obj, list): obj[int(last)] = moved
    elif isinstance(obj, dict): obj[last] = moved
    else: setattr(obj, last, moved)
  return model


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--weights", default=os.path.join(tempfile.gettempdir(), "plugrad_digits_cnn.safetensors"),
                  help="weights saved by train_digits.py (used when the file exists and --train-steps is 0)")
  ap.add_argument("--train-steps", type=int, default=0, help="train this many batches first (default: load --weights, else train 60)")
  ap.add_argument("--batch", type=int, default=1, help="the batch size the exported model takes")
  ap.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "plugrad_digits_export"), help="output folder")
  args = ap.parse_args()

  x_tr, x_te, y_tr, y_te = load_data()
  Tensor.manual_seed(0)
  model = DigitsCNN()
  if args.train_steps == 0 and os.path.exists(args.weights):
    load_state_dict(model, safe_load(args.weights))
    print(f"loaded {args.weights}")
  else:
    steps = args.train_steps or 60
    print(f"training {steps} batches of 32 on {Device.DEFAULT} (train_digits.py trains the full model)")
    train(model, x_tr, y_tr, epochs=1, batch_size=32, lr=1e-2, max_batches=steps, seed=0)
  Tensor.training = False
  to_device(model, "CPU")
  pred = model(Tensor(x_te, device="CPU")).argmax(-1).numpy()
  print(f"test accuracy {float((pred == y_te).mean()):.2%} on {len(y_te)} held-out digits")
  # the sample: digits the model gets right, so that the exported program's answer can be checked against the label
  right = np.flatnonzero(pred == y_te)
  idx = right[:args.batch] if len(right) >= args.batch else np.arange(args.batch)
  for i in idx:
    note = "" if pred[i] == y_te[i] else "  (misclassified: fewer than --batch digits are classified correctly; train longer)"
    print(f"  sample: held-out digit #{i}, label {y_te[i]}, the model predicts {pred[i]}{note}")

  out = Path(args.out)
  sample = x_te[idx]
  e = export_model(model, Tensor(sample, device="CPU"), target="c", out_dir=out / "c")
  sample.tofile(out / "c" / "digit.bin")
  np.asarray(y_te[idx], np.int32).tofile(out / "c" / "label.bin")
  print(f"\nC: {len(e.captured.launches)} kernel launches -> {out / 'c'} ({', '.join(p.name for p in e.files)})")
  print(f"  cd {out / 'c'} && make && ./model_main digit.bin logits.bin          # add OPENMP=1 to make for threads")
  print(f"  model_main prints the predicted digit(s), the argmax of the logits: {' '.join(str(int(p)) for p in pred[idx])} "
        f"(labels {' '.join(str(int(y)) for y in y_te[idx])})")

  if (why := Device.manager.probe("WEBGPU")) is not None:
    print(f"\nWebGPU: skipped, the WEBGPU device is unavailable here: {why}")
    return 0
  to_device(model, "WEBGPU")
  e = export_model(model, Tensor(sample, device="WEBGPU"), target="webgpu", out_dir=out / "webgpu")
  print(f"\nWebGPU: {len(e.captured.launches)} kernel launches -> {out / 'webgpu'} ({', '.join(p.name for p in e.files)})")
  print(f"  cd {out / 'webgpu'} && python -m http.server 8000      # then open http://localhost:8000/ in a browser with WebGPU")
  return 0


if __name__ == "__main__":
  sys.exit(main())
