"""The machinery of the differential tester: dtypes, tolerances, input strategies, running one case on plugrad and
on PyTorch (CPU) and comparing forward values, result dtypes and gradients.

Tolerances (`TOL` forward, `GRAD_TOL` backward; (rtol, atol) by the *result's* float dtype, so `exp` of an int8
tensor is held to float32's): an element passes when `|got - want| <= atol + rtol * |want|`; nan must meet nan and
±inf the same ±inf; the sign of a zero is not compared. Integer and bool results must be equal. They are a few units
in the last place of the dtype, because plugrad composes most functions from the IR's ALU ops (docs/tensor.md: exp
is `exp2(x·log2 e)`, tanh is from exp, ...) where PyTorch calls a library routine, and because half-precision
functions round every step in half where PyTorch's CPU kernels compute in float32 and round once:

  float64   forward 1e-9 / 1e-12    backward 1e-8 / 1e-11
  float32   forward 1e-5 / 1e-6     backward 1e-4 / 1e-5
  float16   forward 4e-3 / 1e-3     backward 1.6e-2 / 4e-3   (eps 9.8e-4: 4 ulp)
  bfloat16  forward 3.2e-2 / 8e-3   backward 6.4e-2 / 3.2e-2 (eps 7.8e-3: 4 ulp)

A table entry may widen them for one op with a reason (`Op.tol`, `Op.atol`). A case also passes when it matches PyTorch
computing in the next wider dtype and rounding the result (`wider`). docs/testing.md has the whole policy.
"""
from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from plugrad import Tensor, dtypes

# ---------------------------------------------------------------- settings

def examples() -> int:
  """Examples per (op, dtype) pair: `DIFF_EXAMPLES=N` (docs/env-vars.md); CI runs the default."""
  raw = os.environ.get("DIFF_EXAMPLES", "").strip()
  if not raw: return 4
  if not raw.isdigit() or int(raw) < 1: raise ValueError(f"DIFF_EXAMPLES={raw!r} is not valid: expected an integer >= 1")
  return int(raw)


def shrink() -> bool:
  """`DIFF_SHRINK=1`: let hypothesis shrink a failing case (slow: each smaller shape compiles new kernels)."""
  raw = os.environ.get("DIFF_SHRINK", "").strip()
  if raw not in ("", "0", "1"): raise ValueError(f"DIFF_SHRINK={raw!r} is not valid: expected 0 or 1")
  return raw == "1"


DEVICE = "CPU"

# ---------------------------------------------------------------- dtypes

# name -> (plugrad dtype, torch dtype, numpy dtype the inputs are drawn in)
DT: dict[str, tuple[Any, torch.dtype, Any]] = {
  "float64": (dtypes.float64, torch.float64, np.float64), "float32": (dtypes.float32, torch.float32, np.float32),
  "float16": (dtypes.float16, torch.float16, np.float16), "bfloat16": (dtypes.bfloat16, torch.bfloat16, np.float32),
  "int8": (dtypes.int8, torch.int8, np.int8), "int16": (dtypes.int16, torch.int16, np.int16), "int32": (dtypes.int32, torch.int32, np.int32),
  "int64": (dtypes.int64, torch.int64, np.int64), "uint8": (dtypes.uint8, torch.uint8, np.uint8), "bool": (dtypes.bool, torch.bool, np.bool_),
}
FLOATS = ("float32", "float16", "bfloat16", "float64")
INTS = ("int8", "int16", "int32", "int64", "uint8")
SIGNED = ("int8", "int16", "int32", "int64")
NUMERIC = FLOATS + INTS
ALL = NUMERIC + ("bool",)
TORCH_NAME = {v[1]: k for k, v in DT.items()}
PG_NAME = {v[0]: k for k, v in DT.items()}
PG_NAME[dtypes.uint16] = "uint16"; PG_NAME[dtypes.uint32] = "uint32"; PG_NAME[dtypes.uint64] = "uint64"
TORCH_NAME[torch.uint16] = "uint16"; TORCH_NAME[torch.uint32] = "uint32"; TORCH_NAME[torch.uint64] = "uint64"


def is_float(name: str) -> bool: return name in FLOATS


