"""WGSL building blocks: identifiers, type names, literals, and the helper functions kernels may need (each helper is
added to a kernel's prelude only when the kernel uses it).

WGSL's types are narrower than plugrad's: 32-bit scalars (i32, u32, f32), f16 with the `shader-f16` feature, and bool
(which cannot live in host-shareable memory). How every plugrad dtype maps onto them:

| dtype | computes as | stored in a storage buffer as |
|---|---|---|
| int32, uint32, float32 | i32, u32, f32 | itself |
| int8, int16 / uint8, uint16 | i32 / u32, narrowed after every op (sign-extended / masked) | bytes / halves packed in u32 words |
| bool | bool | one byte per element, packed in u32 words |
| bfloat16 | f32, as uint16 in memory: emulated by the codegen before rendering (codegen/decompose.py) | halves packed in u32 words |
| float16, `shader-f16` | f16 | f16 |
| float16, no `shader-f16` | f32, rounded through `pack2x16float` after every op | halves packed in u32 words |
| int64, uint64, float64 | not supported: WGSL has no 64-bit types (the renderer says so; the Tensor call refuses them) | |

Packed words that a kernel writes are `atomic<u32>`: two threads writing two bytes of one word each clear and set
only their own bits (`atomicAnd` then `atomicOr`), so neighbouring elements written by different threads never race.
"""
from __future__ import annotations

import math
import re

import numpy as np

from plugrad.backend import DType, RendererError, dtypes, float32_repr

# reserved words and keywords of WGSL that a kernel or local-memory name could collide with (the rest of WGSL's list
# never matches our `dataN`/`aluN` names)
WGSL_RESERVED = frozenset("alias break case const const_assert continue continuing default diagnostic discard else enable false fn for if let loop "
                          "override requires return struct switch true var while array atomic bool f16 f32 i32 u32 mat2x2 ptr sampler texture_1d "
                          "vec2 vec3 vec4 bitcast select abs max min sin exp2 log2 sqrt trunc pow fma main".split())

PACKED = frozenset({dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16})  # (+ float16 without shader-f16)
UNSUPPORTED = {dtypes.int64: "WGSL has no 64-bit integers", dtypes.uint64: "WGSL has no 64-bit integers", dtypes.float64: "WGSL has no 64-bit floats"}


def identifier(name: str, prefix: str = "k_") -> str:
  """`name` as a WGSL identifier: other characters become `_`; a leading digit, `__` or a reserved word gets `prefix`."""
  out = re.sub(r"\W", "_", name, flags=re.ASCII) or "kernel"
  return f"{prefix}{out}" if out[0].isdigit() or out.startswith("__") or out in WGSL_RESERVED or out == "_" else out


def scalar_type(dt: DType, float16: bool) -> str:
  """The WGSL type a value of scalar `dt` computes in (`float16`: the adapter has shader-f16)."""
  if dt in UNSUPPORTED: raise RendererError(f"WEBGPU cannot render {dt!r}: {UNSUPPORTED[dt]}")
  if dt is dtypes.bool: return "bool"
  if dt in (dtypes.int8, dtypes.int16, dtypes.int32): return "i32"
  if dt in (dtypes.uint8, dtypes.uint16, dtypes.uint32): return "u32"
  if dt is dtypes.float16 and float16: return "f16"
  if dtypes.is_float(dt): return "f32"
  raise RendererError(f"WEBGPU has no WGSL type for {dt!r}")


def vector_type(scalar: str, count: int) -> str:
  """A WGSL vector for 2-4 lanes, an array beyond (WGSL vectors stop at 4; lanes are only ever taken by constant index)."""
  return scalar if count == 1 else f"vec{count}<{scalar}>" if count <= 4 else f"array<{scalar}, {count}>"


def bits_of(dt: DType) -> int: return 8 * dt.itemsize


