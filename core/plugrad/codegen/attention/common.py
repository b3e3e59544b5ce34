"""What the fused attention kernels share (the forward's `forward.py`, the backward's `backward.py`): the launch's
shape, the tiling, and the helpers that build vector code in lowered form."""
from __future__ import annotations

import math
from dataclasses import dataclass

from plugrad.dtype import DType, dtypes
from plugrad.renderer.base import Renderer
from plugrad.uop.ops import Ops, UOp

LOG2E, LN2 = 1 / math.log(2), math.log(2)
REG_IDS = 1 << 20  # ids of the online-softmax registers, apart from the inner reductions' (lower_reduces counts from 0)
MAX_SCORE_VECTORS = 8  # the block's score vectors one instance keeps (R rows x nv): independent FMA chains, in registers
MAX_ACC_VECTORS = 16  # the output accumulators one instance keeps (R rows x Ev/u vectors): registers, not a spill
# where the kernels join the codegen passes: written with explicit loops and registers, before the reductions are lowered
ENTRY_PASS = "symbolic"


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


