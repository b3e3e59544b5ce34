"""A fused attention kernel ("flash attention"): softmax(q·kᵀ·scale + mask)·v with an online softmax, so the scores
never reach memory.

The optimizer's REDUCE folds one value with ADD, MUL or MAX; an online softmax carries three states per query row
(the running maximum m, the running sum l, the output accumulator o) and rescales l and o whenever m grows. This
module writes that kernel directly in the lowered form the codegen's later stages take (register accumulators,
explicit loops: what `lower_reduces` produces), and hands it to the same decompose → linearize → render tail as every
kernel, so each device renders it with its own renderer (CPU C/LLVM, the PYTHON interpreter, WGSL, CUDA, ...).

One program instance owns R query rows of one (batch, head). It walks the keys in blocks of nv·w (w the device's
vector width, nv score vectors per row for enough independent multiply-add chains): the block's scores are inner
reductions over the head dimension (q broadcast times a vector of the transposed keys kᵀ, so no horizontal sums),
then per row the block maximum, one rescale of l and o, nv vector exp2s, and o += p·v as a loop over the block's
score vectors with the w keys of each unrolled into vector multiply-adds. Everything is in base 2 (scores scaled by
log2(e)); `lse` (natural log-sum-exp per row) is written too. The backward's two kernels are in
`codegen/attention_backward.py` (`attention_linear(..., kind=)` builds any of the three). A causal kernel stops each
tile's key loop after the tile's last row (on devices without workgroups) and masks the block that crosses the
diagonal. docs/optimizer.md, "The fused attention kernel".
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from plugrad.codegen import codegen_seconds, renderer_key
from plugrad.codegen.decompose import decompose
from plugrad.codegen.linearize import linearize
from plugrad.codegen.lower import flat_launch_index, lower_reduces, split_ends
from plugrad.dtype import AddrSpace, DType, dtypes
from plugrad.renderer.base import Renderer
from plugrad.uop.ops import AxisType, KernelInfo, Ops, UOp
from plugrad.uop.program import ProgramUOp, make_program
from plugrad.uop.rewrite import graph_rewrite
from plugrad.uop.symbolic import symbolic

LOG2E, LN2 = 1 / math.log(2), math.log(2)
REG_IDS = 1 << 20  # ids of the online-softmax registers, apart from the inner reductions' (lower_reduces counts from 0)
MAX_SCORE_VECTORS = 8  # the block's score vectors one instance keeps (R rows x nv): independent FMA chains, in registers
MAX_ACC_VECTORS = 16  # the output accumulators one instance keeps (R rows x Ev/u vectors): registers, not a spill


@dataclass(frozen=True)
class AttentionShape:
  """One fused attention launch: `B*H` heads of `L` queries and `S` keys, head dims `E` (q, k) and `Ev` (v), `dtype`
  the element type of q, k, v and the output. `mask`: None, or which of (batch, head, query) the additive float32 mask
  varies along (its last dim is always the S keys; a False dim is broadcast). `causal`: key j is seen by query i
  when j <= i."""
  B: int
  H: int
  L: int
  S: int
  E: int
  Ev: int
  dtype: DType = dtypes.float32
  mask: tuple[bool, bool, bool] | None = None
  causal: bool = False
  scale: float = 1.0

  @property
  def name(self) -> str:
    return f"flash_attn_{self.B * self.H}_{self.L}_{self.S}_{self.E}" + ("_causal" if self.causal else "_mask" if self.mask else "")

  @property
  def mask_dims(self) -> tuple[bool, bool, bool]:
    """Which of (batch, head, query) the mask varies along (all False without a mask)."""
    return self.mask or (False, False, False)

  @property
  def mask_numel(self) -> int:
    m = self.mask_dims
    return (self.B if m[0] else 1) * (self.H if m[1] else 1) * (self.L if m[2] else 1) * self.S

  def mask_offset(self, bh: UOp, i: UOp | None) -> UOp:
    """The element offset of (head bh of B·H[, query i]) in the mask (B?, H?, L?, S), or with i None in its transpose
    (B?, H?, S, L?)."""
    mb, mh, ml = self.mask_dims
    off = (bh // self.H) * ((self.H if mh else 1) * (self.L if ml else 1) * self.S) if mb else UOp.const(dtypes.index, 0)
    if mh: off = off + (bh % self.H) * ((self.L if ml else 1) * self.S)
    return off + i * self.S if ml and i is not None else off


def _pow2_dividing(n: int, cap: int) -> int:
  w = 1
  while w * 2 <= cap and n % (w * 2) == 0: w *= 2
  return w


def _bcast(x: UOp, n: int) -> UOp: return x if n == 1 else UOp(Ops.VECTORIZE, x.dtype.vec(n), (x,) * n)


def _offsets(c: int, w: int) -> UOp:
  """The positions of score vector c's w lanes in its block, as an index vector (a scalar for w = 1)."""
  return UOp.const(dtypes.index.vec(w), tuple(c * w + t for t in range(w))) if w > 1 else UOp.const(dtypes.index, c)


