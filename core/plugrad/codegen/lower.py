"""Lowering a kernel AST toward the linear program: workgroup dimensions for devices that have them, and reductions
turned into register accumulators with explicit loops."""
from __future__ import annotations

import itertools
import math

from plugrad.dtype import AddrSpace, DType, dtypes
from plugrad.helpers import ceildiv, prod
from plugrad.renderer.base import Renderer
from plugrad.uop.ops import AxisType, Ops, UOp, sint


def reduce_identity(op: Ops, dt: DType) -> float | int | bool:
  if op is Ops.ADD: return 0
  if op is Ops.MUL: return 1
  if op is Ops.MAX: return -math.inf if dtypes.is_float(dt) else dtypes.min(dt)
  raise ValueError(f"no identity for a {op.name} reduction")


def add_gpudims(ast: UOp, renderer: Renderer) -> UOp:
  """On a device with workgroups, run every output element as one thread: the output loops become one flat index
  `gidx0 * L + lidx0` (split back into the loop indices by div/mod), the store gated when L does not divide the size.
  Loads stay in bounds because the flat index is clamped; only the store is masked."""
  if not renderer.has_local: return ast
  ends = [u for u in ast.src if u.op is Ops.END]
  if len(ends) != 1 or ast.src != (ends[0],): return ast
  end = ends[0]
  store, rngs = end.src[0], end.src[1:]
  if store.op is not Ops.STORE or any(r.op is not Ops.RANGE or r.arg[1] is not AxisType.LOOP for r in rngs): return ast
  total: sint = prod([r.src[0] if r.src[0].op is not Ops.CONST else r.src[0].arg for r in rngs])
  lmax = renderer.local_max[0] if renderer.local_max else 1
  lsz = min(total, 128, lmax) if isinstance(total, int) else min(32, lmax)
  groups = ceildiv(total, lsz)
  if isinstance(groups, int) and renderer.global_max and groups > renderer.global_max[0]: return ast
  flat = UOp.special(groups, "gidx0") * lsz + UOp.special(lsz, "lidx0")
  exact = isinstance(total, int) and total % lsz == 0
  clamped = flat if exact else flat.minimum(total - 1)
  sub: dict[UOp, UOp] = {}
  stride: sint = 1
  for i, r in reversed(list(enumerate(rngs))):
    size = r.src[0]
    q = clamped // stride if not (isinstance(stride, int) and stride == 1) else clamped
    sub[r] = q if i == 0 else q % size
    stride = stride * (size.arg if size.op is Ops.CONST else size)
  idx = store.src[0]
  gated = idx if exact else idx.replace(src=(*idx.src[:2], flat < total))
  new_store = store.replace(src=(gated.substitute(sub), store.src[1].substitute(sub)))
  return ast.replace(src=(new_store,))


def lower_reduces(ast: UOp) -> UOp:
  """REDUCE(value, *ranges) → an accumulator: `acc = identity` before the loops, `acc = acc op value` inside them,
  and a read of `acc` after the loops end. Extra sources on the STORE/LOAD pin where the linearizer places them."""
  topo = ast.toposort
  reduces = [u for u in topo if u.op is Ops.REDUCE]
  if not reduces: return ast
  # the loops around each node: the accumulator is reset once per iteration of all of them, even those its value
  # does not depend on (it is one register, not an array over the loops it could be hoisted out of)
  around: dict[UOp, frozenset[UOp]] = {ast: frozenset()}
  for u in reversed(topo):
    inside = around.get(u, frozenset()) | (frozenset(u.src[1:]) if u.op in (Ops.END, Ops.REDUCE) else frozenset())
    for i, s in enumerate(u.src): around[s] = around.get(s, frozenset()) | (inside if i == 0 else around.get(u, frozenset()))
  ids = itertools.count()
  sub: dict[UOp, UOp] = {}
  for red in reduces:  # sources first, so an inner reduction is already replaced when an outer one is built
    value, own = red.src[0].substitute(sub), red.src[1:]
    context = tuple(sorted(around[red] | {r for r in value.toposort if r.op is Ops.RANGE and r not in own}, key=lambda r: r.arg[0]))
    acc = UOp(Ops.DEFINE_REG, red.dtype.ptr(1, AddrSpace.REG), (), next(ids))
    idx = UOp(Ops.INDEX, acc.dtype, (acc, UOp.const(dtypes.index, 0)))
    init = UOp(Ops.STORE, dtypes.void, (idx, UOp.const(red.dtype, reduce_identity(red.arg, red.dtype)), *context))
    cur = UOp(Ops.LOAD, red.dtype, (idx, init, *own))
    update = UOp(Ops.STORE, dtypes.void, (idx, UOp(red.arg, red.dtype, (cur, value))))
    sub[red] = UOp(Ops.LOAD, red.dtype, (idx, split_end(update, own)))
  return ast.substitute(sub)


def split_end(effect: UOp, ranges: tuple[UOp, ...]) -> UOp:
  """END(effect, r0, r1, ...) as nested single-range ENDs, r0 outermost."""
  for r in reversed(ranges): effect = UOp(Ops.END, dtypes.void, (effect, r))
  return effect


def split_ends(ast: UOp) -> UOp:
  sub = {u: split_end(u.src[0], u.src[1:]) for u in ast.toposort if u.op is Ops.END and len(u.src) > 2}
  return ast.substitute(sub) if sub else ast


def upcast_reduce(ast: UOp, renderer: Renderer, width: int = 16) -> UOp:
  """On a device without workgroups, a kernel with one reduction keeps `width` accumulators along its innermost output
  loop j: j splits into (jo, ji) and the reduction loop runs outside a small ji loop (i-k-j order), so the inner loop
  walks contiguous memory and the C compiler vectorizes it. Applies when j's size is a multiple of `width` and the
  reduction depends on j."""
  if renderer.has_local or len(ast.src) != 1 or ast.src[0].op is not Ops.END: return ast
  end = ast.src[0]
  store, outs = end.src[0], end.src[1:]
  reds = [u for u in ast.toposort if u.op is Ops.REDUCE]
  if store.op is not Ops.STORE or not outs or len(reds) != 1: return ast
  j, red = outs[-1], reds[0]
  if j.src[0].op is not Ops.CONST or j.src[0].arg % width or j not in red.src[0].toposort: return ast
  nid = 1 + max(r.arg[0] for r in ast.toposort if r.op is Ops.RANGE)
  jo, ji, ja, jb = (UOp.range(j.src[0].arg // width if n == 0 else width, nid + n, AxisType.LOOP) for n in range(4))
  jsub = jo * width + ji
  own = red.src[1:]
  acc = UOp(Ops.DEFINE_REG, red.dtype.ptr(width, AddrSpace.REG), (), 1 << 20)
  init = split_end(UOp(Ops.STORE, dtypes.void, (acc.index(ja), UOp.const(red.dtype, reduce_identity(red.arg, red.dtype)), *outs[:-1], jo)), (ja,))
  cur = UOp(Ops.LOAD, red.dtype, (acc.index(jb), init, *own, jb))
  value = red.src[0].substitute({j: jo * width + jb})
  update = UOp(Ops.STORE, dtypes.void, (acc.index(jb), UOp(red.arg, red.dtype, (cur, value))))
  result = UOp(Ops.LOAD, red.dtype, (acc.index(ji), split_end(update, (*own, jb))))
  new_store = store.substitute({red: result, j: jsub})
  return ast.replace(src=(UOp(Ops.END, dtypes.void, (new_store, *outs[:-1], jo, ji)),))
