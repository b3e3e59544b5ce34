"""LLM inference: plugrad's examples/llm.py (KV cache, TinyJit decode over a symbolic position) next to Hugging Face
`generate(use_cache=True)` (when `transformers` is installed) and a plain PyTorch loop with a KV cache written below,
same weights (random, GPT-2's initialization), same prompt, greedy decoding, same thread count. One line per cell:

  prefill   the prompt (--prompt-len tokens) to the first token's logits: plugrad's first call (compiles included) and
            a warm one (the third call of that length: its JIT capture replayed); PyTorch's warm
  decode    ms per generated token (median over --tokens steps after plugrad's JIT capture; Hugging Face's as
            (time for N tokens - time for 1) / (N - 1)), tokens/s at that batch
  GB/s      weight bytes read per decode step (every matrix once: the embedding is a gather, GPT-2's LM head is wte)
            / plugrad's decode time, against a STREAM triad measured in the same run (bench/stream_triad.c)

  python bench/llm.py [--models gpt2,llama] [--batch 1,8] [--dtypes float32,bfloat16,int8] [--tokens 32] [--prompt-len 32]
                      [--threads N] [--quick]

The models: gpt2 is GPT-2 small (12 layers, d768, 12 heads, vocab 50257); llama a ~100M LLaMA-style config (12 layers,
d768, 12 heads / 4 kv heads, SwiGLU 2048, vocab 32000). bfloat16 stores the weights in bfloat16 (plugrad computes in
float32; PyTorch and Hugging Face run in bfloat16); int8 (not in the default list) is plugrad's int8 weight-only
model (examples/llm.py --quantize int8: int8 rows, a float32 scale per row) next to the peers in float32. A first
check decodes the same tokens with each framework at float32 and prints how many agree. --quick shrinks every shape
(a smoke test of the script, not a benchmark).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

from plugrad import Tensor, dtypes

HERE = os.path.dirname(os.path.abspath(__file__))


def _example() -> Any:
  """examples/llm.py (the model, its weights and the generation loop) as module `llm_example`."""
  spec = importlib.util.spec_from_file_location("llm_example", os.path.join(os.path.dirname(HERE), "examples", "llm.py"))
  if spec is None or spec.loader is None: raise ImportError("examples/llm.py is missing")
  mod = sys.modules["llm_example"] = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


llm = _example()

MODELS = {"gpt2": llm.GPT2, "llama": llm.LLAMA}
QUICK = {"gpt2": llm.Config("gpt2", layers=2, dim=128, heads=4, vocab=1000, max_ctx=128),
         "llama": llm.Config("llama", layers=2, dim=128, heads=4, kv_heads=2, vocab=1000, max_ctx=128, norm_eps=1e-6)}


# ---------------------------------------------------------------- PyTorch: a plain loop with a KV cache

def torch_decoder(c: Any, w: dict[str, np.ndarray], batch: int, dtype: str):
  """The same model in PyTorch ops over the same weights: step(tokens (B, T) LongTensor, start_pos) -> last logits."""
  import torch
  import torch.nn.functional as F
  tdt = getattr(torch, dtype)
  W = {k: torch.from_numpy(v).to(tdt) for k, v in w.items()}
  hd = c.head_dim
  ck = [torch.zeros(batch, c.n_kv, c.max_ctx, hd, dtype=tdt) for _ in range(c.layers)]
  cv = [torch.zeros(batch, c.n_kv, c.max_ctx, hd, dtype=tdt) for _ in range(c.layers)]
  if c.kind == "llama":
    inv = 1.0 / (c.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = torch.outer(torch.arange(c.max_ctx, dtype=torch.float64), inv)
    cos, sin = (torch.cat([t, t], -1).to(tdt) for t in (ang.cos(), ang.sin()))
  def attend(i: int, q, k, v, sp: int, T: int):
    ck[i][:, :, sp:sp + T], cv[i][:, :, sp:sp + T] = k, v
    keys, vals = ck[i][:, :, :sp + T], cv[i][:, :, :sp + T]
    if c.n_kv != c.heads: keys, vals = (t.repeat_interleave(c.heads // c.n_kv, dim=1) for t in (keys, vals))
    return F.scaled_dot_product_attention(q, keys, vals, is_causal=T > 1)
  @torch.no_grad()
  def step(tokens, sp: int):
    B, T = tokens.shape
    def heads(t, n: int): return t.view(B, T, n, hd).transpose(1, 2)
    if c.kind == "gpt2":
      x = W["wte.weight"][tokens] + W["wpe.weight"][sp:sp + T]
      for i in range(c.layers):
        p = f"h.{i}."
        h = F.layer_norm(x, (c.dim,), W[p + "ln_1.weight"], W[p + "ln_1.bias"], c.norm_eps)
        q, k, v = (heads(t, c.heads) for t in (h @ W[p + "attn.c_attn.weight"] + W[p + "attn.c_attn.bias"]).chunk(3, -1))
        x = x + attend(i, q, k, v, sp, T).transpose(1, 2).reshape(B, T, c.dim) @ W[p + "attn.c_proj.weight"] + W[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (c.dim,), W[p + "ln_2.weight"], W[p + "ln_2.bias"], c.norm_eps)
        up = F.gelu(h @ W[p + "mlp.c_fc.weight"] + W[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + up @ W[p + "mlp.c_proj.weight"] + W[p + "mlp.c_proj.bias"]
      return F.layer_norm(x[:, -1], (c.dim,), W["ln_f.weight"], W["ln_f.bias"], c.norm_eps) @ W["wte.weight"].T
    def rms(t, g): return t * torch.rsqrt(t.float().pow(2).mean(-1, keepdim=True) + c.norm_eps).to(t.dtype) * g
    def rope(t):
      cs, sn = cos[sp:sp + T], sin[sp:sp + T]
      return t * cs + torch.cat([-t[..., hd // 2:], t[..., :hd // 2]], -1) * sn
    x = W["model.embed_tokens.weight"][tokens]
    for i in range(c.layers):
      p = f"model.layers.{i}."
      h = rms(x, W[p + "input_layernorm.weight"])
      q, k, v = (heads(F.linear(h, W[p + f"self_attn.{n}_proj.weight"]), m) for n, m in (("q", c.heads), ("k", c.n_kv), ("v", c.n_kv)))
      x = x + F.linear(attend(i, rope(q), rope(k), v, sp, T).transpose(1, 2).reshape(B, T, -1), W[p + "self_attn.o_proj.weight"])
      h = rms(x, W[p + "post_attention_layernorm.weight"])
      x = x + F.linear(F.silu(F.linear(h, W[p + "mlp.gate_proj.weight"])) * F.linear(h, W[p + "mlp.up_proj.weight"]), W[p + "mlp.down_proj.weight"])
    return rms(x[:, -1], W["model.norm.weight"]) @ W["lm_head.weight"].T
  return step


def torch_generate(step, prompt: np.ndarray, n: int) -> tuple[np.ndarray, float, list[float]]:
  import torch
  toks = torch.from_numpy(prompt)
  st = time.perf_counter()
  nxt = step(toks, 0).float().argmax(-1)
  prefill, out, steps = time.perf_counter() - st, [nxt], []
  for i in range(n - 1):
    st = time.perf_counter()
    nxt = step(nxt[:, None], prompt.shape[1] + i).float().argmax(-1)
    steps.append(time.perf_counter() - st)
    out.append(nxt)
  return torch.stack(out, 1).numpy(), prefill, steps


# ---------------------------------------------------------------- Hugging Face

def hf_model(c: Any, w: dict[str, np.ndarray], dtype: str):
  import torch
  import transformers as tf
  tf.logging.set_verbosity_error()  # its notes on generation settings (no eos within a random vocabulary, ...)
  if c.kind == "gpt2":
    cfg = tf.GPT2Config(n_layer=c.layers, n_embd=c.dim, n_head=c.heads, vocab_size=c.vocab, n_positions=c.max_ctx, n_inner=c.ffn,
                        layer_norm_epsilon=c.norm_eps, activation_function="gelu_new", resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
    m = tf.GPT2LMHeadModel(cfg)
    sd = {"transformer." + k: torch.from_numpy(v) for k, v in w.items()} | {"lm_head.weight": torch.from_numpy(w["wte.weight"])}
  else:
    cfg = tf.LlamaConfig(hidden_size=c.dim, intermediate_size=c.ffn, num_hidden_layers=c.layers, num_attention_heads=c.heads,
                         num_key_value_heads=c.n_kv, vocab_size=c.vocab, max_position_embeddings=c.max_ctx, rms_norm_eps=c.norm_eps,
                         rope_theta=c.rope_theta, tie_word_embeddings=False)
    m = tf.LlamaForCausalLM(cfg)
    sd = {k: torch.from_numpy(v) for k, v in w.items()}
  missing, _ = m.load_state_dict(sd, strict=False)
  if [k for k in missing if not k.endswith("attn.bias") and not k.endswith("masked_bias")]: raise RuntimeError(f"HF weights missing: {missing[:4]}")
  return m.to(getattr(torch, dtype)).eval()


def hf_generate(m, prompt: np.ndarray, n: int) -> tuple[np.ndarray, float, float]:
  """Greedy generate with the cache: the new tokens, the time for 1 token (prefill) and the decode time per token."""
  import torch
  ids = torch.from_numpy(prompt)
  def run(k: int):
    st = time.perf_counter()
    with torch.no_grad():
      out = m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=k, min_new_tokens=k, do_sample=False, use_cache=True,
                       pad_token_id=0)
    return out, time.perf_counter() - st
  run(2)  # warm-up
  _, t1 = run(1)
  out, tn = run(n)
  return out[:, prompt.shape[1]:].numpy(), t1, (tn - t1) / (n - 1)


# ---------------------------------------------------------------- the run

def stream_triad(threads: int) -> float | str:
  """bench/stream_triad.c's triad (median GB/s) on this machine, or why not."""
  cc = next((p for p in ("cc", "gcc", "clang") if subprocess.run(["which", p], capture_output=True).returncode == 0), None)
  if cc is None: return "no C compiler"
  with tempfile.TemporaryDirectory() as d:
    exe = os.path.join(d, "triad")
    res = subprocess.run([cc, "-O3", "-march=native", os.path.join(HERE, "stream_triad.c"), "-o", exe, "-lpthread"], capture_output=True, text=True)
    if res.returncode != 0: return f"cc failed: {res.stderr.strip()[:100]}"
    out = subprocess.run([exe, str(1 << 24), str(threads), "10"], capture_output=True, text=True, timeout=120).stdout
  m = re.search(r"triad_median=([\d.]+)", out)
  return float(m.group(1)) if m else f"stream_triad printed {out[:80]!r}"


