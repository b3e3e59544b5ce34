"""The hand-coded default actions (NOOPT=1 turns them off), chosen from the kernel AST and the renderer's attributes.

On a device without workgroups (the CPU), where the C compiler turns vector lanes into SIMD instructions:
* the *vector axis* is the output axis along which the stores are contiguous; it is UPCAST by two vectors when the
  reduction's loads run along it too (a matmul's N: each k step loads 2 vectors of B), else by one vector;
* a second output axis the reduction depends on is UPCAST by 4 (a 4x16 register tile: 8 vector accumulators, and each
  value loaded from A is used twice per vector of B);
* the reduce axis is UNROLLed by 4; when no output axis is contiguous but the loads run along the reduce axis (a sum
  over the last axis) it is UNROLLed by 4 vectors, which the expander turns into vector accumulators;
* when that vector axis cannot carry plain vector loads (a convolution: its output width is gated by the padding and
  56 is not a multiple of 16), the *channel tile* puts the lanes along an output axis that only one operand reads (the
  output channels: the weights), PACKs that operand into a panel and makes the other axes' pixels the tile's rows;
* the outermost output loop is split across host threads by the runtime.
On devices with workgroups (GPUs; the PYTHON device describes one) see `_workgroup_heuristics`: tensor cores for a
matmul that fits one, a workgroup per output for a long reduction into few outputs (GROUPTOP), a small register tile
per thread, then LOCAL sizes over the output axes (a kernel left without them gets the flat split of add_gpudims).
On a device with CUDA's tensor cores (plugrad-cuda, or PYTHON under EMULATE=CUDA) see `_cuda_heuristics` instead.
"""
from __future__ import annotations

from plugrad.codegen.expand import _contiguous, _simp, linear_coefficient
from plugrad.codegen.opt.kernel import MAX_UPCAST, KernelOptError, Opt, OptOps, Scheduler
from plugrad.codegen.opt.tc import match_tc, matching, pick_triple
from plugrad.dtype import AddrSpace, PtrDType, dtypes
from plugrad.helpers import getenv, prod
from plugrad.renderer.base import Renderer
from plugrad.uop.ops import AxisType, Ops, UOp


def _const_size(r: UOp) -> int: return r.src[0].arg if r.src[0].op is Ops.CONST else 0


def _ranges(v: UOp) -> set[UOp]: return {u for u in v.toposort if u.op is Ops.RANGE}


def _along(idxs: list[UOp], r: UOp) -> bool: return bool(idxs) and all(_contiguous(ix, r) is not None for ix in idxs)


def _try(k: Scheduler, *opts: Opt) -> bool:
  trial = k.copy()
  try: trial.apply_opts(opts)
  except KernelOptError: return False
  k.ast, k.applied, k._next_id = trial.ast, trial.applied, trial._next_id
  return True


PACK_BUDGET = getenv("PACK_BUDGET", 256 << 10, minimum=1)  # bytes of packed panel per tile: a quarter of a typical L2
PACK_MIN_REUSE = 8      # rows that read each packed value at least (else the copy costs more than it saves)


def _stride(idx: UOp, r: UOp) -> int | None:
  """How far the index moves when range `r` steps by one (None: not linear in it)."""
  if (k := linear_coefficient(idx, r)) is not None: return k  # most indices: no rewrite needed
  zero, one = (_simp(idx.substitute({r: UOp.const(dtypes.index, v)})) for v in (0, 1))
  d = _simp(one - zero)
  return d.arg if d.op is Ops.CONST else None


def _pack_panel(k: Scheduler, vec_axis: int) -> None:
  """B-panel packing: the load read along the vector axis (a matmul's B) walks rows far apart as the reduction goes
  on; copied into a scratch array in the order the register tile reads it, the tile streams it from one contiguous
  panel. The vector axis is TILEd so that one tile's panel fits PACK_BUDGET, and the tile loop goes outermost (the
  threads split the tiles, each packing its own)."""
  loads = k.packable_values()
  outs = k.output_axes
  vr = outs[vec_axis]
  red_rngs = set(k.reduce_axes) | set(k.ranges_of(AxisType.UNROLL))
  ups = k.ranges_of(AxisType.UPCAST)
  cand = [n for n, ld in enumerate(loads) if vr in _ranges(ld) and _ranges(ld) & red_rngs]
  if len(cand) != 1: return
  ld = loads[cand[0]]
  d = _ranges(ld)
  # reuse: the output loops the panel does not depend on (a matmul's rows), with their register tile
  reuse = prod(_const_size(r) for r in outs if r not in d) * prod(_const_size(r) for r in ups if r not in d)
  if reuse < PACK_MIN_REUSE: return
  # worth it only when the reduction walks the panel with a stride (rows of B): along a contiguous axis it is a stream
  idxs = [u.src[0].src[1] for u in ld.toposort if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX]
  rstrides = [_stride(ix, r) for ix in idxs for r in k.reduce_axes if r in d]
  if all(s is not None and abs(s) <= 1 for s in rstrides) and _along(idxs, vr): return
  per_col = ld.dtype.itemsize * prod(_const_size(r) for r in d if r is not vr and r not in outs)  # bytes per step of the vector axis
  size = _const_size(vr)
  fits = [t for t in range(1, size + 1) if size % t == 0 and t * per_col <= PACK_BUDGET]
  # a long reduction can make even one register tile's panel larger than the budget (K=3072, 32 columns: 384 KB); without
  # a panel the tile gathers B, 7x slower (1024x3072 @ (768x3072)^T: 234 vs 32 ms), so one tile's panel up to twice it
  if not fits and per_col <= 2 * PACK_BUDGET: fits = [1]
  if not fits: return
  t = max(fits)
  if t < size and not _try(k, Opt(OptOps.TILE, vec_axis, t)): return
  if not _try(k, Opt(OptOps.PACK, cand[0])): return
  # the other operand (a matmul's A) is re-read once per tile column: packed too when that saves work, i.e. when it
  # walks memory with a stride along the reduction (A^T) or carries fused elementwise work, and it fits
  vr = k.output_axes[vec_axis + (1 if t < size else 0)]
  vals = k.packable_values()
  for n, v in enumerate(vals):
    dv = _ranges(v)
    if vr in dv or not dv & red_rngs: continue
    # a part of a larger operand (the bias inside relu(x + b)) is no operand of its own: packing it would leave the
    # elementwise work of the larger one recomputed per tile column
    if any(m != n and v in w.toposort for m, w in enumerate(vals)): continue
    if (_strided_along_reduction(k, v) or _is_fused(v)) and _try(k, Opt(OptOps.PACK, n)): break


def _strided_along_reduction(k: Scheduler, v: UOp) -> bool:
  """Whether operand `v` walks memory with a stride along the innermost reduction range it depends on (the UNROLL copies
  when unrolled: the reduce loop outside them steps by the unroll amount even over contiguous memory)."""
  dv = _ranges(v)
  vidx = [u.src[0].src[1] for u in v.toposort if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX]
  inner = [r for r in (*k.ranges_of(AxisType.UNROLL), *k.reduce_axes) if r in dv][:1]
  return any((st := _stride(ix, r)) is None or abs(st) > 1 for ix in vidx for r in inner)


def _other_axis(k: Scheduler, vec_axis: int, deps: set[UOp]) -> int | None:
  outs = k.output_axes
  return next((n for n in reversed(range(len(outs))) if n != vec_axis and outs[n] in deps and _const_size(outs[n])), None)


VEC_PAD_MAX = 16  # an axis may grow by at most 1/16 of its size to fit the tile's two vectors (or rows, or unroll)


