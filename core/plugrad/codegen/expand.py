"""The expander: UPCAST and UNROLL ranges become straight-line code (docs/optimizer.md).

* An UNROLL range of a REDUCE becomes one copy of the reduced value per position, folded in order into the same
  accumulator (`REDUCE(UNROLL(v0, v1, ...), *other ranges)`; `lower_reduces` folds them).
* The UPCAST ranges of a store loop become copies of the loop body, one per position — except the *vector axis*: the
  innermost UPCAST range whose size is a multiple of the renderer's `vector_width` and along which the store is
  contiguous. It becomes vector lanes: values that depend on it are vectors (loads contiguous along it are one vector
  load, others a gather), values that do not are broadcast, reductions over other ranges keep a vector accumulator.
  A contiguous load or store whose gate differs per lane is a gather (a gated scalar access per lane), or, where the
  renderer has `masked_access`, one vector access with a vector gate.
Copies of one reduction share its loop (lower_reduces groups reductions over the same ranges).
"""
from __future__ import annotations

import itertools

from plugrad.dtype import AddrSpace, DType, PtrDType, dtypes
from plugrad.uop.ops import AxisType, GroupOp, Ops, UOp
from plugrad.uop.rewrite import graph_rewrite
from plugrad.uop.symbolic import symbolic

_simp_memo: dict[UOp, UOp] = {}


def _simp(u: UOp) -> UOp:
  """`u` simplified, memoized: the optimizer and the expander ask about the same index expressions again and again (every
  candidate action, every kernel of a repeated layer). The memo holds its keys alive, so it is dropped when it grows."""
  if (ret := _simp_memo.get(u)) is None:
    if len(_simp_memo) >= 4096: _simp_memo.clear()
    ret = _simp_memo[u] = graph_rewrite(u, symbolic, name="expand index")
  return ret


def linear_terms(idx: UOp) -> tuple[dict[UOp, int], int]:
  """`idx` as {term: coefficient} and a constant, through ADD and products with constants (no rewriting); a term is any
  other node (a range, a div/mod, a product of two ranges)."""
  coeffs: dict[UOp, int] = {}
  k0, stack = 0, [(idx, 1)]
  while stack:
    u, m = stack.pop()
    if u.op is Ops.ADD: stack += [(s, m) for s in u.src]
    elif u.op is Ops.CONST: k0 += u.arg * m
    elif u.op is Ops.MUL and u.src[1].op is Ops.CONST: stack.append((u.src[0], m * u.src[1].arg))
    elif u.op is Ops.MUL and u.src[0].op is Ops.CONST: stack.append((u.src[1], m * u.src[0].arg))
    else: coeffs[u] = coeffs.get(u, 0) + m
  return coeffs, k0


def linear_coefficient(idx: UOp, v: UOp) -> int | None:
  """The coefficient of `v` in index `idx` when `idx` is linear in it (v appears only as a term of the sum, not inside a
  div/mod or another non-linear term), else None. Exact for `dtypes.index` (no wrap-around), so no rewrite is needed."""
  if idx.dtype is not dtypes.index: return None
  coeffs, _ = linear_terms(idx)
  if any(t is not v and v in t.toposort for t in coeffs): return None
  return coeffs.get(v, 0)


def _size(r: UOp) -> int:
  if r.src[0].op is not Ops.CONST: raise ValueError(f"an {r.arg[1].name} range needs a constant size, got {r.src[0].render()}")
  return r.src[0].arg


def _combos(rs: list[UOp]) -> list[dict[UOp, UOp]]:
  return [{r: UOp.const(dtypes.index, c) for r, c in zip(rs, cs)} for cs in itertools.product(*(range(_size(r)) for r in rs))]


