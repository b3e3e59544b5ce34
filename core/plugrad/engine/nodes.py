"""What the scheduler's parts ask of a tensor-graph node: its buffer form, whether a kernel may store through it, its
shape, what its kernel computes."""
from __future__ import annotations

from plugrad.uop.ops import Ops, UOp, sint


class ScheduleError(ValueError):
  """A tensor graph that cannot be turned into kernels (e.g. an ASSIGN to something that is not a buffer)."""


def is_buffer_form(u: UOp) -> bool:
  """A node whose value already sits contiguously in one buffer."""
  return u.op is Ops.BUFFER or (u.op is Ops.RESHAPE and u.src[0].op is Ops.BUFFER)


def buffer_uop(u: UOp) -> UOp:
  """The BUFFER of a buffer-form or realized node (a symbolic-size result is a prefix SHRINK of its buffer, reshaped)."""
  while u.op is not Ops.BUFFER: u = u.src[0]
  return u


def is_writable_view(u: UOp) -> bool:
  """A view of a buffer that names each of its elements at most once, so a kernel can store through it."""
  while u.op in (Ops.RESHAPE, Ops.SHRINK, Ops.PERMUTE, Ops.FLIP): u = u.src[0]
  return u.op is Ops.BUFFER


def node_shape(u: UOp) -> tuple[sint, ...]:
  if (s := u.shape) is None: raise ScheduleError(f"a {u.op.name} has no shape and cannot be computed by a kernel")
  return s


def strides_of(shape: tuple[sint, ...]) -> list[sint]:
  out: list[sint] = []
  acc: sint = 1
  for d in reversed(shape):
    out.append(acc)
    acc = acc * d
  return out[::-1]


def value_node(root: UOp) -> UOp | None:
  """What a realized node's kernel computes (None: no kernel, e.g. a copy)."""
  if root.op in (Ops.COPY, Ops.AFTER): return None
  if root.op is Ops.CONTIGUOUS: return root.src[0]
  if root.op is Ops.ASSIGN: return root.src[1]
  return root
