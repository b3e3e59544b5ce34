"""The fused attention backward: two kernels in the lowered form of `forward.py` (registers, explicit loops),
so the probabilities P and their gradient dS never reach memory either.

With s = q·kᵀ·scale + mask (base 2: times log2 e), P = exp2(s − lse2) and dP = dO·vᵀ, the gradients are
dS = P∘(dP − D) with D = rowsum(P∘dP), dQ = dS·k·scale, dK = dSᵀ·q·scale and dV = Pᵀ·dO.

* `backward_q_kernel`: one instance per R query rows (as the forward). Pass 1 over the key blocks carries the online
  (max, sum) of the forward and the rescaled sum of P∘dP, which gives each row's lse2 and D; pass 2 recomputes the
  block's P and dP and accumulates dQ (the forward's P·V loop with dS and k). It writes dQ, lse2 and D.
* `backward_kv_kernel`: one instance per R key rows. One pass over the query blocks recomputes Pᵀ and dPᵀ from the
  transposed q and dO (so the scores are vectors of queries), reads lse2 and D of those queries, and accumulates dV
  (P against dO's rows) and dK (dS against q's rows). Causal: on a CPU the loop starts at the block of the tile's first
  key (no earlier query sees it); workgroup devices mask instead.

Reading only q, k, v, the mask and dO (not the forward's output or log-sum-exp) keeps a realized output free of
references to its own buffers (gradient.kernel_output_origin); pass 1 is the price: the forward's max and sum again,
and dP once more. docs/optimizer.md, "The fused attention kernel".
"""
from __future__ import annotations

import math
from collections.abc import Callable

from plugrad.codegen.attention.common import (
  ENTRY_PASS,
  LOG2E,
  MAX_ACC_VECTORS,
  MAX_SCORE_VECTORS,
  REG_IDS,
  AttentionShape,
  _bcast,
  _hreduce,
  _lanes,
  _offsets,
  _pow2_dividing,
  masked_scores,
)
from plugrad.codegen.lower import flat_launch_index
from plugrad.dtype import AddrSpace, DType, dtypes
from plugrad.renderer.base import Renderer
from plugrad.uop.ops import AxisType, KernelInfo, Ops, UOp

F32 = dtypes.float32


