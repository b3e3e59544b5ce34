"""ONNX models exported from PyTorch, run by plugrad.onnx next to onnxruntime (CPU, same thread count) and PyTorch.

  python bench/onnx.py [--threads N] [--models resnet18,encoder,decoder] [--batch B] [--reps R]

The models are built here in PyTorch (random weights, BatchNorm statistics randomized), exported with
`torch.onnx.export` (the TorchScript exporter, opset 17, dynamic batch and sequence axes), then loaded from the same
bytes by plugrad (`OnnxModel(..., jit=True)`) and onnxruntime. Each line: plugrad's warm time, onnxruntime's, the ratio,
PyTorch's eager time, and plugrad's first call (load + compile). tests/onnx/test_exported_models.py checks the same
models' outputs against PyTorch.
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

# run as `python bench/onnx.py`, this file's folder is first on sys.path and `import onnx` would import this file: it goes
# last, after site-packages, where `import peers` still finds bench/peers.py
_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != _HERE] + [_HERE]

import peers


def _torch() -> Any:
  import torch
  return torch


def resnet18(num_classes: int = 1000) -> Any:
  """ResNet-18 in torchvision's layout (no torchvision needed)."""
  torch = _torch()
  nn = torch.nn

  class Block(nn.Module):  # type: ignore[misc]
    def __init__(self, cin: int, cout: int, stride: int):
      super().__init__()
      self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout)
      self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout)
      self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)) if stride != 1 or cin != cout else None

    def forward(self, x: Any) -> Any:
      y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
      return torch.relu(y + (x if self.down is None else self.down(x)))

  layers: list[Any] = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
  cin = 64
  for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
    layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
    cin = cout
  layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)]
  return nn.Sequential(*layers)


def encoder(vocab: int = 30522, d: int = 256, heads: int = 4, layers: int = 4, ffn: int = 1024, max_seq: int = 512) -> Any:
  """A BERT-style encoder: token + position embeddings, LayerNorm, post-norm GELU transformer layers, a pooled output."""
  torch = _torch()
  nn = torch.nn

  class Encoder(nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
      super().__init__()
      self.tok, self.pos, self.norm = nn.Embedding(vocab, d), nn.Embedding(max_seq, d), nn.LayerNorm(d)
      layer = nn.TransformerEncoderLayer(d, heads, ffn, dropout=0.0, activation="gelu", batch_first=True)
      self.layers = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
      self.pool = nn.Linear(d, d)

    def forward(self, ids: Any) -> Any:
      pos = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
      h = self.layers(self.norm(self.tok(ids) + self.pos(pos)))
      return h, torch.tanh(self.pool(h[:, 0]))

  return Encoder()


def decoder(vocab: int = 8192, d: int = 256, heads: int = 4, layers: int = 4, max_seq: int = 256) -> Any:
  """A GPT-style decoder (pre-norm, causal attention written out, tied LM head) for a dynamic sequence length."""
  torch = _torch()
  nn = torch.nn

  class Block(nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
      super().__init__()
      self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
      self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
      self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: Any) -> Any:
      b, t, _ = x.shape
      q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
      q, k, v = (z.reshape(b, t, heads, d // heads).transpose(1, 2) for z in (q, k, v))
      s = (q @ k.transpose(-1, -2)) / (d // heads) ** 0.5
      mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
      a = s.masked_fill(mask, float("-inf")).softmax(-1) @ v
      x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
      return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))

  class Decoder(nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
      super().__init__()
      self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(max_seq, d)
      self.blocks = nn.ModuleList(Block() for _ in range(layers))
      self.ln = nn.LayerNorm(d)

    def forward(self, ids: Any) -> Any:
      x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device).unsqueeze(0))
      for blk in self.blocks: x = blk(x)
      return self.ln(x) @ self.tok.weight.T

  return Decoder()


def randomize(model: Any, seed: int = 0) -> Any:
  """Random weights and BatchNorm statistics (so eval-mode BN is not the identity), then eval mode."""
  torch = _torch()
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for m in model.modules():
      if isinstance(m, torch.nn.BatchNorm2d):
        m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
        m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
        m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
        m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)
  return model.eval()


MODELS: dict[str, tuple[Callable[[], Any], Callable[[int, int], np.ndarray], dict[str, dict[int, str]]]] = {
  "resnet18": (resnet18, lambda b, s: np.random.default_rng(1).standard_normal((b, 3, 224, 224), dtype=np.float32),
               {"x": {0: "batch"}}),
  "encoder": (encoder, lambda b, s: np.random.default_rng(1).integers(0, 30522, (b, s)).astype(np.int64), {"x": {0: "batch", 1: "seq"}}),
  "decoder": (decoder, lambda b, s: np.random.default_rng(1).integers(0, 8192, (b, s)).astype(np.int64), {"x": {0: "batch", 1: "seq"}}),
}


def export(name: str, example: np.ndarray) -> tuple[Any, bytes]:
  """(the PyTorch model, its ONNX bytes), exported with dynamic axes."""
  torch = _torch()
  build, _, axes = MODELS[name]
  model = randomize(build())
  f = io.BytesIO()
  import warnings
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
    torch.onnx.export(model, (torch.from_numpy(example),), f, input_names=["x"], opset_version=17, dynamo=False,
                      dynamic_axes=axes)
  return model, f.getvalue()


def _best(fn: Callable[[], Any], reps: int) -> float:
  times = []
  for _ in range(reps):
    st = time.perf_counter()
    fn()
    times.append(time.perf_counter() - st)
  return min(times) * 1e3


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--threads", type=int, default=int(os.environ.get("THREADS", "2")))
  ap.add_argument("--models", default="resnet18,encoder,decoder")
  ap.add_argument("--batch", type=int, default=1)
  ap.add_argument("--seq", type=int, default=128)
  ap.add_argument("--reps", type=int, default=10)
  args = ap.parse_args(argv)
  os.environ["THREADS"] = str(args.threads)
  torch = _torch()
  torch.set_num_threads(args.threads)
  import onnxruntime as ort
  opts = ort.SessionOptions()
  opts.intra_op_num_threads, opts.inter_op_num_threads = args.threads, 1
  print(f"bench/onnx.py: {args.threads} threads, batch {args.batch}, seq {args.seq}; onnxruntime {ort.__version__}, torch {torch.__version__}")
  for name in args.models.split(","): print(bench_one(name, args, opts), flush=True)
  return 0


def bench_one(name: str, args: argparse.Namespace, opts: Any) -> str:
  torch = _torch()
  import onnxruntime as ort

  from plugrad.onnx import OnnxModel
  x = MODELS[name][1](args.batch, args.seq)
  model, data = export(name, x)
  st = time.perf_counter()
  pg = OnnxModel(_proto(data), jit=True)
  def run_pg() -> None:
    for o in pg(x=x).values(): o.numpy()
  run_pg()
  first = time.perf_counter() - st
  for _ in range(3): run_pg()  # the JIT captures on the second call and replays from the third
  peers.settle_tiers()
  sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
  t_pg = _best(run_pg, args.reps)
  t_ort = _best(lambda: sess.run(None, {"x": x}), args.reps)
  with torch.no_grad(): t_th = _best(lambda: model(torch.from_numpy(x)), args.reps)
  return (f"  {name:<10} plugrad {t_pg:9.2f} ms  onnxruntime {t_ort:9.2f} ms  x {t_pg / t_ort:5.2f}   torch {t_th:9.2f} ms"
          f"   [first {first:.1f} s]")


def _proto(data: bytes) -> Any:
  import onnx
  return onnx.load_from_string(data)


if __name__ == "__main__":
  sys.exit(main())
