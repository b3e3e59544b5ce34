"""The CPU's tensor cores (issue 39) at the three tiers this repository can reach:

* emulate: every CPU layout (AMX `tdpbf16ps` / `tdpbssd`, AVX-512 `vdpbf16ps` / `vpdpbusd`) lowered by the TC action's
  CPU form and run by the PYTHON interpreter under EMULATE=CPU_AMX / CPU_AVX512, against numpy;
* compile: the LLVM and C renderers' kernels built for Sapphire Rapids (AMX + AVX-512 BF16/VNNI) and Zen 4 (AVX-512
  BF16/VNNI) on any x86 machine, the instruction found in the assembly;
* run: on this CPU, only where it has the instruction's features; otherwise skipped, saying which it lacks.

Nothing else stands in for the hardware: a run-tier skip means no AMX / AVX-512 machine ran these kernels.
"""
from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import subprocess
import sys

import numpy as np
import pytest

from plugrad.backend import CPU_AMX_TENSOR_CORES, CPU_AVX512_TENSOR_CORES, SettingsError, TensorCore, dtypes
from plugrad.builtin.python_renderer import PythonRenderer
from plugrad.codegen import get_program
from plugrad.codegen.opt.actions import Opt, OptOps
from plugrad.device.buffer import Buffer
from plugrad.device.runner import ProgramRunner
from plugrad.testing.kernels import bf16_round, matmul_ast
from plugrad.uop.ops import Ops
from plugrad_cpu.tensor_cores import ISA, NEEDS, choose, cpu_features

from cpu_helpers import cpu_compiles_through_llvm

TCS = {tc.name: tc for tc in CPU_AMX_TENSOR_CORES}
AMX = ("tdpbf16ps", "tdpbssd")
HAS_LLVMLITE = importlib.util.find_spec("llvmlite") is not None
# these tests pick the LLVM and C paths themselves: test_cpu_c_path.py's rerun of this directory under CPU_LLVM=0 skips them
ONCE = pytest.mark.skipif(HAS_LLVMLITE and not cpu_compiles_through_llvm(), reason="covers both CPU paths itself; run in the LLVM process")
X86 = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 instructions: compiled by an x86 toolchain")
NP = {dtypes.int8: np.int8, dtypes.uint8: np.uint8, dtypes.int32: np.int32, dtypes.float32: np.float32}


def operands(da, db, m: int, n: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, bytes, bytes]:
  """(A, B as numbers, A, B as the buffers' bytes): bfloat16 values on the bf16 grid, integers over the dtypes' range."""
  rng = np.random.default_rng(seed)
  if da is dtypes.bfloat16:
    a, b = (bf16_round(rng.uniform(-1, 1, s).astype(np.float32)) for s in ((m, k), (k, n)))
    return a, b, ((a.view(np.uint32) >> 16).astype(np.uint16)).tobytes(), ((b.view(np.uint32) >> 16).astype(np.uint16)).tobytes()
  a = rng.integers(dtypes.min(da), dtypes.max(da) + 1, (m, k)).astype(NP[da])
  b = rng.integers(dtypes.min(db), dtypes.max(db) + 1, (k, n)).astype(NP[db])
  return a, b, a.tobytes(), b.tobytes()


def run_matmul(device: str, prg, tc: TensorCore, m: int, n: int, k: int, swapped: bool = False) -> None:
  """Run program `prg` (out = A @ B; `swapped`: A of B's dtype and B of A's) on `device` and compare with numpy: exact
  for integers; for bfloat16 inputs (exact products) within what float32 sums round away (vdpbf16ps rounds after each
  product: up to ~1e-4 for K=64 terms of magnitude <= 1)."""
  da, db = (tc.dtype_b, tc.dtype_in) if swapped else (tc.dtype_in, tc.dtype_b)
  a, b, ra, rb = operands(da, db, m, n, k)
  bufs = [Buffer(device, m * n, tc.dtype_out), Buffer(device, m * k, da), Buffer(device, k * n, db)]
  bufs[1].copyin(memoryview(ra)), bufs[2].copyin(memoryview(rb))
  ProgramRunner(prg)(bufs, wait=True)
  got, want = bufs[0].numpy().reshape(m, n), a.astype(np.float64) @ b.astype(np.float64)
  if dtypes.is_int(tc.dtype_out): np.testing.assert_array_equal(got, want.astype(np.int64), err_msg=tc.name)
  else: np.testing.assert_allclose(got, want, rtol=1e-4, atol=3e-4, err_msg=tc.name)


