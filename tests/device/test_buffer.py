"""Buffer: lazy allocation, views, host copies, numpy round trips, device-to-device copies and the errors of each."""
from __future__ import annotations

import numpy as np
import pytest

from plugrad.device.allocator import BufferSpec
from plugrad.device.buffer import Buffer
from plugrad.device.registry import Device
from plugrad.dtype import dtypes
from plugrad.errors import UnknownDeviceError
from tests.device.test_allocator import BytesAllocator, HostAllocator

NP_DTYPES = [d for d in dtypes.all if d is not dtypes.bfloat16]


def random_array(dt, n: int, seed: int = 0) -> np.ndarray:
  rng = np.random.default_rng(seed)
  npdt = dtypes.to_numpy(dt)
  if dt is dtypes.bool: return rng.integers(0, 2, n).astype(np.bool_)
  if dtypes.is_float(dt): return rng.standard_normal(n).astype(npdt)
  info = np.iinfo(npdt)
  return rng.integers(info.min, info.max, n, dtype=npdt, endpoint=True)


def test_allocation_is_lazy():
  a = HostAllocator()
  b = Buffer("HOST", 16, dtypes.float32, allocator=a)
  assert not b.is_allocated() and a.mem_used == 0 and b.nbytes == 64
  assert b.allocate() is b and b.is_allocated() and a.mem_used == 64
  assert b.ensure_allocated() is b and a.calls["alloc"] == 1
  with pytest.raises(ValueError, match="already allocated"): b.allocate()
  with pytest.raises(ValueError, match="not allocated"): _ = Buffer("HOST", 4, dtypes.int8, allocator=a).handle


def test_options_reach_the_allocator():
  a = HostAllocator()
  b = Buffer("HOST", 4, dtypes.int32, BufferSpec(nolru=True), allocator=a).allocate()
  del b
  assert (a.mem_used, a.cached_bytes, a.held) == (0, 0, 0)


def test_release_goes_to_the_allocator_cache():
  a = HostAllocator()
  b = Buffer("HOST", 8, dtypes.float64, allocator=a).allocate()
  h = b.handle
  del b
  assert (a.mem_used, a.cached_bytes) == (0, 64)
  assert Buffer("HOST", 16, dtypes.int32, allocator=a).allocate().handle is h  # same byte size: reused


def test_explicit_deallocate():
  a = HostAllocator()
  b = Buffer("HOST", 8, dtypes.uint8, allocator=a).allocate()
  b.deallocate()
  assert not b.is_allocated() and a.cached_bytes == 8
  b.deallocate()  # a no-op once released
  assert a.cached_bytes == 8


@pytest.mark.parametrize("dt", NP_DTYPES, ids=lambda d: d.name)
def test_numpy_round_trip(dt):
  arr = random_array(dt, 37)
  b = Buffer.from_numpy("HOST", arr, allocator=HostAllocator())
  assert (b.dtype, b.size, b.nbytes) == (dt, 37, arr.nbytes)
  out = b.numpy()
  assert out.dtype == arr.dtype and np.array_equal(out, arr, equal_nan=dtypes.is_float(dt))
  out[0] = out[1]  # numpy() is a copy, not an alias of device memory
  assert np.array_equal(b.numpy(), arr, equal_nan=dtypes.is_float(dt))


def test_bfloat16_reads_back_as_float32():
  vals = np.array([1.0, -2.5, 0.0, np.inf, 3.140625], np.float32)
  bits = (vals.view(np.uint32) >> 16).astype(np.uint16)  # these values are exact in bfloat16
  b = Buffer("HOST", len(vals), dtypes.bfloat16, initial_value=bits.tobytes(), allocator=HostAllocator())
  out = b.numpy()
  assert out.dtype == np.float32 and np.array_equal(out, vals)


