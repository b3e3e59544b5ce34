"""The TC action: a matmul-shaped reduction rewritten onto one of the renderer's tensor cores (renderer/tensor_cores.py).

The kernel must reduce `ADD` over a product `a * b` (each possibly CAST from the tensor core's input dtype; the product
possibly CAST to the accumulator's dtype and masked by PADTO's `where(valid, ., 0)`). The action picks three ranges:
`k`, a range of the reduction both factors depend on (the K side); `i`, an output range `a` depends on and `b` does not
(the M side); `j`, an output range `b` depends on and `a` does not (the N side). Every other range stays a loop: output
ranges either factor reads (a batch, a convolution's other pixels) around the stores, the reduction's other ranges (a
convolution's window) around the accumulation. The action splits i, j, k by the instruction's M, N, K and adds a
LOCAL range `lane` of the instruction's thread count. Each lane loads its fragment elements where the layout table
says, one WMMA per step of the outer k range (and of the other reduce ranges) accumulates `D += A @ B` in a vector
register, and lane `lane`'s result element e is stored at the C layout's (row, col). Layout tables become index
arithmetic on the bits of `lane` (every layout we ship is linear in those bits; one that is not is refused with a
KernelOptError).

Which (i, j, k): among the triples whose sizes the instruction's M, N, K divide, the one of the innermost ranges (the
last output ranges, the last reduce range: `pick_triple`). Sizes it does not divide are PADTO'd first (`match_tc`
lists the triples, so the heuristics can pad one): PADTO may precede TC, nothing else may. A padded K is masked
in both factors (a padded row of K reads 0 on both sides, never 0 times a non-finite value); a padded M or N row needs
no mask (it only feeds outputs the gated stores drop).

A CPU's tensor core (`threads=1`: AVX-512 BF16/VNNI, AMX) is executed by one thread: no `lane` range is added (its
index is the constant 0) and no workgroups are needed; the renderer's own UPCAST/UNROLL of the outer ranges make the
register (tile) block (heuristic.py's `cpu_tensor_core`, the CPU default). Factors of two dtypes (u8 x s8) are matched in the order a
tensor core takes them, and integer factors only when the kernel forms their products in a dtype that holds them all.
"""
from __future__ import annotations

from typing import Protocol

from plugrad.codegen.opt.actions import KernelOptError, Opt
from plugrad.dtype import DType, dtypes
from plugrad.renderer.base import Renderer
from plugrad.renderer.tensor_cores import Layout, TensorCore
from plugrad.uop.ops import AxisType, Ops, UOp


class TCKernel(Protocol):
  """What the TC action reads and uses of the kernel being optimized (kernel.py's Scheduler)."""
  ast: UOp
  renderer: Renderer
  dont_use_locals: bool
  @property
  def output_axes(self) -> list[UOp]: ...
  @property
  def reduces(self) -> list[UOp]: ...
  def new_range(self, size: int | UOp, t: AxisType) -> UOp: ...


def _strip_cast(u: UOp) -> UOp: return u.src[0] if u.op is Ops.CAST else u


