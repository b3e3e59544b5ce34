"""Sliding-window views (uop/windows.py): recognized exactly, and their gradient taken as a fold whose kernels index the
gradient without division, matching PyTorch on conv, pool and transposed-conv shapes of every stride and dilation."""
import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from plugrad import Tensor
from plugrad.gradient import compute_gradient
from plugrad.uop.ops import Ops
from plugrad.uop.windows import window_fold, window_params, window_view

SHAPES = [((2, 3, 9, 9), (3, 3), (1, 1), (1, 1)), ((1, 2, 12, 11), (3, 2), (2, 3), (1, 2)), ((4, 10), (4,), (3,), (2,)),
          ((1, 1, 5, 6, 7), (2, 3, 2), (1, 2, 3), (2, 1, 1)), ((2, 2, 8, 8), (1, 1), (2, 2), (1, 1))]


@pytest.mark.parametrize("shape,k,s,d", SHAPES)
def test_window_views_are_recognized_with_their_parameters(shape, k, s, d):
  x = Tensor.empty(*shape).uop
  assert window_params(window_view(x, k, s, d)) == (x, k, s, d)


def test_other_permutes_are_not_windows():
  x = Tensor.empty(2, 3, 8, 8)
  assert window_params(x.permute(0, 1, 3, 2).uop) is None
  assert window_params(x.reshape(2, 3, 1, 8, 8).expand(2, 3, 4, 8, 8).permute(0, 1, 3, 4, 2).uop) is None
  # a view equal in shape but not in index (another re-read row length) is refused by the rebuild
  v = window_view(x.uop, (3, 3), (1, 1), (1, 1))
  assert window_params(v.src[0].permute(tuple(range(len(v.shape))))) is None


@pytest.mark.parametrize("shape,k,s,d", SHAPES)
def test_fold_is_the_adjoint_of_the_view(shape, k, s, d):
  """<view(x), g> == <x, fold(g)> for random x and g: the fold is exactly the view's transpose."""
  rng = np.random.default_rng(0)
  xv = rng.standard_normal(shape).astype(np.float32)
  view = Tensor(window_view(Tensor(xv).uop, k, s, d))
  gv = rng.standard_normal(view.shape).astype(np.float32)
  fold = Tensor(window_fold(Tensor(gv).uop, shape, k, s, d))
  assert fold.shape == shape
  np.testing.assert_allclose((view.numpy() * gv).sum(), (xv * fold.numpy()).sum(), rtol=1e-4)


def _grads(f, tf, shapes, device=None):
  rng = np.random.default_rng(1)
  xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
  ps = [Tensor(v, device=device, requires_grad=True) for v in xs]
  ts = [torch.tensor(v, requires_grad=True) for v in xs]
  out, tout = f(*ps), tf(*ts)
  seed = rng.standard_normal(tuple(tout.shape)).astype(np.float32)
  out.backward(Tensor(seed, device=device))
  tout.backward(torch.tensor(seed))
  for p, t in zip(ps, ts): np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-4)


CASES = {
  "conv 3x3 pad 1": (lambda x, w: x.conv2d(w, padding=1), lambda x, w: F.conv2d(x, w, padding=1), [(2, 3, 9, 9), (4, 3, 3, 3)]),
  "conv 7x7 stride 2 pad 3": (lambda x, w: x.conv2d(w, stride=2, padding=3), lambda x, w: F.conv2d(x, w, stride=2, padding=3),
                              [(1, 2, 17, 15), (3, 2, 7, 7)]),
  "conv 1x1 stride 2": (lambda x, w: x.conv2d(w, stride=2), lambda x, w: F.conv2d(x, w, stride=2), [(2, 3, 9, 8), (4, 3, 1, 1)]),
  "conv stride (3,2) dilation (2,1)": (lambda x, w: x.conv2d(w, stride=(3, 2), dilation=(2, 1), padding=2),
                                       lambda x, w: F.conv2d(x, w, stride=(3, 2), dilation=(2, 1), padding=2), [(2, 3, 13, 11), (4, 3, 3, 2)]),
  "depthwise": (lambda x, w: x.conv2d(w, padding=1, groups=3), lambda x, w: F.conv2d(x, w, padding=1, groups=3), [(2, 3, 7, 7), (3, 1, 3, 3)]),
  "conv1d": (lambda x, w: x.conv2d(w, padding=1), lambda x, w: F.conv1d(x, w, padding=1), [(2, 3, 10), (4, 3, 3)]),
  "conv3d": (lambda x, w: x.conv2d(w, stride=(1, 2, 1)), lambda x, w: F.conv3d(x, w, stride=(1, 2, 1)), [(1, 2, 5, 6, 5), (2, 2, 2, 3, 2)]),
  "conv_transpose stride 2": (lambda x, w: x.conv_transpose2d(w, stride=2, padding=1),
                              lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1), [(2, 3, 5, 5), (3, 4, 3, 3)]),
  "max pool 3 stride 2 pad 1": (lambda x: x.max_pool2d(3, 2, padding=1), lambda x: F.max_pool2d(x, 3, 2, padding=1), [(2, 3, 12, 11)]),
  "avg pool 3 stride 1": (lambda x: x.avg_pool2d(3, 1), lambda x: F.avg_pool2d(x, 3, 1), [(2, 3, 8, 8)]),
  "avg pool ceil, no pad count": (lambda x: x.avg_pool2d(3, 2, padding=1, ceil_mode=True, count_include_pad=False),
                                  lambda x: F.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False), [(1, 2, 8, 9)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_window_gradients_match_pytorch(name):
  f, tf, shapes = CASES[name]
  _grads(f, tf, shapes)


@pytest.mark.parametrize("name", ["conv stride (3,2) dilation (2,1)", "max pool 3 stride 2 pad 1"])
def test_window_gradients_on_the_interpreter(name):
  f, tf, shapes = CASES[name]
  _grads(f, tf, shapes, device="PYTHON")


def test_max_pool_gradient_is_a_fold_without_division():
  """The gradient reaches the pooled input through the fold (no REDUCE over the view's repeated rows), and the fold's
  kernel computes every index with adds and multiplies only."""
  x = Tensor.empty(2, 4, 16, 16, requires_grad=True, device="CPU")
  out = x.max_pool2d(3, 2, padding=1)
  (g,) = compute_gradient(out.uop, Tensor.ones(*out.shape).uop, [x.uop]).values()
  folds = [u for u in g.toposort if u.op is Ops.CONTIGUOUS and u.shape == (2, 4, 9, 2, 9, 2)]
  assert len(folds) == 1
  items = Tensor(g).schedule()
  fold_kernels = [it.program for it in items if it.kind == "kernel" and it.ast.arg.name.startswith("E_2_4_9_2_9_2")]
  assert len(fold_kernels) == 1
  # (a device with workgroups splits its thread index by division; the CPU's loops are the output's own dims)
  assert not any(u.op in (Ops.IDIV, Ops.MOD) for u in fold_kernels[0].uops)


def test_every_pool_parameter_combination_round_trips():
  for k, s, d in itertools.product((1, 2, 3), (1, 2, 3), (1, 2)):
    x = Tensor.empty(1, 1, 10, 9).uop
    if d * (k - 1) + 1 > 9 or (d == 1 and s == k): continue  # too large; non-overlapping windows are a plain reshape
    assert window_params(window_view(x, (k, k), (s, s), (d, d))) == (x, (k, k), (s, s), (d, d)), (k, s, d)
