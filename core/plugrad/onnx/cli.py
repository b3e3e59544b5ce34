"""`python -m plugrad onnx MODEL.onnx [--input NAME=FILE.npy ...] [--dim NAME=N ...] [--device DEV] [--runs N] [--jit]`.

Runs an ONNX model once or more and prints each output (shape, dtype, first values) and the timings: load (parse and
upload the initializers), the first call (schedule and compile), and the best and mean of the warm calls. Inputs not
given by --input are random (normal floats, integers in [0, 100), bools), their symbolic dimensions (dim_param) set by
--dim NAME=N (default 1). A sequence input is a list of one random tensor, or the --input array's entries along its first
axis; an optional input holds a value.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np


def add_parser(sub: Any) -> None:
  o = sub.add_parser("onnx", help="run an ONNX model: outputs and timings (docs/onnx.md)")
  o.add_argument("model", metavar="MODEL.onnx")
  o.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy", help="an input from a .npy file (repeatable)")
  o.add_argument("--dim", action="append", default=[], metavar="NAME=N", help="a symbolic dimension's size for random inputs (repeatable)")
  o.add_argument("--device", default=None, help="the plugrad device (default: the default device)")
  o.add_argument("--runs", type=int, default=5, help="calls after the first (default 5)")
  o.add_argument("--jit", action="store_true", help="replay the captured kernels from the third call on (TinyJit)")
  o.add_argument("--seed", type=int, default=0)


def _fail(msg: str, code: int = 2) -> int:
  print(f"plugrad onnx: {msg}", file=sys.stderr)
  return code


def _pairs(items: list[str], what: str) -> dict[str, str]:
  out = {}
  for it in items:
    name, sep, value = it.partition("=")
    if not sep or not name: raise ValueError(f"{what} must be NAME=VALUE, got {it!r}")
    out[name] = value
  return out


def run_cli(args: argparse.Namespace) -> int:
  from plugrad.dtype import dtypes
  from plugrad.onnx import OnnxError, OnnxModel
  try:
    given, dims = _pairs(args.input, "--input"), {k: int(v) for k, v in _pairs(args.dim, "--dim").items()}
  except ValueError as e: return _fail(str(e))
  st = time.perf_counter()
  try: model = OnnxModel(args.model, args.device, jit=args.jit)
  except (OSError, OnnxError) as e: return _fail(f"{type(e).__name__}: {e}", 1)
  load = time.perf_counter() - st
  rng = np.random.default_rng(args.seed)
  feed: dict[str, Any] = {}
  for spec in model.inputs:
    if spec.name in given: arr: np.ndarray = np.load(given.pop(spec.name))
    else:
      shape = tuple(d if isinstance(d, int) and d else dims.get(d, 1) if isinstance(d, str) else 1 for d in spec.shape)
      if dtypes.is_float(spec.dtype): arr = rng.standard_normal(shape).astype(np.float32)
      elif spec.dtype == dtypes.bool: arr = rng.integers(0, 2, shape).astype(bool)
      else: arr = rng.integers(0, 100, shape)
      arr = arr if spec.dtype == dtypes.bfloat16 else arr.astype(dtypes.to_numpy(spec.dtype))
      if "sequence" in spec.kind: arr = arr[None]
    feed[spec.name] = list(arr) if "sequence" in spec.kind else arr
  if given: return _fail(f"--input names {sorted(given)} are not inputs of the model; its inputs are {[s.name for s in model.inputs]}")
  def host(v: Any) -> Any:  # a sequence is a list, an empty optional None
    if v is None or isinstance(v, list): return v if v is None else [host(t) for t in v]
    return (v.float() if v.dtype == dtypes.bfloat16 else v).numpy()
  def call() -> dict[str, Any]: return {k: host(v) for k, v in model(**feed).items()}
  try:
    st = time.perf_counter()
    outs = call()
    first = time.perf_counter() - st
    times = []
    for _ in range(args.runs):
      st = time.perf_counter()
      call()
      times.append(time.perf_counter() - st)
  except OnnxError as e: return _fail(f"{type(e).__name__}: {e}", 1)
  print(f"{args.model}: {len(model.nodes)} nodes, opsets {model.opsets}, device {model.device}")
  for name, v in feed.items():
    print(f"  input  {name}: " + (f"a sequence of {len(v)} {v[0].shape if v else ''}" if isinstance(v, list) else f"{v.shape} {v.dtype}"))
  for name, v in outs.items():
    if v is None: print(f"  output {name}: an empty optional")
    for i, arr in enumerate([v] if isinstance(v, np.ndarray) else v or []):
      head = np.array2string(arr.reshape(-1)[:6], precision=5, separator=", ")
      print(f"  output {name}{f'[{i}]' if isinstance(v, list) else ''}: {arr.shape} {arr.dtype} {head}{' ...' if arr.size > 6 else ''}")
  line = f"  load {load * 1e3:.1f} ms, first call {first * 1e3:.1f} ms"
  if times: line += f", warm best {min(times) * 1e3:.2f} ms, mean {sum(times) / len(times) * 1e3:.2f} ms over {len(times)} calls"
  print(line)
  return 0
