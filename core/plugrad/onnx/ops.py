"""ONNX operators mapped onto the Tensor API, so every device runs them. One function per operator (or family): it takes
the node's context, its inputs (a Tensor, or None for an omitted optional input) and its attributes as keywords, and
returns a Tensor or a tuple of them. Values an operator needs as Python numbers (shapes, axes, pads) are read with
`ctx.ints`, which answers from the host copy the model keeps of shape computations, without a device round trip."""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from plugrad.dtype import DType, dtypes
from plugrad.onnx.dtypes import dtype_of
from plugrad.onnx.errors import OnnxError, UnsupportedOnnxOpError
from plugrad.tensor import Tensor

Value = Tensor | list[Tensor] | None  # an ONNX value: a tensor, a sequence of them, or an optional (None when empty)
OpFn = Callable[..., "Value | np.ndarray | tuple[Value, ...]"]  # an ndarray result is a value known on the host
OPS: dict[str, OpFn] = {}


class HostValues:
  """Values known on the host, by their Tensor. Each entry keeps its Tensor alive beside the array: keyed by id alone,
  a Tensor freed mid-run (a Loop's counter) could hand its id to a new Tensor, which would then read a stale value."""
  def __init__(self, items: dict[int, tuple[Tensor, np.ndarray]] | None = None): self._d = dict(items or {})
  def put(self, t: Tensor, a: np.ndarray) -> None: self._d[id(t)] = (t, a)
  def get(self, t: Tensor) -> np.ndarray | None:
    e = self._d.get(id(t))
    return e[1] if e is not None and e[0] is t else None
  def copy(self) -> HostValues: return HostValues(self._d)


class Ctx:
  """What an operator knows of its node besides inputs and attributes."""
  def __init__(self, node: str, opset: int, host: HostValues, n_outputs: int, device: str):
    self.node, self.opset, self.host, self.n_outputs, self.device = node, opset, host, n_outputs, device

  # tensors an operator makes go to the model's device
  def tensor(self, a: np.ndarray) -> Tensor: return Tensor(a, device=self.device)
  def arange(self, n: int, dtype: DType | None = None) -> Tensor: return Tensor.arange(n, dtype=dtype, device=self.device)
  def const(self, a: np.ndarray) -> Tensor:
    """A tensor whose value stays known on the host (shape arithmetic reads it without a device round trip)."""
    t = self.tensor(a)
    self.host.put(t, a)
    return t
  def full(self, shape: Sequence[int], value: Any, dtype: DType) -> Tensor:
    return Tensor.full(tuple(shape), value, dtype=dtype, device=self.device)

  def array(self, t: Tensor) -> np.ndarray:
    """The value of a small input (a shape, axes, pads) on the host."""
    if (a := self.host.get(t)) is not None: return a
    return t.numpy()

  def ints(self, t: Tensor | None) -> list[int]:
    return [] if t is None else [int(v) for v in self.array(t).reshape(-1)]

  def scalar(self, t: Tensor) -> Any: return self.array(t).reshape(-1)[0].item()

  def error(self, msg: str) -> OnnxError: return OnnxError(f"{self.node}: {msg}")
  def unsupported(self, msg: str) -> UnsupportedOnnxOpError: return UnsupportedOnnxOpError(f"{self.node}: {msg}")


F = TypeVar("F", bound=OpFn)


def op(*names: str) -> Callable[[F], F]:
  def register(fn: F) -> F:
    for n in names: OPS[n] = fn
    return fn
  return register


def _sh(x: Tensor | np.ndarray) -> tuple[int, ...]:
  """A shape as ints: the frontend makes no symbolic shapes (a Variable-sized input is refused where it is read)."""
  dims = x.shape
  if not all(isinstance(d, int) for d in dims):
    raise UnsupportedOnnxOpError(f"a symbolic shape {dims} reached an ONNX operator (give concrete input shapes)")
  return tuple(int(d) for d in dims)  # type: ignore[arg-type]


def _axis(a: int, ndim: int) -> int: return a + ndim if a < 0 else a
def _axes(ax: Sequence[int], ndim: int) -> list[int]: return [_axis(a, ndim) for a in ax]
def _prod(xs: Sequence[int]) -> int: return math.prod(int(x) for x in xs)


# ---- elementwise

def _unary(name: str, fn: Callable[[Tensor], Tensor]) -> None:
  OPS[name] = lambda ctx, x: fn(x)

for _name, _fn in {
    "Abs": Tensor.abs, "Acos": Tensor.acos, "Acosh": Tensor.acosh, "Asin": Tensor.asin, "Asinh": Tensor.asinh,
    "Atan": Tensor.atan, "Atanh": Tensor.atanh, "Ceil": Tensor.ceil, "Cos": Tensor.cos, "Cosh": Tensor.cosh,
    "Erf": Tensor.erf, "Exp": Tensor.exp, "Floor": Tensor.floor, "Log": Tensor.log, "Neg": Tensor.neg,
    "Reciprocal": Tensor.reciprocal, "Relu": Tensor.relu, "Round": Tensor.round, "Sigmoid": Tensor.sigmoid,
    "Sign": Tensor.sign, "Sin": Tensor.sin, "Sinh": Tensor.sinh, "Sqrt": Tensor.sqrt, "Tan": Tensor.tan,
    "Tanh": Tensor.tanh, "Softplus": Tensor.softplus, "Softsign": Tensor.softsign,
    "IsNaN": Tensor.isnan, "Not": Tensor.logical_not, "BitwiseNot": Tensor.bitwise_not}.items():
  _unary(_name, _fn)

OPS["Identity"] = lambda ctx, x: x
OPS["Add"] = lambda ctx, a, b: a + b
OPS["Sub"] = lambda ctx, a, b: a - b
OPS["Mul"] = lambda ctx, a, b: a * b
OPS["Equal"] = lambda ctx, a, b: a == b
OPS["Less"] = lambda ctx, a, b: a < b
OPS["Greater"] = lambda ctx, a, b: a > b
OPS["LessOrEqual"] = lambda ctx, a, b: a <= b
OPS["GreaterOrEqual"] = lambda ctx, a, b: a >= b
OPS["And"] = lambda ctx, a, b: a & b
OPS["Or"] = lambda ctx, a, b: a | b
OPS["Xor"] = lambda ctx, a, b: a ^ b
OPS["BitwiseAnd"] = lambda ctx, a, b: a.bitwise_and(b)
OPS["BitwiseOr"] = lambda ctx, a, b: a.bitwise_or(b)
OPS["BitwiseXor"] = lambda ctx, a, b: a.bitwise_xor(b)
OPS["Where"] = lambda ctx, c, x, y: c.where(x, y)


@op("Div")
def div(ctx: Ctx, a: Tensor, b: Tensor) -> Tensor:
  # integer division truncates toward zero (C, and the reference's numpy cast of the quotient)
  return a.div(b, rounding_mode="trunc") if dtypes.is_int(a.dtype) else a / b

@op("Pow")
def pow_(ctx: Ctx, x: Tensor, y: Tensor) -> Tensor:
  if dtypes.is_int(x.dtype): return x.float().pow(y.float()).round().cast(x.dtype)
  return x.pow(y.cast(x.dtype) if y.dtype != x.dtype else y)

@op("Mod")
def mod(ctx: Ctx, a: Tensor, b: Tensor, fmod: int = 0) -> Tensor:
  if not fmod and dtypes.is_float(a.dtype): raise ctx.error("Mod of floats needs fmod=1 (the ONNX specification)")
  return a.fmod(b) if fmod else a.mod(b)

@op("BitShift")
def bitshift(ctx: Ctx, x: Tensor, y: Tensor, direction: str = "") -> Tensor:
  if direction not in ("LEFT", "RIGHT"): raise ctx.error(f"BitShift direction must be LEFT or RIGHT, got {direction!r}")
  return x.lshift(y) if direction == "LEFT" else x.rshift(y)

@op("Max", "Min", "Sum", "Mean")
def variadic(ctx: Ctx, *xs: Tensor, _op: str = "") -> Tensor:
  out = xs[0]
  for x in xs[1:]:
    out = {"Max": Tensor.maximum, "Min": Tensor.minimum}.get(_op, Tensor.add)(out, x)
  return out / len(xs) if _op == "Mean" else out

@op("IsInf")
def isinf(ctx: Ctx, x: Tensor, detect_negative: int = 1, detect_positive: int = 1) -> Tensor:
  return x.isinf(detect_positive=bool(detect_positive), detect_negative=bool(detect_negative))

@op("Clip")
def clip(ctx: Ctx, x: Tensor, lo: Tensor | None = None, hi: Tensor | None = None, min: float | None = None,
         max: float | None = None) -> Tensor:
  lo_v = lo if lo is not None else min
  hi_v = hi if hi is not None else max
  if lo_v is not None: x = x.maximum(lo_v)
  if hi_v is not None: x = x.minimum(hi_v)
  return x

OPS["Elu"] = lambda ctx, x, alpha=1.0: x.elu(alpha)
OPS["Celu"] = lambda ctx, x, alpha=1.0: x.celu(alpha)
OPS["Selu"] = lambda ctx, x, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875: \
  gamma * (x > 0).where(x, alpha * (x.exp() - 1))
OPS["LeakyRelu"] = lambda ctx, x, alpha=0.01: x.leaky_relu(alpha)
OPS["HardSigmoid"] = lambda ctx, x, alpha=0.2, beta=0.5: (alpha * x + beta).clip(0, 1)
OPS["HardSwish"] = lambda ctx, x: x * (x / 6 + 0.5).clip(0, 1)
OPS["ThresholdedRelu"] = lambda ctx, x, alpha=1.0: (x > alpha).where(x, 0)
OPS["Shrink"] = lambda ctx, x, bias=0.0, lambd=0.5: (x < -lambd).where(x + bias, (x > lambd).where(x - bias, 0)).cast(x.dtype)
OPS["PRelu"] = lambda ctx, x, slope: (x < 0).where(x * slope, x)
def _log1p_exp_neg_abs(x: Tensor) -> Tensor:
  """log(1 + exp(-|x|)) without losing the small term (Kahan's log1p: log(w)·u/(w-1), w = 1 + u)."""
  u = (-x.abs()).exp()
  w = 1 + u
  return (w == 1).where(u, w.log() * u / (w - 1))

OPS["Mish"] = lambda ctx, x: x * (x.maximum(0) + _log1p_exp_neg_abs(x)).tanh()
OPS["Swish"] = lambda ctx, x, alpha=1.0: x * (alpha * x).sigmoid()

@op("Gelu")
def gelu(ctx: Ctx, x: Tensor, approximate: str = "none") -> Tensor:
  if approximate == "tanh": return x.gelu()
  if approximate != "none": raise ctx.error(f"Gelu approximate must be 'none' or 'tanh', got {approximate!r}")
  return 0.5 * x * (1 + (x * (1 / math.sqrt(2))).erf())


# ---- casts

@op("Cast")
def cast(ctx: Ctx, x: Tensor, to: int = 0, saturate: int = 1, round_mode: str = "up") -> Tensor:
  return _cast(ctx, x, dtype_of(to, ctx.node))

@op("CastLike")
def cast_like(ctx: Ctx, x: Tensor, like: Tensor, saturate: int = 1, round_mode: str = "up") -> Tensor:
  return _cast(ctx, x, like.dtype)

def _cast(ctx: Ctx, x: Tensor, dt: DType) -> Tensor:
  if dtypes.is_float(x.dtype) and dtypes.is_int(dt):
    # ONNX (and numpy) leave an out-of-range float to int conversion undefined; C makes it UB: truncate first
    return x.trunc().cast(dt)
  return x.cast(dt)


# ---- matrix products

OPS["MatMul"] = lambda ctx, a, b: a @ b

@op("Gemm")
def gemm(ctx: Ctx, a: Tensor, b: Tensor, c: Tensor | None = None, alpha: float = 1.0, beta: float = 1.0, transA: int = 0,
         transB: int = 0) -> Tensor:
  a, b = a.T if transA else a, b.T if transB else b
  y = a @ b
  if alpha != 1.0: y = y * alpha
  if c is not None: y = y + (c * beta if beta != 1.0 else c)
  return y

@op("Einsum")
def einsum(ctx: Ctx, *xs: Tensor, equation: str = "") -> Tensor: return Tensor.einsum(equation.replace(" ", ""), *xs)

@op("MatMulInteger")
def matmul_integer(ctx: Ctx, a: Tensor, b: Tensor, a_zero: Tensor | None = None, b_zero: Tensor | None = None) -> Tensor:
  # a per-row zero point of a (one per row of the matrix) is a column vector
  return _centered(a, a_zero, _sh(a)[-2]) @ _centered(b, b_zero)


# ---- reductions

def _reduce_axes(ctx: Ctx, x: Tensor, axes_in: Tensor | None, axes: Sequence[int] | None, noop: int) -> list[int] | None:
  """The axes to reduce, or None for no reduction (noop_with_empty_axes and no axes)."""
  ax = ctx.ints(axes_in) if axes_in is not None else list(axes or [])
  if not ax: return None if noop else list(range(x.ndim))
  return _axes(ax, x.ndim)

def _reduction(fn: Callable[[Tensor, tuple[int, ...], bool], Tensor]) -> OpFn:
  def run(ctx: Ctx, x: Tensor, axes_in: Tensor | None = None, axes: Sequence[int] | None = None, keepdims: int = 1,
          noop_with_empty_axes: int = 0) -> Tensor:
    ax = _reduce_axes(ctx, x, axes_in, axes, noop_with_empty_axes)
    if ax is None: return x
    return fn(x, tuple(ax), bool(keepdims))
  return run

def _sum_keep_dtype(x: Tensor, ax: tuple[int, ...], k: bool) -> Tensor: return x.sum(ax, keepdim=k).cast(x.dtype)

