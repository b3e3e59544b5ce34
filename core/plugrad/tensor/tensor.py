"""`Tensor`: a lazy n-dimensional array. A Tensor holds one tensor-graph UOp (`.uop`, docs/ir.md stage 1); its methods
build bigger graphs, and `realize()` (or reading the data) has the engine schedule and run the kernels.

The op methods live in small modules by kind (creation, random, elementwise, reduce, movement, bitcast, indexing, scan,
nn, custom kernels), each ending in the mixin that binds them; `Tensor` is composed of those mixins and holds here what
is the tensor itself. docs/tensor.md describes the layout and the semantics, and where they differ from numpy and
PyTorch.
"""
from __future__ import annotations

import builtins
import threading
import weakref
from typing import Any, ClassVar

import numpy as np

from plugrad.dtype import DType, DTypeLike, dtypes, to_dtype
from plugrad.errors import DeviceMismatchError, ShardAxisError, ShardingError
from plugrad.gradient import is_kernel_output, kernel_output_origin
from plugrad.helpers import dedup, prod
from plugrad.tensor.bitcast import BitcastMixin
from plugrad.tensor.creation import MAY_LACK, CreationMixin, canonical_device, require_dtype, uop_from_data
from plugrad.tensor.custom import CustomMixin
from plugrad.tensor.elementwise import ElementwiseMixin
from plugrad.tensor.helpers import (
  WRITABLE_VIEW,
  Devices,
  const_uop,
  device_uop,
  ints,
  is_buffer_form,
  is_view_of_buffer,
  view_base,
  view_chain,
)
from plugrad.tensor.indexing import IndexingMixin
from plugrad.tensor.movement import MovementMixin
from plugrad.tensor.nn_ops import NNMixin
from plugrad.tensor.random import RandomMixin
from plugrad.tensor.reduce import ReduceMixin
from plugrad.tensor.scan import ScanMixin
from plugrad.uop.ops import Ops, UOp, sint
from plugrad.uop.shape import ShapeError, fmt

# Every live Tensor, so a realize can point all tensors that share a computed node at its buffer (weak: dead tensors drop out).
_live: weakref.WeakSet[Tensor] = weakref.WeakSet()
# realized result → the graph it was computed from, kept while the result lives when that graph depends on a tensor with
# requires_grad, so `loss.item(); loss.backward()` still differentiates (as in PyTorch, the graph lives as long as its output)
_origins: weakref.WeakKeyDictionary[UOp, UOp] = weakref.WeakKeyDictionary()
# a WeakSet iterated while another thread adds to it raises "Set changed size during iteration": adds and snapshots
# take this lock (a dead tensor's removal is deferred by the WeakSet itself while a snapshot iterates)
_live_lock = threading.RLock()  # reentrant: a finalizer run by the GC inside the lock may make a Tensor


def _track(t: Tensor) -> None:
  with _live_lock: _live.add(t)


def _live_tensors() -> list[Tensor]:
  with _live_lock: return list(_live)


def _apply_mapping(mapping: dict[UOp, UOp]) -> None:
  if not mapping: return
  # one memo for every substitution of this mapping: the graphs below share most of their nodes (each realized
  # node's origin is the graph under it), and rebuilding them per graph made a training step's first realize quadratic
  memo: dict[UOp, UOp] = {}
  def sub(u: UOp) -> UOp: return u.substitute(mapping, memo)
  for result, graph in list(_origins.items()):  # recorded graphs see this realize too (a leaf in them may just have been realized)
    if any(k in graph.toposort for k in mapping): _origins[result] = sub(graph)
  # a result is differentiable when its graph reaches, other than through DETACH, a tensor with requires_grad or an
  # earlier realized result that has an origin (so a chain of realizes keeps its whole graph)
  if roots := {t.uop for t in _live_tensors() if t.requires_grad} | set(_origins.keys()):
    dep = _reaching(list(mapping), roots)
    for node, result in mapping.items():
      # an ASSIGN's result holds its value (a clone is one); writing a buffer in place makes its old origin stale
      if node.op is Ops.ASSIGN: _origins.pop(result, None)
      value = node.src[1] if node.op is Ops.ASSIGN else node
      # a tensor's own requires_grad gives it no origin, and a write whose value reads the old contents has none left to
      # differentiate (an optimizer's update of its weights and state)
      srcs = (value,) if value is not node else () if node.op is Ops.DETACH else node.src
      # (a precompiled kernel's output is its buffer written in place: that buffer is the write, not an old value read)
      kernel_out = is_kernel_output(value)
      reads = [r for r in value.src[1].src if r is not value.src[0]] if kernel_out else [value]
      if any(s in dep for s in srcs) and not any(view_base(result) in r.toposort for r in reads):
        # every other realized node replaced by its result: `node` is in no graph under itself, so that is `sub` of
        # the sources when the value is the node
        origin = value.replace(src=tuple(sub(s) for s in value.src)) if value is node else sub(value)
        _origins[result] = kernel_output_origin(origin) if kernel_out else origin
  for t in _live_tensors():
    topo = t.uop.toposort
    if any(k in topo for k in mapping): t.uop = sub(t.uop)


