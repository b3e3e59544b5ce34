"""plugrad.nn layers against numpy references (float64), their initializations, train/eval behaviour and bad input."""
import math

import numpy as np
import pytest

from plugrad import Tensor, dtypes, nn
from plugrad.uop.shape import ShapeError
from tests.nn import refs

RNG = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray: return RNG.standard_normal(shape).astype(np.float32)


def set_(t: Tensor, value: np.ndarray) -> np.ndarray:
  """Give a layer tensor known values (through assign, as a user would); returns them."""
  t.assign(Tensor(value.astype(np.float32))).realize()
  return value


def close(got: Tensor, want: np.ndarray, atol: float = 1e-4) -> None: np.testing.assert_allclose(got.numpy(), want, atol=atol, rtol=1e-4)


def test_linear_forward_and_gradients():
  lin = nn.Linear(5, 3)
  w, b, x = set_(lin.weight, rand(3, 5)), set_(lin.bias, rand(3)), rand(4, 5)
  xt = Tensor(x, requires_grad=True)
  out = lin(xt)
  close(out, x @ w.T + b)
  seed = rand(4, 3)
  (out * Tensor(seed)).sum().backward()
  close(lin.weight.grad, seed.T @ x)
  close(lin.bias.grad, seed.sum(0))
  close(xt.grad, seed @ w)


def test_linear_initialization_follows_tinygrad():
  lin = nn.Linear(64, 32)
  w, b = lin.weight.numpy(), lin.bias.numpy()
  assert w.shape == (32, 64) and b.shape == (32,)
  assert np.abs(w).max() <= 1 / 8 and np.abs(w).max() > 0.9 / 8 and abs(w.mean()) < 0.01  # uniform in ±1/sqrt(in_features)
  assert lin.weight.requires_grad is True and lin.bias.requires_grad is True
  assert nn.Linear(4, 2, bias=False).bias is None


