"""The header check and the C stand-in for libcuda (cuda_standin.c), for test_cuda_standin.py.

`header_problems` compiles plugrad_cuda's ctypes declarations against the real cuda.h: each function's prototype compared with
the header's declaration at compile time (`__builtin_types_compatible_p`: a parameter count or C type that differs
fails a static assertion), the symbol the header maps the name to (`cuEventElapsedTime` is `cuEventElapsedTime_v2` in CUDA 13's
header), and per parameter the C type's class (integer, enum, pointer, float), size, signedness and pointee size,
compared with the ctypes type's; the constants' values; the structs' size and field offsets (`offsetof`). It returns
one line per mismatch, so a planted wrong signature shows up by name.

cuda.h comes from NVIDIA's `nvidia-cuda-runtime` wheel (CUDA 13: nvidia/cu13/include; CUDA 12:
nvidia/cuda_runtime/include), else a toolkit ($CUDA_HOME, /usr/local/cuda).
"""
from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
GCC_CLASS = {1: "integer", 5: "pointer", 8: "float"}  # __builtin_classify_type's values (gcc typeclass.h)


def find_cuda_h() -> Path | None:
  """The include directory holding cuda.h, or None."""
  roots: list[Path] = []
  try:
    import nvidia  # the namespace package of NVIDIA's wheels
    roots += [Path(p) / sub for p in nvidia.__path__ for sub in ("cu13/include", "cu12/include", "cuda_runtime/include")]
  except ImportError: pass
  roots += [Path(os.environ[v]) / "include" for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
  roots.append(Path("/usr/local/cuda/include"))
  return next((r for r in roots if (r / "cuda.h").is_file()), None)


def cuda_version(include: Path) -> int:
  """The header's CUDA_VERSION (13050 for 13.5)."""
  m = re.search(r"#define\s+CUDA_VERSION\s+(\d+)", (include / "cuda.h").read_text(errors="replace"))
  return int(m.group(1)) if m else 0


def compiler() -> str | None: return shutil.which("gcc") or shutil.which("cc")


def build_standin(include: Path, out_dir: Path) -> Path:
  """cuda_standin.c compiled against `include`/cuda.h into out_dir; CalledProcessError (with gcc's output) if not."""
  so = out_dir / "libcuda_standin.so"
  cmd = [compiler() or "gcc", "-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared", f"-I{include}",
         str(HERE / "cuda_standin.c"), "-o", str(so)]
  subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)
  return so


def _kind(t: Any) -> tuple[str, int, bool | None, int | None]:
  """(class, size, signed (integers), pointee size (typed pointers)) of a ctypes type, in the C check's terms."""
  if t in (ctypes.c_void_p, ctypes.c_char_p) or issubclass(t, ctypes.Array): return "pointer", ctypes.sizeof(t), None, None
  if issubclass(t, ctypes._Pointer): return "pointer", ctypes.sizeof(t), None, ctypes.sizeof(t._type_)  # type: ignore[attr-defined]
  if t in (ctypes.c_float, ctypes.c_double): return "float", ctypes.sizeof(t), None, None
  return "integer", ctypes.sizeof(t), t(-1).value < 0, None


def _c_ident(name: str) -> str: return re.sub(r"\W", "_", name)


def check_source(prototypes: dict[str, tuple[tuple[str, Any], ...]], constants: dict[str, int],
                 structs: dict[str, type[ctypes.Structure]]) -> str:
  """The C program whose compile and output `header_problems` reads."""
  top = ["#include <stddef.h>", "#include <stdio.h>", "#include <cuda.h>", "#define PG_STR_(x) #x", "#define PG_STR(x) PG_STR_(x)"]
  body = []
  for name, params in prototypes.items():
    ctypes_list = ", ".join(c for c, _ in params) or "void"
    # compile-time only (no reference to link): the header's declaration must have exactly these parameter types
    top.append(f'_Static_assert(__builtin_types_compatible_p(__typeof__(&{name}), CUresult (CUDAAPI *)({ctypes_list})), "pg_fn_{name}");')
    body.append(f'  printf("sym {name} %s\\n", PG_STR({name}));')
    for i, (c, t) in enumerate(params):
      v = f"pg_arg_{name}_{i}"
      top.append(f"static {c} {v};")
      pointee = f"(int)sizeof(*{v})" if _kind(t)[3] is not None else "-1"
      body.append(f'  printf("arg {name} {i} %d %d %d %d\\n", __builtin_classify_type({v}), (int)sizeof({v}), '
                  f"(int)(({c})-1 < ({c})0), {pointee});")
  for cname in constants: body.append(f'  printf("const {cname} %lld\\n", (long long)({cname}));')
  for sname, st in structs.items():
    body.append(f'  printf("struct {sname} size %d\\n", (int)sizeof({sname}));')
    for f, *_ in st._fields_:
      body.append(f'  printf("field {sname} {f} %d %d\\n", (int)offsetof({sname}, {f}), (int)sizeof((({sname} *)0)->{f}));')
  return "\n".join([*top, "int main(void) {", *body, "  return 0;", "}", ""])


