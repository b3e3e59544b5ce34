"""Bring your own AMDGPU assembly: assemble rdna3_vadd.s (RDNA3, gfx1100) with clang, link it with ld.lld into a code
object, wrap it as a plugrad program with `new_program(binary=...)` and, on a machine with a gfx1100 GPU and ROCm,
run it on Tensors with `run_program`. Elsewhere it stops after printing what the code object holds.

    python plugins/amd/examples/byo_assembly.py
"""
import os

import numpy as np

from plugrad import Tensor, dtypes
from plugrad.backend import new_program, run_program
from plugrad_amd import hip
from plugrad_amd.elf import describe
from plugrad_amd.toolchain import find

N = 256  # 4 workgroups of 64 work-items

with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "rdna3_vadd.s")) as f: asm = f.read()
binary = find().code_object(asm, "gfx1100")  # clang -x assembler ... -mcpu=gfx1100, then ld.lld -shared
print(describe(binary))
prog = new_program("vadd", "AMD", binary=binary, buffers=[(dtypes.float32, "out"), (dtypes.float32, "in"), (dtypes.float32, "in")],
                   global_size=(N // 64,), local_size=(64,))
if (why := hip.probe()) is not None or hip.device_arch(0) != "gfx1100":
  print(f"no AMD GPU here to run it on ({why or 'the GPU is not a gfx1100'}): assembled and wrapped only")
else:
  a, b = np.arange(N, dtype=np.float32), np.full(N, 0.5, np.float32)
  out = Tensor.empty(N, dtype=dtypes.float32, device="AMD").realize()
  run_program(prog, out, Tensor(a, device="AMD"), Tensor(b, device="AMD"))
  np.testing.assert_array_equal(out.numpy(), a + b)
  print("vadd on the GPU matches numpy")
