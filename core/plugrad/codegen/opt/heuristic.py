"""The hand-coded default actions (NOOPT=1 turns them off), chosen from the kernel AST and the renderer's attributes.

On a device without workgroups (the CPU), where the C compiler turns vector lanes into SIMD instructions:
* the *vector axis* is the output axis along which the stores are contiguous; it is UPCAST by two vectors when the
  reduction's loads run along it too (a matmul's N: each k step loads 2 vectors of B), else by one vector;
* a second output axis the reduction depends on is UPCAST by 4 (a 4x16 register tile: 8 vector accumulators, and each
  value loaded from A is used twice per vector of B);
* the reduce axis is UNROLLed by 4; when no output axis is contiguous but the loads run along the reduce axis (a sum
  over the last axis) it is UNROLLed by 4 vectors, which the expander turns into vector accumulators;
* the outermost output loop is split across host threads by the runtime.
On devices with workgroups the default is one output element per thread (the flat split of add_gpudims).
"""
from __future__ import annotations

from plugrad.codegen.expand import _contiguous
from plugrad.codegen.opt.kernel import KernelOptError, Opt, OptOps, Scheduler
from plugrad.uop.ops import Ops, UOp


def _const_size(r: UOp) -> int: return r.src[0].arg if r.src[0].op is Ops.CONST else 0


def _along(idxs: list[UOp], r: UOp) -> bool: return bool(idxs) and all(_contiguous(ix, r) is not None for ix in idxs)


def _try(k: Scheduler, *opts: Opt) -> bool:
  trial = k.copy()
  try: trial.apply_opts(opts)
  except KernelOptError: return False
  k.ast, k.applied, k._next_id = trial.ast, trial.applied, trial._next_id
  return True


def hand_coded_optimizations(k: Scheduler) -> Scheduler:
  rd = k.renderer
  if rd.has_local: return k
  w = max(1, rd.vector_width)
  outs, reds = k.output_axes, k.reduces
  stores = [u.src[0].src[1] for u in k.ast.toposort if u.op is Ops.STORE]
  red_loads = [u.src[0].src[1] for red in reds for u in red.src[0].toposort if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX]
  vec_axis = next((n for n in reversed(range(len(outs))) if _const_size(outs[n]) and _along(stores, outs[n])), None)
  raxes = k.reduce_axes
  if not reds:
    if vec_axis is not None: _try(k, Opt(OptOps.UPCAST, vec_axis, w))
    return k
  if len(reds) != 1 or not raxes: return k
  if vec_axis is not None and any(_contiguous(ix, outs[vec_axis]) is not None for ix in red_loads):
    # matmul-like: a register tile of 2 vectors along the vector axis x 4 along another axis the reduction reads
    for amt in (2 * w, w):
      if _try(k, Opt(OptOps.UPCAST, vec_axis, amt)): break
    deps = {x for x in reds[0].src[0].toposort if x.op is Ops.RANGE}
    other = next((n for n in reversed(range(len(outs))) if n != vec_axis and outs[n] in deps and _const_size(outs[n])), None)
    if other is not None:
      for amt in (4, 3, 2):
        if _try(k, Opt(OptOps.UPCAST, other, amt)): break
    _try(k, Opt(OptOps.UNROLL, len(raxes) - 1, 4))
  elif any(_contiguous(ix, raxes[-1]) is not None for ix in red_loads):
    # a reduction along contiguous memory: vector accumulators over the reduce axis
    for amt in (4 * w, 2 * w, w):
      if _try(k, Opt(OptOps.UNROLL, len(raxes) - 1, amt)): break
  else: _try(k, Opt(OptOps.UNROLL, len(raxes) - 1, 4))
  return k
