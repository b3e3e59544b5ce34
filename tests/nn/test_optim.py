"""Optimizers against hand-written numpy updates over three steps (and PyTorch's where installed), the step's
semantics, learning-rate schedules, and bad input."""
import math

import numpy as np
import pytest

from plugrad import Tensor, dtypes, nn
from plugrad.nn import optim

W0 = np.array([[0.5, -1.0, 2.0], [1.5, 0.25, -0.75]], np.float32)
C = np.array([[1.0, 2.0, 0.5], [3.0, -1.0, 0.2]], np.float32)


def loss_of(w: Tensor) -> Tensor: return (w * w * Tensor(C)).sum() * 0.5  # gradient C * w: each step depends on the last


def run_plugrad(make, steps: int = 3) -> list[np.ndarray]:
  w = Tensor(W0, requires_grad=True)
  opt = make([w])
  out = []
  for _ in range(steps):
    opt.zero_grad()
    loss_of(w).backward()
    opt.step()
    out.append(w.numpy())
  return out


def run_numpy(update, steps: int = 3) -> list[np.ndarray]:
  w, state, out = W0.astype(np.float64), {}, []
  for t in range(1, steps + 1):
    w = update(w, C * w, state, t)
    out.append(w)
  return out


def sgd_ref(lr, momentum=0.0, wd=0.0, nesterov=False):
  def update(w, g, s, t):
    g = g + wd * w
    if momentum:
      s["b"] = momentum * s.get("b", 0) + g
      g = g + momentum * s["b"] if nesterov else s["b"]
    return w - lr * g
  return update


def lamb_ref(lr, b1=0.9, b2=0.999, eps=1e-6, wd=0.0, trust=True):
  def update(w, g, s, t):
    s["m"] = b1 * s.get("m", 0) + (1 - b1) * g
    s["v"] = b2 * s.get("v", 0) + (1 - b2) * g * g
    u = (s["m"] / (1 - b1 ** t)) / (np.sqrt(s["v"] / (1 - b2 ** t)) + eps) + wd * w
    r = np.linalg.norm(w) / np.linalg.norm(u) if trust else 1.0
    return w - lr * r * u
  return update


CASES = {
  "sgd": (lambda p: optim.SGD(p, lr=0.1), sgd_ref(0.1)),
  "sgd-momentum": (lambda p: optim.SGD(p, lr=0.1, momentum=0.9), sgd_ref(0.1, 0.9)),
  "sgd-nesterov-wd": (lambda p: optim.SGD(p, lr=0.05, momentum=0.8, weight_decay=0.1, nesterov=True), sgd_ref(0.05, 0.8, 0.1, True)),
  "adam": (lambda p: optim.Adam(p, lr=0.1), lamb_ref(0.1, eps=1e-8, trust=False)),
  "adamw": (lambda p: optim.AdamW(p, lr=0.1, weight_decay=0.2), lamb_ref(0.1, eps=1e-8, wd=0.2, trust=False)),
  "lamb": (lambda p: optim.LAMB(p, lr=0.1, weight_decay=0.1), lamb_ref(0.1, wd=0.1)),
}


@pytest.mark.parametrize("name", CASES)
def test_three_steps_match_the_hand_computed_updates(name):
  make, ref = CASES[name]
  for got, want in zip(run_plugrad(make), run_numpy(ref)): np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # float32 vs float64


@pytest.mark.parametrize("name,kwargs", [("SGD", dict(lr=0.1, momentum=0.9, weight_decay=0.1, nesterov=True)),
                                         ("Adam", dict(lr=0.1)), ("AdamW", dict(lr=0.1, weight_decay=0.2))])
def test_three_steps_match_pytorch(name, kwargs):
  torch = pytest.importorskip("torch")
  w = torch.tensor(W0, requires_grad=True)
  opt = getattr(torch.optim, name)([w], **kwargs)
  want = []
  for _ in range(3):
    opt.zero_grad()
    (w * w * torch.tensor(C)).sum().mul(0.5).backward()
    opt.step()
    want.append(w.detach().numpy().copy())
  got = run_plugrad(lambda p: getattr(optim, name)(p, **kwargs))
  for g, t in zip(got, want): np.testing.assert_allclose(g, t, rtol=1e-5, atol=1e-5)


