"""The scheduler: a lazy tensor graph (stage 1) → kernel ASTs (stage 2) and copies, in dependency order. This module
orders the work and caches schedules by the graph's form; the fusion policy below is `fusion.py`, the kernel building
`kernels.py`, what both ask of a node `nodes.py`.

Which nodes get their own buffer (are *realized*):
* the requested nodes, CONTIGUOUS, COPY (and the source it copies), ASSIGN;
* a REDUCE_AXIS whose result is broadcast (reached through an EXPAND) or feeds another reduction, or that more than
  one kernel would otherwise recompute. When what is broadcast is the reduction followed by elementwise ops that
  nothing else uses (a matmul's bias and ReLU before the next matmul), that result is realized instead: the epilogue
  runs once, in the reduction's kernel, not once per broadcast read;
* of several reductions over different loops that one kernel would hold side by side (a ResNet block's 3x3 conv plus
  its 1x1 downsample conv), all but the largest, each with its own epilogue (_sibling_reductions).
A long reduction into a small output is first rewritten into partials and a reduction over them (_split_reductions,
SPLIT_REDUCE), so its partials kernel has a parallel outer loop. Everything else fuses into the kernel that consumes
it: elementwise chains into their consumer, movement ops into index arithmetic (a view costs no copy), a reduction
followed by elementwise ops into one kernel.

A kernel is built by pushing index expressions down from its output: each output axis is a RANGE, each movement op
rewrites the indices (RESHAPE by flattening and splitting, PAD with a validity gate, ...), each REDUCE_AXIS opens
new REDUCE ranges, and a realized input becomes a LOAD at the flattened index.
"""
from __future__ import annotations

import functools
import heapq
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from plugrad.dtype import dtypes
from plugrad.engine import multi
from plugrad.engine.buffers import buffer_like, new_buffer
from plugrad.engine.fusion import RECOMPUTE_MAX, ROW_FUSE, SPLIT_REDUCE, find_realized, split_reductions
from plugrad.engine.kernels import SCATTER_ATOMIC, aliased_reads, atomic_scatter, build_kernel, build_scatter
from plugrad.engine.nodes import ScheduleError, buffer_uop, is_buffer_form, node_shape
from plugrad.helpers import DEBUG, ContextVar, prod
from plugrad.uop.ops import Ops, UOp
from plugrad.uop.spec import maybe_check


@dataclass
class ScheduleItem:
  """One unit of work: a kernel (`ast` is a SINK), a precompiled kernel (`ast` is its PROGRAM, from run_program) or a
  copy between devices (`ast` is the COPY). `bufs` are BUFFER UOps in DEFINE_GLOBAL slot order (the output first, for
  kernels plugrad builds); `outs` the slots it writes; `var_vals` bind the kernel's symbolic variables."""
  ast: UOp
  bufs: tuple[UOp, ...]
  device: str
  var_vals: dict[str, int] = field(default_factory=dict)
  reads_before: frozenset[UOp] = frozenset()  # buffers read as they were before this schedule (leaves)
  in_place: bool = False  # an ASSIGN: writes its target buffer
  outs: tuple[int, ...] = (0,)

  @property
  def kind(self) -> str: return "copy" if self.ast.op is Ops.COPY else "kernel"

  @property
  def writes(self) -> tuple[UOp, ...]: return tuple(self.bufs[i] for i in self.outs)

  @functools.cached_property
  def program(self) -> Any:
    """The PROGRAM UOp of a kernel (rendered for its device; not compiled), or None for a copy."""
    if self.kind == "copy": return None
    if self.ast.op is Ops.PROGRAM: return self.ast
    from plugrad.codegen import get_program
    from plugrad.device.compiler import PROGRAMS
    from plugrad.device.registry import Device
    from plugrad.device.search import DeviceTimer
    return get_program(self.ast, Device[self.device].renderer, timer=DeviceTimer, store=PROGRAMS)

  def __repr__(self) -> str:
    if self.kind == "kernel": name = self.program.name if self.ast.op is Ops.PROGRAM else self.ast.arg.name
    else: name = f"copy {self.bufs[1].src[1].arg} -> {self.bufs[0].src[1].arg}"
    return f"<ScheduleItem {name} on {self.device}, {len(self.bufs)} buffers>"


