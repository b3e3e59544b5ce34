"""CPU throughput: plugrad's CPU device next to numpy, PyTorch (CPU) and tinygrad 0.14 (DEV=CPU), one line per workload.

  python bench/cpu.py [--threads N] [--quick] [--reps R] [--cap SECONDS]

Workloads (fp32): matmul N=512/1024/2048 (GFLOPS), the fused elementwise a*b+c on 16M floats (GB/s, 16 bytes/element:
3 reads + 1 write), sum of 16M floats and row-sum of a 4096x4096 matrix (GB/s, bytes read + written), conv2d batch 8,
64->64 channels, 56x56, 3x3, padding 1 (GFLOPS), attention's parts at a BERT-style encoder's shapes (softmax over
32x12x128x128 and layernorm over 4096x384 in GB/s of one read + one write; scaled_dot_product_attention 32x12x128x32 and
a 4096x384x384 projection fed by layernorm in GFLOPS of their matmuls), and how plugrad scales from 1 thread to N
(matmul 1024, a*b+c). Low precision (issue 39): matmul bf16 N=512..4096 (bf16 inputs and output, fp32 accumulation:
plugrad `a @ b`, PyTorch's bf16 `a @ b` through oneDNN; numpy has no bfloat16) and matmul u8 x s8 -> s32 N=512..4096
(GOPS; plugrad `a.cast(int32) @ b.cast(int32)`, numpy and PyTorch as int32 matmuls: neither has a u8 x s8 product on
the CPU); each row says which of plugrad's CPU tensor cores ran (AMX, AVX-512 BF16/VNNI, or none), and the header
the CPU's flags for them. --quick runs N=512 of both. --keys picks workloads.
Then the optimizer's target lines (--no-targets skips them), each from a fresh process: matmul with BEAM=2 (--beam
sizes; search seconds, ratio to numpy's line above, and the first run of a second process on the same BEAM cache), the
codegen milliseconds per new kernel (schedule + optimize + lower + render, no C compiler, median over 60 fresh graphs),
and the latency of a new graph on a new shape with the compiler and every cache off, next to tinygrad 0.14's.
Every line shows each peer's number and the ratio plugrad/peer (above 1: plugrad is faster). The C reference
bench/stream_triad.c (cc -O3 -march=native, same thread count) gives what memory allows for the elementwise line.

How it measures. Every framework runs in its own worker process (this script with --worker), so none of them sees the
others' threads, imports or environment; the parent sends one workload at a time to each worker in turn, in rounds
(--rounds, default 2, each starting with another framework; a measurement whose runs took over 3 s runs once), and
keeps each framework's best round: the machine may be shared, and a neighbour's burst should not decide a ratio. It
sleeps 0.5 s after numpy and torch (OpenBLAS and OpenMP threads keep spinning on a core for a while after a call).
In a worker: inputs come from numpy's default_rng (same seed everywhere) and are copied into the framework once; one
warm-up run (it includes plugrad's and tinygrad's compiles, and plugrad's tier-up: its LLVM-compiled kernels are
recompiled by the C compiler, as a loop gets them after a few iterations) is excluded; then R timed runs (more, up to 100, until
they add up to 0.3 s; 3 when one takes over 2 s), each a fresh expression on the same input buffers, realized and
synchronized, with gc.collect() before it (outside the timing; one more line runs plugrad without it); a round
reports their median. plugrad's and tinygrad's kernel counters must grow in every timed run, so a cached result
cannot be timed. The warm-up's result is checked once against a float64 numpy reference (max abs error / max abs
reference), after the timed runs. A measurement (warm-up + timed runs) that passes --cap seconds is killed and
printed as "timeout"; matmul 2048 is skipped for a framework whose 1024 time (x8) predicts a run over a quarter of the
cap. The last line says how busy other processes kept the machine meanwhile: the numbers are only as steady as
the machine was.

Threads, the same count for everyone (--threads, default every core this process may use): numpy/OpenBLAS through
threadpoolctl (else OPENBLAS_NUM_THREADS before the import), torch.set_num_threads, plugrad's THREADS environment
variable, tinygrad's NUM_CPU_THREADS. The line "cores busy" shows what each really used (process CPU time / wall time
over the timed runs).
"""
from __future__ import annotations

import os
import sys

# Before numpy is imported anywhere (workers inherit this environment): on some processors the machine sets
# OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, which make OpenBLAS pick slower kernels. numpy is benchmarked with
# OpenBLAS's own choice; the kernel it picked is printed (threadpoolctl's "architecture").
for _var in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"): os.environ.pop(_var, None)

import argparse
import datetime
import gc
import json
import platform
import re
import resource
import select
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from typing import Any

import peers  # bench/peers.py (the script's folder is on sys.path)

FRAMEWORKS = ("plugrad", "numpy", "torch", "tinygrad")
PEERS = ("numpy", "torch", "tinygrad")
HERE = os.path.dirname(os.path.abspath(__file__))
M16 = 1 << 24  # 16M floats
ATT = 32 * 12 * 128 * 128  # attention scores of batch 32, 12 heads, sequence 128
MIN_TIMED = 0.3  # seconds of timed runs per measurement at least (up to 100 runs), when runs are short
ROUND_LIMIT = 3.0  # a measurement whose timed runs took longer runs in one round only
LOW_SIZES = (512, 1024, 2048, 4096)  # the bf16 and int8 matmuls
# frameworks without a form of a workload family: shown as "n/a (why)"
UNSUPPORTED = {("bf16mm", "numpy"): "numpy has no bfloat16", ("bf16mm", "tinygrad"): "not measured", ("i8mm", "tinygrad"): "not measured"}
TC_FLAGS = ("avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")


# ---------------------------------------------------------------------------------------------------- the workloads

class Workload:
  def __init__(self, key: str, label: str, unit: str, work: float, tol: float, seed: int):
    self.key, self.label, self.unit, self.work, self.tol, self.seed = key, label, unit, work, tol, seed


