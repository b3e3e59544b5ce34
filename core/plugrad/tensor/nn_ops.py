"""Neural-network Tensor methods (activations, convolutions, pooling, normalization, losses, attention, einsum),
built only from the public Tensor methods so that autograd and the scheduler see ordinary graphs.

Convolutions and pooling are a padded, strided window view (`indexing.pool`: movement ops only) times the weight,
summed: the scheduler turns the view into index arithmetic, so no im2col buffer is written.

The methods are plain functions taking the tensor first, bound as methods by `NNMixin` at the bottom.
"""
from __future__ import annotations

import math
import string
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np

from plugrad.dtype import DTypeLike, dtypes, least_upper_dtype, least_upper_float, sum_acc_dtype, to_dtype
from plugrad.gradient import Grads, chain_gradient, register_node_gradient
from plugrad.helpers import argsort, prod
from plugrad.tensor.attention import fused_attention
from plugrad.tensor.helpers import ArgumentError, in_float32, ints, pow2_scale, tensor_cls
from plugrad.tensor.indexing import gather_axis, make_tuple, one_hot_last, pad_constant, pad_pairs, pool, resolve_dim
from plugrad.uop.ops import Ops, UOp
from plugrad.uop.shape import ShapeError, fmt

if TYPE_CHECKING:
  from plugrad.tensor.tensor import Tensor

Reduction = Literal["mean", "sum", "none"]


def _reduce(x: Tensor, reduction: str) -> Tensor:
  if reduction == "none": return x
  if reduction == "sum": return x.sum()
  if reduction == "mean": return x.mean()
  raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _nonpos(x: Tensor) -> Tensor:
  """min(x, 0) whose gradient is 1 at 0 (the negative branch of elu-like functions is taken at 0)."""
  return (x > 0).where(0, x)


def _axes(axis: int | Sequence[int], ndim: int, op: str) -> tuple[int, ...]:
  return tuple(resolve_dim(a, ndim, op) for a in ((axis,) if isinstance(axis, int) else axis))


# ---------------------------------------------------------------- activations

def relu(self: Tensor) -> Tensor:
  """max(x, 0), with gradient 0 at 0."""
  return (self > 0).where(self, 0)


def relu6(self: Tensor) -> Tensor: return self.hardtanh(0, 6)
def leaky_relu(self: Tensor, neg_slope: float = 0.01) -> Tensor: return (self > 0).where(self, self * neg_slope)  # the slope at 0, as PyTorch


def elu(self: Tensor, alpha: float = 1.0) -> Tensor:
  # exp only of the non-positive part: no overflow (and no inf*0 in the gradient) for large x
  return (self > 0).where(self, alpha * (_nonpos(self).exp() - 1))


def celu(self: Tensor, alpha: float = 1.0) -> Tensor: return (self > 0).where(self, alpha * ((_nonpos(self) / alpha).exp() - 1))


def selu(self: Tensor, alpha: float = 1.67326, gamma: float = 1.0507) -> Tensor:
  return gamma * (self > 0).where(self, alpha * (_nonpos(self).exp() - 1))  # the negative side at 0, as PyTorch


@in_float32  # half: x³ and the x² of the gradient overflow from |x| = 40 and 256
def gelu(self: Tensor, approximate: str = "tanh") -> Tensor:
  """GELU; `approximate='tanh'` (tinygrad's default) or `'none'` (the erf form)."""
  if approximate == "tanh": return 0.5 * self * (1 + (math.sqrt(2 / math.pi) * (self + 0.044715 * self * self * self)).tanh())
  if approximate == "none": return 0.5 * self * (1 + (self * (1 / math.sqrt(2))).erf())
  raise ValueError(f"gelu: approximate must be 'tanh' or 'none', got {approximate!r}")


def quick_gelu(self: Tensor) -> Tensor: return self * (self * 1.702).sigmoid()
def silu(self: Tensor) -> Tensor: return self * self.sigmoid()
def swish(self: Tensor) -> Tensor: return self * self.sigmoid()


def sigmoid(self: Tensor) -> Tensor:
  """1 / (1 + exp(-x)), from exp(-|x|) so that neither the value nor its gradient overflows."""
  neg = self >= 0
  e = neg.where(-self, self).exp()  # exp(-|x|) in (0, 1]
  r = 1 / (1 + e)
  return neg.where(r, e * r)


def hardsigmoid(self: Tensor, alpha: float = 1 / 6, beta: float = 0.5) -> Tensor:
  return (alpha * self + beta).hardtanh(0, 1)


def logsigmoid(self: Tensor) -> Tensor: return -(-self).softplus()
@in_float32  # half: x·relu6(x + 3) overflows from x = 10923
def hardswish(self: Tensor) -> Tensor:
  # the bounds tested on x, not on x + 3: one ulp below 3, x + 3 rounds to 6 but the slope is PyTorch's (2x + 3)/6. The
  # middle formula sees only its own inputs (no inf·0 in its gradient at ±inf); x·0 below -3 is PyTorch's nan at -inf
  lo, hi = self <= -3, self >= 3
  xm = (lo | hi).where(0.0, self)
  return lo.where(self * 0, hi.where(self, xm * (xm + 3) * (1 / 6)))
def hardtanh(self: Tensor, min_val: float = -1, max_val: float = 1) -> Tensor:
  """x clipped to [min_val, max_val], with PyTorch's gradient: 0 at the bounds (clip passes it there); nan stays nan."""
  return (self <= min_val).where(min_val, (self >= max_val).where(max_val, self))


def softplus(self: Tensor, beta: float = 1.0) -> Tensor:
  """log(1 + exp(beta*x)) / beta, as max(x, 0) + log(1 + exp(-|y|))/beta with y = beta*x: stable for large |y|, and x
  itself where y overflows the dtype (max(y, 0)/beta would be inf)."""
  y = self * beta
  pos = y >= 0
  return pos.where(self, 0) + (1 + pos.where(-y, y).exp()).log() * (1 / beta)


