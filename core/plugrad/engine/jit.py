"""The JIT: capture the kernels a function launches once, then replay them without Python tensor code.

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor: ...

Call 1 runs the function normally (lazy state gets created, kernels get compiled). Call 2 runs it again while
recording every launch (`plugrad.engine.realize.capture`), then plans the memory of its intermediates and groups
the launches into device graphs. Calls 3 and later check the arguments against the captured call and replay the
launches with the new inputs: no scheduling, no codegen, no tensor graph.

What changes between replays:
* **Tensor arguments** ("inputs"): their buffers are swapped into the kernels that read them. A pure view of a buffer
  (reshape, permute, shrink, ... possibly with bound Variables in it) is passed as that buffer and must come in the
  same view every call; anything else is realized first. Shape, dtype, device and view are checked on every call.
* **Bound Variables** (`Variable("n", 1, 64).bind(k)`) in the arguments, or inside an argument's view: their values
  are passed to the kernels, so one capture serves every value in the variable's range.
* **Outputs**: every returned Tensor computed inside the call gets a new buffer on each replay, so results of
  earlier calls stay valid. A returned tensor that is not computed by the call (a model weight, an input) is
  returned as the same tensor.
Everything else is fixed at capture: Python values among the arguments must not change (checked), state the function
reads (weights, optimizer moments, ...) is read from the same buffers, and host-side reads inside the function
(`.numpy()`, `.item()`) happen only during the first two calls.
"""
from __future__ import annotations

import functools
import gc
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import plugrad.trace as trace
from plugrad.device.buffer import Buffer
from plugrad.device.graph import GraphError, GraphKernel, GraphRunner, check_graph_class
from plugrad.device.registry import Device
from plugrad.engine.buffers import buffer_of, fresh_buffer
from plugrad.engine.memory import MemoryPlan, plan_memory
from plugrad.engine.multi import multi
from plugrad.engine.realize import ENGINE_LOCK, ExecItem, capture
from plugrad.helpers import DEBUG, ContextVar
from plugrad.uop.ops import Ops, UOp

__all__ = ["JIT", "JIT_BATCH_SIZE", "GraphError", "GraphKernel", "GraphRunner", "JitError", "JitInputError", "TinyJit"]

JIT = ContextVar("JIT", 1, (0, 1, 2))    # 0: TinyJit just calls the function; 2: replay without graph runners
JIT_BATCH_SIZE = ContextVar("JIT_BATCH_SIZE", 32, minimum=1)  # kernels in the first graph batch (each next batch doubles)

R = TypeVar("R")
_VIEW_OPS = frozenset({Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.SHRINK, Ops.PAD, Ops.FLIP})


class JitError(RuntimeError):
  """A function cannot be captured or replayed as asked."""


class JitInputError(JitError, ValueError):
  """The arguments of a replay do not match the captured call (names the argument and what differs)."""


# ---- arguments

def _is_tensor(x: Any) -> bool:
  """A Tensor (duck-typed: the engine sits below the tensor layer) is anything holding a tensor-graph `uop`."""
  return isinstance(getattr(x, "uop", None), UOp) and hasattr(x, "realize")


def _flat_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
  return [(f"argument {i}", a) for i, a in enumerate(args)] + [(f"argument {k!r}", v) for k, v in sorted(kwargs.items())]


def _base_buffer(u: UOp) -> UOp | None:
  """The BUFFER under a chain of movement ops, or None when `u` is not a pure view of one buffer."""
  while u.op in _VIEW_OPS: u = u.src[0]
  return u if u.op is Ops.BUFFER else None


def _realized(u: UOp) -> bool:
  return all(_base_buffer(p) is not None for p in u.src) if u.op is Ops.MULTI else _base_buffer(u) is not None


def _placeholder(buf: UOp) -> UOp:
  """A stand-in for an input's buffer in its view template: same dtype, size and device, no identity."""
  return UOp(Ops.BUFFER, buf.dtype, (UOp(Ops.UNIQUE, arg=-1), buf.src[1]), buf.arg)


