"""plugrad.export: the digits CNN and an MLP exported as C (built with cc, run as separate processes that have no Python
at all) and as WebGPU (the plan in model.js run through wgpu-py, and model.js itself in headless Chromium), compared
with plugrad's own outputs."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from plugrad import Device, Tensor, TinyJit, Variable
from plugrad.export import ExportError, export_model
from plugrad.renderer.cstyle import CStyleRenderer
from tests.export import models

REPO = Path(__file__).resolve().parents[2]
HARNESS = r"""
/* The test harness: model_init(argv[1]), inputs from files, model_run_v with the variables given, outputs to files. */
#include <stdio.h>
#include <stdlib.h>
#include "model.h"
int main(int argc, char **argv) {
  void *in[MODEL_NUM_INPUTS + 1], *out[MODEL_NUM_OUTPUTS + 1];
  int64_t vars[MODEL_NUM_VARS + 1] = {0};
  int a = 2;
  if (argc != 2 + MODEL_NUM_INPUTS + MODEL_NUM_OUTPUTS + MODEL_NUM_VARS) { fprintf(stderr, "bad arguments\n"); return 2; }
  if (model_init(argv[1][0] == '-' ? NULL : argv[1]) != 0) { fprintf(stderr, "init: %s\n", model_error()); return 3; }
  for (int i = 0; i < MODEL_NUM_INPUTS; i++, a++) {
    FILE *f = fopen(argv[a], "rb");
    in[i] = malloc(model_input_bytes[i]);
    if (!f || fread(in[i], 1, model_input_bytes[i], f) != model_input_bytes[i]) return 4;
    fclose(f);
  }
  int first_out = a;
  a += MODEL_NUM_OUTPUTS;
  for (int i = 0; i < MODEL_NUM_VARS; i++) vars[i] = atoll(argv[a++]);
  for (int i = 0; i < MODEL_NUM_OUTPUTS; i++) out[i] = calloc(1, model_output_bytes[i]);
  for (int rep = 0; rep < 2; rep++)  /* twice: a run leaves nothing behind that changes the next */
    if (model_run_v((const void *const *)in, out, vars) != 0) { fprintf(stderr, "run: %s\n", model_error()); return 5; }
  for (int i = 0; i < MODEL_NUM_OUTPUTS; i++) {
    FILE *f = fopen(argv[first_out + i], "wb");
    if (!f || fwrite(out[i], 1, model_output_bytes[i], f) != model_output_bytes[i]) return 6;
    fclose(f);
  }
  model_free();
  return 0;
}
"""
CFLAGS = ["-O2", "-march=native", "-fwrapv", "-ffp-contract=off", "-fno-math-errno", "-fno-strict-aliasing"]  # the Makefile's


def cc() -> str:
  for name in ("cc", "gcc", "clang"):
    if (path := shutil.which(name)): return path
  pytest.skip("no C compiler")


def clean_env(**extra: str) -> dict[str, str]:
  """The environment of the exported program: no Python path, no plugrad settings."""
  return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **extra}


def build(out: Path, openmp: bool = False) -> Path:
  (out / "harness.c").write_text(HARNESS)
  exe = out / "harness"
  cmd = [cc(), *CFLAGS, *(["-fopenmp"] if openmp else []), "model.c", "harness.c", "-o", str(exe), "-lm"]
  res = subprocess.run(cmd, cwd=out, capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, f"{' '.join(cmd)}:\n{res.stderr[-4000:]}"
  return exe


def run_c(exe: Path, weights: str, inputs: list[np.ndarray], out_like: list[np.ndarray], vars: tuple[int, ...] = (),
          **env: str) -> list[np.ndarray]:
  d = exe.parent
  ins = [d / f"in{i}.bin" for i in range(len(inputs))]
  outs = [d / f"out{i}.bin" for i in range(len(out_like))]
  for p, x in zip(ins, inputs): np.ascontiguousarray(x).tofile(p)
  res = subprocess.run([str(exe), weights, *map(str, ins), *map(str, outs), *map(str, vars)], capture_output=True, text=True, timeout=120,
                       env=clean_env(**env), cwd=d)
  assert res.returncode == 0, f"exit {res.returncode}: {res.stderr}"
  return [np.fromfile(p, o.dtype)[:o.size].reshape(o.shape) for p, o in zip(outs, out_like)]


def same_c_math() -> bool:
  """Whether plugrad ran the very C the export holds (CPU_LLVM=0), so results must agree to the bit; on the LLVM path
  they are held to 1e-6 (the two compilers compute the interpreter's results, docs/export.md)."""
  return isinstance(Device["CPU"].renderer, CStyleRenderer)


def check(got: np.ndarray, want: np.ndarray) -> None:
  if same_c_math(): np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
  else: np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.fixture(autouse=True)
def eval_mode():
  Tensor.training = False
  yield


# ---- C

def test_c_digits_cnn_make_and_main_match_plugrad(tmp_path):
  model, x = models.digits_cnn(batch=4)
  want = model(Tensor(x)).numpy()
  e = export_model(model, Tensor(x), target="c", out_dir=tmp_path)
  assert {p.name for p in e.files} == {"model.c", "model.h", "main.c", "Makefile", "model.safetensors"}
  assert "plugrad" not in "".join(line for line in (tmp_path / "model.c").read_text().splitlines() if line.startswith("#include"))
  res = subprocess.run(["make", f"CC={cc()}"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stdout + res.stderr
  x.tofile(tmp_path / "x.bin")
  res = subprocess.run(["./model_main", "x.bin", "y.bin"], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=clean_env())
  assert res.returncode == 0, res.stderr
  check(np.fromfile(tmp_path / "y.bin", np.float32).reshape(want.shape), want)
  # the runner says what it wrote and, for float32 logits, the prediction: the argmax of each row
  line = res.stdout.strip()
  assert line.startswith(f"output 0 '{e.captured.outputs[0].name}': float32[4, 10] -> y.bin; argmax over the last axis"), line
  assert line.split(":")[-1].split() == [str(int(v)) for v in want.argmax(-1)], line
  # a missing weights file and one of another model are refused with the reason
  res = subprocess.run(["./model_main", "-w", "nope.safetensors", "x.bin", "y.bin"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
  assert res.returncode == 1 and "cannot open the weights file nope.safetensors" in res.stderr
  other, _ = models.mlp(batch=2, sizes=(8, 4))
  export_model(other, Tensor(np.zeros((2, 8), np.float32)), target="c", out_dir=tmp_path / "other")
  res = subprocess.run(["./model_main", "-w", "other/model.safetensors", "x.bin", "y.bin"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=60)
  assert res.returncode == 1 and "the weights file has no tensor 'bn1.running_var'" in res.stderr


def test_c_weights_file_is_safetensors_with_the_models_names(tmp_path):
  model, x = models.digits_cnn(batch=2)
  export_model(model, Tensor(x), target="c", out_dir=tmp_path)
  from plugrad.nn import get_state_dict
  from plugrad.nn.state import safe_load
  loaded = safe_load(tmp_path / "model.safetensors")
  state = {k: v for k, v in get_state_dict(model).items() if k != "bn1.num_batches_tracked" and "num_batches" not in k}
  assert set(loaded) == set(state)
  for k, t in state.items(): np.testing.assert_array_equal(loaded[k].numpy(), t.numpy())
  st = pytest.importorskip("safetensors.numpy")
  np.testing.assert_array_equal(st.load_file(str(tmp_path / "model.safetensors"))["conv1.weight"], state["conv1.weight"].numpy())


def test_c_mlp_embedded_weights_with_openmp(tmp_path):
  model, x = models.mlp(batch=64)
  want = model(Tensor(x)).numpy()
  e = export_model(model, Tensor(x), target="c", out_dir=tmp_path, embed_weights=True)
  assert not (tmp_path / "model.safetensors").exists() and "model_blob" in (tmp_path / "model.c").read_text()
  assert "#pragma omp parallel" in (tmp_path / "model.c").read_text(), "the 64x256x256 layer has a parallel loop"
  assert len(e.captured.weights) == 4
  got, = run_c(build(tmp_path), "-", [x], [want])
  check(got, want)
  got2, = run_c(build(tmp_path, openmp=True), "-", [x], [want], OMP_NUM_THREADS="2")
  np.testing.assert_array_equal(got2, got)  # each thread computes its own rows the same way


def test_c_symbolic_dimension_is_a_run_argument(tmp_path):
  n = Variable("n", 1, 16)
  full = np.random.default_rng(2).random((16, 8), dtype=np.float32)
  w = Tensor(np.random.default_rng(3).random((8, 4), dtype=np.float32))
  def f(x: Tensor) -> Tensor: return ((x @ w).relu() + 1).contiguous()
  e = export_model(f, Tensor(full).shrink(((0, n.bind(5)), None)), target="c", out_dir=tmp_path)
  assert [(v.name, v.lo, v.hi, v.value) for v in e.captured.vars] == [("n", 1, 16, 5)]
  assert "int model_run(const void *const *inputs, void *const *outputs, int32_t n);" in (tmp_path / "model.h").read_text()
  exe = build(tmp_path)
  out_like = np.zeros((16, 4), np.float32)
  for k in (1, 5, 16):
    got, = run_c(exe, str(tmp_path / "model.safetensors"), [full], [out_like], vars=(k,))
    want = f(Tensor(full[:k])).numpy()  # plugrad on the concrete rows
    np.testing.assert_allclose(got[:k], want, rtol=0, atol=1e-6)
  res = subprocess.run([str(exe), str(tmp_path / "model.safetensors"), str(tmp_path / "in0.bin"), str(tmp_path / "out0.bin"), "17"],
                       capture_output=True, text=True, timeout=60)
  assert res.returncode == 5 and "variable n = 17 is outside [1, 16]" in res.stderr


# ---- errors

def test_export_refuses_what_it_cannot_write_with_the_reason(tmp_path):
  x = Tensor(np.ones((2, 3), np.float32))
  w = Tensor(np.ones((3,), np.float32)).realize()
  with pytest.raises(ExportError, match="target must be one of 'c', 'webgpu', got 'cuda'"):
    export_model(lambda t: t + 1, x, target="cuda", out_dir=tmp_path)
  with pytest.raises(ExportError, match="output 1 of .* is a tensor the function does not compute"):
    export_model(lambda t: ((t + 1).contiguous(), w), x, target="c", out_dir=tmp_path)
  with pytest.raises(ExportError, match="embed_weights is for target='c'"):
    export_model(lambda t: t + 1, x, target="webgpu", out_dir=tmp_path, embed_weights=True)
  with pytest.raises(ExportError, match="needs a function, a model object or a TinyJit, got int"): export_model(3, x, out_dir=tmp_path)


def test_a_tinyjit_is_captured_anew_on_the_example_inputs(tmp_path):
  f = TinyJit(lambda t: (t * 2 + 1).contiguous())
  for _ in range(3): f(Tensor(np.zeros((3,), np.float32)))
  x = np.arange(5, dtype=np.float32)
  e = export_model(f, Tensor(x), target="c", out_dir=tmp_path)
  assert e.captured.inputs[0].nbytes == 20 and e.captured.inputs[0].name == "t"
  got, = run_c(build(tmp_path), "-", [x], [x])
  np.testing.assert_array_equal(got, x * 2 + 1)


# ---- WebGPU

@pytest.fixture
def webgpu():
  pytest.importorskip("wgpu", reason="wgpu is not installed (pip install wgpu)")
  if (why := Device.manager.probe("WEBGPU")) is not None: pytest.skip(f"no WEBGPU device here: {why}")


def test_webgpu_digits_cnn_plan_through_wgpu_matches_plugrad(tmp_path, webgpu):
  from tests.export.wgpu_plan import run_plan
  model, x = models.digits_cnn("WEBGPU", batch=4)
  want = model(Tensor(x, device="WEBGPU")).numpy()
  e = export_model(model, Tensor(x, device="WEBGPU"), target="webgpu", out_dir=tmp_path)
  assert {p.name for p in e.files} == {"model.js", "index.html", "model.safetensors"}
  got = np.frombuffer(run_plan(tmp_path, [x.tobytes()])[0], np.float32).reshape(want.shape)
  np.testing.assert_array_equal(got, want)  # the same WGSL on the same kind of adapter
  cpu_model, _ = models.digits_cnn("CPU", batch=4)
  np.testing.assert_allclose(got, cpu_model(Tensor(x)).numpy(), rtol=1e-5, atol=1e-6)


def test_webgpu_symbolic_dimension_through_wgpu(tmp_path, webgpu):
  from tests.export.wgpu_plan import run_plan
  n = Variable("n", 1, 64)
  full = np.random.default_rng(4).random((64, 8), dtype=np.float32)
  w = Tensor(np.random.default_rng(5).random((8, 8), dtype=np.float32), device="WEBGPU")
  def f(x: Tensor) -> Tensor: return (x @ w).relu().sum(1).contiguous()
  e = export_model(f, Tensor(full, device="WEBGPU").shrink(((0, n.bind(7)), None)), target="webgpu", out_dir=tmp_path)
  assert [v.name for v in e.captured.vars] == ["n"]
  for k in (7, 1, 64):
    got = np.frombuffer(run_plan(tmp_path, [full.tobytes()], {"n": k})[0], np.float32)[:k]
    want = f(Tensor(full[:k], device="WEBGPU")).numpy()  # plugrad on the concrete rows
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _chromium(tmp_path: Path, x: np.ndarray) -> tuple[np.ndarray, str]:
  from tests.export.browser import BrowserUnavailable, run_in_chromium
  try: outs, adapter = run_in_chromium(tmp_path, [x.tobytes()])
  except BrowserUnavailable as e: pytest.skip(f"no browser with WebGPU here: {e}")
  return np.frombuffer(outs[0], np.float32), adapter


def test_webgpu_mlp_in_headless_chromium(tmp_path, webgpu):
  # with softmax: its max starts from -inf, which Tint (Chromium's WGSL compiler) checks more strictly than naga
  model, x = models.mlp("WEBGPU", batch=8, sizes=(64, 32, 10), softmax=True)
  want = model(Tensor(x, device="WEBGPU")).numpy()
  export_model(model, Tensor(x, device="WEBGPU"), target="webgpu", out_dir=tmp_path)
  got, adapter = _chromium(tmp_path, x)
  print(f"Chromium's adapter: {adapter}")
  np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-6)  # another WGSL compiler (Tint) and adapter


def test_webgpu_digits_cnn_in_headless_chromium(tmp_path, webgpu):
  model, x = models.digits_cnn("WEBGPU", batch=2)
  want = model(Tensor(x, device="WEBGPU")).numpy()
  export_model(model, Tensor(x, device="WEBGPU"), target="webgpu", out_dir=tmp_path)
  got, _ = _chromium(tmp_path, x)
  np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-5, atol=1e-6)


def test_c_target_refuses_a_capture_on_webgpu(tmp_path, webgpu):
  with pytest.raises(ExportError, match="target='c'.* needs the model on the CPU device .* captured on WEBGPU"):
    export_model(lambda t: (t + 1).contiguous(), Tensor(np.ones(4, np.float32), device="WEBGPU"), target="c", out_dir=tmp_path)


# ---- the command line and the example

def test_cli_exports_script_func(tmp_path):
  res = subprocess.run([sys.executable, "-m", "plugrad", "export", f"{REPO / 'tests/export/models.py'}:mlp_for_cli", "--target", "c",
                        "--out", str(tmp_path)], capture_output=True, text=True, timeout=600, cwd=REPO)
  assert res.returncode == 0, res.stdout + res.stderr
  assert "model.c" in res.stdout and (tmp_path / "model.h").exists()
  bad = subprocess.run([sys.executable, "-m", "plugrad", "export", "nofile.py:f", "--target", "c", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
  assert bad.returncode == 2 and "nofile.py" in bad.stderr


def test_example_exports_the_digits_cnn(tmp_path):
  pytest.importorskip("sklearn", reason="the example needs scikit-learn")
  pytest.importorskip("tqdm", reason="the example needs tqdm")
  res = subprocess.run([sys.executable, str(REPO / "examples/export_digits.py"), "--train-steps", "3", "--batch", "2", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
  assert res.returncode == 0, res.stdout + res.stderr
  assert "C: 6 kernel launches" in res.stdout and (tmp_path / "c" / "model.c").exists() and (tmp_path / "c" / "digit.bin").exists()
  assert "WebGPU:" in res.stdout
  # the exported sample is classified correctly (3 steps of training get far more than 2 of the held-out digits right),
  # and the built runner prints that prediction
  samples = [ln for ln in res.stdout.splitlines() if ln.strip().startswith("sample: held-out digit")]
  assert len(samples) == 2 and not any("misclassified" in s for s in samples), res.stdout
  labels = np.fromfile(tmp_path / "c" / "label.bin", np.int32).tolist()
  assert [int(s.split("label ")[1].split(",")[0]) for s in samples] == labels
  assert subprocess.run(["make", f"CC={cc()}"], cwd=tmp_path / "c", capture_output=True, text=True, timeout=300).returncode == 0
  run = subprocess.run(["./model_main", "digit.bin", "logits.bin"], cwd=tmp_path / "c", capture_output=True, text=True, timeout=120, env=clean_env())
  assert run.returncode == 0 and run.stdout.strip().split(":")[-1].split() == [str(y) for y in labels], run.stdout + run.stderr
