"""The fused attention kernels ("flash attention"), written by hand in lowered form: the forward (`forward.py`) and the
backward's two (`backward.py`), on what they share (`common.py`). They join the one codegen pipeline at their entry
pass (`KernelInfo.entry_pass`): one program cache, one codegen timing, one trace with every other kernel.
"""
from __future__ import annotations

import plugrad.codegen as codegen
from plugrad.codegen.attention.backward import backward_kv_kernel, backward_q_kernel
from plugrad.codegen.attention.common import LN2, LOG2E, AttentionShape, attention_tiling, causal_keys_read
from plugrad.codegen.attention.forward import attention_kernel
from plugrad.renderer.base import Renderer
from plugrad.uop.ops import UOp
from plugrad.uop.program import ProgramUOp

# the forward kernel and the backward's: dQ with or without the forward's row statistics, dK and dV
KINDS = ("forward", "backward_q", "backward_q_stats", "backward_kv")


def attention_sink(shape: AttentionShape, renderer: Renderer, kind: str = "forward") -> UOp:
  """The lowered kernel graph (a SINK) of the `kind` kernel (one of KINDS) for `shape` on `renderer`'s device."""
  if kind == "forward": return attention_kernel(shape, renderer)
  if kind == "backward_kv": return backward_kv_kernel(shape, renderer)
  if kind in ("backward_q", "backward_q_stats"): return backward_q_kernel(shape, renderer, stats_given=kind == "backward_q_stats")
  raise ValueError(f"attention kernel kind must be one of {KINDS}, got {kind!r}")


def attention_linear(shape: AttentionShape, renderer: Renderer, device: str | None = None, kind: str = "forward") -> ProgramUOp:
  """The PROGRAM of the `kind` kernel for `shape` at the linear stage (for `device`, default the renderer's)."""
  return codegen.linear_program(attention_sink(shape, renderer, kind), renderer, device=device)


def attention_program(shape: AttentionShape, renderer: Renderer, kind: str = "forward") -> ProgramUOp:
  """The rendered PROGRAM of the `kind` kernel for `shape`: `get_program` of its lowered graph."""
  return codegen.get_program(attention_sink(shape, renderer, kind), renderer)


__all__ = ["KINDS", "LN2", "LOG2E", "AttentionShape", "attention_kernel", "attention_linear", "attention_program", "attention_sink",
           "attention_tiling", "causal_keys_read"]
