"""`Renderer`: turns a linear program into source text, and describes the device to the codegen.

The attributes are what the optimizer and the lowering read (never the device name): whether there are workgroups
and shared memory, the launch limits, vector loads, tensor cores and the dtypes the device can compute in.
The conformance suite gates its tests on `capabilities`.
"""
from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any

from plugrad.dtype import DType, PtrDType, dtypes
from plugrad.renderer.tensor_cores import TensorCore
from plugrad.uop.bounds import exact_bounds
from plugrad.uop.ops import GroupOp, Ops, UOp
from plugrad.uop.pattern import PatternMatcher

# The capabilities a renderer may claim (docs/writing-a-backend.md): dtypes it computes in, and features it lowers to.
CAPABILITIES = frozenset({"float16", "bfloat16", "float64", "int64", "locals", "shared", "tensor_cores", "images"})
Dims3 = tuple[int, int, int]
# the dtypes a device may lack, and the capability that says it has them (every device has bool, the 8-32 bit integers and float32)
_DTYPE_CAPABILITY: dict[DType, str] = {dtypes.float16: "float16", dtypes.bfloat16: "bfloat16", dtypes.float64: "float64", dtypes.int64: "int64",
                                       dtypes.uint64: "int64"}


class RendererError(ValueError):
  """A renderer is misconfigured, or was given something it cannot render."""