def _workloads() -> dict[str, Workload]:
  w = [Workload(f"matmul{n}", f"matmul fp32 N={n}", "GFLOPS", 2.0 * n ** 3, 1e-4, n) for n in (512, 1024, 2048)]
  w += [Workload("ew", "a*b+c fp32 16M", "GB/s", 16.0 * M16, 1e-5, 1),
        Workload("sum", "sum fp32 16M", "GB/s", 4.0 * M16 + 4, 1e-3, 2),
        Workload("rowsum", "row-sum fp32 4096x4096", "GB/s", 4.0 * 4096 * 4096 + 4 * 4096, 1e-4, 3),
        Workload("conv", "conv2d 8x64x56x56 3x3 p1 ->64", "GFLOPS", 2.0 * 8 * 64 * 56 * 56 * 64 * 9, 1e-4, 4)]
  # attention's parts at a BERT-style encoder's shapes (issue 20): GB/s counts one read and one write of the rows
  w += [Workload("softmax", "softmax 32x12x128x128", "GB/s", 8.0 * ATT, 1e-5, 5),
        Workload("layernorm", "layernorm 4096x384", "GB/s", 8.0 * 4096 * 384, 1e-4, 6),
        Workload("sdpa", "attention 32x12x128x32 fwd", "GFLOPS", 4.0 * ATT * 32, 1e-4, 7),
        Workload("proj", "layernorm(x) @ W 4096x384x384", "GFLOPS", 2.0 * 4096 * 384 * 384, 1e-3, 8)]
  # low precision (issue 39): bf16 in and out (the output's rounding is the tolerance), u8 x s8 products summed exactly
  w += [Workload(f"bf16mm{n}", f"matmul bf16 N={n}", "GFLOPS", 2.0 * n ** 3, 1e-2, 9) for n in LOW_SIZES]
  w += [Workload(f"i8mm{n}", f"matmul u8xs8->s32 N={n}", "GOPS", 2.0 * n ** 3, 1e-9, 10) for n in LOW_SIZES]
  return {x.key: x for x in w}


WORKLOADS = _workloads()


def make_inputs(key: str) -> list[Any]:
  import numpy as np
  rng = np.random.default_rng(WORKLOADS[key.removesuffix("_nogc")].seed)
  r = lambda *shape: rng.random(shape, dtype=np.float32)  # [0, 1): sums stay well conditioned
  if key.startswith("matmul"):
    n = int(key[6:])
    return [r(n, n), r(n, n)]
  if key.startswith("ew"): return [r(M16), r(M16), r(M16)]
  if key == "sum": return [r(M16)]
  if key == "rowsum": return [r(4096, 4096)]
  if key == "conv": return [r(8, 64, 56, 56), r(64, 64, 3, 3)]
  g = lambda *shape: rng.standard_normal(shape, dtype=np.float32)
  if key == "softmax": return [g(32, 12, 128, 128) * 4]
  if key == "layernorm": return [g(4096, 384)]
  if key == "sdpa": return [g(32, 12, 128, 32), g(32, 12, 128, 32), g(32, 12, 128, 32)]
  if key == "proj": return [g(4096, 384), g(384, 384) * 0.05]
  if key.startswith("bf16mm"):  # values on the bf16 grid (rounded to nearest even), so every framework starts from the same numbers
    n = int(key[6:])
    return [bf16_grid(r(n, n) - 0.5), bf16_grid(r(n, n) - 0.5)]
  if key.startswith("i8mm"):
    n = int(key[4:])
    return [rng.integers(0, 256, (n, n)).astype(np.uint8), rng.integers(-128, 128, (n, n)).astype(np.int8)]
  raise KeyError(key)


def bf16_grid(x: Any) -> Any:
  """float32 `x` rounded to the nearest bfloat16 (ties to even), still float32."""
  import numpy as np
  u = x.view(np.uint32)
  return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


def numpy_conv(x: Any, w: Any) -> Any:
  """conv2d, stride 1, padding 1, as im2col (a copy of the 3x3 windows) + one GEMM: numpy has no convolution."""
  import numpy as np
  n, c, h, wd = x.shape
  oc, _, kh, kw = w.shape
  xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
  win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))  # n, c, h, w, kh, kw
  cols = win.transpose(0, 2, 3, 1, 4, 5).reshape(n * h * wd, c * kh * kw)
  out = cols @ w.reshape(oc, c * kh * kw).T
  return np.ascontiguousarray(out.reshape(n, h, wd, oc).transpose(0, 3, 1, 2))


def reference(key: str, inputs: list[Any]) -> Any:
  import numpy as np
  x = [a.astype(np.float64) for a in inputs]
  if key.startswith("matmul"): return x[0] @ x[1]
  if key.startswith("ew"): return x[0] * x[1] + x[2]
  if key == "sum": return np.sum(x[0])
  if key == "rowsum": return x[0].sum(axis=1)
  if key == "conv": return numpy_conv(x[0], x[1])
  if key == "softmax": return numpy_softmax(x[0])
  if key == "layernorm": return numpy_layernorm(x[0])
  if key == "sdpa": return numpy_sdpa(*x)
  if key == "proj": return numpy_layernorm(x[0]) @ x[1]
  if key.startswith(("bf16mm", "i8mm")): return x[0] @ x[1]
  raise KeyError(key)


def numpy_softmax(x: Any) -> Any:
  import numpy as np
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def numpy_layernorm(x: Any) -> Any:
  y = x - x.mean(-1, keepdims=True)
  return y / ((y * y).mean(-1, keepdims=True) + 1e-5) ** 0.5


def numpy_sdpa(q: Any, k: Any, v: Any) -> Any: return numpy_softmax(q @ k.swapaxes(-1, -2) / q.shape[-1] ** 0.5) @ v


# ---------------------------------------------------------------------------------------------------- codegen, latency, BEAM

def _fresh_graphs(n: int) -> list[tuple[int, int]]:
  """Shapes of n different small graphs (each a new kernel: a fused a*b+c then a row-sum over a new shape)."""
  return [(64 + 8 * i, 96 + 16 * i) for i in range(n)]