def tc_opt(r, tc: TensorCore) -> Opt:
  """The TC action selecting `tc` among the renderer's tensor cores of its dtypes."""
  same = [t for t in r.tensor_cores if (t.dtype_in, t.dtype_b, t.dtype_out) == (tc.dtype_in, tc.dtype_b, tc.dtype_out)]
  return Opt(OptOps.TC, same.index(tc))


# ---- the descriptions

def test_layouts_are_the_instructions_register_orders():
  # B in VNNI order: the K values of a column share one 32-bit group (2 bf16 or 4 bytes); AMX B rows hold K/16 of them
  assert TCS["vdpbf16ps"].b_layout[0][:4] == ((0, 0), (1, 0), (0, 1), (1, 1)) and TCS["vdpbf16ps"].dims == (16, 1, 2)
  assert TCS["vpdpbusd"].b_layout[0][4:8] == ((0, 1), (1, 1), (2, 1), (3, 1)) and TCS["vpdpbusd"].dtype_b is dtypes.int8
  assert TCS["tdpbf16ps"].b_layout[0][32] == (2, 0) and TCS["tdpbf16ps"].a_layout[0][33] == (1, 1)
  assert TCS["tdpbssd"].b_layout[0][64 + 5] == (5, 1) and TCS["tdpbssd"].c_layout[0][17] == (1, 1)
  assert all(tc.threads == 1 and tc.device == "CPU" for tc in CPU_AMX_TENSOR_CORES) and CPU_AVX512_TENSOR_CORES == CPU_AMX_TENSOR_CORES[2:]


# ---- emulate tier: the PYTHON interpreter computes each layout's numbers

@pytest.mark.parametrize("name", list(TCS))
def test_emulated_tc_matmul(name):
  tc = TCS[name]
  r = PythonRenderer("PYTHON", emulate="CPU_AMX" if name in AMX else "CPU_AVX512")
  assert not r.has_local and tc in r.tensor_cores
  # two instructions along M and N, and two K steps: the tile's loops around the WMMA and the accumulation are covered
  m, n, k = 2 * tc.m, 2 * tc.n, 2 * tc.k
  prg = get_program(matmul_ast(m, n, k, tc.dtype_in, tc.dtype_out, dtype_in_b=tc.dtype_in_b), r, opts=[tc_opt(r, tc)])
  wmma = [u for u in prg.uops if u.op is Ops.WMMA]
  assert wmma and all(u.arg == tc.wmma_arg for u in wmma) and not any(u.op is Ops.SPECIAL for u in prg.uops)
  run_matmul("PYTHON", prg, tc, m, n, k)


@pytest.mark.parametrize("name,shape", [("vdpbf16ps", (24, 48, 64)), ("vdpbf16ps", (8, 40, 30)), ("vpdpbusd", (16, 32, 64))], ids=str)
def test_emulated_cpu_default_takes_register_tensor_cores(name, shape):
  # the CPU default (no workgroups): TC first, a block of instructions over M and N, K unrolled; sizes the instruction
  # does not divide are padded (40 -> 48 columns, 30 -> 32 K steps); AMX is left to explicit actions
  tc = TCS[name]
  r = PythonRenderer("PYTHON", emulate="CPU_AMX")
  prg = get_program(matmul_ast(*shape, tc.dtype_in, tc.dtype_out, dtype_in_b=tc.dtype_in_b), r)
  ops = [o.op for o in prg.applied_opts]
  assert OptOps.TC in ops and OptOps.UPCAST in ops and {u.arg for u in prg.uops if u.op is Ops.WMMA} == {tc.wmma_arg}, prg.applied_opts
  run_matmul("PYTHON", prg, tc, *shape)


