"""plugrad-amd without an AMD GPU: the probe's reasons, the CLI, real Tensor programs rendered to HIP and compiled by
clang + lld to code objects whose metadata and kernel descriptors are checked against the kernels, the kernarg packing
checked against clang's own layout, the float64 math helpers checked on the host, and the hipGraph plan built from a
TinyJit capture (the hand-written RDNA3 assembly example: tests/test_plugin_scripts.py in the repository). Nothing
here launches a kernel: no AMD GPU exists on this project's machines, and the run tier (runtime, allocator, graph
runner against HIP) has never run."""
from __future__ import annotations

import ctypes
import math
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest

from plugrad import Tensor, TinyJit, Variable
from plugrad.backend import GraphLaunch as Launch
from plugrad.codegen import get_program
from plugrad.codegen.opt import Opt, OptOps
from plugrad.device.registry import Device, OfflineDevice
from plugrad.dtype import dtypes
from plugrad.engine.schedule import create_schedule
from plugrad.errors import CompileError, DeviceUnavailableError, LaunchError
from plugrad.helpers import Context, SettingsError
from plugrad.testing.harness import emulating_renderer
from plugrad.testing.kernels import matmul_ast
from plugrad_amd import hip, hipmath, toolchain
from plugrad_amd.compiler import AMDCompiler
from plugrad_amd.elf import STT_FUNC, STT_OBJECT, CodeObject, ELFError, unpack_msgpack
from plugrad_amd.graph import KernelNodeParams, node_params
from plugrad_amd.renderer import HIPRenderer
from plugrad_amd.runtime import Kernargs, check_code_object, var_sizes
from plugrad_amd.targets import ARCHS, UnsupportedArchError, base_arch, env_arch, get_arch

ARCH_NAMES = ("gfx942", "gfx1100", "gfx1201")
HAS_HIP = hip.probe() is None
NO_TOOLCHAIN = toolchain.missing()
needs_clang = pytest.mark.skipif(NO_TOOLCHAIN is not None, reason=f"{NO_TOOLCHAIN} (.ci/run installs clang-19 and lld-19)")


# ---- the probe

class FakeHIP:
  """A libamdhip64 stand-in: hipInit and hipGetDeviceCount return what the test says, the device properties hold a
  name and an arch name at the offsets ROCm 6's hipDeviceProp_tR0600 has them (the probe finds the arch by content)."""
  def __init__(self, init: int = 0, count: int = 1, count_code: int = 0, target: bytes = b"gfx942:sramecc+:xnack-"):
    self.init, self.count, self.count_code, self.target = init, count, count_code, target
  def hipInit(self, flags): return self.init
  def hipGetDeviceCount(self, n):
    n._obj.value = self.count
    return self.count_code
  def hipGetDevicePropertiesR0600(self, props, index):
    props[:19] = b"AMD Instinct MI300X"
    props[1160:1160 + len(self.target)] = self.target
    return 0
  def hipGetErrorName(self, code):
    return {100: b"hipErrorNoDevice", 35: b"hipErrorInsufficientDriver", 2: b"hipErrorOutOfMemory"}.get(code, b"hipErrorUnknown")
  def hipGetErrorString(self, code): return {100: b"no ROCm-capable device is detected"}.get(code, b"")


def _no_lib():
  raise OSError("libamdhip64.so: cannot open shared object file: No such file or directory")


def test_probe_reasons():
  assert hip.probe_with(_no_lib).startswith("no HIP runtime (libamdhip64.so not found)")
  assert "hipInit returned hipErrorNoDevice (no ROCm-capable device is detected)" in hip.probe_with(lambda: FakeHIP(init=100))
  assert "hipGetDeviceCount returned hipErrorNoDevice" in hip.probe_with(lambda: FakeHIP(count_code=100))
  assert "HIP reports no AMD GPUs" in hip.probe_with(lambda: FakeHIP(count=0))
  assert hip.probe_with(lambda: FakeHIP()) is None
  why = hip.probe_with(lambda: FakeHIP(target=b"gfx90a:sramecc+:xnack-"))
  assert why is not None and "does not support: gfx90a" in why and "gfx942" in why
  def broken(): raise RuntimeError("boom")
  assert hip.probe_with(lambda: type("L", (), {"hipInit": lambda self, f: broken()})()).startswith("the HIP runtime could not be queried")