def extra_main(kind: str, arg: int) -> None:
  """One measurement in this (fresh) process, printed as one JSON line: `codegen` (ms per new kernel: schedule + optimize +
  lower + render, no compiler), `latency` (ms from building a new graph to its result, compiler included), `beam`
  (BEAM=2 search seconds and GFLOPS of matmul N=arg)."""
  import numpy as np
  rng = np.random.default_rng(0)
  out: dict[str, Any] = {}
  if kind == "codegen":
    from plugrad.codegen import get_program
    from plugrad.device.registry import Device
    from plugrad.engine.schedule import create_schedule
    from plugrad.tensor.tensor import Tensor
    rd = Device["CPU"].renderer
    ms: list[float] = []
    for m, n in _fresh_graphs(arg):
      a, b, c = (Tensor(rng.random((m, n), dtype=np.float32)) for _ in range(3))
      for t in ((a * b + c).relu().sum(1), a.T @ b if m == n else (a * b).max(0), (a + 1.0).exp2() * c):
        t0 = time.perf_counter()
        items, _ = create_schedule(t.uop)
        for it in items:
          if it.kind == "kernel": get_program(it.ast, rd)
        ms.append((time.perf_counter() - t0) * 1e3 / max(1, sum(it.kind == "kernel" for it in items)))
    out = {"median_ms": statistics.median(ms), "kernels": len(ms)}
  elif kind == "latency_plugrad":
    from plugrad.tensor.tensor import Tensor
    ms = []
    for m, n in _fresh_graphs(arg):
      a, b, c = (Tensor(rng.random((m, n), dtype=np.float32)).realize() for _ in range(3))
      t0 = time.perf_counter()
      (a * b + c).relu().sum(1).numpy()
      ms.append((time.perf_counter() - t0) * 1e3)
    out = {"median_ms": statistics.median(ms)}
  elif kind == "latency_tinygrad":
    from tinygrad import Tensor as TT
    ms = []
    for m, n in _fresh_graphs(arg):
      a, b, c = (TT(rng.random((m, n), dtype=np.float32), device="CPU").realize() for _ in range(3))
      t0 = time.perf_counter()
      (a * b + c).relu().sum(1).numpy()
      ms.append((time.perf_counter() - t0) * 1e3)
    out = {"median_ms": statistics.median(ms)}
  elif kind == "beam":
    from plugrad.tensor.tensor import Tensor
    a, b = (Tensor(rng.random((arg, arg), dtype=np.float32)).realize() for _ in range(2))
    t0 = time.perf_counter()
    (a @ b).realize()
    first = time.perf_counter() - t0
    peers.settle_tiers()  # like every workload: the tiered code, after the warm-up
    (a @ b).realize()
    ts = []
    for _ in range(5):
      t0 = time.perf_counter()
      (a @ b).realize()
      ts.append(time.perf_counter() - t0)
    out = {"first_s": first, "gflops": 2.0 * arg ** 3 / statistics.median(ts) / 1e9}
  print(json.dumps(out))


def run_extra(kind: str, arg: int, env: dict[str, str], timeout: float) -> dict[str, Any]:
  try:
    res = subprocess.run([sys.executable, os.path.abspath(__file__), "--extra", f"{kind}:{arg}"], env=env, capture_output=True, text=True,
                         timeout=timeout)
  except subprocess.TimeoutExpired: return {"error": f"over {timeout:.0f} s"}
  lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
  if res.returncode != 0 or not lines: return {"error": (res.stderr.strip().splitlines() or ["failed"])[-1][:200]}
  return json.loads(lines[-1])


def target_lines(threads: int, results: dict[str, dict[str, dict[str, Any]]], beam_sizes: list[int], cap: float) -> list[str]:
  """The issue's remaining target lines: BEAM=2 matmul (search seconds, ratio to numpy, the cached second run), codegen
  ms per new kernel, and fresh-kernel latency with the compiler next to tinygrad's on the same graph."""
  lines: list[str] = []
  base = {k: v for k, v in os.environ.items() if k not in ("BEAM", "DEBUG", "NOOPT")}
  base["THREADS"] = str(threads)
  with tempfile.TemporaryDirectory(prefix="plugrad-bench-cache-") as cache:
    for n in beam_sizes:
      env = {**base, "BEAM": "2", "PLUGRAD_CACHE_DIR": cache}
      r1 = run_extra("beam", n, env, cap * 4)
      r2 = run_extra("beam", n, env, cap) if "error" not in r1 else {"error": "search failed"}
      npy = rate(results.get(f"matmul{n}", {}).get("numpy", {}), WORKLOADS[f"matmul{n}"])
      if "error" in r1: lines.append(f"matmul fp32 N={n} BEAM=2: {r1['error']}")
      else:
        lines.append(f"matmul fp32 N={n} BEAM=2          GFLOPS  plugrad {fmt(r1['gflops'])}"
                     + (f" | numpy {fmt(npy)} ({r1['gflops'] / npy:.3g}x)" if npy else "")
                     + f" | search {r1['first_s']:.1f} s (first run, compiles included)"
                     + (f"; second process (cache hit) first run {r2['first_s']:.2f} s" if "first_s" in r2 else f"; second run: {r2.get('error')}"))
    env = {**base, "PLUGRAD_CACHE_DIR": cache, "CACHE": "0"}
    cg = run_extra("codegen", 20, env, cap)
    lines.append("codegen per new kernel (schedule+optimize+lower+render, no C compiler): " +
                 (f"median {cg['median_ms']:.2f} ms over {cg['kernels']} graphs" if "median_ms" in cg else str(cg.get("error"))))
    lp = run_extra("latency_plugrad", 8, env, cap)
    tenv = {**base, "NUM_CPU_THREADS": str(threads), "DISABLE_COMPILER_CACHE": "1", "DEV": "CPU"}
    if (clang := find_clang()): tenv["CC"] = clang
    lt = run_extra("latency_tinygrad", 8, tenv, cap)
    a, b = lp.get("median_ms"), lt.get("median_ms")
    lines.append("fresh-kernel latency, (a*b+c).relu().sum(1) on a new shape, compiler included, caches off: "
                 + (f"plugrad {a:.1f} ms" if a else f"plugrad {lp.get('error')}") + " | "
                 + (f"tinygrad {b:.1f} ms" if b else f"tinygrad {lt.get('error')}")
                 + (f" ({a / b:.3g}x the time; target <= 0.5x)" if a and b else ""))
  return lines


# ---------------------------------------------------------------------------------------------------- the workers