def test_tc_refuses_products_that_wrap_and_unmatched_dtypes():
  from plugrad.codegen.opt.actions import KernelOptError
  from plugrad.codegen.opt.kernel import Scheduler
  r = PythonRenderer("PYTHON", emulate="CPU_AVX512")
  # int8 x int8 products formed in int8 (what `a @ b` on int8 tensors computes) wrap; an instruction's would not
  with pytest.raises(KernelOptError, match="do not hold|does not hold"):
    Scheduler(matmul_ast(16, 16, 8, dtypes.int8, dtypes.int8), r).apply_opt(Opt(OptOps.TC, 0))
  with pytest.raises(KernelOptError, match="no tensor core of PYTHON takes"):  # s8 x s8 is AMX's, not VNNI's (u8 x s8)
    Scheduler(matmul_ast(16, 16, 8, dtypes.int8, dtypes.int32), r).apply_opt(Opt(OptOps.TC, 0))
  # a product written B-first (int8 x uint8) is matched in the instruction's order: the uint8 matrix is the TC's A
  prg = get_program(matmul_ast(16, 4, 8, dtypes.int8, dtypes.int32, dtype_in_b=dtypes.uint8), r, opts=[Opt(OptOps.TC, 0)])
  assert any(u.op is Ops.WMMA for u in prg.uops)
  run_matmul("PYTHON", prg, TCS["vpdpbusd"], 16, 4, 8, swapped=True)


# ---- choosing the path

def test_choice_from_features_and_cpu_tc_setting():
  spr, zen4 = ISA, ISA - {"amx_tile", "amx_bf16", "amx_int8"}
  assert [tc.name for tc in choose(spr, spr)[0]] == ["tdpbf16ps", "tdpbssd", "vdpbf16ps", "vpdpbusd"]
  tcs, line = choose(zen4, spr)
  assert tcs == CPU_AVX512_TENSOR_CORES and line == "CPU tensor cores: AVX512-BF16/VNNI (vdpbf16ps, vpdpbusd)"
  assert choose(frozenset({"avx2", "fma"}), ISA) == ((), f"CPU tensor cores: none (this CPU lacks {', '.join(sorted(ISA))})")
  assert [tc.name for tc in choose(frozenset({"avx512f", "avx512_vnni"}), ISA)[0]] == ["vpdpbusd"]  # Ice Lake: VNNI, no BF16
  assert "the compiler does not target" in choose(spr, frozenset())[1]  # the CPU has them, the compiler does not
  assert choose(spr, spr, {"CPU_TC": "0"}) == ((), "CPU tensor cores: none (CPU_TC=0)")
  with pytest.raises(SettingsError, match="CPU_TC must be 0 or 1"): choose(spr, spr, {"CPU_TC": "amx"})


def test_this_machine_declares_what_its_cpu_has(cpu):
  r = cpu.renderer
  want, _ = choose(cpu_features(), ISA)
  assert set(r.tensor_cores) <= set(want)
  if not r.tensor_cores:  # nothing changes: no capability, no emulate target, no extra rewrite
    assert "tensor_cores" not in r.capabilities and r.emulate_target is None and r.extra_matcher is None


def test_debug_line_names_the_path_and_bad_setting_fails():
  code = "from plugrad import Device; Device['CPU'].renderer"
  env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}, "DEBUG": "1"}
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
  line = next((ln for ln in out.stdout.splitlines() if ln.startswith("CPU tensor cores: ")), None)
  assert out.returncode == 0 and line is not None, out.stdout + out.stderr
  if not NEEDS["vdpbf16ps"] <= cpu_features(): assert "none (this CPU lacks" in line or "none (the compiler" in line, line
  bad = subprocess.run([sys.executable, "-c", code], env={**env, "CPU_TC": "2"}, capture_output=True, text=True, timeout=300)
  assert bad.returncode != 0 and "CPU_TC must be 0 or 1" in bad.stderr
  off = subprocess.run([sys.executable, "-c", code], env={**env, "CPU_TC": "0"}, capture_output=True, text=True, timeout=300)
  assert "CPU tensor cores: none (CPU_TC=0)" in off.stdout