TOL = {"float64": (1e-9, 1e-12), "float32": (1e-5, 1e-6), "float16": (4e-3, 1e-3), "bfloat16": (3.2e-2, 8e-3)}
GRAD_TOL = {"float64": (1e-8, 1e-11), "float32": (1e-4, 1e-5), "float16": (1.6e-2, 4e-3), "bfloat16": (6.4e-2, 3.2e-2)}

# special values mixed into float inputs: nan, ±inf, -0.0, huge, denormal, and the ±1e3 / ±30 scale where sigmoid,
# tanh, exp and friends saturate or overflow
_SPECIAL_BASE = [math.nan, math.inf, -math.inf, -0.0, 0.0, 1e3, -1e3, 30.0, -30.0, 1.0, -1.0]
SPECIALS = {
  "float64": _SPECIAL_BASE + [1e300, -1e300, 1e-310, -1e-310],
  "float32": _SPECIAL_BASE + [1e30, -1e30, 3e38, 1e-40, -1e-40],
  "float16": _SPECIAL_BASE + [6e4, -6e4, 1e-6, -1e-6],
  "bfloat16": _SPECIAL_BASE + [1e38, -1e38, 1e-39, -1e-39],
}


def int_range(name: str) -> tuple[int, int]:
  if name == "bool": return (0, 1)
  info = np.iinfo(DT[name][2])
  return int(info.min), int(info.max)


def round_bf16(a: np.ndarray) -> np.ndarray:
  return torch.from_numpy(np.array(a, np.float32)).to(torch.bfloat16).float().numpy()

# ---------------------------------------------------------------- case description


@dataclass
class Arg:
  """One tensor argument: its values (bfloat16 values are held as float32) and dtype name; `diff`: take its gradient."""
  value: np.ndarray
  dtype: str
  diff: bool = True

  def __repr__(self) -> str:
    with np.printoptions(precision=9, threshold=64):
      return f"Tensor({self.value.tolist()!r}, dtype={self.dtype}{', requires_grad' if self.diff and is_float(self.dtype) else ''})"


@dataclass
class Py:
  """A Python value passed as it is to both frameworks (a scalar operand, a shape, ...)."""
  value: Any

  def __repr__(self) -> str: return repr(self.value)


@dataclass
class Case:
  op: str
  dtype: str
  args: list[Any]
  kw: dict[str, Any] = field(default_factory=dict)

  def tensors(self) -> list[Arg]: return [a for a in self.args if isinstance(a, Arg)]

  def __repr__(self) -> str: return f"{self.op}[{self.dtype}]({', '.join(map(repr, self.args))}{''.join(f', {k}={v!r}' for k, v in self.kw.items())})"

  def any_value(self, pred: Callable[[np.ndarray], np.ndarray]) -> bool:
    """pred holds for some element of some float input."""
    return any(a.value.size and bool(np.any(pred(a.value.astype(np.float64)))) for a in self.tensors() if is_float(a.dtype))


# ---------------------------------------------------------------- strategies

def values(draw: Any, dt: str, shape: tuple[int, ...], domain: tuple[float, float] | None = None, specials: bool = True) -> np.ndarray:
  """An array of `shape` in dtype `dt`: finite values from `domain` (floats: (-3, 3) by default; ints: the dtype's
  range), with up to two elements replaced by special values (floats: SPECIALS; ints: the dtype's min and max)."""
  shape = tuple(shape)
  if dt == "bool": return draw(hnp.arrays(np.bool_, shape))
  npdt = DT[dt][2]
  if dt in INTS:
    lo, hi = int_range(dt)
    dlo, dhi = (lo, hi) if domain is None else (max(lo, int(domain[0])), min(hi, int(domain[1])))
    arr = draw(hnp.arrays(npdt, shape, elements=st.integers(dlo, dhi)))
    pool = [lo, hi] if domain is None else []
  else:
    lo, hi = domain if domain is not None else (-3.0, 3.0)
    arr = draw(hnp.arrays(np.float64, shape, elements=st.floats(float(lo), float(hi), allow_subnormal=False))).astype(npdt)
    pool = SPECIALS[dt] if specials else []
  arr = np.array(arr, dtype=npdt)
  if pool and arr.size:
    flat = arr.reshape(-1)
    for _ in range(draw(st.integers(0, min(2, arr.size)))):
      flat[draw(st.integers(0, arr.size - 1))] = draw(st.sampled_from(pool))
    arr = flat.reshape(shape)
  return round_bf16(arr) if dt == "bfloat16" else arr


