"""The capture both targets are written from: a TinyJit capture turned into storages, steps and variables.

A *storage* is one piece of memory of the exported program: an input or output (the caller's), a weight (the contents
at export time go to the safetensors file) or scratch (intermediates, placed by the memory planner). A *step* is a
kernel launch (its arguments are (storage, byte offset) pairs in the kernel's slot order, then its variables) or a copy.

Which buffers are weights: the buffers the capture touches that are neither inputs nor outputs and whose first use is
a read (model parameters, constants made inside the function, state a kernel updates in place). Buffers first written
by the capture are scratch.
"""
from __future__ import annotations

import inspect
import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from plugrad.device.buffer import Buffer
from plugrad.dtype import DType, dtypes
from plugrad.engine.buffers import buffer_of
from plugrad.engine.jit import TinyJit, _Output
from plugrad.engine.memory import plan_memory
from plugrad.helpers import Context
from plugrad.uop.ops import Ops, UOp, sint
from plugrad.uop.program import ProgramUOp

TARGETS = ("c", "webgpu")
ALIGN = 64  # bytes: every weight starts at a multiple in the weights file (and so in memory once the file is loaded aligned)
_VIEW_OPS = frozenset({Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.SHRINK, Ops.PAD, Ops.FLIP})

# safetensors dtype names
ST_DTYPES: dict[DType, str] = {dtypes.bool: "BOOL", dtypes.int8: "I8", dtypes.uint8: "U8", dtypes.int16: "I16", dtypes.uint16: "U16",
                               dtypes.int32: "I32", dtypes.uint32: "U32", dtypes.int64: "I64", dtypes.uint64: "U64", dtypes.float16: "F16",
                               dtypes.bfloat16: "BF16", dtypes.float32: "F32", dtypes.float64: "F64"}


class ExportError(ValueError):
  """A model cannot be exported as asked: the message names what (an argument, an output, a kernel) and why."""


@dataclass(frozen=True)
class Storage:
  """One piece of memory of the exported program. `name`: the input/output/weight name (scratch: "scratchN");
  `shape` is the tensor's (symbolic dims rendered as text) for inputs and outputs, the weight's for weights."""
  index: int
  kind: str  # "input" | "output" | "weight" | "scratch"
  name: str
  nbytes: int
  dtype: DType
  shape: tuple[int | str, ...]
  written: bool = False  # a step writes it (for a weight: state the model updates in place)
  data: bytes | None = field(default=None, repr=False)  # a weight's contents at export time


@dataclass(frozen=True)
class Arg:
  """A kernel argument: `size` elements of `dtype` at byte `offset` of storage `storage`."""
  storage: int
  offset: int
  dtype: DType
  size: int


@dataclass(frozen=True)
class Launch:
  """A kernel launch: `program` (the captured PROGRAM), its buffer arguments in slot order, its variables in
  `program.vars` order (names)."""
  program: ProgramUOp
  args: tuple[Arg, ...]
  vars: tuple[str, ...]

  @property
  def name(self) -> str: return self.program.name


@dataclass(frozen=True)
class Copy:
  """`dest.size` elements copied from `src` (a copy the capture made between buffers of one device)."""
  dest: Arg
  src: Arg


@dataclass(frozen=True)
class Variable:
  name: str
  lo: int
  hi: int
  value: int  # the value at capture
  dtype: DType  # int32, or int64 when a kernel takes it as int64


@dataclass
class Captured:
  """A function captured for export: its storages, steps and variables, on one device."""
  name: str
  device: str
  storages: list[Storage]
  inputs: list[Storage]
  outputs: list[Storage]
  vars: list[Variable]
  steps: list[Launch | Copy]

  @property
  def weights(self) -> list[Storage]: return [s for s in self.storages if s.kind == "weight"]
  @property
  def launches(self) -> list[Launch]: return [s for s in self.steps if isinstance(s, Launch)]


# ---- capture

def _base_buffer(u: UOp) -> UOp | None:
  while u.op in _VIEW_OPS: u = u.src[0]
  return u if u.op is Ops.BUFFER else None


