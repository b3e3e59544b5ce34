"""The codegen pipeline as one list of named passes (codegen/passes.py): a renderer's own passes at named points,
kernels written in lowered form joining at their entry pass, and one cache, timing and trace for every kernel."""
from __future__ import annotations

import numpy as np
import pytest

import plugrad.codegen as codegen
from plugrad import trace
from plugrad.builtin.python_renderer import PythonRenderer
from plugrad.codegen import get_program
from plugrad.codegen.attention import AttentionShape, attention_program, attention_sink
from plugrad.codegen.passes import PASS_NAMES, passes_for, run_passes
from plugrad.dtype import dtypes
from plugrad.engine.schedule import create_schedule
from plugrad.renderer.base import RendererError
from plugrad.tensor.tensor import Tensor
from plugrad.uop.ops import Ops, UOp
from plugrad.uop.pattern import PatternMatcher, UPat
from plugrad.uop.rewrite import graph_rewrite

SEEN: list[set[Ops]] = []


def _twos_to_threes(u: UOp, renderer: object) -> UOp:
  SEEN.append({x.op for x in u.toposort})
  pm = PatternMatcher([(UPat(Ops.CONST, dtypes.float32, name="c"), lambda c: c.replace(arg=3.0) if c.arg == 2.0 else None)])
  return graph_rewrite(u, pm, name="twos to threes")


class ThreesRenderer(PythonRenderer):
  extra_passes = (("expand", "twos to threes", _twos_to_threes),)


def _ast(scale: float = 2.0) -> UOp:
  a = Tensor(np.arange(16, dtype=np.float32).reshape(4, 4))
  items, _ = create_schedule(((a * scale).sum(axis=1)).uop)
  return [it for it in items if it.kind == "kernel"][-1].ast


def test_the_pipeline_is_one_named_list_in_order():
  assert PASS_NAMES[:3] == ("unit ranges", "group reduces", "gpudims") and PASS_NAMES[-1] == "renderer rules"
  assert PASS_NAMES.index("expand") < PASS_NAMES.index("reduces") < PASS_NAMES.index("guards")
  assert len(set(PASS_NAMES)) == len(PASS_NAMES)


def test_a_renderer_adds_a_pass_after_a_named_one():
  r = ThreesRenderer("PYTHON")
  names = [p.name for p in passes_for(r)]
  assert names[names.index("expand") + 1] == "twos to threes" and len(names) == len(PASS_NAMES) + 1
  SEEN.clear()
  prg = get_program(_ast(), r)
  assert SEEN and Ops.REDUCE in SEEN[0], "the pass runs after the expander, before the reductions are lowered"
  # the pass changed the kernel: the constant it rewrote is what the source computes with
  assert "3.0" in prg.source and "2.0" not in prg.source
  plain = get_program(_ast(), PythonRenderer("PYTHON"))
  assert "2.0" in plain.source


def test_a_pass_placed_after_an_unknown_one_is_an_error_naming_it():
  class Bad(PythonRenderer):
    extra_passes = (("no such pass", "mine", lambda u, r: u),)
  with pytest.raises(RendererError, match=r"Bad\.extra_passes: pass 'mine' is to run after 'no such pass'"):
    passes_for(Bad("PYTHON"))
  class Malformed(PythonRenderer):
    extra_passes = (("expand", lambda u, r: u),)  # type: ignore[assignment]
  with pytest.raises(RendererError, match="extra_passes must be a tuple of"):
    Malformed("PYTHON")


def test_an_unknown_entry_pass_is_an_error():
  with pytest.raises(ValueError, match="enters the codegen at 'nowhere'"):
    run_passes(_ast(), PythonRenderer("PYTHON"), "nowhere")


SHAPE = AttentionShape(1, 2, 8, 8, 4, 4, dtypes.float32, None, True, 0.5)


def test_attention_kernels_go_through_get_program(monkeypatch: pytest.MonkeyPatch):
  monkeypatch.setattr(codegen, "_cache", {})
  r = PythonRenderer("PYTHON")
  before = codegen.codegen_seconds[0]
  t = trace.enable()
  try: prg = attention_program(SHAPE, r, "backward_kv")
  finally: trace.disable()
  assert codegen.codegen_seconds[0] > before  # one codegen timing
  assert attention_program(SHAPE, r, "backward_kv") is prg  # one program cache
  assert prg.name.startswith("flash_attn_bwd_kv") and prg.ast.src == ()  # nothing may optimize or lower it again
  (k,) = t.kernels
  names = [n for n, _ in k.stages]
  # one trace: the kernel joins at its entry pass (no optimizer stage), then the pipeline's passes in order
  assert names[0] == "ast" and "optimized" not in names and names[-1] == "linear"
  assert names[1:-1] == [p for p in PASS_NAMES[PASS_NAMES.index("symbolic"):] if p in names], names
  assert "reduces" in names