def _bit_expr(lane: UOp, f: list[int]) -> UOp | None:
  """f[lane] as `f[0] + sum_b bit_b(lane) * w_b`, or None when f is not linear in the bits of lane."""
  n = len(f)
  bits = (n - 1).bit_length()
  w = [f[1 << b] - f[0] for b in range(bits)]
  if any(f[x] != f[0] + sum(w[b] for b in range(bits) if x >> b & 1) for x in range(n)): return None
  e: UOp = UOp.const(dtypes.index, f[0])
  for b, wb in enumerate(w):
    if wb: e = e + ((lane // (1 << b)) % 2) * wb
  return e


def _coords(lane: UOp, layout: Layout, e: int, what: str, tc: TensorCore) -> tuple[UOp, UOp]:
  rows, cols = [lay[e][0] for lay in layout], [lay[e][1] for lay in layout]
  r, c = _bit_expr(lane, rows), _bit_expr(lane, cols)
  if r is None or c is None: raise KernelOptError(f"TC {tc.device}/{tc.name}: the {what} layout is not linear in the bits of the lane index")
  return r, c


def _deps(x: UOp) -> set[UOp]: return {r for r in x.toposort if r.op is Ops.RANGE}


def _size(r: UOp) -> int | None: return r.src[0].arg if r.src[0].op is Ops.CONST else None


def _exact_product(dt: DType, da: DType, db: DType) -> bool:
  """Whether integer dtype `dt` holds every product of a value of `da` and one of `db`."""
  prods = [x * y for x in (dtypes.min(da), dtypes.max(da)) for y in (dtypes.min(db), dtypes.max(db))]
  return dtypes.is_int(dt) and dtypes.min(dt) <= min(prods) and max(prods) <= dtypes.max(dt)


class TCMatch:
  """A reduction the TC action can take: its factors (masks pushed in) and the candidate (i, j, k) triples."""
  def __init__(self, red: UOp, a: UOp, b: UOp, triples: list[tuple[UOp, UOp, UOp]]):
    self.red, self.a, self.b, self.triples = red, a, b, triples


def match_tc(k: TCKernel, opt: Opt | None = None) -> TCMatch:
  """The factors of `k`'s reduction and its (i, j, k) triples, innermost first; KernelOptError says why there are none."""
  what = f"{opt}" if opt is not None else "TC"
  reds = k.reduces
  if len(reds) != 1 or reds[0].arg is not Ops.ADD or len(reds[0].src) < 2:
    raise KernelOptError(f"{what}: TC needs one ADD reduction")
  red = reds[0]
  if any(r.arg[1] is not AxisType.REDUCE for r in red.src[1:]): raise KernelOptError(f"{what}: the reduction was split already")
  val, masks = red.src[0], []
  while val.op is Ops.WHERE and val.src[2].op is Ops.CONST and val.src[2].arg == 0:  # PADTO's mask of a padded reduce range
    masks.append(val.src[0])
    val = val.src[1]
  mul = _strip_cast(val)
  if mul.op is not Ops.MUL: raise KernelOptError(f"{what}: the reduced value is not a product")
  a, b = _strip_cast(mul.src[0]), _strip_cast(mul.src[1])
  # factors of two dtypes only where a tensor core takes that pair (vpdpbusd: unsigned x signed bytes), in its order
  pairs = {(tc.dtype_in, tc.dtype_b) for tc in k.renderer.tensor_cores}
  if b.dtype is not a.dtype and (a.dtype, b.dtype) not in pairs:
    if (b.dtype, a.dtype) not in pairs: raise KernelOptError(f"{what}: the factors have different dtypes")
    a, b = b, a
  if dtypes.is_int(a.dtype) and dtypes.is_int(b.dtype) and not _exact_product(mul.dtype, a.dtype, b.dtype):
    # the kernel's products wrap in their narrow dtype (int8 * int8 in int8); an instruction forms them exactly
    raise KernelOptError(f"{what}: the integer products are formed in {mul.dtype!r}, which does not hold every product of the factors")
  for m in masks: a, b = m.where(a, a.const_like(0)), m.where(b, b.const_like(0))
  outs = k.output_axes
  da, db = _deps(a), _deps(b)
  if (da | db) - set(outs) - set(red.src[1:]): raise KernelOptError(f"{what}: the factors depend on ranges that are neither output nor reduce axes")
  ks = [r for r in red.src[1:] if r in da and r in db]
  is_ = [r for r in outs if r in da and r not in db]
  js = [r for r in outs if r in db and r not in da]
  if not ks or not is_ or not js:
    raise KernelOptError(f"{what}: the factors must each depend on an output axis the other does not, and both on a reduce axis")
  triples = [(i, j, kr) for kr in reversed(ks) for i in reversed(is_) for j in reversed(js)]
  return TCMatch(red, a, b, triples)


def pick_triple(m: TCMatch, tc: TensorCore) -> tuple[UOp, UOp, UOp] | None:
  """The (i, j, k) the TC action takes for tensor core `tc`: the first (innermost) triple whose sizes M, N, K divide."""
  def fits(t: tuple[UOp, UOp, UOp]) -> bool: return all((s := _size(r)) is not None and s % d == 0 for r, d in zip(t, (tc.m, tc.n, tc.k)))
  return next((t for t in m.triples if fits(t)), None)


def matching(rd: Renderer, m: TCMatch) -> list[TensorCore]:
  """The renderer's tensor cores that take `m`'s factor and accumulator dtypes, in order (the TC action's axis picks one)."""
  return [tc for tc in rd.tensor_cores if tc.dtype_in is m.a.dtype and tc.dtype_b is m.b.dtype and tc.dtype_out is m.red.dtype]


def _workgroups(k: TCKernel) -> bool: return k.renderer.has_local and not k.dont_use_locals


def apply_tc(k: TCKernel, opt: Opt) -> UOp:
  rd = k.renderer
  if not rd.tensor_cores: raise KernelOptError(f"{opt}: {rd.device} has no tensor cores")
  if not _workgroups(k) and all(tc.threads > 1 for tc in rd.tensor_cores): raise KernelOptError(f"{opt}: tensor cores need workgroups")
  m = match_tc(k, opt)
  red, a, b = m.red, m.a, m.b
  cands = matching(rd, m)
  if not cands:
    pair = f"{a.dtype!r}" if a.dtype is b.dtype else f"{a.dtype!r} x {b.dtype!r}"
    raise KernelOptError(f"{opt}: no tensor core of {rd.device} takes {pair} -> {red.dtype!r}")
  sel = opt.axis if opt.axis is not None else 0
  if not isinstance(sel, int) or not 0 <= sel < len(cands): raise KernelOptError(f"{opt}: axis selects one of {len(cands)} matching tensor cores")
  tc = cands[sel]
  # a warp-wide instruction needs its lanes as a LOCAL range; a CPU's (threads=1) is run by one thread, in registers/tiles
  if tc.threads > 1 and not _workgroups(k): raise KernelOptError(f"{opt}: tensor cores need workgroups")
  if (pick := pick_triple(m, tc)) is None:
    i, j, kr = m.triples[0]
    bad = next((w, _size(r), d) for w, r, d in zip("MNK", (i, j, kr), (tc.m, tc.n, tc.k)) if _size(r) is None or (_size(r) or 0) % d)
    raise KernelOptError(f"{opt}: the {bad[0]} axis (size {bad[1]}) is not a multiple of the tensor core's {bad[0]}={bad[2]} (PADTO it)")
  i, j, kr = pick
  si, sj, sk = (_size(r) or 0 for r in pick)
  io, jo, ko = k.new_range(si // tc.m, i.arg[1]), k.new_range(sj // tc.n, j.arg[1]), k.new_range(sk // tc.k, AxisType.REDUCE)
  lane = k.new_range(tc.threads, AxisType.LOCAL) if tc.threads > 1 else UOp.const(dtypes.index, 0)
  def frag(x: UOp, layout: Layout, n: int, what: str) -> UOp:
    vals = []
    for e in range(n):
      row, col = _coords(lane, layout, e, what, tc)
      if what == "A": sub = {i: io * tc.m + row, kr: ko * tc.k + col}
      else: sub = {kr: ko * tc.k + row, j: jo * tc.n + col}
      vals.append(x.substitute(sub))
    return UOp(Ops.VECTORIZE, x.dtype.vec(n), tuple(vals))
  fa = frag(a, tc.a_layout, tc.elements[0], "A")
  fb = frag(b, tc.b_layout, tc.elements[1], "B")
  zero = UOp.const(tc.dtype_out.vec(tc.elements[2]), 0.0)
  acc = UOp(Ops.REDUCE, zero.dtype, (tc.wmma(fa, fb, zero), *(ko if r is kr else r for r in red.src[1:])), Ops.ADD)
  new_srcs: list[UOp] = []
  for end in k.ast.src:
    if end.op is not Ops.END or red not in end.toposort: raise KernelOptError(f"{opt}: TC needs a kernel with one store of the reduction")
    store = end.src[0]
    stores = []
    for e in range(tc.elements[2]):
      row, col = _coords(lane, tc.c_layout, e, "C", tc)
      stores.append(store.substitute({red: acc.gep(e)}).substitute({i: io * tc.m + row, j: jo * tc.n + col}))
    body = stores[0] if len(stores) == 1 else UOp(Ops.GROUP, dtypes.void, tuple(stores))
    rngs: list[UOp] = []
    for r in end.src[1:]: rngs.extend((io,) if r is i else (jo,) if r is j else (r,))
    new_srcs.append(UOp(Ops.END, dtypes.void, (body, *rngs, *((lane,) if tc.threads > 1 else ()))))
  return k.ast.replace(src=tuple(new_srcs))


# ---- the CPU's default (hand_coded_optimizations on a renderer without workgroups calls it first)
