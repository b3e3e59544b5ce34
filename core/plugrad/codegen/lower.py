"""Lowering a kernel AST toward the linear program: workgroup dimensions for devices that have them, and reductions
turned into register accumulators with explicit loops."""
from __future__ import annotations

from collections.abc import Callable

from plugrad.dtype import AddrSpace, dtypes
from plugrad.helpers import ceildiv, prod
from plugrad.renderer.base import Renderer
from plugrad.uop.ops import AxisType, Ops, UOp, reduce_identity, sint


def add_gpudims(ast: UOp, renderer: Renderer, dont_use_locals: bool = False) -> UOp:
  """On a device with workgroups, the output loops become launch indices: the LOOP/GLOBAL ranges one flat global
  index, the LOCAL and GROUP_REDUCE ranges (from the optimizer) one flat local index (the last range varies fastest,
  so a tensor core's lane range, added last, is the lane). Without local ranges the flat output index is split as
  `gidx0 * L + lidx0` (L = 1 under NOLOCALS), the store gated when L does not divide the size; loads stay in bounds
  because that flat index is clamped. UPCAST ranges stay for the expander."""
  if not renderer.has_local: return ast
  ends = [u for u in ast.src if u.op is Ops.END]
  if len(ends) != 1 or ast.src != (ends[0],): return ast
  end = ends[0]
  body, rngs = end.src[0], end.src[1:]
  glob = [r for r in rngs if r.arg[1] in (AxisType.LOOP, AxisType.GLOBAL)]
  locs = [r for r in rngs if r.arg[1] in (AxisType.LOCAL, AxisType.GROUP_REDUCE)]
  rest = tuple(r for r in rngs if r not in glob and r not in locs)
  if any(r.arg[1] is not AxisType.UPCAST for r in rest): return ast
  def size(r: UOp) -> sint: return r.src[0].arg if r.src[0].op is Ops.CONST else r.src[0]
  def unflatten(flat: UOp, rs: list[UOp]) -> dict[UOp, UOp]:
    sub: dict[UOp, UOp] = {}
    stride: sint = 1
    for n, r in reversed(list(enumerate(rs))):
      q = flat // stride if not (isinstance(stride, int) and stride == 1) else flat
      sub[r] = q if n == 0 else q % size(r)
      stride = stride * size(r)
    return sub
  total: sint = prod([size(r) for r in glob])
  gate: UOp | None = None
  if locs:
    lsz = prod([size(r) for r in locs])
    if isinstance(total, int) and renderer.global_max and total > renderer.global_max[0]: return ast
    sub = unflatten(UOp.special(total, "gidx0"), glob) if glob else {}
    sub.update(unflatten(UOp.special(lsz, "lidx0"), locs))
  else:
    if (launch := flat_launch_index(total, renderer, dont_use_locals)) is None: return ast
    flat, gate = launch
    sub = unflatten(flat, glob)
  stores = [u for u in body.toposort if u.op is Ops.STORE and u.src[0].src[0].op is Ops.DEFINE_GLOBAL] if gate is not None else []
  if stores and gate is not None: body = body.substitute({st: _gated(st, gate) for st in stores})
  body = body.substitute(sub)
  return ast.replace(src=(UOp(Ops.END, dtypes.void, (body, *rest)) if rest else body,))


def flat_launch_index(total: sint, renderer: Renderer, dont_use_locals: bool = False) -> tuple[UOp, UOp | None] | None:
  """(a flat index over `total` output positions from launch indices, the gate of positions past the end or None), or
  None when the workgroups would exceed the device's grid: `gidx0 * L + lidx0` (L = 1 under NOLOCALS); the index is
  clamped to the last position so loads stay in bounds, and stores take the gate."""
  lmax = renderer.local_max[0] if renderer.local_max else 1
  lsz = 1 if dont_use_locals else min(total, 128, lmax) if isinstance(total, int) else min(32, lmax)
  groups = ceildiv(total, lsz)
  if isinstance(groups, int) and renderer.global_max and groups > renderer.global_max[0]: return None
  flat = UOp.special(groups, "gidx0") * lsz + UOp.special(lsz, "lidx0") if lsz != 1 else UOp.special(groups, "gidx0")
  if isinstance(total, int) and total % lsz == 0: return flat, None
  return flat.minimum(total - 1), flat < total