def test_device_properties_name_and_arch():
  assert hip.arch_of(FakeHIP(target=b"gfx1100"), 0) == ("AMD Instinct MI300X", "gfx1100")


def test_check_raises_typed_errors_with_the_hip_names():
  with pytest.raises(hip.HIPOutOfMemory, match=r"hipMalloc\(64\) failed: hipErrorOutOfMemory \(2\)"): hip.check(FakeHIP(), 2, "hipMalloc(64)")
  with pytest.raises(hip.HIPError, match="hipErrorNoDevice"): hip.check(FakeHIP(), 100, "hipInit")
  hip.check(FakeHIP(), 0, "fine")


@pytest.mark.skipif(HAS_HIP, reason="this machine has HIP and an AMD GPU")
def test_cli_lists_the_plugin_and_says_why_amd_is_unavailable():
  env = {**os.environ, "PLUGRAD_STRICT_PLUGINS": "1"}
  out = subprocess.run([sys.executable, "-m", "plugrad", "plugins"], capture_output=True, text=True, env=env, timeout=120)
  row = next(ln for ln in out.stdout.splitlines() if ln.split()[:2] == ["amd", "plugrad-amd"])
  assert out.returncode == 0 and "unavailable here: no HIP runtime (libamdhip64.so not found)" in row, out.stdout  # loaded, not failed
  dev = subprocess.run([sys.executable, "-m", "plugrad", "devices", "AMD"], capture_output=True, text=True, env=env, timeout=120)
  assert "no HIP runtime (libamdhip64.so not found)" in dev.stdout, dev.stdout
  assert dev.returncode == 1
  with pytest.raises(DeviceUnavailableError, match="libamdhip64.so not found"): _ = Device["AMD"]


# ---- targets and settings

def test_arch_from_the_environment(monkeypatch):
  from plugrad_amd.plugin import arch
  monkeypatch.setenv("AMD_ARCH", "gfx1100")
  assert arch("AMD") == "gfx1100"
  monkeypatch.setenv("AMD_ARCH", "gfx942:sramecc+:xnack-")  # a target ID as rocminfo prints it: the features are dropped
  assert arch("AMD") == "gfx942"
  for bad in ("mi300", "gfx90a"):
    monkeypatch.setenv("AMD_ARCH", bad)
    with pytest.raises(SettingsError, match=r"AMD_ARCH=.* is not valid: expected one of gfx942, gfx1100"): arch("AMD")
  monkeypatch.setenv("AMD_ARCH", " ")
  assert env_arch() is None
  if not HAS_HIP: assert arch("AMD") == "gfx942"  # no GPU to ask: the default
  assert base_arch("gfx1201") == "gfx1201" and get_arch("gfx1100").wave == 32 and get_arch("gfx942").wave == 64
  with pytest.raises(UnsupportedArchError, match="gfx90a is not supported"): get_arch("gfx90a")
  with pytest.raises(ValueError, match="not an AMDGPU target ID"): base_arch("sm_80")


def test_arch_from_the_gpu(monkeypatch):
  # a GPU machine, simulated: the probe passes and HIP reports each device's arch
  from plugrad_amd import plugin
  monkeypatch.delenv("AMD_ARCH", raising=False)
  monkeypatch.setattr(hip, "probe", lambda: None)
  monkeypatch.setattr(hip, "device_arch", lambda index: ["gfx1100", "gfx90a"][index])
  assert plugin.arch("AMD") == "gfx1100"
  with pytest.raises(DeviceUnavailableError, match="AMD:1 is a gfx90a, an arch plugrad-amd does not support"): plugin.arch("AMD:1")
  monkeypatch.setenv("AMD_ARCH", "gfx942")  # the setting wins (the runtime then refuses code objects for another arch)
  assert plugin.arch("AMD:1") == "gfx942"