def _dims(shape: Sequence[sint] | None) -> tuple[int | str, ...]:
  return tuple(s if isinstance(s, int) else s.render() for s in shape or ())


def _param_names(fxn: Callable[..., Any]) -> list[str]:
  try: params = list(inspect.signature(fxn).parameters.values())
  except (TypeError, ValueError): return []
  return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _state_names(state: Any, fxn: Any) -> dict[Buffer, tuple[str, tuple[int, ...]]]:
  """Weight names by buffer: from `state` (a state dict or an object holding tensors), else from the object `fxn` is
  a method of or is (a model called as `model(x)`)."""
  from plugrad.nn.state import get_state_dict
  if state is None: state = getattr(fxn, "__self__", None) or (fxn if not inspect.isfunction(fxn) and not inspect.ismethod(fxn) else None)
  if state is None: return {}
  try: sd = state if isinstance(state, dict) else get_state_dict(state)
  except Exception as e:
    raise ExportError(f"export_model: state must be a dict of Tensors or an object holding them: {type(e).__name__}: {e}") from None
  out: dict[Buffer, tuple[str, tuple[int, ...]]] = {}
  for name, t in sd.items():
    if not hasattr(t, "uop") or (b := _base_buffer(t.uop)) is None: continue  # not realized: it cannot be a captured weight
    out.setdefault(buffer_of(b).base, (str(name), tuple(int(s) for s in t.shape if isinstance(s, int))))
  return out


def _unique(name: str, taken: set[str]) -> str:
  base, i = name, 1
  while name in taken: name, i = f"{base}_{i}", i + 1
  taken.add(name)
  return name


