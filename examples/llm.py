"""Text generation with a KV cache: GPT-2 (Hugging Face's state-dict layout) or a LLaMA-style decoder (RMSNorm, RoPE,
grouped-query attention, SwiGLU). The prompt is run in one prefill pass that fills the caches; each next token is one
decode step under TinyJit whose position is a bound Variable, so one capture (and one set of kernels) serves every
position: the key length of the attention is symbolic, the cache row is written in place at `start_pos`.
The prefill is jitted too, per length bucket: the prompt is padded to its bucket (powers of two up to 64, then multiples
of 64) and the logits are read at a bound Variable, so one capture serves every prompt length in the bucket. Causal
attention keeps the padding out of the real positions, and the cache rows it fills are overwritten by the decode steps
before any query reads them.

  python examples/llm.py                                    # GPT-2 small, random weights, byte-level tokens
  python examples/llm.py --weights model.safetensors        # a GPT-2 checkpoint (e.g. Hugging Face's gpt2)
  python examples/llm.py --model llama --layers 8 --dim 512 # a LLaMA-style model, random weights
  python examples/llm.py --temperature 0.8 --top-k 40 --top-p 0.95 --prompt "Once upon a time"
  python examples/llm.py --smoke                            # tiny models: the cached decode equals a full recompute

Tokens are streamed as they come, then the prefill time, decode ms/token and tokens/s are printed. With `tokenizers`
installed and --tokenizer PATH (a tokenizer.json) text is encoded with it; otherwise tokens are bytes (ids < 256).
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from plugrad import Tensor, TinyJit, Variable, dtypes
from plugrad.dtype import DType
from plugrad.engine import realize as realize_mod
from plugrad.nn.state import safe_load


@dataclass(frozen=True)
class Config:
  kind: str = "gpt2"        # gpt2 | llama
  layers: int = 12
  dim: int = 768
  heads: int = 12
  kv_heads: int = 0         # llama: grouped-query attention (0: as many as heads)
  hidden: int = 0           # the MLP's width (0: 4*dim for gpt2, 8/3*dim rounded to 64 for llama)
  vocab: int = 50257
  max_ctx: int = 1024
  norm_eps: float = 1e-5
  rope_theta: float = 10000.0

  @property
  def head_dim(self) -> int: return self.dim // self.heads
  @property
  def n_kv(self) -> int: return self.kv_heads or self.heads
  @property
  def ffn(self) -> int: return self.hidden or (4 * self.dim if self.kind == "gpt2" else 64 * -(-(8 * self.dim // 3) // 64))


# ---------------------------------------------------------------- weights (Hugging Face names)

def weight_shapes(c: Config) -> dict[str, tuple[int, ...]]:
  """Every parameter by its Hugging Face name: GPT2LMHeadModel (Conv1D weights are (in, out)) or LlamaForCausalLM
  (Linear weights are (out, in))."""
  d, f, hd = c.dim, c.ffn, c.head_dim
  if c.kind == "gpt2":
    w = {"wte.weight": (c.vocab, d), "wpe.weight": (c.max_ctx, d), "ln_f.weight": (d,), "ln_f.bias": (d,)}
    for i in range(c.layers):
      p = f"h.{i}."
      w |= {p + "ln_1.weight": (d,), p + "ln_1.bias": (d,), p + "attn.c_attn.weight": (d, 3 * d), p + "attn.c_attn.bias": (3 * d,),
            p + "attn.c_proj.weight": (d, d), p + "attn.c_proj.bias": (d,), p + "ln_2.weight": (d,), p + "ln_2.bias": (d,),
            p + "mlp.c_fc.weight": (d, f), p + "mlp.c_fc.bias": (f,), p + "mlp.c_proj.weight": (f, d), p + "mlp.c_proj.bias": (d,)}
    return w
  w = {"model.embed_tokens.weight": (c.vocab, d), "model.norm.weight": (d,), "lm_head.weight": (c.vocab, d)}
  for i in range(c.layers):
    p = f"model.layers.{i}."
    w |= {p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
          p + "self_attn.q_proj.weight": (c.heads * hd, d), p + "self_attn.k_proj.weight": (c.n_kv * hd, d),
          p + "self_attn.v_proj.weight": (c.n_kv * hd, d), p + "self_attn.o_proj.weight": (d, c.heads * hd),
          p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d), p + "mlp.down_proj.weight": (d, f)}
  return w


def random_weights(c: Config, seed: int = 0) -> dict[str, np.ndarray]:
  """GPT-2's initialization (normal, std 0.02; norms' weights 1 and biases 0), as numpy arrays."""
  rng = np.random.default_rng(seed)
  def init(name: str, shape: tuple[int, ...]) -> np.ndarray:
    if "ln" in name or "norm" in name: return (np.ones if name.endswith("weight") else np.zeros)(shape, np.float32)
    if name.endswith("bias"): return np.zeros(shape, np.float32)
    return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
  return {k: init(k, s) for k, s in weight_shapes(c).items()}


def load_weights(path: str, c: Config) -> dict[str, Tensor]:
  """A safetensors state dict: GPT-2 names with or without the `transformer.` prefix; lm_head tied to wte if absent."""
  sd = {k.removeprefix("transformer."): v for k, v in safe_load(path).items()}
  want = weight_shapes(c)
  if c.kind == "llama" and "lm_head.weight" not in sd: sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
  missing = [k for k in want if k not in sd]
  bad = [f"{k}: {tuple(sd[k].shape)} != {s}" for k, s in want.items() if k in sd and tuple(sd[k].shape) != s]
  if missing or bad: raise SystemExit(f"{path} does not fit the {c.kind} config: missing {missing[:4]}, wrong shapes {bad[:4]}")
  return {k: sd[k] for k in want}


# ---------------------------------------------------------------- the model

_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def _norm(x: Tensor, w: Tensor, b: Tensor | None, eps: float) -> Tensor:
  if b is None: return (x * (x * x).mean(-1, keepdim=True).add(eps).rsqrt()) * w   # RMSNorm
  return x.layernorm(eps=eps) * w + b


class Transformer:
  """A decoder over state dict `w` (Tensors, any float dtype: computed in float32). `__call__(tokens, start_pos)` runs
  tokens (B, T) at positions start_pos.. start_pos+T-1 through every layer, writing their keys and values into the
  caches, and returns the last position's logits (B, vocab) in float32."""
  def __init__(self, c: Config, w: dict[str, Tensor], batch: int, device: str | None = None, quantize: str | None = None):
    self.c, self.batch = c, batch
    # GPT-2's Conv1D matrices are stored (in, out); kept here as (out, in), so that a decode step's matrix-vector
    # products read each output's weights as one contiguous row (a column walk strides a page per element: 5x slower)
    self.w = {k: (v.T.contiguous() if k.endswith(_CONV1D) else v).to(device).realize() for k, v in w.items()}
    if quantize not in (None, "int8"): raise ValueError(f"quantize must be None or 'int8', got {quantize!r}")
    # int8 weight-only: each matrix (out, in) as int8 rows and one float32 scale per row (symmetric, max |w| -> 127), a
    # quarter of float32's bytes, which is what a decode step's time is made of; the rows are dequantized in the kernels
    # that read them (the scale applied once per output of a matmul, after its reduction)
    self.scales: dict[str, Tensor] = {}
    if quantize == "int8":
      for k, v in list(self.w.items()):
        if len(v.shape) != 2 or k.endswith("wpe.weight"): continue
        a = v.float().numpy()
        s = np.maximum(np.abs(a).max(axis=1), 1e-12) / 127
        self.w[k] = Tensor(np.clip(np.rint(a / s[:, None]), -127, 127).astype(np.int8), device=device).realize()
        self.scales[k] = Tensor(s.astype(np.float32), device=device).realize()
    dt = dtypes.float32
    self.caches = [(Tensor.zeros(batch, c.n_kv, c.max_ctx, c.head_dim, dtype=dt, device=device).contiguous().realize(),
                    Tensor.zeros(batch, c.n_kv, c.max_ctx, c.head_dim, dtype=dt, device=device).contiguous().realize()) for _ in range(c.layers)]
    if c.kind == "llama":  # RoPE tables, Hugging Face's rotate-half form
      inv = 1.0 / (c.rope_theta ** (np.arange(0, c.head_dim, 2, dtype=np.float64) / c.head_dim))
      ang = np.outer(np.arange(c.max_ctx), inv)
      self.cos, self.sin = (Tensor(np.concatenate([t, t], -1).astype(np.float32), device=device).realize() for t in (np.cos(ang), np.sin(ang)))
    self.decode = TinyJit(self._step)
    self.prefills: OrderedDict[int, TinyJit] = OrderedDict()  # per padded length; the least recently used dropped

  PREFILL_JITS = 4  # prefill captures kept (each holds its kernels and its intermediate buffers)

  def W(self, name: str) -> Tensor:
    """Weight `name` in float32: a cast fused into the consumer, which reads the stored dtype (int8 rows times their scales)."""
    w = self.w[name].float()
    return w * self.scales[name].reshape(-1, 1) if name in self.scales else w

  def mm(self, x: Tensor, name: str) -> Tensor:
    """x @ W(name).T, an int8 matrix's scales applied to the outputs rather than to every weight."""
    if name not in self.scales: return x @ self.W(name).T
    return (x @ self.w[name].float().T) * self.scales[name]

  def embed(self, name: str, tokens: Tensor) -> Tensor:
    if name not in self.scales: return self.W(name)[tokens]
    return self.w[name].float()[tokens] * self.scales[name][tokens].unsqueeze(-1)

  def _attention(self, i: int, q: Tensor, k: Tensor, v: Tensor, sp: int | Variable, T: int) -> Tensor:
    ck, cv = self.caches[i]
    ck[:, :, sp:sp + T] = k  # this step's rows, written in place
    cv[:, :, sp:sp + T] = v
    keys, vals = ck[:, :, :sp + T], cv[:, :, :sp + T]
    gqa = self.c.n_kv != self.c.heads
    if T == 1: return q.scaled_dot_product_attention(keys, vals, enable_gqa=gqa)  # one query sees every cached key
    if isinstance(sp, int) and sp == 0: return q.scaled_dot_product_attention(keys, vals, is_causal=True, enable_gqa=gqa)
    raise ValueError("a prefill after the first (a chunked prompt) is not supported: prefill once at position 0, then decode")

  def _layer(self, i: int, x: Tensor, sp: int | Variable, T: int) -> Tensor:
    c, B = self.c, x.shape[0]
    hd = c.head_dim
    def heads(t: Tensor, n: int) -> Tensor: return t.reshape(B, T, n, hd).transpose(1, 2)
    if c.kind == "gpt2":
      p = f"h.{i}."
      h = _norm(x, self.W(p + "ln_1.weight"), self.W(p + "ln_1.bias"), c.norm_eps)
      qkv = self.mm(h, p + "attn.c_attn.weight") + self.W(p + "attn.c_attn.bias")
      # computed once: the cache writes realize k and v now, and would each recompute their part of the projection
      q, k, v = (heads(t, c.heads) for t in qkv.realize().chunk(3, dim=-1))
      a = self._attention(i, q, k, v, sp, T).transpose(1, 2).reshape(B, T, c.dim)
      x = x + self.mm(a, p + "attn.c_proj.weight") + self.W(p + "attn.c_proj.bias")
      h = self.mm(_norm(x, self.W(p + "ln_2.weight"), self.W(p + "ln_2.bias"), c.norm_eps), p + "mlp.c_fc.weight") + self.W(p + "mlp.c_fc.bias")
      return x + self.mm(h.gelu(), p + "mlp.c_proj.weight") + self.W(p + "mlp.c_proj.bias")
    p = f"model.layers.{i}."
    h = _norm(x, self.W(p + "input_layernorm.weight"), None, c.norm_eps)
    q = heads(self.mm(h, p + "self_attn.q_proj.weight"), c.heads)
    k = heads(self.mm(h, p + "self_attn.k_proj.weight").realize(), c.n_kv)
    v = heads(self.mm(h, p + "self_attn.v_proj.weight").realize(), c.n_kv)
    cos, sin = self.cos[sp:sp + T].reshape(1, 1, T, hd), self.sin[sp:sp + T].reshape(1, 1, T, hd)
    def rope(t: Tensor) -> Tensor: return t * cos + Tensor.cat(-t[..., hd // 2:], t[..., :hd // 2], dim=-1) * sin
    a = self._attention(i, rope(q), rope(k), v, sp, T).transpose(1, 2).reshape(B, T, c.heads * hd)
    x = x + self.mm(a, p + "self_attn.o_proj.weight")
    h = _norm(x, self.W(p + "post_attention_layernorm.weight"), None, c.norm_eps)
    # the gate on its own: fused with the up projection, two reductions share one kernel that the optimizer cannot tile
    # (a LLaMA prefill spent 1.3 s of its 1.4 s per layer there)
    gate = self.mm(h, p + "mlp.gate_proj.weight").contiguous()
    return x + self.mm(gate.silu() * self.mm(h, p + "mlp.up_proj.weight"), p + "mlp.down_proj.weight")

  def _step(self, tokens: Tensor, sp: int | Variable, pick: int | Variable | None = -1) -> Tensor:
    """The logits at position `pick` of `tokens` (B, T) placed at sp (a bound Variable picks per call), or at every
    position when `pick` is None."""
    c = self.c
    T = int(tokens.shape[1])
    if c.kind == "gpt2": x = self.embed("wte.weight", tokens) + self.W("wpe.weight")[sp:sp + T]
    else: x = self.embed("model.embed_tokens.weight", tokens)
    for i in range(c.layers): x = self._layer(i, x, sp, T).realize()  # the cache writes realize each layer: keep the graph one layer deep
    if pick is not None: x = x[:, pick, :]
    if c.kind == "gpt2": return self.mm(_norm(x, self.W("ln_f.weight"), self.W("ln_f.bias"), c.norm_eps), "wte.weight").contiguous()
    return self.mm(_norm(x, self.W("model.norm.weight"), None, c.norm_eps), "lm_head.weight").contiguous()

  def bucket(self, T: int) -> int:
    """The padded length a prompt of T tokens is run at: the next power of two up to 64, then of 64, within the context.
    A short prompt's prefill reads every weight once whatever its length, so only long ones pay for their padding."""
    return min(self.c.max_ctx, 1 << max(T - 1, 0).bit_length() if T <= 64 else -(-T // 64) * 64)

  def __call__(self, tokens: np.ndarray, start_pos: int, jit: bool = True) -> np.ndarray:
    """Logits (B, vocab) for the last of `tokens` (B, T) placed at start_pos: T == 1 after position 0 is a decode step,
    else a prefill (at position 0 only). Both are jitted unless `jit` is False."""
    B, T = tokens.shape
    if (end := start_pos + T) > self.c.max_ctx: raise ValueError(f"position {end} is past the context of {self.c.max_ctx}")
    dev = self.caches[0][0].device
    if T == 1 and start_pos > 0:
      sp = Variable("start_pos", 1, self.c.max_ctx - 1).bind(start_pos)
      t = Tensor(tokens.astype(np.int32), device=dev)
      return (self.decode(t, sp) if jit else self._step(t, sp)).numpy()
    if not jit or start_pos != 0: return self._step(Tensor(tokens.astype(np.int32), device=dev), start_pos).numpy()
    L = self.bucket(T)
    if (run := self.prefills.get(L)) is None:
      run = self.prefills[L] = TinyJit(self._step)
      while len(self.prefills) > self.PREFILL_JITS: self.prefills.popitem(last=False)
    self.prefills.move_to_end(L)
    padded = np.zeros((B, L), np.int32)
    padded[:, :T] = tokens
    return run(Tensor(padded, device=dev), 0, Variable("last", 0, L - 1).bind(T - 1)).numpy()


# ---------------------------------------------------------------- sampling and tokens

def sample(logits: np.ndarray, temperature: float, top_k: int, top_p: float, rng: np.random.Generator) -> np.ndarray:
  """One token per row: greedy at temperature 0, else from softmax(logits / T) cut to the top-k and the top-p mass."""
  if temperature <= 0: return logits.argmax(-1)
  out = []
  for row in logits.astype(np.float64) / temperature:
    order = np.argsort(-row)
    if top_k > 0: order = order[:top_k]
    p = np.exp(row[order] - row[order[0]])
    p /= p.sum()
    if top_p < 1.0: p = p[:max(1, int(np.searchsorted(np.cumsum(p), top_p)) + 1)]
    out.append(order[rng.choice(len(p), p=p / p.sum())])
  return np.array(out)


class Tokenizer:
  """`tokenizers`' tokenizer.json when given, else bytes (ids 0..255; larger ids print as U+FFFD)."""
  def __init__(self, path: str | None):
    self.tok = None
    if path is not None:
      from tokenizers import Tokenizer as HFTokenizer  # the user asked for it: a missing package is their ImportError
      self.tok = HFTokenizer.from_file(path)
  def encode(self, text: str) -> list[int]: return self.tok.encode(text).ids if self.tok is not None else list(text.encode())
  def decode(self, ids: list[int]) -> str:
    if self.tok is not None: return self.tok.decode(ids)
    return bytes(i if i < 256 else 0x3F for i in ids).decode("utf-8", "replace")


def generate(model: Transformer, prompt: list[list[int]], n: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
             seed: int = 0, on_token=None, jit: bool = True) -> tuple[np.ndarray, float, list[float]]:
  """Prefill the prompts (B, T), then n decode steps; returns the new tokens (B, n), the prefill time and each step's."""
  rng = np.random.default_rng(seed)
  toks = np.array(prompt, np.int64)
  st = time.perf_counter()
  nxt = sample(model(toks, 0), temperature, top_k, top_p, rng)
  prefill = time.perf_counter() - st
  out, steps = [nxt], []
  if on_token is not None: on_token(nxt)
  for i in range(n - 1):
    st = time.perf_counter()
    nxt = sample(model(nxt[:, None], toks.shape[1] + i, jit=jit), temperature, top_k, top_p, rng)
    steps.append(time.perf_counter() - st)
    out.append(nxt)
    if on_token is not None: on_token(nxt)
  return np.stack(out, 1), prefill, steps


def recomputed(c: Config, w: dict[str, Tensor], prompt: list[list[int]], got: np.ndarray, quantize: str | None = None) -> np.ndarray:
  """The greedy choice at every position of prompt + got[:, :-1] from one pass over the whole sequence in a fresh model
  (no cache reads: causal attention over the sequence itself): what cached decoding must have produced."""
  seq = np.concatenate([np.array(prompt, np.int64), got[:, :-1]], 1)
  m = Transformer(c, w, seq.shape[0], quantize=quantize)
  logits = m._step(Tensor(seq.astype(np.int32)), 0, None).numpy()
  return logits.argmax(-1)[:, len(prompt[0]) - 1:]


# ---------------------------------------------------------------- the command line

GPT2 = Config("gpt2")
LLAMA = Config("llama", layers=12, dim=768, heads=12, kv_heads=4, vocab=32000, max_ctx=1024, norm_eps=1e-6)
SMOKE = {"gpt2": Config("gpt2", layers=2, dim=64, heads=4, vocab=300, max_ctx=48),
         "llama": Config("llama", layers=2, dim=64, heads=4, kv_heads=2, vocab=300, max_ctx=48, norm_eps=1e-6)}


def smoke() -> int:
  """Each tiny model: greedy decoding with the cache under the JIT equals a full recompute per token, and after the
  second decode step no program is compiled."""
  ok = True
  for kind, c in SMOKE.items():
    w = {k: Tensor(v * (20.0 if v.ndim == 2 else 1.0)) for k, v in random_weights(c, 1).items()}  # larger weights: less tied logits
    prompt = [[7, 33, 250, 12, 99], [1, 2, 3, 4, 5]]
    model = Transformer(c, w, 2)
    counts: list[int] = []
    def count(_: np.ndarray, counts: list[int] = counts) -> None: counts.append(len(realize_mod._runners))
    got, prefill, steps = generate(model, prompt, 16, on_token=count)
    want = recomputed(c, w, prompt, got)
    same, compiled = bool((got == want).all()), counts[-1] - counts[2]
    print(f"{kind}: {got.shape[1]} tokens x {got.shape[0]}, cached == recomputed: {same}, programs compiled after step 2: {compiled}, "
          f"prefill {prefill * 1e3:.1f} ms, decode {np.median(steps[2:]) * 1e3:.2f} ms/token")
    ok = ok and same and compiled == 0
  print("smoke: OK" if ok else "smoke: FAILED")
  return 0 if ok else 1


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", choices=("gpt2", "llama"), default="gpt2")
  ap.add_argument("--weights", help="a safetensors state dict (Hugging Face names); random weights without it")
  ap.add_argument("--layers", type=int); ap.add_argument("--dim", type=int); ap.add_argument("--heads", type=int)
  ap.add_argument("--kv-heads", type=int); ap.add_argument("--vocab", type=int); ap.add_argument("--ctx", type=int)
  ap.add_argument("--dtype", choices=("float32", "float16", "bfloat16"), default="float32", help="the weights' storage dtype (computed in float32)")
  ap.add_argument("--quantize", choices=("int8",), help="int8 weight-only: every matrix as int8 rows with a float32 scale per row")
  ap.add_argument("--tokenizer", help="a tokenizer.json for the `tokenizers` package; byte-level tokens without it")
  ap.add_argument("--prompt", default="The quick brown fox")
  ap.add_argument("--max-new", type=int, default=32)
  ap.add_argument("--batch", type=int, default=1)
  ap.add_argument("--temperature", type=float, default=0.0); ap.add_argument("--top-k", type=int, default=0)
  ap.add_argument("--top-p", type=float, default=1.0); ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--smoke", action="store_true", help="tiny models: check the cached, jitted decode against a full recompute")
  a = ap.parse_args()
  if a.smoke: return smoke()
  base = GPT2 if a.model == "gpt2" else LLAMA
  given = dict(layers=a.layers, dim=a.dim, heads=a.heads, kv_heads=a.kv_heads, vocab=a.vocab, max_ctx=a.ctx)
  over = {k: v for k, v in given.items() if v is not None}
  c = Config(**{**base.__dict__, **over})
  dt: DType = getattr(dtypes, a.dtype)
  w = load_weights(a.weights, c) if a.weights else {k: Tensor(v) for k, v in random_weights(c, a.seed).items()}
  w = {k: v.cast(dt) for k, v in w.items()}
  tok = Tokenizer(a.tokenizer)
  ids = tok.encode(a.prompt)
  if max(ids) >= c.vocab: raise SystemExit(f"the prompt's token ids go up to {max(ids)}, past the vocabulary of {c.vocab}")
  model = Transformer(c, w, a.batch, quantize=a.quantize)
  print(f"{c.kind}: {c.layers} layers, d{c.dim}, {c.heads} heads ({c.n_kv} kv), vocab {c.vocab}, {a.quantize or a.dtype} weights, batch {a.batch}")
  sys.stdout.write(a.prompt)
  def stream(t: np.ndarray) -> None:
    sys.stdout.write(tok.decode([int(t[0])]))
    sys.stdout.flush()
  got, prefill, steps = generate(model, [ids] * a.batch, a.max_new, a.temperature, a.top_k, a.top_p, a.seed, stream)
  dec = float(np.median(steps[2:])) if len(steps) > 2 else float("nan")
  print(f"\nprefill {len(ids)} tokens: {prefill * 1e3:.1f} ms (first token); decode {dec * 1e3:.2f} ms/token (median after the capture), "
        f"{a.batch / dec:.1f} tokens/s")
  return 0


if __name__ == "__main__": sys.exit(main())
