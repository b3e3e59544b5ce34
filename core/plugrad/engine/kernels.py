"""Building a kernel AST: index expressions pushed down from a realized node's output through movement ops, reductions
and realized inputs (module docstring of schedule.py), and the kernels of scatters."""
from __future__ import annotations

import functools
import itertools

from plugrad.dtype import dtypes
from plugrad.engine.nodes import ScheduleError, buffer_uop, is_buffer_form, node_shape, strides_of, value_node
from plugrad.helpers import ContextVar, recursion_limit
from plugrad.uop.ops import AxisType, GroupOp, KernelInfo, Ops, UOp, reduce_identity, sint
from plugrad.uop.spec import maybe_check


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
    flat = sum((i * s for i, s in zip(idxs, strides_of(shape))), UOp.const(dtypes.index, 0))
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
    if u in self.realized: return self.load(buffer_uop(self.realized[u]), node_shape(u), idxs, valid)
    if op is Ops.BUFFER:
      self.leaf_reads.add(u)
      return self.load(u, node_shape(u), idxs, valid)
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
      if (mapped := _symbolic_reshape(node_shape(u), node_shape(src), idxs)) is not None: return self.value(src, mapped, valid)
      flat = sum((i * s for i, s in zip(idxs, strides_of(node_shape(u)))), UOp.const(dtypes.index, 0))
      sshape = node_shape(src)
      # the outermost dim of size > 1 takes no modulo: `flat` is in bounds wherever the load's gate holds. A `% 64`
      # there (batch 1's leading unit dim counted as the outermost) survived simplification behind a pad's gate and
      # cost a 3x3 convolution reading a max pool's output 2.2x its time
      first = next((j for j, d in enumerate(sshape) if d != 1), len(sshape))
      new = tuple(UOp.const(dtypes.index, 0) if d == 1 else (flat // st) % d if j > first else flat // st
                  for j, (d, st) in enumerate(zip(sshape, strides_of(sshape))))
      return self.value(src, tuple(x.simplify() for x in new), valid)
    if op is Ops.PERMUTE:
      assert src is not None
      inv = [0] * len(u.arg)
      for i, p in enumerate(u.arg): inv[p] = i
      return self.value(src, tuple(idxs[inv[j]] for j in range(len(u.arg))), valid)
    if op is Ops.EXPAND:
      assert src is not None
      zero = UOp.const(dtypes.index, 0)
      return self.value(src, tuple(zero if s == 1 and d != 1 else i for i, s, d in zip(idxs, node_shape(src), node_shape(u))), valid)
    if op is Ops.SHRINK:
      assert src is not None
      return self.value(src, tuple(i + b if not (isinstance(b, int) and b == 0) else i for i, (b, _) in zip(idxs, u.arg)), valid)
    if op is Ops.FLIP:
      assert src is not None
      return self.value(src, tuple((d - 1 - i) if f else i for i, f, d in zip(idxs, u.arg, node_shape(src))), valid)
    if op is Ops.PAD:
      assert src is not None
      conds = [((i >= b) & (i < b + d)) if not (isinstance(b, int) and b == 0 and isinstance(a, int) and a == 0) else None
               for i, (b, a), d in zip(idxs, u.arg, node_shape(src))]
      ok = functools.reduce(lambda x, y: x & y, [c for c in conds if c is not None]).simplify()
      inner = self.value(src, tuple((i - b) if c is not None else i for i, (b, _), c in zip(idxs, u.arg, conds)), ok if valid is None else valid & ok)
      return ok.where(inner, inner.const_like(0))
    if op is Ops.REDUCE_AXIS:
      assert src is not None
      self.has_reduce = True
      rop, axes = u.arg
      if any(isinstance(node_shape(src)[a], int) and node_shape(src)[a] == 0 for a in axes): return UOp.const(u.dtype, reduce_identity(rop, u.dtype))
      rngs = {a: UOp.range(node_shape(src)[a], next(self.ranges), AxisType.REDUCE) for a in axes if node_shape(src)[a] != 1}
      inner = self.value(src, tuple(rngs.get(a, UOp.const(dtypes.index, 0)) if a in axes else i for a, i in enumerate(idxs)), valid)
      return UOp(Ops.REDUCE, u.dtype, (inner, *rngs.values()), rop) if rngs else inner
    if op in GroupOp.ALU or op in (Ops.CAST, Ops.BITCAST):
      return UOp(op, u.dtype, tuple(self.value(s, idxs, valid) for s in u.src), u.arg)
    if op is Ops.GATHER:
      # an indexed load: the index tensor's value (loaded in this kernel) replaces the index along the axis, and a
      # bounds gate makes an out-of-range row read nothing (0)
      x, ix = u.src
      row, ok = self.data_index(ix, idxs, valid, node_shape(x)[u.arg])
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
    flat = sum((idxs[i] * st for i, st in zip(mid_out, strides_of(tuple(shape[i] for i in mid_out)))), zero)
    for j, (i, st) in enumerate(zip(mid_src, strides_of(tuple(sshape[i] for i in mid_src)))):
      new[i] = ((flat // st) % sshape[i] if j else flat // st).simplify()
  return tuple(new)


def _kernel_name(shape: tuple[sint, ...], has_reduce: bool) -> str:
  dims = "_".join(str(d) if isinstance(d, int) else d.render() for d in shape) or "1"
  return f"{'r' if has_reduce else 'E'}_{''.join(c if c.isalnum() else '_' for c in dims)}"


def build_kernel(root: UOp, out: UOp, realized: dict[UOp, UOp]) -> tuple[UOp, tuple[UOp, ...], dict[str, int], frozenset[UOp]]:
  k = _Kernel(realized)
  value = value_node(root)
  assert value is not None
  shape = node_shape(root)
  out_g = k.glob(out)
  ranges = [UOp.range(d, next(k.ranges), AxisType.LOOP) if d != 1 else None for d in shape]
  idxs = tuple(r if r is not None else UOp.const(dtypes.index, 0) for r in ranges)
  with recursion_limit(20000): val = k.value(value, idxs, None)
  if val.dtype is not out.dtype: val = val.cast(out.dtype)
  if root.op is Ops.ASSIGN and not is_buffer_form(root.src[0]):
    # into a view: the address is the view's index arithmetic, the one a load of the view at these indices would use
    target = k.value(root.src[0], idxs, None)
    if target.op is not Ops.LOAD or target.src[0].src[0] is not out_g: raise ScheduleError(f"cannot store through the view {root.src[0].op.name}")
    store = UOp(Ops.STORE, dtypes.void, (target.src[0], val))
  else:
    flat = sum((i * s for i, s in zip(idxs, strides_of(shape))), UOp.const(dtypes.index, 0))
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


def atomic_scatter(u: UOp, device: str) -> bool:
  """Whether scatter-add `u` is one parallel loop of atomic adds rather than the serial form (`build_scatter`): where
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


def build_scatter(u: UOp, out: UOp, realized: dict[UOp, UOp], atomic: bool) -> tuple[UOp, tuple[UOp, ...], dict[str, int], frozenset[UOp]]:
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
  shape = node_shape(ix)
  serial_type = AxisType.LOOP if atomic else AxisType.REDUCE
  ranges = [UOp.range(d, next(k.ranges), serial_type if a == axis else AxisType.LOOP) if d != 1 else None for a, d in enumerate(shape)]
  idxs = tuple(r if r is not None else UOp.const(dtypes.index, 0) for r in ranges)
  with recursion_limit(20000):
    i, ok = k.data_index(ix, idxs, None, node_shape(u)[axis])
    val = k.value(src, idxs, None)
  if val.dtype is not out.dtype: val = val.cast(out.dtype)
  flat = sum((x * s for x, s in zip(idxs[:axis] + (i,) + idxs[axis + 1:], strides_of(node_shape(u)))), UOp.const(dtypes.index, 0))
  at = UOp(Ops.INDEX, out_g.dtype, (out_g, flat, ok))
  if atomic: body = UOp(Ops.STORE, dtypes.void, (at, val), Ops.ADD)
  else: body = UOp(Ops.STORE, dtypes.void, (at, _SCATTER_COMBINE[how](UOp(Ops.LOAD, out.dtype, (at,)), val) if how != "set" else val))
  if not atomic and (serial := ranges[axis]) is not None: body = UOp(Ops.END, dtypes.void, (body, serial))  # innermost
  if par := [r for a, r in enumerate(ranges) if r is not None and (atomic or a != axis)]: body = UOp(Ops.END, dtypes.void, (body, *par))
  name = "scatter_" + _kernel_name(shape, False)[2:]
  ast = UOp(Ops.SINK, dtypes.void, (body,), KernelInfo(name, opts_to_apply=()))
  return _finish(ast.simplify("index simplification"), k, out)


def aliased_reads(ast: UOp, out_slot: int = 0) -> bool:
  """Does the kernel read its output buffer at an index other than the one it writes (then it must not run in place)?"""
  stores = [u for u in ast.toposort if u.op is Ops.STORE]
  written = {s.src[0].src[1] for s in stores}
  return any(u.op is Ops.INDEX and u.src[0].op is Ops.DEFINE_GLOBAL and u.src[0].arg == out_slot and u.src[1] not in written
             and u not in {s.src[0] for s in stores} for u in ast.toposort)