# ---- compile tier: built for x86 CPUs this machine need not be

def _c_compiler(cc: str, monkeypatch) -> None:
  if cc == "default": return
  if shutil.which(cc) is None: pytest.skip(f"{cc} is not installed")
  monkeypatch.setenv("CC", cc)


def _target(march: str, llvm: bool):
  from plugrad.backend import DeviceUnavailableError
  from plugrad_cpu.target import target_compiler, target_renderer
  if llvm and not HAS_LLVMLITE: pytest.skip("llvmlite is not installed")
  try: return target_renderer(march, llvm=llvm), target_compiler(march, llvm=llvm)
  except DeviceUnavailableError as e: pytest.skip(f"the C compiler cannot build for {march}: {str(e)[:200]}")


def _assembly(r, c, prg) -> str:
  from plugrad_cpu.compiler import objdump
  src = r.render(prg)
  return c.assembly(src) if hasattr(c, "assembly") else objdump(c.compile(src), ".so")


CASES = [("sapphirerapids", n) for n in TCS] + [("znver4", n) for n in ("vdpbf16ps", "vpdpbusd")]


@X86
@ONCE
@pytest.mark.parametrize("path", ["llvm", "c", "c-clang-19"])
@pytest.mark.parametrize("march,name", CASES, ids=[f"{m}-{n}" for m, n in CASES])
def test_compiled_for_target_has_the_instruction(march, name, path, monkeypatch):
  if path == "c-clang-19": _c_compiler("clang-19", monkeypatch)
  elif path == "llvm" and shutil.which("clang-19"): monkeypatch.setenv("CC", "clang-19")  # it knows znver4 (gcc 12 does not)
  r, c = _target(march, path == "llvm")
  tc = TCS[name]
  assert tc in r.tensor_cores and r.vector_width == 16
  if name in AMX:  # one tile of instructions (its fragments are 512-1024 elements: code size grows with every copy)
    ast = matmul_ast(tc.m, tc.n, 2 * tc.k, tc.dtype_in, tc.dtype_out, dtype_in_b=tc.dtype_in_b)
    prg = get_program(ast, r, opts=[tc_opt(r, tc)])
  else: prg = get_program(matmul_ast(16, 64, 64, tc.dtype_in, tc.dtype_out, dtype_in_b=tc.dtype_in_b), r)  # the default
  assert OptOps.TC in [o.op for o in prg.applied_opts]
  if name not in AMX:  # B's fragment (column pairs / quads of rows) is read as whole rows, one vector load each ("joined accesses")
    # (bfloat16 is stored as uint16 where the codegen emulates it)
    assert any(u.op is Ops.LOAD and u.dtype.count == 16 and u.dtype.itemsize == 16 * tc.dtype_b.itemsize for u in prg.uops), name
    if tc.dtype_in is dtypes.bfloat16 and not r.native_bfloat16:  # the rows' lanes shuffled as bits, not widened around the shuffle
      assert any(u.op is Ops.VECTORIZE and u.dtype == dtypes.uint16.vec(32) for u in prg.uops), name
  asm = _assembly(r, c, prg)
  assert name in asm, f"{name} not in the {path} assembly for {march}"
  if name in AMX: assert "ldtilecfg" in asm and "tilerelease" in asm and "tileloadd" in asm


