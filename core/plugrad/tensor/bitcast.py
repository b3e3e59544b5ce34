"""`Tensor.bitcast`: reinterpret the bits of each element. Same-size dtypes are one BITCAST; between sizes the words
are split or joined with shifts on unsigned integers, in little-endian order (what reinterpreting memory gives on
every device plugrad runs on), so the last axis grows or shrinks by the size ratio."""
from __future__ import annotations

from typing import TYPE_CHECKING

from plugrad.dtype import DTypeLike, dtypes, to_dtype
from plugrad.tensor.helpers import const_uop, ints, iota
from plugrad.uop.ops import Ops
from plugrad.uop.shape import ShapeError, fmt

if TYPE_CHECKING:
  from plugrad.tensor.tensor import Tensor

_UINT = {1: dtypes.uint8, 2: dtypes.uint16, 4: dtypes.uint32, 8: dtypes.uint64}


def bitcast(self: Tensor, dtype: DTypeLike) -> Tensor:
  """Reinterpret the bits. Between dtypes of different sizes the last axis grows or shrinks (little-endian order)."""
  dt = to_dtype(dtype)
  if dt.count != 1 or dt.scalar() not in dtypes.all: raise TypeError(f"cannot bitcast to {dt}: a Tensor needs a scalar dtype")
  if dtypes.bool in (self.dtype, dt): raise TypeError(f"bitcast from {self.dtype} to {dt}: bool has no defined bit layout; use cast")
  if dt is self.dtype: return self
  old, new = self.dtype.itemsize, dt.itemsize
  if old == new: return self._wrap(self.uop.bitcast(dt))
  if not self.shape: raise ShapeError(f"bitcast of a 0-d tensor from {self.dtype} to {dt}: the sizes differ, so it needs a last axis")
  last = ints(self.shape, "bitcast between sizes")[-1]
  if (last * old) % new:
    raise ShapeError(f"bitcast of shape {fmt(self.shape)} from {self.dtype} to {dt}: {last} x {old} bytes is not a multiple of {new}")
  words = self.bitcast(_UINT[old]) if self.dtype is not _UINT[old] else self
  ratio = max(old, new) // min(old, new)
  # lane j of a wide word holds bits [8*small*j, 8*small*(j+1)): the shifts along a new last axis
  wide = _UINT[max(old, new)]
  shifts = self._wrap(iota(ratio, self.device, wide).alu(Ops.MUL, const_uop(8 * min(old, new), wide, self.device, (ratio,))))
  if old > new:
    lanes = words.unsqueeze(-1).expand(*self.shape, ratio).rshift(shifts).cast(_UINT[new])
    out = lanes.reshape(*self.shape[:-1], last * ratio)
  else:
    lanes = words.reshape(*self.shape[:-1], last // ratio, ratio).cast(wide).lshift(shifts)
    out = lanes.sum(-1, dtype=wide)  # the lanes' bits do not overlap, so the sum is their OR
  return out if dt is out.dtype else out._wrap(out.uop.bitcast(dt))


class BitcastMixin:
  """Mixed into `Tensor`: `bitcast`."""

  bitcast = bitcast