@pytest.mark.parametrize("stride,padding,dilation,groups", [(1, 0, 1, 1), (2, 1, 1, 2), (1, 2, 2, 1)])
def test_conv2d(stride, padding, dilation, groups):
  conv = nn.Conv2d(4, 6, 3, stride=stride, padding=padding, dilation=dilation, groups=groups)
  w, b, x = set_(conv.weight, rand(6, 4 // groups, 3, 3)), set_(conv.bias, rand(6)), rand(2, 4, 7, 6)
  close(conv(Tensor(x)), refs.conv2d(x, w, b, stride, padding, dilation, groups))


def test_conv2d_same_padding_and_init():
  conv = nn.Conv2d(2, 3, (4, 3), padding="same", bias=False)
  assert conv.bias is None and conv.weight.shape == (3, 2, 4, 3)
  bound = 1 / math.sqrt(2 * 4 * 3)
  w = conv.weight.numpy()
  assert np.abs(w).max() <= bound
  x = rand(1, 2, 6, 5)
  out = conv(Tensor(x))
  assert out.shape == (1, 3, 6, 5)
  # 'same' with an even kernel pads one more cell after than before (PyTorch's choice)
  close(out, refs.conv2d(np.pad(x, ((0, 0), (0, 0), (1, 2), (1, 1))), w))
  dilated = nn.Conv2d(2, 3, 3, padding="same", dilation=2, bias=False)
  w = dilated.weight.numpy()
  close(dilated(Tensor(x)), refs.conv2d(x, w, padding=2, dilation=2))


def test_conv1d():
  conv = nn.Conv1d(2, 3, 3, padding=1)
  w, b, x = set_(conv.weight, rand(3, 2, 3)), set_(conv.bias, rand(3)), rand(2, 2, 5)
  # as a 2-d convolution over (1, L) images: padding 1 on both axes, of which the middle row is the 1-d result
  close(conv(Tensor(x)), refs.conv2d(x[:, :, None], w[:, :, None], b, padding=1)[:, :, 1])


@pytest.mark.parametrize("stride,padding,output_padding,dilation,groups", [(1, 0, 0, 1, 1), (2, 1, 1, 1, 2), (2, 0, 0, 2, 1)])
def test_conv_transpose2d(stride, padding, output_padding, dilation, groups):
  conv = nn.ConvTranspose2d(4, 6, (3, 2), stride, padding, output_padding, dilation, groups)
  assert conv.weight.shape == (4, 6 // groups, 3, 2)
  w, b, x = set_(conv.weight, rand(4, 6 // groups, 3, 2)), set_(conv.bias, rand(6)), rand(2, 4, 3, 4)
  close(conv(Tensor(x)), refs.conv_transpose2d(x, w, b, stride, padding, output_padding, dilation, groups))


def test_batchnorm_training_updates_running_statistics(training):
  training(True)
  bn = nn.BatchNorm2d(3, momentum=0.25)
  assert nn.BatchNorm2d is nn.BatchNorm
  g, b = set_(bn.weight, rand(3)), set_(bn.bias, rand(3))
  x = rand(4, 3, 2, 2) * 3 + 1
  out = bn(Tensor(x))
  close(out, refs.normalize(x, (0, 2, 3), 1e-5) * g.reshape(1, 3, 1, 1) + b.reshape(1, 3, 1, 1), atol=1e-3)
  Tensor.realize(bn.running_mean, bn.running_var, bn.num_batches_tracked)
  close(bn.running_mean, 0.25 * x.mean((0, 2, 3)))
  close(bn.running_var, 0.75 + 0.25 * x.var((0, 2, 3), ddof=1), atol=1e-3)  # the unbiased variance, as PyTorch
  assert bn.num_batches_tracked.item() == 1 and bn.num_batches_tracked.dtype is dtypes.int64
  assert bn.running_mean.requires_grad is False and bn.weight.requires_grad is True


def test_batchnorm_eval_uses_running_statistics(training):
  bn = nn.BatchNorm(2)
  mean, var = set_(bn.running_mean, np.array([1.0, -2.0])), set_(bn.running_var, np.array([4.0, 0.25]))
  x = rand(3, 2)
  close(bn(Tensor(x)), (x - mean) / np.sqrt(var + 1e-5))
  assert bn.num_batches_tracked.item() == 0  # evaluation leaves the statistics alone
  close(bn.running_mean, mean)


def test_batchnorm_without_running_stats_or_affine(training):
  bn = nn.BatchNorm(2, affine=False, track_running_stats=False)
  assert bn.weight is None and not hasattr(bn, "running_mean")
  x = rand(5, 2, 3)
  close(bn(Tensor(x)), refs.normalize(x, (0, 2), 1e-5), atol=1e-3)  # batch statistics even in evaluation


def test_batchnorm_backward_matches_numpy(training):
  training(True)
  bn = nn.BatchNorm(2)
  x = rand(4, 2)
  xt = Tensor(x, requires_grad=True)
  seed = rand(4, 2)
  (bn(xt) * Tensor(seed)).sum().backward()
  # d/dx of batch normalization: (seed - mean(seed) - xhat * mean(seed * xhat)) / std
  xhat = refs.normalize(x, (0,), 1e-5)
  std = np.sqrt(x.var(0) + 1e-5)
  close(xt.grad, (seed - seed.mean(0) - xhat * (seed * xhat).mean(0)) / std, atol=1e-3)
  close(bn.weight.grad, (seed * xhat).sum(0), atol=1e-3)
  close(bn.bias.grad, seed.sum(0))


def test_layernorm():
  ln = nn.LayerNorm((2, 3))
  g, b = set_(ln.weight, rand(2, 3)), set_(ln.bias, rand(2, 3))
  x = rand(4, 2, 3)
  close(ln(Tensor(x)), refs.normalize(x, (1, 2), 1e-5) * g + b, atol=1e-3)
  assert nn.LayerNorm(3, elementwise_affine=False).weight is None


def test_rmsnorm():
  rms = nn.RMSNorm(4)
  g, x = set_(rms.weight, rand(4)), rand(3, 4)
  close(rms(Tensor(x)), x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * g)


def test_groupnorm():
  gn = nn.GroupNorm(2, 4)
  g, b = set_(gn.weight, rand(4)), set_(gn.bias, rand(4))
  x = rand(2, 4, 3)
  want = refs.normalize(x.reshape(2, 2, 6), (2,), 1e-5).reshape(2, 4, 3) * g.reshape(1, 4, 1) + b.reshape(1, 4, 1)
  close(gn(Tensor(x)), want, atol=1e-3)


def test_embedding_lookup_and_gradient():
  emb = nn.Embedding(5, 3)
  bound = math.sqrt(6 / (5 + 3))
  assert np.abs(emb.weight.numpy()).max() <= bound  # glorot-uniform
  w = set_(emb.weight, rand(5, 3))
  idx = np.array([[0, 4], [4, 2]], np.int32)
  out = emb(Tensor(idx))
  close(out, w[idx])
  seed = rand(2, 2, 3)
  (out * Tensor(seed)).sum().backward()
  want = np.zeros((5, 3))
  np.add.at(want, idx, seed)  # a repeated index accumulates
  close(emb.weight.grad, want)


def test_dropout(training):
  x = Tensor.ones(16, 16)
  drop = nn.Dropout(0.5)
  assert (drop(x).numpy() == 1).all()  # evaluation: the identity
  training(True)
  got = drop(x).numpy()
  assert set(np.unique(got)) <= {0.0, 2.0} and 0.3 < (got == 0).mean() < 0.7


@pytest.mark.parametrize("make,error,pattern", [
  (lambda: nn.Linear(0, 3), ValueError, "in_features"),
  (lambda: nn.Conv2d(3, 4, 3, groups=2), ValueError, "divisible by groups=2"),
  (lambda: nn.Conv2d(3, 4, 0), ValueError, "kernel_size"),
  (lambda: nn.Conv2d(3, 4, 3, stride=2, padding="same"), ValueError, "'same'"),
  (lambda: nn.Conv2d(3, 4, 3, padding="valid"), ValueError, "'same'"),
  (lambda: nn.ConvTranspose2d(3, 4, 3, padding="same"), ValueError, "padding"),
  (lambda: nn.GroupNorm(3, 4), ValueError, "divisible"),
  (lambda: nn.BatchNorm(-1), ValueError, "sz"),
  (lambda: nn.Dropout(1.5), ValueError, r"\[0, 1\]"),
  (lambda: nn.Linear(4, 2)(Tensor.zeros(3, 5)), ShapeError, r"\(3, 5\).*in_features=4"),
  (lambda: nn.LayerNorm(4)(Tensor.zeros(2, 3)), ShapeError, r"\(2, 3\)"),
  (lambda: nn.BatchNorm(4)(Tensor.zeros(2, 3)), ShapeError, r"\(2, 3\)"),
  (lambda: nn.GroupNorm(2, 4)(Tensor.zeros(2, 6, 3)), ShapeError, r"\(2, 6, 3\)"),
  (lambda: nn.RMSNorm(4)(Tensor.zeros(2, 3)), ShapeError, r"\(2, 3\)"),
  (lambda: nn.Embedding(4, 2)(Tensor([0.5])), TypeError, "integer"),
])
def test_bad_arguments_raise_clear_errors(make, error, pattern):
  with pytest.raises(error, match=pattern): make()
