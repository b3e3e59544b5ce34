"""Transformer models written as a tinygrad user would, for the benchmarks, examples and tests.

* `Encoder`: a BERT-style encoder (word + position + token-type embeddings, post-LN blocks, an additive attention
  mask, tanh gelu). BERT-base is `Encoder(hidden=768, heads=12, ffn=3072, layers=12)`.
* `Decoder`: a GPT-2-style causal decoder (pre-LN blocks, causal attention, a tied LM head).
  GPT-2 small is `Decoder(hidden=768, heads=12, ffn=3072, layers=12, vocab=50257, max_seq=1024)`.

Weights are random (nn's initializers); names follow the Hugging Face checkpoints loosely, so `get_state_dict` keys
can be mapped to a real checkpoint. Both models are plain callables of int32 token ids (batch, seq).

  python bench/models.py [--layers N] [--batch B] [--seq S]      first-result time of the encoder
"""
from __future__ import annotations

import argparse
import time

from plugrad import Tensor, nn


class Attention:
  def __init__(self, hidden: int, heads: int):
    if hidden % heads: raise ValueError(f"hidden={hidden} must be a multiple of heads={heads}")
    self.heads = heads
    self.qkv = nn.Linear(hidden, 3 * hidden)
    self.out = nn.Linear(hidden, hidden)

  def __call__(self, x: Tensor, mask: Tensor | None = None, causal: bool = False) -> Tensor:
    b, s, h = x.shape
    # (b, s, 3, heads, d) → three (b, heads, s, d)
    q, k, v = [t.reshape(b, s, self.heads, h // self.heads).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1)]
    y = q.scaled_dot_product_attention(k, v, attn_mask=mask, is_causal=causal)
    return self.out(y.transpose(1, 2).reshape(b, s, h))


class EncoderLayer:
  """Post-LN (BERT): x = LN(x + attn(x)); x = LN(x + ffn(x))."""
  def __init__(self, hidden: int, heads: int, ffn: int, eps: float = 1e-12):
    self.attn, self.ln1 = Attention(hidden, heads), nn.LayerNorm(hidden, eps=eps)
    self.up, self.down, self.ln2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden), nn.LayerNorm(hidden, eps=eps)

  def __call__(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
    x = self.ln1(x + self.attn(x, mask))
    return self.ln2(x + self.down(self.up(x).gelu()))


class Encoder:
  """A BERT-style encoder: `model(ids, attention_mask=None)` → hidden states (batch, seq, hidden).

  `attention_mask` is (batch, seq) of 1 (attend) / 0 (padding); it becomes the additive mask (0 / -10000) BERT uses.
  `model.encode(x, attention_mask)` runs the blocks on given embeddings (batch, seq, hidden), skipping the lookups."""
  def __init__(self, hidden: int = 384, heads: int = 12, ffn: int = 1536, layers: int = 6, vocab: int = 30522, max_seq: int = 512,
               type_vocab: int = 2, eps: float = 1e-12):
    self.hidden, self.max_seq = hidden, max_seq
    self.word, self.pos, self.type = nn.Embedding(vocab, hidden), nn.Embedding(max_seq, hidden), nn.Embedding(type_vocab, hidden)
    self.ln = nn.LayerNorm(hidden, eps=eps)
    self.layers = [EncoderLayer(hidden, heads, ffn, eps) for _ in range(layers)]

  def embed(self, ids: Tensor, token_type: Tensor | None = None) -> Tensor:
    b, s = ids.shape
    if s > self.max_seq: raise ValueError(f"sequence {s} is longer than max_seq={self.max_seq}")
    pos = Tensor.arange(s).reshape(1, s).expand(b, s)
    tt = token_type if token_type is not None else Tensor.zeros(b, s, dtype=ids.dtype)
    return self.ln(self.word(ids) + self.pos(pos) + self.type(tt))

  def encode(self, x: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    b, s, _ = x.shape
    mask = None if attention_mask is None else ((1 - attention_mask.float()) * -10000.0).reshape(b, 1, 1, s)
    for layer in self.layers: x = layer(x, mask)
    return x

  def __call__(self, ids: Tensor, attention_mask: Tensor | None = None, token_type: Tensor | None = None) -> Tensor:
    return self.encode(self.embed(ids, token_type), attention_mask)


class DecoderLayer:
  """Pre-LN (GPT-2): x = x + attn(LN(x)); x = x + mlp(LN(x))."""
  def __init__(self, hidden: int, heads: int, ffn: int):
    self.ln1, self.attn = nn.LayerNorm(hidden), Attention(hidden, heads)
    self.ln2, self.up, self.down = nn.LayerNorm(hidden), nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

  def __call__(self, x: Tensor) -> Tensor:
    x = x + self.attn(self.ln1(x), causal=True)
    return x + self.down(self.up(self.ln2(x)).gelu())


class Decoder:
  """A GPT-2-style causal decoder: `model(ids)` → logits (batch, seq, vocab); the LM head shares the word embedding."""
  def __init__(self, hidden: int = 768, heads: int = 12, ffn: int = 3072, layers: int = 12, vocab: int = 50257, max_seq: int = 1024):
    self.max_seq = max_seq
    self.word, self.pos = nn.Embedding(vocab, hidden), nn.Embedding(max_seq, hidden)
    self.layers = [DecoderLayer(hidden, heads, ffn) for _ in range(layers)]
    self.ln = nn.LayerNorm(hidden)

  def __call__(self, ids: Tensor) -> Tensor:
    b, s = ids.shape
    if s > self.max_seq: raise ValueError(f"sequence {s} is longer than max_seq={self.max_seq}")
    x = self.word(ids) + self.pos(Tensor.arange(s).reshape(1, s).expand(b, s))
    for layer in self.layers: x = layer(x)
    return self.ln(x) @ self.word.weight.T


def main() -> None:
  ap = argparse.ArgumentParser(description="first-result time of the BERT-style encoder (random weights)")
  ap.add_argument("--layers", type=int, default=6)
  ap.add_argument("--batch", type=int, default=32)
  ap.add_argument("--seq", type=int, default=128)
  ap.add_argument("--no-embed", action="store_true", help="feed random embeddings to the blocks (skips the lookups)")
  args = ap.parse_args()
  from plugrad.codegen import codegen_seconds
  model = Encoder(layers=args.layers)
  for p in nn.get_parameters(model): p.realize()
  ids = Tensor.randint(args.batch, args.seq, low=0, high=30522).realize()
  mask = Tensor.ones(args.batch, args.seq).realize()
  x = Tensor.randn(args.batch, args.seq, model.hidden).realize() if args.no_embed else None
  cg0, t0 = codegen_seconds[0], time.perf_counter()
  out = (model.encode(x, mask) if x is not None else model(ids, mask)).numpy()
  dt = time.perf_counter() - t0
  print(f"encoder layers={args.layers} batch={args.batch} seq={args.seq}: first result {dt:.2f} s (codegen {codegen_seconds[0] - cg0:.2f} s), "
        f"out {out.shape} mean {out.mean():.4f}")


if __name__ == "__main__":
  main()
