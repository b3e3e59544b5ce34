"""The renderer of the PYTHON device (the reference interpreter): a linear program as readable, re-parsable text.

One line per uop, numbered from 0, after a short header:

```
# kernel 'r_16'
# target CUDA
   0 DEFINE_GLOBAL  float32.ptr(16)      ()        0
   1 CONST          int32                ()        16
   2 RANGE          int32                (1,)      (0, AxisType.LOOP)
```

The columns are: the uop's index, its op, its dtype, the indices of its sources, and its arg (the rest of the line;
nothing for None).
None of the first four contains spaces. Args and dtypes are written as Python literals plus a few names (dtype names,
`AxisType.X`, `AddrSpace.X`, `Ops.X`, `inf`, `nan`) and read back by a small parser that evaluates nothing else.

`EMULATE=CUDA|METAL|AMD|AMD_MFMA|CPU_AVX512|CPU_AMX` (read when the renderer is built) makes the PYTHON device describe
that device instead of itself: its workgroup limits, shared memory and tensor cores. The codegen then lowers for it and
the interpreter, which reads the target from the header, runs and checks that lowering. `AMD` is RDNA3 (wave32 WMMA),
`AMD_MFMA` CDNA3 (MI300, gfx942: wave64 MFMA). The CPU targets describe an x86 CPU: no workgroups, 16-wide vectors, and
its tensor cores (AVX-512 BF16/VNNI; `CPU_AMX` adds the AMX tiles), which the optimizer then uses in their CPU form.
"""
from __future__ import annotations

import ast
import functools
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from plugrad.backend import (
  AMD_MFMA_TENSOR_CORES,
  AMD_TENSOR_CORES,
  CPU_AMX_TENSOR_CORES,
  CPU_AVX512_TENSOR_CORES,
  CUDA_TENSOR_CORES,
  METAL_TENSOR_CORES,
  AddrSpace,
  AxisType,
  Dims3,
  DType,
  GroupOp,
  Ops,
  Renderer,
  RendererError,
  TensorCore,
  UOp,
  dtypes,
  getenv,
  linear_parts,
)

_DTYPE_CAPS = frozenset({"float16", "bfloat16", "float64", "int64"})


@dataclass(frozen=True)
class Target:
  """What a PYTHON renderer describes: itself, or the device it emulates."""
  name: str
  local_max: Dims3
  max_threads: int                   # threads per workgroup
  shared_max: int
  tensor_cores: tuple[TensorCore, ...]
  dtypes: frozenset[str]             # the dtype capabilities
  global_max: Dims3 = (2**31 - 1, 65535, 65535)
  workgroups: bool = True            # False: a CPU (no LOCAL ranges or shared memory; tensor cores in their CPU form)
  vector_width: int = 4              # float lanes the optimizer may put in one vector value

  @property
  def capabilities(self) -> frozenset[str]:
    return self.dtypes | ({"locals", "shared"} if self.workgroups else set()) | ({"tensor_cores"} if self.tensor_cores else set())


TARGETS: dict[str, Target] = {
  "PYTHON": Target("PYTHON", (1024, 1024, 64), 1024, 49152, (), _DTYPE_CAPS),
  # sm_80+: 1024 threads per block, 48 KiB of static shared memory per block
  "CUDA": Target("CUDA", (1024, 1024, 64), 1024, 49152, CUDA_TENSOR_CORES, _DTYPE_CAPS),
  # Apple GPUs: 1024 threads per threadgroup, 32 KiB of threadgroup memory, no double precision
  "METAL": Target("METAL", (1024, 1024, 1024), 1024, 32768, METAL_TENSOR_CORES, _DTYPE_CAPS - {"float64"}),
  # RDNA3: 1024 work-items per workgroup, 64 KiB of LDS
  "AMD": Target("AMD", (1024, 1024, 1024), 1024, 65536, AMD_TENSOR_CORES, _DTYPE_CAPS),
  # CDNA3 (MI300, gfx942): 1024 work-items per workgroup, 64 KiB of LDS per workgroup, wave64 MFMA
  "AMD_MFMA": Target("AMD_MFMA", (1024, 1024, 1024), 1024, 65536, AMD_MFMA_TENSOR_CORES, _DTYPE_CAPS),
  # x86 CPUs (plugrad-cpu on Zen 4/5 or Cooper Lake: AVX-512 BF16 + VNNI; Sapphire Rapids and later: AMX too)
  "CPU_AVX512": Target("CPU_AVX512", (1, 1, 1), 1, 0, CPU_AVX512_TENSOR_CORES, _DTYPE_CAPS, workgroups=False, vector_width=16),
  "CPU_AMX": Target("CPU_AMX", (1, 1, 1), 1, 0, CPU_AMX_TENSOR_CORES, _DTYPE_CAPS, workgroups=False, vector_width=16),
}


