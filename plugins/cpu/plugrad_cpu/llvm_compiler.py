"""The in-process CPU compiler (CPU_LLVM=1): LLVM IR text → O2 pipeline → an ELF relocatable object, through llvmlite.

No process is started: parsing, optimizing and emitting a small kernel takes a few milliseconds, against tens for the
system C compiler. The object is loaded by `load_object` into one process-wide ORC JIT, each kernel in a library of
its own (so two kernels may define the same symbol), with the process's symbols (libm) visible to it.
"""
from __future__ import annotations

import hashlib
import itertools
import os
import threading
from typing import Any

from plugrad.backend import CompileError, Compiler, LaunchError
from plugrad_cpu.compiler import objdump

OPT_LEVEL = 2
# the first line of a kernel whose work is small (LLVMRenderer decides): its compile time would dominate, so it gets
# the quick pipeline (registers from allocas, instcombine, CFG cleanup, GVN; ~5 ms instead of ~12 for a small kernel)
QUICK_MARK = "; plugrad-cpu pipeline: quick"
_lock = threading.Lock()  # one LLVM context and target machine for the process: LLVM objects are not thread-safe
_state: dict[str, Any] = {}
_libs = itertools.count()


def _after_fork() -> None:
  global _lock
  _lock = threading.Lock()  # another thread may have held it at the fork


if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=_after_fork)


def _llvm() -> Any:
  import llvmlite.binding as llvm
  if "tm" not in _state:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_triple(llvm.get_process_triple())
    _state["host"] = (llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten())
    # pic + small code model: the object is placed anywhere by the JIT linker, libm calls go through its stubs
    _state["tm"] = target.create_target_machine(cpu=_state["host"][0], features=_state["host"][1], opt=OPT_LEVEL, reloc="pic", codemodel="small")
  return llvm


def host() -> tuple[str, str]:
  """(the host CPU's LLVM name, its feature string): what kernels are compiled for (like -march=native)."""
  with _lock:
    _llvm()
    return _state["host"]


def host_float_lanes() -> int:
  """Float lanes of one vector instruction on this host: 16 with AVX-512, 8 with AVX2, else 4."""
  feats = set(host()[1].split(","))
  return 16 if "+avx512f" in feats else 8 if "+avx2" in feats else 4


def _target_machine(cpu: str, features: str) -> Any:
  """The target machine for CPU `cpu` with `features` (the host's, or another x86 CPU's for the compile tier); call with
  `_lock` held."""
  llvm = _llvm()
  if (cpu, features) == _state["host"]: return _state["tm"]
  key = f"tm {cpu} {features}"
  if key not in _state:
    target = llvm.Target.from_triple(llvm.get_process_triple())
    _state[key] = target.create_target_machine(cpu=cpu, features=features, opt=OPT_LEVEL, reloc="pic", codemodel="small")
  return _state[key]


def _quick_pipeline(llvm: Any) -> Any:
  mpm = llvm.create_new_module_pass_manager()
  for add in (mpm.add_sroa_pass, mpm.add_instruction_combine_pass, mpm.add_simplify_cfg_pass, mpm.add_new_gvn_pass,
              mpm.add_instruction_combine_pass, mpm.add_aggressive_dce_pass, mpm.add_simplify_cfg_pass): add()
  return mpm


class LLVMCompiler(Compiler):
  """LLVM IR text → object bytes. `cache_key` names llvmlite, LLVM, the host CPU and its features, and the opt level.
  Concurrent: llvmlite calls LLVM through ctypes, which lets go of the GIL, so a compile on the engine's compile thread
  runs while the engine renders the next kernel (compiles themselves are serialized by `_lock` and llvmlite's own)."""
  concurrent = True
  def __init__(self, cpu: str | None = None, features: str = "") -> None:
    """`cpu`: compile for that CPU (an LLVM name such as "sapphirerapids", with `features` added to its own) instead of the
    host: the compile tier's objects for a machine this is not (never loaded here)."""
    import llvmlite
    import llvmlite.binding as llvm
    cpu, feats = host() if cpu is None else (cpu, features)
    self.target = (cpu, feats)
    digest = hashlib.sha256(feats.encode()).hexdigest()[:16]
    self.cache_key = (f"plugrad-cpu-llvm llvmlite {llvmlite.__version__} LLVM {'.'.join(map(str, llvm.llvm_version_info))} "
                      f"cpu={cpu} features={digest} O{OPT_LEVEL}")

  def __repr__(self) -> str: return f"<LLVMCompiler {self.cache_key}>"

  def compile(self, src: str) -> bytes: return bytes(self._emit(src, "object"))

  def disassemble(self, lib: bytes) -> str: return objdump(lib, ".o")

  def assembly(self, src: str) -> str:
    """The assembly of IR `src` through the same pipeline as `compile` (what the compile tier's tests read)."""
    return str(self._emit(src, "assembly"))

  def _emit(self, src: str, what: str) -> Any:
    with _lock:
      llvm = _llvm()
      tm = _target_machine(*self.target)
      try:
        mod = llvm.parse_assembly(src)
        mod.verify()
      except RuntimeError as e: raise CompileError(f"LLVM rejected the IR: {str(e).strip()}") from None
      mod.triple, mod.data_layout = tm.triple, str(tm.target_data)
      pto = llvm.create_pipeline_tuning_options(speed_level=OPT_LEVEL)
      # the optimizer already vectorized (UPCAST lanes) and unrolled (UNROLL) what pays; LLVM's loop vectorizer and
      # unroller would mostly re-examine those loops, and leaving them out cuts a kernel's compile time by a third
      pto.loop_vectorization = pto.loop_unrolling = False
      pto.slp_vectorization = True
      pb = llvm.create_pass_builder(tm, pto)
      try:
        (_quick_pipeline(llvm) if src.startswith(QUICK_MARK) else pb.getModulePassManager()).run(mod, pb)
        return tm.emit_object(mod) if what == "object" else tm.emit_assembly(mod)
      except RuntimeError as e: raise CompileError(f"LLVM failed to compile the IR: {str(e).strip()}") from None


def load_object(obj: bytes, symbol: str) -> tuple[Any, int]:
  """Link object bytes into this process: (the library handle, which must outlive every use of the code; the address
  of `symbol`). Raises LaunchError when the object cannot be linked or lacks the symbol."""
  with _lock:
    llvm = _llvm()
    # JITLink, not RuntimeDyld: RuntimeDyld maps a kernel's code and its constants separately, and in a process whose
    # address space is fragmented (thousands of kernels loaded and dropped, large buffers) the two can land more than
    # 2 GiB apart, where the small code model's 32-bit pc-relative reference to a constant cannot reach: an assertion
    # in LLVM aborts the process. JITLink places every section of an object in one allocation.
    if "jit" not in _state: _state["jit"] = llvm.create_lljit_compiler(use_jit_link=True)
    try: lib = llvm.JITLibraryBuilder().add_object_img(obj).add_current_process().export_symbol(symbol).link(_state["jit"], f"plugrad-{next(_libs)}")
    except RuntimeError as e: raise LaunchError(f"linking the kernel object failed: {str(e).strip()}") from None
  addr = lib[symbol]
  if not addr: raise LaunchError(f"the kernel object has no function {symbol!r}")
  return lib, addr
