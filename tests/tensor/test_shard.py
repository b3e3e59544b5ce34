"""Multi-device (sharded and replicated) tensors in one process (docs/sharding.md): results equal the single-device ones
on two CPU instances (CPU_DEVICES=2) and on four PYTHON instances (tiny sizes: the interpreter is slow); gradients,
TinyJit replay and a data-parallel training step of the digits CNN; the copies a layout costs; typed errors."""
from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from plugrad import Device, Tensor, TinyJit
from plugrad.engine.realize import capture
from plugrad.errors import DeviceIndexError, DeviceMismatchError, ShardAxisError, ShardingError
from plugrad.uop.ops import Ops

RNG = np.random.default_rng(3)
CPU2 = ("CPU", "CPU:1")
PY4 = ("PYTHON", "PYTHON:1", "PYTHON:2", "PYTHON:3")


def rand(*shape: int) -> np.ndarray: return RNG.standard_normal(shape).astype(np.float32)


@pytest.fixture(scope="module")
def cpu_devices() -> Iterator[None]:
  """CPU_DEVICES=2 for this module (the plugins re-read it), as it was afterwards."""
  old = os.environ.get("CPU_DEVICES")
  os.environ["CPU_DEVICES"] = "2"
  Device.reset()
  yield
  if old is None: del os.environ["CPU_DEVICES"]
  else: os.environ["CPU_DEVICES"] = old
  Device.reset()


@pytest.fixture(params=["cpu", "python"])
def devs(request: pytest.FixtureRequest, cpu_devices: None) -> tuple[str, ...]:
  return CPU2 if request.param == "cpu" else PY4


def close(got: Tensor, want: np.ndarray, tol: float = 1e-5) -> None:
  np.testing.assert_allclose(got.numpy(), want, rtol=tol, atol=tol)


def copies(fn: object) -> list[tuple[str, int]]:
  """(name, bytes) of the copies run while computing `fn()`."""
  with capture() as items: fn()  # type: ignore[operator]
  return [(ei.name, ei.bufs[0].nbytes) for ei in items if ei.runner is None]


# ---- layout, properties, data

def test_shard_properties_and_gather(devs: tuple[str, ...]) -> None:
  x = rand(5, 3)
  for axis in (None, 0, 1, -1):
    s = Tensor(x).shard(devs, axis)
    assert (s.device, s.shape, s.dtype) == (devs, (5, 3), Tensor(x).dtype)
    np.testing.assert_array_equal(s.numpy(), x)
    np.testing.assert_array_equal(s.to(devs[-1]).numpy(), x)
    assert s.to(devs[0]).device == devs[0]
  # pieces of ceil(n / k) rows in device order, the last ones shorter (or empty)
  s = Tensor(x).shard(devs, 0).realize()
  want = [3, 2] if len(devs) == 2 else [2, 2, 1, 0]
  assert s.uop.op is Ops.MULTI and [p.shape[0] for p in s.uop.src] == want and s.uop.arg == 0
  assert [p.tensor_device for p in s.uop.src] == list(devs)


def test_construct_on_device_tuple(devs: tuple[str, ...]) -> None:
  x = rand(2, 3)
  for t in (Tensor(x, device=devs), Tensor(x).to(devs), Tensor(x).to(list(devs)), Tensor.zeros(2, 3, device=devs) + Tensor(x, device=devs),
            Tensor.arange(6, device=devs).reshape(2, 3).float() * 0 + Tensor(x).to(devs)):
    assert t.device == devs
    np.testing.assert_array_equal(t.numpy(), x)
  a, b = Tensor.rand(4, device=devs), Tensor.empty(4, device=devs)
  assert a.device == b.device == devs and a.realize().uop.arg is None  # replicated: every device holds the same draw
  vals = [Tensor._wrap(p).numpy() for p in a.uop.src]
  assert all((v == vals[0]).all() for v in vals)


def test_reshard_and_clone(devs: tuple[str, ...]) -> None:
  x = rand(4, 6)
  s = Tensor(x).shard(devs, 0)
  for axis in (1, None, 0):
    r = s.shard(devs, axis).realize()
    assert r.uop.arg == axis
    np.testing.assert_array_equal(r.numpy(), x)
  c = s.clone().realize()
  assert c.uop.arg == 0 and c.uop is not s.realize().uop
  np.testing.assert_array_equal(c.numpy(), x)


# ---- ops equal their single-device results

