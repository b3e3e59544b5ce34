"""Symbolic shapes (issue 33): bound Variables through movement ops, slicing, `__setitem__` and `assign` into views of
a realized buffer, reductions and softmax over a symbolic axis; each compared with the same ops at the concrete size,
on CPU, PYTHON and WEBGPU, and each a single kernel family (no new program for a new value). A JIT-captured decode
loop serves 100 positions with one capture. The CPU's C path is rerun in a subprocess (CPU_LLVM=0)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from plugrad import Tensor, TinyJit, Variable
from plugrad.engine import realize as realize_mod
from plugrad.uop.ops import UOpError

RNG = np.random.default_rng(33)


def _webgpu() -> str | None:
  try:
    from plugrad_webgpu.context import probe
  except ImportError: return "plugrad-webgpu is not installed"
  return probe()


DEVICES = ["CPU", "PYTHON", pytest.param("WEBGPU", marks=pytest.mark.skipif(bool(_webgpu()), reason=f"no WEBGPU here: {_webgpu()}"))]


def rand(*shape: int) -> np.ndarray: return RNG.standard_normal(shape).astype(np.float32)


def programs() -> int: return len(realize_mod._runners)


def each_value(device: str, values: tuple[int, ...], fn, want) -> None:
  """fn(tensor-on-device inputs, bound n) against want(numpy, k) for each k; the values after the first add no program."""
  seen = None
  for k in values:
    np.testing.assert_allclose(fn(k), want(k), rtol=1e-5, atol=1e-5, err_msg=f"n={k} on {device}")
    if seen is not None: assert programs() == seen, f"n={k} on {device} compiled {programs() - seen} new programs"
    seen = programs()


@pytest.mark.parametrize("device", DEVICES)
def test_movement_ops_on_a_symbolic_axis(device):
  n = Variable("n", 1, 24)
  a = rand(24, 6)
  x = Tensor(a, device=device).realize()
  def fn(k: int) -> np.ndarray:
    v = x.shrink(((0, n.bind(k)), None))                       # (n, 6)
    r = v.reshape(n.bind(k), 2, 3).permute(2, 0, 1)            # (3, n, 2)
    p = r.pad((None, (1, 2), None)).flip(2)                    # (3, n+3, 2)
    e = p.sum(1, keepdim=True).expand(3, 4, 2)                 # a reduction over the symbolic axis, broadcast back
    return (e.sum(1) + p.max(1)).numpy()
  def want(k: int) -> np.ndarray:
    p = np.pad(a[:k].reshape(k, 2, 3).transpose(2, 0, 1), ((0, 0), (1, 2), (0, 0)))[:, :, ::-1]
    return 4 * p.sum(1) + p.max(1)
  each_value(device, (5, 11, 1, 24), fn, want)


@pytest.mark.parametrize("device", DEVICES)
def test_softmax_and_attention_over_a_symbolic_key_length(device):
  n = Variable("n", 1, 40)
  q, kv = rand(2, 8), rand(40, 8)
  qt, kvt = Tensor(q, device=device).realize(), Tensor(kv, device=device).realize()
  def fn(k: int) -> np.ndarray:
    keys = kvt[0:n.bind(k)]                                    # a slice with a Variable bound
    s = (qt @ keys.T).softmax(-1)
    return np.concatenate([(s @ keys).numpy(), keys.mean(0, keepdim=True).numpy()])
  def want(k: int) -> np.ndarray:
    sc = q @ kv[:k].T
    e = np.exp(sc - sc.max(-1, keepdims=True))
    return np.concatenate([(e / e.sum(-1, keepdims=True)) @ kv[:k], kv[:k].mean(0, keepdims=True)])
  each_value(device, (3, 17, 40, 1), fn, want)


@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_over_a_symbolic_key_length(device):
  n = Variable("n", 1, 32)
  q, k_, v_ = rand(1, 2, 1, 8), rand(1, 2, 32, 8), rand(1, 2, 32, 8)
  qt, kt, vt = (Tensor(a, device=device).realize() for a in (q, k_, v_))
  def fn(k: int) -> np.ndarray:
    b = n.bind(k)
    return qt.scaled_dot_product_attention(kt[:, :, :b], vt[:, :, :b]).numpy()
  def want(k: int) -> np.ndarray:
    sc = q @ k_[:, :, :k].transpose(0, 1, 3, 2) / np.sqrt(8)
    e = np.exp(sc - sc.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ v_[:, :, :k]
  each_value(device, (4, 9, 32), fn, want)


@pytest.mark.parametrize("device", DEVICES)
def test_assign_into_a_shrink_view_symbolic_and_concrete(device):
  p = Variable("start_pos", 1, 7)
  base = rand(2, 1, 8, 2, 3)
  kv = rand(2, 1, 1, 2, 3)
  for pos in (3, 1, 7):
    want = base.copy()
    want[:, :, pos] = kv[:, :, 0]
    for sym in (True, False):
      cache = Tensor(base, device=device).contiguous().realize()
      start = p.bind(pos) if sym else pos
      old = cache + 0                                           # built from the old contents: keeps them
      cache.shrink((None, None, (start, start + 1), None, None)).assign(Tensor(kv, device=device))  # written at once
      np.testing.assert_array_equal(cache.numpy(), want)
      np.testing.assert_array_equal(old.numpy(), base)


@pytest.mark.parametrize("device", DEVICES)
def test_setitem_with_variable_bounds(device):
  p = Variable("start_pos", 0, 9)
  base = rand(1, 2, 10, 4)
  cache = Tensor(base, device=device).contiguous().realize()
  want = base.copy()
  seen = None
  for pos in (0, 4, 9, 5):
    row = rand(1, 2, 1, 4)
    sp = p.bind(pos)
    cache[:, :, sp:sp + 1] = Tensor(row, device=device)
    want[:, :, pos:pos + 1] = row
    np.testing.assert_array_equal(cache.numpy(), want)
    if seen is not None: assert programs() == seen
    seen = programs()
  cache[0, 1, p.bind(2)] = 5.0                                  # a Variable as an int index, a Python value broadcast
  want[0, 1, 2] = 5.0
  cache[:, :, 3:5] = Tensor(rand(1, 1, 2, 4), device=device) * 0 + 1  # concrete bounds into a realized tensor: in place too
  want[:, :, 3:5] = 1
  np.testing.assert_array_equal(cache.numpy(), want)


@pytest.mark.parametrize("device", DEVICES)
def test_creation_ops_sized_by_a_variable(device):
  n = Variable("n", 1, 16)
  a = rand(16, 3)
  x = Tensor(a, device=device).realize()
  def fn(k: int) -> np.ndarray:
    b = n.bind(k)
    ones = Tensor.ones(b, 3, device=device)                     # a buffer for the largest n, of which n rows are used
    ramp = Tensor.arange(b, device=device).float().reshape(b, 1)
    filled = Tensor.full((b, 1), 2.0, device=device, buffer=False)
    return ((x[:b] * ones + ramp * filled).sum(0) + Tensor.arange(1, b + 1, device=device).float().sum()).numpy()
  def want(k: int) -> np.ndarray: return (a[:k] + 2.0 * np.arange(k)[:, None]).sum(0) + np.arange(1, k + 1).sum()
  each_value(device, (4, 16, 1, 9), fn, want)
  with pytest.raises(TypeError, match="int start and step 1"): Tensor.arange(0, n.bind(3), 2)
  with pytest.raises(ValueError, match="a shape must be ints >= 0 or bound Variables"): Tensor.zeros(n.bind(3), -1)


def test_reshape_and_permute_views_are_writable():
  base = np.zeros((4, 6), np.float32)
  t = Tensor(base).contiguous().realize()
  t.reshape(2, 2, 6)[1].T.assign(Tensor(np.arange(12, dtype=np.float32).reshape(6, 2))).realize()
  want = base.copy()
  want.reshape(2, 2, 6)[1] = np.arange(12, dtype=np.float32).reshape(6, 2).T
  np.testing.assert_array_equal(t.numpy(), want)
  t[1:3, ::-1] = Tensor(np.arange(12, dtype=np.float32).reshape(2, 6))  # a flipped view
  want[1:3, ::-1] = np.arange(12, dtype=np.float32).reshape(2, 6)
  np.testing.assert_array_equal(t.numpy(), want)


def test_out_of_range_values_and_bad_views_are_typed_errors():
  n = Variable("n", 1, 8)
  with pytest.raises(UOpError, match=r"value 9 is out of the range \[1, 8\] of Variable 'n'"): n.bind(9)
  x = Tensor(rand(8, 3)).realize()
  with pytest.raises(IndexError, match="can run past dim 0 of size 6"): x[:6][0:n.bind(2)]
  with pytest.raises(IndexError, match="can be out of range for dim 0"): Tensor(rand(4, 3)).realize()[n.bind(2)]
  with pytest.raises(IndexError, match="needs step 1"): x[0:n.bind(4):2]
  with pytest.raises(IndexError, match="negative bounds"): x[-1:n.bind(4)]
  with pytest.raises(IndexError, match="stop can be below its start"): x[Variable("m", 0, 7).bind(5):n.bind(2)]
  with pytest.raises(ValueError, match="assign to a view through EXPAND"): x[:1].expand(4, 3).assign(Tensor(rand(4, 3)))
  with pytest.raises(IndexError, match="no tensor or list indices"): x[[0, 1], 0:Variable("w", 1, 3).bind(2)] = 1.0


def _decode_step(x: Tensor, sp, ws: list[Tensor], ck: Tensor, cv: Tensor) -> Tensor:
  """One attention decode step: write this position's key and value into the caches, attend over positions 0..sp."""
  H, hd = ck.shape[1], ck.shape[3]
  q, k, v = ((x @ w).reshape(1, 1, H, hd).permute(0, 2, 1, 3) for w in ws)
  ck[:, :, sp:sp + 1] = k
  cv[:, :, sp:sp + 1] = v
  att = (q @ ck[:, :, :sp + 1].transpose(-1, -2) / float(np.sqrt(hd))).softmax(-1)
  return (att @ cv[:, :, :sp + 1]).permute(0, 2, 1, 3).reshape(1, H * hd).contiguous()


