"""Random tensors from counter-based random bits: element i of a draw is Threefry-2x32 of the counter offset + i under
the seed (a THREEFRY uop per output word, which the codegen lowers to 32-bit integer operations), computed by a kernel
on the device. `Tensor.manual_seed(s)` sets the key and restarts every device's offset at 0; each draw then
advances its device's offset by the number of elements it used, so the stream of one device does not depend on what
was drawn on another, and the same seed gives the same numbers on every device."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from plugrad.dtype import DType, DTypeLike, dtypes, to_dtype
from plugrad.helpers import prod
from plugrad.tensor.creation import canonical_device
from plugrad.tensor.helpers import Devices, argfix, check_shape, const_uop, iota
from plugrad.uop.ops import Ops, UOp

if TYPE_CHECKING:
  from plugrad.tensor.tensor import Tensor

_U64, _U32 = dtypes.uint64, dtypes.uint32


class _RNG:
  seed: int = 0
  offsets: dict[Devices, int] = {}


def manual_seed(seed: int = 0) -> None:
  """Restart the random streams of all devices from `seed`."""
  if not isinstance(seed, int): raise TypeError(f"manual_seed needs an int seed, got {type(seed).__name__}")
  _RNG.seed, _RNG.offsets = seed & (2**64 - 1), {}


def random_bits(n: int, device: Devices, bits: int = 32) -> UOp:
  """The next `n` random words of `device`'s stream: THREEFRY's high output word (uint32), or with `bits=64` both words
  as uint64. The counter is built from 32-bit operations, so every device draws the same numbers. The stream offset
  is data (a two-word buffer of its own per draw), not a constant of the kernel, so every draw of one size runs the
  same compiled kernel: a model's initialization compiles once per parameter shape, not once per parameter."""
  from plugrad.engine.buffers import from_numpy
  from plugrad.engine.multi import per_device
  offset = _RNG.offsets.get(device, 0)  # a device tuple has a stream of its own, drawn alike on each device (replicated)
  _RNG.offsets[device] = offset + n
  start = per_device(device, lambda d: from_numpy(np.array([offset & 0xFFFFFFFF, offset >> 32], np.uint32), d))
  def word(i: int) -> UOp: return start.shrink(((i, i + 1),)).expand((n,))
  if n <= dtypes.max(dtypes.int32):  # the low counter word wraps at most once: carry into the high one
    lo = iota(n, device, dtypes.int32).cast(_U32).alu(Ops.ADD, word(0))
    hi = word(1).alu(Ops.ADD, lo.alu(Ops.CMPLT, word(0)).cast(_U32))
  else:
    wide = word(0).cast(_U64).alu(Ops.OR, word(1).cast(_U64).alu(Ops.SHL, const_uop(32, _U64, device, (n,))))
    ctr = iota(n, device, dtypes.int64).cast(_U64).alu(Ops.ADD, wide)
    lo, hi = ctr.cast(_U32), ctr.alu(Ops.SHR, const_uop(32, _U64, device, (n,))).cast(_U32)
  words = [UOp(Ops.THREEFRY, _U32, (lo, hi), (_RNG.seed, w)) for w in ((1,) if bits == 32 else (1, 0))]
  if bits == 32: return words[0]
  return words[0].cast(_U64).alu(Ops.SHL, const_uop(32, _U64, device, (n,))).alu(Ops.OR, words[1].cast(_U64))


def _uniform_bits(bits: UOp, dt: DType) -> UOp:
  """[0, 1) of dtype `dt` from random words: the top m bits as k * 2^-m, m = the dtype's significand bits (at most the
  word's bits), so every value is exact in `dt` and 1.0 is never produced (rounding a wider float down to half could give 1.0)."""
  width = bits.dtype.itemsize * 8
  m = min(dtypes.finfo(dt)[1] + 1, width)
  work = dtypes.float64 if dt is dtypes.float64 else dtypes.float32
  shape = bits.shape or ()
  k = bits.alu(Ops.SHR, const_uop(width - m, bits.dtype, bits.tensor_device, shape)).cast(work)
  return k.alu(Ops.MUL, const_uop(2.0 ** -m, work, bits.tensor_device, shape)).cast(dt)


def _draw(kind: str, shape: Any, dtype: DTypeLike | None, default: DType) -> tuple[tuple[int, ...], DType]:
  shp = check_shape(argfix(*shape), kind)
  dt = to_dtype(dtype) if dtype is not None else default
  return shp, dt


def _done(t: Tensor, contiguous: bool, requires_grad: bool | None) -> Tensor:
  t = t.contiguous() if contiguous else t
  t.requires_grad = requires_grad
  return t


def rand(cls: type[Tensor], *shape: Any, device: Devices | None = None, dtype: DTypeLike | None = None, contiguous: bool = True,
         requires_grad: bool | None = None) -> Tensor:
  """Uniform in [0, 1)."""
  shp, dt = _draw("rand", shape, dtype, dtypes.default_float)
  if not dtypes.is_float(dt): raise TypeError(f"rand makes floats; got dtype {dt} (use randint for integers)")
  dev = canonical_device(device)
  bits = random_bits(prod(shp), dev, 64 if dtypes.finfo(dt)[1] >= 32 else 32)  # the significand's bits, from one word
  return _done(cls._wrap(_uniform_bits(bits, dt)).reshape(shp), contiguous, requires_grad)


