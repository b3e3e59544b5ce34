"""Transformers: plugrad on its default device next to PyTorch (CPU) and tinygrad 0.14 (DEV=CPU), same weights, inputs
and thread count, one line per workload with the ratio of the times.

  a  encoder forward     bench/models.py's BERT-style encoder (random weights, additive padding mask): hidden 384, 12 heads,
                         FFN 1536, 6 layers, seq 128, batch 32; and BERT-base (768, 12 heads, 3072, 12 layers), seq 128, batch 8
  b  decoder train step  the GPT-2-small-style causal decoder (768, 12 heads, FFN 3072, 6 layers, vocab 50257), seq 256,
                         batch 4: forward, cross-entropy, backward, AdamW
  c  first result        the encoder of (a) with 1/2/6/12 layers (--layers), each in a fresh process with the compile
                         caches off: seconds from the call to the numpy result (weights and inputs realized before)

  python bench/transformer.py [--threads N] [--only a,b,c] [--layers 1,2,6,12] [--peers plugrad,torch,tinygrad] [--quick]
                              [--budget S] [--reps N]

Every cell runs in its own subprocess (bench/peers.py), killed after --budget seconds ("skipped: over N s"): plugrad is
still slow on some of these models. plugrad and tinygrad are timed with TinyJit (from the third call a run replays its
captured kernels), PyTorch eagerly (no_grad for the forwards); plugrad after `settle()` (bench/train.py's median_ms);
"[first call N s]" is the first run of the JIT'd function, compiles included.
The models: plugrad's are bench/models.py; tinygrad runs the same source (the two share the Tensor and nn APIs);
PyTorch's are written below with the same parameter names and layouts. All load the same numpy weights, and a first
check on a small config compares each framework's encoder and decoder outputs with plugrad's. --quick shrinks every
shape (a smoke test of the script, not a benchmark).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import peers  # bench/peers.py and bench/train.py (the script's folder is on sys.path)
from train import median_ms

HERE = Path(__file__).resolve().parent
FRAMEWORKS = ("plugrad", "torch", "tinygrad")


@dataclass(frozen=True)
class Cfg:
  hidden: int
  heads: int
  ffn: int
  layers: int
  vocab: int
  max_seq: int
  batch: int
  seq: int

  def label(self) -> str: return f"h{self.hidden} L{self.layers} s{self.seq} b{self.batch}"


ENC = Cfg(384, 12, 1536, 6, 30522, 512, 32, 128)
BERT_BASE = Cfg(768, 12, 3072, 12, 30522, 512, 8, 128)
GPT = Cfg(768, 12, 3072, 6, 50257, 1024, 4, 256)
CHECK = Cfg(32, 4, 64, 2, 97, 16, 2, 12)  # the startup agreement check
QUICK = {"enc": Cfg(64, 4, 128, 2, 1000, 64, 2, 32), "bert": Cfg(96, 4, 192, 3, 1000, 64, 2, 32), "gpt": Cfg(64, 4, 256, 2, 512, 64, 2, 32)}


def workloads(args: argparse.Namespace) -> list[tuple[str, str, str, Cfg]]:
  """(part, line label, job kind, config) for the parts asked for."""
  enc, bert, gpt = (QUICK["enc"], QUICK["bert"], QUICK["gpt"]) if args.quick else (ENC, BERT_BASE, GPT)
  out = [("a", f"encoder fwd {enc.label()}", "forward", enc), ("a", f"bert-base fwd {bert.label()}", "forward", bert),
         ("b", f"gpt train AdamW {gpt.label()} v{gpt.vocab}", "train", gpt)]
  out += [("c", f"first result encoder L{n}", "first", replace(enc, layers=n)) for n in args.layers]
  return [w for w in out if w[0] in args.only]


# ---------------------------------------------------------------- shared data: weights and inputs (numpy, same everywhere)

def weights(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
  """GPT-2-like random weights by name (sorted, so every framework draws the same numbers): N(0, 0.02) matrices and
  embeddings, LayerNorm scales near 1, small biases."""
  rng, out = np.random.default_rng(seed), {}
  for k in sorted(shapes):
    w = rng.standard_normal(shapes[k], dtype=np.float32)
    is_ln = k.split(".")[-2].startswith("ln")
    out[k] = (1 + 0.1 * w) if is_ln and k.endswith("weight") else (0.02 * w)
  return out


def inputs(c: Cfg, seed: int = 1) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  mask = np.ones((c.batch, c.seq), np.float32)
  mask[1::2, c.seq - c.seq // 4:] = 0  # odd rows end in padding: the additive mask matters
  return {"ids": rng.integers(0, c.vocab, (c.batch, c.seq)).astype(np.int32), "mask": mask,
          "targets": rng.integers(0, c.vocab, (c.batch, c.seq)).astype(np.int32)}


# ---------------------------------------------------------------- the models per framework

def tinygrad_models() -> Any:
  """bench/models.py run on tinygrad: it only uses `Tensor` and `nn` from plugrad, whose APIs tinygrad's match, so the
  module is loaded with a stand-in `plugrad` that hands out tinygrad's."""
  import tinygrad
  import tinygrad.nn
  shim = types.ModuleType("plugrad")
  shim.Tensor, shim.nn = tinygrad.Tensor, tinygrad.nn  # type: ignore[attr-defined]
  saved = sys.modules.get("plugrad")
  sys.modules["plugrad"] = shim
  try:
    spec = importlib.util.spec_from_file_location("models_on_tinygrad", HERE / "models.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
  finally:
    if saved is None: del sys.modules["plugrad"]
    else: sys.modules["plugrad"] = saved
  return mod


def torch_models() -> tuple[type, type]:
  """bench/models.py's Encoder and Decoder in PyTorch: same parameter names and layouts (Linear weight (out, in)), same
  formulas (tanh gelu, additive -10000 padding mask, the LM head tied to the word embedding)."""
  import torch
  from torch import nn
  F = nn.functional

  class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int):
      super().__init__()
      self.heads, self.qkv, self.out = heads, nn.Linear(hidden, 3 * hidden), nn.Linear(hidden, hidden)
    def forward(self, x: Any, mask: Any = None, causal: bool = False) -> Any:
      b, s, h = x.shape
      q, k, v = (t.reshape(b, s, self.heads, h // self.heads).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
      return self.out(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal).transpose(1, 2).reshape(b, s, h))

  class EncoderLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int, eps: float):
      super().__init__()
      self.attn, self.ln1 = Attention(hidden, heads), nn.LayerNorm(hidden, eps=eps)
      self.up, self.down, self.ln2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden), nn.LayerNorm(hidden, eps=eps)
    def forward(self, x: Any, mask: Any) -> Any:
      x = self.ln1(x + self.attn(x, mask))
      return self.ln2(x + self.down(F.gelu(self.up(x), approximate="tanh")))

  class Encoder(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int, layers: int, vocab: int, max_seq: int, type_vocab: int = 2, eps: float = 1e-12):
      super().__init__()
      self.word, self.pos, self.type = nn.Embedding(vocab, hidden), nn.Embedding(max_seq, hidden), nn.Embedding(type_vocab, hidden)
      self.ln = nn.LayerNorm(hidden, eps=eps)
      self.layers = nn.ModuleList([EncoderLayer(hidden, heads, ffn, eps) for _ in range(layers)])
    def forward(self, ids: Any, attention_mask: Any) -> Any:
      b, s = ids.shape
      pos = torch.arange(s).reshape(1, s).expand(b, s)
      token_type = self._modules["type"]  # registered as "type" (the state dict's name), which Module.type() shadows
      x = self.ln(self.word(ids) + self.pos(pos) + token_type(torch.zeros_like(ids)))
      mask = ((1 - attention_mask.float()) * -10000.0).reshape(b, 1, 1, s)
      for layer in self.layers: x = layer(x, mask)
      return x

  class DecoderLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int):
      super().__init__()
      self.ln1, self.attn = nn.LayerNorm(hidden), Attention(hidden, heads)
      self.ln2, self.up, self.down = nn.LayerNorm(hidden), nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)
    def forward(self, x: Any) -> Any:
      x = x + self.attn(self.ln1(x), causal=True)
      return x + self.down(F.gelu(self.up(self.ln2(x)), approximate="tanh"))

  class Decoder(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int, layers: int, vocab: int, max_seq: int):
      super().__init__()
      self.word, self.pos = nn.Embedding(vocab, hidden), nn.Embedding(max_seq, hidden)
      self.layers = nn.ModuleList([DecoderLayer(hidden, heads, ffn) for _ in range(layers)])
      self.ln = nn.LayerNorm(hidden)
    def forward(self, ids: Any) -> Any:
      b, s = ids.shape
      x = self.word(ids) + self.pos(torch.arange(s).reshape(1, s).expand(b, s))
      for layer in self.layers: x = layer(x)
      return self.ln(x) @ self.word.weight.T

  return Encoder, Decoder


