"""Data-parallel training over the ranks of plugrad.distributed (docs/distributed.md): each rank computes the gradients of
its share of the global batch, the gradients are averaged over the ranks in buckets (several gradients flattened into one
buffer, one all-reduce per bucket, all in flight at once), and every rank applies the same update, so the parameters stay
identical. Rank 0's initial parameters are broadcast when the wrapper is made; rank 0 alone writes checkpoints."""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from plugrad.distributed.comm import _dtname, _group, all_reduce, all_reduce_many, barrier, broadcast
from plugrad.dtype import DType, dtypes
from plugrad.engine.jit import TinyJit
from plugrad.nn.optim import Optimizer
from plugrad.nn.state import get_state_dict, safe_save
from plugrad.tensor import Tensor
from plugrad.tensor.helpers import ints

__all__ = ["DistributedOptimizer", "broadcast_parameters", "save_on_rank0"]


def broadcast_parameters(tensors: list[Tensor], src: int = 0) -> None:
  """Overwrite each tensor (realized, in place) with rank `src`'s values: every rank then starts from the same weights."""
  if _group().size == 1: return
  for t in tensors: t.assign(broadcast(t.detach(), src))
  Tensor.realize(*tensors)


def save_on_rank0(obj: Any, path: str | os.PathLike[str], metadata: dict[str, str] | None = None, wait: bool = True) -> None:
  """Write `obj`'s state dict (a model, or a dict of name -> Tensor) to a safetensors file on rank 0 only; with `wait`
  every rank returns once the file is complete (a barrier), so any rank may read it next."""
  if _group().rank == 0: safe_save(obj if isinstance(obj, dict) else get_state_dict(obj), path, metadata)
  if wait: barrier()


class _Bucket:
  """Gradients of one reduction dtype flattened into one buffer: (param, offset, numel) for each."""
  def __init__(self, dtype: DType):
    self.dtype, self.numel = dtype, 0
    self.items: list[tuple[Tensor, int, int]] = []

  def add(self, t: Tensor, n: int) -> None:
    self.items.append((t, self.numel, n))
    self.numel += n


def _reduce_dtype(dt: DType) -> DType: return dtypes.float64 if dt is dtypes.float64 else dtypes.float32


