"""OnnxModel: an ONNX graph run node by node on plugrad Tensors (lazy: the whole graph is one schedule when its outputs
are read). Shape computations (Shape, and what is computed from shapes and small constants) are evaluated once per
input-shape signature and kept on the host, so Reshape/Slice/Pad read their arguments without a device round trip and a
TinyJit capture of the rest sees only kernels. A value is a Tensor, a sequence (a list of Tensors) or an optional (None
when empty, else its value)."""
from __future__ import annotations

import functools
import inspect
import os
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from plugrad.device.registry import Device
from plugrad.dtype import DType, dtypes
from plugrad.engine.jit import TinyJit
from plugrad.onnx.dtypes import dtype_of
from plugrad.onnx.errors import OnnxError, UnsupportedOnnxOpError
from plugrad.onnx.ops import OPS, Ctx, HostValues, Value
from plugrad.tensor import Tensor

DOMAINS = ("ai.onnx", "ai.onnx.preview")  # the operator sets mapped (the preview domain: FlexAttention)
HOST_LIMIT = 4096  # a value computed only from host values is kept on the host when it has at most this many elements
_MULTI_NAME = {"Max", "Min", "Sum", "Mean", "ArgMax", "ArgMin", "Resize", "Upsample"}  # one function, told which op it is


def _onnx() -> Any:
  try:
    import onnx
  except ImportError:
    raise ImportError("plugrad.onnx needs the onnx package to parse models: pip install 'plugrad[onnx]' (or pip install onnx)") from None
  return onnx


@dataclass(frozen=True)
class InputSpec:
  """An input: its tensors' dtype and shape, inside `kind`'s wrappers, outermost first: () for a tensor, ("sequence",) for
  a list of tensors, ("optional", "sequence") for None or such a list."""
  name: str
  dtype: DType
  shape: tuple[int | str | None, ...]  # a symbolic dimension by its name (dim_param), None where the model says nothing
  kind: tuple[str, ...] = ()


def _attr(a: Any, where: str) -> Any:
  onnx = _onnx()
  v = onnx.helper.get_attribute_value(a)
  if isinstance(v, bytes): return v.decode()
  if isinstance(v, onnx.TensorProto): return onnx.numpy_helper.to_array(v)
  if isinstance(v, list) and v and isinstance(v[0], bytes): return [s.decode() for s in v]
  return v


def _constant(node: Any, where: str) -> np.ndarray:
  attrs = {a.name: _attr(a, where) for a in node.attribute}
  if "value" in attrs: return np.asarray(attrs["value"])
  for name, dt in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64), ("value_ints", np.int64)):
    if name in attrs: return np.array(attrs[name], dtype=dt)
  raise UnsupportedOnnxOpError(f"{where}: Constant with {sorted(attrs)} (strings and sparse tensors are not supported)")


