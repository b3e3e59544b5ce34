"""`python -m plugrad export SCRIPT:FUNC --target c|webgpu --out DIR [--embed-weights]`.

SCRIPT is a Python file; FUNC, a function in it, is called without arguments and returns `(fn, example_inputs)`: the
function or model to export and its example inputs (a Tensor or a tuple of them). The default device is set for the
target before FUNC runs (CPU for c, WEBGPU for webgpu; DEV overrides it), so a model FUNC builds lands on it.
"""
from __future__ import annotations

import argparse
import os
import runpy
import sys
from typing import Any

from plugrad.export.common import TARGETS, ExportError

_DEVICE = {"c": "CPU", "webgpu": "WEBGPU"}


def add_parser(sub: Any) -> None:
  e = sub.add_parser("export", help="export a model (SCRIPT:FUNC returns (fn, example_inputs)) as standalone C or WebGPU (docs/export.md)")
  e.add_argument("target_func", metavar="SCRIPT:FUNC", help="a Python file and a function in it returning (fn, example_inputs)")
  e.add_argument("--target", choices=TARGETS, required=True, help="c: model.c/model.h/Makefile; webgpu: model.js/index.html")
  e.add_argument("--out", required=True, metavar="DIR", help="the folder to write")
  e.add_argument("--embed-weights", action="store_true", help="c only: put the weights into model.c instead of model.safetensors")


def _fail(msg: str, code: int = 2) -> int:
  print(f"plugrad export: {msg}", file=sys.stderr)
  return code


def run_cli(args: argparse.Namespace) -> int:
  from plugrad.device.registry import Device
  from plugrad.export import export_model
  from plugrad.tensor import Tensor
  script, sep, func = str(args.target_func).rpartition(":")
  if not sep or not script or not func: return _fail(f"expected SCRIPT:FUNC (a Python file and a function in it), got {args.target_func!r}")
  if not os.path.isfile(script): return _fail(f"no such script: {script}")
  if not os.environ.get("DEV", "").strip(): Device.DEFAULT = _DEVICE[args.target]
  sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
  scope = runpy.run_path(script, run_name="__plugrad_export__")
  if not callable(fn := scope.get(func)): return _fail(f"{script} defines no function {func!r}")
  got = fn()
  if not isinstance(got, (tuple, list)) or len(got) != 2:
    return _fail(f"{script}:{func}() must return (fn, example_inputs), got {type(got).__name__}")
  model, inputs = got
  inputs = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs)
  was = Tensor.training
  Tensor.training = False  # an exported model runs in evaluation mode (BatchNorm's running statistics, no dropout)
  try: e = export_model(model, *inputs, target=args.target, out_dir=args.out, embed_weights=args.embed_weights)
  except ExportError as err: return _fail(str(err), 1)
  finally: Tensor.training = was
  cap = e.captured
  print(f"exported {cap.name} ({len(cap.launches)} kernel launches, {len(cap.weights)} weights) for {args.target} to {e.out_dir}:")
  for p in e.files: print(f"  {p.name}")
  if args.target == "c": print(f"build: make -C {e.out_dir}   (OPENMP=1 for threads); run: {e.out_dir}/model_main INPUT_FILE... OUTPUT_FILE...")
  else: print(f"serve: cd {e.out_dir} && python -m http.server, then open http://localhost:8000/ in a browser with WebGPU")
  return 0