def tensor(draw: Any, dt: str, shape: tuple[int, ...], domain: tuple[float, float] | None = None, specials: bool = True,
           diff: bool = True) -> Arg:
  return Arg(values(draw, dt, shape, domain, specials), dt, diff)


def index(arr: Any, dt: str = "int64") -> Arg: return Arg(np.asarray(arr, dtype=DT[dt][2]), dt, diff=False)


def scalar(draw: Any, dt: str, domain: tuple[float, float] | None = None, specials: bool = True) -> Py:
  """A Python scalar of dt's kind (bool, int or float), drawn like one tensor element."""
  v = values(draw, dt, (), domain, specials)
  return Py(bool(v) if dt == "bool" else int(v) if dt in INTS else float(v))

# ---------------------------------------------------------------- conversions


def to_torch(a: Arg, grad: bool = True) -> torch.Tensor:
  t = torch.from_numpy(np.array(a.value)).to(DT[a.dtype][1])
  return t.requires_grad_() if grad and a.diff and is_float(a.dtype) else t


def to_plugrad(a: Arg, device: str) -> Tensor:
  t = Tensor(np.array(a.value), device=device)
  if a.dtype == "bfloat16": t = t.cast(dtypes.bfloat16)
  t = t.realize()
  return t.requires_grad_() if a.diff and is_float(a.dtype) else t


def _outputs(out: Any) -> list[Any]:
  if isinstance(out, (tuple, list)): return [o for x in out for o in _outputs(x)]
  return [out]


def torch_np(t: Any) -> np.ndarray:
  if not isinstance(t, torch.Tensor): return np.asarray(t)
  t = t.detach()
  return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def pg_np(t: Any) -> np.ndarray:
  return t.numpy() if isinstance(t, Tensor) else np.asarray(t)


def dtype_name(t: Any) -> str | None:
  if isinstance(t, Tensor): return PG_NAME.get(t.dtype, str(t.dtype))
  if isinstance(t, torch.Tensor): return TORCH_NAME.get(t.dtype, str(t.dtype))
  return None

# ---------------------------------------------------------------- comparison


class Mismatch(AssertionError):
  """plugrad and PyTorch disagree; `part` is what: 'value', 'dtype', 'grad' or 'raises'."""

  def __init__(self, part: str, msg: str):
    super().__init__(msg)
    self.part = part


def _fmax(dt: np.dtype) -> float: return float(np.finfo(dt).max)


def mismatch(got: np.ndarray, want: np.ndarray, tol: tuple[float, float] | None, skip: np.ndarray | None = None,
             undefined: bool = False, loose: bool = False, scale: np.ndarray | None = None, inf_in: bool = False) -> str | None:
  """Why `got` is not `want` (None when it is): shapes equal, then values within tol (floats) or equal.
  `skip`: elements not compared. `undefined` (gradients): where `want` is nan anything will do (there is nothing to
  compare with); with inputs holding ±inf (`inf_in`), where it is ±inf nan will do too (which of them comes out depends on
  the order of evaluation), and where it is ±inf a finite `got` of the same sign within 2^16 of the dtype's largest
  value will do (the product overflowed in one order of evaluation and not the other). `loose` (an output is nan
  throughout): where one side is nan and the other a number, neither means anything. `scale`: rtol is relative to
  max(|want|, scale) (for sums, the sum of the magnitudes: their rounding error bound)."""
  got, want = np.asarray(got), np.asarray(want)
  if got.shape != want.shape: return f"shape {got.shape}, want {want.shape}"
  if not got.size: return None
  if tol is None or (got.dtype.kind in "biu" and want.dtype.kind in "biu"):
    g = got.astype(np.float64) if got.dtype.kind == "f" else got.astype(object)
    w = want.astype(np.float64) if want.dtype.kind == "f" else want.astype(object)
    bad = ~np.array(g == w, dtype=bool)
    if got.dtype.kind == "f" or want.dtype.kind == "f":
      bad &= ~(np.isnan(got.astype(np.float64)) & np.isnan(want.astype(np.float64)))
  else:
    g, w = got.astype(np.float64), want.astype(np.float64)
    rtol, atol = tol
    gn, wn = np.isnan(g), np.isnan(w)
    inf = np.isinf(g) | np.isinf(w)
    ref = np.abs(w) if scale is None else np.maximum(np.abs(w), np.nan_to_num(np.asarray(scale, np.float64), nan=0.0, posinf=np.inf))
    with np.errstate(invalid="ignore", over="ignore"):
      close = np.abs(g - w) <= atol + rtol * ref
    bad = (gn != wn) | (~gn & ~wn & np.where(inf, g != w, ~close))
    if undefined:
      bad &= ~(wn | (np.isinf(w) & gn & inf_in))
      if got.dtype.kind == "f":
        with np.errstate(invalid="ignore"):
          bad &= ~(np.isinf(w) & np.isfinite(g) & (np.sign(g) == np.sign(w)) & (np.abs(g) >= _fmax(got.dtype) / 2 ** 16))
    if loose: bad &= ~(gn ^ wn)
  if skip is not None: bad &= ~np.broadcast_to(skip, bad.shape)
  if not bad.any(): return None
  idx = np.argwhere(bad)[:6]
  with np.printoptions(precision=9):
    rows = "; ".join(f"at {tuple(int(v) for v in i)}: got {got[tuple(i)]!r}, want {want[tuple(i)]!r}" for i in idx)
  return f"{int(bad.sum())} of {bad.size} elements differ ({rows})"