def create_schedule(*targets: UOp) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
  """Kernels and copies that compute `targets`, in the order to run them, and each realized node's replacement (its
  buffer, reshaped to its shape).

  Schedules are cached by the graph's form: the graph with its buffers replaced by numbered stand-ins (same dtype,
  size and device). A graph of the same form over other buffers — the next step of a loop, the same expression on
  new data — reuses the kernels and order, with its own buffers put in and new result buffers made."""
  if not targets: return [], {}
  for t in targets:
    if not isinstance(t, UOp) or t.shape is None: raise ScheduleError(f"create_schedule needs tensor-graph UOps with a shape, got {t!r:.80}")
  if multi.has_multi(targets): return _schedule_multi(targets)
  sink = UOp(Ops.SINK, dtypes.void, tuple(targets))
  if not SCHEDULE_CACHE: return _create_schedule(sink)
  topo = list(sink.toposort)
  leaves = [u for u in topo if u.op is Ops.BUFFER]
  key = (sink.substitute({b: _stand_in(b, i) for i, b in enumerate(leaves)}), bool(SPLIT_REDUCE), RECOMPUTE_MAX.value, ROW_FUSE.value,
         SCATTER_ATOMIC.value)
  with _cache_lock:  # the OrderedDict's reordering and eviction are not atomic (Tensor.schedule() runs outside the engine lock)
    if (hit := _cache.get(key)) is not None: _cache.move_to_end(key)
  if hit is None:
    items, becomes = _create_schedule(sink)
    hit = _template(items, becomes, topo, leaves)
    with _cache_lock:
      _cache[key] = hit
      if len(_cache) > SCHEDULE_CACHE_SIZE: del _cache[next(iter(_cache))]
  return hit.instantiate(topo, leaves)


def _schedule_multi(targets: tuple[UOp, ...]) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
  """Targets with values on several devices: lowered to single-device graphs (engine/multi.py), whose pieces are
  scheduled together; a lowered MULTI's replacement is the MULTI of its pieces' buffers."""
  maybe_check("tensor", UOp(Ops.SINK, dtypes.void, targets))
  lowered_of: dict[UOp, UOp] = {}
  lowered = multi.lower(targets, lowered_of)
  def pieces(v: UOp) -> tuple[UOp, ...]: return v.src if v.op is Ops.MULTI else (v,)
  todo = list(dict.fromkeys(p for v in lowered for p in pieces(v) if not is_buffer_form(p)))
  if left := next((u for p in todo for u in p.toposort if u.op is Ops.MULTI or (u.op is Ops.DEVICE and isinstance(u.arg, tuple))), None):
    raise ScheduleError(f"a multi-device value was left after lowering it to single-device graphs: {left.op.name} {left.arg!r:.80}")
  items, becomes = create_schedule(*todo) if todo else ([], {})
  items = _order(items, by_device=True)
  def result(v: UOp) -> UOp | None:
    got = [r for p in pieces(v) if (r := becomes.get(p, p if is_buffer_form(p) else None)) is not None]
    if len(got) < len(pieces(v)): return None
    return multi.multi(got, v.arg) if v.op is Ops.MULTI else got[0]
  out: dict[UOp, UOp] = {}
  for t, v in zip(targets, lowered):
    if (got := result(v)) is not None: out[t] = got
  # the logical nodes whose lowered values were all computed (shared by other tensors' graphs, as a single-device
  # schedule names its realized intermediates)
  for n in UOp(Ops.SINK, dtypes.void, targets).toposort:
    if n in out or n.shape is None: continue
    if (low := lowered_of.get(n)) is not None and low is not n and (got := result(low)) is not None: out[n] = got
    elif n in becomes: out[n] = becomes[n]
  return items, out


SCHEDULE_CACHE = ContextVar("SCHEDULE_CACHE", 1, (0, 1))
SCHEDULE_CACHE_SIZE = 512  # graph forms kept (oldest dropped first)
_cache: OrderedDict[tuple[UOp, bool, int, int, int], _Template] = OrderedDict()  # (graph form, SPLIT_REDUCE, RECOMPUTE_MAX, ROW_FUSE, SCATTER_ATOMIC)
_cache_lock = threading.Lock()


def _stand_in(buf: UOp, i: int) -> UOp:
  """Buffer number i of a graph's form (the cache holds no real buffer, so it keeps no memory alive)."""
  return UOp(Ops.BUFFER, buf.dtype, (UOp(Ops.UNIQUE, dtypes.void, (), f"leaf {i}"), buf.src[1]), buf.arg)