def masked_scores(sh: AttentionShape, ss: list[UOp], mask: UOp | None, bh: UOp, i: UOp, j0: UOp) -> list[UOp]:
  """Query row i's base-2 scores over the key block from j0 (score vectors of w keys) with the additive mask (buffer
  `mask`, as the forward's slot 5) and the causal limit applied."""
  w = ss[0].dtype.count
  if mask is not None:
    log2e = _bcast(UOp.const(dtypes.float32, LOG2E), w)
    ss = [x + mask.index(sh.mask_offset(bh, i) + j0 + c * w).load(dtype=dtypes.float32.vec(w)) * log2e for c, x in enumerate(ss)]
  if sh.causal:
    # key j0 + c·w + t is seen when c·w + t < i - j0 + 1: one vector comparison per score vector
    lim, ninf = _bcast(i - j0 + 1, w), _bcast(UOp.const(dtypes.float32, -math.inf), w)
    ss = [(_offsets(c, w) < lim).where(x, ninf) for c, x in enumerate(ss)]
  return ss


def _lanes(x: UOp) -> list[UOp]: return [x] if x.dtype.count == 1 else [x.gep(i) for i in range(x.dtype.count)]


def _hreduce(x: UOp, op: Ops) -> UOp:
  """The lanes of `x` (a power of two) combined by `op`, halving the vector each step (log2 vector ops, not n - 1 scalar ones)."""
  while (n := x.dtype.count) > 1:
    x = UOp(op, x.dtype.scalar().vec(n // 2) if n > 2 else x.dtype.scalar(), (x.gep(tuple(range(n // 2))), x.gep(tuple(range(n // 2, n)))))
  return x


def attention_tiling(shape: AttentionShape, renderer: Renderer) -> tuple[int, int, int, int]:
  """(R query rows per instance, nv score vectors per key block, w keys per score vector, u values per accumulator
  vector) for `shape` on `renderer`."""
  w, u = _pow2_dividing(shape.S, renderer.vector_width), _pow2_dividing(shape.Ev, renderer.vector_width)
  R = next(r for r in (4, 2, 1) if shape.L % r == 0 and r * (shape.Ev // u) <= MAX_ACC_VECTORS or r == 1)
  # score vectors per row in one key block: enough independent multiply-add chains (R * nv) to cover the FMA latency
  nv = next(n for n in (8, 4, 2, 1) if R * n <= MAX_SCORE_VECTORS and shape.S % (n * w) == 0)
  return R, nv, w, u


def causal_keys_read(shape: AttentionShape, renderer: Renderer, i: int) -> int:
  """How many keys (from the first) the causal kernel reads for query row i: up to the end of the key block holding
  the last row of i's tile where instances are loop iterations, all of them on a device with workgroups. A key past
  that is never read, so a nan or inf in its value does not reach the output (the plain formula multiplies it by 0)."""
  R, nv, w, _ = attention_tiling(shape, renderer)
  W = nv * w
  if not shape.causal or renderer.has_local or shape.S // W <= 1: return shape.S
  return min(shape.S, ((i // R) * R + R - 1) // W * W + W)


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
  return UOp(Ops.SINK, dtypes.void, (body,), KernelInfo(shape.name, (), ()))


# the forward kernel and the backward's (codegen/attention_backward.py): dQ with or without the forward's row statistics, dK and dV
KINDS = ("forward", "backward_q", "backward_q_stats", "backward_kv")


def attention_linear(shape: AttentionShape, renderer: Renderer, device: str | None = None, kind: str = "forward") -> ProgramUOp:
  """The PROGRAM of the `kind` kernel (one of KINDS) for `shape` at the linear stage (for `device`, default the renderer's)."""
  if kind == "forward": sink = attention_kernel(shape, renderer)
  else:
    from plugrad.codegen.attention_backward import backward_kv_kernel, backward_q_kernel
    if kind not in KINDS: raise ValueError(f"attention kernel kind must be one of {KINDS}, got {kind!r}")
    if kind == "backward_kv": sink = backward_kv_kernel(shape, renderer)
    else: sink = backward_q_kernel(shape, renderer, stats_given=kind == "backward_q_stats")
  lowered = decompose(split_ends(lower_reduces(graph_rewrite(sink, symbolic, name="attention"))), renderer)
  # the PROGRAM's kernel AST is empty: this graph is past the kernel stage (its registers and loops are explicit), so
  # nothing may optimize or lower it again; its LINEAR is complete and any renderer can render it
  return make_program(UOp(Ops.SINK, dtypes.void, (), sink.arg), device or renderer.device).with_linear(linearize(lowered))


_cache: dict[tuple, ProgramUOp] = {}


def attention_program(shape: AttentionShape, renderer: Renderer, kind: str = "forward") -> ProgramUOp:
  """`attention_linear` rendered (cached per renderer kind, shape and kernel kind)."""
  key = (shape, kind, *renderer_key(renderer))
  if (hit := _cache.get(key)) is None:
    start = time.perf_counter()
    prg = attention_linear(shape, renderer, kind=kind)
    hit = _cache[key] = prg.with_source(renderer.render(prg))
    codegen_seconds[0] += time.perf_counter() - start
  return hit


__all__ = ["KINDS", "AttentionShape", "attention_kernel", "attention_linear", "attention_program", "attention_tiling", "causal_keys_read"]
