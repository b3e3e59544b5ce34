"""Optimization actions on a kernel AST: `Opt(op, axis, amount)` applied by a `Scheduler`.

A kernel AST (docs/ir.md, stage 2) loops over RANGEs; every action works by splitting one RANGE `r` of size `s` into
an outer range of size `s/amount` and an inner one of size `amount` (`r = outer*amount + inner`, or
`inner*(s/amount) + outer` for GROUPTOP), and retagging the inner one with the AxisType that tells the lowering
what to do with it (docs/optimizer.md). The outer range keeps `r`'s place in the axis lists, so the axis numbers of
the other axes do not move when an action is applied.

Axis numbers: UPCAST, LOCAL, THREAD, SWAP, TILE count among the *output axes* (ranges of type LOOP or GLOBAL, in loop
order); UNROLL, GROUP, GROUPTOP among the *reduce axes* (type REDUCE, in first-use order); PADTO among the output
axes followed by the reduce axes; TC's axis picks among the renderer's matching tensor cores; PACK's among the
operands of the reductions (`Scheduler.packable_values`).

Two actions change the loop structure instead of retagging a split: TILE splits an output axis into a tile loop moved
to the front (outermost: cache blocking; the numbers of the output axes grow by one) and the loop within the tile,
which keeps the axis's place; PACK copies what one load reads in one iteration of the loops around it into a
scratch array in the order the kernel reads it (B-panel packing), and the kernel then reads the array.
"""
from __future__ import annotations

from plugrad.codegen.expand import linear_coefficient
from plugrad.codegen.opt.actions import KernelOptError, Opt, OptOps
from plugrad.codegen.opt.tc import apply_tc
from plugrad.dtype import AddrSpace, PtrDType, dtypes
from plugrad.helpers import prod
from plugrad.renderer.base import Renderer
from plugrad.uop.ops import AxisType, KernelInfo, Ops, UOp, reduce_identity

MAX_UPCAST = 1024         # lanes (product of UPCAST and UNROLL sizes) a kernel may ask for: an 8x32 tile unrolled by 4
L1_WAYS = 8              # the associativity of a typical x86 L1 data cache (Zen, Skylake)
MAX_PACK_BYTES = 1 << 19  # a PACK scratch array lives on the thread's stack: at most 512 KiB
_PACK_ID = 1 << 16        # DEFINE_REG ids of PACK arrays (the accumulators of lower_reduces count up from 0)
_OUTPUT_TYPES = (AxisType.LOOP, AxisType.GLOBAL)
_LOCAL_TYPES = (AxisType.LOCAL, AxisType.GROUP_REDUCE)


def _size(r: UOp) -> int | None:
  b = r.src[0]
  return b.arg if b.op is Ops.CONST else None