def literal(v: float | int | bool, dt: DType, float16: bool) -> str:
  """A literal of scalar dtype `dt`, typed as its compute type. inf/nan go through helpers (WGSL has no such literals, and
  a constant expression may not be infinite)."""
  if dt is dtypes.bool: return "true" if v else "false"
  t = scalar_type(dt, float16)
  if t in ("f32", "f16"):
    x = float(v)
    if dt is dtypes.float16: x = float(np.float16(x)) if math.isfinite(x) else x
    if math.isnan(x): return f"pg_nan_{t}()"
    if math.isinf(x): return f"pg_inf_{t}()" if x > 0 else f"(-pg_inf_{t}())"
    s = float32_repr(x) if t == "f32" else str(np.float16(x))
    s += "f" if t == "f32" else "h"
    return f"({s})" if s.startswith("-") else s
  n = int(v)
  if t == "u32": return f"{n & 0xFFFFFFFF}u"
  if n == -(1 << 31): return "(-2147483647i - 1i)"
  return f"({n}i)" if n < 0 else f"{n}i"


# ---- helpers, by name: the kernel adds the ones it calls

# helpers other helpers call
DEPENDS = {"pg_inf_f16": ("pg_inf_f32",), "pg_nan_f16": ("pg_nan_f32",), "pg_isnan_f16": ("pg_isnan_f32",),
           "pg_idiv_i32": ("pg_uabs",), "pg_mod_i32": ("pg_uabs",), "pg_fdiv0_f32": ("pg_isnan_f32", "pg_nan_f32", "pg_inf_f32"),
           "pg_fmul0_f32": ("pg_nan_f32",),
           "pg_ne_f32": ("pg_isnan_f32",), "pg_ne_f16": ("pg_isnan_f16",), "pg_lt_f32": ("pg_isnan_f32",),
           "pg_lt_f16": ("pg_isnan_f16",), "pg_eq_f32": ("pg_isnan_f32",), "pg_eq_f16": ("pg_isnan_f16",)}