def backward_tiling(renderer: Renderer, rows: int, cols: int, acc_dims: tuple[int, ...]) -> tuple[int, int, int, int]:
  """(R rows per instance, nv score vectors per block, w columns per score vector, u elements per accumulator vector)
  for an instance that owns rows of `rows` and walks `cols` in blocks, keeping one accumulator row per dim in `acc_dims`."""
  w = _pow2_dividing(cols, renderer.vector_width)
  u = _pow2_dividing(math.gcd(*acc_dims), renderer.vector_width)
  accs = sum(d // u for d in acc_dims)
  R = next(r for r in (4, 2, 1) if rows % r == 0 and r * accs <= MAX_ACC_VECTORS or r == 1)
  nv = next(n for n in (8, 4, 2, 1) if R * n <= MAX_SCORE_VECTORS and cols % (n * w) == 0)
  return R, nv, w, u


class _Builder:
  """What both kernels share: the buffers, the instance index and the pieces of the score and gradient algebra."""
  def __init__(self, sh: AttentionShape, renderer: Renderer, rows: int, R: int):
    self.sh, self.BH = sh, sh.B * sh.H
    per_head = rows // R
    launch = flat_launch_index(self.BH * per_head, renderer) if renderer.has_local else None
    self.g, self.gate = (UOp.range(self.BH * per_head, 0, AxisType.GLOBAL), None) if launch is None else launch
    self.bh, self.t0 = self.g // per_head, (self.g % per_head) * R
    self.here = (self.g,) if self.g.op is Ops.RANGE else ()
    self.regs = REG_IDS
    self.rows: dict[tuple[UOp, UOp, int, int, int, int], UOp] = {}

  def glob(self, slot: int, n: int, d: DType) -> UOp: return UOp(Ops.DEFINE_GLOBAL, d.ptr(n), (), slot)
  def vload(self, buf: UOp, idx: UOp, n: int) -> UOp: return buf.index(idx).load(dtype=buf.dtype.base.vec(n)).cast(F32.vec(n))
  def sload(self, buf: UOp, idx: UOp) -> UOp: return buf.index(idx).load().cast(F32)

  def reg(self, count: int, n: int = 1) -> UOp:
    self.regs += 1
    return UOp(Ops.DEFINE_REG, F32.vec(count).ptr(n, AddrSpace.REG), (), self.regs)

  def state(self, reg: UOp, init: float, loop: UOp) -> UOp:
    """The value of register `reg` (one element) at the top of `loop`'s body, `init` before the loop."""
    ix = reg.index(UOp.const(dtypes.index, 0))
    return UOp(Ops.LOAD, ix.dtype.base, (ix, ix.store(_bcast(UOp.const(F32, init), ix.dtype.base.count), *self.here), loop))

  def accumulate(self, acc: UOp, weights: UOp, rows: UOp, row0: UOp, width: int, k: int, u: int) -> UOp:
    """acc + Σ_t weights[t]·rows[row0 + t, chunk k] (rows of `width` elements, chunks of u)."""
    for t, lane in enumerate(_lanes(weights)):
      # every row of the tile reads the same chunks: built once (building the address arithmetic is most of the cost)
      if (key := (rows, row0, width, k, u, t)) not in self.rows: self.rows[key] = self.vload(rows, (row0 + t) * width + k * u, u)
      acc = UOp(Ops.MULACC, acc.dtype, (_bcast(lane, u), self.rows[key], acc))
    return acc


def _vsum(xs: list[UOp], op: Ops = Ops.ADD) -> UOp:
  acc = xs[0]
  for x in xs[1:]: acc = UOp(op, acc.dtype, (acc, x))
  return _hreduce(acc, op)


def backward_q_kernel(sh: AttentionShape, renderer: Renderer, stats_given: bool = False) -> UOp:
  """Buffers: 0 dq (BH, L, E), 1 lse2 float32 (BH, L), 2 D float32 (BH, L), 3 q (BH, L, E), 4 kᵀ (BH, E, S), 5 k (BH, S, E),
  6 vᵀ (BH, Ev, S), 7 dO (BH, L, Ev), 8 the mask (as the forward's slot 5) when `sh.mask`. `stats_given`: lse2 and D are
  inputs (from the forward's log-sum-exp and output) and pass 1 is skipped; else the kernel computes and writes them."""
  L, S, E, Ev = sh.L, sh.S, sh.E, sh.Ev
  R, nv, w, u = backward_tiling(renderer, L, S, (E,))
  W, b = nv * w, _Builder(sh, renderer, L, R)
  BH, dt = b.BH, sh.dtype
  dq, lse2, dsum = b.glob(0, BH * L * E, dt), b.glob(1, BH * L, F32), b.glob(2, BH * L, F32)
  q, kt, k = b.glob(3, BH * L * E, dt), b.glob(4, BH * E * S, dt), b.glob(5, BH * S * E, dt)
  vt, do = b.glob(6, BH * Ev * S, dt), b.glob(7, BH * L * Ev, dt)
  mask = b.glob(8, sh.mask_numel, F32) if sh.mask else None
  bh, rows = b.bh, [b.t0 + r for r in range(R)]
  nblocks: int | UOp = S // W
  if sh.causal and S // W > 1 and b.g.op is Ops.RANGE: nblocks = ((b.t0 + (R - 1)) // W + 1).minimum(S // W)
  scale2 = _bcast(UOp.const(F32, sh.scale * LOG2E), w)

  def block(i: UOp, jb: UOp, e: UOp, ev: UOp) -> tuple[list[UOp], list[UOp]]:
    """Row i's scaled, masked base-2 scores and dP over key block jb: nv vectors of w keys each."""
    j0 = jb * W
    qv = _bcast(b.sload(q, bh * (L * E) + i * E + e), w)
    ss = masked_scores(sh, [UOp(Ops.REDUCE, F32.vec(w), (qv * b.vload(kt, bh * (E * S) + e * S + j0 + c * w, w), e), Ops.ADD) * scale2
                            for c in range(nv)], mask, bh, i, j0)
    dov = _bcast(b.sload(do, bh * (L * Ev) + i * Ev + ev), w)
    dps = [UOp(Ops.REDUCE, F32.vec(w), (dov * b.vload(vt, bh * (Ev * S) + ev * S + j0 + c * w, w), ev), Ops.ADD) for c in range(nv)]
    return ss, dps

  zero = UOp.const(dtypes.index, 0)
  if stats_given:
    lses, ds_means = [lse2.index(bh * L + i).load() for i in rows], [dsum.index(bh * L + i).load() for i in rows]
  else: lses, ds_means = _row_statistics(b, rows, nblocks, w, block)
  # pass 2: dS = P∘(dP − D) per block, kept in a register array; dQ += dS·k as a loop over the block's score vectors
  jb2, e2, ev2, cv = (UOp.range(nblocks, 4, AxisType.REDUCE), UOp.range(E, 5, AxisType.REDUCE), UOp.range(Ev, 6, AxisType.REDUCE),
                      UOp.range(nv, 7, AxisType.REDUCE))
  acc_updates: list[UOp] = []
  accs: list[list[UOp]] = []
  for i, lse_i, d_i in zip(rows, lses, ds_means):
    ss, dps = block(i, jb2, e2, ev2)
    dss = [(x - _bcast(lse_i, w)).exp2() * (dp - _bcast(d_i, w)) for x, dp in zip(ss, dps)]
    arr = b.reg(w, nv)
    # stored inside jb2 even when one block makes nothing depend on it (a range of 1)
    kept = UOp(Ops.GROUP, dtypes.void, tuple(arr.index(UOp.const(dtypes.index, c)).store(x, jb2) for c, x in enumerate(dss)))
    row_accs = []
    for kk in range(E // u):
      areg = b.reg(u).index(zero)
      row_accs.append(areg)
      ds_c = UOp(Ops.LOAD, F32.vec(w), (arr.index(cv), kept, cv))
      acc = UOp(Ops.LOAD, F32.vec(u), (areg, areg.store(_bcast(UOp.const(F32, 0.0), u), *b.here), cv))
      acc_updates.append(areg.store(b.accumulate(acc, ds_c, k, bh * S + jb2 * W + cv * w, E, kk, u)))
    accs.append(row_accs)
  inner = UOp(Ops.END, dtypes.void, (UOp(Ops.GROUP, dtypes.void, tuple(acc_updates)), cv))
  loop2 = UOp(Ops.END, dtypes.void, (inner, jb2))
  scale = _bcast(UOp.const(F32, sh.scale), u)
  stores = []
  for i, row_accs, lse_i, d_i in zip(rows, accs, lses, ds_means):
    for kk, areg in enumerate(row_accs):
      stores.append(dq.index(bh * (L * E) + i * E + kk * u, b.gate).store((UOp(Ops.LOAD, F32.vec(u), (areg, loop2)) * scale).cast(dt.vec(u))))
    if not stats_given: stores += [lse2.index(bh * L + i, b.gate).store(lse_i), dsum.index(bh * L + i, b.gate).store(d_i)]
  body = UOp(Ops.GROUP, dtypes.void, tuple(stores))
  if b.g.op is Ops.RANGE: body = UOp(Ops.END, dtypes.void, (body, b.g))
  name = sh.name.replace("flash_attn", "flash_attn_bwd_q" if stats_given else "flash_attn_bwd_q2", 1)
  return UOp(Ops.SINK, dtypes.void, (body,), KernelInfo(name, (), (), entry_pass=ENTRY_PASS))


def _row_statistics(b: _Builder, rows: list[UOp], nblocks: int | UOp, w: int,
                    block: Callable[[UOp, UOp, UOp, UOp], tuple[list[UOp], list[UOp]]]) -> tuple[list[UOp], list[UOp]]:
  """Pass 1 of backward_q: per row the online max m, sum l and the rescaled Σ P∘dP (d), as the forward's m and l; the
  rows' lse2 = m + log2 l and D = d / l."""
  E, Ev = b.sh.E, b.sh.Ev
  jb1, e1, ev1 = UOp.range(nblocks, 1, AxisType.REDUCE), UOp.range(E, 2, AxisType.REDUCE), UOp.range(Ev, 3, AxisType.REDUCE)
  zero = UOp.const(dtypes.index, 0)
  updates: list[UOp] = []
  stats: list[tuple[UOp, UOp, UOp]] = []
  for i in rows:
    ss, dps = block(i, jb1, e1, ev1)
    regs = (b.reg(1), b.reg(1), b.reg(1))
    stats.append(regs)
    m_old, l_old, d_old = b.state(regs[0], -math.inf, jb1), b.state(regs[1], 0.0, jb1), b.state(regs[2], 0.0, jb1)
    m_new = m_old.maximum(_vsum(ss, Ops.MAX))
    m_safe = m_new.ne(-math.inf).where(m_new, UOp.const(F32, 0.0))  # a row masked so far: exp2(-inf - 0) = 0, not nan
    corr = (m_old - m_safe).exp2()
    ps = [(x - _bcast(m_safe, w)).exp2() for x in ss]
    updates += [regs[0].index(zero).store(m_new), regs[1].index(zero).store(l_old * corr + _vsum(ps)),
                regs[2].index(zero).store(d_old * corr + _vsum([p * d for p, d in zip(ps, dps)]))]
  loop1 = UOp(Ops.END, dtypes.void, (UOp(Ops.GROUP, dtypes.void, tuple(updates)), jb1))
  final = [tuple(UOp(Ops.LOAD, F32, (r.index(zero), loop1)) for r in regs) for regs in stats]
  return [m + l.log2() for m, l, _ in final], [d * l.reciprocal() for _, l, d in final]


def backward_kv_kernel(sh: AttentionShape, renderer: Renderer) -> UOp:
  """Buffers: 0 dk (BH, S, E), 1 dv (BH, S, Ev), 2 k (BH, S, E), 3 qᵀ (BH, E, L), 4 v (BH, S, Ev), 5 dOᵀ (BH, Ev, L),
  6 q (BH, L, E), 7 dO (BH, L, Ev), 8 lse2 float32 (BH, L), 9 D float32 (BH, L), 10 the mask when `sh.mask`: transposed
  to (B?, H?, S, L) when it varies along the queries, else as the forward's."""
  L, S, E, Ev = sh.L, sh.S, sh.E, sh.Ev
  R, nv, w, u = backward_tiling(renderer, S, L, (E, Ev))
  W, b = nv * w, _Builder(sh, renderer, S, R)
  BH, dt = b.BH, sh.dtype
  dk, dv = b.glob(0, BH * S * E, dt), b.glob(1, BH * S * Ev, dt)
  k, qt, v, dot = b.glob(2, BH * S * E, dt), b.glob(3, BH * E * L, dt), b.glob(4, BH * S * Ev, dt), b.glob(5, BH * Ev * L, dt)
  q, do, lse2, dsum = b.glob(6, BH * L * E, dt), b.glob(7, BH * L * Ev, dt), b.glob(8, BH * L, F32), b.glob(9, BH * L, F32)
  mask = b.glob(10, sh.mask_numel, F32) if sh.mask else None
  bh, keys = b.bh, [b.t0 + r for r in range(R)]
  ib = UOp.range(L // W, 1, AxisType.REDUCE)
  i0 = ib * W
  if sh.causal and L // W > 1 and b.g.op is Ops.RANGE:  # no query before the tile's first key sees it
    first = b.t0 // W
    ib = UOp.range(first * -1 + L // W, 1, AxisType.REDUCE)
    i0 = (ib + first) * W
  e, ev, cv = UOp.range(E, 2, AxisType.REDUCE), UOp.range(Ev, 3, AxisType.REDUCE), UOp.range(nv, 4, AxisType.REDUCE)
  scale2, log2e, ninf = _bcast(UOp.const(F32, sh.scale * LOG2E), w), _bcast(UOp.const(F32, LOG2E), w), _bcast(UOp.const(F32, -math.inf), w)
  zero = UOp.const(dtypes.index, 0)
  qvecs = [b.vload(qt, bh * (E * L) + e * L + i0 + c * w, w) for c in range(nv)]
  dovecs = [b.vload(dot, bh * (Ev * L) + ev * L + i0 + c * w, w) for c in range(nv)]
  lse_c = [b.vload(lse2, bh * L + i0 + c * w, w) for c in range(nv)]
  d_c = [b.vload(dsum, bh * L + i0 + c * w, w) for c in range(nv)]
  acc_updates: list[UOp] = []
  accs: list[tuple[list[UOp], list[UOp]]] = []
  for j in keys:
    kv = _bcast(b.sload(k, bh * (S * E) + j * E + e), w)
    ss = [UOp(Ops.REDUCE, F32.vec(w), (kv * qv, e), Ops.ADD) * scale2 for qv in qvecs]
    if mask is not None:
      if sh.mask_dims[2]:  # (B?, H?, S, L): the queries of key j are contiguous
        ss = [x + mask.index(sh.mask_offset(bh, None) + j * L + i0 + c * w).load(dtype=F32.vec(w)) * log2e for c, x in enumerate(ss)]
      else: ss = [x + _bcast(mask.index(sh.mask_offset(bh, None) + j).load(), w) * log2e for x in ss]
    if sh.causal:  # query i0 + c·w + t sees key j when it is not before it
      lim = _bcast(j - i0, w)
      hidden = [_offsets(c, w) < lim for c in range(nv)]
      ss = [no.where(ninf, x) for no, x in zip(hidden, ss)]
    vv = _bcast(b.sload(v, bh * (S * Ev) + j * Ev + ev), w)
    dps = [UOp(Ops.REDUCE, F32.vec(w), (vv * dov, ev), Ops.ADD) for dov in dovecs]
    ps = [(x - lse).exp2() for x, lse in zip(ss, lse_c)]
    dss = [p * (dp - d) for p, dp, d in zip(ps, dps, d_c)]
    p_arr, ds_arr = b.reg(w, nv), b.reg(w, nv)
    kept = UOp(Ops.GROUP, dtypes.void, tuple(arr.index(UOp.const(dtypes.index, c)).store(x, ib) for arr, xs in ((p_arr, ps), (ds_arr, dss))
                                             for c, x in enumerate(xs)))
    p_cv, ds_cv = UOp(Ops.LOAD, F32.vec(w), (p_arr.index(cv), kept, cv)), UOp(Ops.LOAD, F32.vec(w), (ds_arr.index(cv), kept, cv))
    row = bh * L + i0 + cv * w
    dk_regs, dv_regs = [b.reg(u).index(zero) for _ in range(E // u)], [b.reg(u).index(zero) for _ in range(Ev // u)]
    for regs, weights, rows, width in ((dk_regs, ds_cv, q, E), (dv_regs, p_cv, do, Ev)):
      for kk, areg in enumerate(regs):
        acc = UOp(Ops.LOAD, F32.vec(u), (areg, areg.store(_bcast(UOp.const(F32, 0.0), u), *b.here), cv))
        acc_updates.append(areg.store(b.accumulate(acc, weights, rows, row, width, kk, u)))
    accs.append((dk_regs, dv_regs))
  loop = UOp(Ops.END, dtypes.void, (UOp(Ops.END, dtypes.void, (UOp(Ops.GROUP, dtypes.void, tuple(acc_updates)), cv)), ib))
  scale = _bcast(UOp.const(F32, sh.scale), u)
  stores = []
  for j, (dk_regs, dv_regs) in zip(keys, accs):
    for out, regs, width, factor in ((dk, dk_regs, E, scale), (dv, dv_regs, Ev, None)):
      for kk, areg in enumerate(regs):
        val = UOp(Ops.LOAD, F32.vec(u), (areg, loop))
        stores.append(out.index(bh * (S * width) + j * width + kk * u, b.gate).store((val * factor if factor is not None else val).cast(dt.vec(u))))
  body = UOp(Ops.GROUP, dtypes.void, tuple(stores))
  if b.g.op is Ops.RANGE: body = UOp(Ops.END, dtypes.void, (body, b.g))
  return UOp(Ops.SINK, dtypes.void, (body,), KernelInfo(sh.name.replace("flash_attn", "flash_attn_bwd_kv", 1), (), (), entry_pass=ENTRY_PASS))


__all__ = ["backward_kv_kernel", "backward_q_kernel", "backward_tiling"]