def _arg_uops(arg: Any) -> Iterator[UOp]:
  if isinstance(arg, UOp): yield arg
  elif isinstance(arg, tuple):
    for a in arg: yield from _arg_uops(a)


def _map_arg(arg: Any, fn: Callable[[UOp], Any]) -> Any:
  if isinstance(arg, UOp): return fn(arg)
  return tuple(_map_arg(a, fn) for a in arg) if isinstance(arg, tuple) else arg


def _binds(u: UOp) -> dict[UOp, UOp]:
  """Every BIND in `u`'s graph and in the sizes its movement ops carry (their args), mapped to its Variable."""
  nodes = [u, *u.toposort]
  nodes += [m for n in nodes if n.op in _VIEW_OPS for a in _arg_uops(n.arg) for m in (a, *a.toposort)]
  return {b: b.src[0] for b in nodes if b.op is Ops.BIND}


def _resub(u: UOp, mapping: dict[UOp, UOp]) -> UOp:
  """`u.substitute(mapping)` that also maps the sizes in the args of a chain of movement ops."""
  if (rep := mapping.get(u)) is not None: return rep
  if u.op not in _VIEW_OPS: return u.substitute(mapping)
  return UOp(u.op, u.dtype, (_resub(u.src[0], mapping),), _map_arg(u.arg, lambda a: a.substitute(mapping)))


class _InputSpec:
  """One Tensor input of a call. `template` is what must match between calls: a tuple for a plain buffer, else the
  view with its buffer and binds abstracted. (A plain class: a frozen dataclass's __init__ was a tenth of a replay.)"""
  __slots__ = ("name", "template", "uop")
  def __init__(self, name: str, template: Any, uop: UOp): self.name, self.template, self.uop = name, template, uop

  @property
  def shape(self) -> str: return str(tuple(s if isinstance(s, int) else s.render() for s in self.uop.shape or ()))
  @property
  def dtype(self) -> str: return str(self.uop.dtype)
  @property
  def device(self) -> str: return self.uop.tensor_device


def _describe_mismatch(want: _InputSpec, got: _InputSpec) -> str:
  for what in ("device", "dtype", "shape"):
    if (a := getattr(want, what)) != (b := getattr(got, what)): return f"its {what} is {b}, the captured call had {a}"
  return "it is a different view of its buffer (strides, offset or buffer size differ) than in the captured call; pass .contiguous() tensors"


def _template(u: UOp, buf: UOp) -> Any:
  if u is buf: return (buf.dtype, buf.arg, buf.src[1].arg, None)
  if u.op is Ops.RESHAPE and u.src[0] is buf and all(isinstance(s, int) for s in u.arg): return (buf.dtype, buf.arg, buf.src[1].arg, u.arg)
  return _resub(u, {buf: _placeholder(buf), **_binds(u)})


class _Call:
  """The arguments of one call: input tensors as (spec, buffer UOp), bound Variables' values, and the other values."""
  def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any]):
    self.inputs: list[tuple[_InputSpec, UOp]] = []
    self.var_vals: dict[str, int] = {}
    self.others: list[tuple[str, Any]] = []
    for name, a in _flat_args(args, kwargs):
      if _is_tensor(a):
        if not _realized(a.uop): a.realize()
        # a multi-device tensor is one input per device: each piece's buffer is swapped on replay
        pieces = [(f"{name} (piece {i} on {p.tensor_device})", p) for i, p in enumerate(a.uop.src)] if a.uop.op is Ops.MULTI else [(name, a.uop)]
        for pname, u in pieces:
          buf = _base_buffer(u)
          assert buf is not None  # realize() leaves a buffer (reshaped)
          if (template := _template(u, buf)).__class__ is not tuple: self._bound(u)
          self.inputs.append((_InputSpec(pname, template, u), buf))
      elif isinstance(a, UOp) and a.op is Ops.BIND: self._bound(a)
      else: self.others.append((name, a))

  def _bound(self, u: UOp) -> None:
    for b in _binds(u):
      var, val = b.unbind()
      if self.var_vals.setdefault(var.arg[0], val) != val:
        raise JitInputError(f"Variable {var.arg[0]!r} is bound to both {self.var_vals[var.arg[0]]} and {val} in the arguments")


