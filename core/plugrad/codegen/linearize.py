"""The linearizer: a lowered kernel graph → the ordered uops of a LINEAR program (docs/ir.md, stage 3).

Loops are blocks. A node belongs to the innermost block among the RANGEs it depends on (so loop-invariant work is
hoisted out), an `END(effect, r)` is the loop over `r` as one unit inside its enclosing block, and inside a block the
nodes and loop units are ordered topologically. The final pass turns `END` into `ENDRANGE`, drops the placement
sources the lowering added, and narrows the symbolic `index` dtype to int32 (int64 when a value needs it).
"""
from __future__ import annotations

from collections.abc import Iterator

from plugrad.dtype import DType, PtrDType, dtypes
from plugrad.uop.ops import Ops, UOp


class LinearizeError(RuntimeError):
  """The graph has no valid loop structure (a value used in two sibling loops, an END of a range it is not inside)."""


Block = frozenset[UOp]


def _ranges_of(topo: dict[UOp, None]) -> dict[UOp, Block]:
  rs: dict[UOp, Block] = {}
  empty: Block = frozenset()
  for u in topo:
    s = empty
    for x in u.src:  # most sources share one set: a union only where a source adds ranges
      if (t := rs[x]) is not s and not t <= s: s = t if not s else s | t
    if u.op is Ops.RANGE: s = s | {u}
    elif u.op is Ops.END:
      if u.src[1] not in rs[u.src[0]]: raise LinearizeError(f"END of range {u.src[1].arg} closes an effect that is not inside that range")
      s = rs[u.src[0]] - {u.src[1]}
    rs[u] = s
  return rs


def linearize(sink: UOp) -> list[UOp]:
  topo = sink.toposort
  rs = _ranges_of(topo)
  if rs[sink]: raise LinearizeError(f"ranges {sorted(r.arg[0] for r in rs[sink])} are used but never closed by an END")
  ends = [u for u in topo if u.op is Ops.END]
  # a loop runs inside every loop its ranges run inside: a reduction that depends on an inner output axis only (an
  # avg-pool's count of valid cells) is computed inside the outer loops too, not in a loop beside them
  enc = {e.src[1]: rs[e] | {e.src[1]} for e in ends}
  def close(b: Block) -> Block:
    while (c := b.union(*(enc.get(r, frozenset()) for r in b))) != b: b = c
    return b
  inner = {e: close(rs[e] | {e.src[1]}) for e in ends}
  blocks: list[Block] = [frozenset(), *inner.values()]
  if len(set(blocks)) != len(blocks): raise LinearizeError("two loops over the same range in one kernel")

  # blocks by number (0: the kernel's top level); a node's ranges → the number of its block (many nodes share them)
  fitting: dict[Block, int] = {}
  def place(u: UOp) -> int:
    if (best := fitting.get(rs[u])) is not None: return best
    fits = [b for b in blocks if rs[u] <= b]
    if not fits: raise LinearizeError(f"{u.op.name} depends on ranges {sorted(r.arg[0] for r in rs[u])} that are never closed by an END")
    best_b = min(fits, key=len)
    if any(len(b) == len(best_b) and b != best_b for b in fits): raise LinearizeError(f"{u.op.name} is used inside two sibling loops")
    best = fitting[rs[u]] = blocks.index(best_b)
    return best

  placed = {u: place(u) for u in topo if u.op not in (Ops.SINK, Ops.RANGE)}
  order = {u: i for i, u in enumerate(topo)}
  members: list[list[UOp]] = [[] for _ in blocks]  # in topological order
  for u, i in placed.items(): members[i].append(u)
  block_of_end = {e: blocks.index(inner[e]) for e in ends}
  # within[b][p]: what stands among the members of block b for a node of block p: the first loop directly in b
  # around p (an END), or None when p is not inside b (p == b: the node itself, handled by the callers)
  within = [[next((e for e in ends if placed[e] == bi and inner[e] <= p), None) if b <= p else None for p in blocks] for bi, b in enumerate(blocks)]

  # the sources of each block's members by the block they are placed in: a loop unit's dependencies from its body are
  # then one lookup per (block inside it, block of the sources), not one per source
  by_block: list[dict[int, list[UOp]]] = [{} for _ in blocks]
  for p, ms in enumerate(members):
    groups = by_block[p]
    for x in ms:
      for s in x.src:
        if (q := placed.get(s)) is not None: groups.setdefault(q, []).append(s)
  inside = {e: [p for p, b in enumerate(blocks) if inner[e] <= b] for e in ends}  # the blocks of an END's body

  def deps(m: UOp, bi: int) -> list[UOp]:
    # a loop unit waits for everything its body (and its RANGE's bound) uses from this block
    row, out = within[bi], dict[UOp, None]()
    if m.op is Ops.END:
      for p in inside[m]:
        for q, ss in by_block[p].items():
          if q == bi: out.update(dict.fromkeys(ss))
          elif (r := row[q]) is not None and r is not m: out[r] = None
    for x in ((m, m.src[1]) if m.op is Ops.END else (m,)):
      for s in x.src:
        if (pi := placed.get(s)) is None: continue
        if (r := s if pi == bi else row[pi]) is not None and r is not m: out[r] = None
    return sorted(out, key=order.__getitem__)

  out: list[UOp] = []
  # the blocks being emitted, innermost last (a loop's body goes out where its END is reached, then the END): per block
  # its members not started yet, the walk of the current one (a node after what it waits for), the nodes done, those
  # waiting for their dependencies, and the END closing it. A loop, not a recursive closure: that would be a reference cycle holding every table above
  frames: list[tuple[int, Iterator[UOp], list[tuple[UOp, bool]], set[UOp], set[UOp], UOp | None]] = [(0, iter(members[0]), [], set(), set(), None)]
  while frames:
    bi, todo, stack, done, waiting, end = frames[-1]
    if not stack:
      if (m := next(todo, None)) is None:
        frames.pop()
        if end is not None: out.append(end)
        continue
      stack.append((m, False))
    x, ready = stack.pop()
    if x in done: continue
    if not ready:
      # waiting for a node that is waiting for it: no order exists (e.g. a block taken for the inside of a sibling
      # loop over the same range); without this the walk would grow its stack forever
      if x in waiting: raise LinearizeError(f"{x.op.name} waits for itself through its block's dependencies")
      waiting.add(x)
      stack.append((x, True))
      stack.extend((d, False) for d in reversed(deps(x, bi)) if d not in done)
      continue
    done.add(x)
    waiting.discard(x)
    if x.op is Ops.END:
      out.append(x.src[1])
      frames.append((block_of_end[x], iter(members[block_of_end[x]]), [], set(), set(), x))
    else: out.append(x)
  return _finalize(out)


