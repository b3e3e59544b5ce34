"""The files around the plugins that their wheels do not ship, so their tests run from the repository and not from
plugins/*/tests (which run beside an installed wheel): the GPU check scripts (bench/gpu), the CUDA benchmark's and
replay's dry runs, the Triton example (examples/triton_matmul.py), plugrad-amd's assembly example and the Mac check."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from plugrad.dtype import dtypes
from plugrad.errors import LaunchError

ROOT = Path(__file__).resolve().parents[1]
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="triton is not installed (an optional extra: pip install triton)")


def _bash_syntax_ok(script: Path) -> bool: return subprocess.run(["bash", "-n", str(script)], capture_output=True, timeout=60).returncode == 0


# ---- CUDA: bench/gpu and the Triton example

def test_cuda_gpu_check_script_is_ready():
  driver = pytest.importorskip("plugrad_cuda.driver", reason="plugrad-cuda is not installed (.ci/run installs it)")
  assert _bash_syntax_ok(ROOT / "bench/gpu/cuda_check.sh")
  res = subprocess.run([sys.executable, str(ROOT / "bench/gpu/cuda_replay.py"), "--dry"], capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert res.returncode == 0 and "dry run ok" in res.stdout, res.stderr
  bench = str(ROOT / "bench/gpu/cuda_bench.py")
  # the benchmark's plugrad side at toy sizes on PYTHON under EMULATE=CUDA (the CUDA heuristics' kernels, interpreted)
  res = subprocess.run([sys.executable, bench, "--dry", "--only", "mm16,ew,softmax,replay"], capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert res.returncode == 0 and "mm16: r_64_64 [('TC', 0, None)]" in res.stdout and "n/a" not in res.stdout, res.stdout + res.stderr
  assert "GROUP" in res.stdout and "targets" not in res.stdout, "row statistics in shared memory; no figures from a dry run"
  if driver.probe() is not None:  # without a GPU it says so and measures nothing
    res = subprocess.run([sys.executable, bench], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 1 and "no usable NVIDIA GPU here" in res.stdout and "unmeasured" in res.stdout, res.stdout + res.stderr


def _triton_example() -> ModuleType:
  pytest.importorskip("plugrad_cuda", reason="plugrad-cuda is not installed (.ci/run installs it)")
  sys.path.insert(0, str(ROOT / "examples"))
  try:
    import triton_matmul
    return triton_matmul
  finally: sys.path.remove(str(ROOT / "examples"))


@needs_triton
def test_triton_matmul_ptx_compiles_to_a_cubin_for_sm_90(tmp_path, monkeypatch):
  tm = _triton_example()
  from plugrad_cuda import ptx
  from plugrad_cuda.compiler import CUDACompiler
  from plugrad_cuda.runtime import ptx_abi
  monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
  src, meta = tm.compile_ptx(256, 256, 256, arch=90, block=(64, 64, 32), num_warps=4, num_stages=2)
  assert ptx.is_ptx(src) and ptx.target(src) == "sm_90a" and "wgmma" in src, "Hopper PTX with warpgroup MMA"
  assert meta["threads"] == 128 and meta["grid"] == (4, 4, 1) and ptx.shared_bytes(src) == meta["shared"] > 0
  cubin = CUDACompiler("sm_90").compile(src)
  assert cubin[:4] == b"\x7fELF"
  prog = tm.make_program(src, meta)
  assert prog.signature == ((dtypes.float16, "out"), (dtypes.float16, "in"), (dtypes.float16, "in"))
  assert prog.launch_dims({}) == ((4, 4, 1), (128, 1, 1))
  extra, shared = ptx_abi(prog, meta["name"], 3)
  assert len(extra) == 2 and all(v.value == 0 for v in extra) and shared == meta["shared"]  # Triton's scratch pointers: null


@needs_triton
def test_triton_example_without_a_gpu(capsys, monkeypatch, tmp_path):
  tm = _triton_example()
  if tm.gpu_reason() is None: pytest.skip("this machine has a GPU: the example runs the kernel (bench/gpu/cuda_check.sh)")
  monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
  assert tm.main(["--size", "256"]) == 0
  out = capsys.readouterr().out
  assert "PTX for sm_90a" in out and "no GPU here" in out and "cubin for sm_90a" in out


# ---- AMD: bench/gpu/amd_check.sh and the bring-your-own-assembly example (plugins/amd/examples)

def _amd_toolchain() -> ModuleType:
  toolchain = pytest.importorskip("plugrad_amd.toolchain", reason="plugrad-amd is not installed (.ci/run installs it)")
  if (why := toolchain.missing()) is not None: pytest.skip(f"{why} (.ci/run installs clang-19 and lld-19)")
  return toolchain


def test_amd_gpu_check_script_is_ready():
  assert _bash_syntax_ok(ROOT / "bench/gpu/amd_check.sh")


def test_byo_assembly_example_runs_its_offline_part():
  _amd_toolchain()
  res = subprocess.run([sys.executable, str(ROOT / "plugins/amd/examples/byo_assembly.py")], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PLUGRAD_STRICT_PLUGINS": "1"})
  assert res.returncode == 0, res.stderr
  assert "vadd: gfx1100 wave32" in res.stdout and ("no AMD GPU here" in res.stdout or "matches numpy" in res.stdout)


def test_rdna3_assembly_kernel_assembles_to_a_checked_code_object():
  tc = _amd_toolchain().find()
  from plugrad.backend import new_program
  from plugrad_amd.elf import STT_FUNC, CodeObject
  from plugrad_amd.runtime import Kernargs, check_code_object, var_sizes
  binary = tc.link(tc.assemble((ROOT / "plugins/amd/examples/rdna3_vadd.s").read_text(), "gfx1100"))
  co = CodeObject(binary)
  assert co.arch == "gfx1100" and co.symbol("vadd").type == STT_FUNC and co.symbol("vadd").size == 76  # 13 instructions
  kd = co.descriptor("vadd")
  assert kd.kernarg_size == 24 and kd.wave32 and kd.uses_kernarg_ptr and kd.granulated_vgprs == 0 and kd.group_segment_fixed_size == 0
  assert kd.compute_pgm_rsrc2 >> 7 & 1, "ENABLE_SGPR_WORKGROUP_ID_X: s2 holds the workgroup id"
  meta = co.kernels()["vadd"]
  assert [a[".name"] for a in meta[".args"]] == ["out", "a", "b"] and meta[".wavefront_size"] == 32
  # wrapped as a plugrad program for the AMD device: the signature's packing is the kernel's own
  prog = new_program("vadd", "AMD", binary=binary, buffers=[(dtypes.float32, "out"), (dtypes.float32, "in"), (dtypes.float32, "in")],
                     global_size=(4,), local_size=(64,))
  assert prog.stage == "binary" and prog.device == "AMD" and prog.launch_dims({}) == ((4, 1, 1), (64, 1, 1))
  check_code_object(prog.binary, "vadd", Kernargs(len(prog.globals), var_sizes(prog)), "gfx1100")
  with pytest.raises(LaunchError, match="the code object is for gfx1100, the device is gfx942"):
    check_code_object(prog.binary, "vadd", Kernargs(3, []), "gfx942")
  if tc.objdump is not None:
    text = tc.disassemble(binary, "gfx1100")
    assert "v_add_f32_e32 v1, v1, v2" in text and "global_store_b32 v0, v1, s[4:5]" in text


# ---- METAL: plugins/metal/mac_check.sh

def test_mac_check_script_is_ready(tmp_path: Path):  # its dry run and offline install: tests/gpu/test_gpu_checks.py
  script = ROOT / "plugins/metal/mac_check.sh"
  assert _bash_syntax_ok(script)
  if sys.platform != "darwin":
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60, env={**os.environ, "OUT": str(tmp_path)})
    assert res.returncode == 0 and "== gpu: no GPU (not macOS" in res.stdout, res.stdout + res.stderr