class Side:
  """One framework inside a worker: `load` copies the inputs in, `fn(key)` returns a callable that computes the
  workload once (realized and synchronized) and returns its result, `to_numpy` converts a result."""
  name = ""
  def __init__(self, threads: int): self.threads = threads
  def info(self) -> str: return ""
  def settle(self) -> None: """After the warm-up: let a tiered compiler put in its steady-state code."""
  def launches(self) -> int | None: return None  # kernels run so far, where the framework counts them
  def fresh_allocs(self) -> int | None: return None  # device allocations not served from a cache, where known
  def load(self, arrays: list[Any]) -> list[Any]: return arrays
  def to_numpy(self, out: Any) -> Any: return out

  def fn(self, key: str, xs: list[Any]) -> Any:
    if key.startswith("matmul"): return lambda: self.sync(xs[0] @ xs[1])
    if key.startswith("ew"): return lambda: self.sync(xs[0] * xs[1] + xs[2])
    if key == "sum": return lambda: self.sync(xs[0].sum())
    if key == "rowsum": return lambda: self.sync(self.rowsum(xs[0]))
    if key == "conv": return lambda: self.sync(self.conv(xs[0], xs[1]))
    if key == "softmax": return lambda: self.sync(self.softmax(xs[0]))
    if key == "layernorm": return lambda: self.sync(self.layernorm(xs[0]))
    if key == "sdpa": return lambda: self.sync(self.sdpa(*xs))
    if key == "proj": return lambda: self.sync(self.layernorm(xs[0]) @ xs[1])
    if key.startswith("bf16mm"):
      a, b = self.bf16(xs[0]), self.bf16(xs[1])  # converted once, outside the timing
      return lambda: self.sync(a @ b)
    if key.startswith("i8mm"):
      a, b = self.int_operands(xs[0], xs[1])
      return lambda: self.sync(self.int_matmul(a, b))
    raise KeyError(key)

  def bf16(self, x: Any) -> Any: raise NotImplementedError(f"{self.name} has no bfloat16")
  def int_operands(self, a: Any, b: Any) -> tuple[Any, Any]: return a, b
  def int_matmul(self, a: Any, b: Any) -> Any: return a @ b
  def tensor_cores(self) -> str | None: return None  # which tensor cores the last workload's kernels used, where known

  def sync(self, out: Any) -> Any: return out
  def rowsum(self, m: Any) -> Any: return m.sum(axis=1)
  def conv(self, x: Any, w: Any) -> Any: return x.conv2d(w, padding=1)
  def softmax(self, x: Any) -> Any: return x.softmax(-1)
  def layernorm(self, x: Any) -> Any: return x.layernorm()
  def sdpa(self, q: Any, k: Any, v: Any) -> Any: return q.scaled_dot_product_attention(k, v)


class NumpySide(Side):
  name = "numpy"
  def __init__(self, threads: int):
    super().__init__(threads)
    import numpy as np
    self.np, self.limiter, self.how = np, None, "OPENBLAS_NUM_THREADS"
    try:
      import threadpoolctl
      self.limiter, self.how = threadpoolctl.threadpool_limits(limits=threads), "threadpoolctl"
      self.pools = threadpoolctl.threadpool_info()
    except ImportError: self.pools = []

  def info(self) -> str:
    blas = [p for p in self.pools if p.get("user_api") == "blas"]
    if not blas: return f"numpy {self.np.__version__}, {self.threads} threads via {self.how} (install threadpoolctl to see the BLAS kernel)"
    b = blas[0]
    return (f"numpy {self.np.__version__}, {b.get('internal_api')} {b.get('version')} kernel {b.get('architecture')}, "
            f"{b.get('num_threads')} threads via {self.how}; OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE unset; conv2d = im2col copy + sgemm")

  def conv(self, x: Any, w: Any) -> Any: return numpy_conv(x, w)
  def softmax(self, x: Any) -> Any: return numpy_softmax(x)
  def layernorm(self, x: Any) -> Any: return numpy_layernorm(x)
  def sdpa(self, q: Any, k: Any, v: Any) -> Any: return numpy_sdpa(q, k, v)
  def int_operands(self, a: Any, b: Any) -> tuple[Any, Any]:
    import numpy as np
    return a.astype(np.int32), b.astype(np.int32)  # numpy's integer matmul (no BLAS)


class TorchSide(Side):
  name = "torch"
  def __init__(self, threads: int):
    super().__init__(threads)
    import torch
    self.torch = torch
    torch.set_num_threads(threads)
    torch.set_grad_enabled(False)

  def info(self) -> str:
    t = self.torch
    blas = "MKL" if t.backends.mkl.is_available() else "its BLAS"
    return f"torch {t.__version__}, {t.get_num_threads()} threads via torch.set_num_threads, {blas}, oneDNN conv: {t.backends.mkldnn.is_available()}"

  def load(self, arrays: list[Any]) -> list[Any]: return [self.torch.from_numpy(a.copy()) for a in arrays]
  def to_numpy(self, out: Any) -> Any: return out.float().numpy() if out.dtype == self.torch.bfloat16 else out.numpy()
  def bf16(self, x: Any) -> Any: return x.to(self.torch.bfloat16)
  def int_operands(self, a: Any, b: Any) -> tuple[Any, Any]: return a.to(self.torch.int32), b.to(self.torch.int32)  # no u8 x s8 op
  def rowsum(self, m: Any) -> Any: return m.sum(dim=1)
  def conv(self, x: Any, w: Any) -> Any: return self.torch.nn.functional.conv2d(x, w, padding=1)
  def softmax(self, x: Any) -> Any: return self.torch.softmax(x, -1)
  def layernorm(self, x: Any) -> Any: return self.torch.nn.functional.layer_norm(x, x.shape[-1:])
  def sdpa(self, q: Any, k: Any, v: Any) -> Any: return self.torch.nn.functional.scaled_dot_product_attention(q, k, v)


