"""The default optimizer on CUDA, proven without a GPU at two tiers:

* emulate: the PYTHON interpreter under EMULATE=CUDA describes an sm_80+ GPU (its workgroup limits, shared memory and
  mma.sync tensor cores); the kernel the heuristics choose computes the same numbers as the unoptimized kernel
  (NOOPT: `opts=[]`) and carries the expected actions (tensor cores for fp16/bf16 matmuls and convolutions, GROUP for
  long reductions, float4 lanes and 256-thread blocks for elementwise work);
* compile: the same kernels, chosen by the same heuristics for the CUDA renderer (the actions must be the same, so the
  emulate tier checked what runs on the GPU), rendered as CUDA C and compiled by NVRTC + nvJitLink for sm_90.

Plus BEAM search on an offline CUDA device up to compiling its candidates in parallel with NVRTC (timing needs a GPU;
a stand-in timer ranks them here)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from plugrad import Tensor
from plugrad.builtin.python_renderer import PythonRenderer
from plugrad.codegen import get_program
from plugrad.codegen.opt import OptOps, heuristic
from plugrad.device.buffer import Buffer
from plugrad.device.runner import ProgramRunner
from plugrad.dtype import dtypes
from plugrad.engine.schedule import create_schedule
from plugrad_cuda.compiler import CUDACompiler
from plugrad_cuda.renderer import CUDARenderer

F16, BF16, F32 = dtypes.float16, dtypes.bfloat16, dtypes.float32
EMU = PythonRenderer("PYTHON", emulate="CUDA")
SM90 = CUDARenderer("CUDA", "sm_90")


def kernels(t: Tensor) -> list[tuple]:
  items, _ = create_schedule(t.uop)
  return [(it.ast, it.var_vals) for it in items if it.kind == "kernel"]


def E(*shape: int, dt=F16) -> Tensor: return Tensor.empty(*shape, device="PYTHON", dtype=dt)


def run(prg, var_vals, seed: int = 0) -> list[np.ndarray]:
  """Run `prg` on the PYTHON device on random inputs (the same for a seed); every buffer's contents as float arrays."""
  rng = np.random.default_rng(seed)
  bufs = []
  for g, (dt, _) in zip(prg.buffers, prg.signature):
    vals = rng.standard_normal(g.dtype.size).astype(np.float32)
    if dt is BF16:
      b = Buffer(prg.device, g.dtype.size, dt)
      b.copyin(memoryview((vals.view(np.uint32) >> 16).astype(np.uint16)).cast("B"))
    else:
      data = vals.astype(dtypes.to_numpy(dt)) if dtypes.is_float(dt) else rng.integers(0, 5, g.dtype.size).astype(dtypes.to_numpy(dt))
      b = Buffer.from_numpy(prg.device, data)
    bufs.append(b)
  ProgramRunner(prg)(bufs, var_vals)
  out = []
  for b in bufs:
    if b.dtype is BF16:
      raw = bytearray(b.nbytes)
      b.copyout(memoryview(raw))
      out.append((np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32))
    else: out.append(b.numpy().astype(np.float64))
  return out


EPS = {F32: 2e-5, F16: 2 ** -8, BF16: 2 ** -6}  # the output dtype's rounding, a little over (sums in another order)


def check_emulated(t: Tensor) -> list:
  """Every kernel of `t`: heuristics vs NOOPT under EMULATE=CUDA, equal within the output dtype's rounding. The programs."""
  progs = []
  for ast, vv in kernels(t):
    want = run(get_program(ast, EMU, opts=[]), vv)
    p = get_program(ast, EMU)
    got = run(p, vv)
    out_dt = p.signature[0][0]
    for slot in p.outs:
      w, g = want[slot].astype(np.float64), got[slot].astype(np.float64)
      scale = max(1.0, float(np.max(np.abs(w))) if w.size else 1.0)
      np.testing.assert_allclose(g, w, rtol=EPS[out_dt], atol=EPS[out_dt] * scale, err_msg=f"{p.name} {p.applied_opts}")
    progs.append(p)
  return progs


def ops(p) -> list[OptOps]: return [o.op for o in p.applied_opts]


def has_wmma(p) -> bool: return any(u.op.name == "WMMA" for u in p.uops)


# ---- emulate tier: the numbers and the actions

@pytest.mark.parametrize("dt", [F16, BF16], ids=["f16", "bf16"])
def test_half_matmul_uses_tensor_cores(dt):
  (p,) = check_emulated(E(64, 48, dt=dt) @ E(48, 32, dt=dt))
  assert ops(p)[0] is OptOps.TC and has_wmma(p), p.applied_opts


def test_odd_half_matmul_is_padded_onto_tensor_cores():
  (p,) = check_emulated(E(100, 70) @ E(70, 50))  # 100x50x70 -> 112x56x80: 1.43x the work, under TC_PAD_MAX
  assert ops(p) == [OptOps.PADTO, OptOps.PADTO, OptOps.PADTO, OptOps.TC] and has_wmma(p), p.applied_opts
  (q,) = check_emulated(E(30, 40) @ E(40, 20))  # 1.54x the work when padded: no tensor core
  assert OptOps.TC not in ops(q) and not has_wmma(q)


