"""Optimizers (SGD, Adam, AdamW, LAMB, with tinygrad's signatures and PyTorch's update rules) and learning-rate
schedules (docs/nn.md).

`opt.step()` realizes the new weights and the optimizer's state, and nothing else: the loss is never recomputed by it.
The learning rate is a realized one-element tensor (`opt.lr`), so a schedule changing it reuses the same kernels.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

from plugrad.dtype import dtypes
from plugrad.helpers import dedup
from plugrad.tensor import Tensor
from plugrad.uop.shape import fmt

__all__ = ["LAMB", "SGD", "Adam", "AdamW", "CosineAnnealingLR", "LRScheduler", "LambdaLR", "MultiStepLR", "Optimizer", "StepLR"]


class Optimizer:
  """The base: holds the trained tensors (`params`: requires_grad=True) and the tensors only kept realized with each step
  (`buffers`: requires_grad=False, e.g. BatchNorm's running statistics from `get_parameters`). A tensor whose
  requires_grad was never set is an error: it would get no gradient from backward()."""
  def __init__(self, params: Iterable[Tensor], lr: float, device: str | None = None):
    name = type(self).__name__
    given = list(params)
    if bad := [f"#{i} ({type(t).__name__})" for i, t in enumerate(given) if not isinstance(t, Tensor)]: raise TypeError(f"{name}: not Tensors: {bad}")
    if unset := [f"#{i} {fmt(t.shape)}" for i, t in enumerate(given) if t.requires_grad is None]:
      raise ValueError(f"{name}: tensor(s) {', '.join(unset)} do not have requires_grad set; create them with requires_grad=True (or call "
                       ".requires_grad_()) to train them, or set requires_grad=False for state the optimizer should only keep realized")
    self.params: list[Tensor] = dedup(t for t in given if t.requires_grad)
    self.buffers: list[Tensor] = dedup(t for t in given if not t.requires_grad)
    if not self.params: raise ValueError(f"{name}: no tensor with requires_grad=True to optimize (got {len(given)} tensors)")
    if ints := [f"#{i} {t.dtype}" for i, t in enumerate(self.params) if not dtypes.is_float(t.dtype)]:
      raise TypeError(f"{name}: only float tensors can be trained, got {', '.join(ints)}")
    _check(name, lr=lr)
    self.device = device or self.params[0].device
    self._index = {id(t): i for i, t in enumerate(self.params)}
    self.lr = Tensor([lr], device=self.device, dtype=dtypes.float32, requires_grad=False).realize()

  def zero_grad(self) -> None:
    """Forget the gradients (backward() accumulates into .grad)."""
    for t in self.params: t.grad = None

  def step(self) -> None:
    """Apply one update from the current gradients: realizes the new weights, the optimizer state and the buffers."""
    Tensor.realize(*self.schedule_step())

  def schedule_step(self) -> list[Tensor]:
    """Set up one update (lazily) and return the tensors to realize, in a safe order: to also compute the loss in the same
    run, realize it first: `Tensor.realize(loss, *opt.schedule_step())`. Tensors without a gradient are left alone."""
    live = [t for t in self.params if t.grad is not None]
    if not live: raise RuntimeError(f"{type(self).__name__}.step(): no parameter has a gradient; call loss.backward() first")
    grads = [t.grad for t in live]
    state = self._update(live, grads)  # type: ignore[arg-type]
    # the gradients get their own buffers (m, v and the weight update each read them; none recomputes them), and what
    # reads the old weights (gradients, the buffers' statistics) is listed before the writes to them
    return [*grads, *self.buffers, *state, *live]  # type: ignore[list-item]

  def _update(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
    """Assign each param its new value; return the state tensors assigned too."""
    raise NotImplementedError(f"{type(self).__name__} must implement _update(params, grads) (Optimizer is a base class)")

  def _lr(self, t: Tensor) -> Tensor: return self.lr if self.lr.device == t.device else self.lr.to(t.device)

  def _zeros(self) -> list[Tensor]: return [Tensor.zeros(t.shape, dtype=dtypes.float32, device=t.device, requires_grad=False) for t in self.params]

  def _slot(self, t: Tensor) -> int: return self._index[id(t)]


def _check(name: str, **values: float) -> None:
  for k, v in values.items():
    if not isinstance(v, (int, float)) or not v >= 0: raise ValueError(f"{name}: {k} must be a number >= 0, got {v!r}")


class SGD(Optimizer):
  """p -= lr * g with g = grad + weight_decay * p; with momentum b = momentum * b + g and g = b (or g + momentum * b with
  nesterov). `classic` applies lr before the momentum (b = momentum * b + lr * g; p -= b)."""
  def __init__(self, params: Iterable[Tensor], lr: float = 0.001, momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
               classic: bool = False, device: str | None = None):
    super().__init__(params, lr, device)
    _check("SGD", momentum=momentum, weight_decay=weight_decay)
    if nesterov and momentum == 0: raise ValueError("SGD: nesterov needs momentum > 0")
    self.momentum, self.wd, self.nesterov, self.classic = momentum, weight_decay, nesterov, classic
    self.b = self._zeros() if momentum else []

  def _update(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
    state = []
    for t, g in zip(params, grads):
      g = g.float()
      if self.wd: g = g + self.wd * t.detach()
      if self.classic: g = g * self._lr(t)
      if self.momentum:
        b = self.b[self._slot(t)]
        b.assign(self.momentum * b + g)  # b starts at 0, so the first step gives b = g
        state.append(b)
        g = g + self.momentum * b if self.nesterov else b
      if not self.classic: g = g * self._lr(t)
      t.assign(t.detach() - g.cast(t.dtype))
    return state


class LAMB(Optimizer):
  """Adam's moments with bias correction, update u = m̂ / (sqrt(v̂) + eps) + weight_decay * p, scaled by the trust ratio
  ||p|| / ||u|| (1 where either is 0); with adam=True the ratio is 1 (AdamW)."""
  def __init__(self, params: Iterable[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6, weight_decay: float = 0.0,
               adam: bool = False, device: str | None = None):
    super().__init__(params, lr, device)
    name = type(self).__name__
    _check(name, eps=eps, weight_decay=weight_decay)
    if not (0 <= b1 < 1 and 0 <= b2 < 1): raise ValueError(f"{name}: b1 and b2 must be in [0, 1), got {b1}, {b2}")
    self.b1, self.b2, self.eps, self.wd, self.adam = b1, b2, eps, weight_decay, adam
    # b1^t and b2^t as tensors updated in place: the bias correction needs no new kernel per step
    self.b1_t, self.b2_t = (Tensor.ones(1, dtype=dtypes.float32, device=self.device, requires_grad=False) for _ in range(2))
    self.m, self.v = self._zeros(), self._zeros()

  def _update(self, params: list[Tensor], grads: list[Tensor]) -> list[Tensor]:
    self.b1_t.assign(self.b1_t * self.b1)
    self.b2_t.assign(self.b2_t * self.b2)
    state = [self.b1_t, self.b2_t]
    for t, g in zip(params, grads):
      i, g = self._slot(t), g.float()
      m, v = self.m[i], self.v[i]
      m.assign(self.b1 * m + (1 - self.b1) * g)
      v.assign(self.b2 * v + (1 - self.b2) * (g * g))
      b1_t, b2_t = (x if x.device == t.device else x.to(t.device) for x in (self.b1_t, self.b2_t))
      up = (m / (1 - b1_t)) / ((v / (1 - b2_t)).sqrt() + self.eps)
      if self.wd: up = up + self.wd * t.detach().float()
      if not self.adam:
        r1, r2 = t.detach().float().square().sum().sqrt(), up.square().sum().sqrt()
        up = up * ((r1 > 0) & (r2 > 0)).where(r1 / r2, 1.0)
      t.assign(t.detach() - (self._lr(t) * up).cast(t.dtype))
      state += [m, v]
    return state


class AdamW(LAMB):
  """Adam with decoupled weight decay: p -= lr * (m̂ / (sqrt(v̂) + eps) + weight_decay * p)."""
  def __init__(self, params: Iterable[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
               weight_decay: float = 0.01, device: str | None = None):
    super().__init__(params, lr, b1, b2, eps, weight_decay, adam=True, device=device)


class Adam(AdamW):
  """p -= lr * m̂ / (sqrt(v̂) + eps)."""
  def __init__(self, params: Iterable[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, device: str | None = None):
    super().__init__(params, lr, b1, b2, eps, 0.0, device=device)


# ---------------------------------------------------------------- learning-rate schedules

class LRScheduler:
  """Sets `optimizer.lr` from the number of `step()` calls made so far (PyTorch's closed forms; call it once per epoch
  or once per batch, as the schedule's unit). `base_lr` is the optimizer's learning rate when the schedule is made; the
  schedule's value for step 0 is applied at once."""
  def __init__(self, optimizer: Optimizer):
    if not isinstance(optimizer, Optimizer): raise TypeError(f"{type(self).__name__} needs an Optimizer, got a {type(optimizer).__name__}")
    self.optimizer, self.base_lr, self.last_epoch = optimizer, float(optimizer.lr.item()), 0
    if (lr := self.get_lr()) != self.base_lr: self._set(lr)

  def get_lr(self) -> float: raise NotImplementedError(f"{type(self).__name__} must implement get_lr() (LRScheduler is a base class)")

  def step(self) -> None:
    self.last_epoch += 1
    self._set(self.get_lr())

  def _set(self, lr: float) -> None:
    opt_lr = self.optimizer.lr
    opt_lr.assign(Tensor([lr], device=opt_lr.device, dtype=opt_lr.dtype)).realize()


class LambdaLR(LRScheduler):
  """lr = base_lr * lr_lambda(epoch)."""
  def __init__(self, optimizer: Optimizer, lr_lambda: Callable[[int], float]):
    self.lr_lambda = lr_lambda
    super().__init__(optimizer)

  def get_lr(self) -> float: return self.base_lr * self.lr_lambda(self.last_epoch)


class StepLR(LRScheduler):
  """lr = base_lr * gamma ** (epoch // step_size)."""
  def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1):
    if not isinstance(step_size, int) or step_size < 1: raise ValueError(f"StepLR: step_size must be a positive int, got {step_size!r}")
    self.step_size, self.gamma = step_size, gamma
    super().__init__(optimizer)

  def get_lr(self) -> float: return self.base_lr * self.gamma ** (self.last_epoch // self.step_size)


class MultiStepLR(LRScheduler):
  """lr = base_lr * gamma ** (the number of milestones reached)."""
  def __init__(self, optimizer: Optimizer, milestones: Sequence[int], gamma: float = 0.1):
    self.milestones, self.gamma = sorted(milestones), gamma
    super().__init__(optimizer)

  def get_lr(self) -> float: return self.base_lr * self.gamma ** sum(self.last_epoch >= m for m in self.milestones)


class CosineAnnealingLR(LRScheduler):
  """lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2."""
  def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0):
    if not isinstance(T_max, int) or T_max < 1: raise ValueError(f"CosineAnnealingLR: T_max must be a positive int, got {T_max!r}")
    self.T_max, self.eta_min = T_max, eta_min
    super().__init__(optimizer)

  def get_lr(self) -> float: return self.eta_min + (self.base_lr - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2