def softsign(self: Tensor) -> Tensor: return self / (1 + self.abs())
@in_float32  # half: softplus of x < -1 keeps few digits in half, and mish multiplies its error by x
def mish(self: Tensor) -> Tensor:
  # past 20, tanh(softplus(x)) is 1 in float32 and float64: mish is x, gradient 1 (x·tanh' overflowed to inf·0 at 3e38)
  big = self > 20
  return big.where(self, self * big.where(0.0, self).softplus().tanh())


def _shifted(self: Tensor, axis: int, dtype: DTypeLike | None) -> Tensor:
  resolve_dim(axis, self.ndim, "softmax")
  x = self if dtypes.is_float(self.dtype) else self.cast(least_upper_float(self.dtype))
  m = x - x.max(axis, keepdim=True).detach()  # the shift cancels in the result: no gradient through it
  return m.cast(to_dtype(dtype)) if dtype is not None else m


def softmax(self: Tensor, axis: int = -1, dtype: DTypeLike | None = None) -> Tensor:
  e = _shifted(self, axis, dtype).exp()
  return e / e.sum(axis, keepdim=True)


def softmin(self: Tensor, axis: int = -1, dtype: DTypeLike | None = None) -> Tensor: return (-self).softmax(axis, dtype)


def log_softmax(self: Tensor, axis: int = -1, dtype: DTypeLike | None = None) -> Tensor:
  m = _shifted(self, axis, dtype)
  return m - m.exp().sum(axis, keepdim=True).log()