def capture(fn_or_jit: Any, example_inputs: Sequence[Any], state: Any = None) -> Captured:
  """Capture `fn_or_jit` (a function, a model object or a TinyJit: its function is captured anew) on `example_inputs`
  with TinyJit (the function runs twice) and describe what it launched."""
  fxn = fn_or_jit.fxn if isinstance(fn_or_jit, TinyJit) else fn_or_jit
  if not callable(fxn): raise ExportError(f"export_model needs a function, a model object or a TinyJit, got {type(fn_or_jit).__name__}")
  name = getattr(fxn, "__qualname__", type(fxn).__name__)
  jit: TinyJit[Any] = TinyJit(fxn)
  with Context(JIT=2):  # per-kernel steps: no device graphs are built (they are not exported)
    for _ in range(2): jit(*example_inputs)
  c = jit.captured
  if c is None: raise ExportError(f"export_model: TinyJit did not capture {name}")
  if (devs := {it.device for it in c.items}) and len(devs) != 1:
    raise ExportError(f"export_model: {name} launches on several devices ({', '.join(sorted(devs))}); an export runs on one")
  device = next(iter(devs))
  params = _param_names(fxn)
  taken: set[str] = set()
  storages: dict[Buffer, Storage] = {}

  def add(base: Buffer, kind: str, nm: str, shape: tuple[int | str, ...], dt: DType) -> Storage:
    s = storages[base] = Storage(len(storages), kind, _unique(nm, taken), base.nbytes, dt, shape)
    return s

  inputs: list[Storage] = []
  for spec in c.inputs:
    b = _base_buffer(spec.uop)
    if b is None: raise ExportError(f"export_model: {spec.name} of {name} is not a buffer or a view of one")
    base = buffer_of(b).base
    if base in storages: raise ExportError(f"export_model: {spec.name} of {name} shares its buffer with another input; pass separate tensors")
    pos = spec.name.removeprefix("argument ")
    nm = params[int(pos)] if pos.isdigit() and int(pos) < len(params) else pos.strip("'") if not pos.isdigit() else f"input{pos}"
    inputs.append(add(base, "input", nm, _dims(spec.uop.shape), spec.uop.dtype))
  outputs: list[Storage] = []
  for i, o in enumerate(c.outputs):
    if not isinstance(o, _Output): raise ExportError(f"export_model: output {i} of {name} is on several devices; gather it with .to(device) first")
    if o.slot is None or o.slot < c.n_inputs:
      what = "an input" if o.slot is not None else "a tensor the function does not compute (a weight or a constant)"
      raise ExportError(f"export_model: output {i} of {name} is {what}; an exported model returns only what it computes")
    base = buffer_of(o.buffer).base
    if base in storages: continue  # the same result returned twice
    shape = o.uop.shape or ()
    if all(isinstance(s, int) for s in shape) and (n := _prod(shape)) != base.size:
      raise ExportError(f"export_model: output {i} of {name} ({n} elements) is a view of a buffer of {base.size}; return .contiguous()")
    outputs.append(add(base, "output", f"output{len(outputs)}", _dims(shape), o.uop.dtype))

  # first use of every other buffer: a read makes it a weight, a write makes it scratch
  names = _state_names(state, fxn)
  first: dict[Buffer, str] = {}
  written: set[Buffer] = set()
  for it in c.items:
    if it.runner is None: reads, writes = [it.bufs[1]], [it.bufs[0]]
    else:
      p: ProgramUOp = it.runner.program
      reads, writes = [it.bufs[i] for i in p.ins], [it.bufs[i] for i in p.outs]
    for rb in reads: first.setdefault(rb.base, "read")
    for wb in writes:
      first.setdefault(wb.base, "write")
      written.add(wb.base)
  for base, use in first.items():
    if base in storages or use != "read": continue
    if not base.is_allocated(): raise ExportError(f"export_model: {name} reads a buffer it never wrote and that holds no data ({base!r})")
    nm, shape = names.get(base, (f"weight{sum(s.kind == 'weight' for s in storages.values())}", (base.size,)))
    if _prod(shape) != base.size: shape = (base.size,)
    st = add(base, "weight", nm, shape, base.dtype)
    storages[base] = Storage(st.index, st.kind, st.name, st.nbytes, st.dtype, st.shape, base in written, bytes(base.as_buffer()))
  # scratch: planned by liveness (the JIT's plan may already have put some in an arena: that arena is planned as one buffer)
  scratch = [sb for sb in first if sb not in storages]
  plan = plan_memory([[ib.base for ib in it.bufs] for it in c.items], scratch).replace
  placed: dict[Buffer, tuple[Buffer, int]] = {}
  for sb in scratch:
    view = plan.get(sb, sb)
    arena = view.base
    if arena not in storages:
      storages[arena] = Storage(len(storages), "scratch", _unique(f"scratch{len(storages)}", taken), arena.nbytes, arena.dtype, ())
    placed[sb] = (arena, view.offset if view is not arena else 0)
  for base in list(storages):
    if base in written and storages[base].kind in ("input", "output"):
      s = storages[base]
      if s.kind == "input": raise ExportError(f"export_model: {name} writes into its input {s.name!r}; an exported model's inputs are read-only")
      storages[base] = Storage(s.index, s.kind, s.name, s.nbytes, s.dtype, s.shape, True)

  def arg(b: Buffer) -> Arg:
    base = b.base
    off = b.offset if b is not base else 0
    if base in placed:
      arena, at = placed[base]
      return Arg(storages[arena].index, at + off, b.dtype, b.size)
    return Arg(storages[base].index, off, b.dtype, b.size)

  variables: dict[str, Variable] = {}
  steps: list[Launch | Copy] = []
  for it in c.items:
    if it.runner is None:
      steps.append(Copy(arg(it.bufs[0]), arg(it.bufs[1])))
      continue
    p = it.runner.program
    for v in p.vars:
      vn, lo, hi = v.arg
      if vn not in c.var_vals: raise ExportError(f"export_model: kernel {p.name!r} takes variable {vn!r}, which the capture did not bind")
      old = variables.get(vn)
      dt = dtypes.int64 if v.dtype is dtypes.int64 or (old is not None and old.dtype is dtypes.int64) else dtypes.int32
      variables[vn] = Variable(vn, max(lo, old.lo) if old else lo, min(hi, old.hi) if old else hi, c.var_vals[vn], dt)
    steps.append(Launch(p, tuple(arg(b) for b in it.bufs), tuple(v.arg[0] for v in p.vars)))
  ordered = sorted(storages.values(), key=lambda s: s.index)
  return Captured(name, device, ordered, [storages[s] for s in storages if storages[s].kind == "input"],
                  [storages[s] for s in storages if storages[s].kind == "output"], sorted(variables.values(), key=lambda v: v.name), steps)