def randn(cls: type[Tensor], *shape: Any, dtype: DTypeLike | None = None, requires_grad: bool | None = None, **kwargs: Any) -> Tensor:
  """Standard normal, by the Box-Muller transform of two uniform draws."""
  shp, dt = _draw("randn", shape, dtype, dtypes.default_float)
  if not dtypes.is_float(dt): raise TypeError(f"randn makes floats; got dtype {dt}")
  work = dtypes.float64 if dt is dtypes.float64 else dtypes.float32
  u1, u2 = (u.reshape(shp) for u in cls.rand(2, *shp, dtype=work, contiguous=False, **kwargs).split(1))
  r = ((1 - u1).log() * -2).sqrt()  # 1 - u is in (0, 1]: no log(0)
  return _done((r * (u2 * (2 * math.pi)).cos()).cast(dt), True, requires_grad)


def randint(cls: type[Tensor], *shape: Any, low: int = 0, high: int = 10, dtype: DTypeLike = dtypes.int32, device: Devices | None = None,
            requires_grad: bool | None = None) -> Tensor:
  """Uniform integers in [low, high)."""
  shp, dt = _draw("randint", shape, dtype, dtypes.int32)
  if not isinstance(low, int) or not isinstance(high, int) or low >= high:
    raise ValueError(f"randint needs int bounds low < high, got {low!r}, {high!r}")
  if not dtypes.is_int(dt): raise TypeError(f"randint makes integers; got dtype {dt}")
  dev = canonical_device(device)
  n = prod(shp)
  bits = random_bits(n, dev, 32 if high - low < 2**32 else 64)
  # the bias is at most (high - low) / 2^32 (2^64 for ranges of 2^32 or more)
  bits = bits.alu(Ops.MOD, const_uop(high - low, bits.dtype, dev, (n,)))
  wide = dtypes.int64 if bits.dtype is _U64 else dt
  ret = cls._wrap(bits.cast(wide).alu(Ops.ADD, const_uop(low, wide, dev, (n,))).cast(dt)).reshape(shp)
  return _done(ret, True, requires_grad)


def uniform(cls: type[Tensor], *shape: Any, low: float = 0.0, high: float = 1.0, dtype: DTypeLike | None = None,
            requires_grad: bool | None = None, **kwargs: Any) -> Tensor:
  dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
  work = dt if dtypes.is_float(dt) else dtypes.default_float
  return _done((cls.rand(*shape, dtype=work, contiguous=False, **kwargs) * (high - low) + low).cast(dt), True, requires_grad)


def normal(cls: type[Tensor], *shape: Any, mean: float = 0.0, std: float = 1.0, requires_grad: bool | None = None, **kwargs: Any) -> Tensor:
  return _done(cls.randn(*shape, **kwargs) * std + mean, True, requires_grad)


def _fan(shape: tuple[Any, ...]) -> tuple[int, int]:
  shp = argfix(*shape)
  if not shp: raise ValueError("an initializer needs a shape with at least one dimension")
  return shp[0], prod(shp[1:])


def scaled_uniform(cls: type[Tensor], *shape: Any, requires_grad: bool | None = None, **kwargs: Any) -> Tensor:
  """Uniform in [-1, 1) scaled by 1/sqrt(numel)."""
  scale = prod(argfix(*shape)) ** -0.5 if prod(argfix(*shape)) else 0.0
  return _done(cls.uniform(*shape, low=-1.0, high=1.0, **kwargs) * scale, True, requires_grad)


def glorot_uniform(cls: type[Tensor], *shape: Any, **kwargs: Any) -> Tensor:
  """Glorot/Xavier: uniform in ±sqrt(6 / (fan_out + fan_in)) with fan_out = shape[0], fan_in = prod(shape[1:])."""
  out, fan_in = _fan(shape)
  bound = math.sqrt(6 / (out + fan_in)) if out + fan_in else 0.0
  return cls.uniform(*shape, low=-bound, high=bound, **kwargs)


def kaiming_uniform(cls: type[Tensor], *shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
  """He initialization for leaky ReLU slope `a`: uniform in ±sqrt(6 / ((1 + a^2) fan_in))."""
  _, fan_in = _fan(shape)
  bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a**2)) / math.sqrt(fan_in) if fan_in else 0.0
  return cls.uniform(*shape, low=-bound, high=bound, **kwargs)


def kaiming_normal(cls: type[Tensor], *shape: Any, a: float = 0.01, **kwargs: Any) -> Tensor:
  """He initialization for leaky ReLU slope `a`: normal with std sqrt(2 / ((1 + a^2) fan_in))."""
  _, fan_in = _fan(shape)
  std = math.sqrt(2.0 / (1 + a**2)) / math.sqrt(fan_in) if fan_in else 0.0
  return cls.normal(*shape, mean=0.0, std=std, **kwargs)


def rand_like(self: Tensor, **kwargs: Any) -> Tensor:
  return type(self).rand(*self.shape, **{"dtype": self.dtype, "device": self.device, **kwargs})


def randn_like(self: Tensor, dtype: DTypeLike | None = None, **kwargs: Any) -> Tensor:
  return type(self).randn(*self.shape, dtype=dtype if dtype is not None else self.dtype, **{"device": self.device, **kwargs})


class RandomMixin:
  """Mixed into `Tensor`: the random constructors (class methods) and the seed."""

  manual_seed = staticmethod(manual_seed)
  rand = classmethod(rand); randn = classmethod(randn); randint = classmethod(randint); uniform = classmethod(uniform)
  normal = classmethod(normal); scaled_uniform = classmethod(scaled_uniform); glorot_uniform = classmethod(glorot_uniform)
  kaiming_uniform = classmethod(kaiming_uniform); kaiming_normal = classmethod(kaiming_normal)
  rand_like = rand_like; randn_like = randn_like
