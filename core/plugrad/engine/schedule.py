"""The scheduler: a lazy tensor graph (stage 1) → kernel ASTs (stage 2) and copies, in dependency order.

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
import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from plugrad.codegen.lower import reduce_identity as _identity
from plugrad.dtype import dtypes
from plugrad.engine import multi
from plugrad.engine.buffers import buffer_like, new_buffer
from plugrad.helpers import DEBUG, ContextVar, prod, recursion_limit
from plugrad.uop.ops import AxisType, GroupOp, KernelInfo, Ops, UOp, sint
from plugrad.uop.spec import maybe_check


class ScheduleError(ValueError):
  """A tensor graph that cannot be turned into kernels (e.g. an ASSIGN to something that is not a buffer)."""


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


def _is_buffer_form(u: UOp) -> bool:
  """A node whose value already sits contiguously in one buffer."""
  return u.op is Ops.BUFFER or (u.op is Ops.RESHAPE and u.src[0].op is Ops.BUFFER)


def _buffer_uop(u: UOp) -> UOp:
  """The BUFFER of a buffer-form or realized node (a symbolic-size result is a prefix SHRINK of its buffer, reshaped)."""
  while u.op is not Ops.BUFFER: u = u.src[0]
  return u


def _is_writable_view(u: UOp) -> bool:
  """A view of a buffer that names each of its elements at most once, so a kernel can store through it."""
  while u.op in (Ops.RESHAPE, Ops.SHRINK, Ops.PERMUTE, Ops.FLIP): u = u.src[0]
  return u.op is Ops.BUFFER


def _shape(u: UOp) -> tuple[sint, ...]:
  if (s := u.shape) is None: raise ScheduleError(f"a {u.op.name} has no shape and cannot be computed by a kernel")
  return s


def _strides(shape: tuple[sint, ...]) -> list[sint]:
  out: list[sint] = []
  acc: sint = 1
  for d in reversed(shape):
    out.append(acc)
    acc = acc * d
  return out[::-1]


def _value_node(root: UOp) -> UOp | None:
  """What a realized node's kernel computes (None: no kernel, e.g. a copy)."""
  if root.op in (Ops.COPY, Ops.AFTER): return None
  if root.op is Ops.CONTIGUOUS: return root.src[0]
  if root.op is Ops.ASSIGN: return root.src[1]
  return root


_EPILOGUE = GroupOp.ALU | {Ops.CAST}


def _epilogue_owns(top: UOp, red: UOp, children: dict[UOp, list[UOp]], pos: dict[UOp, int]) -> bool:
  """Whether every value between reduction `red` and `top` (red included) is used only inside `top`'s expression,
  so realizing `top` instead of `red` makes no other kernel recompute the reduction (or realize it as well)."""
  # which nodes under `top` reach `red` (the first source that does decides). Only a node after `red` in the toposort
  # (`pos`) can have it below, so the walk stays in the layer at hand instead of descending through every earlier
  # layer of a deep model (that made scheduling quadratic in depth); iterative, so depth hits no recursion limit
  lo = pos[red]
  reach: dict[UOp, bool] = {}
  stack: list[tuple[UOp, int]] = [(top, 0)]
  while stack:
    u, i = stack.pop()
    if i == 0:
      if u in reach: continue
      if u is red or _is_buffer_form(u) or pos[u] <= lo:
        reach[u] = u is red
        continue
    elif reach[u.src[i - 1]]:
      reach[u] = True
      continue
    if i == len(u.src): reach[u] = False
    else: stack += [(u, i + 1), (u.src[i], 0)]
  inside = {u for u, r in reach.items() if r}
  return all(c in inside for u in inside if u is not top for c in children.get(u, ()))


