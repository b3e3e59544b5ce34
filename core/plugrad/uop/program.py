"""The PROGRAM UOp: a compiled kernel, grown stage by stage, with every derived fact exposed by name.

```
PROGRAM(src=(SINK, DEVICE[, LINEAR[, SOURCE[, BINARY]]]))     stage "ast" → "linear" → "source" → "binary"
```

This is the ONLY module that knows the positions of PROGRAM's sources (ARCHITECTURE §3); everything else uses the
accessors of `ProgramUOp`, the class every PROGRAM UOp is an instance of (built anywhere, rebuilt by graph_rewrite
or unpickled). Derived values are cached per object: UOps are immutable, so they never go stale.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from plugrad.dtype import DType, PtrDType, dtypes
from plugrad.helpers import all_int
from plugrad.uop import spec
from plugrad.uop.ops import OP_CLASSES, GroupOp, KernelInfo, Ops, UOp, sint

LAYOUT: tuple[Ops, ...] = (Ops.SINK, Ops.DEVICE, Ops.LINEAR, Ops.SOURCE, Ops.BINARY)
PROGRAM_STAGES: tuple[str, ...] = ("ast", "linear", "source", "binary")  # the stage of a PROGRAM with 2, 3, 4 or 5 sources


class ProgramError(ValueError):
  """A PROGRAM UOp is malformed, or an accessor got bad input (a missing variable, a bad device name)."""


class ProgramStageError(ProgramError):
  """A PROGRAM is not at the stage an accessor or builder needs."""


class ProgramArgumentError(ProgramError):
  """A kernel was given arguments that do not fit its signature (buffer count, dtype, device, writability, variables);
  the message names the kernel and the argument."""


# ---- symbolic sizes: launch sizes and loop trips are given in the `index` domain, like tensor shapes

def _trip_count(r: UOp) -> sint:
  b = _index_expr(r.src[0])
  return int(b.vmax) if isinstance(b, UOp) and any(x.op in (Ops.RANGE, Ops.SPECIAL) for x in b.toposort) else b


def _index_expr(x: UOp) -> sint:
  """`x` as an int when constant, else the same expression with its integers retyped to `index` (so a size built from
  an int32 `n` compares equal to the user's `Variable("n", ...)` and products of sizes never wrap)."""
  if x.op is Ops.CONST: return x.arg
  done: dict[UOp, UOp] = {}
  for u in x.toposort:
    dt = dtypes.index if not isinstance(u.dtype, PtrDType) and u.dtype.count == 1 and dtypes.is_int(u.dtype) else u.dtype
    done[u] = UOp(u.op, dt, tuple(done[s] for s in u.src), u.arg)
  return done[x]


def _smul(a: sint, b: sint) -> sint:
  if isinstance(a, int) and isinstance(b, int): return a * b
  if (isinstance(a, int) and a == 0) or (isinstance(b, int) and b == 0): return 0
  if isinstance(a, int) and a == 1: return b
  if isinstance(b, int) and b == 1: return a
  return cast(UOp, a * b) if isinstance(a, UOp) else cast(UOp, b) * a


def _sadd(a: sint, b: sint) -> sint:
  if isinstance(a, int) and isinstance(b, int): return a + b
  if isinstance(a, int) and a == 0: return b
  if isinstance(b, int) and b == 0: return a
  return cast(UOp, a + b) if isinstance(a, UOp) else cast(UOp, b) + a


def _simplify(x: sint) -> sint:
  if isinstance(x, int): return x
  from plugrad.uop.symbolic import ssimplify
  return ssimplify(x)


def _buffer_of(u: UOp) -> UOp | None:
  """The DEFINE_* a pointer expression addresses: INDEX, pointer CASTs and vectors of pointers all keep it first."""
  while u.op not in GroupOp.Defines and u.src: u = u.src[0]
  return u if u.op in GroupOp.Defines else None


def _wmma_dims(arg: Any) -> tuple[int, int, int] | None:
  for a in arg if isinstance(arg, tuple) else ():
    if isinstance(a, tuple) and len(a) == 3 and all_int(a) and all(d > 0 for d in a): return cast(tuple[int, int, int], a)
  return None


@dataclass(frozen=True)
class Estimates:
  """The work a kernel does, counted from its linear uops (see `from_uops` for the exact rule)."""
  ops: sint = 0
  lds: sint = 0
  mem: sint = 0
  local_bytes: int = 0

  def __add__(self, o: Estimates) -> Estimates:
    if not isinstance(o, Estimates): return NotImplemented
    return Estimates(_sadd(self.ops, o.ops), _sadd(self.lds, o.lds), _sadd(self.mem, o.mem), self.local_bytes + o.local_bytes)

  def at(self, var_vals: Mapping[str | UOp, int]) -> Estimates:
    """These estimates with the symbolic sizes evaluated at `var_vals` (a missing variable raises ProgramError)."""
    vals = _var_values(var_vals)
    return Estimates(_infer(self.ops, vals, "ops"), _infer(self.lds, vals, "lds"), _infer(self.mem, vals, "mem"), self.local_bytes)

  @staticmethod
  def from_uops(uops: Sequence[UOp]) -> Estimates:
    """Count the work of a linear program (uops in execution order, as in LINEAR).

    Every count is per execution of a uop, multiplied by the trip counts (RANGE bounds) of the loops open around it and by
    the number of threads, the product of the sizes of all SPECIALs. IF blocks are counted as taken (an upper bound).
    * `ops`: ALU uops on the data path, i.e. those whose values flow into a STORE's value (address, gate and
      loop-bound arithmetic is not counted). Each counts its vector width; MULACC counts 2 per lane; a WMMA whose
      arg holds a tuple of three positive ints (N, M, K) counts 2*K per element of its result in each thread (the
      threads of the instruction share its N*M*K multiply-adds; one without dims counts nothing).
    * `lds`: bytes moved to and from GLOBAL memory: each LOAD and STORE through a DEFINE_GLOBAL counts the itemsize of
      its value dtype (vector width included).
    * `mem`: bytes of the distinct DEFINE_GLOBAL buffers loaded or stored: pointer size × itemsize, or that buffer's
      `lds` traffic when the size is unknown (-1).
    * `local_bytes`: size × itemsize of every DEFINE_LOCAL.
    Symbolic bounds give symbolic counts (in the index domain); a loop whose bound depends on an enclosing loop (a
    causal attention's key loop) counts its largest trip count, an upper bound like the IF blocks.
    """
    uops = tuple(uops)
    threads: sint = 1
    for u in dict.fromkeys(u for u in uops if u.op is Ops.SPECIAL): threads = _smul(threads, _index_expr(u.src[0]))
    data: set[UOp] = set()  # the data path, found walking back from the stored values
    for u in reversed(uops):
      if u.op is Ops.STORE: data.add(u.src[1])
      elif u in data:
        if u.op is Ops.LOAD: data.update(s for s in u.src[1:2] if s.dtype is not dtypes.void)  # the alt value, not the address
        elif u.op is not Ops.INDEX: data.update(u.src)
    trips: list[sint] = [1]
    ops: sint = 0
    traffic: dict[UOp, sint] = {}
    local_bytes = 0
    for u in uops:
      if u.op is Ops.RANGE: trips.append(_smul(trips[-1], _trip_count(u)))
      elif u.op is Ops.ENDRANGE:
        if len(trips) == 1: raise ProgramError("Estimates.from_uops: an ENDRANGE without an open RANGE (uops not in execution order?)")
        trips.pop()
      elif u.op in GroupOp.ALU and u in data: ops = _sadd(ops, _smul(u.dtype.count * (2 if u.op is Ops.MULACC else 1), trips[-1]))
      elif u.op is Ops.WMMA and u in data and (d := _wmma_dims(u.arg)) is not None: ops = _sadd(ops, _smul(2 * d[2] * u.dtype.count, trips[-1]))
      elif u.op in (Ops.LOAD, Ops.STORE) and (buf := _buffer_of(u.src[0])) is not None and buf.op is Ops.DEFINE_GLOBAL:
        nbytes = (u.dtype if u.op is Ops.LOAD else u.src[1].dtype).itemsize
        traffic[buf] = _sadd(traffic.get(buf, 0), _smul(nbytes, trips[-1]))
      elif u.op is Ops.DEFINE_LOCAL:
        if not isinstance(u.dtype, PtrDType) or u.dtype.size < 0: raise ProgramError(f"Estimates.from_uops: DEFINE_LOCAL {u.arg!r} has no known size")
        local_bytes += u.dtype.size * u.dtype.base.itemsize
    lds: sint = 0
    mem: sint = 0
    for buf, moved in traffic.items():
      lds = _sadd(lds, moved)
      ptr = cast(PtrDType, buf.dtype)
      mem = _sadd(mem, ptr.size * ptr.base.itemsize if ptr.size >= 0 else _smul(moved, threads))
    return Estimates(_simplify(_smul(ops, threads)), _simplify(_smul(lds, threads)), _simplify(mem), local_bytes)


# ---- variable values at launch

def _var_values(var_vals: Mapping[str | UOp, int] | None) -> dict[str, int]:
  out: dict[str, int] = {}
  for k, v in (var_vals or {}).items():
    if isinstance(k, UOp) and k.op is Ops.DEFINE_VAR: name = k.arg[0]
    elif isinstance(k, str): name = k
    else: raise TypeError(f"var_vals keys must be variable names or DEFINE_VAR UOps, got {type(k).__name__} {k!r}")
    if not isinstance(v, int) or isinstance(v, bool): raise TypeError(f"the value of variable {name!r} must be an int, got {type(v).__name__} {v!r}")
    out[name] = v
  return out


def _infer(x: sint, vals: dict[str, int], what: str) -> int:
  if isinstance(x, int): return x
  from plugrad.uop.symbolic import sym_infer
  bound: dict[UOp, int] = {}
  for var in x.variables():
    name, lo, hi = var.arg
    if name not in vals: raise ProgramError(f"{what} needs a value for variable {name!r} (in [{lo}, {hi}]); var_vals has {sorted(vals)}")
    if not lo <= vals[name] <= hi: raise ProgramError(f"{what}: the value {vals[name]} of variable {name!r} is outside its range [{lo}, {hi}]")
    bound[var] = vals[name]
  ret = sym_infer(x, bound)
  if not isinstance(ret, int): raise ProgramError(f"{what} did not evaluate to an int: {x.render(simplify=False)} gave {ret!r}")
  return ret


# ---- the PROGRAM UOp

class ProgramUOp(UOp):
  """A PROGRAM UOp with named accessors for its parts and what is derived from them."""
  __slots__ = ()

  @functools.cached_property
  def stage(self) -> str:
    """"ast", "linear", "source" or "binary": how far the pipeline has grown this program."""
    ops = tuple(s.op for s in self.src)
    if not 2 <= len(ops) <= len(LAYOUT) or ops != LAYOUT[:len(ops)]:
      raise ProgramError(f"malformed PROGRAM: its sources are ({', '.join(o.name for o in ops)}); "
                         "expected SINK, DEVICE[, LINEAR[, SOURCE[, BINARY]]]")
    return PROGRAM_STAGES[len(ops) - 2]

  def _part(self, op: Ops, what: str) -> UOp:
    i, stage = LAYOUT.index(op), self.stage  # `stage` also validates the layout
    if i >= len(self.src):
      raise ProgramStageError(f"program {self.name!r} is at the {stage!r} stage; {what} needs the {PROGRAM_STAGES[i - 1]!r} stage")
    return self.src[i]

  # ---- the parts
  @property
  def ast(self) -> UOp:
    """The (optimized) kernel AST: a SINK whose arg is a KernelInfo."""
    return self._part(Ops.SINK, "ast")

  @property
  def info(self) -> KernelInfo:
    if not isinstance(ki := self.ast.arg, KernelInfo): raise ProgramError(f"malformed PROGRAM: its SINK arg is {ki!r}, not a KernelInfo")
    return ki

  @property
  def name(self) -> str: return self.info.name
  @property
  def applied_opts(self) -> tuple[Any, ...]: return self.info.applied_opts
  @property
  def device(self) -> str: return self._part(Ops.DEVICE, "device").arg
  @property
  def uops(self) -> tuple[UOp, ...]: return self._part(Ops.LINEAR, "uops").src
  @property
  def source(self) -> str: return self._part(Ops.SOURCE, "source").arg
  @property
  def binary(self) -> bytes: return self._part(Ops.BINARY, "binary").arg

  # ---- derived: from the linear uops when there are any, else from the AST
  @functools.cached_property
  def _nodes(self) -> tuple[UOp, ...]: return self.uops if self.stage != "ast" else tuple(self.ast.toposort)

  @functools.cached_property
  def buffers(self) -> tuple[UOp, ...]:
    """The DEFINE_GLOBAL uops in slot order: buffer handles are passed to a launch in this order."""
    return tuple(sorted((u for u in self._nodes if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg))

  @functools.cached_property
  def globals(self) -> tuple[int, ...]: return tuple(u.arg for u in self.buffers)

  def _slots(self, op: Ops) -> tuple[int, ...]:
    return tuple(sorted({b.arg for u in self._nodes if u.op is op and (b := _buffer_of(u.src[0])) is not None and b.op is Ops.DEFINE_GLOBAL}))

  @functools.cached_property
  def ins(self) -> tuple[int, ...]:
    """The global slots the kernel loads from, sorted."""
    return self._slots(Ops.LOAD)

  @functools.cached_property
  def outs(self) -> tuple[int, ...]:
    """The global slots the kernel stores to, sorted."""
    return self._slots(Ops.STORE)

  @functools.cached_property
  def signature(self) -> tuple[tuple[DType, str], ...]:
    """Per buffer slot, (element dtype, "in" | "out" | "inout"): what `new_program` takes as `buffers`. A slot neither
    loaded nor stored counts as "in"."""
    ins, outs = set(self.ins), set(self.outs)
    # the dtype the kernel was written for: the codegen may store one as another (bfloat16 as uint16, codegen/decompose.py)
    declared = {u.arg: u.dtype.base for u in self.ast.toposort if u.op is Ops.DEFINE_GLOBAL} if self.stage != "ast" else {}
    return tuple((declared.get(g.arg, g.dtype.base), ("inout" if g.arg in ins else "out") if g.arg in outs else "in") for g in self.buffers)

  @property
  def external(self) -> bool:
    """Whether the program was written outside plugrad (`new_program`): its LINEAR declares the signature only."""
    return self.info.external

  @functools.cached_property
  def vars(self) -> tuple[UOp, ...]:
    """The DEFINE_VARs of the kernel sorted by name: their values are passed to a launch in this order."""
    found = {u.src[0] if u.op is Ops.BIND else u: None for u in self._nodes if u.op in (Ops.DEFINE_VAR, Ops.BIND)}
    return tuple(sorted(found, key=lambda v: v.arg[0]))

  @functools.cached_property
  def _dims(self) -> tuple[tuple[sint, sint, sint], tuple[sint, sint, sint]]:
    sizes: dict[str, UOp] = {}
    for u in self._nodes:
      if u.op is Ops.SPECIAL and sizes.setdefault(u.arg, u.src[0]) is not u.src[0]:
        raise ProgramError(f"malformed PROGRAM {self.name!r}: SPECIAL {u.arg!r} appears with two different sizes")
    def dims(prefix: str) -> tuple[sint, sint, sint]:
      g = [_index_expr(sizes[k]) if (k := f"{prefix}{i}") in sizes else 1 for i in range(3)]
      return (g[0], g[1], g[2])
    return dims("gidx"), dims("lidx")

  @property
  def global_size(self) -> tuple[sint, sint, sint]:
    """Workgroups per dimension (the sizes of the `gidxN` SPECIALs, 1 where absent); symbolic sizes are index-dtype UOps."""
    return self._dims[0]

  @property
  def local_size(self) -> tuple[sint, sint, sint]:
    """The workgroup shape (the sizes of the `lidxN` SPECIALs, 1 where absent)."""
    return self._dims[1]

  def launch_dims(self, var_vals: Mapping[str | UOp, int] | None = None) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(global_size, local_size) as ints, with variables (by name or DEFINE_VAR) taken from `var_vals`."""
    vals = _var_values(var_vals)
    g = tuple(_infer(x, vals, f"the global size of {self.name!r}") for x in self.global_size)
    l = tuple(_infer(x, vals, f"the local size of {self.name!r}") for x in self.local_size)
    return (g[0], g[1], g[2]), (l[0], l[1], l[2])

  @functools.cached_property
  def estimates(self) -> Estimates:
    """The work of the kernel counted from its uops (`Estimates.from_uops`); needs the linear stage."""
    return Estimates.from_uops(self._part(Ops.LINEAR, "estimates").src)

  # ---- new programs from this one
  def _grow(self, need: str, part: UOp) -> ProgramUOp:
    if self.stage != need:
      nxt = PROGRAM_STAGES[PROGRAM_STAGES.index(need) + 1]
      raise ProgramStageError(f"program {self.name!r} is at the {self.stage!r} stage; adding {part.op.name} (the {nxt!r} stage) "
                              f"needs the {need!r} stage")
    return _checked(UOp(Ops.PROGRAM, dtypes.void, (*self.src, part)))

  def with_linear(self, uops: Sequence[UOp]) -> ProgramUOp:
    """This program (at the "ast" stage) with its linearized uops added."""
    if isinstance(uops, UOp) or not isinstance(uops, Sequence): raise TypeError(f"with_linear needs a sequence of UOps, got {type(uops).__name__}")
    return self._grow("ast", UOp(Ops.LINEAR, dtypes.void, tuple(uops)))

  def with_source(self, src: str) -> ProgramUOp:
    """This program (at the "linear" stage) with its rendered source code added."""
    if not isinstance(src, str): raise TypeError(f"with_source needs a str, got {type(src).__name__}")
    return self._grow("linear", UOp(Ops.SOURCE, dtypes.void, (), src))

  def with_binary(self, b: bytes) -> ProgramUOp:
    """This program (at the "source" stage) with its compiled code added."""
    if not isinstance(b, (bytes, bytearray, memoryview)): raise TypeError(f"with_binary needs bytes, got {type(b).__name__}")
    return self._grow("source", UOp(Ops.BINARY, dtypes.void, (), bytes(b)))

  def with_device(self, name: str) -> ProgramUOp:
    """The same program for another device (the canonical string, like "CUDA:1"), at the same stage."""
    _check_device(name)
    return _checked(UOp(Ops.PROGRAM, dtypes.void, tuple(UOp(Ops.DEVICE, dtypes.void, (), name) if s.op is Ops.DEVICE else s for s in self.src)))


OP_CLASSES[Ops.PROGRAM] = ProgramUOp


def _check_program(root: UOp) -> None:
  """The spec's "program" stage (uop/spec.py): the sources in LAYOUT's order, each valid at its own stage."""
  ops = tuple(s.op for s in root.src)
  if root.op is not Ops.PROGRAM or root.dtype is not dtypes.void or root.arg is not None or not 2 <= len(ops) <= len(LAYOUT) or \
     ops != LAYOUT[:len(ops)]:
    raise spec.SpecError("program", root, f"a PROGRAM (dtype void, arg None) needs sources {', '.join(o.name for o in LAYOUT[:2])}"
                                          f"{''.join('[, ' + o.name for o in LAYOUT[2:])}{']' * (len(LAYOUT) - 2)} in this order")
  for s in root.src:
    if s.op is Ops.LINEAR: spec.check("linear", s)
    elif s.op is Ops.SINK:
      if not isinstance(s.arg, KernelInfo): raise spec.SpecError("program", s, "the SINK of a PROGRAM needs a KernelInfo arg")
      spec.check("kernel", s)
    else:
      want = {Ops.DEVICE: str, Ops.SOURCE: str, Ops.BINARY: bytes}[s.op]
      if s.src or s.dtype is not dtypes.void or not isinstance(s.arg, want):
        raise spec.SpecError("program", s, f"{s.op.name} needs a {want.__name__} arg, no sources and dtype void")
      if s.op is Ops.DEVICE and not spec.DEVICE_RE.fullmatch(s.arg):
        raise spec.SpecError("program", s, f"DEVICE arg must be a canonical device string like 'CPU' or 'CUDA:1', got {s.arg!r}")


spec.register_stage("program", _check_program)


def _check_device(name: Any) -> None:
  if not isinstance(name, str) or not spec.DEVICE_RE.fullmatch(name):
    raise ProgramError(f"a program's device must be a canonical device string like 'CPU' or 'CUDA:1', got {name!r}")


def _checked(p: UOp) -> ProgramUOp:
  if not isinstance(p, ProgramUOp): raise ProgramError(f"a PROGRAM UOp was not built as a ProgramUOp ({type(p).__name__}): is plugrad.uop imported?")
  spec.maybe_check("program", p)
  return p


def make_program(ast: UOp, device: str) -> ProgramUOp:
  """The first stage of a compiled kernel: PROGRAM(SINK, DEVICE). A SINK without an arg gets KernelInfo()."""
  if not isinstance(ast, UOp) or ast.op is not Ops.SINK:
    raise ProgramError(f"make_program needs a kernel AST rooted at a SINK, got {ast.op.name if isinstance(ast, UOp) else type(ast).__name__}")
  if ast.arg is None: ast = ast.replace(arg=KernelInfo())
  elif not isinstance(ast.arg, KernelInfo): raise ProgramError(f"the SINK of a kernel AST needs a KernelInfo arg, got {ast.arg!r}")
  _check_device(device)
  return _checked(UOp(Ops.PROGRAM, dtypes.void, (ast, UOp(Ops.DEVICE, dtypes.void, (), device))))


# ---- programs written outside plugrad

BUFFER_MODES = ("in", "out", "inout")


def new_program(name: str, device: str, *, source: str | None = None, binary: bytes | None = None, buffers: Sequence[tuple[DType, str]],
                global_size: Sequence[sint], local_size: Sequence[sint] = (1, 1, 1), vars: Sequence[Any] = ()) -> ProgramUOp:
  """A PROGRAM for a kernel written outside plugrad, at the "source" stage (the device's compiler compiles `source`)
  or, given `binary`, at the "binary" stage (used as is; `source`, if also given, is kept for reading only).

  The signature is stated as a synthetic LINEAR that the accessors read like any other: a DEFINE_GLOBAL per buffer
  (slot order), a DEFINE_VAR per variable, the size expressions and their `gidxN`/`lidxN` SPECIALs, and for each buffer a
  LOAD and/or STORE at index 0 that marks it read ("in"), written ("out") or both ("inout"). Its SINK is empty with
  `KernelInfo(name, external=True)`: no component may render that LINEAR again (it does not compute the kernel).
  `vars` are Variables (DEFINE_VARs) or (name, min, max) tuples, declared in name order, the order launches pass them.
  Sizes are ints >= 1 or integer expressions over the declared variables."""
  if not isinstance(name, str) or not name: raise ProgramError(f"new_program needs the kernel's name as a non-empty str, got {name!r}")
  def fail(why: str) -> ProgramError: return ProgramError(f"new_program {name!r}: {why}")
  if not isinstance(device, str) or not spec.DEVICE_RE.fullmatch(device): raise fail(f"device must be a canonical name like 'CPU', got {device!r}")
  if source is None and binary is None: raise fail("give the kernel's source (compiled by the device's compiler) or its binary (used as is)")
  if source is not None and not isinstance(source, str): raise fail(f"source must be a str, got {type(source).__name__}")
  if binary is not None and not isinstance(binary, (bytes, bytearray, memoryview)): raise fail(f"binary must be bytes, got {type(binary).__name__}")
  if isinstance(buffers, (str, bytes)) or not isinstance(buffers, Sequence):
    raise fail(f"buffers must be a list of (dtype, mode) pairs, got {type(buffers).__name__}")
  globs: list[tuple[UOp, str]] = []
  for i, b in enumerate(buffers):
    if not isinstance(b, (tuple, list)) or len(b) != 2: raise fail(f"buffer {i} must be a (dtype, mode) pair, got {b!r}")
    dt, mode = b
    if not isinstance(dt, DType) or isinstance(dt, PtrDType) or dt.count != 1 or dt in (dtypes.void, dtypes.index):
      raise fail(f"buffer {i}: the dtype must be a scalar element dtype like dtypes.float32, got {dt!r}")
    if mode not in BUFFER_MODES: raise fail(f"buffer {i}: the mode must be one of {BUFFER_MODES}, got {mode!r}")
    globs.append((UOp(Ops.DEFINE_GLOBAL, dt.ptr(), (), i), mode))
  if all(m == "in" for _, m in globs): raise fail("the kernel writes no buffer: declare at least one 'out' or 'inout' buffer")
  declared = [_declared_var(v, fail) for v in (vars if isinstance(vars, (tuple, list)) else [vars])]
  if [v.arg[0] for v in declared] != sorted(v.arg[0] for v in declared) or len({v.arg[0] for v in declared}) != len(declared):
    raise fail(f"declare vars once each and sorted by name (launches pass their values in name order), got {[v.arg[0] for v in declared]}")
  by_name = {v.arg[0]: v for v in declared}
  sizes: list[UOp] = []
  for kind, dims in (("gidx", global_size), ("lidx", local_size)):
    what = "global_size" if kind == "gidx" else "local_size"
    if isinstance(dims, (int, UOp)): dims = (dims,)
    if not isinstance(dims, Sequence) or not 1 <= len(dims) <= 3: raise fail(f"{what} must be 1 to 3 sizes, got {dims!r}")
    for i, d in enumerate(dims):
      if not (isinstance(d, int) and d == 1):
        sizes.append(UOp(Ops.SPECIAL, dtypes.int32, (_launch_size(d, by_name, f"{what}[{i}]", fail),), f"{kind}{i}"))
  zero = UOp.const(dtypes.int32, 0)
  access: list[UOp] = []
  for g, mode in globs:
    idx = UOp(Ops.INDEX, g.dtype, (g, zero))
    ld = UOp(Ops.LOAD, g.dtype.base, (idx,))
    if mode != "out": access += [idx, ld]
    if mode != "in": access += [idx, UOp(Ops.STORE, dtypes.void, (idx, ld if mode == "inout" else UOp.const(g.dtype.base, 0)))]
  order = _in_order([*(g for g, _ in globs), *declared, *sizes, *access])
  sink = UOp(Ops.SINK, dtypes.void, (), KernelInfo(name, external=True))
  p = make_program(sink, device).with_linear(order).with_source(source if source is not None else "")
  return p if binary is None else p.with_binary(bytes(binary))


def _in_order(uops: list[UOp]) -> list[UOp]:
  """`uops` (deduplicated) with every source placed before its user."""
  out: dict[UOp, None] = {}
  for u in uops:
    for n in u.toposort: out.setdefault(n, None)
  return list(out)


def _declared_var(v: Any, fail: Any) -> UOp:
  if isinstance(v, UOp) and v.op is Ops.DEFINE_VAR: (name, lo, hi), dt = v.arg, v.dtype
  elif isinstance(v, (tuple, list)) and len(v) == 3: (name, lo, hi), dt = v, dtypes.index
  else: raise fail(f"each var must be a Variable or a (name, min, max) tuple, got {v!r}")
  if not isinstance(name, str) or not name or not all(isinstance(x, int) and not isinstance(x, bool) for x in (lo, hi)) or lo > hi:
    raise fail(f"var {v!r} needs a non-empty name and int bounds min <= max")
  if dt is dtypes.index or not dtypes.is_int(dt):
    dt = dtypes.int32 if dtypes.min(dtypes.int32) <= lo and hi <= dtypes.max(dtypes.int32) else dtypes.int64
  elif dt not in (dtypes.int32, dtypes.int64): raise fail(f"var {name!r}: a kernel takes int32 or int64 variables, got {dt!r}")
  return UOp(Ops.DEFINE_VAR, dt, (), (name, lo, hi))


def _launch_size(d: Any, by_name: dict[str, UOp], what: str, fail: Any) -> UOp:
  """A launch size as an int32 expression over the declared variables."""
  if isinstance(d, int) and not isinstance(d, bool):
    if d < 1: raise fail(f"{what} must be >= 1, got {d}")
    return UOp.const(dtypes.int32, d)
  if not isinstance(d, UOp) or isinstance(d.dtype, PtrDType) or not dtypes.is_int(d.dtype):
    raise fail(f"{what} must be an int or an integer expression of the declared vars, got {d!r}")
  done: dict[UOp, UOp] = {}
  for u in d.toposort:
    if u.op is Ops.DEFINE_VAR:
      if (v := by_name.get(u.arg[0])) is None:
        raise fail(f"{what} uses variable {u.arg[0]!r}, which is not among the declared vars {sorted(by_name)}")
      done[u] = v if v.dtype is dtypes.int32 else v.cast(dtypes.int32)
    elif u.op is Ops.BIND: done[u] = done[u.src[0]]
    else: done[u] = UOp(u.op, dtypes.int32 if u.dtype is dtypes.index else u.dtype, tuple(done[s] for s in u.src), u.arg)
  if done[d].dtype is not dtypes.int32: raise fail(f"{what} must be an int32 or index expression, got one of {done[d].dtype!r}")
  return done[d]


__all__ = ["BUFFER_MODES", "LAYOUT", "PROGRAM_STAGES", "Estimates", "ProgramArgumentError", "ProgramError", "ProgramStageError", "ProgramUOp",
           "make_program", "new_program"]