def _reaching(nodes: list[UOp], roots: set[UOp]) -> set[UOp]:
  """The nodes of `nodes`' graphs from which a path not through DETACH leads to one of `roots`."""
  dep: set[UOp] = set()
  seen: set[UOp] = set()
  for n in nodes:
    for u in n.toposort:
      if u in seen: continue
      seen.add(u)
      if u in roots or (u.op is not Ops.DETACH and any(s in dep for s in u.src)): dep.add(u)
  return dep


def _differentiable(root: UOp) -> tuple[UOp, dict[UOp, UOp], dict[UOp, UOp]]:
  """`root` with each realized result that has an origin replaced by a mark over that origin (expanded the same way).
  Returns the new graph, the marks (a target is found in the graph once substituted the same way; a mark keeps two
  results with equal origins apart, as their lazy nodes were), and the map pointing gradients back at the realized buffers."""
  if not (origins := dict(_origins.items())): return root, {}, {}
  memo: dict[UOp, list[UOp]] = {}
  def reads(g: UOp) -> list[UOp]:  # the realized results g depends on, other than through DETACH
    if (out := memo.get(g)) is not None: return out
    out, seen, todo = [], {g}, [g]
    while todo:
      u = todo.pop()
      if u in origins: out.append(u)
      if u.op is Ops.DETACH: continue
      for s in u.src:
        if s not in seen: seen.add(s); todo.append(s)
    memo[g] = out
    return out
  marks: dict[UOp, UOp] = {}
  entered: set[UOp] = set()
  stack: list[tuple[UOp, bool]] = [(r, False) for r in reads(root)]
  while stack:  # depth first, a result after the results its origin reads
    r, ready = stack.pop()
    if ready:
      # a result entered but not marked yet is one whose origin reads it: it was overwritten since, so it stays a constant
      graph = origins[r].substitute({d: marks[d] for d in reads(origins[r]) if d in marks})
      marks[r] = UOp(Ops.CONTIGUOUS, r.dtype, (graph,), r)  # the result as the arg: a mark of its own, with CONTIGUOUS's rule
    elif r not in entered:
      entered.add(r)
      stack += [(r, True)] + [(d, False) for d in reads(origins[r]) if d not in entered]
  back = {m.src[0]: r for r, m in marks.items()} | {m: r for r, m in marks.items()}
  return root.substitute(marks), marks, back


