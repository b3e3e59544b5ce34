"""Sliding windows as a view of the tensor graph, and that view's adjoint (the gradient of every conv and pool).

`window_view(x, k, s, d)` turns (..., *i) into (..., *o, *k) with o = (i - d*(k-1) - 1)//s + 1 and
view[..., o, k] = x[..., o*s + k*d]: movement ops only, so a conv or pool reads x at an affine index with no copy.

Differentiated op by op, that view's gradient sums each input element's windows through the same reshapes read
backwards: an index split by //, % of the re-read row length in every term, which ran a ResNet's max-pool backward at
8 GFLOPS and each conv's input-gradient fold at 5-12. `window_fold` is the same sum written per window offset:
dx[..., i] = sum over k of g[..., (i - k*d)/s, k] where that is a whole window index in range, each term a gated
load of g (stride s > 1: g with s-1 zeros between elements); a g that is computed (a reduction, a comparison with
the windows) is first written to a buffer, window offsets outermost, and the fold is a buffer of its own. `window_params` recognizes a node built by
`window_view` (rebuilding it from what it infers, so a false match is impossible) and the derivative walk
(gradient.py) takes the fold for it.
"""
from __future__ import annotations

import itertools
import math
from typing import cast

from plugrad.helpers import argsort
from plugrad.uop.ops import GroupOp, Ops, UOp
from plugrad.uop.shape import ShapeError