def test_tensor_core_tile_and_warps_per_block(monkeypatch):
  # a problem large enough for the register tile and 2x2 warps (CUDA_BLOCK_MIN lowered so the interpreter's sizes qualify)
  import plugrad.codegen
  monkeypatch.setattr(heuristic, "CUDA_BLOCK_MIN", 1)
  monkeypatch.setattr(plugrad.codegen, "_cache", {})  # programs are cached per AST, not per heuristic setting
  for dt in (F16, BF16):
    (p,) = check_emulated(E(64, 48, dt=dt) @ E(48, 64, dt=dt))
    assert ops(p) == [OptOps.TC, OptOps.UPCAST, OptOps.UPCAST, OptOps.LOCAL, OptOps.LOCAL], p.applied_opts
    assert sum(u.op.name == "WMMA" for u in p.uops) == heuristic.TC_TILE[0] * heuristic.TC_TILE[1]
  (b,) = check_emulated(E(2, 32, 48) @ E(2, 48, 32))  # batched: the batch stays a loop
  assert ops(b)[0] is OptOps.TC


def test_half_conv2d_uses_tensor_cores():
  # the factors each read an output axis the other does not (batch vs output channels); the reduction's other ranges
  # (the 3x3 window) stay loops around the accumulation; the padded input's gates go into the fragments
  (p,) = check_emulated(E(16, 16, 6, 6).conv2d(E(8, 16, 3, 3), padding=1))
  assert ops(p)[0] is OptOps.TC and has_wmma(p), p.applied_opts


def test_fp32_matmul_and_conv_register_tiles():
  (p,) = check_emulated(E(64, 48, dt=F32) @ E(48, 32, dt=F32))
  assert ops(p) == [OptOps.UPCAST, OptOps.UPCAST, OptOps.UNROLL, OptOps.LOCAL, OptOps.LOCAL] and not has_wmma(p), p.applied_opts
  (q,) = check_emulated(E(30, 40, dt=F32) @ E(40, 20, dt=F32))
  assert OptOps.LOCAL in ops(q) and OptOps.TC not in ops(q)
  (c,) = check_emulated(E(4, 8, 10, 10, dt=F32).conv2d(E(16, 8, 3, 3, dt=F32), padding=1))
  assert OptOps.LOCAL in ops(c) and not has_wmma(c)


def test_long_reductions_group_in_shared_memory():
  partials, final = check_emulated(E(1 << 16, dt=F32).sum())  # split by the scheduler: 32 partial sums of 2048, then 32 -> 1
  assert ops(partials) == [OptOps.GROUP, OptOps.UNROLL] and partials.applied_opts[0].amount == 256 and partials.estimates.local_bytes > 0
  (rows,) = check_emulated(E(64, 1024, dt=F32).sum(1))
  assert ops(rows)[0] is OptOps.GROUP
  (odd,) = check_emulated(E(8, 1009, dt=F32).sum(1))  # 1009 is prime: PADTO 1024, then GROUP
  assert ops(odd)[:2] == [OptOps.PADTO, OptOps.GROUP], odd.applied_opts


@pytest.mark.parametrize("fn", ["softmax", "layernorm"])
def test_row_kernels(fn):
  progs = check_emulated(getattr(E(32, 512, dt=F32), fn)() if fn == "layernorm" else E(32, 512, dt=F32).softmax(-1))
  reds = [p for p in progs if p.name.startswith("r_")]
  assert reds and all(ops(p)[0] is OptOps.GROUP for p in reds), [p.applied_opts for p in progs]
  (ew,) = [p for p in progs if p.name.startswith("E_")]
  assert ops(ew)[0] is OptOps.UPCAST and ew.applied_opts[0].amount == 4


def test_elementwise_gets_float4_lanes_and_256_thread_blocks():
  (p,) = check_emulated((E(1 << 12, dt=F32) * 2 + 1).relu())
  assert [(o.op, o.amount) for o in p.applied_opts] == [(OptOps.UPCAST, 4), (OptOps.LOCAL, 256)]


# ---- compile tier: the same choices for the CUDA renderer, compiled for sm_90

CASES = {
  "matmul_f16": lambda: E(64, 48) @ E(48, 32),
  "matmul_bf16": lambda: E(64, 48, dt=BF16) @ E(48, 32, dt=BF16),
  "matmul_f16_odd": lambda: E(100, 70) @ E(70, 50),
  "matmul_f32": lambda: E(64, 48, dt=F32) @ E(48, 32, dt=F32),
  "matmul_f32_odd": lambda: E(30, 40, dt=F32) @ E(40, 20, dt=F32),
  "conv2d_f16": lambda: E(16, 16, 6, 6).conv2d(E(8, 16, 3, 3), padding=1),
  "conv2d_f32": lambda: E(4, 8, 10, 10, dt=F32).conv2d(E(16, 8, 3, 3, dt=F32), padding=1),
  "sum": lambda: E(1 << 16, dt=F32).sum(),
  "softmax": lambda: E(32, 512, dt=F32).softmax(-1),
  "layernorm": lambda: E(32, 512, dt=F32).layernorm(),
  "elementwise": lambda: (E(1 << 12, dt=F32) * 2 + 1).relu(),
}


