"""The method table: every Tensor method of ../shared/TENSOR_API.md that has a PyTorch counterpart, as
`Op(name, plugrad call, torch call, case generator, dtypes, grad?)` rows. Names with a suffix (`div.floor`) are
variants of one method; `EXCLUDED` says why the remaining API names are not compared.

The generators draw shapes from small pools (every new shape compiles new kernels), including 0-d tensors, size-0 and
size-1 dims, broadcasting pairs and negative dims, and float values with special values mixed in (harness.values).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from hypothesis import strategies as st

from plugrad import Tensor

from .harness import ALL, FLOATS, INTS, NUMERIC, SIGNED, Arg, Op, Py, index, scalar, tensor, values

UNARY_SHAPES = [(), (1,), (0,), (2, 3), (2, 1, 3)]
BIN_SHAPES = [((), ()), ((2, 3), (2, 3)), ((2, 1), (1, 3)), ((3,), ()), ((), (2, 3)), ((0, 3), (1, 3)), ((2, 1, 3), (4, 1))]
RED_SHAPES = [(), (4,), (0,), (2, 3), (3, 0), (2, 1, 3)]
ND_SHAPES = [(1,), (4,), (0,), (2, 3), (3, 0), (2, 1, 3)]  # at least one dim
MAT_SHAPES = [(1, 1), (3, 3), (2, 4), (4, 2), (2, 3, 3), (0, 2)]

S = st.sampled_from


def _f32(x: Any) -> Any:
  """PyTorch's float counterpart of plugrad's integer-to-float rule (docs/tensor.md: functions of integer tensors
  compute in default_float)."""
  return x if x.dtype.is_floating_point else x.to(torch.float32)


def _dims(nd: int) -> tuple[int, ...]: return tuple(range(nd))

# ---------------------------------------------------------------- generators


def unary(domain: tuple[float, float] | None = None, shapes: list = UNARY_SHAPES, specials: bool = True, **kws: Any) -> Any:
  def gen(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
    return [tensor(draw, dt, draw(S(shapes)), domain, specials)], {k: draw(s) for k, s in kws.items()}
  return gen


def binary(domain: tuple[float, float] | None = None, domain_b: tuple[float, float] | None = None, modes: tuple[str, ...] = ("tt", "ts", "st"),
           other: tuple[str, ...] | None = None, specials: bool = True) -> Any:
  """Two operands broadcast together: tensor-tensor, tensor-scalar or scalar-tensor (the reflected operator);
  `other`: the second tensor's dtype is drawn from it (promotion)."""
  def gen(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
    mode = draw(S(modes))
    sa, sb = draw(S(BIN_SHAPES))
    db = domain_b or domain
    if mode == "st": return [scalar(draw, dt, domain, specials), tensor(draw, dt, sa, db, specials)], {}  # the reflected operator
    a = tensor(draw, dt, sa, domain, specials)
    b = tensor(draw, draw(S(other)) if other else dt, sb, db, specials) if mode == "tt" else scalar(draw, dt, db, specials)
    return [a, b], {}
  return gen


def axis_kw(draw: Any, nd: int, multi: bool = True, none: bool = True) -> Any:
  n = max(nd, 1)
  single = list(range(-n, n))
  choices: list[Any] = ([None] if none else []) + single
  if multi and nd >= 2: choices += [(0, -1), (-1, -2)] + ([(0, 2)] if nd >= 3 else [])
  return draw(S(choices))


def reduce(domain: tuple[float, float] | None = None, multi: bool = True, none: bool = True, shapes: list = RED_SHAPES, **kws: Any) -> Any:
  def gen(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
    shape = draw(S(shapes))
    kw = {"axis": axis_kw(draw, len(shape), multi, none), "keepdim": draw(st.booleans())}
    kw.update({k: draw(s) for k, s in kws.items()})
    return [tensor(draw, dt, shape, domain)], kw
  return gen


def scan(domain: tuple[float, float] | None = None, shapes: list = RED_SHAPES) -> Any:
  def gen(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
    shape = draw(S(shapes))
    n = max(len(shape), 1)
    return [tensor(draw, dt, shape, domain)], {"axis": draw(S(list(range(-n, n))))}
  return gen


def with_param(choices: list) -> Any:
  """A unary case plus one positional parameter drawn from `choices`."""
  def gen(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
    return [tensor(draw, dt, draw(S(UNARY_SHAPES))), Py(draw(S(choices)))], {}
  return gen


def _as(b: Any, a: Any) -> Any:
  """b as a tensor of a's dtype when it is a Python scalar (torch functions that take no scalar operand)."""
  return b if isinstance(b, torch.Tensor) else torch.as_tensor(b, dtype=a.dtype)


def fixed(*configs: Any, domain: tuple[float, float] | None = None) -> Any:
  """One config drawn from a list: (shapes of the tensor arguments, keywords)."""
  def gen(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
    shapes, kw = draw(S(list(configs)))
    return [tensor(draw, dt, s, domain) for s in shapes], dict(kw)
  return gen


# torch references that need a few lines

def t_red(fn: Any) -> Any:
  """A torch reduction taking dim=None as "all dims" with keepdim, and tuple dims."""
  def ref(x: Any, axis: Any = None, keepdim: bool = False, **kw: Any) -> Any:
    dim = _dims(x.ndim) if axis is None else axis
    return fn(x, dim, keepdim, **kw)
  return ref


def _prod(x: Any, dim: Any, keepdim: bool) -> Any:
  if isinstance(dim, int): return x.prod(dim, keepdim=keepdim)
  if x.ndim == 0: return x.prod()
  out = x
  for d in sorted((d % max(x.ndim, 1) for d in dim), reverse=True): out = out.prod(d, keepdim=True) if x.ndim else out
  return out if keepdim else out.reshape([s for i, s in enumerate(x.shape) if i not in {d % max(x.ndim, 1) for d in dim}])


def _argext(fn: Any) -> Any:
  def ref(x: Any, axis: Any = None, keepdim: bool = False) -> Any:
    if axis is None and keepdim: return fn(x.flatten(), 0).reshape([1] * x.ndim)
    return fn(x, axis, keepdim)
  return ref


def _cum_first(x: Any, axis: int, largest: bool) -> Any:
  """cummax/cummin with the index of the FIRST element equal to the running extreme (tinygrad's rule)."""
  v = torch.cummax(x, axis).values if largest else torch.cummin(x, axis).values
  if x.ndim == 0 or x.shape[axis] == 0: return v, torch.zeros(x.shape, dtype=torch.int64)
  n = x.shape[axis]
  xt, vt = x.detach().movedim(axis, -1), v.detach().movedim(axis, -1)
  j = torch.arange(n)
  hit = (j[None, :] <= j[:, None]) & ((xt.unsqueeze(-2) == vt.unsqueeze(-1)) | (xt.unsqueeze(-2).isnan() & vt.unsqueeze(-1).isnan()))
  first = torch.where(hit, j, n).amin(-1)
  return v, first.movedim(-1, axis)


def _topk(x: Any, k: int, dim: int = -1, largest: bool = True, sorted_: bool = True) -> Any:
  """torch.topk through the stable sort: topk's order among equal values is unspecified, plugrad's is the stable one."""
  v, i = torch.sort(x, dim=dim, descending=largest, stable=True)
  return v.narrow(dim, 0, k), i.narrow(dim, 0, k)


def _scatter_reduce_ref(x: Any, dim: int, index: Any, src: Any, reduce: str, include_self: bool = True) -> Any:
  return x.scatter_reduce(dim, index, src[tuple(slice(0, s) for s in index.shape)], reduce, include_self=include_self)


def _bilinear_u8(x: Any, size: Any, align_corners: bool) -> Any:
  """PyTorch's own uint8 linear resize (the fixed-point bilinear kernel, a rounded pass per axis, the last axis first),
  which exists only for 2-d images: one axis as a (1, W) image, three as the last two and then the first on its own."""
  if len(size) == 1: return F.interpolate(x.unsqueeze(-2), size=(1, size[0]), mode="bilinear", align_corners=align_corners).squeeze(-2)
  if len(size) == 2: return F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=align_corners)
  n, c, d = x.shape[:3]
  hw = F.interpolate(x.reshape(n * c, d, *x.shape[3:]), size=tuple(size[1:]), mode="bilinear", align_corners=align_corners)
  cols = hw.reshape(n * c, 1, d, size[1] * size[2])  # the remaining axis as an image's height, the other two as its width
  return F.interpolate(cols, size=(size[0], size[1] * size[2]), mode="bilinear", align_corners=align_corners).reshape(n, c, *size)


def _interp_ref(x: Any, size: Any, mode: str = "linear", align_corners: bool = False) -> Any:
  if x.dtype == torch.uint8 and mode == "linear": return _bilinear_u8(x, size, align_corners)
  xf = _f32(x)
  tmode = {1: "linear", 2: "bilinear", 3: "trilinear"}[len(size)] if mode == "linear" else mode
  out = F.interpolate(xf, size=tuple(size), mode=tmode, align_corners=align_corners if mode == "linear" else None)
  return out if x.dtype.is_floating_point else out.to(x.dtype)


def _bn_ref(x: Any, w: Any, b: Any, mean: Any, invstd: Any) -> Any:
  sh = [1, -1] + [1] * (x.ndim - 2)
  return (x - mean.reshape(sh)) * w.reshape(sh) * invstd.reshape(sh) + b.reshape(sh)


def _sparse_ce_ref(x: Any, y: Any, ignore_index: int = -1, label_smoothing: float = 0.0, reduction: str = "mean") -> Any:
  C = x.shape[-1]
  out = F.cross_entropy(x.reshape(-1, C), y.reshape(-1).long(), ignore_index=ignore_index, label_smoothing=label_smoothing, reduction=reduction)
  return out.reshape(y.shape) if reduction == "none" else out


def _normalize_mag(x: Any, p: float, dim: int) -> Any:
  """The scale of normalize's rounding: |x|/n forward and 1/n for the gradient (its terms, which cancel, are of that size)."""
  return x * (1 / torch.linalg.vector_norm(x, p, dim, keepdim=True).clamp_min(1e-12)).detach()


def _layernorm_mag(x: Any, axis: Any, eps: float) -> Any:
  """The scale of layernorm's rounding error: |x|/sqrt(var + eps), the rounding of the mean amplified (a constant row gives
  about ulp(x)/sqrt(eps), not 0)."""
  ax = axis if isinstance(axis, tuple) else (axis,)
  return x / (x.var(ax, keepdim=True, correction=0) + eps).sqrt()


DIVISOR_WHY = "gradients are not compared where N - correction <= 0: the value is a division by zero (inf or nan)"


def _divisor_positive(c: Any) -> bool:
  x, axis = c.args[0].value, c.kw["axis"]
  axes = range(x.ndim) if axis is None else (axis,) if isinstance(axis, int) else axis
  n = int(np.prod([x.shape[a] for a in axes])) if x.ndim else 1
  return n > c.kw["correction"]


def _getitem(x: Any, idx: Any, *tidx: Any) -> Any:
  it = iter(tidx)
  return x[tuple(next(it) if i == "T" else i for i in idx)]


def _setitem_pg(x: Any, v: Any, idx: Any, *tidx: Any) -> Any:
  y = x.clone()
  it = iter(tidx)
  y[tuple(next(it) if i == "T" else i for i in idx)] = v
  return y


def _setitem_pt(x: Any, v: Any, idx: Any, *tidx: Any) -> Any:
  y = x.clone()
  it = iter(tidx)
  y[tuple(next(it) if i == "T" else i for i in idx)] = v
  return y


# ---------------------------------------------------------------- generators for the structured ops

def gen_gather(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape = draw(S([(4,), (3, 4), (2, 3, 2), (3, 0)]))
  nd = len(shape)
  dim = draw(S(list(range(-nd, nd))))
  d = dim % nd
  ishape = tuple(draw(st.integers(0 if s == 0 else 1, max(s, 1) + 1)) if i == d else draw(st.integers(min(1, s), s)) for i, s in enumerate(shape))
  hi = shape[d] - 1
  idx = values(draw, "int64", ishape, (0, hi), specials=False) if hi >= 0 else np.zeros(ishape, np.int64)
  if hi < 0 and int(np.prod(ishape)): ishape = tuple(0 if i == d else s for i, s in enumerate(ishape)); idx = np.zeros(ishape, np.int64)
  return [tensor(draw, dt, shape), index(idx)], {"dim": dim}


def gen_scatter(reduce_mode: str | None) -> Any:
  def gen(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
    shape = draw(S([(4,), (3, 4), (2, 3, 2)]))
    nd = len(shape)
    dim = draw(S(list(range(-nd, nd))))
    d = dim % nd
    if reduce_mode is None:  # a set: distinct positions along dim (a repeated one is written in an unspecified order in torch)
      k = draw(st.integers(1, shape[d]))
      ishape = tuple(k if i == d else draw(st.integers(1, s)) for i, s in enumerate(shape))
      perm = np.array(draw(st.permutations(list(range(shape[d])))))[:k]
      idx = np.broadcast_to(perm.reshape([-1 if i == d else 1 for i in range(nd)]), ishape).copy()
    else:
      ishape = tuple(draw(st.integers(1, s + 1 if i == d else s)) for i, s in enumerate(shape))
      idx = values(draw, "int64", ishape, (0, shape[d] - 1), specials=False)
    src_shape = tuple(max(i, s) for i, s in zip(ishape, shape))
    kw: dict[str, Any] = {"dim": dim}
    if reduce_mode == "scatter": kw["reduce"] = draw(S(["add", "multiply"]))
    elif reduce_mode is not None:
      kw["reduce"] = draw(S(["sum", "prod", "mean", "amax", "amin"]))
      kw["include_self"] = draw(st.booleans())
    return [tensor(draw, dt, shape), index(idx), tensor(draw, dt, src_shape)], kw
  return gen


GETITEM = [  # (shape, index with "T" where an int64 tensor goes, the tensors' values)
  ((3, 4), (0,), ()), ((3, 4), (-1, slice(None)), ()), ((3, 4), (slice(1, None), 2), ()), ((3, 4), (Ellipsis, -2), ()),
  ((3, 4), (None, slice(None, None, 2)), ()), ((3, 4), (slice(1, 1),), ()), ((3, 4), (slice(-2, None), slice(None, -1)), ()),
  ((3, 4), ("T",), ([2, 0, -1],)), ((3, 4), (slice(None), "T"), ([[1, 3], [0, 0]],)), ((3, 4), ("T", "T"), ([0, 2], [3, -4])),
  ((2, 3, 4), (1, "T", slice(None)), ([2, 1],)), ((2, 3, 4), ("T", slice(None), "T"), ([0, 1], [1, 3])), ((5,), (slice(3, 100),), ()),
  ((5,), (slice(-100, 2),), ()), ((0, 3), (slice(None), 1), ()), ((), (None,), ()), ((), (Ellipsis,), ()),
]


def gen_getitem(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape, idx, tv = draw(S(GETITEM))
  return [tensor(draw, dt, shape), Py(idx), *[index(v) for v in tv]], {}


SETITEM = [((3, 4), (0,), (4,), ()), ((3, 4), (slice(None), 1), (), ()), ((3, 4), (slice(1, 3), slice(0, 2)), (2, 2), ()),
           ((3, 4), ("T",), (4,), ([2, 0],)), ((3, 4), (Ellipsis, -1), (3,), ()), ((2, 3), ("T", "T"), (), ([0, 1], [2, 0]))]


def gen_setitem(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape, idx, vshape, tv = draw(S(SETITEM))
  return [tensor(draw, dt, shape), tensor(draw, dt, vshape), Py(idx), *[index(v) for v in tv]], {}


def gen_pad(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  # torch pads bools only with constants, and the other modes only 1 axis of 2-3D input, 2 axes of 3-4D input
  mode = draw(S(["constant"] if dt == "bool" else ["constant", "reflect", "replicate", "circular"]))
  if mode == "constant":
    shape = draw(S([(3,), (2, 4), (1, 2, 3), (2, 0)]))
    npairs = draw(st.integers(1, len(shape)))
    pad = tuple(draw(st.integers(-1, 2)) for _ in range(2 * npairs))
    value = draw(S([0, 1] if dt in INTS + ("bool",) else [0.0, 1.5, -math.inf]))
    return [tensor(draw, dt, shape)], {"padding": pad, "mode": mode, "value": value}
  shape = draw(S([(2, 4), (1, 2, 3), (1, 1, 3, 4)]))
  npairs = {2: 1, 3: draw(S([1, 2])), 4: 2}[len(shape)]
  sizes = shape[::-1]
  pad = tuple(draw(st.integers(0, sizes[i // 2] + (0 if mode == "reflect" else 1))) for i in range(2 * npairs))
  return [tensor(draw, dt, shape)], {"padding": pad, "mode": mode}


def gen_reshape(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape, new = draw(S([((2, 3), (3, 2)), ((2, 3), (-1,)), ((2, 3), (1, 6, 1)), ((2, 3, 2), (-1, 3)), ((), (1, 1)), ((0, 3), (3, -1, 0)),
                       ((4,), (2, 2)), ((1,), ())]))
  return [tensor(draw, dt, shape)], {"shape": new}


def gen_permute(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape = draw(S([(2, 3), (2, 1, 3), (2, 0, 3), (4,)]))
  order = list(draw(st.permutations(list(range(len(shape))))))
  order = [o - len(shape) if draw(st.booleans()) else o for o in order]
  return [tensor(draw, dt, shape)], {"order": tuple(order)}


def gen_two_dims(shapes: list) -> Any:
  def gen(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
    shape = draw(S(shapes))
    n = max(len(shape), 1)
    return [tensor(draw, dt, shape)], {"d0": draw(S(list(range(-n, n)))), "d1": draw(S(list(range(-n, n))))}
  return gen


def gen_expand(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape, new = draw(S([((1,), (3,)), ((2, 1), (2, 4)), ((2, 1), (3, 2, 4)), ((), (2, 3)), ((1, 3), (-1, 3)), ((1, 3), (0, 3)), ((3,), (2, 3))]))
  return [tensor(draw, dt, shape)], {"shape": new}


def gen_cat(other: tuple[str, ...] | None = None) -> Any:
  def gen(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
    shapes, dim = draw(S([([(2, 3), (1, 3)], 0), ([(2, 3), (2, 0), (2, 2)], -1), ([(1,), (3,)], 0), ([(2, 1, 2), (2, 3, 2)], 1),
                          ([(0, 2), (0, 2)], 0)]))
    ts = [tensor(draw, draw(S(other)) if other and i else dt, s) for i, s in enumerate(shapes)]
    return ts, {"dim": dim}
  return gen


def gen_stack(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape, n = draw(S([((3,), 2), ((2, 3), 3), ((), 2), ((0, 2), 2)]))
  nd = len(shape) + 1
  return [tensor(draw, dt, shape) for _ in range(n)], {"dim": draw(S(list(range(-nd, nd))))}


def gen_split(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape, sizes, dim = draw(S([((5, 2), 2, 0), ((5, 2), [1, 4], 0), ((2, 6), 4, -1), ((2, 6), [0, 6], 1), ((0, 3), 2, 0), ((3,), 5, 0)]))
  return [tensor(draw, dt, shape)], {"sizes": sizes, "dim": dim}


def gen_chunk(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape, chunks, dim = draw(S([((5, 2), 2, 0), ((6, 2), 3, 0), ((2, 7), 3, -1), ((2, 3), 5, 1), ((1, 2), 1, 0)]))
  return [tensor(draw, dt, shape)], {"chunks": chunks, "dim": dim}


def gen_conv(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  # (x, weight, bias?, groups, stride, dilation, padding)
  x, w, b, groups, stride, dil, pad = draw(S([
    ((1, 1, 4, 4), (1, 1, 3, 3), False, 1, 1, 1, 0), ((2, 2, 5, 4), (3, 2, 2, 2), True, 1, 1, 1, 1),
    ((1, 4, 5, 5), (4, 2, 3, 3), True, 2, 2, 1, (1, 0)), ((1, 2, 6, 6), (2, 1, 2, 3), False, 2, (2, 1), 2, 0),
    ((1, 1, 3, 3), (2, 1, 3, 3), True, 1, 1, 1, 1), ((0, 1, 3, 3), (1, 1, 2, 2), False, 1, 1, 1, 0)]))
  args = [tensor(draw, dt, x), tensor(draw, dt, w)] + ([tensor(draw, dt, (w[0],))] if b else [Py(None)])
  return args, {"groups": groups, "stride": stride, "dilation": dil, "padding": pad}


def gen_conv_t(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  x, w, b, groups, stride, dil, pad, opad = draw(S([
    ((1, 1, 3, 3), (1, 1, 2, 2), False, 1, 1, 1, 0, 0), ((1, 2, 3, 2), (2, 3, 3, 3), True, 1, 2, 1, 1, 1),
    ((2, 4, 2, 2), (4, 1, 2, 3), True, 2, (2, 1), 1, 0, 0), ((1, 1, 2, 3), (1, 2, 2, 2), False, 1, 1, 2, 0, 0)]))
  args = [tensor(draw, dt, x), tensor(draw, dt, w)] + ([tensor(draw, dt, (w[1] * groups,))] if b else [Py(None)])
  return args, {"groups": groups, "stride": stride, "dilation": dil, "padding": pad, "output_padding": opad}


def gen_pool(avg: bool) -> Any:
  def gen(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
    shape, k, s, p, ceil = draw(S([((1, 1, 4, 4), (2, 2), None, 0, False), ((2, 3, 5, 5), (3, 3), 2, 1, False),
                                   ((1, 1, 5, 4), (2, 3), (1, 2), 0, True),
                                   ((1, 2, 6, 6), (3, 2), 2, (1, 0), True), ((1, 1, 3, 3), (3, 3), 1, 1, False)]))
    kw: dict[str, Any] = {"kernel_size": k, "stride": s, "padding": p, "ceil_mode": ceil}
    if avg: kw["count_include_pad"] = draw(st.booleans())
    return [tensor(draw, dt, shape)], kw
  return gen


def gen_sdpa(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  (q, k, v), mask, causal = draw(S([(((1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4)), None, False), (((2, 3, 4), (2, 5, 4), (2, 5, 2)), None, False),
                                    (((1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4)), None, True), (((2, 3, 4), (2, 5, 4), (2, 5, 2)), "bool", False),
                                    (((2, 3, 4), (2, 5, 4), (2, 5, 2)), "float", False), (((1, 4, 2), (1, 4, 2), (1, 4, 3)), None, True)]))
  args: list[Any] = [tensor(draw, dt, q), tensor(draw, dt, k), tensor(draw, dt, v)]
  L, Sn = q[-2], k[-2]
  if mask == "bool":
    m = values(draw, "bool", (L, Sn)); m[:, 0] = True  # every row keeps one key (else torch's softmax is nan)
    args.append(Arg(m, "bool", diff=False))
  elif mask == "float": args.append(tensor(draw, dt, (L, Sn), specials=False, diff=False))
  else: args.append(Py(None))
  return args, {"is_causal": causal}


def gen_ce(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape, probs = draw(S([((3, 4), False), ((4,), False), ((2, 3, 2), False), ((3, 4), True), ((2, 3), True)]))
  C = shape[0] if len(shape) == 1 else shape[1]
  x = tensor(draw, dt, shape)
  if probs: y: Any = tensor(draw, dt, shape, (0, 1), specials=False, diff=False)
  else: y = index(values(draw, "int64", shape[:0] if len(shape) == 1 else shape[:1] + shape[2:], (0, C - 1), specials=False))
  return [x, y], {"reduction": draw(S(["mean", "sum", "none"])), "label_smoothing": draw(S([0.0, 0.1]))}


def gen_nll(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape, weighted, ignore = draw(S([((3, 4), False, None), ((4,), False, None), ((2, 3, 2), True, None), ((3, 4), True, 1), ((5, 3), False, 0)]))
  C = shape[0] if len(shape) == 1 else shape[1]
  y = index(values(draw, "int64", shape[:0] if len(shape) == 1 else shape[:1] + shape[2:], (0, C - 1), specials=False))
  w = tensor(draw, dt, (C,), (0.1, 2), specials=False, diff=False) if weighted else Py(None)
  kw: dict[str, Any] = {"reduction": draw(S(["mean", "sum", "none"]))}
  if ignore is not None: kw["ignore_index"] = ignore
  return [tensor(draw, dt, shape), y, w], kw


def gen_sparse_ce(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape = draw(S([(3, 4), (2, 3, 5), (4,)]))
  y = index(values(draw, "int64", shape[:-1], (0, shape[-1] - 1), specials=False))
  kw = {"reduction": draw(S(["mean", "sum", "none"])), "label_smoothing": draw(S([0.0, 0.2])), "ignore_index": draw(S([-1, 0]))}
  return [tensor(draw, dt, shape), y], kw


def gen_bce(logits: bool) -> Any:
  def gen(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
    shape = draw(S([(4,), (2, 3), ()]))
    x = tensor(draw, dt, shape) if logits else tensor(draw, dt, shape, (0.0, 1.0), specials=False)
    y = tensor(draw, dt, shape, (0.0, 1.0), specials=False, diff=draw(st.booleans()))
    kw: dict[str, Any] = {"reduction": draw(S(["mean", "sum", "none"]))}
    args = [x, y]
    if logits:
      pw = draw(st.booleans())
      args.append(tensor(draw, dt, shape[-1:], (0.5, 2.0), specials=False, diff=False) if pw else Py(None))
    return args, kw
  return gen


def gen_interp(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape, size = draw(S([((1, 2, 4), (6,)), ((1, 1, 3, 4), (5, 2)), ((2, 1, 4, 4), (2, 2)), ((1, 1, 2, 2, 2), (3, 3, 3)), ((1, 1, 1), (3,))]))
  mode = draw(S(["linear", "nearest", "nearest-exact"]))
  kw = {"size": size, "mode": mode, "align_corners": draw(st.booleans()) if mode == "linear" else False}
  return [tensor(draw, dt, shape)], kw


EINSUM = [("ij,jk->ik", [(2, 3), (3, 4)]), ("ij->ji", [(2, 3)]), ("ii->i", [(3, 3)]), ("ii", [(3, 3)]), ("bij,bjk->bik", [(2, 2, 3), (2, 3, 1)]),
          ("i,i->", [(4,), (4,)]), ("i,j->ij", [(2,), (3,)]), ("...ij->...ji", [(2, 1, 3)]), ("ij,j", [(2, 3), (3,)]), ("ijk->", [(2, 0, 3)])]


def gen_einsum(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  formula, shapes = draw(S(EINSUM))
  return [Py(formula), *[tensor(draw, dt, s) for s in shapes]], {}


MATMUL = [((2, 3), (3, 4)), ((3,), (3,)), ((3,), (3, 2)), ((2, 3), (3,)), ((2, 2, 3), (3, 4)), ((2, 1, 2, 3), (3, 3, 2)), ((0, 3), (3, 2)),
          ((2, 0), (0, 3)), ((1, 1), (1, 1))]


def gen_matmul(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  a, b = draw(S(MATMUL))
  return [tensor(draw, dt, a), tensor(draw, dt, b)], {}


def gen_linear(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  x, w, b = draw(S([((2, 3), (3, 4), True), ((3,), (3, 2), False), ((2, 2, 3), (3, 4), True), ((2, 3), (3,), True)]))
  return [tensor(draw, dt, x), tensor(draw, dt, w), tensor(draw, dt, w[-1:]) if b else Py(None)], {}


def gen_where(other: tuple[str, ...] | None = None) -> Any:
  def gen(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
    sc, sa, sb = draw(S([((2, 3), (2, 3), (2, 3)), ((2, 1), (1, 3), ()), ((3,), (2, 3), (1,)), ((0, 1), (1, 2), (1, 1)), ((), (), ())]))
    c = Arg(values(draw, "bool", sc), "bool", diff=False)
    a = tensor(draw, dt, sa)
    b: Any = tensor(draw, draw(S(other)) if other else dt, sb) if draw(st.booleans()) or other else scalar(draw, dt)
    return [c, a, b], {}
  return gen


def gen_lerp(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  sa, sb = draw(S(BIN_SHAPES))
  w = tensor(draw, dt, sb) if draw(st.booleans()) else Py(draw(S([0.0, 0.25, 1.0, 2.0])))
  return [tensor(draw, dt, sa), tensor(draw, dt, sb), w], {}


def gen_clip(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape = draw(S(UNARY_SHAPES))
  x = tensor(draw, dt, shape)
  lo, hi = draw(S([(-1, 1), (None, 0), (0, None), (2, -2), ("t", "t")]))
  if lo == "t": return [x, tensor(draw, dt, shape[-1:]), tensor(draw, dt, shape[-1:])], {}
  if dt in INTS: lo, hi = (None if v is None else int(v) for v in (lo, hi))
  return [x, Py(lo), Py(hi)], {}


def gen_masked_fill(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  sx, sm = draw(S([((2, 3), (2, 3)), ((2, 3), (1, 3)), ((3,), ()), ((0, 2), (1, 2))]))
  return [tensor(draw, dt, sx), Arg(values(draw, "bool", sm), "bool", diff=False), scalar(draw, dt)], {}


def gen_isclose(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  sa, sb = draw(S(BIN_SHAPES))
  a = tensor(draw, dt, sa, diff=False)
  b = Arg(a.value + np.asarray(values(draw, dt, a.value.shape, (-1e-5, 1e-5), specials=False), a.value.dtype), dt, diff=False) \
      if sa == sb and draw(st.booleans()) else tensor(draw, dt, sb, diff=False)
  return [a, b], {"rtol": draw(S([1e-5, 1e-2])), "atol": draw(S([1e-8, 0.5])), "equal_nan": draw(st.booleans())}


def gen_shift(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  bits = np.iinfo(np.dtype(dt)).bits
  sa, sb = draw(S(BIN_SHAPES))
  a = tensor(draw, dt, sa, (0, 100) if dt not in ("uint8",) else None)
  b = tensor(draw, dt, sb, (0, bits - 1)) if draw(st.booleans()) else Py(draw(st.integers(0, bits - 1)))
  return [a, b], {}


def gen_cast(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  to = draw(S(ALL))
  shape = draw(S(UNARY_SHAPES))
  if dt in FLOATS and to in INTS:  # float -> int outside the target's range (or nan) is undefined in C and differs by platform
    lo, hi = (0, 255) if to == "uint8" else (-100, 100)
    x = tensor(draw, dt, shape, (lo, hi), specials=False)
  elif dt in INTS and to == "uint8": x = tensor(draw, dt, shape, (0, 255))
  else: x = tensor(draw, dt, shape)
  return [x], {"to": to}


def gen_bitcast(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  size = np.dtype(DT_NP[dt]).itemsize
  to = draw(S([d for d in NUMERIC if np.dtype(DT_NP[d]).itemsize == size]))
  return [tensor(draw, dt, draw(S(UNARY_SHAPES)), specials=dt != "bfloat16", diff=False)], {"to": to}


DT_NP = {"float64": np.float64, "float32": np.float32, "float16": np.float16, "bfloat16": np.float16, "int8": np.int8, "int16": np.int16,
         "int32": np.int32, "int64": np.int64, "uint8": np.uint8, "bool": np.bool_}


def gen_creation(kind: str) -> Any:
  def gen(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
    if kind == "arange":
      start, stop, step = draw(S([(5, None, 1), (0, 10, 3), (2, -3, -1), (0.5, 3, 0.5), (0, 1, 0.25), (-2, 2.5, 1), (3, 3, 1), (0, 1, 0.1)]))
      return [], {"start": start, "stop": stop, "step": step, "dtype": draw(S([None, dt]))}
    if kind == "linspace":
      start, stop, steps = draw(S([(0, 1, 5), (-3, 3, 7), (2, 2, 1), (0, 10, 0), (1.5, -2.5, 4), (0, 1, 2)]))
      return [], {"start": start, "stop": stop, "steps": steps, "dtype": draw(S([None, dt]))}
    if kind == "eye":
      n, m = draw(S([(3, None), (2, 4), (0, None), (1, 1), (4, 2)]))
      return [], {"n": n, "m": m, "dtype": draw(S([None, dt]))}
    shape = draw(S([(), (3,), (2, 3), (0, 2)]))
    if kind == "full": return [], {"shape": shape, "fill": draw(S([0, 1, -2, 2.5, True, math.inf])), "dtype": draw(S([None, dt]))}
    return [], {"shape": shape, "dtype": draw(S([None, dt]))}
  return gen


def gen_like(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  return [tensor(draw, dt, draw(S(UNARY_SHAPES)), diff=False)], {"fill": draw(S([0, 1, 2.5, True])), "dtype": draw(S([None, "float32", "int32"]))}


def gen_from_data(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  data = draw(S([[1, 2, 3], [[1.5, -2.0], [0.0, 3.25]], [True, False], [[1, 2.5]], [[True, 2]], 7, -1.5, False, [], [[]]]))
  return [], {"data": data}


def gen_meshgrid(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shapes = draw(S([[(2,), (3,)], [(3,), (1,), (2,)], [(0,), (2,)], [(4,)], [(), (2,)]]))
  return [tensor(draw, dt, s) for s in shapes], {"indexing": draw(S(["ij", "xy"]))}


def gen_diag(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  return [tensor(draw, dt, draw(S([(3,), (1,), (0,), (3, 3), (2, 4)])))], {}


def gen_diagonal(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape = draw(S([(3, 3), (2, 4), (2, 3, 4), (0, 2)]))
  nd = len(shape)
  d1, d2 = draw(st.permutations(list(range(-nd, 0))).map(lambda p: p[:2]))
  return [tensor(draw, dt, shape)], {"offset": draw(S([0, 1, -1, 3, -5])), "dim1": d1, "dim2": d2}


def gen_unfold(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape, dim, size, step = draw(S([((5,), 0, 2, 1), ((2, 6), -1, 3, 2), ((4, 3), 0, 4, 1), ((0, 3), 1, 2, 1), ((3,), 0, 0, 1), ((2, 5), 1, 2, 3)]))
  return [tensor(draw, dt, shape)], {"dim": dim, "size": size, "step": step}


def gen_masked_select(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  sx, sm = draw(S([((2, 3), (2, 3)), ((2, 3), (3,)), ((4,), (4,)), ((0, 2), (0, 2)), ((), ())]))
  return [tensor(draw, dt, sx), Arg(values(draw, "bool", sm), "bool", diff=False)], {}


def gen_one_hot(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape, n = draw(S([((3,), 4), ((2, 2), 3), ((), 2), ((0,), 3)]))
  return [index(values(draw, dt, shape, (0, n - 1), specials=False), dt)], {"num_classes": n}


def gen_unpool(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape, k, s = draw(S([((1, 1, 4, 4), (2, 2), None), ((2, 2, 5, 5), (2, 2), 2), ((1, 1, 6, 4), (3, 2), (3, 2))]))
  x = torch.from_numpy(np.array(values(draw, "float32", shape, specials=False)))
  pooled, idx = F.max_pool2d(x, k, s, return_indices=True)
  return [Arg(pooled.numpy().astype(DT_NP[dt]) if dt != "bfloat16" else pooled.numpy(), dt), index(idx.numpy())], \
         {"kernel_size": k, "stride": s, "output_size": shape[-2:]}


def gen_batchnorm(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape = draw(S([(2, 3), (2, 3, 2, 2), (1, 2, 4)]))
  C = shape[1]
  return [tensor(draw, dt, shape), tensor(draw, dt, (C,)), tensor(draw, dt, (C,)), tensor(draw, dt, (C,)), tensor(draw, dt, (C,), (0.1, 3.0))], {}


def gen_layernorm(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape, axis = draw(S([((2, 4), -1), ((3,), -1), ((2, 3, 4), (-2, -1)), ((2, 1), -1), ((0, 3), -1)]))
  return [tensor(draw, dt, shape)], {"axis": axis, "eps": draw(S([1e-5, 1e-2]))}


def gen_softmax(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape = draw(S([(4,), (2, 3), (2, 1, 3), (0, 3), ()]))
  n = max(len(shape), 1)
  return [tensor(draw, dt, shape)], {"axis": draw(S(list(range(-n, n))))}


def gen_normalize(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape = draw(S([(2, 3), (3, 2, 2), (1, 4)]))
  nd = len(shape)
  return [tensor(draw, dt, shape)], {"p": draw(S([2.0, 1.0, 3.0])), "dim": draw(S(list(range(-nd, nd))))}


def gen_flip(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape = draw(S([(4,), (2, 3), (2, 1, 3), (0, 2)]))
  nd = len(shape)
  axes = draw(S([(0,), (-1,), tuple(range(nd)), (0, -1) if nd > 1 else (0,)]))
  return [tensor(draw, dt, shape)], {"axis": axes}


def gen_flatten(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape = draw(S([(2, 3, 4), (2, 0, 3), (5,), ()]))
  n = max(len(shape), 1)
  a, b = sorted(draw(st.tuples(S(list(range(n))), S(list(range(n))))))
  return [tensor(draw, dt, shape)], {"start_dim": a - n if draw(st.booleans()) else a, "end_dim": b - n if draw(st.booleans()) else b}


def gen_unflatten(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape, dim, sizes = draw(S([((6,), 0, (2, 3)), ((2, 6), -1, (3, -1)), ((4, 2), 0, (1, 4, 1)), ((0, 2), 0, (0, 5))]))
  return [tensor(draw, dt, shape)], {"dim": dim, "sizes": sizes}


def gen_squeeze(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape = draw(S([(1, 3, 1), (2, 3), (1,), (), (0, 1)]))
  n = max(len(shape), 1)
  return [tensor(draw, dt, shape)], {"dim": draw(S([None, *range(-n, n)]))}


def gen_unsqueeze(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape = draw(S([(3,), (2, 3), ()]))
  n = len(shape) + 1
  return [tensor(draw, dt, shape)], {"dim": draw(S(list(range(-n, n))))}


def gen_repeat(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape, reps = draw(S([((3,), (2,)), ((2, 3), (1, 2)), ((2,), (3, 2)), ((1, 2), (2, 0)), ((), (3,))]))
  return [tensor(draw, dt, shape)], {"repeats": reps}


def gen_repeat_interleave(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape, r, dim = draw(S([((3,), 2, 0), ((2, 3), 2, None), ((2, 3), 3, -1), ((2, 1), 0, 0)]))
  return [tensor(draw, dt, shape)], {"repeats": r, "dim": dim}


def gen_roll(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape, shifts, dims = draw(S([((5,), 2, 0), ((2, 3), -1, 1), ((2, 3), (1, 2), (0, 1)), ((2, 3), 4, None), ((0, 3), 1, 0), ((3, 2), 7, -2)]))
  return [tensor(draw, dt, shape)], {"shifts": shifts, "dims": dims}


def gen_tri(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  return [tensor(draw, dt, draw(S([(3, 3), (2, 4), (2, 3, 2), (0, 3)])))], {"diagonal": draw(S([0, 1, -1, 5, -5]))}


def gen_topk(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape = draw(S([(5,), (2, 4), (3, 1), (2, 0)]))
  nd = len(shape)
  dim = draw(S(list(range(-nd, nd))))
  return [tensor(draw, dt, shape)], {"k": draw(st.integers(0, shape[dim])), "dim": dim, "largest": draw(st.booleans())}


def gen_sort(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape = draw(S([(5,), (2, 4), (3, 1), (2, 0), ()]))
  n = max(len(shape), 1)
  return [tensor(draw, dt, shape)], {"dim": draw(S(list(range(-n, n)))), "descending": draw(st.booleans())}


def gen_nonzero(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  return [tensor(draw, dt, draw(S([(4,), (2, 3), (0, 2), (2, 1, 2)])), diff=False)], {}


def gen_sum_dtype(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  """sum(dtype=): float inputs summed as int64 are cast first, so they stay in range (float -> int out of range is undefined)."""
  to = draw(S(["float32", "int64"]))
  shape = draw(S(RED_SHAPES))
  x = tensor(draw, dt, shape, (-100, 100), specials=False) if dt in FLOATS and to == "int64" else tensor(draw, dt, shape)
  return [x], {"axis": axis_kw(draw, len(shape)), "keepdim": draw(st.booleans()), "dt": to}


def gen_std(draw: Any, dt: str) -> tuple[list[Any], dict[str, Any]]:
  shape = draw(S(RED_SHAPES))
  return [tensor(draw, dt, shape)], {"axis": axis_kw(draw, len(shape)), "keepdim": draw(st.booleans()), "correction": draw(S([1, 0, 2]))}


# ---------------------------------------------------------------- the table

def same(name: str, *args: Any, **kw: Any) -> tuple[Any, Any]:
  """The method spelled the same in both: x.name(*args)."""
  return (lambda x, **k: getattr(x, name)(*args, **kw, **k)), (lambda x, **k: getattr(x, name)(*args, **kw, **k))


def U(name: str, pt: Any = None, dts: tuple[str, ...] = NUMERIC, grad: bool = True, domain: Any = None, **o: Any) -> Op:
  """A unary method: x.name() against pt(x) (default: the torch method of the same name)."""
  method = name.split(".")[0]
  return Op(name, lambda x: getattr(x, method)(), pt or (lambda x: getattr(x, method)()), unary(domain), dts, grad, elementwise=True, **o)


def B(name: str, pg: Any, pt: Any, dts: tuple[str, ...] = NUMERIC, grad: bool = True, **g: Any) -> Op:
  o = {k: g.pop(k) for k in ("tol", "why", "api", "python") if k in g}
  return Op(name, pg, pt, binary(**g), dts, grad, **o)


FLT = FLOATS
ERF_ATOL = (2e-7, 3e-5)
ERF_WHY = "erf is Abramowitz & Stegun 7.1.26 in every dtype: absolute error <= 1.5e-7 (docs/tensor.md), its derivative ~1e-5"
FI = NUMERIC  # floats and ints: functions of integer tensors compute in default_float (docs/tensor.md)
I_B = INTS + ("bool",)

OPS: list[Op] = [
  # ---- elementwise math (integer inputs compute in float32, as in PyTorch)
  U("neg", dts=FLOATS + SIGNED + ("uint8",), python=True), U("abs", dts=ALL[:-1], python=True), U("sign", dts=NUMERIC), U("exp", dts=FI, python=True),
  U("exp2", dts=FI), U("log", dts=FI, python=True), U("log2", dts=FI), U("log10", dts=FI), U("sqrt", dts=FI, python=True), U("rsqrt", dts=FI),
  U("sin", dts=FI, python=True), U("cos", dts=FI), U("tan", dts=FI, domain=(-1.4, 1.4)), U("asin", dts=FI, domain=(-1, 1)),
  U("acos", dts=FI, domain=(-1, 1)),
  U("atan", dts=FI), U("sinh", dts=FI), U("cosh", dts=FI), U("tanh", dts=FI, python=True), U("asinh", dts=FI), U("acosh", dts=FI, domain=(1, 5)),
  U("atanh", dts=FI, domain=(-1, 1)), U("erf", dts=FLT, atol=ERF_ATOL, why=ERF_WHY, python=True),
  U("floor", dts=NUMERIC), U("ceil", dts=NUMERIC), U("round", dts=NUMERIC), U("trunc", dts=NUMERIC),
  U("reciprocal", dts=FI), U("square", dts=NUMERIC), U("isnan", dts=NUMERIC, grad=False), U("isinf", dts=NUMERIC, grad=False),
  U("isfinite", dts=NUMERIC, grad=False), U("logical_not", dts=ALL, grad=False), U("bitwise_not", dts=I_B, grad=False),
  Op("isinf.signed", lambda x, pos, neg: x.isinf(pos, neg), lambda x, pos, neg: (x == math.inf) & pos | (x == -math.inf) & neg,
     lambda d, dt: ([tensor(d, dt, d(S(UNARY_SHAPES)), diff=False), Py(d(st.booleans())), Py(d(st.booleans()))], {}), FLT, grad=False),
  # ---- activations
  U("relu", dts=FLOATS + SIGNED, python=True), U("relu6", F.relu6, dts=FLT), U("sigmoid", dts=FLT, python=True), U("silu", F.silu, dts=FLT),
  U("swish", F.silu, dts=FLT),
  Op("leaky_relu", lambda x, s: x.leaky_relu(s), lambda x, s: F.leaky_relu(x, s), with_param([0.01, 0.2]), FLT),
  Op("elu", lambda x, a: x.elu(a), lambda x, a: F.elu(x, a), with_param([1.0, 0.5]), FLT),
  Op("celu", lambda x, a: x.celu(a), lambda x, a: F.celu(x, a), with_param([1.0, 2.0]), FLT),
  U("selu", F.selu, dts=FLT),
  U("gelu", lambda x: F.gelu(x, approximate="tanh"), dts=FLT, python=True),
  Op("gelu.none", lambda x: x.gelu(approximate="none"), lambda x: F.gelu(x), unary(), FLT, atol=(5e-7, 1e-5),
     why=ERF_WHY + "; gelu is x/2·(1 + erf(x/√2))", api=("gelu",), elementwise=True),
  U("quick_gelu", lambda x: x * torch.sigmoid(1.702 * x), dts=FLT), U("mish", F.mish, dts=FLT), U("hardsigmoid", F.hardsigmoid, dts=FLT),
  U("logsigmoid", F.logsigmoid, dts=FLT), U("hardswish", F.hardswish, dts=FLT), U("hardtanh", F.hardtanh, dts=FLT),
  Op("softplus", lambda x, b: x.softplus(b), lambda x, b: F.softplus(x, b), with_param([1.0, 2.0]), FLT),
  U("softsign", F.softsign, dts=FLT),
  Op("softmax", lambda x, axis: x.softmax(axis), lambda x, axis: F.softmax(_f32(x), axis), gen_softmax, FI, python=True),
  Op("softmin", lambda x, axis: x.softmin(axis), lambda x, axis: F.softmin(_f32(x), axis), gen_softmax, FLT),
  Op("log_softmax", lambda x, axis: x.log_softmax(axis), lambda x, axis: F.log_softmax(_f32(x), axis), gen_softmax, FI, python=True),
  Op("normalize", lambda x, p, dim: x.normalize(p, dim), lambda x, p, dim: F.normalize(x, p, dim), gen_normalize, FLT, mag=_normalize_mag,
     why="the gradient's two terms (1/n and x²/n³) cancel: rtol is relative to 1/n"),
  # ---- binary arithmetic (tensor-tensor with broadcasting, tensor-scalar and the reflected scalar-tensor operators)
  B("add", lambda a, b: a + b, lambda a, b: a + b, ALL, python=True), B("sub", lambda a, b: a - b, lambda a, b: a - b, NUMERIC),
  B("mul", lambda a, b: a * b, lambda a, b: a * b, ALL, python=True), B("div", lambda a, b: a / b, lambda a, b: a / b, NUMERIC, domain_b=None),
  B("add.mixed", lambda a, b: a + b, lambda a, b: a + b, ALL, modes=("tt",), other=ALL, api=("add",)),
  B("mul.mixed", lambda a, b: a.mul(b), lambda a, b: a.mul(b), ALL, modes=("tt",), other=ALL, api=("mul",)),
  Op("div.trunc", lambda a, b: a.div(b, rounding_mode="trunc"), lambda a, b: torch.div(a, b, rounding_mode="trunc"),
     binary(modes=("tt", "ts")), FLT, api=("div",)),
  Op("div.floor", lambda a, b: a.div(b, rounding_mode="floor"), lambda a, b: torch.div(a, b, rounding_mode="floor"),
     binary(modes=("tt", "ts")), FLT, api=("div",), python=True),
  Op("div.int", lambda a, b, mode: a.div(b, rounding_mode=mode), lambda a, b, mode: torch.div(a, b, rounding_mode=mode),
     lambda d, dt: (binary(domain_b=(1, 50), modes=("tt", "ts"))(d, dt)[0] + [Py(d(S(["trunc", "floor"])))], {}), INTS, grad=False, api=("div",)),
  Op("div.int_neg", lambda a, b, mode: a.div(b, rounding_mode=mode), lambda a, b, mode: torch.div(a, b, rounding_mode=mode),
     lambda d, dt: (binary(domain=(-50, 50), domain_b=(-50, -1), modes=("tt", "ts"))(d, dt)[0] + [Py(d(S(["trunc", "floor"])))], {}), SIGNED,
     grad=False, api=("div",)),
  B("floordiv", lambda a, b: a // b, lambda a, b: a // b, FLT, grad=False, api=("div",)),  # torch: floor_divide has no derivative
  B("mod", lambda a, b: a % b, lambda a, b: a % b, FLT),
  B("mod.int", lambda a, b: a % b, lambda a, b: a % b, SIGNED, grad=False, domain_b=(1, 50), api=("mod",)),
  B("mod.int_neg", lambda a, b: a % b, lambda a, b: a % b, SIGNED, grad=False, domain=(-50, 50), domain_b=(-50, -1), modes=("tt", "ts"),
    api=("mod",)),
  B("fmod", lambda a, b: a.fmod(b), lambda a, b: a.fmod(b), FLT, modes=("tt", "ts")),
  B("fmod.int", lambda a, b: a.fmod(b), lambda a, b: a.fmod(b), SIGNED, grad=False, domain_b=(1, 50), modes=("tt", "ts"), api=("fmod",)),
  B("pow", lambda a, b: a ** b, lambda a, b: a ** b, FLT, python=True),
  B("pow.int", lambda a, b: a ** b, lambda a, b: a ** b, INTS, grad=False, domain=(-6, 6), domain_b=(0, 5), api=("pow",)),
  B("maximum", lambda a, b: a.maximum(b), lambda a, b: torch.maximum(a, torch.as_tensor(b, dtype=a.dtype) if not isinstance(b, torch.Tensor) else b),
    ALL, modes=("tt", "ts"), python=True),
  B("minimum", lambda a, b: a.minimum(b), lambda a, b: torch.minimum(a, torch.as_tensor(b, dtype=a.dtype) if not isinstance(b, torch.Tensor) else b),
    ALL, modes=("tt", "ts")),
  B("maximum.mixed", lambda a, b: a.maximum(b), lambda a, b: torch.maximum(a, b), NUMERIC, modes=("tt",), other=NUMERIC, api=("maximum",)),
  B("minimum.mixed", lambda a, b: a.minimum(b), lambda a, b: torch.minimum(a, b), NUMERIC, modes=("tt",), other=NUMERIC, api=("minimum",)),
  B("copysign", lambda a, b: a.copysign(b), lambda a, b: torch.copysign(a, b), FLT, modes=("tt", "ts")),
  B("logaddexp", lambda a, b: a.logaddexp(b), lambda a, b: torch.logaddexp(a, _as(b, a)),
    FLT, modes=("tt", "ts")),
  Op("lerp", lambda a, b, w: a.lerp(b, w), lambda a, b, w: torch.lerp(a, b.expand(torch.broadcast_shapes(a.shape, b.shape)) if a.ndim < b.ndim
     else b, w),
     gen_lerp, FLT),
  Op("where", lambda c, a, b: c.where(a, b), lambda c, a, b: torch.where(c, a, b), gen_where(), ALL, python=True),
  Op("where.mixed", lambda c, a, b: c.where(a, b), lambda c, a, b: torch.where(c, a, b), gen_where(ALL), ALL, api=("where",)),
  Op("masked_fill", lambda x, m, v: x.masked_fill(m, v), lambda x, m, v: x.masked_fill(m, v), gen_masked_fill, ALL),
  Op("clip", lambda x, lo, hi: x.clip(lo, hi), lambda x, lo, hi: torch.clamp(x, lo, hi), gen_clip, NUMERIC),
  Op("isclose", lambda a, b, **k: a.isclose(b, **k), lambda a, b, **k: torch.isclose(a, b.to(a.dtype) if isinstance(b, torch.Tensor) else b, **k),
     gen_isclose, FLT, grad=False),
  # ---- comparisons and bitwise ops
  B("lt", lambda a, b: a < b, lambda a, b: a < b, NUMERIC, grad=False, api=("__lt__",), python=True),
  B("gt", lambda a, b: a > b, lambda a, b: a > b, NUMERIC, grad=False, api=("__gt__",)),
  B("le", lambda a, b: a <= b, lambda a, b: a <= b, NUMERIC, grad=False, api=("__le__",)),
  B("ge", lambda a, b: a >= b, lambda a, b: a >= b, NUMERIC, grad=False, api=("__ge__",)),
  B("eq", lambda a, b: a == b, lambda a, b: a == b, ALL, grad=False, api=("__eq__",)),
  B("ne", lambda a, b: a != b, lambda a, b: a != b, ALL, grad=False, api=("__ne__",)),
  B("lt.mixed", lambda a, b: a < b, lambda a, b: a < b, NUMERIC, grad=False, modes=("tt",), other=NUMERIC, api=("__lt__",)),
  B("bitwise_and", lambda a, b: a & b, lambda a, b: a & b, I_B, grad=False, api=("__and__",), python=True),
  B("bitwise_or", lambda a, b: a | b, lambda a, b: a | b, I_B, grad=False, api=("__or__",)),
  B("bitwise_xor", lambda a, b: a ^ b, lambda a, b: a ^ b, I_B, grad=False, api=("__xor__",)),
  Op("lshift", lambda a, b: a << b, lambda a, b: a << b, gen_shift, INTS, grad=False, python=True),
  Op("rshift", lambda a, b: a >> b, lambda a, b: a >> b, gen_shift, INTS, grad=False),
  # ---- reductions
  Op("sum", lambda x, **k: x.sum(**k), t_red(lambda x, d, k: x.sum(d, keepdim=k)), reduce(), ALL, python=True, sums=True),
  Op("sum.dtype", lambda x, dt, **k: x.sum(**k, dtype=dt), t_red(lambda x, d, k, dt: x.sum(d, keepdim=k, dtype=getattr(torch, dt))),
     gen_sum_dtype, NUMERIC, grad=False, api=("sum",), sums=True),
  Op("prod", lambda x, **k: x.prod(**k), t_red(_prod), reduce(multi=False), ALL),
  Op("max", lambda x, **k: x.max(**k), t_red(lambda x, d, k: torch.amax(x, d, keepdim=k)), reduce(), ALL, python=True),
  Op("min", lambda x, **k: x.min(**k), t_red(lambda x, d, k: torch.amin(x, d, keepdim=k)), reduce(), ALL),
  Op("mean", lambda x, **k: x.mean(**k), t_red(lambda x, d, k: _f32(x).mean(d, keepdim=k)), reduce(), FI, sums=True, python=True),
  Op("var", lambda x, **k: x.var(**k), t_red(lambda x, d, k, correction: _f32(x).var(d, keepdim=k, correction=correction)), gen_std, FI,
     python=True, grad_when=_divisor_positive, why=DIVISOR_WHY),
  Op("std", lambda x, **k: x.std(**k), t_red(lambda x, d, k, correction: _f32(x).std(d, keepdim=k, correction=correction)), gen_std, FI,
     grad_when=_divisor_positive, why=DIVISOR_WHY),
  Op("std_mean", lambda x, **k: x.std_mean(**k), t_red(lambda x, d, k, correction: torch.std_mean(_f32(x), d, keepdim=k, correction=correction)),
     gen_std, FLT, grad_when=_divisor_positive, why=DIVISOR_WHY),
  Op("var_mean", lambda x, **k: x.var_mean(**k), t_red(lambda x, d, k, correction: torch.var_mean(_f32(x), d, keepdim=k, correction=correction)),
     gen_std, FLT, grad_when=_divisor_positive, why=DIVISOR_WHY),
  Op("argmax", lambda x, **k: x.argmax(**k), _argext(torch.argmax), reduce(multi=False), NUMERIC, grad=False, python=True),
  Op("argmin", lambda x, **k: x.argmin(**k), _argext(torch.argmin), reduce(multi=False), NUMERIC, grad=False),
  Op("any", lambda x, **k: x.any(**k), t_red(lambda x, d, k: torch.any(x, d, keepdim=k)), reduce(), ALL, grad=False),
  Op("all", lambda x, **k: x.all(**k), t_red(lambda x, d, k: torch.all(x, d, keepdim=k)), reduce(), ALL, grad=False),
  Op("logsumexp", lambda x, **k: x.logsumexp(**k), t_red(lambda x, d, k: torch.logsumexp(_f32(x), d, keepdim=k)), reduce(), FI),
  Op("cumsum", lambda x, axis: x.cumsum(axis), lambda x, axis: torch.cumsum(x, axis), scan(), ALL, sums=True, python=True),
  Op("cumprod", lambda x, axis: x.cumprod(axis), lambda x, axis: torch.cumprod(x, axis), scan(domain=(-2, 2)), NUMERIC),
  Op("cummax", lambda x, axis: x.cummax(axis), lambda x, axis: torch.cummax(x, axis), scan(), NUMERIC),
  Op("cummin", lambda x, axis: x.cummin(axis), lambda x, axis: torch.cummin(x, axis), scan(), NUMERIC),
  Op("logcumsumexp", lambda x, axis: x.logcumsumexp(axis), lambda x, axis: torch.logcumsumexp(x, axis), scan(), FLT),
  Op("sort", lambda x, **k: x.sort(**k), lambda x, **k: torch.sort(x, **k, stable=True), gen_sort, NUMERIC, python=True),
  Op("argsort", lambda x, **k: x.argsort(**k), lambda x, **k: torch.argsort(x, **k, stable=True), gen_sort, NUMERIC, grad=False),
  Op("topk", lambda x, **k: x.topk(**k), _topk, gen_topk, NUMERIC),
  # ---- linear algebra
  Op("matmul", lambda a, b: a @ b, lambda a, b: a @ b, gen_matmul, FLOATS + ("int32", "int64"), api=("matmul", "__matmul__"), sums=True, python=True),
  Op("dot", lambda a, b: a.dot(b), lambda a, b: torch.matmul(a, b), gen_matmul, FLT, sums=True),
  Op("einsum", lambda f, *xs: Tensor.einsum(f, *xs), lambda f, *xs: torch.einsum(f, *xs), gen_einsum, FLT, sums=True),
  Op("linear", lambda x, w, b: x.linear(w, b), lambda x, w, b: (x @ w if w.ndim == 2 else x * w) + (b if b is not None else 0), gen_linear, FLT,
     sums=True),
  # ---- movement
  Op("reshape", lambda x, shape: x.reshape(shape), lambda x, shape: x.reshape(shape), gen_reshape, ALL, python=True),
  Op("view", lambda x, shape: x.view(*shape), lambda x, shape: x.reshape(*shape), gen_reshape, ALL),
  Op("permute", lambda x, order: x.permute(order), lambda x, order: x.permute(order), gen_permute, ALL, python=True),
  Op("transpose", lambda x, d0, d1: x.transpose(d0, d1), lambda x, d0, d1: x.transpose(d0, d1), gen_two_dims([(2, 3), (2, 1, 3), (4,), ()]), ALL),
  Op("expand", lambda x, shape: x.expand(shape), lambda x, shape: x.expand(shape), gen_expand, ALL, python=True),
  Op("pad", lambda x, **k: x.pad(**k), lambda x, padding, mode, value=None: F.pad(x, padding, mode, value), gen_pad, ALL, python=True),
  Op("flip", lambda x, axis: x.flip(axis), lambda x, axis: x.flip(axis), gen_flip, ALL, python=True),
  Op("flatten", lambda x, **k: x.flatten(**k), lambda x, **k: x.flatten(**k), gen_flatten, ALL),
  Op("unflatten", lambda x, dim, sizes: x.unflatten(dim, sizes), lambda x, dim, sizes: x.unflatten(dim, sizes), gen_unflatten, ALL),
  Op("squeeze", lambda x, dim: x.squeeze(dim), lambda x, dim: x.squeeze() if dim is None else x.squeeze(dim), gen_squeeze, ALL),
  Op("unsqueeze", lambda x, dim: x.unsqueeze(dim), lambda x, dim: x.unsqueeze(dim), gen_unsqueeze, ALL),
  Op("cat", lambda *xs, dim: xs[0].cat(*xs[1:], dim=dim), lambda *xs, dim: torch.cat(xs, dim), gen_cat(), ALL, python=True),
  Op("cat.mixed", lambda *xs, dim: xs[0].cat(*xs[1:], dim=dim), lambda *xs, dim: torch.cat(xs, dim), gen_cat(ALL), ALL, api=("cat",)),
  Op("stack", lambda *xs, dim: xs[0].stack(*xs[1:], dim=dim), lambda *xs, dim: torch.stack(xs, dim), gen_stack, ALL),
  Op("split", lambda x, sizes, dim: x.split(sizes, dim), lambda x, sizes, dim: x.split(sizes, dim), gen_split, ALL),
  Op("chunk", lambda x, chunks, dim: x.chunk(chunks, dim), lambda x, chunks, dim: x.chunk(chunks, dim), gen_chunk, ALL),
  Op("repeat", lambda x, repeats: x.repeat(repeats), lambda x, repeats: x.repeat(repeats), gen_repeat, ALL),
  Op("repeat_interleave", lambda x, repeats, dim: x.repeat_interleave(repeats, dim), lambda x, repeats, dim: x.repeat_interleave(repeats, dim),
     gen_repeat_interleave, ALL),
  Op("roll", lambda x, shifts, dims: x.roll(shifts, dims), lambda x, shifts, dims: x.roll(shifts, dims), gen_roll, ALL),
  Op("tril", lambda x, diagonal: x.tril(diagonal), lambda x, diagonal: x.tril(diagonal), gen_tri, ALL, python=True),
  Op("triu", lambda x, diagonal: x.triu(diagonal), lambda x, diagonal: x.triu(diagonal), gen_tri, ALL),
  Op("diag", lambda x: x.diag(), lambda x: torch.diag(x), gen_diag, ALL),
  Op("diagonal", lambda x, **k: x.diagonal(**k), lambda x, **k: torch.diagonal(x, **k), gen_diagonal, ALL),
  Op("unfold", lambda x, dim, size, step: x.unfold(dim, size, step), lambda x, dim, size, step: x.unfold(dim, size, step), gen_unfold, ALL),
  Op("T", lambda x: x.T, lambda x: x.transpose(0, 1) if x.ndim >= 2 else x, unary(shapes=[(2, 3), (1, 0), (2, 1, 3)]), FLT,
     why="tinygrad's .T swaps axes 0 and 1 (docs/tensor.md)", api=("transpose",)),
  # ---- indexing
  Op("getitem", lambda x, idx, *t: _getitem(x, idx, *t), lambda x, idx, *t: _getitem(x, idx, *t), gen_getitem, ALL, api=("__getitem__",),
     python=True),
  Op("setitem", lambda x, v, idx, *t: _setitem_pg(x, v, idx, *t), lambda x, v, idx, *t: _setitem_pt(x, v, idx, *t), gen_setitem, ALL, grad=False,
     api=("__setitem__",)),
  Op("gather", lambda x, i, dim: x.gather(dim, i), lambda x, i, dim: torch.gather(x, dim, i), gen_gather, ALL, python=True),
  Op("scatter", lambda x, i, s, dim: x.scatter(dim, i, s), lambda x, i, s, dim: x.scatter(dim, i, s[tuple(slice(0, n) for n in i.shape)]),
     gen_scatter(None), ALL),
  Op("scatter.reduce", lambda x, i, s, dim, reduce: x.scatter(dim, i, s, reduce=reduce),
     lambda x, i, s, dim, reduce: _scatter_reduce_ref(x, dim, i, s, {"add": "sum", "multiply": "prod"}[reduce]), gen_scatter("scatter"), NUMERIC,
     api=("scatter",)),
  Op("scatter_reduce", lambda x, i, s, dim, **k: x.scatter_reduce(dim, i, s, **k), lambda x, i, s, dim, **k: _scatter_reduce_ref(x, dim, i, s, **k),
     gen_scatter("reduce"), NUMERIC, python=True),
  Op("masked_select", lambda x, m: x.masked_select(m), lambda x, m: torch.masked_select(x, m), gen_masked_select, ALL),
  Op("nonzero", lambda x: x.nonzero(), lambda x: torch.nonzero(x), gen_nonzero, ALL, grad=False),
  # ---- nn
  Op("conv2d", lambda x, w, b, **k: x.conv2d(w, b, **k), lambda x, w, b, **k: F.conv2d(x, w, b, **k), gen_conv, FLT, tol=(4, 4),
     why="sums of products in another order", sums=True, python=True),
  Op("conv_transpose2d", lambda x, w, b, **k: x.conv_transpose2d(w, b, **k), lambda x, w, b, **k: F.conv_transpose2d(x, w, b, **k), gen_conv_t, FLT,
     tol=(4, 4), why="sums of products in another order", sums=True),
  Op("avg_pool2d", lambda x, **k: x.avg_pool2d(**k), lambda x, **k: F.avg_pool2d(x, **k), gen_pool(True), FLT, sums=True),
  Op("max_pool2d", lambda x, **k: x.max_pool2d(**k, return_indices=True), lambda x, **k: F.max_pool2d(x, **k, return_indices=True), gen_pool(False),
     FLT, python=True),
  Op("max_unpool2d", lambda x, i, **k: x.max_unpool2d(i, **k), lambda x, i, **k: F.max_unpool2d(x, i, **k), gen_unpool, FLT),
  Op("batchnorm", lambda x, w, b, m, s: x.batchnorm(w, b, m, s), _bn_ref, gen_batchnorm, FLT),
  Op("layernorm", lambda x, axis, eps: x.layernorm(axis, eps),
     lambda x, axis, eps: F.layer_norm(x, x.shape[-(len(axis) if isinstance(axis, tuple) else 1):], eps=eps),
     gen_layernorm, FLT, tol=(4, 4), why="mean and variance summed in another order; a row's rounding is amplified by 1/sqrt(var + eps)",
     python=True, mag=_layernorm_mag),
  Op("dropout", lambda x, p: x.dropout(p), lambda x, p: F.dropout(x, p, training=False), unary(p=S([0.0, 0.5])), FLT),
  Op("one_hot", lambda x, num_classes: x.one_hot(num_classes), lambda x, num_classes: F.one_hot(x.long(), num_classes), gen_one_hot,
     ("int32", "int64", "int8", "uint8"), grad=False),
  Op("scaled_dot_product_attention", lambda q, k, v, m, **kw: q.scaled_dot_product_attention(k, v, m, **kw),
     lambda q, k, v, m, **kw: F.scaled_dot_product_attention(q, k, v, m, **kw), gen_sdpa, FLT, tol=(4, 4),
     why="softmax and two matmuls; gradients are not compared for inputs past 1e18, where the softmax backward cancels products of that size "
     "and both results are rounding error", grad_when=lambda c: not any(np.any(np.abs(a.value[np.isfinite(a.value)]) > 1e18) for a in c.tensors())),
  Op("cross_entropy", lambda x, y, **k: x.cross_entropy(y, **k), lambda x, y, **k: F.cross_entropy(x, y, **k), gen_ce, FLT, tol=(4, 4),
     why="log_softmax and a sum", python=True),
  Op("nll_loss", lambda x, y, w, **k: x.nll_loss(y, w, **k), lambda x, y, w, **k: F.nll_loss(x, y, w, **k), gen_nll, FLT),
  Op("binary_crossentropy", lambda x, y, **k: x.binary_crossentropy(y, **k), lambda x, y, **k: F.binary_cross_entropy(x, y, **k), gen_bce(False),
     FLT),
  Op("binary_crossentropy_logits", lambda x, y, pw, **k: x.binary_crossentropy_logits(y, pos_weight=pw, **k),
     lambda x, y, pw, **k: F.binary_cross_entropy_with_logits(x, y, pos_weight=pw, **k), gen_bce(True), FLT),
  Op("sparse_categorical_crossentropy", lambda x, y, **k: x.sparse_categorical_crossentropy(y, **k), _sparse_ce_ref, gen_sparse_ce, FLT, tol=(4, 4),
     why="log_softmax and a sum"),
  Op("interpolate", lambda x, **k: x.interpolate(**k), _interp_ref, gen_interp, FLOATS + ("uint8",), sums=True),
  # ---- creation and conversion
  Op("arange", lambda start, stop, step, dtype: Tensor.arange(start, stop, step, dtype=dtype, device=_dev()),
     lambda start, stop, step, dtype: torch.arange(start, stop, step, dtype=_tdt(dtype)) if stop is not None
     else torch.arange(start, dtype=_tdt(dtype)),
     lambda d, dt: gen_creation("arange")(d, dt), ("float32", "int32", "int64", "float16"), grad=False, tol=(1, 1)),
  Op("linspace", lambda start, stop, steps, dtype: Tensor.linspace(start, stop, steps, dtype=dtype, device=_dev()),
     lambda start, stop, steps, dtype: torch.linspace(start, stop, steps, dtype=_tdt(dtype)), gen_creation("linspace"),
     ("float32", "float64", "int32"), grad=False),
  Op("eye", lambda n, m, dtype: Tensor.eye(n, m, dtype=dtype, device=_dev()),
     lambda n, m, dtype: torch.eye(n, m if m is not None else n, dtype=_tdt(dtype)),
     gen_creation("eye"), ("float32", "int32", "bool"), grad=False),
  Op("full", lambda shape, fill, dtype: Tensor.full(shape, fill, dtype=dtype, device=_dev()),
     lambda shape, fill, dtype: torch.full(shape, fill, dtype=_tdt(dtype)),
     gen_creation("full"), ("float32", "int32", "bool", "float16"), grad=False),
  Op("zeros", lambda shape, dtype: Tensor.zeros(*shape, dtype=dtype, device=_dev()), lambda shape, dtype: torch.zeros(shape, dtype=_tdt(dtype)),
     gen_creation("zeros"), ("float32", "int8", "bool"), grad=False),
  Op("ones", lambda shape, dtype: Tensor.ones(*shape, dtype=dtype, device=_dev()), lambda shape, dtype: torch.ones(shape, dtype=_tdt(dtype)),
     gen_creation("ones"), ("float32", "int8", "bool"), grad=False),
  Op("empty", lambda shape, dtype: _shape_dtype(Tensor.empty(*shape, dtype=dtype, device=_dev())),
     lambda shape, dtype: _shape_dtype(torch.empty(shape, dtype=_tdt(dtype))),
     gen_creation("empty"), ("float32", "int8", "bool"), grad=False),
  Op("full_like", lambda x, fill, dtype: x.full_like(fill, dtype=dtype), lambda x, fill, dtype: torch.full_like(x, fill, dtype=_tdt(dtype)), gen_like,
     ALL, grad=False),
  Op("zeros_like", lambda x, fill, dtype: x.zeros_like(dtype=dtype), lambda x, fill, dtype: torch.zeros_like(x, dtype=_tdt(dtype)), gen_like, ALL,
     grad=False),
  Op("ones_like", lambda x, fill, dtype: x.ones_like(dtype=dtype), lambda x, fill, dtype: torch.ones_like(x, dtype=_tdt(dtype)), gen_like, ALL,
     grad=False),
  Op("Tensor", lambda data: Tensor(data, device=_dev()), lambda data: torch.tensor(data), gen_from_data, ("float32",), grad=False, api=("Tensor",)),
  Op("meshgrid", lambda *xs, indexing: xs[0].meshgrid(*xs[1:], indexing=indexing), lambda *xs, indexing: torch.meshgrid(*xs, indexing=indexing),
     gen_meshgrid, FLT + ("int32",)),
  Op("cast", lambda x, to: x.cast(to), lambda x, to: x.to(getattr(torch, to)), gen_cast, ALL, api=("cast", "float", "half", "int", "bool"),
     python=True),
  Op("bitcast", lambda x, to: x.bitcast(to), lambda x, to: x.view(getattr(torch, to)), gen_bitcast, NUMERIC, grad=False),
  Op("contiguous", lambda x: x.contiguous(), lambda x: x.contiguous(), unary(), ALL, api=("contiguous", "clone", "detach", "realize", "numpy")),
  Op("clone", lambda x: x.clone(), lambda x: x.clone(), unary(), FLT),
  Op("detach", lambda x: x.detach() * 1, lambda x: x.detach() * 1, unary(), FLT, grad=False),  # gradient through detach: documented GradientError
  Op("tolist", lambda x: np.array(x.tolist()), lambda x: np.array(x.tolist()), unary(), ("float32", "int32", "bool"),
     grad=False,
     api=("tolist", "item")),
]


def _dev() -> str:
  from .harness import DEVICE
  return DEVICE


def _tdt(name: Any) -> Any: return None if name is None else getattr(torch, name)


def _shape_dtype(t: Any) -> Any:
  """`empty` has no defined values: compare its shape and dtype only."""
  return np.zeros(tuple(t.shape), np.int8), str(t.dtype).replace("dtypes.", "").replace("torch.", "")


OPS_BY_NAME = {op.name: op for op in OPS}
assert len(OPS_BY_NAME) == len(OPS), "duplicate op names"

# TENSOR_API.md names with no PyTorch counterpart to compare against, or nothing to compare
_RANDOM = "random streams differ from PyTorch's by design (docs/tensor.md: same seed, other numbers); tests/tensor checks them"
EXCLUDED = {
  "TinyJit": "not a Tensor op (tests/engine/test_jit.py)", "Variable": "not a Tensor op (tests/tensor/test_symbolic_shapes.py)",
  "axis": "a word in the API's prose", "sequential": "composes other ops (tests/tensor/test_sequential.py)",
  "shard": "multi-device tensors have no PyTorch counterpart; tests/tensor/test_shard.py compares them with one device",
  "shrink": "a movement op checked by the conformance suite and the fuzzer",
  "t": "a word in the API's prose",
  **dict.fromkeys(["rand", "randn", "randint", "uniform", "normal", "scaled_uniform", "glorot_uniform", "kaiming_uniform", "kaiming_normal",
                   "manual_seed"], _RANDOM),
  "shape": "compared for every output", "dtype": "compared for every output", "requires_grad": "set on every input whose gradient is compared",
  "gradient": "computes every gradient compared", "backward": "accumulates what gradient() computes; tests/tensor covers it",
  "grad": "set by backward", "device": "device names have no PyTorch counterpart", "to": "one device per run", "to_": "one device per run",
  "schedule": "no PyTorch counterpart",
}
