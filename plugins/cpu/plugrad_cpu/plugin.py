"""Registration of the CPU device (entry point `plugrad: cpu`). Only the core's plugin API is imported here; the
components are imported inside the hooks, and the compiler is only searched for on PATH by the probe.

Kernels are LLVM IR compiled in-process by llvmlite (`llvm_renderer.py`, `llvm_compiler.py`) when llvmlite is
installed, else C compiled by the system compiler; CPU_LLVM=1 / CPU_LLVM=0 force one. The allocator, runtime and
graph runner are the same, and a C compiler is required either way (the graph runner's batch wrapper is C)."""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import Any

from plugrad.backend import DeviceSpec, SettingsError, device_name, getenv, hookimpl

NAME = "CPU"
NO_LLVMLITE = "CPU_LLVM=1 needs llvmlite (pip install llvmlite, or pip install plugrad-cpu[llvm])"


def llvm_mode(env: dict[str, str] | None = None) -> bool:
  """Whether kernels go through LLVM: CPU_LLVM=1 (required), CPU_LLVM=0 (C), unset: LLVM when llvmlite is installed.
  Any other value is a ValueError."""
  raw = (os.environ if env is None else env).get("CPU_LLVM", "").strip()
  if raw not in ("", "0", "1"):
    raise SettingsError(f"CPU_LLVM must be 0 or 1 (1: compile kernels in-process with LLVM, 0: with the C compiler), got {raw!r}")
  return raw == "1" or (raw == "" and _has_llvmlite())


def _need_llvmlite() -> None:
  from plugrad.backend import DeviceUnavailableError
  try: importlib.import_module("llvmlite.binding")
  except ImportError: raise DeviceUnavailableError(NO_LLVMLITE) from None


def instances() -> int:
  """CPU_DEVICES: how many CPU devices (CPU, CPU:1, ...) the host is split into, default 1; each runs its kernels on its
  share of the threads (runtime.instance_threads). A bad value is a SettingsError."""
  return getenv("CPU_DEVICES", 1, minimum=1, maximum=1024)


def probe() -> str | None:
  instances()  # a bad CPU_DEVICES makes the device misconfigured (SettingsError), named at its first use
  from plugrad_cpu.toolchain import find_cc
  from plugrad_cpu.toolchain import probe as find
  if (why := find()) is not None:
    if (cc := os.environ.get("CC", "").strip()) and find_cc() is None:  # a setting that names no compiler: misconfigured, not absent
      raise SettingsError(f"CC={cc!r} names no program on PATH (a typo?); set CC to a C compiler (clang, gcc) or unset it to search for one")
    return why
  try: llvm = llvm_mode()
  except ValueError: return None  # the renderer hook raises it, naming the variable
  return NO_LLVMLITE if llvm and not _has_llvmlite() else None  # only CPU_LLVM=1 can ask for a missing llvmlite


def _has_llvmlite() -> bool:
  if "llvmlite" in sys.modules: return sys.modules["llvmlite"] is not None  # None: an import made to fail
  return importlib.util.find_spec("llvmlite") is not None


@hookimpl
def plugrad_devices() -> list[DeviceSpec]:
  # priority 100: the default device once installed, unless a GPU plugin (200) is available
  # count: the host is one device (all its cores) unless CPU_DEVICES=N splits it into CPU..CPU:N-1 (API 2.1)
  # api 2.5: the CPU tensor cores (CPU_AMX_TENSOR_CORES, TensorCore.dtype_in_b)
  return [DeviceSpec(NAME, api=(2, 5), priority=100, probe=probe, description="LLVM IR compiled in-process by llvmlite, or C by the system "
                     "compiler (clang/gcc), run on host threads", count=instances)]


@hookimpl
def plugrad_renderer(device: str) -> Any:
  if device_name(device) != NAME: return None
  from plugrad_cpu import tiering
  from plugrad_cpu.runtime import default_threads
  from plugrad_cpu.toolchain import toolchain
  tiering.enabled(), default_threads()  # the device's first use: a bad CPU_TIER or THREADS fails here, not at a later launch
  tc = toolchain()
  if llvm_mode():
    _need_llvmlite()
    from plugrad_cpu.llvm_compiler import host
    from plugrad_cpu.llvm_renderer import LLVMRenderer
    from plugrad_cpu.tensor_cores import cpu_features, from_llvm, host_tensor_cores
    return LLVMRenderer(device, vector_width=tc.float_lanes, tensor_cores=host_tensor_cores(cpu_features(), from_llvm(host()[1])))
  from plugrad_cpu.renderer import c_renderer
  return c_renderer(device)


@hookimpl
def plugrad_compiler(device: str) -> Any:
  if device_name(device) != NAME: return None
  if llvm_mode():
    _need_llvmlite()
    from plugrad_cpu.llvm_compiler import LLVMCompiler
    return LLVMCompiler()
  from plugrad_cpu.compiler import CPUCompiler
  from plugrad_cpu.toolchain import toolchain
  return CPUCompiler(toolchain())


@hookimpl
def plugrad_allocator(device: str) -> Any:
  if device_name(device) != NAME: return None
  from plugrad_cpu.allocator import CPUAllocator
  return CPUAllocator(device)


@hookimpl
def plugrad_runtime(device: str) -> Any:
  if device_name(device) != NAME: return None
  from plugrad_cpu.runtime import CPURuntime
  return CPURuntime(device)


@hookimpl
def plugrad_graph(device: str) -> Any:
  if device_name(device) != NAME: return None
  from plugrad_cpu.graph import CPUGraph
  return CPUGraph