def _find_realized(sink: UOp) -> dict[UOp, None]:
  topo = sink.toposort
  realize: dict[UOp, None] = {}
  for t in sink.src:
    if not _is_buffer_form(t): realize[t] = None
  for u in topo:
    if u.op in (Ops.COPY, Ops.ASSIGN): realize[u] = None
    if u.op is Ops.COPY and not _is_buffer_form(u.src[0]): realize[u.src[0]] = None
    if u.op is Ops.CONTIGUOUS and not _is_buffer_form(u.src[0]): realize[u] = None
    if u.op is Ops.SCATTER:  # its own kernels; a reduction feeding the serial write loop is computed first
      realize[u] = None
      for s in u.src[1:]:
        if not _is_buffer_form(s) and any(x.op is Ops.REDUCE_AXIS for x in s.toposort): realize[s] = None
    if u.op is Ops.ASSIGN and not _is_buffer_form(u.src[0]) and not _is_writable_view(u.src[0]):
      raise ScheduleError(f"ASSIGN target must be a realized buffer or a reshape/shrink/permute/flip view of one (realize it first), "
                          f"got a {u.src[0].op.name} of shape {u.src[0].shape}")
    if u.op is Ops.KERNEL:  # a precompiled kernel takes its buffers as they are: lazy or strided inputs get their own
      for s in u.src:
        if s.op is not Ops.BIND and not _is_buffer_form(s): realize[s] = None
    if u.op is Ops.AFTER:
      if not _is_buffer_form(u.src[0]): raise ScheduleError(f"a kernel writes a {u.src[0].op.name}, not a realized buffer")
      realize[u] = None
  fuse_rows = _fuse_rows(sink)
  if RECOMPUTE_MAX: realize.update(dict.fromkeys(_broadcast_operands(topo, realize, fuse_rows)))
  children: dict[UOp, list[UOp]] = {}
  for u in topo:
    for s in u.src: children.setdefault(s, []).append(u)
  pos = {u: i for i, u in enumerate(topo)}
  while True:  # grow the set until no kernel would recompute or broadcast a reduction
    users: dict[UOp, set[UOp]] = {}
    grow: list[UOp] = []
    for root in realize:
      if (v := _value_node(root)) is None: continue
      # `top`: under a broadcast, the highest node whose value is the reduction below it passed through elementwise
      # ops and reshapes only. Realizing it (not the bare reduction) ends the epilogue (bias, ReLU) in the reduction's
      # kernel, so the broadcasting consumer (the next matmul) reads a plain buffer instead of recomputing it per use.
      # `row`: u's axes are loops nested in axis order (the kernel's output loops, then a trailing reduction's loops),
      # so a row statistic broadcast over its trailing axes (_row_stat) is computed once per row in this kernel
      seen: set[tuple[UOp, bool, UOp | None, bool]] = set()
      stack: list[tuple[UOp, bool, UOp | None, bool]] = [(v, False, None, fuse_rows)]
      while stack:
        u, spread, top, row = stack.pop()
        if (u, spread, top, row) in seen or _is_buffer_form(u) or (u in realize and u is not root and u is not v): continue
        seen.add((u, spread, top, row))
        if u.op is Ops.REDUCE_AXIS:
          if spread:
            grow.append(top if top is not None and _epilogue_owns(top, u, children, pos) else _owned_top(u, children, realize))
            continue
          users.setdefault(u, set()).add(root)
          stack.append((u.src[0], True, None, row and _trailing(_shape(u.src[0]), u.arg[1])))
          continue
        if row and u.op is Ops.EXPAND and _row_stat(u):
          stack.append((u.src[0], False, None, True))
          continue
        row = row and u.op in _EPILOGUE | {Ops.DETACH}
        if not spread or u is v or (u.op not in _EPILOGUE and u.op is not Ops.RESHAPE): top = None
        elif top is None and u.op in _EPILOGUE: top = u
        # a gathered table is read at data-dependent rows, many times over: like a broadcast. So is a padded value: the
        # pad's gate selects the result, the reduction's loop still runs for every padded element (chunk(3)'s backward
        # adds three padded attention gradients: fused, each reduction ran over all 2304 columns, 3x the work)
        for i, s in enumerate(u.src):
          stack.append((s, spread or u.op in (Ops.EXPAND, Ops.PAD) or (u.op is Ops.GATHER and i == 0), top, row))
    grow += [_owned_top(r, children, realize) for r, roots in users.items() if len(roots) > 1]
    grow += _sibling_reductions(users, children, realize)
    if not (new := [g for g in grow if g not in realize]): return realize
    for g in new: realize[g] = None


SIBLING_MIN_WORK = 1 << 16  # a sibling reduction that reads fewer elements stays fused (a kernel launch costs more)


def _sibling_reductions(users: dict[UOp, set[UOp]], children: dict[UOp, list[UOp]], realize: dict[UOp, None]) -> list[UOp]:
  """Reductions that would share a kernel with a larger one over other loops (a ResNet block's 3x3 conv and its 1x1
  downsample conv added before the ReLU): one kernel holds two reduction nests the optimizer cannot tile together (it
  ran at 15 GFLOPS, 50x slower than the two apart), so all but the largest get their own kernel and the largest's
  epilogue reads them. Reductions over the same loops (a mean and a mean of squares) stay together."""
  per_root: dict[UOp, list[UOp]] = {}
  for r, roots in users.items():
    if len(roots) == 1: per_root.setdefault(next(iter(roots)), []).append(r)
  out: list[UOp] = []
  for reds in per_root.values():
    if len(reds) < 2 or not all(all(isinstance(d, int) for d in _shape(r.src[0])) for r in reds): continue
    nests = {(_shape(r.src[0]), r.arg[1]) for r in reds}
    if len(nests) < 2: continue
    def work(r: UOp) -> int: return prod(_shape(r.src[0]))  # type: ignore[arg-type]
    biggest = max(reds, key=work)
    big_nest = (_shape(biggest.src[0]), biggest.arg[1])
    out += [_own_epilogue(r, children, realize) for r in reds if (_shape(r.src[0]), r.arg[1]) != big_nest and work(r) >= SIBLING_MIN_WORK]
  return out


def _own_epilogue(red: UOp, children: dict[UOp, list[UOp]], realize: dict[UOp, None]) -> UOp:
  """`red` and the elementwise ops after it that combine it with no other reduction (a bias, a folded BatchNorm)."""
  top = last = red
  while len(ch := children.get(top, [])) == 1 and (c := ch[0]).op in _EPILOGUE | {Ops.RESHAPE} and c not in realize and \
      not any(x is not top and any(y.op is Ops.REDUCE_AXIS for y in x.toposort) for x in c.src):
    top = c
    if c.op is not Ops.RESHAPE: last = c
  return last


ROW_FUSE = ContextVar("ROW_FUSE", 1, (0, 1, 2))  # row statistics fused into their consumer: 0 never, 1 on devices without workgroups, 2 always


def _fuse_rows(sink: UOp) -> bool:
  """Whether this graph's kernels compute row statistics (softmax's max and sum, layernorm's mean and variance) inside the
  kernel that broadcasts them. A CPU thread loops over whole rows, so a row is read from memory once and its later
  passes hit the cache; a GPU thread per output element would recompute its row's statistics (ROW_FUSE=2 forces it)."""
  if ROW_FUSE.value != 1: return ROW_FUSE.value >= 2
  devs = {d for t in sink.src if isinstance(d := t.tensor_device, str)}
  from plugrad.device.registry import Device
  try: return bool(devs) and not any(Device[d].renderer.has_local for d in devs)
  except Exception: return False  # a device that cannot load here: its kernels keep the statistics apart