def test_from_numpy_takes_any_layout():
  a = HostAllocator()
  arr = np.arange(24, dtype=np.int16).reshape(4, 6)
  assert np.array_equal(Buffer.from_numpy("HOST", arr.T, allocator=a).numpy(), arr.T.reshape(-1))
  assert np.array_equal(Buffer.from_numpy("HOST", arr.astype(">i2"), allocator=a).numpy(), arr.reshape(-1))
  assert Buffer.from_numpy("HOST", np.array(2.5, np.float32), allocator=a).numpy().tolist() == [2.5]
  with pytest.raises(TypeError, match="numpy dtype complex64 has no plugrad dtype"): Buffer.from_numpy("HOST", np.zeros(2, np.complex64), allocator=a)
  with pytest.raises(TypeError, match="needs a numpy array"): Buffer.from_numpy("HOST", [1, 2], allocator=a)  # type: ignore[arg-type]


def test_copyin_copyout_bytes():
  b = Buffer("HOST", 4, dtypes.uint16, allocator=HostAllocator())
  b.copyin(memoryview(bytes(range(8))))  # allocates on first copyin
  out = bytearray(8)
  assert b.copyout(memoryview(out)).tobytes() == bytes(range(8)) and out == bytes(range(8))
  b.copyin(np.array([1, 2, 3, 4], np.uint16).data)  # typed memoryviews of the right kind are accepted
  assert b.numpy().tolist() == [1, 2, 3, 4]


def test_copy_size_and_dtype_errors_name_both_sides():
  b = Buffer("HOST", 4, dtypes.float32, allocator=HostAllocator())
  with pytest.raises(ValueError, match=r"16 bytes \(4 x dtypes.float32\).*has 12 bytes"): b.copyin(memoryview(bytes(12)))
  with pytest.raises(TypeError, match="dtypes.float32 elements, the memoryview has format 'l'"): b.copyin(np.zeros(2, np.int64).data)
  with pytest.raises(TypeError, match="needs a memoryview"): b.copyin([0.0] * 4)  # type: ignore[arg-type]
  with pytest.raises(ValueError, match="never allocated"): b.copyout(memoryview(bytearray(16)))
  b.allocate()
  with pytest.raises(ValueError, match="has 20 bytes"): b.copyout(memoryview(bytearray(20)))
  with pytest.raises(ValueError, match="writable"): b.copyout(memoryview(bytes(16)))
  with pytest.raises(ValueError, match="C-contiguous"): b.copyout(memoryview(bytearray(32))[::2])


def test_initial_value_and_zero_size():
  a = HostAllocator()
  b = Buffer("HOST", 3, dtypes.int8, initial_value=b"\x01\x02\xff", allocator=a)
  assert b.is_allocated() and b.numpy().tolist() == [1, 2, -1]
  with pytest.raises(ValueError, match="holds 3 bytes"): Buffer("HOST", 3, dtypes.int8, initial_value=b"\x01", allocator=a)
  z = Buffer("HOST", 0, dtypes.float32, initial_value=b"", allocator=a)
  assert z.is_allocated() and z.numpy().shape == (0,) and z.as_buffer().nbytes == 0


def test_views_share_memory_with_their_base():
  a = HostAllocator()
  base = Buffer.from_numpy("HOST", np.arange(8, dtype=np.int32), allocator=a)
  v = base.view(4, dtypes.int32, offset=8)
  assert v.is_allocated() and v.base is base and v.numpy().tolist() == [2, 3, 4, 5]
  v.copyin(np.array([-1, -2, -3, -4], np.int32).data)
  assert base.numpy().tolist() == [0, 1, -1, -2, -3, -4, 6, 7]
  vv = v.view(2, dtypes.uint8, offset=4)  # a view of a view points into the root base
  assert vv.base is base and vv.offset == 12 and vv.numpy().tolist() == [0xFE, 0xFF]
  assert a.mem_used == 32 and a.calls["alloc"] == 1  # views take no memory of their own
  assert "view at byte 8" in repr(v)


