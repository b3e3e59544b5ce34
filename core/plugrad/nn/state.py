"""State dicts (the named tensors of a model) and the files they are stored in (plugrad.nn.formats)."""
from __future__ import annotations

import types
from typing import Any

from plugrad.helpers import dedup
from plugrad.nn.formats import StateFileError, npz_load, safe_load, safe_load_metadata, safe_save
from plugrad.tensor import Tensor
from plugrad.uop.ops import Ops, UOp
from plugrad.uop.shape import fmt

__all__ = ["StateDictError", "StateFileError", "get_parameters", "get_state_dict", "load_state_dict", "npz_load", "safe_load",
           "safe_load_metadata", "safe_save"]

_OPAQUE = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, str, bytes)


class StateDictError(ValueError):
  """A state dict that does not fit the model (missing or unexpected keys, shape or dtype mismatches)."""


def get_state_dict(obj: Any, prefix: str = "") -> dict[str, Tensor]:
  """Every tensor reachable from `obj` through attributes, dicts, lists and tuples, named by the path to it: attribute
  names and dict keys joined with '.', list items by index ("layers.0.weight"). A tensor shared by two paths is listed
  under both; reference cycles are followed once."""
  out: dict[str, Tensor] = {}
  _collect(obj, prefix, out, set())
  return out


def _collect(obj: Any, name: str, out: dict[str, Tensor], path: set[int]) -> None:
  if isinstance(obj, Tensor):
    out[name] = obj
    return
  if isinstance(obj, _OPAQUE) or id(obj) in path: return
  if hasattr(obj, "_asdict"): obj = obj._asdict()  # a namedtuple: by field name
  if isinstance(obj, dict): items = [(str(k), v) for k, v in obj.items()]
  elif isinstance(obj, (list, tuple)): items = [(str(i), v) for i, v in enumerate(obj)]
  elif hasattr(obj, "__dict__"): items = list(vars(obj).items())
  else: return
  path.add(id(obj))
  for k, v in items: _collect(v, f"{name}.{k}" if name else k, out, path)
  path.discard(id(obj))


def get_parameters(obj: Any) -> list[Tensor]:
  """The distinct tensors of `obj`'s state dict: what an optimizer takes (it trains those with requires_grad=True and
  keeps the others, like BatchNorm's running statistics, realized)."""
  return dedup(get_state_dict(obj).values())


def load_state_dict(model: Any, state_dict: dict[str, Tensor], strict: bool = True) -> list[Tensor]:
  """Copy `state_dict` into the model's tensors (same names, shapes and dtypes; moved to each tensor's device) and
  realize them; returns the model tensors written. Every key is checked first: any problem raises StateDictError listing
  all of them and the model is left unchanged. strict=False allows missing and unexpected keys (not mismatches)."""
  if not isinstance(state_dict, dict): raise TypeError(f"load_state_dict needs a dict of name -> Tensor, got a {type(state_dict).__name__}")
  own = get_state_dict(model)
  problems: list[str] = []
  if strict:
    if missing := [k for k in own if k not in state_dict]: problems.append(f"missing keys {missing}")
    if unexpected := [k for k in state_dict if k not in own]: problems.append(f"unexpected keys {unexpected}")
  pairs = [(own[k], v, k) for k, v in state_dict.items() if k in own]
  for t, v, k in pairs:
    if not isinstance(v, Tensor): problems.append(f"{k!r} is a {type(v).__name__}, not a Tensor")
    elif v.shape != t.shape: problems.append(f"{k!r} has shape {fmt(v.shape)}, the model's tensor {fmt(t.shape)}")
    elif v.dtype is not t.dtype: problems.append(f"{k!r} has dtype {v.dtype}, the model's tensor {t.dtype}")
  if problems: raise StateDictError("load_state_dict: nothing was loaded: " + "; ".join(problems))
  targets = dedup(t for t, _, _ in pairs)
  if not targets: return []
  # realized first, so that each assign below copies into the model's own memory (a lazy tensor would just take the
  # source's graph, and two models loaded from one dict would share buffers)
  Tensor.realize(*targets)
  # a source that reads one of the model's own buffers (e.g. this model's state dict with two layers swapped) is copied
  # out first: a swap needs each old value read before the other write, an order the scheduler cannot find
  own_bufs = {u for t in targets for u in t.uop.toposort if u.op is Ops.BUFFER}
  sources = [v.to(t.device) for t, v, _ in pairs]
  staged = [i for i, (s, (t, _, _)) in enumerate(zip(sources, pairs)) if s is not t and not own_bufs.isdisjoint(s.uop.toposort)]
  for i in staged: sources[i] = sources[i].clone()
  if staged: Tensor.realize(*(sources[i] for i in staged))
  before: dict[int, UOp] = {id(t): t.uop for t in targets}
  try:
    # a copy, not a graph: an assign is differentiable (as PyTorch's copy_), and loading another model's trained tensors must
    # not make this model's backward reach them (PyTorch loads under no_grad)
    for (t, _, _), s in zip(pairs, sources): t.assign(s if s is t else s.detach())
    Tensor.realize(*targets)
  except BaseException:
    for t in targets: t.uop = before[id(t)]  # assign is lazy until the realize: restoring the graphs undoes it
    raise
  return targets
