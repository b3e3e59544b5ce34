"""The codegen pipeline after the optimizer: one ordered list of named passes, optimized kernel AST → the graph the
linearizer orders (docs/architecture.md, "The codegen passes", gives each pass's contract).

Every kernel goes through this list: the optimizer's output from the first pass, a kernel written by hand in lowered
form (fused attention: explicit loops and registers) from the pass named by its `KernelInfo.entry_pass`. A renderer adds
its own passes at named points (`Renderer.extra_passes`), never by editing the list. While tracing (VIZ, process
replay) every pass's result is recorded as a stage of the kernel.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import plugrad.trace as trace
from plugrad.codegen.decompose import DECOMPOSITIONS
from plugrad.codegen.expand import expand, join_accesses
from plugrad.codegen.linearize import linearize
from plugrad.codegen.lower import add_gpudims, drop_unit_ranges, lower_group_reduces, lower_reduces, simplify_gated_indices, split_ends
from plugrad.renderer.base import Renderer, RendererError
from plugrad.uop.ops import KernelInfo, UOp
from plugrad.uop.rewrite import graph_rewrite
from plugrad.uop.symbolic import symbolic


@dataclass
class PassContext:
  """What a pass may read besides the graph: the renderer, the kernel's info, and one rewrite cache shared by the two
  gated-index passes (the lanes' indices and their forms under each gate share most of their nodes)."""
  renderer: Renderer
  info: KernelInfo
  memo: dict[UOp, UOp] = field(default_factory=dict)

  def simplify(self, u: UOp) -> UOp: return graph_rewrite(u, symbolic, name="gated index", cache=self.memo)


@dataclass(frozen=True)
class Pass:
  """One step of the pipeline: `run(graph, ctx)` returns the rewritten graph (the same object when nothing applies)."""
  name: str
  run: Callable[[UOp, PassContext], UOp]


def _on_renderer(fn: Callable[[UOp, Renderer], UOp]) -> Callable[[UOp, PassContext], UOp]:
  return lambda u, c: fn(u, c.renderer)


PASSES: tuple[Pass, ...] = (
  Pass("unit ranges", lambda u, c: drop_unit_ranges(u)),
  Pass("group reduces", lambda u, c: lower_group_reduces(u)),
  Pass("gpudims", lambda u, c: add_gpudims(u, c.renderer, c.info.dont_use_locals)),
  # gated indices simplified once per access before the expander copies them per lane (the lanes' indices differ)
  Pass("gated indices", lambda u, c: simplify_gated_indices(u, c.simplify)),
  Pass("expand", lambda u, c: expand(u, c.renderer.vector_width, c.renderer.masked_access)),
  Pass("symbolic", lambda u, c: graph_rewrite(u, symbolic, name="symbolic")),
  Pass("lane indices", lambda u, c: simplify_gated_indices(u, c.simplify)),
  Pass("joined accesses", lambda u, c: join_accesses(u, c.renderer.vector_width)),
  Pass("reduces", lambda u, c: lower_reduces(u)),
  Pass("split ends", lambda u, c: split_ends(u)),
  *(Pass(name, _on_renderer(fn)) for name, fn in DECOMPOSITIONS),
)
PASS_NAMES = tuple(p.name for p in PASSES)


def passes_for(renderer: Renderer) -> tuple[Pass, ...]:
  """PASSES with the renderer's `extra_passes` ((after, name, fn(graph, renderer)) each) placed after the pass each names,
  in the order given."""
  extra = renderer.extra_passes
  if not extra: return PASSES
  out = list(PASSES)
  for after, name, fn in extra:
    names = [p.name for p in out]
    if after not in names:
      raise RendererError(f"{type(renderer).__name__}.extra_passes: pass {name!r} is to run after {after!r}, which is not a codegen pass "
                          f"(one of {names})")
    out.insert(names.index(after) + 1, Pass(name, _on_renderer(fn)))
  return tuple(out)


def run_passes(ast: UOp, renderer: Renderer, start: str | None = None) -> UOp:
  """`ast` through the pipeline from pass `start` (default: the first) to the end."""
  info = ast.arg if isinstance(ast.arg, KernelInfo) else KernelInfo()
  passes = passes_for(renderer)
  names = [p.name for p in passes]
  if start is not None and start not in names:
    raise ValueError(f"kernel {info.name!r} enters the codegen at {start!r}, which is not a pass (one of {names})")
  ctx = PassContext(renderer, info)
  for p in passes[names.index(start) if start is not None else 0:]:
    new = p.run(ast, ctx)
    if trace.TRACING and new is not ast: trace.stage(p.name, new)  # VIZ steps through the passes that changed something
    ast = new
  return ast


def lower(opt_ast: UOp, renderer: Renderer) -> list[UOp]:
  """An optimized kernel AST (or a kernel in lowered form, from its entry pass) → the linear uops."""
  info = opt_ast.arg if isinstance(opt_ast.arg, KernelInfo) else KernelInfo()
  return linearize(run_passes(opt_ast, renderer, info.entry_pass or None))


__all__ = ["PASSES", "PASS_NAMES", "Pass", "PassContext", "lower", "passes_for", "run_passes"]