def test_elementwise(devs: tuple[str, ...]) -> None:
  x, y = rand(4, 6), rand(4, 6)
  for ax in (0, 1):
    xs = Tensor(x).shard(devs, ax)
    close(xs * 2 + 1, x * 2 + 1)
    close((xs + Tensor(y).shard(devs, ax)).relu(), np.maximum(x + y, 0))
    close(xs * Tensor(y).shard(devs, 1 - ax), x * y)  # the other operand resharded by copies
    close(xs - Tensor(y).to(devs), x - y)  # a replicated operand, sliced where it lies
    close(xs.where(Tensor(y).to(devs), 0.0), np.where(x != 0, y, 0.0))
    close(xs + Tensor(y[:1]).to(devs), x + y[:1])  # broadcast along the sharded axis
    close((xs > 0).float().exp(), np.exp((x > 0).astype(np.float32)))


@pytest.mark.parametrize("ax_a", [None, 0, 1])
@pytest.mark.parametrize("ax_b", [None, 0, 1])
def test_matmul(devs: tuple[str, ...], ax_a: int | None, ax_b: int | None) -> None:
  a, b = rand(4, 6), rand(6, 5)
  close(Tensor(a).shard(devs, ax_a) @ Tensor(b).shard(devs, ax_b), a @ b)


@pytest.mark.parametrize("ax", [0, 1])
def test_reduce(devs: tuple[str, ...], ax: int) -> None:
  x = rand(6, 4)
  xs = Tensor(x).shard(devs, ax)
  for axis in (None, 0, 1):
    close(xs.sum(axis), x.sum(axis))
    close(xs.max(axis), x.max(axis))
    close(xs.mean(axis), x.mean(axis))
  close(xs.sum(1, keepdim=True), x.sum(1, keepdims=True))
  close(xs.std(0), x.std(0, ddof=1), 1e-4)
  np.testing.assert_array_equal(xs.argmax(1).numpy(), x.argmax(1))


@pytest.mark.parametrize("ax", [0, 1])
def test_softmax(devs: tuple[str, ...], ax: int) -> None:
  x = rand(4, 6)
  xs = Tensor(x).shard(devs, ax)
  for axis in (0, 1): close(xs.softmax(axis), Tensor(x).softmax(axis).numpy())
  close(xs.log_softmax(-1), Tensor(x).log_softmax(-1).numpy())


@pytest.mark.parametrize("ax", [0, 1, 2])
def test_attention(devs: tuple[str, ...], ax: int) -> None:
  q, k, v = rand(2, 4, 3, 8), rand(2, 4, 5, 8), rand(2, 4, 5, 8)
  want = Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), is_causal=False).numpy()
  qs, ks, vs = (Tensor(t).shard(devs, ax) for t in (q, k, v))  # batch, heads, or the query/key rows
  close(qs.scaled_dot_product_attention(ks, vs), want)
  mask = Tensor(np.tril(np.ones((3, 5), bool)))
  want = Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), attn_mask=mask).numpy()
  close(qs.scaled_dot_product_attention(ks, vs, attn_mask=mask.to(devs)), want)


def test_movement(devs: tuple[str, ...]) -> None:
  x = rand(4, 6)
  xs = Tensor(x).shard(devs, 0)
  close(xs.reshape(4, 2, 3), x.reshape(4, 2, 3))
  close(xs.reshape(24), x.reshape(24))  # merged: the pieces stay whole blocks
  close(xs.reshape(6, 4), x.reshape(6, 4))  # across pieces: gathered first
  close(xs.T, x.T)
  close(xs.permute(1, 0) @ Tensor(x).to(devs), x.T @ x)
  close(xs[1:3], x[1:3])
  close(xs[:, 2:5], x[:, 2:5])
  close(xs[3:], x[3:])
  close(xs.flip(0), x[::-1])
  close(xs.flip(1), x[:, ::-1])
  close(xs.pad(((1, 2), (0, 1))), np.pad(x, ((1, 2), (0, 1))))
  close(xs.unsqueeze(1).expand(4, 3, 6), np.broadcast_to(x[:, None], (4, 3, 6)))
  close(xs.cat(xs, dim=0), np.concatenate([x, x]))
  close(xs.cat(xs, dim=1), np.concatenate([x, x], 1))


