"""Rendering and compiling for an x86 CPU other than this one: the compile tier of the CPU's tensor cores (issue 39).

`target_renderer("sapphirerapids")` is a renderer for that CPU (its vector width and the tensor cores its features
give: AMX + AVX-512 BF16/VNNI on Sapphire Rapids, AVX-512 BF16/VNNI on "znver4"), and `target_compiler(...)` builds its
kernels (LLVM in-process, or the C compiler with `-march=<cpu>`). What the named CPU has is read from the C compiler's
predefined macros for `-march=<cpu>`, so the compiler must know the name (gcc 12 lacks "znver4"; `CC=clang-19`).
The code is for that CPU: it is compiled and inspected here, never loaded (the run tier needs the hardware).
"""
from __future__ import annotations

from plugrad.backend import Compiler, Renderer
from plugrad_cpu.tensor_cores import choose, from_macros
from plugrad_cpu.toolchain import toolchain_for


def target_features(march: str) -> frozenset[str]:
  """The tensor-core features (Linux flag names, tensor_cores.ISA) of x86 CPU `march`, per the C compiler."""
  return from_macros(toolchain_for(march).macros)


def target_renderer(march: str, llvm: bool = True, device: str = "CPU", isa: frozenset[str] | None = None) -> Renderer:
  """The LLVM (or C) renderer of the CPU device for CPU `march`, with the tensor cores that CPU has (CPU_TC applies).
  `isa`: the CPU's features (tensor_cores.ISA names) when the C compiler does not know `march` (LLVM path only)."""
  if llvm and isa is not None:
    from plugrad_cpu.llvm_renderer import LLVMRenderer
    return LLVMRenderer(device, vector_width=16 if "avx512f" in isa else 8, cpu=march, features="", tensor_cores=choose(isa, isa)[0])
  tc = toolchain_for(march)
  feats = from_macros(tc.macros) if isa is None else isa
  tcs, _ = choose(feats, feats)
  if llvm:
    from plugrad_cpu.llvm_renderer import LLVMRenderer
    return LLVMRenderer(device, vector_width=tc.float_lanes, cpu=march, features="", tensor_cores=tcs)
  from plugrad_cpu.renderer import CPURenderer
  return CPURenderer(device, native_float16=tc.float16, native_bfloat16=tc.bfloat16, vector_width=tc.float_lanes, tensor_cores=tcs)


def target_compiler(march: str, llvm: bool = True) -> Compiler:
  """The compiler of `target_renderer(march, llvm)`'s source: objects for that CPU (LLVM: any CPU name LLVM knows; it
  warns about one it does not and builds for a generic x86)."""
  if llvm:
    from plugrad_cpu.llvm_compiler import LLVMCompiler
    return LLVMCompiler(cpu=march)
  from plugrad_cpu.compiler import CPUCompiler
  return CPUCompiler(toolchain_for(march))
