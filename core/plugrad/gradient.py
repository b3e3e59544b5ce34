"""Reverse-mode differentiation of the tensor graph (stage 1).

`compute_gradient(root, root_grad, targets)` walks the graph from `root` back to `targets` and applies one local
derivative rule per op (the table `RULES`). The rules build ordinary tensor-graph UOps, so gradients are lazy like
everything else and fuse into the kernels that use them. Only floating-point values carry gradients: integer and bool
nodes (comparisons, indices, masks) end the walk.
"""
from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from plugrad.dtype import dtypes, sum_acc_dtype
from plugrad.helpers import argsort
from plugrad.uop.ops import Ops, UOp
from plugrad.uop.windows import window_fold, window_params

Grads = tuple[UOp | None, ...]


class GradientError(ValueError):
  """A gradient that cannot be computed: a non-scalar root without a seed, a target off the graph, an op without a rule."""


def _const(like: UOp, value: Any) -> UOp:
  """`value` with the dtype, shape and device of `like` (a CONST expanded: nothing is stored)."""
  dev, shape = like.tensor_device, like.shape or ()
  c = UOp(Ops.CONST, like.dtype, (UOp(Ops.DEVICE, dtypes.void, (), dev),) if dev is not None else (), dtypes.as_const(value, like.dtype))
  return c.reshape((1,) * len(shape)).expand(shape) if shape else c


def _neg(x: UOp) -> UOp: return x.alu(Ops.NEG)
def _where(c: UOp, t: UOp, f: UOp) -> UOp: return c.alu(Ops.WHERE, t, f)
def _log(x: UOp) -> UOp: return x.alu(Ops.LOG2).alu(Ops.MUL, _const(x, math.log(2)))
def _not(b: UOp) -> UOp: return b.alu(Ops.CMPNE, _const(b, True))


def _sum_to(g: UOp, axes: tuple[int, ...]) -> UOp:
  """Sum over `axes` (kept as size 1), accumulating half-precision floats in float32."""
  acc = sum_acc_dtype(g.dtype)
  return g.cast(acc).reduce_axis(Ops.ADD, axes).cast(g.dtype)


def _max_grad(ret: UOp, g: UOp) -> Grads:
  # ties share the gradient equally, so d(max(x, x))/dx is 1
  a, b = ret.src
  half = g.alu(Ops.MUL, _const(g, 0.5))
  zero = _const(g, 0.0)
  tie = a.alu(Ops.CMPEQ, b)
  return (_where(b.alu(Ops.CMPLT, a), g, _where(tie, half, zero)), _where(a.alu(Ops.CMPLT, b), g, _where(tie, half, zero)))


def _pow_grad(ret: UOp, g: UOp) -> Grads:
  a, b = ret.src
  zero = _const(a, 0.0)
  # d/da = b * a^(b-1), which is 0 when b == 0 (even where a^(b-1) is inf); d/db = a^b * ln a, taken as 0 at a == 0, b >= 0
  da = _where(b.alu(Ops.CMPEQ, zero), zero, b.alu(Ops.MUL, a.alu(Ops.POW, b.alu(Ops.SUB, _const(b, 1.0)))))
  db = _where(a.alu(Ops.CMPEQ, zero).alu(Ops.AND, _not(b.alu(Ops.CMPLT, zero))), zero, ret.alu(Ops.MUL, _log(a)))
  return (g.alu(Ops.MUL, da), g.alu(Ops.MUL, db))


def _reduce_grad(ret: UOp, g: UOp) -> Grads:
  (x,) = ret.src
  op, axes = ret.arg
  shape = x.shape
  assert shape is not None
  if op is Ops.ADD: return (g.expand(shape),)
  if op is Ops.MAX:
    # the gradient goes to the elements equal to the max, shared equally among ties
    hit = x.alu(Ops.CMPEQ, ret.expand(shape)).cast(x.dtype)
    share = g.alu(Ops.FDIV, _sum_to(hit, axes))
    return (hit.alu(Ops.MUL, share.expand(shape)),)
  # MUL: d/dx_i = product of the other elements, computed without dividing by zero; with no other element it is 1
  # (dividing the product by x_i gave inf/inf = nan for an infinite x_i)
  if all(shape[a] == 1 for a in axes): return (g,)
  # 16-bit floats form the product and the quotients in float32, rounded once: a product of half factors underflows
  # half long before the quotient would (float16 -1.2e-7 · -0.284 is subnormal, and /-1.2e-7 gave -0.5)
  xw = x.cast(dtypes.float32) if x.dtype.itemsize < 4 else x
  zero, one = _const(xw, 0.0), _const(xw, 1.0)
  is_zero = xw.alu(Ops.CMPEQ, zero)
  nonzero = _where(is_zero, one, xw)
  prod_nz = nonzero.reduce_axis(Ops.MUL, axes).expand(shape)
  zeros_elsewhere = _sum_to(is_zero.cast(xw.dtype), axes).expand(shape).alu(Ops.SUB, is_zero.cast(xw.dtype))
  # the seed multiplies before the division, as PyTorch's (grad·result)/x: product/x alone may overflow where the gradient fits
  pg = prod_nz.alu(Ops.MUL, g.expand(shape) if xw is x else g.expand(shape).cast(xw.dtype))
  ret_g = _where(zeros_elsewhere.alu(Ops.CMPEQ, zero), _where(is_zero, pg, pg.alu(Ops.FDIV, nonzero)), zero)
  return (ret_g if xw is x else ret_g.cast(x.dtype),)


