"""Export a JIT-captured model as source that runs without plugrad: a C library or a WebGPU page (docs/export.md).

    from plugrad.export import export_model
    export_model(model, Tensor(x), target="c", out_dir="out/c")         # model.c, model.h, model.safetensors, Makefile, main.c
    export_model(model, Tensor(x), target="webgpu", out_dir="out/web")  # model.js, index.html, model.safetensors

The function is captured with TinyJit on the example inputs (it runs twice), on the device its tensors live on: the C
target needs the CPU device, the WebGPU target the WEBGPU device.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plugrad.export.common import TARGETS, Captured, ExportError, capture

__all__ = ["TARGETS", "Captured", "ExportError", "Exported", "export_model"]


@dataclass(frozen=True)
class Exported:
  """What `export_model` wrote: the target, the folder, the files and the capture they were written from."""
  target: str
  out_dir: Path
  files: tuple[Path, ...]
  captured: Captured


def export_model(fn_or_jit: Any, *example_inputs: Any, target: str = "c", out_dir: str | os.PathLike[str] = "export",
                 embed_weights: bool = False, state: Any = None) -> Exported:
  """Capture `fn_or_jit` (a function, a callable model or a TinyJit) on `example_inputs` and write it for `target`
  ("c" or "webgpu") into `out_dir`. `embed_weights` (C only) puts the weights into model.c instead of a file. `state`
  (a state dict or the model object) names the weights in the file; by default they are named from the model when
  `fn_or_jit` is one or a method of one, else weight0, weight1, ..."""
  if target not in TARGETS: raise ExportError(f"export_model: target must be one of {', '.join(map(repr, TARGETS))}, got {target!r}")
  if embed_weights and target != "c": raise ExportError("export_model: embed_weights is for target='c' (the WebGPU page fetches its weights file)")
  if not isinstance(out_dir, (str, os.PathLike)): raise ExportError(f"export_model: out_dir must be a path, got {type(out_dir).__name__}")
  out = Path(out_dir)
  if out.exists() and not out.is_dir(): raise ExportError(f"export_model: out_dir {str(out)!r} exists and is not a folder")
  cap = capture(fn_or_jit, example_inputs, state)
  if target == "c":
    from plugrad.export import c
    files = c.write(cap, out, embed_weights)
  else:
    from plugrad.export import webgpu
    files = webgpu.write(cap, out)
  return Exported(target, out, tuple(files), cap)