class Renderer(abc.ABC):
  """Subclasses implement `render(program)` and set the attributes below (the defaults describe the least capable
  device: no workgroups, no shared memory, no vector loads, no tensor cores, float32/int32 only)."""
  device: str
  has_local: bool = False                   # workgroups exist (SPECIAL lidxN may be emitted)
  has_shared: bool = False                  # DEFINE_LOCAL (workgroup memory) may be emitted
  global_max: Dims3 | None = None           # the most workgroups per dimension; None = no limit
  local_max: Dims3 | None = None            # the largest workgroup per dimension; None = no limit
  shared_max: int = 0                       # bytes of DEFINE_LOCAL memory one kernel may use
  supports_float4: bool = False             # vector loads and stores (LOAD/STORE of T.vec(n))
  vector_width: int = 1                     # float lanes the optimizer may put in one vector value (1: no vectors)
  # a vector LOAD/STORE through one address may carry a vector gate (one bool per lane): a lane whose gate is false
  # touches no memory (a load gives 0 there). The expander then keeps a padded input's loads whole vectors (a depthwise
  # convolution's rows: gated per lane at the borders) instead of splitting them into gated scalar loads
  masked_access: bool = False
  tensor_cores: tuple[TensorCore, ...] = ()  # the WMMA instructions the renderer can emit
  capabilities: frozenset[str] = frozenset()
  # What the device's plain operators already do; codegen/decompose.py writes out the rest before rendering (False:
  # the least capable device, always correct): integer / and % give 0 for a divisor of 0 and never trap on INT_MIN / -1,
  # shifts by an amount outside [0, bits) give 0 (or the sign), float MAX propagates nan (numpy's maximum);
  # bfloat16 values, memory and rounding (to nearest even, nan kept) are the device's own.
  safe_int_div: bool = False
  safe_shifts: bool = False
  nan_max: bool = False
  # float POW is C's pow: a negative base to an integral power has its sign, 0 to a negative power is inf, x**0 is 1
  # (WGSL's and Metal's pow are undefined below zero: the codegen spells those cases out around pow(|a|, b))
  full_pow: bool = False
  native_bfloat16: bool = False
  # The transcendentals (EXP2, LOG2, SIN) the device computes itself to float32 accuracy; the codegen writes the others
  # out as polynomials (float16/bfloat16 through float32; float64 is never rewritten: a device with float64 computes
  # its transcendentals). Empty: the least capable device. `math_is_native` may answer per dtype instead.
  native_math: frozenset[Ops] = frozenset()
  extra_matcher: PatternMatcher | None = None  # the backend's own rewrites of the kernel graph, after the shared passes
  # passes the backend adds to the codegen pipeline (codegen/passes.py, docs/architecture.md): (the name of the pass it
  # runs after, its own name, fn(graph, renderer) -> graph) each, placed in this order
  extra_passes: tuple[tuple[str, str, Callable[[UOp, Renderer], UOp]], ...] = ()
  # The PYTHON interpreter's target (`EMULATE=...`, builtin/python_renderer.py TARGETS) that describes this device for
  # the conformance suite's emulate tier; None: the one named like the device, if any. A device whose architectures
  # differ (AMD: RDNA3 WMMA is "AMD", CDNA3 MFMA "AMD_MFMA") names the one its renderer targets.
  emulate_target: str | None = None
  # The scalar dtypes whose atomic add the renderer emits: a STORE with arg Ops.ADD (`*p += v`, one read-add-write no
  # other thread's add can interleave). A scatter-add (`index_add`, an embedding's gradient) is then one parallel loop
  # over all of its positions; without it, a serial loop along the indexed axis (docs/ir.md "SCATTER").
  atomic_add: frozenset[DType] = frozenset()

  def __init__(self, device: str):
    if not isinstance(device, str) or not device: raise RendererError(f"a Renderer needs the device name as a non-empty str, got {device!r}")
    self.device = device

  def __repr__(self) -> str: return f"<{type(self).__name__} {self.device}>"

  def dtype_support(self, dt: DType) -> str | None:
    """None when the device can hold and compute scalar dtype `dt`, else why not (a short phrase). The Tensor calls that
    create or cast to a dtype ask this, so an unsupported dtype fails where the user wrote it, never as a wrong result.
    The default reads the dtype capabilities; a backend overrides it to give the real reason."""
    cap = _DTYPE_CAPABILITY.get(dt.scalar())
    return None if cap is None or cap in self.capabilities else f"its renderer does not declare the {cap!r} capability"

  def math_is_native(self, op: Ops, dtype: DType) -> bool:
    """Whether transcendental `op` on values of `dtype` (scalar or vector) is left to the device. Override it when the
    answer depends on the dtype (e.g. a compiler that turns a vector exp2 into one library call per lane)."""
    return op in self.native_math

  @abc.abstractmethod
  def render(self, program: UOp) -> str:
    """The source code of `program`, a PROGRAM UOp at the "linear" stage (read `program.uops` and `program.name`)."""

  def validate(self) -> Renderer:
    """Check that the attributes are consistent (call at the end of `__init__`); returns self."""
    who = f"{type(self).__name__}({self.device})"
    if not isinstance(self.capabilities, frozenset) or not self.capabilities <= CAPABILITIES:
      raise RendererError(f"{who}.capabilities must be a frozenset of {sorted(CAPABILITIES)}, got {self.capabilities!r}")
    for what, dims in (("global_max", self.global_max), ("local_max", self.local_max)):
      if dims is not None and not (isinstance(dims, tuple) and len(dims) == 3 and all(isinstance(d, int) and d > 0 for d in dims)):
        raise RendererError(f"{who}.{what} must be None or three positive ints, got {dims!r}")
    if not isinstance(self.shared_max, int) or self.shared_max < 0:
      raise RendererError(f"{who}.shared_max must be an int >= 0, got {self.shared_max!r}")
    if not isinstance(self.tensor_cores, tuple) or not all(isinstance(tc, TensorCore) for tc in self.tensor_cores):
      raise RendererError(f"{who}.tensor_cores must be a tuple of TensorCore")
    for flag, cap in ((self.has_local, "locals"), (self.has_shared, "shared"), (bool(self.tensor_cores), "tensor_cores")):
      if flag != (cap in self.capabilities): raise RendererError(f"{who}: capability {cap!r} must be claimed exactly when the device has it")
    if self.has_shared and not self.has_local: raise RendererError(f"{who}: shared memory needs workgroups (has_local)")
    if not isinstance(self.atomic_add, frozenset) or not all(isinstance(d, DType) and d.count == 1 and not isinstance(d, PtrDType)
                                                               and d is not dtypes.bool for d in self.atomic_add):
      raise RendererError(f"{who}.atomic_add must be a frozenset of scalar non-bool dtypes, got {self.atomic_add!r}")
    if not isinstance(self.extra_passes, tuple) or not all(isinstance(e, tuple) and len(e) == 3 and isinstance(e[0], str) and isinstance(e[1], str)
                                                             and callable(e[2]) for e in self.extra_passes):
      raise RendererError(f"{who}.extra_passes must be a tuple of (after, name, fn) with two str and a callable, got {self.extra_passes!r}")
    return self


def linear_parts(program: Any) -> tuple[str, tuple[UOp, ...]]:
  """(name, uops) of a PROGRAM UOp at the "linear" stage or later, with a clear error for anything else."""
  if not isinstance(program, UOp) or program.op is not Ops.PROGRAM:
    got = f"a {program.op.name} UOp" if isinstance(program, UOp) else type(program).__name__
    raise RendererError(f"render needs a PROGRAM UOp at the linear stage, got {got}")
  return program.name, program.uops  # type: ignore[attr-defined]  # ProgramUOp accessors (uop/program.py)


# ---- what text renderers share: which values to name and which to write inline

PURE = GroupOp.ALU | {Ops.CAST, Ops.BITCAST, Ops.GEP, Ops.CUSTOMI}  # no effects: may be written where they are used