def window_view(x: UOp, k_: tuple[int, ...], s_: tuple[int, ...], d_: tuple[int, ...]) -> UOp:
  """The overlapping windows over x's last len(k_) dims (arguments checked by the caller: tensor/indexing.py's pool).

  A dim of size i is repeated (expand) and re-read with a row length L = d (mod i), so row j of the re-read starts
  j*d elements later; every s-th element of a row gives the window offsets."""
  nk, shape = len(k_), x.shape
  assert shape is not None and all(isinstance(i, int) for i in shape[-nk:])
  pre, i_ = shape[:-nk], cast(tuple[int, ...], shape[-nk:])
  o_ = [(i - d * (k - 1) - 1) // s + 1 for i, k, s, d in zip(i_, k_, s_, d_)]
  n, keep = len(pre), tuple((0, p) for p in pre)
  L_ = [i * max(1, math.ceil((o * s - d) / i)) + d for i, o, s, d in zip(i_, o_, s_, d_)]
  R_ = [math.ceil(k * L / i) for k, L, i in zip(k_, L_, i_)]
  v = x.reshape((*pre, *[e for i in i_ for e in (1, i)])).expand((*pre, *[e for r, i in zip(R_, i_) for e in (r, i)]))
  v = v.reshape((*pre, *[r * i for r, i in zip(R_, i_)])).shrink(keep + tuple((0, k * L) for k, L in zip(k_, L_)))
  v = v.reshape((*pre, *[e for k, L in zip(k_, L_) for e in (k, L)]))
  v = v.shrink(keep + tuple(e for k, o, s in zip(k_, o_, s_) for e in ((0, k), (0, o * s))))
  if any(s != 1 for s in s_):
    v = v.reshape((*pre, *[e for k, o, s in zip(k_, o_, s_) for e in (k, o, s)]))
    v = v.shrink(keep + tuple(e for k, o in zip(k_, o_) for e in ((0, k), (0, o), (0, 1))))
    v = v.reshape((*pre, *[e for k, o in zip(k_, o_) for e in (k, o)]))
  return v.permute((*range(n), *[n + 2 * j + 1 for j in range(nk)], *[n + 2 * j for j in range(nk)]))


def window_params(u: UOp) -> tuple[UOp, tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None:
  """(x, k, s, d) when `u` is `window_view(x, k, s, d)`, else None. The parameters are read off the chain (k from the
  shape, L from the re-read rows, s from the stride split) and the view rebuilt from them: UOps are unique, so the
  match holds exactly when the rebuilt node is `u`."""
  if u.op is not Ops.PERMUTE or u.shape is None: return None
  chain, v = [u], u.src[0]
  while v.op in GroupOp.Movement and v.op is not Ops.EXPAND and len(chain) < 8: chain.append(v); v = v.src[0]
  if v.op is not Ops.EXPAND or v.src[0].op is not Ops.RESHAPE or (x := v.src[0].src[0]).shape is None: return None
  if (nk := len(u.shape) - len(x.shape)) < 1 or not all(isinstance(d, int) for d in (*u.shape, *x.shape)): return None
  n = len(x.shape) - nk
  k_, i_ = u.shape[n + nk:], x.shape[n:]
  rows = next((c for c in reversed(chain) if c.op is Ops.RESHAPE and len(c.shape or ()) == n + 2 * nk), None)
  if rows is None or rows.shape is None: return None
  d_ = tuple(L % i or i for L, i in zip(rows.shape[n + 1::2], i_))  # type: ignore[operator]
  split = next((c for c in chain if c.op is Ops.RESHAPE and len(c.shape or ()) == n + 3 * nk), None)
  s_ = tuple(split.shape[n + 2::3]) if split is not None and split.shape is not None else (1,) * nk
  if not all(isinstance(a, int) and a >= 1 for a in (*k_, *s_, *d_)): return None
  params = (x, cast(tuple[int, ...], tuple(k_)), cast(tuple[int, ...], s_), cast(tuple[int, ...], d_))
  try: return params if window_view(*params) is u else None
  except ShapeError: return None  # parameters no window view has: another chain of movement ops


def _computed(g: UOp) -> bool:
  """Whether `g`'s elementwise expression (down to buffers) holds a reduction or a window view (a conv's window
  gradient, a sum over output channels; max pool's, each window compared with its maximum): then every fold term would
  rerun it, through the view's // and % chain read at a shifted window (the simplifier cannot drop those: the shifted
  index is in range only under the term's gate). A broadcast of a plain gradient (avg pool) is read as it is."""
  seen, stack = set(), [g]
  while stack:
    if (u := stack.pop()) in seen or u.op in (Ops.BUFFER, Ops.CONTIGUOUS): continue
    seen.add(u)
    if u.op is Ops.REDUCE_AXIS or (u.op is Ops.PERMUTE and window_params(u) is not None): return True
    if u.op in GroupOp.ALU or u.op in GroupOp.Movement or u.op is Ops.CAST: stack.extend(u.src)
  return False


def window_fold(g: UOp, in_shape: tuple[int, ...], k_: tuple[int, ...], s_: tuple[int, ...], d_: tuple[int, ...]) -> UOp:
  """The adjoint of window_view: g of shape (..., *o, *k) summed back onto (..., *i), one term per window offset, each
  g's slice at that offset padded into place (a gated load at an affine index), into a buffer of its own."""
  nk, shape = len(k_), g.shape
  assert shape is not None
  pre, o_, i_ = shape[:-2 * nk], shape[-2 * nk:-nk], in_shape[-nk:]
  n, keep = len(pre), tuple((0, p) for p in pre)
  if _computed(g):  # once into a buffer, window offsets outermost: each term then reads whole rows of o in order
    first = (*range(n), *range(n + nk, n + 2 * nk), *range(n, n + nk))
    g = UOp(Ops.CONTIGUOUS, g.dtype, (g.permute(first),)).permute(tuple(argsort(first)))
  # the input dims split as (q, r) = divmod(i, s): window offset k*d lands on phase r = k*d % s, shifted by k*d // s
  # along q, so each term is a pad of its slice of g, its index affine (no division); once summed, the (q, r) buffer
  # is the input's memory order, read back through a reshape and a cut of the rows past i
  Q_ = [-(-i // s) for i, s in zip(i_, s_)]
  out: UOp | None = None
  for kk in itertools.product(*(range(k) for k in k_)):
    t = g.shrink(keep + tuple((0, o) for o in o_) + tuple((j, j + 1) for j in kk)).reshape((*pre, *[e for o in o_ for e in (o, 1)]))
    places = [(divmod(j * d, s), o, s, Q) for j, d, o, s, Q in zip(kk, d_, o_, s_, Q_)]
    t = t.pad(((0, 0),) * n + tuple(p for (sh, ph), o, s, Q in places for p in ((sh, Q - o - sh), (ph, s - 1 - ph))))
    out = t if out is None else out.alu(Ops.ADD, t)
  assert out is not None
  folded = UOp(Ops.CONTIGUOUS, out.dtype, (out,)).reshape((*pre, *[Q * s for Q, s in zip(Q_, s_)]))
  return folded.shrink(keep + tuple((0, i) for i in i_))