def test_clone_is_a_new_unallocated_buffer_of_the_same_kind():
  a = HostAllocator()
  spec = BufferSpec(nolru=True)
  base = Buffer.from_numpy("HOST", np.arange(8, dtype=np.int32), allocator=a)
  c = Buffer("HOST", 8, dtypes.int32, spec, allocator=a).clone()
  assert not c.is_allocated() and (c.device, c.size, c.dtype, c.options, c.allocator) == ("HOST", 8, dtypes.int32, spec, a)
  c.allocate().copyin(np.full(8, 7, np.int32).data)
  assert c.numpy().tolist() == [7] * 8 and base.numpy().tolist() == list(range(8)) and a.mem_used == 64
  v = base.view(4, dtypes.int32, offset=8).clone()  # a view's clone is a base buffer of the view's size
  assert v.base is v and v.offset == 0 and v.size == 4 and not v.is_allocated()
  del c
  assert a.mem_used == 32  # the clone's memory went back with it


def test_view_keeps_its_base_alive_and_allocates_it():
  a = HostAllocator()
  v = Buffer("HOST", 16, dtypes.uint8, allocator=a).view(4, dtypes.float32)
  assert not v.is_allocated() and a.mem_used == 0
  v.allocate()  # allocating a view allocates its base (which only the view still references)
  assert v.is_allocated() and v.base.is_allocated() and a.mem_used == 16
  v.copyin(np.ones(4, np.float32).data)
  assert v.numpy().tolist() == [1.0] * 4
  base = v.base
  del v
  assert a.mem_used == 16 and base.is_allocated()


def test_view_follows_a_reallocated_base():
  a = HostAllocator()
  base = Buffer("HOST", 4, dtypes.uint8, allocator=a).allocate()
  v = base.view(2, dtypes.uint8, offset=2)
  v.copyin(memoryview(b"ab"))
  base.deallocate()
  assert not v.is_allocated()
  Buffer("HOST", 4, dtypes.uint8, allocator=a).allocate()  # takes the cached memory, so base gets fresh memory
  base.allocate()
  v.copyin(memoryview(b"cd"))
  assert base.numpy().tobytes() == b"\x00\x00cd"


def test_view_errors():
  a = HostAllocator("HOST")
  base = Buffer("HOST", 4, dtypes.float32, allocator=a)
  with pytest.raises(ValueError, match="view of 8 bytes at byte offset 12 does not fit in its base of 16 bytes"): base.view(2, dtypes.float32, 12)
  with pytest.raises(ValueError, match="view on device OTHER of a base buffer on device HOST"): Buffer("OTHER", 1, dtypes.float32, base=base)
  with pytest.raises(ValueError, match="no initial_value"): Buffer("HOST", 1, dtypes.float32, base=base, initial_value=bytes(4))
  with pytest.raises(ValueError, match="offset 4 needs a base"): Buffer("HOST", 1, dtypes.float32, offset=4, allocator=a)
  minimal = Buffer("MIN", 4, dtypes.float32, allocator=BytesAllocator("MIN"))
  with pytest.raises(NotImplementedError, match="MIN: BytesAllocator does not support buffer views"): minimal.view(2, dtypes.float32).allocate()


def test_as_buffer_is_zero_copy_when_the_allocator_allows():
  b = Buffer.from_numpy("HOST", np.zeros(4, np.uint8), allocator=HostAllocator())
  mv = b.as_buffer()
  mv[1] = 7
  assert b.numpy().tolist() == [0, 7, 0, 0]
  c = Buffer.from_numpy("MIN", np.zeros(4, np.uint8), allocator=BytesAllocator("MIN"))
  mv = c.as_buffer()
  mv[1] = 7
  assert c.numpy().tolist() == [0, 0, 0, 0]  # a copy
  with pytest.raises(ValueError, match="never allocated"): Buffer("MIN", 1, dtypes.int8, allocator=BytesAllocator("MIN")).as_buffer()


