"""Tensor constructors: from Python or numpy data, constants, ranges and grids. Constants and ranges are built in the
graph (a CONST broadcast, an index ramp), so they cost no host data; only `Tensor(data)` uploads memory."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from plugrad.dtype import INVERSE_NAMES, DType, DTypeLike, DTypeRangeError, check_fits, dtypes, to_dtype
from plugrad.helpers import prod
from plugrad.tensor.helpers import ArgumentError, Devices, DTypeNotImplementedError, argfix, check_shape, const_uop, iota, tensor_cls
from plugrad.uop.ops import Ops, UOp
from plugrad.uop.shape import ShapeError, fmt

if TYPE_CHECKING:
  from plugrad.tensor.tensor import Tensor


def canonical_device(device: Devices | list[str] | None) -> Devices:
  """The canonical name of `device` (the default device for None); a tuple or list of names gives the tuple of their
  canonical names, the devices of a multi-device tensor (docs/sharding.md)."""
  from plugrad.device.registry import Device
  if isinstance(device, (tuple, list)):
    if not device: raise ValueError("a device tuple needs at least one device")
    for d in device:
      if not isinstance(d, str): raise TypeError(f"a device tuple holds device name strs, got {type(d).__name__} {d!r}")
    from plugrad.engine.multi import note_multi
    note_multi()
    return tuple(Device.canonicalize(d) for d in device)
  if device is not None and not isinstance(device, str):
    raise TypeError(f"device must be a device name str, a tuple of them or None, got {type(device).__name__}")
  return Device.canonicalize(device) if device is not None else Device.DEFAULT


# the dtypes a device may lack (Renderer.dtype_support); every other dtype is never checked, so the common case costs nothing
MAY_LACK = frozenset({dtypes.float16, dtypes.bfloat16, dtypes.float64, dtypes.int64, dtypes.uint64})


def dtype_problem(device: Devices, dt: DType) -> str | None:
  """Why `device` (every device of a tuple) cannot hold or compute `dt`, or None when it can (its renderer's `dtype_support`)."""
  if dt.scalar() not in MAY_LACK: return None
  from plugrad.device.registry import Device
  if isinstance(device, tuple): return next((f"{d}: {why}" for d in device if (why := dtype_problem(d, dt)) is not None), None)
  return Device[device].renderer.dtype_support(dt.scalar())


def require_dtype(device: Any, dt: DType, why: str = "") -> None:
  """Raise UnsupportedDTypeError when `device` (or a device of a tuple) cannot hold or compute `dt` (its renderer's
  `dtype_support` says why). `why` says what needed the dtype when the user did not ask for it by name (a random draw's uint64 bits)."""
  if dt.scalar() not in MAY_LACK or not isinstance(device, (str, tuple)): return
  from plugrad.errors import UnsupportedDTypeError
  if (reason := dtype_problem(device, dt)) is not None:
    name = INVERSE_NAMES.get(dt.scalar(), str(dt))
    raise UnsupportedDTypeError(f"{device} does not support {name} ({reason}){f'; {why} needs it' if why else ''}")


MAX_DIMS = 64  # numpy's limit on an array's dimensions, so the deepest nested list np.array could take


class TensorDataError(TypeError, ValueError):
  """Data `Tensor(...)` cannot take as it is: a numpy masked array (its mask would be silently dropped), or lists
  nested deeper than MAX_DIMS. A TypeError and a ValueError, whichever the caller catches for bad data."""


def _check_nesting(data: Any) -> None:
  # along the first elements only, without recursion: a ragged deeper branch is caught by the RecursionError below
  depth, x = 0, data
  while isinstance(x, (list, tuple)) and depth <= MAX_DIMS:
    depth, x = depth + 1, (x[0] if x else None)
  if depth > MAX_DIMS:
    raise TensorDataError(f"Tensor data is a list nested more than {MAX_DIMS} levels deep; a tensor has at most {MAX_DIMS} dimensions")


def uop_from_data(data: Any, device: Devices, dtype: DType | None) -> UOp:
  """The tensor-graph UOp holding `data`: an uploaded BUFFER of its own (one on each device of a tuple: replicated).
  (Not a CONST for Python scalars: equal constants are one hash-consed node, so a scalar parameter would share its
  identity, and its gradient, with every equal constant.)"""
  if isinstance(device, tuple):
    from plugrad.engine.multi import per_device
    return per_device(device, lambda d: uop_from_data(data, d, dtype))
  from plugrad.engine.buffers import from_numpy
  if isinstance(data, np.generic): data = np.asarray(data)
  if isinstance(data, (bool, int, float)):
    dt = dtype or dtypes.from_py(data)
    if isinstance(data, int) and not isinstance(data, bool): check_fits(data, dt, f"Tensor({data})")
    u = from_numpy(np.array(data, np.float32 if dt is dtypes.bfloat16 else dtypes.to_numpy(dt)), device)
    return u.cast(dt) if u.dtype is not dt else u
  if data is None: data = np.zeros((0,), dtypes.to_numpy(dtype or dtypes.default_float) if dtype is not dtypes.bfloat16 else np.float32)
  if isinstance(data, bytes): data = np.frombuffer(data, np.uint8)
  if isinstance(data, (list, tuple)):
    _check_nesting(data)
    try:
      content = dtypes.from_py(data)  # also rejects anything that is not a number or a bool
      dt = dtype or content
      arr = np.array(data, dtype=np.float32 if dt is dtypes.bfloat16 else dtypes.to_numpy(dt))
    except RecursionError:
      raise TensorDataError(f"Tensor data is a list nested too deeply (a tensor has at most {MAX_DIMS} dimensions)") from None
    except OverflowError as e:
      raise DTypeRangeError(f"Tensor data does not fit in {dt!r} (range {dt.min}..{dt.max}; {e}); pass a wider dtype") from None
    except ValueError as e: raise ValueError(f"Tensor data must be a rectangular nested list ({e})") from None
    u = from_numpy(arr, device)
    return u.cast(dt) if u.dtype is not dt else u
  if isinstance(data, np.ma.MaskedArray):
    raise TensorDataError("Tensor from a numpy masked array: the mask would be dropped; pass arr.filled(value) (masked entries set to value) "
                          "or arr.data (the raw values) to say what the masked entries hold")
  if isinstance(data, np.ndarray):
    # a byte-swapped (e.g. big-endian '>f4') array: its values in native order, then converted to `dtype` as any other
    if not data.dtype.isnative and data.dtype.kind in "biuf": data = data.astype(data.dtype.newbyteorder("="))
    if data.dtype.kind not in "biuf" or data.dtype.itemsize > 8:
      raise TypeError(f"Tensor from a numpy array of dtype {data.dtype}: only bool, int, uint and float arrays (up to 64 bits) are supported")
    if dtype is not None and dtype is not dtypes.bfloat16 and dtypes.from_numpy(data.dtype) is not dtype: data = data.astype(dtypes.to_numpy(dtype))
    u = from_numpy(data, device)
    return u.cast(dtype) if dtype is not None and u.dtype is not dtype else u
  raise TypeError(f"cannot make a Tensor from a {type(data).__name__}; pass a Python scalar, a (nested) list or tuple, a numpy array, bytes or a UOp")


def _finish(t: Tensor, requires_grad: bool | None) -> Tensor:
  t.requires_grad = requires_grad
  return t


def full(cls: type[Tensor], shape: Any, fill_value: Any, dtype: DTypeLike | None = None, device: Devices | None = None, buffer: bool = True,
         requires_grad: bool | None = None) -> Tensor:
  """`shape` filled with `fill_value`. With `buffer` (the default) it gets its own memory, so in-place updates of one
  filled tensor never reach another; `buffer=False` gives a broadcast constant that costs nothing."""
  from plugrad.engine.buffers import new_buffer
  from plugrad.engine.multi import per_device
  raw = argfix(shape) if isinstance(shape, (tuple, list)) else (shape,)
  if any(isinstance(s, UOp) for s in raw): return _full_symbolic(cls, raw, fill_value, dtype, device, buffer, requires_grad)
  shape = check_shape(raw, "full")
  dt = to_dtype(dtype) if dtype is not None else fill_value.dtype if isinstance(fill_value, UOp) else dtypes.from_py(fill_value)
  if isinstance(fill_value, np.generic): fill_value = fill_value.item()
  check_fits(fill_value, dt, "full")
  dev = canonical_device(device)
  val = const_uop(fill_value, dt, dev, shape)
  if buffer and prod(shape): val = UOp(Ops.ASSIGN, dt, (per_device(dev, lambda d: new_buffer(d, prod(shape), dt).reshape(shape)), val))
  return _finish(cls._wrap(val), requires_grad)


def _full_symbolic(cls: type[Tensor], shape: tuple[Any, ...], fill_value: Any, dtype: DTypeLike | None, device: Devices | None, buffer: bool,
                   requires_grad: bool | None) -> Tensor:
  """full() of a shape holding bound Variables: its buffer is sized for their largest values and the tensor is the
  leading part of it (a shrink), filled by one kernel that takes the values."""
  from plugrad.engine.buffers import new_buffer
  from plugrad.engine.multi import per_device
  for s in shape:
    if isinstance(s, UOp) and (s.dtype is not dtypes.index or s.vmin < 0): raise ValueError(f"full: a symbolic size must be a bound Variable "
                                                                                          f"expression >= 0 (dtypes.index), got {s.render()}")
    if not isinstance(s, UOp) and (not isinstance(s, int) or isinstance(s, bool) or s < 0): raise ValueError(f"full: a shape must be ints >= 0 or "
                                                                                                            f"bound Variables, got {shape!r}")
  if isinstance(fill_value, UOp): raise TypeError("full: a symbolic shape takes a Python fill value")
  dt = to_dtype(dtype) if dtype is not None else dtypes.from_py(fill_value)
  if isinstance(fill_value, np.generic): fill_value = fill_value.item()
  check_fits(fill_value, dt, "full")
  dev = canonical_device(device)
  val = const_uop(fill_value, dt, dev, shape)
  if buffer:
    size = prod(shape)
    def target(d: str) -> UOp:
      return new_buffer(d, int(size.simplify().vmax) if isinstance(size, UOp) else size, dt).shrink(((0, size),)).reshape(shape)
    val = UOp(Ops.ASSIGN, dt, (per_device(dev, target), val))
  return _finish(cls._wrap(val), requires_grad)


def full_like(self: Tensor, fill_value: Any, dtype: DTypeLike | None = None, device: Devices | None = None, buffer: bool = True,
              requires_grad: bool | None = None) -> Tensor:
  return type(self).full(self.shape, fill_value, dtype if dtype is not None else self.dtype, device if device is not None else self.device, buffer,
                         requires_grad)


def zeros(cls: type[Tensor], *shape: Any, **kwargs: Any) -> Tensor: return cls.full(argfix(*shape), 0.0, **kwargs)
def ones(cls: type[Tensor], *shape: Any, **kwargs: Any) -> Tensor: return cls.full(argfix(*shape), 1.0, **kwargs)
def zeros_like(self: Tensor, **kwargs: Any) -> Tensor: return self.full_like(0, **kwargs)
def ones_like(self: Tensor, **kwargs: Any) -> Tensor: return self.full_like(1, **kwargs)


def empty(cls: type[Tensor], *shape: Any, device: Devices | None = None, dtype: DTypeLike | None = None, requires_grad: bool | None = None) -> Tensor:
  """Uninitialized memory of `shape` (its contents are whatever the allocator hands out)."""
  from plugrad.engine.buffers import new_buffer
  from plugrad.engine.multi import per_device
  shp = check_shape(argfix(*shape), "empty")
  dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
  return _finish(cls._wrap(per_device(canonical_device(device), lambda d: new_buffer(d, prod(shp), dt).reshape(shp))), requires_grad)


def empty_like(self: Tensor, dtype: DTypeLike | None = None, device: Devices | None = None, requires_grad: bool | None = None) -> Tensor:
  return type(self).empty(self.shape, dtype=dtype if dtype is not None else self.dtype, device=device if device is not None else self.device,
                          requires_grad=requires_grad)


def arange(cls: type[Tensor], start: int | float, stop: int | float | None = None, step: int | float = 1, dtype: DTypeLike | None = None,
           device: Devices | None = None, requires_grad: bool | None = None) -> Tensor:
  """[start, start+step, ...) up to `stop` (exclusive); `arange(n)` is [0, n); a range whose step points away from
  `stop` is empty (numpy). PyTorch's dtype rule: integer bounds give the default int (int64 when a value does not fit
  it), a float anywhere the default float. With an integer `dtype` and float bounds, the float values are truncated."""
  if stop is None: start, stop = 0, start
  start, stop, step = (v.item() if isinstance(v, np.generic) else v for v in (start, stop, step))
  if isinstance(stop, UOp): return _arange_symbolic(cls, start, stop, step, dtype, device, requires_grad)
  for v in (start, stop, step):
    if not isinstance(v, (int, float)): raise TypeError(f"arange takes int or float bounds, got {type(v).__name__} {v!r}")
  for v in (start, stop, step):
    if isinstance(v, float) and not math.isfinite(v): raise ValueError(f"arange: bounds must be finite, got start={start}, stop={stop}, step={step}")
  if step == 0: raise ValueError("arange: step must not be 0")
  floats = any(isinstance(v, float) for v in (start, stop, step))
  n = int(max(math.ceil((stop - start) / step), 0) if floats else max(-((start - stop) // step), 0))
  last = start + (n - 1) * step if n else start
  if dtype is not None: dt = to_dtype(dtype)
  elif floats: dt = dtypes.default_float
  else: dt = dtypes.default_int if all(dtypes.default_int.min <= v <= dtypes.default_int.max for v in (start, last)) else dtypes.int64
  if n and dtypes.is_int(dt):
    for v in (start, last): check_fits(v, dt, f"arange({start}, {stop}, {step})")
  dev = canonical_device(device)
  idx = iota(n, dev, dtypes.int64 if n > dtypes.max(dtypes.int32) else dtypes.int32)
  if dtypes.is_float(dt) or not floats: ramp = cls._wrap(idx.cast(dt)) * step + start  # integers: exact, in the result dtype
  else: ramp = (cls._wrap(idx.cast(dtypes.default_float)) * step + start).cast(dt)
  return _finish(ramp.cast(dt), requires_grad)


def _arange_symbolic(cls: type[Tensor], start: Any, stop: UOp, step: Any, dtype: DTypeLike | None, device: Devices | None,
                     requires_grad: bool | None) -> Tensor:
  """arange up to a bound Variable expression: [start, stop) with an int start and step 1, a symbolic length."""
  if not isinstance(start, int) or isinstance(start, bool) or step != 1 or stop.dtype is not dtypes.index:
    raise TypeError(f"arange with a Variable stop takes an int start and step 1, got start={start!r}, stop={stop.render()}, step={step!r}")
  n = (stop - start).simplify()
  if n.vmin < 0: raise ValueError(f"arange({start}, {stop.render()}): the stop can be below the start")
  dt = to_dtype(dtype) if dtype is not None else dtypes.default_int
  if dtypes.is_int(dt): check_fits(start + int(n.vmax), dt, f"arange({start}, {stop.render()})")
  idx = UOp(Ops.IOTA, dtypes.int32, (UOp(Ops.DEVICE, dtypes.void, (), canonical_device(device)),), n)
  return _finish(cls._wrap(idx.cast(dt)) + start if start else cls._wrap(idx.cast(dt)), requires_grad)


def linspace(cls: type[Tensor], start: int | float, stop: int | float, steps: int, dtype: DTypeLike | None = None, device: Devices | None = None,
             requires_grad: bool | None = None) -> Tensor:
  """`steps` evenly spaced values from `start` to `stop`, both included."""
  # PyTorch's types: a non-int count is a TypeError, a negative one a RuntimeError (ArgumentError is also tinygrad's ValueError)
  if not isinstance(steps, int) or isinstance(steps, bool): raise TypeError(f"linspace: steps must be an int >= 0, got {steps!r}")
  if steps < 0: raise ArgumentError(f"linspace: steps must be an int >= 0, got {steps!r}")
  dt = to_dtype(dtype) if dtype is not None else dtypes.default_float
  if dt is dtypes.bool: raise DTypeNotImplementedError("linspace is not defined for dtypes.bool")
  work = dtypes.float64 if dt is dtypes.float64 else dtypes.float32
  dev = canonical_device(device)
  if steps == 1: return _finish(cls._wrap(const_uop(start, work, dev, (1,))).cast(dt), requires_grad)
  idx = cls._wrap(iota(steps, dev, dtypes.int32).cast(work))
  ramp = idx * ((stop - start) / max(steps - 1, 1)) + start
  return _finish(idx.eq(steps - 1).where(float(stop), ramp).cast(dt), requires_grad)  # the end point exactly, like numpy


def eye(cls: type[Tensor], n: int, m: int | None = None, dtype: DTypeLike | None = None, device: Devices | None = None,
        requires_grad: bool | None = None) -> Tensor:
  m = n if m is None else m
  if not all(isinstance(v, int) and v >= 0 for v in (n, m)): raise ValueError(f"eye: sizes must be ints >= 0, got n={n!r}, m={m!r}")
  dev = canonical_device(device)
  rows, cols = cls._wrap(iota(n, dev)).reshape(n, 1), cls._wrap(iota(m, dev)).reshape(1, m)
  return _finish(rows.eq(cols).cast(to_dtype(dtype) if dtype is not None else dtypes.default_float), requires_grad)


def meshgrid(self: Tensor, *args: Tensor, indexing: str = "ij") -> tuple[Tensor, ...]:
  """Coordinate grids from 0-d or 1-d tensors: with "ij" output i varies along axis i; "xy" swaps the first two axes.
  The tensors may differ in dtype (each grid keeps its own, as tinygrad; PyTorch requires one dtype)."""
  T = tensor_cls()
  if indexing not in ("ij", "xy"): raise ArgumentError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
  for t in args:
    if not isinstance(t, T): raise TypeError(f"meshgrid takes Tensors, got a {type(t).__name__} ({t!r:.60})")
    if t.device != self.device: raise ValueError(f"meshgrid: tensors on different devices ({self.device} and {t.device}); move one with .to()")
  ts = [t.reshape(-1) if t.ndim == 0 else t for t in (self, *args)]
  for t in ts:
    if t.ndim != 1: raise ShapeError(f"meshgrid takes 0-d or 1-d tensors, got shape {fmt(t.shape)}")
  sizes = [t.shape[0] for t in ts]
  if indexing == "xy" and len(ts) >= 2: sizes[0], sizes[1] = sizes[1], sizes[0]
  out = []
  for i, t in enumerate(ts):
    axis = (1 - i if i < 2 else i) if indexing == "xy" and len(ts) >= 2 else i
    out.append(t.reshape(tuple(s if j == axis else 1 for j, s in enumerate(sizes))).expand(tuple(sizes)))
  return tuple(out)


class CreationMixin:
  """Mixed into `Tensor`: the constructors (class methods) and the `*_like` methods."""

  full = classmethod(full); zeros = classmethod(zeros); ones = classmethod(ones); empty = classmethod(empty)
  arange = classmethod(arange); linspace = classmethod(linspace); eye = classmethod(eye)
  full_like = full_like; zeros_like = zeros_like; ones_like = ones_like; empty_like = empty_like; meshgrid = meshgrid