@pytest.mark.parametrize("case", list(CASES))
def test_same_choices_compile_for_sm_90(case):
  comp = CUDACompiler("sm_90")
  for ast, _ in kernels(CASES[case]()):
    emu, cu = get_program(ast, EMU), get_program(ast, SM90)
    assert cu.applied_opts == emu.applied_opts, f"{cu.name}: the CUDA renderer got other actions than the emulated one"
    assert comp.compile(cu.source)[:4] == b"\x7fELF"
    if has_wmma(cu): assert "mma.sync.aligned.m16n8k16.row.col.f32" in cu.source


def test_large_kernels_compile_with_the_full_tile_and_vector_loads():
  comp = CUDACompiler("sm_90")
  (mm,) = kernels(E(4096, 4096) @ E(4096, 4096))
  p = get_program(mm[0], SM90)
  assert ops(p) == [OptOps.TC, OptOps.UPCAST, OptOps.UPCAST, OptOps.LOCAL, OptOps.LOCAL], p.applied_opts
  assert comp.to_ptx(p.source).count("mma.sync.aligned.m16n8k16") == heuristic.TC_TILE[0] * heuristic.TC_TILE[1]
  assert comp.compile(p.source)[:4] == b"\x7fELF"
  for dt, ld in ((F32, "ld.global.v4.f32"), (F16, "ld.global.v4.u16")):  # 128-bit (64-bit for halves) loads and stores
    (ew,) = kernels((E(1 << 28, dt=dt) * 2 + 1).relu())
    p = get_program(ew[0], SM90)
    ptx = comp.to_ptx(p.source)
    assert ld in ptx and ld.replace("ld.", "st.") in ptx and "__launch_bounds__(256)" in p.source, p.source
  (f32mm,) = kernels(E(1024, 1024, dt=F32) @ E(1024, 1024, dt=F32))
  assert "ld.global.v4.f32" in comp.to_ptx(get_program(f32mm[0], SM90).source), "B's rows as float4"


def test_misaligned_vectors_stay_element_aligned():
  # a vector access whose index is not provably a multiple of 4 (a shifted slice) keeps the struct of scalars
  x = E(4097, dt=F32)
  (ast, _), = kernels((x[1:] * 2).contiguous())
  src = get_program(ast, SM90).source
  ptx = CUDACompiler("sm_90").to_ptx(src)
  assert "ld.global.v4.f32" not in ptx and re.search(r"st\.global\.v4\.f32", ptx), "the store is aligned, the shifted load is not"


# ---- BEAM on an offline CUDA device: candidates compiled in parallel by NVRTC + nvJitLink

def test_beam_compiles_candidates_in_parallel_offline(monkeypatch, tmp_path):
  from plugrad.codegen.opt import search
  from plugrad.device.registry import Device
  from plugrad.device.search import DeviceTimer
  from plugrad.helpers import Context
  monkeypatch.setenv("PLUGRAD_CACHE_DIR", str(tmp_path))
  monkeypatch.setenv("CUDA_ARCH", "sm_90")
  monkeypatch.setenv("BEAM_STEPS", "1")
  monkeypatch.setenv("BEAM_WORKERS", "2")
  compiled: list[int] = []

  class OfflineTimer(DeviceTimer):
    """DeviceTimer's parallel compiles on the offline device (its compiler only); the timing a GPU would do is stood in
    for by the kernel's estimated memory traffic per thread (deterministic), and every candidate counts as correct."""
    def __init__(self, renderer):
      self.dev, self.bufs = Device.offline("CUDA"), {}
    def compile_all(self, programs, timeout):
      libs = super().compile_all(programs, timeout)
      compiled.append((len(programs), sum(lib is not None and lib[:4] == b"\x7fELF" for lib in libs)))
      return libs
    def time(self, program, limit): return float(program.estimates.lds) + len(program.source) * 1e-9
    def same_results(self, program, reference): return True

  (ast, _), = kernels(E(64, 64, dt=F32) @ E(64, 64, dt=F32))
  renderer = Device.offline("CUDA").renderer
  assert renderer.arch == "sm_90"
  with Context(BEAM=2): p = get_program(ast, renderer, timer=OfflineTimer)
  n, ok = max(compiled)
  assert n >= 4 and ok == n, f"every candidate of a step compiled in the worker pool (candidates, cubins): {compiled}"
  assert search.stats["searches"] >= 1 and p.source and CUDACompiler("sm_90").compile(p.source)[:4] == b"\x7fELF"