# ---------------------------------------------------------------- the op table's row

@dataclass(frozen=True)
class Op:
  """One row of the table: a Tensor method and its PyTorch counterpart.

  pg / pt: called with the case's arguments (plugrad Tensors / torch tensors, Py values unwrapped) and keywords.
  gen(draw, dtype) -> (args, kw): one case's arguments (`Arg` tensors, `Py` values) and keywords.
  grad: compare gradients of the float inputs with `diff` (float dtypes only).
  tol: (rtol, atol) multipliers of the dtype's tolerance for this op, with `why` saying why it needs them;
  atol: the smallest absolute tolerance (forward, backward), for functions with a documented absolute error (erf).
  api: the TENSOR_API.md names this row covers (default: the name up to the first '.')."""
  name: str
  pg: Callable[..., Any]
  pt: Callable[..., Any]
  gen: Callable[[Any, str], tuple[list[Any], dict[str, Any]]]
  dtypes: tuple[str, ...]
  grad: bool = True
  tol: tuple[float, float] = (1.0, 1.0)
  why: str = ""
  api: tuple[str, ...] = ()
  python: bool = False  # also run on the PYTHON reference interpreter (a small subset: it is slow)
  elementwise: bool = False  # one input, output of its shape: gradients are not compared where the forward value is nan
  atol: tuple[float, float] = (0.0, 0.0)  # smallest absolute tolerance (forward, backward) for this op, with `why`
  sums: bool = False  # a sum of products: rtol is relative to the same op on |inputs| (the rounding error bound)
  mag: Callable[..., Any] | None = None  # like sums, with this function (pt's signature) on |inputs| as the scale
  grad_when: Callable[[Case], bool] = lambda c: True  # gradients are compared in these cases only (with `why`)

  def names(self) -> tuple[str, ...]: return self.api or (self.name.split(".")[0],)


@dataclass(frozen=True)
class Allowed:
  """An intended difference from PyTorch (documented behaviour, mostly tinygrad 0.14's): in the cases `when` selects,
  plugrad may instead match `ref` (an alternative torch computation with pt's signature, compared with the same
  tolerances, gradients included) or, for part 'dtype', give the dtype `dtype(case, torch_dtype_name)`."""
  op: str
  part: str
  reason: str
  ref: Callable[..., Any] | None = None
  dtype: Callable[[Case, str], str | None] | None = None
  when: Callable[[Case], bool] = lambda c: True


@dataclass(frozen=True)
class KnownBug:
  """A divergence that is a plugrad bug: the generated cases `when` selects may fail on `part` (one of 'value', 'dtype',
  'grad', 'raises', or several joined by ','); `repro` is one such case, run as a strict xfail (fixed → the test fails →
  delete the entry)."""
  id: str
  op: str
  part: str
  what: str
  repro: Case
  when: Callable[[Case], bool] = lambda c: True

  def parts(self) -> set[str]: return set(self.part.split(","))


# ---------------------------------------------------------------- statistics (conftest.py reports them)

STATS: Counter[str] = Counter()
PER_OP: Counter[str] = Counter()
METHODS: set[str] = set()


# ---------------------------------------------------------------- running one case