def _gated(st: UOp, gate: UOp) -> UOp:
  """STORE `st` with `gate` and-ed into its INDEX's gate."""
  ix = st.src[0]
  return st.replace(src=(ix.replace(src=(*ix.src[:2], gate if len(ix.src) == 2 else ix.src[2] & gate)), st.src[1]))


def drop_unit_ranges(ast: UOp) -> UOp:
  """Ranges of size 1 (left by splitting a whole axis off) become the index 0 and leave the END/REDUCE range lists."""
  unit = {u for u in ast.toposort if u.op is Ops.RANGE and u.src[0].op is Ops.CONST and u.src[0].arg == 1}
  if not unit: return ast
  zero = UOp.const(dtypes.index, 0)
  done: dict[UOp, UOp] = {}
  for u in ast.toposort:
    if u in unit:
      done[u] = zero
      continue
    if u.op in (Ops.END, Ops.REDUCE) and any(r in unit for r in u.src[1:]):
      rest = tuple(done[r] for r in u.src[1:] if r not in unit)
      if u.op is Ops.END and not rest: done[u] = done[u.src[0]]
      elif u.op is Ops.REDUCE and not rest: done[u] = UOp(Ops.REDUCE, u.dtype, (done[u.src[0]],), u.arg)
      else: done[u] = UOp(u.op, u.dtype, (done[u.src[0]], *rest), u.arg)
      continue
    new_src = tuple(done[s] for s in u.src)
    done[u] = u if all(a is b for a, b in zip(new_src, u.src)) else UOp(u.op, u.dtype, new_src, u.arg)
  return done[ast]


def lower_group_reduces(ast: UOp) -> UOp:
  """A REDUCE over a GROUP_REDUCE range g (the GROUP action): each of the g threads of the workgroup reduces its share
  into a register, writes it to workgroup memory, and after a barrier every thread combines the g partial results
  (one store, by the thread with g == 0). The workgroup memory is indexed by the flat position among the kernel's
  LOCAL and GROUP_REDUCE ranges, so other local axes keep their own slots."""
  reds = [u for u in ast.toposort if u.op is Ops.REDUCE and any(r.arg[1] is AxisType.GROUP_REDUCE for r in u.src[1:])]
  if not reds: return ast
  if len(reds) != 1 or len(ast.src) != 1: raise ValueError("a GROUP_REDUCE range needs a kernel with one reduction and one store")
  red, end = reds[0], ast.src[0]
  if end.op is not Ops.END: end = UOp(Ops.END, dtypes.void, (end,))  # a single output: no loops around the store
  (g,) = [r for r in red.src[1:] if r.arg[1] is AxisType.GROUP_REDUCE]
  own = tuple(r for r in red.src[1:] if r is not g)
  locs = [r for r in end.src[1:] if r.arg[1] is AxisType.LOCAL] + [g]
  sizes = [r.src[0].arg for r in locs]
  def flat_of(rs: list[UOp]) -> UOp:
    out: UOp = UOp.const(dtypes.index, 0)
    for r, st in zip(rs, [prod(sizes[n + 1:]) for n in range(len(sizes))]): out = out + r * st
    return out
  partial = UOp(Ops.REDUCE, red.dtype, (red.src[0], *own), red.arg) if own else red.src[0]
  smem = UOp(Ops.DEFINE_LOCAL, red.dtype.ptr(prod(sizes), AddrSpace.LOCAL), (), "group_partials")
  bar = UOp(Ops.BARRIER, dtypes.void, (smem.index(flat_of(locs)).store(partial),))
  g2 = UOp.range(g.src[0].arg, 1 + max(r.arg[0] for r in ast.toposort if r.op is Ops.RANGE), AxisType.REDUCE)
  combined = UOp(Ops.REDUCE, red.dtype, (UOp(Ops.LOAD, red.dtype, (smem.index(flat_of(locs[:-1] + [g2])), bar)), g2), red.arg)
  body = end.src[0].substitute({red: combined})
  first = g < 1
  stores = [u for u in body.toposort if u.op is Ops.STORE and u.src[0].src[0].op is Ops.DEFINE_GLOBAL]
  body = body.substitute({st: _gated(st, first) for st in stores})
  return ast.replace(src=(UOp(Ops.END, dtypes.void, (body, *end.src[1:], g)),))


