"""The OpenCL C the renderer writes, for a described device (no OpenCL needed) and, where there is one, compiled and run."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from plugrad import Tensor, dtypes
from plugrad.backend import AddrSpace, AxisType, DType, KernelInfo, Ops, ProgramUOp, UOp, new_program, run_program
from plugrad_opencl.platform import DeviceInfo
from plugrad_opencl.renderer import OpenCLRenderer

I32 = dtypes.int32
GROUPS, LSZ = 3, 16
GENERIC = DeviceInfo.generic()
FP16_FP64 = dataclasses.replace(GENERIC, name="a device with half and double", extensions=frozenset({"cl_khr_fp16", "cl_khr_fp64"}), fp64=True)


def linear_program(name: str, statements: list[UOp]) -> ProgramUOp:
  """A PROGRAM at the linear stage, built from its parts (SINK with the kernel's name, DEVICE) as the contract states:
  the statements in order, each after the values it uses."""
  uops: dict[UOp, None] = {}
  def emit(u: UOp) -> None:
    for s in u.src: emit(s)
    uops.setdefault(u, None)
  for st in statements: emit(st)
  base = UOp(Ops.PROGRAM, dtypes.void, (UOp(Ops.SINK, dtypes.void, (), KernelInfo(name)), UOp(Ops.DEVICE, dtypes.void, (), "OPENCL")))
  assert isinstance(base, ProgramUOp)
  return base.with_linear(list(uops))


def reverse_groups(dt: DType) -> ProgramUOp:
  """out[g*16 + l] = a[g*16 + 15 - l] through workgroup memory: each of 3 workgroups reverses its 16 values."""
  out, a = UOp(Ops.DEFINE_GLOBAL, dt.ptr(GROUPS * LSZ), (), 0), UOp(Ops.DEFINE_GLOBAL, dt.ptr(GROUPS * LSZ), (), 1)
  c = {v: UOp.const(I32, v) for v in (GROUPS, LSZ, LSZ - 1)}
  g = UOp(Ops.SPECIAL, I32, (c[GROUPS],), "gidx0")
  li = UOp(Ops.SPECIAL, I32, (c[LSZ],), "lidx0")
  smem = UOp(Ops.DEFINE_LOCAL, dtypes.float32.ptr(LSZ, AddrSpace.LOCAL), (), "smem")
  base = UOp(Ops.MUL, I32, (g, c[LSZ]))
  idx = UOp(Ops.ADD, I32, (base, li))
  val = UOp(Ops.CAST, dtypes.float32, (UOp(Ops.LOAD, dt, (UOp(Ops.INDEX, a.dtype, (a, idx)),)),))
  st = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, smem.dtype, (smem, li)), val))
  bar = UOp(Ops.BARRIER, dtypes.void, ())
  ridx = UOp(Ops.ADD, I32, (c[LSZ - 1], UOp(Ops.MUL, I32, (li, UOp.const(I32, -1)))))
  back = UOp(Ops.CAST, dt, (UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, smem.dtype, (smem, ridx)),)),))
  out_st = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, idx)), back))
  # smem comes after the index computation on purpose: OpenCL C declares __local at kernel scope, the renderer hoists it
  return linear_program("reverse_groups", [out, a, idx, smem, st, bar, out_st])


def test_the_dialect() -> None:
  src = OpenCLRenderer("OPENCL", GENERIC).render(reverse_groups(dtypes.float32))
  assert "get_group_id(0)" in src and "get_local_id(0)" in src and "barrier(CLK_LOCAL_MEM_FENCE);" in src
  lines = src.splitlines()
  head = lines.index("__kernel void reverse_groups(__global float* data0, __global const float* data1) {")
  assert lines[head + 1] == "  __local float smem[16];", src


def test_half_is_native_only_with_cl_khr_fp16() -> None:
  emulated = OpenCLRenderer("OPENCL", GENERIC).render(reverse_groups(dtypes.float16))
  assert "__global const ushort* data1" in emulated and "vload_half" in emulated and "cl_khr_fp16" not in emulated
  native = OpenCLRenderer("OPENCL", FP16_FP64).render(reverse_groups(dtypes.float16))
  assert "#pragma OPENCL EXTENSION cl_khr_fp16 : enable" in native and "__global const half* data1" in native and "vload_half" not in native


def test_capabilities_follow_the_extensions() -> None:
  generic, full = OpenCLRenderer("OPENCL", GENERIC), OpenCLRenderer("OPENCL", FP16_FP64)
  assert "float64" not in generic.capabilities and "float64" in full.capabilities
  assert {"locals", "shared", "float16", "bfloat16", "int64"} <= generic.capabilities
  assert generic.dtype_support(dtypes.float64) == "generic OpenCL 1.2 device has no cl_khr_fp64"
  assert full.dtype_support(dtypes.float64) is None


def test_bool_buffers_are_bytes() -> None:
  out, a = UOp(Ops.DEFINE_GLOBAL, dtypes.bool.ptr(4), (), 0), UOp(Ops.DEFINE_GLOBAL, dtypes.float32.ptr(4), (), 1)
  zero = UOp.const(dtypes.float32, 0.0)
  i = UOp.range(UOp.const(I32, 4), 0, AxisType.LOOP, I32)
  cmp = UOp(Ops.CMPLT, dtypes.bool, (zero, UOp(Ops.LOAD, dtypes.float32, (UOp(Ops.INDEX, a.dtype, (a, i)),))))
  st = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out.dtype, (out, i)), cmp))
  src = OpenCLRenderer("OPENCL", GENERIC).render(linear_program("positive", [out, a, zero, st, UOp(Ops.ENDRANGE, dtypes.void, (i,))]))
  assert "__global uchar* data0" in src  # a kernel may not take a bool pointer


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float16], ids=str)
def test_rendered_kernel_runs_as_an_external_program(opencl: str, dt: DType) -> None:
  from plugrad import Device
  src = Device[opencl].renderer.render(reverse_groups(dt))
  p = new_program("reverse_groups", opencl, source=src, buffers=[(dt, "out"), (dt, "in")], global_size=(GROUPS,), local_size=(LSZ, 1, 1))
  x = np.arange(GROUPS * LSZ, dtype=np.float32)
  out = Tensor.empty(GROUPS * LSZ, dtype=dt, device=opencl).realize()
  run_program(p, out, Tensor(x, device=opencl).cast(dt))
  np.testing.assert_array_equal(out.numpy().astype(np.float32), x.reshape(GROUPS, LSZ)[:, ::-1].reshape(-1))