@dataclass
class _Template:
  """A schedule in stand-in form: leaf i is "leaf i", result buffer j is "new j" (made afresh per use), realized nodes
  are named by their position in the graph's toposort."""
  items: list[ScheduleItem]
  becomes: dict[int, UOp]
  new: list[UOp]

  def instantiate(self, topo: list[UOp], leaves: list[UOp]) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
    real = dict(zip((_stand_in(b, i) for i, b in enumerate(leaves)), leaves)) | {n: buffer_like(n) for n in self.new}
    def sub(u: UOp) -> UOp: return r if (r := real.get(u)) is not None else u.substitute(real)
    items = [ScheduleItem(it.ast, tuple(real[b] for b in it.bufs), it.device, it.var_vals, frozenset(real[b] for b in it.reads_before),
                          it.in_place, it.outs) for it in self.items]
    return items, {topo[i]: sub(v) for i, v in self.becomes.items()}


def _template(items: list[ScheduleItem], becomes: dict[UOp, UOp], topo: list[UOp], leaves: list[UOp]) -> _Template:
  to: dict[UOp, UOp] = {b: _stand_in(b, i) for i, b in enumerate(leaves)}
  new: list[UOp] = []
  for it in items:
    for b in it.bufs:
      if b not in to:
        to[b] = UOp(Ops.BUFFER, b.dtype, (UOp(Ops.UNIQUE, dtypes.void, (), f"new {len(new)}"), b.src[1]), b.arg)
        new.append(to[b])
  def sub(u: UOp) -> UOp: return r if (r := to.get(u)) is not None else u.substitute(to)
  pos = {u: i for i, u in enumerate(topo)}
  return _Template([ScheduleItem(it.ast, tuple(to[b] for b in it.bufs), it.device, it.var_vals, frozenset(to[b] for b in it.reads_before),
                                 it.in_place, it.outs) for it in items], {pos[u]: sub(v) for u, v in becomes.items()}, new)


def _create_schedule(sink: UOp) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
  maybe_check("tensor", sink)
  orig, renamed = sink, None
  if SPLIT_REDUCE:
    sink, renamed = split_reductions(sink)
    if sink is orig: renamed = None
  realize = find_realized(sink)
  realized: dict[UOp, UOp] = {}
  items: list[ScheduleItem] = []
  for u in sink.toposort:
    if u.op is Ops.KERNEL: _schedule_program(u, realized, items)
    elif u in realize: _schedule_one(u, realized, items)
  items = _order(items)
  if renamed is None: becomes = {u: realized[u] for u in realize}
  else:  # the caller knows the graph it gave: name the realized nodes by their original form
    becomes = {old: realized[nu] for old, nu in renamed.items() if nu in realize}
    sink = orig
  for t in sink.src:
    if t.op is Ops.CONTIGUOUS and is_buffer_form(t.src[0]): becomes[t] = t.src[0]
  if DEBUG >= 3:
    for it in items: print(f"scheduled {it!r}")
  return items, becomes


def _schedule_one(u: UOp, realized: dict[UOp, UOp], items: list[ScheduleItem]) -> None:
  shape, device = u.shape, u.tensor_device
  assert shape is not None
  if u.op is Ops.AFTER:  # written in place by its KERNEL (scheduled before it: _schedule_program)
    realized[u] = u.src[0]
    return
  if u.op is Ops.COPY:
    src = realized.get(u.src[0], u.src[0])
    out = new_buffer(u.src[1].arg, int(prod(shape)), u.dtype)
    items.append(ScheduleItem(u, (out, buffer_uop(src)), u.src[1].arg))
    realized[u] = out.reshape(shape)
    return
  if u.op is Ops.SCATTER:  # base into a new buffer, then the write loop over it in place
    base = UOp(Ops.CONTIGUOUS, u.dtype, (u.src[0],))
    _schedule_one(base, realized, items)
    out = buffer_uop(realized[base])
    realized[u] = realized[base]
    if any(isinstance(d, int) and d == 0 for d in (*shape, *node_shape(u.src[1]))): return  # nothing is written
    ast, bufs, var_vals, old = build_scatter(u, out, realized, atomic_scatter(u, device))
    items.append(ScheduleItem(ast, bufs, device, var_vals, old, True))
    return
  size = prod(shape)
  out = buffer_uop(u.src[0]) if u.op is Ops.ASSIGN else new_buffer(device, size if isinstance(size, int) else _max_size(size), u.dtype)
  # a symbolic size gets a buffer for its largest value, of which the result is the first `size` elements
  result = u.src[0] if u.op is Ops.ASSIGN else (out if isinstance(size, int) else out.shrink(((0, size),))).reshape(shape)
  if isinstance(size, int) and size == 0:  # nothing to compute
    realized[u] = result
    return
  ast, bufs, var_vals, old = build_kernel(u, out, realized)
  if u.op is Ops.ASSIGN and aliased_reads(ast):
    # the value reads the target at other positions: compute it into a temporary first, then copy it in
    tmp = UOp(Ops.CONTIGUOUS, u.dtype, (u.src[1],))
    _schedule_one(tmp, realized, items)
    ast, bufs, var_vals, old = build_kernel(u.replace(src=(u.src[0], tmp)), out, realized)
  items.append(ScheduleItem(ast, bufs, device, var_vals, old, u.op is Ops.ASSIGN))
  realized[u] = result


