"""A fused attention kernel ("flash attention"): softmax(q·kᵀ·scale + mask)·v with an online softmax, so the scores
never reach memory.

The optimizer's REDUCE folds one value with ADD, MUL or MAX; an online softmax carries three states per query row
(the running maximum m, the running sum l, the output accumulator o) and rescales l and o whenever m grows. This
module writes that kernel directly in the lowered form the codegen's later passes take (register accumulators,
explicit loops: what `lower_reduces` produces); it joins the codegen passes at its entry pass like every kernel written
so, and each device renders it with its own renderer (CPU C/LLVM, the PYTHON interpreter, WGSL, CUDA, ...).

One program instance owns R query rows of one (batch, head). It walks the keys in blocks of nv·w (w the device's
vector width, nv score vectors per row for enough independent multiply-add chains): the block's scores are inner
reductions over the head dimension (q broadcast times a vector of the transposed keys kᵀ, so no horizontal sums),
then per row the block maximum, one rescale of l and o, nv vector exp2s, and o += p·v as a loop over the block's
score vectors with the w keys of each unrolled into vector multiply-adds. Everything is in base 2 (scores scaled by
log2(e)); `lse` (natural log-sum-exp per row) is written too. The backward's two kernels are in
`backward.py` beside this file (`attention_linear(..., kind=)` builds any of the three). A causal kernel stops each
tile's key loop after the tile's last row (on devices without workgroups) and masks the block that crosses the
diagonal. docs/optimizer.md, "The fused attention kernel".
"""
from __future__ import annotations

import math

from plugrad.codegen.attention.common import (
  ENTRY_PASS,
  LN2,
  LOG2E,
  REG_IDS,
  AttentionShape,
  _bcast,
  _hreduce,
  _lanes,
  attention_tiling,
  masked_scores,
)
from plugrad.codegen.lower import flat_launch_index
from plugrad.dtype import AddrSpace, DType, dtypes
from plugrad.renderer.base import Renderer
from plugrad.uop.ops import AxisType, KernelInfo, Ops, UOp