def _call(fn: Callable[..., Any], args: Sequence[Any], kw: dict[str, Any]) -> tuple[Any, BaseException | None]:
  try: return fn(*args, **kw), None
  except Exception as e: return None, e


def _seed(shape: tuple[int, ...]) -> np.ndarray:
  """The output gradient: a fixed pattern, exact in every float dtype and never 0."""
  return np.resize(np.array([1.0, -0.5, 2.0, 0.25], np.float32), int(np.prod(shape, dtype=np.int64))).reshape(shape)


def _torch_grads(outs: list[Any], tins: list[torch.Tensor]) -> list[np.ndarray] | BaseException:
  diffs = [t for t in tins if t.requires_grad]
  flo = [o for o in outs if isinstance(o, torch.Tensor) and o.dtype.is_floating_point and o.requires_grad]
  if not flo: return [np.zeros(t.shape, np.float32) for t in diffs]
  try:
    seeds = [torch.from_numpy(_seed(tuple(o.shape))).to(o.dtype) for o in flo]
    gs = torch.autograd.grad(flo, diffs, seeds, allow_unused=True, materialize_grads=True)
  except Exception as e: return e
  return [torch_np(g) for g in gs]


def _pg_grads(outs: list[Any], pins: list[Tensor]) -> list[np.ndarray] | BaseException:
  diffs = [t for t in pins if t.requires_grad]
  flo = [o for o in outs if isinstance(o, Tensor) and dtypes.is_float(o.dtype)]
  try:
    if len(flo) == 1: gs = flo[0].gradient(*diffs, gradient=Tensor(_seed(flo[0].shape), device=flo[0].device).cast(flo[0].dtype))
    else:
      loss = None
      for o in flo:
        term = (o * Tensor(_seed(o.shape), device=o.device).cast(o.dtype)).sum()
        loss = term if loss is None else loss + term
      if loss is None: return [np.zeros(t.shape, np.float32) for t in diffs]
      gs = loss.gradient(*diffs)
    return [g.numpy() for g in gs]
  except Exception as e: return e


def _unwrap(a: Any, conv: Callable[[Arg], Any]) -> Any:
  if isinstance(a, Arg): return conv(a)
  if isinstance(a, Py): return a.value
  if isinstance(a, list): return [_unwrap(x, conv) for x in a]
  return a


def _tol(table: dict[str, tuple[float, float]], out_dtype: str | None, op: Op) -> tuple[float, float] | None:
  if out_dtype not in table: return None
  r, a = table[out_dtype]
  return (r * op.tol[0], max(a * op.tol[1], op.atol[table is GRAD_TOL]))


def _flat_tensors(xs: list[Any]) -> list[Any]:
  return [t for x in xs for t in (_flat_tensors(x) if isinstance(x, list) else [x])]


def _magnitudes(op: Op, pt: Callable[..., Any], case: Case) -> tuple[list[np.ndarray], list[np.ndarray]] | None:
  """pt on the inputs' absolute values in float64, and its gradients for the output gradients' absolute values: for a
  sum of products, the scale of the rounding error of each output and gradient element (None where pt refuses it)."""
  def conv(a: Arg) -> torch.Tensor:
    if a.dtype == "bool" or not a.diff: return to_torch(a, False)
    t = torch.from_numpy(np.abs(np.array(a.value, np.float64)))
    return t.requires_grad_() if is_float(a.dtype) and op.grad else t
  try:
    ins = [_unwrap(a, conv) for a in case.args]
    outs = [o for o in _outputs(pt(*ins, **case.kw)) if isinstance(o, torch.Tensor)]
    diffs = [t for t in _flat_tensors(ins) if isinstance(t, torch.Tensor) and t.requires_grad]
    flo = [o for o in outs if o.requires_grad]
    gs = torch.autograd.grad(flo, diffs, [torch.from_numpy(np.abs(_seed(tuple(o.shape)))).to(o.dtype) for o in flo], allow_unused=True,
                             materialize_grads=True) if flo and diffs else []
    return [torch_np(o).astype(np.float64) for o in outs], [torch_np(g).astype(np.float64) for g in gs]
  except Exception: return None


def _has(case: Case, pred: Callable[[np.ndarray], np.ndarray]) -> bool:
  """pred holds for some element of a float tensor argument or a Python float argument."""
  vals = [a.value.astype(np.float64) for a in case.tensors() if is_float(a.dtype)]
  vals += [np.array(a.value) for a in case.args if isinstance(a, Py) and isinstance(a.value, float)]
  return any(v.size and bool(np.any(pred(v))) for v in vals)