class _Copier:
  """Copies of `root` with its ranges `rs` replaced, rebuilding only the nodes that depend on them (found once): a copy
  costs what it changes, not the whole body again (a matmul's epilogue, a PACK's loops)."""
  def __init__(self, root: UOp, rs: list[UOp]):
    self.root, self.dep = root, _dependents(root, set(rs))

  def copy(self, mapping: dict[UOp, UOp]) -> tuple[UOp, dict[UOp, UOp]]:
    """The copy and each replaced node's image."""
    done = dict(mapping)
    for u in self.dep: done[u] = UOp(u.op, u.dtype, tuple(done.get(s, s) for s in u.src), u.arg)
    return done.get(self.root, self.root), done

  def vectorize(self, mapping: dict[UOp, UOp], vax: UOp, lane: UOp, width: int, lane_dep: list[UOp], masked: bool = False) -> tuple[UOp, _Vectorizer]:
    """The copy for `mapping` (which sends `vax` to an expression of `lane`) and its vectorizer; the lane-dependent nodes
    are the images of `lane_dep` (the nodes depending on `vax`), no new walk of the copy."""
    g, done = self.copy(mapping)
    return g, _Vectorizer(lane, width, g, {lane, mapping[vax], *(done[u] for u in lane_dep)}, masked)


def _dependents(root: UOp, keys: set[UOp]) -> list[UOp]:
  """The nodes of `root` that depend on one of `keys` (the keys excluded), sources first."""
  seen, out = set(keys), []
  for u in root.toposort:
    if u not in seen and any(s in seen for s in u.src):
      seen.add(u)
      out.append(u)
  return out