def header_problems(include: Path, out_dir: Path, prototypes: dict[str, tuple[tuple[str, Any], ...]], constants: dict[str, int],
                    structs: dict[str, type[ctypes.Structure]]) -> list[str]:
  """Every way the ctypes declarations disagree with cuda.h (empty: none)."""
  src, exe = out_dir / "header_check.c", out_dir / "header_check"
  src.write_text(check_source(prototypes, constants, structs))
  cc = subprocess.run([compiler() or "gcc", "-std=gnu11", f"-I{include}", str(src), "-o", str(exe)], capture_output=True, text=True, timeout=120)
  if cc.returncode != 0:
    # one line per function whose prototype failed its assertion (or whose C type does not parse)
    bad = sorted({m for m in re.findall(r"pg_(?:fn|arg)_(\w+?)(?:_\d+)?\b", cc.stderr) if m in prototypes})
    rejected = [f"{n}: the C types {[c for c, _ in prototypes[n]]} do not match cuda.h's prototype" for n in bad]
    return rejected or [f"the header check does not compile: {cc.stderr[-2000:]}"]
  out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
  # gcc classifies an enum as an integer of its underlying type (unsigned int here): enums are told by the header text
  enums = set(re.findall(r"typedef\s+enum\s+\w*\s*\{[^}]*\}\s*(\w+)\s*;", (include / "cuda.h").read_text(errors="replace")))
  problems: list[str] = []
  for line in out:
    tag, *rest = line.split()
    if tag == "sym" and rest[0] != rest[1]:
      problems.append(f"{rest[0]}: cuda.h maps this name to {rest[1]}: call {rest[1]} (the library's symbol for today's prototype)")
    elif tag == "arg":
      name, i, cls, size, signed, pointee = rest[0], *map(int, rest[1:])
      c, t = prototypes[name][i]
      kind, tsize, tsigned, tpointee = _kind(t)
      ccls = "enum" if c in enums else GCC_CLASS.get(cls, f"class {cls}")
      where = f"{name} parameter {i} ({c})"
      if (ccls == "enum" and kind != "integer") or (ccls != "enum" and ccls != kind):
        problems.append(f"{where}: cuda.h has a {ccls}, ctypes passes {t.__name__} (a {kind})")
      elif size != tsize: problems.append(f"{where}: {size} bytes in cuda.h, {tsize} as {t.__name__}")
      elif ccls == "integer" and bool(signed) != tsigned:
        problems.append(f"{where}: {'signed' if signed else 'unsigned'} in cuda.h, {t.__name__} is not")
      elif tpointee is not None and pointee != tpointee:
        problems.append(f"{where}: points to {pointee} bytes in cuda.h, {t.__name__} to {tpointee}")
    elif tag == "const" and int(rest[1]) != constants[rest[0]]:
      problems.append(f"{rest[0]} is {rest[1]} in cuda.h, {constants[rest[0]]} in plugrad_cuda")
    elif tag == "struct" and int(rest[2]) != ctypes.sizeof(structs[rest[0]]):
      problems.append(f"struct {rest[0]}: {rest[2]} bytes in cuda.h, {ctypes.sizeof(structs[rest[0]])} as {structs[rest[0]].__name__}")
    elif tag == "field":
      field = getattr(structs[rest[0]], rest[1])
      if (field.offset, field.size) != (int(rest[2]), int(rest[3])):
        problems.append(f"{rest[0]}.{rest[1]}: offset {rest[2]} size {rest[3]} in cuda.h, offset {field.offset} size {field.size} in ctypes")
  return problems


def called_functions(package: Path) -> set[str]:
  """The driver functions the package's modules call (`lib.cuXxx(`, `self.lib.cuXxx(`, ...)."""
  return {m for f in package.glob("*.py") for m in re.findall(r"\blib\.(cu[A-Z]\w*)\s*\(", f.read_text())}
