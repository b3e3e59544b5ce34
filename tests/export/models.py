"""Small models for the export tests (random weights, fixed seeds); also the SCRIPT:FUNC targets of the CLI test."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np

from plugrad import Device, Tensor
from plugrad.nn import Linear

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str) -> Any:
  """A module of examples/ (imported once, without running its main)."""
  if (mod := sys.modules.get(f"examples_{name}")) is not None: return mod
  spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
  assert spec is not None and spec.loader is not None
  mod = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = mod
  spec.loader.exec_module(mod)
  return mod


class MLP:
  def __init__(self, sizes: tuple[int, ...] = (256, 256, 10), softmax: bool = True):
    self.layers = [Linear(a, b) for a, b in zip(sizes, sizes[1:])]
    self.softmax = softmax

  def __call__(self, x: Tensor) -> Tensor:
    for i, layer in enumerate(self.layers): x = layer(x).relu() if i < len(self.layers) - 1 else layer(x)
    return x.softmax(-1) if self.softmax else x


def digits_cnn(device: str = "CPU", batch: int = 4, seed: int = 0) -> tuple[Any, np.ndarray]:
  """(a DigitsCNN with random weights in evaluation mode on `device`, a batch of inputs)."""
  ex = example("export_digits")
  Tensor.manual_seed(seed)
  model = ex.DigitsCNN()
  for bn in (model.bn1, model.bn2):  # running statistics that are not the identity, so the export has to carry them
    bn.running_mean.assign(Tensor.uniform(bn.running_mean.shape[0], low=-0.5, high=0.5)).realize()
    bn.running_var.assign(Tensor.uniform(bn.running_var.shape[0], low=0.5, high=2.0)).realize()
  ex.to_device(model, device)
  return model, np.random.default_rng(seed).random((batch, 1, 8, 8), dtype=np.float32)


def mlp(device: str = "CPU", batch: int = 64, sizes: tuple[int, ...] = (256, 256, 10), seed: int = 1, softmax: bool = True) -> tuple[MLP, np.ndarray]:
  Tensor.manual_seed(seed)
  model = MLP(sizes, softmax)
  example("export_digits").to_device(model, device)
  return model, np.random.default_rng(seed).standard_normal((batch, sizes[0]), dtype=np.float32)


def mlp_for_cli() -> tuple[MLP, tuple[Tensor, ...]]:
  """`python -m plugrad export tests/export/models.py:mlp_for_cli`: the function and its example inputs."""
  model, x = mlp(Device.DEFAULT, batch=8, sizes=(32, 16, 4))
  return model, (Tensor(x, device=Device.DEFAULT),)