def _index_dtype(nodes: list[UOp]) -> DType:
  for u in nodes:
    if u.dtype is dtypes.index and (u.vmin < -(2**31) or u.vmax > 2**31 - 1): return dtypes.int64
  return dtypes.int32


def _finalize(nodes: list[UOp]) -> list[UOp]:
  idx_dt, index, void = _index_dtype(nodes), dtypes.index, dtypes.void
  new: dict[UOp, UOp] = {}  # in the order of `nodes` (a repeated node keeps its first place)
  for u in nodes:
    op, usrc = u.op, u.src
    if op is Ops.END:
      new[u] = UOp(Ops.ENDRANGE, void, (new[usrc[1]],))
      continue
    if op is Ops.GROUP or op is Ops.NOOP: continue  # only grouped effects for the placement
    src: tuple[UOp, ...]
    if op is Ops.BARRIER: src = ()  # its sources only ordered it after the stores it guards
    elif op is Ops.STORE: src = (new[usrc[0]], new[usrc[1]])  # further sources only pinned its place
    elif op is Ops.LOAD:  # keep the alt value and ENDs (ordering); drop placement sources
      src = (new[usrc[0]], *(new[s] for s in usrc[1:] if s.op is Ops.END or (s.dtype is not void and s.op is not Ops.RANGE)))
    else: src = tuple([new[s] for s in usrc])
    dt: DType = u.dtype
    if dt is index or (dt.count != 1 and not isinstance(dt, PtrDType) and dt.scalar() is index): dt = idx_dt.vec(dt.count)
    # an unchanged node is itself: hash-consing would return it too, this skips the lookup
    new[u] = u if dt is u.dtype and src == usrc else UOp(op, dt, src, u.arg)
  return list(dict.fromkeys(new.values()))
