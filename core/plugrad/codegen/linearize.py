"""The linearizer: a lowered kernel graph → the ordered uops of a LINEAR program (docs/ir.md, stage 3).

Loops are blocks. A node belongs to the innermost block among the RANGEs it depends on (so loop-invariant work is
hoisted out), an `END(effect, r)` is the loop over `r` as one unit inside its enclosing block, and inside a block the
nodes and loop units are ordered topologically. The final pass turns `END` into `ENDRANGE`, drops the placement
sources the lowering added, and narrows the symbolic `index` dtype to int32 (int64 when a value needs it).
"""
from __future__ import annotations

from plugrad.dtype import DType, PtrDType, dtypes
from plugrad.uop.ops import Ops, UOp


class LinearizeError(RuntimeError):
  """The graph has no valid loop structure (a value used in two sibling loops, an END of a range it is not inside)."""


Block = frozenset[UOp]


def _ranges_of(topo: dict[UOp, None]) -> dict[UOp, Block]:
  rs: dict[UOp, Block] = {}
  for u in topo:
    s: frozenset[UOp] = frozenset().union(*(rs[x] for x in u.src)) if u.src else frozenset()
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

  def place(u: UOp) -> Block:
    fits = [b for b in blocks if rs[u] <= b]
    if not fits: raise LinearizeError(f"{u.op.name} depends on ranges {sorted(r.arg[0] for r in rs[u])} that are never closed by an END")
    best = min(fits, key=len)
    if any(len(b) == len(best) and b != best for b in fits): raise LinearizeError(f"{u.op.name} is used inside two sibling loops")
    return best

  placed = {u: place(u) for u in topo if u.op not in (Ops.SINK, Ops.RANGE)}
  order = {u: i for i, u in enumerate(topo)}
  members: dict[Block, list[UOp]] = {b: [] for b in blocks}
  for u, b in placed.items(): members[b].append(u)

  def rep(u: UOp, b: Block) -> UOp | None:
    """What stands for `u` among the members of block `b`: u itself, the loop unit that contains it, or None (outer)."""
    pu = placed.get(u)
    if pu is None or not b <= pu or pu == b: return u if pu == b else None
    for e in ends:
      if placed[e] == b and inner[e] <= pu: return e
    return None

  def deps(m: UOp, b: Block) -> list[UOp]:
    # a loop unit waits for everything its body (and its RANGE's bound) uses from this block
    nodes = [m] if m.op is not Ops.END else [x for x, p in placed.items() if inner[m] <= p] + [m, m.src[1]]
    out: dict[UOp, None] = {}
    for x in nodes:
      for s in x.src:
        if (r := rep(s, b)) is not None and r is not m: out[r] = None
    return sorted(out, key=order.__getitem__)

  out: list[UOp] = []

  def emit(b: Block) -> None:
    done: set[UOp] = set()
    for m in sorted(members[b], key=order.__getitem__):
      stack = [(m, False)]
      while stack:
        x, ready = stack.pop()
        if x in done: continue
        if not ready:
          stack.append((x, True))
          stack.extend((d, False) for d in reversed(deps(x, b)) if d not in done)
          continue
        done.add(x)
        if x.op is Ops.END:
          out.append(x.src[1])
          emit(inner[x])
        out.append(x)

  emit(frozenset())
  return _finalize(out)


def _index_dtype(nodes: list[UOp]) -> DType:
  for u in nodes:
    if u.dtype is dtypes.index and (u.vmin < -(2**31) or u.vmax > 2**31 - 1): return dtypes.int64
  return dtypes.int32


def _finalize(nodes: list[UOp]) -> list[UOp]:
  idx_dt = _index_dtype(nodes)
  new: dict[UOp, UOp] = {}
  out: list[UOp] = []
  for u in nodes:
    if u.op is Ops.END:
      new[u] = UOp(Ops.ENDRANGE, dtypes.void, (new[u.src[1]],))
      out.append(new[u])
      continue
    if u.op in (Ops.GROUP, Ops.NOOP): continue  # only grouped effects for the placement
    src: tuple[UOp, ...]
    if u.op is Ops.BARRIER: src = ()  # its sources only ordered it after the stores it guards
    elif u.op is Ops.STORE: src = (new[u.src[0]], new[u.src[1]])  # further sources only pinned its place
    elif u.op is Ops.LOAD:  # keep the alt value and ENDs (ordering); drop placement sources
      src = (new[u.src[0]], *(new[s] for s in u.src[1:] if s.op is Ops.END or (s.dtype is not dtypes.void and s.op is not Ops.RANGE)))
    else: src = tuple(new[s] for s in u.src)
    dt: DType = u.dtype
    if not isinstance(dt, PtrDType) and dt.scalar() is dtypes.index: dt = idx_dt.vec(dt.count)
    nu = UOp(u.op, dt, src, u.arg)
    new[u] = nu
    out.append(nu)
  return list(dict.fromkeys(out))
