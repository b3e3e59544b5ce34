"""scaled_dot_product_attention, forward and forward+backward, side by side: plugrad's plain formula (FLASH_ATTENTION=0),
plugrad's fused online-softmax kernels (FLASH_ATTENTION=1; the backward also with FLASH_ATTENTION=2, the fused forward and
an ordinary-ops backward) and PyTorch CPU, the same threads, under TinyJit / no_grad.
The peak resident memory of each process is printed too (the fused kernel's point on a CPU is memory, not speed).

  python bench/attention.py [--threads N] [--reps 8]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
import peers

# (B, H, L, E, mask): BERT-style padding mask, BERT-base heads, GPT-2 small causal, a long causal sequence
SHAPES = [(32, 12, 128, 32, "pad"), (8, 12, 128, 64, "pad"), (4, 12, 256, 64, "causal"), (4, 12, 1024, 64, "causal")]


def best(fn: Any, reps: int) -> float:
  ts = []
  for _ in range(reps):
    t = time.perf_counter()
    fn()
    ts.append(time.perf_counter() - t)
  return min(ts[2:]) * 1e3


def one(name: str, B: int, H: int, L: int, E: int, kind: str, reps: int, backward: bool) -> float:
  if name == "torch":
    import torch
    q, k, v = (torch.randn(B, H, L, E, requires_grad=backward) for _ in range(3))
    m = (torch.rand(B, 1, 1, L) > 0.1) if kind == "pad" else None
    g = torch.randn(B, H, L, E)
    def step() -> None:
      o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=kind == "causal")
      if backward: o.backward(g)
    with torch.set_grad_enabled(backward): return best(step, reps)
  from plugrad import Tensor, TinyJit
  qp, kp, vp = (Tensor.randn(B, H, L, E, requires_grad=backward).realize() for _ in range(3))
  mp = (Tensor.rand(B, 1, 1, L) > 0.1).realize() if kind == "pad" else None
  gp = Tensor.randn(B, H, L, E).realize()  # a random upstream gradient (o.sum()'s ones would let the codegen fold dV = Pᵀ·1)
  @TinyJit
  def f(q: Tensor, k: Tensor, v: Tensor) -> Any:
    o = q.scaled_dot_product_attention(k, v, attn_mask=mp, is_causal=kind == "causal")
    if not backward: return o.realize()
    for t in (q, k, v): t.grad = None
    (o * gp).sum().backward()
    return q.grad.realize(), k.grad.realize(), v.grad.realize()  # type: ignore[union-attr]
  return best(lambda: f(qp, kp, vp), reps)


def peer_main(name: str, reps: int, backward: bool) -> dict[str, Any]:
  out: dict[str, Any] = {f"{B}x{H}x{L}x{E} {kind}": one(name, B, H, L, E, kind, reps, backward) for B, H, L, E, kind in SHAPES}
  out["peak MB"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
  return out


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
  ap.add_argument("--reps", type=int, default=8)
  ap.add_argument("--peer")
  ap.add_argument("--backward", action="store_true")
  args = ap.parse_args()
  if args.peer:
    if args.peer == "torch":
      import torch
      torch.set_num_threads(args.threads)
    print(json.dumps(peer_main(args.peer, args.reps, args.backward)))
    return
  sides = [("plugrad plain", "plugrad", {"FLASH_ATTENTION": "0"}), ("plugrad fused", "plugrad", {"FLASH_ATTENTION": "1"}), ("torch", "torch", {})]
  for backward in (False, True):
    # backward: also the fused forward with the ordinary-ops backward (FLASH_ATTENTION=2)
    todo = sides[:1] + [("fused fwd only", "plugrad", {"FLASH_ATTENTION": "2"})] + sides[1:] if backward else sides
    res = {label: peers.run_peer(__file__, peer, args.threads, "--reps", str(args.reps), *(["--backward"] if backward else []), env_extra=env)
           for label, peer, env in todo}
    print(f"{'forward+backward' if backward else 'forward'} (ms, best of {args.reps}, {args.threads} threads)")
    for key in [f"{B}x{H}x{L}x{E} {kind}" for B, H, L, E, kind in SHAPES] + ["peak MB"]:
      cells = [f"{label} {r[key]:>8.1f}" if isinstance(r, dict) else f"{label} {r}" for label, r in res.items()]
      print(f"  {key:<22} " + "   ".join(cells))


if __name__ == "__main__":
  main()
