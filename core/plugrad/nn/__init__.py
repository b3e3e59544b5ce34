"""Neural-network layers with tinygrad's constructor signatures and initializations (docs/nn.md).

A layer is a plain object: its tensors are attributes, calling it applies it. Trainable tensors are created with
`requires_grad=True`; running statistics with `requires_grad=False`, so `get_parameters` hands both to an optimizer,
which trains the first and realizes the second with each step. `Tensor.training` switches BatchNorm and Dropout
between training and evaluation behaviour.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from plugrad.dtype import dtypes
from plugrad.helpers import prod
from plugrad.nn import optim, state
from plugrad.nn.state import get_parameters, get_state_dict, load_state_dict
from plugrad.tensor import Tensor
from plugrad.uop.shape import ShapeError, fmt

__all__ = ["BatchNorm", "BatchNorm2d", "BatchNorm3d", "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d", "Dropout", "Embedding",
           "GroupNorm", "LayerNorm", "Linear", "RMSNorm", "get_parameters", "get_state_dict", "load_state_dict", "optim", "state"]


def _positive(what: str, **values: int) -> None:
  for name, v in values.items():
    if not isinstance(v, int) or isinstance(v, bool) or v < 1: raise ValueError(f"{what}: {name} must be a positive int, got {v!r}")


def _kernel(kernel_size: int | Sequence[int], what: str) -> tuple[int, ...]:
  ks = (kernel_size, kernel_size) if isinstance(kernel_size, int) else tuple(kernel_size)
  if not ks or not all(isinstance(k, int) and k > 0 for k in ks): raise ValueError(f"{what}: kernel_size must be positive ints, got {kernel_size!r}")
  return ks


def _uniform(*shape: int, bound: float) -> Tensor: return Tensor.uniform(*shape, low=-bound, high=bound, requires_grad=True)


class Linear:
  """y = x @ weight.T + bias; weight (out_features, in_features) and bias uniform in ±1/sqrt(in_features)."""
  def __init__(self, in_features: int, out_features: int, bias: bool = True):
    _positive("Linear", in_features=in_features, out_features=out_features)
    bound = 1 / math.sqrt(in_features)
    self.weight = _uniform(out_features, in_features, bound=bound)
    self.bias: Tensor | None = _uniform(out_features, bound=bound) if bias else None

  def __call__(self, x: Tensor) -> Tensor:
    if not x.shape or x.shape[-1] != self.weight.shape[1]:
      raise ShapeError(f"Linear: input {fmt(x.shape)} must end in in_features={self.weight.shape[1]}")
    y = x.matmul(self.weight.T)
    return y if self.bias is None else y + self.bias


class Conv2d:
  """A convolution over len(kernel_size) spatial dims (an int kernel_size means 2). `padding` is an int, one int per
  spatial dim, 2 per dim (F.pad order), or 'same' (stride 1). weight (out, in/groups, *kernel) and bias are uniform in
  ±1/sqrt(in_channels * prod(kernel_size)), as in tinygrad."""
  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int], stride: int | Sequence[int] = 1,
               padding: int | Sequence[int] | str = 0, dilation: int | Sequence[int] = 1, groups: int = 1, bias: bool = True):
    name = type(self).__name__
    _positive(name, in_channels=in_channels, out_channels=out_channels, groups=groups)
    if in_channels % groups or out_channels % groups:
      raise ValueError(f"{name}: in_channels={in_channels} and out_channels={out_channels} must both be divisible by groups={groups}")
    self.kernel_size = _kernel(kernel_size, name)
    if isinstance(padding, str):
      if padding.lower() != "same" or stride != 1: raise ValueError(f"{name}: a str padding must be 'same' (with stride=1), got {padding!r}")
      padding = self._same_padding(dilation)
    self.stride, self.dilation, self.groups, self.padding = stride, dilation, groups, padding
    bound = 1 / math.sqrt(in_channels * prod(self.kernel_size))
    self.weight = _uniform(*self._weight_shape(in_channels, out_channels), bound=bound)
    self.bias: Tensor | None = _uniform(out_channels, bound=bound) if bias else None

  def _weight_shape(self, cin: int, cout: int) -> tuple[int, ...]: return (cout, cin // self.groups, *self.kernel_size)

  def _same_padding(self, dilation: int | Sequence[int]) -> tuple[int, ...]:
    dil = (dilation,) * len(self.kernel_size) if isinstance(dilation, int) else tuple(dilation)
    # (before, after) per dim in F.pad order (last dim first); an even kernel puts the extra cell after
    pairs = [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for d, k in zip(dil[::-1], self.kernel_size[::-1])]
    return tuple(p for pair in pairs for p in pair)

  def __call__(self, x: Tensor) -> Tensor: return x.conv2d(self.weight, self.bias, self.groups, self.stride, self.dilation, self.padding)


class ConvTranspose2d(Conv2d):
  """The transpose of Conv2d; weight (in, out/groups, *kernel), uniform in ±1/sqrt(in_channels * prod(kernel_size))."""
  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int], stride: int | Sequence[int] = 1,
               padding: int | Sequence[int] = 0, output_padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1, groups: int = 1,
               bias: bool = True):
    if isinstance(padding, str): raise ValueError(f"ConvTranspose2d: padding must be an int or a sequence of ints, got {padding!r}")
    super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias)
    self.output_padding = output_padding

  def _weight_shape(self, cin: int, cout: int) -> tuple[int, ...]: return (cin, cout // self.groups, *self.kernel_size)

  def __call__(self, x: Tensor) -> Tensor:
    return x.conv_transpose2d(self.weight, self.bias, self.groups, self.stride, self.dilation, self.padding, self.output_padding)


def Conv1d(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int | str = 0, dilation: int = 1, groups: int = 1,
           bias: bool = True) -> Conv2d:
  return Conv2d(in_channels, out_channels, (kernel_size,), stride, padding, dilation, groups, bias)


def ConvTranspose1d(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0, output_padding: int = 0,
                    dilation: int = 1, groups: int = 1, bias: bool = True) -> ConvTranspose2d:
  return ConvTranspose2d(in_channels, out_channels, (kernel_size,), stride, padding, output_padding, dilation, groups, bias)


class BatchNorm:
  """Normalizes each channel (axis 1) of (N, C, ...) inputs. In training mode (`Tensor.training`) it uses the batch's
  mean and biased variance and updates running_mean / running_var (unbiased) with `momentum` through `assign`; in
  evaluation mode it uses the running statistics (or the batch's when track_running_stats=False)."""
  def __init__(self, sz: int, eps: float = 1e-5, affine: bool = True, track_running_stats: bool = True, momentum: float = 0.1):
    _positive("BatchNorm", sz=sz)
    self.eps, self.track_running_stats, self.momentum = eps, track_running_stats, momentum
    self.weight: Tensor | None = Tensor.ones(sz, requires_grad=True) if affine else None
    self.bias: Tensor | None = Tensor.zeros(sz, requires_grad=True) if affine else None
    self.num_batches_tracked = Tensor.zeros(dtype=dtypes.int64, requires_grad=False)
    if track_running_stats: self.running_mean, self.running_var = Tensor.zeros(sz, requires_grad=False), Tensor.ones(sz, requires_grad=False)

  def __call__(self, x: Tensor) -> Tensor:
    c = self.weight.shape[0] if self.weight is not None else self.running_mean.shape[0] if self.track_running_stats else None
    if x.ndim < 2 or (c is not None and x.shape[1] != c): raise ShapeError(f"BatchNorm({c}): input {fmt(x.shape)} must be (N, {c}, ...)")
    if self.track_running_stats and not Tensor.training:
      return x.batchnorm(self.weight, self.bias, self.running_mean, self.running_var.add(self.eps).rsqrt())
    axes = tuple(d for d in range(x.ndim) if d != 1)
    mean = x.mean(axes)
    # the mean's gradient through the variance is zero (the deviations sum to 0), so detach it there: a smaller graph
    dev = x - mean.detach().reshape(1, -1, *(1,) * (x.ndim - 2))
    var = (dev * dev).mean(axes)
    if self.track_running_stats and Tensor.training:
      n = prod(x.shape) // x.shape[1]
      m = self.momentum
      self.running_mean.assign((1 - m) * self.running_mean + m * mean.detach().cast(self.running_mean.dtype))
      self.running_var.assign((1 - m) * self.running_var + m * (n / max(n - 1, 1)) * var.detach().cast(self.running_var.dtype))
      self.num_batches_tracked.assign(self.num_batches_tracked + 1)
    return x.batchnorm(self.weight, self.bias, mean, var.add(self.eps).rsqrt())


BatchNorm2d = BatchNorm3d = BatchNorm


class LayerNorm:
  """Normalizes over the trailing `normalized_shape` dims, then an elementwise affine (weight 1, bias 0)."""
  def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True):
    self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    _positive("LayerNorm", **{f"normalized_shape[{i}]": s for i, s in enumerate(self.normalized_shape)})
    self.axis, self.eps = tuple(range(-len(self.normalized_shape), 0)), eps
    self.weight: Tensor | None = Tensor.ones(*self.normalized_shape, requires_grad=True) if elementwise_affine else None
    self.bias: Tensor | None = Tensor.zeros(*self.normalized_shape, requires_grad=True) if elementwise_affine else None

  def __call__(self, x: Tensor) -> Tensor:
    n = len(self.normalized_shape)
    if x.shape[x.ndim - n:] != self.normalized_shape:
      raise ShapeError(f"LayerNorm: input {fmt(x.shape)} must end in normalized_shape {fmt(self.normalized_shape)}")
    x = x.layernorm(self.axis, self.eps)
    return x if self.weight is None or self.bias is None else x * self.weight + self.bias


