import runpy
import subprocess
import sys
import types
from pathlib import Path

import pytest

from plugrad.nn.state import safe_load, safe_load_metadata

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_hello_kernel_runs_on_the_default_device(capsys):
  runpy.run_path(str(EXAMPLES / "hello_kernel.py"), run_name="__main__")
  assert "both kernels match numpy" in capsys.readouterr().out


def test_cli_lists_builtin_devices():
  out = subprocess.run([sys.executable, "-m", "plugrad", "devices"], capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  assert "PYTHON" in out.stdout and "PASS" in out.stdout


def test_gpt_char_smoke(tmp_path):
  """examples/gpt_char.py end to end in --smoke mode on the default device: a few JIT'd AdamW steps of a tiny GPT, a
  validation loss, a sample, the safetensors checkpoint reloaded into a fresh model with the same logits."""
  pytest.importorskip("tqdm", reason="the example needs tqdm (pip install tqdm)")
  weights = tmp_path / "gpt_char.safetensors"
  out = subprocess.run([sys.executable, str(EXAMPLES / "gpt_char.py"), "--smoke", "--weights", str(weights)], capture_output=True, text=True,
                       timeout=600)
  assert out.returncode == 0, out.stdout + out.stderr
  assert "standard-library source" in out.stdout and "val loss" in out.stdout and "sample:" in out.stdout
  assert "loss=" in out.stdout and "chars/s" in out.stdout  # the progress bar
  assert "same logits" in out.stdout
  sd = safe_load(weights)
  assert sd["tok.weight"].shape[1] == 32 and "blocks.0.qkv.weight" in sd and "vocab" in safe_load_metadata(weights)


def test_llm_smoke():
  """examples/llm.py --smoke: tiny GPT-2 and LLaMA-style models; greedy decoding through the KV cache under TinyJit (the
  position a bound Variable) gives the tokens a full pass over the sequence does, and nothing compiles after step 2."""
  out = subprocess.run([sys.executable, str(EXAMPLES / "llm.py"), "--smoke"], capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stdout + out.stderr
  assert "smoke: OK" in out.stdout and out.stdout.count("cached == recomputed: True") == 2
  assert out.stdout.count("programs compiled after step 2: 0") == 2


def _llm_module():
  import importlib.util
  spec = importlib.util.spec_from_file_location("llm_example", EXAMPLES / "llm.py")
  assert spec is not None and spec.loader is not None
  llm = sys.modules["llm_example"] = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(llm)
  return llm


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_llm_jitted_prefill_serves_every_length_of_its_bucket(kind):
  """The prefill runs padded to its length bucket under one TinyJit per bucket, the last real position picked by a
  bound Variable: every prompt length in the bucket gives the logits of an exact-length eager prefill, the replays
  compile nothing, and the decode after a padded prefill reads none of the padding's cache rows."""
  import numpy as np

  from plugrad import Tensor
  from plugrad.engine import realize as realize_mod
  llm = _llm_module()
  c = llm.SMOKE[kind]
  w = {k: Tensor(v * (20.0 if v.ndim == 2 else 1.0)) for k, v in llm.random_weights(c, 2).items()}
  def bucket(t: int, ctx: int) -> int: return llm.Transformer.bucket(types.SimpleNamespace(c=llm.Config(max_ctx=ctx)), t)
  assert [bucket(t, 1024) for t in (1, 2, 5, 8, 33, 64, 65, 130)] == [1, 2, 8, 8, 64, 64, 128, 192]
  assert [bucket(t, 48) for t in (33, 47, 48)] == [48, 48, 48]  # capped at the context
  m = llm.Transformer(c, w, 2)
  rng = np.random.default_rng(0)
  for i, T in enumerate((5, 6, 7, 8, 5)):
    toks = rng.integers(0, c.vocab, (2, T))
    want = llm.Transformer(c, w, 2)._step(Tensor(toks.astype(np.int32)), 0).numpy()
    before = len(realize_mod._runners)
    np.testing.assert_allclose(m(toks, 0), want, rtol=1e-4, atol=1e-4, err_msg=f"prompt length {T}")
    if i >= 2: assert len(realize_mod._runners) == before, f"prompt length {T}: the bucket's replay compiled a kernel"
  assert list(m.prefills) == [8] and m.prefills[8].captured is not None
  prompt = rng.integers(0, c.vocab, (2, 6))
  got, _, _ = llm.generate(m, prompt.tolist(), 6)
  assert (got == llm.recomputed(c, w, prompt.tolist(), got)).all()


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_llm_int8_weight_only(kind):
  """--quantize int8: every matrix stored as int8 rows (a quarter of float32's bytes) with a float32 scale per row; the
  logits stay within the rounding of the weights (half a step of each row's scale), cached jitted decoding gives the
  tokens a full pass of the same int8 model does, and the embeddings are looked up through the same rows."""
  import numpy as np

  from plugrad import Tensor, dtypes
  llm = _llm_module()
  c = llm.SMOKE[kind]
  w = {k: Tensor(v * (20.0 if v.ndim == 2 else 1.0)) for k, v in llm.random_weights(c, 4).items()}
  m8, mf = llm.Transformer(c, w, 2, quantize="int8"), llm.Transformer(c, w, 2)
  mats = [k for k, v in mf.w.items() if len(v.shape) == 2 and not k.endswith("wpe.weight")]
  assert mats and all(m8.w[k].dtype is dtypes.int8 and k in m8.scales for k in mats)
  for k in mats[:3]:  # the dequantized rows are the weights to within half a step
    step = m8.scales[k].numpy()[:, None]
    assert (np.abs(m8.W(k).numpy() - mf.W(k).numpy()) <= step / 2 + 1e-6).all()
  toks = np.random.default_rng(1).integers(0, c.vocab, (2, 7))
  # the int8 model computes what a float32 model with the dequantized weights computes (the scales after the reductions)
  for k in mats: mf.w[k] = m8.W(k).realize()
  np.testing.assert_allclose(m8(toks, 0), mf(toks, 0), rtol=2e-4, atol=2e-4)
  prompt = toks[:, :5].tolist()
  got, _, _ = llm.generate(m8, prompt, 6)
  assert (got == llm.recomputed(c, w, prompt, got, quantize="int8")).all()
  with pytest.raises(ValueError, match="quantize must be None or 'int8'"): llm.Transformer(c, w, 2, quantize="int4")


def test_llm_loads_a_gpt2_safetensors_and_samples(tmp_path):
  """A GPT-2 state dict in Hugging Face's names (`transformer.` prefix, Conv1D layouts) from a safetensors file,
  temperature/top-k/top-p sampling, streamed text and the tokens/s line."""
  import numpy as np

  from plugrad import Tensor
  from plugrad.nn.state import safe_save
  llm = _llm_module()
  c = llm.Config("gpt2", layers=1, dim=32, heads=2, vocab=260, max_ctx=32)
  path = tmp_path / "gpt2.safetensors"
  safe_save({"transformer." + k: Tensor(v) for k, v in llm.random_weights(c, 3).items()}, path)
  args = ["--weights", str(path), "--layers", "1", "--dim", "32", "--heads", "2", "--vocab", "260", "--ctx", "32", "--max-new", "6",
          "--temperature", "0.8", "--top-k", "20", "--top-p", "0.9", "--prompt", "hi"]
  out = subprocess.run([sys.executable, str(EXAMPLES / "llm.py"), *args], capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stdout + out.stderr
  assert "gpt2: 1 layers, d32" in out.stdout and "tokens/s" in out.stdout and "\nhi" in out.stdout
  bad = subprocess.run([sys.executable, str(EXAMPLES / "llm.py"), *args[:2], "--layers", "2", "--dim", "32", "--heads", "2", "--vocab", "260",
                        "--ctx", "32"], capture_output=True, text=True, timeout=600)
  assert bad.returncode != 0 and "missing ['h.1." in bad.stderr
  rng = np.random.default_rng(0)
  logits = rng.standard_normal((3, 50))
  assert (llm.sample(logits, 0.0, 0, 1.0, rng) == logits.argmax(-1)).all()
  assert (llm.sample(logits, 1.0, 1, 1.0, rng) == logits.argmax(-1)).all()     # top-k 1 is greedy
  assert (llm.sample(logits, 1.0, 0, 1e-6, rng) == logits.argmax(-1)).all()    # so is a tiny top-p
  assert set(llm.sample(np.zeros((200, 5)), 1.0, 2, 1.0, rng).tolist()) <= {0, 1, 2, 3, 4}
