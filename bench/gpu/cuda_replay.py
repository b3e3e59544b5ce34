"""TinyJit/CUDA-graph replay on the CUDA device next to PyTorch's CUDA-graph replay: µs per kernel (run by
cuda_check.sh on a GPU machine; `--dry` checks the plugrad side builds on PYTHON, for CI without a GPU).

The step is a chain of K dependent elementwise kernels over N floats, small enough that launch overhead dominates:
what a graph replay saves. Prints one line per framework: replay µs per step and per kernel (median of R replays)."""
from __future__ import annotations

import argparse
import statistics
import time

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


def time_plugrad(device: str, reps: int = R) -> tuple[float, int]:
  from plugrad import Device
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
  return statistics.median(times) * 1e6, len(graphs)


def time_torch(reps: int = R) -> float:
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
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    g.replay()
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
  assert out.numel() == N
  return statistics.median(times) * 1e6


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--dry", action="store_true", help="build the plugrad step on PYTHON only (no GPU)")
  a = ap.parse_args()
  if a.dry:
    f, x = plugrad_step("PYTHON", 2)
    for _ in range(3): f(x)
    print("dry run ok")
    return
  us, ngraphs = time_plugrad("CUDA")
  print(f"plugrad CUDA-graph replay: {us:.1f} us per step of {K} kernels = {us / K:.2f} us per kernel ({ngraphs} graph(s))")
  try:
    tu = time_torch()
    print(f"torch CUDA-graph replay:   {tu:.1f} us per step of {2 * K} kernels = {tu / (2 * K):.2f} us per kernel")
  except Exception as e: print(f"torch CUDA-graph replay: unavailable ({type(e).__name__}: {e})")


if __name__ == "__main__":
  main()