def test_copy_to_uses_transfer_between_same_allocator_class():
  src_a, dst_a = HostAllocator("HOST"), HostAllocator("HOST:1")
  src = Buffer.from_numpy("HOST", np.arange(10, dtype=np.float64), allocator=src_a)
  dst = src.copy_to("HOST:1", allocator=dst_a)
  assert dst.device == "HOST:1" and dst.dtype is dtypes.float64 and dst.numpy().tolist() == list(range(10))
  assert dst_a.calls["transfer"] == 1 and dst.handle is not src.handle


def test_copy_to_goes_through_host_between_different_allocators():
  src = Buffer.from_numpy("MIN", np.arange(6, dtype=np.int16), allocator=BytesAllocator("MIN"))
  ha = HostAllocator("HOST")
  dst = src.copy_to("HOST", allocator=ha)
  assert dst.numpy().tolist() == list(range(6)) and ha.calls["transfer"] == 0
  back = dst.copy_to("MIN", allocator=BytesAllocator("MIN"))
  assert back.numpy().tolist() == list(range(6))
  with pytest.raises(ValueError, match="never allocated"):
    Buffer("HOST", 1, dtypes.int8, allocator=ha).copy_to("MIN", allocator=BytesAllocator("MIN"))


def test_constructor_errors():
  a = HostAllocator()
  with pytest.raises(ValueError, match="size must be an int >= 0"): Buffer("HOST", -1, dtypes.float32, allocator=a)
  with pytest.raises(TypeError, match="scalar dtype"): Buffer("HOST", 1, dtypes.float32.vec(4), allocator=a)
  with pytest.raises(TypeError, match="scalar dtype"): Buffer("HOST", 1, dtypes.float32.ptr(), allocator=a)
  with pytest.raises(TypeError, match="scalar dtype"): Buffer("HOST", 1, dtypes.index, allocator=a)
  with pytest.raises(TypeError, match="BufferSpec"): Buffer("HOST", 1, dtypes.int8, {"host": True}, allocator=a)  # type: ignore[arg-type]
  with pytest.raises(TypeError, match="must be an Allocator"): Buffer("HOST", 1, dtypes.int8, allocator=object())  # type: ignore[arg-type]
  with pytest.raises(TypeError, match="device name"): Buffer(3, 1, dtypes.int8, allocator=a)  # type: ignore[arg-type]


def test_repr():
  b = Buffer("HOST", 16, dtypes.float32, allocator=HostAllocator())
  assert repr(b) == "<Buffer HOST dtypes.float32[16] (64 bytes, not allocated)>"
  b.allocate()
  assert repr(b).endswith("allocated)>") and "not" not in repr(b)


# ---- through the device registry (the PYTHON and NULL built-in devices)

def test_registry_device_names_and_allocator():
  b = Buffer("python", 4, dtypes.float32)
  assert b.device == "PYTHON" and b.allocator is Device["PYTHON"].allocator
  assert Buffer("PYTHON", 2, dtypes.float32, base=b).device == "PYTHON"
  v = Buffer("python:0", 2, dtypes.float32, base=b, offset=8)  # another spelling of the base's device
  assert v.device == "PYTHON" and v.base is b
  with pytest.raises(UnknownDeviceError): Buffer("NO_SUCH_DEVICE", 4, dtypes.float32)


def test_registry_buffers_round_trip_and_copy_between_devices():
  arr = np.linspace(-1, 1, 12, dtype=np.float32)
  b = Buffer.from_numpy("PYTHON", arr)
  assert np.array_equal(b.view(4, dtypes.float32, offset=16).numpy(), arr[4:8])
  c = b.copy_to("PYTHON:1")
  assert c.device == "PYTHON:1" and c.allocator is not b.allocator and np.array_equal(c.numpy(), arr)
  n = b.copy_to("NULL")
  assert n.device == "NULL" and n.numpy().tolist() == [0.0] * 12  # NULL keeps no data