def model_kw(c: Cfg) -> dict[str, int]: return {k: getattr(c, k) for k in ("hidden", "heads", "ffn", "layers", "vocab", "max_seq")}


class Side:
  """One framework in a peer process: builds a model with the shared weights and returns callables for a job."""
  def __init__(self, name: str, threads: int):
    self.name = name
    if name == "torch":
      import torch
      torch.set_num_threads(threads)
      self.torch = torch
      self.Encoder, self.Decoder = torch_models()
    else:
      mod = tinygrad_models() if name == "tinygrad" else importlib.import_module("models")
      self.Encoder, self.Decoder = mod.Encoder, mod.Decoder
      if name == "plugrad":
        from plugrad import Tensor, TinyJit
        from plugrad.nn import optim, state
      else:
        from tinygrad import Tensor, TinyJit
        from tinygrad.nn import optim, state
      self.Tensor, self.TinyJit, self.optim, self.state = Tensor, TinyJit, optim, state

  def build(self, kind: str, c: Cfg) -> Any:
    model = (self.Decoder if kind == "decoder" else self.Encoder)(**model_kw(c))
    if self.name == "torch":
      sd = model.state_dict()
      model.load_state_dict({k: self.torch.from_numpy(v) for k, v in weights({k: tuple(v.shape) for k, v in sd.items()}).items()})
    else:
      sd = self.state.get_state_dict(model)
      self.state.load_state_dict(model, {k: self.Tensor(v) for k, v in weights({k: tuple(v.shape) for k, v in sd.items()}).items()})
      for p in self.state.get_parameters(model): p.realize()
    return model

  def data(self, c: Cfg) -> dict[str, Any]:
    d = inputs(c)
    if self.name == "torch": return {"ids": self.torch.from_numpy(d["ids"]).long(), "mask": self.torch.from_numpy(d["mask"]),
                                     "targets": self.torch.from_numpy(d["targets"]).long()}
    return {k: self.Tensor(v).realize() for k, v in d.items()}

  def check(self, c: Cfg) -> dict[str, list]:
    """Encoder and decoder outputs on the small config (no JIT, no timing)."""
    enc, dec, d = self.build("encoder", c), self.build("decoder", c), self.data(c)
    if self.name == "torch":
      with self.torch.no_grad(): return {"encoder": enc(d["ids"], d["mask"]).numpy().tolist(), "decoder": dec(d["ids"]).numpy().tolist()}
    return {"encoder": enc(d["ids"], d["mask"]).numpy().tolist(), "decoder": dec(d["ids"]).numpy().tolist()}

  def forward(self, c: Cfg) -> Any:
    model, d = self.build("encoder", c), self.data(c)
    if self.name == "torch":
      def run() -> None:
        with self.torch.no_grad(): model(d["ids"], d["mask"])
      return run
    jit = self.TinyJit(lambda ids, mask: model(ids, mask).realize())
    return lambda: jit(d["ids"], d["mask"]).numpy()

  def train(self, c: Cfg) -> Any:
    model, d = self.build("decoder", c), self.data(c)
    if self.name == "torch":
      opt = self.torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
      def run() -> None:
        opt.zero_grad()
        self.torch.nn.functional.cross_entropy(model(d["ids"]).flatten(0, 1), d["targets"].flatten()).backward()
        opt.step()
      return run
    opt = self.optim.AdamW(self.state.get_parameters(model), lr=1e-4, weight_decay=0.01)

    @self.TinyJit
    def step(ids: Any, targets: Any) -> Any:
      opt.zero_grad()
      loss = model(ids).sparse_categorical_crossentropy(targets)
      loss.backward()
      return loss.realize(*opt.schedule_step())
    return lambda: step(d["ids"], d["targets"]).numpy()

  def first(self, c: Cfg) -> dict[str, float]:
    model, d = self.build("encoder", c), self.data(c)
    cg = importlib.import_module("plugrad.codegen").codegen_seconds if self.name == "plugrad" else [0.0]
    cg0, t0 = cg[0], time.perf_counter()
    if self.name == "torch":
      with self.torch.no_grad(): model(d["ids"], d["mask"]).numpy()
    else: model(d["ids"], d["mask"]).numpy()
    return {"s": time.perf_counter() - t0, **({"codegen_s": cg[0] - cg0} if self.name == "plugrad" else {})}