def test_renderer_per_arch_and_its_emulation_target():
  mfma, wmma, rdna4 = (HIPRenderer("AMD", a) for a in ARCH_NAMES)
  assert [tc.device for tc in mfma.tensor_cores] == ["AMD_MFMA"] * 2 and {tc.threads for tc in mfma.tensor_cores} == {64}
  assert [tc.device for tc in wmma.tensor_cores] == ["AMD"] * 2 and rdna4.tensor_cores == () and "tensor_cores" not in rdna4.capabilities
  assert (mfma.emulate_target, wmma.emulate_target, rdna4.emulate_target) == ("AMD_MFMA", "AMD", "AMD")
  assert {"float16", "bfloat16", "float64", "int64"} <= mfma.capabilities
  with pytest.raises(ValueError, match="unsupported arch 'gfx90a'"): HIPRenderer("AMD", "gfx90a")


@pytest.mark.skipif(HAS_HIP, reason="this machine has an AMD GPU: Device.offline gives the real device")
@needs_clang
def test_offline_device_renders_and_compiles_only(monkeypatch):
  monkeypatch.setenv("AMD_ARCH", "gfx1100")
  dev = Device.offline("AMD")
  assert isinstance(dev, OfflineDevice) and dev.renderer.arch == "gfx1100" and dev.compiler.cache_key.endswith(" gfx1100")
  assert emulating_renderer(dev).target.name == "AMD"  # the conformance suite's emulate tier: RDNA3
  with pytest.raises(DeviceUnavailableError, match="libamdhip64.so not found"): _ = dev.runtime
  with pytest.raises(DeviceUnavailableError, match="renderer and compiler only"): _ = dev.allocator
  monkeypatch.setenv("AMD_ARCH", "gfx942")
  assert emulating_renderer(Device.offline("AMD")).target.name == "AMD_MFMA"  # CDNA3: the MFMA layouts


# ---- compiling to code objects, checked against the kernels

def _kernels(t: Tensor) -> list:
  items, _ = create_schedule(t.uop)
  return [it.ast for it in items if it.kind == "kernel"]


def _compile(arch: str, ast, opts=None) -> tuple[str, bytes, object]:
  r = HIPRenderer("AMD", arch)
  p = get_program(ast, r, opts=opts)
  src = r.render(p)
  return src, AMDCompiler(arch).compile(src), p


def check_kernel_object(binary: bytes, program, arch: str) -> dict:
  """The code object holds exactly this kernel for this arch, and its metadata, descriptor and our packing agree."""
  co = CodeObject(binary)
  a = ARCHS[arch]
  symbol = program.name if program.name.isidentifier() else None
  kernels = co.kernels()
  assert co.arch == arch and co.osabi == 64 and len(kernels) == 1, (co.arch, kernels.keys())
  (name, meta), = kernels.items()
  assert symbol is None or name == symbol
  assert meta[".symbol"] == f"{name}.kd" and co.symbol(name).type == STT_FUNC and co.symbol(f"{name}.kd").type == STT_OBJECT
  kd = co.descriptor(name)
  args = Kernargs(len(program.globals), var_sizes(program))
  assert kd.kernarg_size == meta[".kernarg_segment_size"] == args.size, (kd, meta, args.layout)
  assert kd.group_segment_fixed_size == meta[".group_segment_fixed_size"]
  assert meta[".wavefront_size"] == a.wave and kd.wave32 == (a.wave == 32)
  assert meta[".vgpr_count"] > 0 and meta[".sgpr_count"] > 0 and "sgpr_spill_count" not in meta
  assert kd.granulated_vgprs == max(math.ceil(meta[".vgpr_count"] / 8), 1) - 1  # 8-register granules on these archs
  assert meta[".max_flat_workgroup_size"] == math.prod(program.local_size)
  assert kd.uses_kernarg_ptr or args.size == 0
  assert check_code_object(binary, name, args, arch) is not None
  return meta


