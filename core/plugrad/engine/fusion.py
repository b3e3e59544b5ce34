"""The fusion policy: which nodes of a tensor graph get their own buffer (are realized) and so end a kernel, and the
splitting of long reductions into small outputs (module docstring of schedule.py: the rules)."""
from __future__ import annotations

from plugrad.engine.nodes import ScheduleError, is_buffer_form, is_writable_view, node_shape, value_node
from plugrad.helpers import ContextVar, prod
from plugrad.uop.ops import GroupOp, Ops, UOp, sint

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
      if u is red or is_buffer_form(u) or pos[u] <= lo:
        reach[u] = u is red
        continue
    elif reach[u.src[i - 1]]:
      reach[u] = True
      continue
    if i == len(u.src): reach[u] = False
    else: stack += [(u, i + 1), (u.src[i], 0)]
  inside = {u for u, r in reach.items() if r}
  return all(c in inside for u in inside if u is not top for c in children.get(u, ()))


def find_realized(sink: UOp) -> dict[UOp, None]:
  topo = sink.toposort
  realize: dict[UOp, None] = {}
  for t in sink.src:
    if not is_buffer_form(t): realize[t] = None
  for u in topo:
    if u.op in (Ops.COPY, Ops.ASSIGN): realize[u] = None
    if u.op is Ops.COPY and not is_buffer_form(u.src[0]): realize[u.src[0]] = None
    if u.op is Ops.CONTIGUOUS and not is_buffer_form(u.src[0]): realize[u] = None
    if u.op is Ops.SCATTER:  # its own kernels; a reduction feeding the serial write loop is computed first
      realize[u] = None
      for s in u.src[1:]:
        if not is_buffer_form(s) and any(x.op is Ops.REDUCE_AXIS for x in s.toposort): realize[s] = None
    if u.op is Ops.ASSIGN and not is_buffer_form(u.src[0]) and not is_writable_view(u.src[0]):
      raise ScheduleError(f"ASSIGN target must be a realized buffer or a reshape/shrink/permute/flip view of one (realize it first), "
                          f"got a {u.src[0].op.name} of shape {u.src[0].shape}")
    if u.op is Ops.KERNEL:  # a precompiled kernel takes its buffers as they are: lazy or strided inputs get their own
      for s in u.src:
        if s.op is not Ops.BIND and not is_buffer_form(s): realize[s] = None
    if u.op is Ops.AFTER:
      if not is_buffer_form(u.src[0]): raise ScheduleError(f"a kernel writes a {u.src[0].op.name}, not a realized buffer")
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
      if (v := value_node(root)) is None: continue
      # `top`: under a broadcast, the highest node whose value is the reduction below it passed through elementwise
      # ops and reshapes only. Realizing it (not the bare reduction) ends the epilogue (bias, ReLU) in the reduction's
      # kernel, so the broadcasting consumer (the next matmul) reads a plain buffer instead of recomputing it per use.
      # `row`: u's axes are loops nested in axis order (the kernel's output loops, then a trailing reduction's loops),
      # so a row statistic broadcast over its trailing axes (_row_stat) is computed once per row in this kernel
      seen: set[tuple[UOp, bool, UOp | None, bool]] = set()
      stack: list[tuple[UOp, bool, UOp | None, bool]] = [(v, False, None, fuse_rows)]
      while stack:
        u, spread, top, row = stack.pop()
        if (u, spread, top, row) in seen or is_buffer_form(u) or (u in realize and u is not root and u is not v): continue
        seen.add((u, spread, top, row))
        if u.op is Ops.REDUCE_AXIS:
          if spread:
            grow.append(top if top is not None and _epilogue_owns(top, u, children, pos) else _owned_top(u, children, realize))
            continue
          users.setdefault(u, set()).add(root)
          stack.append((u.src[0], True, None, row and _trailing(node_shape(u.src[0]), u.arg[1])))
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
    # siblings only once nothing else grows: a reduction realized in this round (a matmul under a softmax) no longer
    # shares its reader's kernel, and counted as a sibling it split softmax's max and sum into kernels of their own
    if not grow: grow += _sibling_reductions(users, children, realize)
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
    if len(reds) < 2 or not all(all(isinstance(d, int) for d in node_shape(r.src[0])) for r in reds): continue
    nests = {(node_shape(r.src[0]), r.arg[1]) for r in reds}
    if len(nests) < 2: continue
    def work(r: UOp) -> int: return prod(node_shape(r.src[0]))  # type: ignore[arg-type]
    biggest = max(reds, key=work)
    big_nest = (node_shape(biggest.src[0]), biggest.arg[1])
    out += [_own_epilogue(r, children, realize) for r in reds if (node_shape(r.src[0]), r.arg[1]) != big_nest and work(r) >= SIBLING_MIN_WORK]
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
  shape, sshape = node_shape(e), node_shape(e.src[0])
  axes = tuple(a for a, (s, d) in enumerate(zip(sshape, shape)) if s != d)
  if not _trailing(shape, axes): return False
  found, stack, seen = False, [e.src[0]], set()
  while stack:
    if (u := stack.pop()) in seen: continue
    seen.add(u)
    if u.op is Ops.REDUCE_AXIS:
      if set(u.arg[1]) != set(axes) or node_shape(u.src[0]) != shape: return False
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
# ALU ops a reduction may redo per element of a broadcast operand (broadcast count x its ALU ops) before that operand
# gets a kernel even when broadcast no more than RECOMPUTE_MAX times: a BatchNorm backward (~30 ops) read by a 3x3
# depthwise conv's input gradient (9 times) or a 1x1 conv's from 16 channels ran MobileNetV2's training step 1.6x slower
RECOMPUTE_WORK = 128