class PlugradSide(Side):
  name = "plugrad"
  def __init__(self, threads: int):
    super().__init__(threads)
    os.environ["THREADS"] = str(threads)  # read when the CPU device is created, i.e. before the first kernel
    os.environ.setdefault("DEV", "CPU")
    import plugrad
    from plugrad import Tensor
    from plugrad.device import runner
    from plugrad.device.registry import Device
    self.Tensor, self.Device, self.plugrad = Tensor, Device, plugrad
    self._count = 0
    self._wmma: set[str] = set()  # the tensor-core instructions of the kernels run since the last tensor_cores()
    orig = runner.ProgramRunner.__call__
    def counted(r: Any, *a: Any, **kw: Any) -> Any:
      self._count += 1
      if (names := getattr(r, "_bench_wmma", None)) is None:
        names = r._bench_wmma = {u.arg[0] for u in r.program.uops if u.op.name == "WMMA"}
      self._wmma |= names
      return orig(r, *a, **kw)
    runner.ProgramRunner.__call__ = counted  # type: ignore[method-assign]
    self._fresh = 0  # allocations the allocator could not serve from its cache of freed buffers
    alloc = Device["CPU"].allocator
    orig_alloc = alloc._alloc
    def counted_alloc(*a: Any, **kw: Any) -> Any:
      self._fresh += 1
      return orig_alloc(*a, **kw)
    alloc._alloc = counted_alloc

  def fresh_allocs(self) -> int | None: return self._fresh

  def settle(self) -> None: peers.settle_tiers()
  def bf16(self, x: Any) -> Any: return x.cast(self.plugrad.dtypes.bfloat16).realize()
  def int_matmul(self, a: Any, b: Any) -> Any: return a.cast(self.plugrad.dtypes.int32) @ b.cast(self.plugrad.dtypes.int32)

  def tensor_cores(self) -> str | None:
    used, self._wmma = self._wmma, set()
    return ", ".join(sorted(used)) if used else "none"

  def info(self) -> str:
    dev = self.Device["CPU"]
    cc, comp = "", getattr(dev, "compiler", None)
    if (tc := getattr(comp, "toolchain", None)) is not None:
      cc = f", {os.path.basename(tc.cc[0])} {tc.version.split(') ')[-1] if tc.version else ''} -O2 -march=native"
    elif (key := getattr(comp, "cache_key", "")).startswith("plugrad-cpu-llvm"):  # LLVM in-process (llvmlite)
      cc = ", " + " ".join(w for w in key.split()[1:] if not w.startswith("features=")) + " in-process"
    tcs = ", ".join(tc.name for tc in dev.renderer.tensor_cores) or "none (bf16 through the shared float32 emulation, int8 as int32)"
    return (f"plugrad (plugrad-cpu {getattr(dev, 'plugin_version', '?')}) device CPU{cc}, "
            f"{getattr(dev.runtime, 'threads', '?')} threads via THREADS={os.environ['THREADS']}; CPU tensor cores: {tcs}")

  def launches(self) -> int | None: return self._count
  def load(self, arrays: list[Any]) -> list[Any]: return [self.Tensor(a.copy(), device="CPU").realize() for a in arrays]
  def sync(self, out: Any) -> Any: return out.realize()  # runs the kernels synchronously and synchronizes the device
  def to_numpy(self, out: Any) -> Any: return out.numpy()


class TinygradSide(Side):
  name = "tinygrad"
  def __init__(self, threads: int):
    super().__init__(threads)
    os.environ["DEV"] = "CPU"
    os.environ["NUM_CPU_THREADS"] = str(threads)
    os.environ.pop("THREADS", None)  # tinygrad reads THREADS as an on/off switch for core_id splitting: leave it on
    import tinygrad
    from tinygrad import Device, Tensor
    self.tinygrad, self.Tensor, self.Device = tinygrad, Tensor, Device
    try:
      from tinygrad.helpers import GlobalCounters
      self.counters: Any = GlobalCounters
    except ImportError: self.counters = None

  def info(self) -> str:
    ver = getattr(self.tinygrad, "__version__", None)
    if ver is None:
      try:
        from importlib.metadata import version
        ver = version("tinygrad")
      except Exception: ver = "?"
    return (f"tinygrad {ver} DEV=CPU ({self.Device.DEFAULT}, CC={os.environ.get('CC')}), NUM_CPU_THREADS={self.threads}: its only CPU "
            f"thread setting, it splits a kernel into that many core_id shares (see 'cores busy' for what ran in parallel)")

  def launches(self) -> int | None: return None if self.counters is None else self.counters.kernel_count
  def load(self, arrays: list[Any]) -> list[Any]: return [self.Tensor(a.copy(), device="CPU").realize() for a in arrays]
  def to_numpy(self, out: Any) -> Any: return out.numpy()

  def sync(self, out: Any) -> Any:
    out = out.realize()
    self.Device["CPU"].synchronize()
    return out


SIDES: dict[str, type[Side]] = {"plugrad": PlugradSide, "numpy": NumpySide, "torch": TorchSide, "tinygrad": TinygradSide}


def _cpu_seconds() -> float:
  r = resource.getrusage(resource.RUSAGE_SELF)
  return r.ru_utime + r.ru_stime


class Measurement:
  """One workload inside a worker: inputs, the callable, and the warm-up's result (checked once, in the first round)."""
  def __init__(self, side: Side, key: str):
    import numpy as np
    self.side, self.key = side, key
    self.arrays = make_inputs(key)
    self.f = side.fn(key, side.load(self.arrays))
    gc.collect()
    side.tensor_cores()  # forget the loads' kernels
    t0 = time.perf_counter()
    first = side.to_numpy(self.f())
    self.warmup = time.perf_counter() - t0
    self.tcs = side.tensor_cores()
    side.settle()
    side.to_numpy(self.f())  # the swapped-in code's first run
    self.first: Any = np.array(first, copy=True)
    self.checked: dict[str, Any] | None = None

  def timed(self, reps: int, budget: float, collect: bool = True) -> dict[str, Any]:
    """Up to `reps` timed runs (more when they are short) while they fit in `budget` seconds."""
    times: list[float] = []
    t_start, cpu, wall, no_launch, fresh = time.perf_counter(), 0.0, 0.0, False, 0
    if self.warmup > 2.0: reps = min(reps, 3)  # slow: the median of 3
    while len(times) < reps or (sum(times) < MIN_TIMED and len(times) < 100):  # fast workloads: more runs, a steadier median
      if times and time.perf_counter() - t_start + statistics.median(times) > budget: break
      if collect: gc.collect()
      n0, c0, a0 = self.side.launches(), _cpu_seconds(), self.side.fresh_allocs()
      t0 = time.perf_counter()
      out = self.f()
      dt = time.perf_counter() - t0
      cpu, wall = cpu + _cpu_seconds() - c0, wall + dt
      if n0 is not None and self.side.launches() == n0: no_launch = True
      if a0 is not None and self.side.fresh_allocs() != a0: fresh += 1
      times.append(dt)
      del out
    return {"key": self.key, "times": times, "median": statistics.median(times), "warmup": self.warmup,
            "cores": cpu / wall if wall > 0 else 0.0, "no_launch": no_launch, "fresh": fresh, "tensor_cores": self.tcs, **self.check()}

  def check(self) -> dict[str, Any]:
    """The warm-up's result against float64 numpy: max abs error / max abs reference (after the timed runs: the
    reference runs OpenBLAS, whose threads would keep spinning during timed runs)."""
    if self.checked is None:
      import numpy as np
      ref = reference(self.key, self.arrays)
      ok = self.first.shape == np.shape(ref)
      err = float(np.max(np.abs(self.first.astype(np.float64) - ref)) / max(float(np.max(np.abs(ref))), 1e-30)) if ok else float("inf")
      self.checked = {"relerr": err, "shape_ok": ok}
    return self.checked


