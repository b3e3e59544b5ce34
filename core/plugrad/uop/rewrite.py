"""`graph_rewrite`: apply a PatternMatcher to every node of a graph until no rule fires anywhere.

Both orders reach a graph where no rule matches any node; they differ in which rule gets the first chance:
- bottom-up (default): a node's sources are rewritten first, then the node; a replacement is itself rewritten.
- top-down (`top_down=True`): a node is rewritten (to a fixed point) before its sources are visited, which lets a
  rule see (and replace) a whole subtree before its parts are simplified.
The walk is iterative (no recursion limit on deep graphs) and each node is processed once per distinct UOp.
"""
from __future__ import annotations

from typing import Any, cast

import plugrad.trace as trace
from plugrad.helpers import REWRITE_STEPS
from plugrad.uop.ops import UOp
from plugrad.uop.pattern import PatternMatcher


class RewriteNotConverging(RuntimeError):
  """A rewrite kept firing (a cycle between rules, or a rule that keeps growing the graph)."""


def _no_convergence(pm: PatternMatcher, u: UOp, ctx: Any, why: str, name: str | None) -> RewriteNotConverging:
  rule = pm.firing_rule(u, ctx)
  where = f"rule {rule.pat!r} at {rule.location}" if rule is not None else "an unknown rule"
  return RewriteNotConverging(f"graph_rewrite{f' {name!r}' if name else ''} does not converge: {why}; {where} keeps firing on "
                              f"{u.op!r} {u.dtype!r} {str(u.arg)[:60]}")


def graph_rewrite(sink: UOp, pm: PatternMatcher, ctx: Any = None, *, top_down: bool = False, name: str | None = None,
                  cache: dict[UOp, UOp] | None = None) -> UOp:
  """Rewrite `sink` with `pm` to a fixed point. `ctx` is passed to rules that take a `ctx` argument.

  `cache` (bottom-up only, for rules that do not use `ctx`): each node's result, kept across calls that pass the same
  dict with the same `pm`. A node's bottom-up result depends only on its own subgraph, so many small rewrites of graphs
  that share parts (the indices of a kernel's lanes) rewrite each shared node once."""
  if trace.TRACING and (rec := trace.rewrite_begin(pm, sink, name)) is not None:  # VIZ records the rules that fire
    out = (_top_down if top_down else _bottom_up)(sink, cast(PatternMatcher, rec), ctx, name)
    trace.rewrite_end(rec, out)
    return out
  if top_down: return _top_down(sink, pm, ctx, name)
  return _bottom_up(sink, pm, ctx, name, cache)


def _rebuild(n: UOp, done: dict[UOp, UOp]) -> UOp:
  src = n.src
  new = tuple([done[s] for s in src])
  for a, b in zip(new, src):
    if a is not b: return UOp(n.op, n.dtype, new, n.arg)
  return n


def _bottom_up(root: UOp, pm: PatternMatcher, ctx: Any, name: str | None, cache: dict[UOp, UOp] | None = None) -> UOp:
  done: dict[UOp, UOp] = {} if cache is None else cache
  budget = int(REWRITE_STEPS.value)
  rewrite = pm.rewrite
  # a plain matcher's rules are tried here, not through pm.rewrite: one call less per node (VIZ's recorder keeps it)
  fast = pm.fast if type(pm) is PatternMatcher else None
  # stack entries: (node, stage, link). stage 0: visit sources; 1: rebuild and match; 2: take the result of `link`.
  stack: list[tuple[UOp, int, UOp | None]] = [(root, 0, None)]
  active: set[UOp] = set()  # replacements being rewritten (a repeat means a cycle)
  while stack:
    n, stage, link = stack.pop()
    if stage == 0:
      if n in done: continue
      stack.append((n, 1, None))
      for s in reversed(n.src):
        if s not in done: stack.append((s, 0, None))
    elif stage == 1:
      if n in done: continue
      if src := n.src:
        new = tuple([done[s] for s in src])
        nn = n if new == src else UOp(n.op, n.dtype, new, n.arg)  # UOp has no __eq__: == compares by identity
      else: nn = n
      r: UOp | None = None
      if fast is None: r = rewrite(nn, ctx)
      else:
        for fn in fast.get(nn.op, ()):
          if (r := fn(nn, ctx)) is not None: break
      if r is None or r is nn:
        done[n] = nn
        done.setdefault(nn, nn)
        active.discard(n)
        continue
      if (budget := budget - 1) < 0: raise _no_convergence(pm, nn, ctx, f"more than {REWRITE_STEPS.value} rule applications", name)
      if r in active: raise _no_convergence(pm, nn, ctx, "a rewrite cycle (a result contains or returns to an earlier form)", name)
      active.add(n)
      stack.append((n, 2, r))
      if r not in done:
        active.add(r)
        stack.append((r, 0, None))
    else:
      assert link is not None
      done[n] = done[link]
      active.discard(n); active.discard(link)
  return done[root]


def _top_down(root: UOp, pm: PatternMatcher, ctx: Any, name: str | None) -> UOp:
  done: dict[UOp, UOp] = {}
  budget = int(REWRITE_STEPS.value)
  rewrite = pm.rewrite
  # stage 0: rewrite n itself to a fixed point, then visit the sources of the result; 1: rebuild it from the
  # rewritten sources (a changed node goes round again); 2: take the result of `link`.
  stack: list[tuple[UOp, int, UOp | None]] = [(root, 0, None)]
  active: set[UOp] = set()
  while stack:
    n, stage, link = stack.pop()
    if stage == 0:
      if n in done: continue
      if n in active: raise _no_convergence(pm, n, ctx, "a rewrite cycle (a result contains or returns to an earlier form)", name)
      active.add(n)
      x, seen = n, {n}
      while (r := rewrite(x, ctx)) is not None and r is not x:
        if (budget := budget - 1) < 0: raise _no_convergence(pm, x, ctx, f"more than {REWRITE_STEPS.value} rule applications", name)
        if r in seen: raise _no_convergence(pm, x, ctx, "a rewrite cycle (a result contains or returns to an earlier form)", name)
        seen.add(r)
        x = r
      if x is not n and x in done:
        done[n] = done[x]
        active.discard(n)
        continue
      stack.append((n, 1, x))
      for s in reversed(x.src):
        if s not in done: stack.append((s, 0, None))
    elif stage == 1:
      assert link is not None
      nn = _rebuild(link, done)
      if nn is link:
        done[n] = done[link] = link
        active.discard(n)
      else:
        if (budget := budget - 1) < 0: raise _no_convergence(pm, nn, ctx, f"more than {REWRITE_STEPS.value} rule applications", name)
        stack.append((n, 2, nn))
        stack.append((nn, 0, None))
    else:
      assert link is not None
      done[n] = done[link]
      active.discard(n)
  return done[root]