def _schedule_program(k: UOp, realized: dict[UOp, UOp], items: list[ScheduleItem]) -> None:
  """KERNEL(*slot tensors, *BINDs, arg=PROGRAM): the given program over the slots' buffers, writing its outputs in place."""
  p = k.arg
  n = len(p.globals)
  bufs = tuple(buffer_uop(realized.get(s, s)) for s in k.src[:n])
  var_vals = {var.arg[0]: val for var, val in (b.unbind() for b in k.src[n:])}
  leaves = frozenset(b for s, b in zip(k.src[:n], bufs) if s not in realized)
  items.append(ScheduleItem(p, bufs, p.device, var_vals, leaves, True, tuple(p.outs)))


def _order(items: list[ScheduleItem], by_device: bool = False) -> list[ScheduleItem]:
  """The graph order, except that a kernel reading a buffer's old contents runs before the ASSIGN (or precompiled kernel)
  that overwrites it. `by_device` (a multi-device schedule): among the items ready to run, those on the device of the
  last one first, so each device's kernels come in long runs (what TinyJit batches into one graph launch)."""
  before: list[set[int]] = [set() for _ in items]  # before[j]: items that must run before j
  last_writer: dict[UOp, int] = {}
  for j, it in enumerate(items):
    writes = it.writes
    for b in it.bufs:
      if b in last_writer and (b not in it.reads_before or (it.in_place and b in writes)): before[j].add(last_writer[b])
    for b in writes: last_writer[b] = j
  readers: dict[UOp, list[int]] = {}
  for j, it in enumerate(items):
    for b in it.reads_before: readers.setdefault(b, []).append(j)
  for i, other in enumerate(items):
    if other.in_place: before[i].update(j for b in other.writes for j in readers.get(b, ()) if j != i)
  # the lowest-numbered item whose predecessors have all run goes next (a heap: linear in the schedule, which a scan of
  # every item per step was not)
  after: list[list[int]] = [[] for _ in items]
  waiting = [len(b) for b in before]
  for j, bs in enumerate(before):
    for i in bs: after[i].append(j)
  order: list[int] = []
  if by_device:
    queues: dict[str, list[int]] = {}  # ready items per device (a copy counts as its destination's), each a heap
    for j, w in enumerate(waiting):
      if w == 0: queues.setdefault(items[j].device, []).append(j)
    dev = ""
    while any(queues.values()):
      if not queues.get(dev): dev = min((d for d, q in queues.items() if q), key=lambda d: queues[d][0])
      order.append(j := heapq.heappop(queues[dev]))
      for k in after[j]:
        waiting[k] -= 1
        if waiting[k] == 0: heapq.heappush(queues.setdefault(items[k].device, []), k)
  else:
    ready = [j for j, w in enumerate(waiting) if w == 0]
    while ready:
      order.append(j := heapq.heappop(ready))
      for k in after[j]:
        waiting[k] -= 1
        if waiting[k] == 0: heapq.heappush(ready, k)
  if len(order) < len(items):
    raise ScheduleError("a kernel reads both the old and the new contents of an assigned buffer; realize the old value first")
  return [items[j] for j in order]


def _max_size(size: UOp) -> int:
  """The largest element count a symbolic size can take (buffers are allocated for it)."""
  return int(size.simplify().vmax)