def _same_value(a: Any, b: Any) -> bool:
  if a is b: return True
  try: return bool(a == b) and type(a) is type(b)
  except Exception: return False


# ---- outputs

def _walk(ret: Any, fn: Callable[[Any], Any]) -> Any:
  """`ret` with every Tensor in it (through tuples, lists and dict values) replaced by fn(tensor)."""
  if _is_tensor(ret): return fn(ret)
  if isinstance(ret, (tuple, list)): return type(ret)(_walk(r, fn) for r in ret)
  if isinstance(ret, dict): return {k: _walk(v, fn) for k, v in ret.items()}
  return ret


def _tensors(ret: Any) -> list[Any]:
  out: list[Any] = []
  _walk(ret, out.append)
  return out


# ---- replay steps

class _KernelStep:
  """Per-kernel replay of one launch: the fallback when a device has no graph runner (or it declined a batch)."""
  def __init__(self, k: GraphKernel, slots: Sequence[Buffer], var_names: Sequence[str]):
    where = {id(b): i for i, b in enumerate(slots)}
    self.runner = k.runner
    self.fixed = [b.ensure_allocated() for b in k.bufs]
    self.patch = [(i, where[id(b)]) for i, b in enumerate(k.bufs) if id(b) in where]
    self.vars = list(k.runner.var_names)

  def __call__(self, slots: Sequence[Buffer], var_vals: dict[str, int], wait: bool = False) -> float | None:
    handles = [b.handle for b in self.fixed]
    for i, k in self.patch: handles[i] = slots[k].handle
    return self.runner.launch(handles, tuple(var_vals[n] for n in self.vars), wait)


class _CopyStep:
  def __init__(self, ei: ExecItem, slots: Sequence[Buffer]):
    where = {id(b): i for i, b in enumerate(slots)}
    self.dest, self.src = ((where.get(id(b)), b) for b in ei.bufs[:2])

  def __call__(self, slots: Sequence[Buffer], var_vals: dict[str, int], wait: bool = False) -> float | None:
    (dk, dest), (sk, src) = self.dest, self.src
    (slots[dk] if dk is not None else dest).copy_from(slots[sk] if sk is not None else src)
    return None


def _timed_steps(steps: list[Any], slots: Sequence[Buffer], var_vals: dict[str, int]) -> None:
  """A replay with every step waited for and timed (DEBUG>=2, VIZ): a kernel step times its launch itself
  (ProgramRunner.launch), a graph batch is one timed launch of all its kernels."""
  for step in steps:
    if not isinstance(step, GraphRunner):
      step(slots, var_vals)
      continue
    st = time.perf_counter()
    if (t := step(slots, var_vals, wait=True)) is None:
      Device[step.device].synchronize()
      t = time.perf_counter() - st
    ests = [k.runner.program.estimates.at(dict(zip(k.runner.var_names, step.vals(j, var_vals)))) for j, k in enumerate(step.kernels)]
    ops, mem = sum(int(e.ops) for e in ests), sum(int(e.mem) for e in ests)
    name = f"{type(step).__name__}[{len(step.kernels)}] {step.kernels[0].runner.name}..{step.kernels[-1].runner.name}"
    trace.launched(name, step.device, st, t, ops=ops, mem=mem, kind="graph")
    if DEBUG >= 2: print(f"{name:<28} {step.device:<10} {len(step.kernels)} kernels {t * 1e6:10.2f} us {ops / t * 1e-9:9.2f} GFLOPS "
                         f"{mem / t * 1e-9:8.2f} GB/s" if t > 0 else f"{name:<28} {step.device:<10} {t * 1e6:10.2f} us")


def _batches(n: int, first: int) -> Iterator[tuple[int, int]]:
  start, size = 0, max(1, first)
  while start < n:
    yield start, min(n, start + size)
    start, size = start + size, size * 2