def value_srcs(u: UOp) -> tuple[UOp, ...]:
  """The sources whose values `u` uses (a LOAD's trailing effects and an IF's extra sources only order it)."""
  if u.op is Ops.LOAD: return u.src[:2] if len(u.src) > 1 and u.src[1].dtype is not dtypes.void else u.src[:1]
  if u.op is Ops.IF: return u.src[:1]
  return tuple(s for s in u.src if s.dtype is not dtypes.void)


def no_signed_wrap(u: UOp) -> bool:
  """Whether a signed integer ADD, SUB or MUL provably stays inside its dtype: its exact result over its operands'
  bounds (`vmin`, `vmax`: loop ranges, variables, masked loads) fits. Index arithmetic always does (the linearizer
  chose int32 because it fits); values loaded from memory may wrap. A renderer may mark such an op no-signed-wrap
  (LLVM's `nsw`), which lets the compiler widen int32 indices to 64-bit addresses once instead of re-deriving that
  for every sign extension (LLVM's IndVarSimplify took seconds per large kernel without it)."""
  if u.op not in (Ops.ADD, Ops.SUB, Ops.MUL) or len(u.src) != 2: return False
  d = u.dtype.scalar()
  if not dtypes.is_int(d) or dtypes.is_unsigned(d) or d is dtypes.bool or d is dtypes.index: return False
  lo, hi = exact_bounds(u.op, u.src[0]._min_max, u.src[1]._min_max)
  return dtypes.min(d) <= lo and hi <= dtypes.max(d)


def index_parts(who: str, u: UOp) -> tuple[UOp, UOp | None] | None:
  """What a pointer uop adds to the address of its source: None for a CAST (the same address), else the INDEX's
  (element index, gate or None). One address per pointer: a vector of addresses (which codegen/decompose.py splits
  into lanes before rendering) is a RendererError naming `who`."""
  if u.op is Ops.CAST: return None
  if u.op is not Ops.INDEX or u.src[1].dtype.count != 1:
    raise RendererError(f"{who} cannot render {u.op.name} of a vector of addresses (codegen/decompose.py splits them)")
  return u.src[1], (u.src[2] if len(u.src) == 3 else None)


def and_gates(a: str | None, b: str | None, conj: Callable[[str, str], str]) -> str | None:
  """Two optional gates (None: always) as one: `conj(a, b)` renders the conjunction when both are present."""
  return b if a is None else a if b is None else conj(a, b)


def workgroup_threads(uops: Sequence[UOp], device: str) -> int:
  """Work-items per workgroup of a linear program: the product of its `lidxN` sizes. For a dialect that declares it in
  the kernel's signature (CUDA's `__launch_bounds__`, HIP's `amdgpu_flat_work_group_size`), so each size must be a
  constant; a symbolic one is a RendererError naming `device`."""
  dims = [1, 1, 1]
  for u in uops:
    if u.op is Ops.SPECIAL and u.arg.startswith("l"):
      if u.src[0].op is not Ops.CONST: raise RendererError(f"{device}: the workgroup size {u.arg} must be a constant")
      dims[int(u.arg[-1])] = u.src[0].arg
  return dims[0] * dims[1] * dims[2]


def define_of(u: UOp) -> UOp | None:
  """The DEFINE_* a pointer expression starts from, or None."""
  while u.op not in GroupOp.Defines and u.src: u = u.src[0]
  return u if u.op in GroupOp.Defines else None


def use_analysis(uops: Sequence[UOp]) -> tuple[dict[UOp, int], set[UOp], set[UOp]]:
  """(use counts, the values to write inline, the DEFINEs stored to) of a linear program. A pure scalar used once, in
  the block where it is defined, can be written into its user's expression instead of getting a name."""
  uses: dict[UOp, int] = {}
  block: dict[UOp, UOp | None] = {}
  open_: list[UOp] = []
  where: dict[UOp, list[UOp | None]] = {}
  for u in uops:
    if u.op in (Ops.ENDRANGE, Ops.ENDIF): open_.pop()
    block[u] = open_[-1] if open_ else None
    if u.op in (Ops.RANGE, Ops.IF): open_.append(u)
    for s in value_srcs(u):
      uses[s] = uses.get(s, 0) + 1
      where.setdefault(s, []).append(block[u])
  inline = {u for u in uops if u.op in PURE and u.dtype.count == 1 and not isinstance(u.dtype, PtrDType) and uses.get(u) == 1
            and where[u] == [block[u]]}
  written = {b for u in uops if u.op is Ops.STORE and (b := define_of(u.src[0])) is not None}
  return uses, inline, written