def worker_main(name: str, threads: int) -> None:
  out = sys.stdout
  sys.stdout = sys.stderr  # anything a framework prints goes to the log, not into the protocol
  try:
    side = SIDES[name](threads)
    info = side.info()
  except Exception as e:
    out.write(json.dumps({"ready": False, "error": f"{type(e).__name__}: {e}"}) + "\n")
    out.flush()
    return
  out.write(json.dumps({"ready": True, "info": info}) + "\n")
  out.flush()
  m: Measurement | None = None  # the current workload, kept for its later rounds
  for line in sys.stdin:
    req = json.loads(line)
    try:
      if m is None or m.key != req["key"]:
        m = None
        gc.collect()
        m = Measurement(side, req["key"])
      res = m.timed(req["reps"], req["budget"], req.get("gc", True))
    except Exception as e: res = {"key": req["key"], "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
    out.write(json.dumps(res) + "\n")
    out.flush()


# ---------------------------------------------------------------------------------------------------- the parent

class Worker:
  """A worker process answering one JSON line per request; killed (its whole process group) when a request times out."""
  def __init__(self, name: str, threads: int, env: dict[str, str], log: str):
    self.name, self.threads, self.env, self.log = name, threads, env, log
    self.proc: subprocess.Popen | None = None
    self.info: str | None = None
    self.error: str | None = None
    self._buf = b""
    self.ready = False

  def spawn(self) -> None:
    """Start the process (it imports its framework meanwhile); `start` waits for it to be ready."""
    if self.proc is not None or self.error is not None: return
    with open(self.log, "ab") as logf:
      self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", self.name, "--threads", str(self.threads)],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logf, env=self.env, start_new_session=True)
    self._buf, self.ready = b"", False

  def start(self) -> bool:
    if self.error is not None: return False
    self.spawn()
    if self.ready: return True
    msg = self._read(180.0)
    if msg is None or not msg.get("ready"):
      self.error = (msg or {}).get("error") or f"did not start (see {self.log})"
      self.kill()
      return False
    self.info, self.ready = msg["info"], True
    return True

  def _read(self, timeout: float) -> dict[str, Any] | None:
    assert self.proc is not None and self.proc.stdout is not None
    fd, end = self.proc.stdout.fileno(), time.monotonic() + timeout
    while b"\n" not in self._buf:
      left = end - time.monotonic()
      if left <= 0: return None
      ready, _, _ = select.select([fd], [], [], left)
      if not ready: return None
      chunk = os.read(fd, 65536)
      if not chunk: return None  # the worker died
      self._buf += chunk
    line, self._buf = self._buf.split(b"\n", 1)
    return json.loads(line)

  def request(self, key: str, reps: int, cap: float, collect: bool = True) -> dict[str, Any]:
    if not self.start(): return {"key": key, "error": self.error}
    assert self.proc is not None and self.proc.stdin is not None
    self.proc.stdin.write((json.dumps({"key": key, "reps": reps, "budget": 0.8 * cap, "gc": collect}) + "\n").encode())
    self.proc.stdin.flush()
    res = self._read(cap)
    if res is None:
      died = self.proc.poll() is not None
      self.kill()
      return {"key": key, "timeout": not died, "error": None if not died else f"worker died (see {self.log})"}
    return res

  def kill(self) -> None:
    if self.proc is None: return
    try: os.killpg(self.proc.pid, signal.SIGKILL)  # our own worker's process group (start_new_session)
    except ProcessLookupError: pass
    self.proc.wait()
    self.proc, self.ready = None, False


def predict_big(results: dict[str, dict[str, dict[str, Any]]], key: str, f: str, cap: float) -> str | None:
  """Why a matmul of N >= 2048 (`key`) cannot fit in `cap` for framework `f` (None: run it): a run is at least 8x the
  work of N/2 (the same family's line before it), and the measurement is a warm-up + 3 runs at least."""
  fam, n = re.fullmatch(r"([a-z0-9]*?[a-z]+)(\d+)", key).groups()  # type: ignore[union-attr]
  if int(n) < 2048: return None
  small = results.get(f"{fam}{int(n) // 2}", {}).get(f)
  if small is None: return None
  if "median" not in small: return f"N={int(n) // 2} did not finish"
  if (pred := small["median"] * 8) * 4 > cap:
    return (f"N={int(n) // 2} took {small['median']:.1f} s/run, so one N={n} run takes >= {pred:.0f} s: warm-up + 3 runs exceed the "
            f"{cap:.0f} s cap")
  return None


def find_clang() -> str | None:
  """tinygrad 0.14's CPU device compiles with clang (its flags are clang's): clang, else the newest clang-NN."""
  if (p := shutil.which("clang")): return p
  for v in range(30, 10, -1):
    if (p := shutil.which(f"clang-{v}")): return p
  return None


def build_stream(d: str) -> str | tuple[str]:
  """bench/stream_triad.c compiled with `cc -O3 -march=native` into `d`: the executable, or (why not,)."""
  cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
  if cc is None: return ("no C compiler (cc) on PATH",)
  exe = os.path.join(d, "stream_triad")
  res = subprocess.run([cc, "-O3", "-march=native", os.path.join(HERE, "stream_triad.c"), "-o", exe, "-lpthread"], capture_output=True, text=True)
  return exe if res.returncode == 0 else (f"cc failed: {res.stderr.strip()[:200]}",)


def run_stream(exe: str, threads: int) -> dict[str, float] | str:
  res = subprocess.run([exe, str(M16), str(threads), "10"], capture_output=True, text=True, timeout=120)
  if res.returncode != 0: return f"stream_triad failed: {res.stderr.strip()[:200]}"
  return {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", res.stdout)}


def _system_busy() -> float | None:
  """Seconds of CPU time the whole machine has spent busy since boot (/proc/stat), or None off Linux."""
  try:
    with open("/proc/stat") as f: vals = [int(x) for x in f.readline().split()[1:]]
  except (OSError, ValueError): return None
  return (sum(vals[:7]) - vals[3] - vals[4]) / os.sysconf("SC_CLK_TCK")  # user nice system [idle iowait] irq softirq


def _other_load(busy0: float | None, t_begin: float) -> float | None:
  """Average cores that processes other than this benchmark (and its workers) kept busy since `busy0`: the noise."""
  busy1 = _system_busy()
  if busy0 is None or busy1 is None: return None
  own = sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)))
  return max(0.0, (busy1 - busy0 - own) / (time.perf_counter() - t_begin))