def test_attention_sink_rejects_an_unknown_kind():
  with pytest.raises(ValueError, match="attention kernel kind must be one of"):
    attention_sink(SHAPE, PythonRenderer("PYTHON"), "sideways")


def test_joined_loads_read_interleaved_runs_as_vector_loads():
  # a tensor core's operand fragment: lane 2i reads row k at column i, lane 2i+1 row k+1 (vdpbf16ps's column pairs)
  from plugrad.codegen.expand import join_accesses
  from plugrad.uop.ops import AxisType
  buf = UOp(Ops.DEFINE_GLOBAL, dtypes.bfloat16.ptr(4096), (), 1)
  r = UOp.range(UOp.const(dtypes.index, 8), 0, AxisType.LOOP)
  def ld(off: int) -> UOp: return buf.index(r * 512 + off).load()
  pairs = UOp(Ops.VECTORIZE, dtypes.bfloat16.vec(32), tuple(ld(512 * (i % 2) + i // 2) for i in range(32)))
  out = join_accesses(pairs, vector_width=16)
  runs = sorted({g.src[0] for g in out.src}, key=lambda v: linear_const(v.src[0].src[1]))
  assert out.op is Ops.VECTORIZE and [g.op for g in out.src] == [Ops.GEP] * 32
  assert [(v.op, v.dtype) for v in runs] == [(Ops.LOAD, dtypes.bfloat16.vec(16))] * 2
  assert [(out.src[i].src[0] is runs[i % 2], out.src[i].arg) for i in range(32)] == [(True, (i // 2,)) for i in range(32)]
  # cast lanes are cast vectors; a gather (a transposed read), a short vector and a renderer without lanes stay as they are
  casts = UOp(Ops.VECTORIZE, dtypes.float32.vec(32), tuple(u.cast(dtypes.float32) for u in pairs.src))
  assert (j := join_accesses(casts, 16)).op is Ops.CAST and j.src[0].op is Ops.VECTORIZE and j.src[0].src[0].op is Ops.GEP
  gather = UOp(Ops.VECTORIZE, dtypes.bfloat16.vec(16), tuple(ld(512 * i) for i in range(16)))
  short = UOp(Ops.VECTORIZE, dtypes.bfloat16.vec(2), (ld(0), ld(1)))
  assert join_accesses(gather, 16) is gather and join_accesses(short, 16) is short and join_accesses(pairs, 1) is pairs
  # rows that would start off a multiple of their length, or more lanes than the renderer's vectors: a GPU's vector types
  # need their natural alignment
  shifted = UOp(Ops.VECTORIZE, dtypes.bfloat16.vec(32), tuple(ld(512 * (i % 2) + i // 2 + 1) for i in range(32)))
  assert join_accesses(shifted, 16) is shifted and join_accesses(pairs, 4) is pairs


def linear_const(idx: UOp) -> int:
  from plugrad.codegen.expand import linear_terms
  return linear_terms(idx)[1]


def test_joined_stores_write_every_lane_of_a_vector_as_one_store():
  # a tensor core's accumulator, each lane cast to bfloat16 and stored on its own: one vector store of the cast vector
  from plugrad.codegen.expand import join_accesses
  from plugrad.uop.ops import AxisType
  buf = UOp(Ops.DEFINE_GLOBAL, dtypes.bfloat16.ptr(4096), (), 0)
  src = UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(4096), (), 1)
  r = UOp.range(UOp.const(dtypes.index, 8), 0, AxisType.LOOP)
  acc = src.index(r * 64).load(dtype=dtypes.float32.vec(16))
  def st(i: int, lane: int) -> UOp: return buf.index(r * 64 + 16 + i).store(acc.gep(lane).cast(dtypes.bfloat16))
  out = join_accesses(UOp(Ops.GROUP, dtypes.void, tuple(st(i, i) for i in range(16))), 16)
  (one,) = out.src
  assert one.op is Ops.STORE and one.src[1].op is Ops.CAST and one.src[1].dtype == dtypes.bfloat16.vec(16) and one.src[1].src[0] is acc
  # lanes out of order, or one lane missing, stay as they are
  for bad in ([st(i, 15 - i) for i in range(16)], [st(i, i) for i in range(15)]):
    g = UOp(Ops.GROUP, dtypes.void, tuple(bad))
    assert join_accesses(g, 16) is g
