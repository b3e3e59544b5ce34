"""What the differential tester expects to differ from PyTorch.

ALLOWED: intended differences, each with its reason (documented plugrad behaviour, mostly tinygrad 0.14's). Keep it
short: an entry needs a line in docs/tensor.md (or tinygrad 0.14's behaviour) to point at, and it should say exactly
what plugrad does instead (`ref`, a torch formula of it, or `dtype`), so that anything else still fails.

KNOWN_BUGS: divergences that are plugrad bugs. Each one tolerates only the generated cases its `when` selects, and
only on its `part`; its `repro` runs as a strict xfail, so fixing the bug makes the run fail until the entry is deleted.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .harness import DEVICE, DT, TOL, Allowed, Arg, Case, KnownBug, Py
from .ops import _cum_first

# ---------------------------------------------------------------- helpers for `when` and `ref`


def _int32_for_int64(c: Case, torch_dtype: str) -> str | None: return "int32" if torch_dtype == "int64" else None


def _with_identity(fn: Any, largest: bool) -> Any:
  """max/min where reducing an empty axis gives the identity (-inf or the dtype's minimum for max) instead of raising."""
  def ref(x: Any, axis: Any = None, keepdim: bool = False) -> Any:
    dims = {d % max(x.ndim, 1) for d in (range(x.ndim) if axis is None else (axis,) if isinstance(axis, int) else axis)}
    if x.ndim == 0 or all(x.shape[d] for d in dims): return fn(x, tuple(dims), keepdim)
    if x.dtype.is_floating_point: ident: Any = -torch.inf if largest else torch.inf
    elif x.dtype == torch.bool: ident = not largest
    else: ident = torch.iinfo(x.dtype).min if largest else torch.iinfo(x.dtype).max
    shape = [1 if i in dims else s for i, s in enumerate(x.shape)] if keepdim else [s for i, s in enumerate(x.shape) if i not in dims]
    return torch.full(shape, ident, dtype=x.dtype)
  return ref


def _empty_reduce(c: Case) -> bool: return any(a.value.size == 0 for a in c.tensors())


def _floats(c: Case, i: int | None = None) -> list[np.ndarray]:
  """The numeric arguments of c (all, or the i-th argument only; tensors and Python numbers) as float64 arrays."""
  args = c.args if i is None else [c.args[i]]
  out = []
  for a in args:
    if isinstance(a, Arg) and a.dtype != "bool": out.append(a.value.astype(np.float64))
    elif isinstance(a, Py) and isinstance(a.value, (int, float)) and not isinstance(a.value, bool): out.append(np.array(float(a.value)))
  return out


def _any(c: Case, pred: Any, i: int | None = None) -> bool:
  with np.errstate(invalid="ignore", over="ignore"):
    return any(v.size and bool(np.any(pred(v))) for v in _floats(c, i))


_TRIG = {"float64": 8.0, "float32": 8.0, "float16": 0.5, "bfloat16": 0.5}  # cos(x) = sin(π/2 - x) is off past these |x| (ints: float32)
_TRIG.update(dict.fromkeys(("int8", "int16", "int32", "int64", "uint8", "bool"), 8.0))
def _remainder_inexact(c: Case) -> bool:
  """a/b (exactly, in float64) has more integer digits than the dtype's mantissa holds, or lies within two ulps of an integer
  (rounding it can cross the integer), or overflows the dtype; or _tiny_quotient."""
  (a,), (b,) = _floats(c, 0), _floats(c, 1)
  nmant = {"float64": 52, "float32": 23, "float16": 10, "bfloat16": 7}[c.dtype]
  with np.errstate(all="ignore"):
    q = np.broadcast_to(a, np.broadcast_shapes(a.shape, b.shape)) / b
    ok = np.isfinite(a) & np.isfinite(b) & (b != 0)
    near = (np.abs(q - np.round(q)) <= np.abs(q) * 2.0 ** -nmant * 2) & (q != 0)
    r = np.fmod(a, np.where(b == 0, 1, b))  # |a - trunc(a/b)·b| rounds at ulp(a): off by more than the tolerance allows
    rtol, atol = TOL[c.dtype]
    rounds = np.abs(a) * 2.0 ** -nmant > atol + rtol * np.abs(r)
    return bool(np.any(ok & ((np.abs(q) >= 2.0 ** nmant) | near | (np.abs(q) > _fmax(c)) | rounds))) or _tiny_quotient(c)


def _tiny_quotient(c: Case) -> bool:
  """A finite nonzero a over an infinite b, or a/b below the dtype's smallest denormal (it rounds to ±0)."""
  (a,), (b,) = _floats(c, 0), _floats(c, 1)
  tiny = {"float64": 5e-324, "float32": 1.4e-45, "float16": 6e-8, "bfloat16": 9.2e-41}[c.dtype]
  with np.errstate(all="ignore"):
    a, b = np.broadcast_arrays(a, b)
    under = (a != 0) & np.isfinite(a) & (b != 0) & (np.abs(a / np.where(b == 0, 1, b)) < tiny / 2)
    return bool(np.any(np.isfinite(a) & np.isinf(b)) or np.any(under))


DT_MAX = {"float64": 1.7976931348623157e308, "float32": 3.4028234663852886e38, "float16": 65504.0, "bfloat16": 3.3895313892515355e38}


_SMALL = {"float64": 1e-290, "float32": 1e-30, "float16": 1e-3, "bfloat16": 1e-30}  # products of such factors underflow


def _fmax(c: Case) -> float:
  """The largest finite value of the dtype c computes in (integer inputs of math functions compute in float32)."""
  return DT_MAX.get(c.dtype, DT_MAX["float32"])


def _nonfinite(c: Case, i: int | None = None) -> bool: return _any(c, lambda v: ~np.isfinite(v), i)
def _big(c: Case, limit: float, i: int | None = None) -> bool: return _any(c, lambda v: np.isfinite(v) & (np.abs(v) > limit), i)
def _sdpa_math(q: Any, k: Any, v: Any, m: Any, is_causal: bool = False) -> Any:
  s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
  if is_causal: m = torch.ones(s.shape[-2:], dtype=torch.bool).tril()
  if m is not None: s = s + (torch.where(m, 0.0, -torch.inf).to(s.dtype) if m.dtype == torch.bool else m)
  p = torch.softmax(s, -1)
  if not is_causal or q.dtype not in (torch.float32, torch.float16, torch.bfloat16): return p @ v
  # the fused kernel (FLASH_ATTENTION, the default for these dtypes) never reads the keys of the blocks past a causal
  # row's diagonal: their values (nan or inf included) do not reach the output; the others enter as p·v
  from plugrad.codegen.attention import AttentionShape, causal_keys_read
  from plugrad.device.registry import Device
  L, S = s.shape[-2:]
  sh = AttentionShape(1, 1, L, S, q.shape[-1], v.shape[-1], causal=True)
  read = torch.tensor([[j < causal_keys_read(sh, Device[DEVICE].renderer, i) for j in range(S)] for i in range(L)])
  return (p.unsqueeze(-1) * v.unsqueeze(-3)).where(read.unsqueeze(-1), 0.0).sum(-2)


def T(values: Any, dtype: str, diff: bool = True) -> Arg:
  """A tensor argument of a reproducer."""
  return Arg(np.array(values, dtype=DT[dtype][2]), dtype, diff)


def _conv_padded(x: Any, w: Any, b: Any, groups: int, stride: Any, dilation: Any, padding: Any) -> Any:
  """conv2d of the explicitly zero-padded input."""
  ph, pw = (padding, padding) if isinstance(padding, int) else padding
  return F.conv2d(F.pad(x, (pw, pw, ph, ph)), w, b, groups=groups, stride=stride, dilation=dilation)


def _lcse_loop(x: Any, axis: int) -> Any:
  """logcumsumexp as logsumexp over each prefix, each with the prefix's softmax as its gradient."""
  if x.ndim == 0 or x.shape[axis] == 0: return torch.logcumsumexp(x, axis)
  xt = x.movedim(axis, 0)
  return torch.stack([_lse_softmax_grad(xt[:i + 1], 0) for i in range(xt.shape[0])]).movedim(0, axis)


def _cumprod_loop(x: Any, axis: int) -> Any:
  """cumprod as a chain of multiplications, so that autograd gives the exact gradient."""
  if x.ndim == 0 or x.shape[axis] == 0: return torch.cumprod(x, axis)
  xt = x.movedim(axis, 0)
  outs = [xt[0]]
  for i in range(1, xt.shape[0]): outs.append(outs[-1] * xt[i])
  return torch.stack(outs).movedim(0, axis)


def _scatter_extreme_ref(x: Any, index: Any, src: Any, dim: int, reduce: str, include_self: bool = True) -> Any:
  """scatter_reduce amin/amax written with amin/amax over the candidates of each position, whose gradient is shared
  equally among the tied candidates only."""
  if reduce not in ("amin", "amax") or include_self: return x.scatter_reduce(dim, index, src[tuple(slice(0, s) for s in index.shape)], reduce,
                                                                            include_self=include_self)
  d = dim % x.ndim
  src = src[tuple(slice(0, s) for s in index.shape)]
  xt, it, st = x.movedim(d, -1), index.movedim(d, -1), src.movedim(d, -1)
  n, pre = xt.shape[-1], it.shape[:-1]
  part = xt[tuple(slice(0, p) for p in pre)]
  hit = it.unsqueeze(-2) == torch.arange(n).reshape(n, 1)  # (..., n, k): src k lands on position n
  fill = torch.inf if reduce == "amin" else -torch.inf
  cand = torch.where(hit, st.unsqueeze(-2), torch.tensor(fill, dtype=x.dtype))
  red = cand.amin(-1) if reduce == "amin" else cand.amax(-1)
  out = xt.clone()
  out[tuple(slice(0, p) for p in pre)] = torch.where(hit.any(-1), red, part)
  return out.movedim(-1, d)


def _divisor_ok(c: Case) -> bool:
  x, axis = c.args[0].value, c.kw["axis"]
  axes = range(x.ndim) if axis is None else (axis,) if isinstance(axis, int) else axis
  return (int(np.prod([x.shape[a] for a in axes])) if x.ndim else 1) > c.kw["correction"]


def _var_by_zero(op: str) -> Any:
  """var and friends written out with the numerator in the input dtype, divided by max(0, N - correction)."""
  def ref(x: Any, axis: Any = None, keepdim: bool = False, correction: int = 1) -> Any:
    x = x if x.dtype.is_floating_point else x.float()
    d = _dims(x, axis)
    n = int(np.prod([x.shape[i] for i in ((d,) if isinstance(d, int) else d)])) if x.ndim else 1
    var = ((x - x.mean(d, keepdim=True)) ** 2).sum(d, keepdim=keepdim) / max(0, n - correction)
    out = var.sqrt() if op.startswith("std") else var
    return (out, x.mean(d, keepdim=keepdim)) if op.endswith("_mean") else out
  return ref


def _reduce(x: Any, reduction: str) -> Any: return x.mean() if reduction == "mean" else x.sum() if reduction == "sum" else x


def _dims(x: Any, axis: Any) -> Any: return tuple(range(x.ndim)) if axis is None else axis


def _zero_d(c: Case) -> bool: return any(a.value.ndim == 0 for a in c.tensors())


def _promoted(fn: Any, first: int = 0) -> Any:
  """fn with its tensor arguments from `first` on cast to the dtype PyTorch's promotion gives when none is 0-d."""
  def ref(*xs: Any, **kw: Any) -> Any:
    ts = [x for x in xs[first:] if isinstance(x, torch.Tensor)]
    dt = ts[0].dtype
    for t in ts[1:]: dt = torch.promote_types(dt, t.dtype)
    return fn(*xs[:first], *[x.to(dt) if isinstance(x, torch.Tensor) else x for x in xs[first:]], **kw)
  return ref


class _DivExact(torch.autograd.Function):
  """a / b with the gradient -(a/b)/b for b, which does not under/overflow where a/b² does."""
  @staticmethod
  def forward(ctx: Any, a: Any, b: Any) -> Any:
    ctx.save_for_backward(a, b)
    return a / b

  @staticmethod
  def backward(ctx: Any, g: Any) -> Any:
    a, b = ctx.saved_tensors
    return g / b, -(g * (a / b)) / b


def _div_exact(a: Any, b: Any) -> Any:
  if not isinstance(a, torch.Tensor): a = torch.tensor(a, dtype=b.dtype)
  if not isinstance(b, torch.Tensor): b = torch.tensor(b, dtype=a.dtype)
  a, b = torch.broadcast_tensors(a, b)
  return _DivExact.apply(a, b)


def _lse_softmax_grad(x: Any, axis: Any = None, keepdim: bool = False) -> Any:
  """logsumexp whose gradient is softmax(x) (PyTorch's is exp(x - logsumexp(x)), off where the result rounds)."""
  dims = tuple(range(x.ndim)) if axis is None else axis
  lse = torch.logsumexp(x, dims, keepdim=keepdim)
  p = torch.softmax(x.flatten(), 0).reshape(x.shape) if axis is None else _softmax_over(x, dims)
  lin = ((x - x.detach()) * p.detach()).sum(dims, keepdim=keepdim)
  return lse.detach() + lin


def _softmax_over(x: Any, dims: Any) -> Any:
  dims = (dims,) if isinstance(dims, int) else tuple(dims)
  e = torch.exp(x - torch.amax(x, dims, keepdim=True))
  return e / e.sum(dims, keepdim=True)


def _upcast(x: Any) -> Any: return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _normalize_scaled(x: Any, p: float, dim: int) -> Any:
  """F.normalize with the norm of x/s times s (s = max|x| along dim where it is finite and not 0), in float32 for half."""
  w = _upcast(x)
  a = w.abs()
  s = a.amax(dim, keepdim=True).detach()
  s = torch.where((s > 0) & s.isfinite(), s, torch.ones_like(s))
  return (w / ((a / s).pow(p).sum(dim, keepdim=True).pow(1 / p) * s).clamp_min(1e-12)).to(x.dtype)


def _std_scaled(op: str) -> Any:
  """std (and std_mean) of the deviations divided by a power of two near their largest magnitude, as plugrad computes it."""
  def ref(x: Any, axis: Any = None, keepdim: bool = False, correction: int = 1) -> Any:
    d = _dims(x, axis)
    dev = x - x.mean(d, keepdim=True).detach()
    s = dev.abs().amax(d, keepdim=True).detach()
    s = torch.where((s > 0) & s.isfinite(), torch.exp2(torch.floor(torch.log2(s))), torch.ones_like(s))
    n = int(np.prod([x.shape[i] for i in ((d,) if isinstance(d, int) else d)])) if x.ndim else 1
    out = ((dev / s) ** 2).sum(d, keepdim=True).div(max(0, n - correction)).sqrt() * s
    out = out if keepdim else out.squeeze(d)
    return (out, x.mean(d, keepdim=keepdim)) if op.endswith("_mean") else out
  return ref


def _layernorm_formula(x: Any, axis: Any, eps: float) -> Any:
  """layernorm as plugrad computes it (in float32 for half): y·rsqrt(mean(y²) + eps) with y = x - mean(x)."""
  w, dims = _upcast(x), tuple(range(-(len(axis) if isinstance(axis, tuple) else 1), 0))
  y = w - w.mean(dims, keepdim=True)
  return (y * ((y * y).mean(dims, keepdim=True) + eps).rsqrt()).to(x.dtype)

def _fmod_formula(a: Any, b: Any) -> Any:
  """float64 fmod as plugrad computes it: a - trunc(a/b)·b, a itself for an infinite b."""
  b = torch.as_tensor(b, dtype=a.dtype)
  return torch.where(b.isinf() & a.isfinite(), a, a - torch.trunc(a / b) * b)


def _mod_formula(a: Any, b: Any) -> Any:
  b = torch.as_tensor(b, dtype=a.dtype)
  m = _fmod_formula(a, b)
  return torch.where((m != 0) & ((b < 0) != (m < 0)), m + b, m)


def _quotient_overflows(c: Case) -> bool:
  """Finite a over a finite nonzero b whose quotient is past the dtype's largest finite value."""
  (a,), (b,) = _floats(c, 0), _floats(c, 1)
  with np.errstate(all="ignore"):
    q = np.broadcast_to(a, np.broadcast_shapes(a.shape, b.shape)) / np.where(b == 0, 1, b)
    return bool(np.any(np.isfinite(a) & np.isfinite(b) & (b != 0) & (np.abs(q) > _fmax(c))))


def _clip_selects(x: Any, lo: Any, hi: Any) -> Any:
  """clamp as plugrad builds it, two selects: lo where x < lo, then hi where that is above hi."""
  r = torch.where(x < lo, lo, x)
  return torch.where(r > hi, hi, r)


def _tied_bounds(c: Case) -> bool:
  lo, hi = c.args[1], c.args[2]
  return isinstance(lo, Arg) and isinstance(hi, Arg) and bool(np.any(np.equal(*np.broadcast_arrays(lo.value, hi.value))))


def _conv_transpose_interleaved(x: Any, w: Any, b: Any, groups: int, stride: Any, dilation: Any, padding: Any, output_padding: Any) -> Any:
  """conv_transpose2d as plugrad computes it: conv2d of the zero-interleaved, explicitly padded input with the flipped,
  transposed weight, so that a nan/inf weight meets the interleaved zeros and the padding."""
  s, d = ((v, v) if isinstance(v, int) else tuple(v) for v in (stride, dilation))
  p, op = ((v, v) if isinstance(v, int) else tuple(v) for v in (padding, output_padding))
  n, c, h, wd = x.shape
  xi = x.new_zeros((n, c, (h - 1) * s[0] + 1, (wd - 1) * s[1] + 1))
  xi[:, :, ::s[0], ::s[1]] = x
  kh, kw = w.shape[2:]
  pads = [((k - 1) * dd - pp, (k - 1) * dd - pp + oo) for k, dd, pp, oo in zip((kh, kw), d, p, op)]
  wt = w.reshape(groups, w.shape[0] // groups, w.shape[1], kh, kw).transpose(1, 2).reshape(groups * w.shape[1], w.shape[0] // groups, kh, kw)
  return F.conv2d(F.pad(xi, (*pads[1], *pads[0])), wt.flip(-2, -1), b, groups=groups, dilation=d)


class _BCEClampedTarget(torch.autograd.Function):
  """F.binary_cross_entropy with PyTorch's input gradient, computed in float32 at least (in half 1e-12 is 0), and the
  target's gradient as the derivative of the clamped loss: log(1 - p) and log(p) each clamped at -100."""
  @staticmethod
  def forward(ctx: Any, p: Any, y: Any) -> Any:
    ctx.save_for_backward(p, y)
    return F.binary_cross_entropy(p, y, reduction="none")

  @staticmethod
  def backward(ctx: Any, g: Any) -> Any:
    p, y = ctx.saved_tensors
    w = p.float() if p.dtype in (torch.float16, torch.bfloat16) else p
    gp = (g * (w - y.to(w.dtype)) / (w * (1 - w)).clamp(min=1e-12)).to(p.dtype)
    return gp, g * ((1 - p).log().clamp(min=-100) - p.log().clamp(min=-100))


ALLOWED: list[Allowed] = [
  # ---- dtypes (tinygrad 0.14's, documented in docs/tensor.md)
  *[Allowed(op, "dtype", "indices are int32, as in tinygrad 0.14 (docs/tensor.md: argmax/argmin give int32; sort/topk/cummax "
            "indices, max_pool2d's return_indices, nonzero and one_hot likewise)", dtype=_int32_for_int64)
    for op in ("argmax", "argmin", "sort", "argsort", "topk", "cummax", "cummin", "max_pool2d", "nonzero", "one_hot")],
  *[Allowed(op, "dtype", "integer results default to int32 (dtypes.default_int, tinygrad 0.14; docs/tensor.md); PyTorch's default is int64",
            dtype=_int32_for_int64) for op in ("arange", "full", "Tensor")],
  *[Allowed(op, "dtype", "any/all return bool for every dtype (tinygrad, numpy); PyTorch keeps uint8 for uint8 input (its legacy exception)",
            dtype=lambda c, t: "bool" if t == "uint8" else None) for op in ("any", "all")],
  *[Allowed(op, "value", "a 0-d tensor takes part in dtype promotion like any tensor (tinygrad 0.14, numpy 2; docs/tensor.md 'dtypes and "
            "promotion'); PyTorch lets a 0-d tensor defer to a dimensioned one of the same kind (int64 0-d + int32 → int32, wrapping)",
            ref=_promoted(fn, first), when=_zero_d)
    for op, fn, first in (("add.mixed", lambda a, b: a + b, 0), ("mul.mixed", lambda a, b: a.mul(b), 0), ("maximum.mixed", torch.maximum, 0),
                          ("minimum.mixed", torch.minimum, 0), ("lt.mixed", lambda a, b: a < b, 0), ("where.mixed", torch.where, 1))],
  # ---- values
  Allowed("relu", "value", "relu(nan) is 0, as tinygrad (docs/tensor.md 'Gradients at kinks'); PyTorch gives nan",
          ref=lambda x: torch.where(x > 0, x, torch.zeros_like(x))),
  Allowed("sign", "value", "sign(nan) is nan, as numpy and tinygrad (docs/tensor.md); PyTorch gives 0",
          ref=lambda x: torch.where(x.isnan(), x, torch.sign(x)) if x.dtype.is_floating_point else torch.sign(x)),
  Allowed("selu", "value", "selu's defaults are tinygrad 0.14's rounded constants alpha=1.67326, gamma=1.0507 (docs/tensor.md); "
          "F.selu's differ by ~2e-6", ref=lambda x: 1.0507 * torch.where(x > 0, x, 1.67326 * torch.expm1(x.clamp(max=0)))),
  Allowed("max", "raises", "reducing an empty axis gives the identity (-inf / the dtype's minimum) instead of raising (docs/tensor.md "
          "Reductions)", ref=_with_identity(lambda x, d, k: torch.amax(x, d, keepdim=k), True), when=_empty_reduce),
  Allowed("min", "raises", "reducing an empty axis gives the identity (+inf / the dtype's maximum) instead of raising (docs/tensor.md "
          "Reductions)", ref=_with_identity(lambda x, d, k: torch.amin(x, d, keepdim=k), False), when=_empty_reduce),
  Allowed("cummax", "value", "the index is the first position where the running maximum was reached, as in tinygrad 0.14 (PyTorch "
          "gives the last of equal values)", ref=lambda x, axis: _cum_first(x, axis, True)),
  Allowed("cummin", "value", "the index is the first position where the running minimum was reached, as in tinygrad 0.14 (PyTorch "
          "gives the last of equal values)", ref=lambda x, axis: _cum_first(x, axis, False)),
  Allowed("scaled_dot_product_attention", "value", "plugrad computes the documented formula softmax(q·kᵀ/√E + mask)·v, so a nan or "
          "inf score makes its row nan (IEEE); PyTorch's fused CPU kernel gives 0 for such a row. The fused kernel skips the key blocks "
          "past a causal row's diagonal, so a nan or inf value there does not reach that row (docs/optimizer.md)", ref=_sdpa_math, when=_nonfinite),
  Allowed("pad", "dtype", "a Python int pad value promotes a bool tensor to int32 like any int scalar operand (docs/tensor.md 'dtypes and "
          "promotion', tinygrad 0.14); PyTorch keeps bool", ref=lambda x, padding, mode, value=None: F.pad(x.to(torch.int32), padding, mode, value),
          when=lambda c: c.dtype == "bool" and type(c.kw.get("value")) is int),
  Allowed("conv2d", "value", "with a nan/inf weight, the zero padding times that weight is nan (padding is zeros in the input by "
          "definition, and PyTorch's reference path gives the same); PyTorch's mkldnn path leaves the padding out of the products",
          ref=_conv_padded, when=lambda c: _nonfinite(c, 1) and c.kw["padding"] != 0),
  Allowed("div", "grad", "the gradient of a/b for b is -(a/b)/b, finite where PyTorch's -a/b² underflows b² to 0 (float64 "
          "a=-1e-310, b=3.9e-166: PyTorch -inf)", ref=_div_exact, when=lambda c: _any(c, lambda v: (v != 0) & (np.abs(v) < 1e-19), 1)),
  *[Allowed(op, "value", "the results are var/std and mean computed apart, as torch.var and torch.mean give them: with an infinite input "
            "the mean is ±inf (PyTorch's fused var_mean/std_mean, Welford's algorithm, give nan)",
            ref=lambda x, axis=None, keepdim=False, correction=1, _f=f: _f(x, axis, keepdim, correction), when=_nonfinite)
    for op, f in (("var_mean", lambda x, a, k, c: (torch.var(x, _dims(x, a), keepdim=k, correction=c), torch.mean(x, _dims(x, a), keepdim=k))),
                  ("std_mean", lambda x, a, k, c: (torch.std(x, _dims(x, a), keepdim=k, correction=c), torch.mean(x, _dims(x, a), keepdim=k))))],
  Allowed("logsumexp", "grad", "the gradient is softmax(x); PyTorch's exp(x - logsumexp(x)) is off where the result rounds (two equal "
          "maxima of 1e38: PyTorch 1 each, plugrad 0.5)", ref=_lse_softmax_grad, when=lambda c: _big(c, 1e6)),
  *[Allowed(op, "value", "where N - correction <= 0 the variance divides by 0; plugrad's numerator is formed in the input dtype, so it "
            "is nan (0/0) where the squares underflow and PyTorch's inf (docs/tensor.md: var divides by max(0, N - correction))",
            ref=_var_by_zero(op), when=lambda c: not _divisor_ok(c)) for op in ("var", "std", "var_mean", "std_mean")],
  Allowed("binary_crossentropy_logits", "value", "at ±inf logits the loss is its limit (inf or 0), from logsigmoid; PyTorch's "
          "(1 - y)·x + max(-x, 0) + ... gives nan there, and cancels to 0 for huge logits (y = 5e-28, x = -1e38: 0, plugrad 5.4e10)",
          ref=lambda x, y, pw, reduction="mean": _reduce(-(y * F.logsigmoid(x) * (1 if pw is None else pw) + (1 - y) * F.logsigmoid(-x)), reduction),
          when=lambda c: _nonfinite(c, 0) or _big(c, 1e15, 0)),
  Allowed("hardsigmoid", "grad", "PyTorch's float64 hardsigmoid backward uses a float32 1/6 (off by 3e-8); plugrad's is exact",
          ref=lambda x: torch.where((x > -3) & (x < 3), x / 6 + 0.5, F.hardsigmoid(x)), when=lambda c: c.dtype == "float64"),
  Allowed("gelu.none", "value", "gelu(±inf) is its limit (inf, 0); PyTorch's erf form gives nan there",
          ref=lambda x: torch.where(x.isinf(), torch.where(x > 0, x, torch.zeros_like(x)), F.gelu(x)), when=lambda c: _any(c, np.isinf)),
  Allowed("arange", "value", "an integer dtype= with float bounds truncates the float values start + i·step (docs/tensor.md 'Creating "
          "tensors'); PyTorch casts the bounds first",
          ref=lambda start, stop, step, dtype: torch.arange(start, stop, step, dtype=torch.float64).to(getattr(torch, dtype)),
          when=lambda c: c.kw["dtype"] in ("int32", "int64") and any(isinstance(c.kw[k], float) for k in ("start", "stop", "step"))),
  Allowed("logcumsumexp", "grad", "PyTorch's logcumsumexp backward loses the gradient of huge inputs (0 for 3e38, in float64 too); "
          "plugrad's is the softmax of each prefix, as the gradient of logsumexp over the prefixes written out", ref=_lcse_loop,
          when=lambda c: _big(c, 1e20)),
  Allowed("cumprod", "grad", "PyTorch's cumprod backward divides by the input where it is not 0, which is wrong for denormal inputs "
          "(1/x overflows); plugrad's is the product of the other factors, the gradient of the product written out", ref=_cumprod_loop,
          when=lambda c: _any(c, lambda v: (v != 0) & (np.abs(v) < _SMALL[c.dtype]))),
  Allowed("scatter_reduce", "grad", "amin/amax with include_self=False: PyTorch counts self among the values tied with the result although "
          "self is left out (each src gets 1/3 instead of 1/2 and the gradients sum to less than the output's); plugrad shares it among "
          "the src values that reached the result", ref=_scatter_extreme_ref,
          when=lambda c: c.kw["reduce"] in ("amin", "amax") and not c.kw["include_self"]),
  Allowed("normalize", "value", "the p-norm is s·||x/s||_p with s a power of two near max|x| (docs/tensor.md 'Half precision and "
          "overflow'), so it is finite where |x|^p overflows the dtype: float64 [[1e300, 1, 2]] with p=3 normalizes to [1, 1e-300, "
          "2e-300]; PyTorch's |x|^p overflows and it gives 0", ref=lambda x, p, dim: _normalize_scaled(x, p, dim),
          when=lambda c: _big(c, _fmax(c) ** (1 / c.kw["p"]) * 0.9)),
  *[Allowed(op, "value", "std scales the deviations by a power of two near their largest magnitude before squaring (docs/tensor.md "
            "'Half precision and overflow'), so it is finite where the variance overflows: float64 std([1e300, 2, -0.8], correction=2) "
            "is 8.2e299; PyTorch's float64 variance overflows to inf (its float32 std is right: it accumulates in float64)",
            ref=_std_scaled(op), when=lambda c: _big(c, _fmax(c) ** 0.5 / 4)) for op in ("std", "std_mean")],
  Allowed("layernorm", "value", "a row whose squared deviations overflow float32 (|x - mean| >= 1.8e19; bfloat16 computes in float32) "
          "normalizes to 0 (y·rsqrt(inf)), PyTorch's to nan: neither is the normalized row, which would take a second pass over every "
          "row (a maximum to scale by) and 2-3x the time of every layernorm (4096x384 float32 on the CPU: 4.5 -> 13.4 ms)",
          ref=lambda x, axis, eps: _layernorm_formula(x, axis, eps), when=lambda c: c.dtype != "float16" and _big(c, 1e18)),
  *[Allowed(op, "value", "where a/b overflows the dtype, PyTorch's vectorized CPU kernel (tensors of 8 or more elements) gives nan; "
            "its scalar path, C's fmod and plugrad give the exact remainder (float32 fmod(2, 1e-40) = 1.69e-41)",
            ref=lambda a, b, _f=f: _f(a.double(), b.double() if isinstance(b, torch.Tensor) else b).to(a.dtype),
            when=lambda c: c.dtype != "float64" and _quotient_overflows(c)) for op, f in (("fmod", torch.fmod), ("mod", torch.remainder))],
  *[Allowed(op, "value", "float64 fmod/mod are a - trunc(a/b)·b in float64 (docs/tensor.md 'Arithmetic semantics'): rounded where "
            "a/b has more than 53 bits or lies within an ulp of an integer (fmod(1e300, 3)); PyTorch's remainder is exact. Float32 and "
            "narrower are exact; an exact float64 remainder would take ~190 steps of 64-bit integer division per element",
            ref=f, when=lambda c: c.dtype == "float64" and _remainder_inexact(c)) for op, f in (("fmod", _fmod_formula), ("mod", _mod_formula))],
  Allowed("clip", "grad", "with tensor bounds min == max and x below them the gradient goes to min, which the result equals "
          "(docs/tensor.md 'Gradients at kinks'); PyTorch's clamp backward gives it to neither bound (its tests min < max and "
          "max < min both fail), so d(result) is lost. x=[-2.6], min=[0], max=[0]: plugrad 1 to min, PyTorch 0 everywhere",
          ref=_clip_selects, when=lambda c: _tied_bounds(c)),
  Allowed("conv_transpose2d", "value", "conv_transpose2d is a conv2d of the zero-interleaved input (docs/tensor.md): with a nan/inf "
          "weight, the interleaved zeros and the padding times that weight are nan, as conv2d's padding (above); leaving those "
          "products out made every conv_transpose2d 1.6x slower (8x64x32x32, 4x4 kernel, stride 2: 164 vs 100 ms)",
          ref=_conv_transpose_interleaved, when=lambda c: _nonfinite(c, 1) or _nonfinite(c, 0)),
  Allowed("binary_crossentropy", "grad", "the target's gradient where p(1 - p) < 1e-12 is the derivative of the loss as computed, "
          "with both logs clamped at -100 (±100 at p = 0 or 1); PyTorch's is the unclamped log(1 - p) - log(p), ±inf there. "
          "The input's gradient is PyTorch's (p - y)/max(p(1 - p), 1e-12) (docs/tensor.md 'Gradients at singular points')",
          ref=lambda x, y, reduction="mean": _reduce(_BCEClampedTarget.apply(x, y), reduction),
          when=lambda c: c.args[1].diff and _any(c, lambda v: v * (1 - v) < 1e-12, 0)),
]

KNOWN_BUGS: list[KnownBug] = [
  # ---- gradients
  # ---- values
]