def test_gather_and_assign(devs: tuple[str, ...]) -> None:
  x, idx = rand(4, 6), RNG.integers(0, 6, (4, 2)).astype(np.int32)
  xs = Tensor(x).shard(devs, 0)
  close(xs.gather(1, Tensor(idx).shard(devs, 0)), np.take_along_axis(x, idx, 1))
  close(xs.gather(1, Tensor(idx).to(devs)), np.take_along_axis(x, idx, 1))
  t = Tensor(x).shard(devs, 1).realize()
  t.assign(xs * 2).realize()
  assert t.uop.arg == 1
  close(t, x * 2)
  t[1:3] = Tensor(np.zeros((2, 6), np.float32)).to(devs)
  want = x * 2
  want[1:3] = 0
  close(t, want)


def test_devices_of_two_backends(cpu_devices: None) -> None:
  # the pieces' copies between backends go through host memory (their allocators differ), the rest is the same
  x, w = rand(5, 4), rand(4, 3)
  xs = Tensor(x).shard(("CPU:1", "PYTHON:2"), 0)
  close(xs @ Tensor(w).to(("CPU:1", "PYTHON:2")), x @ w)
  close(xs.sum(0), x.sum(0))


# ---- collectives: what runs where

def test_replicated_operand_is_sliced_not_copied() -> None:
  x, y = Tensor(rand(4, 6)).shard(PY4, 0).realize(), Tensor(rand(4, 6)).to(PY4).realize()
  assert copies(lambda: (x + y).realize()) == []


def test_allreduce_copies(devs: tuple[str, ...]) -> None:
  xs = Tensor(rand(8, 3)).shard(devs, 0).realize()
  got = copies(lambda: xs.sum(0).realize())
  n = len(devs)
  assert len(got) == n * (n - 1) and all(nb == 3 * 4 for _, nb in got)  # every device receives every other partial sum
  s = xs.sum(0)
  assert s.schedule() and sum(it.kind == "copy" for it in s.schedule()) == n * (n - 1)


def test_replicated_result_identical_on_every_device(devs: tuple[str, ...]) -> None:
  s = Tensor(rand(64, 5)).shard(devs, 0).sum(0).realize()
  vals = [Tensor._wrap(p).numpy() for p in s.uop.src]
  assert s.uop.arg is None and all((v == vals[0]).all() for v in vals)  # combined in device order everywhere: the same bits


# ---- gradients

def _mlp(x: Tensor, w1: Tensor, w2: Tensor) -> Tensor: return (x @ w1).relu().matmul(w2).log_softmax(-1).mean()


@pytest.mark.parametrize("layout", [(0, None, None), (None, 1, 0), (0, 0, None), (1, 0, 1)], ids=str)
def test_gradients(devs: tuple[str, ...], layout: tuple[int | None, ...]) -> None:
  x, w1, w2 = rand(4, 6), rand(6, 8), rand(8, 3)
  def grads(shard: bool) -> list[np.ndarray]:
    ts = [Tensor(a, requires_grad=True) for a in (x, w1, w2)]
    if shard:
      for t, ax in zip(ts, layout): t.shard_(devs, ax)
    _mlp(*ts).backward()
    if shard:  # each gradient is laid out like its parameter
      for t, ax in zip(ts, layout):
        assert t.grad is not None and t.grad.device == devs and t.grad.realize().uop.arg == ax
    return [t.grad.numpy() for t in ts if t.grad is not None]
  for got, want in zip(grads(True), grads(False)): np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_gradient_through_shard(devs: tuple[str, ...]) -> None:
  x, w = Tensor(rand(4, 6), requires_grad=True), Tensor(rand(6, 2), requires_grad=True)
  (x.shard(devs, 0) @ w.to(devs)).square().sum().backward()
  x2, w2 = Tensor(x.numpy(), requires_grad=True), Tensor(w.numpy(), requires_grad=True)
  (x2 @ w2).square().sum().backward()
  assert x.grad is not None and w.grad is not None and x.grad.device == x.device and w.grad.device == w.device
  close(x.grad, x2.grad.numpy(), 1e-4)  # type: ignore[union-attr]
  close(w.grad, w2.grad.numpy(), 1e-4)  # type: ignore[union-attr]


# ---- JIT

def test_jit_replays_sharded_step(devs: tuple[str, ...]) -> None:
  w = Tensor(rand(6, 3)).to(devs).realize()
  @TinyJit
  def step(x: Tensor) -> tuple[Tensor, Tensor]:
    h = x @ w
    return h.softmax(-1).realize(), h.sum(0).realize()
  for _ in range(4):
    x = rand(4, 6)
    a, b = step(Tensor(x).shard(devs, 0))
    assert a.device == b.device == devs
    close(a, Tensor(x @ w.numpy()).softmax(-1).numpy())
    close(b, (x @ w.numpy()).sum(0))
  assert step.captured is not None and any(ei.runner is None for ei in step.captured.items)  # the all-reduce's copies were captured