@dataclass
class CapturedJit:
  """A capture, ready to replay: the steps, the buffers swapped per call, how to rebuild the outputs."""
  name: str
  inputs: list[_InputSpec]
  others: list[tuple[str, Any]]
  var_vals: dict[str, int]  # the captured call's values (variables bound inside the function keep them)
  items: list[ExecItem]
  steps: list[Any]
  n_inputs: int
  outputs: list[_Output | _MultiOutput]
  fresh_outputs: list[tuple[Buffer, UOp]]  # per computed output, in slot order (after the inputs): an unallocated Buffer like its
                                           # buffer at capture, and its DEVICE
  out_tree: Any
  memory: MemoryPlan
  graphs: int

  def __post_init__(self) -> None: self.devices = [Device[d] for d in dict.fromkeys(it.device for it in self.items)]

  def check(self, call: _Call) -> None:
    if len(call.inputs) != len(self.inputs):
      raise JitInputError(f"TinyJit({self.name}) was captured with {len(self.inputs)} Tensor arguments "
                          f"({', '.join(s.name for s in self.inputs) or 'none'}), this call passes {len(call.inputs)}")
    for want, (got, _) in zip(self.inputs, call.inputs):
      if got.name != want.name:
        raise JitInputError(f"TinyJit({self.name}): the captured call had a Tensor as {want.name}, this call has one as {got.name}")
      if got.template is not want.template and not (type(got.template) is tuple and got.template == want.template):
        raise JitInputError(f"TinyJit({self.name}): {got.name}: {_describe_mismatch(want, got)}")
    if len(call.others) != len(self.others) or any(a[0] != b[0] or not _same_value(a[1], b[1]) for a, b in zip(call.others, self.others)):
      now, then = dict(call.others), dict(self.others)
      diff = next((k for k in {**now, **then} if k not in now or k not in then or not _same_value(now[k], then[k])), "an argument")
      raise JitInputError(f"TinyJit({self.name}): {diff} is {now.get(diff, 'missing')!r:.60}, the captured call had "
                          f"{then.get(diff, 'nothing')!r:.60}; a replay reruns the captured kernels, so values that change must be "
                          "Tensors or bound Variables")

  def replay(self, call: _Call) -> Any:
    self.check(call)
    var_vals = {**self.var_vals, **call.var_vals} if call.var_vals else self.var_vals
    with ENGINE_LOCK:  # not interleaved with another thread's realize or replay (the runners and allocators are shared)
      fresh = [fresh_buffer(proto, dev) for proto, dev in self.fresh_outputs]
      slots = [buffer_of(b).ensure_allocated() for _, b in call.inputs] + [buf for _, buf in fresh]
      if DEBUG >= 2 or trace.TIMELINE: _timed_steps(self.steps, slots, var_vals)  # graph batches are timed as one launch
      else:
        for step in self.steps: step(slots, var_vals)
      for dev in self.devices: dev.synchronize()
    slot_uops = [b for _, b in call.inputs] + [u for u, _ in fresh]
    outs = iter(self.outputs)
    def rebuild(_: Any) -> Any: return next(outs).rebuild(slot_uops, var_vals)
    return _walk(self.out_tree, rebuild)


@dataclass
class _Output:
  """A returned tensor: its class and uop at capture, and its slot when its buffer changes per call (an input, or a
  result the call computed: it gets a new buffer)."""
  cls: type
  uop: UOp
  slot: int | None
  buffer: UOp  # its BUFFER at capture
  binds: tuple[UOp, ...]

  def rebuild(self, slot_uops: list[UOp], var_vals: dict[str, int]) -> Any:
    return getattr(self.cls, "_wrap", self.cls)(self.rebuilt(slot_uops, var_vals))

  def rebuilt(self, slot_uops: list[UOp], var_vals: dict[str, int]) -> UOp:
    if self.slot is None: return self.uop
    old, new = self.buffer, slot_uops[self.slot]
    if self.binds: return _resub(self.uop, {old: new, **{b: b.src[0].bind(var_vals[b.src[0].arg[0]]) for b in self.binds}})
    if (u := self.uop) is old: return new
    return UOp(u.op, u.dtype, (new,), u.arg) if u.src[0] is old else u.substitute({old: new})