OPS["ReduceSum"] = _reduction(_sum_keep_dtype)
OPS["ReduceMean"] = _reduction(lambda x, ax, k: x.mean(ax, keepdim=k))
OPS["ReduceMax"] = _reduction(lambda x, ax, k: x.max(ax, keepdim=k))
OPS["ReduceMin"] = _reduction(lambda x, ax, k: x.min(ax, keepdim=k))
OPS["ReduceProd"] = _reduction(lambda x, ax, k: x.prod(ax, keepdim=k).cast(x.dtype))
OPS["ReduceL1"] = _reduction(lambda x, ax, k: _sum_keep_dtype(x.abs(), ax, k))
OPS["ReduceL2"] = _reduction(lambda x, ax, k: (x * x).sum(ax, keepdim=k).sqrt().cast(x.dtype))
OPS["ReduceSumSquare"] = _reduction(lambda x, ax, k: _sum_keep_dtype(x * x, ax, k))
OPS["ReduceLogSum"] = _reduction(lambda x, ax, k: x.sum(ax, keepdim=k).log())
OPS["ReduceLogSumExp"] = _reduction(lambda x, ax, k: x.logsumexp(ax, keepdim=k))

@op("ArgMax", "ArgMin")
def arg_extreme(ctx: Ctx, x: Tensor, axis: int = 0, keepdims: int = 1, select_last_index: int = 0, _op: str = "") -> Tensor:
  axis = _axis(axis, x.ndim)
  fn = Tensor.argmax if _op == "ArgMax" else Tensor.argmin
  if select_last_index:
    n = _sh(x)[axis]
    out = (n - 1) - fn(x.flip(axis), axis, keepdim=bool(keepdims)).cast(dtypes.int64)
  else: out = fn(x, axis, keepdim=bool(keepdims)).cast(dtypes.int64)
  return out


# ---- softmax family

def _softmax_like(fn: Callable[..., Tensor]) -> OpFn:
  def run(ctx: Ctx, x: Tensor, axis: int | None = None) -> Tensor:
    if ctx.opset >= 13: return fn(x, _axis(-1 if axis is None else axis, x.ndim), ctx)
    # before opset 13 the input is seen as a 2-D matrix split at `axis` (default 1)
    a = _axis(1 if axis is None else axis, x.ndim)
    return fn(x.reshape(_prod(_sh(x)[:a]), _prod(_sh(x)[a:])), 1, ctx).reshape(_sh(x))
  return run

OPS["Softmax"] = _softmax_like(lambda x, a, ctx: x.softmax(a))
OPS["LogSoftmax"] = _softmax_like(lambda x, a, ctx: x.log_softmax(a))
OPS["Hardmax"] = _softmax_like(lambda x, a, ctx: x.argmax(a, keepdim=True).eq(ctx.arange(_sh(x)[a]).reshape(
  [-1 if i == a else 1 for i in range(x.ndim)])).cast(x.dtype))


# ---- shapes and movement

@op("Shape")
def shape(ctx: Ctx, x: Tensor, start: int = 0, end: int | None = None) -> Tensor:
  return ctx.tensor(np.array(_sh(x)[slice(start, end)], dtype=np.int64))

OPS["Size"] = lambda ctx, x: ctx.tensor(np.array(_prod(_sh(x)), dtype=np.int64))

@op("Reshape")
def reshape(ctx: Ctx, x: Tensor, shape: Tensor, allowzero: int = 0) -> Tensor:
  s = ctx.ints(shape)
  if not allowzero: s = [_sh(x)[i] if v == 0 else v for i, v in enumerate(s)]
  return x.reshape(s)

@op("Flatten")
def flatten(ctx: Ctx, x: Tensor, axis: int = 1) -> Tensor:
  a = _axis(axis, x.ndim)
  return x.reshape(_prod(_sh(x)[:a]), _prod(_sh(x)[a:]))

@op("Squeeze")
def squeeze(ctx: Ctx, x: Tensor, axes_in: Tensor | None = None, axes: Sequence[int] | None = None) -> Tensor:
  ax = ctx.ints(axes_in) if axes_in is not None else list(axes or [])
  ax = _axes(ax, x.ndim) if ax else [i for i, s in enumerate(_sh(x)) if s == 1]
  return x.reshape([s for i, s in enumerate(_sh(x)) if i not in ax])

@op("Unsqueeze")
def unsqueeze(ctx: Ctx, x: Tensor, axes_in: Tensor | None = None, axes: Sequence[int] | None = None) -> Tensor:
  ax = ctx.ints(axes_in) if axes_in is not None else list(axes or [])
  n = x.ndim + len(ax)
  ax = sorted(_axes(ax, n))
  dims = iter(_sh(x))
  return x.reshape([1 if i in ax else next(dims) for i in range(n)])

@op("Transpose")
def transpose(ctx: Ctx, x: Tensor, perm: Sequence[int] | None = None) -> Tensor:
  return x.permute(list(perm) if perm is not None else list(range(x.ndim))[::-1])

@op("Concat")
def concat(ctx: Ctx, *xs: Tensor, axis: int = 0) -> Tensor:
  xs_ = [x for x in xs if x is not None]
  return xs_[0].cat(*xs_[1:], dim=_axis(axis, xs_[0].ndim)) if len(xs_) > 1 else xs_[0]

@op("Split")
def split(ctx: Ctx, x: Tensor, split_in: Tensor | None = None, axis: int = 0, split: Sequence[int] | None = None,
          num_outputs: int | None = None) -> tuple[Tensor, ...]:
  a = _axis(axis, x.ndim)
  sizes = ctx.ints(split_in) if split_in is not None else list(split or [])
  if not sizes:
    n = num_outputs or ctx.n_outputs
    chunk = -(-_sh(x)[a] // n)
    sizes = [min(chunk, _sh(x)[a] - i * chunk) for i in range(n)]
  if sum(sizes) != _sh(x)[a]: raise ctx.error(f"Split sizes {sizes} do not add up to axis {a}'s length {_sh(x)[a]}")
  return tuple(x.split(sizes, a))

@op("Slice")
def slice_(ctx: Ctx, x: Tensor, starts_in: Tensor | None = None, ends_in: Tensor | None = None, axes_in: Tensor | None = None,
           steps_in: Tensor | None = None, starts: Sequence[int] = (), ends: Sequence[int] = (), axes: Sequence[int] = ()) -> Tensor:
  st = ctx.ints(starts_in) if starts_in is not None else list(starts)
  en = ctx.ints(ends_in) if ends_in is not None else list(ends)
  ax = ctx.ints(axes_in) if axes_in is not None else list(axes) or list(range(len(st)))
  sp = ctx.ints(steps_in) if steps_in is not None else [1] * len(st)
  sl: list[slice] = [slice(None)] * x.ndim
  for s, e, a, p in zip(st, en, _axes(ax, x.ndim), sp):
    n = _sh(x)[a]
    if p == 0: raise ctx.error("Slice step 0")
    s, e = s + n if s < 0 else s, e + n if e < 0 else e
    if p > 0: sl[a] = slice(min(max(s, 0), n), min(max(e, 0), n), p)
    else:
      s, e = min(max(s, 0), n - 1), min(max(e, -1), n - 1)
      sl[a] = slice(s, None if e < 0 else e, p)
  return x[tuple(sl)]

def _norm_index(idx: Tensor, n: int) -> Tensor: return (idx < 0).where(idx + n, idx)

@op("Gather")
def gather(ctx: Ctx, x: Tensor, idx: Tensor, axis: int = 0) -> Tensor:
  a = _axis(axis, x.ndim)
  return x[(slice(None),) * a + (_norm_index(idx, _sh(x)[a]).cast(dtypes.int32),)]

@op("GatherElements")
def gather_elements(ctx: Ctx, x: Tensor, idx: Tensor, axis: int = 0) -> Tensor:
  a = _axis(axis, x.ndim)
  return x.gather(a, _norm_index(idx, _sh(x)[a]).cast(dtypes.int32))

@op("GatherND")
def gather_nd(ctx: Ctx, x: Tensor, idx: Tensor, batch_dims: int = 0) -> Tensor:
  k, b = _sh(idx)[-1], batch_dims
  batch = [ctx.arange(s).reshape([s if j == i else 1 for j in range(idx.ndim - 1)]) for i, s in enumerate(_sh(idx)[:b])]
  comps = [_norm_index(idx[..., j], _sh(x)[b + j]).cast(dtypes.int32) for j in range(k)]
  return x[tuple(batch + comps)]

@op("ScatterElements", "Scatter")
def scatter_elements(ctx: Ctx, x: Tensor, idx: Tensor, upd: Tensor, axis: int = 0, reduction: str = "none") -> Tensor:
  a = _axis(axis, x.ndim)
  i = _norm_index(idx, _sh(x)[a]).cast(dtypes.int32)
  if reduction == "none": return x.scatter(a, i, upd)
  red = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}.get(reduction)
  if red is None: raise ctx.error(f"ScatterElements reduction {reduction!r}")
  return x.scatter_reduce(a, i, upd, red)  # type: ignore[arg-type]

@op("ScatterND")
def scatter_nd(ctx: Ctx, x: Tensor, idx: Tensor, upd: Tensor, reduction: str = "none") -> Tensor:
  k = _sh(idx)[-1]
  strides = [_prod(_sh(x)[j + 1:k]) for j in range(k)]
  lin = sum((_norm_index(idx[..., j], _sh(x)[j]).cast(dtypes.int32) * strides[j] for j in range(k)), ctx.full(_sh(idx)[:-1], 0, dtypes.int32))
  rest = _sh(x)[k:]
  flat = x.reshape(_prod(_sh(x)[:k]), *rest)
  u = upd.reshape(-1, *rest)
  li = lin.reshape(-1, *[1] * len(rest)).expand(_sh(u)) if rest else lin.reshape(-1)
  if reduction == "none": out = flat.scatter(0, li, u)
  else:
    red = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}.get(reduction)
    if red is None: raise ctx.error(f"ScatterND reduction {reduction!r}")
    out = flat.scatter_reduce(0, li, u, red)  # type: ignore[arg-type]
  return out.reshape(_sh(x))

@op("Expand")
def expand(ctx: Ctx, x: Tensor, shape: Tensor) -> Tensor:
  s = ctx.ints(shape)
  n = max(len(s), x.ndim)
  xs, ss = [1] * (n - x.ndim) + list(_sh(x)), [1] * (n - len(s)) + s
  return x.reshape(xs).expand([max(a, b) if 1 in (a, b) else b for a, b in zip(xs, ss)])

OPS["Tile"] = lambda ctx, x, reps: x.repeat(ctx.ints(reps))

@op("Pad")
def pad(ctx: Ctx, x: Tensor, pads_in: Tensor | None = None, value_in: Tensor | None = None, axes_in: Tensor | None = None,
        mode: str = "constant", pads: Sequence[int] = (), value: float = 0.0) -> Tensor:
  p = ctx.ints(pads_in) if pads_in is not None else list(pads)
  ax = _axes(ctx.ints(axes_in), x.ndim) if axes_in is not None else list(range(x.ndim))
  pairs: list[tuple[int, int]] = [(0, 0)] * x.ndim
  for i, a in enumerate(ax): pairs[a] = (p[i], p[i + len(ax)])
  m = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "wrap": "circular"}.get(mode)
  if m is None: raise ctx.unsupported(f"Pad mode {mode!r}")
  v = ctx.scalar(value_in) if value_in is not None else value
  return x.pad(tuple(pairs), mode=m, **({"value": v} if m == "constant" else {}))

@op("ConstantOfShape")
def constant_of_shape(ctx: Ctx, shape: Tensor, value: Any = None) -> Tensor:
  arr = np.zeros(1, np.float32) if value is None else value
  return ctx.full(tuple(ctx.ints(shape)), arr.reshape(-1)[0].item(), dtypes.from_numpy(arr.dtype))

@op("Range")
def range_(ctx: Ctx, start: Tensor, limit: Tensor, delta: Tensor) -> Tensor:
  s, lim, d = ctx.scalar(start), ctx.scalar(limit), ctx.scalar(delta)
  n = max(math.ceil((lim - s) / d), 0)
  return (ctx.arange(n, start.dtype) * d + s).cast(start.dtype) if n else ctx.full((0,), 0, start.dtype)

@op("EyeLike")
def eye_like(ctx: Ctx, x: Tensor, dtype: int | None = None, k: int = 0) -> Tensor:
  dt = dtype_of(dtype, ctx.node) if dtype is not None else x.dtype
  r, c = _sh(x)
  rows, cols = ctx.arange(r).reshape(r, 1), ctx.arange(c).reshape(1, c)
  return (cols - rows == k).cast(dt)

@op("Trilu")
def trilu(ctx: Ctx, x: Tensor, k: Tensor | None = None, upper: int = 1) -> Tensor:
  d = ctx.scalar(k) if k is not None else 0
  return x.triu(d) if upper else x.tril(d)

@op("CumSum")
def cumsum(ctx: Ctx, x: Tensor, axis: Tensor, exclusive: int = 0, reverse: int = 0) -> Tensor:
  a = _axis(ctx.scalar(axis), x.ndim)
  y = x.flip(a) if reverse else x
  out = y.cumsum(a).cast(x.dtype)
  if exclusive: out = out - y
  return out.flip(a) if reverse else out

@op("OneHot")
def one_hot(ctx: Ctx, idx: Tensor, depth: Tensor, values: Tensor, axis: int = -1) -> Tensor:
  d = int(ctx.scalar(depth))
  a = _axis(axis, idx.ndim + 1)
  i = idx.cast(dtypes.int64)
  i = (i < 0).where(i + d, i).unsqueeze(a)
  hot = i == ctx.arange(d, dtypes.int64).reshape([d if j == a else 1 for j in range(idx.ndim + 1)])
  return hot.where(values[1], values[0])