class DistributedOptimizer:
  """Wraps an optimizer for data-parallel training: `step()` (and `schedule_step()`) first average every gradient over
  the ranks, then update. Made on every rank, it broadcasts rank 0's parameters and buffers (`broadcast=False` to skip).
  Gradients go in buckets of up to `bucket_mb` megabytes (a bigger gradient gets a bucket of its own), float16 and
  bfloat16 ones as float32. Other attributes (`lr`, `params`, ...) are the wrapped optimizer's, so a learning-rate
  schedule is made on the wrapped one.

  Under TinyJit, the all-reduce (host code) must sit between two captures: `make_step(loss_fn)` builds that step."""
  def __init__(self, optimizer: Optimizer, bucket_mb: float = 25.0, broadcast: bool = True):
    if not isinstance(optimizer, Optimizer):
      raise TypeError(f"DistributedOptimizer wraps a plugrad.nn.optim.Optimizer, got a {type(optimizer).__name__}")
    if not isinstance(bucket_mb, (int, float)) or not bucket_mb > 0:
      raise ValueError(f"DistributedOptimizer: bucket_mb must be a number > 0, got {bucket_mb!r}")
    self.optimizer, self.bucket_bytes = optimizer, int(bucket_mb * 2**20)
    self._layout: tuple[tuple[int, tuple[int, ...], DType], ...] | None = None
    self._buckets: list[_Bucket] = []
    if broadcast: broadcast_parameters([*optimizer.params, *optimizer.buffers])

  def __getattr__(self, name: str) -> Any:
    if name == "optimizer": raise AttributeError(name)  # (not set yet: __init__ failed)
    return getattr(self.optimizer, name)

  @property
  def world_size(self) -> int: return _group().size

  def zero_grad(self) -> None: self.optimizer.zero_grad()

  def step(self) -> None:
    """Average the gradients over the ranks, then apply the wrapped optimizer's update."""
    self.sync_gradients()
    self.optimizer.step()

  def schedule_step(self) -> list[Tensor]:
    """As Optimizer.schedule_step, after averaging the gradients (which realizes them: not inside a TinyJit capture)."""
    self.sync_gradients()
    return self.optimizer.schedule_step()

  def sync_gradients(self) -> None:
    """Replace each gradient by its mean over the ranks (nothing to do in a world of one)."""
    if self.world_size > 1: self.apply_flat(self.all_reduce_flat(self.flat_grads()))

  # ---- the three parts of a step, for a step split around TinyJit captures
  def buckets(self) -> list[_Bucket]:
    """The buckets of the parameters that have a gradient now, in parameter order (recomputed when that set changes)."""
    live = [t for t in self.optimizer.params if t.grad is not None]
    if not live: raise RuntimeError("DistributedOptimizer: no parameter has a gradient; call loss.backward() first")
    layout = tuple((id(t), ints(t.shape, 'DistributedOptimizer'), t.grad.dtype) for t in live if t.grad is not None)
    if layout != self._layout:
      self._layout, self._buckets = layout, []
      open_: dict[DType, _Bucket] = {}
      for t, (_, shape, dt) in zip(live, layout):
        rdt, n = _reduce_dtype(dt), int(np.prod(shape, dtype=np.int64))
        b = open_.get(rdt)
        if b is None or (b.numel and (b.numel + n) * rdt.itemsize > self.bucket_bytes):
          b = open_[rdt] = _Bucket(rdt)
          self._buckets.append(b)
        b.add(t, n)
    return self._buckets

  def flat_grads(self) -> list[Tensor]:
    """One lazy flat tensor per bucket: the bucket's gradients, flattened and concatenated."""
    flats = []
    for b in self.buckets():
      parts = [t.grad.flatten().cast(b.dtype) for t, _, _ in b.items if t.grad is not None]
      flats.append(parts[0] if len(parts) == 1 else parts[0].cat(*parts[1:]))
    return flats

  def all_reduce_flat(self, flats: list[Tensor]) -> list[Tensor]:
    """The buckets' means over the ranks: new tensors (all buckets in flight at once; host staging)."""
    bs = self.buckets()
    if len(flats) != len(bs) or any(tuple(f.shape) != (b.numel,) for f, b in zip(flats, bs)):
      raise ValueError(f"all_reduce_flat: expected {len(bs)} flat buckets of sizes {[b.numel for b in bs]}, "
                       f"got shapes {[tuple(f.shape) for f in flats]}")
    if self.world_size == 1: return flats
    Tensor.realize(*flats)
    sizes = ", ".join(f"{b.numel} x {_dtname(b.dtype)}" for b in bs)
    return all_reduce_many(flats, "mean", f"DistributedOptimizer gradient all-reduce of {len(bs)} bucket(s): {sizes}")

  def apply_flat(self, flats: list[Tensor]) -> None:
    """Set each parameter's gradient to its slice of the reduced bucket (lazy views: they fuse into the update)."""
    for b, f in zip(self.buckets(), flats):
      for t, off, n in b.items:
        assert t.grad is not None  # buckets() holds only parameters with a gradient
        t.grad = f[off:off + n].reshape(t.shape).cast(t.grad.dtype)

  def sync_buffers(self) -> None:
    """Average the float buffers (BatchNorm's running statistics: each rank saw only its share of the batch) over the
    ranks, in place; call it on every rank before evaluating or saving."""
    if self.world_size == 1: return
    bufs = [t for t in self.optimizer.buffers if dtypes.is_float(t.dtype)]
    for t in bufs: t.assign(all_reduce(t.detach(), "mean"))
    Tensor.realize(*bufs)

  def make_step(self, loss_fn: Callable[..., Tensor], jit: bool = True) -> Callable[..., Tensor]:
    """A training step `step(*args) -> loss` (this rank's loss): zero_grad, `loss_fn(*args)`, backward, the gradient
    all-reduce, the update. With `jit`, the part before the all-reduce and the update are each a TinyJit capture, so
    from the third call on only the all-reduce runs Python code."""
    def grads(*args: Any) -> tuple[Tensor, list[Tensor]]:
      self.optimizer.zero_grad()
      loss = loss_fn(*args)
      loss.backward()
      flats = self.flat_grads()
      Tensor.realize(loss, *flats)
      return loss, flats

    def update(*flats: Tensor) -> Tensor:
      self.apply_flat(list(flats))
      Tensor.realize(*self.optimizer.schedule_step())
      return self.optimizer.lr

    run_grads, run_update = (TinyJit(grads), TinyJit(update)) if jit else (grads, update)
    def step(*args: Any) -> Tensor:
      loss, flats = run_grads(*args)
      run_update(*self.all_reduce_flat(flats))
      return loss
    return step