def _expand_grad(ret: UOp, g: UOp) -> Grads:
  src_shape, out_shape = ret.src[0].shape, ret.shape
  assert src_shape is not None and out_shape is not None
  return (_sum_to(g, tuple(i for i, (s, o) in enumerate(zip(src_shape, out_shape)) if s != o)),)


def _scatter_add(base: UOp, idx: UOp, g: UOp, axis: int) -> UOp: return UOp(Ops.SCATTER, g.dtype, (base, idx, g), (axis, "add"))


def _gather(x: UOp, idx: UOp, axis: int) -> UOp:
  """GATHER of `x` by `idx`, x first cut to idx's extent outside the axis (a SCATTER's index may be smaller than its base)."""
  xs, ix = _shape(x), _shape(idx)
  if any(a != b for d, (a, b) in enumerate(zip(xs, ix)) if d != axis):
    x = x.shrink(tuple((0, s if d == axis else i) for d, (s, i) in enumerate(zip(xs, ix))))
  return UOp(Ops.GATHER, x.dtype, (x, idx), axis)


def _gather_grad(ret: UOp, g: UOp) -> Grads:
  # the backward of an indexed read is an indexed accumulate into zeros, never a product with a one-hot matrix
  return (_scatter_add(_const(ret.src[0], 0.0), ret.src[1], g, ret.arg), None)


def _scatter_grad(ret: UOp, g: UOp) -> Grads:
  base, idx, src = ret.src
  axis, how = ret.arg
  if how == "add": return (g, None, _gather(g, idx, axis))
  if how == "mul": return _scatter_mul_grad(ret, g)
  if how in ("max", "min"):  # the gradient goes to the values equal to the result, shared equally among ties
    zero = _const(g, 0.0)
    src_hit, base_hit = src.alu(Ops.CMPEQ, _gather(ret, idx, axis)).cast(g.dtype), base.alu(Ops.CMPEQ, ret).cast(g.dtype)
    count = base_hit.alu(Ops.ADD, _scatter_add(zero, idx, src_hit, axis))
    share = g.alu(Ops.FDIV, count.alu(Ops.MAX, _const(count, 1.0)))
    return (base_hit.alu(Ops.MUL, share), None, src_hit.alu(Ops.MUL, _gather(share, idx, axis)))
  # the base keeps its gradient where nothing was written; each written element's goes to the source that wrote last
  ishape = _shape(idx)
  dev = UOp(Ops.DEVICE, dtypes.void, (), ret.tensor_device)
  n = ishape[axis]
  def ints(v: int, shape: tuple) -> UOp: return UOp(Ops.CONST, dtypes.int32, (dev,), v).reshape((1,) * len(shape)).expand(shape)
  rank = UOp(Ops.IOTA, dtypes.int32, (dev,), n).alu(Ops.ADD, ints(1, (n,)))  # 1-based, so 0 can mean "not written"
  rank = rank.reshape(tuple(n if d == axis else 1 for d in range(len(ishape)))).expand(ishape)
  last = UOp(Ops.SCATTER, dtypes.int32, (ints(0, _shape(base)), idx, rank), (axis, "max"))
  gs = _gather(g, idx, axis)
  return (_where(last.alu(Ops.CMPEQ, ints(0, _shape(base))), g, _const(g, 0.0)), None,
          _where(_gather(last, idx, axis).alu(Ops.CMPEQ, rank), gs, _const(gs, 0.0)))