def expand_unrolls(ast: UOp, vector_width: int = 1, masked: bool = False) -> UOp:
  """UNROLL ranges of reductions → UNROLL values. In a reduction that no UPCAST range of a vector's size reaches, an UNROLL range along
  which a load is contiguous (size a multiple of `vector_width`) becomes vector lanes: a vector accumulator, folded
  lane by lane after the loop (the horizontal reduction)."""
  done: dict[UOp, UOp] = {}
  upcast = {u for u in ast.toposort if u.op is Ops.RANGE and u.arg[1] is AxisType.UPCAST}
  marker_id = 1 + max((u.arg[0] for u in ast.toposort if u.op is Ops.RANGE), default=0)
  for u in ast.toposort:
    new_src = tuple(done[s] for s in u.src)
    if u.op is Ops.REDUCE and any(r.arg[1] is AxisType.UNROLL for r in u.src[1:]):
      unr = [r for r in u.src[1:] if r.arg[1] is AxisType.UNROLL]
      rest = tuple(r for r in new_src[1:] if r not in unr)
      val = new_src[0]
      loads = [x.src[0].src[1] for x in val.toposort if x.op is Ops.LOAD and x.src[0].op is Ops.INDEX]
      # lanes for a reduction no UPCAST range that could become the store's lanes reaches (a row statistic: its value
      # is broadcast to the store's lanes; the copies of a GEMV's independent chains: an UPCAST off the vector width
      # only copies it), and that holds no reduction varying along the lanes
      allow_vec = vector_width > 1 and u.dtype.count == 1 and not any(_size(r) % vector_width == 0 for r in upcast & set(u.toposort))
      vax = next((r for r in reversed(unr) if allow_vec and _size(r) % vector_width == 0 and any(_contiguous(ix, r) is not None for ix in loads)
                  and not any(x.op in (Ops.WMMA, Ops.REDUCE) for x in _dependents(val, {r}))), None)
      copier = _Copier(val, unr)
      if vax is None:
        copies = [copier.copy(c)[0] for c in _combos(unr)]
        value = copies[0] if len(copies) == 1 else UOp(Ops.UNROLL, u.dtype, tuple(copies))
        done[u] = UOp(Ops.REDUCE, u.dtype, (value, *rest), u.arg)
        continue
      lane = UOp.range(vector_width, marker_id, AxisType.UNROLL)
      vdt = u.dtype.vec(vector_width)
      vcopies, lane_dep = [], _dependents(val, {vax})
      for c in _combos([r for r in unr if r is not vax]):
        for chunk in range(_size(vax) // vector_width):
          g, vz = copier.vectorize({**c, vax: UOp.const(dtypes.index, chunk * vector_width) + lane}, vax, lane, vector_width, lane_dep, masked)
          vcopies.append(vz.vec_or_bcast(g))
      vred = UOp(Ops.REDUCE, vdt, (vcopies[0] if len(vcopies) == 1 else UOp(Ops.UNROLL, vdt, tuple(vcopies)), *rest), u.arg)
      out = vred.gep(0)
      for lane_n in range(1, vector_width): out = UOp(u.arg, u.dtype, (out, vred.gep(lane_n)))
      done[u] = out
    else: done[u] = u if all(a is b for a, b in zip(new_src, u.src)) else UOp(u.op, u.dtype, new_src, u.arg)
  return done[ast]


def _conjuncts(g: UOp) -> list[UOp]: return _conjuncts(g.src[0]) + _conjuncts(g.src[1]) if g.op is Ops.AND and g.dtype is dtypes.bool else [g]


def _addends(u: UOp) -> list[UOp]: return _addends(u.src[0]) + _addends(u.src[1]) if u.op is Ops.ADD else [u]


def _contiguous(idx: UOp, v: UOp) -> UOp | None:
  """The base index when `idx` is `base + v` (v the lane), else None."""
  # which nodes of the index hold `v`, found in one walk: every question below is then a lookup (this runs per load
  # and per copy of the body, each index a new graph)
  holds: set[UOp] = set()
  for u in idx.toposort:
    if u is v or any(s in holds for s in u.src): holds.add(u)
  # the common case without the simplifier (it was most of the codegen time of a small kernel): `v` is one addend of the
  # index's sum and no other addend mentions it, so the other addends are the base; a `v` nowhere in it is no lane at all
  if idx not in holds: return None
  terms = _addends(idx)
  if sum(t is v for t in terms) == 1 and not any(t in holds for t in terms if t is not v):
    rest = [t for t in terms if t is not v]
    base = rest[0] if rest else UOp.const(dtypes.index, 0)
    for t in rest[1:]: base = base + t
    return base
  # linear in `v` (e.g. `(0+v)*1` as the optimizer builds it): decided from the coefficient without the simplifier, which
  # per lane and per load was most of a wide kernel's expansion time; only a `v` under a div/mod needs the simplifier.
  # The base is left as it is: lower() simplifies the whole expanded kernel in one rewrite
  if idx.dtype is dtypes.index:  # linear_coefficient, with the walk above
    coeffs, _ = linear_terms(idx)
    if not any(t is not v and t in holds for t in coeffs): return _zeroed(idx, v, holds) if coeffs.get(v, 0) == 1 else None
  base = _simp(_zeroed(idx, v, holds))
  return base if _simp(idx) is _simp(base + v) else None


def _zeroed(idx: UOp, v: UOp, holds: set[UOp]) -> UOp:
  """`idx.substitute({v: 0})`, rebuilding only the nodes that hold `v`."""
  done = {v: UOp.const(dtypes.index, 0)}
  for u in idx.toposort:
    if u in holds and u is not v: done[u] = UOp(u.op, u.dtype, tuple([done.get(s, s) for s in u.src]), u.arg)
  return done[idx]


class _Vectorizer:
  def __init__(self, v: UOp, width: int, root: UOp, dep: set[UOp] | None = None, masked: bool = False):
    self.v, self.w, self.masked = v, width, masked
    if dep is None:
      dep = set()
      for u in root.toposort:
        if u is v or any(s in dep for s in u.src): dep.add(u)
    self.dep = dep  # the nodes that depend on the lane
    self.memo: dict[UOp, UOp] = {}

  def lanes(self, u: UOp) -> list[UOp]:
    """`u` at each lane: one walk rebuilding only what depends on the lane (the rest is shared, not copied per lane). Not
    simplified here: lower() simplifies the whole expanded kernel in one rewrite, each shared subexpression once."""
    done: dict[UOp, tuple[UOp, ...]] = {self.v: tuple(UOp.const(dtypes.index, c) for c in range(self.w))}
    for n in u.toposort:
      if n in done or n not in self.dep: continue
      srcs = [done.get(s) or (s,) * self.w for s in n.src]
      done[n] = tuple(UOp(n.op, n.dtype, tuple(s[c] for s in srcs), n.arg) for c in range(self.w))
    return list(done[u]) if u in done else [u] * self.w

  def bcast(self, u: UOp) -> UOp:
    if u.op is Ops.CONST: return UOp.const(u.dtype.vec(self.w), u.arg)
    return UOp(Ops.VECTORIZE, u.dtype.vec(self.w), (u,) * self.w)

  def vec_or_bcast(self, u: UOp) -> UOp: return self.vec(u) if u in self.dep else self.bcast(u)

  def vec(self, u: UOp) -> UOp:
    if u not in self.dep: return u
    if (ret := self.memo.get(u)) is None: ret = self.memo[u] = self._vec(u)
    return ret

  def _vector_index(self, ix: UOp) -> UOp | None:
    """INDEX `ix` as the address of one vector access when its index runs contiguously along the lanes (its base), else
    None. A gate that differs per lane (a padded row's borders) becomes a vector gate (a masked access) where the
    renderer has `masked_access`; without it such an access is split into lanes."""
    gate = ix.src[2] if len(ix.src) > 2 else None
    if ix.src[0] in self.dep or (gate in self.dep and not self.masked) or (base := _contiguous(ix.src[1], self.v)) is None: return None
    return ix.replace(src=(ix.src[0], base, *((self.vec(gate),) if gate in self.dep else ix.src[2:])))

  def _vec(self, u: UOp) -> UOp:
    w = self.w
    if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX and all(s.dtype is dtypes.void for s in u.src[1:]):  # ordering sources (a PACK copy) stay
      if (vix := self._vector_index(u.src[0])) is not None: return UOp(Ops.LOAD, u.dtype.vec(w), (vix, *u.src[1:]))
      return UOp(Ops.VECTORIZE, u.dtype.vec(w), tuple(self.lanes(u)))
    if u.op is Ops.STORE:
      ix, vval = u.src[0], self.vec_or_bcast(u.src[1])
      # an atomic add (arg Ops.ADD) is one scalar per lane: no device adds a vector atomically
      if u.arg is None and (vix := self._vector_index(ix)) is not None: return UOp(Ops.STORE, dtypes.void, (vix, vval))
      return UOp(Ops.GROUP, dtypes.void, tuple(UOp(Ops.STORE, dtypes.void, (lx, vval.gep(c)), u.arg) for c, lx in enumerate(self.lanes(ix))))
    if u.op is Ops.WHERE and self.masked and (ld := u.src[1]).op is Ops.LOAD and ld.src[0].op is Ops.INDEX and len(ld.src[0].src) > 2 and \
       set(_conjuncts(u.src[0])) <= set(_conjuncts(ld.src[0].src[2])) and u.src[2].op is Ops.CONST and u.src[2].arg == 0 and \
       (m := self.vec(ld)).op is Ops.LOAD:
      # a padded read, WHERE(valid, LOAD(.., gate valid [and ...]), 0): the masked load already gives 0 where valid is false
      return m
    if u.op is Ops.GROUP: return UOp(Ops.GROUP, dtypes.void, tuple(self.vec(s) for s in u.src))
    if u.op is Ops.REDUCE: return UOp(Ops.REDUCE, u.dtype.vec(w), (self.vec_or_bcast(u.src[0]), *u.src[1:]), u.arg)
    if u.op is Ops.UNROLL: return UOp(Ops.UNROLL, u.dtype.vec(w), tuple(self.vec_or_bcast(s) for s in u.src))
    value = not isinstance(u.dtype, PtrDType) and u.dtype.count == 1 and u.dtype is not dtypes.index and u.dtype is not dtypes.void
    if value and (u.op in GroupOp.ALU or u.op is Ops.CAST) and all(s.dtype.count == 1 and s.dtype is not dtypes.index for s in u.src):
      srcs = tuple(self.vec_or_bcast(s) for s in u.src)
      return UOp(u.op, u.dtype.vec(w), srcs, u.arg)
    if value: return UOp(Ops.VECTORIZE, u.dtype.vec(w), tuple(self.lanes(u)))
    raise ValueError(f"the expander cannot vectorize a {u.op.name} of {u.dtype!r}")


def _vector_axis(body: UOp, ups: list[UOp], width: int) -> UOp | None:
  if width <= 1 or any(u.op is Ops.WMMA for u in body.toposort): return None
  fits = [r for r in reversed(ups) if _size(r) % width == 0]
  if not fits: return None
  # the kernel's output stores (a PACK copy into a scratch array is not one: its loops are its own)
  stores = [u for u in body.toposort if u.op is Ops.STORE and not (isinstance(p := u.src[0].dtype, PtrDType) and p.addrspace is AddrSpace.REG)]
  red_loads = [x.src[0] for red in body.toposort if red.op is Ops.REDUCE for x in red.src[0].toposort
               if x.op is Ops.LOAD and x.src[0].op is Ops.INDEX]
  def vector_loads(r: UOp) -> int:  # loads of the reduction that lanes along r make whole vector loads (no gate per lane)
    return sum(_contiguous(ix.src[1], r) is not None and (len(ix.src) < 3 or r not in ix.src[2].toposort) for ix in red_loads)
  def stored(r: UOp) -> bool: return all(_contiguous(st.src[0].src[1], r) is not None for st in stores)
  # the reduction's loads run once per step of its loop, the stores once per output: lanes go where the most loads of
  # the inner loop are vector loads (a convolution's channel tile: the packed weights, not its output rows, whose
  # input loads are gated by the padding per lane), then where the stores are contiguous (each output stored once),
  # then innermost. No axis of either kind: plain copies
  best = max(fits, key=lambda r: (vector_loads(r), stored(r)))  # max keeps the first (innermost) of equals
  return best if vector_loads(best) or stored(best) else None


def _vector_copies(ast: UOp, width: int, masked: bool, next_id: int) -> tuple[UOp, int]:
  """PACK copies whose innermost loop the array is written contiguously along, in whole vectors: that loop becomes
  vector lanes, one vector store per step, the source one vector load where it is contiguous along it too and else
  its lanes read one by one (a transposing copy: a convolution's weight panel, B of A.B^T). A scalar copy is bound by
  its one store per element: 512x3x3 weights into an 8-channel panel took 24.8 us, with vector stores 6.8 us. Returns
  the new AST and the next free range id."""
  sub: dict[UOp, UOp] = {}
  for e in ast.toposort:
    if e.op is not Ops.END or e in ast.src or len(e.src) < 2 or (st := e.src[0]).op is not Ops.STORE: continue
    if not isinstance(p := st.src[0].dtype, PtrDType) or p.addrspace is not AddrSpace.REG: continue
    r = e.src[-1]
    if r.src[0].op is not Ops.CONST or (n := _size(r)) % width or _contiguous(st.src[0].src[1], r) is None: continue
    lane = UOp.range(width, next_id, AxisType.UPCAST)
    outer = UOp.range(n // width, next_id + 1, AxisType.LOOP) if n > width else None
    next_id += 2
    body = st.substitute({r: outer * width + lane if outer is not None else lane})
    vbody = _Vectorizer(lane, width, body, masked=masked).vec(body)
    loops = (*e.src[1:-1], *((outer,) if outer is not None else ()))
    sub[e] = UOp(Ops.END, dtypes.void, (vbody, *loops)) if loops else vbody
  return (ast.substitute(sub) if sub else ast), next_id


def expand(ast: UOp, vector_width: int = 1, masked: bool = False) -> UOp:
  """`ast` with its UNROLL and UPCAST ranges expanded (see the module doc); `vector_width` > 1 allows vector lanes;
  `masked` (the renderer's `masked_access`) lets a load or store whose gate differs per lane stay one vector access."""
  ast = expand_unrolls(ast, vector_width, masked)
  new: list[UOp] = []
  marker_id = 1 + max((u.arg[0] for u in ast.toposort if u.op is Ops.RANGE), default=0)
  if vector_width > 1: ast, marker_id = _vector_copies(ast, vector_width, masked, marker_id)
  for end in ast.src:
    ups = [r for r in end.src[1:] if r.arg[1] is AxisType.UPCAST] if end.op is Ops.END else []
    if not ups:
      new.append(end)
      continue
    body, others = end.src[0], tuple(r for r in end.src[1:] if r.arg[1] is not AxisType.UPCAST)
    vax = _vector_axis(body, ups, vector_width)
    parts: list[UOp] = []
    copier = _Copier(body, ups)
    if vax is None:
      parts = [copier.copy(c)[0] for c in _combos(ups)]
    else:
      lane = UOp.range(vector_width, marker_id, AxisType.UPCAST)
      rest, lane_dep = [r for r in ups if r is not vax], _dependents(body, {vax})
      for c in _combos(rest):
        for chunk in range(_size(vax) // vector_width):
          g, vz = copier.vectorize({**c, vax: UOp.const(dtypes.index, chunk * vector_width) + lane}, vax, lane, vector_width, lane_dep, masked)
          parts.append(vz.vec(g))
    group = parts[0] if len(parts) == 1 else UOp(Ops.GROUP, dtypes.void, tuple(parts))
    new.append(UOp(Ops.END, dtypes.void, (group, *others)) if others else group)
  return ast.replace(src=tuple(new))


JOIN_MIN = 4  # lanes a run of neighbouring addresses needs before it is read as one vector load


def _aligned(terms: dict[UOp, int], offsets: list[int], lanes: int, width: int) -> bool:
  """Whether vector accesses of `lanes` elements at these addresses are ones every renderer takes: at most `width`
  lanes, each starting at a multiple of `lanes` elements from the buffer's start (a GPU's vector types need their
  natural alignment; the CPU's do not, but a tensor core's rows are whole vectors apart anyway)."""
  return lanes <= width and all(c % lanes == 0 for c in terms.values()) and all(o % lanes == 0 for o in offsets)


def _joined(vz: UOp, width: int) -> UOp | None:
  """A VECTORIZE of scalar loads whose addresses form r interleaved runs of neighbours (lane i reads run i % r, the next
  address each time) as r vector loads, their lanes put back in order: a tensor core's operand fragment (vdpbf16ps's
  16 column pairs are two rows of B, lane by lane) was 32 scalar loads and inserts; it is two loads and one shuffle."""
  n, lds = vz.dtype.count, vz.src
  if n >= JOIN_MIN and all(u.op is Ops.CAST and u.dtype is lds[0].dtype for u in lds) and \
     (inner := _joined(UOp(Ops.VECTORIZE, lds[0].src[0].dtype.vec(n), tuple(u.src[0] for u in lds)), width)) is not None:
    return UOp(Ops.CAST, vz.dtype, (inner,))  # a cast fused into the operand (float32 data cast to bfloat16): cast the vectors
  if n < JOIN_MIN or not all(ld.op is Ops.LOAD and len(ld.src) == 1 and ld.src[0].op is Ops.INDEX and len(ld.src[0].src) == 2 and
                             ld.dtype.count == 1 for ld in lds): return None
  buf = lds[0].src[0].src[0]
  if any(ld.src[0].src[0] is not buf for ld in lds): return None
  forms = [linear_terms(ld.src[0].src[1]) for ld in lds]
  if any(f[0] != forms[0][0] for f in forms): return None
  offs = [f[1] for f in forms]
  for r in (d for d in range(1, n // JOIN_MIN + 1) if n % d == 0):
    if all(offs[i + r] == offs[i] + 1 for i in range(n - r)):
      if not _aligned(forms[0][0], offs[:r], n // r, width): return None
      runs = [UOp(Ops.LOAD, lds[j].dtype.vec(n // r), (lds[j].src[0],)) for j in range(r)]
      return UOp(Ops.VECTORIZE, vz.dtype, tuple(runs[i % r].gep(i // r) for i in range(n))) if r > 1 else runs[0]
  return None


def _lane_of(val: UOp) -> tuple[UOp, int, DType | None] | None:
  """(v, i, cast): a stored value that is lane i of vector v, or that lane cast to `cast`, else None."""
  cast = val.dtype if val.op is Ops.CAST else None
  g = val.src[0] if cast is not None else val
  return (g.src[0], g.arg[0], cast) if g.op is Ops.GEP and len(g.arg) == 1 and g.src[0].dtype.count > 1 else None


def _joined_stores(group: UOp, width: int) -> UOp | None:
  """A GROUP whose scalar stores write every lane of one vector (or its lanes cast), in order, to neighbouring
  addresses as one vector store of it: a tensor core's accumulators were stored lane by lane, each lane's bfloat16
  rounding a scalar branch."""
  runs: dict[tuple[UOp, frozenset[tuple[UOp, int]], UOp, DType | None], dict[int, tuple[int, UOp]]] = {}
  for st in group.src:
    if st.op is not Ops.STORE or st.arg is not None or len(st.src) != 2 or (ix := st.src[0]).op is not Ops.INDEX or len(ix.src) != 2: continue
    if st.src[1].dtype.count != 1 or (lane := _lane_of(st.src[1])) is None: continue
    terms, off = linear_terms(ix.src[1])
    runs.setdefault((ix.src[0], frozenset(terms.items()), lane[0], lane[2]), {})[lane[1]] = (off, st)
  done: dict[UOp, UOp | None] = {}
  for (_, terms_key, v, cast), lanes in runs.items():
    n = v.dtype.count
    if n < JOIN_MIN or sorted(lanes) != list(range(n)) or any(lanes[i][0] != lanes[0][0] + i for i in range(n)): continue
    if not _aligned(dict(terms_key), [lanes[0][0]], n, width): continue
    first = lanes[0][1]
    done[first] = UOp(Ops.STORE, dtypes.void, (first.src[0], UOp(Ops.CAST, cast.vec(n), (v,)) if cast is not None else v))
    done.update({lanes[i][1]: None for i in range(1, n)})
  if not done: return None
  return group.replace(src=tuple(done.get(s, s) for s in group.src if done.get(s, s) is not None))


def join_accesses(ast: UOp, vector_width: int) -> UOp:
  """Every VECTORIZE of scalar loads that `_joined` can read as vector loads, read so, and every GROUP of stores that
  `_joined_stores` can write as vector stores, written so (a renderer without vector lanes keeps them: vector_width 1)."""
  if vector_width <= 1: return ast
  # loads first: a replaced GROUP would keep the old values under it (substitute does not look inside a replacement)
  if sub := {u: j for u in ast.toposort if u.op is Ops.VECTORIZE and (j := _joined(u, vector_width)) is not None}: ast = ast.substitute(sub)
  if sub := {u: j for u in ast.toposort if u.op is Ops.GROUP and (j := _joined_stores(u, vector_width)) is not None}:
    ast = ast.substitute(sub)
  return ast