@needs_clang
@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_tensor_programs_compile_to_code_objects(arch):
  rng = np.random.default_rng(0)
  def T(*shape): return Tensor(rng.standard_normal(shape).astype(np.float32), device="PYTHON")
  n = Variable("n", 1, 256)
  progs = {"sum": T(1 << 14).sum(), "rowsum": T(64, 512).sum(1), "half": (T(256).half() * 3).exp2().half(),
           "bf16": (T(256).cast(dtypes.bfloat16) + T(256).cast(dtypes.bfloat16)).relu(), "matmul": T(64, 96) @ T(96, 32),
           "softmax": T(8, 128).softmax(-1), "f64": T(64).cast(dtypes.float64).sin().exp2().log2(), "pow": T(32).abs() ** T(32),
           "symbolic": (T(256).shrink(((0, n.bind(100)),)) * 2).sum(), "int64": T(64).cast(dtypes.int64) * 3 + 1}
  srcs: dict[str, list[str]] = {}
  metas = {}
  for name, t in progs.items():
    for ast in _kernels(t):
      src, binary, p = _compile(arch, ast)
      metas.setdefault(name, []).append(check_kernel_object(binary, p, arch))
      srcs.setdefault(name, []).append(src)
  assert any("__builtin_amdgcn_s_barrier()" in s and "__attribute__((shared" in s for s in srcs["sum"]), "the long reduction uses LDS"
  assert any(m[".group_segment_fixed_size"] > 0 for m in metas["sum"]), "and the code object reserves it"
  assert any("_Float16" in s for s in srcs["half"]) and any("pg_sin_f64" in s and "pg_exp2_f64" in s for s in srcs["f64"])
  assert any("pg_pow_f32" in s for s in srcs["pow"])
  assert any(len(m[".args"]) == 3 and m[".args"][-1][".size"] == 4 for m in metas["symbolic"]), "the variable n is an int32 kernarg"
  assert all('extern "C" __attribute__((global)) void __attribute__((amdgpu_flat_work_group_size(1, ' in s for v in srcs.values() for s in v)


def test_kernargs_pack_in_place():
  k = Kernargs(2, [4, 8, 4])
  assert k.layout == [(0, 8), (8, 8), (16, 4), (24, 8), (32, 4)] and k.size == 36 and ctypes.sizeof(k.buf) == 40
  addr = ctypes.addressof(k.buf)
  k.set([0x1000, 0xFFFF_FFFF_0000], [-7, 1 << 40, 5])
  assert k.values() == (0x1000, 0xFFFF_FFFF_0000, -7, 1 << 40, 5) and ctypes.addressof(k.buf) == addr
  assert list(k.extra)[:4] == [1, addr, 2, ctypes.addressof(k.nbytes)] and k.extra[4] == 3 and k.nbytes.value == 36
  with pytest.raises(LaunchError, match="takes 2 buffers and 3 variables"): k.set([1], [2])


@needs_clang
@pytest.mark.parametrize("arch", ARCH_NAMES)
def test_kernarg_layout_matches_clang(arch):
  # variables in name order, an int32 before an int64: the int64 is aligned to 8, as clang lays out the parameters
  src = ('extern "C" __attribute__((global)) void k(float* out, const float* a, int n, long long m, int z) {\n'
         "  out[__builtin_amdgcn_workitem_id_x()] = a[n] + (float)m + (float)z;\n}\n")
  binary = AMDCompiler(arch).compile(src)
  meta = CodeObject(binary).kernels()["k"]
  good = Kernargs(2, [4, 8, 4])
  assert [(a[".offset"], a[".size"]) for a in meta[".args"]] == good.layout and meta[".kernarg_segment_size"] == good.size
  check_code_object(binary, "k", good, arch)
  with pytest.raises(LaunchError, match=r"explicit arguments are at \(offset, size\) .* plugrad packs"):
    check_code_object(binary, "k", Kernargs(2, [8, 4, 4]))
  other = "gfx1100" if arch != "gfx1100" else "gfx942"
  with pytest.raises(LaunchError, match=f"the code object is for {arch}, the device is {other}"): check_code_object(binary, "k", good, other)
  with pytest.raises(LaunchError, match="holds \\['k'\\], not 'q'"): check_code_object(binary, "q", good)
  with pytest.raises(LaunchError, match="not an AMDGPU code object"): check_code_object(b"\x7fELF" + bytes(60), "k", good)