def get_target(name: str) -> Target:
  if name not in TARGETS:
    raise RendererError(f"EMULATE={name!r} is not an emulated device; choose one of {sorted(t for t in TARGETS if t != 'PYTHON')}")
  return TARGETS[name]


class PythonRenderer(Renderer):
  """The PYTHON device's renderer. `emulate` (default: the EMULATE environment variable) picks the described device."""
  supports_float4 = True
  vector_width = 4  # exercises the expander's vector lanes in the interpreter
  has_local = has_shared = True
  nan_max = True  # numpy's maximum: nan wins
  full_pow = True  # numpy's power
  native_math = GroupOp.Transcendental  # numpy's
  # numpy's add.at: every dtype but bool and bfloat16 (whose memory here is uint16 bits, docs/writing-a-backend.md)
  atomic_add = frozenset({dtypes.float16, dtypes.float32, dtypes.float64, *dtypes.ints})

  def __init__(self, device: str, emulate: str | None = None):
    super().__init__(device)
    name = getenv("EMULATE", "") if emulate is None else emulate
    self.target = get_target(name.upper() or "PYTHON")
    self.emulate = None if self.target.name == "PYTHON" else self.target.name
    t = self.target
    self.global_max, self.local_max, self.shared_max = t.global_max, t.local_max, t.shared_max
    if not t.workgroups: self.has_local = self.has_shared = False
    self.vector_width = t.vector_width
    self.tensor_cores, self.capabilities = t.tensor_cores, t.capabilities
    self.validate()

  def __repr__(self) -> str: return f"<PythonRenderer {self.device}{f' EMULATE={self.emulate}' if self.emulate else ''}>"

  def render(self, program: UOp) -> str:
    name, uops = linear_parts(program)
    return render_text(name, self.target.name, uops)


# ---- the text format

class Line(NamedTuple):
  """One parsed uop line."""
  op: Ops
  dtype: DType
  src: tuple[int, ...]
  arg: Any
  lineno: int   # 1-based line in the text
  text: str


class Parsed(NamedTuple):
  name: str
  target: str
  lines: tuple[Line, ...]


class SourceSyntaxError(ValueError):
  """The text is not a well-formed PYTHON program; the message names the line."""


def format_dtype(dt: DType) -> str: return repr(dt).replace("dtypes.", "").replace(" ", "")


def format_arg(x: Any) -> str:
  """`x` in the literal syntax `parse_value` reads back."""
  if x is None or isinstance(x, (bool, int, str)): return repr(x)
  if isinstance(x, float): return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf") if math.isinf(x) else repr(x)
  if isinstance(x, tuple): return "(" + ", ".join(format_arg(e) for e in x) + ("," if len(x) == 1 else "") + ")"
  if isinstance(x, (AxisType, AddrSpace, Ops)): return f"{type(x).__name__}.{x.name}"
  if isinstance(x, DType): return format_dtype(x)
  raise RendererError(f"the PYTHON renderer cannot write an arg of type {type(x).__name__}: {x!r}")


def render_text(name: str, target: str, uops: tuple[UOp, ...]) -> str:
  index = {u: i for i, u in enumerate(uops)}
  out = [f"# kernel {name!r}", f"# target {target}"]
  for i, u in enumerate(uops):
    if (missing := [s for s in u.src if s not in index or index[s] >= i]):
      raise RendererError(f"kernel {name!r}: uop #{i} ({u.op.name}) uses a {missing[0].op.name} that does not come before it in the program")
    try: arg = format_arg(u.arg)
    except RendererError as e: raise RendererError(f"kernel {name!r}, uop #{i} ({u.op.name}): {e}") from None
    srcs = "(" + ",".join(str(index[s]) for s in u.src) + ("," if len(u.src) == 1 else "") + ")"
    out.append(f"{i:4d} {u.op.name:<14} {format_dtype(u.dtype):<24} {srcs:<12} {'' if u.arg is None else arg}".rstrip())
  return "\n".join(out) + "\n"


