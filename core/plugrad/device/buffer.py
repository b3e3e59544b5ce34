"""`Buffer`: a typed, lazily allocated piece of device memory (or a view into one).

A Buffer knows its device, element count and dtype from the start, but takes memory from the device's allocator
only when something needs it (`allocate`, a copy in, a kernel launch): the scheduler creates many buffers that the
memory planner later merges, so eager allocation would waste memory and time.
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

from plugrad.device.allocator import Allocator, BufferSpec
from plugrad.device.registry import Device
from plugrad.dtype import DType, PtrDType, dtypes

_KINDS = {**dict.fromkeys("efd", "float"), **dict.fromkeys("bhilqn", "int"), **dict.fromkeys("BHILQN", "uint"), "?": "bool"}


def _kind(dt: DType) -> str: return "bool" if dt is dtypes.bool else "float" if dtypes.is_float(dt) else "uint" if dtypes.is_unsigned(dt) else "int"


class Buffer:
  """`size` elements of `dtype` on `device`. With `base`, a view of `size` elements at byte `offset` of that buffer's memory.

  `allocator` is for callers that hold an allocator but no registered device (allocator tests, a backend's own unit
  tests); normally the allocator is `Device[device].allocator`.
  """
  def __init__(self, device: str, size: int, dtype: DType, options: BufferSpec | None = None, base: Buffer | None = None, offset: int = 0,
               initial_value: bytes | bytearray | memoryview | None = None, *, allocator: Allocator | None = None):
    self._handle: Any = None
    self._base: Buffer | None = None
    if not isinstance(size, int) or isinstance(size, bool) or size < 0: raise ValueError(f"Buffer size must be an int >= 0 (elements), got {size!r}")
    if not isinstance(dtype, DType) or isinstance(dtype, PtrDType) or dtype.count != 1 or dtype.scalar() not in dtypes.all:
      raise TypeError(f"Buffer dtype must be a scalar dtype (one of {', '.join(map(repr, dtypes.all))}), got {dtype!r}")
    if options is not None and not isinstance(options, BufferSpec):
      raise TypeError(f"Buffer options must be a BufferSpec or None, got {type(options).__name__}")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
      raise ValueError(f"Buffer offset must be an int >= 0 (bytes), got {offset!r}")
    self.size, self.dtype, self.offset = size, dtype, offset
    self._view_of: Any = None  # the base handle this view's handle was derived from
    if base is not None: self._init_view(device, base, options, initial_value, allocator)
    else:
      if offset != 0: raise ValueError(f"Buffer offset {offset} needs a base buffer to be an offset into")
      self.options = options
      self.device, self._dev = _resolve(device, allocator)
      self._allocator = allocator
      if initial_value is not None: self.allocate().copyin(initial_value if isinstance(initial_value, memoryview) else memoryview(initial_value))

  def _init_view(self, device: str, base: Buffer, options: BufferSpec | None, initial_value: Any, allocator: Allocator | None) -> None:
    if not isinstance(base, Buffer): raise TypeError(f"Buffer base must be a Buffer, got {type(base).__name__}")
    if initial_value is not None: raise ValueError("a view Buffer takes no initial_value: it shares its base's memory (copyin to it instead)")
    if options is not None and options != base.options: raise ValueError(f"a view has its base's options ({base.options}), got {options}")
    if allocator is not None and allocator is not base.allocator: raise ValueError("a view uses its base's allocator; do not pass another one")
    if base._base is not None: self.offset, base = self.offset + base.offset, base._base  # views of views point at the root
    if device != base.device and base._dev is not None: device = _resolve(device, None)[0]  # an alias of the base's device is fine
    if device != base.device:
      raise ValueError(f"a view on device {device} of a base buffer on device {base.device}: a view must be on its base's device")
    if self.offset + self.nbytes > base.nbytes:
      raise ValueError(f"view of {self.nbytes} bytes at byte offset {self.offset} does not fit in its base of {base.nbytes} bytes ({base!r})")
    self._base, self.device, self._dev, self._allocator, self.options = base, base.device, base._dev, base._allocator, base.options

  # ---- identity and memory
  @property
  def nbytes(self) -> int: return self.size * self.dtype.itemsize
  @property
  def base(self) -> Buffer: return self if self._base is None else self._base
  @property
  def allocator(self) -> Allocator:
    if self._allocator is None: self._allocator = self._dev.allocator
    return self._allocator

  def is_allocated(self) -> bool: return self.base._handle is not None

  def allocate(self) -> Buffer:
    """Take memory from the allocator (a view allocates its base). Allocating twice is an error: use `ensure_allocated`."""
    if self.is_allocated(): raise ValueError(f"{self!r} is already allocated")
    if self._base is not None:
      self._base.allocate()
      _ = self.handle  # derive the view's handle now, so an allocator without views fails here, not at first use
    else: self._handle = self.allocator.alloc(self.nbytes, self.options)
    return self

  def ensure_allocated(self) -> Buffer: return self if self.is_allocated() else self.allocate()

  def deallocate(self) -> None:
    """Return the memory to the allocator (its cache). A view only forgets its derived handle."""
    if self._base is not None: self._handle = self._view_of = None
    elif self._handle is not None:
      handle, self._handle = self._handle, None
      self.allocator.free(handle, self.nbytes, self.options)

  @property
  def handle(self) -> Any:
    """The allocator's handle for this buffer's memory (what a runtime is launched with)."""
    if self._base is None:
      if self._handle is None: raise ValueError(f"{self!r} is not allocated")
      return self._handle
    bh = self._base.handle
    if self._view_of is not bh:  # first use, or the base was re-allocated since
      self._handle, self._view_of = self.allocator.offset(bh, self.offset, self.nbytes), bh
    return self._handle

  def __del__(self) -> None:
    if self._base is None and self._handle is not None and not sys.is_finalizing(): self.deallocate()

  def __repr__(self) -> str:
    state = "allocated" if self.is_allocated() else "not allocated"
    where = f", view at byte {self.offset} of {self._base.dtype!r}[{self._base.size}]" if self._base is not None else ""
    opts = f", {self.options}" if self.options is not None else ""
    return f"<Buffer {self.device} {self.dtype!r}[{self.size}] ({self.nbytes} bytes{where}{opts}, {state})>"

  def clone(self) -> Buffer:
    """A new, unallocated buffer with this one's device, size, dtype and options (of a view: a base buffer of the view's
    size). It skips the constructor's checks, which this buffer passed."""
    b = object.__new__(Buffer)
    b._handle = b._base = b._view_of = None
    b.size, b.dtype, b.offset, b.options = self.size, self.dtype, 0, self.options
    b.device, b._dev, b._allocator = self.device, self._dev, self._allocator
    return b

  def view(self, size: int, dtype: DType, offset: int = 0) -> Buffer:
    """`size` elements of `dtype` at byte `offset` of this buffer, sharing its memory (and keeping it alive)."""
    return Buffer(self.device, size, dtype, base=self, offset=offset)

  # ---- host data movement
  def _host_mv(self, mv: Any, what: str, writable: bool) -> memoryview:
    if isinstance(mv, (bytes, bytearray)): mv = memoryview(mv)
    if not isinstance(mv, memoryview): raise TypeError(f"{what} needs a memoryview (or bytes/bytearray), got {type(mv).__name__}")
    if writable and mv.readonly: raise ValueError(f"{what} needs a writable memoryview, got a read-only one")
    if not mv.c_contiguous: raise ValueError(f"{what} needs a C-contiguous memoryview")
    if mv.nbytes != self.nbytes:
      raise ValueError(f"{what} size mismatch: {self!r} holds {self.nbytes} bytes ({self.size} x {self.dtype!r}), "
                       f"the memoryview has {mv.nbytes} bytes")
    fmt = mv.format.lstrip("@=<>!")
    if fmt not in ("B", "b", "c") and (_KINDS.get(fmt) != _kind(self.dtype) or mv.itemsize != self.dtype.itemsize):
      raise TypeError(f"{what} dtype mismatch: {self!r} has {self.dtype!r} elements, the memoryview has format {mv.format!r} "
                      f"({mv.itemsize}-byte items); pass bytes (memoryview.cast('B')) to copy raw memory")
    return mv.cast("B") if fmt != "B" or mv.ndim != 1 else mv

  def copyin(self, mv: memoryview) -> Buffer:
    """Copy host memory (exactly `nbytes`) into the buffer, allocating it if needed."""
    src = self._host_mv(mv, "copyin", writable=False)
    self.ensure_allocated()
    self.allocator.copyin(self.handle, src)
    return self

  def copyout(self, mv: memoryview) -> memoryview:
    """Copy the buffer into `mv` (exactly `nbytes`, writable) and return it."""
    dest = self._host_mv(mv, "copyout", writable=True)
    if not self.is_allocated(): raise ValueError(f"copyout from {self!r}: it was never allocated, so it holds no data")
    self.allocator.copyout(dest, self.handle)
    return mv

  def as_buffer(self) -> memoryview:
    """The contents as a byte memoryview: the device memory itself when the allocator offers host access, else a copy."""
    if not self.is_allocated(): raise ValueError(f"as_buffer of {self!r}: it was never allocated, so it holds no data")
    if self.allocator.supports_memoryview: return self.allocator.as_memoryview(self.handle, self.nbytes)
    return self.copyout(memoryview(bytearray(self.nbytes)))

  def numpy(self) -> np.ndarray:
    """A new 1-D numpy array with the contents (bfloat16, which numpy lacks, comes back as float32)."""
    if self.size == 0: return np.empty(0, np.float32 if self.dtype is dtypes.bfloat16 else dtypes.to_numpy(self.dtype))
    if self.dtype is dtypes.bfloat16:
      raw = np.empty(self.size, np.uint16)
      self.copyout(raw.data.cast("B"))
      return (raw.astype(np.uint32) << 16).view(np.float32)
    out = np.empty(self.size, dtypes.to_numpy(self.dtype))
    self.copyout(out.data.cast("B"))
    return out

  @staticmethod
  def from_numpy(device: str, arr: np.ndarray, *, allocator: Allocator | None = None) -> Buffer:
    """A new allocated buffer with the (flattened) contents of `arr`, of the matching dtype."""
    if not isinstance(arr, np.ndarray): raise TypeError(f"Buffer.from_numpy needs a numpy array, got {type(arr).__name__}")
    if not arr.dtype.isnative: arr = arr.astype(arr.dtype.newbyteorder("="))
    arr = np.ascontiguousarray(arr).reshape(-1)
    return Buffer(device, arr.size, dtypes.from_numpy(arr.dtype), initial_value=arr.data.cast("B"), allocator=allocator)

  def copy_to(self, device: str, *, allocator: Allocator | None = None) -> Buffer:
    """A new buffer on `device` with this buffer's contents (see `copy_from`)."""
    if not self.is_allocated(): raise ValueError(f"copy_to from {self!r}: it was never allocated, so it holds no data")
    return Buffer(device, self.size, self.dtype, allocator=allocator).allocate().copy_from(self)

  def copy_from(self, src: Buffer) -> Buffer:
    """Copy `src` (the same byte size) into this buffer, allocating it if needed: a direct device transfer when both
    ends share an allocator class that implements `_transfer` (instances of one device: CUDA:0 → CUDA:1, CPU → CPU:1),
    else through host memory (the engine's COPY)."""
    if src.nbytes != self.nbytes: raise ValueError(f"copy_from: {src!r} holds {src.nbytes} bytes, {self!r} {self.nbytes}")
    self.ensure_allocated()
    if not self.nbytes: return self  # nothing to copy (an empty source may never have been allocated)
    src_a, dest_a = src.allocator, self.allocator
    if type(src_a) is type(dest_a) and dest_a.supports_transfer and src.is_allocated():
      dest_a._transfer(self.handle, src.handle, self.nbytes, src_a, dest_a)
    else: self.copyin(src.as_buffer())
    return self


def _resolve(device: str, allocator: Allocator | None) -> tuple[str, Any]:
  """The canonical device name and the registry's device object (None when an allocator is given directly)."""
  if not isinstance(device, str) or not device: raise TypeError(f"Buffer device must be a device name str, got {device!r}")
  if allocator is not None:
    if not isinstance(allocator, Allocator): raise TypeError(f"allocator must be an Allocator, got {type(allocator).__name__}")
    return device, None
  dev = Device[device]
  return dev.name, dev