def peer_main(name: str, job: dict[str, Any], threads: int, reps: int) -> dict[str, Any]:
  side, c = Side(name, threads), Cfg(**job["cfg"])
  if job["kind"] == "check": return side.check(c)
  if job["kind"] == "first": return side.first(c)
  ctx: Any = None
  if name == "tinygrad":
    from tinygrad import Context
    ctx = Context(TRAINING=int(job["kind"] == "train"))
    ctx.__enter__()
  elif name == "plugrad":
    side.Tensor.training = job["kind"] == "train"
  fn = side.forward(c) if job["kind"] == "forward" else side.train(c)
  t0 = time.perf_counter()
  fn()  # compiles (plugrad, tinygrad); TinyJit captures on the second call
  first = time.perf_counter() - t0
  t0 = time.perf_counter()
  fn()
  second = time.perf_counter() - t0
  settle = peers.settle_tiers if name == "plugrad" else None
  # the budget is per cell: runs over a second get at most 3 reps, and over 5 s no warm-up beyond the two calls above
  ms = median_ms(fn, 0 if second >= 5.0 else 1, reps if second < 1.0 else min(reps, 3), settle)
  return {"ms": ms, "first_s": first}


# ---------------------------------------------------------------- the driver

def ratio(base: float, other: float) -> str:
  return f"(plugrad {base / other:.2f}x slower)" if base >= other else f"(plugrad {other / base:.2f}x faster)"