def machine_line(threads: int) -> str:
  model = platform.processor() or platform.machine()
  flags = ""
  try:
    with open("/proc/cpuinfo") as f: txt = f.read()
    if (m := re.search(r"model name\s*:\s*(.+)", txt)): model = m.group(1).strip()
    if (m := re.search(r"flags\s*:\s*(.+)", txt)):
      fl = set(m.group(1).split())
      flags = " ".join(x for x in ("avx2", "fma", *TC_FLAGS) if x in fl)
      flags += f"; lacks {' '.join(x for x in TC_FLAGS if x not in fl)}" if any(x not in fl for x in TC_FLAGS) else ""
  except OSError: pass
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return (f"{datetime.date.today().isoformat()}, {model} ({cores} cores{', ' + flags if flags else ''}), Python {platform.python_version()}, "
          f"{threads} thread{'s' if threads != 1 else ''} for everyone")


def fmt(v: float) -> str:
  return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def rate(res: dict[str, Any], wl: Workload) -> float | None:
  if res.get("error") or res.get("timeout") or res.get("skipped") or "median" not in res: return None
  return wl.work / res["median"] / 1e9


def cell(res: dict[str, Any] | None, wl: Workload) -> str:
  if res is None: return "n/a"
  if res.get("na"): return f"n/a ({res['why']})"
  if res.get("skipped"): return "skipped"
  if res.get("timeout"): return "timeout"
  if res.get("error"): return "error"
  return fmt(rate(res, wl) or 0.0)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
  default_threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
  ap.add_argument("--threads", type=int, default=default_threads, help=f"threads for every framework (default: all cores, {default_threads})")
  ap.add_argument("--quick", action="store_true", help="a fast subset: matmul 512 (fp32, bf16, u8xs8), a*b+c, sum, row-sum, scaling on a*b+c")
  ap.add_argument("--reps", type=int, default=None, help="timed runs per measurement (default 5, --quick 3; 3 when a run takes > 2 s)")
  ap.add_argument("--rounds", type=int, default=None, help="rounds over the frameworks per workload, each reporting its median; the best "
                  "round is kept (default 2, --quick 1; measurements over 3 s run once)")
  ap.add_argument("--cap", type=float, default=60.0, help="seconds one measurement (input setup, warm-up, timed runs) may take (default 60)")
  ap.add_argument("--keys", default=None, help="comma-separated workloads to run instead of the default list (e.g. softmax,sdpa)")
  ap.add_argument("--only", default=None, help=f"comma-separated frameworks to run (default: all of {','.join(FRAMEWORKS)})")
  ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
  ap.add_argument("--extra", default=None, help=argparse.SUPPRESS)
  ap.add_argument("--no-targets", action="store_true", help="skip the BEAM=2 matmul, codegen-ms and fresh-kernel latency lines")
  ap.add_argument("--beam", default="1024,2048", help="matmul sizes for the BEAM=2 line (default 1024,2048; --quick: 512)")
  args = ap.parse_args()
  if args.threads < 1: ap.error("--threads must be at least 1")
  # every library's thread pool, for whichever reads these at import (numpy's OpenBLAS when threadpoolctl is missing)
  for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"): os.environ[var] = str(args.threads)
  if args.worker:
    worker_main(args.worker, args.threads)
    return
  if args.extra:
    kind, _, n = args.extra.partition(":")
    extra_main(kind, int(n or 0))
    return

  t_begin = time.perf_counter()
  reps = args.reps or (3 if args.quick else 5)
  rounds = args.rounds or (1 if args.quick else 2)
  low = ["bf16mm512", "i8mm512"] if args.quick else [f"{fam}{n}" for fam in ("bf16mm", "i8mm") for n in LOW_SIZES]
  keys = (["matmul512", "ew", "sum", "rowsum"] if args.quick else ["matmul512", "matmul1024", "matmul2048", "ew", "sum", "rowsum", "conv",
                                                                  "softmax", "layernorm", "sdpa", "proj"]) + low
  if args.keys: keys = args.keys.split(",")
  frameworks = [f for f in FRAMEWORKS if args.only is None or f in args.only.split(",")]
  logdir = tempfile.mkdtemp(prefix="plugrad-bench-cpu-")

  def env_for(name: str, threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"): env[var] = str(threads)
    if name == "tinygrad":
      clang = find_clang()
      if clang: env["CC"] = clang  # plugrad reads CC too, so it is set for tinygrad's worker only
    if name == "plugrad": env["THREADS"] = str(threads)
    return env

  workers = {f: Worker(f, args.threads, env_for(f, args.threads), os.path.join(logdir, f"{f}.log")) for f in frameworks}
  if "plugrad" in workers and args.threads > 1:  # plugrad on 1 thread, for the scaling line, in the same rounds
    workers["plugrad@1"] = Worker("plugrad", 1, env_for("plugrad", 1), os.path.join(logdir, "plugrad-1thread.log"))
  if "tinygrad" in workers and find_clang() is None:
    workers["tinygrad"].error = "tinygrad 0.14's CPU device needs clang (e.g. apt-get install clang-14)"

  print(f"plugrad CPU benchmark: {machine_line(args.threads)}")
  for w in workers.values(): w.spawn()  # the imports run side by side
  for f, w in workers.items():
    ok = w.start()
    print(f"  {f:9s} {w.info if ok else 'n/a: ' + str(w.error)}" + (" (the scaling line)" if "@" in f else ""))

  results: dict[str, dict[str, dict[str, Any]]] = {k: {} for k in keys}
  stream: dict[str, float] | str | None = None
  stream_exe = build_stream(logdir) if "ew" in keys else None
  if isinstance(stream_exe, tuple): stream, stream_exe = stream_exe[0], None  # could not build it: the reason
  busy0 = _system_busy()
  for key in keys:
    for rnd in range(rounds):
      names = list(workers)
      for f in names[rnd % len(names):] + names[:rnd % len(names)]:  # each round starts with another framework
        if key not in ("matmul1024", "ew") and "@" in f: continue  # the 1-thread plugrad worker only runs the scaling pair
        prev = results[key].get(f)
        fam = key.rstrip("0123456789")
        if rnd == 0 and (why := UNSUPPORTED.get((fam, f.split("@")[0]))):
          results[key][f] = {"key": key, "skipped": True, "why": why, "na": True}
          continue
        if rnd == 0 and "mm" in key and (why := predict_big(results, key, f, args.cap)):
          results[key][f] = {"key": key, "skipped": True, "why": why}
          continue
        if rnd > 0 and (prev is None or "median" not in prev or sum(prev["times"]) > ROUND_LIMIT): continue  # slow: one round
        res = workers[f].request(key, reps, args.cap)
        if prev is not None and "median" in prev:
          res["rounds"] = prev["rounds"] + [res["median"]] if "median" in res else prev["rounds"]
          if "median" not in res or res["median"] > prev["median"]: res = {**prev, "rounds": res["rounds"]}
        elif "median" in res: res["rounds"] = [res["median"]]
        results[key][f] = res
        time.sleep(0.5 if rnd == 0 or f in ("numpy", "torch") else 0.1)  # OpenBLAS/OpenMP threads spin for a while after a call
      if key == "ew" and stream_exe is not None:  # the C reference, in the same rounds as the others' elementwise runs
        sr = run_stream(stream_exe, args.threads)
        if isinstance(sr, str) or not isinstance(stream, dict) or sr["fused_median"] > stream["fused_median"]: stream = sr
  scaling = {key: results[key].pop("plugrad@1") for key in ("matmul1024", "ew") if "plugrad@1" in results.get(key, {})}

  for w in workers.values(): w.kill()
  nogc = None
  if "plugrad" in workers and not args.quick and "ew" in keys:  # a fresh process, as a user's loop would start: nothing cached yet
    fresh = Worker("plugrad", args.threads, env_for("plugrad", args.threads), os.path.join(logdir, "plugrad-nogc.log"))
    nogc = fresh.request("ew_nogc", 20, args.cap, collect=False)
    fresh.kill()

  # ---- report
  print("\nEach line: the workload, then every framework's median (its best round); (x) = plugrad/peer, above 1: plugrad is faster.")
  problems: list[str] = []
  busy: dict[str, list[float]] = {f: [] for f in frameworks}
  for key in keys:
    wl = WORKLOADS[key]
    row = results[key]
    p = rate(row.get("plugrad", {}), wl)
    parts = [f"plugrad {cell(row.get('plugrad'), wl)}"] if "plugrad" in row else []
    for f in PEERS:
      if f not in row: continue
      r = rate(row[f], wl)
      parts.append(f"{f} {cell(row[f], wl)}" + (f" ({p / r:.3g}x)" if p and r else ""))
    if key == "ew" and isinstance(stream, dict):
      c = stream.get("fused_median", 0.0)
      parts.append(f"C a*b+c {fmt(c)}" + (f" ({p / c:.3g}x)" if p and c else ""))
    if "tensor_cores" in row.get("plugrad", {}) and key.startswith(("bf16mm", "i8mm")):
      parts.append(f"plugrad's tensor cores: {row['plugrad']['tensor_cores']}")
    print(f"{wl.label:32s} {wl.unit:6s}  " + " | ".join(parts))
    for f, res in row.items():
      if res.get("cores"): busy[f].append(res["cores"])
      if res.get("error"): problems.append(f"{wl.label}: {f} failed: {res['error']}")
      elif res.get("timeout"): problems.append(f"{wl.label}: {f} timeout (one measurement over {args.cap:.0f} s)")
      elif res.get("skipped"):
        if not res.get("na"): problems.append(f"{wl.label}: {f} skipped: {res['why']}")
      else:
        if res.get("relerr", 0) > wl.tol or not res.get("shape_ok", True):
          problems.append(f"MISMATCH {wl.label}: {f} relative error {res['relerr']:.2e} > {wl.tol:.0e} (vs float64 numpy)")
        if res.get("no_launch"): problems.append(f"{wl.label}: {f} ran no kernel in a timed run (a cached result was timed)")
        if len(res.get("times", ())) < 3:
          problems.append(f"{wl.label}: {f} fit only {len(res['times'])} timed run(s) of {res['median']:.1f} s in the cap "
                          f"(the warm-up took {res['warmup']:.1f} s)")
  if isinstance(stream, dict):
    p = rate(results.get("ew", {}).get("plugrad", {}), WORKLOADS["ew"])
    print(f"C STREAM reference (bench/stream_triad.c, cc -O3 -march=native, {int(stream.get('threads', args.threads))} threads): "
          f"triad a=b+s*c {fmt(stream['triad_median'])} GB/s (12 B/elem), fused d=a*b+c {fmt(stream['fused_median'])} GB/s (16 B/elem)"
          + (f"; plugrad a*b+c / triad {p / stream['triad_median']:.3g}x" if p else ""))
  elif stream is not None: print(f"C STREAM reference: {stream}")
  if scaling:
    parts = []
    for key, res1 in scaling.items():
      wl = WORKLOADS[key]
      pn, p1 = rate(results.get(key, {}).get("plugrad", {}), wl), rate(res1, wl)
      parts.append(f"{wl.label} {fmt(pn) if pn else cell(results.get(key, {}).get('plugrad'), wl)} vs {fmt(p1) if p1 else cell(res1, wl)} {wl.unit}"
                   + (f" ({pn / p1:.2f}x)" if pn and p1 else ""))
      if res1.get("relerr", 0) > wl.tol: problems.append(f"MISMATCH {wl.label}: plugrad 1 thread relative error {res1['relerr']:.2e}")
    print(f"plugrad scaling {args.threads} threads vs 1: " + "; ".join(parts))
  if nogc is not None and (r := rate(nogc, WORKLOADS["ew"])):
    p = rate(results.get("ew", {}).get("plugrad", {}), WORKLOADS["ew"])
    print(f"plugrad a*b+c 16M without gc.collect() between runs: {fmt(r)} GB/s" + (f" ({r / p:.2g}x the number above)" if p else "")
          + f"; {nogc.get('fresh', '?')} of {len(nogc['times'])} runs allocated fresh output memory (more would mean that dropped "
          "results keep their buffers until the cycle collector runs)")
  other = _other_load(busy0, t_begin)
  print("cores busy (process CPU time / wall, timed runs): " +
        ", ".join(f"{f} {statistics.median(v):.2f}" for f, v in busy.items() if v) +
        (f"; other processes kept {other:.2f} of {os.cpu_count()} cores busy on average during the run" if other is not None else ""))
  if args.threads > 1 and busy.get("tinygrad") and statistics.median(busy["tinygrad"]) < 1.2:
    print(f"  tinygrad ran on one core although NUM_CPU_THREADS={args.threads}: 0.14 queues a kernel's core_id shares to a single "
          "worker thread, which runs them one after another")
  if not args.no_targets and "plugrad" in workers:
    for line in target_lines(args.threads, results, [int(x) for x in ("512" if args.quick else args.beam).split(",") if x], args.cap): print(line)
  for line in problems: print(f"  ! {line}")
  if not any(p.startswith("MISMATCH") for p in problems): print("  all results match float64 numpy within tolerance")
  print(f"total {time.perf_counter() - t_begin:.0f} s; worker logs in {logdir}")


if __name__ == "__main__":
  main()