def _alu_count(u: UOp, realize: dict[UOp, None], limit: int) -> int:
  """ALU ops in `u`'s elementwise expression (down to buffers, realized nodes and reductions), counted up to `limit`."""
  n, seen, stack = 0, set(), [u]
  while stack and n < limit:
    if (x := stack.pop()) in seen or is_buffer_form(x) or (x in realize and x is not u) or x.op is Ops.REDUCE_AXIS: continue
    seen.add(x)
    n += x.op in GroupOp.ALU
    stack.extend(x.src)
  return n


def _broadcast_operands(topo: dict[UOp, None], realize: dict[UOp, None], fuse_rows: bool) -> list[UOp]:
  """Elementwise work under an EXPAND inside a reduction's source, broadcast more than RECOMPUTE_MAX times (or redoing
  more than RECOMPUTE_WORK ALU ops per element): fused, the reduction would compute it once per element of the
  broadcast (a projection fed by layernorm or GELU, issue 20: the normalization redone for every output column tile),
  so it gets its own kernel and the reduction reads a buffer.
  Not a row statistic's epilogue when rows fuse (layernorm's backward: 1/sqrt(var + eps) in a row sum): it runs once per
  row where the row loop hoists it, and where it cannot, find_realized realizes it with its reduction."""
  out: dict[UOp, None] = {}
  seen: set[UOp] = set()
  for r in topo:
    if r.op is not Ops.REDUCE_AXIS: continue
    stack = [r.src[0]]
    while stack:
      if (u := stack.pop()) in seen or is_buffer_form(u) or u in realize or u.op is Ops.REDUCE_AXIS: continue
      seen.add(u)
      if fuse_rows and u.op is Ops.EXPAND and _row_stat(u): continue
      if u.op is Ops.EXPAND and (base := u.src[0]).shape is not None and all(isinstance(d, int) for d in (*node_shape(u), *base.shape)):
        while base.op in GroupOp.Movement and not is_buffer_form(base): base = base.src[0]
        times = prod(node_shape(u)) // max(1, prod(node_shape(u.src[0])))
        if times > 1 and base.op in GroupOp.ALU and (alus := _alu_count(base, realize, max(2, RECOMPUTE_WORK // times + 1))) >= 2 \
           and (times > RECOMPUTE_MAX.value or times * alus > RECOMPUTE_WORK):
          out[base] = None
          continue
      stack.extend(u.src)
  return list(out)


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
  shape, axes = node_shape(u.src[0]), set(u.arg[1])
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
  nested in the second reduction, is realized by find_realized (its outer loop of `ways` iterations is the parallel
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


def split_reductions(sink: UOp) -> tuple[UOp, dict[UOp, UOp]]:
  """The sink with every long reduction into a small output split (see _split_plan), and each node's new form. The
  rewrite is a function of the graph alone, so a cached schedule of the same form has the same kernels."""
  new: dict[UOp, UOp] = {}
  for u in sink.toposort:
    src = tuple(new[s] for s in u.src)
    nu = u if src == u.src else u.replace(src=src)
    if nu.op is Ops.REDUCE_AXIS and (plan := _split_plan(nu)) is not None: nu = _split_reduce(nu, *plan)
    new[u] = nu
  return new[sink], new
