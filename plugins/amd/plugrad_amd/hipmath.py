"""Math the AMDGPU backend of clang does not provide without ROCm's device libraries (ocml), written out in C.

clang lowers float32 `exp2`, `log2`, `sqrt`, `fma`, `trunc` and float64 `sqrt`, `fma`, `trunc`, `fmod` to AMDGPU
instructions itself (`__builtin_*`), but float64 `exp2`/`log2`/`sin` and `pow` of any width have no lowering: they
become calls to functions that, with `-nogpulib`, do not exist. The helpers below are those, in plain C on clang
builtins that exist for the host too (`__builtin_ldexp`, `__builtin_frexp`, `__builtin_rint`, `__builtin_fma`), so
plugins/amd/tests compiles the very same text for the CPU and checks it against numpy (`host_library`).

* `pg_exp2_f64`: 2^n · e^(f·ln2) with n = rint(x), |f| <= 1/2; e^r by its Taylor series to r^13 (remainder < 1e-19).
* `pg_log2_f64`: x = m·2^e with m in [sqrt(1/2), sqrt(2)); log(m) = 2·atanh(s), s = (m-1)/(m+1), |s| <= 0.172, by
  its series to s^23 (remainder < 1e-20).
* `pg_sin_f64`: x itself for |x| < 1e-8 (signed zeros kept); else reduction by pi/2 in three parts with fma
  (Cody-Waite; exact enough for |x| up to about 1e15, beyond that the result loses digits: no Payne-Hanek), then the
  Taylor series of sin or cos to degree 21/22 on [-pi/4, pi/4].
* `pg_pow_f64`, `pg_pow_f32`: C99's `pow` special cases (1 for b = 0 or a = 1 even with nan, signed zeros and
  infinities for odd integer b, nan for a < 0 and non-integer b), else exp2(b·log2|a|) in double: correct to float
  rounding for float32 (the float path), within about |b·log2 a|·3e-16 relative for float64.
"""
from __future__ import annotations

import math


def _coeffs(ks: range, sign: bool = False) -> list[str]:
  return [repr((-1) ** (j if sign else 0) / math.factorial(k)) for j, k in enumerate(ks)]


def _horner(var: str, coeffs: list[str]) -> str:
  """c[0] + var*(c[1] + var*(...)) as C text."""
  out = coeffs[-1]
  for c in reversed(coeffs[:-1]): out = f"{c} + {var} * ({out})"
  return out


_EXP = _horner("r", _coeffs(range(0, 14)))
_LOG = _horner("s2", [repr(1 / k) for k in range(1, 25, 2)])
_SIN = _horner("r2", _coeffs(range(1, 22, 2), sign=True))
_COS = _horner("r2", _coeffs(range(0, 23, 2), sign=True))

# C source per helper; `{fn}` is the dialect's helper prefix (static __device__ inline on AMDGPU, static inline on a host)
HELPERS: dict[str, str] = {
  "pg_exp2_f64": f"""\
{{fn}}double pg_exp2_f64(double x) {{
  if (x != x) return x;
  if (x >= 1024.0) return __builtin_inf();
  if (x < -1080.0) return 0.0;
  double n = __builtin_rint(x), r = (x - n) * 0.6931471805599453;
  return __builtin_ldexp({_EXP}, (int)n);
}}""",
  "pg_log2_f64": f"""\
{{fn}}double pg_log2_f64(double x) {{
  if (x != x || x == __builtin_inf()) return x;
  if (x < 0.0) return __builtin_nan("");
  if (x == 0.0) return -__builtin_inf();
  int e;
  double m = __builtin_frexp(x, &e);
  if (m < 0.70710678118654752) {{ m *= 2.0; e -= 1; }}
  double s = (m - 1.0) / (m + 1.0), s2 = s * s;
  return (double)e + 2.0 * s * ({_LOG}) * 1.4426950408889634;
}}""",
  "pg_sin_f64": f"""\
{{fn}}double pg_sin_f64(double x) {{
  if (x != x || x - x != 0.0) return x - x;
  if (__builtin_fabs(x) < 1e-8) return x;
  double k = __builtin_rint(x * 0.6366197723675814);
  double r = __builtin_fma(-k, 1.5707963267948966, x);
  r = __builtin_fma(-k, 6.123233995736766e-17, r);
  r = __builtin_fma(-k, -1.4973849048591698e-33, r);
  double q = k - 4.0 * __builtin_floor(k * 0.25), r2 = r * r;
  double s = (q == 0.0 || q == 2.0) ? r * ({_SIN}) : {_COS};
  return q >= 2.0 ? -s : s;
}}""",
  "pg_pow_f64": """\
{fn}double pg_pow_f64(double a, double b) {
  if (b == 0.0 || a == 1.0) return 1.0;
  if (a != a || b != b) return a + b;
  double ab = __builtin_fabs(a), bb = __builtin_fabs(b);
  int integer = __builtin_rint(b) == b, odd = integer && bb < 9007199254740992.0 && __builtin_fmod(bb, 2.0) == 1.0;
  if (bb == __builtin_inf()) return ab == 1.0 ? 1.0 : (ab < 1.0) == (b > 0.0) ? 0.0 : __builtin_inf();
  if (ab == 0.0) return b < 0.0 ? (odd ? __builtin_copysign(__builtin_inf(), a) : __builtin_inf()) : (odd ? a : 0.0);
  if (ab == __builtin_inf()) return b < 0.0 ? (odd && a < 0.0 ? -0.0 : 0.0) : (odd && a < 0.0 ? -__builtin_inf() : __builtin_inf());
  if (a < 0.0 && !integer) return __builtin_nan("");
  double r = pg_exp2_f64(b * pg_log2_f64(ab));
  return a < 0.0 && odd ? -r : r;
}""",
  "pg_pow_f32": "{fn}float pg_pow_f32(float a, float b) { return (float)pg_pow_f64((double)a, (double)b); }",
}
# what each helper calls (added to the prelude before it)
DEPENDS: dict[str, tuple[str, ...]] = {"pg_pow_f64": ("pg_exp2_f64", "pg_log2_f64"), "pg_pow_f32": ("pg_exp2_f64", "pg_log2_f64", "pg_pow_f64")}


def source(name: str, prefix: str) -> list[tuple[str, str]]:
  """(name, C text) of helper `name` and everything it calls, callees first."""
  return [(n, HELPERS[n].replace("{fn}", prefix)) for n in (*DEPENDS.get(name, ()), name)]


def host_library() -> str:
  """All helpers as a C file for the host (`cc -O2 -fno-fast-math`), with exported wrappers `host_NAME`."""
  parts = [HELPERS[n].replace("{fn}", "static ") for n in ("pg_exp2_f64", "pg_log2_f64", "pg_sin_f64", "pg_pow_f64", "pg_pow_f32")]
  parts += [f"double host_{n}(double x) {{ return pg_{n}_f64(x); }}" for n in ("exp2", "log2", "sin")]
  parts += ["double host_pow_f64(double a, double b) { return pg_pow_f64(a, b); }",
            "float host_pow_f32(float a, float b) { return pg_pow_f32(a, b); }"]
  return "\n\n".join(parts) + "\n"
