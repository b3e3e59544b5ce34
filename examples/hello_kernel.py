"""Run one kernel through plugrad's whole device path on the default device (DEV=... to choose another).

The kernels are written by hand as LINEAR programs (docs/ir.md, stage 3), below the Tensor frontend that normally makes
them (`from plugrad import Tensor`; README, "A tour"), to show what a backend receives: here
y[i] = a * x[i] + y[i] over 1,000 float32s, then the conformance suite's row sum with a register accumulator. Each is made into a PROGRAM
UOp, rendered, compiled (through the on-disk cache) and run by the device's plugin, and checked against numpy.
"""
import numpy as np

from plugrad.device.buffer import Buffer
from plugrad.device.registry import Device
from plugrad.device.runner import ProgramRunner
from plugrad.dtype import dtypes
from plugrad.testing.kernels import LinearBuilder, reduce_rows
from plugrad.uop.ops import KernelInfo, Ops, UOp
from plugrad.uop.program import make_program

F32 = dtypes.float32


def saxpy(n: int) -> list[UOp]:
  k = LinearBuilder()
  y, x = k.glob(0, F32, n), k.glob(1, F32, n)
  a = k.emit(UOp.variable("a_x1000", -10**6, 10**6, dtypes.int32))  # a symbolic launch argument
  scale = k.alu(Ops.MUL, k.emit(UOp(Ops.CAST, F32, (a,))), k.const(F32, 1e-3))
  i = k.range(n, 0)
  k.store(y, i, k.alu(Ops.ADD, k.alu(Ops.MUL, scale, k.load(x, i)), k.load(y, i)))
  k.end(i)
  return k.linear


def run(name: str, uops: list[UOp], arrays: list[np.ndarray], var_vals: dict[str, int]) -> list[np.ndarray]:
  dev = Device[Device.DEFAULT]
  prg = make_program(UOp(Ops.SINK, dtypes.void, (), KernelInfo(name)), dev.name).with_linear(uops)
  bufs = [Buffer(dev.name, arr.size, F32).copyin(arr.data.cast("B")) for arr in arrays]
  seconds = ProgramRunner(prg)(bufs, var_vals, wait=True)
  print(f"{name:10s} on {dev.name} ({dev.distribution}): {prg.estimates.at(var_vals).ops} flops, {seconds * 1e3:.2f} ms")
  return [b.numpy() for b in bufs]


def main() -> None:
  rng = np.random.default_rng(0)
  x, y = rng.standard_normal(1000, dtype=np.float32), rng.standard_normal(1000, dtype=np.float32)
  got = run("saxpy", saxpy(1000), [y.copy(), x], {"a_x1000": 2500})[0]
  np.testing.assert_allclose(got, np.float32(2.5) * x + y, rtol=1e-6)
  rows = reduce_rows(Device[Device.DEFAULT].renderer)  # a register-accumulator reduction from the conformance suite
  sums = run("row_sums", rows.uops, [np.zeros(rows.sizes[0], np.float32), rows.inputs[1]], {})[0]
  np.testing.assert_allclose(sums, rows.expected[0], rtol=1e-5, atol=1e-5)
  print("both kernels match numpy")


if __name__ == "__main__":
  main()