@needs_clang
@pytest.mark.parametrize("arch", ["gfx942", "gfx1100"])
@pytest.mark.parametrize("din", [dtypes.float16, dtypes.bfloat16], ids=["f16", "bf16"])
def test_tensor_core_matmul_compiles(arch, din):
  src, binary, p = _compile(arch, matmul_ast(64, 32, 64, din, dtypes.float32), opts=[Opt(OptOps.TC, 0)])
  check_kernel_object(binary, p, arch)
  asm = AMDCompiler(arch).to_asm(src)
  kind = "f16" if din is dtypes.float16 else "bf16"
  want = f"v_mfma_f32_16x16x16_{kind}" if arch == "gfx942" else f"v_wmma_f32_16x16x16_{kind}"
  assert want in asm, f"{want} not in the {arch} assembly"
  if arch == "gfx942": assert math.prod(p.local_size) % 64 == 0  # whole wave64s execute an MFMA
  # the heuristics pick the tensor core by themselves for a matmul of matching shape and dtypes
  assert "__builtin_amdgcn_" + ("mfma" if arch == "gfx942" else "wmma") in _compile(arch, matmul_ast(64, 32, 64, din, dtypes.float32))[0]


@needs_clang
def test_compile_error_carries_clangs_diagnostics():
  bad = 'extern "C" __attribute__((global)) void k(float* a) {\n  a[0] = nope;\n}\n'
  with pytest.raises(CompileError, match=r"(?s)clang \(HIP → gfx942 assembly\).*kernel.hip:2:10: error: use of undeclared identifier 'nope'"):
    AMDCompiler("gfx942").compile(bad)
  with pytest.raises(CompileError, match=r"(?s)failed to compile.*source near line 2:\n.*>    2 \|   a\[0\] = nope;"):
    AMDCompiler("gfx942").compile_cached(bad, "k")
  with pytest.raises(CompileError, match=r"(?s)clang \(assembler, gfx1100\).*error"): toolchain.find().assemble("  v_bogus_op v0\n", "gfx1100")


@needs_clang
def test_cache_key_names_the_toolchain_and_arch():
  a, b = AMDCompiler("gfx942"), AMDCompiler("gfx1100")
  v = ".".join(map(str, toolchain.find().version))
  assert a.cache_key != b.cache_key and f"clang-{v}" in a.cache_key and "-ffp-contract=off" in a.cache_key and a.cache_key.endswith("gfx942")


@needs_clang
def test_disassembler():
  if toolchain.find().objdump is None: pytest.skip("no llvm-objdump next to clang (Debian: apt-get install llvm-19)")
  c = AMDCompiler("gfx1100")
  text = c.disassemble(c.compile('extern "C" __attribute__((global)) void k(float* a) { a[0] = 1.0f; }\n'))
  assert "<k>:" in text and "s_endpgm" in text and "global_store_b32" in text


def test_toolchain_discovery_says_what_it_tried(tmp_path):
  with pytest.raises(toolchain.ToolchainMissing, match="AMD_CLANG; tried: /nonexistent/clang: not found.*apt-get install clang-19 lld-19"):
    toolchain.find({"AMD_CLANG": "/nonexistent/clang", "PATH": ""})
  fake = tmp_path / "clang"
  fake.write_text("#!/bin/sh\necho 'clang version 15.0.7'\n")
  fake.chmod(0o755)
  assert "clang 15 is older than 17" in (toolchain.missing({"AMD_CLANG": str(fake), "PATH": ""}) or "")
  assert "not found" in (toolchain.missing({"PATH": str(tmp_path / "empty")}) or "")


