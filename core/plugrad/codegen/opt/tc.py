"""The TC action: a matmul-shaped reduction rewritten onto one of the renderer's tensor cores (renderer/tensor_cores.py).

The kernel must reduce `ADD` over one range `k` of a product `a * b` (each possibly CAST from the tensor core's input
dtype), where `a` depends on one output range `i` (the M side) and `k`, and `b` on `k` and another output range `j`
(the N side). The action splits i, j, k by the instruction's M, N, K and adds a LOCAL range `lane` of the
instruction's thread count. Each lane loads its fragment elements where the layout table says, one WMMA per step of
the outer k range accumulates `D += A @ B` in a vector register, and lane `lane`'s result element e is stored at the
C layout's (row, col). Layout tables become index arithmetic on the bits of `lane` (every layout we ship is linear
in those bits; one that is not is refused with a KernelOptError).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from plugrad.dtype import dtypes
from plugrad.renderer.tensor_cores import Layout, TensorCore
from plugrad.uop.ops import AxisType, Ops, UOp

if TYPE_CHECKING:
  from plugrad.codegen.opt.kernel import Opt, Scheduler


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
  from plugrad.codegen.opt.kernel import KernelOptError
  rows, cols = [lay[e][0] for lay in layout], [lay[e][1] for lay in layout]
  r, c = _bit_expr(lane, rows), _bit_expr(lane, cols)
  if r is None or c is None: raise KernelOptError(f"TC {tc.device}/{tc.name}: the {what} layout is not linear in the bits of the lane index")
  return r, c


def apply_tc(k: Scheduler, opt: Opt) -> UOp:
  from plugrad.codegen.opt.kernel import KernelOptError
  rd = k.renderer
  if not rd.tensor_cores: raise KernelOptError(f"{opt}: {rd.device} has no tensor cores")
  if not rd.has_local or k.dont_use_locals: raise KernelOptError(f"{opt}: tensor cores need workgroups")
  reds = k.reduces
  if len(reds) != 1 or reds[0].arg is not Ops.ADD or len(reds[0].src) != 2:
    raise KernelOptError(f"{opt}: TC needs one ADD reduction over one range")
  red = reds[0]
  kr = red.src[1]
  mul = _strip_cast(red.src[0])
  if mul.op is not Ops.MUL: raise KernelOptError(f"{opt}: the reduced value is not a product")
  a, b = _strip_cast(mul.src[0]), _strip_cast(mul.src[1])
  outs = k.output_axes
  def deps(x: UOp) -> set[UOp]: return {r for r in x.toposort if r.op is Ops.RANGE}
  da, db = deps(a), deps(b)
  if kr not in da or kr not in db: raise KernelOptError(f"{opt}: both factors must depend on the reduce axis")
  ia, jb = [r for r in outs if r in da], [r for r in outs if r in db]
  if len(ia) != 1 or len(jb) != 1 or ia[0] is jb[0] or da - {ia[0], kr} or db - {jb[0], kr}:
    raise KernelOptError(f"{opt}: the factors must each depend on one distinct output axis and the reduce axis")
  i, j = ia[0], jb[0]
  cands = [tc for tc in rd.tensor_cores if tc.dtype_in is a.dtype and tc.dtype_out is red.dtype]
  if not cands: raise KernelOptError(f"{opt}: no tensor core of {rd.device} takes {a.dtype!r} -> {red.dtype!r}")
  if b.dtype is not a.dtype: raise KernelOptError(f"{opt}: the factors have different dtypes")
  sel = opt.axis if opt.axis is not None else 0
  if not isinstance(sel, int) or not 0 <= sel < len(cands): raise KernelOptError(f"{opt}: axis selects one of {len(cands)} matching tensor cores")
  tc = cands[sel]
  sizes = [r.src[0].arg if r.src[0].op is Ops.CONST else None for r in (i, j, kr)]
  for what, s, d in zip("MNK", sizes, (tc.m, tc.n, tc.k)):
    if s is None or s % d: raise KernelOptError(f"{opt}: the {what} axis (size {s}) is not a multiple of the tensor core's {what}={d} (PADTO it)")
  assert sizes[0] is not None and sizes[1] is not None and sizes[2] is not None
  io, jo, ko = k.new_range(sizes[0] // tc.m, i.arg[1]), k.new_range(sizes[1] // tc.n, j.arg[1]), k.new_range(sizes[2] // tc.k, AxisType.REDUCE)
  lane = k.new_range(tc.threads, AxisType.LOCAL)
  def frag(x: UOp, layout: Layout, n: int, what: str) -> UOp:
    vals = []
    for e in range(n):
      row, col = _coords(lane, layout, e, what, tc)
      if what == "A": sub = {i: io * tc.m + row, kr: ko * tc.k + col}
      else: sub = {kr: ko * tc.k + row, j: jo * tc.n + col}
      vals.append(x.substitute(sub))
    return UOp(Ops.VECTORIZE, tc.dtype_in.vec(n), tuple(vals))
  fa = frag(a, tc.a_layout, tc.elements[0], "A")
  fb = frag(b, tc.b_layout, tc.elements[1], "B")
  zero = UOp.const(tc.dtype_out.vec(tc.elements[2]), 0.0)
  acc = UOp(Ops.REDUCE, zero.dtype, (tc.wmma(fa, fb, zero), ko), Ops.ADD)
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
    new_srcs.append(UOp(Ops.END, dtypes.void, (body, *rngs, lane)))
  return k.ast.replace(src=tuple(new_srcs))