class OnnxModel:
  """An ONNX model on a plugrad device: `OnnxModel("model.onnx")(input_ids=ids)` returns a dict of output Tensors.

  `model` is a path or an `onnx.ModelProto`; `device` a plugrad device name (default: the default device); `jit=True`
  replays each input-shape signature's kernels from the third call on (TinyJit). Initializers are realized Tensors on
  the device (`initializers`). Operators outside the supported set raise `UnsupportedOnnxOpError` at load, naming each
  node and op."""

  def __init__(self, model: str | os.PathLike[str] | Any, device: str | None = None, jit: bool = False):
    onnx = _onnx()
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(os.fspath(model))
    self.device = Device.canonicalize(device) if device is not None else Device.DEFAULT
    self.graph = proto.graph
    self.opsets = {imp.domain or "ai.onnx": imp.version for imp in proto.opset_import}
    self.nodes = list(self.graph.node)
    if missing := _unsupported_nodes(self.graph):
      raise UnsupportedOnnxOpError(f"{len(missing)} node(s) use operators plugrad.onnx does not support: {', '.join(missing[:8])}"
                                   + (" ..." if len(missing) > 8 else ""))
    self._init_host: dict[str, np.ndarray] = {}
    self.initializers: dict[str, Tensor] = {}
    for init in self.graph.initializer:
      arr = onnx.numpy_helper.to_array(init)
      self.initializers[init.name] = self._upload(arr, f"initializer {init.name!r}").realize()
      if arr.size <= HOST_LIMIT: self._init_host[init.name] = arr
    self.inputs = [self._spec(vi) for vi in self.graph.input if vi.name not in self.initializers]
    self.outputs = [o.name for o in self.graph.output]
    self.jit = jit
    # both bounded, so a server feeding ever new shapes keeps a fixed footprint (least recently used out first)
    self._jits: OrderedDict[tuple[Any, ...], TinyJit[Any]] = OrderedDict()
    self._folded: OrderedDict[tuple[Any, ...], list[np.ndarray]] = OrderedDict()

  def _spec(self, vi: Any) -> InputSpec:
    tp, kind = vi.type, []
    while (field := tp.WhichOneof("value")) in ("sequence_type", "optional_type"):
      kind.append(field.removesuffix("_type"))
      tp = getattr(tp, field).elem_type
    if field != "tensor_type": raise UnsupportedOnnxOpError(f"input {vi.name!r}: {field or 'untyped'} values are not supported")
    t = tp.tensor_type
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim)
    return InputSpec(vi.name, dtype_of(t.elem_type, f"input {vi.name!r}"), dims, tuple(kind))

  def _upload(self, arr: np.ndarray, what: str) -> Tensor:
    if arr.dtype.kind in "OSU": raise UnsupportedOnnxOpError(f"{what}: string tensors are not supported")
    arr = np.require(arr, requirements="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
    if arr.dtype.name == "bfloat16":  # ml_dtypes' bfloat16 (what onnx's numpy_helper returns): its bits
      return Tensor(arr.view(np.uint16), device=self.device).bitcast(dtypes.bfloat16)
    return Tensor(arr, device=self.device)

  def _input(self, spec: InputSpec, value: Any, kind: tuple[str, ...] | None = None) -> Value:
    kind = spec.kind if kind is None else kind
    if kind[:1] == ("optional",): return None if value is None else self._input(spec, value, kind[1:])
    if kind[:1] == ("sequence",):
      if not isinstance(value, (list, tuple)):
        raise OnnxError(f"input {spec.name!r}: the model takes a sequence (a list of tensors), got {type(value).__name__}")
      return [self._tensor_input(spec, v) for v in value]
    if value is None: raise OnnxError(f"input {spec.name!r}: the model takes a tensor, got None")
    return self._tensor_input(spec, value)

  def _tensor_input(self, spec: InputSpec, value: Any) -> Tensor:
    if not isinstance(value, Tensor):
      arr = np.asarray(value)
      if spec.dtype is not dtypes.bfloat16 and arr.dtype != dtypes.to_numpy(spec.dtype):
        if not np.can_cast(arr.dtype, dtypes.to_numpy(spec.dtype), casting="same_kind"):
          raise OnnxError(f"input {spec.name!r}: the model takes {spec.dtype}, got a {arr.dtype} array")
        arr = arr.astype(dtypes.to_numpy(spec.dtype))
      value = self._upload(arr, f"input {spec.name!r}")
    t = value
    if t.dtype != spec.dtype: raise OnnxError(f"input {spec.name!r}: the model takes {spec.dtype}, got {t.dtype}")
    if spec.shape and (len(t.shape) != len(spec.shape) or any(isinstance(d, int) and d and d != s for d, s in zip(spec.shape, t.shape))):
      raise OnnxError(f"input {spec.name!r}: the model takes shape {spec.shape}, got {tuple(t.shape)}")
    return t if t.device == self.device else t.to(self.device)

  def __call__(self, **inputs: Any) -> dict[str, Any]:
    """The outputs by name: a Tensor each (a sequence output is a list of Tensors, an optional one None when empty: typed
    Any so the usual `out["logits"].numpy()` type-checks). A sequence input is a list, an empty optional one None."""
    names = {s.name for s in self.inputs}
    if unknown := sorted(set(inputs) - names): raise OnnxError(f"unknown input(s) {unknown}; the model's inputs are {sorted(names)}")
    if missing := sorted(names - set(inputs)): raise OnnxError(f"missing input(s) {missing}; the model's inputs are {sorted(names)}")
    values = [self._input(s, inputs[s.name]) for s in self.inputs]
    if not self.jit: return dict(zip(self.outputs, self._run(*values)))
    # TinyJit takes Tensors: each sequence's length and which optionals are empty are part of the signature instead
    key = tuple(_signature(v) for v in values)
    if (jit := self._jits.get(key)) is None: jit = self._jits[key] = TinyJit(functools.partial(self._run_realized, key))
    _touch(self._jits, key, MAX_JITS)
    return dict(zip(self.outputs, jit(*[t for v in values for t in _leaves(v)])))

  def _run_realized(self, key: tuple[Any, ...], *tensors: Tensor) -> tuple[Value, ...]:
    it = iter(tensors)
    outs = self._run(*[_rebuild(sig, it) for sig in key])
    # a jitted output must be a buffer of its own (an output that is an input or an initializer is copied)
    return tuple(_map_tensors(o, lambda t: t.contiguous().realize()) for o in outs)

  def _run(self, *values: Value) -> tuple[Value, ...]:
    env: dict[str, Value] = {**self.initializers, **{s.name: v for s, v in zip(self.inputs, values)}}
    host = HostValues()
    for k, v in self._init_host.items(): host.put(self.initializers[k], v)
    scope = _Scope(env, dict(self._init_host), host)
    return tuple(self._run_graph(self.nodes, [o.name for o in self.graph.output], scope, ()))

  def _run_graph(self, nodes: list[Any], outputs: list[str], scope: _Scope, path: tuple[str, ...]) -> list[Value]:
    """Run `nodes` in `scope` (the main graph, or a subgraph seeing its outer scope); `path` names the subgraph."""
    for i, node in enumerate(nodes):
      where = " / ".join([*path, _describe(i, node)])
      try: outs = self._node(i, node, where, scope, path)
      except OnnxError: raise
      except Exception as e:
        e.add_note(f"in ONNX {where}")
        raise
      for name, val in zip(node.output, outs):
        if not name: continue
        if isinstance(val, np.ndarray):
          scope.host_of[name] = val
          val = self._upload(val, where)
          scope.host.put(val, scope.host_of[name])
        scope.env[name] = val  # None: an empty optional
    try: return [scope.env[o] for o in outputs]
    except KeyError as e: raise OnnxError(f"{' / '.join(path) or 'the graph'} never computes its output {e.args[0]!r}") from None

  def _node(self, i: int, node: Any, where: str, scope: _Scope, path: tuple[str, ...]) -> list[Any]:
    if node.op_type == "Constant": return [_constant(node, where)]
    env, host_of = scope.env, scope.host_of
    args: list[Value] = []
    for name in node.input:
      if not name: args.append(None)
      elif name not in env: raise OnnxError(f"{where}: input {name!r} is computed by no earlier node")
      else: args.append(env[name])
    # omitted trailing inputs take the operator's defaults; a named one holding an empty optional stays (Loop's state)
    while args and not node.input[len(args) - 1]: args.pop()
    graphs = {a.name: a.g for a in node.attribute if a.type == a.GRAPH}
    # a node whose inputs are all host values (shapes, small constants) is evaluated once per their values
    of_shape = node.op_type in ("Shape", "Size") and all(isinstance(a, Tensor) for a in args)
    on_host = not graphs and (of_shape or (bool(node.input) and all(not n or n in host_of for n in node.input)))
    key = None
    if on_host:
      key = (path, i, tuple(tuple(a.shape) for a in args if isinstance(a, Tensor)) if of_shape else
             tuple((host_of[n].dtype.str, host_of[n].shape, host_of[n].tobytes()) for n in node.input if n))
      if (hit := self._folded.get(key)) is not None:
        self._folded.move_to_end(key)
        return list(hit)
    fn = OPS[node.op_type]
    params = inspect.signature(fn).parameters
    attrs = {a.name: _attr(a, where) for a in node.attribute if a.type != a.GRAPH}
    attrs.update({k: Subgraph(self, g, scope, (*path, f"{_describe(i, node)}.{k}")) for k, g in graphs.items()})
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())  # it checks the names itself
    if not takes_any and (unknown := [a for a in attrs if a not in params]):
      raise UnsupportedOnnxOpError(f"{where}: attribute(s) {unknown} are not supported")
    if node.op_type in _MULTI_NAME: attrs["_op"] = node.op_type
    ctx = Ctx(where, self.opsets.get(node.domain or "ai.onnx", 1), scope.host, len(node.output), self.device)
    out = fn(ctx, *args, **attrs)
    outs = list(out) if isinstance(out, tuple) else [out]  # a tuple holds the outputs; a list is one sequence value
    if len(outs) < len([n for n in node.output if n]):
      raise OnnxError(f"{where}: the node names {len(node.output)} outputs, the operator makes {len(outs)}")
    if key is not None and all(isinstance(o, Tensor) and o.numel() <= HOST_LIMIT for o in outs[:len(node.output)]):
      arrays = [o.numpy() for o in outs[:len(node.output)] if isinstance(o, Tensor)]
      self._folded[key] = arrays
      _touch(self._folded, key, MAX_FOLDED)
      return list(arrays)
    return outs


