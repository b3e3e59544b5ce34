"""The optimizer's actions: `Opt(op, axis, amount)`, and the error an action that cannot apply raises (what each action
does: kernel.py and docs/optimizer.md)."""
from __future__ import annotations

import enum
from dataclasses import dataclass


class OptOps(enum.Enum):
  TC = enum.auto(); UPCAST = enum.auto(); UNROLL = enum.auto(); LOCAL = enum.auto(); THREAD = enum.auto()
  GROUP = enum.auto(); GROUPTOP = enum.auto(); NOLOCALS = enum.auto(); PADTO = enum.auto(); SWAP = enum.auto()
  TILE = enum.auto(); PACK = enum.auto()

  def __repr__(self) -> str: return f"OptOps.{self.name}"


@dataclass(frozen=True, order=True)
class Opt:
  """One action: `op` on axis `axis` by `amount` (0 = the whole axis, for UPCAST/UNROLL/LOCAL/GROUP; SWAP: the other
  axis; TC: unused)."""
  op: OptOps
  axis: int | None = None
  amount: int | None = None

  def __repr__(self) -> str: return f"Opt(op={self.op!r}, axis={self.axis}, amount={self.amount})"


class KernelOptError(ValueError):
  """An action that cannot be applied to this kernel on this renderer; the message says why."""
