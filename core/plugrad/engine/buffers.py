"""The device memory behind tensor-graph BUFFER UOps.

A BUFFER UOp (`BUFFER(UNIQUE, DEVICE)`, arg = element count) names one allocation; its `Buffer` is created on first
use and lives as long as the UOp does (a weak map), so a tensor graph that nobody holds frees its memory.
"""
from __future__ import annotations

import itertools
import weakref

import numpy as np

from plugrad.device.buffer import Buffer
from plugrad.device.registry import Device
from plugrad.dtype import DType, dtypes
from plugrad.uop.ops import Ops, UOp

_unique = itertools.count()
_buffers: weakref.WeakKeyDictionary[UOp, Buffer] = weakref.WeakKeyDictionary()


def new_buffer(device: str, size: int, dtype: DType) -> UOp:
  """A fresh BUFFER UOp of `size` elements (shape `(size,)`) on `device`; its memory is allocated when first used."""
  if not isinstance(size, int) or size < 0: raise ValueError(f"a buffer needs a size that is an int >= 0, got {size!r}")
  if dtype.count != 1 or dtype is dtypes.void or dtype is dtypes.index: raise TypeError(f"a buffer needs a scalar storage dtype, got {dtype}")
  return _fresh_uop(dtype, UOp(Ops.DEVICE, dtypes.void, (), Device.canonicalize(device)), size)


def _fresh_uop(dtype: DType, device: UOp, size: int) -> UOp:
  return UOp(Ops.BUFFER, dtype, (UOp(Ops.UNIQUE, dtypes.void, (), next(_unique)), device), size)


def buffer_like(buf: UOp) -> UOp:
  """A fresh BUFFER UOp with the dtype, size and device of BUFFER `buf`."""
  return _fresh_uop(buf.dtype, buf.src[1], buf.arg)


def fresh_buffer(proto: Buffer, device: UOp) -> tuple[UOp, Buffer]:
  """A fresh BUFFER UOp on DEVICE `device` and its allocated Buffer, shaped as the unallocated Buffer `proto`
  (TinyJit's outputs: one pair per output per replay, so it skips `Buffer`'s argument checks)."""
  u = _fresh_uop(proto.dtype, device, proto.size)
  _buffers[u] = buf = proto.clone().allocate()
  return u, buf


def buffer_of(u: UOp) -> Buffer:
  """The device Buffer behind a BUFFER UOp (created, not yet allocated, on first request)."""
  if u.op is not Ops.BUFFER: raise TypeError(f"buffer_of needs a BUFFER UOp, got {u.op!r}")
  if (buf := _buffers.get(u)) is None: buf = _buffers[u] = Buffer(u.src[1].arg, u.arg, u.dtype)
  return buf


def from_numpy(arr: np.ndarray, device: str) -> UOp:
  """A BUFFER holding a copy of `arr`, reshaped to its shape."""
  arr = np.require(arr, requirements="C")  # (ascontiguousarray would make a 0-d array 1-d)
  u = new_buffer(device, int(arr.size), dtypes.from_numpy(arr.dtype))
  if arr.size: buffer_of(u).copyin(arr.reshape(-1).data.cast("B"))
  return u.reshape(arr.shape)