class Tensor(CreationMixin, RandomMixin, ElementwiseMixin, ReduceMixin, MovementMixin, BitcastMixin, IndexingMixin, ScanMixin, NNMixin,
             CustomMixin):
  """A lazy array on one device. `Tensor(data, device=None, dtype=None, requires_grad=None)` takes a Python scalar, a
  (nested) list or tuple, a numpy array, bytes, or a tensor-graph UOp."""
  uop: UOp
  requires_grad: bool | None
  grad: Tensor | None
  __array_priority__: ClassVar[float] = 1000.0  # numpy scalar (op) Tensor defers to our reflected operators

  def __init__(self, data: Any, device: Devices | list[str] | None = None, dtype: DTypeLike | None = None, requires_grad: bool | None = None):
    dt = to_dtype(dtype) if dtype is not None else None
    if dt is not None and (dt.count != 1 or dt.scalar() not in dtypes.all): raise TypeError(f"a Tensor needs a scalar dtype, got {dt}")
    if isinstance(data, Tensor): data = data.uop
    if isinstance(data, UOp):
      if data.shape is None: raise TypeError(f"Tensor(UOp) needs a tensor-graph UOp with a shape, got a {data.op.name}")
      uop = data
      if uop.dtype is dtypes.index:  # a bound Variable: an int tensor on a device
        dev = canonical_device(device)
        uop = const_uop(0, dtypes.default_int, dev, ()).alu(Ops.ADD, uop.cast(dtypes.default_int))
      if device is not None and (dev := canonical_device(device)) != uop.tensor_device: uop = UOp(Ops.COPY, uop.dtype, (uop, device_uop(dev)))
    else: uop = uop_from_data(data, canonical_device(device), dt)
    if dt is not None and uop.dtype is not dt: uop = uop.cast(dt)
    if uop.dtype in MAY_LACK: require_dtype(uop.tensor_device, uop.dtype)
    self.uop, self.requires_grad, self.grad = uop, requires_grad, None
    _track(self)

  @classmethod
  def _wrap(cls, uop: UOp) -> Tensor:
    """A Tensor around an existing graph node (the op methods use this). The only check: a dtype the device may lack
    (`MAY_LACK`) must be one it has, so every op that makes or casts to such a dtype fails where it is written."""
    if uop.dtype in MAY_LACK: require_dtype(uop.tensor_device, uop.dtype)
    t = object.__new__(cls)
    t.uop, t.requires_grad, t.grad = uop, None, None
    _track(t)
    return t

  # ---- properties
  @property
  def shape(self) -> tuple[sint, ...]:
    s = self.uop.shape
    assert s is not None  # a Tensor's uop always has a shape (checked at construction)
    return s
  @property
  def dtype(self) -> DType: return self.uop.dtype
  @property
  def device(self) -> Devices:
    """The device name, or for a multi-device tensor the tuple of its devices (docs/sharding.md)."""
    return self.uop.tensor_device
  @property
  def ndim(self) -> int: return len(self.shape)
  def numel(self) -> sint: return prod(self.shape)
  def element_size(self) -> int: return self.dtype.itemsize
  def nbytes(self) -> int: return prod(ints(self.shape, "nbytes")) * self.element_size()
  def is_floating_point(self) -> bool: return dtypes.is_float(self.dtype)
  def __len__(self) -> int:
    if not self.shape: raise TypeError("len() of a 0-d tensor")
    return ints(self.shape[:1], "len")[0]

  def __repr__(self) -> str:
    state = "realized" if is_buffer_form(self.uop) else f"lazy {self.uop.op.name}"
    grad = f", requires_grad={self.requires_grad}" if self.requires_grad is not None else ""
    return f"<Tensor {fmt(self.shape)} {self.dtype} on {self.device}, {state}{grad}>"

  def __hash__(self) -> int: return id(self)
  def __bool__(self) -> bool:
    raise TypeError("the truth value of a Tensor is not defined (use .item(), .any() or .all(), or compare with .numpy())")

  # ---- realization and data
  def realize(self, *lst: Tensor) -> Tensor:
    """Compute this tensor (and `lst`) now; every live tensor that shares a computed node then uses its buffer."""
    from plugrad.engine.realize import ENGINE_LOCK
    from plugrad.engine.realize import realize as run
    def pending() -> list[UOp]: return dedup(t.uop for t in (self, *lst) if not is_buffer_form(t.uop))
    if not (todo := pending()): return self
    with ENGINE_LOCK:  # one realize at a time: another thread's may have computed (and mapped) part of this graph meanwhile
      if not (todo := pending()): return self
      # lazy tensors that read a buffer before one of these assigns overwrites it are computed first
      if readers := _old_value_readers(todo):
        _apply_mapping(run(*readers))
        todo = pending()
      if todo: _apply_mapping(run(*todo))
    return self

  def schedule(self, *lst: Tensor) -> list[Any]:
    """The ScheduleItems (kernels and copies) that would compute this tensor and `lst`, without running them."""
    from plugrad.engine.schedule import create_schedule
    return create_schedule(*dedup(t.uop for t in (self, *lst) if not is_buffer_form(t.uop)))[0]

  def _buffer(self) -> Any:
    from plugrad.engine.buffers import buffer_of
    if isinstance(self.device, tuple):
      raise ShardingError(f"a tensor on {self.device} has one buffer per device; gather it with .to(device) first (or read it with .numpy())")
    self.realize()
    u = self.uop
    return buffer_of(u if u.op is Ops.BUFFER else u.src[0]).ensure_allocated()  # (an empty() tensor was never written)

  def numpy(self) -> np.ndarray:
    """A numpy copy of the data (bfloat16 comes back as float32, which numpy has)."""
    if self.dtype is dtypes.bfloat16: return self.cast(dtypes.float32).numpy()
    shape = ints(self.shape, "numpy")
    if 0 in shape: return np.zeros(shape, dtypes.to_numpy(self.dtype))
    if isinstance(self.device, tuple):  # gathered on the host: each piece read from its device
      u = self.realize().uop
      parts = [self._wrap(p).numpy() for p in u.src]
      return parts[0] if u.arg is None else np.concatenate(parts, axis=u.arg)
    return self._buffer().numpy().reshape(shape)

  def tolist(self) -> Any: return self.numpy().tolist()

  def item(self) -> Any:
    if self.numel() != 1: raise ShapeError(f"item() needs a tensor with one element, got shape {fmt(self.shape)}")
    return self.numpy().reshape(()).item()

  # ---- devices, copies, dtypes
  def to(self, device: Devices | list[str] | None) -> Tensor:
    """This tensor on `device`; a tuple of devices replicates it on each (`shard(devices)`), and a multi-device tensor
    moved to one device is gathered there."""
    dev = canonical_device(device)
    if dev == self.device: return self
    if isinstance(dev, tuple): return self.shard(dev)
    ret = Tensor._wrap(UOp(Ops.COPY, self.dtype, (self.uop, device_uop(dev))))
    ret.requires_grad = self.requires_grad
    if self.grad is not None: ret.grad = self.grad.to(dev)
    return ret

  def to_(self, device: Devices | list[str] | None) -> Tensor:
    """Move this tensor (and its gradient) to `device` in place."""
    moved = self.to(device)
    self.uop, self.grad = moved.uop, moved.grad
    return self

  def shard(self, devices: tuple[str, ...] | list[str], axis: int | None = None) -> Tensor:
    """This tensor on several devices: split along `axis` into one piece per device, in order, of ceil(n / len(devices))
    rows each (the last pieces shorter, or empty), or replicated on every device when `axis` is None. A multi-device
    tensor is resharded. Ops on the result run per device, with the copies they need (docs/sharding.md)."""
    from plugrad.device.registry import Device
    from plugrad.engine.multi import layout
    devs = canonical_device(devices)
    if not isinstance(devs, tuple): raise TypeError(f"shard takes a tuple of devices, got {devices!r} (to move to one device, use .to())")
    for d in devs: Device[d]  # a device that does not exist here (CPU:1 without CPU_DEVICES=2) fails now, not at the first kernel
    if axis is not None:
      if not isinstance(axis, int) or isinstance(axis, bool): raise TypeError(f"shard: axis must be an int or None, got {axis!r}")
      if not -self.ndim <= axis < self.ndim: raise ShardAxisError(f"shard: axis {axis} is out of range for shape {fmt(self.shape)}")
      axis %= self.ndim
      if not isinstance(self.shape[axis], int): raise ShardAxisError(f"shard: axis {axis} of shape {fmt(self.shape)} is symbolic")
    if isinstance(self.device, tuple) and layout(self.uop) == (devs, axis): return self
    ret = Tensor._wrap(UOp(Ops.COPY, self.dtype, (self.uop, device_uop(devs)), axis))
    ret.requires_grad = self.requires_grad
    if self.grad is not None: ret.grad = self.grad.shard(devs, axis)
    return ret

  def shard_(self, devices: tuple[str, ...] | list[str], axis: int | None = None) -> Tensor:
    """Shard this tensor (and its gradient) in place."""
    moved = self.shard(devices, axis)
    self.uop, self.grad = moved.uop, moved.grad
    return self

  def contiguous(self) -> Tensor:
    """This tensor computed into its own contiguous memory when realized (a no-op for a tensor that already is)."""
    if is_buffer_form(self.uop) or self.uop.op is Ops.CONTIGUOUS: return self._wrap(self.uop)
    return self._wrap(UOp(Ops.CONTIGUOUS, self.dtype, (self.uop,)))

  def clone(self, device: Devices | list[str] | None = None) -> Tensor:
    """A copy in new memory (on `device` when given), with the same requires_grad and a cloned gradient."""
    from plugrad.engine.buffers import new_buffer
    from plugrad.engine.multi import fresh_like
    dev = canonical_device(device) if device is not None else self.device
    src = self.uop if dev == self.device else self.to(dev).uop
    n = prod(ints(self.shape, "clone"))
    # on several devices: new buffers laid out as the value is (a sharded value stays sharded)
    target = fresh_like(src) if isinstance(dev, tuple) else new_buffer(dev, n, self.dtype).reshape(self.shape)
    ret = Tensor._wrap(UOp(Ops.ASSIGN, self.dtype, (target, src)) if n else src)
    ret.requires_grad = self.requires_grad
    if self.grad is not None: ret.grad = self.grad.clone(device)
    return ret

  def _forget_origin(self) -> None:
    """Drop the graph this realized tensor keeps for a later backward (the JIT calls it on a captured call's results:
    that graph would hold every intermediate buffer of the call, and replayed results carry none either)."""
    _origins.pop(self.uop, None)

  def detach(self) -> Tensor:
    """The same values, cut off from the autograd graph."""
    ret = self._wrap(UOp(Ops.DETACH, self.dtype, (self.uop,)))
    ret.requires_grad = False
    return ret

  def cast(self, dtype: DTypeLike) -> Tensor:
    dt = to_dtype(dtype)
    if dt.count != 1 or dt.scalar() not in dtypes.all: raise TypeError(f"cannot cast to {dt}: a Tensor needs a scalar dtype")
    return self if dt is self.dtype else self._wrap(self.uop.cast(dt))

  def float(self) -> Tensor: return self.cast(dtypes.float32)
  def half(self) -> Tensor: return self.cast(dtypes.float16)
  def double(self) -> Tensor: return self.cast(dtypes.float64)
  def int(self) -> Tensor: return self.cast(dtypes.int32)
  def long(self) -> Tensor: return self.cast(dtypes.int64)
  def bool(self) -> Tensor: return self.cast(dtypes.bool)

  def assign(self, x: Tensor | Any) -> Tensor:
    """Write `x` (broadcast to this shape; same dtype and device) into this tensor. A realized tensor is updated in its
    memory when the assign is realized; a lazy one simply takes `x` as its value."""
    if not isinstance(x, Tensor): x = Tensor(x, device=self.device, dtype=self.dtype)
    if x.uop is self.uop: return self
    if x.dtype is not self.dtype: raise TypeError(f"assign of a {x.dtype} tensor to a {self.dtype} tensor; cast it first")
    if x.device != self.device: raise DeviceMismatchError(f"assign of a tensor on {x.device} to a tensor on {self.device}; move it with .to() first")
    if x.shape != self.shape:
      try: x = x._broadcast_to(self.shape)
      except ShapeError: raise ShapeError(f"assign of shape {fmt(x.shape)} to a tensor of shape {fmt(self.shape)}") from None
    target = self.uop.src[0] if self.uop.op is Ops.ASSIGN else self.uop  # a second assign before a realize replaces the first
    if is_buffer_form(target): self.uop = UOp(Ops.ASSIGN, self.dtype, (target, x.uop))
    elif is_view_of_buffer(target):
      # a view that names each element of the buffer at most once (no EXPAND; no PAD, whose padding is no memory): the
      # kernel stores into the region only. Realized now: the base tensor holds only its buffer, so a lazy write would
      # be invisible to it (a stale read of a KV cache); tensors built from the old contents are computed first
      if (bad := next((u.op for u in view_chain(target) if u.op not in WRITABLE_VIEW), None)) is not None:
        raise ValueError(f"assign to a view through {bad.name} of a buffer: only reshape, shrink (slicing), permute and flip views "
                         "can be written in place")
      self.uop = UOp(Ops.ASSIGN, self.dtype, (target, x.uop))
      self.realize()
    else: self.uop = x.uop
    return self

  # ---- autograd
  def requires_grad_(self, requires_grad: builtins.bool = True) -> Tensor:
    self.requires_grad = requires_grad
    return self

  def gradient(self, *targets: Tensor, gradient: Tensor | None = None) -> list[Tensor]:
    """d(self)/d(target) for each target (self must be a single element unless `gradient`, the seed, is given)."""
    from plugrad.gradient import GradientError, compute_gradient
    seed = self._seed(gradient, "gradient")
    for t in targets:
      if not t.is_floating_point(): raise TypeError(f"gradient: only float tensors have gradients, got a target of dtype {t.dtype}")
    root, marks, back = _differentiable(self.uop)
    want = [t.uop.substitute(marks) for t in targets]
    grads = compute_gradient(root, seed.uop, want)
    if missing := [i for i, u in enumerate(want) if u not in grads]:
      raise GradientError(f"gradient: target(s) {missing} are not part of this tensor's graph (or only through detach)")
    return [Tensor._wrap(_like_layout(grads[u].substitute(back), t.uop)) for u, t in zip(want, targets)]

  def backward(self, gradient: Tensor | None = None) -> Tensor:
    """Accumulate d(self)/d(t) into `t.grad` for every live tensor `t` with requires_grad=True that self depends on."""
    from plugrad.gradient import GradientError, compute_gradient
    seed = self._seed(gradient, "backward")
    root, marks, back = _differentiable(self.uop)
    topo = root.toposort
    if not (targets := [(t, u) for t in _live_tensors() if t.requires_grad and (u := t.uop.substitute(marks)) in topo]):
      raise GradientError("backward(): no tensor with requires_grad=True is part of this tensor's graph")
    grads = compute_gradient(root, seed.uop, dedup(u for _, u in targets))
    for t, u in targets:
      if (g := grads.get(u)) is None: continue
      # .grad holds values, not a graph (PyTorch's backward without create_graph): realized, it keeps no origin, so a
      # step's activations are not held until the next zero_grad
      g = UOp(Ops.DETACH, g.dtype, (_like_layout(g.substitute(back), t.uop),))
      t.grad = Tensor._wrap(g) if t.grad is None else t.grad + Tensor._wrap(g)
    return self

  def _seed(self, gradient: Tensor | None, what: str) -> Tensor:
    from plugrad.gradient import GradientError
    if not self.is_floating_point(): raise TypeError(f"{what}: only float tensors can be differentiated, this one is {self.dtype}")
    if gradient is None:
      if self.numel() != 1:
        raise GradientError(f"{what}() without a gradient needs a tensor with one element; this one has shape {fmt(self.shape)} (pass gradient=)")
      return self._wrap(const_uop(1.0, self.dtype, self.device, self.shape))
    if gradient.shape != self.shape: raise ShapeError(f"{what}: the gradient has shape {fmt(gradient.shape)}, the tensor has {fmt(self.shape)}")
    if gradient.device != self.device: raise ValueError(f"{what}: the gradient is on {gradient.device}, the tensor on {self.device}")
    return gradient.cast(self.dtype)

  # ---- Python operators (reflected forms put the other operand first; in-place forms assign)
  def __neg__(self) -> Tensor: return self.neg()
  def __abs__(self) -> Tensor: return self.abs()
  def __invert__(self) -> Tensor: return self.bitwise_not()
  def __add__(self, x: Any) -> Tensor: return self.add(x)
  def __radd__(self, x: Any) -> Tensor: return self.add(x, True)
  def __sub__(self, x: Any) -> Tensor: return self.sub(x)
  def __rsub__(self, x: Any) -> Tensor: return self.sub(x, True)
  def __mul__(self, x: Any) -> Tensor: return self.mul(x)
  def __rmul__(self, x: Any) -> Tensor: return self.mul(x, True)
  def __truediv__(self, x: Any) -> Tensor: return self.div(x)
  def __rtruediv__(self, x: Any) -> Tensor: return self.div(x, True)
  def __floordiv__(self, x: Any) -> Tensor: return self.div(x, rounding_mode="floor")
  def __rfloordiv__(self, x: Any) -> Tensor: return self.div(x, True, rounding_mode="floor")
  def __mod__(self, x: Any) -> Tensor: return self.mod(x)
  def __rmod__(self, x: Any) -> Tensor: return self.mod(x, True)
  def __pow__(self, x: Any) -> Tensor: return self.pow(x)
  def __rpow__(self, x: Any) -> Tensor: return self.pow(x, True)
  def __matmul__(self, x: Tensor) -> Tensor: return self.matmul(x)
  def __rmatmul__(self, x: Tensor) -> Tensor: return self.matmul(x, True)
  def __and__(self, x: Any) -> Tensor: return self.bitwise_and(x)
  def __rand__(self, x: Any) -> Tensor: return self.bitwise_and(x, True)
  def __or__(self, x: Any) -> Tensor: return self.bitwise_or(x)
  def __ror__(self, x: Any) -> Tensor: return self.bitwise_or(x, True)
  def __xor__(self, x: Any) -> Tensor: return self.bitwise_xor(x)
  def __rxor__(self, x: Any) -> Tensor: return self.bitwise_xor(x, True)
  def __lshift__(self, x: Any) -> Tensor: return self.lshift(x)
  def __rlshift__(self, x: Any) -> Tensor: return self.lshift(x, True)
  def __rshift__(self, x: Any) -> Tensor: return self.rshift(x)
  def __rrshift__(self, x: Any) -> Tensor: return self.rshift(x, True)
  def __eq__(self, x: Any) -> Tensor: return self.eq(x)  # type: ignore[override]
  def __ne__(self, x: Any) -> Tensor: return self.ne(x)  # type: ignore[override]

  def __iadd__(self, x: Any) -> Tensor: return self.assign(self.add(x))
  def __isub__(self, x: Any) -> Tensor: return self.assign(self.sub(x))
  def __imul__(self, x: Any) -> Tensor: return self.assign(self.mul(x))
  def __itruediv__(self, x: Any) -> Tensor: return self.assign(self.div(x))
  def __ifloordiv__(self, x: Any) -> Tensor: return self.assign(self.div(x, rounding_mode="floor"))
  def __imod__(self, x: Any) -> Tensor: return self.assign(self.mod(x))
  def __ipow__(self, x: Any) -> Tensor: return self.assign(self.pow(x))
  def __imatmul__(self, x: Tensor) -> Tensor: return self.assign(self.matmul(x))
  def __iand__(self, x: Any) -> Tensor: return self.assign(self.bitwise_and(x))
  def __ior__(self, x: Any) -> Tensor: return self.assign(self.bitwise_or(x))
  def __ixor__(self, x: Any) -> Tensor: return self.assign(self.bitwise_xor(x))
  def __ilshift__(self, x: Any) -> Tensor: return self.assign(self.lshift(x))
  def __irshift__(self, x: Any) -> Tensor: return self.assign(self.rshift(x))


def _like_layout(g: UOp, of: UOp) -> UOp:
  """The gradient `g` of the multi-device tensor `of` laid out like it (the same devices, sharded along the same axis
  or replicated: a no-op when it already is); a single-device gradient as it is."""
  if not isinstance(of.tensor_device, tuple): return g
  from plugrad.engine.multi import layout
  devs, axis = layout(of) or (of.tensor_device, None)
  return UOp(Ops.COPY, g.dtype, (g, device_uop(devs)), axis)


def _old_value_readers(todo: list[UOp]) -> list[UOp]:
  """The graphs of live tensors (outside `todo`) that read a buffer that an ASSIGN (or a precompiled kernel's AFTER) in
  `todo` writes, and not through it: they were built from the old contents, so they must run before the write."""
  assigns = {u for r in todo for u in r.toposort if u.op in (Ops.ASSIGN, Ops.AFTER)}
  if not assigns: return []
  written = {view_base(a.src[0]) for a in assigns}
  wanted = set(todo)
  out = []
  for t in _live_tensors():
    u = t.uop
    if u in wanted or is_buffer_form(u): continue
    topo = u.toposort
    if any(b in topo for b in written) and not any(a in topo for a in assigns): out.append(u)
  return dedup(out)
