"""The expander: UPCAST and UNROLL ranges become straight-line code (docs/optimizer.md).

* An UNROLL range of a REDUCE becomes one copy of the reduced value per position, folded in order into the same
  accumulator (`REDUCE(UNROLL(v0, v1, ...), *other ranges)`; `lower_reduces` folds them).
* The UPCAST ranges of a store loop become copies of the loop body, one per position — except the *vector axis*: the
  innermost UPCAST range whose size is a multiple of the renderer's `vector_width` and along which the store is
  contiguous. It becomes vector lanes: values that depend on it are vectors (loads contiguous along it are one vector
  load, others a gather), values that do not are broadcast, reductions over other ranges keep a vector accumulator.
Copies of one reduction share its loop (lower_reduces groups reductions over the same ranges).
"""
from __future__ import annotations

import itertools

from plugrad.dtype import AddrSpace, PtrDType, dtypes
from plugrad.uop.ops import AxisType, GroupOp, Ops, UOp
from plugrad.uop.rewrite import graph_rewrite
from plugrad.uop.symbolic import symbolic


def _simp(u: UOp) -> UOp: return graph_rewrite(u, symbolic, name="expand index")


def _size(r: UOp) -> int:
  if r.src[0].op is not Ops.CONST: raise ValueError(f"an {r.arg[1].name} range needs a constant size, got {r.src[0].render()}")
  return r.src[0].arg


def _combos(rs: list[UOp]) -> list[dict[UOp, UOp]]:
  return [{r: UOp.const(dtypes.index, c) for r, c in zip(rs, cs)} for cs in itertools.product(*(range(_size(r)) for r in rs))]