@X86
@ONCE
def test_znver4_declares_no_amx_and_c_source_says_what_it_needs(monkeypatch):
  if shutil.which("clang-19"): monkeypatch.setenv("CC", "clang-19")  # gcc 12 does not know znver4
  r, _ = _target("sapphirerapids", llvm=False)
  tc = TCS["vdpbf16ps"]
  src = r.render(get_program(matmul_ast(8, 32, 8, tc.dtype_in, tc.dtype_out), r, opts=[tc_opt(r, tc)]))
  assert "#include <immintrin.h>" in src and "_mm512_dpbf16_ps" in src and "#if !defined(__AVX512BF16__)" in src
  from plugrad.backend import DeviceUnavailableError
  from plugrad_cpu.target import target_features
  try: assert not target_features("znver4") & {"amx_tile", "amx_bf16", "amx_int8"}
  except DeviceUnavailableError as e: pytest.skip(f"the C compiler does not know znver4: {str(e)[:200]}")


@X86
@ONCE
def test_llvm_target_from_named_features():
  # a CPU the C compiler does not know: its features given (the LLVM path), here Zen 4's
  from plugrad_cpu.target import target_compiler, target_renderer
  if not HAS_LLVMLITE: pytest.skip("llvmlite is not installed")
  r = target_renderer("znver4", isa=frozenset({"avx512f", "avx512_bf16", "avx512_vnni"}))
  assert r.tensor_cores == CPU_AVX512_TENSOR_CORES and r.emulate_target == "CPU_AVX512"
  tc = TCS["vpdpbusd"]
  asm = _assembly(r, target_compiler("znver4"), get_program(matmul_ast(8, 32, 16, tc.dtype_in, tc.dtype_out, dtype_in_b=tc.dtype_b), r))
  assert "vpdpbusd" in asm and "ldtilecfg" not in asm


@X86
@ONCE
def test_amx_kernel_asks_linux_for_the_tile_state(cpu, monkeypatch):
  # loading a kernel that uses AMX requests the AMX state first (arch_prctl); on a CPU without AMX that is a clear
  # LaunchError before anything is linked or run, with the remedy
  from plugrad.backend import LaunchError
  from plugrad_cpu.target import target_compiler, target_renderer
  from plugrad_cpu.tensor_cores import AMX_MARK, request_amx
  if not HAS_LLVMLITE: pytest.skip("llvmlite is not installed")
  if shutil.which("clang-19"): monkeypatch.setenv("CC", "clang-19")
  r, c = target_renderer("sapphirerapids"), target_compiler("sapphirerapids")
  tc = TCS["tdpbf16ps"]
  prg = get_program(matmul_ast(16, 16, 32, tc.dtype_in, tc.dtype_out), r, opts=[tc_opt(r, tc)])
  assert AMX_MARK in prg.source
  loaded = prg.with_binary(c.compile(prg.source)).with_device(cpu.name)
  if "amx_tile" in cpu_features():
    request_amx()  # granted where the CPU and Linux have AMX
    return
  with pytest.raises(LaunchError, match="this kernel uses AMX tiles, but this CPU lacks amx_tile; set CPU_TC=0"): cpu.runtime.load(loaded)


# ---- run tier: only on a CPU with the instruction

@pytest.mark.parametrize("name", list(TCS))
def test_run_on_this_cpu(name, cpu):
  tc = TCS[name]
  if (missing := NEEDS[name] - cpu_features()): pytest.skip(f"this CPU lacks {', '.join(sorted(missing))}: {name} was not run (compile tier only)")
  r = cpu.renderer
  if tc not in r.tensor_cores: pytest.skip(f"the CPU device does not declare {name} here (CPU_TC=0, or its compiler does not target it)")
  m, n, k = (tc.m, tc.n, 2 * tc.k) if name in AMX else (24, 48, 64)
  ast = matmul_ast(m, n, k, tc.dtype_in, tc.dtype_out, dtype_in_b=tc.dtype_in_b)
  prg = get_program(ast, r, opts=[tc_opt(r, tc)] if name in AMX else None)
  assert any(u.op is Ops.WMMA for u in prg.uops)
  run_matmul(cpu.name, prg, tc, m, n, k)