def _prod(xs: Sequence[Any]) -> int:
  n = 1
  for x in xs: n *= int(x)
  return n


# ---- the weights file

def safetensors_bytes(weights: Sequence[Storage], metadata: dict[str, str] | None = None) -> bytes:
  """The weights as one safetensors file whose tensors each start at a multiple of ALIGN bytes, counted from the file's
  start (the header is padded with spaces, which the format allows)."""
  header: dict[str, Any] = {"__metadata__": dict(metadata or {})}
  off = 0
  for w in weights:
    assert w.data is not None  # capture() read every weight
    if w.dtype not in ST_DTYPES: raise ExportError(f"export_model: weight {w.name!r} has dtype {w.dtype!r}, which safetensors cannot hold")
    off = (off + ALIGN - 1) // ALIGN * ALIGN
    header[w.name] = {"dtype": ST_DTYPES[w.dtype], "shape": [int(s) for s in w.shape], "data_offsets": [off, off + len(w.data)]}
    off += len(w.data)
  text = json.dumps(header, separators=(",", ":")).encode()
  text += b" " * ((-(8 + len(text))) % ALIGN)
  body = bytearray(off)
  for w in weights:
    a, b = header[w.name]["data_offsets"]
    body[a:b] = w.data or b""
  return struct.pack("<Q", len(text)) + text + bytes(body)


# ---- symbolic sizes as data: [op, args...] lists that the generated JS (and tests) evaluate

_SYM_OPS = {Ops.ADD: "add", Ops.SUB: "sub", Ops.MUL: "mul", Ops.IDIV: "div", Ops.MOD: "mod", Ops.MAX: "max", Ops.CMPLT: "lt", Ops.NEG: "neg",
            Ops.WHERE: "where"}


def sym_data(x: sint) -> Any:
  """An integer size as an int, or as nested lists: ["var", name], [op, a, b...] with op among add sub mul div (truncating)
  mod max lt neg where."""
  if isinstance(x, int): return x
  if x.op is Ops.CONST: return int(x.arg)
  if x.op is Ops.DEFINE_VAR: return ["var", x.arg[0]]
  if x.op is Ops.BIND: return ["var", x.src[0].arg[0]]
  if x.op is Ops.CAST: return sym_data(x.src[0])
  if (op := _SYM_OPS.get(x.op)) is None:
    raise ExportError(f"export_model: a launch size uses {x.op.name}, which the export cannot evaluate: {x.render()}")
  return [op, *(sym_data(s) for s in x.src)]


def sym_eval(e: Any, vals: dict[str, int]) -> int:
  """Evaluate `sym_data`'s form (what the generated model.js does at run time)."""
  if isinstance(e, int): return e
  op, *a = e
  if op == "var": return vals[a[0]]
  v = [sym_eval(x, vals) for x in a]
  if op == "div": return abs(v[0]) // abs(v[1]) * (1 if (v[0] >= 0) == (v[1] > 0) else -1)
  if op == "mod": return v[0] - sym_eval(["div", v[0], v[1]], vals) * v[1]
  fns: dict[str, Callable[[list[int]], int]] = {"add": lambda v: v[0] + v[1], "sub": lambda v: v[0] - v[1], "mul": lambda v: v[0] * v[1],
                                                "max": lambda v: max(v), "lt": lambda v: int(v[0] < v[1]), "neg": lambda v: -v[0],
                                                "where": lambda v: v[1] if v[0] else v[2]}
  return fns[op](v)