class RMSNorm:
  """x / sqrt(mean(x^2 over the last dim) + eps), computed in float32 and cast back, times weight (ones)."""
  def __init__(self, dim: int, eps: float = 1e-6, elementwise_affine: bool = True):
    _positive("RMSNorm", dim=dim)
    self.eps = eps
    self.weight: Tensor | None = Tensor.ones(dim, requires_grad=True) if elementwise_affine else None

  def __call__(self, x: Tensor) -> Tensor:
    if self.weight is not None and (not x.shape or x.shape[-1] != self.weight.shape[0]):
      raise ShapeError(f"RMSNorm({self.weight.shape[0]}): input {fmt(x.shape)} must end in {self.weight.shape[0]}")
    xf = x.float()
    y = (xf * (xf * xf).mean(-1, keepdim=True).add(self.eps).rsqrt()).cast(x.dtype)
    return y if self.weight is None else y * self.weight


class GroupNorm:
  """Normalizes each of `num_groups` channel groups of (N, C, ...) inputs, then a per-channel affine."""
  def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
    _positive("GroupNorm", num_groups=num_groups, num_channels=num_channels)
    if num_channels % num_groups: raise ValueError(f"GroupNorm: num_channels={num_channels} must be divisible by num_groups={num_groups}")
    self.num_groups, self.num_channels, self.eps = num_groups, num_channels, eps
    self.weight: Tensor | None = Tensor.ones(num_channels, requires_grad=True) if affine else None
    self.bias: Tensor | None = Tensor.zeros(num_channels, requires_grad=True) if affine else None

  def __call__(self, x: Tensor) -> Tensor:
    if x.ndim < 2 or x.shape[1] != self.num_channels: raise ShapeError(f"GroupNorm: input {fmt(x.shape)} must be (N, {self.num_channels}, ...)")
    x = x.reshape(x.shape[0], self.num_groups, -1).layernorm(eps=self.eps).reshape(x.shape)
    if self.weight is None or self.bias is None: return x
    per_channel = (1, -1, *(1,) * (x.ndim - 2))
    return x * self.weight.reshape(per_channel) + self.bias.reshape(per_channel)


