"""The WEBGPU compiler: naga (inside wgpu-native) parses and validates the WGSL when the shader module is created.

WebGPU has no binary format a program could keep: the driver compiles a shader module when a pipeline is made. So the
"binary" is the validated WGSL text itself (UTF-8), cached by the core like any binary; the runtime keeps the pipelines
it made from it (see runtime.py). An invalid shader raises `CompileError` with naga's message and the WGSL line.
"""
from __future__ import annotations

import re
from typing import Any

from plugrad.backend import CompileError, Compiler

# naga points at the source as "┌─ LABEL:12:5" (the shader module's label, "wgsl" without one)
_NAGA_LOC = re.compile(r"┌─ \S*?:(\d+):(\d+)")


class WGSLCompiler(Compiler):
  """`compile(src)` creates a shader module on the device (naga validates it) and returns the source bytes."""
  def __init__(self, device: Any, wgpu_version: str, adapter: str):
    self.device = device
    # what validation depends on: naga's version (it ships inside wgpu-native, whose version wgpu-py pins) and the
    # device's features (enable f16 is valid only with shader-f16)
    self.cache_key = f"plugrad-webgpu naga (wgpu-py {wgpu_version}) features={','.join(sorted(device.features))}"
    self.adapter = adapter

  def __repr__(self) -> str: return f"<WGSLCompiler naga on {self.adapter}>"

  def compile(self, src: str) -> bytes:
    try: self.device.create_shader_module(label="plugrad", code=src)
    except Exception as e: raise CompileError(naga_message(str(e), type(e).__name__)) from None
    return src.encode()

  def disassemble(self, lib: bytes) -> str: return lib.decode()


def naga_message(text: str, kind: str = "GPUValidationError") -> str:
  """naga's diagnostic, with the WGSL line it names spelled out (`line N`) so the core quotes the source around it."""
  text = text.strip()
  if (m := _NAGA_LOC.search(text)) is not None: text += f"\n(naga: WGSL line {m.group(1)}, column {m.group(2)})"
  return f"naga rejected the WGSL ({kind}):\n{text}"
