"""Realizing never changes a gradient: whichever tensors of a graph are realized (`.numpy()`, `.realize()`,
`Tensor.realize(a, b)`, `.item()`), in whatever order, `gradient()` and `backward()` give what the lazy graph gives (and
what PyTorch gives). docs/tensor.md, "Autograd"."""
from __future__ import annotations

import gc
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from plugrad import Tensor
from plugrad.nn import Linear
from plugrad.nn.optim import SGD, Adam
from plugrad.nn.state import get_parameters, get_state_dict, load_state_dict
from plugrad.tensor.tensor import _origins

torch: Any
try:
  import torch
except ImportError:  # the comparison with the lazy run still holds
  torch = None


def test_realized_intermediate_keeps_every_path() -> None:
  x = Tensor([1.0, 2.0], requires_grad=True)
  y = x.exp()
  z = y * 2
  y.numpy()
  z.numpy()
  np.testing.assert_allclose((y.sum() + z.sum()).gradient(x)[0].numpy(), 3 * np.exp([1.0, 2.0]), rtol=1e-6)


@pytest.mark.parametrize("how", ["numpy", "realize", "together"])
def test_realized_clone_is_differentiable(how: str) -> None:
  x = Tensor([1.0, 2.0], requires_grad=True)
  c, d = x.clone(), x.clone()
  if how == "numpy": c.numpy(); d.numpy()
  elif how == "realize": d.realize(); c.realize()
  else: Tensor.realize(c, d)
  loss = (c * 3).sum() + (d * 5).sum() + x.sum()
  gx, gc, gd = (g.numpy() for g in loss.gradient(x, c, d))  # each clone stays its own target, as it was lazily
  assert gx.tolist() == [9.0, 9.0] and gc.tolist() == [3.0, 3.0] and gd.tolist() == [5.0, 5.0]
  loss.backward()
  assert x.grad is not None and c.grad is not None and x.grad.tolist() == [9.0, 9.0] and c.grad.tolist() == [3.0, 3.0]


def test_assign_of_a_realized_tensor_takes_the_new_graph() -> None:
  x = Tensor([1.0, 2.0], requires_grad=True)
  a = x * 2
  a.realize()
  a.assign(x * 3).realize()  # the old origin (x * 2) no longer describes a's memory
  assert a.sum().gradient(x)[0].tolist() == [3.0, 3.0]


def test_loading_a_live_models_state_does_not_link_the_models() -> None:
  src, dst = Linear(3, 2), Linear(3, 2)
  load_state_dict(dst, get_state_dict(src))
  dst(Tensor.ones(1, 3)).sum().backward()
  assert dst.weight.grad is not None and src.weight.grad is None


# ---------------------------------------------------------------- random graphs

# op name → (arity, how it is built); every value is (3, 3) so that any pool entry composes with any other
OPS: dict[str, tuple[int, Callable[..., Any]]] = {
  "exp": (1, lambda a: (a * 0.3).exp()),
  "relu": (1, lambda a: a.relu()),
  "tanh": (1, lambda a: a.tanh()),
  "clone": (1, lambda a: a.clone()),
  "reshape": (1, lambda a: a.reshape(9, 1).expand(9, 2).sum(1).reshape(3, 3) * 0.5),
  "transpose": (1, lambda a: a.transpose(0, 1)),
  "max": (1, lambda a: a - (a.amax(1, keepdim=True) if torch is not None and isinstance(a, torch.Tensor) else a.max(1, keepdim=True))),
  "mean": (1, lambda a: a * a.mean(0, keepdim=True)),
  "sum": (1, lambda a: a.sum(1, keepdim=True).expand(3, 3) * 0.2),
  "mul": (2, lambda a, b: a * b),
  "add": (2, lambda a, b: a + b),
  "sub": (2, lambda a, b: a - b),
  "matmul": (2, lambda a, b: (a @ b) * 0.3),
}


def make_program(rng: random.Random) -> list[tuple[str, tuple[int, ...]]]:
  """Steps over a pool that starts with the two inputs; no two steps alike (the lazy graph would merge them)."""
  steps: list[tuple[str, tuple[int, ...]]] = []
  while len(steps) < rng.randint(4, 9):
    name = rng.choice(sorted(OPS))
    step = (name, tuple(rng.randrange(2 + len(steps)) for _ in range(OPS[name][0])))
    if step not in steps: steps.append(step)
  return steps


def build(program: list[tuple[str, tuple[int, ...]]], inputs: list[Any]) -> list[Any]:
  pool = list(inputs)
  for name, args in program: pool.append(OPS[name][1](*(pool[i] for i in args)))
  return pool