class Embedding:
  """Rows of weight (vocab_size, embed_size, glorot-uniform) picked by integer indices of any shape."""
  def __init__(self, vocab_size: int, embed_size: int):
    _positive("Embedding", vocab_size=vocab_size, embed_size=embed_size)
    self.vocab_sz, self.embed_sz = vocab_size, embed_size
    self.weight = Tensor.glorot_uniform(vocab_size, embed_size, requires_grad=True)

  def __call__(self, idx: Tensor) -> Tensor:
    if not dtypes.is_int(idx.dtype): raise TypeError(f"Embedding needs integer indices, got dtype {idx.dtype}")
    # an indexed load of whole rows (gather, so an out-of-range or negative index reads a zero row as before); its
    # gradient is a scatter-add into the table, not a one-hot product
    n = prod(idx.shape)
    rows = idx.reshape(n, 1).expand(n, self.embed_sz)
    return self.weight.gather(0, rows).reshape(*idx.shape, self.embed_sz)


class Dropout:
  """Zeroes each element with probability p in training mode (`Tensor.training`) and scales the rest by 1/(1-p)."""
  def __init__(self, p: float = 0.5):
    if not 0 <= p <= 1: raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
    self.p = p

  def __call__(self, x: Tensor) -> Tensor: return x.dropout(self.p)