def compare(op: Op, case: Case, device: str, pt: Callable[..., Any] | None = None, stats: bool = False) -> list[tuple[str, str]]:
  """Run `case` on both sides; returns the (part, message) of every disagreement (empty: they agree)."""
  pt = pt or op.pt
  tins = [_unwrap(a, lambda x: to_torch(x, op.grad)) for a in case.args]
  tout, terr = _call(pt, tins, case.kw)
  pins = [_unwrap(a, lambda x: to_plugrad(x, device)) for a in case.args]
  pout, perr = _call(op.pg, pins, case.kw)
  pvals: list[np.ndarray] = []
  if perr is None:
    try: pvals = [pg_np(o) for o in _outputs(pout)]  # realizing can raise too
    except Exception as e: perr = e
  if terr is not None or perr is not None:
    if terr is not None and perr is not None: return []  # both refuse the input: agreement
    if terr is not None: return [("raises", f"torch raises {type(terr).__name__}: {str(terr)[:300]}; plugrad returns")]
    assert perr is not None
    return [("raises", f"plugrad raises {type(perr).__name__}: {str(perr)[:400]}; torch returns")]
  touts, pouts = _outputs(tout), _outputs(pout)
  if len(touts) != len(pouts): return [("value", f"{len(pouts)} outputs, torch gives {len(touts)}")]
  mag = _magnitudes(op, op.mag or pt, case) if op.sums or op.mag else None
  bad: list[tuple[str, str]] = []
  for i, (t, p, pv) in enumerate(zip(touts, pouts, pvals)):
    tn, pn = dtype_name(t), dtype_name(p)
    if tn is not None and pn is not None and tn != pn: bad.append(("dtype", f"output {i}: dtype {pn}, torch gives {tn}"))
    scale = mag[0][i] if mag is not None and i < len(mag[0]) else None
    if (why := mismatch(pv, torch_np(t), _tol(TOL, tn, op), scale=scale)) is not None: bad.append(("value", f"output {i}: {why}"))
  # gradients: not where an input holds nan (every convention is as good as another there)
  if op.grad and not bad and not _has(case, np.isnan) and op.grad_when(case):
    ptens, ttens = _flat_tensors(pins), [t for t in _flat_tensors(tins) if isinstance(t, torch.Tensor)]
    if any(isinstance(t, torch.Tensor) and t.requires_grad for t in ttens):
      tg = _torch_grads(touts, ttens)
      pg = _pg_grads(pouts, [p for p in ptens if isinstance(p, Tensor)])
      if isinstance(pg, BaseException) and not isinstance(tg, BaseException):
        bad.append(("grad", f"backward: plugrad raises {type(pg).__name__}: {str(pg)[:300]}"))
      elif not isinstance(tg, BaseException) and not isinstance(pg, BaseException):  # torch without a derivative: nothing to compare
        if stats: STATS["gradient checks"] += 1
        diffs = [t for t in ttens if isinstance(t, torch.Tensor) and t.requires_grad]
        # where torch's gradient is nan there is nothing to compare with; with inputs holding ±inf, where it is ±inf nan
        # will do too (a finite torch gradient must still be matched: sigmoid'(inf) is 0, softmax over a -inf mask has 0
        # gradients there)
        inf_in = _has(case, np.isinf)
        # an output that is nan throughout (0/0: var with correction >= N): where one side's gradient is nan and the
        # other's a number, neither means anything; an elementwise function's gradient is not compared where its value is nan
        flo = [t.detach() for t in touts if isinstance(t, torch.Tensor) and t.dtype.is_floating_point and t.numel()]
        nan_out = any(bool(t.isnan().all()) for t in flo)
        skip = np.isnan(torch_np(touts[0]).astype(np.float64)) if op.elementwise else None
        for i, (g, w, t) in enumerate(zip(pg, tg, diffs)):
          scale = mag[1][i] if mag is not None and i < len(mag[1]) else None
          if TORCH_NAME[t.dtype] in ("float16", "bfloat16") and w.size:  # half precision: sums that cancel round at the tensor's scale
            fin = np.abs(w[np.isfinite(w)].astype(np.float64))
            tscale = np.full(w.shape, fin.max() / 8 if fin.size else 0.0)
            scale = tscale if scale is None else np.maximum(scale, tscale)
          if (why := mismatch(g, w, _tol(GRAD_TOL, TORCH_NAME[t.dtype], op), skip, True, nan_out, scale, inf_in)) is not None:
            bad.append(("grad", f"gradient of input {i}: {why}"))
  return bad