def _trailing(shape: tuple[sint, ...], axes: tuple[int, ...]) -> bool:
  """Whether `axes` are the last axes of `shape` that are not 1 (their loops are the innermost ones)."""
  return bool(axes) and all(a in axes or shape[a] == 1 for a in range(min(axes), len(shape)))


def _row_stat(e: UOp) -> bool:
  """Whether EXPAND `e` broadcasts a row statistic back over the rows it reduced: below it, elementwise ops over
  constants and reductions of a source shaped like `e` over exactly the expanded axes, which are `e`'s trailing ones.
  Its value depends on the leading axes only, which a kernel over `e`'s shape loops over outside the broadcast ones."""
  shape, sshape = _shape(e), _shape(e.src[0])
  axes = tuple(a for a, (s, d) in enumerate(zip(sshape, shape)) if s != d)
  if not _trailing(shape, axes): return False
  found, stack, seen = False, [e.src[0]], set()
  while stack:
    if (u := stack.pop()) in seen: continue
    seen.add(u)
    if u.op is Ops.REDUCE_AXIS:
      if set(u.arg[1]) != set(axes) or _shape(u.src[0]) != shape: return False
      found = True
    elif u.op in _EPILOGUE or u.op is Ops.DETACH: stack.extend(u.src)
    elif not (u.op in (Ops.CONST, Ops.EXPAND, Ops.RESHAPE) and all(x.op in (Ops.CONST, Ops.EXPAND, Ops.RESHAPE, Ops.DEVICE) for x in u.toposort)):
      return False
  return found


# broadcast factor up to which a reduction recomputes its elementwise operand in place (about one vector's lanes: a
# register tile reads each operand value once per vector of columns); 0 turns the rule off
def _owned_top(red: UOp, children: dict[UOp, list[UOp]], realize: dict[UOp, None]) -> UOp:
  """What to realize for reduction `red` that several kernels read: the end of the elementwise chain that is its only
  user (attention's scale, mask and cast after q.k), so that the chain runs once, in the reduction's kernel, instead
  of in a kernel of its own or in every reader."""
  top = last = red
  while len(ch := children.get(top, [])) == 1 and (c := ch[0]).op in _EPILOGUE | {Ops.RESHAPE} and c not in realize:
    top = c
    if c.op is not Ops.RESHAPE: last = c
  return last


RECOMPUTE_MAX = ContextVar("RECOMPUTE_MAX", 16, minimum=0)


def _alu_count(u: UOp, realize: dict[UOp, None], limit: int) -> int:
  """ALU ops in `u`'s elementwise expression (down to buffers, realized nodes and reductions), counted up to `limit`."""
  n, seen, stack = 0, set(), [u]
  while stack and n < limit:
    if (x := stack.pop()) in seen or _is_buffer_form(x) or (x in realize and x is not u) or x.op is Ops.REDUCE_AXIS: continue
    seen.add(x)
    n += x.op in GroupOp.ALU
    stack.extend(x.src)
  return n


def _broadcast_operands(topo: dict[UOp, None], realize: dict[UOp, None], fuse_rows: bool) -> list[UOp]:
  """Elementwise work under an EXPAND inside a reduction's source, broadcast more than RECOMPUTE_MAX times: fused, the
  reduction would compute it once per element of the broadcast (a projection fed by layernorm or GELU, issue 20: the
  normalization redone for every output column tile), so it gets its own kernel and the reduction reads a buffer.
  Not a row statistic's epilogue when rows fuse (layernorm's backward: 1/sqrt(var + eps) in a row sum): it runs once per
  row where the row loop hoists it, and where it cannot, _find_realized realizes it with its reduction."""
  out: dict[UOp, None] = {}
  seen: set[UOp] = set()
  for r in topo:
    if r.op is not Ops.REDUCE_AXIS: continue
    stack = [r.src[0]]
    while stack:
      if (u := stack.pop()) in seen or _is_buffer_form(u) or u in realize or u.op is Ops.REDUCE_AXIS: continue
      seen.add(u)
      if fuse_rows and u.op is Ops.EXPAND and _row_stat(u): continue
      if u.op is Ops.EXPAND and (base := u.src[0]).shape is not None and all(isinstance(d, int) for d in (*_shape(u), *base.shape)):
        while base.op in GroupOp.Movement and not _is_buffer_form(base): base = base.src[0]
        if prod(_shape(u)) > RECOMPUTE_MAX.value * prod(_shape(u.src[0])) and base.op in GroupOp.ALU and _alu_count(base, realize, 2) >= 2:
          out[base] = None
          continue
      stack.extend(u.src)
  return list(out)