def test_an_unversioned_llvm_tool_is_taken_only_at_clang_s_version(tmp_path, monkeypatch):
  clang_dir, bin_dir = tmp_path / "clang", tmp_path / "bin"
  clang_dir.mkdir()
  bin_dir.mkdir()
  (clang_dir / "clang").write_text("#!/bin/sh\necho 'clang version 19.1.7'\n")
  objdump = bin_dir / "llvm-objdump"
  monkeypatch.setenv("PATH", str(bin_dir))
  for printed, found in (("Debian LLVM version 14.0.6", None), ("Ubuntu LLVM version 19.1.7", str(objdump))):
    objdump.write_text(f"#!/bin/sh\necho '{printed}'\n")
    objdump.chmod(0o755)
    assert toolchain._next_to(str(clang_dir / "clang"), "llvm-objdump", 19) == found, printed


# ---- the math helpers, the same C text compiled for the host

@pytest.fixture(scope="module")
def host_math(tmp_path_factory):
  d = tmp_path_factory.mktemp("hipmath")
  src, lib = d / "m.c", d / "m.so"
  src.write_text(hipmath.host_library())
  cc = next((c for c in ("cc", "gcc", "clang", "clang-19") if shutil.which(c)), None)
  if cc is None: pytest.skip("no host C compiler")
  res = subprocess.run([cc, "-O2", "-fno-fast-math", "-ffp-contract=off", "-shared", "-fPIC", str(src), "-o", str(lib)],
                       capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr
  m = ctypes.CDLL(str(lib))
  for n in ("exp2", "log2", "sin"):
    getattr(m, f"host_{n}").restype, getattr(m, f"host_{n}").argtypes = ctypes.c_double, [ctypes.c_double]
  m.host_pow_f64.restype, m.host_pow_f64.argtypes = ctypes.c_double, [ctypes.c_double] * 2
  m.host_pow_f32.restype, m.host_pow_f32.argtypes = ctypes.c_float, [ctypes.c_float] * 2
  return m


def _rel(got: np.ndarray, want: np.ndarray) -> float: return float(np.max(np.abs(got - want) / np.abs(want)))


def test_float64_math_helpers_match_numpy(host_math):
  rng = np.random.default_rng(0)
  x = np.concatenate([rng.uniform(-1070, 1020, 4000), rng.uniform(-4, 4, 4000), [0.0, -0.0, 1.0, 0.5, -1022.5, 1023.99]])
  assert _rel(np.array([host_math.host_exp2(v) for v in x]), np.exp2(x)) < 2e-15
  assert [host_math.host_exp2(v) for v in (np.nan, 1024.0, -1100.0, -1074.0)][1:] == [np.inf, 0.0, 5e-324]
  y = np.concatenate([np.exp(rng.uniform(-700, 700, 4000)), rng.uniform(0.5, 2, 4000), [5e-324, 1e-310, 2.0, 1.0000000000000002, 0.9999999999999999]])
  assert _rel(np.array([host_math.host_log2(v) for v in y]), np.log2(y)) < 2e-15
  assert [host_math.host_log2(v) for v in (1.0, np.inf, 0.0)] == [0.0, np.inf, -np.inf] and np.isnan(host_math.host_log2(-1.0))
  z = np.concatenate([rng.uniform(-10, 10, 4000), rng.uniform(-1e6, 1e6, 4000), [np.pi, -np.pi, np.pi / 2, 1e-300]])
  assert float(np.max(np.abs(np.array([host_math.host_sin(v) for v in z]) - np.sin(z)))) < 3e-16
  assert np.isnan(host_math.host_sin(np.inf)) and np.isnan(host_math.host_sin(np.nan)) and math.copysign(1, host_math.host_sin(-0.0)) == -1


def test_pow_helpers_follow_c99(host_math):
  libm = ctypes.CDLL("libm.so.6")  # the host's C99 pow is the reference for the special cases
  libm.pow.restype, libm.pow.argtypes = ctypes.c_double, [ctypes.c_double] * 2
  special = [0.0, -0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 3.0, -3.0, 2.5, np.inf, -np.inf, np.nan, 1e-40, -7.0]
  for a in special:
    for b in special:
      got, want = host_math.host_pow_f64(a, b), libm.pow(a, b)
      # through exp2(b*log2|a|) in double: the error grows with |b*log2|a|| (documented in hipmath.py)
      lg = math.log2(abs(a)) if 0 < abs(a) < math.inf and math.isfinite(b) else 0.0
      tol = 4e-16 * (1 + abs(b * lg))
      assert (math.isnan(got) and math.isnan(want)) or (got == want and math.copysign(1, got) == math.copysign(1, want)) or \
        abs(got - want) <= tol * abs(want), (a, b, got, want)
  rng = np.random.default_rng(1)
  a, b = rng.uniform(0, 10, 4000).astype(np.float32), rng.uniform(-30, 30, 4000).astype(np.float32)
  got = np.array([host_math.host_pow_f32(x, y) for x, y in zip(a, b)], np.float32)
  want = (a.astype(np.float64) ** b.astype(np.float64)).astype(np.float32)  # the correctly rounded float32 result
  ok = np.isfinite(want) & (want > 1e-37)
  assert np.array_equal(got[ok], want[ok])


# ---- ELF and MessagePack details

def test_msgpack_subset():
  assert unpack_msgpack(bytes([0x82, 0xA1, 0x61, 0x01, 0xA1, 0x62, 0x93, 0xC3, 0xC0, 0xFF])) == {"a": 1, "b": [True, None, -1]}
  assert unpack_msgpack(b"\xcd\x01\x00") == 256 and unpack_msgpack(b"\xd0\x80") == -128
  assert unpack_msgpack(b"\xcb" + struct.pack(">d", 1.5)) == 1.5 and unpack_msgpack(b"\xca" + struct.pack(">f", -2.0)) == -2.0
  assert unpack_msgpack(b"\xd9\x03abc") == "abc" and unpack_msgpack(b"\xdc\x00\x01\x05") == [5]
  with pytest.raises(ELFError, match="truncated"): unpack_msgpack(b"\x92\x01")
  with pytest.raises(ELFError, match="unsupported type byte 0xc7"): unpack_msgpack(b"\xc7\x00\x00")
  with pytest.raises(ELFError, match="not an ELF file"): CodeObject(b"nope" * 20)


# ---- the hipGraph nodes (pure Python; the plan itself: tests/device/test_graph_plan.py)

def test_node_params_point_at_the_packed_kernargs():
  assert ctypes.sizeof(KernelNodeParams) == 64  # hipKernelNodeParams on x86-64
  fields = ("blockDim", "extra", "func", "gridDim", "kernelParams", "sharedMemBytes")
  assert [getattr(KernelNodeParams, f).offset for f in fields] == [0, 16, 24, 32, 48, 56]
  args = Kernargs(2, [4])
  n = node_params(ctypes.c_void_p(0x55), Launch((3, 2, 1), (128, 1, 1), (0x3000, 0x4000), (9,)), args)
  assert (n.func, n.gridDim.x, n.gridDim.y, n.blockDim.x, n.sharedMemBytes, n.kernelParams) == (0x55, 3, 2, 128, 0, None)
  assert n.extra == ctypes.cast(args.extra, ctypes.c_void_p).value and args.values() == (0x3000, 0x4000, 9)


# ---- the runtime, allocator and hipGraph runner driven through plugrad against a stand-in HIP (amd_fake_hip.py beside this file):
# what plugrad hands to HIP (copies, code objects, launch dims, packed kernargs, graph nodes and patches), not what a
# GPU computes: the stand-in executes no kernel

@pytest.fixture
def stand_in_hip(monkeypatch):
  from amd_fake_hip import FakeHIP
  fake = FakeHIP("gfx1100")
  monkeypatch.setattr(hip, "load_libhip", lambda: fake)
  monkeypatch.delenv("AMD_ARCH", raising=False)  # the arch comes from the (stand-in) GPU
  hip.hip.cache_clear()
  hip.context.cache_clear()
  Device.reset()
  try: yield fake
  finally:
    Device.reset()
    hip.hip.cache_clear()
    hip.context.cache_clear()


def _ptrs(kernargs: bytes, n: int) -> tuple[int, ...]: return struct.unpack_from(f"<{n}Q", kernargs)


@needs_clang
def test_runtime_and_allocator_against_a_stand_in_hip(stand_in_hip, capsys):
  fake = stand_in_hip
  dev = Device["AMD"]
  assert dev.renderer.arch == "gfx1100" and "Stand-in Radeon GPU (gfx1100), HIP 6.2" in dev.runtime.describe()
  x = np.arange(64, dtype=np.float32)
  a = Tensor(x, device="AMD").realize()
  assert any(bytes(m) == x.tobytes() for m in fake.memory.values()), "the copy in went through the staging buffer to device memory"
  b = (a * 2 + 1).realize()
  (launch,) = fake.launches
  assert fake.functions[launch.fn] in fake.modules[next(iter(fake.modules))]
  out_ptr, in_ptr = _ptrs(launch.kernargs, 2)
  assert bytes(fake.memory[in_ptr]) == x.tobytes() and len(fake.memory[out_ptr]) == 256 and len(launch.kernargs) == 16
  assert math.prod(launch.grid) * math.prod(launch.block) >= 16  # the launch covers the 64 elements (vectors of 4 per work-item)
  fake.memory[out_ptr][:] = (x * 2 + 1).tobytes()  # what the GPU would have written
  np.testing.assert_array_equal(b.numpy(), x * 2 + 1)  # the copy out reads it back
  n = Variable("n", 1, 64)
  (a.shrink(((0, n.bind(5)),)) * 3).sum().realize()
  assert struct.unpack_from("<i", fake.launches[-1].kernargs, 16)[0] == 5, "the variable n is the int32 after the two pointers"
  if toolchain.find().objdump is not None:  # DEBUG=5 prints the code object's disassembly when a kernel is loaded
    with Context(DEBUG=5): (a - 7).realize()
    assert "s_endpgm" in capsys.readouterr().out


@needs_clang
def test_hipgraph_runner_against_a_stand_in_hip(stand_in_hip):
  fake = stand_in_hip
  def step(a, b):
    x = (a * 2 + b).contiguous()
    y = (x * x - a).contiguous()
    z = (b + 1).contiguous()
    return (y + z).realize()
  f = TinyJit(step)
  inputs = []
  with Context(JIT=1):
    for v in range(5):
      a, b = (Tensor(np.full(64, v + k, np.float32), device="AMD").realize() for k in range(2))
      inputs.append((a._buffer().ensure_allocated().handle.ptr, b._buffer().ensure_allocated().handle.ptr))
      f(a, b)
  assert fake.graph_launches, "the replays ran as hipGraph launches"
  (graph,) = fake.graphs.values()  # built and instantiated once: every replay has the same topology
  assert len(graph.nodes) == 4 and len(fake.execs) == 1
  by_handle = {nd.handle: k for k, nd in enumerate(graph.nodes)}
  deps = [tuple(by_handle[d] for d in nd.deps) for nd in graph.nodes]
  assert 0 in deps[1] and set(deps[3]) >= {1, 2}, deps  # y reads x; the sum of y and z waits for both
  # each replay's nodes read that replay's inputs: the patched kernargs hold the new device pointers
  last_a, last_b = inputs[-1]
  launched = fake.graph_launches[-1]
  first_ptrs = [set(_ptrs(nd.kernargs, len(nd.kernargs) // 8)) for nd in launched]
  assert last_a in first_ptrs[0] and last_b in first_ptrs[0] and last_b in first_ptrs[2]
  assert fake.set_params, "new inputs patch the nodes in place (hipGraphExecKernelNodeSetParams)"