class Scheduler:
  """A kernel AST and the actions applied to it so far. `apply_opt` raises KernelOptError (leaving the scheduler as it
  was) when an action is invalid; `get_optimized_ast()` is the AST with the applied list in its KernelInfo."""

  def __init__(self, ast: UOp, renderer: Renderer):
    if ast.op is not Ops.SINK: raise KernelOptError(f"the scheduler needs a kernel AST rooted at a SINK, got {ast.op!r}")
    self.ast, self.renderer = ast, renderer
    self.info: KernelInfo = ast.arg if isinstance(ast.arg, KernelInfo) else KernelInfo()
    self.applied: list[Opt] = list(self.info.applied_opts)
    self.dont_use_locals = self.info.dont_use_locals
    self._next_id = 1 + max((u.arg[0] for u in ast.toposort if u.op is Ops.RANGE), default=-1)

  def copy(self) -> Scheduler:
    k = Scheduler.__new__(Scheduler)
    k.ast, k.renderer, k.info, k.applied = self.ast, self.renderer, self.info, list(self.applied)
    k.dont_use_locals, k._next_id = self.dont_use_locals, self._next_id
    return k

  # ---- what the kernel looks like
  @property
  def ends(self) -> list[UOp]: return [u for u in self.ast.src if u.op is Ops.END]

  @property
  def reduces(self) -> list[UOp]: return [u for u in self.ast.toposort if u.op is Ops.REDUCE]

  def ranges_of(self, *types: AxisType) -> list[UOp]:
    """Ranges of the given types: those closed by the kernel's ENDs in loop order first, then the reductions' ones."""
    seen: dict[UOp, None] = {}
    for e in self.ends:
      for r in e.src[1:]: seen[r] = None
    for red in self.reduces:
      for r in red.src[1:]: seen[r] = None
    return [r for r in seen if r.arg[1] in types]

  @property
  def output_axes(self) -> list[UOp]: return self.ranges_of(*_OUTPUT_TYPES)
  @property
  def reduce_axes(self) -> list[UOp]: return self.ranges_of(AxisType.REDUCE)
  @property
  def full_shape(self) -> list[int | None]: return [_size(r) for r in self.output_axes + self.reduce_axes]

  def upcast_size(self, split: UOp | None = None, amt: int = 1) -> int:
    """Register lanes: the UPCAST sizes times the UNROLL sizes of the most unrolled reduction (the reductions of one
    kernel run one after another, a row kernel's max and sum, so their unrolls do not multiply); with range `split`
    split by `amt` (UPCAST: every reduction grows, UNROLL: those over it)."""
    unrolled = [prod(_size(r) or 1 for r in red.src[1:] if r.arg[1] is AxisType.UNROLL) * (amt if split in red.src[1:] else 1)
                for red in self.reduces]
    up = prod(_size(r) or 1 for r in self.ranges_of(AxisType.UPCAST)) * (amt if split is not None and split.arg[1] is not AxisType.REDUCE else 1)
    return up * max(unrolled, default=1)
  def local_size(self) -> int: return prod(_size(r) or 1 for r in self.ranges_of(*_LOCAL_TYPES))

  # ---- applying actions
  def apply_opts(self, opts: tuple[Opt, ...] | list[Opt]) -> Scheduler:
    for o in opts: self.apply_opt(o)
    return self

  def apply_opt(self, opt: Opt) -> None:
    if not isinstance(opt, Opt): raise KernelOptError(f"an action must be an Opt, got {type(opt).__name__} {opt!r}")
    before = (self.ast, self.dont_use_locals, self._next_id)
    try: self._apply(opt)
    except KernelOptError:
      self.ast, self.dont_use_locals, self._next_id = before
      raise
    self.applied.append(opt)

  def _axis(self, axes: list[UOp], opt: Opt, what: str) -> UOp:
    if not isinstance(opt.axis, int) or not 0 <= opt.axis < len(axes):
      raise KernelOptError(f"{opt}: axis must be the number of one of the {len(axes)} {what} axes of kernel {self.info.name!r}")
    return axes[opt.axis]

  def _amount(self, r: UOp, opt: Opt) -> int:
    size = _size(r)
    if size is None: raise KernelOptError(f"{opt}: the axis has the symbolic size {r.src[0].render()}; only constant sizes can be split")
    amt = size if opt.amount == 0 else opt.amount
    if not isinstance(amt, int) or amt < 1: raise KernelOptError(f"{opt}: amount must be a positive int (0 = the whole axis)")
    if size % amt: raise KernelOptError(f"{opt}: the axis has size {size}, which {amt} does not divide (PADTO it first)")
    return amt

  def _split_target(self, axes: list[UOp], opt: Opt, what: str) -> tuple[UOp, int]:
    """(the range `opt` splits, the amount), checked: a valid axis, a dividing amount, not inside a PACK copy."""
    r = self._axis(axes, opt, what)
    amt = self._amount(r, opt)
    self._not_packed(r, opt)
    return r, amt

  def _workgroup_fits(self, opt: Opt, amt: int) -> None:
    rd = self.renderer
    limit = min(rd.local_max[0] if rd.local_max else 1024, 1024)
    if self.local_size() * amt > limit: raise KernelOptError(f"{opt}: a workgroup of more than {limit} threads")

  def _apply(self, opt: Opt) -> None:
    op, rd = opt.op, self.renderer
    if self.applied and self.applied[-1].op is OptOps.TC and op is OptOps.TC: raise KernelOptError(f"{opt}: TC was already applied")
    if op is OptOps.TC:
      if any(o.op is not OptOps.PADTO for o in self.applied):
        raise KernelOptError(f"{opt}: TC must be the first action (it rewrites the reduction; only PADTO may come before it)")
      self.ast = apply_tc(self, opt)
      return
    if op is OptOps.NOLOCALS:
      if not rd.has_local: raise KernelOptError(f"{opt}: {rd.device} has no workgroups")
      if self.dont_use_locals or self.ranges_of(*_LOCAL_TYPES): raise KernelOptError(f"{opt}: the kernel already uses (or refused) locals")
      self.dont_use_locals = True
      return
    if op is OptOps.SWAP:
      axes = self.output_axes
      a, b = self._axis(axes, opt, "output"), self._axis(axes, Opt(op, opt.amount), "output")
      if a is b: raise KernelOptError(f"{opt}: swapping an axis with itself")
      self._reorder({a: b, b: a})
      return
    if op is OptOps.PACK:
      self._pack(opt)
      return
    if op is OptOps.TILE:
      r = self._axis(self.output_axes, opt, "output")
      amt = self._amount(r, opt)
      size = _size(r)
      assert size is not None
      if amt == size: raise KernelOptError(f"{opt}: a tile of the whole axis (size {size}) leaves nothing to block")
      if self.ranges_of(AxisType.THREAD): raise KernelOptError(f"{opt}: TILE must come before THREAD (the tile loop goes outermost)")
      self._not_packed(r, opt)
      outer, inner = self.new_range(size // amt, r.arg[1]), self.new_range(amt, r.arg[1])
      self.ast = replace_range(self.ast, r, outer * amt + inner, (inner,), front=(outer,))
      return
    if op is OptOps.PADTO:
      self._padto(self._axis(self.output_axes + self.reduce_axes, opt, "output or reduce"), opt)
      return
    if op in (OptOps.UPCAST, OptOps.LOCAL, OptOps.THREAD):
      r, amt = self._split_target(self.output_axes, opt, "output")
      if op is OptOps.UPCAST:
        self._split(opt, r, amt, AxisType.UPCAST)
      elif op is OptOps.LOCAL:
        if not rd.has_local or self.dont_use_locals: raise KernelOptError(f"{opt}: {rd.device} has no workgroups (or NOLOCALS was applied)")
        self._workgroup_fits(opt, amt)
        self._split(opt, r, amt, AxisType.LOCAL)
      else:
        if rd.has_local: raise KernelOptError(f"{opt}: THREAD splits work across host threads; {rd.device} has workgroups (use LOCAL)")
        if self.ranges_of(AxisType.THREAD): raise KernelOptError(f"{opt}: the kernel already has a THREAD axis")
        size = _size(r)
        assert size is not None
        outer, inner = self.new_range(amt, AxisType.THREAD), self.new_range(size // amt, r.arg[1])
        self.ast = replace_range(self.ast, r, outer * (size // amt) + inner, (inner,), front=(outer,))
      return
    if op in (OptOps.UNROLL, OptOps.GROUP, OptOps.GROUPTOP):
      r, amt = self._split_target(self.reduce_axes, opt, "reduce")
      if op is OptOps.UNROLL:
        self._split(opt, r, amt, AxisType.UNROLL)
        return
      if not (rd.has_local and rd.has_shared) or self.dont_use_locals:
        raise KernelOptError(f"{opt}: {rd.device} has no workgroup memory to combine partial reductions in (or NOLOCALS was applied)")
      reds = [u for u in self.reduces if r in u.src[1:]]
      if len(self.reduces) != 1 or len(reds) != 1: raise KernelOptError(f"{opt}: GROUP needs a kernel with exactly one reduction")
      if self.ranges_of(AxisType.GROUP_REDUCE):
        raise KernelOptError(f"{opt}: the reduction is already grouped")
      if self.ranges_of(AxisType.UPCAST, AxisType.UNROLL): raise KernelOptError(f"{opt}: GROUP must come before UPCAST/UNROLL")
      self._workgroup_fits(opt, amt)
      if self.local_size() * amt * reds[0].dtype.itemsize > rd.shared_max:
        raise KernelOptError(f"{opt}: needs more than {rd.shared_max} bytes of shared memory")
      self._split(opt, r, amt, AxisType.GROUP_REDUCE, top=op is OptOps.GROUPTOP)
      return
    raise KernelOptError(f"unknown action {opt}")

  # ---- packing
  def packable_values(self) -> list[UOp]:
    """PACK's candidates, in first-use order: the *operands* of the reductions, i.e. the largest parts of a reduced value
    that read global memory and lack one of the value's output loops (a matmul's A and B factors, with whatever
    elementwise work was fused into them: packing the value computes that work once instead of once per reuse)."""
    copied = {u for pk in self._packs() for u in pk.toposort}  # what the PACK copies already made compute
    outs = set(self.ranges_of(*_OUTPUT_TYPES, AxisType.UPCAST))
    out: dict[UOp, None] = {}
    for red in self.reduces:
      topo = [u for u in red.src[0].toposort if u not in copied]
      rng: dict[UOp, frozenset[UOp]] = {}
      reads: dict[UOp, bool] = {}
      users: dict[UOp, list[UOp]] = {}
      for u in topo:
        rng[u] = frozenset({u} if u.op is Ops.RANGE else ()).union(*(rng.get(x, frozenset()) for x in u.src))
        glob = u.op is Ops.LOAD and u.src[0].op is Ops.INDEX and u.src[0].src[0].op is Ops.DEFINE_GLOBAL
        reads[u] = glob or any(reads.get(x, False) for x in u.src)
        for x in u.src: users.setdefault(x, []).append(u)
      full = rng[red.src[0]] & outs
      own = set(red.src[1:]) | set(self.ranges_of(AxisType.UNROLL))
      for u in topo:
        if isinstance(u.dtype, PtrDType) or u.dtype.count != 1 or u.dtype in (dtypes.index, dtypes.void) or not reads[u]: continue
        if not (rng[u] & own) or full <= rng[u]: continue
        if all(rng[c] != rng[u] for c in users.get(u, [])): out[u] = None
    return list(out)

  def _packs(self) -> list[UOp]:
    return [u for u in self.ast.toposort if u.op is Ops.END and u.src[0].op is Ops.STORE and isinstance(p := u.src[0].src[0].dtype, PtrDType)
            and p.addrspace is AddrSpace.REG]

  def _not_packed(self, r: UOp, opt: Opt) -> None:
    """Splitting a loop a PACK copy sits inside would split the copy too: refused (the loops it covers may be split)."""
    for pk in self._packs():
      if r in pk.toposort and r not in pk.src[1:]:
        raise KernelOptError(f"{opt}: a PACK copy is made once per iteration of this axis; split it before PACK")

  def _pack(self, opt: Opt) -> None:
    """Copy the values of operand `opt.axis` during one iteration of the outer loops it depends on (the *scope*: the leading
    loops of the store loop up to the first one the operand does not depend on) into a scratch array, ordered as the kernel
    walks it: output loops, reduce loops, unrolled and upcast ranges (the vector lanes innermost). The copy runs once per
    scope iteration; the loops inside the scope that the load does not depend on (the reuse) then read the array."""
    ld = self._axis(self.packable_values(), opt, "packable operand")
    if opt.amount not in (None, 0): raise KernelOptError(f"{opt}: PACK takes no amount (0 or None)")
    if len(self.ends) != 1 or self.ast.src != (self.ends[0],): raise KernelOptError(f"{opt}: PACK needs a kernel with one store loop")
    if any(u.op in (Ops.REDUCE, Ops.END) for u in ld.toposort):
      raise KernelOptError(f"{opt}: the operand contains a reduction or a copy (its loops would be copied too)")
    bufs = {u.src[0].src[0] for u in ld.toposort if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX}
    if any(u.op is Ops.STORE and u.src[0].src[0] in bufs for u in self.ast.toposort):
      raise KernelOptError(f"{opt}: the kernel writes a buffer this operand reads")
    deps = {u for u in ld.toposort if u.op is Ops.RANGE}
    loop = [r for r in self.ends[0].src[1:] if r.arg[1] is not AxisType.UPCAST]  # register ranges are copied whole, never a scope
    # the scope ends before a loop the operand does not depend on, with reuse inside it; the outermost such end whose copy
    # fits (an A^T operand under a column-tile loop: ended before that loop the copy would hold every row of A; ended
    # before the column loop within the tile, it holds one row tile's panel)
    def reuse(p: int) -> int: return prod(_size(x) or 2 for x in loop[p:] if x.arg[1] in _OUTPUT_TYPES and x not in deps)
    ends = [p for p, r in enumerate(loop) if r not in deps and any(x.arg[1] in _OUTPUT_TYPES and x not in deps for x in loop[p:])]
    ends = ends[:1] + [p for p in ends[1:] if reuse(p) >= 2]  # a deeper scope only where its copy is read twice
    if not ends: raise KernelOptError(f"{opt}: no loop inside the copy's scope reuses the packed values (the load depends on every output loop)")
    red_rngs = [r for red in self.reduces for r in red.src[1:]]
    order = [r for r in loop if r.arg[1] in _OUTPUT_TYPES] + [r for r in red_rngs if r.arg[1] is AxisType.REDUCE] + \
      [r for r in red_rngs if r.arg[1] is AxisType.UNROLL] + [r for r in self.ends[0].src[1:] if r.arg[1] is AxisType.UPCAST]
    for p in ends:
      scope = set(loop[:p])
      covered = list(dict.fromkeys(r for r in order if r in deps and r not in scope))
      if (stray := deps - scope - set(covered)):
        raise KernelOptError(f"{opt}: the operand depends on loops {sorted(r.arg[0] for r in stray)} PACK cannot order")
      sizes = [_size(r) for r in covered]
      if any(sz is None for sz in sizes): raise KernelOptError(f"{opt}: the load depends on a loop of symbolic size")
      covered = [r for r, sz in zip(covered, sizes) if sz != 1]
      isizes = [_size(r) or 1 for r in covered]
      if (total := prod(isizes)) * ld.dtype.itemsize <= MAX_PACK_BYTES: break
    else: raise KernelOptError(f"{opt}: the copy would take {total * ld.dtype.itemsize} bytes, more than {MAX_PACK_BYTES} (TILE the loops first)")
    fresh = {r: self.new_range(sz, AxisType.LOOP) for r, sz in zip(covered, isizes)}
    def flat(rs: list[UOp]) -> UOp:
      out: UOp = UOp.const(dtypes.index, 0)
      for n, r in enumerate(rs): out = out + r * prod(isizes[n + 1:])
      return out
    arr = UOp(Ops.DEFINE_REG, ld.dtype.ptr(total, AddrSpace.REG), (), _PACK_ID + len(self._packs()))
    # the copy's loops nest as the array is laid out (its lanes innermost: the expander writes them as vectors) unless
    # _vector_copy says no; then a loop the source runs along contiguously goes innermost: a transposing copy (B of
    # A.B^T) reads whole lines and scatters into the panel, which is in L1/L2, instead of one element per source row
    src = ld.substitute(fresh)
    idxs = [u.src[0].src[1] for u in src.toposort if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX]
    loops = list(fresh.values())
    vector = self._vector_copy(isizes, [linear_coefficient(ix, loops[-1]) for ix in idxs], ld.dtype.itemsize)
    if not vector and idxs and (along := [r for r in loops[:-1] if all(linear_coefficient(ix, r) == 1 for ix in idxs)]):
      loops = [r for r in loops if r is not along[-1]] + [along[-1]]
    copy = UOp(Ops.END, dtypes.void, (arr.index(flat([fresh[r] for r in covered])).store(src), *loops))
    self.ast = self.ast.substitute({ld: UOp(Ops.LOAD, ld.dtype, (arr.index(flat(covered)), copy))})

  def _vector_copy(self, isizes: list[int], lane_strides: list[int | None], itemsize: int) -> bool:
    """Whether a PACK copy keeps the array's innermost loop innermost, for the expander to write whole vectors along
    it (`expand._vector_copies`): its size is a multiple of the vector width, and the source rows its lanes read at
    once (a transposing copy reads one element of each) do not crowd one L1 set — rows 8 or 12 KiB apart (B of
    A.B^T at K = 2048 or 3072) all fall in one set, and gathering 16 of them ran 1.04-1.21x slower than reading each
    row's line (the copy's other order)."""
    w = self.renderer.vector_width
    if w <= 1 or not isizes or isizes[-1] % w: return False
    for st in lane_strides:
      if st is None or st in (0, 1): continue
      sets = {(i * st * itemsize) % 4096 // 64 for i in range(isizes[-1])}
      if isizes[-1] // len(sets) > L1_WAYS: return False
    return True

  def new_range(self, size: int | UOp, t: AxisType) -> UOp:
    r = UOp.range(size, self._next_id, t)
    self._next_id += 1
    return r

  def _split(self, opt: Opt, r: UOp, amt: int, t: AxisType, top: bool = False) -> None:
    if t in (AxisType.UPCAST, AxisType.UNROLL) and self.upcast_size(r, amt) > MAX_UPCAST:
      raise KernelOptError(f"{opt}: more than {MAX_UPCAST} register lanes")
    size = _size(r)
    assert size is not None
    outer = self.new_range(size // amt, r.arg[1])
    inner = self.new_range(amt, t)
    expr = inner * (size // amt) + outer if top else outer * amt + inner
    self.ast = replace_range(self.ast, r, expr, (outer, inner))

  def _reorder(self, swap: dict[UOp, UOp]) -> None:
    sub: dict[UOp, UOp] = {}
    for e in self.ends: sub[e] = e.replace(src=(e.src[0], *(swap.get(x, x) for x in e.src[1:])))
    self.ast = self.ast.substitute(sub)

  def _padto(self, r: UOp, opt: Opt) -> None:
    size = _size(r)
    if size is None: raise KernelOptError(f"{opt}: the axis has a symbolic size")
    if not isinstance(opt.amount, int) or opt.amount < 2: raise KernelOptError(f"{opt}: amount must be an int >= 2")
    new = -(-size // opt.amount) * opt.amount
    if new == size: raise KernelOptError(f"{opt}: the axis size {size} is already a multiple of {opt.amount}")
    if new > 2 * size: raise KernelOptError(f"{opt}: padding {size} to {new} more than doubles the work")
    nr = r.replace(src=(UOp.const(r.dtype, new),))
    ok = nr < size
    sub: dict[UOp, UOp] = {}
    topo = self.ast.toposort
    for u in topo:  # gate every memory access that depends on the padded range
      if u.op is Ops.INDEX and r in u.src[1].toposort | (u.src[2].toposort if len(u.src) > 2 else {}):
        sub[u] = u.replace(src=(u.src[0], u.src[1], ok if len(u.src) == 2 else (u.src[2] & ok)))
    ast = self.ast.substitute(sub)
    red_sub: dict[UOp, UOp] = {}
    for red in (u for u in ast.toposort if u.op is Ops.REDUCE and r in u.src[1:]):
      red_sub[red] = red.replace(src=(ok.where(red.src[0], red.src[0].const_like(reduce_identity(red.arg, red.dtype))), *red.src[1:]))
    self.ast = ast.substitute(red_sub).substitute({r: nr})

  def get_optimized_ast(self) -> UOp:
    info = KernelInfo(self.info.name, tuple(self.applied), None, self.dont_use_locals)
    return self.ast.replace(arg=info)


def replace_range(ast: UOp, r: UOp, expr: UOp, parts: tuple[UOp, ...], front: tuple[UOp, ...] = ()) -> UOp:
  """`ast` with RANGE `r` replaced by the index `expr`; in the range lists of END and REDUCE, `r` becomes `parts`
  (and `front` goes first)."""
  done: dict[UOp, UOp] = {}
  for u in ast.toposort:
    if u is r:
      done[u] = expr
      continue
    if u.op in (Ops.END, Ops.REDUCE) and r in u.src[1:]:
      rngs: list[UOp] = list(front)
      for x in u.src[1:]: rngs.extend(parts if x is r else (done[x],))
      done[u] = UOp(u.op, u.dtype, (done[u.src[0]], *rngs), u.arg)
      continue
    new_src = tuple(done[s] for s in u.src)
    done[u] = u if all(a is b for a, b in zip(new_src, u.src)) else UOp(u.op, u.dtype, new_src, u.arg)
  return done[ast]