def lower_reduces(ast: UOp, mulacc: bool = True) -> UOp:
  """REDUCE(value, *ranges) → an accumulator: `acc = identity` before the loops, `acc = acc op value` inside them,
  and a read of `acc` after the loops end. Extra sources on the STORE/LOAD pin where the linearizer places them: in
  the innermost loop among those the value depends on (a reduction that does not vary along an enclosing loop is
  hoisted out of it).

  Reductions over the same ranges (the copies the expander made of one reduction) share one loop, and so every member
  starts its accumulator inside all the loops any member depends on: a copy that lost an enclosing loop (a padded
  copy reading only the pad's fill, a constant) would otherwise start outside it and add up across its iterations,
  while the shared loop runs inside it. A value that is an
  UNROLL of n values (an unrolled reduce axis) folds them in order into the accumulator; with `mulacc`, a float ADD of
  a product becomes MULACC (a fused multiply-add, one rounding). Every END over several ranges comes out as nested
  single-range ENDs (split_ends) when the kernel has a reduction."""
  topo = ast.toposort
  reduces = [u for u in topo if u.op is Ops.REDUCE]
  if not reduces: return ast
  sub: dict[UOp, UOp] = {}
  groups: dict[tuple[UOp, ...], list[tuple[UOp, tuple[UOp, ...], set[UOp], int]]] = {}  # own -> (reduce, values, context, acc)
  pending: dict[UOp, tuple[UOp, ...]] = {}  # reduce -> its group, until the group's loop is built
  def flush(own: tuple[UOp, ...]) -> None:
    members = groups.pop(own)
    context = tuple(sorted(set().union(*(m[2] for m in members)), key=lambda r: r.arg[0]))
    updates = [_accumulate(red, vals, own, context, n, mulacc) for red, vals, _, n in members]
    loop = split_end(updates[0] if len(updates) == 1 else UOp(Ops.GROUP, dtypes.void, tuple(updates)), own)
    for (red, *_), upd in zip(members, updates):
      sub[red] = UOp(Ops.LOAD, red.dtype, (upd.src[0], loop))
      del pending[red]
  # `sub` applied, memoized over the whole pass: a reduction is in `sub` before any value holding it is rebuilt, and its
  # entry never changes, so a node's image is the same each time (the copies' values share their loads and epilogues).
  # An END over several ranges is split here too (what split_ends would do after): a PACK copy's END sits below the
  # loads that read its array, so splitting it afterwards would rebuild every node above them a second time
  images: dict[UOp, UOp] = {}
  def substitute(root: UOp) -> UOp:
    stack = [root]
    while stack:
      if (n := stack[-1]) in images: stack.pop()
      elif (r := sub.get(n)) is not None: images[stack.pop()] = r
      elif missing := [x for x in n.src if x not in images]: stack.extend(missing)
      else:
        new_src = tuple([images[x] for x in stack.pop().src])
        if n.op is Ops.END and len(new_src) > 2: images[n] = split_end(new_src[0], new_src[1:])
        else: images[n] = n if new_src == n.src else UOp(n.op, n.dtype, new_src, n.arg)  # == compares UOps by identity
    return images[root]
  holds: dict[UOp, bool] = {}  # whether a node is or holds a reduction (most values hold none: no pending one to find)
  depth: dict[UOp, int] = {}  # how many reductions deep a node is (0: it holds none)
  for u in topo:
    holds[u] = u.op is Ops.REDUCE or any(holds[s] for s in u.src)
    depth[u] = max((depth[s] for s in u.src), default=0) + (u.op is Ops.REDUCE) if holds[u] else 0
  # accumulators numbered in graph order; the reductions taken level by level (those holding no reduction first, ...),
  # so an inner reduction is replaced before an outer one is built, and every copy of one reduction (the expander's:
  # all at one level) has joined its group before an outer one needs the group's loop: in graph order a copy would
  # come after the loop was built, and get a second loop over the same range
  acc_of = {r: n for n, r in enumerate(r for r in reduces if len(r.src) > 1)}
  for red in sorted(reduces, key=lambda r: depth[r]):
    if pending and holds[red.src[0]]:
      for own in {pending[r] for r in red.src[0].toposort if r in pending}: flush(own)
    value, own = substitute(red.src[0]), red.src[1:]
    vals = value.src if value.op is Ops.UNROLL else (value,)
    if not own:  # nothing to loop over (a fully unrolled axis): fold the values, no accumulator (products fused, as in a loop)
      cur = vals[0]
      for v in vals[1:]: cur = _fold(red, cur, v, mulacc)
      sub[red] = cur
      continue
    vtopo = value.toposort
    closed = {r for e in vtopo if e.op is Ops.END for r in e.src[1:]}  # loops of inner reductions, already lowered
    # the accumulator is placed by the loops its value depends on, not by the loops around its use: a row statistic
    # fused into the kernel that broadcasts it (softmax's max and sum) runs once per row, not once per output element
    context = {r for r in vtopo if r.op is Ops.RANGE and r not in own and r not in closed}
    groups.setdefault(own, []).append((red, vals, context, acc_of[red]))
    pending[red] = own
  for own in list(groups): flush(own)
  return substitute(ast)


