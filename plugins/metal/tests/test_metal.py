"""plugrad-metal without a Mac: registration and the probe's reasons, the MSL renderer (its binding ABI, vectors through
packed types, no double, simdgroup-matrix tensor cores), and the approximate compile tier — MSL compiled as C++ by
clang against the shim header, "syntax-checked, not Metal-compiled" — on suite kernels and real Tensor programs.
The numbers of METAL's lowering are checked by the PYTHON interpreter under EMULATE=METAL (the kernel Metal would get
is the one the interpreter runs). Nothing here runs Metal: no Mac is available to this project."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from plugrad import Tensor
from plugrad.builtin.python_renderer import TARGETS, PythonRenderer
from plugrad.codegen import get_program
from plugrad.codegen.decompose import decompose_linear
from plugrad.codegen.opt import Opt, OptOps
from plugrad.device.buffer import Buffer
from plugrad.device.registry import Device, OfflineDevice
from plugrad.device.runner import ProgramRunner
from plugrad.dtype import dtypes
from plugrad.engine.schedule import create_schedule
from plugrad.errors import CompileError, DeviceUnavailableError
from plugrad.helpers import SettingsError
from plugrad.renderer.base import RendererError
from plugrad.renderer.tensor_cores import METAL_TENSOR_CORES
from plugrad.testing.kernels import matmul_ast
from plugrad.uop.ops import KernelInfo, Ops, UOp
from plugrad.uop.program import make_program
from plugrad_metal import plugin
from plugrad_metal.abi import signature
from plugrad_metal.renderer import MetalRenderer
from plugrad_metal.syntax import LABEL, SyntaxCheckCompiler, find_clang, lint

from metal_helpers import glob, lin, run_emulated, special

ON_MAC = sys.platform == "darwin"
needs_clang = pytest.mark.skipif(find_clang() is None, reason="the METAL syntax check needs clang (apt-get install clang-19)")
LANGS = ("3.0", "3.1")
SYNTAX_ID = "syntax-checked-not-Metal-compiled"


def lang_ids(lang: str) -> str: return f"MSL{lang}-{SYNTAX_ID}"


@pytest.fixture(scope="module")
def checkers():
  return {lang: (MetalRenderer("METAL", lang), SyntaxCheckCompiler(lang)) for lang in LANGS}


def program(uops, renderer, name="k"):
  return make_program(UOp(Ops.SINK, dtypes.void, (), KernelInfo(name)), "METAL").with_linear(decompose_linear(list(uops), renderer))


# ---- registration and the probe

class FakeMetal:
  def __init__(self, device): self.device = device
  def MTLCreateSystemDefaultDevice(self): return self.device


def test_probe_reasons():
  assert plugin.probe_with("linux", FakeMetal).startswith("not macOS (sys.platform is 'linux'): Metal exists only on Apple platforms")
  def missing(): raise ImportError("No module named 'Metal'")
  assert "pip install pyobjc-framework-Metal" in plugin.probe_with("darwin", missing)
  assert plugin.probe_with("darwin", lambda: FakeMetal(None)) == "no Metal device (MTLCreateSystemDefaultDevice returned nil)"
  assert plugin.probe_with("darwin", lambda: FakeMetal(object())) is None
  def broken(): raise RuntimeError("boom")
  assert plugin.probe_with("darwin", broken).startswith("the Metal framework could not be loaded: RuntimeError: boom")


def test_language_setting(monkeypatch):
  assert [plugin.macos_language(v) for v in ("13.6", "14.5", "15.1", "26.0", "")] == ["3.0", "3.1", "3.2", "3.2", "3.0"]
  monkeypatch.setenv("METAL_LANGUAGE", "3.0")
  assert plugin.language() == "3.0" and plugin.plugrad_renderer("METAL").language == "3.0"
  monkeypatch.setenv("METAL_LANGUAGE", "2.4")
  with pytest.raises(SettingsError, match="METAL_LANGUAGE='2.4' is not valid"): plugin.language()
  monkeypatch.delenv("METAL_LANGUAGE")
  if not ON_MAC: assert plugin.language() == plugin.OFFLINE_LANGUAGE == "3.1"
  assert plugin.plugrad_renderer("CUDA") is None and plugin.plugrad_compiler("CUDA", None) is None


@pytest.mark.skipif(ON_MAC, reason="on macOS METAL may be available")
def test_cli_lists_the_plugin_and_says_why_metal_is_unavailable():
  env = {**os.environ, "PLUGRAD_STRICT_PLUGINS": "1"}
  out = subprocess.run([sys.executable, "-m", "plugrad", "plugins"], capture_output=True, text=True, env=env, timeout=120)
  row = next(ln for ln in out.stdout.splitlines() if ln.split()[:2] == ["metal", "plugrad-metal"])
  assert out.returncode == 0 and "unavailable here: not macOS" in row, out.stdout  # loaded, not failed
  dev = subprocess.run([sys.executable, "-m", "plugrad", "devices", "METAL"], capture_output=True, text=True, env=env, timeout=120)
  assert "not macOS (sys.platform is" in dev.stdout and dev.returncode == 1, dev.stdout
  with pytest.raises(DeviceUnavailableError, match="not macOS"): _ = Device["METAL"]


@pytest.mark.skipif(ON_MAC, reason="on macOS Device.offline gives the real device")
def test_offline_device_renders_and_syntax_checks_only(monkeypatch):
  monkeypatch.setenv("METAL_LANGUAGE", "3.0")
  dev = Device.offline("METAL")
  assert isinstance(dev, OfflineDevice) and isinstance(dev.renderer, MetalRenderer) and dev.renderer.language == "3.0"
  assert isinstance(dev.compiler, SyntaxCheckCompiler) and LABEL in dev.compiler.cache_key and "MSL 3.0" in dev.compiler.cache_key
  with pytest.raises(DeviceUnavailableError, match="not macOS"): _ = dev.runtime
  with pytest.raises(DeviceUnavailableError): _ = dev.allocator


def test_runtime_modules_import_without_metal():
  # the components a Mac uses import (Metal itself is loaded on first use); the plan and ABI modules are tested in test_icb.py
  import plugrad_metal.allocator
  import plugrad_metal.compiler
  import plugrad_metal.graph
  import plugrad_metal.runtime
  assert plugrad_metal.compiler.is_metallib(b"MTLB\x01\x00") and not plugrad_metal.compiler.is_metallib(b"#include <metal_stdlib>")


# ---- the renderer

def test_emulated_target_describes_the_renderer():
  r, t = MetalRenderer("METAL", "3.1"), TARGETS["METAL"]
  assert (r.local_max, r.shared_max, r.global_max, r.tensor_cores) == (t.local_max, t.shared_max, t.global_max, t.tensor_cores)
  assert r.capabilities == t.capabilities and "float64" not in r.capabilities
  assert r.dtype_support(dtypes.float64) == "the Metal Shading Language has no 64-bit floats" and r.dtype_support(dtypes.bfloat16) is None
  assert r.native_bfloat16 and not MetalRenderer("METAL", "3.0").native_bfloat16
  with pytest.raises(RendererError, match="unknown Metal Shading Language version"): MetalRenderer("METAL", "2.0")


def test_binding_abi_in_the_signature():
  r = MetalRenderer("METAL", "3.1")
  out, a, flags = glob(0, dtypes.float32, 64), glob(1, dtypes.float16, 64), glob(2, dtypes.bool, 64)
  n, m = UOp.variable("n", 1, 64, dtypes.int32), UOp.variable("m", 1, 1 << 40, dtypes.int64)
  g, l = special("gidx0", 4), special("lidx0", 16)
  i = g * 16 + l
  val = (a.index(i).load().cast(dtypes.float32) * n.cast(dtypes.float32) + m.cast(dtypes.float32))
  st = out.index(i).store(flags.index(i).load().where(val, 0.0))
  p = program(lin(out, a, flags, n, m, g, l, st), r, "abi")
  src = r.render(p)
  head = src[src.index("kernel void"):src.index("{")]
  assert head == ("kernel void abi(device float* data0 [[buffer(0)]], const device half* data1 [[buffer(1)]], "
                  "const device uchar* data2 [[buffer(2)]], constant long& m [[buffer(3)]], constant int& n [[buffer(4)]], "
                  "uint3 gid [[threadgroup_position_in_grid]], uint3 lid [[thread_position_in_threadgroup]]) "), head
  sig = signature(p)  # the runtime's view of the same ABI: variables in name order after the buffers
  assert (sig.nbufs, list(sig.var_indices), sig.var_formats) == (3, [3, 4], ("<q", "<i"))
  assert sig.pack([1 << 40, 7]) == [(3, (1 << 40).to_bytes(8, "little")), (4, (7).to_bytes(4, "little"))]
  assert "((int)gid.x)" in src and "((int)lid.x)" in src and "!=0)" in src  # bool memory is bytes


def test_reserved_names_and_binding_limit():
  r = MetalRenderer("METAL", "3.1")
  out = glob(0, dtypes.float32, 4)
  v = UOp.variable("uint", 0, 3, dtypes.int32)
  src = r.render(program(lin(out, v, out.index(v).store(UOp.const(dtypes.float32, 1.0))), r))
  assert "constant int& uint_ [[buffer(1)]]" in src
  many = [glob(s, dtypes.float32, 4) for s in range(32)]
  stores = [b.index(UOp.const(dtypes.int32, 0)).store(UOp.const(dtypes.float32, 1.0)) for b in many]
  with pytest.raises(RendererError, match="at most 31 buffers and variables, this one needs 32"): r.render(program(lin(*many, *stores), r))


def vector_kernel(dt):
  """Four threads each copy four contiguous elements as one vector, the store gated off for thread 3."""
  out, a = glob(0, dt, 16), glob(1, dt, 16)
  l = special("lidx0", 4)
  v = UOp(Ops.LOAD, dt.vec(4), (a.index(l * 4),))
  return lin(out, a, l, out.index(l * 4, l < 3).store(v))


@needs_clang
@pytest.mark.parametrize("lang", LANGS, ids=lang_ids)
@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float16, dtypes.bool, dtypes.int64, dtypes.uint8, dtypes.bfloat16], ids=str)
def test_vector_memory(checkers, lang, dt):
  r, c = checkers[lang]
  src = r.render(p := program(vector_kernel(dt), r, "vec"))
  c.compile(src)
  if dt is dtypes.int64: assert "long4" in src and "packed_long" not in src and "data0[alu" in src  # no packed long: lane by lane
  elif dt is dtypes.bool: assert "packed_uchar4" in src and "bool4" in src
  elif dt is dtypes.bfloat16 and lang == "3.0": assert "packed_ushort4" in src and "bfloat" not in src  # the shared emulation
  else: assert f"packed_{r.vector_name(r.mdt(dt.vec(4)))}" in src
  assert not re.search(r"(device|thread|threadgroup) [a-z]+4\*\)", src), "never an aligned vector type in memory (16 bytes for float4)"
  # the same kernel in the interpreter: the gate and the lanes
  x = (np.arange(16) % 2 == 0) if dt is dtypes.bool else np.arange(16).astype(np.float32 if dt is dtypes.bfloat16 else dtypes.to_numpy(dt))
  if dt is dtypes.bfloat16: x = (x.view(np.uint32) >> 16).astype(np.uint16)
  got = run_emulated(vector_kernel(dt), np.zeros_like(x), x, local_size=(4, 1, 1))[0]
  np.testing.assert_array_equal(got[:12], x[:12])
  assert not got[12:].any() and p.name == "vec"


@needs_clang
@pytest.mark.parametrize("lang", LANGS, ids=lang_ids)
def test_no_double_and_precise_math(checkers, lang):
  r, c = checkers[lang]
  out, a = glob(0, dtypes.int32, 8), glob(1, dtypes.float32, 8)
  i = special("lidx0", 8)
  x = a.index(i).load()
  y = (UOp(Ops.EXP2, dtypes.float32, (x,)) / x).cast(dtypes.int32)
  src = r.render(program(lin(out, a, i, out.index(i).store(y)), r, "math"))
  c.compile(src)
  assert "double" not in src and "metal::precise::exp2(" in src and "metal::precise::divide(" in src and "pg_f2i(" in src


@needs_clang
@pytest.mark.parametrize("lang", LANGS, ids=lang_ids)
def test_tensor_programs_syntax_check(checkers, lang):
  r, c = checkers[lang]
  rng = np.random.default_rng(0)
  def T(*shape): return Tensor(rng.standard_normal(shape).astype(np.float32), device="PYTHON")
  progs = {"sum": T(1 << 14).sum(), "rowsum": T(64, 512).sum(1), "half": (T(256).half() * 3).exp2().half(),
           "bf16": (T(256).cast(dtypes.bfloat16) + T(256).cast(dtypes.bfloat16)).relu(), "matmul": T(64, 96) @ T(96, 32),
           "half_matmul": T(64, 64).half() @ T(64, 64).half(), "softmax": T(8, 128).softmax(-1), "where": (T(64) > 0).where(T(64), 1.0),
           "int64": (Tensor(np.arange(64), device="PYTHON").cast(dtypes.int64) * 3).sum(), "conv": T(1, 4, 16, 16).conv2d(T(8, 4, 3, 3)),
           "gelu": T(32, 32).gelu(), "argmax": T(16, 64).argmax(1)}
  srcs: dict[str, list[str]] = {}
  for name, t in progs.items():
    items, _ = create_schedule(t.uop)
    for it in items:
      if it.kind != "kernel": continue
      src = r.render(get_program(it.ast, r))
      assert c.compile(src) == src.encode(), "the syntax-checked binary is the checked source"
      srcs.setdefault(name, []).append(src)
  assert any("threadgroup float" in s and "threadgroup_barrier(mem_flags::mem_threadgroup);" in s for s in srcs["sum"]), \
    "a long reduction uses shared memory"
  assert any("simdgroup_multiply_accumulate" in s for s in srcs["matmul"] + srcs["half_matmul"]), "the heuristics pick the simdgroup matrices"
  assert all(s.startswith("#include <metal_stdlib>\nusing namespace metal;") and "kernel void " in s for v in srcs.values() for s in v)
  assert any(("device bfloat*" in s) == (lang >= "3.1") for s in srcs["bf16"])


# ---- tensor cores: rendered as simdgroup matrices, the same lowering computed by the interpreter

@needs_clang
@pytest.mark.parametrize("tc", METAL_TENSOR_CORES, ids=lambda tc: tc.name)
def test_tensor_core_matmul(checkers, tc):
  r, c = checkers["3.1"]
  m, n, k = 4 * tc.m, 2 * tc.n, 4 * tc.k
  ast = matmul_ast(m, n, k, tc.dtype_in, tc.dtype_out)
  metal = get_program(ast, r, opts=[Opt(OptOps.TC, 0)])
  src = r.render(metal)
  c.compile(src)
  mat = {dtypes.float32: "simdgroup_float8x8", dtypes.float16: "simdgroup_half8x8"}
  assert f"{mat[tc.dtype_in]} ma, mb;" in src and f"{mat[tc.dtype_out]} mc;" in src and "simdgroup_multiply_accumulate(mc, ma, mb, mc);" in src
  assert src.count("thread_elements()") == 8
  # the interpreter runs the kernel made for EMULATE=METAL: the same linear program, so these are Metal's numbers
  emu = PythonRenderer("PYTHON", emulate="METAL")
  prg = get_program(ast, emu, opts=[Opt(OptOps.TC, 0)])
  assert [(u.op, u.dtype, u.arg) for u in prg.uops] == [(u.op, u.dtype, u.arg) for u in metal.uops], "METAL and EMULATE=METAL lower alike"
  assert [u.arg for u in prg.uops if u.op is Ops.WMMA] == [tc.wmma_arg]
  rng = np.random.default_rng(5)
  npin = dtypes.to_numpy(tc.dtype_in)
  A, B = rng.uniform(-1, 1, (m, k)).astype(npin), rng.uniform(-1, 1, (k, n)).astype(npin)
  bufs = [Buffer("PYTHON", m * n, tc.dtype_out), Buffer("PYTHON", m * k, tc.dtype_in), Buffer("PYTHON", k * n, tc.dtype_in)]
  bufs[1].copyin(memoryview(A).cast("B"))
  bufs[2].copyin(memoryview(B).cast("B"))
  ProgramRunner(prg)(bufs)
  tol = 3e-2 if tc.dtype_out is dtypes.float16 else 1e-4
  np.testing.assert_allclose(bufs[0].numpy().reshape(m, n).astype(np.float64), A.astype(np.float64) @ B.astype(np.float64), rtol=tol, atol=tol)


def test_layout_is_mlx_simdgroup_layout():
  # MLX steel/gemm/mma.h (Apple's own code): qid = lane / 4; row = (qid & 4) + (lane / 2) % 4; col = (qid & 2) * 2 + (lane % 2) * 2;
  # thread_elements()[e] is (row, col + e), for A, B and C alike
  for tc in METAL_TENSOR_CORES:
    for lane in range(32):
      qid = lane // 4
      want = tuple(((qid & 4) + (lane // 2) % 4, (qid & 2) * 2 + (lane % 2) * 2 + e) for e in range(2))
      assert tc.a_layout[lane] == tc.b_layout[lane] == tc.c_layout[lane] == want


# ---- the approximate syntax check: what it catches

@needs_clang
def test_syntax_check_errors_name_the_kernel_line():
  c = SyntaxCheckCompiler("3.1")
  src = "#include <metal_stdlib>\nusing namespace metal;\nkernel void k(device float* data0 [[buffer(0)]]) {\n  data0[0] = nope;\n}\n"
  with pytest.raises(CompileError, match=r"(?s)syntax-checked, not Metal-compiled.*kernel\.metal:4:\d+: first error in the kernel.*"
                                          r"undeclared identifier 'nope'"):
    c.compile(src)
  with pytest.raises(CompileError, match=r"(?s)failed to compile.*source near line 4"): c.compile_cached(src, "k")


@needs_clang
@pytest.mark.parametrize("body, why", [
  ("double x = data0[0]; data0[1] = x;", "metal_has_no_double"),
  ("packed_bool4 v; data0[0] = v[0];", "unknown type name 'packed_bool4'"),
  ("bfloat x = data0[0]; data0[1] = x;", "undeclared identifier 'bfloat'"),                   # MSL 3.0: no bfloat
  ("thread float* p = data0; p[0] = 1.0f;", "cannot initialize a variable"),              # device pointer as thread
  ("data0[0] = metal::precise::exp2(1.0f, 2.0f);", "too many arguments"),
  ("data0[0] = as_type<float>((short)1);", "same size"),
  ("threadgroup_barrier(mem_flags::mem_everything);", "no member named 'mem_everything'"),
], ids=["double", "packed_bool", "bfloat-3.0", "address-space", "arity", "as_type", "mem_flags"])
def test_syntax_check_catches(body, why):
  src = f"#include <metal_stdlib>\nusing namespace metal;\nkernel void k(device float* data0 [[buffer(0)]]) {{\n  {body}\n}}\n"
  with pytest.raises(CompileError, match=why): SyntaxCheckCompiler("3.0").compile(src)


@needs_clang
def test_syntax_check_attributes_and_lint():
  c = SyntaxCheckCompiler("3.1")
  ok = "#include <metal_stdlib>\nkernel void k(device float* a [[buffer(0)]], uint3 gid [[threadgroup_position_in_grid]]) {\n  a[gid.x] = 1.0f;\n}\n"
  assert c.compile(ok) == ok.encode()
  with pytest.raises(CompileError, match="unknown attribute 'bufer'"): c.compile(ok.replace("buffer(0)", "bufer(0)"))
  assert lint(ok.replace("buffer(0)", "buffer(1)")) == ["buffer indices [1] are not 0..0, each once (the METAL binding ABI)"]
  assert lint("  float4 v = *((float4*)(a+1));") == \
    ["kernel.metal:1: the pointer cast (float4*) names no address space (device, threadgroup, thread, constant)"]
  assert lint("  float4 v = float4(*((const device packed_float4*)(a+1)));") == []
  assert len(lint("long long x = 1ll;")) == 1
  with pytest.raises(CompileError, match="names no address space"): c.compile(ok.replace("a[gid.x] = 1.0f;", "*((float*)(a)) = 1.0f;"))


def test_syntax_compiler_identity():
  c = SyntaxCheckCompiler("3.0", clang="/nonexistent/clang++")
  assert c.clang == "/nonexistent/clang++" and "syntax-checked, not Metal-compiled" in repr(c) and "clang-missing" in c.cache_key
  with pytest.raises(CompileError, match=r"syntax-checked, not Metal-compiled\): METAL syntax check: /nonexistent/clang\+\+ --version failed"):
    c.compile("kernel void k() {}")
  with pytest.raises(CompileError, match="is not clang"): SyntaxCheckCompiler("3.0", clang=sys.executable).compile("kernel void k() {}")
  if (clang := find_clang()) is not None:
    a, b = SyntaxCheckCompiler("3.0", clang), SyntaxCheckCompiler("3.1", clang)
    assert a.cache_key != b.cache_key and "shim-" in a.cache_key and "clang-" in a.cache_key