def weight_bytes(c: Any, itemsize: int) -> int:
  """Bytes of the matrices a decode step reads (the embedding is one gathered row; GPT-2's LM head is wte)."""
  skip = {"wpe.weight", "model.embed_tokens.weight"}
  return sum(int(np.prod(s)) for k, s in llm.weight_shapes(c).items() if k not in skip) * itemsize


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--models", default="gpt2,llama"); ap.add_argument("--batch", default="1,8")
  ap.add_argument("--dtypes", default="float32,bfloat16")
  ap.add_argument("--tokens", type=int, default=32); ap.add_argument("--prompt-len", type=int, default=32)
  ap.add_argument("--threads", type=int, default=os.cpu_count() or 1); ap.add_argument("--quick", action="store_true")
  ap.add_argument("--cell", help=argparse.SUPPRESS)  # MODEL,DTYPE,BATCH,TRIAD: one cell, in the subprocess the run starts
  a = ap.parse_args()
  if a.cell is not None:
    name, dt, b, tr = a.cell.split(",")
    return cell(a, name, dt, int(b), float(tr) if tr != "-" else None)
  have_torch, have_hf = (importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))
  if have_torch:
    import torch
    torch.set_num_threads(a.threads)
  triad = stream_triad(a.threads)
  print(f"threads {a.threads}; STREAM triad {triad if isinstance(triad, str) else f'{triad:.1f} GB/s'}; "
        f"peers: {'PyTorch ' + torch.__version__ if have_torch else 'no torch'}, "
        f"{'transformers ' + __import__('transformers').__version__ if have_hf else 'no transformers (pip install transformers)'}")
  # each cell in a process of its own: three frameworks' copies of the weights and every compiled kernel of a cell stay
  # out of the next one's memory (a single process running all cells hit an LLVM JIT relocation assertion)
  base = [sys.executable, os.path.abspath(__file__), "--tokens", str(a.tokens), "--prompt-len", str(a.prompt_len), "--threads", str(a.threads)]
  for name in a.models.split(","):
    for dt in a.dtypes.split(","):
      for b in a.batch.split(","):
        res = subprocess.run([*base, *(["--quick"] if a.quick else []), "--cell", f"{name},{dt},{b},{triad if isinstance(triad, float) else '-'}"],
                             capture_output=True, text=True)
        out = res.stdout.strip() or f"{name:<5} {dt:<8} batch {b}: failed (exit {res.returncode}): {res.stderr.strip()[-300:]}"
        print(out, flush=True)
  return 0