HELPERS: dict[str, str] = {
  # the bits go through a variable: a bitcast of a constant is a constant expression, and Chromium's Tint rejects one
  # whose value is inf or nan ("value inf cannot be represented as 'f32'"); naga accepts both spellings
  "pg_inf_f32": "fn pg_inf_f32() -> f32 { var b = 0x7f800000u; return bitcast<f32>(b); }",
  "pg_nan_f32": "fn pg_nan_f32() -> f32 { var b = 0x7fc00000u; return bitcast<f32>(b); }",
  "pg_inf_f16": "fn pg_inf_f16() -> f16 { return f16(pg_inf_f32()); }",
  "pg_nan_f16": "fn pg_nan_f16() -> f16 { return f16(pg_nan_f32()); }",
  # nan tests look at the bits: naga compiles `x != x` to an ordered comparison (false for nan), and WGSL lets
  # implementations assume there are no nans at all
  "pg_isnan_f32": "fn pg_isnan_f32(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }",
  "pg_isnan_f16": "fn pg_isnan_f16(x: f16) -> bool { return pg_isnan_f32(f32(x)); }",
  # x / ±0 written with a literal zero: llvmpipe folds it to a wrong value (0 / 0.0f gives 0), so it is spelled out
  "pg_fdiv0_f32": """fn pg_fdiv0_f32(a: f32, zero_sign: f32) -> f32 {
  if (pg_isnan_f32(a) || a == 0.0f) { return pg_nan_f32(); }
  return select(-pg_inf_f32(), pg_inf_f32(), (a > 0.0f) == (zero_sign > 0.0f));
}""",
  # x * ±0 with a literal zero: llvmpipe folds it to 0, also for a nan or inf x (nan in IEEE); zero_sign is the zero's sign bit
  "pg_fmul0_f32": """fn pg_fmul0_f32(a: f32, zero_sign: u32) -> f32 {
  if ((bitcast<u32>(a) & 0x7fffffffu) >= 0x7f800000u) { return pg_nan_f32(); }
  return bitcast<f32>((bitcast<u32>(a) & 0x80000000u) ^ zero_sign);
}""",
  # C's comparisons: != true, < and == false when either side is nan. naga's != is ordered, and a shader compiler may
  # assume no nans (llvmpipe through OpenGL turns `nan < -1.0` true), so nan is tested on the bits
  "pg_ne_f32": "fn pg_ne_f32(a: f32, b: f32) -> bool { return !(a == b) || pg_isnan_f32(a) || pg_isnan_f32(b); }",
  "pg_ne_f16": "fn pg_ne_f16(a: f16, b: f16) -> bool { return !(a == b) || pg_isnan_f16(a) || pg_isnan_f16(b); }",
  "pg_lt_f32": "fn pg_lt_f32(a: f32, b: f32) -> bool { return (a < b) && !pg_isnan_f32(a) && !pg_isnan_f32(b); }",
  "pg_lt_f16": "fn pg_lt_f16(a: f16, b: f16) -> bool { return (a < b) && !pg_isnan_f16(a) && !pg_isnan_f16(b); }",
  "pg_eq_f32": "fn pg_eq_f32(a: f32, b: f32) -> bool { return (a == b) && !pg_isnan_f32(a); }",
  "pg_eq_f16": "fn pg_eq_f16(a: f16, b: f16) -> bool { return (a == b) && !pg_isnan_f16(a); }",
  # float -> integer bits: truncation, nan/inf give 0, huge values wrap modulo 2^32 (the interpreter's C semantics; WGSL's
  # own conversion saturates). t - floor(t / 2^32) * 2^32 is exact in f32 for every integer-valued t.
  "pg_f2u": """fn pg_f2u(x: f32) -> u32 {
  if ((bitcast<u32>(x) & 0x7fffffffu) >= 0x7f800000u) { return 0u; }
  let t = trunc(x);
  if (abs(t) < 2147483648.0f) { return bitcast<u32>(i32(t)); }
  return u32(t - floor(t / 4294967296.0f) * 4294967296.0f);
}""",
  "pg_f16": "fn pg_f16(f: f32) -> f32 { return unpack2x16float(pack2x16float(vec2<f32>(f, 0.0f))).x; }",
  # signed division and remainder on magnitudes (u32), so the result never depends on how the backend divides negative
  # numbers (GLSL leaves % of negatives undefined); a divisor of 0 or -1 never gets here (codegen/decompose.py)
  "pg_uabs": "fn pg_uabs(x: i32) -> u32 { return select(bitcast<u32>(x), 0u - bitcast<u32>(x), x < 0i); }",
  "pg_idiv_i32": """fn pg_idiv_i32(a: i32, b: i32) -> i32 {
  let q = bitcast<i32>(pg_uabs(a) / pg_uabs(b));
  return select(q, 0i - q, (a < 0i) != (b < 0i));
}""",
  "pg_mod_i32": """fn pg_mod_i32(a: i32, b: i32) -> i32 {
  let r = bitcast<i32>(pg_uabs(a) % pg_uabs(b));
  return select(r, 0i - r, a < 0i);
}""",
  "pg_pow_i32": """fn pg_pow_i32(a0: i32, b0: i32) -> i32 {
  if (b0 < 0i) { if (a0 == 1i) { return 1i; } if (a0 == -1i) { return select(1i, -1i, (b0 & 1i) != 0i); } return 0i; }
  var a = a0; var b = b0; var r = 1i;
  while (b != 0i) { if ((b & 1i) != 0i) { r = r * a; } a = a * a; b = b >> 1u; }
  return r;
}""",
  "pg_pow_u32": """fn pg_pow_u32(a0: u32, b0: u32) -> u32 {
  var a = a0; var b = b0; var r = 1u;
  while (b != 0u) { if ((b & 1u) != 0u) { r = r * a; } a = a * a; b = b >> 1u; }
  return r;
}""",
}