def test_a_network_step_reads_every_weight_before_writing_any():
  """Two layers: layer 1's gradient reads layer 2's weights; the loss is realized in the same run as the update. Both
  must see the weights from before the update."""
  rng = np.random.default_rng(1)
  x, y = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)
  w1, w2 = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((5, 2)).astype(np.float32)
  t1, t2 = Tensor(w1, requires_grad=True), Tensor(w2, requires_grad=True)
  opt = optim.SGD([t1, t2], lr=0.1)
  for _ in range(3):
    opt.zero_grad()
    loss = ((Tensor(x).matmul(t1).relu().matmul(t2) - Tensor(y)) ** 2).mean()
    loss.backward()
    Tensor.realize(loss, *opt.schedule_step())
    h = x @ w1
    err = np.maximum(h, 0) @ w2 - y
    np.testing.assert_allclose(loss.item(), (err ** 2).mean(), rtol=1e-5)
    d_out = 2 * err / err.size
    g2, g1 = np.maximum(h, 0).T @ d_out, x.T @ ((d_out @ w2.T) * (h > 0))
    w1, w2 = w1 - 0.1 * g1, w2 - 0.1 * g2
    np.testing.assert_allclose(t1.numpy(), w1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(t2.numpy(), w2, rtol=1e-5, atol=1e-6)


def test_step_realizes_buffers_and_skips_params_without_gradient(training):
  training(True)
  bn, unused = nn.BatchNorm(2), Tensor([1.0, 2.0], requires_grad=True)
  opt = optim.Adam([*nn.get_parameters(bn), unused], lr=0.01)
  assert any(t is bn.running_mean for t in opt.buffers) and any(t is bn.weight for t in opt.params)
  for _ in range(3):
    opt.zero_grad()
    bn(Tensor(np.arange(6, dtype=np.float32).reshape(3, 2))).sum().backward()
    opt.step()
  assert bn.num_batches_tracked.item() == 3
  assert len(bn.running_mean.uop.toposort) <= 3  # realized each step: no chain of pending assigns
  np.testing.assert_array_equal(unused.numpy(), [1.0, 2.0])


def test_zero_grad_and_step_without_backward():
  w = Tensor([1.0], requires_grad=True)
  opt = optim.SGD([w], lr=0.5)
  (w * 3).sum().backward()
  opt.step()
  assert w.item() == -0.5 and w.grad is not None
  opt.zero_grad()
  assert w.grad is None
  with pytest.raises(RuntimeError, match="backward"): opt.step()


@pytest.mark.parametrize("make,error,pattern", [
  (lambda: optim.SGD([Tensor([1.0])]), ValueError, r"requires_grad"),
  (lambda: optim.Adam([Tensor([1.0], requires_grad=False)]), ValueError, r"no tensor with requires_grad=True"),
  (lambda: optim.SGD([Tensor([1], requires_grad=True)]), TypeError, r"float"),
  (lambda: optim.SGD([[1.0]]), TypeError, r"not Tensors"),
  (lambda: optim.SGD([Tensor([1.0], requires_grad=True)], lr=-1), ValueError, r"lr"),
  (lambda: optim.SGD([Tensor([1.0], requires_grad=True)], nesterov=True), ValueError, r"nesterov"),
  (lambda: optim.Adam([Tensor([1.0], requires_grad=True)], b1=1.0), ValueError, r"b1"),
  (lambda: optim.StepLR(optim.SGD([Tensor([1.0], requires_grad=True)]), step_size=0), ValueError, r"step_size"),
  (lambda: optim.CosineAnnealingLR(object(), T_max=3), TypeError, r"Optimizer"),
])
def test_bad_arguments_raise_clear_errors(make, error, pattern):
  with pytest.raises(error, match=pattern): make()


SCHEDULES = {
  "step": (lambda o: optim.StepLR(o, step_size=2, gamma=0.5), lambda e: 0.5 ** (e // 2)),
  "multistep": (lambda o: optim.MultiStepLR(o, [1, 3], gamma=0.1), lambda e: 0.1 ** ((e >= 1) + (e >= 3))),
  "cosine": (lambda o: optim.CosineAnnealingLR(o, T_max=4, eta_min=0.1), lambda e: 0.1 + 0.9 * (1 + math.cos(math.pi * e / 4)) / 2),
  "lambda": (lambda o: optim.LambdaLR(o, lambda e: 1 / (e + 1)), lambda e: 1 / (e + 1)),
}


@pytest.mark.parametrize("name", SCHEDULES)
def test_lr_schedules(name):
  make, factor = SCHEDULES[name]
  opt = optim.SGD([Tensor([1.0], requires_grad=True)], lr=1.0)
  lr_before = opt.lr
  sched = make(opt)
  got = [opt.lr.item()]
  for _ in range(5):
    sched.step()
    got.append(opt.lr.item())
  np.testing.assert_allclose(got, [factor(e) for e in range(6)], rtol=1e-6)
  assert opt.lr is lr_before and opt.lr.dtype is dtypes.float32  # updated in place: the step kernels stay the same


def test_cosine_schedule_matches_pytorch():
  torch = pytest.importorskip("torch")
  topt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.3)
  tsched = torch.optim.lr_scheduler.CosineAnnealingLR(topt, T_max=7, eta_min=0.01)
  opt = optim.SGD([Tensor([1.0], requires_grad=True)], lr=0.3)
  sched = optim.CosineAnnealingLR(opt, T_max=7, eta_min=0.01)
  for _ in range(7):
    topt.step()
    tsched.step()
    sched.step()
    assert opt.lr.item() == pytest.approx(topt.param_groups[0]["lr"], rel=1e-6)


def test_lr_schedule_drives_the_update():
  w = Tensor([0.0], requires_grad=True)
  opt = optim.SGD([w], lr=1.0)
  sched = optim.StepLR(opt, step_size=1, gamma=0.5)
  for _ in range(3):
    opt.zero_grad()
    w.sum().backward()  # gradient 1: each step moves w by the current lr
    opt.step()
    sched.step()
  assert w.item() == pytest.approx(-(1 + 0.5 + 0.25))
