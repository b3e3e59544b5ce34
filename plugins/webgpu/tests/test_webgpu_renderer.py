"""The WGSL renderer's output (golden structure checks on suite kernels, with fixed limits: no adapter needed) and its
refusals: 64-bit dtypes, workgroups past the limits."""
import pytest

from plugrad.dtype import dtypes
from plugrad.renderer.base import RendererError
from plugrad.testing.kernels import LinearBuilder, suite
from plugrad.uop.ops import Ops, UOp
from plugrad_webgpu.context import Limits
from plugrad_webgpu.renderer import FOLD_MARK, WGSLRenderer

LIMITS = Limits((256, 256, 64), 256, 1024, 16384, 8, 1 << 27, 1 << 28)
I32 = dtypes.int32


def renderer(float16: bool = True, limits: Limits = LIMITS) -> WGSLRenderer: return WGSLRenderer("WEBGPU", limits, float16, "a test adapter")


def render(name: str, ren: WGSLRenderer | None = None) -> str:
  ren = ren or renderer()
  return ren.render(suite()[name](ren).program("WEBGPU", ren))


def test_limits_come_from_the_adapter_description():
  ren = renderer()
  assert ren.local_max == (256, 256, 64) and ren.shared_max == 16384
  assert ren.global_max == (1024 * 1024, 1024, 1024)  # gidx0 may be folded onto two dispatch dimensions
  assert {"locals", "shared", "float16", "bfloat16"} <= ren.capabilities and not {"float64", "int64"} & ren.capabilities


def test_elementwise_kernel_structure():
  src = render("ew-add-float32")
  assert "@group(0) @binding(0) var<storage, read_write> data0: array<f32>;" in src
  assert "@compute @workgroup_size(1, 1, 1)\nfn ew_add_float32(" in src
  assert "for (var ridx0: i32 = 0i; ridx0 < 37i; ridx0++) {" in src and "data0[ridx0] = (val" in src
  assert "pg_" not in src.split("@compute")[0]  # no helper needed


def test_narrow_types_are_packed_into_words_written_with_atomics():
  src = render("ew-add-int8")
  assert "var<storage, read_write> data0: array<atomic<u32>>;" in src and "var<storage, read_write> data1: array<u32>;" in src
  assert "atomicAnd(&data0[u32(i) >> 2u], ~(255u << s));" in src and "atomicOr(&data0[u32(i) >> 2u], (b & 255u) << s);" in src
  assert "<< 24u) >> 24u)" in src  # int8 sums wrap: sign-extended from the low byte
  assert "fn pg_ld_data1(i: i32) -> u32 { return (data1[u32(i) >> 2u] >> ((u32(i) & 3u) << 3u)) & 255u; }" in render("ew-and-bool")


def test_semantic_helpers_only_when_needed():
  # signed division on magnitudes; the guards (x / 0, INT_MIN / -1) and nan-propagating MAX come from the shared passes
  assert "fn pg_idiv_i32(" in render("ew-idiv-int32") and "fn pg_" not in render("ew-mod-uint32")
  assert "select(val8, 1u, (val8 == 0u))" in render("ew-mod-uint32")
  assert "fn pg_ne_f32(" in render("ew-max-float32") and "fn pg_max" not in render("ew-max-float32")
  assert "fn pg_ne_f32(" in render("ew-cmpne-float32")      # C's != is true for nan; naga's is ordered
  assert "fn pg_f2u(" in render("cast-float32-int32")       # truncation that wraps, not WGSL's saturation
  # bfloat16 rounding is integer ops written by the codegen (codegen/decompose.py), no helper of the renderer's
  bf16 = render("cast-float32-bfloat16")
  assert "2143289344u" in bf16 and "bf16" not in bf16.replace("bfloat16", "")


def test_float16_native_or_emulated():
  native, emulated = render("ew-mul-float16", renderer(True)), render("ew-mul-float16", renderer(False))
  assert native.startswith("enable f16;") and "array<f16>" in native
  assert "enable f16" not in emulated and "unpack2x16float" in emulated and "fn pg_f16(" in emulated


def test_workgroups_shared_memory_and_barriers():
  src = render("shared_reduce")
  assert "@compute @workgroup_size(16, 1, 1)" in src and "var<workgroup> smem: array<f32, 16>;" in src
  assert "workgroupBarrier();" in src and "let gidx0 = i32(pg_wid.x);" in src and "let lidx0 = i32(pg_lid.x);" in src


def test_long_launches_are_folded():
  k = LinearBuilder()
  out = k.glob(0, I32, 5000)
  g = k.emit(UOp(Ops.SPECIAL, I32, (k.const(I32, 5000),), "gidx0"))
  k.store(out, g, g)
  ren = renderer()
  from plugrad.testing.kernels import SuiteKernel
  prog = SuiteKernel("fold", k.linear, {}, {}, {0: 5000}, {0: I32}).program("WEBGPU", ren)
  src = ren.render(prog)
  assert FOLD_MARK in src and "var<uniform> pg_args: PgArgs;" in src and "if (pg_lin >= pg_args.g.x * pg_args.g.y * pg_args.g.z) { return; }" in src


def test_64_bit_dtypes_are_refused_with_the_reason():
  with pytest.raises(RendererError, match="WGSL has no 64-bit integers"): render("ew-add-int64")
  with pytest.raises(RendererError, match="WGSL has no 64-bit floats"): render("ew-add-float64")
  ren = renderer()
  assert ren.dtype_support(dtypes.float64) == "WGSL has no 64-bit floats" and ren.dtype_support(dtypes.float16) is None


def test_workgroup_past_the_limits_is_refused():
  small = Limits((8, 8, 8), 8, 1024, 16384, 8, 1 << 27, 1 << 28)
  with pytest.raises(RendererError, match=r"workgroup \(16, 1, 1\) exceeds a test adapter's limits"): render("shared_reduce", renderer(True, small))