def _scatter_mul_grad(ret: UOp, g: UOp) -> Grads:
  """r = base · (the product of the src values written to the position): a factor's derivative is r / factor, and
  for a factor that is 0 the product of the others, which is not 0 only where it is the position's one zero factor."""
  base, idx, src = ret.src
  axis = ret.arg[0]
  one, zero = _const(base, 1.0), _const(base, 0.0)
  zb, zs = base.alu(Ops.CMPEQ, zero), src.alu(Ops.CMPEQ, _const(src, 0.0))
  base1, src1 = _where(zb, one, base), _where(zs, _const(src, 1.0), src)
  zeros = zb.cast(base.dtype).alu(Ops.ADD, _scatter_add(zero, idx, zs.cast(src.dtype), axis))
  rest = _where(zeros.alu(Ops.CMPEQ, one), UOp(Ops.SCATTER, ret.dtype, (base1, idx, src1), ret.arg), zero)
  gr, grest = g.alu(Ops.MUL, ret), g.alu(Ops.MUL, rest)
  return (_where(zb, grest, gr.alu(Ops.FDIV, base1)), None,
          _where(zs, _gather(grest, idx, axis), _gather(gr, idx, axis).alu(Ops.FDIV, src1)))


def _sin_grad(ret: UOp, g: UOp) -> Grads:
  # cos(x) as 1 - 2·sin²(x/2): halving is exact and the device reduces x/2 exactly, where sin(π/2 - x) would round
  # π/2 - x first (off by ulp(x)/2: float32 sin'(1e30) came out 0.791 for -0.612); 16-bit floats in float32, rounded once
  (x,) = ret.src
  w = x.cast(dtypes.float32) if x.dtype.itemsize < 4 else x
  s = w.alu(Ops.MUL, _const(w, 0.5)).alu(Ops.SIN)
  cos = _const(s, 1.0).alu(Ops.SUB, s.alu(Ops.MUL, s).alu(Ops.MUL, _const(s, 2.0)))
  return (g.alu(Ops.MUL, cos if w is x else cos.cast(x.dtype)),)


def _copy_back(x: UOp, g: UOp) -> UOp:
  """The gradient of a COPY, moved back to where its source `x` lies: laid out like `x` when that is several devices."""
  dev, axis = x.tensor_device, None
  if isinstance(dev, tuple):
    from plugrad.engine.multi import layout
    dev, axis = layout(x) or (dev, None)
  return UOp(Ops.COPY, g.dtype, (g, UOp(Ops.DEVICE, dtypes.void, (), dev)), axis)


def _multi_grad(r: UOp, g: UOp) -> Grads:
  """MULTI(*pieces): a sharded piece's gradient is its rows of `g`, on the piece's device. Replicated pieces are one
  value held n times, so `g` goes to the first only (giving it to each would count it n times where they share a source)."""
  def on(x: UOp, p: UOp) -> UOp: return UOp(Ops.COPY, g.dtype, (x, UOp(Ops.DEVICE, dtypes.void, (), p.tensor_device)))
  if r.arg is None: return (on(g, r.src[0]), *(None for _ in r.src[1:]))
  out, lo = [], 0
  for p in r.src:
    n = _shape(p)[r.arg]
    out.append(on(g.shrink(tuple((lo, lo + n) if d == r.arg else (0, s) for d, s in enumerate(_shape(g)))), p))
    lo += n
  return tuple(out)


def _shape(u: UOp) -> tuple:
  assert u.shape is not None
  return u.shape