class _Kernel:
  """Builds one kernel AST by pushing index expressions from the output down to the loads."""

  def __init__(self, realized: dict[UOp, UOp]):
    self.realized = realized
    self.globals: dict[UOp, UOp] = {}
    self.ranges = itertools.count()
    self.var_vals: dict[str, int] = {}
    self.has_reduce = False
    self.leaf_reads: set[UOp] = set()
    self.memo: dict[tuple[UOp, tuple[UOp, ...], UOp | None], UOp] = {}

  def glob(self, buf: UOp) -> UOp:
    if (g := self.globals.get(buf)) is None:
      g = self.globals[buf] = UOp(Ops.DEFINE_GLOBAL, buf.dtype.ptr(buf.arg), (), len(self.globals))
    return g

  def load(self, buf: UOp, shape: tuple[sint, ...], idxs: tuple[UOp, ...], valid: UOp | None) -> UOp:
    flat = sum((i * s for i, s in zip(idxs, _strides(shape))), UOp.const(dtypes.index, 0))
    g = self.glob(buf)
    return UOp(Ops.LOAD, buf.dtype, (UOp(Ops.INDEX, g.dtype, (g, flat) if valid is None else (g, flat, valid)),))

  def data_index(self, ix: UOp, idxs: tuple[UOp, ...], valid: UOp | None, n: sint) -> tuple[UOp, UOp]:
    """The index tensor `ix`'s value at `idxs` as an index clamped to [0, n), and the gate that it lies there. The clamp
    changes nothing where the gate holds; it keeps every address in bounds and the index arithmetic's bounds those of
    the table (so it stays 32-bit) rather than those of the index dtype."""
    i = self.value(ix, idxs, valid).cast(dtypes.index)
    return i.maximum(0).minimum(n - 1), (i < 0).logical_not() & (i < n)

  def value(self, u: UOp, idxs: tuple[UOp, ...], valid: UOp | None) -> UOp:
    """The value of tensor-graph node `u` at index `idxs` (one index expression per axis), loads gated by `valid`."""
    if (ret := self.memo.get(key := (u, idxs, valid))) is None: ret = self.memo[key] = self._value(u, idxs, valid)
    return ret

  def _value(self, u: UOp, idxs: tuple[UOp, ...], valid: UOp | None) -> UOp:
    op = u.op
    if u in self.realized: return self.load(_buffer_uop(self.realized[u]), _shape(u), idxs, valid)
    if op is Ops.BUFFER:
      self.leaf_reads.add(u)
      return self.load(u, _shape(u), idxs, valid)
    if op is Ops.CONST: return UOp.const(u.dtype, u.arg)
    if op is Ops.IOTA: return idxs[0].cast(u.dtype)
    if op is Ops.BIND:
      var, val = u.unbind()
      self.var_vals[var.arg[0]] = val
      return var if var.dtype is u.dtype else var.cast(u.dtype)
    if op is Ops.DEFINE_VAR: return u
    if op in (Ops.CONTIGUOUS, Ops.DETACH): return self.value(u.src[0], idxs, valid)
    src = u.src[0] if u.src else None
    if op is Ops.RESHAPE:
      assert src is not None
      if (mapped := _symbolic_reshape(_shape(u), _shape(src), idxs)) is not None: return self.value(src, mapped, valid)
      flat = sum((i * s for i, s in zip(idxs, _strides(_shape(u)))), UOp.const(dtypes.index, 0))
      sshape = _shape(src)
      new = tuple(UOp.const(dtypes.index, 0) if d == 1 else (flat // st) % d if j else flat // st
                  for j, (d, st) in enumerate(zip(sshape, _strides(sshape))))
      return self.value(src, tuple(x.simplify() for x in new), valid)
    if op is Ops.PERMUTE:
      assert src is not None
      inv = [0] * len(u.arg)
      for i, p in enumerate(u.arg): inv[p] = i
      return self.value(src, tuple(idxs[inv[j]] for j in range(len(u.arg))), valid)
    if op is Ops.EXPAND:
      assert src is not None
      return self.value(src, tuple(UOp.const(dtypes.index, 0) if s == 1 and d != 1 else i for i, s, d in zip(idxs, _shape(src), _shape(u))), valid)
    if op is Ops.SHRINK:
      assert src is not None
      return self.value(src, tuple(i + b if not (isinstance(b, int) and b == 0) else i for i, (b, _) in zip(idxs, u.arg)), valid)
    if op is Ops.FLIP:
      assert src is not None
      return self.value(src, tuple((d - 1 - i) if f else i for i, f, d in zip(idxs, u.arg, _shape(src))), valid)
    if op is Ops.PAD:
      assert src is not None
      conds = [((i >= b) & (i < b + d)) if not (isinstance(b, int) and b == 0 and isinstance(a, int) and a == 0) else None
               for i, (b, a), d in zip(idxs, u.arg, _shape(src))]
      ok = functools.reduce(lambda x, y: x & y, [c for c in conds if c is not None]).simplify()
      inner = self.value(src, tuple((i - b) if c is not None else i for i, (b, _), c in zip(idxs, u.arg, conds)), ok if valid is None else valid & ok)
      return ok.where(inner, inner.const_like(0))
    if op is Ops.REDUCE_AXIS:
      assert src is not None
      self.has_reduce = True
      rop, axes = u.arg
      if any(isinstance(_shape(src)[a], int) and _shape(src)[a] == 0 for a in axes): return UOp.const(u.dtype, _identity(rop, u.dtype))
      rngs = {a: UOp.range(_shape(src)[a], next(self.ranges), AxisType.REDUCE) for a in axes if _shape(src)[a] != 1}
      inner = self.value(src, tuple(rngs.get(a, UOp.const(dtypes.index, 0)) if a in axes else i for a, i in enumerate(idxs)), valid)
      return UOp(Ops.REDUCE, u.dtype, (inner, *rngs.values()), rop) if rngs else inner
    if op in GroupOp.ALU or op in (Ops.CAST, Ops.BITCAST):
      return UOp(op, u.dtype, tuple(self.value(s, idxs, valid) for s in u.src), u.arg)
    if op is Ops.GATHER:
      # an indexed load: the index tensor's value (loaded in this kernel) replaces the index along the axis, and a
      # bounds gate makes an out-of-range row read nothing (0)
      x, ix = u.src
      row, ok = self.data_index(ix, idxs, valid, _shape(x)[u.arg])
      inner = self.value(x, idxs[:u.arg] + (row,) + idxs[u.arg + 1:], ok if valid is None else valid & ok)
      return ok.where(inner, inner.const_like(0))
    raise ScheduleError(f"cannot put a {op.name} into a kernel (shape {u.shape})")


def _same_dim(a: sint, b: sint) -> bool:
  if isinstance(a, int) and isinstance(b, int): return a == b
  return isinstance(a, UOp) and isinstance(b, UOp) and (a is b or a.simplify() is b.simplify())


def _symbolic_reshape(shape: tuple[sint, ...], sshape: tuple[sint, ...], idxs: tuple[UOp, ...]) -> tuple[UOp, ...] | None:
  """The source indices of a reshape with a symbolic size (None for concrete reshapes, which keep the flat form): the
  dims both shapes share as a leading and a trailing run (unit dims aside) pass their index through; only the dims
  between are flattened and split. Flattening a dim of symbolic size leaves a division and modulo by a Variable that
  the simplifier cannot undo (attention over n cached keys read its keys at (i*n + j) // n % 4 ...)."""
  if all(isinstance(d, int) for d in (*shape, *sshape)): return None
  out = [i for i, d in enumerate(shape) if not (isinstance(d, int) and d == 1)]
  src = [i for i, d in enumerate(sshape) if not (isinstance(d, int) and d == 1)]
  k = 0
  while k < min(len(out), len(src)) and _same_dim(shape[out[k]], sshape[src[k]]): k += 1
  m = 0
  while m < min(len(out), len(src)) - k and _same_dim(shape[out[-1 - m]], sshape[src[-1 - m]]): m += 1
  zero = UOp.const(dtypes.index, 0)
  new: list[UOp] = [zero] * len(sshape)
  for a, b in zip(out[:k] + out[len(out) - m:], src[:k] + src[len(src) - m:]): new[b] = idxs[a]
  mid_out, mid_src = out[k:len(out) - m], src[k:len(src) - m]
  if mid_src:
    if any(not isinstance(d, int) for d in (*(shape[i] for i in mid_out), *(sshape[i] for i in mid_src))): return None  # flatten it all
    flat = sum((idxs[i] * st for i, st in zip(mid_out, _strides(tuple(shape[i] for i in mid_out)))), zero)
    for j, (i, st) in enumerate(zip(mid_src, _strides(tuple(sshape[i] for i in mid_src)))):
      new[i] = ((flat // st) % sshape[i] if j else flat // st).simplify()
  return tuple(new)


def _kernel_name(shape: tuple[sint, ...], has_reduce: bool) -> str:
  dims = "_".join(str(d) if isinstance(d, int) else d.render() for d in shape) or "1"
  return f"{'r' if has_reduce else 'E'}_{''.join(c if c.isalnum() else '_' for c in dims)}"


def _build_kernel(root: UOp, out: UOp, realized: dict[UOp, UOp]) -> tuple[UOp, tuple[UOp, ...], dict[str, int], frozenset[UOp]]:
  k = _Kernel(realized)
  value = _value_node(root)
  assert value is not None
  shape = _shape(root)
  out_g = k.glob(out)
  ranges = [UOp.range(d, next(k.ranges), AxisType.LOOP) if d != 1 else None for d in shape]
  idxs = tuple(r if r is not None else UOp.const(dtypes.index, 0) for r in ranges)
  with recursion_limit(20000): val = k.value(value, idxs, None)
  if val.dtype is not out.dtype: val = val.cast(out.dtype)
  if root.op is Ops.ASSIGN and not _is_buffer_form(root.src[0]):
    # into a view: the address is the view's index arithmetic, the one a load of the view at these indices would use
    target = k.value(root.src[0], idxs, None)
    if target.op is not Ops.LOAD or target.src[0].src[0] is not out_g: raise ScheduleError(f"cannot store through the view {root.src[0].op.name}")
    store = UOp(Ops.STORE, dtypes.void, (target.src[0], val))
  else:
    flat = sum((i * s for i, s in zip(idxs, _strides(shape))), UOp.const(dtypes.index, 0))
    store = UOp(Ops.STORE, dtypes.void, (UOp(Ops.INDEX, out_g.dtype, (out_g, flat)), val))
  live = [r for r in ranges if r is not None]
  store, live = _merge_loops(store, live)
  name = _kernel_name(tuple(r.src[0].arg for r in live) if len(live) < len([d for d in shape if d != 1]) else shape, k.has_reduce)
  ast = UOp(Ops.SINK, dtypes.void, (UOp(Ops.END, dtypes.void, (store, *live)) if live else store,), KernelInfo(name))
  if binds := [u for u in ast.toposort if u.op is Ops.BIND]:  # bound sizes (from shapes): the kernel takes the variable, the item its value
    for b in binds:
      bvar, bval = b.unbind()
      k.var_vals[bvar.arg[0]] = bval
    ast = ast.substitute({b: b.src[0] for b in binds})
  return _finish(ast.simplify("index simplification"), k, out)


def _merge_loops(store: UOp, loops: list[UOp]) -> tuple[UOp, list[UOp]]:
  """A kernel's adjacent loops as one wherever nothing tells them apart: every address, iota and random counter of the
  kernel is linear in `outer * inner_size + inner` (a contiguous (512, 512, 3, 3) weight is one loop of 2,359,296,
  which vectorizes; as four its innermost 3 did not). Output loops and each reduction's own ranges (BatchNorm's 8x8
  pixels: one reduce loop of 64), innermost pairs first, by substituting `m // inner_size, m % inner_size` and
  simplifying: a pair whose indexing keeps a division or modulo of `m` (a broadcast, a transpose, a pad's gate, a
  strided window: the stem's weight gradient reads the image at 2*ow + kw) stays apart."""
  i = len(loops) - 1
  while i > 0:
    if (res := _merged(store, loops[i - 1], loops[i])) is not None: store, loops = res[0], [*loops[:i - 1], res[1], *loops[i + 1:]]
    i -= 1
  done: set[UOp] = set()
  while (red := next((u for u in store.toposort if u.op is Ops.REDUCE and len(u.src) > 2 and u not in done), None)) is not None:
    for j in range(len(red.src) - 1, 1, -1):
      if (res := _merged(store, red.src[j - 1], red.src[j], red)) is not None:
        store = res[0]
        break
    else: done.add(red)
  return store, loops


def _merged(store: UOp, a: UOp, b: UOp, red: UOp | None = None) -> tuple[UOp, UOp] | None:
  """(the kernel with ranges a, b (a outer) as one range m, m), or None where an index would divide m; `red`: the
  reduction whose ranges they are (its range list gets m in their place)."""
  if a.src[0].op is not Ops.CONST or b.src[0].op is not Ops.CONST: return None
  inner = b.src[0].arg
  m = UOp.range(a.src[0].arg * inner, a.arg[0], a.arg[1])
  sub = {a: m // inner, b: m % inner}
  if red is not None: sub = {red: red.replace(src=(red.src[0].substitute(sub), *(m if r is a else r for r in red.src[1:] if r is not b)))}
  merged = store.substitute(sub).simplify("merge loops")
  dep = {m}
  for u in merged.toposort:
    if u is not m and u.op is not Ops.REDUCE and any(x in dep for x in u.src):
      if u.op in (Ops.IDIV, Ops.MOD): return None
      dep.add(u)
  return merged, m


def _finish(ast: UOp, k: _Kernel, out: UOp) -> tuple[UOp, tuple[UOp, ...], dict[str, int], frozenset[UOp]]:
  """The kernel's AST, buffers (slot order), variables and leaf reads, taken from the simplified AST: simplification
  drops loads that cannot be reached (a PAD's gate that is always false, `x ^ x`, a one-element sort's compares), and a
  buffer the kernel no longer reads must not be passed to it. The slots left are renumbered densely, the output first."""
  live = {u.arg for u in ast.toposort if u.op is Ops.DEFINE_GLOBAL}
  kept = [(b, g) for b, g in k.globals.items() if g.arg in live]
  if len(kept) < len(k.globals):
    ast = ast.substitute({g: g.replace(arg=i) for i, (_, g) in enumerate(kept) if g.arg != i})
  bufs = tuple(b for b, _ in kept)
  maybe_check("kernel", ast)
  return ast, bufs, k.var_vals, frozenset(k.leaf_reads.intersection(bufs) - {out})


_SCATTER_COMBINE = {"add": lambda a, b: a + b, "mul": lambda a, b: a * b, "max": lambda a, b: a.maximum(b),
                    "min": lambda a, b: -((-a).maximum(-b)) if dtypes.is_float(a.dtype) else (b < a).where(b, a)}  # NaN wins, as in max


# scatter-adds as one parallel loop of atomic adds: 0 never, 1 on devices with workgroups, 2 wherever the renderer has them
SCATTER_ATOMIC = ContextVar("SCATTER_ATOMIC", 1, (0, 1, 2))


def _atomic_scatter(u: UOp, device: str) -> bool:
  """Whether scatter-add `u` is one parallel loop of atomic adds rather than the serial form (`_build_scatter`): where
  the device's renderer adds its dtype atomically (`Renderer.atomic_add`), by default on devices with workgroups only.
  A GPU wants a thread per position, and the serial form's only parallelism is the positions outside the indexed axis.
  A CPU's threads are few and already busy with those positions, and their atomic adds contend for cache lines: on 2
  threads (bench/gather.py), 4M adds into 1000 floats took 86 ms atomically and 2.4 ms serially, an embedding's
  gradient (4096 ids, 384 features) 5.9 ms against 4.7 ms."""
  if SCATTER_ATOMIC.value == 0 or u.arg[1] != "add": return False
  from plugrad.device.registry import Device
  try: r = Device[device].renderer
  except Exception: return False  # a device that cannot load here never runs the kernel
  return u.dtype in r.atomic_add and (r.has_local or SCATTER_ATOMIC.value == 2)


def _build_scatter(u: UOp, out: UOp, realized: dict[UOp, UOp], atomic: bool) -> tuple[UOp, tuple[UOp, ...], dict[str, int], frozenset[UOp]]:
  """The write kernel of SCATTER(base, idx, src) into `out` (which already holds base): a loop over idx's positions
  storing src at the row idx names, combined with what is there. Positions that differ outside the axis write disjoint
  elements, so those loops are parallel; the loop along the axis runs in order in one thread (a REDUCE-typed range,
  which no device parallelizes or vectorizes), which makes repeated rows read-modify-write safely without atomics
  and gives `set` the last write. `atomic` (an add only): every loop is parallel and each position adds its value with
  an atomic STORE (arg Ops.ADD). Out-of-range rows are skipped (the store's gate)."""
  _, ix, src = u.src
  axis, how = u.arg
  k = _Kernel(realized)
  out_g = k.glob(out)
  shape = _shape(ix)
  serial_type = AxisType.LOOP if atomic else AxisType.REDUCE
  ranges = [UOp.range(d, next(k.ranges), serial_type if a == axis else AxisType.LOOP) if d != 1 else None for a, d in enumerate(shape)]
  idxs = tuple(r if r is not None else UOp.const(dtypes.index, 0) for r in ranges)
  with recursion_limit(20000):
    i, ok = k.data_index(ix, idxs, None, _shape(u)[axis])
    val = k.value(src, idxs, None)
  if val.dtype is not out.dtype: val = val.cast(out.dtype)
  flat = sum((x * s for x, s in zip(idxs[:axis] + (i,) + idxs[axis + 1:], _strides(_shape(u)))), UOp.const(dtypes.index, 0))
  at = UOp(Ops.INDEX, out_g.dtype, (out_g, flat, ok))
  if atomic: body = UOp(Ops.STORE, dtypes.void, (at, val), Ops.ADD)
  else: body = UOp(Ops.STORE, dtypes.void, (at, _SCATTER_COMBINE[how](UOp(Ops.LOAD, out.dtype, (at,)), val) if how != "set" else val))
  if not atomic and (serial := ranges[axis]) is not None: body = UOp(Ops.END, dtypes.void, (body, serial))  # innermost
  if par := [r for a, r in enumerate(ranges) if r is not None and (atomic or a != axis)]: body = UOp(Ops.END, dtypes.void, (body, *par))
  name = "scatter_" + _kernel_name(shape, False)[2:]
  ast = UOp(Ops.SINK, dtypes.void, (body,), KernelInfo(name, opts_to_apply=()))
  return _finish(ast.simplify("index simplification"), k, out)


def _aliased_reads(ast: UOp, out_slot: int = 0) -> bool:
  """Does the kernel read its output buffer at an index other than the one it writes (then it must not run in place)?"""
  stores = [u for u in ast.toposort if u.op is Ops.STORE]
  written = {s.src[0].src[1] for s in stores}
  return any(u.op is Ops.INDEX and u.src[0].op is Ops.DEFINE_GLOBAL and u.src[0].arg == out_slot and u.src[1] not in written
             and u not in {s.src[0] for s in stores} for u in ast.toposort)


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
  todo = list(dict.fromkeys(p for v in lowered for p in pieces(v) if not _is_buffer_form(p)))
  if left := next((u for p in todo for u in p.toposort if u.op is Ops.MULTI or (u.op is Ops.DEVICE and isinstance(u.arg, tuple))), None):
    raise ScheduleError(f"a multi-device value was left after lowering it to single-device graphs: {left.op.name} {left.arg!r:.80}")
  items, becomes = create_schedule(*todo) if todo else ([], {})
  items = _order(items, by_device=True)
  def result(v: UOp) -> UOp | None:
    got = [r for p in pieces(v) if (r := becomes.get(p, p if _is_buffer_form(p) else None)) is not None]
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


SPLIT_REDUCE = ContextVar("SPLIT_REDUCE", 1, (0, 1))
SPLIT_MIN_REDUCE = 4096   # elements reduced per output before a reduction is split (shorter ones are not worth a kernel)
SPLIT_MAX_OUTPUTS = 1024  # outputs below which a long reduction is split (more outputs already give every thread rows)
SPLIT_WAYS = (32, 16, 8)  # partial results per output, largest first (the first stage's parallel loop)


def _split_plan(u: UOp) -> tuple[int, int] | None:
  """(axis, ways) to split REDUCE_AXIS `u` at, or None. Decided from sizes only, in two cases:
  * few outputs: at least SPLIT_MIN_REDUCE elements reduced into fewer than SPLIT_MAX_OUTPUTS outputs, split along the
    outermost reduced axis that one of SPLIT_WAYS divides (its chunks are contiguous slabs of the source), by the
    largest such way count: the partials kernel gets a parallel outer loop;
  * a long reduction over reused operands (_reuses_operands: a matmul or convolution with K >= 2*SPLIT_CHUNK): cut
    into chunks of about SPLIT_CHUNK along its outermost reduced axis, so that the operand panel a register tile
    streams while it accumulates stays in cache for the next tile (the GPT LM head's input gradient, K=50257: 2.3 s
    unsplit, 0.23 s in 13 chunks; a length no way count near that divides leaves a rest, see _split_reduce)."""
  src_shape, out_shape = u.src[0].shape, u.shape
  if src_shape is None or out_shape is None or not all(isinstance(d, int) for d in (*src_shape, *out_shape)): return None
  rop, axes = u.arg
  reduced, outs = prod(src_shape[a] for a in axes), prod(out_shape)
  if reduced >= SPLIT_MIN_REDUCE and outs < SPLIT_MAX_OUTPUTS:
    for a in axes:
      if (ways := next((s for s in SPLIT_WAYS if src_shape[a] % s == 0 and src_shape[a] > s), None)) is not None: return a, ways
    return None
  if reduced < 2 * SPLIT_CHUNK or not _reuses_operands(u): return None
  a = next(a for a in sorted(axes) if src_shape[a] > 1)
  d = src_shape[a]
  want = min(-(-reduced // SPLIT_CHUNK), d, SPLIT_PARTIALS_MAX // (outs * u.dtype.itemsize))
  if want < 2: return None
  return a, next((w for w in range(want, min(2 * want, d - 1) + 1) if d % w == 0), want)


SPLIT_CHUNK = 4096  # elements per partial when a long reduction over reused operands is cut into chunks
SPLIT_PARTIALS_MAX = 1 << 26  # bytes of partial results such a cut may write


def _reuses_operands(u: UOp) -> bool:
  """Whether REDUCE_AXIS `u`'s elementwise source broadcasts a value along an axis the reduction keeps (a matmul's
  operands, a convolution's weights): each such element is read by many outputs, so a kernel tiles the outputs and
  re-reads an operand panel as long as the reduction for every tile. Broadcasts reached through movement ops or over
  constants are not looked into."""
  shape, axes = _shape(u.src[0]), set(u.arg[1])
  stack, seen = [u.src[0]], set()
  while stack:
    if (x := stack.pop()) in seen: continue
    seen.add(x)
    if x.op is Ops.EXPAND and x.shape == shape and (base := x.src[0]).shape is not None and base.op is not Ops.CONST:
      if any(s == 1 and d > 1 and i not in axes for i, (s, d) in enumerate(zip(base.shape, shape))) and \
         not all(y.op in (Ops.CONST, Ops.EXPAND, Ops.RESHAPE, Ops.DEVICE) for y in base.toposort): return True
    elif x.op in _EPILOGUE and x.shape == shape: stack.extend(x.src)
  return False


def _split_reduce(u: UOp, a: int, ways: int) -> UOp:
  """REDUCE_AXIS `u` as two reductions: axis `a` (size d) of the source reshaped to (ways, d/ways) and the ways moved
  outermost; the first reduces every original axis, leaving `ways` partials per output (shape (ways, *out)), and, being
  nested in the second reduction, is realized by _find_realized (its outer loop of `ways` iterations is the parallel
  one); the second reduces the partials. Both keep the reduction's op and dtype (the partials accumulate in it). When
  `ways` does not divide d, the chunks cover a prefix of the axis and the rest is reduced apart and combined by the op."""
  rop, axes = u.arg
  src = u.src[0]
  shape = src.shape
  assert shape is not None and u.shape is not None
  d = shape[a]
  assert isinstance(d, int)
  # chunks of equal length; when `ways` does not divide d, of whole vectors (16), and the rest reduced on its own and
  # combined in the final kernel (not padded: a padded axis would gate every multiply-add, the LM head's K=50257 took 2x the time)
  chunk = d // ways
  if d % ways and chunk >= 64: chunk -= chunk % 16
  whole = src if chunk * ways == d else src.shrink(tuple((0, chunk * ways) if i == a else (0, n) for i, n in enumerate(shape)))
  split = whole.reshape((*shape[:a], ways, chunk, *shape[a + 1:]))
  moved = split.permute((a, *(i for i in range(len(shape) + 1) if i != a)))
  # after the move every source axis b sits at b+1 (axis a's d/ways part included); the kernel merges the reduce loops
  # that read memory in one run (_merge_loops)
  partial = UOp(Ops.REDUCE_AXIS, u.dtype, (moved,), (rop, tuple(b + 1 for b in axes)))
  out = UOp(Ops.REDUCE_AXIS, u.dtype, (partial,), (rop, (0,))).reshape(u.shape)
  if chunk * ways == d: return out
  rest = src.shrink(tuple((chunk * ways, d) if i == a else (0, n) for i, n in enumerate(shape)))
  # in a kernel of its own: as a second reduction in the final kernel it would leave that kernel without its vector tile
  return out.alu(rop, UOp(Ops.CONTIGUOUS, u.dtype, (UOp(Ops.REDUCE_AXIS, u.dtype, (rest,), (rop, axes)),)))


def _split_reductions(sink: UOp) -> tuple[UOp, dict[UOp, UOp]]:
  """The sink with every long reduction into a small output split (see _split_plan), and each node's new form. The
  rewrite is a function of the graph alone, so a cached schedule of the same form has the same kernels."""
  new: dict[UOp, UOp] = {}
  for u in sink.toposort:
    src = tuple(new[s] for s in u.src)
    nu = u if src == u.src else u.replace(src=src)
    if nu.op is Ops.REDUCE_AXIS and (plan := _split_plan(nu)) is not None: nu = _split_reduce(nu, *plan)
    new[u] = nu
  return new[sink], new


def _create_schedule(sink: UOp) -> tuple[list[ScheduleItem], dict[UOp, UOp]]:
  maybe_check("tensor", sink)
  orig, renamed = sink, None
  if SPLIT_REDUCE:
    sink, renamed = _split_reductions(sink)
    if sink is orig: renamed = None
  realize = _find_realized(sink)
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
    if t.op is Ops.CONTIGUOUS and _is_buffer_form(t.src[0]): becomes[t] = t.src[0]
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
    items.append(ScheduleItem(u, (out, _buffer_uop(src)), u.src[1].arg))
    realized[u] = out.reshape(shape)
    return
  if u.op is Ops.SCATTER:  # base into a new buffer, then the write loop over it in place
    base = UOp(Ops.CONTIGUOUS, u.dtype, (u.src[0],))
    _schedule_one(base, realized, items)
    out = _buffer_uop(realized[base])
    realized[u] = realized[base]
    if any(isinstance(d, int) and d == 0 for d in (*shape, *_shape(u.src[1]))): return  # nothing is written
    ast, bufs, var_vals, old = _build_scatter(u, out, realized, _atomic_scatter(u, device))
    items.append(ScheduleItem(ast, bufs, device, var_vals, old, True))
    return
  size = prod(shape)
  out = _buffer_uop(u.src[0]) if u.op is Ops.ASSIGN else new_buffer(device, size if isinstance(size, int) else _max_size(size), u.dtype)
  # a symbolic size gets a buffer for its largest value, of which the result is the first `size` elements
  result = u.src[0] if u.op is Ops.ASSIGN else (out if isinstance(size, int) else out.shrink(((0, size),))).reshape(shape)
  if isinstance(size, int) and size == 0:  # nothing to compute
    realized[u] = result
    return
  ast, bufs, var_vals, old = _build_kernel(u, out, realized)
  if u.op is Ops.ASSIGN and _aliased_reads(ast):
    # the value reads the target at other positions: compute it into a temporary first, then copy it in
    tmp = UOp(Ops.CONTIGUOUS, u.dtype, (u.src[1],))
    _schedule_one(tmp, realized, items)
    ast, bufs, var_vals, old = _build_kernel(u.replace(src=(u.src[0], tmp)), out, realized)
  items.append(ScheduleItem(ast, bufs, device, var_vals, old, u.op is Ops.ASSIGN))
  realized[u] = result


def _schedule_program(k: UOp, realized: dict[UOp, UOp], items: list[ScheduleItem]) -> None:
  """KERNEL(*slot tensors, *BINDs, arg=PROGRAM): the given program over the slots' buffers, writing its outputs in place."""
  p = k.arg
  n = len(p.globals)
  bufs = tuple(_buffer_uop(realized.get(s, s)) for s in k.src[:n])
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