def explain(op: Op, case: Case, allowed: Sequence[Allowed], device: str = DEVICE, count: bool = True) -> list[list[tuple[str, str]]]:
  """The disagreements of one case with PyTorch, and with each alternative reference that applies (an Allowed entry's
  `ref`, PyTorch in a wider dtype), less the dtypes the allowlist gives: [] when one of them agrees completely."""
  bad = compare(op, case, device, stats=count)
  if not bad: return []
  mine = [a for a in allowed if a.op == op.name and a.when(case)]

  def residual(found: list[tuple[str, str]]) -> list[tuple[str, str]]:  # what no dtype allowance explains
    return [b for b in found if not (b[0] == "dtype" and any(a.dtype is not None and _dtype_allowed(a, case, b[1]) for a in mine))]

  found = [residual(bad)]
  if not found[0]:
    if count: STATS["allowed differences"] += 1
    return []
  for a in mine:
    if a.ref is None: continue
    found.append(residual(compare(op, case, device, a.ref)))
    if not found[-1]:
      if count: STATS["allowed differences"] += 1
      return []
  if WIDER.keys() & {a.dtype for a in case.tensors()}:
    found.append(residual(compare(op, case, device, wider(op.pt))))
    if not found[-1]:
      if count: STATS["cases matching PyTorch in a wider dtype"] += 1
      return []
  return found


def check(op: Op, case: Case, allowed: Sequence[Allowed], bugs: Sequence[KnownBug], device: str = DEVICE) -> None:
  """Compare one case; raise Mismatch for a disagreement that no Allowed entry explains and no KnownBug covers (with
  any of the references)."""
  STATS["examples"] += 1
  PER_OP[op.name] += 1
  METHODS.update(op.names())
  found = explain(op, case, allowed, device)
  if not found: return
  mine = [b for b in bugs if b.op == op.name and b.when(case)]
  for left in found:
    if all(any(p in k.parts() for k in mine) for p, _ in left):
      STATS["known-bug cases"] += 1
      return
  left = found[0]
  raise Mismatch(left[0][0], f"{case!r} on {device}:\n  " + "\n  ".join(f"{p}: {m}" for p, m in left))


WIDER = {"float16": torch.float32, "bfloat16": torch.float32, "float32": torch.float64}


def wider(pt: Callable[..., Any]) -> Callable[..., Any]:
  """pt computed in the next wider float dtype (float16/bfloat16 → float32, float32 → float64), its outputs rounded back:
  the second reference. PyTorch's kernels round intermediates in their own places (half precision mostly in float32);
  a result that matches the same function computed more precisely is as right as PyTorch's own."""
  def ref(*xs: Any, **kw: Any) -> Any:
    ins = {x.dtype for x in _flat_tensors(list(xs)) if isinstance(x, torch.Tensor) and x.dtype.is_floating_point}
    if len(ins) != 1 or TORCH_NAME[next(iter(ins))] not in WIDER: raise TypeError("no single float dtype to widen")
    (narrow,) = ins
    wide = WIDER[TORCH_NAME[narrow]]
    def up(x: Any) -> Any:
      if isinstance(x, list): return [up(v) for v in x]
      return x.to(wide) if isinstance(x, torch.Tensor) and x.dtype == narrow else x
    def down(o: Any) -> Any:
      if isinstance(o, (tuple, list)): return type(o)(down(v) for v in o) if not hasattr(o, "_fields") else type(o)(*[down(v) for v in o])
      return o.to(narrow) if isinstance(o, torch.Tensor) and o.dtype == wide else o
    return down(pt(*[up(x) for x in xs], **kw))
  return ref


def _dtype_allowed(a: Allowed, case: Case, msg: str) -> bool:
  # msg: "output i: dtype X, torch gives Y"
  got = msg.split("dtype ")[1].split(",")[0]
  want = msg.rsplit("torch gives ", 1)[1]
  assert a.dtype is not None
  return a.part == "dtype" and a.dtype(case, want) == got