@pytest.mark.parametrize("device", ["CPU", "PYTHON"])
def test_jit_decode_loop_one_capture_for_100_positions(device):
  D, H, L, steps = 16, 2, 128, 100 if device == "CPU" else 24
  ws = [Tensor(rand(D, D) * 0.3, device=device).realize() for _ in range(3)]
  xs = [Tensor(rand(1, D), device=device).realize() for _ in range(steps)]
  sv = Variable("start_pos", 0, L - 1)
  def caches() -> tuple[Tensor, Tensor]: return tuple(Tensor.zeros(1, H, L, D // H, device=device).contiguous().realize() for _ in range(2))  # type: ignore[return-value]
  jk, jv = caches()
  step = TinyJit(lambda x, sp: _decode_step(x, sp, ws, jk, jv))
  jitted, counts = [], []
  for p in range(steps):
    jitted.append(step(xs[p], sv.bind(p)).numpy())
    counts.append(programs())
  assert counts[-1] == counts[1], f"{counts[-1] - counts[1]} programs compiled after the second step"
  assert step.captured is not None and set(step.captured.var_vals) == {"start_pos"}
  ek, ev = caches()
  for p in range(steps):
    np.testing.assert_allclose(jitted[p], _decode_step(xs[p], sv.bind(p), ws, ek, ev).numpy(), rtol=1e-5, atol=1e-6, err_msg=f"position {p}")
  np.testing.assert_allclose(jk.numpy(), ek.numpy(), rtol=1e-6)


@pytest.mark.skipif(os.environ.get("CPU_LLVM") == "0", reason="this process already compiles C")
def test_c_path_reruns_these(tmp_path):
  pytest.importorskip("llvmlite", reason="without llvmlite the CPU compiles C already")
  env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
  env.update(CPU_LLVM="0", SPEC="1", PLUGRAD_CACHE_DIR=str(tmp_path))
  here = os.path.abspath(__file__)
  cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-o", "addopts=", here, "-k", "CPU and not c_path"]
  res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=os.path.dirname(os.path.dirname(os.path.dirname(here))))
  assert res.returncode == 0 and " passed" in res.stdout, res.stdout[-4000:] + res.stderr[-2000:]


@pytest.mark.parametrize("device", ["CUDA", "AMD", "METAL"])
def test_symbolic_kernels_render_and_compile_for_gpu_targets(device):
  """The decode step's kernels (a cache row written at start_pos, attention over start_pos + 1 keys) are the same ASTs
  for every position, and each renders for the GPU targets with start_pos as a kernel argument and compiles there
  (NVRTC, clang for AMDGPU, clang's MSL syntax check): the compile tier of every device."""
  from plugrad.codegen import get_program
  from plugrad.device.registry import Device
  from plugrad.engine.schedule import create_schedule
  from plugrad.errors import DeviceError
  try: dev = Device.offline(device)
  except DeviceError as e: pytest.skip(f"{device}: {e}")
  sv = Variable("start_pos", 0, 63)
  ck = Tensor.zeros(1, 2, 64, 8, device="CPU").contiguous().realize()
  q, k = Tensor(rand(1, 2, 1, 8), device="CPU").realize(), Tensor(rand(1, 2, 1, 8), device="CPU").realize()
  def kernels(p: int) -> list:
    sp = sv.bind(p)
    write = ck[:, :, sp:sp + 1].assign(k)
    att = (q @ ck[:, :, :sp + 1].transpose(-1, -2)).softmax(-1) @ ck[:, :, :sp + 1]
    return [it.ast for it in create_schedule(write.uop)[0] + create_schedule(att.uop)[0] if it.kind == "kernel"]
  first = kernels(3)
  assert first == kernels(40) and len(first) >= 3
  for ast in first:
    p = get_program(ast, dev.renderer)
    assert [v.arg[0] for v in p.vars] == ["start_pos"] and "start_pos" in p.source, p.name
    try: dev.compiler.compile(p.source)
    except (ImportError, FileNotFoundError, OSError) as e: pytest.skip(f"{device}'s compiler is not installed here: {e}")