_ENUMS: dict[str, Any] = {"AxisType": AxisType, "AddrSpace": AddrSpace, "Ops": Ops}
_NAMES: dict[str, Any] = {"None": None, "True": True, "False": False, "inf": math.inf, "nan": math.nan,
                          **{n: dt for n, dt in vars(dtypes).items() if isinstance(dt, DType)}}


def _value(node: ast.AST) -> Any:
  if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (int, float, str))): return node.value
  if isinstance(node, ast.Tuple): return tuple(_value(e) for e in node.elts)
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
    v = _value(node.operand)
    if isinstance(v, bool) or not isinstance(v, (int, float)): raise SourceSyntaxError(f"cannot negate {v!r}")
    return -v if isinstance(node.op, ast.USub) else v
  if isinstance(node, ast.Name):
    if node.id not in _NAMES: raise SourceSyntaxError(f"unknown name {node.id!r}")
    return _NAMES[node.id]
  if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in _ENUMS:
    enum = _ENUMS[node.value.id]
    if node.attr not in enum.__members__: raise SourceSyntaxError(f"{node.value.id} has no member {node.attr!r}")
    return enum[node.attr]
  if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("vec", "ptr") and not node.keywords:
    base, args = _value(node.func.value), tuple(_value(a) for a in node.args)
    if not isinstance(base, DType): raise SourceSyntaxError(f".{node.func.attr}() needs a dtype, got {base!r}")
    try: return base.vec(*args) if node.func.attr == "vec" else base.ptr(*args)
    except (TypeError, ValueError) as e: raise SourceSyntaxError(f"bad dtype: {e}") from None
  raise SourceSyntaxError(f"unexpected {ast.unparse(node)!r}")


@functools.lru_cache(maxsize=4096)
def parse_value(text: str) -> Any:
  """Read a value written by `format_arg` / `format_dtype` (literals and the known names only; nothing is executed)."""
  try: tree = ast.parse(text.strip(), mode="eval")
  except SyntaxError as e: raise SourceSyntaxError(f"cannot parse {text.strip()!r}: {e.msg}") from None
  return _value(tree.body)


def parse_text(text: str) -> Parsed:
  """Parse a rendered program back into lines; raises SourceSyntaxError naming the line on malformed input."""
  name: str | None = None
  target = "PYTHON"
  lines: list[Line] = []
  for lineno, raw in enumerate(text.splitlines(), 1):
    s = raw.strip()
    if not s: continue
    try:
      if s.startswith("#"):
        key, _, rest = s[1:].strip().partition(" ")
        if key == "kernel":
          if not isinstance(name := parse_value(rest), str): raise SourceSyntaxError("the kernel name must be a str literal")
        elif key == "target": target = rest.strip()
        continue
      fields = s.split(None, 4)
      if len(fields) < 4: raise SourceSyntaxError("expected: index op dtype (sources) arg")
      if not fields[0].isdigit() or int(fields[0]) != len(lines): raise SourceSyntaxError(f"expected uop index {len(lines)}, got {fields[0]!r}")
      if fields[1] not in Ops.__members__: raise SourceSyntaxError(f"unknown op {fields[1]!r}")
      if not isinstance(dt := parse_value(fields[2]), DType): raise SourceSyntaxError(f"{fields[2]!r} is not a dtype")
      src = parse_value(fields[3])
      if not isinstance(src, tuple) or not all(isinstance(j, int) and not isinstance(j, bool) and 0 <= j < len(lines) for j in src):
        raise SourceSyntaxError(f"sources must be a tuple of indices of earlier uops, got {fields[3]!r}")
      arg = parse_value(fields[4]) if len(fields) == 5 else None
    except SourceSyntaxError as e: raise SourceSyntaxError(f"line {lineno}: {e} in {raw.strip()!r}") from None
    lines.append(Line(Ops[fields[1]], dt, src, arg, lineno, raw.strip()))
  if name is None: raise SourceSyntaxError("line 1: missing the '# kernel <name>' header")
  return Parsed(name, target, tuple(lines))


__all__ = ["TARGETS", "Line", "Parsed", "PythonRenderer", "SourceSyntaxError", "Target", "format_arg", "format_dtype", "get_target",
           "parse_text", "parse_value", "render_text"]