RULES: dict[Ops, Callable[[UOp, UOp], Grads]] = {
  Ops.ADD: lambda r, g: (g, g),
  Ops.SUB: lambda r, g: (g, _neg(g)),
  Ops.MUL: lambda r, g: (g.alu(Ops.MUL, r.src[1]), g.alu(Ops.MUL, r.src[0])),
  # d/db = -(a/b)/b, not -(1/b)·(a/b): 1/b overflows for a tiny b (float16 |b| < 1.5e-5) and meets a/b = 0 as inf·0
  Ops.FDIV: lambda r, g: (g.alu(Ops.FDIV, r.src[1]), _neg(g.alu(Ops.MUL, r.alu(Ops.FDIV, r.src[1])))),
  Ops.NEG: lambda r, g: (_neg(g),),
  Ops.RECIPROCAL: lambda r, g: (_neg(g.alu(Ops.MUL, r.alu(Ops.MUL, r))),),
  Ops.SQRT: lambda r, g: (g.alu(Ops.FDIV, r.alu(Ops.MUL, _const(r, 2.0))),),
  Ops.EXP2: lambda r, g: (g.alu(Ops.MUL, r.alu(Ops.MUL, _const(r, math.log(2)))),),
  Ops.LOG2: lambda r, g: (g.alu(Ops.FDIV, r.src[0].alu(Ops.MUL, _const(r, math.log(2)))),),
  Ops.SIN: _sin_grad,
  Ops.TRUNC: lambda r, g: (None,),  # derivative 0: nothing flows on (0 times an infinite 1/b below would be nan)
  Ops.MAX: _max_grad,
  Ops.POW: _pow_grad,
  Ops.WHERE: lambda r, g: (None, _where(r.src[0], g, _const(g, 0.0)), _where(r.src[0], _const(g, 0.0), g)),
  Ops.MULACC: lambda r, g: (g.alu(Ops.MUL, r.src[1]), g.alu(Ops.MUL, r.src[0]), g),
  Ops.CAST: lambda r, g: (g.cast(r.src[0].dtype) if dtypes.is_float(r.src[0].dtype) else None,),
  Ops.BITCAST: lambda r, g: (None,),
  Ops.RESHAPE: lambda r, g: (g.reshape(_shape(r.src[0])),),
  Ops.EXPAND: _expand_grad,
  Ops.PERMUTE: lambda r, g: (g.permute(tuple(argsort(r.arg))),),
  Ops.PAD: lambda r, g: (g.shrink(tuple((b, b + s) for (b, _), s in zip(r.arg, _shape(r.src[0])))),),
  Ops.SHRINK: lambda r, g: (g.pad(tuple((b, s - e) for (b, e), s in zip(r.arg, _shape(r.src[0])))),),
  Ops.FLIP: lambda r, g: (g.flip(r.arg),),
  Ops.REDUCE_AXIS: _reduce_grad,
  Ops.GATHER: _gather_grad,
  Ops.SCATTER: _scatter_grad,
  Ops.CONTIGUOUS: lambda r, g: (g,),
  Ops.DETACH: lambda r, g: (None,),
  Ops.COPY: lambda r, g: (_copy_back(r.src[0], g), None),
  Ops.MULTI: lambda r, g: _multi_grad(r, g),
  Ops.ASSIGN: lambda r, g: (None, g),  # the result holds the assigned value
}
# ops whose results are not differentiable (integers, bools, random bits): the walk stops there
NO_GRAD = frozenset({Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.IDIV, Ops.MOD, Ops.THREEFRY})


# The derivatives of precompiled kernels (a KERNEL node, whose outputs are AFTER(buffer, KERNEL)): PROGRAM -> rule(kernel,
# output slot, gradient of that output) -> one gradient (or None) per source of the KERNEL. Keyed by the PROGRAM, which
# stays the same when the graph around the kernel is rewritten (realized inputs, the tensor layer's marks).
KERNEL_GRADIENTS: dict[UOp, Callable[[UOp, int, UOp], Grads]] = {}


def register_kernel_gradient(program: UOp, rule: Callable[[UOp, int, UOp], Grads]) -> None:
  """Make the outputs of every launch of `program` differentiable: gradients flow to the KERNEL's sources by `rule`."""
  KERNEL_GRADIENTS[program] = rule


def kernel_output_origin(after: UOp) -> UOp:
  """`after` (AFTER(buffer, KERNEL)) with the kernel's written buffers replaced by constants of their shapes (the slot
  number as the value, so each stays apart): the graph a realized output keeps for its gradient must not hold that
  output's own buffer (the buffer is the key it is kept under: a cycle that would never be freed). Derivative rules
  read the KERNEL's inputs only."""
  k = after.src[1]
  out = {k.src[slot]: _const(k.src[slot], float(slot)) for slot in k.arg.outs}
  return UOp(Ops.AFTER, after.dtype, (out.get(after.src[0], after.src[0]), k.replace(src=tuple(out.get(s, s) for s in k.src))))


# Nodes of the tensor graph whose derivative the layer that built them gives (a conv's input gradient as a transposed
# conv, tensor/nn_ops.py): node -> (the sources its gradient goes to, rule(node, gradient of node) -> one per source).
# Weak keys: an entry lives as long as the node, and a rewritten graph (a source realized since) is a new node that the
# op rules differentiate, which is the same derivative, only slower.
NODE_GRADIENTS: weakref.WeakKeyDictionary[UOp, tuple[tuple[UOp, ...], Callable[[UOp, UOp], Grads]]] = weakref.WeakKeyDictionary()


def register_node_gradient(node: UOp, sources: tuple[UOp, ...], rule: Callable[[UOp, UOp], Grads]) -> None:
  """Differentiate `node` by `rule` (to `sources`, which must be in its graph) instead of op by op down to them. The rule
  must not hold `node` itself (it is passed in): the entry would keep its own key alive."""
  NODE_GRADIENTS[node] = (sources, rule)