def _padded_split(k: Scheduler, op: OptOps, axis: int, amts: tuple[int, ...], reduce: bool = False, pad_max: int = 0) -> bool:
  """`op` on `axis` by the first of `amts` that divides it; else by the first one that does after a PADTO growing the
  axis by at most 1/`pad_max` (default VEC_PAD_MAX; a vocabulary of 50257 = 29 x 1733 would otherwise get no register
  tile rows and a scalar reduce loop: padded, only the last tile's gated loads and stores are wasted)."""
  pad_max = pad_max or VEC_PAD_MAX
  if any(_try(k, Opt(op, axis, amt)) for amt in amts): return True
  sz = _const_size((k.reduce_axes if reduce else k.output_axes)[axis])
  pad_axis = axis + (len(k.output_axes) if reduce else 0)  # PADTO numbers the output axes, then the reduce axes
  for amt in amts:
    if amt > 1 and sz and -sz % amt <= sz // pad_max:
      trial = k.copy()
      if _try(trial, Opt(OptOps.PADTO, pad_axis, amt)) and _try(trial, Opt(op, axis, amt)):
        k.ast, k.applied, k._next_id = trial.ast, trial.applied, trial._next_id
        return True
  return False


def _register_tile(k: Scheduler, vec_axis: int, deps: set[UOp]) -> None:
  w, padded = max(1, k.renderer.vector_width), False
  # a vector axis of an odd number of vectors (784 = 49 x 16) would get a one-vector tile (half the reuse of each A
  # value) and a tile count the threads split unevenly: padded to two vectors it keeps the full tile (stores gated)
  if w > 1 and (sz := _const_size(k.output_axes[vec_axis])) and sz % (2 * w) and -sz % (2 * w) <= sz // VEC_PAD_MAX:
    trial = k.copy()
    if padded := _try(trial, Opt(OptOps.PADTO, vec_axis, 2 * w)) and _try(trial, Opt(OptOps.UPCAST, vec_axis, 2 * w)):
      k.ast, k.applied, k._next_id = trial.ast, trial.applied, trial._next_id
  vectors = 2 if padded else next((amt // w for amt in (2 * w, w) if _try(k, Opt(OptOps.UPCAST, vec_axis, amt))), 0)
  if not vectors and w > 1 and _one_vector_pad(k, vec_axis, w):
    # a pixel row that is no multiple of a vector (a 1x1 convolution at 7x7: 49 pixels) padded to whole vectors
    vectors = 1 if _try(k, Opt(OptOps.PADTO, vec_axis, w)) and _try(k, Opt(OptOps.UPCAST, vec_axis, w)) else 0
  if (other := _other_axis(k, vec_axis, deps)) is not None:
    # 16-wide vectors mean AVX-512 and its 32 vector registers: 8 rows x 2 vectors = 16 accumulators; else 4 x 2 of 16.
    # A tile one vector wide takes twice the rows, keeping the accumulators (each row's broadcast then feeds one FMA:
    # 1x320x7x7 1x1 -> 1280 padded to 56 pixels, 4 rows 0.93 ms, 8 rows 0.60 ms, one thread)
    rows = (8, 6, 4, 3, 2) if w >= 16 else (4, 3, 2)
    _padded_split(k, OptOps.UPCAST, other, tuple(2 * r for r in rows[:2]) + rows if vectors == 1 else rows)
  _padded_split(k, OptOps.UNROLL, len(k.reduce_axes) - 1, (4,), reduce=True)


TRANSPOSE_MIN_REUSE = 32  # rows that reuse a transposed panel at least (below: the dot-product layout is faster)


def _transposed_tile(k: Scheduler, vec_axis: int, deps: set[UOp]) -> Scheduler | None:
  """The register tile on a copy of `k` when PACK can give it a panel (else None: the tile would gather B). Not for
  few rows: the copy transposes all of B (N x K gathered elements) once, which costs about as much as 16-32 rows of
  dot products along the contiguous reduction (the vector accumulators of the reduction branch, both operands read in
  vectors). A classifier head 8x512 @ (1000x512)^T took 0.57 ms packed and 0.21 ms as dot products (one thread); at
  32 rows the two are even (0.80 / 0.81 ms), at 64 the tile wins (1.4 / 1.6 ms)."""
  vr = k.output_axes[vec_axis]
  vals = [v for v in k.packable_values() if vr in v.toposort and set(k.reduce_axes) & set(v.toposort)]
  if len(vals) == 1:
    rows = prod(_const_size(r) for r in k.output_axes if r not in vals[0].toposort)
    if rows < TRANSPOSE_MIN_REUSE: return None
  trial = k.copy()
  _register_tile(trial, vec_axis, deps)
  _pack_panel(trial, vec_axis)
  return trial if any(o.op is OptOps.PACK for o in trial.applied) else None


# rows of a channel tile, one vector accumulator each, leaving registers for the weight vectors and the broadcast
# input: of 32 vector registers (AVX-512) or 16 (AVX2; 6 rows left a 7-wide output without any, 21 -> 86 GFLOPS)
ROW_LIMIT = {True: 14, False: 12}
ROW_PAD_MAX = 8  # the rows' axis may grow by at most 1/8 to divide (its gated last rows cost less than no rows)


def _pack_fits(k: Scheduler, n: int, budget: int | None = None) -> bool:
  """PACK operand `n` on `k` when its copy fits `budget` (default PACK_BUDGET: the panel should stay in L2 while the
  tile reuses it)."""
  budget = PACK_BUDGET if budget is None else budget
  trial = k.copy()
  if not _try(trial, Opt(OptOps.PACK, n)): return False
  if _pack_bytes(trial) > budget: return False
  k.ast, k.applied, k._next_id = trial.ast, trial.applied, trial._next_id
  return True


def _pack_bytes(k: Scheduler) -> int:
  """The bytes of `k`'s largest PACK array."""
  regs = [u.dtype for u in k.ast.toposort if u.op is Ops.DEFINE_REG]
  return max((p.size * p.base.itemsize for p in regs if isinstance(p, PtrDType) and p.addrspace is AddrSpace.REG), default=0)


def _vector_lanes_fit(k: Scheduler, vec_axis: int | None, w: int) -> bool:
  """Whether output axis `vec_axis` (the stores' contiguous one) can carry the matmul tile's vector lanes: its size is a
  multiple of the vector width and no load of the reduction is gated by it (a padded convolution input is gated along
  its width, so lanes there would gather). Loads strided along it are fine: PACK transposes them (A.B^T)."""
  if vec_axis is None: return False
  r = k.output_axes[vec_axis]
  # a size off the vector width by little gets padded by _register_tile (the LM head's 50257 columns)
  if not (sz := _const_size(r)) or (sz % w and -sz % (2 * w) > sz // VEC_PAD_MAX and not _one_vector_pad(k, vec_axis, w)): return False
  gates = [u.src[0].src[2] for red in k.reduces for u in red.src[0].toposort
           if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX and len(u.src[0].src) > 2]
  return not any(r in g.toposort for g in gates)


ONE_VECTOR_PAD_MAX = 4  # a vector axis may grow by up to 1/4 to whole vectors when the tile's rows stream along the reduction


def _one_vector_pad(k: Scheduler, vec_axis: int, w: int) -> bool:
  """Whether the matmul tile should pad the vector axis to whole vectors (growing it by at most 1/ONE_VECTOR_PAD_MAX)
  rather than leave it to the channel tile. A 1x1 convolution at 7x7 (49 pixels) took the channel tile: its rows
  broadcast input pixels, which lie a whole channel apart along the reduction, so every step of it read new cache lines
  from L2 for 7 FMAs (1x320x7x7 -> 1280: 0.91 ms, one thread). Padded to 56 pixels, the lanes read the input from a
  packed panel and the rows broadcast weights that run along the reduction, a line per 16 steps (0.60 ms), though an
  eighth of the lanes is padding. The same holds for a 3x3 convolution's input gradient at 7x7 (the unfolded windows
  W^T . dY, 8x4608x49: 42.7 -> 23 ms), whose rows' operand (W^T) is strided along the reduction and gets packed too.
  So: whenever the lanes' operand runs contiguously and ungated along the axis, and another operand gives the rows."""
  r = k.output_axes[vec_axis]
  if not (sz := _const_size(r)) or not sz % w or -sz % w > sz // ONE_VECTOR_PAD_MAX or not k.reduce_axes: return False
  lanes: list[UOp] = []
  rows: list[UOp] = []
  for red in k.reduces:
    for u in red.src[0].toposort:
      if u.op is not Ops.LOAD or u.src[0].op is not Ops.INDEX: continue
      ix = u.src[0]
      if len(ix.src) > 2: return False  # a gated load (a padded input): lanes there would gather
      (lanes if r in ix.src[1].toposort else rows).append(ix.src[1])
  return bool(lanes) and bool(rows) and all(_stride(ix, r) == 1 for ix in lanes)


def _loads_of(red: UOp) -> list[UOp]: return [u.src[0].src[1] for u in red.src[0].toposort if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX]


def _reader(k: Scheduler, r: UOp) -> int | None:
  """The number of the packable operand that depends on range `r`."""
  return next((n for n, v in enumerate(k.packable_values()) if r in v.toposort), None)


def _divisor(size: int, limit: int) -> int: return max(d for d in range(1, min(size, limit) + 1) if size % d == 0)


def _is_fused(v: UOp) -> bool:
  """Whether value `v` computes something besides loading (elementwise work fused into a reduction's operand)."""
  return any(u.op not in (Ops.LOAD, Ops.INDEX, Ops.CONST, Ops.RANGE, Ops.DEFINE_GLOBAL) and u.dtype is not dtypes.index for u in v.toposort)


def _pack_fused_operand(k: Scheduler, lane: UOp) -> bool | None:
  """PACK the channel tile's other operand (the one without the lanes) when it carries fused elementwise work that the
  output loops it does not depend on would repeat: a convolution's input gradient reads BatchNorm's backward (a sqrt
  and divisions per element) once per window position (3x3), packed it is computed once per element of the scope
  (the digits CNN's r_128_1_1_16_4_4_3_3: 0.97 -> 0.37 ms). Likewise when it is a plain load strided along the
  reduction and ungated: a stride-2 1x1 convolution's rows broadcast input pixels a channel apart, new cache lines at
  every step (8x1024x14x14 -> 2048: 24.8 -> 16.7 ms; 8x128x28x28 -> 256: 2.43 -> 1.80 ms, 2 threads, LLVM code). A
  padded input (a gated load) is not packed: that copy cost the forward 3x3 convolution 1.6x. Only the whole operand
  (not a part of a larger one), and only when its copy fits PACK_BUDGET. Returns whether it packed one (None: no
  operand wanted packing)."""
  vals, wanted = k.packable_values(), None
  red = set(k.reduce_axes) | set(k.ranges_of(AxisType.UNROLL))
  for n, v in enumerate(vals):
    dv = _ranges(v)
    # arithmetic on floats, not just a gate selecting a load (a padded input: a copy would cost more than the select)
    arith = any(not isinstance(u.dtype, PtrDType) and dtypes.is_float(u.dtype) and u.op not in (Ops.LOAD, Ops.CONST, Ops.WHERE)
                for u in v.toposort)
    gated = any(u.op is Ops.INDEX and len(u.src) > 2 for u in v.toposort)
    if lane in dv or not dv & red or any(m != n and v in w.toposort for m, w in enumerate(vals)): continue
    if not arith and (gated or not _strided_along_reduction(k, v)): continue
    # a strided input's copy may take twice the budget (8x512x28x28 stride 2: 392 KiB a batch, 25.7 -> 13.2 ms)
    if prod(_const_size(r) for r in k.output_axes if r not in dv) >= 2:
      if _pack_fits(k, n, None if arith else 2 * PACK_BUDGET): return True
      wanted = False
  return wanted


def _pack_operand_per_row(k: Scheduler, lane: UOp, pk: int) -> Scheduler | None:
  """The channel tile with an output loop of the other operand moved outermost (TILE(row, 1)), the outermost one
  with which that operand's copy fits, then the panel and that copy PACKed: for an operand `_pack_fused_operand` wants
  packed whose copy fits no scope in the plain loop order. A stride-2 1x1 convolution at a 56x56 input had no copy
  (the channel-tile loop outermost, its scope would be the whole subsampled input, 784 KiB), its rows broadcasting
  pixels a channel apart; with the output rows outermost each row's copy (28 KiB) serves every channel tile, and the
  weights are copied once. One thread, C: 1x256x56x56 -> 512 4.7 -> 2.9 ms, batch 8 43.3 -> 25.9 ms."""
  vals = k.packable_values()
  panel = _ranges(vals[pk])
  other = {u for n, v in enumerate(vals) if n != pk for u in v.toposort if u.op is Ops.RANGE}
  for n, r in enumerate(k.output_axes):
    if r not in other or r in panel or _const_size(r) < 2: continue
    t = k.copy()
    # the panel, now copied once for all rows (its scope empty), may take twice the budget as a register tile's may
    if _try(t, Opt(OptOps.TILE, n, 1)) and (p := _reader(t, lane)) is not None and _pack_fits(t, p, 2 * PACK_BUDGET) and \
        _pack_fused_operand(t, lane): return t
  return None


def _channel_tile(k: Scheduler) -> Scheduler | None:
  """A register tile for reductions whose store-contiguous axis cannot carry the vector lanes — a convolution's output
  width (56 is not a multiple of 16; its padded input is gated along it, so its loads there would be gathers) or its
  weight gradient's kernel width (3). The lanes go along another output axis `c` that exactly one operand depends on
  (a convolution's output channels: the weights), and that operand is PACKed so that the lanes read one contiguous
  panel. The rows of the tile are output axes the other operand reads and the packed one does not (the output pixels),
  each row a scalar load broadcast to one vector accumulator; the innermost reduce axis is unrolled (a 3x3 window's
  width: neighbouring rows then share their loads). Returns the tiled copy of `k`, or None when PACK cannot apply
  (without the panel the lanes would gather)."""
  w = k.renderer.vector_width
  if w <= 1: return None
  red = set(k.reduce_axes)
  # a channel count off the vector width (MobileNetV2's 24-channel projections) is PADTO'd to it, but only when no
  # axis fits unpadded and the output rows reuse the panel: 1x96x56x56 1x1 -> 24 ran as plain loops, 4.6 ms; padded
  # to 32 channels, 0.23 ms (8 lanes unpadded: 0.53; one thread)
  outs0, vrngs = k.output_axes, [_ranges(v) for v in k.packable_values()]  # k is not changed while the candidates are ranked
  def reuse_of(ci: int) -> int:  # how many output positions reuse each packed value (rows of the tile and loops around it)
    mine = [n for n, vr in enumerate(vrngs) if outs0[ci] in vr and vr & red]
    if len(mine) != 1: return 0
    others = set().union(*(vr for n, vr in enumerate(vrngs) if n != mine[0]))
    return prod(_const_size(r) for r in outs0 if r not in vrngs[mine[0]] and r in others)
  # among the lane axes, the one whose packed operand is reused most comes first (ties: the innermost). A stride-2
  # stem (8x3x224x224 -> 32) had the lanes along its 112-wide output rows, packing the input for 32 channels of reuse,
  # 11 ms; along the channels (the weights packed, reused by every pixel) 3.0 ms (one thread)
  cands = sorted(((pad, ci) for pad in (False, True) for ci in reversed(range(len(k.output_axes)))),
                 key=lambda pc: (pc[0], -reuse_of(pc[1])))
  for pad, ci in cands:
    outs, vals = k.output_axes, k.packable_values()
    c = outs[ci]
    if not (sz := _const_size(c)) or (sz % w != 0) != pad or -sz % w > sz: continue
    mine = [n for n, v in enumerate(vals) if c in _ranges(v) and _ranges(v) & red]
    if len(mine) != 1 or any(c in _ranges(v) for n, v in enumerate(vals) if n != mine[0]): continue
    packed = _ranges(vals[mine[0]])
    reuse = set().union(*(_ranges(v) for n, v in enumerate(vals) if n != mine[0])) - packed
    rows = [n for n in reversed(range(len(outs))) if outs[n] in reuse and _const_size(outs[n])]
    reused = prod(_const_size(outs[n]) for n in rows) >= PACK_MIN_REUSE  # what the new paths (padding, 2x budget) need
    trial = k.copy()
    if pad and not (reused and _try(trial, Opt(OptOps.PADTO, ci, w))): continue
    before = set(trial.ranges_of(AxisType.UPCAST))
    if not _try(trial, Opt(OptOps.UPCAST, ci, w)): continue
    lane = next(r for r in trial.ranges_of(AxisType.UPCAST) if r not in before)
    left, whole_row = ROW_LIMIT[w >= 16], False
    for n in rows:  # the innermost reuse axis first (stores and input loads run along it), then the next while room is left
      if left < 2: break
      if (d := _divisor(sz := _const_size(trial.output_axes[n]), left)) > 1 and _try(trial, Opt(OptOps.UPCAST, n, d)):
        left, whole_row = left // d, whole_row or (n == rows[0] and d == sz)
      elif d == 1 and sz > left:
        # a prime pixel count (17x17, 13 wide) has no divisor for the rows: padded by at most 1/ROW_PAD_MAX instead
        # (17 -> 18 = 2 x 9 rows, 13 -> 14 = 2 x 7); without rows each weight vector fed one FMA (4x384x17x17 1x1 ->
        # 192: 2.4 GFLOPS; 4x256x13x13 3x3 -> 256: 56 GFLOPS, 3x PyTorch's time)
        if _padded_split(trial, OptOps.UPCAST, n, tuple(range(left, 1, -1)), pad_max=ROW_PAD_MAX): left //= trial.applied[-1].amount or 1
    # two lane vectors where the rows allow it (and the panel still fits), else one
    two = trial.copy() if whole_row else None
    for cand in ([two] if two is not None and _second_lane_vector(two, ci, before | {lane}, w) else []) + [trial]:
      if (done := _pack_channel_tile(cand, ci, lane, reused)) is not None: return done
  return None


def _pack_channel_tile(trial: Scheduler, ci: int, lane: UOp, reused: bool) -> Scheduler | None:
  """The channel tile's last steps: unroll the innermost reduce axis, PACK the lanes' operand into a panel (the channel
  loop TILEd until one tile's panel fits). None when no panel fits."""
  if (last := _const_size(trial.reduce_axes[-1])):
    # a prime run up to 8 (a weight gradient's 7 output columns) is unrolled whole rather than not at all: its gated
    # window loads then fold per copy and neighbours share them (512x512x3x3 at 7x7: 25.7 -> 14.0 ms, 2 threads)
    amt = last if last <= 4 else _divisor(last, 4)
    _try(trial, Opt(OptOps.UNROLL, len(trial.reduce_axes) - 1, last if amt == 1 and last <= UNROLL_WHOLE_MAX else amt))
  if (pk := _reader(trial, lane)) is not None and _pack_fits(packed := trial.copy(), pk):
    # hoisted only where the copy would otherwise be made per image (its array one tile's panel, not every tile's)
    if _hoist_panel(trial, ci, lane) and _try(hoisted := trial.copy(), Opt(OptOps.TILE, ci, 1)) and \
        _pack_fits(hoisted, pk) and _pack_bytes(hoisted) >= _pack_bytes(packed): packed = hoisted
    return _other_operand(packed, trial, lane, pk)
  # too big for one copy: TILE the channel loop (the tile loop goes outermost, the threads split the tiles, each
  # packing its own panel) until one tile's panel fits PACK_BUDGET
  size = _const_size(trial.output_axes[ci])
  tiles = sorted((t for t in range(1, size) if size % t == 0), reverse=True)
  # a long reduction (512 channels x 3x3: one 16-channel panel is 288 KiB) fits no tile: one register tile's panel
  # then up to twice the budget, as _pack_panel allows; without it the kernel got no actions at all and ran as
  # scalar loops (ResNet's 512-channel 3x3 convs at 7x7: 0.5-1 GFLOPS)
  for t, budget in [(t, PACK_BUDGET) for t in tiles] + ([(1 if tiles else 0, 2 * PACK_BUDGET)] if reused else []):  # t=0: no TILE
    tiled = trial.copy()
    if (t == 0 or _try(tiled, Opt(OptOps.TILE, ci, t))) and (pk := _reader(tiled, lane)) is not None and _pack_fits(tiled, pk, budget):
      return _other_operand(tiled, trial, lane, pk)
  return None


def _other_operand(packed: Scheduler, unpacked: Scheduler, lane: UOp, pk: int) -> Scheduler:
  """The channel tile `packed` with its other operand packed where that pays (`_pack_fused_operand`), or, where that
  copy fits no scope, `unpacked` re-tiled per output row (`_pack_operand_per_row`) when that works."""
  if _pack_fused_operand(packed, lane) is False and (per_row := _pack_operand_per_row(unpacked, lane, pk)) is not None: return per_row
  return packed


HOIST_BYTES = 4 << 20  # what the loops a hoisted panel moves inside may re-read per tile: about one core's share of L3


def _hoist_panel(k: Scheduler, ci: int, lane: UOp) -> bool:
  """Whether the channel tile's panel should be packed once per channel tile rather than once per iteration of the
  output loops around it that it does not depend on (a batch): TILE(ci, 1) moves the tile loop outermost. The copy (a
  transpose) was 10-30% of the kernel at a 7x7 or 14x14 output with scalar stores, paid once per image. In the
  tile-major order each tile then re-reads the other operand over all those loops (every image), so only where that
  fits HOIST_BYTES. One thread, C code, batch 8, scalar copies: 512 channels 3x3/2 at 14x14 37.3 -> 31.0 ms, 256
  channels 3x3 at 7x7 8.5 -> 6.3 ms; with vector copies 0.88-0.96x on one thread, 0.88-0.98x on two. 8x128x56x56
  3x3/2 (12.8 MB of input) ran 1.32x slower hoisted."""
  if (pk := _reader(k, lane)) is None: return False
  vals = k.packable_values()
  deps = _ranges(vals[pk])
  outs = k.output_axes
  if not any(_const_size(r) > 1 and r not in deps for r in outs[:ci]): return False
  # the tile loop becomes the one the threads split: no fewer iterations than the loops it moves above
  if _const_size(outs[ci]) < prod(_const_size(r) or 1 for r in outs[:ci]): return False
  bufs = {u.src[0].src[0] for n, v in enumerate(vals) if n != pk for u in v.toposort if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX}
  return all(isinstance(b.dtype, PtrDType) for b in bufs) and \
    sum(b.dtype.size * b.dtype.base.itemsize for b in bufs if isinstance(b.dtype, PtrDType)) <= HOIST_BYTES


def _second_lane_vector(k: Scheduler, ci: int, not_rows: set[UOp], w: int) -> bool:
  """Two vectors along the channel tile's lanes where the rows are a whole output row of few pixels (ROW_LIMIT/2 + 1 at
  most: a 7x7 map) read at unit stride: neighbouring rows of a window then share their scalar loads, and each
  broadcast feeds two FMAs. Single-thread kernel times, C: 512 channels 3x3 at 7x7, batch 8, 28.6 -> 21.6 ms. Where
  the rows are part of a longer row (14x14, 28x28: -4% to +6%) or their operand is strided (the stride-2 convs: 13-70%
  slower) it is left out."""
  rows = [r for r in k.ranges_of(AxisType.UPCAST) if r not in not_rows]
  if not rows or prod(_const_size(r) for r in rows) * 2 > ROW_LIMIT[w >= 16] + 2: return False
  if not (sz := _const_size(k.output_axes[ci])) or sz % 2: return False
  loads = [ix for red in k.reduces for ix in _loads_of(red) if rows[-1] in ix.toposort]
  return bool(loads) and all(_stride(ix, rows[-1]) == 1 for ix in loads) and _try(k, Opt(OptOps.UPCAST, ci, 2))


MASKED_ROWS = 8     # output rows a masked row tile computes at once (a 3x3 window's rows then share 2 of every 3 loads)...
MASKED_COPIES = 14  # ...and vector accumulators in all (the row's vectors x the rows)
MASKED_WHOLE = 8    # a row of at most this many vectors is copied whole (its border masks become constants)


def _masked_row_tile(k: Scheduler, vec_axis: int | None) -> bool:
  """Vector lanes along the stores' contiguous axis when the reduction's streamed operand is contiguous along it but
  gated per lane — a depthwise convolution's padded input rows: each channel has its own weights, so no operand is
  reused across channels and the channel tile would gather (its lanes are 56x56 floats apart: 16 GFLOPS). With the
  renderer's masked vector access (`masked_access`) every window position is one vector load whose border lanes are
  masked off; the axis is padded to whole vectors (by at most 1/ONE_VECTOR_PAD_MAX: 28 -> 32, 7 -> 8) with masked
  stores, and copied whole when it is at most MASKED_WHOLE vectors (each copy's masks are then constants, not built
  per iteration: 8x192x28x28, one thread, 1.41 -> 0.76 ms; a 7x7 window at 56 wide 2.1 -> 1.2 ms). The window's axes
  are unrolled whole from the innermost while the lanes (MAX_UPCAST) leave room for two rows, so neighbouring rows
  share their loads (row y+1's top is row y's middle); the next output axis the operand depends on then gives up to
  MASKED_ROWS rows, MASKED_COPIES accumulators in all (8x960x7x7 with 7 rows: 1.01 -> 0.28 ms)."""
  rd, w = k.renderer, k.renderer.vector_width
  if not rd.masked_access or w <= 1 or vec_axis is None or len(k.reduces) != 1 or not k.reduce_axes: return False
  x = k.output_axes[vec_axis]
  if not (sz := _const_size(x)) or -sz % w > sz // ONE_VECTOR_PAD_MAX or not all(_const_size(r) for r in k.reduce_axes): return False
  loads = [u.src[0] for u in k.reduces[0].src[0].toposort if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX]
  # a load gated along the axis and contiguous along it, every load that moves with the axis contiguous along it
  # (stride 1), and the gated operand read by every output: no operand is reused across an output axis, so no register
  # tile or panel has anything to share (a dense convolution's input is reused by every output channel: the channel tile)
  gated = [ix for ix in loads if len(ix.src) > 2 and x in ix.src[2].toposort and _contiguous(ix.src[1], x) is not None]
  if not gated or any(x in ix.src[1].toposort and _contiguous(ix.src[1], x) is None for ix in loads): return False
  if not any(all(r in ix.toposort for r in k.output_axes if _const_size(r) != 1) for ix in gated): return False
  trial = k.copy()
  if sz % w and not _try(trial, Opt(OptOps.PADTO, vec_axis, w)): return False
  if not _try(trial, Opt(OptOps.UPCAST, vec_axis, w)): return False
  vectors = chunks if 1 < (chunks := _const_size(trial.output_axes[vec_axis])) <= MASKED_WHOLE and _try(trial, Opt(OptOps.UPCAST, vec_axis, 0)) else 1
  streamed = {r for ix in loads if x in ix.src[1].toposort for r in ix.src[1].toposort if r.op is Ops.RANGE}
  outs, unroll, window = trial.output_axes, list[int](), 1  # the window's copies count as lanes too
  for n in reversed(range(len(trial.reduce_axes))):
    if w * vectors * 2 * window * (size := _const_size(trial.reduce_axes[n])) > MAX_UPCAST: break
    unroll, window = unroll + [n], window * size
  rows = next((n for n in reversed(range(len(outs))) if n != vec_axis and outs[n] in streamed and _const_size(outs[n]) > 1), None)
  limit = min(MASKED_ROWS, MASKED_COPIES // vectors, MAX_UPCAST // (w * vectors * window))
  if rows is not None and (d := _divisor(_const_size(outs[rows]), limit)) > 1: _try(trial, Opt(OptOps.UPCAST, rows, d))
  for n in unroll: _try(trial, Opt(OptOps.UNROLL, n, 0))
  k.ast, k.applied, k._next_id = trial.ast, trial.applied, trial._next_id
  return True


GATED_UPCAST_MAX = 8  # an output axis at most this long whose gates decide which loads happen is copied whole
UNROLL_WHOLE_MAX = 8  # the channel tile's innermost reduce axis, when no amount up to 4 divides it, is unrolled whole up to this


def _upcast_gated_axis(k: Scheduler) -> None:
  """UPCAST whole the innermost small output axis that the gates of the reduction's loads depend on. A window sum over a
  padded input (a convolution's input gradient folding its windows back) tests, per loaded value, which window positions
  are inside the padding: with the axis copied out, each copy's gate and index fold to simpler expressions (most of
  the tests become constants) and the copies share the rest (the digits CNN's r_128_16_1_6_1_6: 1.8 -> 0.16 ms)."""
  gates = [u.src[0].src[2] for red in k.reduces for u in red.src[0].toposort
           if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX and len(u.src[0].src) > 2]
  if not gates: return
  gated = set().union(*(g.toposort for g in gates))
  for n in reversed(range(len(k.output_axes))):
    r = k.output_axes[n]
    if 2 <= _const_size(r) <= GATED_UPCAST_MAX and r in gated and _try(k, Opt(OptOps.UPCAST, n, 0)): return


def _lanes_gather(k: Scheduler, vec_axis: int, red_loads: list[UOp], w: int) -> bool:
  """Would vector lanes along output axis `vec_axis` gather the streamed operand while it runs contiguously along the
  innermost reduce axis? A load that moves with the reduction and is not contiguous along the lanes (BatchNorm's
  statistics read x[n, c, h, w]: 64 floats apart along the channels) makes the register tile a gather, and it also
  takes the channel loop, the only parallel one, down to one iteration; lanes along the reduction read it in vectors.
  Only when the lanes would really go there (the axis a multiple of the vector width): a value read once per output
  (BatchNorm's mean) is contiguous along the channels, but is no operand worth a tile."""
  r, raxes = k.output_axes[vec_axis], k.reduce_axes
  if not raxes or not (sz := _const_size(r)) or sz % w: return False
  rs = set(raxes)
  streamed = [ix for ix in red_loads if any(u in rs for u in ix.toposort)]
  return any(r in ix.toposort and _contiguous(ix, r) is None for ix in streamed) and any(_contiguous(ix, raxes[-1]) is not None for ix in streamed)


WORKGROUP_THREADS = 256  # threads per workgroup the default aims for (8 warps of 32, 4 waves of 64)
GROUP_OUTPUTS_MAX = 4096  # a reduction into at most this many outputs leaves too few threads without GROUP...
GROUP_REDUCE_MIN = 256    # ...when it is at least this long


TC_PAD_MAX = 1.5  # the tensor core's padding may grow a matmul's work (M*N*K) by at most this factor
TC_WARPS = 4       # warps per block of a tensor-core kernel (2x2 over the output tile)
TC_TILE = (2, 4)   # mma tiles per warp along M and N (32 accumulators a thread: each A fragment used 4 times, each B one twice)
CUDA_BLOCK_MIN = 2 * 132  # blocks a kernel should keep before its tile grows (two per streaming multiprocessor of an H100/H200)


def _cuda_class(rd: Renderer) -> bool:
  """A device with CUDA's tensor cores (sm_80+: the CUDA renderer, or the PYTHON device under EMULATE=CUDA): warps of
  32 threads, coalesced global memory, 128-bit vector loads. The optimizer reads the renderer's attributes, never its
  device name, so the tensor cores are what tell."""
  return any(tc.device == "CUDA" for tc in rd.tensor_cores)


def _tensor_core(k: Scheduler) -> bool:
  """TC for a matmul-shaped reduction (a matmul, a batched one, a convolution: one ADD reduction of a product whose
  factors each read an output axis the other does not) whose dtypes one of the tensor cores takes. Sizes the
  instruction does not divide are PADTO'd first (the innermost triple whose padding grows the work least, at most
  TC_PAD_MAX). Then each warp computes a TC_TILE of instructions (UPCAST: the fragments of A are reused along N, those
  of B along M) and a block holds TC_WARPS warps (LOCAL), as far as the sizes divide and the grid keeps
  CUDA_BLOCK_MIN blocks (a small problem keeps one warp per tile: parallelism first)."""
  if not k.renderer.tensor_cores: return False
  try: m = match_tc(k)
  except KernelOptError: return False
  tcs = [tc for tc in k.renderer.tensor_cores if tc.dtype_in is m.a.dtype and tc.dtype_out is m.red.dtype]
  if not tcs: return False
  tc, outs, raxes = tcs[0], k.output_axes, k.reduce_axes
  pads: list[Opt] = []
  if pick_triple(m, tc) is None:
    best: tuple[float, list[Opt]] | None = None
    for trip in m.triples:
      sizes = [_const_size(r) for r in trip]
      if not all(sizes): continue
      padded = [-(-s // d) * d for s, d in zip(sizes, (tc.m, tc.n, tc.k))]
      growth = prod(padded) / prod(sizes)
      if growth > TC_PAD_MAX or (best is not None and growth >= best[0]): continue
      nums = [outs.index(trip[0]), outs.index(trip[1]), len(outs) + raxes.index(trip[2])]
      best = (growth, [Opt(OptOps.PADTO, n, d) for n, s, d in zip(nums, sizes, (tc.m, tc.n, tc.k)) if s % d])
    if best is None: return False
    pads = best[1]
  trial = k.copy()
  if not _try(trial, *pads) or (pick := pick_triple(match_tc(trial), tc)) is None: return False
  mi, nj = trial.output_axes.index(pick[0]), trial.output_axes.index(pick[1])  # TC's outer ranges keep these numbers
  if not _try(trial, Opt(OptOps.TC, 0)): return False
  k.ast, k.applied, k._next_id = trial.ast, trial.applied, trial._next_id
  def blocks() -> int: return prod(_const_size(r) for r in k.output_axes)
  for ax, amt in ((nj, TC_TILE[1]), (mi, TC_TILE[0])):
    for a in (amt, 2):
      if a > 1 and blocks() // a >= CUDA_BLOCK_MIN and _try(k, Opt(OptOps.UPCAST, ax, a)): break
  warps = 1
  for ax in (nj, mi):
    if warps < TC_WARPS and blocks() // 2 >= CUDA_BLOCK_MIN and _try(k, Opt(OptOps.LOCAL, ax, 2)): warps *= 2
  return True


def _cuda_heuristics(k: Scheduler) -> Scheduler:
  """The default on a CUDA-class GPU (`_cuda_class`). Tensor cores for fp16/bf16 matmuls and convolutions
  (`_tensor_core`). A reduction along contiguous memory that is long (GROUP_REDUCE_MIN) gets a block per output
  whatever the output count (a row of softmax or layernorm), and any long reduction into few outputs
  (GROUP_OUTPUTS_MAX) too: GROUP, not GROUPTOP, so the 32 threads of a warp read 32 neighbouring elements at each step
  (coalesced; GROUPTOP gives each thread a contiguous chunk, 32 rows of memory apart), the reduce axis PADTO'd to a
  multiple of 32 first when nothing divides it, the rest of it UNROLLed by 4 (loads in flight). Otherwise the generic
  register tile with 4-lane vectors along the stores' contiguous axis (float4 / 4 halves: the CUDA renderer makes them
  128-bit (64-bit) accesses where the index is a multiple of 4) and blocks of WORKGROUP_THREADS threads: at most a warp
  (32) along the innermost axis when there are others to spread over, else all of it along that axis (an elementwise
  kernel gets 256-thread blocks, not 32)."""
  rd = k.renderer
  if not k.dont_use_locals and _tensor_core(k): return k
  outs, reds = k.output_axes, k.reduces
  sizes = [_const_size(r) for r in outs]
  grouped = False
  if len(reds) == 1 and rd.has_shared and all(sizes) and (raxes := k.reduce_axes) and (last := _const_size(raxes[-1])) >= GROUP_REDUCE_MIN:
    red_loads = [u.src[0].src[1] for u in reds[0].src[0].toposort if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX]
    rows = bool(red_loads) and all(_contiguous(ix, raxes[-1]) is not None for ix in red_loads)
    if rows or prod(sizes) <= GROUP_OUTPUTS_MAX:
      amts = tuple(a for a in (WORKGROUP_THREADS, 128, 64, 32) if last % a == 0) or (_divisor(last, WORKGROUP_THREADS),)
      grouped = any(a >= 32 and _try(k, Opt(OptOps.GROUP, len(raxes) - 1, a)) for a in amts)
      if not grouped and -last % 32 <= last // VEC_PAD_MAX:
        grouped = _try(k, Opt(OptOps.PADTO, len(outs) + len(raxes) - 1, 32), Opt(OptOps.GROUP, len(raxes) - 1, 32))
    if grouped and (rest := _const_size(k.reduce_axes[-1])) and rest >= 4: _try(k, Opt(OptOps.UNROLL, len(k.reduce_axes) - 1, 4))
  stores = [u.src[0].src[1] for u in k.ast.toposort if u.op is Ops.STORE]
  vec_axis = next((n for n in reversed(range(len(outs))) if _const_size(outs[n]) and _along(stores, outs[n])), None)
  if vec_axis is not None and not grouped:
    deps = {x for red in reds for x in red.src[0].toposort if x.op is Ops.RANGE}
    other = _other_axis(k, vec_axis, deps) if reds and outs[vec_axis] in deps else None
    if rd.supports_float4: _try(k, Opt(OptOps.UPCAST, vec_axis, 4))
    if other is not None: _try(k, Opt(OptOps.UPCAST, other, 4))
  if reds and not grouped and k.reduce_axes: _try(k, Opt(OptOps.UNROLL, len(k.reduce_axes) - 1, 4))
  limit = min(WORKGROUP_THREADS, rd.local_max[0] if rd.local_max else WORKGROUP_THREADS)
  spread = [n for n in range(len(k.output_axes)) if _const_size(k.output_axes[n]) > 1]
  for n in reversed(range(len(k.output_axes))):
    if (left := limit // max(1, k.local_size())) < 2: break
    cap = left if len(spread) <= 1 else min(left, 32)
    if (sz := _const_size(k.output_axes[n])) and (d := _divisor(sz, cap)) > 1: _try(k, Opt(OptOps.LOCAL, n, d))
  return k


def _workgroup_heuristics(k: Scheduler) -> Scheduler:
  """The default on a device with workgroups. A tensor core when the kernel is a matmul one of the renderer's WMMA
  shapes and dtypes divides (its lane range must stay the last LOCAL range, so nothing else is added). Otherwise: a
  long reduction into few outputs (a full sum, softmax's row statistics) gets GROUPTOP, its threads each reducing a
  strided share and combining the partials in shared memory; each thread computes a small register tile (4 lanes
  along the stores' contiguous axis, 4 rows of a matmul's other axis, the reduction unrolled by 4); the remaining
  output axes give the workgroup its shape, innermost first (consecutive threads store neighbouring elements)."""
  rd = k.renderer
  if _cuda_class(rd): return _cuda_heuristics(k)
  if rd.tensor_cores and not k.dont_use_locals and _try(k, Opt(OptOps.TC, 0)): return k
  outs, reds = k.output_axes, k.reduces
  sizes = [_const_size(r) for r in outs]
  grouped = False
  if len(reds) == 1 and rd.has_shared and all(sizes) and prod(sizes) <= GROUP_OUTPUTS_MAX and (raxes := k.reduce_axes):
    last = _const_size(raxes[-1])
    if last >= GROUP_REDUCE_MIN:
      grouped = (amt := _divisor(last, WORKGROUP_THREADS)) >= 16 and _try(k, Opt(OptOps.GROUPTOP, len(raxes) - 1, amt))
  stores = [u.src[0].src[1] for u in k.ast.toposort if u.op is Ops.STORE]
  vec_axis = next((n for n in reversed(range(len(outs))) if _const_size(outs[n]) and _along(stores, outs[n])), None)
  if vec_axis is not None and not grouped:
    deps = {x for red in reds for x in red.src[0].toposort if x.op is Ops.RANGE}
    other = _other_axis(k, vec_axis, deps) if reds and outs[vec_axis] in deps else None  # a matmul's M (axis numbers stay put)
    if rd.supports_float4: _try(k, Opt(OptOps.UPCAST, vec_axis, 4))
    if other is not None: _try(k, Opt(OptOps.UPCAST, other, 4))
  if reds and not grouped and k.reduce_axes: _try(k, Opt(OptOps.UNROLL, len(k.reduce_axes) - 1, 4))
  limit = min(WORKGROUP_THREADS, rd.local_max[0] if rd.local_max else WORKGROUP_THREADS)
  for n in reversed(range(len(k.output_axes))):
    if (left := limit // max(1, k.local_size())) < 2: break
    if (sz := _const_size(k.output_axes[n])) and (d := _divisor(sz, min(left, 32))) > 1: _try(k, Opt(OptOps.LOCAL, n, d))
  return k


def _row_kernel(k: Scheduler, vec_axis: int, w: int) -> None:
  """A kernel whose reductions are row statistics broadcast along the stores (softmax, layernorm: ROW_FUSE): the stores
  get one vector of lanes, and each reduction whose loads run along its axis gets vector accumulators over it (the
  expander vectorizes a reduction the store's lanes do not reach; its result is broadcast to them)."""
  _padded_split(k, OptOps.UPCAST, vec_axis, (w,))
  for n, r in enumerate(k.reduce_axes):
    loads = [u.src[0].src[1] for red in k.reduces if r in red.src[1:] for u in red.src[0].toposort if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX]
    along = any(r in ix.toposort and _contiguous(ix, r) is not None for ix in loads)
    _padded_split(k, OptOps.UNROLL, n, (4 * w, 2 * w, w) if along else (4,), reduce=True)


REGISTER_BYTES = 64  # an AVX-512 register: the CPU default takes tensor cores whose fragments fit in one


# the block of register-sized CPU tensor-core instructions the default computes at once: (rows of M, columns of N, K
# steps unrolled). An AVX-512 instruction covers one row of 16 columns: 8 rows x 2 registers are 16 of the 32 zmm
# registers as accumulators, beside the 2 B registers and A's broadcast. Not tuned on hardware (none here has it).
CPU_TC_TILE = (8, 2, 2)


def cpu_tensor_core(k: Scheduler) -> bool:
  """TC in its CPU form (threads=1, no LOCAL lanes) for a matmul-shaped reduction whose dtypes one of the renderer's
  register-sized tensor cores takes (AVX-512 BF16 `vdpbf16ps`, VNNI `vpdpbusd`): sizes the instruction does not divide
  are PADTO'd when that grows the work at most TC_PAD_MAX; then a CPU_TC_TILE block of instructions is UPCAST over M and
  N (copies of the WMMA sharing each A and B fragment) and the K steps UNROLLed, each by the largest divisor of the axis
  up to the block. True when TC was applied (the kernel is then complete), False with `k` unchanged.
  AMX tiles are left to explicit actions (`Opt(OptOps.TC, axis)`, BEAM): their 512-1024 element fragments are gathered
  element by element (no `tileloadd` from a VNNI-packed panel yet), which took ~10 s to generate and compile a 32x32x64
  kernel here, and whose speed nothing here can measure (no AMX hardware)."""
  rd = k.renderer
  try: m = match_tc(k)
  except KernelOptError: return False
  for sel, tc in enumerate(matching(rd, m)):
    if tc.threads != 1 or max(tc.elements[0] * tc.dtype_in.itemsize, tc.elements[1] * tc.dtype_b.itemsize) > REGISTER_BYTES: continue
    trial = k.copy()
    if (pick := pick_triple(m, tc)) is None:
      sizes = [_const_size(r) or 0 for r in m.triples[0]]
      if not all(sizes) or prod(-(-s // d) * d for s, d in zip(sizes, (tc.m, tc.n, tc.k))) > TC_PAD_MAX * prod(sizes): continue
      outs, raxes = trial.output_axes, trial.reduce_axes
      nums = (outs.index(m.triples[0][0]), outs.index(m.triples[0][1]), len(outs) + raxes.index(m.triples[0][2]))
      try: trial.apply_opts([Opt(OptOps.PADTO, num, d) for num, s, d in zip(nums, sizes, (tc.m, tc.n, tc.k)) if s % d])
      except KernelOptError: continue
      if (pick := pick_triple(match_tc(trial), tc)) is None: continue
    mi, nj, kr = trial.output_axes.index(pick[0]), trial.output_axes.index(pick[1]), trial.reduce_axes.index(pick[2])
    try: trial.apply_opt(Opt(OptOps.TC, sel))
    except KernelOptError: continue
    rows, cols, steps = CPU_TC_TILE
    for op, ax, want in ((OptOps.UPCAST, nj, cols), (OptOps.UPCAST, mi, rows), (OptOps.UNROLL, kr, steps)):
      axes = trial.output_axes if op is OptOps.UPCAST else trial.reduce_axes
      if want > 1 and (size := _const_size(axes[ax])) and (amt := max(d for d in range(1, want + 1) if size % d == 0)) > 1:
        step = trial.copy()
        try: step.apply_opt(Opt(op, ax, amt))
        except KernelOptError: continue
        trial = step
    k.ast, k.applied, k._next_id = trial.ast, trial.applied, trial._next_id
    return True
  return False


def hand_coded_optimizations(k: Scheduler) -> Scheduler:
  rd = k.renderer
  if rd.has_local: return _workgroup_heuristics(k)
  if rd.tensor_cores and not k.applied and cpu_tensor_core(k): return k  # AVX-512 BF16 / VNNI (AMX only by explicit actions)
  w = max(1, rd.vector_width)
  outs, reds = k.output_axes, k.reduces
  stores = [u.src[0].src[1] for u in k.ast.toposort if u.op is Ops.STORE]
  red_loads = [u.src[0].src[1] for red in reds for u in red.src[0].toposort if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX]
  vec_axis = next((n for n in reversed(range(len(outs))) if _const_size(outs[n]) and _along(stores, outs[n])), None)
  raxes = k.reduce_axes
  if not reds:  # a length off the vector width by little is padded (the cross-entropy gradient over 50257 classes: 5x)
    if vec_axis is not None: _padded_split(k, OptOps.UPCAST, vec_axis, (w,))
    return k
  if vec_axis is not None and not any(outs[vec_axis] in red.src[0].toposort for red in reds):
    _row_kernel(k, vec_axis, w)
    return k
  if len(reds) > 1 and raxes and vec_axis is not None and _vector_lanes_fit(k, vec_axis, w) and \
     all(any(_contiguous(ix, outs[vec_axis]) is not None for ix in _loads_of(red)) for red in reds):
    # sibling reductions summed in one kernel (a ResNet block's conv3 + downsample, each 1x1): the register tile without
    # a panel, every reduction's loads contiguous along the lanes; untiled it ran scalar (82 ms for 1x(64->256)x56x56)
    _register_tile(k, vec_axis, {x for red in reds for x in red.src[0].toposort if x.op is Ops.RANGE})
    return k
  if len(reds) != 1 or not raxes: return k
  deps = {x for x in reds[0].src[0].toposort if x.op is Ops.RANGE}
  lanes_fit = _vector_lanes_fit(k, vec_axis, w)
  if not lanes_fit and _masked_row_tile(k, vec_axis): pass  # a window per output (depthwise)
  elif not lanes_fit and (trial := _channel_tile(k)) is not None:
    # the store-contiguous axis cannot carry plain vector loads (a convolution): the lanes go along the output channels
    k.ast, k.applied, k._next_id = trial.ast, trial.applied, trial._next_id
  elif vec_axis is not None and lanes_fit and any(_contiguous(ix, outs[vec_axis]) is not None for ix in red_loads) and \
      not _lanes_gather(k, vec_axis, red_loads, w):
    # matmul-like: a register tile of 2 vectors along the vector axis x 8 (4) along another axis the reduction reads
    # (where the lanes fit: a stride-2 conv's weight gradient has the kernel's 7 columns there, and gets vector
    # accumulators along the gradient's contiguous rows below instead, 1.1 s -> 46 ms for ResNet's stem)
    _register_tile(k, vec_axis, deps)
    _pack_panel(k, vec_axis)
  elif vec_axis is not None and outs[vec_axis] in deps and _other_axis(k, vec_axis, deps) is not None and \
      (trial := _transposed_tile(k, vec_axis, deps)) is not None:
    # A.B^T: both operands run along the reduction; the register tile reads B from a panel PACK transposes it into
    k.ast, k.applied, k._next_id = trial.ast, trial.applied, trial._next_id
  else:
    _upcast_gated_axis(k)
    raxes = k.reduce_axes
    red_loads = [u.src[0].src[1] for red in k.reduces for u in red.src[0].toposort if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX]
    if any(_contiguous(ix, raxes[-1]) is not None for ix in red_loads):
      # a reduction along contiguous memory: vector accumulators over the reduce axis
      # a contiguous run shorter than a vector (BatchNorm's 4x4 or 8x8 pixels) is unrolled whole: its loads still share lines
      # so is a short one whose run is no multiple of a vector (7x7 pixels merged into one loop of 49): vector
      # accumulators over it would be padded and gated, lanes along the outputs are not
      last = _const_size(raxes[-1])
      short = 1 < last < w or (last % w != 0 and prod(_const_size(r) for r in raxes) <= SHORT_REDUCE)
      if short: _short_rows_in_lanes(k, vec_axis, w)  # before the UNROLL: the other order measured 40% slower
      else: _independent_chains(k)
      amts = ((0,) if last < w else (_divisor(last, w),)) if short else (4 * w, 2 * w, w)
      # a run that no vector count divides or pads to cheaply (7 rows of 56 pixels a strided view keeps apart) is
      # unrolled by its largest divisor up to a vector: narrower vectors, no gates
      if not _padded_split(k, OptOps.UNROLL, len(raxes) - 1, amts, reduce=True) and not short and last and (d := _divisor(last, w)) > 1:
        _try(k, Opt(OptOps.UNROLL, len(raxes) - 1, d))
    else: _try(k, Opt(OptOps.UNROLL, len(raxes) - 1, 4))
  return k


SHORT_REDUCE = 256  # elements per output up to which a reduction is bound by its add chain, not by its loads
CHAINS = 4  # outputs a long dot product computes at once


def _independent_chains(k: Scheduler) -> None:
  """A long reduction along contiguous memory into one vector accumulator per output (a GEMV, a classifier head of few
  rows, a row sum) is one chain of dependent fused multiply-adds: each waits the FMA latency (4 cycles) for the one
  before, whatever the loads cost. CHAINS outputs at once (an UPCAST of the innermost output axis it divides, copies
  rather than lanes) run that many chains side by side and share the loads of an operand the axis does not index (x of
  x @ W.T). Short reductions are _short_rows_in_lanes'."""
  if not k.reduce_axes or prod(_const_size(r) for r in k.reduce_axes) <= SHORT_REDUCE: return
  outs = k.output_axes
  def chains(n: int) -> bool: return (sz := _const_size(outs[n])) > 0 and sz % CHAINS == 0 and _try(k, Opt(OptOps.UPCAST, n, CHAINS))
  if not any(chains(n) for n in reversed(range(len(outs)))): return
  # a second axis by 2 where the operands split between the two (the rows of x @ W.T: each W row then serves 2 rows of
  # x, each x row 4 of W), 8 chains in all
  loads = [u.src[0].src[1] for red in k.reduces for u in red.src[0].toposort if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX]
  ups = k.ranges_of(AxisType.UPCAST)
  for n in reversed(range(len(k.output_axes))):
    r = k.output_axes[n]
    if not (sz := _const_size(r)) or sz % 2: continue
    if any(r in ix.toposort and not any(u in ix.toposort for u in ups) for ix in loads) and _try(k, Opt(OptOps.UPCAST, n, 2)): return


def _short_rows_in_lanes(k: Scheduler, vec_axis: int | None, w: int) -> None:
  """A short reduction over rows shorter than a vector (global average pooling: 7x7 pixels per channel) is one chain
  of dependent adds per output, unrolled or not: 49 adds x the add latency per output, whatever the loads cost. Its
  outputs go into vector lanes along the stores' contiguous axis (the channels), one independent accumulator per lane:
  the loads gather (49 floats apart), but w chains run at once. Global average pool 8x512x7x7: 82 -> 35 us of kernel
  (one thread); 4 or 8 scalar copies instead of lanes gave 63 and 49 us."""
  if vec_axis is None or prod(_const_size(r) for r in k.reduce_axes) > SHORT_REDUCE: return
  r = k.output_axes[vec_axis]
  if (sz := _const_size(r)) and sz % w == 0 and sz > w: _try(k, Opt(OptOps.UPCAST, vec_axis, w))