@op("DepthToSpace")
def depth_to_space(ctx: Ctx, x: Tensor, blocksize: int = 1, mode: str = "DCR") -> Tensor:
  n, c, h, w = _sh(x)
  b = blocksize
  if mode == "DCR": y = x.reshape(n, b, b, c // (b * b), h, w).permute(0, 3, 4, 1, 5, 2)
  else: y = x.reshape(n, c // (b * b), b, b, h, w).permute(0, 1, 4, 2, 5, 3)
  return y.reshape(n, c // (b * b), h * b, w * b)

@op("SpaceToDepth")
def space_to_depth(ctx: Ctx, x: Tensor, blocksize: int = 1) -> Tensor:
  n, c, h, w = _sh(x)
  b = blocksize
  return x.reshape(n, c, h // b, b, w // b, b).permute(0, 3, 5, 1, 2, 4).reshape(n, c * b * b, h // b, w // b)

@op("TopK")
def topk(ctx: Ctx, x: Tensor, k: Tensor, axis: int = -1, largest: int = 1, sorted: int = 1) -> tuple[Tensor, Tensor]:
  v, i = x.topk(int(ctx.scalar(k)), _axis(axis, x.ndim), largest=bool(largest), sorted_=True)
  return v, i.cast(dtypes.int64)

@op("NonZero")
def nonzero(ctx: Ctx, x: Tensor) -> Tensor:
  # its shape is the data's: read on the host (the graph cannot stay lazy past it)
  return ctx.tensor(np.array(np.nonzero(x.numpy()), dtype=np.int64).reshape(x.ndim, -1))

@op("Compress")
def compress(ctx: Ctx, x: Tensor, cond: Tensor, axis: int | None = None) -> Tensor:
  keep = np.nonzero(ctx.array(cond).reshape(-1))[0]
  if axis is None: x, a = x.reshape(-1), 0
  else: a = _axis(axis, x.ndim)
  keep = keep[keep < _sh(x)[a]]
  return x[(slice(None),) * a + (ctx.tensor(keep.astype(np.int32)),)]


# ---- neural-network layers

def _spatial_pads(ctx: Ctx, x: Tensor, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
                  pads: Sequence[int] | None, auto_pad: str, ceil_mode: int = 0) -> list[tuple[int, int]]:
  """(begin, end) padding per spatial axis, from `pads` or `auto_pad`."""
  n = len(kernel)
  if auto_pad in ("", "NOTSET"):
    p = list(pads) if pads else [0] * (2 * n)
    return [(p[i], p[i + n]) for i in range(n)]
  if auto_pad == "VALID": return [(0, 0)] * n
  if auto_pad not in ("SAME_UPPER", "SAME_LOWER"): raise ctx.error(f"auto_pad {auto_pad!r}")
  out = []
  for i in range(n):
    size = _sh(x)[2 + i]
    o = -(-size // strides[i])
    total = max((o - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - size, 0)
    small, big = total // 2, total - total // 2
    out.append((small, big) if auto_pad == "SAME_UPPER" else (big, small))
  return out

def _conv_attrs(ctx: Ctx, x: Tensor, kernel: Sequence[int], strides: Sequence[int] | None, dilations: Sequence[int] | None,
                pads: Sequence[int] | None, auto_pad: str) -> tuple[list[int], list[int], list[tuple[int, int]]]:
  n = len(kernel)
  st, dl = list(strides or [1] * n), list(dilations or [1] * n)
  return st, dl, _spatial_pads(ctx, x, kernel, st, dl, pads, auto_pad)

def _pad_spatial(x: Tensor, pairs: Sequence[tuple[int, int]], value: float = 0.0) -> Tensor:
  if not any(b or e for b, e in pairs): return x
  return x.pad(((0, 0), (0, 0), *pairs), value=value)

@op("Conv")
def conv(ctx: Ctx, x: Tensor, w: Tensor, b: Tensor | None = None, auto_pad: str = "NOTSET", dilations: Sequence[int] | None = None,
         group: int = 1, kernel_shape: Sequence[int] | None = None, pads: Sequence[int] | None = None,
         strides: Sequence[int] | None = None) -> Tensor:
  st, dl, pp = _conv_attrs(ctx, x, kernel_shape or _sh(w)[2:], strides, dilations, pads, auto_pad)
  return _pad_spatial(x, pp).conv2d(w, b, groups=group, stride=st, dilation=dl, padding=0)

@op("ConvTranspose")
def conv_transpose(ctx: Ctx, x: Tensor, w: Tensor, b: Tensor | None = None, auto_pad: str = "NOTSET",
                   dilations: Sequence[int] | None = None, group: int = 1, kernel_shape: Sequence[int] | None = None,
                   output_padding: Sequence[int] | None = None, output_shape: Sequence[int] | None = None,
                   pads: Sequence[int] | None = None, strides: Sequence[int] | None = None) -> Tensor:
  k = list(kernel_shape or _sh(w)[2:])
  n = len(k)
  st, dl = list(strides or [1] * n), list(dilations or [1] * n)
  op_ = list(output_padding or [0] * n)
  full = [st[i] * (_sh(x)[2 + i] - 1) + (k[i] - 1) * dl[i] + 1 for i in range(n)]
  if output_shape is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER"):
    target = list(output_shape)[-n:] if output_shape is not None else [_sh(x)[2 + i] * st[i] for i in range(n)]
    pairs = []
    for i in range(n):
      total = full[i] + op_[i] - target[i]
      pairs.append((total // 2, total - total // 2) if auto_pad == "SAME_UPPER" else (total - total // 2, total // 2))
  elif auto_pad == "VALID": pairs = [(0, 0)] * n
  else:
    p = list(pads or [0] * (2 * n))
    pairs = [(p[i], p[i + n]) for i in range(n)]
  y = x.conv_transpose2d(w, None, groups=group, stride=st, dilation=dl, padding=0)
  # output_padding grows the end (only the bias reaches it); the pads crop
  y = y.pad(((0, 0), (0, 0), *[(-pb, op_[i] - pe) for i, (pb, pe) in enumerate(pairs)]))
  return y if b is None else y + b.reshape(1, -1, *[1] * n)

def _pool_geometry(ctx: Ctx, x: Tensor, kernel_shape: Sequence[int], strides: Sequence[int] | None, dilations: Sequence[int] | None,
                   pads: Sequence[int] | None, auto_pad: str) -> tuple[list[int], list[int], list[int], list[tuple[int, int]]]:
  k = list(kernel_shape)
  n = len(k)
  st, dl = list(strides or [1] * n), list(dilations or [1] * n)
  return k, st, dl, _spatial_pads(ctx, x, k, st, dl, pads, auto_pad)

@op("MaxPool")
def max_pool(ctx: Ctx, x: Tensor, auto_pad: str = "NOTSET", ceil_mode: int = 0, dilations: Sequence[int] | None = None,
             kernel_shape: Sequence[int] = (), pads: Sequence[int] | None = None, storage_order: int = 0,
             strides: Sequence[int] | None = None) -> Tensor | tuple[Tensor, Tensor]:
  k, st, dl, pp = _pool_geometry(ctx, x, kernel_shape, strides, dilations, pads, auto_pad)
  symmetric = all(b == e and b <= kk // 2 for (b, e), kk in zip(pp, k))
  if ctx.n_outputs < 2:
    xp = x if symmetric else _pad_spatial(x, pp, -math.inf if dtypes.is_float(x.dtype) else dtypes.min(x.dtype))
    return xp.max_pool2d(k, st, dl, [b for b, _ in pp] if symmetric else 0, ceil_mode=bool(ceil_mode))
  if not symmetric: raise ctx.unsupported("MaxPool indices with asymmetric pads")
  y, idx = x.max_pool2d(k, st, dl, [b for b, _ in pp], ceil_mode=bool(ceil_mode), return_indices=True)  # type: ignore[misc]
  spatial = _sh(x)[2:]
  idx = idx.cast(dtypes.int64)
  if storage_order:
    if len(spatial) != 2: raise ctx.unsupported("MaxPool storage_order=1 beyond 2-D")
    idx = (idx // spatial[1]) + (idx % spatial[1]) * spatial[0]
  plane = _prod(spatial)
  base = ctx.arange(_sh(x)[0] * _sh(x)[1], dtypes.int64).reshape(_sh(x)[0], _sh(x)[1], *[1] * len(spatial)) * plane
  return y, idx + base

@op("AveragePool")
def average_pool(ctx: Ctx, x: Tensor, auto_pad: str = "NOTSET", ceil_mode: int = 0, count_include_pad: int = 0,
                 dilations: Sequence[int] | None = None, kernel_shape: Sequence[int] = (), pads: Sequence[int] | None = None,
                 strides: Sequence[int] | None = None) -> Tensor:
  k, st, dl, pp = _pool_geometry(ctx, x, kernel_shape, strides, dilations, pads, auto_pad)
  if all(b == e and b <= kk // 2 for (b, e), kk in zip(pp, k)):
    return x.avg_pool2d(k, st, dl, [b for b, _ in pp], ceil_mode=bool(ceil_mode), count_include_pad=bool(count_include_pad))
  window = _prod(k)
  total = _pad_spatial(x, pp).avg_pool2d(k, st, dl, 0, ceil_mode=bool(ceil_mode), count_include_pad=True) * window
  if count_include_pad: return total / window
  ones = _pad_spatial(ctx.full((1, 1, *_sh(x)[2:]), 1, x.dtype), pp)
  return total / (ones.avg_pool2d(k, st, dl, 0, ceil_mode=bool(ceil_mode), count_include_pad=True) * window)

@op("LpPool")
def lp_pool(ctx: Ctx, x: Tensor, auto_pad: str = "NOTSET", ceil_mode: int = 0, dilations: Sequence[int] | None = None,
            kernel_shape: Sequence[int] = (), p: int = 2, pads: Sequence[int] | None = None, strides: Sequence[int] | None = None) -> Tensor:
  k, st, dl, pp = _pool_geometry(ctx, x, kernel_shape, strides, dilations, pads, auto_pad)
  s = _pad_spatial(x.abs().pow(p), pp).avg_pool2d(k, st, dl, 0, ceil_mode=bool(ceil_mode), count_include_pad=True) * _prod(k)
  return s.pow(1.0 / p)

OPS["GlobalAveragePool"] = lambda ctx, x: x.mean(tuple(range(2, x.ndim)), keepdim=True)
OPS["GlobalMaxPool"] = lambda ctx, x: x.max(tuple(range(2, x.ndim)), keepdim=True)
OPS["GlobalLpPool"] = lambda ctx, x, p=2: x.abs().pow(p).sum(tuple(range(2, x.ndim)), keepdim=True).pow(1.0 / p)

def _channel(t: Tensor, ndim: int) -> Tensor: return t.reshape(1, -1, *[1] * (ndim - 2))

@op("BatchNormalization")
def batch_norm(ctx: Ctx, x: Tensor, scale: Tensor, bias: Tensor, mean: Tensor, var: Tensor, epsilon: float = 1e-5,
               momentum: float = 0.9, training_mode: int = 0, spatial: int = 1) -> Tensor | tuple[Tensor, ...]:
  if training_mode:
    axes = tuple(i for i in range(x.ndim) if i != 1)
    m, v = x.mean(axes), x.var(axes, correction=0)
    y = (x - _channel(m, x.ndim)) * (_channel(v, x.ndim) + epsilon).rsqrt() * _channel(scale, x.ndim) + _channel(bias, x.ndim)
    return y, mean * momentum + m * (1 - momentum), var * momentum + v * (1 - momentum)
  return (x - _channel(mean, x.ndim)) * (_channel(var, x.ndim) + epsilon).rsqrt() * _channel(scale, x.ndim) + _channel(bias, x.ndim)

@op("InstanceNormalization")
def instance_norm(ctx: Ctx, x: Tensor, scale: Tensor, bias: Tensor, epsilon: float = 1e-5) -> Tensor:
  return x.layernorm(tuple(range(2, x.ndim)), epsilon) * _channel(scale, x.ndim) + _channel(bias, x.ndim)

@op("LayerNormalization")
def layer_norm(ctx: Ctx, x: Tensor, scale: Tensor, bias: Tensor | None = None, axis: int = -1, epsilon: float = 1e-5,
               stash_type: int = 1) -> tuple[Tensor, ...]:
  a = _axis(axis, x.ndim)
  axes = tuple(range(a, x.ndim))
  xf = x.float() if stash_type == 1 and x.dtype != dtypes.float64 else x
  m = xf.mean(axes, keepdim=True)
  inv = ((xf - m).square().mean(axes, keepdim=True) + epsilon).rsqrt()
  y = ((xf - m) * inv).cast(x.dtype) * scale
  if bias is not None: y = y + bias
  return y, m, inv

@op("RMSNormalization")
def rms_norm(ctx: Ctx, x: Tensor, scale: Tensor, axis: int = -1, epsilon: float = 1e-5, stash_type: int = 1) -> Tensor:
  axes = tuple(range(_axis(axis, x.ndim), x.ndim))
  xf = x.float() if stash_type == 1 and x.dtype != dtypes.float64 else x
  return (xf * (xf.square().mean(axes, keepdim=True) + epsilon).rsqrt()).cast(x.dtype) * scale

@op("GroupNormalization")
def group_norm(ctx: Ctx, x: Tensor, scale: Tensor, bias: Tensor, epsilon: float = 1e-5, num_groups: int = 1,
               stash_type: int = 1) -> Tensor:
  n, c = _sh(x)[:2]
  g = x.reshape(n, num_groups, -1).layernorm(-1, epsilon).reshape(_sh(x))
  if _sh(scale)[0] == num_groups and num_groups != c:  # opset 18: one scale per group
    scale, bias = scale.repeat_interleave(c // num_groups), bias.repeat_interleave(c // num_groups)
  return g * _channel(scale, x.ndim) + _channel(bias, x.ndim)

@op("LpNormalization")
def lp_norm(ctx: Ctx, x: Tensor, axis: int = -1, p: int = 2) -> Tensor:
  a = _axis(axis, x.ndim)
  norm = x.abs().sum(a, keepdim=True) if p == 1 else x.square().sum(a, keepdim=True).sqrt()
  return (norm == 0).where(0, x / norm).cast(x.dtype)

@op("MeanVarianceNormalization")
def mvn(ctx: Ctx, x: Tensor, axes: Sequence[int] = (0, 2, 3)) -> Tensor:
  ax = tuple(_axes(axes, x.ndim))
  m = x.mean(ax, keepdim=True)
  return (x - m) / ((x - m).square().mean(ax, keepdim=True).sqrt() + 1e-9)

@op("LRN")
def lrn(ctx: Ctx, x: Tensor, alpha: float = 1e-4, beta: float = 0.75, bias: float = 1.0, size: int = 1) -> Tensor:
  c = _sh(x)[1]
  sq = x.square().pad(((0, 0), ((size - 1) // 2, size // 2), *[(0, 0)] * (x.ndim - 2)))
  window = sum((sq.shrink(((0, _sh(sq)[0]), (i, i + c), *[(0, s) for s in _sh(sq)[2:]])) for i in range(size)), x * 0)
  return x / (bias + (alpha / size) * window).pow(beta)

@op("Dropout")
def dropout(ctx: Ctx, x: Tensor, ratio: Tensor | None = None, training_mode: Tensor | None = None, seed: int | None = None,
            is_test: int = 0) -> tuple[Tensor, Tensor]:
  if training_mode is not None and bool(ctx.scalar(training_mode)) and (ratio is None or ctx.scalar(ratio) > 0):
    raise ctx.unsupported("Dropout in training mode (a random op: its mask cannot match another runtime's)")
  return x, ctx.full(_sh(x), True, dtypes.bool)


# ---- losses

@op("NegativeLogLikelihoodLoss")
def nll_loss(ctx: Ctx, x: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int | None = None,
             reduction: str = "mean") -> Tensor:
  t = target.cast(dtypes.int32)
  valid = (t != ignore_index) if ignore_index is not None else ctx.full(_sh(t), True, dtypes.bool)
  safe = valid.where(t, 0)
  picked = -x.gather(1, safe.unsqueeze(1)).squeeze(1)
  w = weight[safe] if weight is not None else ctx.full(_sh(t), 1, x.dtype)
  w = valid.where(w, 0).cast(x.dtype)
  loss = picked * w
  if reduction == "none": return loss
  if reduction == "sum": return loss.sum()
  if reduction == "mean": return loss.sum() / w.sum()
  raise ctx.error(f"reduction {reduction!r}")

@op("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy(ctx: Ctx, x: Tensor, target: Tensor, weight: Tensor | None = None, ignore_index: int | None = None,
                          reduction: str = "mean") -> tuple[Tensor, Tensor]:
  logp = x.log_softmax(1)
  return nll_loss(ctx, logp, target, weight, ignore_index, reduction), logp


# ---- quantization

def _per_axis(ctx: Ctx, p: Tensor, x: Tensor, axis: int, block_size: int) -> Tensor:
  if p.ndim == 0 or p.numel() == 1: return p.reshape([])
  a = _axis(axis, x.ndim)
  if block_size: return p.repeat_interleave(block_size, a).shrink(tuple((0, s) for s in _sh(x)))
  return p.reshape([-1 if i == a else 1 for i in range(x.ndim)])

@op("DequantizeLinear")
def dequantize(ctx: Ctx, x: Tensor, scale: Tensor, zero: Tensor | None = None, axis: int = 1, block_size: int = 0,
               output_dtype: int = 0) -> Tensor:
  s = _per_axis(ctx, scale, x, axis, block_size)
  xf = x.cast(dtypes.float32)
  if zero is not None: xf = xf - _per_axis(ctx, zero, x, axis, block_size).cast(dtypes.float32)
  return (xf * s.cast(dtypes.float32)).cast(scale.dtype)

@op("QuantizeLinear")
def quantize(ctx: Ctx, x: Tensor, scale: Tensor, zero: Tensor | None = None, axis: int = 1, block_size: int = 0,
             output_dtype: int = 0, saturate: int = 1, precision: int = 0) -> Tensor:
  dt = zero.dtype if zero is not None else dtype_of(output_dtype, ctx.node) if output_dtype else dtypes.uint8
  if not dtypes.is_int(dt): raise ctx.unsupported(f"QuantizeLinear to {dt}")
  q = (x.float() / _per_axis(ctx, scale, x, axis, block_size).float()).round()
  if zero is not None: q = q + _per_axis(ctx, zero, x, axis, block_size).float()
  return q.clip(dtypes.min(dt), dtypes.max(dt)).cast(dt)

@op("DynamicQuantizeLinear")
def dynamic_quantize(ctx: Ctx, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
  lo, hi = x.min().minimum(0), x.max().maximum(0)
  scale = (hi - lo) / 255
  zp = (-lo / scale).round().clip(0, 255)
  return (x / scale).round().add(zp).clip(0, 255).cast(dtypes.uint8), scale, zp.cast(dtypes.uint8)


# ---- attention

@op("Attention")
def attention(ctx: Ctx, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, past_k: Tensor | None = None,
              past_v: Tensor | None = None, nonpad_kv_seqlen: Tensor | None = None, is_causal: int = 0,
              kv_num_heads: int | None = None, q_num_heads: int | None = None, qk_matmul_output_mode: int = 0,
              scale: float | None = None, softcap: float = 0.0, softmax_precision: int | None = None) -> tuple[Tensor, ...]:
  three_d = q.ndim == 3
  if three_d:
    if not q_num_heads or not kv_num_heads: raise ctx.error("Attention on 3-D inputs needs q_num_heads and kv_num_heads")
    b = _sh(q)[0]
    q = q.reshape(b, _sh(q)[1], q_num_heads, -1).permute(0, 2, 1, 3)
    k = k.reshape(b, _sh(k)[1], kv_num_heads, -1).permute(0, 2, 1, 3)
    v = v.reshape(b, _sh(v)[1], kv_num_heads, -1).permute(0, 2, 1, 3)
  if past_k is not None: k = past_k.cat(k, dim=2)
  if past_v is not None: v = past_v.cat(v, dim=2)
  present_k, present_v = k, v
  hq, hk = _sh(q)[1], _sh(k)[1]
  if hq != hk:
    k, v = k.repeat_interleave(hq // hk, 1), v.repeat_interleave(hq // hk, 1)
  sc = scale if scale is not None else 1 / math.sqrt(_sh(q)[-1])
  scores = (q * sc) @ k.transpose(-1, -2)
  if softcap: scores = softcap * (scores / softcap).tanh()
  qk = scores
  sq, skv = _sh(scores)[-2], _sh(scores)[-1]
  bias = None
  if mask is not None:
    m = mask
    if _sh(m)[-1] < skv: m = m.pad(tuple([(0, 0)] * (m.ndim - 1) + [(0, skv - _sh(m)[-1])]), value=(-math.inf if m.dtype != dtypes.bool else False))
    bias = m.where(0.0, -math.inf) if m.dtype == dtypes.bool else m
  if is_causal:
    # query i sees the past and the new keys up to its own position
    past = _sh(past_k)[2] if past_k is not None else 0
    causal = ctx.arange(skv).reshape(1, skv) <= ctx.arange(sq).reshape(sq, 1) + past
    cb = causal.where(0.0, -math.inf)
    bias = cb if bias is None else bias + cb
  if nonpad_kv_seqlen is not None:
    keep = ctx.arange(skv, dtypes.int64).reshape(1, 1, 1, skv) < nonpad_kv_seqlen.cast(dtypes.int64).reshape(-1, 1, 1, 1)
    pb = keep.where(0.0, -math.inf)
    bias = pb if bias is None else bias + pb
  if bias is not None: scores = scores + bias
  if qk_matmul_output_mode == 2: qk = scores
  p = scores.float().softmax(-1).cast(q.dtype) if softmax_precision is not None else scores.softmax(-1)
  if qk_matmul_output_mode == 3: qk = p
  y = p @ v
  if three_d: y = y.permute(0, 2, 1, 3).reshape(_sh(y)[0], _sh(y)[2], -1)
  return y, present_k, present_v, qk


# ---- resize: one interpolation matrix per resized axis

def _resize_matrix(n_in: int, n_out: int, scale: float, mode: str, coord: str, nearest_mode: str, cubic_a: float,
                   exclude_outside: int, antialias: int, roi: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
  """(out × in) weights and a per-output flag of outputs outside the input (tf_crop_and_resize's extrapolation). The
  coordinate maps use the scaled length (scale · n_in, not rounded), as the ONNX reference does."""
  o = np.arange(n_out, dtype=np.float64)
  width = scale * n_in
  if coord == "half_pixel": x = (o + 0.5) / scale - 0.5
  elif coord == "half_pixel_symmetric": x = n_in / 2 * (1 - n_out / width) + (o + 0.5) / scale - 0.5
  elif coord == "pytorch_half_pixel": x = (o + 0.5) / scale - 0.5 if width != 1 else np.full(n_out, -0.5)
  elif coord == "align_corners": x = o * (n_in - 1) / (width - 1) if width != 1 else np.zeros(n_out)
  elif coord == "asymmetric": x = o / scale
  elif coord == "tf_crop_and_resize":
    lo, hi = roi
    x = (o * (hi - lo) * (n_in - 1) / (width - 1) if width != 1 else np.full(n_out, (hi - lo) * (n_in - 1) / 2)) + lo * (n_in - 1)
  else: raise OnnxError(f"Resize coordinate_transformation_mode {coord!r}")
  outside = (x < 0) | (x > n_in - 1) if coord == "tf_crop_and_resize" else np.zeros(n_out, bool)
  # the taps are base + offsets, base = ceil(x) - 1, so the fraction r = x - base is in (0, 1]
  base = np.ceil(x) - 1
  r = x - base
  m = np.zeros((n_out, n_in))
  rows = np.arange(n_out)
  if mode == "nearest":
    up = {"round_prefer_floor": r > 0.5, "round_prefer_ceil": r >= 0.5, "floor": r == 1, "ceil": np.ones(n_out, bool)}.get(nearest_mode)
    if up is None: raise OnnxError(f"Resize nearest_mode {nearest_mode!r}")
    m[rows, np.clip(base + up, 0, n_in - 1).astype(int)] = 1
    return m, outside
  if mode not in ("linear", "cubic"): raise OnnxError(f"Resize mode {mode!r}")
  s = min(scale, 1.0) if antialias else 1.0
  start = int(np.floor(-(1 if mode == "linear" else 2) / s) + 1)
  offsets = np.arange(start, 2 - start)
  d = np.abs(s * (offsets[None, :] - r[:, None]))
  if mode == "linear": w = np.clip(1 - d, 0, 1)
  else:
    a = cubic_a
    w = np.where(d <= 1, ((a + 2) * d - (a + 3)) * d * d + 1, np.where(d < 2, ((d - 5) * d + 8) * d * a - 4 * a, 0.0))
  if antialias: w = w / w.sum(1, keepdims=True)
  taps = base[:, None] + offsets[None, :]
  if exclude_outside:
    w = np.where((taps >= 0) & (taps < n_in), w, 0)
    w = w / w.sum(1, keepdims=True)
  np.add.at(m, (np.repeat(rows, len(offsets)), np.clip(taps, 0, n_in - 1).astype(int).reshape(-1)), w.reshape(-1))
  return m, outside

@op("Resize", "Upsample")
def resize(ctx: Ctx, x: Tensor, roi: Tensor | None = None, scales: Tensor | None = None, sizes: Tensor | None = None,
           antialias: int = 0, axes: Sequence[int] | None = None, coordinate_transformation_mode: str = "half_pixel",
           cubic_coeff_a: float = -0.75, exclude_outside: int = 0, extrapolation_value: float = 0.0,
           keep_aspect_ratio_policy: str = "stretch", mode: str = "nearest", nearest_mode: str = "round_prefer_floor",
           _op: str = "") -> Tensor:
  if _op == "Upsample":  # Upsample(X, scales): asymmetric nearest or linear
    scales, roi, coordinate_transformation_mode, nearest_mode = roi, None, "asymmetric", "floor"
  ax = _axes(axes, x.ndim) if axes else list(range(x.ndim))
  sc = [float(v) for v in ctx.array(scales).reshape(-1)] if scales is not None and scales.numel() else None
  sz = ctx.ints(sizes) if sizes is not None and sizes.numel() else None
  if sz is not None:
    in_sz = [_sh(x)[a] for a in ax]
    if keep_aspect_ratio_policy != "stretch":
      pick = min if keep_aspect_ratio_policy == "not_larger" else max
      r = pick(s / i for s, i in zip(sz, in_sz))
      sz = [int(round(r * i)) for i in in_sz]
      sc = [r] * len(ax)
    else: sc = [s / i for s, i in zip(sz, in_sz)]
  elif sc is not None: sz = [int(math.floor(_sh(x)[a] * s)) for a, s in zip(ax, sc)]
  else: raise ctx.error("Resize needs scales or sizes")
  assert sc is not None
  rois = [float(v) for v in ctx.array(roi).reshape(-1)] if roi is not None and roi.numel() else []
  out = x.float() if not dtypes.is_float(x.dtype) else x
  for j, a in enumerate(ax):
    n_in, n_out = _sh(x)[a], sz[j]
    if n_in == n_out and sc[j] == 1.0 and coordinate_transformation_mode != "tf_crop_and_resize": continue
    roi_a = (rois[j], rois[j + len(ax)]) if rois else (0.0, 1.0)
    m, outside = _resize_matrix(n_in, n_out, sc[j], mode, coordinate_transformation_mode, nearest_mode, cubic_coeff_a,
                                exclude_outside, antialias, roi_a)
    moved = out.transpose(a, -1)
    moved = moved @ ctx.tensor(m.T.astype(np.float32)).cast(out.dtype)
    if outside.any(): moved = ctx.tensor(outside).where(extrapolation_value, moved)
    out = moved.transpose(a, -1)
  return out.round().cast(x.dtype) if not dtypes.is_float(x.dtype) else out


# ---- bit casts, scans, windows

@op("BitCast")
def bitcast(ctx: Ctx, x: Tensor, to: int = 0) -> Tensor:
  dt = dtype_of(to, ctx.node)
  if dt.itemsize != x.dtype.itemsize: raise ctx.error(f"BitCast from {x.dtype} to {dt}: the bit widths differ")
  # a bool is one byte holding 0 or 1: to and from it, the bits are the value
  return x.cast(dt) if dtypes.bool in (dt, x.dtype) else x.bitcast(dt)

@op("CumProd")
def cumprod(ctx: Ctx, x: Tensor, axis: Tensor, exclusive: int = 0, reverse: int = 0) -> Tensor:
  a = _axis(ctx.scalar(axis), x.ndim)
  y = x.flip(a) if reverse else x
  out = y.cumprod(a).cast(x.dtype)
  if exclusive: out = out.pad(tuple((1, -1) if i == a else (0, 0) for i in range(x.ndim)), value=1)
  return out.flip(a) if reverse else out

def _window(kind: str) -> OpFn:
  def run(ctx: Ctx, size: Tensor, output_datatype: int = 1, periodic: int = 1) -> Tensor:
    n = int(ctx.scalar(size))
    i, d = np.arange(n, dtype=np.float64), float(n if periodic else n - 1)
    w = {"Hann": lambda: np.sin(i * np.pi / d) ** 2,
         "Hamming": lambda: 25 / 46 - (21 / 46) * np.cos(2 * np.pi * i / d),
         "Blackman": lambda: 0.42 - 0.5 * np.cos(2 * np.pi * i / d) + 0.08 * np.cos(4 * np.pi * i / d)}[kind]()
    return ctx.tensor(w.astype(np.float32)).cast(dtype_of(output_datatype, ctx.node))
  return run

for _w in ("Hann", "Hamming", "Blackman"): OPS[f"{_w}Window"] = _window(_w)


# ---- crops, unpooling, sequences

@op("CenterCropPad")
def center_crop_pad(ctx: Ctx, x: Tensor, shape: Tensor, axes: Sequence[int] | None = None) -> Tensor:
  ax = _axes(axes, x.ndim) if axes else list(range(x.ndim))
  pairs: list[tuple[int, int]] = [(0, 0)] * x.ndim
  for a, want in zip(ax, ctx.ints(shape)):
    d = want - _sh(x)[a]  # > 0 pads, < 0 crops; the odd element goes to the end either way
    pairs[a] = (d // 2, d - d // 2) if d >= 0 else (-((-d) // 2), -((-d) - (-d) // 2))
  return x.pad(tuple(pairs))

@op("MaxUnpool")
def max_unpool(ctx: Ctx, x: Tensor, idx: Tensor, output_shape: Tensor | None = None, kernel_shape: Sequence[int] = (),
               pads: Sequence[int] | None = None, strides: Sequence[int] | None = None) -> Tensor:
  n = len(kernel_shape)
  st, p = list(strides or [1] * n), list(pads or [0] * (2 * n))
  inferred = [*_sh(x)[:2], *[(_sh(x)[2 + i] - 1) * st[i] + kernel_shape[i] - p[i] - p[i + n] for i in range(n)]]
  flat = ctx.full((_prod(inferred),), 0, x.dtype)
  y = flat.scatter(0, idx.reshape(-1).cast(dtypes.int32), x.reshape(-1)).reshape(inferred)
  # the indices address the inferred shape (as the reference does); a larger output_shape grows it at the ends
  want = ctx.ints(output_shape) if output_shape is not None else inferred
  return y.pad(tuple((0, w - s) for w, s in zip(want, inferred)))

@op("ReverseSequence")
def reverse_sequence(ctx: Ctx, x: Tensor, lens: Tensor, batch_axis: int = 1, time_axis: int = 0) -> Tensor:
  t = ctx.arange(_sh(x)[time_axis], dtypes.int64).reshape([-1 if i == time_axis else 1 for i in range(x.ndim)])
  n = lens.cast(dtypes.int64).reshape([-1 if i == batch_axis else 1 for i in range(x.ndim)])
  src = (t < n).where(n - 1 - t, t).expand(_sh(x))
  return x.gather(time_axis, src.cast(dtypes.int32))

@op("TensorScatter")
def tensor_scatter(ctx: Ctx, cache: Tensor, update: Tensor, write_indices: Tensor | None = None, mode: str = "linear",
                   axis: int = -2) -> Tensor:
  a = _axis(axis, cache.ndim)
  b = _sh(cache)[0]
  start = write_indices.cast(dtypes.int64) if write_indices is not None else ctx.full((b,), 0, dtypes.int64)
  pos = start.reshape(b, *[1] * (cache.ndim - 1)) + ctx.arange(_sh(update)[a], dtypes.int64).reshape(
    [-1 if i == a else 1 for i in range(cache.ndim)])
  if mode == "circular": pos = pos % _sh(cache)[a]
  elif mode != "linear": raise ctx.error(f"TensorScatter mode {mode!r}")
  return cache.scatter(a, pos.expand(_sh(update)).cast(dtypes.int32), update)

@op("Unique")
def unique(ctx: Ctx, x: Tensor, axis: int | None = None, sorted: int = 1) -> tuple[Tensor, ...]:
  # the output's length is the data's: computed on the host
  a = x.numpy()
  y, first, inverse, counts = np.unique(a, True, True, True, axis=None if axis is None else _axis(axis, x.ndim))
  if not sorted:
    order = np.argsort(first)
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    first, counts, inverse = first[order], counts[order], rank[inverse.reshape(-1)]
    y = np.take(a if axis is not None else a.reshape(-1), first, axis=0 if axis is None else _axis(axis, x.ndim))
  return tuple(ctx.tensor(np.ascontiguousarray(v)) for v in (y, first.astype(np.int64), inverse.reshape(-1).astype(np.int64),
                                                              counts.astype(np.int64)))


# ---- signal processing: DFTs as products with cos/sin matrices

def _dft_matrices(n_in: int, n_fft: int, n_out: int, inverse: bool) -> tuple[np.ndarray, np.ndarray]:
  k = np.arange(n_out)[:, None]
  t = np.arange(min(n_in, n_fft))[None, :]
  ang = 2 * np.pi * k * t / n_fft
  return np.cos(ang), (np.sin(ang) if inverse else -np.sin(ang))

def _dft(ctx: Ctx, x: Tensor, axis: int, n_fft: int, inverse: bool, onesided: bool) -> Tensor:
  """x (..., 1 or 2) along `axis` (not the last): the complex result as (..., 2)."""
  re = x[..., 0]
  im = x[..., 1] if _sh(x)[-1] == 2 else None
  a = axis % x.ndim
  n = _sh(x)[a]
  take = min(n, n_fft)
  def along(t: Tensor, m: np.ndarray) -> Tensor:  # (out × take) applied along axis a of t
    moved = t.transpose(a, -1)[..., :take]
    return (moved @ ctx.tensor(m.T.astype(np.float32)).cast(t.dtype)).transpose(a, -1)
  if inverse and onesided:  # the real signal of a one-sided spectrum (Hermitian symmetry)
    kk = np.arange(n)[None, :]
    tt = np.arange(n_fft)[:, None]
    wgt = np.where((kk == 0) | ((n_fft % 2 == 0) & (kk == n_fft // 2)), 1.0, 2.0) / n_fft
    ang = 2 * np.pi * tt * kk / n_fft
    out = along(re, wgt * np.cos(ang))
    if im is not None: out = out - along(im, wgt * np.sin(ang))
    return out.unsqueeze(-1)
  n_out = n_fft // 2 + 1 if onesided else n_fft
  c, s = _dft_matrices(n, n_fft, n_out, inverse)
  if inverse: c, s = c / n_fft, s / n_fft
  out_re, out_im = along(re, c), along(re, s)
  if im is not None: out_re, out_im = out_re - along(im, s), out_im + along(im, c)
  return out_re.unsqueeze(-1).cat(out_im.unsqueeze(-1), dim=-1)

@op("DFT")
def dft(ctx: Ctx, x: Tensor, dft_length: Tensor | None = None, axis_in: Tensor | None = None, axis: int | None = None,
        inverse: int = 0, onesided: int = 0) -> Tensor:
  a = int(ctx.scalar(axis_in)) if axis_in is not None else (axis if axis is not None else (1 if ctx.opset < 20 else -2))
  a = a % x.ndim
  n = _sh(x)[a]
  n_fft = int(ctx.scalar(dft_length)) if dft_length is not None else (2 * (n - 1) if inverse and onesided else n)
  return _dft(ctx, x, a, n_fft, bool(inverse), bool(onesided))

@op("STFT")
def stft(ctx: Ctx, x: Tensor, step: Tensor, window: Tensor | None = None, frame_length: Tensor | None = None,
         onesided: int = 1) -> Tensor:
  hop = int(ctx.scalar(step))
  n = int(ctx.scalar(frame_length)) if frame_length is not None else _sh(window)[0] if window is not None else 0
  if not n: raise ctx.error("STFT needs a window or a frame_length")
  frames = 1 + (_sh(x)[1] - n) // hop
  idx = (np.arange(frames)[:, None] * hop + np.arange(n)[None, :]).reshape(-1)
  f = x[:, ctx.tensor(idx.astype(np.int32))].reshape(_sh(x)[0], frames, n, _sh(x)[-1])
  if window is not None: f = f * window.reshape(1, 1, n, 1)
  return _dft(ctx, f, 2, n, False, bool(onesided) and _sh(x)[-1] == 1)

@op("MelWeightMatrix")
def mel_weight_matrix(ctx: Ctx, num_mel_bins: Tensor, dft_length: Tensor, sample_rate: Tensor, lower_edge_hertz: Tensor,
                      upper_edge_hertz: Tensor, output_datatype: int = 1) -> Tensor:
  """Triangular filters with peak 1, their edges evenly spaced on the mel scale, as (dft_length // 2 + 1, num_mel_bins)."""
  n_mel, n_fft, rate = int(ctx.scalar(num_mel_bins)), int(ctx.scalar(dft_length)), float(ctx.scalar(sample_rate))
  def mel(f: float) -> float: return 2595 * math.log10(1 + f / 700)
  lo, hi = mel(float(ctx.scalar(lower_edge_hertz))), mel(float(ctx.scalar(upper_edge_hertz)))
  # n_mel + 2 edges at steps of (hi - lo) / (n_mel + 2), as the reference and onnxruntime space them, to whole DFT bins
  hz = 700 * (10 ** ((np.arange(n_mel + 2) * ((hi - lo) / (n_mel + 2)) + lo) / 2595) - 1)
  edges = np.floor((n_fft + 1) * hz / rate).astype(np.float32)
  left, center, right = (ctx.tensor(edges[i:i + n_mel].reshape(1, n_mel)) for i in range(3))
  j = ctx.arange(n_fft // 2 + 1, dtypes.float32).reshape(-1, 1)
  rising = (j == center).where(1.0, (j - left) / (center - left).maximum(1))  # 1 at the center (also when left == center)
  falling = (right - j) / (right - center).maximum(1)
  w = ((j >= left) & (j <= center)).where(rising, ((j > center) & (j < right)).where(falling, 0.0))
  return w.cast(dtype_of(output_datatype, ctx.node))


# ---- rotary embeddings, quantized products, grids

@op("RotaryEmbedding")
def rotary_embedding(ctx: Ctx, x: Tensor, cos: Tensor, sin: Tensor, position_ids: Tensor | None = None, interleaved: int = 0,
                     num_heads: int = 0, rotary_embedding_dim: int = 0) -> Tensor:
  four_d = x.ndim == 4
  y = x.permute(0, 2, 1, 3) if four_d else x.reshape(_sh(x)[0], _sh(x)[1], num_heads, -1)  # (b, s, heads, head)
  d = rotary_embedding_dim or _sh(y)[-1]
  rot, rest = y[..., :d], y[..., d:]
  if position_ids is not None: cos, sin = cos[position_ids.cast(dtypes.int32)], sin[position_ids.cast(dtypes.int32)]
  cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
  x1, x2 = (rot[..., 0::2], rot[..., 1::2]) if interleaved else (rot[..., : d // 2], rot[..., d // 2:])
  real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
  rot = real.unsqueeze(-1).cat(imag.unsqueeze(-1), dim=-1).reshape(_sh(rot)) if interleaved else real.cat(imag, dim=-1)
  out = rot.cat(rest, dim=-1) if d < _sh(y)[-1] else rot
  return out.permute(0, 2, 1, 3) if four_d else out.reshape(_sh(x))

def _requantize(ctx: Ctx, acc: Tensor, scale: Tensor, zero: Tensor | None, like: Tensor) -> Tensor:
  dt = zero.dtype if zero is not None else like.dtype
  q = (acc.cast(dtypes.float32) * scale).round()
  if zero is not None: q = q + zero.cast(dtypes.float32)
  return q.clip(dtypes.min(dt), dtypes.max(dt)).cast(dt)

def _centered(t: Tensor, zero: Tensor | None, axis_len: int | None = None) -> Tensor:
  v = t.cast(dtypes.int32)
  if zero is None: return v
  z = zero.cast(dtypes.int32)
  return v - (z.reshape(-1, *[1] * (t.ndim - 1)) if axis_len is not None and z.ndim == 1 and _sh(z)[0] > 1 else z)

@op("QLinearMatMul")
def qlinear_matmul(ctx: Ctx, a: Tensor, a_scale: Tensor, a_zero: Tensor | None, b: Tensor, b_scale: Tensor, b_zero: Tensor | None,
                   y_scale: Tensor, y_zero: Tensor | None = None) -> Tensor:
  acc = _centered(a, a_zero) @ _centered(b, b_zero)
  return _requantize(ctx, acc, (a_scale.float() * b_scale.float() / y_scale.float()), y_zero, a)

@op("ConvInteger")
def conv_integer(ctx: Ctx, x: Tensor, w: Tensor, x_zero: Tensor | None = None, w_zero: Tensor | None = None, auto_pad: str = "NOTSET",
                 dilations: Sequence[int] | None = None, group: int = 1, kernel_shape: Sequence[int] | None = None,
                 pads: Sequence[int] | None = None, strides: Sequence[int] | None = None) -> Tensor:
  xi, wi = _centered(x, x_zero), _centered(w, w_zero, _sh(w)[0])
  return conv(ctx, xi, wi, None, auto_pad, dilations, group, kernel_shape, pads, strides).cast(dtypes.int32)

@op("QLinearConv")
def qlinear_conv(ctx: Ctx, x: Tensor, x_scale: Tensor, x_zero: Tensor | None, w: Tensor, w_scale: Tensor, w_zero: Tensor | None,
                 y_scale: Tensor, y_zero: Tensor | None = None, b: Tensor | None = None, auto_pad: str = "NOTSET",
                 dilations: Sequence[int] | None = None, group: int = 1, kernel_shape: Sequence[int] | None = None,
                 pads: Sequence[int] | None = None, strides: Sequence[int] | None = None) -> Tensor:
  acc = conv_integer(ctx, x, w, x_zero, w_zero, auto_pad, dilations, group, kernel_shape, pads, strides)
  if b is not None: acc = acc + b.cast(dtypes.int32).reshape(1, -1, *[1] * (x.ndim - 2))
  ws = w_scale.float().reshape(1, -1, *[1] * (x.ndim - 2)) if w_scale.numel() > 1 else w_scale.float()
  return _requantize(ctx, acc, x_scale.float() * ws / y_scale.float(), y_zero, x)

@op("AffineGrid")
def affine_grid(ctx: Ctx, theta: Tensor, size: Tensor, align_corners: int = 0) -> Tensor:
  n, _, *spatial = ctx.ints(size)
  axes = []
  for s in spatial:  # normalized coordinates of each axis, from -1 to 1
    axes.append(np.linspace(-1, 1, s) if align_corners else (np.arange(s) * 2 + 1) / s - 1)
  mesh = np.meshgrid(*axes, indexing="ij")
  homo = np.stack([*mesh[::-1], np.ones_like(mesh[0])], axis=-1).reshape(-1, len(spatial) + 1)  # (points, x y [z] 1)
  grid = ctx.tensor(homo.astype(np.float32)).cast(theta.dtype) @ theta.transpose(1, 2)  # (n, points, dims)
  return grid.reshape(n, *spatial, len(spatial))

@op("Col2Im")
def col2im(ctx: Ctx, x: Tensor, image_shape: Tensor, block_shape: Tensor, dilations: Sequence[int] | None = None,
           pads: Sequence[int] | None = None, strides: Sequence[int] | None = None) -> Tensor:
  img, blk = ctx.ints(image_shape), ctx.ints(block_shape)
  nd = len(img)
  dl, st, p = list(dilations or [1] * nd), list(strides or [1] * nd), list(pads or [0] * (2 * nd))
  padded = [img[i] + p[i] + p[i + nd] for i in range(nd)]
  blocks = [(padded[i] - dl[i] * (blk[i] - 1) - 1) // st[i] + 1 for i in range(nd)]
  b, c = _sh(x)[0], _sh(x)[1] // _prod(blk)
  cols = x.reshape(b, c, *blk, *blocks)
  out = None
  for off in np.ndindex(*blk):
    v = cols[(slice(None), slice(None), *off)]  # (b, c, *blocks)
    # spread the blocks `stride` apart, then move them to their kernel offset
    for i in range(nd):
      if st[i] > 1:
        ax = 2 + i
        v = v.unsqueeze(ax + 1).pad(tuple((0, st[i] - 1) if j == ax + 1 else (0, 0) for j in range(v.ndim + 1)))
        v = v.reshape(*_sh(v)[:ax], -1, *_sh(v)[ax + 2:])
    v = v.pad(((0, 0), (0, 0), *[(off[i] * dl[i], padded[i] - off[i] * dl[i] - _sh(v)[2 + i]) for i in range(nd)]))
    out = v if out is None else out + v
  assert out is not None
  return out.pad(((0, 0), (0, 0), *[(-p[i], -p[i + nd]) for i in range(nd)]))


# ---- recurrent state: linear attention, causal convolution

def _heads(x: Tensor, n: int) -> Tensor:
  """(b, t, n*d) -> (b, n, t, d)."""
  b, t, hd = _sh(x)
  return x.reshape(b, t, n, hd // n).permute(0, 2, 1, 3)

@op("LinearAttention")
def linear_attention(ctx: Ctx, q: Tensor, k: Tensor, v: Tensor, past_state: Tensor | None = None, decay: Tensor | None = None,
                     beta: Tensor | None = None, chunk_size: int = 0, kv_num_heads: int = 0, q_num_heads: int = 0,
                     scale: float = 0.0, update_rule: str = "gated_delta") -> tuple[Tensor, Tensor]:
  if update_rule not in ("linear", "gated", "delta", "gated_delta"): raise ctx.error(f"LinearAttention update_rule {update_rule!r}")
  if not q_num_heads or not kv_num_heads or q_num_heads % kv_num_heads: raise ctx.error("q_num_heads must be a multiple of kv_num_heads")
  gated, delta = update_rule in ("gated", "gated_delta"), update_rule in ("delta", "gated_delta")
  if gated != (decay is not None) or delta != (beta is not None):
    raise ctx.error(f"update_rule {update_rule!r} takes {'a' if gated else 'no'} decay and {'a' if delta else 'no'} beta input")
  b, t, _ = _sh(q)
  dk, dv, group = _sh(q)[-1] // q_num_heads, _sh(v)[-1] // kv_num_heads, q_num_heads // kv_num_heads
  q4, k4, v4 = (_heads(z, n).float() for z, n in ((q, q_num_heads), (k, kv_num_heads), (v, kv_num_heads)))
  # the decay is per head (last dim kv_num_heads) or per head and key dimension (kv_num_heads * dk)
  g4 = None if decay is None else (decay.reshape(b, t, kv_num_heads, 1).permute(0, 2, 1, 3) if _sh(decay)[-1] == kv_num_heads
                                   else _heads(decay, kv_num_heads)).float()
  b4 = None if beta is None else beta.reshape(b, t, _sh(beta)[-1], 1).permute(0, 2, 1, 3).float()
  state = past_state.float() if past_state is not None else ctx.full((b, kv_num_heads, dk, dv), 0, dtypes.float32)
  sc = scale or 1 / math.sqrt(dk)
  outs = []
  for i in range(t):  # the recurrence, one step per position (state: (b, heads, dk, dv))
    kt, vt = k4[:, :, i], v4[:, :, i]
    if g4 is not None: state = state * g4[:, :, i].exp().unsqueeze(-1)
    if b4 is not None: vt = b4[:, :, i] * (vt - (state * kt.unsqueeze(-1)).sum(2))
    state = state + kt.unsqueeze(-1) * vt.unsqueeze(-2)
    read = state.repeat_interleave(group, 1) if group > 1 else state
    outs.append(sc * (q4[:, :, i].unsqueeze(-1) * read).sum(2))  # (b, q_heads, dv)
  y = Tensor.stack(*outs, dim=2).permute(0, 2, 1, 3).reshape(b, t, q_num_heads * dv).cast(q.dtype)
  return y, state.cast(past_state.dtype if past_state is not None else q.dtype)

@op("CausalConvWithState")
def causal_conv_with_state(ctx: Ctx, x: Tensor, w: Tensor, bias: Tensor | None = None, past_state: Tensor | None = None,
                           activation: str = "none") -> tuple[Tensor, Tensor]:
  if activation not in ("none", "silu", "swish"): raise ctx.error(f"CausalConvWithState activation {activation!r}")
  b, c, _ = _sh(x)
  k = _sh(w)[2]
  past = past_state if past_state is not None else ctx.full((b, c, k - 1), 0, x.dtype)
  padded = past.cat(x, dim=2)
  y = padded.conv2d(w, bias, groups=c)
  if activation != "none": y = (y.float() * y.float().sigmoid()).cast(x.dtype)
  return y, padded[:, :, _sh(padded)[2] - (k - 1):]


# ---- grid sampling: every tap a gather from the flattened image, weighted

def _reflect(v: Tensor, lo: float, hi: float) -> Tensor:
  """Reflect v by the nearer border until it lies in [lo, hi] (the reference's rule, on Tensors)."""
  rng = hi - lo
  def fold(d: Tensor, near: float, far: float, sign: float) -> Tensor:  # d >= 0: how far past `near`
    n = (d / rng).floor()
    r = d - n * rng
    return (n % 2 == 0).where(near + sign * r, far - sign * r)
  below, above = fold(lo - v, lo, hi, 1.0), fold(v - hi, hi, lo, -1.0)
  return (v < lo).where(below, (v > hi).where(above, v))

@op("GridSample")
def grid_sample(ctx: Ctx, x: Tensor, grid: Tensor, align_corners: int = 0, mode: str = "linear", padding_mode: str = "zeros") -> Tensor:
  mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
  if mode not in ("nearest", "linear", "cubic"): raise ctx.error(f"GridSample mode {mode!r}")
  if padding_mode not in ("zeros", "border", "reflection"): raise ctx.error(f"GridSample padding_mode {padding_mode!r}")
  n, c, *dims = _sh(x)
  out = _sh(grid)[1:-1]
  nd = len(dims)
  g = grid.float()
  lo = [0.0 if align_corners else -0.5] * nd
  hi = [d - 1.0 if align_corners else d - 0.5 for d in dims]
  pos = []
  for i, d in enumerate(dims):  # the grid's last axis holds x, y[, z]: the spatial axes reversed
    gi = g[..., nd - 1 - i]
    p = (gi + 1) / 2 * (d - 1) if align_corners else ((gi + 1) * d - 1) / 2
    if mode == "nearest": p = p.round()
    outside = (p < lo[i]) | (p > hi[i])
    if padding_mode == "border": p = outside.where(p.clip(0, d - 1), p)
    elif padding_mode == "reflection": p = _reflect(p, lo[i], hi[i])
    pos.append(p)
  offs = [0] if mode == "nearest" else [0, 1] if mode == "linear" else [-1, 0, 1, 2]
  a = -0.75
  def weight(f: Tensor, o: int) -> Tensor:
    if mode == "nearest": return f * 0 + 1
    if mode == "linear": return 1 - f if o == 0 else f
    t = (f - o).abs()  # Keys' cubic kernel at the tap's distance
    return (t <= 1).where(((a + 2) * t - (a + 3)) * t * t + 1, ((t * a - 5 * a) * t + 8 * a) * t - 4 * a)
  base = [p if mode == "nearest" else p.floor() for p in pos]
  frac = [p - b for p, b in zip(pos, base)]
  flat = x.reshape(n, c, -1)
  total = None
  for combo in itertools.product(offs, repeat=nd):
    w, idx, ok = None, None, None
    for i, o in enumerate(combo):
      t = base[i] + o
      if padding_mode == "border": t = t.clip(0, dims[i] - 1)
      elif padding_mode == "reflection": t = _reflect(t, lo[i], hi[i]).trunc().clip(0, dims[i] - 1)
      inside = (t >= 0) & (t <= dims[i] - 1)
      wi = weight(frac[i], o)
      w = wi if w is None else w * wi
      ok = inside if ok is None else ok & inside
      ti = inside.where(t, 0).cast(dtypes.int32) * _prod(dims[i + 1:])
      idx = ti if idx is None else idx + ti
    assert w is not None and idx is not None and ok is not None
    vals = flat.gather(2, idx.reshape(n, 1, -1).expand(n, c, _prod(out)))
    term = vals * ok.where(w, 0).reshape(n, 1, -1).cast(vals.dtype)
    total = term if total is None else total + term
  assert total is not None
  return total.reshape(n, c, *out).cast(x.dtype)


# ---- recurrent layers: the recurrence unrolled over the (static) sequence, one direction at a time

def _activation(name: str, alpha: float | None, beta: float | None) -> Callable[[Tensor], Tensor]:
  acts: dict[str, Callable[[Tensor], Tensor]] = {
    "sigmoid": Tensor.sigmoid, "tanh": Tensor.tanh, "relu": Tensor.relu,
    "leakyrelu": lambda x: x.leaky_relu(0.01 if alpha is None else alpha),
    "hardsigmoid": lambda x: ((0.2 if alpha is None else alpha) * x + (0.5 if beta is None else beta)).clip(0, 1),
    "affine": lambda x: (1.0 if alpha is None else alpha) * x + (0.0 if beta is None else beta),
    "scaledtanh": lambda x: (1.0 if alpha is None else alpha) * ((1.0 if beta is None else beta) * x).tanh(),
    "thresholdedrelu": lambda x: (x > (1.0 if alpha is None else alpha)).where(x, 0),
    "elu": lambda x: x.elu(1.0 if alpha is None else alpha), "softsign": Tensor.softsign, "softplus": Tensor.softplus}
  if (fn := acts.get(name.lower())) is None: raise UnsupportedOnnxOpError(f"recurrent activation {name!r}")
  return fn

def _recurrent(ctx: Ctx, kind: str, x: Tensor, w: Tensor, r: Tensor, b: Tensor | None, lens: Tensor | None, h0: Tensor | None,
               c0: Tensor | None, p: Tensor | None, attrs: dict[str, Any]) -> tuple[Tensor, ...]:
  known = {"hidden_size", "layout", "direction", "activations", "activation_alpha", "activation_beta", "clip",
           *({"GRU": ["linear_before_reset"], "LSTM": ["input_forget"]}.get(kind, []))}
  if unknown := sorted(set(attrs) - known): raise ctx.unsupported(f"attribute(s) {unknown} are not supported")
  gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
  hidden, layout, direction = attrs["hidden_size"], attrs.get("layout", 0), attrs.get("direction", "forward")
  if layout: x = x.permute(1, 0, 2)  # (seq, batch, input)
  seq, batch, _ = _sh(x)
  if lens is not None and any(v != seq for v in ctx.ints(lens)):
    raise ctx.unsupported(f"{kind} with sequence_lens shorter than the sequence ({ctx.ints(lens)} of {seq})")
  dirs = ["forward", "reverse"] if direction == "bidirectional" else [direction]
  n_act = {"RNN": 1, "GRU": 2, "LSTM": 3}[kind]
  names = attrs.get("activations") or {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}[kind] * len(dirs)
  alphas, betas = list(attrs.get("activation_alpha") or []), list(attrs.get("activation_beta") or [])
  clip = attrs.get("clip")
  def clipped(t: Tensor) -> Tensor: return t.clip(-clip, clip) if clip is not None else t
  ys, hs, cs = [], [], []
  for d, dname in enumerate(dirs):
    acts = [_activation(names[d * n_act + i], alphas[d * n_act + i] if d * n_act + i < len(alphas) else None,
                        betas[d * n_act + i] if d * n_act + i < len(betas) else None) for i in range(n_act)]
    wd, rd = w[d], r[d]  # (gates*hidden, input), (gates*hidden, hidden)
    wb, rb = (b[d][: gates * hidden], b[d][gates * hidden:]) if b is not None else (None, None)
    h = h0[d] if h0 is not None else ctx.full((batch, hidden), 0, x.dtype)
    c = c0[d] if c0 is not None else ctx.full((batch, hidden), 0, x.dtype)
    out: list[Tensor] = [x] * seq
    steps = range(seq - 1, -1, -1) if dname == "reverse" else range(seq)
    for t in steps:
      xw = x[t] @ wd.T + (wb if wb is not None else 0)
      hr = h @ rd.T + (rb if rb is not None else 0)
      if kind == "RNN": h = acts[0](clipped(xw + hr))
      elif kind == "GRU":
        xz, xr, xh = xw.chunk(3, 1)
        hz, hrr, hh = hr.chunk(3, 1)
        z, rr = acts[0](clipped(xz + hz)), acts[0](clipped(xr + hrr))
        if attrs.get("linear_before_reset", 0): cand = acts[1](clipped(xh + rr * hh))
        else:
          rbh = rb[2 * hidden:] if rb is not None else 0
          cand = acts[1](clipped(xh + (rr * h) @ rd[2 * hidden:].T + rbh))
        h = (1 - z) * cand + z * h
      else:
        gi, go, gf, gc = (xw + hr).chunk(4, 1)
        pi, po, pf = (p[d][:hidden], p[d][hidden:2 * hidden], p[d][2 * hidden:]) if p is not None else (None, None, None)
        i_ = acts[0](clipped(gi + (pi * c if pi is not None else 0)))
        f_ = acts[0](clipped(gf + (pf * c if pf is not None else 0)))
        if attrs.get("input_forget", 0): f_ = 1 - i_
        c = f_ * c + i_ * acts[1](clipped(gc))
        o_ = acts[0](clipped(go + (po * c if po is not None else 0)))
        h = o_ * acts[2](c)
      out[t] = h
    ys.append(Tensor.stack(*out, dim=0))  # (seq, batch, hidden)
    hs.append(h)
    cs.append(c)
  y = Tensor.stack(*ys, dim=1)  # (seq, dirs, batch, hidden)
  yh, yc = Tensor.stack(*hs, dim=0), Tensor.stack(*cs, dim=0)
  if layout: y, yh, yc = y.permute(2, 0, 1, 3), yh.permute(1, 0, 2), yc.permute(1, 0, 2)
  return (y, yh, yc) if kind == "LSTM" else (y, yh)

def _recurrent_op(kind: str) -> OpFn:
  def run(ctx: Ctx, x: Tensor, w: Tensor, r: Tensor, b: Tensor | None = None, lens: Tensor | None = None, h0: Tensor | None = None,
          c0: Tensor | None = None, p: Tensor | None = None, **attrs: Any) -> tuple[Tensor, ...]:
    return _recurrent(ctx, kind, x, w, r, b, lens, h0, c0, p, attrs)
  return run

for _k in ("RNN", "GRU", "LSTM"): OPS[_k] = _recurrent_op(_k)


# ---- detection and linear algebra

@op("NonMaxSuppression")
def non_max_suppression(ctx: Ctx, boxes: Tensor, scores: Tensor, max_out: Tensor | None = None, iou_threshold: Tensor | None = None,
                        score_threshold: Tensor | None = None, center_point_box: int = 0) -> Tensor:
  limit = max(int(ctx.scalar(max_out)), 0) if max_out is not None and max_out.numel() else 0
  iou_t = float(ctx.scalar(iou_threshold)) if iou_threshold is not None and iou_threshold.numel() else 0.0
  b = boxes.float()
  if center_point_box:
    x0, x1 = b[..., 0] - b[..., 2] / 2, b[..., 0] + b[..., 2] / 2
    y0, y1 = b[..., 1] - b[..., 3] / 2, b[..., 1] + b[..., 3] / 2
  else:
    x0, x1 = b[..., 1].minimum(b[..., 3]), b[..., 1].maximum(b[..., 3])
    y0, y1 = b[..., 0].minimum(b[..., 2]), b[..., 0].maximum(b[..., 2])
  def pair(t: Tensor) -> tuple[Tensor, Tensor]: return t.unsqueeze(2), t.unsqueeze(1)  # (n, boxes, 1), (n, 1, boxes)
  (ax0, bx0), (ax1, bx1), (ay0, by0), (ay1, by1) = pair(x0), pair(x1), pair(y0), pair(y1)
  iw, ih = ax1.minimum(bx1) - ax0.maximum(bx0), ay1.minimum(by1) - ay0.maximum(by0)
  inter = iw * ih
  area_a, area_b = (ax1 - ax0) * (ay1 - ay0), (bx1 - bx0) * (by1 - by0)
  union = area_a + area_b - inter
  ok = (iw > 0) & (ih > 0) & (area_a > 0) & (area_b > 0) & (union > 0)
  suppress = (ok & (inter / ok.where(union, 1) > iou_t)).numpy()  # (n, boxes, boxes)
  # the greedy selection is sequential and its output's length is the data's: on the host
  sc = scores.float().numpy()
  thr = float(ctx.scalar(score_threshold)) if score_threshold is not None and score_threshold.numel() else None
  picked: list[tuple[int, int, int]] = []
  for n in range(sc.shape[0]):
    for c in range(sc.shape[1]):
      cand = [i for i in range(sc.shape[2]) if thr is None or sc[n, c, i] > thr]
      cand.sort(key=lambda i: (-sc[n, c, i], i))
      chosen: list[int] = []
      for i in cand:
        if len(chosen) >= limit: break
        if not any(suppress[n, i, j] for j in chosen): chosen.append(i)
      picked += [(n, c, i) for i in chosen]
  return ctx.tensor(np.array(picked, dtype=np.int64).reshape(-1, 3))

@op("RoiAlign")
def roi_align(ctx: Ctx, x: Tensor, rois: Tensor, batch_indices: Tensor, coordinate_transformation_mode: str | None = None,
              mode: str = "avg", output_height: int = 1, output_width: int = 1, sampling_ratio: int = 0, spatial_scale: float = 1.0) -> Tensor:
  """Each roi's (output_height x output_width) bins, each the average (or maximum) of a grid of bilinear samples of x in
  the bin: the four neighbours of every sample gathered from x, weighted."""
  # opset 16 added the mode, half_pixel its default; RoiAlign-10 behaves as output_half_pixel
  ctm = coordinate_transformation_mode or ("half_pixel" if ctx.opset >= 16 else "output_half_pixel")
  if ctm not in ("half_pixel", "output_half_pixel"): raise ctx.error(f"RoiAlign coordinate_transformation_mode {ctm!r}")
  if mode not in ("avg", "max"): raise ctx.error(f"RoiAlign mode {mode!r}")
  _, c, h, w = _sh(x)
  nr, (ph, pw) = _sh(rois)[0], (output_height, output_width)
  half = ctm == "half_pixel"
  box = rois.float() * spatial_scale - (0.5 if half else 0.0)  # (nr, 4): x0, y0, x1, y1 in x's pixels
  size = box[:, 2:] - box[:, :2]
  if not half: size = size.maximum(1.0)  # the legacy mode makes a degenerate roi one pixel
  bins = size / ctx.tensor(np.array([pw, ph], np.float32))
  if sampling_ratio > 0: grid, gx, gy = ctx.full((nr, 2), sampling_ratio, dtypes.float32), sampling_ratio, sampling_ratio
  else:
    # ceil(bin size) samples per bin along each axis, every roi its own: the rois are read on the host for the largest
    b = ctx.array(rois).astype(np.float32).reshape(nr, 4) * np.float32(spatial_scale)
    sz = b[:, 2:] - b[:, :2]
    counts = np.ceil((sz if half else np.maximum(sz, 1)) / np.array([pw, ph], np.float32)).clip(0)
    grid, gx, gy = ctx.tensor(counts.astype(np.float32)), int(counts[:, 0].max(initial=1)), int(counts[:, 1].max(initial=1))
  gx, gy = max(gx, 1), max(gy, 1)  # an empty grid averages to 0: one masked sample keeps the shapes non-empty
  def along(k: int, n_bins: int, samples: int, limit: int) -> tuple[Tensor, ...]:
    """Along x (k=0) or y (k=1), per (roi, bin, sample): the low and high neighbours, their weights (0 for a sample more
    than a pixel outside), and whether the sample is in the roi's grid."""
    g = grid[:, k].reshape(nr, 1, 1)
    i = ctx.arange(samples, dtypes.float32).reshape(1, 1, samples)
    step = bins[:, k].reshape(nr, 1, 1)
    p = box[:, k].reshape(nr, 1, 1) + ctx.arange(n_bins, dtypes.float32).reshape(1, n_bins, 1) * step + (i + 0.5) * step / g.maximum(1)
    inside = (p >= -1.0) & (p <= limit)
    p = p.maximum(0)
    last = p.floor() >= limit - 1  # at (or past) the last pixel both neighbours are it
    lo = last.where(limit - 1, p.floor())
    frac = last.where(0.0, p - lo)
    return lo, last.where(lo, lo + 1), inside.where(1 - frac, 0.0), inside.where(frac, 0.0), (i < g).expand(nr, n_bins, samples)
  xl, xh, xwl, xwh, xin = along(0, pw, gx, w)
  yl, yh, ywl, ywh, yin = along(1, ph, gy, h)
  # every sample as (roi, channel, bin row, bin column, grid row, grid column)
  def Y(t: Tensor) -> Tensor: return t.reshape(nr, 1, ph, 1, gy, 1)
  def X(t: Tensor) -> Tensor: return t.reshape(nr, 1, 1, pw, 1, gx)
  shape = (nr, c, ph, pw, gy, gx)
  plane = (batch_indices.cast(dtypes.int32).reshape(nr, 1, 1, 1, 1, 1) * c + ctx.arange(c, dtypes.int32).reshape(1, c, 1, 1, 1, 1)) * (h * w)
  flat = x.reshape(-1)
  taps = []
  for (yi, wy), (xi, wx) in itertools.product(((yl, ywl), (yh, ywh)), ((xl, xwl), (xh, xwh))):
    idx = (plane + Y(yi).cast(dtypes.int32) * w + X(xi).cast(dtypes.int32)).expand(shape).reshape(-1)
    taps.append(flat.gather(0, idx).reshape(shape).float() * (Y(wy) * X(wx)))
  counted = Y(yin) & X(xin)
  if mode == "avg":
    out = counted.where(taps[0] + taps[1] + taps[2] + taps[3], 0.0).sum((4, 5)) / (grid[:, 0] * grid[:, 1]).maximum(1).reshape(nr, 1, 1, 1)
  else:  # onnxruntime's (and the reference's) max: the largest weighted neighbour of any sample, 0 for an empty grid
    best = counted.where(taps[0].maximum(taps[1]).maximum(taps[2]).maximum(taps[3]), -math.inf).max((4, 5))
    out = counted.any((4, 5)).where(best, 0.0)
  return out.cast(x.dtype)

def _det(m: Tensor, n: int) -> Tensor:
  """The determinant of (..., n, n) by cofactor expansion along the first row (exact in the formula; n! terms)."""
  if n == 1: return m[..., 0, 0]
  if n == 2: return m[..., 0, 0] * m[..., 1, 1] - m[..., 0, 1] * m[..., 1, 0]
  total = None
  for j in range(n):
    cols = [k for k in range(n) if k != j]
    minor = Tensor.stack(*[m[..., 1:, k] for k in cols], dim=-1)
    term = m[..., 0, j] * _det(minor, n - 1) * (1 if j % 2 == 0 else -1)
    total = term if total is None else total + term
  assert total is not None
  return total

@op("Det")
def det(ctx: Ctx, x: Tensor) -> Tensor:
  n = _sh(x)[-1]
  if n > 6: raise ctx.unsupported(f"Det of {n}x{n} matrices (cofactor expansion is used up to 6x6)")
  return _det(x, n)


# ---- control flow and graph attributes (a Subgraph is called with its inputs, returns its outputs)

Graph = Callable[..., list[Value]]

def _tensor(ctx: Ctx, v: Value, what: str) -> Tensor:
  if not isinstance(v, Tensor): raise ctx.error(f"{what} must be a tensor, got {'an empty optional' if v is None else 'a sequence'}")
  return v

@op("If")
def if_(ctx: Ctx, cond: Tensor, then_branch: Graph, else_branch: Graph) -> tuple[Value, ...]:
  # the branch taken decides the graph: read on the host (the graph is realized up to the condition)
  return tuple((then_branch if bool(ctx.scalar(cond)) else else_branch)())

@op("Loop")
def loop(ctx: Ctx, trip: Tensor | None, cond: Tensor | None, *carried: Value, body: Graph) -> tuple[Value, ...]:
  n = int(ctx.scalar(trip)) if trip is not None else None
  go = bool(ctx.scalar(cond)) if cond is not None else True
  state, scans, i = list(carried), [], 0
  while go and (n is None or i < n):
    outs = body(ctx.const(np.array(i, np.int64)), ctx.const(np.array(go)), *state)
    go = bool(ctx.scalar(_tensor(ctx, outs[0], "the body's condition")))
    state, step = outs[1:1 + len(state)], outs[1 + len(state):]
    scans.append([_tensor(ctx, s, "a scan output") for s in step])
    i += 1
  if scans and scans[0]: return (*state, *[Tensor.stack(*col, dim=0) for col in zip(*scans)])
  if ctx.n_outputs > len(state): raise ctx.unsupported("Loop with scan outputs that ran no iteration (their shape is unknown)")
  return tuple(state)

def _scan_steps(ctx: Ctx, body: Graph, state: list[Tensor], seqs: list[Tensor], axes: Sequence[int],
                reverse: Sequence[int]) -> tuple[list[Tensor], list[list[Tensor]]]:
  """Run the body once per position along each scan input's axis: the final state, and each step's scan outputs."""
  length = _sh(seqs[0])[axes[0]] if seqs else 0
  steps: list[list[Tensor]] = []
  for t in range(length):
    sl = [s[(slice(None),) * a + ((length - 1 - t) if d else t,)] for s, a, d in zip(seqs, axes, reverse)]
    outs = [_tensor(ctx, o, "a Scan body output") for o in body(*state, *sl)]
    state = outs[:len(state)]
    steps.append(outs[len(state):])
  return state, steps

def _no_steps(ctx: Ctx, n_state: int) -> None:
  if ctx.n_outputs > n_state: raise ctx.unsupported("Scan over empty sequences with scan outputs (their shape is unknown)")

@op("Scan")
def scan(ctx: Ctx, *xs: Tensor | None, body: Graph, num_scan_inputs: int = 0, directions: Sequence[int] | None = None,
         scan_input_axes: Sequence[int] | None = None, scan_input_directions: Sequence[int] | None = None,
         scan_output_axes: Sequence[int] | None = None, scan_output_directions: Sequence[int] | None = None) -> tuple[Tensor, ...]:
  m = num_scan_inputs
  if ctx.opset < 9:
    # Scan-8: every input has a leading batch axis, each batch entry is scanned on its own along axis 1 for its length
    lens, rest = xs[0], [_tensor(ctx, x, "a Scan input") for x in xs[1:]]
    state, seqs = rest[:len(rest) - m], rest[len(rest) - m:]
    batch, longest = _sh(seqs[0])[:2]
    n = ctx.ints(lens) if lens is not None else [longest] * batch
    if any(not 0 <= v <= longest for v in n): raise ctx.error(f"sequence_lens {n} outside [0, {longest}]")
    runs = [_scan_steps(ctx, body, [s[b] for s in state], [s[b, :n[b]] for s in seqs], [0] * m, directions or [0] * m) for b in range(batch)]
    if (like := next((steps[0] for _, steps in runs if steps), None)) is None: _no_steps(ctx, len(state))
    def padded(steps: list[list[Tensor]], j: int, like: list[Tensor]) -> Tensor:
      # a shorter sequence's scan outputs are padded to the longest with zeros (the specification leaves them undefined)
      if not steps: return ctx.full((longest, *_sh(like[j])), 0, like[j].dtype)
      return Tensor.stack(*[st[j] for st in steps], dim=0).pad(((0, longest - len(steps)),) + ((0, 0),) * steps[0][j].ndim)
    rows = [[*st, *[padded(steps, j, like) for j in range(len(like))]] if like is not None else st for st, steps in runs]
    return tuple(Tensor.stack(*col, dim=0) for col in zip(*rows))
  if directions is not None: raise ctx.error("directions is Scan-8's attribute (from opset 9: scan_input_directions)")
  state, seqs = [_tensor(ctx, x, "a Scan input") for x in xs[:len(xs) - m]], [_tensor(ctx, x, "a Scan input") for x in xs[len(xs) - m:]]
  in_axes = [_axis(a, s.ndim) for a, s in zip(scan_input_axes or [0] * m, seqs)]
  st, steps = _scan_steps(ctx, body, state, seqs, in_axes, scan_input_directions or [0] * m)
  if not steps: _no_steps(ctx, len(state))
  cols = [list(col) for col in zip(*steps)]
  out_axes, out_dirs = list(scan_output_axes or [0] * len(cols)), list(scan_output_directions or [0] * len(cols))
  results = [Tensor.stack(*(c[::-1] if d else c), dim=_axis(a, c[0].ndim + 1)) for c, a, d in zip(cols, out_axes, out_dirs)]
  return (*st, *results)


# ---- sequences (a Python list of Tensors) and optionals (None when empty, else the value)

def _seq(ctx: Ctx, v: Value) -> list[Tensor]:
  if not isinstance(v, list): raise ctx.error(f"expected a sequence, got {'an empty optional' if v is None else 'a tensor'}")
  return v

def _position(ctx: Ctx, pos: Tensor | None, n: int, default: int, insert: bool = False) -> int:
  """A sequence position in [-n, n) (insertion: [-n, n]) as an index from the front."""
  p = default if pos is None else int(ctx.scalar(pos))
  if not -n <= p < n + insert: raise ctx.error(f"position {p} is outside a sequence of {n}")
  return p + n if p < 0 else p

OPS["SequenceConstruct"] = lambda ctx, *xs: list(xs)
OPS["SequenceLength"] = lambda ctx, seq: np.array(len(_seq(ctx, seq)), np.int64)
OPS["SequenceAt"] = lambda ctx, seq, pos: _seq(ctx, seq)[_position(ctx, pos, len(seq), 0)]

@op("SequenceEmpty")
def sequence_empty(ctx: Ctx, dtype: int = 1) -> list[Tensor]:
  dtype_of(dtype, ctx.node)  # a sequence of a type plugrad lacks is refused even while it is empty
  return []

@op("SequenceInsert")
def sequence_insert(ctx: Ctx, seq: Value, t: Tensor, pos: Tensor | None = None) -> list[Tensor]:
  s = _seq(ctx, seq)
  i = _position(ctx, pos, len(s), len(s), insert=True)
  return [*s[:i], t, *s[i:]]  # a new list: the input sequence may be read again

@op("SequenceErase")
def sequence_erase(ctx: Ctx, seq: Value, pos: Tensor | None = None) -> list[Tensor]:
  s = _seq(ctx, seq)
  i = _position(ctx, pos, len(s), -1)
  return s[:i] + s[i + 1:]

@op("SplitToSequence")
def split_to_sequence(ctx: Ctx, x: Tensor, split: Tensor | None = None, axis: int = 0, keepdims: int = 1) -> list[Tensor]:
  axis = _axis(axis, x.ndim)
  n = _sh(x)[axis]
  if split is None:  # pieces of one, the axis kept or dropped
    return [x[(slice(None),) * axis + ((slice(i, i + 1),) if keepdims else (i,))] for i in range(n)]
  sizes = ctx.ints(split)
  if split.ndim == 0 and sizes[0] <= 0: raise ctx.error(f"split size {sizes[0]} must be positive")
  if split.ndim == 0: sizes = [sizes[0]] * (n // sizes[0]) + ([n % sizes[0]] if n % sizes[0] else [])
  if sum(sizes) != n: raise ctx.error(f"split sizes {sizes} do not add up to the axis's {n}")
  return list(x.split(sizes, axis))

@op("ConcatFromSequence")
def concat_from_sequence(ctx: Ctx, seq: Value, axis: int = 0, new_axis: int = 0) -> Tensor:
  s = _seq(ctx, seq)
  if not s: raise ctx.error("ConcatFromSequence of an empty sequence")
  if new_axis: return Tensor.stack(*s, dim=_axis(axis, s[0].ndim + 1))
  return s[0].cat(*s[1:], dim=_axis(axis, s[0].ndim))

@op("SequenceMap")
def sequence_map(ctx: Ctx, seq: Value, *rest: Value, body: Graph) -> tuple[list[Tensor], ...]:
  """The body once per position of the sequence inputs (each at that position; a tensor input whole every time)."""
  n = len(_seq(ctx, seq))
  if any(isinstance(r, list) and len(r) != n for r in rest): raise ctx.error("SequenceMap's sequence inputs differ in length")
  cols: list[list[Tensor]] = [[] for _ in range(ctx.n_outputs)]
  for i in range(n):
    outs = body(*[a[i] if isinstance(a, list) else a for a in (seq, *rest)])
    for col, out in zip(cols, outs): col.append(_tensor(ctx, out, "a SequenceMap body output"))
  return tuple(cols)

OPS["Optional"] = lambda ctx, x=None, type=None: x  # `type` only types an empty one
OPS["OptionalHasElement"] = lambda ctx, x=None: np.array(x is not None)  # known on the host: an If on it needs no device read

@op("OptionalGetElement")
def optional_get_element(ctx: Ctx, x: Value) -> Value:
  if x is None: raise ctx.error("OptionalGetElement of an empty optional")
  return x  # a tensor or a sequence is its own value (opset 18 takes them too)


@op("FlexAttention")
def flex_attention(ctx: Ctx, q: Tensor, k: Tensor, v: Tensor, scale: float | None = None, score_mod: Graph | None = None,
                   prob_mod: Graph | None = None, softmax_precision: int | None = None) -> Tensor:
  hq, hk = _sh(q)[1], _sh(k)[1]
  if hq != hk: k, v = k.repeat_interleave(hq // hk, 1), v.repeat_interleave(hq // hk, 1)
  s = math.sqrt(scale if scale is not None else 1 / math.sqrt(_sh(q)[-1]))
  compute = dtype_of(softmax_precision, ctx.node) if softmax_precision is not None else \
    dtypes.float32 if q.dtype in (dtypes.float16, dtypes.bfloat16) else q.dtype
  scores = ((q * s) @ (k * s).transpose(-1, -2)).cast(compute)
  if score_mod is not None: scores = _tensor(ctx, score_mod(scores)[0], "score_mod's output").cast(compute)
  p = scores.softmax(-1)
  if prob_mod is not None: p = _tensor(ctx, prob_mod(p)[0], "prob_mod's output").cast(compute)
  return (p @ v.cast(compute)).cast(v.dtype)


@op("DeformConv")
def deform_conv(ctx: Ctx, x: Tensor, w: Tensor, offset: Tensor, b: Tensor | None = None, mask: Tensor | None = None,
                dilations: Sequence[int] | None = None, group: int = 1, kernel_shape: Sequence[int] | None = None,
                offset_group: int = 1, pads: Sequence[int] | None = None, strides: Sequence[int] | None = None) -> Tensor:
  """Each kernel tap samples the input bilinearly (zeros outside) at its regular position plus the offset (GridSample
  does the sampling), scaled by the mask; the taps then contract with the weights like a grouped convolution."""
  n, ic, ih, iw = _sh(x)
  oc, icg, kh, kw = _sh(w) if kernel_shape is None else (_sh(w)[0], _sh(w)[1], *kernel_shape)
  oh, ow = _sh(offset)[2:]
  sth, stw = strides or (1, 1)
  dh, dw = dilations or (1, 1)
  ph, pw = (pads or (0, 0, 0, 0))[:2]
  k = kh * kw
  off = offset.reshape(n, offset_group, kh, kw, 2, oh, ow)
  msk = (mask if mask is not None else ctx.full((n, offset_group * k, oh, ow), 1, x.dtype)).reshape(n, offset_group, kh, kw, oh, ow)
  rows = ctx.arange(oh).reshape(1, oh, 1).cast(x.dtype) * sth - ph
  cols = ctx.arange(ow).reshape(1, 1, ow).cast(x.dtype) * stw - pw
  per_group = ic // offset_group
  taps = []  # (n, ic, oh, ow) per tap
  for a in range(kh):
    for c in range(kw):
      sampled = []
      for g in range(offset_group):
        py, px = rows + a * dh + off[:, g, a, c, 0], cols + c * dw + off[:, g, a, c, 1]
        grid = (px / (iw - 1) * 2 - 1).unsqueeze(-1).cat((py / (ih - 1) * 2 - 1).unsqueeze(-1), dim=-1)
        s = grid_sample(ctx, x[:, g * per_group:(g + 1) * per_group], grid, align_corners=1)
        sampled.append(s * msk[:, g, a, c].unsqueeze(1))
      taps.append(sampled[0].cat(*sampled[1:], dim=1) if offset_group > 1 else sampled[0])
  col = Tensor.stack(*taps, dim=2)  # (n, ic, k, oh, ow)
  col = col.reshape(n, group, icg * k, oh * ow)
  wg = w.reshape(group, oc // group, icg * k)
  y = (wg.unsqueeze(0) @ col).reshape(n, oc, oh, ow)  # (n, group, oc/group, oh*ow)
  return y if b is None else y + b.reshape(1, -1, 1, 1)