@dataclass
class _MultiOutput:
  """A returned multi-device tensor: one `_Output` per piece, put back together as a MULTI along `axis`."""
  cls: type
  pieces: list[_Output]
  axis: int | None

  def rebuild(self, slot_uops: list[UOp], var_vals: dict[str, int]) -> Any:
    return getattr(self.cls, "_wrap", self.cls)(multi([p.rebuilt(slot_uops, var_vals) for p in self.pieces], self.axis))


def _capture(name: str, call: _Call, items: list[ExecItem], ret: Any) -> CapturedJit:
  if not items: raise JitError(f"TinyJit({name}) launched no kernels in the captured call: there is nothing to replay")
  if drew := [ei.name for ei in items if ei.runner is not None and any(u.op is Ops.THREEFRY for u in ei.runner.program.ast.toposort)]:
    # the random counter is a constant of the kernel: every replay would draw the same numbers
    raise JitError(f"TinyJit({name}): kernels {drew} draw random numbers (Tensor.rand, dropout, ...) inside the captured call, and a replay "
                   "would repeat them; draw them outside the jitted function and pass them in as Tensor arguments")
  in_bufs = [buffer_of(b) for _, b in call.inputs]
  outs = _tensors(ret)
  # a result's autograd graph (kept so `loss.backward()` works after the call) holds the call's intermediates: the
  # planner could share none of them. Results of the capture and of replays are not differentiable outside the call.
  for t in outs: getattr(t, "_forget_origin", lambda: None)()
  fresh_uops = {u: ei.bufs[i] for ei in items for i, ref in ei.fresh if (u := ref()) is not None}
  # outputs computed by the call are swapped per replay; views of inputs or of state are returned as they are
  out_slots: dict[Buffer, int] = {}
  fresh_outputs: list[tuple[Buffer, UOp]] = []
  in_uops = [b for _, b in call.inputs]
  def output(cls: type, u: UOp) -> _Output:
    b = _base_buffer(u)
    buf = fresh_uops.get(b) if b is not None else None
    if b is not None and b in in_uops: return _Output(cls, u, in_uops.index(b), b, tuple(_binds(u)))  # an input (or a view of one)
    if b is None or buf is None: return _Output(cls, u, None, u, ())
    if buf not in out_slots:
      out_slots[buf] = len(in_bufs) + len(out_slots)
      fresh_outputs.append((Buffer(b.src[1].arg, b.arg, b.dtype), b.src[1]))
    return _Output(cls, u, out_slots[buf], b, tuple(_binds(u)))
  outputs: list[_Output | _MultiOutput] = [_MultiOutput(type(t), [output(type(t), p) for p in t.uop.src], t.uop.arg) if t.uop.op is Ops.MULTI
                                           else output(type(t), t.uop) for t in outs]
  del outs
  fresh_uops.clear()  # (the dict is `output`'s closure cell: emptied, it holds no buffer through the collection below)
  gc.collect()
  # intermediates: created by the call, held by nobody now (a buffer someone still holds is state: it stays fixed)
  held = set(in_bufs) | set(out_slots)
  planned = {ei.bufs[i] for ei in items for i, ref in ei.fresh if ref() is None and ei.bufs[i] not in held}
  memory = plan_memory([ei.bufs for ei in items], planned)
  if DEBUG >= 2: print(f"TinyJit({name}): {memory}")
  if trace.TIMELINE: trace.jit_memory(name, [(ei.name, ei.bufs) for ei in items], memory)  # VIZ's memory view
  swap = memory.replace
  items = [ExecItem(ei.runner, [swap.get(b, b) for b in ei.bufs], ei.var_vals) for ei in items]
  slots = in_bufs + list(out_slots)
  var_names = sorted({n for ei in items if ei.runner is not None for n in ei.runner.var_names})
  steps, graphs = _build_steps(name, items, slots, var_names)
  return CapturedJit(name, [s for s, _ in call.inputs], call.others, {n: v for ei in items for n, v in ei.var_vals.items()} | call.var_vals,
                     items, steps, len(in_bufs), outputs, fresh_outputs, ret, memory, graphs)