def check_line(res: dict[str, Any]) -> tuple[str, bool]:
  """plugrad's check outputs against each peer's: max |diff| / max |plugrad|, tolerance 1e-4."""
  base, cells, ok = res.get("plugrad"), [], True
  if not isinstance(base, dict): return f"check {CHECK.label()}: plugrad {base}", False
  for n, r in res.items():
    if n == "plugrad": continue
    if not isinstance(r, dict):
      cells.append(f"{n} {r}")
      continue
    errs = []
    for m in ("encoder", "decoder"):
      a, b = np.asarray(base[m]), np.asarray(r[m])
      err = float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-12)) if a.shape == b.shape else float("inf")
      ok &= err <= 1e-4
      errs.append(f"{m} {err:.1e}")
    cells.append(f"{n}: " + ", ".join(errs))
  return f"check {CHECK.label()} (max |diff| / max |plugrad|, tolerance 1e-4): " + "; ".join(cells) + ("" if ok else "  MISMATCH"), ok


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
  ap.add_argument("--only", default="a,b,c", help="parts: a (encoder forwards), b (decoder training step), c (first result)")
  ap.add_argument("--layers", default=None, help="layer counts for part c (default 1,2,6,12; 1,2 with --quick)")
  ap.add_argument("--peers", default=",".join(FRAMEWORKS), help="frameworks to run")
  ap.add_argument("--quick", action="store_true", help="small shapes: a smoke test of the script")
  ap.add_argument("--budget", type=float, default=240.0, help="seconds per cell (one framework, one line) before it is killed")
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument("--peer", help=argparse.SUPPRESS)  # internal: run one job for one framework, print its JSON
  ap.add_argument("--job", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.peer:
    print(json.dumps(peer_main(args.peer, json.loads(args.job), args.threads, args.reps)))
    return 0
  args.only = set(args.only.split(","))
  args.layers = [int(n) for n in (args.layers or ("1,2" if args.quick else "1,2,6,12")).split(",")]
  names = [n for n in FRAMEWORKS if n in args.peers.split(",")]

  def run(name: str, kind: str, c: Cfg, env_extra: dict[str, str] | None = None) -> dict[str, Any] | str:
    job = json.dumps({"kind": kind, "cfg": asdict(c)})
    return peers.run_peer(__file__, name, args.threads, "--job", job, "--reps", str(args.reps), timeout=args.budget, env_extra=env_extra)

  dev = subprocess.run([sys.executable, "-c", "from plugrad import Device; print(Device.DEFAULT)"], capture_output=True, text=True).stdout.strip()
  print(f"plugrad on {dev or '?'}, torch CPU, tinygrad DEV=CPU; {args.threads} thread(s); forward/step: median of up to {args.reps} runs "
        f"after warm-up, ms; first result: s; {args.budget:.0f} s budget per cell", flush=True)
  line, ok = check_line({n: run(n, "check", CHECK) for n in names})
  print(line, flush=True)
  for part, label, kind, c in workloads(args):
    res: dict[str, Any] = {}
    if kind == "first":  # a fresh process per framework and count, nothing cached on disk
      with tempfile.TemporaryDirectory(prefix="plugrad-bench-cache-") as cache:
        env = {"PLUGRAD_CACHE_DIR": cache, "CACHE": "0", "DISABLE_COMPILER_CACHE": "1"}
        res = {n: run(n, kind, c, env) for n in names}
    else: res = {n: run(n, kind, c) for n in names}
    base, cells = res.get("plugrad"), []
    for n, r in res.items():
      if not isinstance(r, dict):
        cells.append(f"{n} {r}")
        continue
      if kind == "first":
        cells.append(f"{n} {r['s']:7.2f} s" + (f" (codegen {r['codegen_s']:.2f} s)" if "codegen_s" in r else ""))
        if isinstance(base, dict) and n != "plugrad": cells[-1] += " " + ratio(base["s"], r["s"])
      else:
        cells.append(f"{n} {r['ms']:9.1f} ms")
        if isinstance(base, dict) and n != "plugrad": cells[-1] += " " + ratio(base["ms"], r["ms"])
        if n != "torch": cells[-1] += f" [first call {r['first_s']:.1f} s]"  # compile included
    print(f"{part} {label:38s} " + "   ".join(cells), flush=True)
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