def chain_gradient(top: UOp, g: UOp, target: UOp) -> UOp:
  """The gradient at `target` of `g` at `top`, by the op rules down a chain of single-source ops (movement ops, casts)
  from `top` to `target`: the same UOps the derivative walk would build there."""
  u = top
  while u is not target:
    if len(u.src) != 1: raise GradientError(f"chain_gradient: {u.op.name} has {len(u.src)} sources, the chain must be single-source")
    g_ = RULES[u.op](u, g)[0]
    if g_ is None: raise GradientError(f"chain_gradient: no gradient flows through {u.op.name}")
    g, u = g_, u.src[0]
  return g


def _kernel_of(u: UOp) -> UOp | None:
  """The KERNEL whose registered derivative `u` (one of its outputs) takes, or None."""
  return u.src[1] if u.op is Ops.AFTER and u.src[1].op is Ops.KERNEL and u.src[1].arg in KERNEL_GRADIENTS else None


def is_kernel_output(u: UOp) -> bool:
  """Whether `u` is an output of a KERNEL whose PROGRAM has a registered derivative."""
  return _kernel_of(u) is not None


def _custom_rules(topo: Iterable[UOp]) -> dict[UOp, tuple[tuple[UOp, ...], Callable[[UOp], Grads]]]:
  """The nodes whose derivative is not their op's rule: a precompiled kernel's outputs (its registered rule, to the
  KERNEL's sources), the nodes given to register_node_gradient (their rule, to their sources), and every sliding-window
  view (uop/windows.py: its fold straight to the viewed input, in place of the chain of movement-op rules below it)."""
  def kernel_rule(k: UOp, slot: int) -> Callable[[UOp], Grads]: return lambda g: KERNEL_GRADIENTS[k.arg](k, slot, g)
  def fold_rule(x: UOp, k_: tuple[int, ...], s_: tuple[int, ...], d_: tuple[int, ...]) -> Callable[[UOp], Grads]:
    return lambda g: (window_fold(g, x.shape, k_, s_, d_),)  # type: ignore[arg-type]
  out: dict[UOp, tuple[tuple[UOp, ...], Callable[[UOp], Grads]]] = {}
  for u in topo:
    if (k := _kernel_of(u)) is not None: out[u] = (k.src, kernel_rule(k, k.src.index(u.src[0])))
    elif (r := NODE_GRADIENTS.get(u)) is not None: out[u] = (r[0], functools.partial(r[1], u))
    elif u.op is Ops.PERMUTE and (w := window_params(u)) is not None: out[u] = ((w[0],), fold_rule(*w))
  return out


def compute_gradient(root: UOp, root_grad: UOp, targets: Iterable[UOp]) -> dict[UOp, UOp]:
  """d(root)/d(target) for each target reached from `root`, seeded with `root_grad` (same shape as root). A float target
  in the graph that no differentiable path joins to `root` (only through comparisons or integer ops, or through an
  empty tensor) gets zeros of its shape, as in PyTorch; targets not in the graph, or only through DETACH, are absent."""
  if root.shape != root_grad.shape: raise GradientError(f"the gradient seed has shape {root_grad.shape}, but the root has shape {root.shape}")
  wanted = set(targets)
  topo = root.toposort
  custom = _custom_rules(topo)
  def inputs(u: UOp) -> tuple[UOp, ...]: return c[0] if (c := custom.get(u)) is not None else u.src
  # the nodes on a differentiable path from a target up to the root
  on_path: set[UOp] = set()
  for u in topo:
    if u in wanted or (dtypes.is_float(u.dtype) and u.op is not Ops.DETACH and u.op not in NO_GRAD and any(s in on_path for s in inputs(u))):
      on_path.add(u)
  grads: dict[UOp, UOp] = {root: root_grad}
  for u in reversed(topo):
    if (g := grads.get(u)) is None or u not in on_path or not any(s in on_path for s in inputs(u)): continue
    if (c := custom.get(u)) is not None: local = c[1](g)
    elif (rule := RULES.get(u.op)) is None: raise GradientError(f"no derivative rule for {u.op.name} (dtype {u.dtype}, shape {u.shape})")
    else: local = rule(u, g)
    for s, sg in zip(inputs(u), local):
      if sg is None or s not in on_path: continue
      grads[s] = grads[s].alu(Ops.ADD, sg) if s in grads else sg
  # the nodes `root` depends on other than through DETACH: a target among them that got no gradient has derivative 0
  live: set[UOp] = {root}
  for u in reversed(topo):
    if u in live and u.op is not Ops.DETACH: live.update(u.src)
  return {t: grads[t] if t in grads else _const(t, 0.0) for t in wanted if t in grads or (t in live and dtypes.is_float(t.dtype))}