def expand_unrolls(ast: UOp, vector_width: int = 1) -> UOp:
  """UNROLL ranges of reductions → UNROLL values. Without UPCAST ranges in the kernel, an UNROLL range along which a
  load is contiguous (size a multiple of `vector_width`) becomes vector lanes: a vector accumulator, folded lane by
  lane after the loop (the horizontal reduction)."""
  done: dict[UOp, UOp] = {}
  allow_vec = vector_width > 1 and not any(u.op is Ops.RANGE and u.arg[1] is AxisType.UPCAST for u in ast.toposort)
  marker_id = 1 + max((u.arg[0] for u in ast.toposort if u.op is Ops.RANGE), default=0)
  for u in ast.toposort:
    new_src = tuple(done[s] for s in u.src)
    if u.op is Ops.REDUCE and any(r.arg[1] is AxisType.UNROLL for r in u.src[1:]):
      unr = [r for r in u.src[1:] if r.arg[1] is AxisType.UNROLL]
      rest = tuple(r for r in new_src[1:] if r not in unr)
      val = new_src[0]
      loads = [x.src[0].src[1] for x in val.toposort if x.op is Ops.LOAD and x.src[0].op is Ops.INDEX]
      vax = next((r for r in reversed(unr) if allow_vec and u.dtype.count == 1 and _size(r) % vector_width == 0 and
                  not any(x.op in (Ops.WMMA, Ops.REDUCE) for x in val.toposort) and any(_contiguous(ix, r) is not None for ix in loads)), None)
      if vax is None:
        copies = [val.substitute(c) for c in _combos(unr)]
        value = copies[0] if len(copies) == 1 else UOp(Ops.UNROLL, u.dtype, tuple(copies))
        done[u] = UOp(Ops.REDUCE, u.dtype, (value, *rest), u.arg)
        continue
      lane = UOp.range(vector_width, marker_id, AxisType.UNROLL)
      vdt = u.dtype.vec(vector_width)
      vcopies = []
      for c in _combos([r for r in unr if r is not vax]):
        for chunk in range(_size(vax) // vector_width):
          g = val.substitute({**c, vax: UOp.const(dtypes.index, chunk * vector_width) + lane})
          vcopies.append(_Vectorizer(lane, vector_width, g).vec_or_bcast(g))
      vred = UOp(Ops.REDUCE, vdt, (vcopies[0] if len(vcopies) == 1 else UOp(Ops.UNROLL, vdt, tuple(vcopies)), *rest), u.arg)
      out = vred.gep(0)
      for lane_n in range(1, vector_width): out = UOp(u.arg, u.dtype, (out, vred.gep(lane_n)))
      done[u] = out
    else: done[u] = u if all(a is b for a, b in zip(new_src, u.src)) else UOp(u.op, u.dtype, new_src, u.arg)
  return done[ast]


def _addends(u: UOp) -> list[UOp]: return _addends(u.src[0]) + _addends(u.src[1]) if u.op is Ops.ADD else [u]


def _contiguous(idx: UOp, v: UOp) -> UOp | None:
  """The base index when `idx` is `base + v` (v the lane), else None."""
  # the common case without the simplifier (it was most of the codegen time of a small kernel): `v` is one addend of the
  # index's sum and no other addend mentions it, so the other addends are the base; a `v` nowhere in it is no lane at all
  if v not in idx.toposort: return None
  terms = _addends(idx)
  if sum(t is v for t in terms) == 1 and not any(v in t.toposort for t in terms if t is not v):
    rest = [t for t in terms if t is not v]
    base = rest[0] if rest else UOp.const(dtypes.index, 0)
    for t in rest[1:]: base = base + t
    return base
  base = _simp(idx.substitute({v: UOp.const(dtypes.index, 0)}))
  return base if _simp(idx) is _simp(base + v) else None


class _Vectorizer:
  def __init__(self, v: UOp, width: int, root: UOp):
    self.v, self.w = v, width
    self.dep: set[UOp] = set()
    for u in root.toposort:
      if u is v or any(s in self.dep for s in u.src): self.dep.add(u)
    self.memo: dict[UOp, UOp] = {}

  def lanes(self, u: UOp) -> list[UOp]: return [u.substitute({self.v: UOp.const(dtypes.index, c)}) for c in range(self.w)]

  def bcast(self, u: UOp) -> UOp:
    if u.op is Ops.CONST: return UOp.const(u.dtype.vec(self.w), u.arg)
    return UOp(Ops.VECTORIZE, u.dtype.vec(self.w), (u,) * self.w)

  def vec_or_bcast(self, u: UOp) -> UOp: return self.vec(u) if u in self.dep else self.bcast(u)

  def vec(self, u: UOp) -> UOp:
    if u not in self.dep: return u
    if (ret := self.memo.get(u)) is None: ret = self.memo[u] = self._vec(u)
    return ret

  def _vec(self, u: UOp) -> UOp:
    w = self.w
    if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX and all(s.dtype is dtypes.void for s in u.src[1:]):  # ordering sources (a PACK copy) stay
      ix = u.src[0]
      gate = ix.src[2] if len(ix.src) > 2 else None
      if (gate is None or gate not in self.dep) and ix.src[0] not in self.dep and (base := _contiguous(ix.src[1], self.v)) is not None:
        return UOp(Ops.LOAD, u.dtype.vec(w), (ix.replace(src=(ix.src[0], base, *ix.src[2:])), *u.src[1:]))
      return UOp(Ops.VECTORIZE, u.dtype.vec(w), tuple(_simp(x) for x in self.lanes(u)))
    if u.op is Ops.STORE:
      ix, val = u.src[0], u.src[1]
      gate = ix.src[2] if len(ix.src) > 2 else None
      vval = self.vec_or_bcast(val)
      if (gate is None or gate not in self.dep) and (base := _contiguous(ix.src[1], self.v)) is not None:
        return UOp(Ops.STORE, dtypes.void, (ix.replace(src=(ix.src[0], base, *ix.src[2:])), vval))
      return UOp(Ops.GROUP, dtypes.void, tuple(UOp(Ops.STORE, dtypes.void, (_simp(lx), vval.gep(c))) for c, lx in enumerate(self.lanes(ix))))
    if u.op is Ops.GROUP: return UOp(Ops.GROUP, dtypes.void, tuple(self.vec(s) for s in u.src))
    if u.op is Ops.REDUCE: return UOp(Ops.REDUCE, u.dtype.vec(w), (self.vec_or_bcast(u.src[0]), *u.src[1:]), u.arg)
    if u.op is Ops.UNROLL: return UOp(Ops.UNROLL, u.dtype.vec(w), tuple(self.vec_or_bcast(s) for s in u.src))
    value = not isinstance(u.dtype, PtrDType) and u.dtype.count == 1 and u.dtype is not dtypes.index and u.dtype is not dtypes.void
    if value and (u.op in GroupOp.ALU or u.op is Ops.CAST) and all(s.dtype.count == 1 and s.dtype is not dtypes.index for s in u.src):
      srcs = tuple(self.vec_or_bcast(s) for s in u.src)
      if u.op is Ops.THREEFRY:  # scalar only (spec): one per lane on the vectorized operands
        return UOp(Ops.VECTORIZE, u.dtype.vec(w), tuple(UOp(u.op, u.dtype, tuple(s.gep(c) for s in srcs), u.arg) for c in range(w)))
      return UOp(u.op, u.dtype.vec(w), srcs, u.arg)
    if value: return UOp(Ops.VECTORIZE, u.dtype.vec(w), tuple(_simp(x) for x in self.lanes(u)))
    raise ValueError(f"the expander cannot vectorize a {u.op.name} of {u.dtype!r}")


def _vector_axis(body: UOp, ups: list[UOp], width: int) -> UOp | None:
  if width <= 1 or any(u.op is Ops.WMMA for u in body.toposort): return None
  # the kernel's output stores (a PACK copy into a scratch array is not one: its loops are its own)
  stores = [u for u in body.toposort if u.op is Ops.STORE and not (isinstance(p := u.src[0].dtype, PtrDType) and p.addrspace is AddrSpace.REG)]
  fits = [r for r in reversed(ups) if _size(r) % width == 0]
  for r in fits:
    if all(_contiguous(st.src[0].src[1], r) is not None for st in stores): return r
  # no axis along which the stores are contiguous (a convolution's output channels, NCHW): an axis along which a
  # reduction reads contiguous memory (a packed panel) still pays for itself, since each output is stored once after
  # the whole reduction; the stores become one scalar store per lane
  red_loads = [x.src[0].src[1] for red in body.toposort if red.op is Ops.REDUCE for x in red.src[0].toposort
               if x.op is Ops.LOAD and x.src[0].op is Ops.INDEX]
  return next((r for r in fits if any(_contiguous(ix, r) is not None for ix in red_loads)), None)


def expand(ast: UOp, vector_width: int = 1) -> UOp:
  """`ast` with its UNROLL and UPCAST ranges expanded (see the module doc); `vector_width` > 1 allows vector lanes."""
  ast = expand_unrolls(ast, vector_width)
  new: list[UOp] = []
  marker_id = 1 + max((u.arg[0] for u in ast.toposort if u.op is Ops.RANGE), default=0)
  for end in ast.src:
    ups = [r for r in end.src[1:] if r.arg[1] is AxisType.UPCAST] if end.op is Ops.END else []
    if not ups:
      new.append(end)
      continue
    body, others = end.src[0], tuple(r for r in end.src[1:] if r.arg[1] is not AxisType.UPCAST)
    vax = _vector_axis(body, ups, vector_width)
    parts: list[UOp] = []
    if vax is None:
      parts = [body.substitute(c) for c in _combos(ups)]
    else:
      lane = UOp.range(vector_width, marker_id, AxisType.UPCAST)
      rest = [r for r in ups if r is not vax]
      for c in _combos(rest):
        for chunk in range(_size(vax) // vector_width):
          g = body.substitute({**c, vax: UOp.const(dtypes.index, chunk * vector_width) + lane})
          parts.append(_Vectorizer(lane, vector_width, g).vec(g))
    group = parts[0] if len(parts) == 1 else UOp(Ops.GROUP, dtypes.void, tuple(parts))
    new.append(UOp(Ops.END, dtypes.void, (group, *others)) if others else group)
  return ast.replace(src=tuple(new))
