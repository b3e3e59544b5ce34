"""A small character-level GPT trained on Python's own standard-library sources (no download): the .py files next to
`os.py`, concatenated. Pre-LN decoder blocks with causal attention, AdamW with warm-up and cosine decay, the training
step under TinyJit, a tqdm bar, a validation loss and a generated sample every --sample-every steps, and a safetensors
checkpoint that is reloaded into a fresh model at the end to check it.

  python examples/gpt_char.py                      # DEV=PYTHON / DEV=CPU / ... to pick the device
  python examples/gpt_char.py --steps 300 --sample-every 100
  python examples/gpt_char.py --smoke              # a tiny model, a few steps: checks the whole path in seconds
  mpirun -np 2 python examples/gpt_char.py --distributed   # data-parallel over 2 processes (docs/distributed.md)

Exits with status 1 if the reloaded model disagrees with the trained one.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

import numpy as np
from tqdm import tqdm

import plugrad.distributed as dist
from plugrad import Device, Tensor, TinyJit, nn
from plugrad.nn import get_parameters, get_state_dict, load_state_dict
from plugrad.nn.optim import AdamW, LambdaLR
from plugrad.nn.state import safe_load, safe_load_metadata, safe_save

# ---------------------------------------------------------------- the corpus

def load_corpus(max_bytes: int) -> str:
  """Python's standard-library sources (top-level .py files, in name order) up to `max_bytes`, as ASCII: the few other
  characters become '?', which keeps the vocabulary to the ~100 characters code is written in."""
  libdir = os.path.dirname(os.__file__)
  parts, size = [], 0
  for name in sorted(os.listdir(libdir)):
    if not name.endswith(".py"): continue
    with open(os.path.join(libdir, name), encoding="utf-8", errors="replace") as f: text = f.read()
    parts.append(f"# ---- {name}\n{text}")
    size += len(parts[-1])
    if size >= max_bytes: break
  return "".join(parts)[:max_bytes].encode("ascii", "replace").decode("ascii")


# ---------------------------------------------------------------- the model

class Block:
  """Pre-LN: x + attention(LN(x)), then x + MLP(LN(x)); the attention is causal (a position sees itself and the past)."""
  def __init__(self, dim: int, heads: int):
    self.heads = heads
    self.ln1, self.qkv, self.proj = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
    self.ln2, self.up, self.down = nn.LayerNorm(dim), nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

  def __call__(self, x: Tensor) -> Tensor:
    b, t, d = x.shape
    q, k, v = [z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(self.ln1(x)).chunk(3, dim=-1)]
    x = x + self.proj(q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(b, t, d))
    return x + self.down(self.up(self.ln2(x)).gelu())


class CharGPT:
  def __init__(self, vocab: int, ctx: int, dim: int, heads: int, layers: int):
    self.config = {"vocab": vocab, "ctx": ctx, "dim": dim, "heads": heads, "layers": layers}
    self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
    self.blocks = [Block(dim, heads) for _ in range(layers)]
    self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

  def __call__(self, idx: Tensor) -> Tensor:
    """Token ids (batch, t ≤ ctx) → next-character logits (batch, t, vocab)."""
    b, t = idx.shape
    x = self.tok(idx) + self.pos(Tensor.arange(t).reshape(1, t).expand(b, t))
    for blk in self.blocks: x = blk(x)
    return self.head(self.ln(x))


# ---------------------------------------------------------------- sampling

def make_sampler(model: CharGPT) -> TinyJit:
  """The forward on one full context window, under TinyJit: generation always runs this one shape (the prompt sits at the
  front of the window and causality keeps the padding after it from mattering), so its kernels are compiled once."""
  return TinyJit(lambda idx: model(idx).realize())


def generate(forward: TinyJit, ctx: int, prompt: list[int], n: int, rng: np.random.Generator, temperature: float = 0.8) -> list[int]:
  Tensor.training = False
  out = list(prompt)
  for _ in range(n):
    window = out[-ctx:]
    ids = np.zeros((1, ctx), np.int32)
    ids[0, :len(window)] = window
    logits = forward(Tensor(ids)).numpy()[0, len(window) - 1].astype(np.float64) / temperature
    p = np.exp(logits - logits.max())
    out.append(int(rng.choice(len(p), p=p / p.sum())))
  return out[len(prompt):]


# ---------------------------------------------------------------- training

def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
  # the defaults fit a few minutes on 2 cores; larger models learn more but plugrad's step is still slow (docs/nn.md)
  ap.add_argument("--steps", type=int, default=500)
  ap.add_argument("--batch-size", type=int, default=16)
  ap.add_argument("--ctx", type=int, default=64, help="context length in characters")
  ap.add_argument("--dim", type=int, default=128)
  ap.add_argument("--heads", type=int, default=4)
  ap.add_argument("--layers", type=int, default=2)
  ap.add_argument("--lr", type=float, default=2e-3)
  ap.add_argument("--corpus-kb", type=int, default=400, help="how much of the standard library to train on")
  ap.add_argument("--sample-every", type=int, default=100, help="steps between validation losses and samples (and checkpoints)")
  ap.add_argument("--sample-chars", type=int, default=160)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--weights", default=os.path.join(tempfile.gettempdir(), "plugrad_gpt_char.safetensors"), help="the checkpoint")
  ap.add_argument("--smoke", action="store_true", help="a tiny model for a few steps: checks the path, not the quality")
  ap.add_argument("--distributed", action="store_true",
                  help="data-parallel over the processes of an MPI launch (mpirun -np N ...): each trains on 1/N of every batch; rank 0 "
                  "reports and saves")
  args = ap.parse_args()
  if args.smoke:
    args.steps, args.batch_size, args.ctx, args.dim, args.heads, args.layers = 4, 4, 16, 32, 2, 1
    args.corpus_kb, args.sample_every, args.sample_chars = 20, 4, 16
  rank, world = 0, 1
  if args.distributed:
    dist.init()
    rank, world = dist.rank(), dist.world_size()
    if args.batch_size % world: ap.error(f"--batch-size {args.batch_size} must be divisible by the {world} processes")
  share = slice(rank * args.batch_size // world, (rank + 1) * args.batch_size // world)

  t_start = time.perf_counter()
  text = load_corpus(args.corpus_kb * 1000)
  chars = sorted(set(text))
  stoi = {c: i for i, c in enumerate(chars)}
  data = np.array([stoi[c] for c in text], np.int32)
  split = int(0.9 * len(data))
  train_data, val_data = data[:split], data[split:]
  if rank == 0:
    print(f"device {Device.DEFAULT}: {len(text) / 1e3:.0f} KB of standard-library source, {len(chars)} distinct characters" +
          (f"; {world} processes, {args.batch_size // world} windows of each batch per process" if world > 1 else ""))

  Tensor.manual_seed(args.seed)
  rng = np.random.default_rng(args.seed)  # the batches: the same on every rank, each takes its share
  sample_rng = rng if world == 1 else np.random.default_rng(args.seed + 1)  # rank 0's samples must not move the ranks' batch draws apart
  model = CharGPT(len(chars), args.ctx, args.dim, args.heads, args.layers)
  params = get_parameters(model)
  n_params = sum(p.numel() for p in params)
  if rank == 0: print(f"model: {args.layers} layers, dim {args.dim}, {args.heads} heads, context {args.ctx}: {n_params / 1e6:.2f}M parameters")
  opt = AdamW(params, lr=args.lr, weight_decay=0.01)
  warmup = max(1, min(100, args.steps // 10))  # a short linear warm-up, then cosine decay to 10% of lr
  decay = max(1, args.steps - warmup)
  sched = LambdaLR(opt, lambda s: (s + 1) / warmup if s < warmup else 0.1 + 0.45 * (1 + math.cos(math.pi * (s - warmup) / decay)))

  def batch(src: np.ndarray, n: int) -> tuple[Tensor, Tensor]:
    starts = rng.integers(0, len(src) - args.ctx - 1, n)
    w = np.stack([src[s:s + args.ctx + 1] for s in starts])
    return Tensor(w[:, :-1]), Tensor(w[:, 1:])

  @TinyJit  # from the third step on, the step's kernels are replayed without building or scheduling a graph
  def step(x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    loss = model(x).sparse_categorical_crossentropy(y)
    loss.backward()
    return loss.realize(*opt.schedule_step())  # the loss and the update in one run

  if world > 1:  # rank 0's initial weights broadcast; two captures around the gradient all-reduce
    step = dist.DistributedOptimizer(opt).make_step(lambda x, y: model(x).sparse_categorical_crossentropy(y))  # type: ignore[assignment]

  evaluate = TinyJit(lambda x, y: model(x).sparse_categorical_crossentropy(y).realize())
  val_batches = [batch(val_data, args.batch_size) for _ in range(2 if args.smoke else 8)]  # the same held-out windows every time
  sampler = make_sampler(model)
  prompt = [stoi[c] for c in "def "]

  def report(step_no: int, train_loss: float) -> None:
    Tensor.training = False
    val = float(np.mean([evaluate(x, y).item() for x, y in val_batches]))
    sample = "".join(chars[i] for i in generate(sampler, args.ctx, prompt, args.sample_chars, sample_rng))
    safe_save(get_state_dict(model), args.weights, metadata={"vocab": json.dumps(chars), "config": json.dumps(model.config)})
    tqdm.write(f"step {step_no}: train loss {train_loss:.3f}, val loss {val:.3f}; sample:\n    def {sample.replace(chr(10), chr(10) + '    ')}",
               file=sys.stdout)

  losses: list[float] = []
  with tqdm(total=args.steps, desc="training", unit="step", file=sys.stdout, disable=rank != 0) as bar:
    t0 = time.perf_counter()
    for s in range(1, args.steps + 1):
      Tensor.training = True
      x, y = batch(train_data, args.batch_size)
      if world == 1: loss = step(x, y).item()
      else: loss = dist.all_reduce(step(x[share], y[share]), "mean").item()  # the whole batch's loss
      sched.step()
      losses.append(loss)
      bar.update(1)
      bar.set_postfix(loss=f"{loss:.3f}", rate=f"{s * args.batch_size * args.ctx / (time.perf_counter() - t0):.0f} chars/s")
      if rank == 0 and (s % args.sample_every == 0 or s == args.steps): report(s, float(np.mean(losses[-args.sample_every:])))
  if rank != 0: return 0  # rank 0 checks the checkpoint it wrote

  # the checkpoint holds everything to rebuild the model: check that a fresh one predicts the same
  meta = safe_load_metadata(args.weights)
  fresh = CharGPT(**json.loads(meta["config"]))
  load_state_dict(fresh, safe_load(args.weights))
  Tensor.training = False
  x, _ = val_batches[0]
  a, b = model(x).numpy(), fresh(x).numpy()
  same = bool(np.allclose(a, b, rtol=1e-5, atol=1e-5)) and json.loads(meta["vocab"]) == chars
  print(f"saved {args.weights}; reloaded into a fresh model: {'same logits' if same else 'DIFFERENT logits'}; "
        f"total {time.perf_counter() - t_start:.1f} s")
  return 0 if same else 1


if __name__ == "__main__":
  sys.exit(main())