@in_float32  # half: eps=1e-12 is 0 in half, and |x|^p underflows or overflows it
def normalize(self: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
  """self / max(||self||_p over dim, eps). The norm is s·||self/s||_p with s a power of two near max|self| (exact):
  |x|^p neither overflows (float32 |x| >= 1.8e19 at p=2) nor underflows."""
  resolve_dim(dim, self.ndim, "normalize")
  if p == 0: norm = self.ne(0).sum(dim, keepdim=True)
  else:
    a = self.abs()
    s = pow2_scale(a.max(dim, keepdim=True).detach())
    t = (a / s).pow(p).sum(dim, keepdim=True)
    # a slice of zeros: pow(0, 1/p) has an infinite derivative, which maximum's 0 below would meet as nan; PyTorch's
    # gradient there is x-independent (1/eps), so the norm's path carries nothing
    zero = t.eq(0)
    norm = zero.where(0.0, zero.where(1.0, t).pow(1 / p) * s)
  return self / norm.maximum(eps)


# ---------------------------------------------------------------- convolution and pooling

def conv2d(self: Tensor, weight: Tensor, bias: Tensor | None = None, groups: int = 1, stride: int | Sequence[int] = 1,
           dilation: int | Sequence[int] = 1, padding: int | Sequence[int] = 0, dtype: DTypeLike | None = None) -> Tensor:
  """Convolution of (N, Cin, *spatial) with weight (Cout, Cin/groups, *kernel), any number of spatial dims.
  `padding`: an int, one int per spatial dim, or 2 per dim in F.pad order (last dim first); negative cuts."""
  if weight.ndim < 3 or self.ndim != weight.ndim:
    raise ShapeError(f"conv2d: input {fmt(self.shape)} and weight {fmt(weight.shape)} must be (N, C, *spatial) and (Cout, C/groups, *kernel)")
  (bs, cin_), (cout, cin), HW = self.shape[:2], weight.shape[:2], ints(weight.shape[2:], "conv2d")
  if not isinstance(groups, int) or groups < 1: raise ValueError(f"conv2d: groups must be a positive int, got {groups!r}")
  if cin * groups != cin_ or cout % groups:
    raise ShapeError(f"conv2d: input {fmt(self.shape)} has {cin_} channels but weight {fmt(weight.shape)} with groups={groups} "
                     f"needs {cin * groups} (and Cout divisible by groups)")
  if bias is not None and bias.shape != (cout,):
    raise ShapeError(f"conv2d: bias {fmt(bias.shape)} must be ({cout},) for weight {fmt(weight.shape)}")
  nk = len(HW)
  x = pool(pad_constant(self, pad_pairs(padding, nk)), HW, stride, dilation)  # (bs, cin_, *o, *k)
  oyx, rcout = x.shape[2:2 + nk], cout // groups
  x = x.reshape(bs, groups, 1, cin, *oyx, *HW)
  w = weight.reshape(1, groups, rcout, cin, *(1,) * nk, *HW)
  axes, out = (3, *range(4 + nk, 4 + 2 * nk)), to_dtype(dtype) if dtype is not None else least_upper_dtype(x.dtype, w.dtype)
  if dtypes.is_float(out):  # products formed in the accumulation dtype (float32 for half) and rounded once, as Tensor.dot
    summed = (x.cast(acc := sum_acc_dtype(out)) * w.cast(acc)).sum(axes)
    if all(s == 1 for s in make_tuple(stride, nk, "stride")) and prod(HW) > 1 and rcout > 1:
      _input_gradient_by_transposed_conv(summed, self, weight, groups, dilation, padding)
    ret = summed.cast(out).reshape(bs, cout, *oyx)
  else: ret = (x * w).sum(axes, dtype=dtype if dtype is not None else sum_acc_dtype(out)).reshape(bs, cout, *oyx)  # ints as tinygrad
  return ret if bias is None else ret + bias.reshape(1, cout, *(1,) * nk)


def _input_gradient_by_transposed_conv(summed: Tensor, x: Tensor, weight: Tensor, groups: int, dilation: Any, padding: Any) -> None:
  """Differentiate a stride-1 conv (`summed`: its sum of window products) to its input as a transposed conv of the
  output gradient, which runs as the forward conv's kernels. Op by op, the gradient of the windows is their sum over
  the output channels, written to a buffer k·k times the input's size (the window fold's), then folded: at ResNet-18's
  3x3 convs, batch 8, 1.3-2x the time. Strided convs keep the fold (a transposed conv would multiply s·s zeros), and so
  do 1x1 convs and depthwise ones (no such buffer). The weight's gradient stays the op rules' own."""
  red = summed.uop
  while red.op is Ops.RESHAPE: red = red.src[0]
  if red.op is not Ops.REDUCE_AXIS or red.arg[0] is not Ops.ADD or red.src[0].op is not Ops.MUL: return
  w_side, w_uop = red.src[0].src[1], weight.uop
  u = w_side
  while u is not w_uop:  # the weight's side of the product: movement ops and casts down to the weight
    if len(u.src) != 1: return
    u = u.src[0]
  T, bs, cout, o_, x_dtype = type(x), x.shape[0], weight.shape[0], summed.shape[3:], x.dtype
  def rule(node: UOp, g: UOp) -> Grads:
    mul = node.src[0]
    g_mul = chain_gradient(node, g, mul)
    dw = chain_gradient(mul.src[1], g_mul.alu(Ops.MUL, mul.src[0]), w_uop)
    dy = T._wrap(g.reshape((bs, cout, *o_)))
    dx = dy.conv_transpose2d(T._wrap(w_uop), groups=groups, dilation=dilation, padding=padding).cast(x_dtype)
    return (dx.uop, dw)
  register_node_gradient(red, (x.uop, w_uop), rule)


def conv_transpose2d(self: Tensor, weight: Tensor, bias: Tensor | None = None, groups: int = 1, stride: int | Sequence[int] = 1,
                     dilation: int | Sequence[int] = 1, padding: int | Sequence[int] = 0, output_padding: int | Sequence[int] = 0) -> Tensor:
  """Transposed convolution of (N, Cin, *spatial) with weight (Cin, Cout/groups, *kernel): a conv2d of the
  zero-interleaved input with the flipped, transposed weight."""
  if weight.ndim < 3 or self.ndim != weight.ndim:
    raise ShapeError(f"conv_transpose2d: input {fmt(self.shape)} and weight {fmt(weight.shape)} must be (N, Cin, *spatial) "
                     "and (Cin, Cout/groups, *kernel)")
  HW, nk = ints(weight.shape[2:], "conv_transpose2d"), weight.ndim - 2
  if not isinstance(groups, int) or groups < 1 or weight.shape[0] % groups:
    raise ValueError(f"conv_transpose2d: groups={groups!r} must be a positive int dividing weight's {weight.shape[0]} input channels")
  if self.shape[1] != weight.shape[0]:
    raise ShapeError(f"conv_transpose2d: input {fmt(self.shape)} has {self.shape[1]} channels, "
                     f"weight {fmt(weight.shape)} expects {weight.shape[0]}")
  s_, d_, op_ = (make_tuple(v, nk, n) for v, n in ((stride, "stride"), (dilation, "dilation"), (output_padding, "output_padding")))
  if any(o >= max(s, d) or o < 0 for o, s, d in zip(op_, s_, d_)):
    raise ValueError(f"conv_transpose2d: output_padding {op_} must be >= 0 and smaller than stride {s_} or dilation {d_}")
  w = weight.reshape(groups, weight.shape[0] // groups, *weight.shape[1:]).transpose(1, 2).flip(tuple(range(3, 3 + nk)))
  w = w.reshape(groups * weight.shape[1], weight.shape[0] // groups, *HW)
  x = self
  if any(s > 1 for s in s_):  # put s-1 zeros between input elements
    (bs, c), sp = x.shape[:2], x.shape[2:]
    x = x.reshape(bs, c, *[v for n in sp for v in (n, 1)]).pad(((0, 0), (0, 0)) + tuple(p for s in s_ for p in ((0, 0), (0, s - 1))))
    x = x.reshape(bs, c, *[n * s for n, s in zip(sp, s_)]).shrink(((0, bs), (0, c)) + tuple((0, (n - 1) * s + 1) for n, s in zip(sp, s_)))
  pads = [((k - 1) * d - b, (k - 1) * d - a + o) for k, d, (b, a), o in zip(HW, d_, pad_pairs(padding, nk), op_)]
  return x.conv2d(w, bias, groups=groups, dilation=d_, padding=[p for pair in pads[::-1] for p in pair])


def _pool_setup(self: Tensor, kernel_size: int | Sequence[int], stride: Any, dilation: Any, padding: Any, ceil_mode: bool,
                op: str) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[tuple[int, int], ...], list[tuple[int, int]]]:
  k_ = make_tuple(kernel_size, 2, "kernel_size") if isinstance(kernel_size, int) else tuple(kernel_size)
  nk = len(k_)
  if self.ndim < nk: raise ShapeError(f"{op}: input {fmt(self.shape)} has fewer dims than the kernel {k_}")
  s_ = k_ if stride is None else make_tuple(stride, nk, "stride")
  d_ = make_tuple(dilation, nk, "dilation")
  reg = pad_pairs(padding, nk)
  if any(2 * max(b, a) > k for (b, a), k in zip(reg, k_)):
    raise ValueError(f"{op}: padding {padding} must be at most half the kernel size {k_}")
  pads = list(reg)
  if ceil_mode:  # extra padding after, so that a last partial window (starting inside input or left padding) counts
    for j, (i, k, s, d, (b, a)) in enumerate(zip(ints(self.shape[-nk:], op), k_, s_, d_, reg)):
      span = i + b + a - d * (k - 1) - 1
      o = -(-span // s) + 1
      if (o - 1) * s >= i + b: o -= 1
      pads[j] = (b, a + max(0, (o - 1) * s + d * (k - 1) + 1 - (i + b + a)))
  return k_, s_, d_, reg, pads


def avg_pool2d(self: Tensor, kernel_size: int | Sequence[int] = (2, 2), stride: Any = None, dilation: Any = 1,
               padding: int | Sequence[int] = 0, ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:
  """Average over windows of the last len(kernel_size) dims. The divisor counts zero padding when
  `count_include_pad`, never the extra positions ceil_mode adds (as in PyTorch)."""
  T = tensor_cls()
  k_, s_, d_, reg, pads = _pool_setup(self, kernel_size, stride, dilation, padding, ceil_mode, "avg_pool2d")
  axes = tuple(range(-len(k_), 0))
  total = pool(pad_constant(self, pads), k_, s_, d_).sum(axes)
  if count_include_pad and pads == list(reg): return total / prod(k_)
  ones = T.ones(self.shape[-len(k_):], dtype=dtypes.float32, device=self.device, buffer=False)
  if count_include_pad:  # the regular padding counts, the ceil_mode extension does not
    ones, pads = pad_constant(ones, reg, 1.0), [(0, a - ra) for (_, a), (_, ra) in zip(pads, reg)]
  count = pool(pad_constant(ones, pads), k_, s_, d_).sum(axes)
  return total / count.cast(total.dtype) if dtypes.is_float(total.dtype) else total / count


def max_pool2d(self: Tensor, kernel_size: int | Sequence[int] = (2, 2), stride: Any = None, dilation: Any = 1,
               padding: int | Sequence[int] = 0, ceil_mode: bool = False, return_indices: bool = False) -> Tensor | tuple[Tensor, Tensor]:
  """Max over windows of the last len(kernel_size) dims; with `return_indices`, also the flat index (int32) of
  the first maximum of each window within the spatial dims (what max_unpool2d takes)."""
  T = tensor_cls()
  k_, s_, d_, _, pads = _pool_setup(self, kernel_size, stride, dilation, padding, ceil_mode, "max_pool2d")
  axes = tuple(range(-len(k_), 0))
  windows = pool(pad_constant(self, pads, dtypes.min(self.dtype)), k_, s_, d_)
  out = windows.max(axes)
  if not return_indices: return out
  sp = self.shape[-len(k_):]
  n = prod(sp)
  # n - flat index, so that the largest value marks the first maximum; padding gets 0 (never chosen)
  rev = pool(pad_constant(T.arange(n, 0, -1, dtype=dtypes.int32, device=self.device).reshape(sp), pads, 0), k_, s_, d_)
  hit = windows.eq(out.reshape(*out.shape, *(1,) * len(k_)))
  first = n - hit.where(rev, 0).max(axes)
  if not dtypes.is_float(self.dtype): return out, first.detach()
  # a window holding nan: the index of its last nan, as PyTorch (each nan replaces the maximum so far)
  last_nan = windows.isnan().where(n - rev, -1).max(axes)
  return out, out.isnan().where(last_nan, first).detach()


def max_unpool2d(self: Tensor, indices: Tensor, kernel_size: int | Sequence[int] = (2, 2), stride: Any = None, dilation: Any = 1,
                 padding: int | Sequence[int] = 0, output_size: Sequence[int] | None = None) -> Tensor:
  """Scatter pooled values back to the positions max_pool2d's `indices` name; everything else is 0."""
  k_ = make_tuple(kernel_size, 2, "kernel_size") if isinstance(kernel_size, int) else tuple(kernel_size)
  nk = len(k_)
  if self.shape != indices.shape: raise ShapeError(f"max_unpool2d: values {fmt(self.shape)} and indices {fmt(indices.shape)} differ")
  if self.ndim < nk: raise ShapeError(f"max_unpool2d: input {fmt(self.shape)} has fewer dims than the kernel {k_}")
  pre, sp = self.shape[:-nk], self.shape[-nk:]
  if output_size is None:
    s_ = k_ if stride is None else make_tuple(stride, nk, "stride")
    d_ = make_tuple(dilation, nk, "dilation")
    out_sp = tuple((i - 1) * s - b - a + d * (k - 1) + 1 for i, k, s, d, (b, a) in zip(sp, k_, s_, d_, pad_pairs(padding, nk)))
  else: out_sp = tuple(output_size)[-nk:]
  n_in, n_out = prod(sp), prod(out_sp)
  hit = one_hot_last(indices.reshape(*pre, n_in), n_out).transpose(-1, -2)  # (*pre, n_out, n_in)
  return hit.where(self.reshape(*pre, 1, n_in), 0).sum(-1, dtype=self.dtype).reshape(*pre, *out_sp)


# ---------------------------------------------------------------- normalization, dropout, attention

def batchnorm(self: Tensor, weight: Tensor | None, bias: Tensor | None, mean: Tensor, invstd: Tensor,
              axis: int | tuple[int, ...] = 1) -> Tensor:
  """(x - mean) * weight * invstd + bias, the per-channel tensors laid along `axis`."""
  ax = _axes(axis, self.ndim, "batchnorm")
  shape = tuple(s if d in ax else 1 for d, s in enumerate(self.shape))
  per = tuple(self.shape[d] for d in ax)
  for name, t in (("weight", weight), ("bias", bias), ("mean", mean)):
    if t is not None and t.shape != per and prod(t.shape) != prod(per):
      raise ShapeError(f"batchnorm: {name} {fmt(t.shape)} does not match the {per} channels of input {fmt(self.shape)} along axis {ax}")
  x = self - mean.reshape(shape)
  if weight is not None: x = x * weight.reshape(shape)
  x = x * (invstd.reshape(shape) if invstd.ndim == len(ax) else invstd)
  return x + bias.reshape(shape) if bias is not None else x


@in_float32  # half: (x - mean)² overflows from 256, and the backward's (var + eps)^-1.5 ≈ 1.6e7 at var = 0
def layernorm(self: Tensor, axis: int | tuple[int, ...] = -1, eps: float = 1e-5) -> Tensor:
  """(x - mean) / sqrt(var + eps) over `axis` (no affine part; nn.LayerNorm adds it)."""
  ax = _axes(axis, self.ndim, "layernorm")
  y = self - self.mean(ax, keepdim=True)
  return y * (y * y).mean(ax, keepdim=True).add(eps).rsqrt()


def dropout(self: Tensor, p: float = 0.5) -> Tensor:
  """In training mode (`Tensor.training`), zero each element with probability p and scale the rest by 1/(1-p)."""
  T = tensor_cls()
  if not 0 <= p <= 1: raise ValueError(f"dropout: p must be in [0, 1], got {p}")
  if not type(self).training or p == 0: return self
  if p == 1: return self * 0
  keep = T.rand(self.shape, device=self.device) >= p
  return keep.where(self, 0) * (1 / (1 - p))


def one_hot(self: Tensor, num_classes: int) -> Tensor:
  """int32 one-hot vectors along a new last dim."""
  if not dtypes.is_int(self.dtype): raise TypeError(f"one_hot needs an integer tensor, got {self.dtype}")
  if not isinstance(num_classes, int) or num_classes < 0: raise ValueError(f"one_hot: num_classes must be an int >= 0, got {num_classes!r}")
  return one_hot_last(self, num_classes).where(1, 0)


def scaled_dot_product_attention(self: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, enable_gqa: bool = False) -> Tensor:
  """softmax(q @ k^T / sqrt(d) + mask) @ v; a bool mask keeps where True. `enable_gqa` repeats k/v heads (dim -3)."""
  if self.ndim < 2 or key.ndim < 2 or value.ndim < 2 or self.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
    raise ShapeError(f"scaled_dot_product_attention: query {fmt(self.shape)}, key {fmt(key.shape)} and value {fmt(value.shape)} "
                     "must be (..., L, E), (..., S, E) and (..., S, Ev)")
  E = ints(self.shape, "scaled_dot_product_attention")[-1]
  if enable_gqa:
    if self.ndim < 3 or self.shape[-3] % key.shape[-3] or self.shape[-3] % value.shape[-3]:
      raise ShapeError(f"scaled_dot_product_attention: query heads {fmt(self.shape)} must be a multiple of key/value heads {fmt(key.shape)}")
    heads = ints(self.shape[-3:-2] + key.shape[-3:-2] + value.shape[-3:-2], "scaled_dot_product_attention")
    key, value = key.repeat_interleave(heads[0] // heads[1], dim=-3), value.repeat_interleave(heads[0] // heads[2], dim=-3)
  if is_causal and attn_mask is not None:
    raise ArgumentError("scaled_dot_product_attention: give attn_mask or is_causal, not both (PyTorch and tinygrad raise too); "
                        "to combine them, pass attn_mask & Tensor.ones(L, S, dtype=dtypes.bool).tril()")
  if dropout_p == 0.0 or not type(self).training:  # dropout on the probabilities needs them in memory
    if (out := fused_attention(self, key, value, attn_mask, is_causal, 1 / math.sqrt(E))) is not None: return out
  qk = self.matmul(key.transpose(-2, -1), dtype=least_upper_dtype(self.dtype, key.dtype, dtypes.float32)) * (1 / math.sqrt(E))
  if is_causal:
    T = tensor_cls()
    attn_mask = T.ones(qk.shape[-2:], dtype=dtypes.bool, device=self.device, buffer=False).tril()
  if attn_mask is not None: qk = qk + (attn_mask.where(0, -math.inf) if attn_mask.dtype == dtypes.bool else attn_mask)
  return qk.cast(self.dtype).softmax(-1).dropout(dropout_p) @ value


# ---------------------------------------------------------------- losses

def binary_crossentropy(self: Tensor, Y: Tensor, reduction: Reduction = "mean") -> Tensor:
  """BCE of probabilities `self` against targets Y; the logs are clamped at -100 as in PyTorch, and so is its gradient:
  (p - y)/max(p(1 - p), 1e-12), finite at p = 0 and 1."""
  if self.shape != Y.shape: raise ShapeError(f"binary_crossentropy: input {fmt(self.shape)} and target {fmt(Y.shape)} differ")
  def bce(p: Tensor) -> Tensor: return -(Y * p.log().maximum(-100) + (1 - Y) * (1 - p).log().maximum(-100))
  # at the edges the value is the clamped formula of p held fixed, plus q(p) - q(p held) (0, exactly) with q' = (p - y)/1e-12,
  # in float32 at least (1e-12 is 0 in half, 1/1e-12 overflows it); inside, the formula sees only p away from 0 and 1
  wide = dtypes.float32 if self.dtype.itemsize < 4 else self.dtype
  pw = self.cast(wide)
  edge = pw * (1 - pw) < 1e-12
  def q(p: Tensor) -> Tensor: return (p - Y.detach().cast(wide)).square() * (0.5 / 1e-12)
  at_edge = bce(self.detach()) + (q(pw) - q(pw.detach())).cast(self.dtype)
  return _reduce(edge.where(at_edge, bce(edge.where(0.5, self))), reduction)


def binary_crossentropy_logits(self: Tensor, Y: Tensor, reduction: Reduction = "mean", pos_weight: Tensor | None = None) -> Tensor:
  """BCE of logits `self` against targets Y (stable: through logsigmoid)."""
  if self.shape != Y.shape: raise ShapeError(f"binary_crossentropy_logits: input {fmt(self.shape)} and target {fmt(Y.shape)} differ")
  pos = Y * self.logsigmoid() if pos_weight is None else pos_weight * Y * self.logsigmoid()
  return _reduce(-(pos + (1 - Y) * (-self).logsigmoid()), reduction)


def sparse_categorical_crossentropy(self: Tensor, Y: Tensor, ignore_index: int = -1, label_smoothing: float = 0.0,
                                    reduction: Reduction = "mean") -> Tensor:
  """Cross entropy of logits (..., C) (classes LAST, unlike PyTorch) against int labels (...). Labels equal to
  `ignore_index` add nothing and are not counted in the mean."""
  if not 0.0 <= label_smoothing <= 1.0: raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
  if self.ndim < 1 or self.shape[:-1] != Y.shape:
    raise ShapeError(f"sparse_categorical_crossentropy: logits {fmt(self.shape)} need labels of shape {fmt(self.shape[:-1])}, got {fmt(Y.shape)}")
  if not dtypes.is_int(Y.dtype): raise TypeError(f"sparse_categorical_crossentropy: labels must be integers, got {Y.dtype}")
  logp = self.log_softmax(-1)
  keep = Y.ne(ignore_index)
  picked = one_hot_last(Y, ints(self.shape, "sparse_categorical_crossentropy")[-1]).where(logp, 0).sum(-1)
  # without smoothing the mean is left out: 0·mean is nan where some logit is -inf
  loss = -keep.where((1 - label_smoothing) * picked + label_smoothing * logp.mean(-1) if label_smoothing else picked, 0)
  return loss.sum() / keep.sum() if reduction == "mean" else _reduce(loss, reduction)


def cross_entropy(self: Tensor, Y: Tensor, reduction: Reduction = "mean", label_smoothing: float = 0.0) -> Tensor:
  """Cross entropy of logits (N, C, ...) (or (C,)) against class indices (N, ...) or class probabilities (self's shape)."""
  if not 0.0 <= label_smoothing <= 1.0: raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
  if self.ndim == 0: raise ShapeError("cross_entropy needs logits with a class dim, got a 0-d tensor")
  cd = 0 if self.ndim == 1 else 1
  C = ints(self.shape, "cross_entropy")[cd]
  if indexed := self.shape != Y.shape:
    if self.shape[:cd] + self.shape[cd + 1:] != Y.shape:
      raise ShapeError(f"cross_entropy: logits {fmt(self.shape)} need targets of shape {fmt(self.shape)} (probabilities) "
                       f"or {fmt(self.shape[:cd] + self.shape[cd + 1:])} (class indices), got {fmt(Y.shape)}")
    if not dtypes.is_int(Y.dtype): raise TypeError(f"cross_entropy: class-index targets must be integers, got {Y.dtype}")
    Y = one_hot_last(Y, C).where(1.0, 0.0)
    if dtypes.is_float(self.dtype): Y = Y.cast(self.dtype)
    if cd != Y.ndim - 1: Y = Y.permute(0, Y.ndim - 1, *range(1, Y.ndim - 1))
  Y = Y * (1 - label_smoothing) + label_smoothing / C
  terms = self.log_softmax(cd) * Y
  # class indices: a class other than the target adds nothing, also where its log-probability is -inf (0·-inf is nan; PyTorch
  # picks the target's). Probabilities are multiplied through, as PyTorch does
  if indexed and not label_smoothing: terms = Y.ne(0).where(terms, 0)
  return _reduce(-terms.sum(cd), reduction)


def nll_loss(self: Tensor, Y: Tensor, weight: Tensor | None = None, ignore_index: int | None = None, reduction: Reduction = "mean") -> Tensor:
  """Negative log likelihood of log-probabilities (N, C, ...) (or (C,)) at int labels (N, ...); `weight` per class."""
  if self.ndim == 0: raise ShapeError("nll_loss needs log-probabilities with a class dim, got a 0-d tensor")
  cd = 0 if self.ndim == 1 else 1
  C = ints(self.shape, "nll_loss")[cd]
  if self.shape[:cd] + self.shape[cd + 1:] != Y.shape:
    raise ShapeError(f"nll_loss: input {fmt(self.shape)} needs targets of shape {fmt(self.shape[:cd] + self.shape[cd + 1:])}, got {fmt(Y.shape)}")
  if not dtypes.is_int(Y.dtype): raise TypeError(f"nll_loss: targets must be integers, got {Y.dtype}")
  if weight is not None and weight.shape != (C,): raise ShapeError(f"nll_loss: weight {fmt(weight.shape)} must be ({C},)")
  hot = one_hot_last(Y, C)  # (N, ..., C)
  x = self if cd == self.ndim - 1 else self.permute(0, *range(2, self.ndim), 1)
  # float weights of self's dtype, as PyTorch: float32 ones would promote a half loss to float32
  w = hot.where(1.0, 0.0).cast(self.dtype if dtypes.is_float(self.dtype) else dtypes.float32) if weight is None else hot.where(weight, 0)
  if ignore_index is not None: w = Y.ne(ignore_index).unsqueeze(-1).where(w, 0)
  # an ignored row adds nothing, also where its picked log-probability is nan or -inf (0·-inf would be nan)
  picked = hot.where(x, 0) if ignore_index is None else (hot & Y.ne(ignore_index).unsqueeze(-1)).where(x, 0)
  nll = -(picked * w).sum(-1)
  return nll.sum() / w.sum() if reduction == "mean" else _reduce(nll, reduction)


# ---------------------------------------------------------------- interpolate, einsum

def _interp_taps(n_in: int, n_out: int, mode: str, align_corners: bool, dt: Any) -> list[tuple[np.ndarray, np.ndarray | None]]:
  """The source rows and weights that resample one dim, as PyTorch computes them: 'linear' two taps (i0 with 1 - λ,
  i1 = min(i0 + 1, n_in - 1) with λ; coordinates and weights in `dt`, float64 for float64 input, else float32), the
  nearest modes one tap without a weight (coordinates in float32 for every dtype, as PyTorch's)."""
  o = np.arange(n_out, dtype=dt)
  if mode == "linear":
    if align_corners: src = o * dt((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros_like(o)
    else: src = np.maximum((o + dt(0.5)) * dt(dt(n_in) / dt(n_out)) - dt(0.5), dt(0))
    lo = np.minimum(np.floor(src).astype(np.int64), n_in - 1)
    lam = np.clip(src - lo.astype(dt), 0, 1).astype(dt)
    return [(lo, (dt(1) - lam).astype(dt)), (np.minimum(lo + 1, n_in - 1), lam)]
  o32, scale = np.arange(n_out, dtype=np.float32), np.float32(n_in / n_out)
  src = np.floor((o32 + np.float32(0.5)) * scale if mode == "nearest-exact" else o32 * scale).astype(np.int64)
  return [(np.minimum(src, n_in - 1), None)]


def _tap(x: Tensor, rows: np.ndarray, w: np.ndarray | None, axis: int) -> Tensor:
  """x read at `rows` along `axis` (times the weights w, one per row): a gather, not a product with a 0/1 matrix, so a
  nan or inf reaches only the outputs that read it."""
  T = tensor_cls()
  at = [1] * x.ndim
  at[axis] = len(rows)
  idx = T(rows.astype(np.int32), device=x.device).reshape(at).expand(*x.shape[:axis], len(rows), *x.shape[axis + 1:])
  return gather_axis(x, idx, axis) if w is None else gather_axis(x, idx, axis) * T(w, device=x.device).reshape(at)


def _interp_matrix_u8(n_in: int, n_out: int, align_corners: bool) -> tuple[np.ndarray, int]:
  """PyTorch's uint8 bilinear weights for one dim: the (n_out, n_in) float64 weights quantized to int16 fixed point,
  and their precision (bits). It computes uint8 images this way (Pillow's scheme) rather than through floats."""
  W = np.zeros((n_out, n_in), dtype=np.float64)
  scale = ((n_in - 1) / (n_out - 1) if n_out > 1 else 0.0) if align_corners else n_in / n_out
  delta = 0.5 if align_corners else 0.0
  for i in range(n_out):
    center = scale * (i + 0.5 - delta)
    lo = max(int(center - 1.0 + 0.5 + delta), 0)
    ws = [max(0.0, 1.0 - abs(j + lo - center + 0.5 - delta)) for j in range(min(int(center + 1.0 + 0.5 + delta), n_in) - lo)]
    if (total := sum(ws)) != 0: ws = [w / total for w in ws]
    W[i, lo:lo + len(ws)] = ws
  precision = 0
  while precision < 22 and int(0.5 + W.max() * (1 << (precision + 1))) < (1 << 15): precision += 1
  return np.trunc(W * (1 << precision) + 0.5), precision


def interpolate(self: Tensor, size: Sequence[int], mode: str = "linear", align_corners: bool = False) -> Tensor:
  """Resize the last len(size) dims. Modes: 'linear' (bi/trilinear with more dims), 'nearest', 'nearest-exact'.
  Each dim reads its source rows by a gather (one, or two weighted as PyTorch's kernels weight them, with float64 weights
  for float64 and float32 ones otherwise; 16-bit floats compute in float32), so a nan or inf reaches only the outputs
  that read it. uint8 'linear' computes as
  PyTorch does (fixed-point weights, last dim first, each pass rounded), so its images match PyTorch's exactly; other
  integer tensors are interpolated in float32 and truncated back (as tinygrad; PyTorch does not interpolate them)."""
  T = tensor_cls()
  if not isinstance(size, (tuple, list)) or not size or len(size) > self.ndim or not all(isinstance(s, int) and s > 0 for s in size):
    raise ValueError(f"interpolate: size must be 1..{self.ndim} positive ints, got {size!r}")
  if mode not in ("linear", "nearest", "nearest-exact"):
    raise ValueError(f"interpolate: mode must be 'linear', 'nearest' or 'nearest-exact', got {mode!r}")
  if align_corners and mode != "linear": raise ValueError("interpolate: align_corners only applies to mode='linear'")
  dims = list(zip(range(self.ndim - len(size), self.ndim), size))
  shape = ints(self.shape, "interpolate")
  if mode == "linear" and self.dtype is dtypes.uint8:
    x = self
    for i, out in reversed(dims):
      if shape[i] == out: continue  # PyTorch skips a dim that keeps its size (its weights are the identity)
      Wq, precision = _interp_matrix_u8(shape[i], out, align_corners)
      W = T(Wq.astype(np.int32), device=self.device)                                                 # (out, in)
      acc = (x.cast(dtypes.int32).transpose(i, -1).unsqueeze(-2) * W).sum(-1, dtype=dtypes.int32).transpose(i, -1)
      x = ((acc + (1 << (precision - 1))) >> precision).clip(0, 255).cast(dtypes.uint8)
    return x
  # float32 for everything narrower (PyTorch's opmath: one rounding at the end), float64 as it is
  x = self.cast(dtypes.float64 if self.dtype is dtypes.float64 else dtypes.float32)
  dt = np.float64 if x.dtype is dtypes.float64 else np.float32
  for i, out in reversed(dims):  # the last dim first: w0·x[i0] + w1·x[i1] nested as PyTorch's kernels nest them
    terms = [_tap(x, rows, w, i) for rows, w in _interp_taps(shape[i], out, mode, align_corners, dt)]
    x = terms[0] if len(terms) == 1 else terms[0] + terms[1]
  return x.cast(self.dtype)


def einsum(formula: str, *operands: Tensor | Sequence[Tensor], dtype: DTypeLike | None = None) -> Tensor:
  """Einstein summation: `Tensor.einsum("ij,jk->ik", a, b)`; '...' and repeated letters (diagonals) work, an
  implicit output is the sorted letters that appear once."""
  xs: list[Tensor] = [t for o in operands for t in (o if isinstance(o, (list, tuple)) else (o,))]
  formula = formula.replace(" ", "")
  lhs, arrow, rhs = formula.partition("->")
  inputs = lhs.split(",")
  if len(inputs) != len(xs): raise ShapeError(f"einsum: '{formula}' has {len(inputs)} operands, got {len(xs)}")
  if any(c not in string.ascii_letters + "." for c in lhs.replace(",", "") + rhs): raise ValueError(f"einsum: bad formula '{formula}'")
  free = [c for c in string.ascii_letters if c not in formula]
  ell_n = 0
  for j, (s, x) in enumerate(zip(inputs, xs)):
    if "..." in s:
      n = x.ndim - (len(s) - 3)
      if n < 0: raise ShapeError(f"einsum: operand {j} {fmt(x.shape)} has fewer dims than '{s}'")
      ell_n = max(ell_n, n)
  ell = "".join(free[:ell_n])
  inputs = [s.replace("...", ell[ell_n - (x.ndim - len(s) + 3):] if "..." in s else "") for s, x in zip(inputs, xs)]
  if not arrow: rhs = ell + "".join(sorted(c for c in set("".join(inputs)) if "".join(inputs).count(c) == 1 and c not in ell))
  else: rhs = rhs.replace("...", ell)
  sizes: dict[str, int] = {}
  for j, (s, x) in enumerate(zip(inputs, xs)):
    if len(s) != x.ndim: raise ShapeError(f"einsum: operand {j} {fmt(x.shape)} does not have the {len(s)} dims of '{s}'")
    for c in set(s):  # a repeated letter within an operand takes its diagonal
      while s.count(c) > 1:
        a, b = s.index(c), s.index(c, s.index(c) + 1)
        if x.shape[a] != x.shape[b]:
          raise ShapeError(f"einsum: repeated '{c}' of operand {j} {fmt(x.shape)} has sizes {x.shape[a]} and {x.shape[b]}")
        x, s = x.diagonal(0, a, b), s[:a] + s[a + 1:b] + s[b + 1:] + c
    xs[j], inputs[j] = x, s
    for c, n in zip(s, ints(x.shape, "einsum")):
      if sizes.setdefault(c, n) != n and 1 not in (sizes[c], n):
        raise ShapeError(f"einsum: '{c}' has size {sizes[c]} in one operand and {n} in operand {j} {fmt(x.shape)}")
      sizes[c] = max(sizes[c], n)
  if len(set(rhs)) != len(rhs) or any(c not in sizes for c in rhs): raise ShapeError(f"einsum: bad output '{rhs}' in '{formula}'")
  alpha = sorted(sizes)
  aligned = [x.permute(tuple(argsort(list(s)))).reshape(tuple(x.shape[s.index(c)] if c in s else 1 for c in alpha)) for s, x in zip(inputs, xs)]
  red = tuple(i for i, c in enumerate(alpha) if c not in rhs)
  target = to_dtype(dtype) if dtype is not None else least_upper_dtype(*(t.dtype for t in aligned))
  # a contraction of floats forms its products in the accumulation dtype (float32 for half) and rounds once, as Tensor.dot
  if red and dtypes.is_float(target): aligned = [t.cast(sum_acc_dtype(target)) for t in aligned]
  prod_ = aligned[0]
  for t in aligned[1:]: prod_ = prod_ * t
  if not red: out = prod_ if dtype is None else prod_.cast(target)
  elif dtypes.is_float(target): out = prod_.sum(red).cast(target)
  else: out = prod_.sum(red, dtype=dtype if dtype is not None else sum_acc_dtype(prod_.dtype))  # ints as tinygrad's (and PyTorch's) einsum
  kept = [c for c in alpha if c in rhs]
  return out.permute(tuple(kept.index(c) for c in rhs))


def linear(self: Tensor, weight: Tensor, bias: Tensor | None = None, dtype: DTypeLike | None = None) -> Tensor:
  """`self @ weight + bias` with weight shaped (in, out), as in tinygrad (PyTorch's nn.Linear stores the transpose); a
  1-d weight scales elementwise."""
  x = self.mul(weight) if weight.ndim == 1 else self.dot(weight, dtype=dtype)
  return x if bias is None else x.add(bias)


def sequential(self: Tensor, ll: Sequence[Callable[[Tensor], Tensor]]) -> Tensor:
  """Applies the callables (layers, Tensor methods, functions) in order, each to the previous one's result, as
  tinygrad's `x.sequential([conv, bn, Tensor.relu])`."""
  if isinstance(ll, (str, bytes)) or not isinstance(ll, Sequence):
    raise ArgumentError(f"sequential: expected a list of callables, got {type(ll).__name__}")
  x = self
  for i, f in enumerate(ll):
    if not callable(f): raise ArgumentError(f"sequential: item {i} is not callable ({type(f).__name__})")
    x = f(x)
    if not isinstance(x, type(self)):
      raise ArgumentError(f"sequential: item {i} ({getattr(f, '__name__', type(f).__name__)}) returned {type(x).__name__}, not a Tensor")
  return x


class NNMixin:
  """Mixed into `Tensor`: the nn-level methods."""
  training: ClassVar[bool] = False  # `Tensor.training = True` turns dropout on (nn layers and optimizers set it)

  relu = relu; relu6 = relu6; leaky_relu = leaky_relu; elu = elu; celu = celu; selu = selu; gelu = gelu; quick_gelu = quick_gelu; silu = silu
  swish = swish; sigmoid = sigmoid; hardsigmoid = hardsigmoid; logsigmoid = logsigmoid; hardswish = hardswish; hardtanh = hardtanh
  softplus = softplus; softsign = softsign; mish = mish; softmax = softmax; softmin = softmin; log_softmax = log_softmax; normalize = normalize
  conv2d = conv2d; conv_transpose2d = conv_transpose2d; avg_pool2d = avg_pool2d; max_pool2d = max_pool2d; max_unpool2d = max_unpool2d
  batchnorm = batchnorm; layernorm = layernorm; dropout = dropout; one_hot = one_hot; scaled_dot_product_attention = scaled_dot_product_attention
  binary_crossentropy = binary_crossentropy; binary_crossentropy_logits = binary_crossentropy_logits
  sparse_categorical_crossentropy = sparse_categorical_crossentropy; cross_entropy = cross_entropy; nll_loss = nll_loss; interpolate = interpolate
  einsum = staticmethod(einsum)
  linear = linear; sequential = sequential
