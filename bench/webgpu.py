"""WEBGPU next to CPU: fused elementwise, matmul and JIT replay overhead, one line each.

  python bench/webgpu.py [--n 16777216] [--matmul 512] [--reps 5]

On a machine without a GPU the WEBGPU adapter is Mesa's software rasterizer (lavapipe through Vulkan, or llvmpipe
through OpenGL): shaders are compiled by LLVM and run on the CPU's cores, so these figures measure plugrad-webgpu's
path (WGSL, naga, wgpu-native, a CPU rasterizer), not a GPU. The adapter is printed on the first line.

  elementwise  a*b+c on N float32 (GB/s, 16 bytes per element: 3 reads, 1 write); N=16M launches 131072 workgroups,
               more than one dispatch dimension holds, so it also runs the folded launch
  matmul       (N,N) @ (N,N) float32 (GFLOPS, 2N^3 flops)
  jit replay   ten dependent tiny kernels (x = x*1.0001 + 1 on 16 floats) in a TinyJit: microseconds per kernel per
               replay, with the device's graph runner (JIT=1: one submission per replay) and without it (JIT=2: one
               submission per kernel). Each mode runs in its own process (JIT is read at import).

Each figure is the median of --reps timed runs after one warm-up (which includes compiling); a run is the expression
realized and the device synchronized. Results are checked against numpy once.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np


def timed(fn: Callable[[], object], sync: Callable[[], None], reps: int) -> tuple[float, object]:
  out = fn()
  sync()
  ts = []
  for _ in range(reps):
    st = time.perf_counter()
    out = fn()
    sync()
    ts.append(time.perf_counter() - st)
  return statistics.median(ts), out


def bench_device(dev: str, n: int, mm: int, reps: int) -> dict[str, float]:
  from plugrad import Tensor
  from plugrad.device.registry import Device
  sync = Device[dev].synchronize
  rng = np.random.default_rng(0)
  a, b, c = (rng.random(n, dtype=np.float32) for _ in range(3))
  ta, tb, tc = (Tensor(x, device=dev).realize() for x in (a, b, c))
  t_ew, out = timed(lambda: (ta * tb + tc).realize(), sync, reps)
  assert np.allclose(out.numpy()[:1000], (a * b + c)[:1000], rtol=1e-6)  # type: ignore[attr-defined]
  x, y = rng.random((mm, mm), dtype=np.float32), rng.random((mm, mm), dtype=np.float32)
  tx, ty = Tensor(x, device=dev).realize(), Tensor(y, device=dev).realize()
  t_mm, out = timed(lambda: (tx @ ty).realize(), sync, max(1, reps // 2))
  np.testing.assert_allclose(out.numpy(), x @ y, rtol=2e-3)  # type: ignore[attr-defined]
  return {"ew_gbs": 16 * n / t_ew * 1e-9, "ew_ms": t_ew * 1e3, "mm_gflops": 2 * mm**3 / t_mm * 1e-9, "mm_ms": t_mm * 1e3}


def jit_worker(dev: str, reps: int) -> float:
  from plugrad import Tensor
  from plugrad.device.registry import Device
  from plugrad.engine.jit import TinyJit

  @TinyJit
  def chain(x: Tensor) -> Tensor:
    for _ in range(10): x = (x * 1.0001 + 1).contiguous()
    return x.realize()

  x = Tensor(np.ones(16, np.float32), device=dev).realize()
  for _ in range(3): chain(x)
  Device[dev].synchronize()
  ts = []
  for _ in range(max(reps, 50)):
    st = time.perf_counter()
    chain(x)
    Device[dev].synchronize()
    ts.append(time.perf_counter() - st)
  return statistics.median(ts) / 10 * 1e6


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--n", type=int, default=16 * 1024 * 1024)
  ap.add_argument("--matmul", type=int, default=512)
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument("--jit-worker", default=None, help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.jit_worker:
    print(json.dumps(jit_worker(args.jit_worker, args.reps)))
    return
  from plugrad_webgpu.context import gpu
  g = gpu()
  print(f"WEBGPU adapter: {g.describe()} ({g.driver}); {'Mesa software rasterizer: CPU cores, not a GPU' if g.software else 'hardware'}")
  res = {dev: bench_device(dev, args.n, args.matmul, args.reps) for dev in ("WEBGPU", "CPU")}
  w, c = res["WEBGPU"], res["CPU"]
  print(f"elementwise a*b+c {args.n} f32: WEBGPU {w['ew_gbs']:.2f} GB/s ({w['ew_ms']:.1f} ms)  CPU {c['ew_gbs']:.2f} GB/s ({c['ew_ms']:.1f} ms)  "
        f"ratio {w['ew_gbs'] / c['ew_gbs']:.2f}x")
  print(f"matmul {args.matmul} f32: WEBGPU {w['mm_gflops']:.2f} GFLOPS ({w['mm_ms']:.1f} ms)  CPU {c['mm_gflops']:.2f} GFLOPS ({c['mm_ms']:.1f} ms)  "
        f"ratio {w['mm_gflops'] / c['mm_gflops']:.2f}x")
  for dev in ("WEBGPU", "CPU"):
    us = {}
    for mode in ("1", "2"):
      env = {**os.environ, "JIT": mode}
      cmd = [sys.executable, __file__, "--jit-worker", dev, "--reps", str(args.reps)]
      out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
      us[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"jit replay {dev}: {us['1']:.1f} us/kernel with the graph runner, {us['2']:.1f} us/kernel kernel by kernel")


if __name__ == "__main__":
  main()