MAX_JITS = 16  # input-shape signatures whose TinyJit capture is kept
MAX_FOLDED = 16384  # host-evaluated node results kept (a few per node and shape signature)


def _touch(cache: OrderedDict[Any, Any], key: Any, cap: int) -> None:
  cache.move_to_end(key)
  while len(cache) > cap: cache.popitem(last=False)


def _signature(v: Value) -> Any:
  """A tensor's (shape, dtype); a sequence's ("sequence", its tensors' signatures); None for an empty optional."""
  if v is None: return None
  if isinstance(v, list): return ("sequence", tuple(_signature(t) for t in v))
  return (tuple(v.shape), v.dtype)


def _leaves(v: Value) -> list[Tensor]: return [] if v is None else list(v) if isinstance(v, list) else [v]


def _rebuild(sig: Any, tensors: Iterator[Tensor]) -> Value:
  """The value of signature `sig`, its tensors taken in order from the iterator `tensors`."""
  if sig is None: return None
  return [next(tensors) for _ in sig[1]] if sig[0] == "sequence" else next(tensors)


def _map_tensors(v: Value, fn: Callable[[Tensor], Any]) -> Any: return None if v is None else [fn(t) for t in v] if isinstance(v, list) else fn(v)


@dataclass
class _Scope:
  env: dict[str, Value]
  host_of: dict[str, np.ndarray]  # the values known on the host, by name
  host: HostValues  # the same, by their Tensor (what Ctx.ints reads)

  def child(self) -> _Scope: return _Scope(dict(self.env), dict(self.host_of), self.host.copy())