def loss_of(pool: list[Any], weights: list[float]) -> Any:
  return sum((p.sum() * w for p, w in zip(pool[1:], weights)), pool[0].sum())


def realize_some(rng: random.Random, tensors: list[Tensor]) -> None:
  """A random subset realized in a random order, each way a program may do it."""
  chosen = rng.sample(tensors, rng.randint(0, len(tensors)))
  while chosen:
    how = rng.choice(["numpy", "realize", "together", "item"])
    if how == "together" and len(chosen) > 1: Tensor.realize(chosen.pop(), chosen.pop())
    elif how == "item": chosen.pop().sum().item()  # a scalar derived from it: realizes its graph, not the tensor
    elif how == "numpy": chosen.pop().numpy()
    else: chosen.pop().realize()


def run(program: list[tuple[str, tuple[int, ...]]], data: list[np.ndarray], weights: list[float], target: int,
        rng: random.Random | None) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """gradient() of the loss for the inputs and the pool entry `target`, then backward() into the same tensors; with
  `rng`, random intermediates (and the loss) are realized first, and again between the two."""
  inputs = [Tensor(d, requires_grad=True) for d in data]
  pool = build(program, inputs)
  loss = loss_of(pool, weights)
  if rng is not None:
    realize_some(rng, pool[2:])
    if rng.random() < 0.5: loss.item()
  grads = [g.numpy() for g in loss.gradient(inputs[0], inputs[1], pool[target])]
  if rng is not None: realize_some(rng, pool[2:])
  pool[target].requires_grad_()
  loss.backward()
  got = [t.grad for t in (inputs[0], inputs[1], pool[target])]
  assert all(g is not None for g in got), "backward() left a gradient out"
  return grads, [g.numpy() for g in got if g is not None]


def torch_grads(program: list[tuple[str, tuple[int, ...]]], data: list[np.ndarray], weights: list[float], target: int) -> list[np.ndarray]:
  inputs = [torch.tensor(d, requires_grad=True) for d in data]
  pool = build(program, inputs)
  return [g.numpy() for g in torch.autograd.grad(loss_of(pool, weights), [inputs[0], inputs[1], pool[target]])]


@pytest.mark.parametrize("seed", range(12))
def test_random_graphs_realized_in_any_order(seed: int) -> None:
  rng = random.Random(seed)
  program = make_program(rng)
  data = [np.asarray(rng.choices(np.linspace(-1.5, 1.5, 31), k=9), np.float32).reshape(3, 3) for _ in range(2)]
  weights = [rng.choice([0.5, 1.0, 2.0, -1.0, 3.0]) for _ in range(len(program) + 1)]
  target = rng.randrange(2, 2 + len(program))
  lazy_grads, lazy_backward = run(program, data, weights, target, None)
  for g, b in zip(lazy_grads, lazy_backward): np.testing.assert_allclose(b, g, rtol=1e-5, atol=1e-6)
  if torch is not None:
    for g, t in zip(lazy_grads, torch_grads(program, data, weights, target)): np.testing.assert_allclose(g, t, rtol=1e-4, atol=1e-5)
  for trial in range(3):
    grads, backward = run(program, data, weights, target, random.Random(seed * 100 + trial))
    for got, want in zip(grads + backward, lazy_grads + lazy_backward):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"program {program}, trial {trial}")


# ---------------------------------------------------------------- a training loop that logs

@pytest.mark.parametrize("opt", [SGD, Adam])
def test_logging_the_loss_does_not_change_training(opt: type) -> None:
  def train(log: bool) -> list[np.ndarray]:
    kept = []
    Tensor.manual_seed(7)
    l1, l2 = Linear(4, 8), Linear(8, 1)
    params = get_parameters([l1, l2])
    optim = opt(params, lr=0.05) if opt is Adam else opt(params, lr=0.05, momentum=0.9)
    x = Tensor(np.linspace(-1, 1, 24, dtype=np.float32).reshape(6, 4))
    for _ in range(4):
      h = l1(x).relu()
      if log: h.numpy()
      pred = l2(h)
      if log: pred.numpy()  # the loss below then reads only realized tensors, none that requires grad
      loss = (pred - 0.5).square().mean()
      if log: loss.item()
      optim.zero_grad()
      loss.backward()
      optim.step()
      gc.collect()
      kept.append(len(_origins))
    # the graphs remembered are this step's (.grad and the optimizer's state keep none): they do not pile up
    assert kept[-1] == kept[-2] <= 4, kept
    return [p.numpy() for p in params]
  for got, want in zip(train(True), train(False)): np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