def cell(a: argparse.Namespace, name: str, dt: str, B: int, triad: float | None) -> int:
  have_torch, have_hf = (importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))
  if have_torch:
    import torch
    torch.set_num_threads(a.threads)
  n, T = (8, 8) if a.quick else (a.tokens, a.prompt_len)
  c = (QUICK if a.quick else MODELS)[name]
  w = llm.random_weights(c, 0)
  rng = np.random.default_rng(1)
  prompt = rng.integers(0, min(c.vocab, 256), (B, T))
  # int8: weight-only int8 rows with float32 scales (examples/llm.py --quantize int8); its peers run in float32
  quant, store = ("int8", "float32") if dt == "int8" else (None, dt)
  model = llm.Transformer(c, {k: Tensor(v).cast(getattr(dtypes, store)) for k, v in w.items()}, B, quantize=quant)
  st = time.perf_counter()
  model(prompt, 0)
  first = time.perf_counter() - st
  model(prompt, 0)  # the prefill's JIT captures on its second call: the warm figure (in generate) is a replay
  got, warm, steps = llm.generate(model, prompt.tolist(), n)
  dec = float(np.median(steps[2:]))
  gbs = weight_bytes(c, {"float32": 4, "int8": 1}.get(dt, 2)) / dec / 1e9
  line = (f"{name:<5} {dt:<8} batch {B}: plugrad prefill {first:6.2f} s first, {warm * 1e3:7.1f} ms warm; decode {dec * 1e3:7.2f} ms/token "
          f"({B / dec:6.1f} tok/s, {gbs:5.1f} GB/s{f', {gbs / triad:.2f}x triad' if isinstance(triad, float) else ''})")
  if have_torch:
    tstep = torch_decoder(c, w, B, store)
    torch_generate(tstep, prompt, 3)  # warm-up
    tg, tpre, tsteps = torch_generate(tstep, prompt, n)
    tdec = float(np.median(tsteps[2:]))
    line += f" | torch loop prefill {tpre * 1e3:7.1f} ms, decode {tdec * 1e3:7.2f} ms ({dec / tdec:.2f}x)"
    if dt == "float32": line += f", tokens agree {int((tg == got).sum())}/{got.size}"
  if have_hf:
    hg, hpre, hdec = hf_generate(hf_model(c, w, store), prompt, n)
    line += f" | HF generate prefill {hpre * 1e3:7.1f} ms, decode {hdec * 1e3:7.2f} ms ({dec / hdec:.2f}x)"
    if dt == "float32": line += f", tokens agree {int((hg == got).sum())}/{got.size}"
  print(line, flush=True)
  return 0


if __name__ == "__main__": sys.exit(main())