def _build_steps(name: str, items: list[ExecItem], slots: list[Buffer], var_names: list[str]) -> tuple[list[Any], int]:
  steps: list[Any] = []
  graphs = 0
  j = 0
  while j < len(items):
    if items[j].runner is None:
      steps.append(_CopyStep(items[j], slots))
      j += 1
      continue
    end = j
    while end < len(items) and items[end].runner is not None and items[end].device == items[j].device: end += 1
    run = [GraphKernel(ei.runner, tuple(ei.bufs)) for ei in items[j:end] if ei.runner is not None]
    cls = _graph_class(items[j].device) if JIT < 2 else None
    for a, b in _batches(len(run), JIT_BATCH_SIZE.value):
      batch = run[a:b]
      # one kernel too: a graph launch is the cheaper one (the CPU's runs its threads from C, a single launch hands a
      # share to a Python worker: a 1x512 @ 512x1000 GEMV under TinyJit 0.18 -> 0.07 ms)
      if cls is not None:
        try:
          steps.append(cls(batch, slots, var_names))
          graphs += 1
          continue
        except Exception as e:
          if DEBUG >= 1: print(f"TinyJit({name}): {cls.__name__} declined {len(batch)} kernels on {items[j].device}, replaying them one by one: {e}")
      steps += [_KernelStep(k, slots, var_names) for k in batch]
    j = end
  return steps, graphs


def _graph_class(device: str) -> type[GraphRunner] | None:
  cls = Device[device].graph
  return None if cls is None else check_graph_class(cls, device)


class TinyJit(Generic[R]):
  """Decorator: capture the kernels `fxn` launches on its second call and replay them from the third on (see the
  module docstring for what may change between calls). `reset()` forgets the capture; `captured` holds it."""
  def __init__(self, fxn: Callable[..., R]):
    if not callable(fxn): raise TypeError(f"TinyJit needs a callable, got {type(fxn).__name__}")
    self.fxn = fxn
    self.name = getattr(fxn, "__qualname__", type(fxn).__name__)
    functools.update_wrapper(self, fxn)  # type: ignore[arg-type]
    self.reset()

  def reset(self) -> None:
    self.calls = 0
    self.captured: CapturedJit | None = None
    # the first two calls of one TinyJit run one at a time (threads that call it meanwhile wait, then replay)
    self._lock = threading.RLock()

  def __get__(self, obj: Any, objtype: Any = None) -> Any:
    """As a method decorator: one TinyJit per instance (each instance has its own state to capture)."""
    if obj is None: return self
    jits: weakref.WeakKeyDictionary[Any, TinyJit] = self.__dict__.setdefault("_per_instance", weakref.WeakKeyDictionary())
    if (jit := jits.get(obj)) is None: jit = jits[obj] = TinyJit(functools.partial(self.fxn, obj))
    return jit

  def __call__(self, *args: Any, **kwargs: Any) -> R:
    if not JIT: return self.fxn(*args, **kwargs)
    call = _Call(args, kwargs)
    if (captured := self.captured) is not None: return captured.replay(call)
    with self._lock: return self._call_unjitted(call, args, kwargs)

  def _call_unjitted(self, call: _Call, args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
    if self.captured is not None: return self.captured.replay(call)  # captured by another thread while this one waited
    if self.calls == 0:
      ret = self.fxn(*args, **kwargs)
      if outs := _tensors(ret): outs[0].realize(*outs[1:])
      self.calls = 1
      return ret
    with capture() as items:
      ret = self.fxn(*args, **kwargs)
      if outs := _tensors(ret): outs[0].realize(*outs[1:])
    del outs
    self.captured = _capture(self.name, call, items, ret)
    self.calls = 2
    if DEBUG >= 1:
      c = self.captured
      print(f"TinyJit({self.name}): captured {sum(ei.runner is not None for ei in c.items)} kernels, "
            f"{len(c.items) - sum(ei.runner is not None for ei in c.items)} copies, {c.graphs} graph batches")
    return ret