# ---- data-parallel training of the digits CNN

def _digits() -> object:
  spec = importlib.util.spec_from_file_location("train_digits", Path(__file__).parents[2] / "examples" / "train_digits.py")
  assert spec is not None and spec.loader is not None
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_data_parallel_digits_step(cpu_devices: None) -> None:
  """Batch sharded along axis 0, weights (and BatchNorm's statistics) replicated, gradients all-reduced in the graph
  (the batch sums of the weights' gradients run over the sharded axis): the parameters after two Adam steps equal the
  single-device ones within rtol 1e-4, atol 1e-5 (float32 sums in another order; measured 8e-7)."""
  from plugrad.nn import get_parameters, get_state_dict
  from plugrad.nn.optim import Adam
  td = _digits()
  x_tr, _, y_tr, _ = td.load_data()  # type: ignore[attr-defined]
  def train(shard: bool) -> dict[str, np.ndarray]:
    Tensor.manual_seed(0)
    model = td.DigitsCNN()  # type: ignore[attr-defined]
    if shard:
      for t in get_state_dict(model).values(): t.to_(CPU2)
    opt = Adam(get_parameters(model), lr=1e-2)
    @TinyJit
    def step(xb: Tensor, yb: Tensor) -> Tensor:
      opt.zero_grad()
      loss = model(xb).sparse_categorical_crossentropy(yb, label_smoothing=0.1)
      loss.backward()
      return loss.realize(*opt.schedule_step())
    Tensor.training = True
    try:
      for b in range(3):  # the third call replays the capture
        xb, yb = Tensor(x_tr[b * 16:(b + 1) * 16]), Tensor(y_tr[b * 16:(b + 1) * 16])
        step(xb.shard(CPU2, 0), yb.shard(CPU2, 0)) if shard else step(xb, yb)
    finally: Tensor.training = False
    state = get_state_dict(model)
    if shard: assert all(t.device == CPU2 for t in state.values())
    return {k: t.numpy() for k, t in state.items()}
  single, parallel = train(False), train(True)
  for k, want in single.items(): np.testing.assert_allclose(parallel[k], want, rtol=1e-4, atol=1e-5, err_msg=k)


# ---- the CPU instances

def test_cpu_instances(cpu_devices: None) -> None:
  from plugrad_cpu.runtime import default_threads
  total = default_threads()
  a, b = Device["CPU"].runtime.threads, Device["CPU:1"].runtime.threads
  assert a + b == max(total, 2) and a >= b >= 1
  assert Device["CPU:1"].allocator.supports_transfer
  with pytest.raises(DeviceIndexError, match="CPU:2"): Tensor([1.0]).to("CPU:2").realize()
  with pytest.raises(DeviceIndexError, match="CPU:2"): Tensor([1.0]).shard(("CPU", "CPU:2"))


def test_cpu_single_instance_by_default() -> None:
  old = os.environ.pop("CPU_DEVICES", None)
  Device.reset()
  try:
    with pytest.raises(DeviceIndexError, match="reports 1 CPU device"): Tensor([1.0, 2.0]).shard(CPU2)
  finally:
    if old is not None: os.environ["CPU_DEVICES"] = old
    Device.reset()


# ---- errors

def test_errors(devs: tuple[str, ...]) -> None:
  xs = Tensor(rand(4, 3)).shard(devs, 0)
  with pytest.raises(DeviceMismatchError, match="different devices"): xs + Tensor(rand(4, 3))
  with pytest.raises(DeviceMismatchError): xs + Tensor(rand(4, 3)).shard(devs[:1], 0)
  with pytest.raises(ShardAxisError, match="out of range"): Tensor(rand(4, 3)).shard(devs, 2)
  with pytest.raises(ShardAxisError): Tensor(rand(4, 3)).shard(devs, -3)
  with pytest.raises(TypeError, match="tuple of devices"): Tensor(rand(2)).shard(devs[0])  # type: ignore[arg-type]
  with pytest.raises(ShardingError, match="several devices|per device"): xs._buffer()
  assert isinstance(DeviceMismatchError("x"), ValueError)