def attention_kernel(shape: AttentionShape, renderer: Renderer) -> UOp:
  """The lowered kernel graph (a SINK) for `shape` on `renderer`'s device. Buffers: 0 out (B*H, L, Ev), 1 lse float32
  (B*H, L), 2 q (B*H, L, E), 3 kᵀ (B*H, E, S), 4 v (B*H, S, Ev), 5 the mask when `shape.mask` (see AttentionShape)."""
  sh, f32, dt = shape, dtypes.float32, shape.dtype
  BH, L, S, E, Ev = sh.B * sh.H, sh.L, sh.S, sh.E, sh.Ev
  R, nv, w, u = attention_tiling(shape, renderer)
  W = nv * w
  def glob(slot: int, n: int, d: DType) -> UOp: return UOp(Ops.DEFINE_GLOBAL, d.ptr(n), (), slot)
  out, lse, q, kt, v = glob(0, BH * L * Ev, dt), glob(1, BH * L, f32), glob(2, BH * L * E, dt), glob(3, BH * E * S, dt), glob(4, BH * S * Ev, dt)
  mask = glob(5, sh.mask_numel, f32) if sh.mask else None
  tiles = BH * (L // R)
  # the instance index: a parallel loop on a CPU, launch indices where the device has workgroups
  launch = flat_launch_index(tiles, renderer) if renderer.has_local else None
  if launch is None: g, gate = UOp.range(tiles, 0, AxisType.GLOBAL), None
  else: g, gate = launch
  bh, i0 = g // (L // R), (g % (L // R)) * R
  rows = [i0 + r for r in range(R)]
  nblocks: int | UOp = S // W
  # no block after the tile's last row; only in a loop (threads of a workgroup keep one bound: the PYTHON interpreter,
  # which runs them in lockstep, requires it, and a GPU's lanes would wait for the longest row anyway)
  if sh.causal and S // W > 1 and launch is None: nblocks = ((i0 + (R - 1)) // W + 1).minimum(S // W)
  jb = UOp.range(nblocks, 1, AxisType.REDUCE)
  e = UOp.range(E, 2, AxisType.REDUCE)
  j0 = jb * W
  kvecs = [kt.index(bh * (E * S) + e * S + j0 + c * w).load(dtype=dt.vec(w)).cast(f32.vec(w)) for c in range(nv)]
  scale2 = _bcast(UOp.const(f32, sh.scale * LOG2E), w)
  ranges_here = (g,) if g.op is Ops.RANGE else ()

  def reg(n: int, count: int) -> UOp: return UOp(Ops.DEFINE_REG, f32.vec(count).ptr(1, AddrSpace.REG), (), n).index(UOp.const(dtypes.index, 0))
  def vmap(op: Ops, xs: list[UOp]) -> UOp:  # lanewise over the block's vectors, then across the lanes
    acc = xs[0]
    for x in xs[1:]: acc = UOp(op, acc.dtype, (acc, x))
    return _hreduce(acc, op)
  cv = UOp.range(nv, 3, AxisType.REDUCE)
  vrows: dict[tuple[int, int], UOp] = {}  # every row's P·V reads the same values: built once, not once per row
  def vrow(t: int, k: int) -> UOp:
    if (key := (t, k)) not in vrows: vrows[key] = v.index(bh * (S * Ev) + (j0 + cv * w + t) * Ev + k * u).load(dtype=dt.vec(u)).cast(f32.vec(u))
    return vrows[key]
  def pv(acc: UOp, p: UOp, k: int) -> UOp:  # acc + Σ_t p[t]·v[key cv·w + t, value chunk k]
    for t, lane in enumerate(_lanes(p)): acc = UOp(Ops.MULACC, acc.dtype, (_bcast(lane, u), vrow(t, k), acc))
    return acc
  updates: list[UOp] = []
  pv_updates: list[UOp] = []
  regs: list[tuple[UOp, UOp, list[UOp]]] = []  # per row: m, l and the accumulators
  for r, i in enumerate(rows):
    qv = _bcast(q.index(bh * (L * E) + i * E + e).load().cast(f32), w)
    ss = masked_scores(sh, [UOp(Ops.REDUCE, f32.vec(w), (qv * kv, e), Ops.ADD) * scale2 for kv in kvecs], mask, bh, i, j0)
    ids = REG_IDS + r * (3 + Ev // u) + 1
    m_reg, l_reg = reg(ids, 1), reg(ids + 1, 1)
    acc_regs = [reg(ids + 2 + k, u) for k in range(Ev // u)]
    regs.append((m_reg, l_reg, acc_regs))
    def state(ix: UOp, init: float, n: int) -> UOp:
      return UOp(Ops.LOAD, ix.dtype.base, (ix, ix.store(_bcast(UOp.const(f32, init), n), *ranges_here), jb))
    m_old, l_old = state(m_reg, -math.inf, 1), state(l_reg, 0.0, 1)
    m_new = m_old.maximum(vmap(Ops.MAX, ss))
    m_safe = m_new.ne(-math.inf).where(m_new, UOp.const(f32, 0.0))  # a row masked so far: exp2(-inf - 0) = 0, not nan
    corr = (m_old - m_safe).exp2()
    ps = [(x - _bcast(m_safe, w)).exp2() for x in ss]
    updates += [m_reg.store(m_new), l_reg.store(l_old * corr + vmap(Ops.ADD, ps))]
    # o += P·V over the block: a loop over its nv score vectors (kept in a register array) with the w keys of each
    # unrolled, not all nv·w keys unrolled (a kernel nv times smaller to lower and compile)
    p_arr = UOp(Ops.DEFINE_REG, f32.vec(w).ptr(nv, AddrSpace.REG), (), ids - 1)
    kept = UOp(Ops.GROUP, dtypes.void, tuple(p_arr.index(UOp.const(dtypes.index, c)).store(x) for c, x in enumerate(ps)))
    # the rescale by corr happens in the first pass: a register is read once per loop body (the linearizer drops a
    # LOAD's placement sources, so a second read of it in the same block would merge with the first)
    first = _bcast(cv.eq(0), u)
    for k, areg in enumerate(acc_regs):
      p_c = UOp(Ops.LOAD, f32.vec(w), (p_arr.index(cv), kept, cv))
      acc = UOp(Ops.LOAD, f32.vec(u), (areg, areg.store(_bcast(UOp.const(f32, 0.0), u), *ranges_here), cv))
      pv_updates.append(areg.store(pv(first.where(acc * _bcast(corr, u), acc), p_c, k)))
  updates.append(UOp(Ops.END, dtypes.void, (UOp(Ops.GROUP, dtypes.void, tuple(pv_updates)), cv)))
  loop = UOp(Ops.END, dtypes.void, (UOp(Ops.GROUP, dtypes.void, tuple(updates)), jb))
  stores = []
  for i, (m_reg, l_reg, acc_regs) in zip(rows, regs):
    m_f, l_f = UOp(Ops.LOAD, f32, (m_reg, loop)), UOp(Ops.LOAD, f32, (l_reg, loop))
    inv = l_f.reciprocal()
    for k, areg in enumerate(acc_regs):
      val = (UOp(Ops.LOAD, f32.vec(u), (areg, loop)) * _bcast(inv, u)).cast(dt.vec(u))
      stores.append(out.index(bh * (L * Ev) + i * Ev + k * u, gate).store(val))
    stores.append(lse.index(bh * L + i, gate).store((m_f + l_f.log2()) * UOp.const(f32, LN2)))
  body = UOp(Ops.GROUP, dtypes.void, tuple(stores))
  if g.op is Ops.RANGE: body = UOp(Ops.END, dtypes.void, (body, g))
  return UOp(Ops.SINK, dtypes.void, (body,), KernelInfo(shape.name, (), (), entry_pass=ENTRY_PASS))