def _accumulate(red: UOp, vals: tuple[UOp, ...], own: tuple[UOp, ...], context: tuple[UOp, ...], n: int, mulacc: bool) -> UOp:
  """The update `acc = acc op v...` of reduction `red` into accumulator number `n`, whose start (`acc = identity`) is
  pinned inside the loops `context` and whose update inside `own`."""
  acc = UOp(Ops.DEFINE_REG, red.dtype.ptr(1, AddrSpace.REG), (), n)
  idx = UOp(Ops.INDEX, acc.dtype, (acc, UOp.const(dtypes.index, 0)))
  init = UOp(Ops.STORE, dtypes.void, (idx, UOp.const(red.dtype, reduce_identity(red.arg, red.dtype)), *context))
  cur = UOp(Ops.LOAD, red.dtype, (idx, init, *own))
  for v in vals: cur = _fold(red, cur, v, mulacc)
  return UOp(Ops.STORE, dtypes.void, (idx, cur))


def _fold(red: UOp, cur: UOp, v: UOp, mulacc: bool) -> UOp:
  """`cur op v` for reduction `red`; with `mulacc`, a float sum of a product is one MULACC (a fused multiply-add)."""
  if mulacc and red.arg is Ops.ADD and v.op is Ops.MUL and dtypes.is_float(red.dtype): return UOp(Ops.MULACC, red.dtype, (v.src[0], v.src[1], cur))
  return UOp(red.arg, red.dtype, (cur, v))


def split_end(effect: UOp, ranges: tuple[UOp, ...]) -> UOp:
  """END(effect, r0, r1, ...) as nested single-range ENDs, r0 outermost."""
  for r in reversed(ranges): effect = UOp(Ops.END, dtypes.void, (effect, r))
  return effect


def split_ends(ast: UOp) -> UOp:
  """Every END over several ranges as nested single-range ENDs, inner ones first (a PACK copy loop sits inside the
  body of the store loop)."""
  topo = ast.toposort
  if not any(u.op is Ops.END and len(u.src) > 2 for u in topo): return ast
  done: dict[UOp, UOp] = {}
  for u in topo:
    if not (src := u.src):
      done[u] = u
      continue
    new_src = tuple([done[s] for s in src])
    if u.op is Ops.END and len(src) > 2: done[u] = split_end(new_src[0], new_src[1:])
    else: done[u] = u if new_src == src else UOp(u.op, u.dtype, new_src, u.arg)  # == compares UOps by identity
  return done[ast]


# ---- gated memory accesses: the index only matters where the gate holds

def _clauses(gate: UOp) -> list[UOp]:
  if gate.op is Ops.AND and gate.dtype is dtypes.bool: return _clauses(gate.src[0]) + _clauses(gate.src[1])
  return [gate]


