"""TinyJit/CUDA-graph replay on the CUDA device next to PyTorch's CUDA-graph replay: µs per kernel (run by
cuda_check.sh on a GPU machine; `--dry` checks the plugrad side builds on PYTHON, for CI without a GPU).

The step is a chain of K dependent elementwise kernels over N floats, small enough that launch overhead dominates:
what a graph replay saves. Prints one line per framework: replay µs per step and per kernel (median of R replays)."""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

K, N, R = 16, 4096, 200


def plugrad_step(device: str, k: int = K):
  from plugrad import Tensor, TinyJit
  def step(x: Tensor) -> Tensor:
    for i in range(k): x = (x * 1.0001 + i).contiguous()
    return x
  f = TinyJit(step)
  x = Tensor(np.ones(N, np.float32), device=device).realize()
  return f, x


def reference(x: np.ndarray, k: int = K) -> np.ndarray:
  """The chain in numpy float32, op by op (CUDA's kernels multiply, then add, rounding each: --fmad=false)."""
  for i in range(k): x = (x * np.float32(1.0001) + np.float32(i)).astype(np.float32)
  return x


def time_plugrad(device: str, reps: int = R) -> dict[str, Any]:
  """Host µs per replay (median), GPU µs per replay by CUDA events (the graph launch timed by the runtime's events
  through plugrad's timeline tracing; None where nothing was timed), the number of graphs in the capture and the
  replayed output's relative error against numpy (on new input buffers)."""
  from plugrad import Device, Tensor, trace
  f, x = plugrad_step(device)
  for _ in range(3): f(x).realize()  # capture, then the graph exists
  graphs = [s for s in f.captured.steps if hasattr(s, "deps")]
  Device[device].synchronize()
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    f(x).realize()
    Device[device].synchronize()
    times.append(time.perf_counter() - t)
  dev = []
  for _ in range(min(reps, 20)):
    trace.enable(graphs=True)
    try: f(x).realize()
    finally: got = trace.disable()
    if got is not None and (ts := [ln.seconds for ln in got.launches if ln.kind in ("kernel", "graph")]): dev.append(sum(ts))
  xs = np.random.default_rng(1).uniform(0.5, 2.0, N).astype(np.float32)
  out = f(Tensor(xs, device=device).realize()).numpy()  # a replay on a new input buffer, checked
  want = reference(xs)
  err = float(np.max(np.abs(out.astype(np.float64) - want)) / np.max(np.abs(want)))
  return {"us": statistics.median(times) * 1e6, "device_us": statistics.median(dev) * 1e6 if dev else None, "graphs": len(graphs), "relerr": err}


def time_torch(reps: int = R) -> tuple[float, float]:
  """(host µs, GPU µs by CUDA events) per replay of a PyTorch CUDA graph of the same chain."""
  import torch
  x = torch.ones(N, device="cuda")
  s = torch.cuda.Stream()
  s.wait_stream(torch.cuda.current_stream())
  def body(y):
    for i in range(K): y = y * 1.0001 + i  # 2 kernels per step in eager torch; one fused op each is not guaranteed
    return y
  with torch.cuda.stream(s): body(x)
  torch.cuda.current_stream().wait_stream(s)
  g = torch.cuda.CUDAGraph()
  with torch.cuda.graph(g): out = body(x)
  torch.cuda.synchronize()
  times, dev = [], []
  for _ in range(reps):
    t = time.perf_counter()
    g.replay()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
  for _ in range(min(reps, 20)):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    g.replay()
    end.record()
    end.synchronize()
    dev.append(start.elapsed_time(end) * 1e3)
  if out.numel() != N: raise RuntimeError(f"torch's graph output has {out.numel()} elements, not {N}")
  return statistics.median(times) * 1e6, statistics.median(dev)


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--dry", action="store_true", help="build the plugrad step on PYTHON only (no GPU)")
  a = ap.parse_args()
  if a.dry:
    f, x = plugrad_step("PYTHON", 2)
    for _ in range(3): f(x)
    print("dry run ok")
    return
  r = time_plugrad("CUDA")
  dev = f", GPU {r['device_us'] / K:.2f} us per kernel by events" if r["device_us"] else ""
  print(f"plugrad CUDA-graph replay: {r['us']:.1f} us per step of {K} kernels = {r['us'] / K:.2f} us per kernel{dev} "
        f"({r['graphs']} graph(s)); output vs numpy: relative error {r['relerr']:.1e}")
  try:
    tu, td = time_torch()
    print(f"torch CUDA-graph replay:   {tu:.1f} us per step of {2 * K} kernels = {tu / (2 * K):.2f} us per kernel, GPU {td / (2 * K):.2f} us")
  except Exception as e: print(f"torch CUDA-graph replay: unavailable ({type(e).__name__}: {e})")


if __name__ == "__main__":
  main()