class Subgraph:
  """A graph attribute (If's branches, Loop's and Scan's body, FlexAttention's score_mod): called with its inputs as
  Tensors, it runs in a scope that sees the outer graph's values, and returns its outputs."""
  def __init__(self, model: OnnxModel, graph: Any, scope: _Scope, path: tuple[str, ...]):
    self.model, self.graph, self.scope, self.path = model, graph, scope, path
    self.input_names = [vi.name for vi in graph.input]
    self.nodes = list(graph.node)

  def __call__(self, *inputs: Value) -> list[Value]:
    if len(inputs) != len(self.input_names):
      raise OnnxError(f"{' / '.join(self.path)}: the subgraph takes {len(self.input_names)} inputs, got {len(inputs)}")
    onnx = _onnx()
    scope = self.scope.child()
    for init in self.graph.initializer:
      arr = onnx.numpy_helper.to_array(init)
      scope.env[init.name] = t = self.model._upload(arr, f"initializer {init.name!r}")
      if arr.size <= HOST_LIMIT: scope.host_of[init.name] = arr; scope.host.put(t, arr)
    for name, v in zip(self.input_names, inputs):
      scope.env[name] = v
      scope.host_of.pop(name, None)
      if isinstance(v, Tensor) and (arr := self.scope.host.get(v)) is not None: scope.host_of[name] = arr
    return self.model._run_graph(self.nodes, [o.name for o in self.graph.output], scope, self.path)


def _describe(i: int, n: Any) -> str:
  dom = f"{n.domain}." if n.domain and n.domain != "ai.onnx" else ""
  return f"node {i}{f' {n.name!r}' if n.name else ''} ({dom}{n.op_type})"


def _unsupported_nodes(graph: Any, path: str = "") -> list[str]:
  """Every node (subgraphs included) whose operator plugrad.onnx does not map."""
  out = []
  for i, n in enumerate(graph.node):
    if (n.domain or "ai.onnx") not in DOMAINS or (n.op_type not in OPS and n.op_type != "Constant"): out.append(path + _describe(i, n))
    for a in n.attribute:
      if a.type == a.GRAPH: out += _unsupported_nodes(a.g, f"{path}{_describe(i, n)}.{a.name} / ")
  return out


def run_onnx(model: str | os.PathLike[str] | Any, inputs: Mapping[str, Any], device: str | None = None) -> dict[str, Any]:
  """Load and run once; the outputs as numpy arrays (a sequence as a list of them, an empty optional as None)."""
  outs = OnnxModel(model, device)(**inputs)
  return {k: _map_tensors(v, Tensor.numpy) for k, v in outs.items()}


__all__ = ["InputSpec", "OnnxModel", "run_onnx", "dtypes"]