def _clause_bounds(c: UOp) -> tuple[UOp, int, int] | None:
  """(X, lo, hi) when clause `c` says X lies in [lo, hi] (X an integer expression, not a constant): `X < k`, `k < X`, and
  their negations `(X < k) != True`."""
  neg = False
  if c.op is Ops.CMPNE and c.src[1].op is Ops.CONST and c.src[1].arg is True and c.src[0].op is Ops.CMPLT: c, neg = c.src[0], True
  if c.op is not Ops.CMPLT or c.src[0].dtype is not dtypes.index: return None
  a, b = c.src
  if b.op is Ops.CONST and a.op is not Ops.CONST:
    x, lo, hi = a, a.vmin, a.vmax
    if neg: lo = max(lo, b.arg)   # X >= k
    else: hi = min(hi, b.arg - 1)
  elif a.op is Ops.CONST and b.op is not Ops.CONST:
    x, lo, hi = b, b.vmin, b.vmax
    if neg: hi = min(hi, a.arg)   # X <= k
    else: lo = max(lo, a.arg + 1)
  else: return None
  if not isinstance(lo, int) or not isinstance(hi, int) or lo > hi or (lo, hi) == (x.vmin, x.vmax): return None
  return x, lo, hi


_BOUND_SENSITIVE = frozenset({Ops.IDIV, Ops.MOD, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.WHERE, Ops.MAX})


def simplify_gated_index(idx: UOp, gate: UOp, simplify: Callable[[UOp], UOp]) -> UOp:
  """`idx` simplified with what `gate` says about the values it is used with: each clause `X < k` (or `k < X`) of the gate
  bounds X, so X is replaced by a variable with those bounds, the index simplified (a division whose quotient the
  bound makes constant folds away, a modulo that cannot wrap drops), and the variables put back. A padded window's
  index (the sums of a convolution's input gradient) loses most of its divisions this way. Valid because a gated
  access reads or writes nothing where the gate is false. Not for an index that loads (a gather's): what the gate says
  would also drop the gates of those loads, which run before the gated access and would then read out of bounds."""
  topo = idx.toposort
  # only a division, modulo, comparison or max can fold under a bound: an index without one (a padded vocabulary's 256
  # gated lanes, each a plain sum) is left alone without a rewrite per clause
  if any(u.op is Ops.LOAD for u in topo) or not any(u.op in _BOUND_SENSITIVE for u in topo): return idx
  back: dict[UOp, UOp] = {}
  new = idx
  for n, c in enumerate(_clauses(gate)):
    if back: c = simplify(c.substitute({x: v for v, x in back.items()}))
    if (b := _clause_bounds(c)) is None: continue
    x, lo, hi = b
    if not (sub := _sum_sub(new, x, v := UOp.variable(f"gate{n}_{id(x)}", lo, hi))): continue
    back[v] = x
    new = simplify(new.substitute(sub))
  if not back: return idx
  for v, x in reversed(back.items()): new = new.substitute({v: x})  # a later clause's X may hold an earlier variable
  new = simplify(new)
  return new if _ops(new) < _ops(idx) else idx


def _addends(u: UOp) -> list[UOp]: return _addends(u.src[0]) + _addends(u.src[1]) if u.op is Ops.ADD else [u]


def _sum_sub(idx: UOp, x: UOp, v: UOp) -> dict[UOp, UOp]:
  """Replacements putting `v` for `x` in `idx`: where `x` is a node of it, and where `x` is a sum whose addends are among
  those of a larger sum (the simplifier regroups sums: `(r1*21 + r2) + r4*6` holds `r2 + r4*6` only as addends)."""
  topo = idx.toposort
  sub: dict[UOp, UOp] = {x: v} if x in topo else {}
  if x.op is not Ops.ADD: return sub
  xs = _addends(x)
  for u in topo:
    if u.op is not Ops.ADD or u is x: continue
    rest = _addends(u)
    for t in xs:
      if t not in rest: break
      rest.remove(t)
    else:
      out = v
      for t in rest: out = out + t
      sub[u] = out
  return sub


def _ops(u: UOp) -> int: return sum(1 for x in u.toposort if x.op not in (Ops.CONST, Ops.RANGE, Ops.DEFINE_VAR, Ops.SPECIAL))


def simplify_gated_indices(ast: UOp, simplify: Callable[[UOp], UOp]) -> UOp:
  """Every gated INDEX of `ast` with its index simplified under its gate (simplify_gated_index)."""
  sub: dict[UOp, UOp] = {}
  for u in ast.toposort:
    if u.op is Ops.INDEX and len(u.src) > 2 and u.src[1].dtype is dtypes.index and u.src[1].op is not Ops.CONST:
      if (ni := simplify_gated_index(u.src[1], u.src[2], simplify)) is not u.src[1]: sub[u] = u.replace(src=(u.src[0], ni, *u.src[2:]))
  return ast.substitute(sub) if sub else ast
